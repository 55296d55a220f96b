"""The ClientApp: local SGD on this node's shard; rpsagg_mod compresses what it sends back.

The model is the run config's ``model``: ``softmax`` (numpy), ``cnn`` (``fmnist_app.cnn``)
or ``mlp`` (``fmnist_app.mlp``), PyTorch models sent as their ``state_dict``
(:mod:`fmnist_app.models`). With a PyTorch model, ``train-only = "head"`` fine-tunes the
classifier head alone on frozen features (every other array stays exactly as received),
and ``reply = "trained"`` replies with the trained arrays alone: a partial reply, which the
server refuses unless its ``partial`` is ``"allow"``.

With ``seed`` > 0 in the run config the mod's client seeds are derived from it, the node
and the round (a reproducible run); with 0 they are fresh ``secrets.randbits(64)``.
"""

from __future__ import annotations

import secrets

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fmnist_app.models import torch_model
from fmnist_app.task import partition, steps_per_epoch, train
from rpsagg.spec import mix64
from rpsagg_flower import make_rpsagg_mod


def client_seed(msg: Message, context: Context) -> int:
    """This reply's 64-bit client seed: from the run config's ``seed``, or fresh."""
    seed = int(context.run_config.get("seed", 0))
    if seed == 0:
        return secrets.randbits(64)
    rnd = int(msg.content.config_records["config"]["server-round"])  # type: ignore[arg-type]
    return mix64(mix64(seed) ^ mix64(context.node_id) ^ rnd)


app = ClientApp(mods=[make_rpsagg_mod(context_seeds=client_seed)])


@app.train()
def local_train(msg: Message, context: Context) -> Message:
    """Train from the received model; reply with the new model (the mod sends its update)."""
    config = msg.content.config_records["config"]
    pid = int(context.node_config["partition-id"])
    x, y = partition(pid, int(context.node_config["num-partitions"]),
                     int(context.run_config["examples-per-client"]))
    arch = torch_model(str(context.run_config.get("model", "softmax")))
    if arch is not None:
        rc = context.run_config
        only, reply = str(rc.get("train-only", "all")), str(rc.get("reply", "all"))
        if only not in ("all", "head") or reply not in ("all", "trained"):
            raise ValueError(f"train-only must be 'all' or 'head' and reply 'all' or "
                             f"'trained'; got {only!r} and {reply!r}")
        trainable = arch.HEAD if only == "head" else None
        arrays, loss = arch.train(
            msg.content.array_records["arrays"], arch.images(x), y,
            epochs=int(rc["local-epochs"]), lr=float(rc["lr"]), batch=int(rc["batch-size"]),
            seed=1000 * int(config["server-round"]) + pid,  # type: ignore[arg-type]
            trainable=trainable)
        if trainable is not None and reply == "trained":  # a partial reply
            arrays = ArrayRecord({key: arrays[key] for key in trainable})
        metrics = MetricRecord({"train-loss": loss, "num-examples": len(y)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
    if str(context.run_config.get("train-only", "all")) != "all":
        raise ValueError("train-only applies to model = 'cnn' or 'mlp' (the softmax model has "
                         "no head apart from its weights)")
    w, b, steps = msg.content.array_records["arrays"].to_numpy_ndarrays()
    new_w, new_b, loss = train(
        w, b, x, y, epochs=int(context.run_config["local-epochs"]),
        lr=float(context.run_config["lr"]), batch=int(context.run_config["batch-size"]),
        seed=1000 * int(config["server-round"]) + pid,  # type: ignore[arg-type]
    )
    epochs, batch = int(context.run_config["local-epochs"]), int(context.run_config["batch-size"])
    arrays = ArrayRecord({"weight": Array(new_w.astype(np.float32)),
                          "bias": Array(new_b.astype(np.float32)),
                          "steps": Array(np.asarray(steps + epochs * steps_per_epoch(len(y), batch),
                                                    np.int64))})
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
