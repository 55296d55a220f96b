"""The ServerApp: FedAvg uncompressed, or RandProjSpatialFedAvg with one of rpsagg's estimators.

Run config (``pyproject.toml``, or ``flwr run --run-config``): ``model`` (``softmax``;
``cnn``, the small CNN with BatchNorm of ``fmnist_app.cnn``; ``mlp``, the perceptron of
``fmnist_app.mlp``), ``method`` (``fedavg`` or an
estimator name), ``k``, ``transform``, ``value-bits``, ``bits``, the server step
(``server-optimizer``, ``server-lr``, ``server-momentum``, ``error-feedback``), the spatial
decoders' ``solver``, ``partial`` (``refuse``: a reply that carries only some of the
model's arrays fails the run; ``allow``: each array is averaged over the replies that carry
it), ``seed``
(> 0: nonces and client seeds derived from it), ``num-server-rounds``, the training
settings and ``results-path`` (a JSON file with one entry per round). Bytes up are counted
from the replies for every method, FedAvg's too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fmnist_app.models import torch_model
from fmnist_app.task import evaluate, init_model, load
from rpsagg.spec import mix64
from rpsagg_flower import RandProjSpatialFedAvg
from rpsagg_flower.optim import make_server_optimizer
from rpsagg_flower.payload import Layout
from rpsagg_flower.wire import wire_bytes

app = ServerApp()


class CountingFedAvg(FedAvg):
    """Flower's FedAvg, plus ``rpsagg.bytes-up``: the replies' wire bytes
    (``rpsagg_flower.wire.wire_bytes``, what the compressed runs report too)."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if metrics is not None:
            sizes: dict[str, int] = {}
            metrics["rpsagg.bytes-up"] = sum(wire_bytes(r, sizes) for r in replies
                                             if not r.has_error())
        return arrays, metrics


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, evaluating the global model on the 10,000 test images after each."""
    rc = context.run_config
    method = str(rc["method"])
    nodes = int(rc["clients"])
    seed = int(rc.get("seed", 0))
    model = str(rc.get("model", "softmax"))
    arch = torch_model(model)
    # BatchNorm's running statistics travel as they are, beside the counters
    plain = arch.buffer_names() if arch is not None else []
    strategy: FedAvg
    if method == "fedavg":
        strategy = CountingFedAvg(fraction_evaluate=0.0, min_train_nodes=nodes,
                                  min_available_nodes=nodes)
    else:
        bits = int(rc["bits"])
        rounds = iter(range(1, 1 << 30))
        strategy = RandProjSpatialFedAvg(
            method, k=None if method in ("eden", "qsgd") else int(rc["k"]),
            transform=str(rc["transform"]), value_bits=int(rc["value-bits"]),
            bits=bits or None, fraction_evaluate=0.0, min_train_nodes=nodes,
            min_available_nodes=nodes,
            nonces=(lambda: mix64(mix64(seed) + next(rounds))) if seed else None,
            server_optimizer=make_server_optimizer(
                str(rc.get("server-optimizer", "sgd")), float(rc.get("server-lr", 1.0)),
                float(rc.get("server-momentum", 0.0))),
            error_feedback=bool(rc.get("error-feedback", False)),
            solver=str(rc.get("solver", "auto")),
            uncompressed=plain,
            partial=str(rc.get("partial", "refuse")),
        )
    if arch is not None:
        initial = arch.initial(seed)
    else:
        w, b = init_model()
        initial = ArrayRecord({"weight": Array(w), "bias": Array(b),
                               "steps": Array(np.zeros((), np.int64))})
    d = Layout.of(initial, plain).d
    x_test, y_test = load("t10k")
    test_images = arch.images(x_test) if arch is not None else None
    log: dict[int, dict[str, float]] = {}
    started = time.monotonic()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        if arch is not None:
            loss, acc = arch.evaluate(arrays, test_images, y_test)
            # the CNN counts its steps (BatchNorm's counter); the MLP does not
            steps = (float(arrays["bn1.num_batches_tracked"].numpy())
                     if "bn1.num_batches_tracked" in arrays else None)
        else:
            weight, bias, counter = arrays.to_numpy_ndarrays()
            loss, acc = evaluate(weight, bias, x_test, y_test)
            steps = float(counter)
        log[server_round] = {"test-loss": loss, "test-accuracy": acc,
                             "elapsed-s": time.monotonic() - started}
        if steps is not None:
            log[server_round]["steps"] = steps
        return MetricRecord({"test-loss": loss, "test-accuracy": acc})

    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(rc["num-server-rounds"]),
        train_config=ConfigRecord({}), evaluate_fn=evaluate_fn,
    )
    for rnd, metrics in result.train_metrics_clientapp.items():
        entry = log.setdefault(rnd, {})
        entry.update({key: float(v) for key, v in metrics.items()
                      if isinstance(v, int | float)})
    path = str(rc["results-path"])
    if path:
        out = {"method": method, "model": model,
               "k": int(rc["k"]), "transform": str(rc["transform"]),
               "value-bits": int(rc["value-bits"]), "clients": nodes, "seed": seed,
               "server-optimizer": str(rc.get("server-optimizer", "sgd")),
               "server-lr": float(rc.get("server-lr", 1.0)),
               "error-feedback": bool(rc.get("error-feedback", False)),
               "d": d,
               "rounds": {str(r): v for r, v in sorted(log.items())}}
        Path(path).write_text(json.dumps(out, indent=1))
