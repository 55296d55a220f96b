"""``rpsagg-client`` prints one line per round (bytes sent, ack, how the round ended) unless
``--quiet``; the bytes it prints are the bytes the server counted for its submission."""

from __future__ import annotations

import re
import subprocess

import pytest
from service_util import base_config, client_command, in_process_server, kill_all

ROUNDS = 3
LINE = re.compile(r"^\[client-0\] round (\d+): sent (\d+) B \((\d+) floats \+ seed\), "
                  r"acked as ([12]) of 2; round done with 2/2 clients$")


@pytest.mark.timeout(180)
def test_one_line_per_round_unless_quiet() -> None:
    cfg = base_config(n=2, k=8, d=64, rounds=ROUNDS, task="mean", eval=True)
    with in_process_server(cfg) as srv:
        procs = [subprocess.Popen(client_command([
            "--server", f"127.0.0.1:{srv.port}", "--client-id", f"client-{i}", "--insecure",
            *(["--quiet"] if i == 1 else []),
        ]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
        try:
            outs = [p.communicate(timeout=150) for p in procs]
        finally:
            kill_all(procs)  # type: ignore[arg-type]
        assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
        state = srv.running.state
        lines = outs[0][0].splitlines()
        matches = [LINE.match(line) for line in lines]
        assert all(matches), lines
        assert [int(m.group(1)) for m in matches if m] == list(range(1, ROUNDS + 1))
        for m in matches:
            assert m is not None
            view = state.round_detail(int(m.group(1)))
            assert view is not None
            mine = [a for a in view.arrivals if a.client_id == "client-0"]
            assert len(mine) == 1
            assert int(m.group(2)) == mine[0].wire_bytes  # the server's count
            assert int(m.group(3)) == cfg.k
        assert outs[1][0] == ""  # --quiet
