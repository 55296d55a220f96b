"""Retention: the created jobs that ended (done, failed, cancelled) keep their data up to
``--keep-finished-jobs``; beyond it the job that ended first is removed, with a line in
the log: its runtime closed, its database deleted, then its catalog row. ``DELETE
/api/jobs/{id}`` removes an ended job at once. A queued or running job is never removed.

Fault story: the files go before the row, so a crash between them leaves a row without a
database, which a restart shows as a job that never ran (and retention removes in turn),
never a database that nothing lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from rpsagg_server.domain.errors import NotFound, PreconditionFailed, Unavailable
from rpsagg_server.domain.jobstate import ENDED
from rpsagg_server.jobs.catalog import CatalogError, JobRecord
from rpsagg_server.jobs.jobruntime import JobRuntime

if TYPE_CHECKING:
    from rpsagg_server.jobs.jobhost import JobHost

log = logging.getLogger("rpsagg.server")


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
    """

    def __init__(self, host: JobHost, records: MutableMapping[str, JobRecord],
                 keep: int) -> None:
        self.host = host
        self._records = records
        self.keep = keep
        #: called with a job's id and runtime (None: not open) before it is removed
        self.on_remove: list[Callable[[str, JobRuntime | None], None]] = []
        self._started = False  # the host's jobs are reopened (nothing is being opened)
        self._lock = asyncio.Lock()  # one removal at a time (a job's end, an API call)

    def ended(self) -> list[JobRecord]:
        """The ended created jobs, the first ended first."""
        done = [r for r in self._records.values() if r.kind == "created" and r.state in ENDED]
        return sorted(done, key=lambda r: (r.finished_at or 0.0, r.seq))

    async def start(self) -> None:
        """Once the host reopened its jobs (a job's end meanwhile removes nothing, so that
        no job is removed while it is being reopened): :meth:`apply`, then at every call."""
        self._started = True
        await self.apply()

    async def apply(self) -> None:
        """Remove the ended jobs beyond :attr:`keep`, the first ended first."""
        if not self._started:
            return
        async with self._lock:
            ended = self.ended()
            for rec in ended[:max(len(ended) - self.keep, 0)]:
                try:
                    await self._remove(rec.id, f"--keep-finished-jobs {self.keep}")
                except Exception:  # it stays (logged): retention never stops the server
                    log.exception("[Jobs] job %s could not be removed", rec.id)

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
            hook(job_id, rt)
        if rt is not None:
            del self.host.jobs[job_id]
            await rt.close()
        await asyncio.to_thread(_delete_files, self.host.catalog.job_db(job_id))
        try:
            await asyncio.to_thread(self.host.catalog.delete, job_id)
        except CatalogError as exc:
            raise Unavailable(f"job {job_id}'s data was removed, its row not: {exc}") from None
        del self._records[job_id]
        self.host.listing.forget(job_id)
        log.info("[Jobs] job %s removed (%s)", job_id, why)
