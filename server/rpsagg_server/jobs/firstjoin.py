"""A ``--d 0`` job (with ``--data external``): open, but waiting for its first join to say d.

A server that is not told d cannot build its job (the estimator, the wire profile, the
request size limit and beta all depend on it), so its default job starts in the state
``waiting`` (what ``GET /api/jobs/default`` shows), served by the server's one gRPC server
and servicer, with its TLS, tokens and connection bounds:

- GetRound describes the job with ``d = 0`` and no round;
- the first Join that says its d (``JoinRequest.d``, which ``rpsagg-client --vectors``
  sends) fixes d: it is committed to the database (meta ``learned_d``) before anyone is
  told, and that join, like every call until the job has opened with that d, is refused as
  :class:`~rpsagg_server.domain.errors.NotReady` ("the job starts with d = ..."), which clients
  retry;
- a join without d, with d below k or with d above ``--max-d`` (the largest d the server
  may allocate for) is refused and fixes nothing; the other calls are not ready while the
  job waits. With ``--tokens`` only an authenticated join reaches this.

Then the job opens (:class:`~rpsagg_server.jobs.jobhost.JobHost`) and is a job like any
other, d fixed: a join whose d differs is an
:class:`~rpsagg_server.domain.errors.InvalidRequest`. A restart on the same database
reads ``learned_d`` back (:func:`learned_config`) and opens the job at once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import NoReturn

from rpsagg.tasks import make_task
from rpsagg_server.domain.errors import InvalidRequest, NotReady, PreconditionFailed, StartupError
from rpsagg_server.rounds.results import announced_k, no_round_info
from rpsagg_server.settings.serverconfig import BYTES_PER_COORDINATE, ServerConfig, memory_limit
from rpsagg_server.store.database import Store
from rpsagg_server.store.jobnumber import job_id
from rpsagg_wire.v1.serde import RoundInfo

log = logging.getLogger("rpsagg.server")
#: the meta key of the d the first join fixed
LEARNED_KEY = "learned_d"


def learned_config(cfg: ServerConfig) -> ServerConfig:
    """``cfg`` with the d an earlier start learned from its first join (as given when
    ``--d`` is not 0, or when nothing was learned yet); :class:`StartupError` when that d is
    above ``--max-d``."""
    if cfg.d:
        return cfg
    store = Store(cfg.db)
    try:
        saved = store.get_meta(LEARNED_KEY)
    finally:
        store.close()
    if saved is None:
        return cfg
    if int(saved) > cfg.d_limit:
        raise StartupError(f"--db {cfg.db}: its job's d = {saved} (from its first "
                           f"join) is above --max-d {cfg.d_limit}")
    log.info("[Server] d = %s, learned from the first join of this job", saved)
    return replace(cfg, d=int(saved))


class FirstJoin:
    """A job waiting for its d: GetRound says d = 0; the first Join with a d fixes it.

    Parameters
    ----------
    job : str
        The job's id.
    cfg : ServerConfig
        Its configuration, ``d = 0``.
    """

    def __init__(self, job: str, cfg: ServerConfig) -> None:
        self.id = job
        self.cfg = cfg
        self.store = Store(cfg.db)
        #: resolves to the d the first join fixed (durably)
        self.learned: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._taking = False
        self.m = make_task(cfg.task, 1, cfg.params).m
        self.max_d = cfg.d_limit
        self.job_id = job_id(self.store)
        log.info("[Server] job %s takes d from the first client's join (at most --max-d "
                 "%d%s)", job, self.max_d, "" if cfg.max_d else
                 f", automatic: {BYTES_PER_COORDINATE} bytes per coordinate within a "
                 f"quarter of {memory_limit() / 2**30:.1f} GiB")

    def not_ready(self) -> NotReady:
        """What every call but Join and GetRound is answered while the job waits."""
        if self.learned.done() and not self.learned.cancelled():
            return NotReady(f"the job starts with d = {self.learned.result()}; retry")
        return NotReady("the job has not started: it takes d from the first client's join")

    async def join(self, client_id: str, d: int) -> NoReturn:
        """The first join that says its d fixes it; every join is then refused (retried).
        ``client_id`` is checked and authorized by the caller."""
        if self._taking or self.learned.done():
            raise self.not_ready()
        if d == 0:
            raise PreconditionFailed("this job takes d from the first client's join, and this "
                                     "join says none (JoinRequest.d; rpsagg-client --vectors "
                                     "sends it)")
        if d < announced_k(self.cfg, self.cfg.k):
            raise InvalidRequest(f"d = {d} (client {client_id!r}) "
                                 f"is below the job's k = {self.cfg.k}")
        if d > self.max_d:
            raise InvalidRequest(f"d = {d} (client {client_id!r}) "
                                 f"is above the server's --max-d {self.max_d}")
        self._taking = True
        try:  # durable before anyone is told: a restart keeps this d
            await asyncio.to_thread(self.store.put_meta, LEARNED_KEY, str(d))
        finally:
            self._taking = False
        log.info("[Server] d = %d from client %s's join", d, client_id)
        self.learned.set_result(d)
        raise self.not_ready()

    def round_info(self) -> RoundInfo:
        """GetRound's answer: the job with d = 0 and no round."""
        return no_round_info(self.cfg, self.m, d=0, job_id=self.job_id)

    def close(self) -> None:
        """Close its store (the job opens its own on the same database)."""
        if not self.learned.done():
            self.learned.cancel()
        self.store.close()
