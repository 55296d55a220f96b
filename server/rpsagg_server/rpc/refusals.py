"""The gRPC edge of the domain's refusals: one table, applied by one function.

:data:`GRPC_STATUS` maps each :class:`~rpsagg_server.domain.errors.DomainError` class to the
status a call refused with it ends with; :func:`abort` logs a refusal with the method's tag
and ends the call with its status and message. The servicer's handlers are wrapped once, when
the service is registered (:func:`answer_unary`, :func:`answer_stream`), so a refusal they
raise is answered by :func:`abort`; the token check answers its own with :func:`abort` too.
Handlers just raise. (An interceptor doing the same cost a wrapped handler per call: about a
tenth of the server's CPU per submission in a burst, ``bench/bench_service_load.py``.)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
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


def answer_unary(method: str, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A unary handler whose refusals end its call with their status (:func:`abort`).

    Parameters
    ----------
    method : str
        The method's name, for the log line's tag.
    inner : callable
        The handler, ``inner(request, context)``: a coroutine function or a plain one.

    Returns
    -------
    callable
        The coroutine function to register in its place.
    """
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


def answer_stream(method: str, inner: Callable[[Any, Any], Any]
                  ) -> Callable[[Any, Any], AsyncIterator[Any]]:
    """A unary-stream handler whose refusals end its call with their status
    (:func:`abort`), whatever form its result takes (:func:`stream_items`).

    Parameters
    ----------
    method : str
        The method's name, for the log line's tag.
    inner : callable
        The handler, ``inner(request, context)``.

    Returns
    -------
    callable
        The async generator function to register in its place.
    """
    async def behavior(request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for item in stream_items(inner(request, context)):
                yield item
        except DomainError as exc:
            await abort(context, method, exc)
    return behavior
