"""gRPC servicer: authenticate, parse at the wire edge, validate, log with a tag, abort.

Handlers are registered raw (request bytes in), so malformed bytes are parsed by
:mod:`rpsagg_wire.v1.serde` and answered with INVALID_ARGUMENT and a message, instead of the
generic deserialization failure gRPC would give.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from rpsagg_server.live import Rejected, check_client_id
from rpsagg_server.rounds import RoundEngine
from rpsagg_wire.v1 import serde

log = logging.getLogger("rpsagg.server")


class TokenBook:
    """Client tokens from a file: one per line, ``TOKEN`` (any client id) or ``CLIENT_ID TOKEN``.

    Blank lines and lines starting with ``#`` are ignored.
    """

    def __init__(self, entries: list[tuple[str | None, str]]) -> None:
        self.entries = entries

    @classmethod
    def from_file(cls, path: str) -> TokenBook:
        """Parse a token file."""
        entries: list[tuple[str | None, str]] = []
        for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) == 1:
                entries.append((None, parts[0]))
            elif len(parts) == 2:
                entries.append((parts[0], parts[1]))
            else:
                raise ValueError(f"{path}:{lineno}: expected 'TOKEN' or 'CLIENT_ID TOKEN'")
        if not entries:
            raise ValueError(f"{path}: no tokens")
        return cls(entries)

    def lookup(self, token: str) -> tuple[bool, str | None]:
        """``(known, bound_client_id)``; compares in constant time per entry."""
        found, bound = False, None
        for cid, tok in self.entries:
            if hmac.compare_digest(tok.encode(), token.encode()):
                found, bound = True, cid
        return found, bound


_CODES = {c.name: c for c in grpc.StatusCode}


class AggregationServicer:
    """Implements ``rpsagg.v1.Aggregation`` on top of a :class:`RoundEngine`."""

    def __init__(self, engine: RoundEngine, tokens: TokenBook | None) -> None:
        self.engine = engine
        self.tokens = tokens

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """The method handlers to add to a ``grpc.aio`` server."""

        def unary(name: str, fn: Callable[[bytes, Any], Awaitable[Any]]) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=None,
                response_serializer=serde.reply_serializer(name))

        return grpc.method_handlers_generic_handler(serde.SERVICE, {
            "Join": unary("Join", self.Join),
            "GetRound": unary("GetRound", self.GetRound),
            "Submit": unary("Submit", self.Submit),
            "GetResult": unary("GetResult", self.GetResult),
            "WatchRounds": grpc.unary_stream_rpc_method_handler(
                self.WatchRounds, request_deserializer=None,
                response_serializer=serde.reply_serializer("WatchRounds")),
        })

    # -- helpers ---------------------------------------------------------------------------
    def _authenticate(self, context: Any, client_id: str | None) -> None:
        if self.tokens is None:
            return
        headers = [v for k, v in (context.invocation_metadata() or ()) if k == "authorization"]
        if len(headers) > 1:  # never let "the last one wins" pick among several tokens
            raise Rejected("UNAUTHENTICATED",
                           f"{len(headers)} 'authorization' metadata entries; send exactly one")
        header = headers[0] if headers else ""
        if not isinstance(header, str) or not header.startswith("Bearer ") or not header[7:]:
            raise Rejected("UNAUTHENTICATED",
                           "missing token: send metadata 'authorization: Bearer <token>'")
        known, bound = self.tokens.lookup(header[7:])
        if not known:
            raise Rejected("UNAUTHENTICATED", "invalid token")
        if bound is not None and client_id is not None and bound != client_id:
            raise Rejected("PERMISSION_DENIED",
                           f"this token belongs to client {bound!r}, not {client_id!r}")

    def _check_reader(self, context: Any, client_id: str) -> None:
        """The optional ``client_id`` of a read: well formed, and the token's own."""
        if client_id:
            check_client_id(client_id)
            self._authenticate(context, client_id)

    async def _abort(self, context: Any, tag: str, exc: Rejected) -> None:
        log.info("[Aggregator.%s] %s: %s", tag, exc.code, exc.message)
        await context.abort(_CODES[exc.code], exc.message)

    def _parse(self, method: str, raw: bytes) -> Any:
        try:
            return serde.parse_request(method, raw)
        except serde.WireError as exc:
            raise Rejected("INVALID_ARGUMENT", str(exc)) from None

    # -- methods ---------------------------------------------------------------------------
    async def Join(self, raw: bytes, context: Any) -> serde.JoinReply:
        """Register a client id."""
        try:
            self._authenticate(context, None)
            req = self._parse("Join", raw)
            check_client_id(req.client_id)
            self._authenticate(context, req.client_id)
            return await self.engine.join(req.client_id)
        except Rejected as exc:
            await self._abort(context, "Join", exc)
            raise AssertionError("unreachable") from None

    async def GetRound(self, raw: bytes, context: Any) -> serde.RoundInfo:
        """The current round."""
        try:
            self._authenticate(context, None)
            req = self._parse("GetRound", raw)
            self._check_reader(context, req.client_id)
            return self.engine.round_info(req.client_id)
        except Rejected as exc:
            await self._abort(context, "GetRound", exc)
            raise AssertionError("unreachable") from None

    async def Submit(self, raw: bytes, context: Any) -> serde.SubmitReply:
        """Validate and durably commit a submission; the reply is the ack."""
        arrived = time.time()  # first thing: the deadline is judged by arrival
        try:
            self._authenticate(context, None)
            sub = self._parse("Submit", raw)
            self._authenticate(context, sub.client_id)
            return await self.engine.submit(sub, arrived, raw)
        except Rejected as exc:
            self.engine.state._emit("submission", exc.code)
            await self._abort(context, "Submit", exc)
            raise AssertionError("unreachable") from None

    async def GetResult(self, raw: bytes, context: Any) -> serde.RoundResult:
        """A round's result, optionally waiting for it."""
        try:
            self._authenticate(context, None)
            req = self._parse("GetResult", raw)
            self._check_reader(context, req.client_id)
            remaining = context.time_remaining()
            timeout = None if remaining is None else max(0.0, remaining - 0.2)
            return await self.engine.result(req.round_id, req.wait, timeout, req.client_id)
        except Rejected as exc:
            await self._abort(context, "GetResult", exc)
            raise AssertionError("unreachable") from None

    async def WatchRounds(self, raw: bytes, context: Any) -> AsyncIterator[serde.RoundEvent]:
        """Stream round events until the job is done."""
        try:
            self._authenticate(context, None)
            req = self._parse("WatchRounds", raw)
            self._check_reader(context, req.client_id)
        except Rejected as exc:
            await self._abort(context, "WatchRounds", exc)
            return
        async for ev in self.engine.watch(req.client_id):
            yield ev
