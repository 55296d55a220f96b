"""Admission of submissions: validate, commit durably, acknowledge (or refuse, with why).

A submission's state machine: once its write is queued, the write's outcome decides. The
in-memory update runs in a callback of the store's future, independent of the handler, so a
caller that goes away (deadline, cancel) never undoes a write that commits. Committed means
in memory and acknowledged on an identical retry (``duplicate = true``) in every later state
of its round, closed, finished and after a restart included. A write that fails is
refused as unavailable with the reason, and nothing of it is kept.

Requests are admitted in passes (:meth:`Intake.admit`): everything that arrived since the
last pass is parsed, checked and queued for the store in one loop, and each request still
gets its own answer.

Publishes :class:`~rpsagg_server.readmodel.events.SubmissionCommitted` and
:class:`~rpsagg_server.readmodel.events.SubmissionDuplicate`; the round's lifecycle is told of the
first commit (its deadline starts) and of the n-th (the round closes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any, NoReturn, Protocol

from rpsagg.schemes import WireProfile
from rpsagg_server.domain.errors import (
    Conflict,
    DomainError,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    Unavailable,
)
from rpsagg_server.readmodel.events import Publish, SubmissionCommitted, SubmissionDuplicate
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.rounds.requestchecks import (
    check_bound,
    check_submission_spec,
    validate_submission,
)
from rpsagg_server.rounds.results import JobProgress, ResultBook
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import Store, StoredSubmission
from rpsagg_server.store.writer import WriteError
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import ACCEPTING, RoundState
from rpsagg_wire.v1.serde import Submission, SubmitReply

log = logging.getLogger("rpsagg.server")
#: seconds between two admission passes under load. Run once per request, between gRPC's
#: own work, the admission's Python cost 54 us per request and left the passes one request
#: long; in passes 5 ms apart it costs 22 us, and a burst of 1,000 submissions went from
#: about 3,600 to 5,000 a second (docs/reliability.md, "Load").
ADMIT_INTERVAL = 0.005


class Lifecycle(Protocol):
    """What admission tells the round's lifecycle
    (:class:`~rpsagg_server.rounds.engine.RoundEngine`)."""

    def first_commit(self, live: LiveRound) -> None:
        """The round's first submission committed: start its deadline."""

    def all_committed(self, live: LiveRound) -> None:
        """All n clients' submissions committed: close the round."""

    def view_changed(self) -> None:
        """The current round's arrivals changed."""


