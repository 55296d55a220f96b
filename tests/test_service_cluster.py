"""The README's main command (the local cluster launcher): round lines, summary, Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

CMD = [sys.executable, "-m", "rpsagg_server.cluster", "--n", "3", "--k", "8", "--d", "128",
       "--data", "synthetic", "--data-r", "1", "--http-port", "0"]
ROUND_LINE = re.compile(r"^\s+(\d+)\s+3/3\s+120 B\s+1\.5 KiB\s+\S+\s+\S+\s+\S+\s+\d+ ms$")


@pytest.mark.timeout(180)
def test_cluster_prints_a_line_per_round_and_a_summary() -> None:
    out = subprocess.run([*CMD, "--rounds", "2"], capture_output=True, text=True, timeout=170)
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
        assert proc.returncode == 130
        assert "Ctrl-C: stopping the server and the clients" in rest
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail("processes of the cluster are still running after Ctrl-C")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(10)
