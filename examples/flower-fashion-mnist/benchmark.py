"""Benchmark: FedAvg against rpsagg's estimators at matched bytes up, with and without
variance control, on Fashion-MNIST and on a 2,002,001-parameter model.

    python benchmark.py --quick        # a few minutes on 2 cores
    python benchmark.py                # more clients and rounds
    python benchmark.py --report-only  # table and plot from the JSON in --out

Each run drives Flower's own objects in this process: the strategy (Flower's ``FedAvg`` or
``RandProjSpatialFedAvg``) configures each round, a real ``ClientApp`` with
``mods=[rpsagg_mod]`` answers every node's message with a ``Context`` kept per node across
rounds (as a SuperNode keeps it: the error-feedback memory lives there), and the replies
go to ``aggregate_train``. Only the transport is left out (``run_comparison.py`` and
``tests/flower/test_e2e.py`` run the same app over real SuperLinks and SuperNodes).
Bytes up are counted from the replies (Flower's ``count_bytes`` of every reply's
``ArrayRecord`` and, for compressed replies, the ``rpsagg`` config record); decode time is
the strategy's ``rpsagg.decode-seconds``. Seeds are fixed (``--seed``): nonces, client
seeds, data and minibatch order.

Tasks:

* ``fmnist``: softmax regression on Fashion-MNIST (d = 7,850; ``fmnist_app.task``), IID
  shards, one local epoch of SGD; metric: test accuracy.
* ``wide``: a linear model y = x W + b + s with W float32 1000 x 2000, b float16 (2000),
  s float64 (a scalar): 2,002,001 parameters. Each client holds synthetic data from the
  same teacher plus client noise and takes a few gradient steps on the mean squared error;
  metric: the loss on held-out data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fmnist_app.task import evaluate, load, partition, train  # noqa: E402

from rpsagg.spec import mix64  # noqa: E402
from rpsagg_flower import RandProjSpatialFedAvg, ServerSGD, make_rpsagg_mod  # noqa: E402
from rpsagg_flower.optim import ServerOptimizer  # noqa: E402


class Nodes:
    """The node list FedAvg's sampling asks a Grid for (``get_node_ids``)."""

    def __init__(self, n: int) -> None:
        self.ids = list(range(1, n + 1))

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


# --- tasks ---------------------------------------------------------------------------------

@dataclass
class Task:
    name: str
    initial: Callable[[], ArrayRecord]
    train: Callable[[int, ArrayRecord, int], tuple[ArrayRecord, float, int]]
    evaluate: Callable[[ArrayRecord], dict[str, float]]
    metric: str  # the headline metric's key


def fmnist_task(clients: int, examples: int, seed: int) -> Task:
    x_test, y_test = load("t10k")
    shards = [partition(i, clients, examples) for i in range(clients)]

    def initial() -> ArrayRecord:
        return ArrayRecord({"weight": Array(np.zeros((784, 10), np.float32)),
                            "bias": Array(np.zeros(10, np.float32))})

    def train_fn(node: int, arrays: ArrayRecord, rnd: int) -> tuple[ArrayRecord, float, int]:
        w, b = arrays.to_numpy_ndarrays()
        x, y = shards[node - 1]
        w2, b2, loss = train(w, b, x, y, epochs=1, lr=0.05, batch=64,
                             seed=mix64(seed * 1_000_003 + 1000 * rnd + node) % 2**32)
        return ArrayRecord({"weight": Array(w2.astype(np.float32)),
                            "bias": Array(b2.astype(np.float32))}), loss, len(y)

    def eval_fn(arrays: ArrayRecord) -> dict[str, float]:
        w, b = arrays.to_numpy_ndarrays()
        loss, acc = evaluate(w, b, x_test, y_test)
        return {"test-loss": loss, "test-accuracy": acc}

    return Task("fmnist", initial, train_fn, eval_fn, "test-accuracy")


