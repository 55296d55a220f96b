"""The paper's three distributed optimization tasks, in-process.

Power iteration and k-means on Fashion-MNIST (test set, 32x32, d = 1024), linear regression
by SGD on UJIIndoorLoc (d = 512). The task logic is :mod:`rpsagg.tasks` (shared with the
service); this module drives rounds: every client computes its vectors from the global
state, encodes them, the server decodes each of the ``m`` vectors jointly and applies the
estimate. Per iteration it records the squared error of the mean estimate (for k-means the
average over the centroids) and the task loss after the update:

- power iteration: ``min(||v_t - v_top||, ||v_t + v_top||)`` (the sign of an eigenvector is
  arbitrary);
- k-means: the k-means objective, the sum over all rows of the squared distance to the
  nearest centroid;
- linear regression: the training MSE.

Seeds follow the service's rule, so a service run can be replayed exactly: vector j of
client i in round t is encoded with ``derive_round_seed(client_seed, nonce, client_id, j)``
where ``client_seed = seed_of(tag, run, t, i)``, ``nonce = seed_of(tag, run, t)`` (or the
service's recorded nonce) and ``client_id = client_name(i)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg import Estimator, VectorCorrelationTracker, make_estimator
from rpsagg.spec import derive_round_seed
from rpsagg.tasks import Task, make_task
from rpsagg.tasks.base import Shard
from rpsagg_experiments.runtime import TAGS, parallel_map, seed_of, write_csv
from rpsagg_experiments.splits import Dataset, fashion_mnist, shards, ujiindoorloc

DATASET = {"power-iteration": "fashion-mnist", "kmeans": "fashion-mnist", "linreg": "ujiindoorloc"}
DIM = {"power-iteration": 1024, "kmeans": 1024, "linreg": 512}
ITERATIONS = {"power-iteration": 30, "kmeans": 30, "linreg": 50}
PARAMS: dict[str, dict[str, float]] = {
    "power-iteration": {},
    "kmeans": {"centroids": 10, "updates": 1},
    "linreg": {"lr": 0.001},
}
#: label -> (estimator name, transform)
LINEUP: dict[str, tuple[str, str]] = {
    "rand-k": ("rand-k", "avg"),
    "rand-k-spatial(avg)": ("rand-k-spatial", "avg"),
    "rand-proj-spatial(avg)": ("rand-proj-spatial", "avg"),
    "rand-k-wangni": ("rand-k-wangni", "avg"),
    "induced": ("induced", "avg"),
    "rand-proj-spatial(auto)": ("rand-proj-spatial", "auto"),
}
#: (n, k) of the paper's main figure.
MAIN: dict[str, list[tuple[int, int]]] = {
    "power-iteration": [(10, 102), (50, 20)],
    "kmeans": [(10, 102), (50, 20)],
    "linreg": [(10, 50), (50, 10)],
}
#: Additional (n, k) of the appendix, per split.
APPENDIX: dict[str, dict[str, list[tuple[int, int]]]] = {
    "iid": {
        "power-iteration": [(10, 5), (10, 25), (10, 51), (50, 5), (50, 10)],
        "kmeans": [(10, 5), (10, 25), (10, 51), (50, 10), (50, 51)],
        "linreg": [(10, 5), (10, 25), (50, 1), (50, 5)],
    },
    "noniid": {
        "power-iteration": [(10, 5), (10, 25), (10, 51), (50, 5), (50, 10)],
        "kmeans": [(10, 5), (10, 25), (10, 51), (50, 5), (50, 10)],
        "linreg": [(10, 5), (10, 25), (50, 1), (50, 5), (50, 50)],
    },
}


def client_name(i: int) -> str:
    """Client id of client ``i`` (used in the seeds, as in the service)."""
    return f"client-{i:03d}"


@dataclass(frozen=True)
class Job:
    """One run of one estimator on one task setting."""

    task: str
    split: str
    n: int
    k: int
    estimator: str
    run: int
    iterations: int
    data_path: str | None = None
    nonces: tuple[int, ...] | None = None
    client_ids: tuple[str, ...] | None = None
    task_params: tuple[tuple[str, float], ...] = ()


@dataclass
class Trace:
    """Per-iteration results of one :class:`Job`."""

    job: Job
    sq_err: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    r_hat: list[float] = field(default_factory=list)
    encode_s: float = 0.0
    decode_s: float = 0.0


def load_dataset(task: str, data_path: str | None = None) -> Dataset:
    """The task's data set (cached per process)."""
    if DATASET[task] == "fashion-mnist":
        return fashion_mnist(None)
    return ujiindoorloc(data_path)


def build_task(task: str, overrides: Iterable[tuple[str, float]] = ()) -> Task:
    """The :mod:`rpsagg.tasks` task with the paper's parameters, then ``overrides``."""
    return make_task(task, DIM[task], {**PARAMS[task], **dict(overrides)})


