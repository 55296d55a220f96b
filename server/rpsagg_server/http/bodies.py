"""The body of a job's creation (``POST /api/jobs``): read within a bound, parsed strictly.

A body is at most :data:`MAX_BODY` bytes: a ``Content-Length`` above it is answered ``413``
before a byte of the body is read, and a chunked body is stopped (``413``, the connection
closed) once it passes the bound, so a large body never sits in memory. Its JSON must be an
object; ``NaN``, ``Infinity`` and nesting deeper than the parser's recursion are ``400``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect

#: a creation's body, at most
MAX_BODY = 64 << 10


async def read_body(request: Request, limit: int) -> bytes:
    """A request's body, at most ``limit`` bytes: ``413`` from a ``Content-Length`` above
    it before a byte of the body is read, or once a chunked body passes it (the connection
    is closed: the rest is never read).

    Raises
    ------
    HTTPException
        413, or 400 for a malformed ``Content-Length`` or a client gone before the end.
    """
    too_large = HTTPException(413, f"a job's settings are at most {limit} bytes",
                              headers={"Connection": "close"})
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HTTPException(400, f"Content-Length must be a number of bytes; got {length!r}")
        if int(length) > limit:
            raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # gone (or closed at --http-header-timeout with a 408)
        raise HTTPException(400, "the body ended before its length") from None
    return b"".join(chunks)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_settings(raw: bytes) -> dict[str, Any]:
    """A creation's body as job settings: a JSON object (``{}`` takes every default).

    Raises
    ------
    HTTPException
        400 with one line: no body, not JSON (``NaN`` and ``Infinity`` included), nested
        too deeply, or not an object.
    """
    if not raw.strip():
        raise HTTPException(400, "the body must be a JSON object of job settings ({} for "
                            "every default); it is empty")
    try:
        settings = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise HTTPException(400, "the body is not JSON this server reads: nested too "
                            "deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HTTPException(400, f"the body is not JSON: {reason}") from None
    if not isinstance(settings, dict):
        raise HTTPException(400, "the body must be a JSON object of job settings")
    return settings
