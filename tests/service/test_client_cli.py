"""``rpsagg-client`` prints one line per round (bytes sent, ack, how the round ended, the
estimated error) unless ``--quiet``; the bytes it prints are the bytes the server counted
for its submission, the error the one the server estimated."""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from service_util import base_config, client_command, in_process_server, kill_all, wait_until

from rpsagg_client import AggregationClient
from rpsagg_client.cli import round_line

pytestmark = pytest.mark.service

ROUNDS = 3
LINE = re.compile(r"^\[client-0\] round (\d+): sent (\d+) B \((\d+) floats \+ seed\), "
                  r"acked as ([12]) of 2; round done with 2/2 clients, "
                  r"estimated (relative|squared) error (\S+) \+- (\S+)$")


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
            est = view.estimated_error
            assert est is not None
            # relative where the estimate of ||x_bar||^2 is positive (it can come out <= 0
            # by chance with 2 clients), else squared
            rel = math.isfinite(est.relative_error)
            assert m.group(5) == ("relative" if rel else "squared")
            value, stderr = ((est.relative_error, est.relative_error_stderr) if rel
                             else (est.squared_error, est.squared_error_stderr))
            assert m.group(6) == f"{value:.4g}"
            assert m.group(7) == f"{stderr:.2g}"
        assert outs[1][0] == ""  # --quiet


@pytest.mark.timeout(180)
def test_refusals_for_good_exit_3_or_4_with_one_line(tmp_path: Path) -> None:
    """A client that cannot take part (the job is full; a wrong token) exits at once with a
    status that says so (3 or 4; a restart policy bounded by count stops there) and one
    line naming the client and the reason; no retries."""
    from service_util import make_certs

    certs = make_certs(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("right-token\n")
    cfg = replace(base_config(n=1, rounds=50), insecure=False, tls_cert=certs.server_cert,
                  tls_key=certs.server_key, tokens=str(tokens))
    with in_process_server(cfg) as srv, \
            AggregationClient(f"localhost:{srv.port}", "first", token="right-token",
                              tls_ca=certs.ca) as first:
        first.join()  # the only slot
        for cid, token, status, code in (("second", "right-token", 3, "RESOURCE_EXHAUSTED"),
                                         ("first", "wrong-token", 4, "UNAUTHENTICATED")):
            out = subprocess.run(client_command([
                "--server", f"localhost:{srv.port}", "--client-id", cid, "--token", token,
                "--tls-ca", certs.ca]), capture_output=True, text=True, timeout=60)
            assert out.returncode == status, out.stderr[-2000:]
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1, lines
            assert lines[0].startswith(f"rpsagg-client: {cid}: {code}: ")
            assert lines[0].endswith("(refused for good: not retrying)")


@pytest.mark.timeout(120)
def test_last_line_has_the_result_when_the_job_ends_before_the_next_look() -> None:
    """The job can end between a client's last submission and its next GetRound (the
    submission completed the last round): the client still reports that round's result.
    Forced here: one client, one round, and the client looks only once the job is done."""
    cfg = base_config(n=1, k=8, d=64, rounds=1, task="mean")
    with in_process_server(cfg) as srv, \
            AggregationClient(f"127.0.0.1:{srv.port}", "only", insecure=True) as c, \
            AggregationClient(f"127.0.0.1:{srv.port}", "observer", insecure=True) as observer:
        c.join()
        rounds = c.rounds()
        rnd = next(rounds)
        sub = c.encode(rnd, np.ones(64))
        assert c.submit_encoded(sub).received == 1
        wait_until(lambda: observer.current_round().job_done, 30, "the job to end")
        assert list(rounds) == []  # the job is over
        res = c.finished_result(rnd.round_id)
        assert res is not None and res.state == "done" and res.n_prime == 1
        line = round_line("only", rnd.round_id, sub, "acked as 1 of 1", res, 1)
        assert "; round done with 1/1 clients, estimated " in line, line
