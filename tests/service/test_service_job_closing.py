"""Ended jobs are closed, and opened again only to be read (``rpsagg_server.jobs.endedjobs``),
checked on a real ``rpsagg-server`` process: what it holds (``/proc/PID/fd``, its threads),
what it serves after a job was closed and opened again, and what a restart with many
finished jobs opens (nothing of theirs), under ``prlimit --nofile=1024``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
from http_util import Service
from repo_paths import ROOT
from service_util import base_config, in_process_server, run_round_alone, wait_until

from rpsagg_client import AggregationClient
from rpsagg_server.jobs.catalog import CatalogError
from rpsagg_server.jobs.endedjobs import READERS

sys.path.insert(0, str(ROOT / "bench"))
from finished_jobs import clone_finished_job

pytestmark = pytest.mark.service

#: a small created job (one client, one round)
JOB = {"n": 1, "k": 8, "d": 64, "task": "mean", "rounds": 1, "round_timeout": 60}


def _run(target: str, job: str, value: float = 1.0) -> np.ndarray:
    """Run the job's one round with its one client; the estimate GetResult gives."""
    return run_round_alone(target, job, JOB["d"], value)


def _result(target: str, job: str) -> np.ndarray:
    """Round 1's estimate as GetResult gives it (a reader, not a member; a refusal is not
    retried)."""
    client = AggregationClient(target, "reader", insecure=True, job=job, retry_budget=0)
    try:
        return np.asarray(client.result(1).estimate)
    finally:
        client.close()


def _fd_targets(pid: int) -> list[str]:
    """What each of process ``pid``'s descriptors points at (a path, ``socket:[inode]``...)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def _open_files(pid: int) -> set[str]:
    """The paths of the files process ``pid`` holds open (and its other descriptors)."""
    return set(_fd_targets(pid))


def _fd_kinds(pid: int) -> dict[str, int]:
    """Process ``pid``'s descriptors by kind (a socket, a pipe, a job's database file...)."""
    return dict(Counter(re.sub(r"\[\d+\]$|j[0-9a-f]{8}", "*", t) for t in _fd_targets(pid)))


def _usage(pid: int) -> tuple[int, int]:
    """``(threads, open descriptors)`` of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("Threads:")))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def _ended(svc: Service, job: str) -> bool:
    return svc.job(job)["state"] == "done"


@pytest.mark.timeout(240)
def test_a_closed_job_serves_the_same_bytes_when_opened_again(tmp_path: Path) -> None:
    """A job's downloads, GetResult and rounds before it is closed are those after: the
    READERS jobs that end after it push it out of the ended jobs kept open (its database
    is no longer open in the server), and a read opens it again."""
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "8")
    try:
        first = svc.create(**JOB)
        by_client = _run(svc.target, first, 3.0)
        wait_until(lambda: _ended(svc, first), 30, "the job's end recorded")
        npy = svc.api(f"/api/jobs/{first}/rounds/1/estimate?format=npy")[1]
        rounds = svc.api(f"/api/jobs/{first}/rounds")[1]
        described = svc.job(first)
        db = svc.job_db(first)
        assert db in _open_files(svc.proc.pid)  # kept open: the most recently ended

        later = [svc.create(**JOB) for _ in range(READERS)]
        for job in later:
            _run(svc.target, job)
        wait_until(lambda: db not in _open_files(svc.proc.pid), 30, "the first job closed")
        assert svc.job(first) == described  # from its row's summary, closed

        assert svc.api(f"/api/jobs/{first}/rounds/1/estimate?format=npy")[1] == npy
        assert db in _open_files(svc.proc.pid)  # opened again to be read
        assert svc.api(f"/api/jobs/{first}/rounds")[1] == rounds
        assert np.load(io.BytesIO(npy)).tobytes() == by_client.reshape(-1).tobytes()
        for job in later:  # each read opens it (and closes the least recently read)
            svc.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")
        wait_until(lambda: db not in _open_files(svc.proc.pid), 30, "closed again")
        assert _result(svc.target, first).tobytes() == by_client.tobytes()
        held = {p for p in _open_files(svc.proc.pid) if p.endswith(".db")}
        assert len(held) <= READERS + 2, held  # the default job's, the catalog, READERS
    finally:
        svc.close()


