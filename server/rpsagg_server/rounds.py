"""The round engine: joins, round lifecycle, durable submissions, decoding, recovery.

Lifecycle of a round: ``open`` (no submission yet) -> ``collecting`` (first submission
committed; the deadline ``--round-timeout`` seconds later starts running) -> ``decoding``
(all n submitted, or the deadline passed with at least ``--min-clients``) -> ``done``, or
``failed`` with a reason (too few arrivals at the deadline, or a decode error). A failed
round is followed by a new round on the same task state, unless ``--max-failed-rounds``
consecutive rounds have failed: then the job ends as failed, with the reason.

The job's end is drained: once it is done (or failed), every read answers ``job_done`` and
the engine records which joined clients have been told (:meth:`RoundEngine.drain`), so the
server stops only after each of them has seen it, or after a bounded wait.

beta for n is computed at start-up in the decode thread, visibly
(:mod:`rpsagg_server.betawarm`); joins and submissions are served meanwhile, and the first
decode waits for it.

Every state change is committed to the :class:`~rpsagg_server.store.Store` before it is
acknowledged. After a crash the last round resumes with every committed submission (a
collecting round gets a fresh deadline); finished rounds stay queryable.

A submission's state machine: once its write is queued, the write's outcome decides. The
in-memory update runs in a callback of the store's future, independent of the handler, so a
caller that goes away (deadline, cancel) never undoes a write that commits. Committed means
in memory and acknowledged on an identical retry (``duplicate = true``) in every later state
of its round, closed, finished and after a restart included. A write that fails is
answered UNAVAILABLE with the reason, and nothing of it is kept. Engine-owned writes (round
rows) are retried until they commit, so a round never wedges on a transient database error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import numpy as np

from rpsagg import (
    QUANTIZER_NAMES,
    CorrelationTracker,
    Estimator,
    make_estimator,
    round_encoding,
)
from rpsagg.tasks import Task, make_task
from rpsagg_server.betawarm import BetaWarmup
from rpsagg_server.config import ServerConfig
from rpsagg_server.decoding import DecodeOptions, DecodeOutcome, decode_round
from rpsagg_server.live import LiveRound, Rejected, check_submission_spec, validate_submission
from rpsagg_server.state import ClientView, JobView, ServerState
from rpsagg_server.store import (
    Store,
    StoredSubmission,
    WriteError,
    op_client,
    op_meta,
    op_round,
    op_submission,
)
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import (
    Contributor,
    JoinReply,
    RoundEvent,
    RoundInfo,
    RoundResult,
    Submission,
    SubmitReply,
)

log = logging.getLogger("rpsagg.server")
SPATIAL = ("rand-k-spatial", "rand-proj-spatial")
CONFIG_KEYS = ("n", "k", "d", "estimator", "transform", "task", "eval")
# a deadline timer that fires this late means the process was stalled (SIGSTOP, swapping):
# submissions may be waiting in gRPC's queues, so the close waits until arrivals are quiet
STALL_SLACK = 0.2
SETTLE_QUIET = 0.5
SETTLE_MAX = 10.0


class RoundEngine:
    """Owns the rounds of one job; every method runs on the server's event loop.

    Parameters
    ----------
    config : ServerConfig
    store : Store
    state : ServerState
        Read model for the dashboard; updated on every change.
    """

    def __init__(self, config: ServerConfig, store: Store, state: ServerState) -> None:
        self.cfg = config
        self.store = store
        self.state = state
        self.task: Task = make_task(config.task, config.d, config.params)
        self.m = self.task.m
        self.tracker = CorrelationTracker() if config.transform == "auto" else None
        #: Rand-Proj-Spatial's projection: "auto" (by d) for a new job; a recovered job keeps
        #: the one it was started with (its stored submissions were encoded with it).
        self.projection = "auto"
        self._base = self._make_estimator(None)
        #: (spec_version, projection, block_size) every round announces: what clients need
        #: to encode (the projection follows from d; the prior of auto does not change it).
        self.encoding = round_encoding(self._base)
        self.clients: dict[str, int] = {}
        self._joining: dict[str, tuple[int, asyncio.Future[None]]] = {}
        self._round_writes = asyncio.Lock()  # round rows commit in the order they change
        self._view_due = False
        self._last_arrival = 0.0  # loop.time() when the last Submit reached the engine
        self.current: LiveRound | None = None
        self.results: dict[int, RoundResult] = {}
        self.steps_done = 0
        self.job_done = False
        self.job_failure = ""  # why the job ended without finishing its rounds
        self.failed_streak = 0  # consecutive failed rounds (--max-failed-rounds)
        self.seen_done: set[str] = set()  # joined clients that were told job_done
        self._all_seen = asyncio.Event()
        self.beta = BetaWarmup(state, config.n)
        self._watchers: list[asyncio.Queue[RoundEvent | None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpsagg-decode")
        self._tasks: set[asyncio.Task[None]] = set()
        self.done_event = asyncio.Event()
        # observers of finished rounds (the dashboard's task metrics): called on the loop
        # with the round id and the new global state after each done round; never awaited
        # by the engine, cancelled at close
        self.done_hooks: list[Callable[[int, np.ndarray], Awaitable[None]]] = []

    # -- set-up ----------------------------------------------------------------------------
    def _make_estimator(self, prior: float | None) -> Estimator:
        c = self.cfg
        if c.estimator in QUANTIZER_NAMES:
            return make_estimator(c.estimator, n=c.n, d=c.d, bits=c.bits)
        if c.estimator not in SPATIAL:
            return make_estimator(c.estimator, n=c.n, k=c.k, d=c.d, value_bits=c.value_bits)
        transform: str | float = c.transform
        if transform not in ("avg", "max", "one", "auto"):
            transform = float(transform)
        projection = self.projection if c.estimator == "rand-proj-spatial" else "auto"
        return make_estimator(c.estimator, n=c.n, k=c.k, d=c.d, transform=transform,
                              prior_r=prior if transform == "auto" else None,
                              projection=projection, value_bits=c.value_bits)

    def _recover_encoding(self, job_exists: bool) -> None:
        """Keep the projection a job was started with; record it for a new job.

        Stored submissions are decoded with the projection they were encoded with, so a
        job recovered by a newer server keeps it even where the default has changed: a job
        from before the projection was recorded (meta ``encoding`` absent) used the SRHT.
        If recording it fails, start-up fails (nothing was announced to clients yet).
        """
        saved = self.store.get_meta("encoding")
        if saved is not None:
            projection = str(json.loads(saved)[1])
        elif job_exists:
            projection = "srht" if self.cfg.estimator == "rand-proj-spatial" else ""
        else:
            projection = self.encoding[1]
        if projection and projection != self.encoding[1]:
            log.warning("[Engine] job in %s was started with projection %r; keeping it "
                        "(a new job with d=%d would use %r)", self.cfg.db, projection,
                        self.cfg.d, self.encoding[1])
            self.projection = projection
            self._base = self._make_estimator(None)
            self.encoding = round_encoding(self._base)
        if saved is None:
            self.store.write_sync([op_meta("encoding", json.dumps(list(self.encoding)))])

    def _transform_label(self, est: Estimator) -> str:
        tr = getattr(est, "transform", None)
        return "none" if tr is None else str(tr.label())

    async def start(self) -> None:
        """Recover from the store (or start a fresh job) and open the current round."""
        saved = self.store.get_meta("config")
        mine = {k: getattr(self.cfg, k) for k in CONFIG_KEYS}
        if saved is not None:
            theirs = json.loads(saved)
            diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
            if diff:
                detail = ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diff.items())
                raise ValueError(
                    f"database {self.cfg.db} belongs to a job with other settings: {detail}")
        else:
            self.store.write_sync([op_meta("config", json.dumps(mine))])
        self._recover_encoding(job_exists=saved is not None)
        for cid, idx, joined in self.store.clients():
            self.clients[cid] = idx
            self.state._put_client(ClientView(cid, idx, joined))
        frac = self.store.get_meta("tracker_fraction")
        if self.tracker is not None and frac is not None:
            self.tracker.fraction = json.loads(frac)
        self.job_done = self.store.get_meta("job_done") == "1"
        self.job_failure = self.store.get_meta("job_failure") or ""
        last = None
        for stored in self.store.rounds():
            live = LiveRound.from_stored(stored, self.cfg, self.m)
            if live.state == "done":
                self.steps_done += 1
            if live.state in ("done", "failed"):
                self.failed_streak = self.failed_streak + 1 if live.state == "failed" else 0
            self.results[live.round_id] = self._result(live)
            self.state._put_round(live.view(self.cfg, self.clients), current=False, emit=False)
            last = live
        if last is not None and last.state in ("open", "collecting", "decoding"):
            await self._resume(last)
        elif not self.job_done:
            state = (self.task.initial_state(self.cfg.seed) if last is None
                     else np.asarray(last.next_state if last.next_state is not None
                                     else last.global_state))
            await self._open_round(state, (last.round_id if last else 0) + 1)
        self._publish_job()
        if self.job_done:
            self.beta.not_needed()
            self.done_event.set()
        else:
            task = self.beta.start(self._executor, self._compute_beta)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- beta ------------------------------------------------------------------------------
    def _compute_beta(self) -> float:
        """beta for n (runs in the decode thread; a Monte Carlo on a cold cache)."""
        return float(self._base.beta_for(self.cfg.n))

    async def _resume(self, live: LiveRound) -> None:
        live.estimator = self._make_estimator(live.r_prior)
        for s in self.store.submissions(live.round_id):
            live.add(serde.decode_submission(s.payload), s.received_at)
        log.info("[Engine] resuming round %d (%s) with %d committed submissions",
                 live.round_id, live.state, len(live.subs))
        self.current = live
        if live.state == "decoding" or len(live.subs) >= self.cfg.n:
            live.state = "collecting"
            self._spawn(self._close(live, "recovered"))
        elif live.subs:  # collecting (or open when its row's update did not land)
            live.state = "collecting"
            if live.first_at is None:
                live.first_at = min(a.received_at for a in live.arrivals())
            live.deadline = time.time() + self.cfg.round_timeout
            self._arm_deadline(live)
        self.state._put_round(live.view(self.cfg, self.clients), current=True)

    # -- joins -----------------------------------------------------------------------------
    async def join(self, client_id: str) -> JoinReply:
        """Register ``client_id``; its index is stable across re-joins and restarts."""
        if client_id in self.clients:
            idx = self.clients[client_id]
        elif client_id in self._joining:
            idx, fut = self._joining[client_id]
            await self._outcome(fut)
        else:
            used = set(self.clients.values()) | {i for i, _ in self._joining.values()}
            if len(used) >= self.cfg.n:
                raise Rejected("RESOURCE_EXHAUSTED",
                               f"all n={self.cfg.n} client slots are taken; "
                               f"client {client_id!r} cannot join")
            idx = next(i for i in range(self.cfg.n) if i not in used)
            now = time.time()
            fut = self.store.enqueue([op_client(client_id, idx, now)])
            self._joining[client_id] = (idx, fut)
            fut.add_done_callback(functools.partial(self._joined, client_id, idx, now))
            await self._outcome(fut)
        hint = self.cfg.data if self.cfg.data != "synthetic" else f"synthetic:r={self.cfg.data_r}"
        return JoinReply(idx, self.cfg.n, self.cfg.task, hint, self.cfg.params)

    def _joined(self, client_id: str, idx: int, now: float, fut: asyncio.Future[None]) -> None:
        """The join's write finished (whoever still waits for it)."""
        del self._joining[client_id]
        if fut.exception() is not None:
            return
        self.clients[client_id] = idx
        self.state._put_client(ClientView(client_id, idx, now))
        log.info("[Engine.Join] client %s -> index %d", client_id, idx)
        self._view_changed()

    @staticmethod
    async def _outcome(fut: asyncio.Future[None]) -> None:
        """Wait for a queued write without owning it: cancelling the caller leaves the write
        (and its callbacks) alone; a failed write is UNAVAILABLE with the reason.
        """
        try:
            await asyncio.shield(fut)
        except WriteError as exc:
            raise Rejected("UNAVAILABLE", exc.reason) from None

    async def _durable(self, ops: list[tuple[str, tuple[object, ...]]]) -> None:
        """Commit an engine-owned write (round rows, job state), retrying until it lands."""
        delay = 0.05
        async with self._round_writes:
            while True:
                try:
                    await self.store.write(ops)
                    return
                except WriteError as exc:
                    log.warning("[Engine] %s; retrying in %.2fs", exc.reason, delay)
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)

    def _view_changed(self) -> None:
        """Refresh the current round's dashboard view once per loop pass (not per request)."""
        if self._view_due:
            return
        self._view_due = True

        def refresh() -> None:
            self._view_due = False
            live = self.current
            if live is not None:
                self.state._put_round(live.view(self.cfg, self.clients), current=True)

        asyncio.get_running_loop().call_soon(refresh)

    # -- rounds ----------------------------------------------------------------------------
    def round_info(self, client_id: str = "") -> RoundInfo:
        """The current round (``job_done`` when there is none).

        ``client_id`` names the asking client: told ``job_done``, it counts as drained.
        """
        live = self.current
        c = self.cfg
        if live is None:
            if self.job_done:
                self._seen(client_id)
            return RoundInfo(0, 0, c.estimator, c.n, c.k, c.d, "", c.task, self.m, None,
                             "unspecified", 0, c.eval, self.job_done, self.steps_done,
                             c.rounds, self.job_failure, *self.encoding,
                             value_bits=c.value_bits, bits=c.bits)
        return RoundInfo(
            live.round_id, live.nonce, c.estimator, c.n, c.k, c.d, live.transform, c.task,
            self.m, live.global_state, live.state,
            0 if live.deadline is None else int(live.deadline * 1000), c.eval, False,
            live.task_step, c.rounds, "", *self.encoding,
            value_bits=c.value_bits, bits=c.bits,
        )

    # -- the drained job end ---------------------------------------------------------------
    def _seen(self, client_id: str) -> None:
        """``client_id`` was told ``job_done``; set :meth:`drain`'s event once all were."""
        if client_id in self.clients:
            self.seen_done.add(client_id)
        if self.job_done and self.seen_done.issuperset(self.clients):
            self._all_seen.set()

    def undrained(self) -> list[str]:
        """Joined clients that have not been told ``job_done`` yet."""
        return sorted(set(self.clients) - self.seen_done)

    async def drain(self, timeout: float) -> bool:
        """After the job is done, wait until every joined client has been told so, at most
        ``timeout`` seconds; True when all were."""
        await self.done_event.wait()
        self._seen("")
        try:
            await asyncio.wait_for(self._all_seen.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _open_round(self, global_state: np.ndarray, round_id: int) -> None:
        """Open the first round of this process (start-up: a write error is fatal here)."""
        live = self._new_round(global_state, round_id)
        await self.store.write([op_round(live.stored())])
        self._install(live)

    def _new_round(self, global_state: np.ndarray, round_id: int) -> LiveRound:
        """A new round; its row must be durable before :meth:`_install` shows its nonce, so
        a committed submission always has its round row (a restart resumes the same round).
        """
        prior = None if self.tracker is None else self.tracker.prior(self.cfg.n)
        est = self._make_estimator(prior)
        live = LiveRound(
            round_id=round_id, nonce=secrets.randbits(64), task_step=self.steps_done,
            transform=self._transform_label(est), r_prior=prior,
            global_state=np.asarray(global_state, dtype=np.float64), opened_at=time.time(),
        )
        live.estimator = est
        return live

    def _install(self, live: LiveRound) -> None:
        self.current = live
        self.state._put_round(live.view(self.cfg, self.clients), current=True)
        self._broadcast(RoundEvent(live.round_id, "open"))
        log.info("[Engine] round %d open (step %d, transform %s)", live.round_id,
                 live.task_step, live.transform)

    async def submit(self, sub: Submission, arrived: float | None = None,
                     raw: bytes | None = None) -> SubmitReply:
        """Validate, commit durably, then acknowledge; closes the round when all n are in.

        ``arrived`` is when the request reached the handler (unix seconds; now if None);
        ``raw`` the request bytes ``sub`` was parsed from (stored as they are; re-encoded
        when None).
        """
        arrived = time.time() if arrived is None else arrived
        self._last_arrival = asyncio.get_running_loop().time()
        if sub.client_id not in self.clients:
            raise Rejected("FAILED_PRECONDITION",
                           f"client {sub.client_id!r} has not joined; call Join first")
        live = self.current
        if live is None or sub.round_id != live.round_id:
            return await self._finished_retry(sub)
        pending = live.pending.get(sub.client_id)
        if pending is not None:  # the same client's write is queued: its outcome decides
            digest, fut = pending
            if digest != sub.digest:
                raise self._different(sub)
            await self._outcome(fut)
        committed = live.subs.get(sub.client_id)
        if committed is not None and committed.digest == sub.digest:
            self.state._emit("submission", "duplicate")
            return SubmitReply(live.round_id, len(live.subs), True)
        if live.state not in ("open", "collecting"):
            raise Rejected("FAILED_PRECONDITION",
                           f"round {live.round_id} is closed ({live.state}); "
                           "no more submissions")
        if committed is not None:
            raise self._different(sub)
        check_submission_spec(sub, self.encoding[0], self.encoding[1])
        validate_submission(sub, self.cfg, self.m)
        ops = [op_submission(StoredSubmission(live.round_id, sub.client_id, sub.client_seed,
                                              sub.digest,
                                              serde.encode_submission(sub) if raw is None
                                              else raw, arrived))]
        fut = self.store.enqueue(ops)
        live.pending[sub.client_id] = (sub.digest, fut)
        fut.add_done_callback(functools.partial(self._landed, live, sub, arrived))
        await self._outcome(fut)
        return SubmitReply(live.round_id, len(live.subs), False)

    def _landed(self, live: LiveRound, sub: Submission, arrived: float,
                fut: asyncio.Future[None]) -> None:
        """A submission's write finished: a commit enters memory whether or not its caller
        is still there (runs before any waiter resumes: it was the first callback).
        """
        del live.pending[sub.client_id]
        if fut.exception() is not None:
            return
        live.add(sub, arrived)
        if live.first_at is None:  # the first commit starts the deadline
            live.first_at = time.time()
            live.deadline = live.first_at + self.cfg.round_timeout
            live.state = "collecting"
            self._arm_deadline(live)
            self._spawn(self._durable([op_round(live.stored())]))
        self.state._emit("submission", "ok")
        self.state._emit("bytes_received", "wire", float(sub.wire_bytes))
        self.state._emit("bytes_received", "payload", float(sub.payload_bytes))
        self._view_changed()
        if len(live.subs) >= self.cfg.n and live.state == "collecting":
            self._spawn(self._close(live, "all clients submitted"))

    def _different(self, sub: Submission) -> Rejected:
        return Rejected("ALREADY_EXISTS",
                        f"client {sub.client_id!r} already submitted a different "
                        f"submission in round {sub.round_id}")

    async def _finished_retry(self, sub: Submission) -> SubmitReply:
        """A submission for a round that is not the current one: an identical retry of a
        committed submission is acknowledged (``duplicate``), anything else refused.
        """
        if sub.round_id not in self.results:
            self._reject_round(sub.round_id)
        digest, count = await asyncio.to_thread(self.store.committed, sub.round_id,
                                                sub.client_id)
        if digest is not None and digest == sub.digest:
            self.state._emit("submission", "duplicate")
            return SubmitReply(sub.round_id, count, True)
        self._reject_round(sub.round_id)

    def _reject_round(self, round_id: int) -> NoReturn:
        if round_id in self.results:
            r = self.results[round_id]
            raise Rejected("FAILED_PRECONDITION",
                           f"round {round_id} is finished ({r.state}); no more submissions")
        cur = "none" if self.current is None else str(self.current.round_id)
        if self.job_done:
            raise Rejected("FAILED_PRECONDITION", f"round {round_id}: the job is done")
        raise Rejected("NOT_FOUND", f"unknown round {round_id} (current round: {cur})")

    def _arm_deadline(self, live: LiveRound) -> None:
        assert live.deadline is not None
        delay = max(0.0, live.deadline - time.time())
        loop = asyncio.get_running_loop()
        live.timer = loop.call_later(delay, lambda: self._spawn(self._deadline(live)))

    async def _deadline(self, live: LiveRound) -> None:
        """The deadline timer fired. If it fired late, the process was stalled and requests
        that reached the server before the deadline may still wait in gRPC's queues: keep
        admitting until no submission has arrived for ``SETTLE_QUIET`` seconds (at most
        ``SETTLE_MAX``), then close.
        """
        assert live.deadline is not None
        late = time.time() - live.deadline
        if late > STALL_SLACK and live.state == "collecting":
            loop = asyncio.get_running_loop()
            fired = loop.time()
            log.warning("[Engine] round %d: deadline timer %.1fs late (stalled); admitting "
                        "submissions already received", live.round_id, late)
            while loop.time() < fired + SETTLE_MAX:
                quiet = loop.time() - max(fired, self._last_arrival)
                if quiet >= SETTLE_QUIET:
                    break
                await asyncio.sleep(SETTLE_QUIET - quiet)
        await self._close(live, "deadline")

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self, live: LiveRound, why: str) -> None:
        if live.state != "collecting" or self.current is not live:
            return
        live.state = "decoding"
        if live.timer is not None:
            live.timer.cancel()
        live.closed_at = time.time()
        self.state._put_round(live.view(self.cfg, self.clients), current=True)
        self._broadcast(RoundEvent(live.round_id, "decoding", why, received=len(live.subs)))
        if live.pending:  # queued writes decide before the set is closed
            await asyncio.gather(*(f for _, f in list(live.pending.values())),
                                 return_exceptions=True)
        # the closed set is durable: after a crash the round is decoded from exactly this set
        await self._durable([op_round(live.stored())])
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
                                     evaluate=self.cfg.eval,
                                     options=DecodeOptions.from_config(self.cfg)),
            )
        except Exception as exc:  # a decode error fails the round, never the server
            log.exception("[Engine] round %d decode failed", live.round_id)
            await self._finish(live, None, f"decode error: {exc}")
            return
        await self._finish(live, outcome, "")

    async def _finish(self, live: LiveRound, outcome: DecodeOutcome | None, reason: str) -> None:
        live.finished_at = time.time()
        ops = []
        if outcome is None:
            live.state, live.reason = "failed", reason
            next_state = live.global_state
            self.failed_streak += 1
            log.warning("[Engine] round %d failed: %s", live.round_id, reason)
        else:
            self.failed_streak = 0
            live.state = "done"
            live.outcome = outcome
            next_state = self.task.apply(live.global_state, outcome.estimate)
            live.next_state = np.asarray(next_state, dtype=np.float64)
            self.steps_done += 1
            self.state._emit("decode_seconds", "", outcome.seconds)
            log.info("[Engine] round %d done: n'=%d decode %.3fs", live.round_id,
                     outcome.n_prime, outcome.seconds)
        job_done = self.steps_done >= self.cfg.rounds
        failure = ""
        limit = self.cfg.max_failed_rounds
        if not job_done and limit and self.failed_streak >= limit:
            job_done = True
            failure = (f"{self.failed_streak} consecutive rounds failed (--max-failed-rounds "
                       f"{limit}); the last: {reason}")
        ops.append(op_round(live.stored()))
        if self.tracker is not None:
            ops.append(op_meta("tracker_fraction", json.dumps(self.tracker.fraction)))
        if job_done:
            ops.append(op_meta("job_done", "1"))
        if failure:
            ops.append(op_meta("job_failure", failure))
        if job_done:
            nxt = None
        else:  # the next round opens in the same transaction
            nxt = self._new_round(next_state, live.round_id + 1)
            ops.append(op_round(nxt.stored()))
        await self._durable(ops)
        self.job_done = job_done
        self.job_failure = failure
        self.results[live.round_id] = self._result(live)
        self.state._put_round(live.view(self.cfg, self.clients), current=False)
        self.current = None
        live.finished.set()
        if live.state == "done" and live.next_state is not None:
            for hook in self.done_hooks:
                self._spawn(hook(live.round_id, live.next_state))
        self._broadcast(RoundEvent(live.round_id, live.state, failure or live.reason, job_done,
                                   len(live.subs)))
        if failure:
            log.error("[Engine] job failed after %d steps: %s", self.steps_done, failure)
            self.done_event.set()
        elif job_done:
            log.info("[Engine] job done after %d steps", self.steps_done)
            self.done_event.set()
        else:
            assert nxt is not None
            self._install(nxt)
        self._publish_job()

    def _publish_job(self) -> None:
        prior = None if self.tracker is None else self.tracker.prior(self.cfg.n)
        self.state._set_job(JobView(self.cfg.task, self.steps_done, self.cfg.rounds,
                                    self.job_done, prior, self.job_failure))

    # -- results ---------------------------------------------------------------------------
    def _result(self, live: LiveRound) -> RoundResult:
        o = live.outcome
        nan = math.nan
        ev = o.eval_errors if o is not None and o.eval_errors is not None else (nan, nan, nan)
        contributors = tuple(
            Contributor(cid, seed)
            for cid, seed in sorted(live.contributors(), key=lambda p: self.clients.get(p[0], 0))
        ) if live.state == "done" else ()
        return RoundResult(
            live.round_id, live.state, live.reason, None if o is None else o.estimate,
            live.next_state if live.state == "done" else live.global_state,
            0 if o is None else o.n_prime, nan if o is None else o.beta,
            nan if o is None else o.c, nan if o is None else o.seconds, contributors,
            nan if o is None else o.r_hat, ev[0], ev[1], ev[2],
            self.job_done and live.state in ("done", "failed"), live.nonce, live.transform,
            live.payload_bytes(), live.wire_bytes(),
        )

    async def result(self, round_id: int, wait: bool, timeout: float | None,
                     client_id: str = "") -> RoundResult:
        """A round's result; with ``wait``, block (up to ``timeout``) until it finishes.

        ``client_id`` names the asking client: told ``job_done``, it counts as drained.
        """
        res = await self._result_for(round_id, wait, timeout)
        if res.job_done:
            self._seen(client_id)
        return res

    async def _result_for(self, round_id: int, wait: bool, timeout: float | None
                          ) -> RoundResult:
        if round_id == 0:
            if self.results:
                return self.results[max(self.results)]
            if self.current is None:
                raise Rejected("NOT_FOUND", "no round has finished yet")
            round_id = self.current.round_id
        if round_id in self.results and not (
            self.current is not None and self.current.round_id == round_id
        ):
            return self.results[round_id]
        live = self.current
        if live is None or live.round_id != round_id:
            cur = "none" if live is None else str(live.round_id)
            raise Rejected("NOT_FOUND", f"unknown round {round_id} (current round: {cur})")
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.finished.wait(), timeout)
        if round_id in self.results:
            return self.results[round_id]
        return self._result(live)

    async def watch(self, client_id: str = "") -> AsyncIterator[RoundEvent]:
        """The current round's state, then every transition; ends after the job-done event
        (``client_id``, the asking client, then counts as drained)."""
        q: asyncio.Queue[RoundEvent | None] = asyncio.Queue()
        self._watchers.append(q)
        try:
            if self.job_done:
                failed = bool(self.job_failure)
                yield RoundEvent(0, "failed" if failed else "done",
                                 self.job_failure if failed else "job done", True)
                self._seen(client_id)
                return
            live = self.current
            if live is not None:
                yield RoundEvent(live.round_id, live.state, "", False, len(live.subs))
            while True:
                ev = await q.get()
                if ev is None:  # the server is shutting down
                    return
                yield ev
                if ev.job_done:
                    self._seen(client_id)
                    return
        finally:
            self._watchers.remove(q)

    def _broadcast(self, ev: RoundEvent) -> None:
        for q in self._watchers:
            q.put_nowait(ev)

    def end_watches(self) -> None:
        """End every WatchRounds stream (before the gRPC server stops)."""
        for q in self._watchers:
            q.put_nowait(None)

    async def close(self) -> None:
        """Cancel timers and background work (the store is closed by the caller)."""
        if self.current is not None and self.current.timer is not None:
            self.current.timer.cancel()
        for t in list(self._tasks):
            t.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
