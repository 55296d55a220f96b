"""The refusals of the domain: one exception class per kind of "no", each with a message.

The domain modules (rounds, submissions, requestchecks, membership, results, jobhost, ...) raise
these and say nothing of how a protocol answers them. Each edge maps the classes exactly
once: gRPC in :mod:`rpsagg_server.rpc.refusals` (a table class -> gRPC status, applied
by one server interceptor), HTTP in :mod:`rpsagg_server.http.errors` (a table class -> HTTP
status, applied by one FastAPI exception handler; the body is ``{"detail": message}``).

A new kind of refusal is a new subclass here and one row in each table (a test checks that
both tables cover every subclass).
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the server refuses, with a message saying why (sent to the caller as is).

    Parameters
    ----------
    message : str
        One line for the caller.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(DomainError):
    """The request itself is wrong: malformed, out of range, inconsistent with the job."""


class Unauthenticated(DomainError):
    """The caller did not say who it is (no credential, or an unknown one)."""


class Forbidden(DomainError):
    """The caller is known but may not do this (another client's id, another job)."""


class NotFound(DomainError):
    """What the request names does not exist (a job, a round)."""


class Conflict(DomainError):
    """What the request would create exists already, differently (a job id, another
    submission of the same client in the same round)."""


class PreconditionFailed(DomainError):
    """The request is well formed but the state does not allow it (a closed round, an
    ended job, a client that has not joined); retrying the same request does not help."""


class LimitExceeded(DomainError):
    """The request is above one of the job's limits (its size, the client slots)."""


class NotReady(DomainError):
    """Not yet: the job is queued or starting, or the queue is full; retry later."""


class Unavailable(DomainError):
    """The server could not do it now: the database refused a write or a read."""


class StartupError(Exception):
    """A user error found at start-up (a flag, a file, an address, a job's database that
    cannot be opened): the message is the whole report; the command exits with status 2.
    Not a :class:`DomainError`: nothing answers it on the wire."""


def error_classes() -> list[type[DomainError]]:
    """Every subclass of :class:`DomainError` (at any depth), for the edges' tables.

    Returns
    -------
    list of type
        The subclasses, in definition order.
    """
    out: list[type[DomainError]] = []
    stack = list(reversed(DomainError.__subclasses__()))
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(reversed(cls.__subclasses__()))
    return out
