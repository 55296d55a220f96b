"""A standing service: the jobs of one server, created at start (the default job, from the
job flags) or over the HTTP API (``POST /api/jobs``), each with its own rounds, database,
read model and fault story, sharing one gRPC port, one dashboard and one pool of decode
workers.

:class:`JobRuntime` is one open job (its store, event bus, read model, engine and task
monitor: what a single-job server had). :class:`JobHost` owns them: it routes a request's
``job`` field to its runtime, creates, queues, starts and cancels jobs, keeps the
:class:`~rpsagg_server.catalog.Catalog` (the durable list of created jobs; its module
docstring tells the crash story) and bounds what the server takes on: ``--max-jobs`` jobs
running at once, and the jobs' memory estimates (:func:`job_memory`) within
``--jobs-memory-bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import re
import secrets
import sqlite3
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from rpsagg.schemes import WireProfile, estimator_from_options
from rpsagg.tasks import make_task
from rpsagg_server import jobs
from rpsagg_server.catalog import (
    ENDED,
    JOB_STATES,
    OPEN_STATES,
    RESERVED_IDS,
    Catalog,
    CatalogError,
    JobRecord,
)
from rpsagg_server.config import (
    BYTES_PER_COORDINATE,
    JOB_KEYS,
    ServerConfig,
    job_config,
    memory_limit,
)
from rpsagg_server.decodepool import DecodePool
from rpsagg_server.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    NotReady,
    PreconditionFailed,
    Unavailable,
)
from rpsagg_server.events import EventBus
from rpsagg_server.recovery import SettingsMismatch
from rpsagg_server.rounds import RoundEngine
from rpsagg_server.startup import StartupError
from rpsagg_server.state import ServerState
from rpsagg_server.store import ReadError, Store, WriteError
from rpsagg_server.taskeval import TaskMonitor

log = logging.getLogger("rpsagg.server")

#: the id of the job the server's flags start
DEFAULT_JOB = "default"
#: how a job's id is spelled (created jobs get ``j`` and 8 hex digits)
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: the largest request any job may take, unless ``--max-request-bytes`` says otherwise
AUTO_REQUEST_BYTES = 64 << 20
#: jobs waiting for a slot, at most
MAX_QUEUED = 1000
#: what opening a job raises when its database cannot be (re)opened: a start-up check, the
#: store's or SQLite's errors, the file system, settings that do not fit the database. Any
#: other exception is a bug and is not taken for "cannot be reopened".
CANNOT_OPEN = (StartupError, SettingsMismatch, ReadError, WriteError, sqlite3.Error, OSError)


def check_job_id(job_id: object) -> None:
    """Refuse an id that is not :data:`JOB_ID`'s shape, or one of :data:`RESERVED_IDS`
    (:class:`~rpsagg_server.errors.InvalidRequest`)."""
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise InvalidRequest("id must be 1..64 characters of [A-Za-z0-9._-], starting with a "
                         f"letter or digit; got {job_id!r}")
    if job_id.lower() in RESERVED_IDS:
        raise InvalidRequest(f"id {job_id!r} is reserved (the store's own files use it)")


@dataclass(frozen=True)
class _Need:
    """What a job's settings imply: its configuration, vectors per submission (m) and
    memory estimate."""

    cfg: ServerConfig
    m: int
    memory: int


def max_request_bytes(cfg: ServerConfig, m: int, max_values: int, sends_indices: bool,
                      block_size: int) -> int:
    """Request size limit of a job: m vectors of values (+ indices) (+ float64 reference),
    plus 25% and 4 KiB of slack, so a slightly wrong submission still reaches validation and
    gets a precise refusal (an invalid request), while anything far larger is refused before it is
    parsed. Values count 4 bytes each (which bounds packed codes too); a blockwise job adds
    4 bytes per block for the block scales of quantized values."""
    indices = max_values if sends_indices else 0
    reference = 8 * cfg.d if cfg.eval else 0
    scales = 4 * -(-cfg.d // block_size) if block_size else 0
    per_vector = 4 * max_values + 4 * indices + reference + scales + 32
    return int(1.25 * (m * per_vector + 1024)) + 4096


def job_memory(cfg: ServerConfig, m: int) -> int:
    """The memory a job is taken to need, in bytes: a round of d coordinates per vector
    (:data:`~rpsagg_server.config.BYTES_PER_COORDINATE` each: the estimate, the decode's
    work vectors, the next state), n submissions of k values (and in evaluation mode a d-long
    float64 reference) per vector, and its cache of finished rounds (at most
    ``--result-cache-bytes``, at most two rounds' estimate and state); once the job ends,
    :func:`ended_memory`."""
    d = max(cfg.d, 1)
    round_bytes = BYTES_PER_COORDINATE * d * m
    subs = cfg.n * m * (8 * max(cfg.k, 1) + (8 * d if cfg.eval else 0))
    cache = min(cfg.result_cache_bytes, 2 * 16 * d * m)
    return round_bytes + subs + cache


def ended_memory(cfg: ServerConfig, m: int) -> int:
    """The memory an ended job keeps: one round's estimate and state in its cache (older
    rounds are read back from its database when asked for)."""
    return min(cfg.result_cache_bytes, 16 * max(cfg.d, 1) * m)


@dataclass
class JobRuntime:
    """One open job: what a single-job server had."""

    id: str
    cfg: ServerConfig
    store: Store
    bus: EventBus
    state: ServerState
    engine: RoundEngine
    monitor: TaskMonitor
    limit: int  # the largest request it takes, in bytes
    memory: int  # its estimate (job_memory)
    default: bool = False
    #: its HTTP app and metrics registry (set by the server's dashboard)
    extras: dict[str, Any] = field(default_factory=dict)

    async def close(self) -> None:
        """Stop its timers and background work, then close its monitor and store."""
        await self.engine.close()
        self.monitor.close()
        self.store.close()


async def open_job(job_id: str, cfg: ServerConfig, executor: Executor | None,
                   default: bool = False) -> JobRuntime:
    """Open (recover or start) one job on ``cfg.db``.

    Raises :class:`~rpsagg_server.startup.StartupError` for a database that cannot be opened
    or written, :class:`~rpsagg_server.recovery.SettingsMismatch` for a database of a job with
    other settings.
    """
    try:
        # a new database's file, log mode and tables are synchronous commits: made off the
        # event loop, which serves the other jobs meanwhile
        store = await asyncio.to_thread(Store, cfg.db)
    except sqlite3.Error as exc:
        raise StartupError(f"--db {cfg.db}: cannot open it ({exc})") from None
    monitor: TaskMonitor | None = None
    try:
        # one bus: the read model, the metrics ledger, the engine's watchers and the task
        # monitor subscribe to the engine's domain events
        bus = EventBus()
        state = ServerState(cfg.public_dict())
        if default:
            state.past_jobs = [j.as_dict() for j in jobs.past_jobs(cfg.db)]
        bus.subscribe(state.apply)
        bus.subscribe(state.ledger.observe)
        engine = RoundEngine(cfg, store, bus, executor)
        state.read_estimate = engine.archive.estimate
        monitor = TaskMonitor(cfg, engine.task, bus.publish)
        bus.subscribe(monitor.observe)
        wire = engine.wire
        limit = max_request_bytes(cfg, engine.m, wire.max_values, wire.sends_indices,
                                  wire.block_size)
        try:
            await engine.start()
        except sqlite3.Error as exc:  # e.g. a read-only file or directory
            raise StartupError(f"--db {cfg.db}: {exc}") from None
        except (WriteError, ReadError) as exc:  # the first round's row could not be
            # written (full disk), or the newest round's could not be read back
            raise StartupError(f"--db {cfg.db}: {exc.reason}") from None
    except BaseException:
        if monitor is not None:
            monitor.close()
        store.close()
        raise
    # where the task starts (round 0), then rounds finished before a restart, again
    monitor.measure_later(0, engine.task.initial_state(cfg.seed))
    for rid, res in sorted(engine.results.results.items()):
        if res.state == "done":  # the state is read back in the monitor's thread
            monitor.measure_later(rid, engine.archive.state_reader(rid))
    state.add_check("database", store.writable)  # the last transaction (or heartbeat)
    state.add_check("beta", engine.beta.ready.is_set)
    return JobRuntime(job_id, cfg, store, bus, state, engine, monitor, limit,
                      job_memory(cfg, engine.m), default)


def _wire(cfg: ServerConfig) -> WireProfile:
    """What a job's clients send at most (``--k-max`` values; what bounds a request)."""
    return estimator_from_options(cfg.estimator, n=cfg.n, k=cfg.k_max or cfg.k, d=cfg.d,
                                  transform=cfg.transform, prior_r=None, projection="auto",
                                  block_size=cfg.block_size_for(cfg.d),
                                  value_bits=cfg.fixed_value_bits or 32, bits=cfg.bits).wire


