"""Retention: the created jobs that ended (done, failed, cancelled) keep their data up to
``--keep-finished-jobs`` jobs and for ``--keep-finished-for`` after their end; beyond either
the job that ended first is removed, with a line in the log: its runtime closed, its
database deleted, then its catalog row. The count is applied at every job's end, the age
when the oldest kept job reaches it (a timer). ``DELETE /api/jobs/{id}`` removes an ended
job at once. A queued or running job is never removed. ``GET /api/jobs`` says what is kept
(:meth:`Retention.kept`).

Fault story: the files go before the row, so a crash between them leaves a row without a
database, which a restart shows as a job that never ran (and retention removes in turn),
never a database that nothing lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rpsagg_server.domain.errors import NotFound, PreconditionFailed, Unavailable
from rpsagg_server.domain.jobstate import ENDED
from rpsagg_server.jobs.catalog import CatalogError, JobRecord
from rpsagg_server.settings.process import format_duration

if TYPE_CHECKING:
    from rpsagg_server.jobs.jobhost import JobHost

log = logging.getLogger("rpsagg.server")

#: the age timer looks again at least this often (seconds; a clock that jumped)
MAX_WAIT_S = 3600.0
#: seconds before the timer tries again to remove a job past its age whose removal failed
RETRY_S = 60.0


def _delete_files(db: str) -> None:
    """A job's database and its journal files."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            Path(db + suffix).unlink()


class Retention:
    """The ended jobs' data a server keeps (module docstring).

    Parameters
    ----------
    host : JobHost
        The jobs.
    records : MutableMapping[str, JobRecord]
        The catalog's rows, as the host keeps them.
    keep : int
        ``--keep-finished-jobs``: the ended created jobs kept, the most recently ended.
    keep_for : float
        ``--keep-finished-for``: seconds an ended job is kept after its end (0: no limit).
    """

    def __init__(self, host: JobHost, records: MutableMapping[str, JobRecord],
                 keep: int, keep_for: float = 0.0) -> None:
        self.host = host
        self._records = records
        self.keep = keep
        self.keep_for = keep_for
        self._timer: asyncio.Task[None] | None = None
        self._applied = asyncio.Event()  # set by every apply (the age timer looks again)
        #: called with a job's id before it is removed
        self.on_remove: list[Callable[[str], None]] = []
        self._started = False  # the host's jobs are reopened (nothing is being opened)
        self._lock = asyncio.Lock()  # one removal at a time (a job's end, an API call)

    def ended(self) -> list[JobRecord]:
        """The ended created jobs, the first ended first."""
        done = [r for r in self._records.values() if r.kind == "created" and r.state in ENDED]
        return sorted(done, key=lambda r: (r.finished_at or 0.0, r.seq))

    def kept(self) -> dict[str, Any]:
        """What is kept: the rules, the ended jobs kept and their databases' bytes (as they
        closed)."""
        ended = self.ended()
        return {"keep_finished_jobs": self.keep, "keep_finished_for": self.keep_for,
                "ended_jobs": len(ended),
                "ended_bytes": sum(int(r.summary.get("db_bytes", 0)) for r in ended),
                "oldest_finished_at": ended[0].finished_at if ended else None}

    async def start(self) -> None:
        """Once the host reopened its jobs (a job's end meanwhile removes nothing, so that
        no job is removed while it is being reopened): :meth:`apply` in the background (a
        start serves before it removes what it found due), then at every call, and by age
        when the oldest kept job reaches it."""
        self._started = True
        self._timer = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Stop the background removals (the server stops)."""
        if self._timer is not None:
            self._timer.cancel()

    async def _run(self) -> None:
        """Apply, then again whenever the oldest kept job reaches the age (looked at again
        after every :meth:`apply`: a job that ended meanwhile may be the oldest)."""
        await self.apply()
        while self.keep_for > 0:
            ended = self.ended()
            due = (ended[0].finished_at or 0.0) + self.keep_for if ended else math.inf
            left = due - time.time()  # <= 0: its removal failed (logged)
            self._applied.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied.wait(),
                                       min(left + 0.5 if left > 0 else RETRY_S, MAX_WAIT_S))
            if not self._applied.is_set():
                await self.apply()

    async def apply(self) -> None:
        """Remove the ended jobs beyond :attr:`keep` and those older than
        :attr:`keep_for`, the first ended first."""
        if not self._started:
            return
        async with self._lock:
            ended = self.ended()
            cut = time.time() - self.keep_for if self.keep_for > 0 else -math.inf
            for i, rec in enumerate(ended):
                if i < len(ended) - self.keep:
                    why = f"--keep-finished-jobs {self.keep}"
                elif (rec.finished_at or 0.0) < cut:
                    why = f"--keep-finished-for {format_duration(self.keep_for)}"
                else:
                    break  # the rest ended later
                try:
                    await self._remove(rec.id, why)
                except Exception:  # it stays (logged): retention never stops the server
                    log.exception("[Jobs] job %s could not be removed", rec.id)
        self._applied.set()

    async def remove(self, job_id: str, why: str) -> None:
        """Remove an ended job's data and row; :class:`NotFound` for an unknown job,
        :class:`PreconditionFailed` for one that has not ended (or is not a created
        job), :class:`Unavailable` when its row could not be dropped (its data is gone:
        it is shown as a job that never ran)."""
        async with self._lock:
            await self._remove(job_id, why)

    async def _remove(self, job_id: str, why: str) -> None:
        rec = self._records.get(job_id)
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        rt = self.host.jobs.get(job_id)
        if rec.kind != "created" or rec.state not in ENDED or (
                rt is not None and not rt.engine.job_done):
            raise PreconditionFailed(f"job {job_id} is {rec.state}: only an ended created "
                                     "job's data can be removed (cancel it first)")
        for hook in self.on_remove:
            hook(job_id)
        if rt is not None:  # ended, not closed yet
            del self.host.jobs[job_id]
            await rt.close()
        await self.host.ended.drop(job_id)
        await asyncio.to_thread(_delete_files, self.host.catalog.job_db(job_id))
        try:
            await asyncio.to_thread(self.host.catalog.delete, job_id)
        except CatalogError as exc:
            raise Unavailable(f"job {job_id}'s data was removed, its row not: {exc}") from None
        del self._records[job_id]
        self.host.listing.forget(job_id)
        log.info("[Jobs] job %s removed (%s)", job_id, why)
