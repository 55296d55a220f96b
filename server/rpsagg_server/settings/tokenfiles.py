"""The gRPC token file (``--tokens``): its tokens, each bound to a client, a job, or any,
and the reading of any token file (UTF-8, errors that never show a token's bytes)."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from rpsagg_server.domain.errors import Unauthenticated


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
        :class:`~rpsagg_server.domain.errors.Unauthenticated` for anything but exactly one
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