def run_shards(job: Job, data: Dataset) -> list[Shard]:
    """The clients' shards for a job (the split's seed depends on the run only)."""
    return shards(data, job.n, job.split, seed_of(TAGS["tasks"], job.run, 0xDA7A))


def initial_seed(run: int) -> int:
    """Seed of the task's initial state in run ``run``."""
    return seed_of(TAGS["tasks"], run, 0x1717) >> 1


def round_nonce(run: int, t: int) -> int:
    """Nonce of round ``t`` in-process (the service draws its own and records it)."""
    return seed_of(TAGS["tasks"], run, t)


def client_seed(run: int, t: int, i: int) -> int:
    """The seed client ``i`` passes to ``derive_round_seed`` in round ``t``."""
    return seed_of(TAGS["tasks"], run, t, i, 0xC11E)


class Reference:
    """Full-data quantities for the task loss."""

    def __init__(self, task: Task, data: Dataset) -> None:
        self.task = task
        self.full = Shard(data.x, data.y)
        self.v_top: np.ndarray | None = None
        if task.name == "power-iteration":
            _, vecs = np.linalg.eigh(data.x.T @ data.x)
            self.v_top = vecs[:, -1]

    def loss(self, state: np.ndarray) -> float:
        """The paper's task loss of a global state."""
        if self.v_top is not None:
            v = self.v_top
            return float(min(np.linalg.norm(state - v), np.linalg.norm(state + v)))
        value = self.task.metric(state, self.full)
        assert value is not None
        if self.task.name == "kmeans":
            return value * self.full.x.shape[0]  # the objective is a sum, metric a mean
        return value


def make_lineup_estimator(label: str, n: int, k: int, d: int) -> Estimator:
    """The estimator behind a :data:`LINEUP` label."""
    name, transform = LINEUP[label]
    return make_estimator(name, n=n, k=k, d=d, transform=transform)


_REFERENCES: dict[tuple[str, str | None], Reference] = {}


def reference(task: Task, job: Job, data: Dataset) -> Reference:
    """The full-data :class:`Reference` of a task (cached per process)."""
    key = (job.task, job.data_path)
    if key not in _REFERENCES:
        _REFERENCES[key] = Reference(task, data)
    return _REFERENCES[key]


def run_job(job: Job) -> Trace:
    """Run one job: ``job.iterations`` rounds, recording error and loss each round."""
    data = load_dataset(job.task, job.data_path)
    task = build_task(job.task, job.task_params)
    ref = reference(task, job, data)
    client_shards = run_shards(job, data)
    ids = job.client_ids or tuple(client_name(i) for i in range(job.n))
    base = make_lineup_estimator(job.estimator, job.n, job.k, task.d)
    auto = LINEUP[job.estimator][1] == "auto"
    # transform=auto: vector j of every client is decoded with the prior of slot j (the
    # service's rule, so a service run replays bit for bit)
    tracker = VectorCorrelationTracker(task.m) if auto else None
    state = task.initial_state(initial_seed(job.run))
    trace = Trace(job)
    for t in range(job.iterations):
        ests = ([base.with_prior(p) for p in tracker.priors(job.n)]  # type: ignore[attr-defined]
                if tracker is not None else [base] * task.m)
        nonce = job.nonces[t] if job.nonces is not None else round_nonce(job.run, t)
        vecs = np.stack([task.client_vectors(state, s, t) for s in client_shards])  # (n, m, d)
        truth = vecs.mean(axis=0)
        start = time.perf_counter()
        seeds = [[derive_round_seed(client_seed(job.run, t, i), nonce, ids[i], j)
                  for i in range(job.n)] for j in range(task.m)]
        batches = [[ests[j].encode(vecs[i, j], seeds[j][i]) for i in range(job.n)]
                   for j in range(task.m)]
        mid = time.perf_counter()
        estimate = np.stack([e.decode(b) for e, b in zip(ests, batches, strict=True)])
        trace.encode_s += mid - start
        trace.decode_s += time.perf_counter() - mid
        if tracker is not None:
            trace.r_hat.append(tracker.update(batches)[0])
        trace.sq_err.append(float(np.sum((estimate - truth) ** 2)) / task.m)
        state = task.apply(state, estimate)
        trace.loss.append(ref.loss(state))
    return trace


#: Default grid per task: the appendix settings are cheap for linear regression only.
DEFAULT_GRID = {"power-iteration": "main", "kmeans": "main", "linreg": "all"}


def settings(task: str, split: str, grid: str) -> list[tuple[int, int]]:
    """(n, k) pairs: ``main`` (the paper's Figure 4), ``appendix`` or ``all``."""
    main = MAIN[task]
    extra = APPENDIX[split][task]
    if grid == "main":
        return list(main)
    if grid == "appendix":
        return list(extra)
    return list(main) + [p for p in extra if p not in main]


