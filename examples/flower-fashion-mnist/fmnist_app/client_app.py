"""The ClientApp: local SGD on this node's shard; rpsagg_mod compresses what it sends back."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fmnist_app.task import partition, train
from rpsagg_flower import rpsagg_mod

app = ClientApp(mods=[rpsagg_mod])


@app.train()
def local_train(msg: Message, context: Context) -> Message:
    """Train from the received model; reply with the new model (the mod sends its update)."""
    w, b = msg.content.array_records["arrays"].to_numpy_ndarrays()
    config = msg.content.config_records["config"]
    pid = int(context.node_config["partition-id"])
    x, y = partition(pid, int(context.node_config["num-partitions"]),
                     int(context.run_config["examples-per-client"]))
    new_w, new_b, loss = train(
        w, b, x, y, epochs=int(context.run_config["local-epochs"]),
        lr=float(context.run_config["lr"]), batch=int(context.run_config["batch-size"]),
        seed=1000 * int(config["server-round"]) + pid,  # type: ignore[arg-type]
    )
    arrays = ArrayRecord({"weight": Array(new_w.astype(np.float32)),
                          "bias": Array(new_b.astype(np.float32))})
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
