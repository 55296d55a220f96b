"""Benchmark: FedAvg against rpsagg's estimators at matched bytes up, with and without
variance control, on Fashion-MNIST (a small CNN with BatchNorm) and on a 2,002,001-parameter
model.

    python benchmark.py --quick                  # both tasks, 5 clients: ~10 min on 2 cores
    python benchmark.py --quick --decode-sweep   # plus decode times for k = 10 .. d/2
    python benchmark.py --quick --tasks fmnist --seeds 1 2 3 --only 4-bit EDEN
    python benchmark.py --quick --tasks fmnist --seeds 1 2 3 --partial  # partial replies
    python benchmark.py                          # 10 clients, 10 rounds, whole shards
    python benchmark.py --report-only --out DIR  # tables and plots from DIR's JSON

Each run drives Flower's own objects in this process: the strategy (Flower's ``FedAvg`` or
``RandProjSpatialFedAvg``) configures each round, a real ``ClientApp`` with
``mods=[rpsagg_mod]`` answers every node's message with a ``Context`` kept per node across
rounds (as a SuperNode keeps it: the error-feedback memory lives there), and the replies
go to ``aggregate_train``. Only the transport is left out (``run_comparison.py`` and
``tests/flower/test_e2e.py`` run the example app over real SuperLinks and SuperNodes).
Bytes up are the replies' wire bytes, as Flower 1.42 pushes them
(``rpsagg_flower.wire.wire_bytes`` of every reply ``Message``: its metadata, records,
arrays' descriptions and chunks, each with its object header); ``payload-bytes-up`` beside
them is the data and keys alone (Flower's ``count_bytes`` of every reply's ``ArrayRecord``
or, for compressed replies, of the record that carries the packed reply:
``rpsagg_flower.carrier.payload_bytes``). Decode time is the strategy's
``rpsagg.decode-seconds``. Seeds are fixed (``--seed``/``--seeds``): model
initialization, nonces, client seeds, minibatch order and Flower's node sampling. The
thread pools are pinned (``--threads``, default 2: torch's, OpenMP's and BLAS's), since the
thread count orders the float sums; each run's JSON records its command and
``environment`` (threads, machine, library versions).

Tasks:

* ``fmnist``: the CNN of ``fmnist_app.cnn`` (two conv-BatchNorm-ReLU-pool blocks and a
  linear layer: d = 20,586 trainable parameters, plus BatchNorm's running statistics,
  sent uncompressed, and int64 counters), sent as PyTorch state dicts in
  ArrayRecords; IID shards, one local epoch of SGD with momentum; metric: test
  accuracy on the 10,000 test images.
* ``wide``: a linear model y = x W + b + s with W float32 1000 x 2000, b float16 (2000),
  s float64 (a scalar): 2,002,001 parameters. Each client holds synthetic data from the
  same teacher plus client noise and takes a few gradient steps on the mean squared error;
  metric: the loss on held-out data.
"""

from __future__ import annotations

import os
import sys

#: the environment variables that size the OpenMP, MKL and OpenBLAS thread pools: read once,
#: when numpy and torch load them, so they are set here, before those imports
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
DEFAULT_THREADS = 2


