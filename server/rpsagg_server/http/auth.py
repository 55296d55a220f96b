"""Bearer-token authentication of the dashboard's data (``--http-tokens FILE``).

With a token file, ``/api/*`` and ``/metrics`` need exactly one header
``Authorization: Bearer <token>`` with a token of the file (Prometheus:
``authorization: {credentials_file: ...}``; the dashboard page asks for a token and sends it).
Open without a token: the health probes (``/healthz``, ``/readyz``), the page itself (``/``,
``/static/*``: no data), and the API's schema (``/docs``, ``/openapi.json``).

Refusals say nothing about the tokens: ``401`` (``WWW-Authenticate: Bearer``) for a
missing, repeated or malformed header, ``403`` for a well-formed header with an unknown
token. Tokens are compared as SHA-256 digests with :func:`hmac.compare_digest`, every token
of the file each time, so the time taken does not depend on which token (or how much of
one) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from rpsagg_server.auth import read_token_text

PROTECTED = ("/api/", "/metrics")


class HttpTokens:
    """Dashboard tokens from a file: one per line; blank lines and ``#`` lines are skipped.

    Parameters
    ----------
    tokens : list of str
    """

    def __init__(self, tokens: list[str]) -> None:
        if not tokens:
            raise ValueError("no tokens")
        self._digests = [hashlib.sha256(t.encode()).digest() for t in tokens]

    @classmethod
    def from_file(cls, path: str, flag: str = "--http-tokens") -> HttpTokens:
        """Parse a token file.

        Raises
        ------
        ValueError
            A line with more than one word, or no token at all (the message names the line).
        """
        tokens: list[str] = []
        for lineno, line in enumerate(read_token_text(flag, path).splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) != 1:
                raise ValueError(f"{flag} {path}:{lineno}: expected one token per line")
            tokens.append(parts[0])
        if not tokens:
            raise ValueError(f"{flag} {path}: no tokens")
        return cls(tokens)

    def __or__(self, other: HttpTokens) -> HttpTokens:
        """The tokens of both files (the admin tokens also read the dashboard's data)."""
        out = HttpTokens.__new__(HttpTokens)
        out._digests = self._digests + other._digests
        return out

    def known(self, token: str) -> bool:
        """Whether ``token`` is one of the file's (constant time in which one matched)."""
        digest = hashlib.sha256(token.encode()).digest()
        found = False
        for d in self._digests:
            found |= hmac.compare_digest(d, digest)
        return found


def protected(path: str) -> bool:
    """Whether ``path`` needs a token: ``/api/*`` and ``/metrics`` (``/metrics/`` too)."""
    return path.startswith(PROTECTED[0]) or path.rstrip("/") == PROTECTED[1]


class BearerAuth:
    """ASGI middleware: the token check in front of the app's protected paths.

    Parameters
    ----------
    app : ASGI app
    tokens : HttpTokens
    """

    def __init__(self, app: ASGIApp, tokens: HttpTokens) -> None:
        self.app = app
        self.tokens = tokens

    def verdict(self, headers: list[tuple[bytes, bytes]]) -> int:
        """200 (let it through), 401 (no usable header) or 403 (unknown token)."""
        values = [v for k, v in headers if k.lower() == b"authorization"]
        if len(values) != 1:
            return 401
        scheme, _, token = values[0].partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return 401
        try:
            text = token.strip().decode("ascii")
        except UnicodeDecodeError:
            return 401
        return 200 if self.tokens.known(text) else 403

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        status = self.verdict(scope["headers"])
        if status == 200:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "unauthorized" if status == 401 else "forbidden"}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="rpsagg"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
