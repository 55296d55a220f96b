"""What a finished round leaves: the round marked done or failed, the job's progress counted,
and what follows (the state the next round starts from, or the job's end and why)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from rpsagg.tasks import Task
from rpsagg_server.decode.decoding import DecodeOutcome
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.rounds.results import JobProgress
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.messages import RoundState

log = logging.getLogger("rpsagg.server")


@dataclass(frozen=True)
class RoundEnd:
    """What follows a finished round.

    Attributes
    ----------
    next_state : ndarray
        The global state the next round starts from (a failed round's own).
    job_done : bool
        Whether the job ends with this round.
    failure : str
        Why the job ended without finishing its rounds (cancelled, or too many consecutive
        failed rounds); "" otherwise.
    """

    next_state: np.ndarray
    job_done: bool
    failure: str


def end_round(live: LiveRound, outcome: DecodeOutcome | None, reason: str,
              progress: JobProgress, task: Task, cfg: ServerConfig) -> RoundEnd:
    """Finish ``live`` in memory: done with ``outcome`` (the task takes its step), or failed
    with ``reason`` (``outcome`` None); count it in ``progress`` (steps, the failed streak)
    and say what follows. Nothing is written or published here.

    Parameters
    ----------
    live : LiveRound
        The round, closed and decoded (or given up).
    outcome : DecodeOutcome or None
    reason : str
        Why the round failed (when ``outcome`` is None).
    progress : JobProgress
        The job's progress (``--rounds 0``: until stopped; cancelled: its reason).
    task : Task
    cfg : ServerConfig
        ``--rounds`` and ``--max-failed-rounds``.
    """
    p = progress
    live.finished_at = time.time()
    if outcome is None:
        live.state, live.reason = RoundState.FAILED, reason
        next_state = live.global_state
        p.failed_streak += 1
        log.warning("[Engine] round %d failed: %s", live.round_id, reason)
    else:
        p.failed_streak = 0
        live.state = RoundState.DONE
        live.outcome = outcome
        next_state = task.apply(live.global_state, outcome.estimate)
        live.next_state = np.asarray(next_state, dtype=np.float64)
        p.steps_done += 1
        log.info("[Engine] round %d done: n'=%d decode %.3fs", live.round_id,
                 outcome.n_prime, outcome.seconds)
    # --rounds 0: until stopped (stop_job)
    job_done = p.stopping or 0 < cfg.rounds <= p.steps_done
    failure = p.cancelled
    limit = cfg.max_failed_rounds
    if not job_done and limit and p.failed_streak >= limit:
        job_done = True
        failure = (f"{p.failed_streak} consecutive rounds failed (--max-failed-rounds "
                   f"{limit}); the last: {reason}")
    return RoundEnd(next_state, job_done, failure)
