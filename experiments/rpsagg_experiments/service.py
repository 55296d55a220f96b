"""``--via-service``: a task through a real ``rpsagg-server`` and client processes (gRPC).

:func:`run_via_service` starts ``rpsagg-server`` (plain-text, in-memory store, a free
port) and n :mod:`~rpsagg_experiments.service_client` processes on this machine, lets them
run the task, and collects the server's per-round estimates and nonces. The server draws
its round nonces itself, so the in-process run is then replayed with those nonces and the
same client ids and seeds (:class:`~rpsagg_experiments.optimization.Job` ``nonces`` and
``client_ids``); :func:`compare` checks that both give the same per-iteration numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from rpsagg_experiments.launch import LocalJob, ServerProcess
from rpsagg_experiments.optimization import (
    DIM,
    ITERATIONS,
    LINEUP,
    MAIN,
    PARAMS,
    Job,
    Trace,
    build_task,
    client_name,
    initial_seed,
    load_dataset,
    reference,
    run_job,
    run_shards,
)
from rpsagg_experiments.runtime import write_csv


@dataclass
class ServiceRun:
    """What a service run produced, and its in-process replay."""

    service: Trace
    replay: Trace
    seconds: float


#: Task parameter -> ``rpsagg-server`` flag (integers where the server wants them).
SERVER_FLAGS: dict[str, tuple[str, type]] = {
    "lr": ("--lr", float),
    "centroids": ("--centroids", int),
    "updates": ("--kmeans-updates", int),
}


def server_flags(params: dict[str, float]) -> list[str]:
    """The ``rpsagg-server`` flags that set the task parameters ``params``."""
    flags: list[str] = []
    for key, value in params.items():
        if key not in SERVER_FLAGS:
            raise ValueError(f"no rpsagg-server flag for task parameter {key!r}")
        flag, kind = SERVER_FLAGS[key]
        flags += [flag, str(kind(value))]
    return flags


def service_job(job: Job, workdir: Path, timeout: float = 600.0) -> ServiceRun:
    """Run ``job`` through the service and replay it in-process."""
    name, transform = LINEUP[job.estimator]
    server_args = [
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
        "--db", ":memory:", "--n", str(job.n), "--k", str(job.k), "--d", str(DIM[job.task]),
        "--estimator", name, "--transform", transform, "--task", job.task,
        "--rounds", str(job.iterations), "--seed", str(initial_seed(job.run)),
        "--round-timeout", str(timeout), "--min-clients", str(job.n), "--linger", "5",
    ]
    server_args += server_flags({**PARAMS[job.task], **dict(job.task_params)})
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    with ExitStack() as logs:
        def log(name: str) -> IO[bytes]:
            return logs.enter_context((workdir / name).open("wb"))

        server = ServerProcess(server_args, workdir / "port", env=env, stdout=log("server.log"),
                               stderr=subprocess.STDOUT)
        with LocalJob(server, client_env=env) as local:
            for i in range(job.n):
                cmd = [
                    "--server", local.target, "--client-id", client_name(i),
                    "--task", job.task, "--split", job.split, "--n", str(job.n),
                    "--k", str(job.k), "--run", str(job.run),
                    "--out", str(workdir / f"c{i}.json"),
                ]
                if job.data_path:
                    cmd += ["--data-path", job.data_path]
                local.start_client(cmd, module="rpsagg_experiments.service_client",
                                   stdout=log(f"c{i}.log"), stderr=subprocess.STDOUT)
            if any(code != 0 for code in local.wait_clients(timeout)):
                raise RuntimeError(f"a client failed; see {workdir}")
    seconds = time.perf_counter() - start
    records = [json.loads((workdir / f"c{i}.json").read_text()) for i in range(job.n)]
    ids = [""] * job.n
    for rec in records:
        ids[int(rec["index"])] = rec["client_id"]
    lead = next(r for r in records if int(r["index"]) == 0)
    steps = sorted(lead["rounds"], key=lambda e: int(e["step"]))
    nonces = tuple(int(e["nonce"]) for e in steps)
    estimates = [np.asarray(e["estimate"], dtype=np.float64) for e in steps]
    replay_job = Job(job.task, job.split, job.n, job.k, job.estimator, job.run,
                     len(nonces), job.data_path, nonces, tuple(ids), job.task_params)
    service = _trace_from_estimates(replay_job, estimates)
    replay = run_job(replay_job)
    return ServiceRun(service, replay, seconds)


def _trace_from_estimates(job: Job, estimates: list[np.ndarray]) -> Trace:
    """Error and loss of the server's estimates along the service's own trajectory."""
    data = load_dataset(job.task, job.data_path)
    task = build_task(job.task, job.task_params)
    ref = reference(task, job, data)
    shards = run_shards(job, data)
    state = task.initial_state(initial_seed(job.run))
    trace = Trace(job)
    for t, est in enumerate(estimates):
        truth = np.stack([task.client_vectors(state, s, t) for s in shards]).mean(axis=0)
        estimate = est.reshape(task.m, task.d)
        trace.sq_err.append(float(np.sum((estimate - truth) ** 2)) / task.m)
        state = task.apply(state, estimate)
        trace.loss.append(ref.loss(state))
    return trace


def compare(run: ServiceRun) -> float:
    """Largest relative difference between the service's and the replay's numbers."""
    a = np.array(run.service.sq_err + run.service.loss)
    b = np.array(run.replay.sq_err + run.replay.loss)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def run_via_service(
    task: str,
    out: Path,
    *,
    estimator: str = "rand-proj-spatial(avg)",
    n: int | None = None,
    k: int | None = None,
    split: str = "iid",
    iterations: int | None = None,
    runs: int = 1,
    data_path: str | None = None,
    task_params: tuple[tuple[str, float], ...] = (),
) -> list[dict[str, Any]]:
    """Run ``runs`` runs of a task through the service; write ``<task>-service.csv`` with the
    service's and the in-process replay's numbers side by side."""
    n0, k0 = MAIN[task][0]
    rows = []
    for r in range(runs):
        job = Job(task, split, n or n0, k or k0, estimator, r, iterations or ITERATIONS[task],
                  data_path, task_params=task_params)
        with tempfile.TemporaryDirectory(prefix="rpsagg-svc-") as tmp:
            res = service_job(job, Path(tmp))
        diff = compare(res)
        print(f"[via-service] {task} run {r}: {len(res.service.loss)} rounds in "
              f"{res.seconds:.1f} s; max relative difference to in-process {diff:.2e}",
              flush=True)
        for t in range(len(res.service.loss)):
            rows.append({"task": task, "split": split, "n": job.n, "k": job.k,
                         "estimator": estimator, "run": r, "iteration": t + 1,
                         "sq_err_service": res.service.sq_err[t],
                         "sq_err_inprocess": res.replay.sq_err[t],
                         "loss_service": res.service.loss[t],
                         "loss_inprocess": res.replay.loss[t]})
    write_csv(out / f"{task}-service.csv", rows)
    return rows
