"""Membership: which clients joined the job, with their stable index.

A join is durable before it is answered: its row is queued on the store's writer, and the
write's outcome decides (a caller that goes away never undoes a join that commits; a write
that fails is refused as unavailable and nothing of it is kept). A client's index is stable
across re-joins and restarts. Publishes :class:`~rpsagg_server.readmodel.events.ClientJoined`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING

from rpsagg_server.domain.errors import (
    InvalidRequest,
    LimitExceeded,
    PreconditionFailed,
    Unavailable,
)
from rpsagg_server.readmodel.events import ClientJoined, Publish
from rpsagg_server.readmodel.views import ClientView
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_server.store.database import Store
from rpsagg_server.store.writer import WriteError
from rpsagg_wire.v1.serde import JoinReply

if TYPE_CHECKING:
    from rpsagg_server.rounds.results import JobProgress

log = logging.getLogger("rpsagg.server")


async def outcome(fut: asyncio.Future[None]) -> None:
    """Wait for a queued write without owning it: cancelling the caller leaves the write (and
    its callbacks) alone; a failed write is :class:`~rpsagg_server.domain.errors.Unavailable` with
    the reason.
    """
    try:
        await asyncio.shield(fut)
    except WriteError as exc:
        raise Unavailable(exc.reason) from None


def ended_refusal(client_id: str, failure: str) -> PreconditionFailed:
    """A new client's join of a job that has ended (``failure``: why it failed, or "")."""
    return PreconditionFailed(f"client {client_id!r} cannot join: the job has ended "
                              f"({'failed: ' + failure if failure else 'done'})")


class Membership:
    """The job's clients: ``clients`` maps each joined client id to its index.

    Parameters
    ----------
    config : ServerConfig
    store : Store
    publish : callable
        The event bus's publish.
    """

    def __init__(self, config: ServerConfig, store: Store, publish: Publish) -> None:
        self.cfg = config
        self.store = store
        self.publish = publish
        self.clients: dict[str, int] = {}
        self._joining: dict[str, tuple[int, asyncio.Future[None]]] = {}
        self._ends: JobProgress | None = None  # refuse_after's

    def refuse_after(self, progress: JobProgress) -> None:
        """From the job's end on (``progress.job_done``) take no new client; a joined one
        re-joins (a created job's: the default job answers late clients ``job_done``)."""
        self._ends = progress

    def recover(self) -> None:
        """Read the joined clients back from the store (start-up)."""
        for cid, idx, joined in self.store.clients():
            self.clients[cid] = idx
            self.publish(ClientJoined(ClientView(cid, idx, joined), recovered=True))

    async def join(self, client_id: str, d: int = 0) -> JoinReply:
        """Register ``client_id``; its index is stable across re-joins and restarts.

        ``d``: the length of the client's vectors, if it says (0): a d other than the
        job's is refused (:class:`~rpsagg_server.domain.errors.InvalidRequest`) before anything is
        recorded.
        """
        if d and d != self.cfg.d:
            raise InvalidRequest(f"client {client_id!r} has vectors of length "
                                 f"{d}; this job's d is {self.cfg.d}")
        if client_id in self.clients:
            idx = self.clients[client_id]
        elif client_id in self._joining:
            idx, fut = self._joining[client_id]
            await outcome(fut)
        elif self._ends is not None and self._ends.job_done:
            raise ended_refusal(client_id, self._ends.job_failure)
        else:
            used = set(self.clients.values()) | {i for i, _ in self._joining.values()}
            if len(used) >= self.cfg.n:
                raise LimitExceeded(
                    f"all n={self.cfg.n} client slots are taken; "
                    f"client {client_id!r} cannot join")
            idx = next(i for i in range(self.cfg.n) if i not in used)
            now = time.time()
            fut = self.store.add_client(client_id, idx, now)
            self._joining[client_id] = (idx, fut)
            fut.add_done_callback(functools.partial(self._joined, client_id, idx, now))
            await outcome(fut)
        c = self.cfg
        hint = c.data if c.data != "synthetic" else f"synthetic:r={c.data_r}"
        return JoinReply(client_index=idx, n=c.n, task=c.task, data_hint=hint,
                         task_params=c.params)

    def _joined(self, client_id: str, idx: int, now: float, fut: asyncio.Future[None]) -> None:
        """The join's write finished (whoever still waits for it)."""
        del self._joining[client_id]
        if fut.exception() is not None:
            return
        self.clients[client_id] = idx
        log.info("[Engine.Join] client %s -> index %d", client_id, idx)
        self.publish(ClientJoined(ClientView(client_id, idx, now)))
