"""``GET /api/jobs``: the finished jobs of earlier starts (``--on-finished-job new``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from rpsagg_server.http.deps import StateDep

router = APIRouter(prefix="/api", tags=["jobs"])


@router.get("/jobs", summary="Past jobs of this database")
def get_jobs(state: StateDep) -> dict[str, Any]:
    """The jobs that earlier starts of this server moved to ``<db>.jobs/`` when they found
    them finished, newest first: the archive's file name, done or failed (and why), the
    job's settings, rounds (done of all), when its first and last rounds opened, and how
    many clients joined (the server's catalog lists them; the read model holds them from the
    job's start). The current job is ``/api/status``."""
    return {"past_jobs": list(state.past_jobs)}
