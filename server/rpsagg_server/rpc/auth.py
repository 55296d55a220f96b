"""Token authentication of the ``rpsagg.v1.Aggregation`` service, as a grpc.aio interceptor.

With ``--tokens FILE``, every call of the service must carry exactly one metadata entry
``authorization: Bearer <token>`` with a token of the file; anything else is answered
unauthenticated before the handler runs (more than one entry included: "the last one wins"
never picks among several tokens). A token bound to a client id in the file
(``CLIENT_ID TOKEN``) may only act as that client: the handler checks the id the request
names with :func:`authorize` (forbidden otherwise). A token of a job
(``JOB CLIENT_ID TOKEN``) may only act in that job (:func:`authorize_job`). Other services
on the same server (the gRPC health service) are not intercepted.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from rpsagg_server.domain.errors import DomainError, Forbidden
from rpsagg_server.rounds.requestchecks import check_bound
from rpsagg_server.rpc.refusals import abort
from rpsagg_server.settings.tokenfiles import TokenBook, Verdict
from rpsagg_wire.v1 import serde

#: the client id the caller's token is bound to (None: any client, or no tokens)
_bound: contextvars.ContextVar[str | None] = contextvars.ContextVar("rpsagg_bound",
                                                                   default=None)
#: the job the caller's token is scoped to (None: any job, or no tokens)
_bound_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("rpsagg_bound_job",
                                                                       default=None)


def authorize(client_id: str) -> None:
    """Refuse (:class:`~rpsagg_server.domain.errors.Forbidden`) a request naming another client
    than the token's own."""
    check_bound(_bound.get(), client_id)


def authorize_job(job: str) -> None:
    """Refuse (:class:`~rpsagg_server.domain.errors.Forbidden`) a call in another job than the
    token's own."""
    scope = _bound_job.get()
    if scope is not None and scope != job:
        raise Forbidden(f"this token is for job {scope!r}, not {job!r}")


def bound_client() -> str | None:
    """The client id this call's token belongs to (None: any client, or no tokens); for a
    check made later, outside the call's context
    (:func:`~rpsagg_server.rounds.requestchecks.check_bound`)."""
    return _bound.get()


Refused = Callable[[str, DomainError], None]


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call of the Aggregation service before its handler runs.

    A refused call ends with its :class:`~rpsagg_server.domain.errors.Unauthenticated`,
    answered by :func:`~rpsagg_server.rpc.refusals.abort` as the handlers' refusals are.

    Parameters
    ----------
    tokens : TokenBook
    on_refused : callable, optional
        ``on_refused(method, rejected)`` for each refused call (the metrics count refused
        submissions).
    """

    def __init__(self, tokens: TokenBook, on_refused: Refused | None = None) -> None:
        self.tokens = tokens
        self.on_refused = on_refused
        self._prefix = f"/{serde.SERVICE}/"

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the Aggregation service's handlers with the token check."""
        handler = await continuation(details)
        path: str = details.method
        if handler is None or not path.startswith(self._prefix):
            return handler
        method = path[len(self._prefix):]
        try:
            verdict: Verdict | DomainError = self.tokens.authenticate(
                details.invocation_metadata)
        except DomainError as exc:
            verdict = exc
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary, verdict),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream, verdict),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler  # the service has no other kinds of method

    async def _refuse(self, context: Any, method: str, exc: DomainError) -> NoReturn:
        if self.on_refused is not None:
            self.on_refused(method, exc)
        await abort(context, method, exc)

    def _unary(self, method: str, inner: Any, verdict: Verdict | DomainError) -> Any:
        async def behavior(request: Any, context: Any) -> Any:
            if isinstance(verdict, DomainError):
                await self._refuse(context, method, verdict)
            token = _bound.set(verdict.client)
            job_token = _bound_job.set(verdict.job)
            try:
                return await inner(request, context)
            finally:
                _bound_job.reset(job_token)
                _bound.reset(token)
        return behavior

    def _stream(self, method: str, inner: Any, verdict: Verdict | DomainError) -> Any:
        async def behavior(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(verdict, DomainError):
                await self._refuse(context, method, verdict)
            _bound.set(verdict.client)  # this call's own task: nothing else reads it
            _bound_job.set(verdict.job)
            async for item in inner(request, context):
                yield item
        return behavior
