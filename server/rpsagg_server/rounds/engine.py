"""The round engine: the lifecycle of rounds, over membership, admission and results.

Lifecycle of a round: ``open`` (no submission yet) -> ``collecting`` (first submission
committed; the deadline ``--round-timeout`` seconds later starts running) -> ``decoding``
(all n submitted, or the deadline passed with at least ``--min-clients``) -> ``done``, or
``failed`` with a reason (too few arrivals at the deadline, or a decode error). A failed
round is followed by a new round on the same task state, unless ``--max-failed-rounds``
consecutive rounds have failed: then the job ends as failed, with the reason.

:class:`RoundEngine` owns this lifecycle and composes the engine's other parts, which the
servicer calls directly: joins (``engine.membership``, :mod:`~rpsagg_server.rounds.membership`),
admission of submissions (``engine.intake``, :mod:`~rpsagg_server.rounds.submissions`), results,
watchers and the drained job end (``engine.results``, :mod:`~rpsagg_server.rounds.results`); each
round's budget and estimator (``engine.planner``, :mod:`~rpsagg_server.rounds.planner`: target
mode's rule is :class:`rpsagg.planning.BudgetPolicy`); the views it publishes
(``engine.views``, :mod:`~rpsagg_server.rounds.viewpublisher`); what a finished round
leaves (:mod:`~rpsagg_server.rounds.roundend`); and restart from the store, the job's
projection included (:mod:`~rpsagg_server.rounds.recovery`).
Every change is published as a domain event (:mod:`~rpsagg_server.readmodel.events`) on the engine's
bus, to which the read model, the watchers, the metrics ledger and the task monitor
subscribe.

beta for n is computed at start-up in the decode thread, visibly
(:mod:`rpsagg_server.rounds.betawarm`); joins and submissions are served meanwhile, and the first
decode waits for it.

Every state change is committed to the :class:`~rpsagg_server.store.database.Store` before it is
acknowledged or published. Engine-owned writes (round rows) are retried until they commit,
so a round never wedges on a transient database error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from rpsagg import VectorCorrelationTracker, round_encoding
from rpsagg.schemes import WireProfile
from rpsagg.tasks import Task, make_task
from rpsagg_server.decode.decoding import DecodeOptions, DecodeOutcome, decode_round
from rpsagg_server.readmodel.events import (
    EventBus,
    RoundClosed,
    RoundCollecting,
    RoundDecoded,
    RoundFailed,
    RoundOpened,
    RoundRecovered,
)
from rpsagg_server.rounds import deadline
from rpsagg_server.rounds.archive import RoundArchive
from rpsagg_server.rounds.betawarm import BetaWarmup
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.rounds.membership import Membership
from rpsagg_server.rounds.planner import RoundPlanner
from rpsagg_server.rounds.recovery import Recovery, next_state
from rpsagg_server.rounds.results import JobProgress, ResultBook
from rpsagg_server.rounds.roundend import end_round
from rpsagg_server.rounds.roundview import estimate_info
from rpsagg_server.rounds.rowcodec import to_row
from rpsagg_server.rounds.submissions import Intake
from rpsagg_server.rounds.viewpublisher import ViewPublisher
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import Store
from rpsagg_server.store.jobnumber import job_id
from rpsagg_server.store.writer import WriteError
from rpsagg_wire.v1.messages import ACCEPTING, LIVE, RoundState

log = logging.getLogger("rpsagg.server")


class RoundEngine:
    """Owns the rounds of one job; every method runs on the server's event loop.

    Parameters
    ----------
    config : ServerConfig
    store : Store
    bus : EventBus
        Where the engine publishes its domain events.
    executor : Executor, optional
        Where beta's warm-up and the decodes run, one at a time in order: a server of
        several jobs passes each job's lane of its shared pool
        (:class:`~rpsagg_server.decode.decodepool.DecodePool`); default, a thread of its own.
    planner : RoundPlanner, optional
        Each round's budget and estimator (default: one for ``config``).
    """

    def __init__(self, config: ServerConfig, store: Store, bus: EventBus,
                 executor: Executor | None = None,
                 planner: RoundPlanner | None = None) -> None:
        self.cfg = config
        self.store = store
        self.bus = bus
        self.publish = bus.publish
        self.task: Task = make_task(config.task, config.d, config.params)
        self.m = self.task.m
        #: transform=auto: one correlation tracker per vector slot; vector j of a round is
        #: decoded with slot j's prior (``docs/reproduction.md``)
        self.tracker = (VectorCorrelationTracker(self.m)
                        if config.transform == "auto" or config.target_rel_error > 0 else None)
        #: each round's budget and estimator (the projection a recovered job keeps included)
        self.planner = planner or RoundPlanner(config)
        #: the job's progress; ``encoding`` is (spec_version, projection, block_size): the
        #: projection and block size every round announces (the projection follows from d,
        #: not from auto's prior); a round announces its own spec version
        self.progress = JobProgress(round_encoding(self.planner.encoding_estimator()))
        self.membership = Membership(config, store, self.publish)
        self.clients = self.membership.clients
        #: finished rounds' arrays: the store behind a cache of ``--result-cache-bytes``
        self.archive = RoundArchive(store, config.result_cache_bytes)
        self.results = ResultBook(config, self.m, self.clients, self.progress, self.archive)
        self.intake = Intake(config, self.m, store, self.publish, self.clients, self.progress,
                             self.results, self)
        #: the views the engine publishes (the current round's arrivals paced)
        self.views = ViewPublisher(config, self.clients, self.progress, self.tracker,
                                   self.publish)
        bus.subscribe(self.results.observe)
        bus.subscribe(self.views.on_event)
        self._round_writes = asyncio.Lock()  # round rows commit in the order they change
        self.beta = BetaWarmup(self.publish, config.n)
        self._executor = executor or ThreadPoolExecutor(max_workers=1,
                                                        thread_name_prefix="rpsagg-decode")
        self._tasks: set[asyncio.Task[None]] = set()
        self.done_event = self.progress.done_event

    # -- the job's progress, read by the server and the tests -----------------------------
    @property
    def current(self) -> LiveRound | None:
        """The open, collecting or decoding round (None after the job is done)."""
        return self.progress.current

    @property
    def job_done(self) -> bool:
        """Whether the job is done (or failed)."""
        return self.progress.job_done

    @property
    def encoding(self) -> tuple[str, str, int]:
        """``(spec_version, projection, block_size)`` every round announces."""
        return self.progress.encoding

    # -- set-up ----------------------------------------------------------------------------
    @property
    def wire(self) -> WireProfile:
        """What the job's clients send (the estimator's wire profile)."""
        return self.planner.base.wire

    async def start(self) -> None:
        """Recover from the store (or start a fresh job) and open the current round."""
        rec = Recovery(self.cfg, self.store, self.m, self.progress, self.tracker,
                       self.planner, self)
        # the start-up writes (settings, encoding, the job's id: each a synchronous commit)
        # run off the event loop, which serves the server's other jobs meanwhile, in one
        # trip (on a busy loop, each trip waits its turn); nothing reads this engine yet
        await asyncio.to_thread(self._startup_writes, rec)
        self.membership.recover()
        last = rec.recover_rounds()
        p = self.progress
        if last is not None and last.state in LIVE:
            rec.resume(last)
        elif not p.job_done:
            live = self._new_round(next_state(self.task, self.cfg.seed, last),
                                   (last.round_id if last else 0) + 1)
            await self.store.open_round(to_row(live))  # start-up: a write error is fatal
            self._install(live)
        self.views.job()
        if p.job_done:
            self.beta.not_needed()
            p.done_event.set()
        else:
            self.spawn(self.beta.start(self._executor, self._compute_beta))

    def _startup_writes(self, rec: Recovery) -> None:
        rec.recover_encoding(rec.check_job_config())
        job_id(self.store)

    def _compute_beta(self) -> float:
        """beta for n (runs in the decode thread; a Monte Carlo on a cold cache)."""
        return float(self.planner.base.beta_for(self.cfg.n))

    # -- recovery's host (recovery.RoundHost) -------------------------------------------------
    def show_recovered(self, live: LiveRound, current: bool) -> None:
        """A round read back at start-up: a past round's result is kept; shown either way."""
        view = self.views.of(live)
        if not current:
            self.results.record(live)
            self.publish(RoundRecovered(view, current=False,
                                        estimate=estimate_info(live, view, self.cfg)))
        else:
            self.publish(RoundRecovered(view, current=True))

    def close_again(self, live: LiveRound) -> None:
        """Decode a resumed round whose close did not finish before the restart."""
        self.spawn(self.close_round(live, "recovered"))

    # -- views, background work ----------------------------------------------------------
    def view_changed(self) -> None:
        """The current round's arrivals changed (its view is published, paced)."""
        self.views.changed()

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` in the background (cancelled by :meth:`close`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _durable(self, write: Callable[[], Awaitable[None]]) -> None:
        """Commit an engine-owned write (round rows, job state), retrying until it lands."""
        delay = 0.05
        async with self._round_writes:
            while True:
                try:
                    await write()
                    return
                except WriteError as exc:
                    log.warning("[Engine] %s; retrying in %.2fs", exc.reason, delay)
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)

    # -- the lifecycle ---------------------------------------------------------------------
    def _new_round(self, global_state: np.ndarray, round_id: int) -> LiveRound:
        """A new round; its row must be durable before :meth:`_install` shows its nonce, so
        a committed submission always has its round row (a restart resumes the same round).
        """
        return LiveRound.planned(round_id, global_state, self.progress.steps_done,
                                 self.planner.choose(self.tracker))

    def _install(self, live: LiveRound) -> None:
        self.progress.current = live
        self.publish(RoundOpened(self.views.of(live)))
        log.info("[Engine] round %d open (step %d, transform %s)", live.round_id,
                 live.task_step, live.transform)

    def first_commit(self, live: LiveRound) -> None:
        """The round's first submission committed: its deadline starts running."""
        live.first_at = time.time()
        live.deadline = live.first_at + self.cfg.round_timeout
        live.state = RoundState.COLLECTING
        self.arm_deadline(live)
        row = to_row(live)
        self.spawn(self._durable(lambda: self.store.save_round(row)))
        self.publish(RoundCollecting(self.views.of(live)))

    def all_committed(self, live: LiveRound) -> None:
        """All n submissions committed: close the round."""
        self.spawn(self.close_round(live, "all clients submitted"))

    def arm_deadline(self, live: LiveRound) -> None:
        """Start the round's deadline timer (:mod:`~rpsagg_server.rounds.deadline`)."""
        deadline.arm(live, lambda: self.spawn(self._deadline(live)))

    async def _deadline(self, live: LiveRound) -> None:
        """The deadline timer fired: close (after settling, if the process was stalled)."""
        await deadline.settle(live, lambda: self.intake.last_arrival)
        await self.close_round(live, "deadline")

    async def close_round(self, live: LiveRound, why: str) -> None:
        """Close the round's set of submissions (durably), decode it and finish it."""
        if live.state != RoundState.COLLECTING or self.progress.current is not live:
            return
        await self._close_set(live, why)
        if len(live.subs) < self.cfg.min_clients:
            await self._finish(live, None, f"{why}: {len(live.subs)} of the minimum "
                               f"{self.cfg.min_clients} clients submitted")
            return
        subs = sorted(live.subs.values(), key=lambda s: self.clients[s.client_id])
        assert live.estimator is not None
        est = live.estimator
        loop = asyncio.get_running_loop()
        try:
            outcome = await loop.run_in_executor(
                self._executor,
                lambda: decode_round(est, subs, live.nonce, self.m, tracker=self.tracker,
                                     evaluate=self.cfg.eval, priors=live.r_priors,
                                     options=DecodeOptions.from_config(self.cfg)),
            )
        except Exception as exc:  # a decode error fails the round, never the server
            log.exception("[Engine] round %d decode failed", live.round_id)
            await self._finish(live, None, f"decode error: {exc}")
            return
        await self._finish(live, outcome, "")

    async def _close_set(self, live: LiveRound, why: str) -> None:
        """Close the round's set of submissions (admission refuses it from now on), durably:
        after a crash the round is decoded from exactly this set."""
        live.state = RoundState.DECODING
        if live.timer is not None:
            live.timer.cancel()
        live.closed_at = time.time()
        self.publish(RoundClosed(self.views.of(live), why))
        if live.pending:  # queued writes decide before the set is closed (asyncio.wait:
            # cancelling this task must not cancel the store's futures)
            await asyncio.wait({f for _, f, _ in live.pending.values()})
        row = to_row(live)
        await self._durable(lambda: self.store.save_round(row))

    async def _finish(self, live: LiveRound, outcome: DecodeOutcome | None, reason: str) -> None:
        p = self.progress
        end = end_round(live, outcome, reason, p, self.task, self.cfg)
        job_done, failure = end.job_done, end.failure
        # the next round opens in the same transaction
        nxt = None if job_done else self._new_round(end.next_state, live.round_id + 1)
        row, next_row = to_row(live), None if nxt is None else to_row(nxt)
        tracker = self.tracker
        fraction = None if tracker is None else tracker.fractions
        await self._durable(lambda: self.store.finish_round(
            row, next_round=next_row, tracker=tracker is not None, tracker_fraction=fraction,
            job_done=job_done, job_failure=failure))
        p.job_done = job_done
        p.job_failure = failure
        self.results.record(live)
        p.current = None
        live.finished.set()
        view = self.views.of(live)
        if live.state == RoundState.DONE and live.next_state is not None:
            self.publish(RoundDecoded(view, live.next_state, job_done,
                                      estimate_info(live, view, self.cfg)))
        else:
            self.publish(RoundFailed(view, job_done, failure))
        if failure:
            log.error("[Engine] job failed after %d steps: %s", p.steps_done, failure)
            p.done_event.set()
        elif job_done:
            log.info("[Engine] job done after %d steps", p.steps_done)
            p.done_event.set()
        else:
            assert nxt is not None
            self._install(nxt)
        self.views.job()

    def stop_job(self) -> None:
        """End the job after the current round (the clean stop of ``--rounds 0``).

        The current round closes now, as at its deadline: it is decoded from what arrived,
        or fails below ``--min-clients`` (an open round, with nothing committed, fails); a
        decoding round finishes its decode. The job is then done and drained as at the end
        of its rounds.
        """
        p = self.progress
        if p.job_done or p.stopping:
            return
        p.stopping = True
        live = p.current
        if live is None:
            return
        log.info("[Engine] stopping the job after round %d (%s)", live.round_id, live.state)
        if live.state in ACCEPTING:
            live.state = RoundState.COLLECTING  # writes still queued decide before the set closes
            self.spawn(self.close_round(live, "the job was stopped"))

    async def cancel(self, why: str) -> None:
        """End the job now, as failed with ``why`` (a cancel over the API).

        An open or collecting round closes to submissions at once and fails with ``why``
        (what it had committed stays stored); a decoding round finishes its decode first.
        Returns when the end is durable (for a decoding round: once its finish wrote it).
        """
        p = self.progress
        if p.job_done or p.cancelled:
            return
        p.stopping = True
        p.cancelled = why
        live = p.current
        if live is None:
            return
        if live.state not in ACCEPTING:  # decoding: its finish ends the job, durably
            await live.finished.wait()
            return
        log.info("[Engine] cancelling the job in round %d (%s)", live.round_id, live.state)
        await self._close_set(live, why)
        await self._finish(live, None, why)

    async def close(self) -> None:
        """Cancel timers and background work (the store is closed by the caller)."""
        current = self.progress.current
        if current is not None and current.timer is not None:
            current.timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.archive.close()