def _flag_names(message: str) -> str:
    """A flag's check message with the flags spelled as job settings (``--min-clients`` ->
    ``min_clients``)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


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
        self._records: dict[str, JobRecord] = {r.id: r for r in self.catalog.all()}
        self._full_settings: dict[str, dict[str, Any]] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._scheduling = asyncio.Lock()
        self._create_lock = asyncio.Lock()
        #: called with each job's runtime once it is open (the dashboard builds its app)
        self.on_open: list[Callable[[JobRuntime], None]] = []
        self.changed = asyncio.Event()  # set (and cleared) at every job state change

    # -- start-up --------------------------------------------------------------------------
    def expect_default(self, cfg: ServerConfig) -> None:
        """Before the default job opens: its request limit raises the server's when
        ``--max-request-bytes`` is automatic (the gRPC server is built with it)."""
        m = make_task(cfg.task, cfg.d, cfg.params).m
        wire = _wire(cfg)
        need = max_request_bytes(cfg, m, wire.max_values, wire.sends_indices, wire.block_size)
        if not self.cfg.max_request_bytes:
            self.request_limit = max(self.request_limit, need)
        elif need > self.request_limit:
            raise StartupError(f"--max-request-bytes {self.request_limit} is below the default "
                               f"job's request limit of {need} bytes")

    async def open_default(self, cfg: ServerConfig) -> JobRuntime:
        """Open the default job (the flags')."""
        rt = await open_job(DEFAULT_JOB, cfg, self.pool.lane(DEFAULT_JOB), default=True)
        self.default_id = DEFAULT_JOB
        self._install(rt)
        return rt

    async def restore(self) -> None:
        """Reopen the created jobs the catalog lists (queued ones start when there is room;
        a cancel acknowledged before a crash is applied again). A job whose database cannot
        be reopened (:data:`CANNOT_OPEN`) is marked failed; any other error propagates."""
        for rec in list(self._records.values()):
            if rec.state == "queued":
                continue
            try:
                rt = await self._open(rec)
            except CANNOT_OPEN as exc:
                log.error("[Jobs] job %s cannot be reopened: %s", rec.id, exc)
                if rec.state not in ENDED:  # in memory only: the next start tries again
                    self._records[rec.id] = dataclasses.replace(
                        rec, state="failed", failure=f"cannot be reopened: {exc}")
                continue
            if rec.state == "cancelled":
                await rt.engine.cancel(rec.failure or "cancelled")
        await self.schedule()

    async def _open(self, rec: JobRecord) -> JobRuntime:
        settings = {k: v for k, v in rec.settings.items() if k in JOB_KEYS}
        try:
            cfg = job_config(self.cfg, settings, self.catalog.job_db(rec.id))
        except ValueError as exc:  # recorded settings this version refuses
            raise SettingsMismatch(str(exc)) from None
        rt = await open_job(rec.id, cfg, self.pool.lane(rec.id))
        self._install(rt)
        return rt

    def _install(self, rt: JobRuntime) -> None:
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
            state = "failed" if p.job_failure else "done"
            await self._set_state(rt.id, state, p.job_failure, must=False,
                                  only_from=OPEN_STATES)
        if not rt.default:  # an ended created job keeps one round's arrays cached
            rt.memory = ended_memory(rt.cfg, rt.engine.m)
            rt.engine.archive.shrink(rt.memory)
        log.info("[Jobs] job %s ended (%s)", rt.id,
                 "failed: " + p.job_failure if p.job_failure else "done")
        self._changed()
        await self.schedule()

    def _changed(self) -> None:
        self.changed.set()
        self.changed.clear()

    async def _set_state(self, job_id: str, state: str, failure: str = "",
                         must: bool = True, only_from: tuple[str, ...] = JOB_STATES) -> bool:
        """Record a job's new state in the catalog, then in memory, if it is in one of
        ``only_from`` (a state another writer changed meanwhile stays: a cancel wins over
        the scheduler's ``running``); returns whether it moved.

        ``must``: a failed write raises :class:`CatalogError` and changes nothing (what an
        answer acknowledges, a cancel). Otherwise (the engine's own transitions: started,
        ended) the state changes in memory anyway and the write failure is logged: a restart
        derives the same state again from the job's database (a running job's end is in
        it; a queued job that had started resumes from it)."""
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
            for rec in sorted(self._records.values(), key=lambda r: r.seq):
                if self._records[rec.id].state != "queued":  # as it is now: a cancel may
                    continue  # have come while an earlier job opened
                if len(self.running()) >= self.cfg.max_jobs:
                    return
                await self._start(rec)

    async def _start(self, rec: JobRecord) -> None:
        """Open a queued job and record it running, unless a cancel came meanwhile (then
        it is cancelled before anything can join it)."""
        try:
            rt = await self._open(rec)
        except CANNOT_OPEN as exc:
            log.error("[Jobs] job %s failed to start: %s", rec.id, exc)
            await self._set_state(rec.id, "failed", f"failed to start: {exc}", must=False,
                                  only_from=("queued",))
            return
        now = self._records[rec.id]  # no await since it was installed: nothing joined yet
        if now.state != "queued":
            await rt.engine.cancel(now.failure or "cancelled")
            return
        if await self._set_state(rec.id, "running", must=False, only_from=("queued",)):
            log.info("[Jobs] job %s started", rec.id)

    def _committed_memory(self) -> int:
        """The estimates of the jobs that hold or will hold memory: open and queued."""
        total = sum(rt.memory for rt in self.jobs.values())
        for rec in self._records.values():
            if rec.state == "queued":
                total += int(rec.settings.get("_memory", 0))
        return total

    # -- the API ---------------------------------------------------------------------------
    async def create(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Validate, record (durably) and queue a job; it starts right after the answer when
        there is room (the answer says ``queued``).
        ``settings`` may name the job (``id``; default ``j`` and 8 random hex digits), so
        that a token file can scope tokens to it ahead of its creation.

        Raises :class:`~rpsagg_server.errors.InvalidRequest` (a bad setting, or a job that
        would not fit in memory or under the request limit), :class:`~.errors.Conflict` (the
        id is taken), :class:`~.errors.NotReady` (too many queued) or
        :class:`~.errors.Unavailable` (the catalog write failed).
        """
        settings = dict(settings)
        wanted = settings.pop("id", None)
        async with self._create_lock:
            if wanted is not None:
                check_job_id(wanted)
                if wanted in self._records or wanted == DEFAULT_JOB:
                    raise Conflict(f"id: a job {wanted!r} exists already")
            need, limit = self._vet(settings)
            left = self.memory_budget - self._committed_memory()
            if need.memory > left:
                raise InvalidRequest(
                    f"d: a job of d = {need.cfg.d}, m = {need.m}, n = {need.cfg.n} is estimated "
                    f"at {need.memory / 2**20:.1f} MiB; {max(left, 0) / 2**20:.1f} MiB of the "
                    f"jobs' {self.memory_budget / 2**20:.1f} MiB (--jobs-memory-bytes) are left")
            if limit > self.request_limit:
                raise InvalidRequest(
                    f"d: this job's submissions may take {limit} bytes; the server takes "
                    f"requests of at most {self.request_limit} bytes (--max-request-bytes)")
            queued = sum(r.state == "queued" for r in self._records.values())
            if queued >= MAX_QUEUED:
                raise NotReady(f"{queued} jobs are queued already; try again later")
            job_id = wanted or self._new_id()
            stored = {k: v for k, v in dict(settings).items() if k in JOB_KEYS}
            stored["_memory"] = need.memory
            try:
                rec = await asyncio.to_thread(self.catalog.add, job_id, stored)
            except CatalogError as exc:
                raise Unavailable(f"the job could not be recorded: {exc}") from None
            self._records[job_id] = rec
            log.info("[Jobs] job %s created: %s", job_id,
                     ", ".join(f"{k}={v}" for k, v in sorted(stored.items()) if k[0] != "_"))
        # the answer says queued: the job starts right after it (opening its database takes
        # a few synchronous commits, which the creation's answer does not wait for)
        self._spawn(self.schedule())
        return self.describe(job_id)

    def _vet(self, settings: Mapping[str, Any]) -> tuple[_Need, int]:
        """Everything a job's settings imply, derived before anything is recorded: its
        configuration, task, memory estimate and request limit
        (:class:`~rpsagg_server.errors.InvalidRequest`, one line naming the setting, for
        whatever the flags' checks or the library's refuse)."""
        try:
            cfg = job_config(self.cfg, settings, ":memory:")
            m = make_task(cfg.task, cfg.d, cfg.params).m
            probe = _wire(cfg)
        except ValueError as exc:
            raise InvalidRequest(_flag_names(str(exc))) from None
        limit = max_request_bytes(cfg, m, probe.max_values, probe.sends_indices,
                                  probe.block_size)
        return _Need(cfg, m, job_memory(cfg, m)), limit

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._watchers.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._watchers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("[Jobs] scheduling failed: %s", task.exception())

    def _new_id(self) -> str:
        while True:
            job_id = "j" + secrets.token_hex(4)
            if job_id not in self._records and job_id != DEFAULT_JOB:
                return job_id

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job (durably, then its current round fails); refused
        :class:`~rpsagg_server.errors.NotFound` for an unknown job,
        :class:`~rpsagg_server.errors.PreconditionFailed` for one that has ended."""
        if job_id == self.default_id:
            rt = self.jobs[job_id]
            if rt.engine.job_done:
                raise PreconditionFailed(f"job {job_id} has ended already")
            await rt.engine.cancel("cancelled over the API")
            return self.describe(job_id)
        rec = self._records.get(job_id)
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        if rec.state in ENDED:
            raise PreconditionFailed(f"job {job_id} has ended already ({rec.state})")
        try:
            moved = await self._set_state(job_id, "cancelled", "cancelled over the API",
                                          only_from=OPEN_STATES)
        except CatalogError as exc:
            raise Unavailable(f"the cancel could not be recorded: {exc}") from None
        if not moved:  # it ended while the cancel was written
            raise PreconditionFailed(f"job {job_id} has ended already "
                                     f"({self._records[job_id].state})")
        live = self.jobs.get(job_id)
        if live is not None:
            await live.engine.cancel("cancelled over the API")
        log.info("[Jobs] job %s cancelled", job_id)
        await self.schedule()
        return self.describe(job_id)

    def route(self, job: str) -> JobRuntime:
        """The job a request names (``""``: the default job, else the only open job);
        :class:`~rpsagg_server.errors.NotFound`, :class:`~rpsagg_server.errors.NotReady` (queued) or
        :class:`~rpsagg_server.errors.PreconditionFailed` otherwise."""
        if not job:
            if self.default_id is not None:
                return self.jobs[self.default_id]
            live = self.running()
            queued = [r.id for r in self._records.values() if r.state == "queued"]
            if len(live) + len(queued) == 1:
                if live:
                    return self.jobs[live[0]]
                job = queued[0]  # the only job is about to start: as when it is named
            else:
                raise PreconditionFailed(
                    f"this server has no default job and {len(live) + len(queued)} "
                    "open jobs: name one (rpsagg-client --job ID)")
        rt = self.jobs.get(job)
        if rt is not None:
            return rt
        rec = self._records.get(job)
        if rec is not None and rec.state == "queued":
            raise NotReady(f"job {job} is queued; it starts when a slot is free (retry)")
        if rec is not None:
            raise PreconditionFailed(f"job {job} is {rec.state}: {rec.failure}")
        raise NotFound(f"no job {job!r} on this server")

    def default(self) -> JobRuntime | None:
        """The default job's runtime (None on a server without one)."""
        return None if self.default_id is None else self.jobs[self.default_id]

    def describe(self, job_id: str) -> dict[str, Any]:
        """A job as ``GET /api/jobs/{id}`` shows it (KeyError when unknown)."""
        rt = self.jobs.get(job_id)
        rec = self._records.get(job_id)
        if rt is None and rec is None:
            raise KeyError(job_id)
        out: dict[str, Any] = {"id": job_id, "default": job_id == self.default_id}
        if rec is not None:
            out.update(state=rec.state, failure=rec.failure, created_at=rec.created_at,
                       started_at=rec.started_at, finished_at=rec.finished_at,
                       settings=self._settings(rec))
        else:
            assert rt is not None
            p = rt.engine.progress
            state = self._state(job_id)
            finished = None
            if p.job_done:
                finished = max((r.finished_at for r in rt.state.rounds(limit=1)
                                if r.finished_at is not None), default=None)
            public = rt.cfg.public_dict()
            out.update(state=state, failure=p.job_failure, created_at=rt.state.started_at,
                       started_at=rt.state.started_at, finished_at=finished,
                       settings={k: public[k] for k in JOB_KEYS})
        if rt is None:
            out.update(rounds=int(out["settings"].get("rounds", 10)), rounds_done=0,
                       bytes_up=0, payload_bytes=0, last_rel_error=None, clients=0)
            return out
        rounds = rt.state.rounds()
        last = next((r for r in rounds if r.state == "done"), None)
        est = None if last is None else last.estimated_error
        rel = None if est is None or not math.isfinite(est.relative_error) \
            else float(est.relative_error)
        out.update(rounds=rt.cfg.rounds, rounds_done=rt.engine.progress.steps_done,
                   bytes_up=sum(r.wire_bytes for r in rounds),
                   payload_bytes=sum(r.payload_bytes for r in rounds),
                   last_rel_error=rel, clients=len(rt.state.clients()),
                   memory_estimate=rt.memory)
        return out

    def _settings(self, rec: JobRecord) -> dict[str, Any]:
        """A created job's settings, every job setting (the defaults filled in)."""
        full = self._full_settings.get(rec.id)
        if full is None:
            given = {k: v for k, v in rec.settings.items() if k in JOB_KEYS}
            try:
                public = job_config(self.cfg, given, ":memory:").public_dict()
                full = {k: public[k] for k in JOB_KEYS}
            except ValueError:  # settings a later version refuses: shown as given
                full = given
            self._full_settings[rec.id] = full
        return dict(full)

    def list(self) -> list[dict[str, Any]]:
        """Every job, the default first, then the created ones oldest first."""
        ids = ([self.default_id] if self.default_id else []) + \
            [r.id for r in sorted(self._records.values(), key=lambda r: r.seq)]
        return [self.describe(i) for i in ids]

    def _state(self, job_id: str) -> str:
        """A job's state: its catalog row's, or the default job's engine's."""
        rec = self._records.get(job_id)
        if rec is not None:
            return rec.state
        p = self.jobs[job_id].engine.progress
        return ("cancelled" if p.cancelled else "failed" if p.job_failure
                else "done" if p.job_done else "running")

    def counts(self) -> dict[str, int]:
        """Jobs by state (what ``/metrics`` shows at every scrape: no job is described)."""
        out = dict.fromkeys(JOB_STATES, 0)
        ids = ([self.default_id] if self.default_id else []) + list(self._records)
        for job_id in ids:
            out[self._state(job_id)] += 1
        return out

    async def wait_idle(self) -> None:
        """Return once no created job is queued or running."""
        while any(r.state in ("queued", "running") for r in self._records.values()):
            await self.changed.wait()

    async def close(self) -> None:
        """Close every job and the catalog."""
        for t in list(self._watchers):
            t.cancel()
        for rt in list(self.jobs.values()):
            with contextlib.suppress(Exception):
                await rt.close()
        self.pool.close()
        self.catalog.close()