@pytest.mark.timeout(300)
def test_what_the_server_holds_stays_flat_over_waves_of_jobs(tmp_path: Path) -> None:
    """Four waves of 6 jobs created, run to their end and read: after each later wave,
    once idle, the server process holds no more descriptors of any kind (a socket, a pipe,
    a job's database file...) than after the first, and about its threads.

    What a moment holds besides the steady state is transient and only adds: a client's
    connection still closing, the pipes and ``/dev/null`` of the formatting worker being
    spawned (2-3 descriptors seen). A descriptor kept per ended job would add 6 a wave,
    above any such margin by the second wave. Threads: the process's pools (asyncio's
    default executor, gRPC's) start threads as load asks, up to fixed bounds; a thread per
    ended job would add 18 over the three later waves: fewer than 6 more is the bound."""
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "8", "--no-default-job")
    try:
        after: list[tuple[int, int]] = []
        held: dict[str, int] = {}
        for _wave in range(4):
            jobs = [svc.create(**JOB) for _ in range(6)]
            for job in jobs:
                _run(svc.target, job)
            wait_until(lambda jobs=jobs: all(_ended(svc, j) for j in jobs), 30, "ended")
            for job in jobs:
                assert svc.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")[0] == 200
            if not after:  # once only READERS ended jobs (and the catalog) are open
                wait_until(lambda: len([p for p in _open_files(svc.proc.pid)
                                        if p.endswith(".db")]) == READERS + 1, 30, "closed")
                held = _fd_kinds(svc.proc.pid)
            else:
                wait_until(lambda most=held: not _above(_fd_kinds(svc.proc.pid), most), 30,
                           f"at most the first wave's descriptors {held}: above it "
                           f"{_above(_fd_kinds(svc.proc.pid), held)}")
            after.append(_usage(svc.proc.pid))
        assert after[-1][0] - after[0][0] < 6, after
    finally:
        svc.close()


def _above(now: dict[str, int], most: dict[str, int]) -> dict[str, int]:
    """The kinds ``now`` holds more of than ``most``, with how many."""
    return {k: n for k, n in now.items() if n > most.get(k, 0)}


@pytest.mark.timeout(300)
def test_a_restart_with_many_finished_jobs_opens_none_of_them(tmp_path: Path) -> None:
    """2,000 finished jobs (copies of a real one, ``bench/finished_jobs.py``), restarted
    under ``prlimit --nofile=1024``: it serves, lists every job, holds no descriptor of
    theirs, and a copy read on demand has the original's bytes."""
    svc = Service(tmp_path, "a", "--insecure", "--no-default-job")
    try:
        job = svc.create(**JOB)
        _run(svc.target, job, 2.0)
        wait_until(lambda: _ended(svc, job), 30, "the job's end recorded")
        npy = svc.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")[1]
        svc.proc.terminate()
        assert svc.proc.wait(30) == 0
        copies = clone_finished_job(tmp_path / "jobs.db.d", job, 2000)

        again = Service(tmp_path, "b", "--insecure", "--no-default-job",
                        "--keep-finished-jobs", "5000", prefix=("prlimit", "--nofile=1024"))
        svc.procs.append(again.proc)
        limits = Path(f"/proc/{again.proc.pid}/limits").read_text()
        assert any(line.startswith("Max open files") and " 1024 " in line
                   for line in limits.splitlines())
        assert again.api("/healthz")[0] == 200
        listed = again.api("/api/jobs")[1]
        assert len(listed["jobs"]) == 2001 and listed["retention"]["ended_jobs"] == 2001
        assert not any(p.endswith(".db") and Path(p).stem.startswith(job)
                       for p in _open_files(again.proc.pid))
        assert _usage(again.proc.pid)[1] < 60
        for copy in (copies[0], copies[1000], copies[-1]):
            assert again.api(f"/api/jobs/{copy}/rounds/1/estimate?format=npy")[1] == npy
        assert again.job(copies[7])["rounds_done"] == 1
    finally:
        svc.close()


