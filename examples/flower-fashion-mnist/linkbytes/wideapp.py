"""The benchmark's 2,002,001-parameter linear model as a small Flower app, written into a
folder for a run (``--models wide``)."""

from __future__ import annotations

from pathlib import Path

WIDE_PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "wide-app"
version = "0.1.0"
description = "The benchmark's 2,002,001-parameter linear model (link_bytes.py)"
license = "MIT"
requires-python = ">=3.11"
dependencies = ["rpsagg-flower", "flwr>=1.42,<1.43", "numpy>=1.26"]

[tool.setuptools.packages.find]
include = ["wide_app*"]

[tool.flwr.app]
publisher = "rpsagg"

[tool.flwr.app.components]
serverapp = "wide_app.apps:server"
clientapp = "wide_app.apps:client"

[tool.flwr.app.config]
method = "fedavg"
k = 20020
value-bits = 32
clients = 2
num-server-rounds = 3
seed = 1
examples-per-client = 200
results-path = ""
"""

# the wide model of benchmark.py (wide_task) as a Flower app: a teacher, synthetic data per
# node, three local gradient steps on the mean squared error
WIDE_APPS = '''\
"""The benchmark's wide model (W float32 1000 x 2000, b float16, s float64) over Flower."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from rpsagg.spec import mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.wire import wire_bytes


class CountingFedAvg(FedAvg):
    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if metrics is not None:
            sizes = {}
            metrics["rpsagg.bytes-up"] = sum(wire_bytes(r, sizes) for r in replies
                                             if not r.has_error())
        return arrays, metrics


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    nodes, seed = int(rc["clients"]), int(rc["seed"])
    common = dict(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    if rc["method"] == "fedavg":
        strategy = CountingFedAvg(**common)
    else:
        rounds = iter(range(1, 1 << 30))
        strategy = RandProjSpatialFedAvg(
            str(rc["method"]), k=int(rc["k"]), value_bits=int(rc["value-bits"]),
            nonces=lambda: mix64(mix64(seed) + next(rounds)), **common)
    initial = ArrayRecord({"W": Array(np.zeros((1000, 2000), np.float32)),
                           "b": Array(np.zeros(2000, np.float16)),
                           "s": Array(np.zeros((), np.float64))})
    result = strategy.start(grid=grid, initial_arrays=initial,
                            num_rounds=int(rc["num-server-rounds"]),
                            train_config=ConfigRecord({}))
    log = {str(r): {k: float(v) for k, v in m.items() if isinstance(v, int | float)}
           for r, m in result.train_metrics_clientapp.items()}
    if str(rc["results-path"]):
        Path(str(rc["results-path"])).write_text(json.dumps(
            {"method": str(rc["method"]), "model": "wide", "k": int(rc["k"]),
             "value-bits": int(rc["value-bits"]), "clients": nodes, "seed": seed,
             "d": 2002001, "rounds": log}, indent=1))


def client_seed(msg: Message, context: Context) -> int:
    rnd = int(msg.content.config_records["config"]["server-round"])
    return mix64(mix64(int(context.run_config["seed"])) ^ mix64(context.node_id) ^ rnd)


client = ClientApp(mods=[make_rpsagg_mod(context_seeds=client_seed)])


@client.train()
def train(msg: Message, context: Context) -> Message:
    seed, pid = int(context.run_config["seed"]), int(context.node_config["partition-id"])
    rng = np.random.default_rng(seed)
    w_star = (rng.standard_normal((1000, 2000)) / np.sqrt(1000)).astype(np.float32)
    b_star = rng.standard_normal(2000).astype(np.float32)
    r = np.random.default_rng(seed * 100 + pid)
    n = int(context.run_config["examples-per-client"])
    x = r.standard_normal((n, 1000)).astype(np.float32)
    y = x @ w_star + b_star + 0.5 + 0.1 * r.standard_normal((n, 2000)).astype(np.float32)
    w_in, b_in, s_in = msg.content.array_records["arrays"].to_numpy_ndarrays()
    w, b, s = w_in.astype(np.float32), b_in.astype(np.float32), float(s_in)
    for _ in range(3):
        g = 2.0 * (x @ w + b + s - y) / (n * 2000)
        w, b, s = (w - 0.05 * 2000 * (x.T @ g), b - 0.05 * 2000 * g.sum(axis=0),
                   s - 0.05 * float(g.sum()))
    arrays = ArrayRecord({"W": Array(w.astype(np.float32)), "b": Array(b.astype(np.float16)),
                          "s": Array(np.asarray(s, np.float64))})
    metrics = MetricRecord({"train-loss": float(np.mean((x @ w + b + s - y) ** 2)),
                            "num-examples": n})
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
'''


def wide_app(folder: Path) -> Path:
    """Write the wide model's Flower app into ``folder``; its path."""
    app = folder / "wide-app"
    (app / "wide_app").mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(WIDE_PYPROJECT)
    (app / "wide_app" / "__init__.py").write_text("")
    (app / "wide_app" / "apps.py").write_text(WIDE_APPS)
    return app
