"""An ended job lets go of what only a running job needs (``JobRuntime.release``), and is
closed (``rpsagg_server.jobs.endedjobs``).

A created job that ends (done, failed, cancelled) stops its store's writer thread (and with
it the heartbeat commit every 2 s) and closes its write connection, and its task monitor's
thread; what it serves stays: its rounds, results and downloads, read from its database
opened again on demand, the same bytes after a restart. A new client can no longer join it
(a refusal, not a retry); a write after the stop is refused, never left waiting.
"""

from __future__ import annotations

import asyncio
import io
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from http_util import Service
from prometheus_client.parser import text_string_to_metric_families
from service_util import base_config, in_process_server, run_round_alone, wait_until

import rpsagg
from rpsagg_client import AggregationClient
from rpsagg_server.domain.errors import Unavailable
from rpsagg_server.http.jobmetrics import ENDED_LABEL, KEEP_ENDED
from rpsagg_server.jobs.catalog import CatalogError
from rpsagg_server.jobs.endedjobs import READERS
from rpsagg_server.store.database import Store
from rpsagg_server.store.writer import STOPPED, WriteError

pytestmark = pytest.mark.service

#: a small created job (one client, one round)
JOB = {"n": 1, "k": 8, "d": 64, "task": "mean", "rounds": 1, "round_timeout": 60}
ENDED = 5


def _estimate(svc: Service, job: str) -> bytes:
    status, body = svc.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")
    assert status == 200, (status, body)
    assert isinstance(body, bytes)
    return body


@pytest.mark.timeout(240)
def test_ended_jobs_serve_the_same_bytes_after_a_restart_and_take_no_new_client(
        tmp_path: Path) -> None:
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "8")
    try:
        jobs = [svc.create(**JOB) for _ in range(ENDED)]
        clients = [svc.client(f"c{i}", "--insecure", "--job", job) for i, job in enumerate(jobs)]
        for proc in clients:
            assert proc.wait(timeout=120) == 0
        wait_until(lambda: all(svc.job(j)["state"] == "done" for j in jobs), 30, "jobs done")
        before = {job: _estimate(svc, job) for job in jobs}
        for body in before.values():
            assert np.load(io.BytesIO(body)).shape == (JOB["d"],)
        rounds = svc.api(f"/api/jobs/{jobs[0]}/rounds")[1]["rounds"]
        assert [(r["round_id"], r["state"]) for r in rounds] == [(1, "done")]

        # a new client cannot join an ended job: refused at once, not retried
        late = AggregationClient(svc.target, "late", insecure=True, job=jobs[0],
                                 retry_budget=0)
        try:
            with pytest.raises(grpc.RpcError) as err:
                late.join()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "the job has ended (done)" in str(err.value.details())
            assert late.current_round().job_done
        finally:
            late.close()
        known = AggregationClient(svc.target, "c0", insecure=True, job=jobs[0])
        try:
            assert known.join().client_index == 0  # a joined client re-joins
        finally:
            known.close()

        svc.proc.terminate()
        svc.proc.wait(30)
        again = Service(tmp_path, "b", "--insecure", "--max-jobs", "8")
        svc.procs.append(again.proc)
        # reopened at the restart, then let go again: the same bytes
        assert {job: _estimate(again, job) for job in jobs} == before
    finally:
        svc.close()


@pytest.mark.timeout(120)
def test_a_job_that_never_ran_is_a_row_and_nothing_else(tmp_path: Path) -> None:
    """Queued behind the default job, then cancelled: no database, before and after a
    restart, and a client is told the job ended and why."""
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "1")
    try:
        jobs = [svc.create(**JOB) for _ in range(3)]
        for job in jobs:
            assert svc.job(job)["state"] == "queued"
            assert svc.api(f"/api/jobs/{job}", "DELETE")[0] == 200
        for server in (svc, None):
            if server is None:  # the restart
                svc.proc.terminate()
                svc.proc.wait(30)
                server = Service(tmp_path, "b", "--insecure", "--max-jobs", "1")
                svc.procs.append(server.proc)
            for job in jobs:
                assert not Path(server.job_db(job)).exists()
                assert server.job(job)["state"] == "cancelled"
                client = AggregationClient(server.target, "x0", insecure=True, job=job,
                                           retry_budget=0)
                try:
                    info = client.current_round()
                    with pytest.raises(grpc.RpcError) as err:  # as any ended job: refused
                        client.join()
                finally:
                    client.close()
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "the job has ended (failed: cancelled over the API)" in str(
                    err.value.details())
                assert info.job_done and info.job_failure == "cancelled over the API"
                assert (info.d, info.total_rounds) == (JOB["d"], JOB["rounds"])
        assert not (tmp_path / "jobs.db.d").exists() or not any(
            p.name.startswith(tuple(jobs)) for p in (tmp_path / "jobs.db.d").iterdir())
    finally:
        svc.close()


