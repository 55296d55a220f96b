"""Results: what clients read about rounds, waiting for them, the WatchRounds broadcast, and
the drained job end.

:class:`ResultBook` answers GetRound (the current round), GetResult (a round's result, or a
wait for it) and WatchRounds (the current round's state, then every transition from the
domain events it subscribes to). It reads the engine's :class:`JobProgress` and never
changes a round.

The job's end is drained: once it is done (or failed), every read answers ``job_done`` and
the book records which joined clients have been told (:meth:`ResultBook.drain`), so the
server stops only after each of them has seen it, or after a bounded wait.

A finished round's result is kept without its arrays (the estimate and the task's state:
``m x d`` floats each); GetResult gets them from the :class:`~rpsagg_server.rounds.archive.
RoundArchive`, the store behind a cache of bounded size, so memory does not grow with the
rounds. A failed read of the store refuses that call
(:class:`~rpsagg_server.domain.errors.Unavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rpsagg.schemes import scheme_traits
from rpsagg_server.domain.errors import NotFound, Unavailable
from rpsagg_server.readmodel.events import (
    Event,
    RoundClosed,
    RoundDecoded,
    RoundFailed,
    RoundOpened,
)
from rpsagg_server.readmodel.views import EstimatedError
from rpsagg_server.rounds.archive import RoundArchive
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import ReadError
from rpsagg_wire.v1.messages import FINISHED, RoundState
from rpsagg_wire.v1.serde import Contributor, RoundEvent, RoundInfo, RoundResult


def announced_k(cfg: ServerConfig, k: int) -> int:
    """``RoundInfo.k``: the round's k, or 0 for schemes without one (``eden``, ``qsgd``
    send every coordinate and ignore ``--k``).

    Parameters
    ----------
    cfg : ServerConfig
    k : int
        The round's k (``--k`` or the one ``--target-rel-error`` chose).

    Returns
    -------
    int
    """
    return k if scheme_traits(cfg.estimator).takes_k else 0


def no_round_info(cfg: ServerConfig, m: int, *, d: int, job_done: bool = False,
                  job_failure: str = "", job_id: int = 0) -> RoundInfo:
    """``GetRound``'s answer for a job without a round and without a database: one waiting
    for its first join's d (``d`` 0), or one that ended without ever running."""
    c = cfg
    return RoundInfo(round_id=0, nonce=0, scheme=c.estimator, n=c.n, k=announced_k(c, c.k),
                     d=d, transform="", task=c.task, m=m, global_state=None,
                     state=RoundState.UNSPECIFIED, deadline_unix_ms=0, eval=c.eval,
                     job_done=job_done, task_step=0, total_rounds=c.rounds,
                     job_failure=job_failure, value_bits=c.fixed_value_bits, bits=c.bits,
                     job_id=job_id)


@dataclass
class JobProgress:
    """The engine's progress, written by the engine's lifecycle and read by the results.

    ``encoding`` is ``(spec_version, projection, block_size)``, what every round announces.
    """

    encoding: tuple[str, str, int]
    current: LiveRound | None = None
    steps_done: int = 0
    job_done: bool = False
    job_failure: str = ""  # why the job ended without finishing its rounds
    job_id: int = 0  # RoundInfo.job_id (rpsagg_server.store.jobnumber.job_id)
    failed_streak: int = 0  # consecutive failed rounds (--max-failed-rounds)
    stopping: bool = False  # asked to end the job after the current round (--rounds 0)
    cancelled: str = ""  # why the job was cancelled (RoundEngine.cancel); "" otherwise
    done_event: asyncio.Event = field(default_factory=asyncio.Event)


def estimated_fields(e: EstimatedError | None) -> dict[str, float]:
    """The ``est_*`` fields of :class:`RoundResult` and :class:`RoundEvent` (none: NaN)."""
    if e is None:
        return {}
    return {"est_sq_error": e.squared_error, "est_sq_error_stderr": e.squared_error_stderr,
            "est_mean_sq_norm": e.mean_norm_squared, "est_relative_error": e.relative_error}


