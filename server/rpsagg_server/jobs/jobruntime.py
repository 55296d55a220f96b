"""One open job: its store, event bus, read model, round engine and task monitor (what a
single-job server had), and what the dashboard adds to it (its HTTP app and metrics
registry, typed fields set once the dashboard builds them)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from rpsagg_server.domain.errors import StartupError
from rpsagg_server.jobs.sizing import ended_memory, job_memory, wire_limit
from rpsagg_server.readmodel.events import EventBus
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.rounds.engine import RoundEngine
from rpsagg_server.rounds.recovery import SettingsMismatch
from rpsagg_server.rounds.taskeval import TaskMonitor
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import ReadError, Store
from rpsagg_server.store.writer import WriteError
from rpsagg_wire.v1.messages import RoundState

log = logging.getLogger("rpsagg.server")

#: what opening a job raises when its database cannot be (re)opened: a start-up check, the
#: store's or SQLite's errors, the file system, settings that do not fit the database. Any
#: other exception is a bug and is not taken for "cannot be reopened".
CANNOT_OPEN = (StartupError, SettingsMismatch, ReadError, WriteError, sqlite3.Error, OSError)

#: an ASGI app, spelled without the web framework (the shapes of ``starlette.types``)
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
    #: its dashboard app (``/api/jobs/{id}/...``), once the dashboard built it
    app: AsgiApp | None = None
    #: its metrics (``/metrics`` labels them with its id), once the dashboard built them
    registry: CollectorRegistry | None = None
    #: requests using it now (an ended job is closed once none is: :mod:`.endedjobs`)
    leases: int = 0
    closed: bool = False

    def keep_little(self) -> None:
        """An ended job keeps one round's arrays cached (:func:`~.sizing.ended_memory`;
        older rounds are read back from its database)."""
        self.memory = ended_memory(self.cfg, self.engine.m)
        self.engine.archive.shrink(self.memory)

    async def release(self) -> None:
        """An ended job lets go of what only a running job needs: its task
        monitor's thread (after the measurements queued), its archive's reader thread (its
        reads go to the one that ended jobs share) and its store's writer thread, heartbeat
        and write connection (after the queued writes).
        What it serves stays: its read model, its results and its downloads (read through
        the store's second connection). A failure is logged: the job keeps them."""
        try:
            await self.monitor.drain()
            if self.closed:  # closed meanwhile (an ended job read, pushed out at once)
                return
            self.monitor.close()
            self.engine.archive.release()
            await asyncio.to_thread(self.store.stop_writing)
        except Exception:
            log.exception("[Jobs] job %s could not let go of its threads", self.id)

    async def close(self) -> None:
        """Stop its timers and background work, then close its monitor and store (once)."""
        if self.closed:
            return
        self.closed = True
        await self.engine.close()
        self.monitor.close()
        self.store.close()


async def open_job(job_id: str, cfg: ServerConfig, executor: Executor | None,
                   default: bool = False, reading: bool = False) -> JobRuntime:
    """Open (recover or start) one job on ``cfg.db``; ``reading``: an ended job, to be read
    (its store has no writer: :class:`~rpsagg_server.store.database.Store`'s ``writing``).

    Raises :class:`~rpsagg_server.domain.errors.StartupError` for a database that cannot be opened
    or written, :class:`~rpsagg_server.rounds.recovery.SettingsMismatch` for a database of a job
    with other settings.
    """
    try:
        # a new database's file, log mode and tables are synchronous commits: made off the
        # event loop, which serves the other jobs meanwhile
        store = await asyncio.to_thread(Store, cfg.db, writing=not reading)
    except sqlite3.Error as exc:
        raise StartupError(f"--db {cfg.db}: cannot open it ({exc})") from None
    monitor: TaskMonitor | None = None
    try:
        # one bus: the read model, the metrics ledger, the engine's watchers and the task
        # monitor subscribe to the engine's domain events
        bus = EventBus()
        state = ServerState(cfg.public_dict())
        bus.subscribe(state.apply)
        bus.subscribe(state.ledger.observe)
        engine = RoundEngine(cfg, store, bus, executor)
        if not default:  # a created job takes no new client once it ended
            engine.membership.refuse_after(engine.progress)
        state.read_estimate = engine.archive.estimate
        monitor = TaskMonitor(cfg, engine.task, bus.publish)
        bus.subscribe(monitor.observe)
        limit = wire_limit(cfg, engine.m, engine.wire)
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
        if res.state == RoundState.DONE:  # the state is read back in the monitor's thread
            monitor.measure_later(rid, engine.archive.state_reader(rid))
    state.add_check("database", store.writable)  # the last transaction (or heartbeat)
    state.add_check("beta", engine.beta.ready.is_set)
    return JobRuntime(job_id, cfg, store, bus, state, engine, monitor, limit,
                      job_memory(cfg, engine.m), default)
