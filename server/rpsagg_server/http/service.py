"""The dashboard of a standing service: the jobs API, one app per job, and ``/metrics`` of
every job.

Paths:

- ``GET /api/jobs``: every job (``{"jobs": [...], "past_jobs": [...]}``); ``POST /api/jobs``
  creates one (``201 {"id": ...}``; ``400`` with one line naming a bad setting);
  ``GET /api/jobs/{id}``; ``POST /api/jobs/{id}/cancel`` or ``DELETE /api/jobs/{id}``.
  Creating and cancelling needs an admin token (``--admin-tokens``) unless the server runs
  ``--insecure``.
- ``/api/jobs/{id}/...``: the job's own API (``/api/jobs/{id}/rounds`` is that job's
  ``/api/rounds``, and so on); ``/jobs/{id}/``: its page.
- ``/metrics``: the series of the running jobs and of the last ended ones, each with a
  label ``job`` (the default job's is ``default``), those of the jobs ended before them
  summed (:mod:`~rpsagg_server.http.jobmetrics`), and the server-wide ones (connections,
  body cache) without it.
- Every other path is the default job's app, as on a server of one job (``/api/status``,
  ``/api/rounds``, ``/``...); without a default job, ``/`` is the page (the job list) and
  the default job's API answers 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Info
from starlette.types import Receive, Scope, Send

import rpsagg
from rpsagg_server.domain.errors import DomainError
from rpsagg_server.http import errors, routes_jobsapi
from rpsagg_server.http.app import add_routes, closing_lifespan, create_app, mount_page
from rpsagg_server.http.auth import Gate, HttpTokens
from rpsagg_server.http.errors import http_status
from rpsagg_server.http.jobmetrics import JobsCollector
from rpsagg_server.http.jobschemas import add_security
from rpsagg_server.http.renders import DEFAULT_MAX_BYTES, BodyCache, BodyCacheCollector
from rpsagg_server.http.routes_jobsapi import AdminGuard
from rpsagg_server.http.schemas import versions
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.jobs.jobruntime import JobRuntime
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.rounds.archive import ArchiveCollector


def _job_app(rt: JobRuntime, bodies: BodyCache) -> None:
    """Build a job's app and registry (``rt.app``, ``rt.registry``)."""
    registry = CollectorRegistry()
    registry.register(ArchiveCollector(rt.engine.archive))
    rt.registry = registry
    rt.app = create_app(rt.state, registry, bodies=bodies, job=rt.id)


def create_service_app(host: JobHost, registry: CollectorRegistry | None = None,
                       admin_tokens: HttpTokens | None = None) -> FastAPI:
    """The HTTP app of a server and its jobs.

    Parameters
    ----------
    host : JobHost
        The server's jobs (their apps are built as they open).
    registry : CollectorRegistry, optional
        The server-wide registry ``/metrics`` exposes (the jobs' series are added to it);
        default: the host's (:attr:`JobHost.registry`, where the server adds its own).
    admin_tokens : HttpTokens, optional
        Who may create and cancel jobs; without them only an ``--insecure`` server lets
        anyone do it.

    Returns
    -------
    FastAPI
        An app whose routing sends ``/api/jobs/{id}/...``, ``/jobs/{id}/...`` and the
        default job's paths to the jobs' own apps (module docstring).
    """
    registry = host.registry if registry is None else registry
    cache = BodyCache(host.cfg.http_body_cache_bytes if host.cfg.http_body_cache_bytes
                      is not None else DEFAULT_MAX_BYTES)
    registry.register(BodyCacheCollector(cache))
    registry.register(JobsCollector(host))
    build_info(registry)
    for rt in host.jobs.values():
        _job_app(rt, cache)
    host.on_open.append(lambda rt: _job_app(rt, cache))
    app = FastAPI(title="rpsagg server", version=rpsagg.__version__,
                  summary="Jobs of a Rand-Proj-Spatial aggregation server: create, list, "
                  "cancel; each job's rounds under /api/jobs/{id}/.",
                  lifespan=closing_lifespan(cache))
    app.state.host = host
    app.state.registry = registry
    app.state.bodies = cache
    app.state.admin_guard = AdminGuard(admin_tokens, host.cfg.insecure)
    errors.install(app)
    # /docs: the jobs API and a job's own API (its paths as the default job's; each is also
    # under /api/jobs/{id}/), from a template app that is never served
    template = create_app(ServerState(host.cfg.public_dict()), CollectorRegistry(),
                          bodies=cache)
    app.openapi = merged_openapi(app, template)  # type: ignore[method-assign]
    add_routes(app, routes_jobsapi.router)
    mount_page(app, registry)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        return JSONResponse({"ready": True, "checks": {}})

    return app


def build_info(registry: CollectorRegistry) -> None:
    """``rpsagg_build_info{version, seed_spec, protocol} 1`` on ``registry``: the release and
    the specs it speaks (what ``/api/status`` says under ``versions``)."""
    v = versions()
    Info("rpsagg_build", "The rpsagg release and the specs it speaks", registry=registry).info(
        {"version": v.rpsagg, "seed_spec": v.seed_spec, "protocol": v.protocol})