def _done_rounds(svc: Service) -> dict[str, float]:
    """``rpsagg_rounds_total{state="done"}`` by job."""
    text = svc.api("/metrics")[1].decode()
    return {s.labels["job"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "rpsagg_rounds_total" and s.labels["state"] == "done"}


@pytest.mark.timeout(240)
def test_retention_removes_the_first_ended_and_nothing_running(tmp_path: Path) -> None:
    """``--keep-finished-jobs 2``: of four jobs run to their end, the first two are removed
    (database and row), the running ones stay; ``DELETE`` removes an ended job and only
    cancels a running one; a restart with a lower bound removes the one ended first."""
    flags = ("--insecure", "--max-jobs", "4", "--keep-finished-jobs", "2")
    svc = Service(tmp_path, "a", *flags)
    try:
        keeper = svc.create(**dict(JOB, rounds=0))  # runs until cancelled
        wait_until(lambda: svc.job(keeper)["state"] == "running", 30, "the long job")
        jobs = []
        for i in range(4):
            jobs.append(svc.create(**JOB))
            assert svc.client(f"c{i}", "--insecure", "--job", jobs[-1]).wait(timeout=120) == 0
        wait_until(lambda: {j["id"] for j in svc.api("/api/jobs")[1]["jobs"]}
                   == {"default", keeper, *jobs[2:]}, 30, "the first two removed")
        for job in jobs[:2]:
            assert svc.api(f"/api/jobs/{job}")[0] == 404
            assert not Path(svc.job_db(job)).exists()
        assert Path(svc.job_db(keeper)).exists() and svc.job(keeper)["state"] == "running"
        assert _done_rounds(svc)[ENDED_LABEL] == 2  # the removed jobs' rounds still count

        status, gone = svc.api(f"/api/jobs/{jobs[2]}", "DELETE")
        assert (status, gone["id"], gone["state"]) == (200, jobs[2], "done")
        assert svc.api(f"/api/jobs/{jobs[2]}")[0] == 404
        assert not Path(svc.job_db(jobs[2])).exists()
        status, cancelled = svc.api(f"/api/jobs/{keeper}", "DELETE")  # running: a cancel
        assert (status, cancelled["state"]) == (200, "cancelled")
        assert Path(svc.job_db(keeper)).exists()

        svc.proc.terminate()
        svc.proc.wait(30)
        again = Service(tmp_path, "b", *flags[:-1], "1")
        svc.procs.append(again.proc)
        # removed right after the start (which serves first): it ended before the keeper
        wait_until(lambda: again.api(f"/api/jobs/{jobs[3]}")[0] == 404, 30, "removed")
        assert not Path(again.job_db(jobs[3])).exists()
        assert again.job(keeper)["state"] == "cancelled"
    finally:
        svc.close()


def _ours() -> Counter[str]:
    """This process's threads of the server's own kinds, by kind."""
    kinds = ("rpsagg-store", "rpsagg-archive-ended", "rpsagg-archive", "rpsagg-task")
    return Counter(next(k for k in kinds if t.name.startswith(k)) for t in threading.enumerate()
                   if t.name.startswith(kinds))


def _run_one_round(port: int, job: str) -> None:
    run_round_alone(f"127.0.0.1:{port}", job, JOB["d"])


@pytest.mark.timeout(120)
def test_ended_jobs_hold_no_thread_of_their_own(tmp_path: Path) -> None:
    """Waves of jobs created, run to their end and read: the server's own threads after the
    second wave are those after the first (its running jobs' only: none), for ever; an
    ended job is closed, opened again to be read, and at most READERS of them are open."""
    cfg = base_config(db=str(tmp_path / "jobs.db"), no_default_job=True, max_jobs=8,
                      eval=True)
    with in_process_server(cfg) as srv:
        host = srv.running.host
        after = []

        async def read(job: str) -> tuple[int, ...]:
            async with host.ended.app_of(job) as rt:
                assert rt is not None and job not in host.jobs
                rt.engine.archive.shrink(0)  # read from its store, not its cache
                return tuple(rt.engine.archive.get(1).estimate.shape)

        for _wave in range(2):
            jobs = [str(srv.call(host.create(dict(JOB, eval=True)))["id"])  # type: ignore[index]
                    for _ in range(ENDED)]
            wait_until(lambda jobs=jobs: all(j in host.jobs for j in jobs), 30, "started")
            assert _ours()["rpsagg-store"] == ENDED  # a writer each while they run
            with ThreadPoolExecutor(ENDED) as pool:
                list(pool.map(lambda j: _run_one_round(srv.port, j), jobs))
            wait_until(lambda: not host.jobs, 30, "every job ended and closed")
            for job in jobs:  # each opened again (the first ones were closed meanwhile)
                assert srv.call(read(job)) == (1, JOB["d"])
            assert len(host.ended.held()) == READERS
            wait_until(lambda: _ours()["rpsagg-task"] == _ours()["rpsagg-store"] == 0, 30,
                       "the readers' task monitors done")
            after.append(_ours())
        assert after[0] == after[1], after
        assert after[1]["rpsagg-archive"] == 0 and after[1]["rpsagg-archive-ended"] <= 1


@pytest.mark.timeout(180)
def test_metrics_keep_the_last_ended_jobs_series_and_every_total(tmp_path: Path) -> None:
    """Twelve jobs run to their end, one after another: ``/metrics`` has series of their own
    for the last eight only; the four before are summed under ``job="(ended)"``, so the sum
    of ``rpsagg_rounds_total`` and of the bytes received over every series is every job's."""
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "4")
    try:
        jobs = []
        for i in range(KEEP_ENDED + 4):
            jobs.append(svc.create(**JOB))
            assert svc.client(f"c{i}", "--insecure", "--job", jobs[-1]).wait(timeout=120) == 0
            wait_until(lambda: svc.job(jobs[-1])["state"] == "done", 30, "the job done")
        status, text = svc.api("/metrics")
        assert status == 200
        rounds: dict[str, float] = {}
        received = 0.0
        build = []
        for fam in text_string_to_metric_families(text.decode()):
            for sample in fam.samples:
                if sample.name == "rpsagg_build_info":  # the server's, once
                    build.append((sample.labels, sample.value))
                if sample.name == "rpsagg_rounds_total" and sample.labels["state"] == "done":
                    rounds[sample.labels["job"]] = sample.value
                if sample.name == "rpsagg_bytes_received_total":
                    received += sample.value
        assert build == [({"version": rpsagg.__version__, "seed_spec": rpsagg.SPEC_VERSION,
                            "protocol": "rpsagg.v1"}, 1.0)]
        assert rounds.pop(ENDED_LABEL) == 4
        assert rounds == {"default": 0, **{job: 1 for job in jobs[4:]}}
        listed = svc.api("/api/jobs")[1]["jobs"]
        assert received == sum(j["bytes_up"] for j in listed) > 0
    finally:
        svc.close()