def prewarm_betas(jobs: Sequence[Job], workers: int, progress: bool) -> None:
    """Compute (and cache on disk) the Monte Carlo betas of the avg transform up front, so
    that the pool's workers do not compute the same one twice."""
    keys = sorted({(j.n, j.k, DIM[j.task]) for j in jobs
                   if LINEUP[j.estimator][0] == "rand-proj-spatial"})
    parallel_map(_beta_avg, keys, workers=workers, desc="betas", progress=progress)


def _beta_avg(key: tuple[int, int, int]) -> float:
    n, k, d = key  # the default projection for d, as the jobs' estimators use it
    return make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="avg").beta_bar


def summarize(traces: Sequence[Trace]) -> list[dict[str, Any]]:
    """Mean and standard deviation over runs, per (setting, estimator, iteration)."""
    groups: dict[tuple[str, str, int, int, str], list[Trace]] = {}
    for tr in traces:
        j = tr.job
        groups.setdefault((j.task, j.split, j.n, j.k, j.estimator), []).append(tr)
    rows = []
    for (task, split, n, k, est), trs in groups.items():
        err = np.array([tr.sq_err for tr in trs])
        loss = np.array([tr.loss for tr in trs])
        for t in range(err.shape[1]):
            rows.append({
                "task": task, "split": split, "n": n, "k": k, "estimator": est,
                "iteration": t + 1, "runs": len(trs),
                "sq_err_mean": float(err[:, t].mean()), "sq_err_std": float(err[:, t].std()),
                "loss_mean": float(loss[:, t].mean()), "loss_std": float(loss[:, t].std()),
            })
    return rows


def trace_rows(traces: Sequence[Trace]) -> list[dict[str, Any]]:
    """One row per (job, iteration): the raw per-run numbers."""
    rows = []
    for tr in traces:
        j = tr.job
        for t, (e, lo) in enumerate(zip(tr.sq_err, tr.loss, strict=True)):
            rows.append({"task": j.task, "split": j.split, "n": j.n, "k": j.k,
                         "estimator": j.estimator, "run": j.run, "iteration": t + 1,
                         "sq_err": e, "loss": lo})
    return rows


def make_jobs(
    task: str,
    *,
    splits: Sequence[str] = ("iid", "noniid"),
    grid: str = "all",
    runs: int = 10,
    iterations: int | None = None,
    estimators: Sequence[str] = tuple(LINEUP),
    data_path: str | None = None,
    task_params: tuple[tuple[str, float], ...] = (),
) -> list[Job]:
    """Every (split, n, k, estimator, run) job of a task."""
    iters = iterations or ITERATIONS[task]
    return [
        Job(task, split, n, k, est, run, iters, data_path, task_params=task_params)
        for split in splits
        for n, k in settings(task, split, grid)
        for est in estimators
        for run in range(runs)
    ]


def run(
    task: str,
    out: Path,
    *,
    quick: bool = False,
    workers: int = 2,
    progress: bool = True,
    data_path: str | None = None,
    grid: str | None = None,
    runs: int | None = None,
    task_params: tuple[tuple[str, float], ...] = (),
) -> list[dict[str, Any]]:
    """Run a task's experiments (task parameters: the paper's, then ``task_params``).

    Writes ``<task>.csv`` (per iteration), ``<task>-runs.csv`` (per run),
    ``<task>-verdict.csv`` (the paper's claim per setting) and the figures.
    """
    if quick:
        jobs = make_jobs(task, grid=grid or "main", runs=runs or 2,
                         iterations=max(5, ITERATIONS[task] // 3), data_path=data_path,
                         task_params=task_params)
        jobs = [j for j in jobs if (j.n, j.k) == MAIN[task][0]]
    else:
        jobs = make_jobs(task, grid=grid or DEFAULT_GRID[task], runs=runs or 10,
                         data_path=data_path, task_params=task_params)
    prewarm_betas(jobs, workers, progress)
    # longest jobs first (decode cost grows with nk and with m) for a balanced pool
    jobs.sort(key=lambda j: -(j.n * j.k) ** 2 * (10 if j.task == "kmeans" else 1))
    traces = parallel_map(run_job, jobs, workers=workers, desc=task, progress=progress)
    rows = summarize(traces)
    write_csv(out / f"{task}.csv", rows)
    write_csv(out / f"{task}-runs.csv", trace_rows(traces))
    from rpsagg_experiments.verdict import markdown, verdicts

    checked = verdicts(rows)
    write_csv(out / f"{task}-verdict.csv", checked)
    print(f"[{task}] the paper's claim, setting by setting ({task}-verdict.csv):\n"
          + markdown(checked, list(LINEUP)), flush=True)
    from rpsagg_experiments.plotting import plot_task

    plot_task(rows, out, task)
    return rows
