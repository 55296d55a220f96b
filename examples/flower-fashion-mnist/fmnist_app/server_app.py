"""The ServerApp: FedAvg uncompressed, or RandProjSpatialFedAvg with one of rpsagg's estimators.

Run config (``pyproject.toml``, or ``flwr run --run-config``): ``method`` (``fedavg`` or an
estimator name), ``k``, ``transform``, ``value-bits``, ``bits``, ``num-server-rounds``, the
training settings and ``results-path`` (a JSON file with one entry per round).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fmnist_app.task import evaluate, init_model, load
from rpsagg_flower import RandProjSpatialFedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the rounds, evaluating the global model on the 10,000 test images after each."""
    rc = context.run_config
    method = str(rc["method"])
    nodes = int(rc["clients"])
    strategy: FedAvg
    if method == "fedavg":
        strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes,
                          min_available_nodes=nodes)
    else:
        bits = int(rc["bits"])
        strategy = RandProjSpatialFedAvg(
            method, k=None if method in ("eden", "qsgd") else int(rc["k"]),
            transform=str(rc["transform"]), value_bits=int(rc["value-bits"]),
            bits=bits or None, fraction_evaluate=0.0, min_train_nodes=nodes,
            min_available_nodes=nodes,
        )
    w, b = init_model()
    initial = ArrayRecord({"weight": Array(w), "bias": Array(b)})
    x_test, y_test = load("t10k")
    log: dict[int, dict[str, float]] = {}
    started = time.monotonic()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weight, bias = arrays.to_numpy_ndarrays()
        loss, acc = evaluate(weight, bias, x_test, y_test)
        log[server_round] = {"test-loss": loss, "test-accuracy": acc,
                             "elapsed-s": time.monotonic() - started}
        return MetricRecord({"test-loss": loss, "test-accuracy": acc})

    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(rc["num-server-rounds"]),
        train_config=ConfigRecord({}), evaluate_fn=evaluate_fn,
    )
    raw_reply = initial.count_bytes()
    for rnd, metrics in result.train_metrics_clientapp.items():
        entry = log.setdefault(rnd, {})
        entry.update({key: float(v) for key, v in metrics.items()
                      if isinstance(v, int | float)})
        entry.setdefault("rpsagg.bytes-up", float(nodes * raw_reply))  # FedAvg: every reply raw
    path = str(rc["results-path"])
    if path:
        out = {"method": method, "k": int(rc["k"]), "transform": str(rc["transform"]),
               "value-bits": int(rc["value-bits"]), "clients": nodes,
               "d": sum(a.size for a in initial.to_numpy_ndarrays()),
               "rounds": {str(r): v for r, v in sorted(log.items())}}
        Path(path).write_text(json.dumps(out, indent=1))