class ResultBook:
    """Finished rounds' results, the current round, watchers and the drain.

    Parameters
    ----------
    config : ServerConfig
    m : int
        Vectors per submission (the task's).
    clients : dict
        The membership's client ids -> indices (read, never written, here).
    progress : JobProgress
    archive : RoundArchive
        Finished rounds' arrays (the store, behind a bounded cache).
    """

    def __init__(self, config: ServerConfig, m: int, clients: dict[str, int],
                 progress: JobProgress, archive: RoundArchive) -> None:
        self.cfg = config
        self.m = m
        self.clients = clients
        self.progress = progress
        self.archive = archive
        #: finished rounds' results without their arrays (``estimate`` and
        #: ``global_state`` None; :meth:`result` adds them from the archive)
        self.results: dict[int, RoundResult] = {}
        self.seen_done: set[str] = set()  # joined clients that were told job_done
        self._all_seen = asyncio.Event()
        self._watchers: list[asyncio.Queue[RoundEvent | None]] = []

    # -- results ---------------------------------------------------------------------------
    def record(self, live: LiveRound) -> None:
        """Keep a finished (or recovered) round's result; its arrays go to the archive
        (a round recovered without them is read back from the store on demand)."""
        self.results[live.round_id] = dataclasses.replace(
            self.build(live), estimate=None, global_state=None)
        arrays = live.arrays()
        if arrays is not None:
            self.archive.put(live.round_id, arrays)

    async def _with_arrays(self, res: RoundResult) -> RoundResult:
        """A kept result with its estimate and global state (from the archive)."""
        try:
            arrays = await self.archive.fetch(res.round_id)
        except ReadError as exc:
            raise Unavailable(f"round {res.round_id}'s result could not be "
                              f"read back: {exc.reason}") from None
        return dataclasses.replace(res, estimate=arrays.estimate, global_state=arrays.state)

    def build(self, live: LiveRound) -> RoundResult:
        """The :class:`RoundResult` of a round as it is now."""
        o = live.outcome
        nan = math.nan
        ev = o.eval_errors if o is not None and o.eval_errors is not None else (nan, nan, nan)
        done = live.state == RoundState.DONE
        contributors = tuple(
            Contributor(client_id=cid, client_seed=seed)
            for cid, seed in sorted(live.contributors(), key=lambda p: self.clients.get(p[0], 0))
        ) if done else ()
        return RoundResult(
            round_id=live.round_id, state=live.state, reason=live.reason,
            estimate=None if o is None else o.estimate,
            global_state=live.next_state if done else live.global_state,
            n_prime=0 if o is None else o.n_prime, beta=nan if o is None else o.beta,
            c=nan if o is None else o.c, decode_seconds=nan if o is None else o.seconds,
            contributors=contributors, r_hat=nan if o is None else o.r_hat,
            eval_sq_error=ev[0], eval_sq_error_rand_k=ev[1],
            eval_sq_error_rand_k_spatial=ev[2],
            job_done=self.progress.job_done and live.state in FINISHED,
            nonce=live.nonce, transform=live.transform, payload_bytes=live.payload_bytes(),
            wire_bytes=live.wire_bytes(),
            **estimated_fields(None if o is None else o.estimated_error),
        )

    async def result(self, round_id: int, wait: bool, timeout: float | None,
                     client_id: str = "") -> RoundResult:
        """A round's result; with ``wait``, block (up to ``timeout``) until it finishes.

        ``client_id`` names the asking client: told ``job_done``, it counts as drained.
        """
        res = await self._result_for(round_id, wait, timeout)
        if res.job_done:
            self.seen(client_id)
        return res

    async def _result_for(self, round_id: int, wait: bool, timeout: float | None
                          ) -> RoundResult:
        current = self.progress.current
        if round_id == 0:
            if self.results:
                return await self._with_arrays(self.results[max(self.results)])
            if current is None:
                raise NotFound("no round has finished yet")
            round_id = current.round_id
        if round_id in self.results and not (
            current is not None and current.round_id == round_id
        ):
            return await self._with_arrays(self.results[round_id])
        live = current
        if live is None or live.round_id != round_id:
            cur = "none" if live is None else str(live.round_id)
            raise NotFound(f"unknown round {round_id} (current round: {cur})")
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.finished.wait(), timeout)
        if round_id in self.results:
            return await self._with_arrays(self.results[round_id])
        return self.build(live)

    # -- the current round -----------------------------------------------------------------
    def round_info(self, client_id: str = "") -> RoundInfo:
        """The current round (``job_done`` when there is none).

        ``client_id`` names the asking client: told ``job_done``, it counts as drained.
        """
        p = self.progress
        live = p.current
        c = self.cfg
        if live is None and p.job_done:
            self.seen(client_id)
        spec_version, projection, block_size = p.encoding
        if live is not None and live.estimator is not None:
            spec_version = live.estimator.wire.spec_version  # the round's own (value bits)
        return RoundInfo(
            round_id=0 if live is None else live.round_id,
            nonce=0 if live is None else live.nonce,
            scheme=c.estimator, n=c.n,
            k=announced_k(c, c.k if live is None else (live.k or c.k)), d=c.d,
            transform="" if live is None else live.transform, task=c.task, m=self.m,
            global_state=None if live is None else live.global_state,
            state=RoundState.UNSPECIFIED if live is None else live.state,
            deadline_unix_ms=(0 if live is None or live.deadline is None
                              else int(live.deadline * 1000)),
            eval=c.eval, job_done=live is None and p.job_done,
            task_step=p.steps_done if live is None else live.task_step,
            total_rounds=c.rounds, job_failure=p.job_failure if live is None else "",
            spec_version=spec_version, projection=projection, block_size=block_size,
            value_bits=(live.value_bits if live is not None else 0) or c.fixed_value_bits,
            bits=c.bits, job_id=p.job_id,
        )

    # -- WatchRounds -----------------------------------------------------------------------
    def observe(self, event: Event) -> None:
        """Broadcast the round transitions a watcher sees (subscribed to the event bus)."""
        if isinstance(event, RoundOpened):
            ev = RoundEvent(round_id=event.view.round_id, state=RoundState.OPEN)
        elif isinstance(event, RoundClosed):
            ev = RoundEvent(round_id=event.view.round_id, state=RoundState.DECODING,
                            reason=event.why, received=len(event.view.clients_arrived))
        elif isinstance(event, RoundDecoded | RoundFailed):
            v = event.view
            failure = event.job_failure if isinstance(event, RoundFailed) else ""
            ev = RoundEvent(round_id=v.round_id, state=v.state, reason=failure or v.reason,
                            job_done=event.job_done, received=len(v.clients_arrived),
                            **estimated_fields(v.estimated_error
                                               if v.state == RoundState.DONE else None))
        else:
            return
        for q in self._watchers:
            q.put_nowait(ev)

    async def watch(self, client_id: str = "") -> AsyncIterator[RoundEvent]:
        """The current round's state, then every transition; ends after the job-done event
        (``client_id``, the asking client, then counts as drained)."""
        q: asyncio.Queue[RoundEvent | None] = asyncio.Queue()
        self._watchers.append(q)
        p = self.progress
        try:
            if p.job_done:
                failed = bool(p.job_failure)
                yield RoundEvent(round_id=0, state=RoundState.FAILED if failed else RoundState.DONE,
                                 reason=p.job_failure if failed else "job done", job_done=True)
                self.seen(client_id)
                return
            live = p.current
            if live is not None:
                yield RoundEvent(round_id=live.round_id, state=live.state,
                                 received=len(live.subs))
            while True:
                ev = await q.get()
                if ev is None:  # the server is shutting down
                    return
                yield ev
                if ev.job_done:
                    self.seen(client_id)
                    return
        finally:
            self._watchers.remove(q)

    def end_watches(self) -> None:
        """End every WatchRounds stream (before the gRPC server stops)."""
        for q in self._watchers:
            q.put_nowait(None)

    # -- the drained job end ---------------------------------------------------------------
    def seen(self, client_id: str) -> None:
        """``client_id`` was told ``job_done``; set :meth:`drain`'s event once all were."""
        if client_id in self.clients:
            self.seen_done.add(client_id)
        if self.progress.job_done and self.seen_done.issuperset(self.clients):
            self._all_seen.set()

    def undrained(self) -> list[str]:
        """Joined clients that have not been told ``job_done`` yet."""
        return sorted(set(self.clients) - self.seen_done)

    async def drain(self, timeout: float) -> bool:
        """After the job is done, wait until every joined client has been told so, at most
        ``timeout`` seconds; True when all were."""
        await self.progress.done_event.wait()
        self.seen("")
        try:
            await asyncio.wait_for(self._all_seen.wait(), timeout)
        except TimeoutError:
            return False
        return True
