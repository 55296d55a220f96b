"""The gRPC edge of the domain's refusals: one table, applied by one interceptor.

:data:`GRPC_STATUS` maps each :class:`~rpsagg_server.domain.errors.DomainError` class to the status
a call refused with it ends with; :class:`RefusalInterceptor`, installed on every server
that serves the Aggregation service, catches a refusal raised by a handler (or by an
interceptor inside it, such as the token check), logs it with the method's tag and aborts
the call with its status and message (:func:`abort`). Handlers just raise.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from rpsagg_server.domain.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    NotReady,
    PreconditionFailed,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger("rpsagg.server")

#: the status a call refused with each domain error ends with
GRPC_STATUS: dict[type[DomainError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    PreconditionFailed: grpc.StatusCode.FAILED_PRECONDITION,
    LimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotReady: grpc.StatusCode.UNAVAILABLE,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: DomainError) -> grpc.StatusCode:
    """The status a call refused with ``exc`` ends with (its nearest class in the table).

    Parameters
    ----------
    exc : DomainError

    Returns
    -------
    grpc.StatusCode
    """
    for cls in type(exc).__mro__:
        if cls in GRPC_STATUS:
            return GRPC_STATUS[cls]
    return grpc.StatusCode.UNKNOWN  # only a DomainError itself: every subclass is listed


async def abort(context: Any, method: str, exc: DomainError) -> NoReturn:
    """Log a refusal with the method's tag and end the call with its status and message.

    Parameters
    ----------
    context : grpc.aio.ServicerContext
        The call's context.
    method : str
        The method's name, for the log line's tag.
    exc : DomainError
        The refusal.
    """
    status = status_of(exc)
    log.info("[Aggregator.%s] %s: %s", method, status.name, exc.message)
    await context.abort(status, exc.message)
    raise AssertionError("context.abort returned")  # grpc.aio's abort always raises


class RefusalInterceptor(grpc.aio.ServerInterceptor):
    """Answers every :class:`~rpsagg_server.domain.errors.DomainError` a handler (or an interceptor
    after this one) raises with :func:`abort`; install it before the token check."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Wrap the method's handler so that its refusals become the call's status."""
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler  # no other kind of method is served


def _unary(method: str, inner: Any) -> Any:
    async def behavior(request: Any, context: Any) -> Any:
        try:
            res = inner(request, context)
            return await res if inspect.isawaitable(res) else res
        except DomainError as exc:
            await abort(context, method, exc)
    return behavior


async def stream_items(res: Any) -> AsyncIterator[Any]:
    """The items a unary-stream handler's result gives, whatever its form: an async
    generator, an awaitable that writes with ``context.write``, or an iterable."""
    if inspect.isasyncgen(res):
        async for item in res:
            yield item
    elif inspect.isawaitable(res):  # writes with context.write
        await res
    else:
        for item in res:
            yield item


def _stream(method: str, inner: Any) -> Any:
    async def behavior(request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for item in stream_items(inner(request, context)):
                yield item
        except DomainError as exc:
            await abort(context, method, exc)
    return behavior