def _argv_threads(argv: list[str]) -> int:
    """``--threads N`` (or ``--threads=N``) of a command line, else :data:`DEFAULT_THREADS`."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith("--threads=") and arg[10:].isdigit():
            return int(arg[10:])
    return DEFAULT_THREADS


if __name__ == "__main__":  # as a script: the pools are sized before numpy and torch start
    for _var in THREAD_VARS:
        os.environ[_var] = str(_argv_threads(sys.argv[1:]))

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fmnist_app import cnn  # noqa: E402
from fmnist_app.task import load, partition  # noqa: E402

from rpsagg.spec import mix64  # noqa: E402
from rpsagg_flower import RandProjSpatialFedAvg, ServerSGD, make_rpsagg_mod  # noqa: E402
from rpsagg_flower.carrier import payload_bytes  # noqa: E402
from rpsagg_flower.optim import ServerOptimizer  # noqa: E402
from rpsagg_flower.payload import Layout  # noqa: E402
from rpsagg_flower.wire import wire_bytes  # noqa: E402


def pin_threads(threads: int) -> None:
    """Size every thread pool the runs use: torch's intra-op pool (``torch.set_num_threads``)
    and, through threadpoolctl, the OpenMP and BLAS pools numpy and torch loaded (as a script,
    ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` were also set
    before they loaded). The thread count changes the order of torch's and BLAS's float
    sums, and so the trained models: a result repeats bit for bit at the same count on the
    same machine and library builds."""
    torch.set_num_threads(threads)
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # torch's pool is pinned all the same
        return
    threadpool_limits(threads)


def environment(threads: int) -> dict[str, Any]:
    """What a rerun elsewhere can differ by: the machine, the library versions and the
    thread counts the run used (the JSON's ``environment``)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for name in ("torch", "numpy", "flwr", "rpsagg", "rpsagg-flower"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "-"
    pools: dict[str, int] = {}
    try:
        from threadpoolctl import threadpool_info

        pools = {f"{p['internal_api']} ({p.get('user_api', '')})": int(p["num_threads"])
                 for p in threadpool_info()}
    except ImportError:
        pass
    return {"threads": threads, "torch-threads": torch.get_num_threads(), "pools": pools,
            "platform": platform.platform(), "python": platform.python_version(),
            "cpu": cpu, "cpu-count": os.cpu_count(), "versions": versions}


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
    uncompressed: tuple[str, ...] = ()  # float arrays sent uncompressed (BatchNorm buffers)
    # a client that fine-tunes the head alone on frozen features (fmnist): the whole model
    # back, every other array exactly as received; and the head's keys
    train_head: Callable[[int, ArrayRecord, int], tuple[ArrayRecord, float, int]] | None = None
    head: tuple[str, ...] = ()


def fmnist_task(clients: int, examples: int, seed: int, test_examples: int = 0,
                arch: ModuleType = cnn) -> Task:
    """The small CNN with BatchNorm (``fmnist_app.cnn``; or ``arch``, ``fmnist_app.mlp``) on
    IID shards of Fashion-MNIST, evaluated on the test set (its first ``test_examples``
    images; 0: all 10,000). The task is ``fmnist`` (the CNN) or ``fmnist-mlp``."""
    x_test, y_test = load("t10k")
    if test_examples:
        x_test, y_test = x_test[:test_examples], y_test[:test_examples]
    test_images = arch.images(x_test)
    shards = [partition(i, clients, examples) for i in range(clients)]
    shard_images = [arch.images(x) for x, _ in shards]

    def initial() -> ArrayRecord:
        return arch.initial(seed)

    def train_fn(node: int, arrays: ArrayRecord, rnd: int,
                 trainable: tuple[str, ...] | None = None) -> tuple[ArrayRecord, float, int]:
        y = shards[node - 1][1]
        new, loss = arch.train(arrays, shard_images[node - 1], y, epochs=1, lr=0.01, batch=32,
                               seed=mix64(seed * 1_000_003 + 1000 * rnd + node) % 2**63,
                               trainable=trainable)
        return new, loss, len(y)

    def train_head(node: int, arrays: ArrayRecord, rnd: int
                   ) -> tuple[ArrayRecord, float, int]:
        return train_fn(node, arrays, rnd, trainable=arch.HEAD)

    def eval_fn(arrays: ArrayRecord) -> dict[str, float]:
        loss, acc = arch.evaluate(arrays, test_images, y_test)
        return {"test-loss": loss, "test-accuracy": acc}

    return Task("fmnist" if arch is cnn else "fmnist-mlp", initial, train_fn, eval_fn,
                "test-accuracy", uncompressed=tuple(arch.buffer_names()),
                train_head=train_head, head=arch.HEAD)


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
    budget: str = ""  # the plot's panel: "~30x", "~80x", "1-bit"
    # "all": every node trains every array; "mixed": the even nodes fine-tune the head alone
    # (Task.train_head) and reply with every array; "mixed-partial": they reply with the
    # head's arrays alone (the strategy's partial="allow")
    clients: str = "all"


def client_app(task: Task, seed: int, clients: str = "all") -> ClientApp:
    def client_seed(msg: Message, ctxt: Context) -> int:
        rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        return mix64(mix64(seed) ^ mix64(ctxt.node_id) ^ rnd)

    app = ClientApp(mods=[make_rpsagg_mod(context_seeds=client_seed)])

    @app.train()
    def fit(msg: Message, ctxt: Context) -> Message:
        rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        received = msg.content.array_records["arrays"]
        if clients != "all" and ctxt.node_id % 2 == 0:
            assert task.train_head is not None, f"{task.name} has no head-only training"
            arrays, loss, n = task.train_head(ctxt.node_id, received, rnd)
            if clients == "mixed-partial":
                arrays = ArrayRecord({key: arrays[key] for key in task.head})
        else:
            arrays, loss, n = task.train(ctxt.node_id, received, rnd)
        metrics = MetricRecord({"train-loss": loss, "num-examples": n})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


def run(task: Task, cfg: Config, clients: int, rounds: int, seed: int,
        solver: str = "auto", error_tol: float | str | None = "auto") -> dict[str, Any]:
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
            error_feedback=cfg.error_feedback, solver=solver, error_tol=error_tol,
            uncompressed=task.uncompressed, **cfg.extra,
            **common)
    # Flower's node sampling (strategy_utils.sample_nodes) draws from Python's global
    # random: its order is the order of the replies and so of FedAvg's float sums, which
    # chaotic training amplifies (unseeded, four FedAvg runs ended 0.8438 to 0.8458).
    random.seed(seed)
    torch.manual_seed(seed)  # nothing here draws from it (the CNN's seeds are explicit)
    app = client_app(task, seed, cfg.clients)
    contexts = {n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(),
                           run_config={}) for n in range(1, clients + 1)}
    arrays = task.initial()
    log: dict[str, dict[str, float]] = {"0": task.evaluate(arrays)}
    grid = Nodes(clients)
    for rnd in range(1, rounds + 1):
        started = time.perf_counter()
        if isinstance(strategy, RandProjSpatialFedAvg):  # this loop drives it: no wrapper
            with strategy.driving():
                messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
        else:
            messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
        replies = [app(m, contexts[m.metadata.dst_node_id]) for m in messages]
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            raise RuntimeError(f"{cfg.label}: error replies in round {rnd}: {errors[:2]}")
        sizes: dict[str, int] = {}
        up = sum(wire_bytes(r, sizes) for r in replies)
        payload = sum(payload_bytes(r.content) for r in replies)
        new, metrics = strategy.aggregate_train(rnd, replies)
        if new is None or metrics is None:
            raise RuntimeError(f"{cfg.label}: round {rnd} produced no model")
        arrays = new
        entry = task.evaluate(arrays)
        entry["bytes-up"] = float(up)
        entry["payload-bytes-up"] = float(payload)
        entry["round-seconds"] = time.perf_counter() - started
        for key in ("rpsagg.decode-seconds", "rpsagg.bytes-up", "rpsagg.compression-ratio"):
            if key in metrics:
                entry[key] = float(metrics[key])  # type: ignore[arg-type]
        log[str(rnd)] = entry
        decode = entry.get("rpsagg.decode-seconds")
        print(f"[bench] {task.name} {cfg.label} ({cfg.control}) round {rnd}: "
              f"{task.metric} {entry[task.metric]:.4f}, {up:,} B up "
              f"({payload:,} B payload)"
              + (f", decode {decode:.3f} s" if decode is not None else ""), flush=True)
    return {"task": task.name, "label": cfg.label, "solver": solver, "error-tol": error_tol,
            "method": cfg.method,
            "budget": cfg.budget,
            "k": cfg.k,
            "value-bits": cfg.value_bits, "bits": cfg.bits, "control": cfg.control,
            "client-mix": cfg.clients,
            "clients": clients, "rounds": log, "metric": task.metric, "seed": seed}


def compressed_size(task: Task) -> int:
    """d: the coordinates the mod compresses (floating-point arrays not sent as they are)."""
    return Layout.of(task.initial(), task.uncompressed).d


def budgets(task: str, d: int) -> list[tuple[int, int, int, int]]:
    """``(ratio, k, k8, k4)``: the budgets of the sparsifiers and projections, as k float32
    values, k8 8-bit or k4 4-bit codes per reply, for about ``ratio`` times fewer wire bytes
    up than FedAvg (the table prints the ratio counted from the replies).

    fmnist: on the wire (``rpsagg_flower.wire.wire_bytes``) FedAvg's reply is 90,113 B and a
    packed compressed reply carries about 945 B besides its values or codes (BatchNorm's
    statistics and counters raw, 400 B; a scale; 69 B of rpsagg framing; the 474 B of
    Flower's ``Message``, ``RecordDict`` and metrics that FedAvg's reply has too). ~30x
    leaves 3,004 - 945 B: 2,048 B of values or codes, k = 512 float32 values, k8 = 2,048
    8-bit or k4 = 4,096 4-bit codes (30.1x). 100x (901 B a reply) is below the overhead
    alone, so the second budget is ~80x: k = 50, k8 = 200, k4 = 400 (200 B; 79.0x and
    78.6x).
    wide: the overhead is negligible beside d = 2,002,001 floats (k = d/100)."""
    if task == "fmnist":
        return [(30, 512, 2048, 4096), (80, 50, 200, 400)]
    k = d // 100
    return [(100, k, 4 * k, 8 * k)]


def configs(task: str, d: int, n: int) -> list[Config]:
    """FedAvg and the estimators at matched bytes up (:func:`budgets`), each with and
    without variance control; QSGD and EDEN at 1 bit per coordinate (what they can do:
    ~18x for fmnist's CNN, whose d pads to 2^15 for EDEN; 16x and 30x for the wide
    model). The wide model's quantized Rand-Proj-Spatial is 8-bit only: at 8 d/100 = 0.8 d
    4-bit codes are no compression at all."""
    out = [Config("FedAvg", "fedavg")]
    for i, (ratio, k, k8, k4) in enumerate(budgets(task, d)):
        kinds = [
            (f"Rand-k k={k}", "rand-k", {"k": k}),
            (f"Rand-k-Spatial k={k}", "rand-k-spatial", {"k": k}),
            (f"Rand-Proj-Spatial k={k}", "rand-proj-spatial", {"k": k}),
            (f"Rand-Proj-Spatial k={k8}, 8-bit", "rand-proj-spatial",
             {"k": k8, "value_bits": 8}),
        ]
        if task == "fmnist":
            kinds.append((f"Rand-Proj-Spatial k={k4}, 4-bit", "rand-proj-spatial",
                          {"k": k4, "value_bits": 4}))
        if i == 0:
            kinds += [("QSGD 1-bit", "qsgd", {"bits": 1}), ("EDEN 1-bit", "eden", {"bits": 1})]
        for label, method, kw in kinds:
            budget = "1-bit" if method in ("qsgd", "eden") else f"~{ratio}x"
            out.append(Config(label, method, budget=budget, **kw))  # type: ignore[arg-type]
            name, opt, ef = _control(task, method, kw, d, n)
            out.append(Config(label, method, control=name, optimizer=opt, error_feedback=ef,
                              budget=budget, **kw))  # type: ignore[arg-type]
    return out


def partial_configs(d: int) -> list[Config]:
    """Clients of two kinds (``--partial``, fmnist): the odd nodes train every array, the
    even nodes fine-tune the classifier head alone on frozen features. FedAvg with every
    node training every array is the reference; then FedAvg and 4-bit Rand-Proj-Spatial at
    the ~30x budget with the head-only nodes replying in full (their other arrays unchanged:
    marked zero, left out of the sketch, counted as a zero update) and with the head alone
    (``partial="allow"``: each array averaged over the replies that carry it)."""
    k4 = budgets("fmnist", d)[0][3]
    rps = {"k": k4, "value_bits": 4, "budget": "~30x"}
    return [
        Config("FedAvg", "fedavg"),
        Config("FedAvg, even nodes train the head, reply in full", "fedavg", clients="mixed",
               budget="~30x"),
        Config(f"Rand-Proj-Spatial k={k4}, 4-bit", "rand-proj-spatial",
               **rps),  # type: ignore[arg-type]
        Config(f"Rand-Proj-Spatial k={k4}, 4-bit, even nodes train the head, reply in full",
               "rand-proj-spatial", clients="mixed", **rps),  # type: ignore[arg-type]
        Config(f"Rand-Proj-Spatial k={k4}, 4-bit, even nodes train the head, reply with it "
               "alone", "rand-proj-spatial", clients="mixed-partial",
               extra={"partial": "allow"}, **rps),  # type: ignore[arg-type]
    ]


def _control(task: str, cfg_method: str, kw: dict[str, Any], d: int, n: int
             ) -> tuple[str, Callable[[], ServerOptimizer], bool]:
    """The variance control of a configuration: a server step matched to the estimator's
    variance. A decoded mean of n independent unbiased estimates with relative variance
    ``w`` (``E||g - u||^2 <= w ||u||^2 / n`` for identical updates ``u``) changes the
    squared error by ``(1 - lr)^2 + lr^2 w / n`` per round (``docs/flower.md``), least at
    ``lr = 1 / (1 + w / n)``. ``w``: ``(d/k)(1 + q) - 1`` for the sparsifiers (the spatial
    decoders only do better), where ``q`` is the b-bit codes' rounding: stochastic rounding
    to ``2^b - 1`` steps over ``[-s, s]`` (s the largest of k near-Gaussian values, s^2 about
    ``2 ln(k)`` times their mean square) adds at most ``s^2 / (2^b - 1)^2`` per value, so
    ``q = 2 ln(k) / (2^b - 1)^2`` (0.074 at 4 bits, k = 4,096; 2e-4 at 8 bits; 0 for
    float32); QSGD with one level ``sqrt(d)``; EDEN 1-bit about 0.6 (its paper's bound).
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
        bits = int(kw.get("value_bits", 32))
        q = 0.0 if bits >= 32 else 2.0 * np.log(k) / (2**bits - 1) ** 2
        w = d / k * (1.0 + q) - 1.0
    lr = 1.0 / (1.0 + w / n)
    return (f"server lr {lr:.3g}", lambda: ServerSGD(lr=lr), False)


# --- report ----------------------------------------------------------------------------------

def table(results: list[dict[str, Any]]) -> str:
    """The markdown table: one row per configuration; with several seeds the metric is the
    mean over seeds and the gap to FedAvg is given per seed too (each seed's FedAvg)."""
    task = results[0]["task"]
    metric = results[0]["metric"]
    last = max(int(r) for r in results[0]["rounds"])
    seeds = sorted({r["seed"] for r in results})
    base = {r["seed"]: r for r in results
            if r["method"] == "fedavg" and r.get("client-mix", "all") == "all"}
    base_up = np.mean([base[seeds[0]]["rounds"][str(r)]["bytes-up"] for r in range(1, last + 1)])
    head = ["method", "variance control", *[f"{metric} r{r}" for r in range(0, last + 1)],
            "bytes up / round", "payload / round", "vs FedAvg", f"gap to FedAvg (r{last})",
            "decode s / round (after r1)"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for res in results:
        groups.setdefault((res["label"], res["control"]), []).append(res)
    rows = []
    for (label, control), runs in groups.items():
        def mean(r: int, key: str = metric, runs: list[dict[str, Any]] = runs) -> float:
            return float(np.mean([x["rounds"][str(r)][key] for x in runs]))

        up = np.mean([mean(r, "bytes-up") for r in range(1, last + 1)])
        payload = [x["rounds"][str(r)].get("payload-bytes-up") for x in runs
                   for r in range(1, last + 1)]
        payload_s = "-" if None in payload else f"{np.mean(payload):,.0f}"
        dec = [x["rounds"][str(r)].get("rpsagg.decode-seconds") for x in runs
               for r in range(2, last + 1)]
        dec_s = "-" if not dec or dec[0] is None else f"{np.mean(dec):.3f} (max {max(dec):.3f})"
        gaps = [x["rounds"][str(last)][metric] - base[x["seed"]]["rounds"][str(last)][metric]
                for x in runs]
        scale, unit = (100, " pt") if metric == "test-accuracy" else (1, "")
        gap_s = f"{scale * np.mean(gaps):+.2f}{unit}" if unit else f"{np.mean(gaps):+.4g}"
        cells = [f"{mean(r):.4g}" for r in range(0, last + 1)]
        if len(gaps) > 1:  # the spread across seeds: the sample standard deviation
            spread = np.std([x["rounds"][str(last)][metric] for x in runs], ddof=1)
            cells[-1] += f" ± {spread:.2g}"
            gap_s += (f" ± {scale * np.std(gaps, ddof=1):.2f}" if unit
                      else f" ± {np.std(gaps, ddof=1):.3g}")
            gap_s += " (" + ", ".join(f"{scale * g:+.2f}" if unit else f"{g:+.3g}"
                                      for g in gaps) + ")"
        rows.append([label, control, *cells,
                     f"{up:,.0f}", payload_s,
                     f"{base_up / up:.1f}x less" if up < base_up else "1x",
                     gap_s, dec_s])
    seeds_s = f"seed {seeds[0]}" if len(seeds) == 1 else (
        f"seeds {', '.join(map(str, seeds))} (metric: the mean, ± the standard deviation "
        f"across seeds in the last round; gap: the mean ± its standard deviation, then per "
        f"seed)")
    lines = [f"**{task}**, {results[0]['clients']} clients, {last} rounds, {seeds_s}", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """One panel per budget (its runs and FedAvg; dashed: with variance control), and the
    metric per MiB sent up of every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in results if r["seed"] == results[0]["seed"]]  # the first seed's
    metric = results[0]["metric"]
    def mix(r: dict[str, Any]) -> str:
        return str(r.get("client-mix", "all"))

    base = next(r for r in results if r["method"] == "fedavg" and mix(r) == "all")
    groups: dict[str, list[dict[str, Any]]] = {}
    for res in results:
        if res is not base:
            groups.setdefault(res.get("budget") or "compressed", []).append(res)
    panels = len(groups) + 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 5.2), squeeze=False)
    cmap = plt.get_cmap("tab10")
    families = sorted({(r["method"], r["value-bits"], mix(r)) for r in results})
    hue = {fam: cmap(i % 10) for i, fam in enumerate(families)}  # one per estimator and mix
    color = {r["label"]: "black" if r is base else hue[(r["method"], r["value-bits"], mix(r))]
             for r in results}

    def curve(ax: Any, res: dict[str, Any], per_byte: bool) -> None:
        rounds = sorted(int(r) for r in res["rounds"])
        vals = [res["rounds"][str(r)][metric] for r in rounds]
        style = "-" if res["control"] == "none" else "--"
        label = res["label"] + ("" if res["control"] == "none" else " + VC")
        if per_byte:
            sent = np.cumsum([res["rounds"][str(r)]["bytes-up"] for r in rounds[1:]])
            ax.plot(sent / 2**20, vals[1:], style, marker=".", color=color[res["label"]],
                    label=label)
        else:
            ax.plot(rounds, vals, style, marker=".", color=color[res["label"]], label=label)

    for ax, (name, runs) in zip(axes[0], groups.items(), strict=False):
        for res in [base, *runs]:
            curve(ax, res, per_byte=False)
        ax.set(xlabel="round", ylabel=metric, title=f"{results[0]['task']}: {name} fewer bytes"
               if name.endswith("x") else f"{results[0]['task']}: {name} quantizers")
        ax.legend(fontsize=7, loc="best")
    ax = axes[0][-1]
    for res in results:
        curve(ax, res, per_byte=True)
    ax.set(xlabel="MiB sent up (cumulative)", ylabel=metric, xscale="log",
           title="per byte sent (dashed: + variance control)")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        if metric == "test-loss":
            ax.set_yscale("log")
    env = results[0].get("environment")
    if env:  # the figure carries its command and machine
        fig.text(0.005, 0.005, f"{results[0].get('command', 'benchmark.py')}; "
                 f"{env['threads']} thread(s), {env['cpu']}, {env['cpu-count']} CPUs; "
                 + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
                 fontsize=7, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1) if env else (0, 0, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def decode_sweep(d: int, clients: list[int], seed: int, rounds: int = 4) -> list[dict[str, Any]]:
    """Decode time per round of the spatial decoders with the strategy's defaults
    (``make_estimator`` with ``method="auto"``, ``projection="auto"``) at dimension ``d``,
    for k from 1 to d/2 (float32 values; 8-bit codes too): ``rounds`` rounds of fresh seeds
    on correlated updates; round 1 pays beta's Monte Carlo (cached afterwards)."""
    import rpsagg

    rng = np.random.default_rng(seed)
    out = []
    ks = sorted({max(1, d // r) for r in (2000, 1000, 400, 200, 100, 50, 38, 20, 10, 4, 2)})
    for n in clients:
        base = rng.standard_normal(d)
        xs = [base + 0.5 * rng.standard_normal(d) for _ in range(n)]
        for name, bits in (("rand-k-spatial", 32), ("rand-proj-spatial", 32),
                           ("rand-proj-spatial", 8)):
            for k in ks:
                est = rpsagg.make_estimator(name, n=n, k=k, d=d, value_bits=bits)
                times, solver = [], ""
                for rnd in range(rounds):
                    msgs = [est.encode(x, seed=mix64(seed * 7919 + rnd * 1009 + i))
                            for i, x in enumerate(xs)]
                    started = time.perf_counter()
                    result = est.decode_with_info(msgs)
                    times.append(time.perf_counter() - started)
                    solver = result.solve.method if result.solve is not None else "-"
                row = {"estimator": name, "value-bits": bits, "n": n, "k": k, "d": d,
                       "round-1-s": times[0], "after-round-1-max-s": max(times[1:]),
                       "solver": solver}
                out.append(row)
                print(f"[bench] decode {name} {bits}-bit n={n} k={k}: round 1 "
                      f"{times[0]:.3f} s, after {max(times[1:]):.4f} s ({solver})", flush=True)
    return out


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Decode milliseconds per round after round 1 (the slowest of rounds 2+), one row per
    estimator and n, one column per k; the solver ``"auto"`` chose in brackets where it
    built the Gram matrix."""
    ks = sorted({r["k"] for r in rows})
    head = ["estimator", "values", "n", *[f"k={k:,}" for k in ks]]
    lines = [f"**decode ms per round after round 1** (slowest of rounds 2-4), "
             f"d = {rows[0]['d']:,}", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    cells: dict[tuple[str, int, int], dict[int, str]] = {}
    for r in rows:
        mark = " (exact)" if r["solver"].startswith("exact") else ""
        cells.setdefault((r["estimator"], r["value-bits"], r["n"]), {})[r["k"]] = (
            f"{1000 * r['after-round-1-max-s']:.1f}{mark}")
    for (name, bits, n), by_k in cells.items():
        lines.append(f"| {name} | {bits}-bit | {n} | "
                     + " | ".join(by_k.get(k, "-") for k in ks) + " |")
    worst = max(rows, key=lambda r: r["after-round-1-max-s"])
    first = max(rows[1:], key=lambda r: r["round-1-s"])  # rows[0] pays scipy's import
    lines += ["", f"Slowest after round 1: {1000 * worst['after-round-1-max-s']:.1f} ms "
              f"({worst['estimator']}, {worst['value-bits']}-bit, n = {worst['n']}, "
              f"k = {worst['k']:,}); slowest round 1 (beta's Monte Carlo where it is not "
              f"cached yet): {1000 * first['round-1-s']:.1f} ms."]
    return "\n".join(lines)


def _error_tol(text: str) -> float | str | None:
    """``--error-tol``: a number, ``auto`` or ``none``."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, 'auto' or 'none'; got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["fmnist", "wide"], choices=["fmnist", "wide"])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--examples-per-client", type=int, default=0,
                    help="fmnist shard size (0: all of it); wide: 400")
    ap.add_argument("--test-examples", type=int, default=0,
                    help="fmnist: evaluate on the test set's first N images (0: all 10,000; "
                         "evaluation is most of a short run's time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="run every configuration once per seed (default: --seed alone); the "
                         "table gives the mean and each seed's gap to that seed's FedAvg")
    ap.add_argument("--only", nargs="+", metavar="TEXT",
                    help="only the configurations whose label contains one of these (FedAvg "
                         "always runs)")
    ap.add_argument("--solver", default="auto", choices=["auto", "exact", "cg"],
                    help="the spatial decoders' joint solver (RandProjSpatialFedAvg(solver=))")
    ap.add_argument("--error-tol", type=_error_tol, default="auto",
                    help="RandProjSpatialFedAvg(error_tol=): the SRHT decodes' conjugate "
                         "gradients also stop once the solve moves the estimate by at most "
                         "this times a bound below the estimator's RMS error; 'auto' (the "
                         "strategy's default: 1e-2 for blockwise rounds) or 'none'")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                    help="torch's, OpenMP's and BLAS's threads (default %(default)s: the "
                         "count the measured tables were run with; the same count repeats "
                         "a run bit for bit, another count changes the float sums' order)")
    ap.add_argument("--quick", action="store_true",
                    help="5 clients; fmnist 5 rounds on 1,000 images each, wide 3 rounds on "
                         "200 examples each")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "benchmark")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--partial", action="store_true",
                    help="fmnist: instead of the estimators' table, clients of two kinds (the "
                         "even nodes fine-tune the head alone) replying in full or with the "
                         "head alone (partial replies), against FedAvg")
    ap.add_argument("--decode-sweep", action="store_true",
                    help="also time the spatial decoders at fmnist's d for k from 1 to d/2 "
                         "(n = 5 and 10), without training")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    if args.test_examples < 0:
        ap.error("--test-examples must be 0 (all) or more")
    if args.partial and args.tasks != ["fmnist"]:
        ap.error("--partial is an fmnist experiment: give --tasks fmnist")
    pin_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.decode_sweep:
        sweep = args.out / "decode-sweep.json"
        if not args.report_only:
            d = Layout.of(cnn.initial(args.seed), cnn.buffer_names()).d  # fmnist's
            sweep.write_text(json.dumps(decode_sweep(d, [5, 10], args.seed), indent=1))
        print(sweep_table(json.loads(sweep.read_text())))
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # the ServerApp
    for name in args.tasks:
        path = args.out / f"{name}.json"
        if not args.report_only:
            clients = 5 if args.quick else args.clients
            rounds = (5 if name == "fmnist" else 3) if args.quick else args.rounds
            results = []
            for seed in args.seeds or [args.seed]:  # each seed: its data and initial model
                task = (fmnist_task(clients, 1000 if args.quick else args.examples_per_client,
                                    seed, args.test_examples) if name == "fmnist"
                        else wide_task(clients, 200 if args.quick else 400, seed))
                every = (partial_configs(compressed_size(task)) if args.partial
                         else configs(name, compressed_size(task), clients))
                chosen = [cfg for cfg in every
                          if cfg.method == "fedavg" or not args.only
                          or any(text in cfg.label for text in args.only)]
                results += [run(task, cfg, clients, rounds, seed, args.solver, args.error_tol)
                            for cfg in chosen]
            env = environment(args.threads)
            command = "benchmark.py " + " ".join(
                shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
            for res in results:
                res["environment"], res["command"] = env, command
            path.write_text(json.dumps(results, indent=1))
        results = json.loads(path.read_text())
        print(table(results))
        env = results[0].get("environment")
        if env:
            print(f"\n{env['threads']} thread(s); {env['cpu']}, {env['cpu-count']} CPUs, "
                  f"{env['platform']}; " + ", ".join(f"{k} {v}"
                                                      for k, v in env["versions"].items()))
        plot(results, args.out / f"{name}.png")
        print(f"[bench] {path}, {args.out / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