@pytest.mark.timeout(120)
def test_a_removal_whose_row_cannot_be_dropped_keeps_the_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files go first: a failed row delete answers Unavailable and leaves the row (a
    job without data, as one that never ran), which a second removal drops."""
    cfg = base_config(db=str(tmp_path / "jobs.db"), no_default_job=True)
    with in_process_server(cfg) as srv:
        host = srv.running.host
        job = str(srv.call(host.create(dict(JOB)))["id"])  # type: ignore[index]
        wait_until(lambda: job in host.jobs, 30, "started")
        _run_one_round(srv.port, job)
        wait_until(lambda: host.describe(job)["state"] == "done", 30, "the job's end recorded")

        def fails(job_id: str) -> None:
            raise CatalogError("disk I/O error")

        with monkeypatch.context() as patch:
            patch.setattr(host.catalog, "delete", fails)
            with pytest.raises(Unavailable, match="its row not: disk I/O error"):
                srv.call(host.retention.remove(job, "a test"))
        assert not Path(host.catalog.job_db(job)).exists() and job not in host.jobs
        assert host.describe(job)["state"] == "done"
        srv.call(host.retention.remove(job, "a test"))
        with pytest.raises(KeyError):
            host.describe(job)
        assert host.catalog.get(job) is None


def test_a_stopped_store_refuses_writes_and_still_reads(tmp_path: Path) -> None:
    db = str(tmp_path / "job.db")

    async def scenario() -> None:
        store = Store(db)
        try:
            await store.add_client("c0", 0, 1.0)
            await asyncio.to_thread(store.stop_writing)
            assert store.writable()  # stopped on purpose: no fault for readiness
            with pytest.raises(WriteError, match=STOPPED):
                await asyncio.wait_for(store.add_client("c1", 1, 2.0), 10)
            outcomes = await asyncio.wait_for(store.commit_submissions([]), 10)
            assert outcomes == []
            with pytest.raises(WriteError, match=STOPPED):
                store.put_meta("k", "v")
            assert store.clients() == [("c0", 0, 1.0)]  # read through the second connection
            assert store.get_meta("k") is None
        finally:
            store.close()

    asyncio.run(scenario())
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT client_id FROM clients").fetchall() == [("c0",)]
    finally:
        conn.close()