def wide_task(clients: int, examples: int, seed: int, steps: int = 3,
              lr: float = 0.05) -> Task:
    """A teacher (W*, b*, s*); client i's inputs x ~ N(0, I_1000) and targets
    x W* + b* + s* + noise; local steps of gradient descent on the mean squared error."""
    rng = np.random.default_rng(seed)
    w_star = (rng.standard_normal((1000, 2000)) / np.sqrt(1000)).astype(np.float32)
    b_star = rng.standard_normal(2000).astype(np.float32)
    s_star = 0.5

    def data(n: int, r: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = r.standard_normal((n, 1000)).astype(np.float32)
        y = x @ w_star + b_star + s_star + 0.1 * r.standard_normal((n, 2000)).astype(np.float32)
        return x, y

    shards = [data(examples, np.random.default_rng(seed * 100 + i)) for i in range(clients)]
    held = data(500, np.random.default_rng(seed * 100 + 99))

    def initial() -> ArrayRecord:
        return ArrayRecord({"W": Array(np.zeros((1000, 2000), np.float32)),
                            "b": Array(np.zeros(2000, np.float16)),
                            "s": Array(np.zeros((), np.float64))})

    def loss_of(w: np.ndarray, b: np.ndarray, s: float, x: np.ndarray, y: np.ndarray) -> float:
        r = x @ w + b + s - y
        return float(np.mean(r * r))

    def train_fn(node: int, arrays: ArrayRecord, rnd: int) -> tuple[ArrayRecord, float, int]:
        w_in, b_in, s_in = arrays.to_numpy_ndarrays()
        w, b, s = w_in.astype(np.float32), b_in.astype(np.float32), float(s_in)
        x, y = shards[node - 1]
        for _ in range(steps):
            r = x @ w + b + s - y  # d loss / d prediction = 2 r / (n * 2000)
            g = 2.0 * r / r.size
            w = w - lr * 2000 * (x.T @ g)
            b = b - lr * 2000 * g.sum(axis=0)
            s = s - lr * float(g.sum())
        return ArrayRecord({"W": Array(w.astype(np.float32)), "b": Array(b.astype(np.float16)),
                            "s": Array(np.asarray(s, np.float64))}), loss_of(w, b, s, x, y), len(y)

    def eval_fn(arrays: ArrayRecord) -> dict[str, float]:
        w, b, s = arrays.to_numpy_ndarrays()
        return {"test-loss": loss_of(w, b.astype(np.float32), float(s), *held)}

    return Task("wide", initial, train_fn, eval_fn, "test-loss")


# --- runs ------------------------------------------------------------------------------------

@dataclass
class Config:
    label: str
    method: str  # "fedavg" or an estimator name
    k: int | None = None
    value_bits: int = 32
    bits: int | None = None
    control: str = "none"  # "none", or a description of the variance control
    optimizer: Callable[[], ServerOptimizer] | None = None
    error_feedback: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def client_app(task: Task, seed: int) -> ClientApp:
    def client_seed(msg: Message, ctxt: Context) -> int:
        rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        return mix64(mix64(seed) ^ mix64(ctxt.node_id) ^ rnd)

    app = ClientApp(mods=[make_rpsagg_mod(context_seeds=client_seed)])

    @app.train()
    def fit(msg: Message, ctxt: Context) -> Message:
        rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        arrays, loss, n = task.train(ctxt.node_id, msg.content.array_records["arrays"], rnd)
        metrics = MetricRecord({"train-loss": loss, "num-examples": n})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def run(task: Task, cfg: Config, clients: int, rounds: int, seed: int,
        solver: str = "cg") -> dict[str, Any]:
    strategy: FedAvg
    common = {"fraction_evaluate": 0.0, "min_train_nodes": clients,
              "min_available_nodes": clients}
    if cfg.method == "fedavg":
        strategy = FedAvg(**common)  # type: ignore[arg-type]
    else:
        counter = iter(range(1, 1 << 30))
        strategy = RandProjSpatialFedAvg(
            cfg.method, k=cfg.k, value_bits=cfg.value_bits, bits=cfg.bits,
            nonces=lambda: mix64(mix64(seed) + next(counter)),
            server_optimizer=cfg.optimizer() if cfg.optimizer else None,
            error_feedback=cfg.error_feedback, solver=solver, **cfg.extra,
            **common)  # type: ignore[arg-type]
    app = client_app(task, seed)
    contexts = {n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(),
                           run_config={}) for n in range(1, clients + 1)}
    arrays = task.initial()
    log: dict[str, dict[str, float]] = {"0": task.evaluate(arrays)}
    grid = Nodes(clients)
    for rnd in range(1, rounds + 1):
        started = time.perf_counter()
        messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
        replies = [app(m, contexts[m.metadata.dst_node_id]) for m in messages]
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            raise RuntimeError(f"{cfg.label}: error replies in round {rnd}: {errors[:2]}")
        up = sum(rec.count_bytes() for r in replies for rec in r.content.array_records.values())
        up += sum(rec.count_bytes() for r in replies for key, rec
                  in r.content.config_records.items() if key == "rpsagg")
        new, metrics = strategy.aggregate_train(rnd, replies)
        if new is None or metrics is None:
            raise RuntimeError(f"{cfg.label}: round {rnd} produced no model")
        arrays = new
        entry = task.evaluate(arrays)
        entry["bytes-up"] = float(up)
        entry["round-seconds"] = time.perf_counter() - started
        for key in ("rpsagg.decode-seconds", "rpsagg.bytes-up", "rpsagg.compression-ratio"):
            if key in metrics:
                entry[key] = float(metrics[key])  # type: ignore[arg-type]
        log[str(rnd)] = entry
        decode = entry.get("rpsagg.decode-seconds")
        print(f"[bench] {task.name} {cfg.label} ({cfg.control}) round {rnd}: "
              f"{task.metric} {entry[task.metric]:.4f}, {up:,} B up"
              + (f", decode {decode:.3f} s" if decode is not None else ""), flush=True)
    return {"task": task.name, "label": cfg.label, "solver": solver, "method": cfg.method,
            "k": cfg.k,
            "value-bits": cfg.value_bits, "bits": cfg.bits, "control": cfg.control,
            "clients": clients, "rounds": log, "metric": task.metric, "seed": seed}


