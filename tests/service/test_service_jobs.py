"""Job life across starts (``--on-finished-job``): a finished job does not block the next.

* ``new``: a server started on the database of a finished job moves it to ``<db>.jobs/``
  and runs a new job to its end; ``/api/jobs`` lists the moved job; an unfinished job is
  resumed, never moved.
* ``keep`` (the default): the finished job is served again, nothing moves.
* Fault story of the move: a start interrupted after the copy (the archive complete, the
  database still there) finishes the move on the next start without a second archive; a
  failed copy (a folder that cannot be written) refuses to start with one line and leaves
  the database as it was.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import base_config, in_process_server, run_local_job

from rpsagg_server import jobs
from rpsagg_server.http import create_app

pytestmark = pytest.mark.service

N, K, D, ROUNDS = 2, 8, 64, 2


def _finished_db(tmp_path: Path) -> Path:
    return Path(run_local_job(tmp_path, n=N, k=K, d=D, rounds=ROUNDS, data_r=0.0))


def _job_state(db: Path) -> tuple[str | None, int]:
    conn = sqlite3.connect(db)
    try:
        done = conn.execute("SELECT value FROM meta WHERE key = 'job_done'").fetchone()
        rounds = conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
    finally:
        conn.close()
    return (None if done is None else done[0]), int(rounds)


@pytest.mark.timeout(240)
def test_new_job_after_a_finished_one_and_the_old_one_listed(tmp_path: Path) -> None:
    db = _finished_db(tmp_path)
    assert _job_state(db) == ("1", ROUNDS)
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, db=str(db), on_finished_job="new")
    with in_process_server(cfg) as srv:
        # a new job: round 1 open, nothing done; the old one moved and listed
        assert not srv.running.engine.job_done
        assert srv.running.engine.progress.current is not None
        assert srv.running.engine.progress.current.round_id == 1
        (moved,) = (db.parent / "job.db.jobs").glob("*.db")
        assert _job_state(moved) == ("1", ROUNDS)
        with TestClient(create_app(srv.running.state, CollectorRegistry())) as http:
            past = http.get("/api/jobs").json()["past_jobs"]
    assert len(past) == 1
    assert past[0]["file"] == moved.name and past[0]["state"] == "done"
    assert past[0]["rounds"] == ROUNDS and past[0]["rounds_done"] == ROUNDS
    assert past[0]["clients"] == N and past[0]["config"]["d"] == D
    assert "/" not in past[0]["file"]  # no paths on the unauthenticated dashboard
    assert _job_state(db) == (None, 1)  # the new job's database


@pytest.mark.timeout(240)
def test_keep_serves_the_finished_job_again(tmp_path: Path) -> None:
    db = _finished_db(tmp_path)
    with in_process_server(base_config(n=N, k=K, d=D, rounds=ROUNDS, db=str(db))) as srv:
        assert srv.running.engine.job_done
    assert not (db.parent / "job.db.jobs").exists()
    assert _job_state(db) == ("1", ROUNDS)


def test_an_unfinished_job_is_never_moved(tmp_path: Path) -> None:
    db = tmp_path / "job.db"
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, db=str(db), on_finished_job="new")
    with in_process_server(cfg):
        pass  # round 1 open, no submission: the job is unfinished
    assert jobs.archive_finished_job(str(db)) is None
    with in_process_server(cfg) as srv:
        assert srv.running.engine.progress.current is not None
        assert srv.running.engine.progress.current.round_id == 1
    assert not jobs.jobs_dir(str(db)).exists()
    assert jobs.archive_finished_job(":memory:") is None
    assert jobs.archive_finished_job(str(tmp_path / "missing.db")) is None


@pytest.mark.timeout(240)
def test_an_interrupted_move_completes_once(tmp_path: Path) -> None:
    db = _finished_db(tmp_path)
    keep = tmp_path / "copy.db"
    shutil.copy(db, keep)
    first = jobs.archive_finished_job(str(db))
    assert first is not None and not db.exists()
    # the crash: the archive complete, the database (and its WAL) back in place
    shutil.copy(keep, db)
    second = jobs.archive_finished_job(str(db))
    assert second == first and not db.exists()
    assert sorted(p.name for p in jobs.jobs_dir(str(db)).iterdir()) == [first.name]
    # a leftover temporary copy of a crash during VACUUM INTO is replaced, not listed
    shutil.copy(keep, db)
    first.unlink()
    (first.parent / (first.name + ".tmp")).write_bytes(b"half a copy")
    third = jobs.archive_finished_job(str(db))
    assert third == first and _job_state(third) == ("1", ROUNDS)
    assert [j.file for j in jobs.past_jobs(str(db))] == [first.name]


@pytest.mark.timeout(240)
def test_a_failed_move_refuses_to_start_and_keeps_the_job(tmp_path: Path) -> None:
    """A file where the jobs folder must be (a read-only folder would not stop root): one
    line, exit status 2 (StartupError), the job untouched."""
    db = _finished_db(tmp_path)
    jobs.jobs_dir(str(db)).write_text("not a folder")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "rpsagg-server"), "--insecure", "--grpc-port",
         "0", "--http-port", "0", "--host", "127.0.0.1", "--n", str(N), "--k", str(K),
         "--d", str(D), "--task", "mean", "--rounds", str(ROUNDS), "--db", str(db),
         "--on-finished-job", "new"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot move its finished job" in lines[0], out.stderr
    assert _job_state(db) == ("1", ROUNDS)


def test_bad_flag_value() -> None:
    with pytest.raises(ValueError, match="--on-finished-job must be keep or new"):
        base_config(on_finished_job="archive")
