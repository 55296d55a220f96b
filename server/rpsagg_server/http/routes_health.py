"""``GET /healthz`` (the process answers), ``GET /readyz`` (writes commit, gRPC serves, beta
ready)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from rpsagg_server.http import schemas
from rpsagg_server.http.deps import StateDep

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=schemas.Health, summary="Liveness")
def healthz() -> schemas.Health:
    """200 whenever the process is serving HTTP."""
    return schemas.Health(status="ok")


@router.get("/readyz", response_model=schemas.Readiness, summary="Readiness",
            responses={503: {"model": schemas.Readiness, "description": "Not ready"}})
def readyz(state: StateDep, response: Response) -> schemas.Readiness:
    """200 when every readiness check passes (``database``: the last write transaction, or
    the writer's idle heartbeat every 2 s, committed; ``grpc``: the gRPC server is serving;
    ``beta``: beta for n has been computed); 503 with the failing checks otherwise, or when
    none is registered."""
    checks = state.readiness()
    ready = bool(checks) and all(checks.values())
    if not ready:
        response.status_code = 503
    return schemas.Readiness(ready=ready, checks=checks)
