"""``GET /api/status``: configuration, current round, clients, uptime, spec versions."""

from __future__ import annotations

import time

from fastapi import APIRouter

from rpsagg_server.http import schemas
from rpsagg_server.http.deps import StateDep

router = APIRouter(prefix="/api", tags=["status"])


@router.get("/status", response_model=schemas.Status, summary="What the server is doing now")
def get_status(state: StateDep) -> schemas.Status:
    """Configuration (scheme, transform, n, k, d, task, ...), the current round and its
    state, the clients that joined, the task's progress (and why the job failed, if it
    did), the start-up computation of beta, uptime and spec versions."""
    current = state.current_round()
    newest = state.rounds(limit=1)
    clients = state.clients()
    job = state.job()
    beta = state.beta()
    start = state.task_metrics(0)  # the starting state, before round 1
    return schemas.Status(
        config=schemas.from_config(state.config()),
        current_round=None if current is None else schemas.from_round(
            current, state.task_metrics(current.round_id)),
        latest_round=schemas.from_round(newest[0], state.task_metrics(newest[0].round_id))
        if newest else None,
        clients_joined=len(clients),
        clients=[schemas.from_client(c) for c in clients],
        job=None if job is None else schemas.from_job(job),
        beta=None if beta is None else schemas.from_beta(beta, time.time()),
        task_metrics_note=state.task_metrics_note(),
        task_start=None if start is None else schemas.from_task(start),
        uptime_seconds=state.uptime_seconds(),
        started_at=state.started_at,
        versions=schemas.versions(),
    )
