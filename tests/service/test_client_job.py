"""A client names its job: ``AggregationClient(job=...)`` and ``rpsagg-client --job`` (or
``RPSAGG_JOB``) put it in every request (the ``job`` field, 30), and the client's lines
say which job they are about.

The server here is a stand-in speaking the real wire format (a grpc server with generic
handlers): it records the job of each request as the server reads it (``serde.peek_job``)
and as it parses it, and plays a one-round mean job.
"""

from __future__ import annotations

import argparse
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest

from rpsagg_client import AggregationClient
from rpsagg_client.cli import _parser, round_line, run
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import (
    JoinReply,
    RoundEvent,
    RoundInfo,
    RoundResult,
    Submission,
    SubmitReply,
    VectorPayload,
)

pytestmark = pytest.mark.service

K, D = 4, 8
NAN = math.nan


class OneRoundJob:
    """A one-round ``rand-k`` mean job for one client; records ``(method, job)`` per call,
    the job read both by :func:`serde.peek_job` and by the full parse."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.submitted = threading.Event()

    def _record(self, name: str, raw: bytes) -> Any:
        req = serde.parse_request(name, raw)
        assert serde.peek_job(raw) == req.job  # the server's shortcut agrees with the parse
        self.calls.append((name, req.job))
        return req

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(name: str) -> Any:
            fn = getattr(self, name.lower())
            return grpc.unary_unary_rpc_method_handler(
                lambda raw, ctx: fn(self._record(name, raw)),
                response_serializer=serde.reply_serializer(name))

        return grpc.method_handlers_generic_handler(serde.SERVICE, {
            **{name: unary(name) for name in ("Join", "GetRound", "Submit", "GetResult")},
            "WatchRounds": grpc.unary_stream_rpc_method_handler(
                lambda raw, ctx: self.watchrounds(self._record("WatchRounds", raw)),
                response_serializer=serde.reply_serializer("WatchRounds")),
        })

    def _done(self) -> bool:
        return self.submitted.is_set()

    def join(self, req: Any) -> JoinReply:
        return JoinReply(client_index=0, n=1, task="mean", data_hint="synthetic")

    def getround(self, req: Any) -> RoundInfo:
        return RoundInfo(round_id=1, nonce=7, scheme="rand-k", n=1, k=K, d=D, transform="none",
                         task="mean", m=1, global_state=None,
                         state="done" if self._done() else "open", deadline_unix_ms=0,
                         eval=False, job_done=self._done(), task_step=0, total_rounds=1,
                         job_id=1)

    def submit(self, req: Any) -> SubmitReply:
        self.submitted.set()
        return SubmitReply(round_id=req.round_id, received=1, duplicate=False)

    def getresult(self, req: Any) -> RoundResult:
        return RoundResult(
            round_id=1, state="done", reason="", estimate=np.zeros((1, D)), global_state=None,
            n_prime=1, beta=NAN, c=NAN, decode_seconds=0.0, contributors=(), r_hat=NAN,
            eval_sq_error=NAN, eval_sq_error_rand_k=NAN, eval_sq_error_rand_k_spatial=NAN,
            job_done=self._done(), nonce=7, transform="none")

    def watchrounds(self, req: Any) -> Iterator[RoundEvent]:
        yield RoundEvent(round_id=1, state="done", job_done=True)


@pytest.fixture
def job_server() -> Iterator[tuple[OneRoundJob, str]]:
    job = OneRoundJob()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((job.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield job, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("job_id", ["exp-7", ""])
def test_every_request_names_the_clients_job(job_server: tuple[OneRoundJob, str],
                                             job_id: str) -> None:
    job, target = job_server
    with AggregationClient(target, "c0", insecure=True, job=job_id) as client:
        assert client.job == job_id
        client.join(D)
        rnd = client.current_round()
        client.submit(rnd, np.ones(D))
        # an already encoded submission that names no job goes for the client's job
        client.submit_encoded(Submission(1, "c0", 5, (VectorPayload(np.zeros(K, np.float32),
                                                                    np.arange(K)),)))
        assert client.result(1, wait=True).state == "done"
        assert [ev.job_done for ev in client.watch()] == [True]
    methods = ["Join", "GetRound", "Submit", "Submit", "GetResult", "WatchRounds"]
    assert job.calls == [(m, job_id) for m in methods]


@pytest.mark.timeout(60)
def test_a_submission_that_names_a_job_goes_as_it_is(
        job_server: tuple[OneRoundJob, str]) -> None:
    job, target = job_server
    with AggregationClient(target, "c0", insecure=True, job="a") as client:
        client.submit_encoded(Submission(1, "c0", 5, (VectorPayload(np.zeros(K, np.float32),
                                                                    np.arange(K)),), job="b"))
    assert job.calls == [("Submit", "b")]


def _args(argv: list[str]) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    args.token = None
    return args


def test_the_job_flag_reads_rpsagg_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RPSAGG_JOB", raising=False)
    assert _parser().parse_args([]).job == ""
    monkeypatch.setenv("RPSAGG_JOB", "from-env")
    assert _parser().parse_args([]).job == "from-env"
    assert _parser().parse_args(["--job", "from-flag"]).job == "from-flag"  # the flag wins


@pytest.mark.timeout(60)
def test_rpsagg_client_job_takes_part_and_its_lines_name_the_job(
        job_server: tuple[OneRoundJob, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RPSAGG_JOB", raising=False)
    job, target = job_server
    args = _args(["--server", target, "--client-id", "c0", "--insecure", "--job", "exp-7"])
    assert run(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("[c0] job exp-7 round 1: sent "), out
    assert "acked as 1 of 1" in out[0]
    assert {j for _, j in job.calls} == {"exp-7"}
    assert [m for m, _ in job.calls][:2] == ["Join", "GetRound"]
    assert "Submit" in [m for m, _ in job.calls]


def test_round_line_names_the_job_only_when_given() -> None:
    assert round_line("c0", 3, None, "why", None, 2) == "[c0] round 3: nothing sent (why)"
    assert round_line("c0", 3, None, "why", None, 2, "j1") == \
        "[c0] job j1 round 3: nothing sent (why)"