def merged_openapi(app: FastAPI, template: FastAPI) -> Callable[[], dict[str, Any]]:
    """The service's ``openapi()``: its own paths (the jobs API) with a job's, those of
    ``template`` (the service's win where both have a path), the bearer scheme added;
    built once, on the first call, and kept in ``app.openapi_schema``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            own = get_openapi(
                title=app.title, version=app.version, summary=app.summary,
                description="Each job's API (below, as the default job's paths) is also "
                "served under `/api/jobs/{id}/` for job `id`, its page under `/jobs/{id}/`.",
                routes=app.routes)
            job = template.openapi()
            # the service's paths win (its /api/jobs lists every job, with the past ones)
            own["paths"] = {**job.get("paths", {}), **own.get("paths", {})}
            schemas = {**job.get("components", {}).get("schemas", {}),
                       **own.get("components", {}).get("schemas", {})}
            if schemas:
                own.setdefault("components", {})["schemas"] = schemas
            app.openapi_schema = add_security(own)
        return app.openapi_schema

    return openapi


_OWN = ("/api/jobs", "/metrics", "/static/", "/docs", "/openapi.json")


class JobRouter:
    """ASGI: sends each request to the app that answers it (module docstring), the token
    check (:class:`~rpsagg_server.http.auth.Gate`) made on the path that app serves.

    Parameters
    ----------
    service : FastAPI
        The service's own app (:func:`create_service_app`).
    host : JobHost
        The jobs, whose apps answer their paths.
    tokens : HttpTokens, optional
        ``--http-tokens`` (with the admin tokens): who may read; None: everyone.
    """

    def __init__(self, service: FastAPI, host: JobHost,
                 tokens: HttpTokens | None = None) -> None:
        self.service = service
        self.host = host
        self.gate = Gate(tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.service(scope, receive, send)  # lifespan: the service app's
            return
        path: str = scope["path"]
        parts = path.split("/")
        # /api/jobs/{id}/<rest>: the job's /api/<rest> (not cancel: the service's)
        if len(parts) > 4 and parts[1:3] == ["api", "jobs"] and parts[4] != "cancel":
            await self._forward(parts[3], "/api/" + "/".join(parts[4:]), scope, receive,
                                send)
            return
        if len(parts) > 3 and parts[1] == "jobs":  # /jobs/{id}/<rest>: the job's page
            rest = "/" + "/".join(parts[3:])
            if rest.startswith("/static/") or rest == "/":
                await self._serve(rest, scope, receive, send)
                return
            await self._forward(parts[2], rest, scope, receive, send)
            return
        if path == "/jobs" or (len(parts) == 3 and parts[1] == "jobs"):
            await _redirect(path.rstrip("/") + "/" if path != "/jobs" else "/", send)
            return
        default = self.host.default()
        if path == "/" or path.startswith(_OWN):
            await self._serve(path, scope, receive, send)
        elif default is not None:
            await self._forward(default.id, path, scope, receive, send)
        elif path in ("/healthz", "/readyz"):
            await self._serve(path, scope, receive, send)
        elif self.host.default_id is not None:  # waiting for its d: says so
            await self._forward(self.host.default_id, path, scope, receive, send)
        elif await self.gate.admit(path, scope, send):
            await _json(404, {"detail": "this server has no default job: see /api/jobs"},
                        send)

    async def _serve(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        """The service app's ``path``, behind the token check."""
        if await self.gate.admit(path, scope, send):
            if path != scope["path"]:
                scope = {**scope, "path": path, "raw_path": path.encode()}
            await self.service(scope, receive, send)

    async def _forward(self, job_id: str, path: str, scope: Scope, receive: Receive,
                       send: Send) -> None:
        """Job ``job_id``'s ``path``, behind the token check (made before the job is looked
        up: an unknown job's answer says nothing to a reader without a token)."""
        if not await self.gate.admit(path, scope, send):
            return
        try:
            async with self.host.ended.app_of(job_id) as rt:
                if rt is not None and rt.app is not None:
                    await rt.app({**scope, "path": path, "raw_path": path.encode(),
                                  "root_path": ""}, receive, send)
                    return
        except DomainError as exc:  # an ended job's database could not be read
            await _json(http_status(exc), {"detail": exc.message}, send)
            return
        rec = None
        with suppress(KeyError):
            rec = self.host.describe(job_id)
        detail = (f"no job {job_id!r}" if rec is None else
                  f"job {job_id} is {rec['state']}: it has no rounds yet")
        await _json(404, {"detail": detail}, send)


async def _json(status: int, body: Any, send: Send) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


async def _redirect(location: str, send: Send) -> None:
    await send({"type": "http.response.start", "status": 307,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def create_standing_app(host: JobHost, admin_tokens: HttpTokens | None = None,
                        http_tokens: HttpTokens | None = None) -> JobRouter:
    """The server's dashboard: :func:`create_service_app` behind :class:`JobRouter`
    (``.service`` is the FastAPI app, ``.service.state.registry`` its registry), reading
    behind ``http_tokens`` when given."""
    service = create_service_app(host, admin_tokens=admin_tokens)
    return JobRouter(service, host, http_tokens)


