"""The job's end: a drained job end, CANCELLED retried on reads,
and ``--max-failed-rounds``.

The drained end is tested on the real ``rpsagg-server`` process with ``--linger 0`` (the
setting under which the server used to stop while clients' reads were accepted by gRPC but
not yet handled, which cancelled them): a client that polls late still gets ``job_done`` and
the server waits for it; a client that never polls holds the server only for ``--drain``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import (
    base_config,
    client_command,
    in_process_server,
    kill_all,
    server_command,
    wait_port_file,
)

from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import RoundEvent, RoundInfo, RoundResult

pytestmark = pytest.mark.service

K, D = 8, 64


def start_server(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """An ``rpsagg-server`` process (mean task, eval off, linger 0) on a free port."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(server_command([
        "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
        "--k", str(K), "--d", str(D), "--task", "mean", "--round-timeout", "120",
        "--db", str(tmp_path / "job.db"), "--linger", "0", "--port-file", str(port_file),
        *args,
    ]), stderr=subprocess.PIPE)
    try:
        return proc, wait_port_file(port_file, proc)
    except BaseException:
        kill_all([proc])
        raise


@pytest.mark.timeout(240)
def test_late_pollers_get_job_done_and_the_server_waits_for_them(tmp_path: Path) -> None:
    """Two ``rpsagg-client`` processes and one client that polls only 1.5 s after the job is
    done: every one is told ``job_done`` and exits cleanly, and the server (``--linger 0``,
    ``--drain 90``) stops once the last of them was told, long before its drain bound."""
    n, rounds = 3, 2
    server, port = start_server(tmp_path, "--n", str(n), "--rounds", str(rounds),
                                "--drain", "90")
    procs = [server]
    target = f"127.0.0.1:{port}"
    try:
        for i in range(n - 1):
            procs.append(subprocess.Popen(client_command(
                ["--server", target, "--client-id", f"cli-{i}", "--insecure"]),
                stderr=subprocess.PIPE))
        late = AggregationClient(target, "late", insecure=True)
        observer = AggregationClient(target, "observer", insecure=True)  # never joins
        late.join()
        rng = np.random.default_rng(3)
        for rnd in late.rounds():
            late.submit(rnd, rng.normal(size=D))
            if rnd.task_step == rounds - 1:  # the last round: wait until the job is done
                assert observer.result(rnd.round_id, wait=True, timeout=120).job_done
                time.sleep(1.5)  # the injected fault: this client polls late
                assert server.poll() is None, "the server stopped before 'late' was told"
        assert late.job_failure == ""
        for p in procs[1:]:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
        _, err = server.communicate(timeout=60)
        assert server.returncode == 0, err.decode()[-2000:]
        # it stopped because all were told, not at its 90 s drain bound
        assert f"all {n} joined clients were told" in err.decode()
        late.close()
        observer.close()
    finally:
        kill_all(procs)


@pytest.mark.timeout(120)
def test_a_client_that_never_polls_holds_the_server_only_for_the_drain(
    tmp_path: Path,
) -> None:
    drain = 3.0
    server, port = start_server(tmp_path, "--n", "2", "--rounds", "1", "--drain", str(drain))
    try:
        a, b = (AggregationClient(f"127.0.0.1:{port}", cid, insecure=True)
                for cid in ("a", "b"))
        for c in (a, b):
            c.join()
        rnd = a.current_round()
        for c in (a, b):
            c.submit(rnd, np.ones(D))
        assert a.result(rnd.round_id, wait=True, timeout=60).job_done  # 'a' is told
        told_at = time.monotonic()
        _, err = server.communicate(timeout=drain + 60)  # 'b' never asks again
        waited = time.monotonic() - told_at
        log = err.decode()
        assert server.returncode == 0, log[-2000:]
        assert f"drain bound of {drain:.1f} s passed; 1 joined client(s) were not told: b" \
            in log
        assert waited < drain + 30, waited
        a.close()
        b.close()
    finally:
        kill_all([server])


