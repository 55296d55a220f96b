"""The HTTP edge of the domain's refusals: one table, applied by one exception handler.

:data:`HTTP_STATUS` maps each :class:`~rpsagg_server.domain.errors.DomainError` class to the HTTP
status a request refused with it is answered with; :func:`install` registers the one
FastAPI exception handler that answers it, with the body ``{"detail": message}`` (the shape
of FastAPI's own ``HTTPException`` answers). Routes just let the refusal through.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

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

#: the HTTP status a request refused with each domain error is answered with
HTTP_STATUS: dict[type[DomainError], int] = {
    InvalidRequest: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    PreconditionFailed: 409,
    LimitExceeded: 413,
    NotReady: 503,
    Unavailable: 503,
}


def http_status(exc: DomainError) -> int:
    """The HTTP status a request refused with ``exc`` is answered with (its nearest class in
    the table).

    Parameters
    ----------
    exc : DomainError

    Returns
    -------
    int
    """
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500  # only a DomainError itself: every subclass is listed


async def _answer(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)  # registered for DomainError only
    return JSONResponse({"detail": exc.message}, status_code=http_status(exc))


def install(app: FastAPI) -> None:
    """Answer every :class:`~rpsagg_server.domain.errors.DomainError` a route of ``app`` raises.

    Parameters
    ----------
    app : FastAPI
    """
    app.add_exception_handler(DomainError, _answer)