def configs(task: str, d: int, n: int) -> list[Config]:
    """FedAvg and the estimators at matched bytes up, each with and without variance
    control. Budgets: for Fashion-MNIST about 32x fewer bytes than FedAvg's float32 model
    (what EDEN and QSGD reach at 1 bit per coordinate) and about 100x for the sparsifiers;
    for the wide model about 100x."""
    out = [Config("FedAvg", "fedavg")]
    # k floats: >= 30x and ~100x fewer bytes than FedAvg (fmnist), ~100x (wide)
    budgets = [(32, d // 33), (100, d // 100)] if task == "fmnist" else [(100, d // 100)]
    for ratio, k in budgets:
        kinds = [
            (f"Rand-k k={k}", "rand-k", {"k": k}),
            (f"Rand-k-Spatial k={k}", "rand-k-spatial", {"k": k}),
            (f"Rand-Proj-Spatial k={k}", "rand-proj-spatial", {"k": k}),
            (f"Rand-Proj-Spatial k={4 * k}, 8-bit", "rand-proj-spatial",
             {"k": 4 * k, "value_bits": 8}),
        ]
        if ratio == 32 or task == "wide":
            kinds += [("QSGD 1-bit", "qsgd", {"bits": 1}), ("EDEN 1-bit", "eden", {"bits": 1})]
        for label, method, kw in kinds:
            if task == "wide" and method in ("qsgd", "eden"):
                label += " (~32x)"
            out.append(Config(label, method, **kw))  # type: ignore[arg-type]
            name, opt, ef = _control(task, method, kw, d, n)
            out.append(Config(label, method, control=name, optimizer=opt, error_feedback=ef,
                              **kw))  # type: ignore[arg-type]
    return out


def _control(task: str, cfg_method: str, kw: dict[str, Any], d: int, n: int
             ) -> tuple[str, Callable[[], ServerOptimizer], bool]:
    """The variance control of a configuration: a server step matched to the estimator's
    variance. A decoded mean of n independent unbiased estimates with relative variance
    ``w`` (``E||g - u||^2 <= w ||u||^2 / n`` for identical updates ``u``) changes the
    squared error by ``(1 - lr)^2 + lr^2 w / n`` per round (``docs/flower.md``), least at
    ``lr = 1 / (1 + w / n)``. ``w``: ``d/k - 1`` for the sparsifiers (the spatial decoders
    only do better), plus the 8-bit rounding's ``(d/k) / 4^8``-order term, which is
    negligible; QSGD with one level ``sqrt(d)``; EDEN 1-bit about 0.6 (its paper's bound).
    Rand-k additionally keeps error feedback at ``lr = k/d`` (its contractive form)."""
    k = kw.get("k")
    if cfg_method == "rand-k" and k is not None:
        return (f"error feedback, lr {k / d:.3g}", lambda: ServerSGD(lr=k / d), True)
    if cfg_method == "qsgd":
        w = float(np.sqrt(d))
    elif cfg_method == "eden":
        w = 0.6
    else:
        assert k is not None
        w = d / k - 1.0
    lr = 1.0 / (1.0 + w / n)
    return (f"server lr {lr:.3g}", lambda: ServerSGD(lr=lr), False)


# --- report ----------------------------------------------------------------------------------

def table(results: list[dict[str, Any]]) -> str:
    task = results[0]["task"]
    metric = results[0]["metric"]
    last = max(int(r) for r in results[0]["rounds"])
    base = next(r for r in results if r["method"] == "fedavg")
    base_up = np.mean([base["rounds"][str(r)]["bytes-up"] for r in range(1, last + 1)])
    base_final = base["rounds"][str(last)][metric]
    head = ["method", "variance control", *[f"{metric} r{r}" for r in range(0, last + 1)],
            "bytes up / round", "vs FedAvg", f"gap to FedAvg (r{last})",
            "decode s / round (after r1)"]
    rows = []
    for res in results:
        rounds = res["rounds"]
        up = np.mean([rounds[str(r)]["bytes-up"] for r in range(1, last + 1)])
        dec = [rounds[str(r)].get("rpsagg.decode-seconds") for r in range(2, last + 1)]
        dec_s = "-" if not dec or dec[0] is None else f"{np.mean(dec):.3f} (max {max(dec):.3f})"
        gap = rounds[str(last)][metric] - base_final
        gap_s = f"{100 * gap:+.2f} pt" if metric == "test-accuracy" else f"{gap:+.4g}"
        rows.append([res["label"], res["control"],
                     *[f"{rounds[str(r)][metric]:.4g}" for r in range(0, last + 1)],
                     f"{up:,.0f}", f"{base_up / up:.1f}x less" if up < base_up else "1x",
                     gap_s, dec_s])
    lines = [f"**{task}**, {results[0]['clients']} clients, {last} rounds", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = results[0]["metric"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = [plt.get_cmap("tab20")(i / 19) for i in range(20)]
    for i, res in enumerate(results):
        rounds = sorted(int(r) for r in res["rounds"])
        vals = [res["rounds"][str(r)][metric] for r in rounds]
        style = "-" if res["control"] == "none" else "--"
        label = res["label"] + ("" if res["control"] == "none" else " + VC")
        color = colors[i % len(colors)]
        ax1.plot(rounds, vals, style, marker=".", label=label, color=color)
        sent = np.cumsum([res["rounds"][str(r)]["bytes-up"] for r in rounds[1:]])  # from r1
        ax2.plot(sent / 2**20, vals[1:], style, marker=".", label=label, color=color)
    ax1.set(xlabel="round", ylabel=metric, title=f"{results[0]['task']}: {metric} per round")
    ax2.set(xlabel="MiB sent up (cumulative)", ylabel=metric, xscale="log",
            title="per byte sent")
    if metric == "test-loss":
        ax1.set_yscale("log")
        ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["fmnist", "wide"], choices=["fmnist", "wide"])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--examples-per-client", type=int, default=0,
                    help="fmnist shard size (0: all of it); wide: 400")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--solver", default="cg", choices=["auto", "exact", "cg"],
                    help="the spatial decoders' joint solver (RandProjSpatialFedAvg(solver=))")
    ap.add_argument("--quick", action="store_true",
                    help="5 clients; fmnist 5 rounds on 1,000 images each, wide 3 rounds")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "benchmark")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # the ServerApp
    for name in args.tasks:
        path = args.out / f"{name}.json"
        if not args.report_only:
            clients = 5 if args.quick else args.clients
            if name == "fmnist":
                rounds = 5 if args.quick else args.rounds
                task = fmnist_task(clients, 1000 if args.quick else args.examples_per_client,
                                   args.seed)
                d = 7850
            else:
                rounds = 3 if args.quick else args.rounds
                task = wide_task(clients, 200 if args.quick else 400, args.seed)
                d = 2_002_001
            results = [run(task, cfg, clients, rounds, args.seed, args.solver)
                       for cfg in configs(name, d, clients)]
            path.write_text(json.dumps(results, indent=1))
        results = json.loads(path.read_text())
        print(table(results))
        plot(results, args.out / f"{name}.png")
        print(f"[bench] {path}, {args.out / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
