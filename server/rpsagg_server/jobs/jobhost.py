"""A standing service: the jobs of one server, created at start (the default job, from the
job flags) or over the HTTP API (``POST /api/jobs``), each with its own rounds, database,
read model and fault story, sharing one gRPC port, one dashboard and one pool of decode
workers.

:class:`JobHost` owns them: it routes a request's ``job`` field to its runtime
(:class:`~rpsagg_server.jobs.jobruntime.JobRuntime`), or to the default job's
:class:`~rpsagg_server.jobs.firstjoin.FirstJoin` while a ``--d 0`` job waits for its d;
creates, queues, starts, cancels, closes (:mod:`~rpsagg_server.jobs.endedjobs`) and retires
(:mod:`~rpsagg_server.jobs.retention`) jobs; and keeps the
:class:`~rpsagg_server.jobs.catalog.Catalog`, the one list of every job (its module
docstring tells the crash story), bounded by :mod:`~rpsagg_server.jobs.scheduling`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.errors import (
    Conflict,
    NotFound,
    NotReady,
    PreconditionFailed,
    Unavailable,
)
from rpsagg_server.domain.jobstate import ENDED, OPEN_STATES, JobState
from rpsagg_server.jobs import jobviews, restore, scheduling
from rpsagg_server.jobs.catalog import (
    DEFAULT_JOB,
    JOB_STATES,
    Catalog,
    CatalogError,
    JobRecord,
    check_job_id,
    new_job_id,
)
from rpsagg_server.jobs.defaultjob import DefaultJob
from rpsagg_server.jobs.endedjobs import EndedJobs
from rpsagg_server.jobs.firstjoin import FirstJoin
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN, JobRuntime, open_job
from rpsagg_server.jobs.retention import Retention
from rpsagg_server.jobs.sizing import AUTO_REQUEST_BYTES, server_request_limit, vet
from rpsagg_server.rounds.recovery import SettingsMismatch
from rpsagg_server.settings.serverconfig import JOB_KEYS, ServerConfig, job_config, memory_limit

log = logging.getLogger("rpsagg.server")

class JobHost:
    """The jobs of one server.

    Parameters
    ----------
    cfg : ServerConfig
        The server's configuration (its job flags are the default job's).
    pool : DecodePool
        The decode workers the jobs share.
    """

    def __init__(self, cfg: ServerConfig, pool: DecodePool) -> None:
        self.cfg = cfg
        self.pool = pool
        self.catalog = Catalog(cfg.db)
        self.jobs: dict[str, JobRuntime] = {}
        self.default_id: str | None = None
        self.memory_budget = cfg.jobs_memory_bytes or memory_limit() // 2
        self.request_limit = cfg.max_request_bytes or AUTO_REQUEST_BYTES
        #: the server-wide metrics (``/metrics``; the jobs' series are added to them)
        self.registry = CollectorRegistry()
        self._records: dict[str, JobRecord] = {r.id: r for r in self.catalog.all()}
        #: the jobs as the jobs API shows them, from the catalog's rows
        self.listing = jobviews.JobListing(cfg, self._records, self.jobs)
        self._watchers: set[asyncio.Task[None]] = set()
        self._scheduling = asyncio.Lock()
        self._create_lock = asyncio.Lock()
        self._default = DefaultJob(self.catalog, self._records, pool, self._install, self._changed)
        self.retention = Retention(self, self._records, cfg.keep_finished_jobs,
                                   cfg.keep_finished_for)
        #: the ended created jobs, closed and opened to be read (:mod:`.endedjobs`)
        self.ended = EndedJobs(self, self._records)
        #: called with each job's runtime once it is open (the dashboard builds its app)
        self.on_open: list[Callable[[JobRuntime], None]] = []
        self.changed = asyncio.Event()  # set (and cleared) at every job state change

    # -- start-up --------------------------------------------------------------------------
    def expect_default(self, cfg: ServerConfig) -> None:
        """Before the default job opens: its request limit raises the server's when
        ``--max-request-bytes`` is automatic (:func:`~.sizing.server_request_limit`)."""
        self.request_limit = server_request_limit(cfg, self.request_limit)

    def add_past_jobs(self) -> None:
        """List the jobs moved to ``<db>.jobs/`` that the catalog lacks
        (:meth:`~rpsagg_server.jobs.catalog.Catalog.add_past_jobs`)."""
        self.catalog.add_past_jobs(self.cfg.db)
        self._records.update((r.id, r) for r in self.catalog.all())

    async def open_default(self, cfg: ServerConfig) -> JobRuntime | None:
        """Open the default job (the flags'); with ``d = 0`` it waits for its first join
        (None is returned; :meth:`wait_default`)."""
        self.default_id = self.listing.default_id = DEFAULT_JOB
        return await self._default.open(cfg)

    async def wait_default(self) -> JobRuntime | None:
        """The default job's runtime once it is open (None on a server without one); what
        kept a waiting job from opening is raised
        (:data:`~rpsagg_server.jobs.jobruntime.CANNOT_OPEN`)."""
        if self.default_id is None:
            return None
        await self._default.wait()
        return self.default()

    def drop_default(self) -> None:
        """A start without a default job (``--no-default-job``): no row of one."""
        self._default.drop()

    async def restore(self) -> None:
        """Reopen the running created jobs the catalog lists, close the ended ones a crash
        left open, then start the retention and what is queued
        (:func:`~rpsagg_server.jobs.restore.restore`)."""
        await restore.restore(self, self._records)

    async def open_record(self, rec: JobRecord, install: bool = True,
                          reading: bool = False) -> JobRuntime:
        """Open a created job of the catalog (:func:`~.jobruntime.open_job`; ``reading``: an
        ended one, to be read), installed as one of the open jobs (its app built, its end
        watched) unless ``install`` is False; raises :data:`~.jobruntime.CANNOT_OPEN`."""
        try:
            cfg = job_config(self.cfg, rec.job_settings, self.catalog.job_db(rec.id))
        except ValueError as exc:  # recorded settings this version refuses
            raise SettingsMismatch(str(exc)) from None
        rt = await open_job(rec.id, cfg, self.pool.lane(rec.id), reading=reading)
        if install:
            self._install(rt)
        return rt

    def _install(self, rt: JobRuntime) -> None:
        if rt.default:
            rt.state.past_jobs = self.past_jobs()  # its own /api/jobs
        self.jobs[rt.id] = rt
        for hook in self.on_open:
            hook(rt)
        task = asyncio.ensure_future(self._watch(rt))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        self._changed()

    async def _watch(self, rt: JobRuntime) -> None:
        """Record the job's end in the catalog, then start what waits."""
        await rt.engine.done_event.wait()
        rec = self._records.get(rt.id)
        p = rt.engine.progress
        if rec is not None and rec.state not in ENDED:
            await self._set_state(rt.id, jobviews.runtime_state(rt), p.job_failure,
                                  must=False, only_from=OPEN_STATES)
        why = "failed: " + p.job_failure if p.job_failure else "done"
        if not rt.default:  # an ended created job keeps one round's arrays cached
            rt.keep_little()
        log.info("[Jobs] job %s ended (%s)", rt.id, why)
        self._changed()
        await self.schedule()
        if not rt.default:  # closed (after the queued jobs started)
            await self.ended.retire(rt)
            await self.retention.apply()

    def _changed(self) -> None:
        self.changed.set()
        self.changed.clear()

    async def _set_state(self, job_id: str, state: JobState, failure: str = "",
                         must: bool = True, only_from: tuple[str, ...] = JOB_STATES) -> bool:
        """Record a job's new state in the catalog, then in memory, if it is in one of
        ``only_from`` (a cancel wins over the scheduler's ``running``); whether it moved.

        ``must``: a failed write raises :class:`CatalogError` and changes nothing (a cancel).
        Otherwise (the engine's transitions: started, ended) it changes in memory anyway and
        the failure is logged: a restart derives the same state from the job's database."""
        try:
            moved = await asyncio.to_thread(self.catalog.set_state, job_id, state, failure,
                                            only_from)
        except CatalogError as exc:
            if must:
                raise
            log.warning("[Jobs] job %s is %s, but the catalog could not record it (%s); a "
                        "restart finds it again from the job's database", job_id, state, exc)
            old = self._records.get(job_id)
            moved = old is not None and old.state in only_from
            if old is not None and moved:
                self._records[job_id] = dataclasses.replace(old, state=state, failure=failure)
            self._changed()
            return moved
        rec = self.catalog.get(job_id)
        if rec is not None:
            self._records[job_id] = rec
        self._changed()
        return moved

    # -- scheduling ------------------------------------------------------------------------
    def running(self) -> list[str]:
        """Ids of the open jobs that have not ended."""
        return [i for i, rt in self.jobs.items() if not rt.engine.job_done]

    async def schedule(self) -> None:
        """Start queued jobs, oldest first, while fewer than ``--max-jobs`` run."""
        async with self._scheduling:
            for rec in scheduling.queued(self._records.values()):
                if self._records[rec.id].state != JobState.QUEUED:  # as it is now: a cancel may
                    continue  # have come while an earlier job opened
                if len(self.running()) >= self.cfg.max_jobs:
                    return
                await self._start(rec)

    async def _start(self, rec: JobRecord) -> None:
        """Open a queued job and record it running, unless a cancel came meanwhile (then
        it is cancelled before anything can join it)."""
        try:
            rt = await self.open_record(rec)
        except CANNOT_OPEN as exc:
            log.error("[Jobs] job %s failed to start: %s", rec.id, exc)
            await self._set_state(rec.id, JobState.FAILED, f"failed to start: {exc}", must=False,
                                  only_from=(JobState.QUEUED,))
            return
        now = self._records[rec.id]  # no await since it was installed: nothing joined yet
        if now.state != JobState.QUEUED:
            await rt.engine.cancel(now.failure or "cancelled")
            return
        if await self._set_state(rec.id, JobState.RUNNING, must=False,
                                 only_from=(JobState.QUEUED,)):
            log.info("[Jobs] job %s started", rec.id)

    # -- the API ---------------------------------------------------------------------------
    async def create(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Validate, record (durably) and queue a job; it starts right after the answer when
        there is room (the answer says ``queued``).
        ``settings`` may name the job (``id``; default ``j`` and 8 random hex digits), so
        that a token file can scope tokens to it ahead of its creation.

        Raises :class:`~rpsagg_server.domain.errors.InvalidRequest` (a bad setting, or a job that
        would not fit in memory or under the request limit), :class:`~.errors.Conflict` (the
        id is taken, by any job of the catalog), :class:`~.errors.NotReady` (too many
        queued) or :class:`~.errors.Unavailable` (the catalog write failed).
        """
        settings = dict(settings)
        wanted = settings.pop("id", None)
        async with self._create_lock:
            if wanted is not None:
                check_job_id(wanted)
                if wanted in self._records or wanted == DEFAULT_JOB:
                    raise Conflict(f"id: a job {wanted!r} exists already")
            need, limit = vet(self.cfg, settings)
            scheduling.check_fits(
                need, limit, self.memory_budget,
                scheduling.committed_memory(self.jobs.values(), self._records.values()),
                self.request_limit, scheduling.count_queued(self._records.values()))
            job_id = wanted or new_job_id({*self._records, DEFAULT_JOB})
            stored = {k: v for k, v in dict(settings).items() if k in JOB_KEYS}
            stored["_memory"] = need.memory
            try:
                rec = await asyncio.to_thread(self.catalog.add, job_id, stored)
            except CatalogError as exc:
                raise Unavailable(f"the job could not be recorded: {exc}") from None
            self._records[job_id] = rec
            self.listing.remember(job_id, need.cfg)
            log.info("[Jobs] job %s created: %s", job_id,
                     ", ".join(f"{k}={v}" for k, v in sorted(stored.items()) if k[0] != "_"))
        self._spawn(self.schedule())  # after the answer (opening a database takes commits)
        return self.describe(job_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        (task := asyncio.ensure_future(coro)).add_done_callback(self._done)
        self._watchers.add(task)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._watchers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("[Jobs] scheduling failed: %s", task.exception())

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job, the default one too: its catalog row says cancelled, then its
        current round fails and the job's end is written to its database, all before the
        answer (what the answer acknowledges survives a crash); refused
        :class:`~rpsagg_server.domain.errors.NotFound` for an unknown job,
        :class:`~rpsagg_server.domain.errors.PreconditionFailed` for one that has ended."""
        if job_id == self.default_id and job_id not in self.jobs:
            raise PreconditionFailed(f"job {job_id} has not started: it waits for its "
                                     "first join")
        rec = self._records.get(job_id)
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        live = self.jobs.get(job_id)
        if rec.state in ENDED or (live is not None and live.engine.job_done):
            raise PreconditionFailed(f"job {job_id} has ended already "
                                     f"({jobviews.runtime_state(live) if live else rec.state})")
        try:
            moved = await self._set_state(job_id, JobState.CANCELLED, "cancelled over the API",
                                          only_from=OPEN_STATES)
        except CatalogError as exc:
            raise Unavailable(f"the cancel could not be recorded: {exc}") from None
        if not moved:  # it ended while the cancel was written
            raise PreconditionFailed(f"job {job_id} has ended already "
                                     f"({self._records[job_id].state})")
        live = self.jobs.get(job_id)  # again: a start may have installed it meanwhile
        if live is not None:
            await live.engine.cancel("cancelled over the API")
        log.info("[Jobs] job %s cancelled", job_id)
        await self.schedule()
        return self.describe(job_id)

    def route(self, job: str) -> JobRuntime:
        """The job a request names (``""``: the default job, else the only open job);
        :class:`~rpsagg_server.domain.errors.NotFound`,
        :class:`~rpsagg_server.domain.errors.NotReady` (queued) or
        :class:`~rpsagg_server.domain.errors.PreconditionFailed` otherwise."""
        if not job and self.default_id is not None:
            job = self.default_id
        if not job:
            # a job that is starting is open (installed) and still queued in its record until
            # the catalog says running: one job, counted once
            ids = list(dict.fromkeys([*self.running(), *(
                r.id for r in scheduling.queued(self._records.values()))]))
            if len(ids) != 1:
                raise PreconditionFailed(
                    f"this server has no default job and {len(ids)} open jobs: name one "
                    "(rpsagg-client --job ID)")
            job = ids[0]  # the only job (about to start, or running): as when it is named
        waiting = self._default.waiting
        if waiting is not None and job == waiting.id:
            raise waiting.not_ready()
        rt = self.jobs.get(job)
        if rt is not None:
            return rt
        rec = self._records.get(job)
        if rec is not None and rec.state == JobState.QUEUED:
            raise NotReady(f"job {job} is queued; it starts when a slot is free (retry)")
        if rec is not None:
            raise PreconditionFailed(f"job {job} is {rec.state}: {rec.failure}")
        raise NotFound(f"no job {job!r} on this server")

    def waiting_for_d(self, job: str) -> FirstJoin | None:
        """The job a request names (``""``: the default job) while it waits for its first
        join's d; None otherwise."""
        w = self._default.waiting
        return w if w is not None and job in ("", w.id) else None

    def default(self) -> JobRuntime | None:
        """The default job's runtime (None without one, or while it waits for its d)."""
        return None if self.default_id is None else self.jobs.get(self.default_id)

    def describe(self, job_id: str) -> dict[str, Any]:
        """A job as ``GET /api/jobs/{id}`` shows it (KeyError when unknown)."""
        return self.listing.describe(job_id)

    def past_jobs(self) -> list[dict[str, Any]]:
        """The past jobs (``--on-finished-job new``), newest first."""
        return self.listing.past_jobs()

    def list(self) -> list[dict[str, Any]]:
        """Every job: the default first, the created ones oldest first."""
        return self.listing.list()

    def counts(self) -> dict[str, int]:
        """Jobs by state (what ``/metrics`` shows at every scrape: no job is described)."""
        return self.listing.counts()

    async def wait_idle(self) -> None:
        """Return once no created job is queued or running."""
        while any(r.state in (JobState.QUEUED, JobState.RUNNING) for r in self._records.values()
                  if r.kind == "created"):
            await self.changed.wait()

    async def close(self) -> None:
        """Close every job and the catalog."""
        for t in list(self._watchers):
            t.cancel()
        self.retention.stop()
        await self._default.close()
        await self.ended.close()
        for rt in list(self.jobs.values()):
            with contextlib.suppress(Exception):
                await rt.close()
        self.pool.close()
        self.catalog.close()
