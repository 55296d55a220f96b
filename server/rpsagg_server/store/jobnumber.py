"""The job's number (``RoundInfo.job_id``), kept in its database's meta table."""

from __future__ import annotations

import secrets
from typing import Protocol

JOB_ID_KEY = "job_id"


class _Meta(Protocol):
    def get_meta(self, key: str) -> str | None: ...

    def put_meta(self, key: str, value: str) -> None: ...


def job_id(store: _Meta) -> int:
    """The job's id (``RoundInfo.job_id``): a random non-zero 63-bit number drawn by the first
    start on a database (a database from before the id gets one at its next start) and kept
    in meta ``job_id``. A new job on a new database (``--on-finished-job new``) draws a new
    one, which tells the clients of the old job that theirs ended."""
    saved = store.get_meta(JOB_ID_KEY)
    if saved is not None:
        return int(saved)
    new = secrets.randbits(63) or 1
    store.put_meta(JOB_ID_KEY, str(new))
    return new
