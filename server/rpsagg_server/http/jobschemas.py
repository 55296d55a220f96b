"""What the jobs API documents: a job's settings as the request body (from
:class:`~rpsagg_server.settings.jobspec.JobSpec`), a job as answered, the one error body of every
refusal, and the bearer scheme of ``--http-tokens`` and ``--admin-tokens``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from rpsagg_server.http.auth import protected
from rpsagg_server.jobs.catalog import JOB_ID
from rpsagg_server.settings.jobspec import JobSpec

#: what each refusal of the API means
ERRORS: dict[int, str] = {
    400: "A bad setting or body, in one line naming it.",
    401: "No usable 'Authorization: Bearer TOKEN' header.",
    403: "A token that is not one of the file's (or not an admin token where one is needed).",
    404: "No such job.",
    409: "A job of that id exists already, or the job has ended.",
    413: "A body above 64 KiB (decided from Content-Length before it is read).",
    503: "Too many jobs queued, or the catalog could not record the change: retry later.",
}
#: the name of the bearer scheme in the OpenAPI
BEARER = "bearer"


class ErrorBody(BaseModel):
    """Every refusal's body."""

    detail: str = Field(description="Why, in one line.")


class JobInfo(BaseModel):
    """A job as ``GET /api/jobs/{id}`` shows it."""

    id: str
    default: bool = Field(description="Whether it is the job the server's flags started.")
    kind: str = Field(description="default (the flags' job), created (over this API) or past "
                      "(a finished default job moved to <db>.jobs/).")
    state: str = Field(description="waiting (for its first join's d: --d 0), queued, "
                       "running, done, failed or cancelled.")
    failure: str = Field(description="Why it failed or was cancelled (empty otherwise).")
    created_at: float | None = Field(description="Unix seconds.")
    started_at: float | None
    finished_at: float | None
    settings: dict[str, Any] = Field(description="Every job setting (the defaults filled in).")
    rounds: int = Field(description="Rounds the job runs (0: until stopped).")
    rounds_done: int
    bytes_up: int = Field(description="Serialized Submit requests of its rounds.")
    payload_bytes: int = Field(description="Seeds, values and indices of its rounds.")
    last_rel_error: float | None = Field(
        description="The estimated relative error of its last done round.")
    clients: int = Field(description="Clients that joined it.")
    memory_estimate: int | None = Field(
        default=None, description="Bytes it is taken to need (open jobs).")


def job_body_schema() -> dict[str, Any]:
    """The request body of ``POST /api/jobs``: a JSON object of :class:`JobSpec`'s fields,
    each optional (its default otherwise), plus ``id``."""
    schema = TypeAdapter(JobSpec).json_schema()
    schema["properties"]["id"] = {
        "type": "string", "pattern": JOB_ID.pattern,
        "description": "The job's id (default: j and 8 random hex digits); 'default' and "
        "'catalog' are reserved."}
    schema["description"] = ("A job's settings: the job flags of rpsagg-server in snake case; "
                             "{} takes every default.")
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that refuses with ``codes``."""
    return {code: {"model": ErrorBody, "description": ERRORS[code]} for code in codes}


def add_security(schema: dict[str, Any]) -> dict[str, Any]:
    """The bearer scheme in ``schema``'s components, required by every operation whose path
    :func:`~rpsagg_server.http.auth.protected` guards (when the server has tokens)."""
    schema.setdefault("components", {})["securitySchemes"] = {BEARER: {
        "type": "http", "scheme": "bearer",
        "description": "A token of --http-tokens (reading) or --admin-tokens (reading, and "
        "creating and cancelling jobs); a server without token files takes no header."}}
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            op["security"] = [{BEARER: []}] if protected(path) else []
    return schema
