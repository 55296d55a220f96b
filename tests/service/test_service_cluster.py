"""The README's main command (the local cluster launcher): round lines, summary, the
dashboard staying up after the job until Ctrl-C, Ctrl-C (exit status 0, no process left)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from http_util import free_port, get_json

pytestmark = pytest.mark.service

CMD = [sys.executable, "-m", "rpsagg_experiments.cluster", "--n", "3", "--k", "8", "--d", "128",
       "--data", "synthetic", "--data-r", "1", "--http-port", "0"]
ROUND_LINE = re.compile(
    r"^\s+(\d+)\s+3/3\s+120 B\s+1\.5 KiB\s+\S+\s+\S+\s+\S+\s+\S+\s+\d+ ms$")


@pytest.mark.timeout(180)
def test_cluster_prints_a_line_per_round_and_a_summary() -> None:
    out = subprocess.run([*CMD, "--rounds", "2", "--exit"], capture_output=True, text=True,
                         timeout=170)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any("--insecure on loopback" in line for line in lines)
    assert any(line.split()[:2] == ["round", "clients"] for line in lines)
    rounds = [int(m.group(1)) for m in map(ROUND_LINE.match, lines) if m]
    assert rounds == [1, 2]
    assert any("240 B sent up instead of 3.0 KiB raw float32" in line for line in lines)


@pytest.mark.timeout(180)
def test_ctrl_c_stops_the_server_and_every_client() -> None:
    proc = subprocess.Popen([*CMD, "--rounds", "100000"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    pgid = os.getpgid(proc.pid)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait for the first finished round
            if ROUND_LINE.match(line):
                break
        os.killpg(pgid, signal.SIGINT)  # what a terminal's Ctrl-C does
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert "Ctrl-C: stopping the server and the clients" in rest
        wait_group_gone(pgid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(10)


def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Fail unless every process of the group (server, clients) has exited within timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail("processes of the cluster are still running after Ctrl-C")


@pytest.mark.timeout(180)
def _shown(x: float | None) -> str:
    """How the launcher's round line shows an error the API gives as ``x``."""
    return "n/a" if x is None else f"{x:.3e}"


def test_dashboard_stays_up_after_the_job_until_ctrl_c() -> None:
    http = free_port()
    cmd = [*CMD[:-1], str(http), "--rounds", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    pgid = os.getpgid(proc.pid)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # until the launcher says the job is done
            seen.append(line)
            if "job done" in line:
                break
        else:
            pytest.fail(f"the launcher ended without 'job done': {''.join(seen)[-2000:]}")
        assert "stay up until Ctrl-C" in line
        assert f"http://127.0.0.1:{http}/" in line
        # Well after the job: the launcher still runs and the dashboard still answers.
        status = get_json(f"http://127.0.0.1:{http}/api/status")
        assert status["job"]["done"] is True
        assert proc.poll() is None
        rounds = get_json(f"http://127.0.0.1:{http}/api/rounds")["rounds"]
        assert sorted(r["round_id"] for r in rounds if r["state"] == "done") == [1, 2]
        # with the dashboard on, the error columns are relative to ||x_bar||^2
        assert any(x.split()[:5] == ["round", "clients", "bytes", "up", "raw"]
                   and "rel.error" in x for x in seen)
        assert any("est.rel" in x for x in seen)
        printed = {int(m.group(1)): m.group(0).split()[6:10]  # after "120 B" "1.5 KiB"
                   for m in map(ROUND_LINE.match, seen) if m}
        assert sorted(printed) == [1, 2]
        for r in rounds:
            rel = r["relative_error"]
            # the estimated relative error first, then the measured ones; "n/a" where the
            # API has null (the estimate of ||x_bar||^2 is unbiased, so it can come out
            # <= 0 by chance at this k, and the ratio is then not formed)
            assert printed[r["round_id"]] == [_shown(r["error_estimate"]["relative_error"])] + [
                _shown(rel[k]) for k in ("estimate", "rand_k", "rand_k_spatial")]
        os.killpg(pgid, signal.SIGINT)  # Ctrl-C in the terminal
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert "Ctrl-C: stopping the server and the clients" in rest
        wait_group_gone(pgid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(10)


def test_long_wait_reports_elapsed_time_until_stopped() -> None:
    from rpsagg_experiments.cluster import LongWait

    lines: list[str] = []
    waiting = LongWait(lines.append, after=0.05, every=0.05)
    waiting.start("round 1 decoding", "why it takes long")
    end = time.monotonic() + 30
    while len(lines) < 3 and time.monotonic() < end:  # bounded wait for three reports
        time.sleep(0.01)
    waiting.stop()
    count = len(lines)
    assert count >= 3
    assert re.fullmatch(r"\[cluster\] round 1 decoding: \d+ s \(why it takes long\)", lines[0])
    assert all(re.fullmatch(r"\[cluster\] round 1 decoding: \d+ s", x) for x in lines[1:])
    time.sleep(0.2)  # four report periods: nothing may follow a stop()
    assert len(lines) == count
    # a wait that ends before `after` prints nothing
    quick = LongWait(lines.append, after=60.0)
    quick.start("round 2 decoding")
    quick.stop()
    assert len(lines) == count
