"""Restart from the store: the job's settings and projection, its progress and its rounds.

After a crash the last round resumes with every committed submission (a collecting round
gets a fresh deadline; a round that was closing is decoded from exactly its closed set);
finished rounds stay queryable. A database of a job with other settings is refused.

Recovery sees the round engine through :class:`RoundHost` only (three calls: show a
recovered round, close one again, arm a deadline) and gets the engine's data explicitly
in :class:`Recovery`; it never imports the engine.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rpsagg import VectorCorrelationTracker, round_encoding
from rpsagg.tasks import Task
from rpsagg_server.rounds.liveround import LiveRound
from rpsagg_server.rounds.planner import RoundPlanner
from rpsagg_server.rounds.results import JobProgress
from rpsagg_server.rounds.rowcodec import from_row
from rpsagg_server.settings.jobspec import IDENTITY_KEYS, JOB_DEFAULTS
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import Store
from rpsagg_server.store.jobnumber import job_id
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import FINISHED, RoundState

log = logging.getLogger("rpsagg.server")


class SettingsMismatch(ValueError):
    """A job's database (or catalog record) holds settings this server cannot run it with:
    another job's, or settings this version refuses. The job cannot be (re)opened; the
    message says which settings."""


class RoundHost(Protocol):
    """What a restart asks of the round engine."""

    def show_recovered(self, live: LiveRound, current: bool) -> None:
        """A round read back: into the results (a past round) and the read model."""

    def close_again(self, live: LiveRound) -> None:
        """Close (decode) a resumed round again, in the background."""

    def arm_deadline(self, live: LiveRound) -> None:
        """Arm a resumed collecting round's deadline."""


@dataclass
class Recovery:
    """Reads one job back from its store.

    Parameters
    ----------
    cfg : ServerConfig
    store : Store
    m : int
        Vectors per submission.
    progress : JobProgress
        Filled in by :meth:`recover_rounds` and :meth:`resume`.
    tracker : VectorCorrelationTracker or None
        ``transform=auto``'s correlation priors (restored), else None.
    planner : RoundPlanner
        A round's estimator for its correlation prior, k and value bits, and the projection
        the job keeps.
    host : RoundHost
    """

    cfg: ServerConfig
    store: Store
    m: int
    progress: JobProgress
    tracker: VectorCorrelationTracker | None
    planner: RoundPlanner
    host: RoundHost

    def check_job_config(self) -> bool:
        """Refuse a database of a job with other settings; record a new job's. True when
        the database already held a job."""
        cfg = self.cfg
        saved = self.store.get_meta("config")
        mine = {k: getattr(cfg, k) for k in IDENTITY_KEYS}
        if saved is None:
            self.store.put_meta("config", json.dumps(mine))
            return False
        theirs = json.loads(saved)
        # a key an older database lacks predates its setting: the default is what it was
        diff = {k: (theirs.get(k, JOB_DEFAULTS[k]), v) for k, v in mine.items()
                if theirs.get(k, JOB_DEFAULTS[k]) != v}
        if diff:
            detail = ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diff.items())
            raise SettingsMismatch(f"database {cfg.db} belongs to a job with other settings: "
                                   f"{detail}")
        return True

    def recover_encoding(self, job_exists: bool) -> None:
        """Keep the projection a job was started with; record it for a new job.

        Stored submissions are decoded with the projection they were encoded with, so a
        job recovered by a newer server keeps it even where the default has changed: a job
        from before the projection was recorded (meta ``encoding`` absent) used the SRHT.
        If recording it fails, start-up fails (nothing was announced to clients yet).
        """
        p = self.progress
        saved = self.store.get_meta("encoding")
        if saved is not None:
            projection = str(json.loads(saved)[1])
        elif job_exists:
            projection = "srht" if p.encoding[1] else ""  # the projection before "auto"
        else:
            projection = p.encoding[1]
        if projection and projection != p.encoding[1]:
            log.warning("[Engine] job in %s was started with projection %r; keeping it "
                        "(a new job with d=%d would use %r)", self.cfg.db, projection,
                        self.cfg.d, p.encoding[1])
            self.planner.keep_projection(projection)
            p.encoding = round_encoding(self.planner.encoding_estimator())
        if saved is None:
            self.store.put_meta("encoding", json.dumps(list(p.encoding)))

    def recover_rounds(self) -> LiveRound | None:
        """Read the job's progress and rounds back; returns the newest round (None: no
        round yet). Finished rounds' results are kept, and every round is shown to the
        read model. Only the newest round is read with its arrays (it resumes, or the next
        round starts from its state); the others' are read back on demand (the archive)."""
        p, store = self.progress, self.store
        frac = store.get_meta("tracker_fraction")
        if self.tracker is not None and frac is not None:
            # a list (one fraction per vector slot), or one number from a store written
            # before the per-vector priors, which every slot then starts from
            self.tracker.restore(json.loads(frac))
        p.job_done = store.get_meta("job_done") == "1"
        p.job_failure = store.get_meta("job_failure") or ""
        p.job_id = job_id(store)
        last = None
        rows = store.rounds(arrays=False)
        for i, stored in enumerate(rows):
            if i == len(rows) - 1:
                stored = store.round(stored.round_id)
            live = from_row(stored)
            if live.state == RoundState.DONE:
                p.steps_done += 1
            if live.state in FINISHED:
                p.failed_streak = p.failed_streak + 1 if live.state == RoundState.FAILED else 0
            self.host.show_recovered(live, current=False)
            last = live
        return last

    def resume(self, live: LiveRound) -> None:
        """Make the last unfinished round current again with its committed submissions."""
        live.estimator = self.planner.estimator(live.r_prior, live.k, live.value_bits)
        for s in self.store.submissions(live.round_id):
            live.add(serde.decode_submission(s.payload), s.received_at)
        log.info("[Engine] resuming round %d (%s) with %d committed submissions",
                 live.round_id, live.state, len(live.subs))
        self.progress.current = live
        if live.state == RoundState.DECODING or len(live.subs) >= self.cfg.n:
            live.state = RoundState.COLLECTING
            self.host.close_again(live)
        elif live.subs:  # collecting (or open when its row's update did not land)
            live.state = RoundState.COLLECTING
            if live.first_at is None:
                live.first_at = min(a.received_at for a in live.arrivals())
            live.deadline = time.time() + self.cfg.round_timeout
            self.host.arm_deadline(live)
        self.host.show_recovered(live, current=True)


def next_state(task: Task, seed: int, last: LiveRound | None) -> np.ndarray:
    """The global state the next round starts from."""
    if last is None:
        return np.asarray(task.initial_state(seed))
    return np.asarray(last.next_state if last.next_state is not None else last.global_state)
