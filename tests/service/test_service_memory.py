"""Bounded memory over many rounds, with real processes: a ``rpsagg-server --rounds 0``
subprocess (d = 2^18: 2 MiB an estimate), rounds driven by the public client, the server's
RSS read from ``/proc``.

Without the bound every done round's estimate stayed in memory (and a restart read every
one back): 40 rounds at this d grew the RSS by ~80 MiB. With ``--result-cache-bytes`` of two
rounds, the RSS after 40 rounds stays near the RSS after 10, a restart on that database
starts near a fresh server's, and every old round's estimate, evicted long ago, is still
served bit for bit as stored: by GetResult and by the dashboard's ``.npy`` download,
before and after the restart. Every wait is on a state (the port file, a round's result),
with a bound. The soak benchmark (``bench/soak.py``) runs here too, bounded to 10 s at
d = 2^14.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from http_util import free_port
from repo_paths import ROOT
from test_http_exposure import http_get, metric

from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import ServerProcess

pytestmark = pytest.mark.service

D = 1 << 18  # 2 MiB of float64 an estimate
CACHE = 2 * D * 8  # --result-cache-bytes: two rounds
ROUNDS = 40


def rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class Server:
    """A ``--rounds 0`` server subprocess on ``db`` and its one joined client."""

    def __init__(self, tmp_path: Path, db: Path, name: str) -> None:
        self.http = free_port()
        self.log = tmp_path / f"{name}.log"
        self.proc = ServerProcess([
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0",
            "--http-port", str(self.http), "--http-host", "127.0.0.1", "--task", "mean",
            "--data", "external", "--n", "1", "--k", "64", "--d", str(D), "--rounds", "0",
            "--transform", "one", "--round-timeout", "600", "--db", str(db),
            "--result-cache-bytes", str(CACHE), "--linger", "-1",
        ], tmp_path / f"{name}.port", stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"), start_timeout=120)
        self.proc.start()
        assert self.proc.proc is not None
        self.pid = self.proc.proc.pid
        self.client = AggregationClient(self.proc.target, "c0", insecure=True, timeout=60,
                                        wait_timeout=120)
        self.client.join()

    def rss(self) -> float:
        return rss_mib(self.pid)

    def round(self, x: np.ndarray) -> tuple[int, bytes]:
        """Submit to the current round and wait for its result: (id, estimate bytes)."""
        rnd = self.client.current_round()
        self.client.submit(rnd, x)
        res = self.client.result(rnd.round_id, wait=True)
        assert res.state == "done" and res.estimate is not None, (res.state, res.reason)
        return rnd.round_id, _bytes(res.estimate)

    def result(self, round_id: int) -> bytes:
        res = self.client.result(round_id, wait=False)
        assert res.state == "done" and res.estimate is not None
        return _bytes(res.estimate)

    def download(self, round_id: int) -> bytes:
        url = f"http://127.0.0.1:{self.http}/api/rounds/{round_id}/estimate?format=npy"
        with urllib.request.urlopen(url, timeout=60) as res:
            return _bytes(np.load(io.BytesIO(res.read()), allow_pickle=False)[None, :])

    def metric(self, name: str) -> float:
        """The value of the unlabelled sample ``name`` in ``/metrics``."""
        status, text = http_get(f"http://127.0.0.1:{self.http}/metrics")
        assert status == 200
        return metric(text.decode(), name)

    def kill(self) -> None:
        self.client.close()
        assert self.proc.proc is not None
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.proc.wait(30)

    def stop(self) -> None:
        self.client.close()
        self.proc.stop()


def _bytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def stored(db: Path) -> dict[int, bytes]:
    """Every done round's estimate as its row holds it (a second connection)."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute("SELECT round_id, estimate FROM rounds WHERE state = 'done'")
        return {int(r): bytes(e) for r, e in rows}
    finally:
        conn.close()


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_memory_stays_bounded_and_old_estimates_are_served(tmp_path: Path) -> None:
    db = tmp_path / "soak.db"
    x = np.random.default_rng(0).standard_normal(D)
    seen: dict[int, bytes] = {}
    rss: list[float] = []
    srv = Server(tmp_path, db, "soak")
    try:
        for _ in range(ROUNDS):
            rid, est = srv.round(x)
            seen[rid] = est
            rss.append(srv.rss())
        rows = stored(db)
        assert set(rows) == set(seen) and len(seen) == ROUNDS
        # the first rounds left the cache long ago: read back from the store, bit for bit
        reads = srv.metric("rpsagg_result_reads_total")
        for rid in (1, 2, ROUNDS // 2, ROUNDS):
            assert srv.result(rid) == seen[rid] == rows[rid], rid
            assert srv.download(rid) == rows[rid], rid
        # /metrics: the cache within its bound, and the old rounds read from the database
        assert srv.metric("rpsagg_result_cache_max_bytes") == CACHE
        assert 0 < srv.metric("rpsagg_result_cache_bytes") <= CACHE
        assert 1 <= srv.metric("rpsagg_result_cache_rounds") <= 2
        assert srv.metric("rpsagg_result_reads_total") >= reads + 2  # rounds 1 and 2 at least
        after_reads = srv.rss()
    finally:
        srv.kill()  # a crash: the open round resumes at the restart
    # 30 rounds of 2 MiB estimates: +60 MiB if they stayed in memory
    growth = max(rss[-1], after_reads) - rss[9]
    assert growth < 20, (f"RSS after 10 rounds {rss[9]:.0f} MiB, after {ROUNDS} "
                         f"{rss[-1]:.0f} MiB, after the reads {after_reads:.0f} MiB")
    again = Server(tmp_path, db, "restarted")
    try:
        restarted = again.rss()
        for rid in (1, 3, ROUNDS - 1, ROUNDS):  # none of them is cached at the start
            assert again.result(rid) == rows[rid], rid
            assert again.download(rid) == rows[rid], rid
        rid, est = again.round(x)  # the resumed round finishes
        assert rid == ROUNDS + 1 and stored(db)[rid] == est
    finally:
        again.stop()
    fresh = Server(tmp_path, tmp_path / "fresh.db", "fresh")
    try:
        fresh_rss = fresh.rss()
    finally:
        fresh.stop()
    print(f"RSS MiB: after 10 rounds {rss[9]:.0f}, after {ROUNDS} {rss[-1]:.0f}, after the "
          f"reads {after_reads:.0f}; restarted {restarted:.0f}, fresh {fresh_rss:.0f}")
    # a restart reads no old estimate eagerly (it read all 80 MiB of them before)
    assert restarted < 1.5 * fresh_rss and restarted - fresh_rss < 20, (restarted, fresh_rss)
    assert os.path.getsize(db) > ROUNDS * D * 8  # they are all in the store


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_the_soak_benchmark_scaled_down(tmp_path: Path) -> None:
    """``bench/soak.py`` bounded in time (the 24-hour soak at a size CI runs): its own
    checks hold (old rounds bit for bit after the restart) and so do the targets."""
    out = tmp_path / "soak.json"
    bench = ROOT / "bench" / "soak.py"
    proc = subprocess.run(
        [sys.executable, str(bench), "--d", "16384", "--seconds", "10", "--after", "3",
         "--check", "5", "--cache-bytes", str(8 * 16384 * 8), "--json", str(out)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fig = json.loads(out.read_text())
    s = fig["summary"]
    assert s["rounds"] >= 10 and fig["mismatched_rounds"] == [] and fig["checked_rounds"]
    assert s["ratio_last_to_10"] < 2.0 and s["ratio_restarted_to_fresh"] < 1.5, s
