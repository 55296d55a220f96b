"""Restart from the store: the job's settings, its progress and its rounds.

After a crash the last round resumes with every committed submission (a collecting round
gets a fresh deadline; a round that was closing is decoded from exactly its closed set);
finished rounds stay queryable. A database of a job with other settings is refused.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from rpsagg_server.events import RoundRecovered
from rpsagg_server.live import LiveRound
from rpsagg_wire.v1 import serde

if TYPE_CHECKING:
    from rpsagg_server.rounds import RoundEngine

log = logging.getLogger("rpsagg.server")
CONFIG_KEYS = ("n", "k", "d", "estimator", "transform", "task", "eval", "mean_vectors")
#: what a key absent from an older database's record was (it predates the setting)
_BEFORE = {"mean_vectors": 1}


def check_job_config(engine: RoundEngine) -> bool:
    """Refuse a database of a job with other settings; record a new job's. True when the
    database already held a job."""
    cfg = engine.cfg
    saved = engine.store.get_meta("config")
    mine = {k: getattr(cfg, k) for k in CONFIG_KEYS}
    if saved is None:
        engine.store.put_meta("config", json.dumps(mine))
        return False
    theirs = json.loads(saved)
    diff = {k: (theirs.get(k, _BEFORE.get(k)), v) for k, v in mine.items()
            if theirs.get(k, _BEFORE.get(k)) != v}
    if diff:
        detail = ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diff.items())
        raise ValueError(f"database {cfg.db} belongs to a job with other settings: {detail}")
    return True


def recover_rounds(engine: RoundEngine) -> LiveRound | None:
    """Read the job's progress and rounds back; returns the newest round (None: no round
    yet). Finished rounds' results are kept, and every round is shown to the read model."""
    p, store = engine.progress, engine.store
    frac = store.get_meta("tracker_fraction")
    if engine.tracker is not None and frac is not None:
        # a list (one fraction per vector slot), or one number from a store written before
        # the per-vector priors, which every slot then starts from
        engine.tracker.restore(json.loads(frac))
    p.job_done = store.get_meta("job_done") == "1"
    p.job_failure = store.get_meta("job_failure") or ""
    last = None
    for stored in store.rounds():
        live = LiveRound.from_stored(stored, engine.cfg, engine.m)
        if live.state == "done":
            p.steps_done += 1
        if live.state in ("done", "failed"):
            p.failed_streak = p.failed_streak + 1 if live.state == "failed" else 0
        engine.results.record(live)
        view = engine.view(live)
        engine.publish(RoundRecovered(view, current=False,
                                      estimate=live.estimate_view(view, engine.cfg)))
        last = live
    return last


def resume(engine: RoundEngine, live: LiveRound) -> None:
    """Make the last unfinished round current again with its committed submissions."""
    live.estimator = engine.estimator(live.r_prior)
    for s in engine.store.submissions(live.round_id):
        live.add(serde.decode_submission(s.payload), s.received_at)
    log.info("[Engine] resuming round %d (%s) with %d committed submissions",
             live.round_id, live.state, len(live.subs))
    engine.progress.current = live
    if live.state == "decoding" or len(live.subs) >= engine.cfg.n:
        live.state = "collecting"
        engine.spawn(engine.close_round(live, "recovered"))
    elif live.subs:  # collecting (or open when its row's update did not land)
        live.state = "collecting"
        if live.first_at is None:
            live.first_at = min(a.received_at for a in live.arrivals())
        live.deadline = time.time() + engine.cfg.round_timeout
        engine.arm_deadline(live)
    engine.publish(RoundRecovered(engine.view(live), current=True))


def next_state(engine: RoundEngine, last: LiveRound | None) -> np.ndarray:
    """The global state the next round starts from."""
    if last is None:
        return np.asarray(engine.task.initial_state(engine.cfg.seed))
    return np.asarray(last.next_state if last.next_state is not None else last.global_state)
