"""``GET /api/rounds`` (newest first, paged with ``before``) and ``GET /api/rounds/{id}``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from rpsagg_server.http import schemas
from rpsagg_server.http.deps import StateDep

router = APIRouter(prefix="/api/rounds", tags=["rounds"])

MAX_LIMIT = 1000


@router.get("", response_model=schemas.RoundPage, summary="Recent rounds, newest first")
def list_rounds(
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Rounds per page.")] = 50,
    before: Annotated[int | None, Query(
        ge=1, description="Only rounds with an id below this (the previous page's "
        "``next_before``).")] = None,
) -> schemas.RoundPage:
    """A page of rounds, newest first; follow ``next_before`` for older ones."""
    views = state.rounds()
    total = len(views)
    if before is not None:
        views = [v for v in views if v.round_id < before]
    page = views[:limit]
    more = len(views) > limit
    return schemas.RoundPage(
        rounds=[schemas.from_round(v, state.task_metrics(v.round_id)) for v in page],
        total=total,
        next_before=page[-1].round_id if more else None,
    )


@router.get("/{round_id}", response_model=schemas.Round, summary="One round in detail",
            responses={404: {"description": "No round with this id"}})
def get_round(
    state: StateDep,
    round_id: Annotated[int, Path(ge=1, description="Round id (rounds count from 1).")],
) -> schemas.Round:
    """State and timestamps, clients expected/arrived/missing, bytes (payload, wire, raw
    float32), every arrival (client, time, bytes), decode seconds, transform, beta, R_hat
    and, in evaluation mode, the squared and relative errors of the estimate and of the
    Rand-k / Rand-k-Spatial shadows and the task's progress after the round."""
    view = state.round_detail(round_id)
    if view is None:
        newest = state.rounds(limit=1)
        known = f"rounds 1..{newest[0].round_id} exist" if newest else "no round exists yet"
        raise HTTPException(status_code=404, detail=f"round {round_id} not found ({known})")
    return schemas.from_round(view, state.task_metrics(round_id))
