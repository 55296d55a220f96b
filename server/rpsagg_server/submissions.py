"""Admission of submissions: validate, commit durably, acknowledge (or refuse, with why).

A submission's state machine: once its write is queued, the write's outcome decides. The
in-memory update runs in a callback of the store's future, independent of the handler, so a
caller that goes away (deadline, cancel) never undoes a write that commits. Committed means
in memory and acknowledged on an identical retry (``duplicate = true``) in every later state
of its round, closed, finished and after a restart included. A write that fails is
answered UNAVAILABLE with the reason, and nothing of it is kept.

Publishes :class:`~rpsagg_server.events.SubmissionCommitted` and
:class:`~rpsagg_server.events.SubmissionDuplicate`; the round's lifecycle is told of the
first commit (its deadline starts) and of the n-th (the round closes).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import NoReturn, Protocol

from rpsagg_server.config import ServerConfig
from rpsagg_server.events import Publish, SubmissionCommitted, SubmissionDuplicate
from rpsagg_server.live import LiveRound, Rejected, check_submission_spec, validate_submission
from rpsagg_server.membership import outcome
from rpsagg_server.results import JobProgress, ResultBook
from rpsagg_server.store import Store, StoredSubmission
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import Submission, SubmitReply


class Lifecycle(Protocol):
    """What admission tells the round's lifecycle (:class:`~rpsagg_server.rounds.RoundEngine`)."""

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

    async def submit(self, sub: Submission, arrived: float | None = None) -> SubmitReply:
        """Validate, commit durably, then acknowledge; closes the round when all n are in.

        ``arrived`` is when the request reached the handler (unix seconds; now if None). The
        store gets the canonical bytes the digest was computed from at the parse
        (:func:`rpsagg_wire.v1.serde.canonical_bytes`).
        """
        arrived = time.time() if arrived is None else arrived
        self.last_arrival = asyncio.get_running_loop().time()
        if sub.client_id not in self.clients:
            raise Rejected("FAILED_PRECONDITION",
                           f"client {sub.client_id!r} has not joined; call Join first")
        live = self.progress.current
        if live is None or sub.round_id != live.round_id:
            return await self._finished_retry(sub)
        pending = live.pending.get(sub.client_id)
        if pending is not None:  # the same client's write is queued: its outcome decides
            digest, fut = pending
            if digest != sub.digest:
                raise self._different(sub)
            await outcome(fut)
        committed = live.subs.get(sub.client_id)
        if committed is not None and committed.digest == sub.digest:
            self.publish(SubmissionDuplicate(live.round_id, sub.client_id))
            return SubmitReply(round_id=live.round_id, received=len(live.subs), duplicate=True)
        if live.state not in ("open", "collecting"):
            raise Rejected("FAILED_PRECONDITION",
                           f"round {live.round_id} is closed ({live.state}); "
                           "no more submissions")
        if committed is not None:
            raise self._different(sub)
        spec_version, projection, _ = self.progress.encoding
        check_submission_spec(sub, spec_version, projection)
        assert live.estimator is not None  # set when the round opened or resumed
        validate_submission(sub, self.cfg, self.m, live.estimator)
        fut = self.store.commit_submission(StoredSubmission(
            round_id=live.round_id, client_id=sub.client_id, client_seed=sub.client_seed,
            digest=sub.digest, payload=serde.canonical_bytes(sub), received_at=arrived))
        live.pending[sub.client_id] = (sub.digest, fut)
        fut.add_done_callback(functools.partial(self._landed, live, sub, arrived))
        await outcome(fut)
        return SubmitReply(round_id=live.round_id, received=len(live.subs), duplicate=False)

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
            self.lifecycle.first_commit(live)
        self.publish(SubmissionCommitted(live.round_id, sub.client_id, sub.wire_bytes,
                                         sub.payload_bytes))
        self.lifecycle.view_changed()
        if len(live.subs) >= self.cfg.n and live.state == "collecting":
            self.lifecycle.all_committed(live)

    def _different(self, sub: Submission) -> Rejected:
        return Rejected("ALREADY_EXISTS",
                        f"client {sub.client_id!r} already submitted a different "
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
            raise Rejected("FAILED_PRECONDITION", f"round {round_id} is finished "
                           f"({results[round_id].state}); no more submissions")
        current = self.progress.current
        cur = "none" if current is None else str(current.round_id)
        if self.progress.job_done:
            raise Rejected("FAILED_PRECONDITION", f"round {round_id}: the job is done")
        raise Rejected("NOT_FOUND", f"unknown round {round_id} (current round: {cur})")