@pytest.mark.timeout(120)
def test_retention_by_age_removes_an_ended_job_once_it_is_older(tmp_path: Path) -> None:
    """``--keep-finished-for 2s``: an ended job is removed about 2 s after its end, by the
    retention's timer (no other job ends meanwhile); a running one stays."""
    cfg = base_config(db=str(tmp_path / "jobs.db"), no_default_job=True, max_jobs=4,
                      keep_finished_for=2.0)
    with in_process_server(cfg) as srv:
        host = srv.running.host
        ended = str(srv.call(host.create(dict(JOB)))["id"])  # type: ignore[index]
        running = str(srv.call(host.create(dict(JOB, n=2)))["id"])  # type: ignore[index]
        wait_until(lambda: ended in host.jobs and running in host.jobs, 30, "started")
        _run(f"127.0.0.1:{srv.port}", ended)
        wait_until(lambda: host.describe(ended)["state"] == "done", 30, "ended")
        db = Path(host.catalog.job_db(ended))
        assert db.exists() and host.retention.kept()["ended_jobs"] == 1
        wait_until(lambda: ended not in host.listing.records, 30, "removed by age")
        assert not db.exists() and host.catalog.get(ended) is None
        assert host.describe(running)["state"] == "running"
        assert Path(host.catalog.job_db(running)).exists()


@pytest.mark.timeout(120)
def test_a_summary_that_cannot_be_recorded_is_recorded_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog refuses the summary as the job closes: the job is closed anyway and
    described from memory; the next start opens it once, closes it again and records it."""
    cfg = base_config(db=str(tmp_path / "jobs.db"), no_default_job=True)
    with in_process_server(cfg) as srv:
        host = srv.running.host

        def fails(job_id: str, summary: dict[str, object]) -> None:
            raise CatalogError("disk I/O error")

        monkeypatch.setattr(host.catalog, "set_summary", fails)
        job = str(srv.call(host.create(dict(JOB)))["id"])  # type: ignore[index]
        wait_until(lambda: job in host.jobs, 30, "started")
        estimate = _run(f"127.0.0.1:{srv.port}", job)
        wait_until(lambda: job not in host.jobs, 30, "the job closed")
        assert host.describe(job)["rounds_done"] == 1
        assert host.catalog.get(job).summary == {}  # type: ignore[union-attr]
    monkeypatch.undo()
    with in_process_server(cfg) as srv:  # the restart
        host = srv.running.host
        assert host.catalog.get(job).summary["rounds_done"] == 1  # type: ignore[union-attr]
        assert job not in host.jobs and host.ended.held() == []
        assert _result(f"127.0.0.1:{srv.port}", job).tobytes() == estimate.tobytes()


@pytest.mark.timeout(120)
def test_an_ended_job_whose_database_cannot_be_read_is_unavailable(tmp_path: Path) -> None:
    """Its database moved away behind the server's back: its downloads answer 503 and
    GetResult UNAVAILABLE, each with why; put back, it is read again."""
    svc = Service(tmp_path, "a", "--insecure", "--no-default-job")
    try:
        job = svc.create(**JOB)
        _run(svc.target, job)
        wait_until(lambda: _ended(svc, job), 30, "the job's end recorded")
        npy = svc.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")[1]
        svc.proc.terminate()
        assert svc.proc.wait(30) == 0
        again = Service(tmp_path, "b", "--insecure", "--no-default-job")  # nothing open
        svc.procs.append(again.proc)
        db = Path(again.job_db(job))
        db.rename(db.with_suffix(".moved"))
        status, body = again.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")
        assert status == 503 and body["detail"].startswith(f"job {job}'s rounds cannot be "
                                                           "read: "), (status, body)
        with pytest.raises(grpc.RpcError) as err:
            _result(again.target, job)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"job {job}'s rounds cannot be read" in str(err.value.details())
        assert not db.exists()  # a read never makes a database
        assert again.job(job)["rounds_done"] == 1  # described from its row all along
        db.with_suffix(".moved").rename(db)
        assert again.api(f"/api/jobs/{job}/rounds/1/estimate?format=npy")[1] == npy
    finally:
        svc.close()
