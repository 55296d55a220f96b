"""Ended jobs let go of what they held: a created job that ends (done, failed, cancelled)
is closed, and opened again, to be read, only while its rounds are asked for.

A job's end (:meth:`EndedJobs.retire`, once its end is durable in its own database):

1. what its rounds came to (:func:`~rpsagg_server.jobs.jobviews.summary`) is written to its
   catalog row, which describes it from then on (``GET /api/jobs/{id}``, the list);
2. it lets go of its threads and its writer
   (:meth:`~rpsagg_server.jobs.jobruntime.JobRuntime.release`) and leaves the open jobs;
3. it stays open to be read, the most recently used of at most :data:`READERS` ended jobs;
   the one used least recently is closed (its store, its read model, its app).

A request for a closed job's rounds (its API under ``/api/jobs/{id}/``, its page,
``GetResult``, ``GetRound``, ``WatchRounds``) opens its database with no writer
(:func:`~rpsagg_server.jobs.jobruntime.open_job` with ``reading``), read back as a restart
reads a job, into the same bounded set. A job with no rounds (queued, then cancelled) has
no database and is never opened (:meth:`~.jobviews.JobListing.ended_info`).

Every request holds a lease on the runtime it uses (:meth:`EndedJobs.serving`,
:meth:`EndedJobs.app_of`): a runtime pushed out of the set while a request reads it is
closed when that request is done.

Fault story: a summary that cannot be written is logged, kept in memory and the job closed
anyway; the next start finds an ended job with no summary, opens it (cancelled again if its
cancel was not in its database yet) and closes it, writing the summary then. A database
that cannot be opened for reading is refused with why
(:class:`~rpsagg_server.domain.errors.Unavailable`), and is tried again at the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import TYPE_CHECKING

from rpsagg_server.domain.errors import PreconditionFailed, Unavailable
from rpsagg_server.jobs import jobviews
from rpsagg_server.jobs.catalog import CatalogError, JobRecord
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN, JobRuntime

if TYPE_CHECKING:
    from rpsagg_server.jobs.jobhost import JobHost

log = logging.getLogger("rpsagg.server")

#: the ended jobs kept open to be read, at most (the most recently used)
READERS = 4


class EndedJobs:
    """The ended created jobs: closed, opened to be read (module docstring).

    Parameters
    ----------
    host : JobHost
        The jobs (its catalog, open jobs and the hooks that build a job's app).
    records : MutableMapping[str, JobRecord]
        The catalog's rows, as the host keeps them.
    size : int
        :data:`READERS`.
    """

    def __init__(self, host: JobHost, records: MutableMapping[str, JobRecord],
                 size: int = READERS) -> None:
        self.host = host
        self._records = records
        self.size = size
        self._open: OrderedDict[str, JobRuntime] = OrderedDict()
        self._opening: dict[str, asyncio.Task[JobRuntime]] = {}
        self._closing: set[asyncio.Task[None]] = set()  # closes, releases under way
        #: called with a job's runtime as it leaves the open jobs (its metrics are final)
        self.on_retire: list[Callable[[JobRuntime], None]] = []

    def held(self) -> list[str]:
        """The ids of the ended jobs open to be read now, least recently used first."""
        return list(self._open)

    # -- a job's end -----------------------------------------------------------------------
    async def retire(self, rt: JobRuntime, keep: bool = True) -> None:
        """Close an ended created job: its summary in its row, its threads let go, out of
        the open jobs into the set open to be read (module docstring), or closed at once
        (``keep`` False: a start closing a job a crash left open)."""
        summary = {**jobviews.summary(rt), "db_bytes": _db_bytes(rt.cfg.db)}
        try:
            await asyncio.to_thread(self.host.catalog.set_summary, rt.id, summary)
        except CatalogError as exc:
            log.warning("[Jobs] job %s: its summary could not be recorded (%s); the next start "
                        "opens it once to record it", rt.id, exc)
        rec = self._records.get(rt.id)
        if rec is not None:
            self._records[rt.id] = dataclasses.replace(rec, summary=summary)
        await rt.release()
        if self.host.jobs.get(rt.id) is not rt:  # removed meanwhile (DELETE)
            return
        for hook in self.on_retire:
            hook(rt)
        del self.host.jobs[rt.id]
        if keep:
            self._keep(rt)
        else:
            await self._close(rt)

    # -- reading ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def serving(self, job: str) -> AsyncIterator[JobRuntime]:
        """The runtime of the job a gRPC request names
        (:meth:`~rpsagg_server.jobs.jobhost.JobHost.route`), a closed ended job opened to
        be read, leased while the block runs."""
        try:
            rt: JobRuntime | None = self.host.route(job)
        except PreconditionFailed:
            rec = self._records.get(job)
            if rec is None or not jobviews.closed(rec):
                raise
            rt = None
        async with self._leased(job, rt) as leased:
            yield leased

    @contextlib.asynccontextmanager
    async def app_of(self, job_id: str) -> AsyncIterator[JobRuntime | None]:
        """The runtime whose app answers job ``job_id``'s HTTP paths, leased while the
        block runs: an open job's, a closed ended one's opened to be read, or None (no
        such job, or one with no rounds)."""
        rt = self.host.jobs.get(job_id)
        rec = self._records.get(job_id)
        if rt is None and (rec is None or not jobviews.closed(rec)):
            yield None
            return
        async with self._leased(job_id, rt) as leased:
            yield leased

    @contextlib.asynccontextmanager
    async def _leased(self, job_id: str, rt: JobRuntime | None) -> AsyncIterator[JobRuntime]:
        if rt is None:
            rt = await self._reader(job_id)  # leased already
        else:
            rt.leases += 1
            if rt.id in self._open:
                self._open.move_to_end(rt.id)
        try:
            yield rt
        finally:
            rt.leases -= 1
            if rt.leases == 0 and not self._holds(rt):
                self._close_later(rt)

    async def _reader(self, job_id: str) -> JobRuntime:
        """A closed job's runtime, opened to be read if it is not open, returned with a
        lease. One open at a time per job, which a caller that goes away does not stop (the
        runtime is kept, then closed as any other): nothing opened is left unclosed."""
        while True:
            rt = self._open.get(job_id)
            if rt is not None:
                rt.leases += 1
                self._open.move_to_end(job_id)
                return rt
            task = self._opening.get(job_id)
            if task is None:
                task = self._opening[job_id] = asyncio.ensure_future(self._read(job_id))
                task.add_done_callback(lambda t: self._opened(job_id, t))
            await asyncio.shield(task)  # then it is kept (pushed out meanwhile: again)

    def _opened(self, job_id: str, task: asyncio.Task[JobRuntime]) -> None:
        self._opening.pop(job_id, None)
        if not task.cancelled() and task.exception() is None:
            self._keep(task.result())

    async def _read(self, job_id: str) -> JobRuntime:
        try:
            rt = await self.host.open_record(self._records[job_id], install=False,
                                             reading=True)
        except CANNOT_OPEN as exc:
            log.error("[Jobs] job %s cannot be opened to be read: %s", job_id, exc)
            raise Unavailable(f"job {job_id}'s rounds cannot be read: {exc}") from None
        rt.keep_little()
        for hook in self.host.on_open:
            hook(rt)
        # its task measured again (its dashboard's curve), then its threads let go
        self._track(asyncio.ensure_future(rt.release()))
        return rt

    # -- the set ---------------------------------------------------------------------------
    def _keep(self, rt: JobRuntime) -> None:
        """``rt`` is the most recently used; the least recently used beyond :attr:`size`
        are closed (once no request uses them)."""
        self._open[rt.id] = rt
        self._open.move_to_end(rt.id)
        while len(self._open) > self.size:
            _, old = self._open.popitem(last=False)
            if old.leases == 0:
                self._close_later(old)

    def _holds(self, rt: JobRuntime) -> bool:
        return self._open.get(rt.id) is rt or self.host.jobs.get(rt.id) is rt

    def _close_later(self, rt: JobRuntime) -> None:
        self._track(asyncio.ensure_future(self._close(rt)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(rt: JobRuntime) -> None:
        try:
            await rt.close()
        except Exception:
            log.exception("[Jobs] job %s could not be closed", rt.id)

    async def drop(self, job_id: str) -> None:
        """Close an ended job now, or when its last request is done (it is being
        removed)."""
        rt = self._open.pop(job_id, None)
        if rt is not None and rt.leases == 0:
            await self._close(rt)

    async def close(self) -> None:
        """Close every ended job open to be read (the server stops), those being opened
        too."""
        for task in list(self._opening.values()):
            with contextlib.suppress(Exception):
                await task  # then kept (_opened), and closed below
        while self._open:
            _, rt = self._open.popitem()
            await self._close(rt)
        await asyncio.gather(*list(self._closing), return_exceptions=True)


def _db_bytes(db: str) -> int:
    """A job's database and its write-ahead log, in bytes, as they are now."""
    return sum(os.path.getsize(db + suffix) for suffix in ("", "-wal")
               if os.path.exists(db + suffix))
