"""Bearer-token authentication of the dashboard's data (``--http-tokens FILE``).

With a token file, every path needs exactly one header ``Authorization: Bearer <token>``
with a token of the file (Prometheus: ``authorization: {credentials_file: ...}``; the
dashboard page asks for a token and sends it), except the paths of :data:`OPEN`: the health
probes (``/healthz``, ``/readyz``), the page itself (``/``, ``/static/*``: no data), and the
API's schema (``/docs``, ``/openapi.json``). The check is made on the path an app finally
serves (:class:`Gate`), whatever prefix reached it: a job's ``/jobs/{id}/api/status`` is
that job's ``/api/status`` and needs the token as that does. Everything not open is
protected, so a route added later is protected unless it is added to :data:`OPEN`.

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

from starlette.types import Scope, Send

from rpsagg_server.settings.tokenfiles import read_token_text

#: the paths open without a token (none serves a job's data or metrics)
OPEN = frozenset({"/", "/healthz", "/readyz", "/docs", "/docs/oauth2-redirect",
                  "/openapi.json"})
#: the prefixes of open paths (the page's static files)
OPEN_PREFIXES = ("/static/",)


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
    """Whether ``path`` (the path an app serves, after any job prefix was taken off) needs a
    token: every path but :data:`OPEN` and :data:`OPEN_PREFIXES`."""
    return path not in OPEN and not path.startswith(OPEN_PREFIXES)


def verdict(tokens: HttpTokens, headers: list[tuple[bytes, bytes]]) -> int:
    """200 (a known token), 401 (no usable ``Authorization`` header: none, repeated, not
    ``Bearer``, empty or not ASCII) or 403 (an unknown token)."""
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
    return 200 if tokens.known(text) else 403


class Gate:
    """The token check of the paths apps serve.

    Parameters
    ----------
    tokens : HttpTokens, optional
        The dashboard's tokens (``--http-tokens``); None lets every request through.
    """

    def __init__(self, tokens: HttpTokens | None) -> None:
        self.tokens = tokens

    async def admit(self, path: str, scope: Scope, send: Send) -> bool:
        """Whether a request for ``path`` (as the app that answers it sees it) may go on;
        if not, the refusal (401 or 403) has been sent."""
        if self.tokens is None or scope["type"] != "http" or not protected(path):
            return True
        status = verdict(self.tokens, scope["headers"])
        if status == 200:
            return True
        body = json.dumps({"detail": "unauthorized" if status == 401 else "forbidden"}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store")]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="rpsagg"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return False