class Intake:
    """Admits submissions to the current round.

    Parameters
    ----------
    config : ServerConfig
    m : int
    store : Store
    publish : callable
    clients : dict
        The membership's client ids -> indices.
    progress : JobProgress
    results : ResultBook
        Finished rounds (an identical retry of a committed submission is acknowledged).
    lifecycle : Lifecycle
    """

    def __init__(self, config: ServerConfig, m: int, store: Store, publish: Publish,
                 clients: dict[str, int], progress: JobProgress, results: ResultBook,
                 lifecycle: Lifecycle) -> None:
        self.cfg = config
        self.m = m
        self.store = store
        self.publish = publish
        self.clients = clients
        self.progress = progress
        self.results = results
        self.lifecycle = lifecycle
        self.last_arrival = 0.0  # loop.time() when the last Submit reached the engine
        #: requests waiting for the next admission pass: (raw bytes or a parsed
        #: submission, arrival time, bound client id, the ack's future)
        self._arrived: list[tuple[bytes | Submission, float, str | None,
                                  asyncio.Future[SubmitReply]]] = []
        self._pass_at = -ADMIT_INTERVAL  # loop.time() of the last admission pass
        self._waiting: set[asyncio.Task[SubmitReply]] = set()

    def admit(self, raw: bytes, arrived: float, bound: str | None) -> asyncio.Future[SubmitReply]:
        """Take one received Submit request; the future resolves with its ack once the
        submission is durable (or raises a :class:`~rpsagg_server.domain.errors.DomainError` saying
        why not).

        Requests are admitted in passes, at most one every :data:`ADMIT_INTERVAL` seconds:
        the requests that arrived since the last pass are parsed, checked and queued for the
        store in one loop, and their writes land together. A request that finds the server
        idle is admitted at once; under load one waits at most ``ADMIT_INTERVAL``.

        ``arrived``: when the request reached the handler (unix seconds). ``bound``: the
        client id the caller's token belongs to (None: any). Cancelling the future (the
        caller went away) changes nothing about the submission.
        """
        fut: asyncio.Future[SubmitReply] = asyncio.get_running_loop().create_future()
        self._take(raw, arrived, bound, fut)
        return fut

    async def submit(self, sub: Submission, arrived: float | None = None) -> SubmitReply:
        """Admit a parsed submission (see :meth:`admit`)."""
        arrived = time.time() if arrived is None else arrived
        fut: asyncio.Future[SubmitReply] = asyncio.get_running_loop().create_future()
        self._take(sub, arrived, None, fut)
        return await fut

    def _take(self, item: bytes | Submission, arrived: float, bound: str | None,
              fut: asyncio.Future[SubmitReply]) -> None:
        """Queue a request for the next admission pass, scheduled when the first arrives:
        at once when the last pass was more than :data:`ADMIT_INTERVAL` ago, else that long
        after it."""
        if not self._arrived:
            loop = asyncio.get_running_loop()
            wait = self._pass_at + ADMIT_INTERVAL - loop.time()
            if wait <= 0:
                loop.call_soon(self._admit_all)
            else:
                loop.call_later(wait, self._admit_all)
        self._arrived.append((item, arrived, bound, fut))

    def _admit_all(self) -> None:
        """One admission pass over the requests that arrived since the last."""
        batch, self._arrived = self._arrived, []
        self.last_arrival = self._pass_at = asyncio.get_running_loop().time()
        live = self.progress.current
        queued: list[tuple[Submission, float, asyncio.Future[SubmitReply]]] = []
        in_pass: set[str] = set()  # clients with a write queued by this pass
        # what the round's messages carry, built once for the pass (a property that builds
        # a new profile each time it is read)
        wire = None if live is None or live.estimator is None else live.estimator.wire
        for item, arrived, bound, fut in batch:
            try:
                sub = item if isinstance(item, Submission) else self._parse(item)
                check_bound(bound, sub.client_id)
                if self._admit_now(sub, live, wire, fut, in_pass):
                    queued.append((sub, arrived, fut))
                    in_pass.add(sub.client_id)
            except Exception as exc:  # a DomainError: the answer; anything else: a bug, logged
                if not isinstance(exc, DomainError):
                    log.exception("[Engine] admitting a submission failed")
                if not fut.done():
                    fut.set_exception(exc)
        if not queued:
            return
        assert live is not None
        writes = self.store.commit_submissions([StoredSubmission(
            round_id=live.round_id, client_id=sub.client_id, client_seed=sub.client_seed,
            digest=sub.digest, payload=serde.canonical_bytes(sub), received_at=arrived)
            for sub, arrived, _ in queued])
        for i, (sub, _, _) in enumerate(queued):
            live.pending[sub.client_id] = (sub.digest, writes, i)
        writes.add_done_callback(functools.partial(self._landed, live, queued))

    @staticmethod
    def _parse(raw: bytes) -> Submission:
        try:
            sub: Submission = serde.parse_request("Submit", raw)
        except serde.WireError as exc:
            raise InvalidRequest(str(exc)) from None
        return sub

    def _admit_now(self, sub: Submission, live: LiveRound | None, wire: WireProfile | None,
                   fut: asyncio.Future[SubmitReply], in_pass: set[str]) -> bool:
        """Decide what can be decided now: True to queue the write; False when ``fut`` is
        answered (a duplicate) or a task will answer it (the cases that wait). Raises
        :class:`~rpsagg_server.domain.errors.DomainError`."""
        if sub.client_id not in self.clients:
            raise PreconditionFailed(
                f"client {sub.client_id!r} has not joined; call Join first")
        if (live is None or sub.round_id != live.round_id or sub.client_id in live.pending
                or sub.client_id in in_pass):
            # a finished round's retry (read from the database), or a retry while the first
            # write is queued (its outcome decides): they wait, this pass does not
            self._answer_later(self._admit_later(sub), fut)
            return False
        committed = live.subs.get(sub.client_id)
        if committed is not None and committed.digest == sub.digest:
            self.publish(SubmissionDuplicate(live.round_id, sub.client_id))
            if not fut.done():
                fut.set_result(SubmitReply(round_id=live.round_id, received=len(live.subs),
                                           duplicate=True))
            return False
        if live.state not in ACCEPTING:
            raise PreconditionFailed(
                f"round {live.round_id} is closed ({live.state}); "
                "no more submissions")
        if committed is not None:
            raise self._different(sub)
        assert wire is not None  # the estimator is set when the round opened or resumed
        check_submission_spec(sub, wire)  # the round's own version
        validate_submission(sub, self.cfg, self.m, wire)
        return True

    def _answer_later(self, work: Coroutine[Any, Any, SubmitReply],
                      fut: asyncio.Future[SubmitReply]) -> None:
        task = asyncio.ensure_future(work)
        self._waiting.add(task)

        def done(t: asyncio.Task[SubmitReply]) -> None:
            self._waiting.discard(t)
            exc = None if t.cancelled() else t.exception()
            if fut.done():
                return
            if t.cancelled():
                fut.cancel()
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(t.result())

        task.add_done_callback(done)

    async def _admit_later(self, sub: Submission) -> SubmitReply:
        """The cases that wait: a retry while the client's first write is queued, and a
        submission for another round than the current one."""
        live = self.progress.current
        if live is None or sub.round_id != live.round_id:
            return await self._finished_retry(sub)
        pending = live.pending.get(sub.client_id)
        if pending is not None:  # the same client's write is queued: its outcome decides
            digest, writes, i = pending
            if digest != sub.digest:
                raise self._different(sub)
            error = (await asyncio.shield(writes))[i]
            if error is not None:
                raise Unavailable(error.reason)
        return await self.submit(sub)  # decided now: the next pass answers it

    def _landed(self, live: LiveRound,
                queued: list[tuple[Submission, float, asyncio.Future[SubmitReply]]],
                writes: asyncio.Future[list[WriteError | None]]) -> None:
        """A pass's writes finished: each commit enters memory whether or not its caller is
        still there (this runs before any waiter resumes: it was the first callback)."""
        errors: list[WriteError | None] = (
            [WriteError("the server is stopping")] * len(queued) if writes.cancelled()
            else writes.result())
        landed = 0
        for (sub, arrived, fut), error in zip(queued, errors, strict=True):
            pending = live.pending.get(sub.client_id)
            if pending is not None and pending[1] is writes:
                del live.pending[sub.client_id]
            if error is not None:
                if not fut.done():
                    fut.set_exception(Unavailable(error.reason))
                continue
            live.add(sub, arrived)
            landed += 1
            if live.first_at is None and live.state == RoundState.OPEN:  # the first commit starts
                # the deadline (a round closed while open, by a stop, has none)
                self.lifecycle.first_commit(live)
            self.publish(SubmissionCommitted(live.round_id, sub.client_id, sub.wire_bytes,
                                             sub.payload_bytes))
            if not fut.done():
                fut.set_result(SubmitReply(round_id=live.round_id, received=len(live.subs),
                                           duplicate=False))
        if landed:
            self.lifecycle.view_changed()
            if len(live.subs) >= self.cfg.n and live.state == RoundState.COLLECTING:
                self.lifecycle.all_committed(live)

    def _different(self, sub: Submission) -> Conflict:
        return Conflict(f"client {sub.client_id!r} already submitted a different "
                        f"submission in round {sub.round_id}")

    async def _finished_retry(self, sub: Submission) -> SubmitReply:
        """A submission for a round that is not the current one: an identical retry of a
        committed submission is acknowledged (``duplicate``), anything else refused.
        """
        if sub.round_id not in self.results.results:
            self._reject_round(sub.round_id)
        digest, count = await asyncio.to_thread(self.store.committed, sub.round_id,
                                                sub.client_id)
        if digest is not None and digest == sub.digest:
            self.publish(SubmissionDuplicate(sub.round_id, sub.client_id))
            return SubmitReply(round_id=sub.round_id, received=count, duplicate=True)
        self._reject_round(sub.round_id)

    def _reject_round(self, round_id: int) -> NoReturn:
        results = self.results.results
        if round_id in results:
            raise PreconditionFailed(f"round {round_id} is finished "
                                     f"({results[round_id].state}); no more submissions")
        current = self.progress.current
        cur = "none" if current is None else str(current.round_id)
        if self.progress.job_done:
            raise PreconditionFailed(f"round {round_id}: the job is done")
        raise NotFound(f"unknown round {round_id} (current round: {cur})")
