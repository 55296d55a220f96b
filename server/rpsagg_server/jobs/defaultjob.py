"""The default job: the job of the server's flags (id ``default``, rounds in ``--db``).

It opens at start, or, with ``--d 0``, waits for its first join's d
(:class:`~rpsagg_server.jobs.firstjoin.FirstJoin`; state ``waiting``) and opens once a join
fixed it. Its catalog row is written from its database at every open (the database stays
its authority: a row that cannot be written is kept in memory and logged; a job its database
says failed for the reason a cancelled row gives stays cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import replace
from typing import Any

from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.jobstate import JobState
from rpsagg_server.jobs import jobviews
from rpsagg_server.jobs.catalog import DEFAULT_JOB, Catalog, CatalogError, JobRecord
from rpsagg_server.jobs.firstjoin import FirstJoin
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN, JobRuntime, open_job
from rpsagg_server.settings.serverconfig import JOB_KEYS, ServerConfig

log = logging.getLogger("rpsagg.server")


class DefaultJob:
    """Opens the default job and keeps its catalog row.

    Parameters
    ----------
    catalog : Catalog
        The server's catalog.
    records : MutableMapping[str, JobRecord]
        The host's rows in memory (this writes the default job's).
    pool : DecodePool
        The decode workers.
    install : Callable[[JobRuntime], None]
        Called with the runtime once the job is open (the host serves it from then on).
    changed : Callable[[], None]
        Called at every change of the row.
    """

    id = DEFAULT_JOB

    def __init__(self, catalog: Catalog, records: MutableMapping[str, JobRecord],
                 pool: DecodePool, install: Callable[[JobRuntime], None],
                 changed: Callable[[], None]) -> None:
        self.catalog = catalog
        self.records = records
        self.pool = pool
        self.install = install
        self.changed = changed
        #: the job while it waits for its first join's d (``--d 0``)
        self.waiting: FirstJoin | None = None
        self._settled = asyncio.Event()  # it opened, or cannot
        self._error: BaseException | None = None
        self._learning: asyncio.Task[None] | None = None

    async def open(self, cfg: ServerConfig) -> JobRuntime | None:
        """Open it; with ``d = 0`` it waits for its first join (None is returned, and the
        job opens once a join fixed d)."""
        if cfg.d:
            return await self._open(cfg)
        self.waiting = FirstJoin(self.id, cfg)
        public = cfg.public_dict()
        self.record(JobState.WAITING, {k: public[k] for k in JOB_KEYS})
        self._learning = asyncio.ensure_future(self._open_learned(cfg, self.waiting))
        return None

    async def _open(self, cfg: ServerConfig) -> JobRuntime:
        rt = await open_job(self.id, cfg, self.pool.lane(self.id), default=True)
        state = jobviews.runtime_state(rt)
        before = self.records.get(self.id)
        if (state == JobState.FAILED and before is not None
                and before.state == JobState.CANCELLED
                and before.failure == rt.engine.progress.job_failure):
            state = JobState.CANCELLED  # the job's database says why it failed: the cancel
        self.record(state, jobviews.runtime_settings(rt), rt.engine.progress.job_failure,
                    rt.state.started_at, jobviews.finished_at(rt))
        self.install(rt)
        self._settled.set()
        return rt

    async def _open_learned(self, cfg: ServerConfig, waiting: FirstJoin) -> None:
        """Once the first join fixed d: open the job with it."""
        try:
            d = await waiting.learned
            waiting.store.close()
            await self._open(replace(cfg, d=d))
        except CANNOT_OPEN as exc:
            log.error("[Jobs] job %s cannot start: %s", self.id, exc)
            self.record(JobState.FAILED, dict(self.records[self.id].settings),
                        f"failed to start: {exc}")
            self._error = exc
            self._settled.set()
        finally:
            self.waiting = None

    async def wait(self) -> None:
        """Return once it is open; what kept a waiting job from opening is raised
        (:data:`~rpsagg_server.jobs.jobruntime.CANNOT_OPEN`)."""
        await self._settled.wait()
        if self._error is not None:
            raise self._error

    def record(self, state: JobState, settings: dict[str, Any], failure: str = "",
               started_at: float | None = None, finished_at: float | None = None) -> None:
        """Write its row (in memory too; a failed write is logged)."""
        try:
            rec = self.catalog.put_default(state, settings, failure, started_at, finished_at)
        except CatalogError as exc:
            log.warning("[Jobs] the catalog could not record the default job (%s)", exc)
            rec = JobRecord(self.id, 0, settings, state, started_at or 0.0, started_at,
                            finished_at, failure, "default")
        self.records[self.id] = rec
        self.changed()

    def drop(self) -> None:
        """A start without a default job (``--no-default-job``): no row of one."""
        if self.records.pop(self.id, None) is not None:
            self.catalog.drop_default()

    async def close(self) -> None:
        """Stop waiting for a first join (the runtime is closed with the other jobs)."""
        if self._learning is not None:
            self._learning.cancel()
            with contextlib.suppress(BaseException):
                await self._learning
        if self.waiting is not None:
            self.waiting.close()
