"""``GET /api/clients``: every joined client's activity."""

from __future__ import annotations

from fastapi import APIRouter

from rpsagg_server.http import schemas
from rpsagg_server.http.deps import StateDep

router = APIRouter(prefix="/api", tags=["clients"])


@router.get("/clients", response_model=list[schemas.ClientActivity],
            summary="Joined clients and what each did")
def list_clients(state: StateDep) -> list[schemas.ClientActivity]:
    """Every joined client in index order: id, index, when it joined, when it was last seen
    (latest accepted submission), rounds contributed and missed, bytes sent, and whether it
    is a straggler (missed the latest finished round)."""
    return [schemas.from_client_stats(c) for c in state.client_stats()]
