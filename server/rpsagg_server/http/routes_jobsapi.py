"""The jobs API of a standing service (``/api/jobs``): list, create, describe and cancel the
server's jobs; creating and cancelling only for an admin (:class:`AdminGuard`).

The routes read the service app's ``state.host`` (the :class:`~rpsagg_server.jobs.jobhost.JobHost`)
and ``state.admin_guard`` (an :class:`AdminGuard`), both set by
:func:`~rpsagg_server.http.service.create_service_app`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from rpsagg_server.domain.jobstate import ENDED
from rpsagg_server.http.auth import HttpTokens, verdict
from rpsagg_server.http.bodies import MAX_BODY, parse_settings, read_body
from rpsagg_server.http.jobschemas import JobInfo, job_body_schema, refusals
from rpsagg_server.jobs.jobhost import JobHost

router = APIRouter()


class AdminGuard:
    """Who may create and cancel jobs: a bearer admin token, or anyone on ``--insecure``."""

    def __init__(self, tokens: HttpTokens | None, insecure: bool) -> None:
        self.tokens = tokens
        self.insecure = insecure

    def check(self, request: Request) -> None:
        """Raise ``HTTPException`` 401/403 unless the request may change jobs."""
        if self.tokens is None:
            if self.insecure:
                return
            raise HTTPException(403, "creating and cancelling jobs needs --admin-tokens on "
                                "the server (or --insecure)")
        status = verdict(self.tokens, request.scope["headers"])
        if status == 401:
            raise HTTPException(401, "an admin token is needed: Authorization: Bearer TOKEN",
                                headers={"WWW-Authenticate": 'Bearer realm="rpsagg-admin"'})
        if status == 403:
            raise HTTPException(403, "not an admin token")


def _host(request: Request) -> JobHost:
    """The jobs the service app serves."""
    host: JobHost = request.app.state.host
    return host


def _check_admin(request: Request) -> None:
    """Raise ``HTTPException`` 401/403 unless the request may change jobs."""
    guard: AdminGuard = request.app.state.admin_guard
    guard.check(request)


@router.get("/api/jobs", tags=["jobs"], summary="Every job of this server",
            responses=refusals(401, 403))
def list_jobs(request: Request) -> dict[str, Any]:
    """From the catalog: the default job first, then the created jobs oldest first;
    ``past_jobs``: the finished jobs earlier starts moved to ``<db>.jobs/``
    (``--on-finished-job new``), newest first (each is also ``/api/jobs/{id}``, id its
    file's stem); ``retention``: what the server keeps of the ended created jobs (its
    ``--keep-finished-jobs`` and ``--keep-finished-for`` in seconds, how many it keeps now,
    their databases' bytes, when the oldest ended)."""
    host = _host(request)
    return {"jobs": host.list(), "past_jobs": host.past_jobs(),
            "retention": host.retention.kept()}


@router.post("/api/jobs", tags=["jobs"], status_code=201, summary="Create a job",
             openapi_extra={"requestBody": job_body_schema()},
             responses={201: {"model": JobInfo, "description": "Recorded (durably); it "
                              "starts when a slot is free.", "headers": {"Location": {
                                  "description": "/api/jobs/{id}",
                                  "schema": {"type": "string"}}}},
                        **refusals(400, 401, 403, 409, 413, 503)})
async def create_job(request: Request) -> JSONResponse:
    """The body is a JSON object of job settings (the job flags of ``rpsagg-server`` in
    snake case). ``201`` with the job once it is recorded (durably); ``400`` with one
    line naming a bad setting."""
    _check_admin(request)
    settings = parse_settings(await read_body(request, MAX_BODY))
    job = await _host(request).create(settings)  # a refusal: answered by http.errors
    return JSONResponse(job, status_code=201,
                        headers={"Location": f"/api/jobs/{job['id']}"})


@router.get("/api/jobs/{job_id}", tags=["jobs"], summary="One job",
            responses={200: {"model": JobInfo}, **refusals(401, 403, 404)})
def get_job(request: Request, job_id: str) -> dict[str, Any]:
    """The job's state, settings, progress and bytes."""
    try:
        return _host(request).describe(job_id)
    except KeyError:
        raise HTTPException(404, f"no job {job_id!r}") from None


async def _cancel(request: Request, job_id: str) -> dict[str, Any]:
    _check_admin(request)
    return await _host(request).cancel(job_id)  # a refusal: answered by http.errors


@router.post("/api/jobs/{job_id}/cancel", tags=["jobs"], summary="Cancel a job",
             responses={200: {"model": JobInfo}, **refusals(401, 403, 404, 409, 503)})
async def cancel_job(request: Request, job_id: str) -> dict[str, Any]:
    """Cancel a queued or running job: recorded durably, then its current round fails
    (what it had committed stays stored). ``409`` when it has ended."""
    return await _cancel(request, job_id)


@router.delete("/api/jobs/{job_id}", tags=["jobs"],
               summary="Cancel a job, or remove an ended one's data",
               responses={200: {"model": JobInfo}, **refusals(401, 403, 404, 409, 503)})
async def delete_job(request: Request, job_id: str) -> dict[str, Any]:
    """A queued or running job: the same as ``POST /api/jobs/{job_id}/cancel`` (its record
    and data stay). An ended created job: its database and its record are removed (the
    answer is the job as it was; ``GET`` then answers 404), as ``--keep-finished-jobs``
    does to the oldest."""
    _check_admin(request)
    host = _host(request)
    try:
        job = host.describe(job_id)
    except KeyError:
        raise HTTPException(404, f"no job {job_id!r}") from None
    if job["state"] not in ENDED or job["kind"] != "created":
        return await _cancel(request, job_id)
    await host.retention.remove(job_id, "deleted over the API")  # a refusal: http.errors
    return job
