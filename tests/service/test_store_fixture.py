"""A database written by an earlier release opens and resumes.

``tests/fixtures/store-v0.1.0/`` was made once, by ``PYTHONPATH=tests python
tests/service/test_store_fixture.py --make DIR`` with the code of commit daa58f4 (0.1.0), checked in
as it came out: the default job (``FLAGS``) with round 1 done and round 2 collecting
(client c0's submission committed), the server killed with ``SIGKILL``, the write-ahead
log checkpointed into the file. Never regenerate it: it pins what databases in users'
hands look like, so that a change of the store's layout must read it (a migration), not
only the databases the new code writes.

The test copies it, starts the server of today on it, and finishes the job with the same
clients: round 2 decodes with c0's committed row and c1's new one, round 1's stored
estimate is unchanged, and every done round decodes bit for bit as the library decodes
its stored submissions.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest
from repo_paths import TESTS
from service_util import (
    check_rounds_against_inprocess,
    server_command,
    wait_port_file,
)

from rpsagg_client import AggregationClient
from rpsagg_server.store.database import Store

pytestmark = pytest.mark.service

FIXTURE = TESTS / "fixtures" / "store-v0.1.0"
N, K, D, ROUNDS = 2, 8, 64, 3
#: the default job of the fixture's server (a restart must name the same settings)
FLAGS = ["--insecure", "--n", str(N), "--k", str(K), "--d", str(D), "--task", "mean",
         "--data", "external", "--rounds", str(ROUNDS), "--round-timeout", "600",
         "--grpc-port", "0", "--http-port", "0", "--linger", "-1"]
#: SHA-256 of round 1's estimate as the fixture stores it
ROUND1_SHA256_FILE = FIXTURE / "round1-estimate.sha256"


def vectors(round_id: int) -> np.ndarray:
    """The clients' vectors of a round, (N, D) float64: the same when made and resumed."""
    return np.random.default_rng(1000 + round_id).normal(size=(N, D))


def _start(db: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = db.with_name("port")
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(server_command(["--db", str(db), "--port-file", str(port_file),
                                            *FLAGS]), stderr=open(log, "wb"))  # noqa: SIM115
    return proc, f"127.0.0.1:{wait_port_file(port_file, proc)}"


def _clients(target: str) -> list[AggregationClient]:
    out = [AggregationClient(target, f"c{i}", insecure=True, retry_budget=20)
           for i in range(N)]
    for c in out:
        c.join(d=D)
    return out


def make(folder: Path) -> None:
    """Write the fixture (run by hand, once; see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "rpsagg.db"
    proc, target = _start(db, folder / "make.log")
    clients = _clients(target)
    try:
        rnd = clients[0].current_round()
        for c in clients:
            c.submit(rnd, vectors(1)[c.index])
        assert clients[0].result(1, wait=True, timeout=60).state == "done"
        rnd = clients[0].current_round()
        assert rnd.round_id == 2
        clients[0].submit(rnd, vectors(2)[0])
    finally:
        for c in clients:
            c.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for path in (db, folder / "rpsagg.db.d" / "catalog.db"):
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for side in ("port", "make.log"):
        (folder / side).unlink(missing_ok=True)
    store = Store(str(db))
    try:
        estimate = store.round(1).estimate
        assert estimate is not None
        (folder / "round1-estimate.sha256").write_text(hashlib.sha256(estimate).hexdigest()
                                                       + "\n")
    finally:
        store.close()
    for side in folder.rglob("*.db-*"):  # the logs, empty once checkpointed
        side.unlink()


@pytest.mark.timeout(180)
def test_a_database_of_an_earlier_release_opens_and_resumes(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "fixture")  # the catalog in rpsagg.db.d/ too
    db = tmp_path / "fixture" / "rpsagg.db"
    proc, target = _start(db, tmp_path / "server.log")
    clients = _clients(target)
    try:
        rnd = clients[0].current_round()
        assert (rnd.round_id, rnd.state) == (2, "collecting"), rnd
        assert not clients[1].submit(rnd, vectors(2)[1]).duplicate
        res = clients[0].result(2, wait=True, timeout=60)
        assert (res.state, res.n_prime) == ("done", N)  # c0's row was kept across the kill
        rnd = clients[0].current_round()
        assert rnd.round_id == 3
        for c in clients:
            c.submit(rnd, vectors(3)[c.index])
        assert clients[0].result(3, wait=True, timeout=60).state == "done"
        assert clients[0].current_round().job_done
    finally:
        for c in clients:
            c.close()
        proc.terminate()
        proc.wait(timeout=30)
    assert check_rounds_against_inprocess(str(db), N, K, D, "rand-proj-spatial") == ROUNDS
    store = Store(str(db))
    try:
        estimate = store.round(1).estimate
        assert estimate is not None
        assert hashlib.sha256(estimate).hexdigest() == ROUND1_SHA256_FILE.read_text().strip()
    finally:
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write the store fixture (once)")
    parser.add_argument("--make", type=Path, required=True, metavar="DIR")
    make(parser.parse_args().make)
