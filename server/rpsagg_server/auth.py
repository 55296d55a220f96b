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
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import grpc

from rpsagg_server.errors import DomainError, Forbidden, Unauthenticated
from rpsagg_server.requestchecks import check_bound
from rpsagg_wire.v1 import serde

#: the client id the caller's token is bound to (None: any client, or no tokens)
_bound: contextvars.ContextVar[str | None] = contextvars.ContextVar("rpsagg_bound",
                                                                   default=None)
#: the job the caller's token is scoped to (None: any job, or no tokens)
_bound_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("rpsagg_bound_job",
                                                                       default=None)


class Verdict(tuple[str | None, str | None]):
    """What a token allows: ``(client_id, job)``, each None for any."""

    @property
    def client(self) -> str | None:
        return self[0]

    @property
    def job(self) -> str | None:
        return self[1]


def read_token_text(flag: str, path: str) -> str:
    """The text of a token file, UTF-8; a file that is not is one line naming ``flag``,
    the file and the first bad byte's offset (never the bytes: they may be a token)."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{flag} {path}: not UTF-8 text (an invalid byte at offset "
                         f"{exc.start})") from None


class TokenBook:
    """Client tokens from a file: one per line, ``TOKEN`` (any client id, any job),
    ``CLIENT_ID TOKEN`` (that client, any job) or ``JOB CLIENT_ID TOKEN`` (that client, in
    that job only; ``*`` as the client id: any client of the job).

    Blank lines and lines starting with ``#`` are ignored.
    """

    def __init__(self, entries: list[tuple[str | None, str]],
                 jobs: list[str | None] | None = None) -> None:
        self.entries = entries
        self.jobs = jobs if jobs is not None else [None] * len(entries)

    @classmethod
    def from_file(cls, path: str) -> TokenBook:
        """Parse a token file (the ``--tokens`` flag's); errors name the flag and the file."""
        entries: list[tuple[str | None, str]] = []
        scopes: list[str | None] = []
        for lineno, line in enumerate(read_token_text("--tokens", path).splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) == 1:
                entries.append((None, parts[0]))
                scopes.append(None)
            elif len(parts) == 2:
                entries.append((parts[0], parts[1]))
                scopes.append(None)
            elif len(parts) == 3:
                entries.append((None if parts[1] == "*" else parts[1], parts[2]))
                scopes.append(parts[0])
            else:
                raise ValueError(f"--tokens {path}:{lineno}: expected 'TOKEN', "
                                 "'CLIENT_ID TOKEN' or 'JOB CLIENT_ID TOKEN'")
        if not entries:
            raise ValueError(f"--tokens {path}: no tokens")
        return cls(entries, scopes)

    def lookup(self, token: str) -> tuple[bool, str | None]:
        """``(known, bound_client_id)``; compares in constant time per entry."""
        known, verdict = self.lookup_scoped(token)
        return known, verdict.client

    def lookup_scoped(self, token: str) -> tuple[bool, Verdict]:
        """``(known, (bound_client_id, job))``; compares in constant time per entry."""
        found, bound = False, Verdict((None, None))
        for (cid, tok), job in zip(self.entries, self.jobs, strict=True):
            if hmac.compare_digest(tok.encode(), token.encode()):
                found, bound = True, Verdict((cid, job))
        return found, bound

    def authenticate(self, metadata: Any) -> Verdict:
        """The client id and job the call's token is bound to (None: any); raises
        :class:`~rpsagg_server.errors.Unauthenticated` for anything but exactly one
        ``authorization: Bearer <known token>`` entry."""
        headers = [v for k, v in (metadata or ()) if k == "authorization"]
        if len(headers) > 1:
            raise Unauthenticated(
                f"{len(headers)} 'authorization' metadata entries; send exactly one")
        header = headers[0] if headers else ""
        if not isinstance(header, str) or not header.startswith("Bearer ") or not header[7:]:
            raise Unauthenticated(
                "missing token: send metadata 'authorization: Bearer <token>'")
        known, bound = self.lookup_scoped(header[7:])
        if not known:
            raise Unauthenticated("invalid token")
        return bound


def authorize(client_id: str) -> None:
    """Refuse (:class:`~rpsagg_server.errors.Forbidden`) a request naming another client
    than the token's own."""
    check_bound(_bound.get(), client_id)


def authorize_job(job: str) -> None:
    """Refuse (:class:`~rpsagg_server.errors.Forbidden`) a call in another job than the
    token's own."""
    scope = _bound_job.get()
    if scope is not None and scope != job:
        raise Forbidden(f"this token is for job {scope!r}, not {job!r}")


def bound_client() -> str | None:
    """The client id this call's token belongs to (None: any client, or no tokens); for a
    check made later, outside the call's context
    (:func:`~rpsagg_server.requestchecks.check_bound`)."""
    return _bound.get()


Refused = Callable[[str, DomainError], None]


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call of the Aggregation service before its handler runs.

    A refused call raises its :class:`~rpsagg_server.errors.Unauthenticated`; the
    :class:`~rpsagg_server.grpcerrors.RefusalInterceptor` installed before this one answers it.

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

    def _refuse(self, method: str, exc: DomainError) -> NoReturn:
        if self.on_refused is not None:
            self.on_refused(method, exc)
        raise exc

    def _unary(self, method: str, inner: Any, verdict: Verdict | DomainError) -> Any:
        async def behavior(request: Any, context: Any) -> Any:
            if isinstance(verdict, DomainError):
                self._refuse(method, verdict)
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
                self._refuse(method, verdict)
            _bound.set(verdict.client)  # this call's own task: nothing else reads it
            _bound_job.set(verdict.job)
            async for item in inner(request, context):
                yield item
        return behavior
