"""gRPC servicer: parse at the wire edge, validate, raise the domain's refusals.

A refusal (:class:`~rpsagg_server.domain.errors.DomainError`) raised by a handler is logged with
the method's tag and answered with its status by :func:`~rpsagg_server.rpc.refusals.abort`,
the one place that maps them: :meth:`AggregationServicer.generic_handler` registers every
handler wrapped once (:func:`~rpsagg_server.rpc.refusals.answer_unary`).

Authentication runs before any handler, in :class:`~rpsagg_server.rpc.auth.TokenInterceptor`;
a handler only checks that the client id a request names is the token's own
(:func:`~rpsagg_server.rpc.auth.authorize`).

Each request names its job (field ``job``; ``""`` for the default job): the handler routes
it to that job's engine through the :class:`~rpsagg_server.jobs.jobhost.JobHost`, and checks that
the token may act in it (:func:`~rpsagg_server.rpc.auth.authorize_job`). A submission's job is
read without parsing the submission (:func:`rpsagg_wire.v1.serde.peek_job`) and its size is
held to the job's own limit.

Handlers are registered raw (request bytes in), so malformed bytes are parsed by
:mod:`rpsagg_wire.v1.serde` and answered with INVALID_ARGUMENT and a message, instead of the
generic deserialization failure gRPC would give.

A ``--d 0`` job waiting for its first join's d (:mod:`rpsagg_server.jobs.firstjoin`) is
served here too: its Join and GetRound go to its
:class:`~rpsagg_server.jobs.firstjoin.FirstJoin`, its other calls are refused by the
routing (UNAVAILABLE, retried).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from rpsagg_server.domain.errors import DomainError, InvalidRequest, LimitExceeded
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.jobs.jobruntime import JobRuntime
from rpsagg_server.readmodel.events import SubmissionRefused
from rpsagg_server.rounds.membership import ended_refusal
from rpsagg_server.rounds.requestchecks import check_client_id
from rpsagg_server.rpc.auth import authorize, authorize_job, bound_client
from rpsagg_server.rpc.refusals import answer_stream, answer_unary, status_of
from rpsagg_wire.v1 import serde


class AggregationServicer:
    """Implements ``rpsagg.v1.Aggregation`` on top of the jobs of a :class:`JobHost`."""

    def __init__(self, host: JobHost) -> None:
        self.host = host

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """The method handlers to add to a ``grpc.aio`` server."""

        def unary(name: str, fn: Callable[[bytes, Any], Awaitable[Any]]) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                answer_unary(name, fn), request_deserializer=None,
                response_serializer=serde.reply_serializer(name))

        return grpc.method_handlers_generic_handler(serde.SERVICE, {
            "Join": unary("Join", self.Join),
            "GetRound": unary("GetRound", self.GetRound),
            "Submit": unary("Submit", self.Submit),
            "GetResult": unary("GetResult", self.GetResult),
            "WatchRounds": grpc.unary_stream_rpc_method_handler(
                answer_stream("WatchRounds", self.WatchRounds), request_deserializer=None,
                response_serializer=serde.reply_serializer("WatchRounds")),
        })

    # -- helpers ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _job(self, job: str) -> AsyncIterator[JobRuntime]:
        """The job a request names, if the token may act in it (an ended job's opened to be
        read: :mod:`~rpsagg_server.jobs.endedjobs`), leased while the block runs."""
        async with self.host.ended.serving(job) as rt:
            authorize_job(rt.id)
            yield rt

    def _check_reader(self, client_id: str) -> None:
        """The optional ``client_id`` of a read: well formed, and the token's own."""
        if client_id:
            check_client_id(client_id)
            authorize(client_id)

    def _parse(self, method: str, raw: bytes) -> Any:
        try:
            return serde.parse_request(method, raw)
        except serde.WireError as exc:
            raise InvalidRequest(str(exc)) from None

    # -- methods: a refusal raised here is answered by refusals.abort (generic_handler) ----
    async def Join(self, raw: bytes, context: Any) -> serde.JoinReply:
        """Register a client id."""
        req = self._parse("Join", raw)
        check_client_id(req.client_id)
        authorize(req.client_id)
        waiting = self.host.waiting_for_d(req.job)
        if waiting is not None:
            authorize_job(waiting.id)
            await waiting.join(req.client_id, req.d)  # raises: fixed, or refused
        ended = self.host.listing.ended_info(req.job)
        if ended is not None:  # it never ran: refused as a job that ended
            authorize_job(req.job)
            raise ended_refusal(req.client_id, ended.job_failure)
        async with self._job(req.job) as rt:
            return await rt.engine.membership.join(req.client_id, req.d)

    async def GetRound(self, raw: bytes, context: Any) -> serde.RoundInfo:
        """The current round."""
        req = self._parse("GetRound", raw)
        self._check_reader(req.client_id)
        waiting = self.host.waiting_for_d(req.job)
        if waiting is not None:
            authorize_job(waiting.id)
            return waiting.round_info()
        ended = self.host.listing.ended_info(req.job)
        if ended is not None:  # it never ran: its row says how it ended
            authorize_job(req.job)
            return ended
        async with self._job(req.job) as rt:
            return rt.engine.results.round_info(req.client_id)

    async def Submit(self, raw: bytes, context: Any) -> serde.SubmitReply:
        """Validate and durably commit a submission; the reply is the ack."""
        arrived = time.time()  # first thing: the deadline is judged by arrival
        job: JobRuntime | None = None
        try:
            async with self._job(serde.peek_job(raw)) as job:
                if len(raw) > job.limit:
                    raise LimitExceeded(f"a submission of {len(raw)} bytes is above job "
                                        f"{job.id}'s limit of {job.limit} bytes")
                return await job.engine.intake.admit(raw, arrived, bound_client())
        except DomainError as exc:
            counted = job or self.host.default()
            if counted is not None:
                counted.engine.publish(SubmissionRefused(status_of(exc).name, exc.message))
            raise

    async def GetResult(self, raw: bytes, context: Any) -> serde.RoundResult:
        """A round's result, optionally waiting for it."""
        req = self._parse("GetResult", raw)
        self._check_reader(req.client_id)
        remaining = context.time_remaining()
        timeout = None if remaining is None else max(0.0, remaining - 0.2)
        async with self._job(req.job) as rt:
            return await rt.engine.results.result(req.round_id, req.wait, timeout,
                                                  req.client_id)

    async def WatchRounds(self, raw: bytes, context: Any) -> AsyncIterator[serde.RoundEvent]:
        """Stream round events until the job is done."""
        req = self._parse("WatchRounds", raw)
        self._check_reader(req.client_id)
        async with self._job(req.job) as rt:
            async for ev in rt.engine.results.watch(req.client_id):
                yield ev