# -- CANCELLED on the idempotent reads -------------------------------------------------------
class FlakyServicer:
    """Answers each method, but the first call of GetRound and GetResult, and the first
    WatchRounds stream after its first event, end with CANCELLED (what a stopping server
    gives a call it accepted but had not handled)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(name: str, fn: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, response_serializer=serde.reply_serializer(name))

        return grpc.method_handlers_generic_handler(serde.SERVICE, {
            "GetRound": unary("GetRound", self.get_round),
            "GetResult": unary("GetResult", self.get_result),
            "Submit": unary("Submit", self.submit),
            "WatchRounds": grpc.unary_stream_rpc_method_handler(
                self.watch, response_serializer=serde.reply_serializer("WatchRounds")),
        })

    def get_round(self, raw: bytes, context: grpc.ServicerContext) -> RoundInfo:
        if self._count("GetRound") == 1:
            context.abort(grpc.StatusCode.CANCELLED, "injected")
        assert serde.parse_request("GetRound", raw).client_id == "c0"
        return RoundInfo(0, 0, "rand-k", 1, K, D, "", "mean", 1, None, "unspecified", 0,
                         False, True, 1, 1)

    def get_result(self, raw: bytes, context: grpc.ServicerContext) -> RoundResult:
        if self._count("GetResult") == 1:
            context.abort(grpc.StatusCode.CANCELLED, "injected")
        req = serde.parse_request("GetResult", raw)
        nan = float("nan")
        return RoundResult(req.round_id, "done", "", None, None, 1, nan, nan, nan, (), nan,
                           nan, nan, nan, True, 0, "none")

    def submit(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        self._count("Submit")
        context.abort(grpc.StatusCode.CANCELLED, "injected")

    def watch(self, raw: bytes, context: grpc.ServicerContext) -> Iterator[RoundEvent]:
        n = self._count("WatchRounds")
        yield RoundEvent(1, "open")
        if n == 1:
            context.abort(grpc.StatusCode.CANCELLED, "injected")
        yield RoundEvent(1, "done", "", True, 1)


def test_cancelled_reads_are_retried_and_a_watch_reopened() -> None:
    from concurrent.futures import ThreadPoolExecutor

    flaky = FlakyServicer()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((flaky.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with AggregationClient(f"127.0.0.1:{port}", "c0", insecure=True, backoff=0.01,
                               retry_budget=10) as c:
            assert c.current_round().job_done and flaky.calls["GetRound"] == 2
            assert c.job_failure == ""
            assert c.result(1, wait=True).state == "done" and flaky.calls["GetResult"] == 2
            events = [(ev.round_id, ev.state, ev.job_done) for ev in c.watch()]
            # the re-opened stream starts again with the current state
            assert events == [(1, "open", False), (1, "open", False), (1, "done", True)]
            assert flaky.calls["WatchRounds"] == 2
            # Submit is not a read: a cancelled Submit is reported, not retried
            with pytest.raises(grpc.RpcError) as err:
                c.submit_encoded(serde.Submission(1, "c0", 1, (
                    serde.VectorPayload(np.zeros(K, np.float32)),)))
            assert err.value.code() == grpc.StatusCode.CANCELLED
            assert flaky.calls["Submit"] == 1
    finally:
        server.stop(0)


# -- --max-failed-rounds ---------------------------------------------------------------------
def scrape_job_state(http: TestClient) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            if s.name == "rpsagg_job_state":
                out[s.labels["state"]] = s.value
    return out


@pytest.mark.timeout(180)
def test_max_failed_rounds_ends_the_job_as_failed_with_the_reason(tmp_path: Path) -> None:
    """n = 3, --min-clients 2, one client: every round fails at its deadline; after
    --max-failed-rounds 2 the job ends as failed, visible in WatchRounds' last event,
    /api/status, /metrics and RoundInfo, and after a restart."""
    cfg = base_config(n=3, k=K, d=D, min_clients=2, round_timeout=0.3, max_failed_rounds=2,
                      rounds=3, db=str(tmp_path / "failed.db"))
    with in_process_server(cfg) as srv:
        target = f"127.0.0.1:{srv.port}"
        with TestClient(create_app(srv.running.state, CollectorRegistry())) as http, \
                AggregationClient(target, "alone", insecure=True) as c, \
                AggregationClient(target, "observer", insecure=True) as observer:
            assert scrape_job_state(http) == {"running": 1.0, "done": 0.0, "failed": 0.0}
            events = observer.watch()
            c.join()
            submitted = []
            for rnd in c.rounds():
                c.submit(rnd, np.ones(D))
                submitted.append(rnd.round_id)
            assert submitted == [1, 2]
            assert c.job_failure is not None
            assert c.job_failure == ("its last round failed: deadline: 1 of the minimum 2 "
                                     "clients submitted")
            last = [ev for ev in events][-1]
            assert last.job_done and last.state == "failed" and last.round_id == 2
            want = ("2 consecutive rounds failed (--max-failed-rounds 2); the last: "
                    "deadline: 1 of the minimum 2 clients submitted")
            assert last.reason == want
            job = http.get("/api/status").json()["job"]
            assert job["state"] == "failed" and job["failure"] == want and job["done"]
            assert job["steps_done"] == 0
            assert scrape_job_state(http) == {"running": 0.0, "done": 0.0, "failed": 1.0}
            info = c.current_round()
            assert info.job_done and info.job_failure == want and info.total_rounds == 3
            assert [r["state"] for r in http.get("/api/rounds").json()["rounds"]] == \
                ["failed", "failed"]
    with in_process_server(replace(cfg, max_failed_rounds=5)) as srv:  # restart: remembered
        job_view = srv.running.state.job()
        assert job_view is not None and job_view.state == "failed"
        assert job_view.failure == want
        with AggregationClient(f"127.0.0.1:{srv.port}", "alone", insecure=True) as c:
            assert c.current_round().job_failure == want


@pytest.mark.timeout(120)
def test_the_failed_round_streak_survives_a_restart(tmp_path: Path) -> None:
    """One failed round, a restart, one more: with --max-failed-rounds 2 the job fails."""
    cfg = base_config(n=3, k=K, d=D, min_clients=2, round_timeout=0.3, max_failed_rounds=2,
                      rounds=3, db=str(tmp_path / "streak.db"))
    for round_id in (1, 2):
        with in_process_server(cfg) as srv, \
                AggregationClient(f"127.0.0.1:{srv.port}", "alone", insecure=True) as c:
            c.join()
            rnd = c.current_round()
            assert rnd.round_id == round_id and not rnd.job_done
            c.submit(rnd, np.ones(D))
            res = c.result(round_id, wait=True, timeout=60)
            assert res.state == "failed" and res.job_done == (round_id == 2)
    with in_process_server(cfg) as srv:
        job = srv.running.state.job()
        assert job is not None and job.state == "failed"
        assert job.failure.startswith("2 consecutive rounds failed")
