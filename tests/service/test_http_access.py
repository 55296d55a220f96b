"""Read access on a real server with ``--http-tokens``: every route that serves a job's data
or metrics needs the token, whatever prefix reaches it (the default job's paths, ``/jobs/{id}/``
and ``/api/jobs/{id}/``), and the open paths stay open.

The routes are walked from the apps themselves (a job's app as :func:`create_app` builds it,
its hidden routes included, and the service's OpenAPI as the server serves it), so a route
added later is walked too. What is open is written here, not read from the product.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_util import Service, call
from prometheus_client import CollectorRegistry
from service_util import wait_until
from starlette.routing import Mount, Route

from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.http.app import create_app
from rpsagg_server.http.service import create_service_app
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.settings.serverconfig import ServerConfig

pytestmark = pytest.mark.service

READ, ADMIN = "read-tok", "admin-tok"
#: the paths a reader without a token may have: probes, the page, the API's schema
OPEN = {"/", "/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/openapi.json",
        "/static/dashboard.js"}
#: the small job each server runs (one client, one round)
JOB = {"n": 1, "k": 8, "d": 64, "task": "mean", "rounds": 1, "round_timeout": 60}
#: path parameters filled in (round 1 is done by then)
PARAMS = {"round_id": "1", "job_id": "j1"}


def job_paths() -> list[str]:
    """Every GET path of a job's app: its OpenAPI's, and its routes kept out of the schema
    (``/metrics``, the page, ``/static`` as one of its files)."""
    app = create_app(ServerState(ServerConfig(insecure=True).public_dict()),
                     CollectorRegistry())
    paths = [p for p, ops in app.openapi()["paths"].items() if "get" in ops]
    for route in app.routes:
        if isinstance(route, Mount):
            paths.append(route.path + "/dashboard.js")
        elif isinstance(route, Route) and "GET" in (route.methods or {"GET"}):
            paths.append(route.path)
    return [re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], p) for p in set(paths)]


def test_the_apps_routes_are_their_own(tmp_path: Path) -> None:
    """No route is a router included whole: FastAPI keeps an included router as one nested
    route whose candidates every request checks again (0.2 ms of the server's CPU on each
    ``GET /api/jobs/{id}``); the apps add their routers' routes as their own."""
    job_app = create_app(ServerState(ServerConfig(insecure=True).public_dict()),
                         CollectorRegistry())
    pool = DecodePool(1)
    try:
        host = JobHost(ServerConfig(insecure=True, db=str(tmp_path / "jobs.db")), pool)
        service_app = create_service_app(host)
        for app in (job_app, service_app):
            nested = [r for r in app.routes if not isinstance(r, (Route, Mount))]
            assert not nested, nested
        assert {"/api/jobs", "/api/jobs/{job_id}"} <= {
            r.path for r in service_app.routes if isinstance(r, Route)}
    finally:
        host.catalog.close()
        pool.close()


def reached(path: str, job: str) -> list[str]:
    """The URLs that reach a job's ``path``: as the default job's (for ``default``), under
    ``/jobs/{id}`` and, for its API, under ``/api/jobs/{id}``."""
    out = [f"/jobs/{job}{path}"]
    if job == "default":
        out.append(path)
    if path.startswith("/api/"):
        out.append(f"/api/jobs/{job}/{path[len('/api/'):]}")
    return out


def _flags(tmp: Path) -> tuple[str, ...]:
    (tmp / "read").write_text(READ + "\n")
    (tmp / "admin").write_text(ADMIN + "\n")
    return ("--insecure", "--http-tokens", str(tmp / "read"), "--admin-tokens",
            str(tmp / "admin"))


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Service]:
    """A server with read and admin tokens, its default job and job j1 each done with one
    round."""
    default = tuple(f"--{k.replace('_', '-')}={v}" for k, v in JOB.items())
    svc = Service(tmp_path, "acl", *_flags(tmp_path), default=default)
    try:
        status, job = svc.api("/api/jobs", "POST", {**JOB, "id": "j1"}, token=ADMIN)
        assert status == 201, job
        clients = [svc.client("c0", "--insecure"), svc.client("c1", "--insecure", "--job", "j1")]
        for proc in clients:
            assert proc.wait(timeout=60) == 0
        wait_until(lambda: all(svc.api(f"/api/jobs/{j}", token=READ)[1]["state"] == "done"
                               for j in ("default", "j1")), 30, "both jobs done")
        yield svc
    finally:
        svc.close()


def _status(svc: Service, url: str, header: str | None) -> int:
    req = urllib.request.Request(svc.url + url)
    if header is not None:
        req.add_header("Authorization", header)
    return _status_of(req)


def _status_of(req: urllib.request.Request) -> int:
    """The status of one request (redirects not followed)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=20) as res:
            res.read()
            return int(res.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


@pytest.mark.timeout(180)
def test_every_route_of_every_job_needs_the_token_whatever_prefix(guarded: Service) -> None:
    svc = guarded
    paths = job_paths()
    assert {"/api/status", "/api/rounds/1/estimate", "/metrics", "/api/rounds/export.csv"} \
        <= set(paths), paths
    urls = [(url, path) for job in ("default", "j1") for path in paths
            for url in reached(path, job)]
    # the reproductions, by name: each served a job's data without a token
    for url in ("/jobs/default/api/status", "/jobs/j1/api/rounds/1/estimate?format=npy",
                "/jobs/j1/api/rounds/1/estimate?format=csv", "/jobs/j1/api/rounds/export.csv",
                "/jobs/j1/metrics", "/jobs/default/metrics"):
        urls.append((url, "/" + url.split("?")[0].split("/", 3)[3]))
    refused = []
    for url, path in urls:
        if path in OPEN:
            assert _status(svc, url, None) == 200, url
            continue
        got = (_status(svc, url, None), _status(svc, url, "Bearer wrong"),
               _status(svc, url, f"Bearer {READ}"), _status(svc, url, f"Bearer {ADMIN}"))
        assert got == (401, 403, 200, 200), (url, got)
        refused.append(url)
    assert len(refused) >= 3 * len(paths) - 2 * len(OPEN), refused


@pytest.mark.timeout(180)
def test_every_route_of_the_service_needs_the_token(guarded: Service) -> None:
    svc = guarded
    status, schema = call(svc.url + "/openapi.json")
    assert status == 200
    for template, ops in schema["paths"].items():
        url = re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], template)
        for method in ops:
            if method.upper() == "GET":
                want = (401, 403, 200) if template not in OPEN else (200, 200, 200)
                got = tuple(call(svc.url + url, token=tok)[0] for tok in (None, "wrong", READ))
                assert got == want, (url, got)
            else:  # writes: the read token reads, it does not create or cancel
                assert call(svc.url + url, method.upper(), {})[0] == 401, (method, url)
                assert call(svc.url + url, method.upper(), {}, token=READ)[0] == 403, url
    # a job that does not exist says so only to a reader with a token
    assert call(svc.url + "/jobs/nope/api/status")[0] == 401
    assert call(svc.url + "/jobs/nope/api/status", token=READ)[0] == 404


@pytest.mark.timeout(120)
def test_a_server_without_a_default_job_guards_its_paths_too(tmp_path: Path) -> None:
    svc = Service(tmp_path, "nodef", *_flags(tmp_path), "--no-default-job", default=())
    try:
        for url in ("/api/status", "/api/rounds", "/metrics", "/api/jobs", "/jobs/x/api/status"):
            assert call(svc.url + url)[0] == 401, url
        assert call(svc.url + "/api/status", token=READ)[0] == 404
        assert call(svc.url + "/healthz")[0] == 200
    finally:
        svc.close()

