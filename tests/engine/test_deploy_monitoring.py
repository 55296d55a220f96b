"""docker-compose.yml's ``monitoring`` profile: Prometheus and Grafana as users run them.

1. The profile validates (``docker compose --profile monitoring config -q``, Compose v2 as
   ``scripts/engine.sh`` provides it, alone and with
   the TLS override); Prometheus and Grafana are in the profile only; every file they mount
   is in the repository.
2. ``promtool check config`` accepts docker/monitoring/prometheus.yml and it scrapes the
   compose service ``server`` on the port the server's dashboard listens on.
3. The provisioned Grafana dashboard uses the provisioned data source, every query parses as
   PromQL (``promtool check rules``) and names only series the server exports; panels chart
   the estimated error (with its standard error as a band) and none overlap; a variable
   ``job`` (the label every per-job series carries) selects the jobs in every query.
4. A real Prometheus (Debian's ``prometheus``) scrapes a live server on loopback, with the
   scrape job of docker/monitoring/prometheus.yml (``honor_labels``), while client processes
   run a job; the test reads the rpsagg_* series back through Prometheus's HTTP API and
   compares them with the server's own JSON API, creates a second job, and runs every
   dashboard query for the jobs the variable ``job`` finds (both, by their own label).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from engine_util import COMPOSE, COMPOSE_TLS, ROOT, engine, resolve_compose
from http_util import free_port, get_json
from service_util import client_command, kill_all, server_command, wait_port_file

pytestmark = pytest.mark.engine

MONITORING = ROOT / "docker" / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "rpsagg.json"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = MONITORING / "grafana" / "provisioning" / "dashboards" / "rpsagg.yml"

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs Debian's prometheus package (scripts/setup-env.sh test installs it as root)")


def monitoring_config(tmp_path: Path, files: list[Path]) -> dict[str, Any]:
    env_file = tmp_path / ".env"
    env_file.write_text("COMPOSE_PROFILES=monitoring\n")
    return resolve_compose(files, env_file)


def binds(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts of a resolved service: container path -> host path (named volumes are
    left out)."""
    return {vol["target"]: Path(vol["source"]) for vol in service.get("volumes", [])
            if vol["type"] == "bind"}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def job_variable() -> dict[str, Any]:
    """The dashboard's variable ``job``."""
    (var,) = [v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]
              if v["name"] == "job"]
    return var


def variable_metric() -> str:
    """The series whose label values list the jobs: ``label_values(METRIC, job)``."""
    m = re.fullmatch(r"label_values\((rpsagg_\w+), job\)", job_variable()["query"])
    assert m, job_variable()["query"]
    return m.group(1)


def with_jobs(expr: str, jobs: list[str]) -> str:
    """A dashboard query as Grafana sends it for the selected ``jobs`` (a regex of them)."""
    return expr.replace("$job", "|".join(re.escape(j) for j in jobs))


def yaml_load(path: Path) -> Any:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


@pytest.mark.usefixtures("docker_engine")
# -- 1. the compose profile ------------------------------------------------------------------
@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_TLS]], ids=["plain", "tls"])
def test_monitoring_profile_is_valid_and_optional(files: list[Path], tmp_path: Path) -> None:
    cfg = monitoring_config(tmp_path, files)
    services = cfg["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    assert "profiles" not in services["server"] and "profiles" not in services["client"]
    args = ["docker", "compose", "--project-directory", str(ROOT), "--env-file",
            str(tmp_path / ".env"), "--profile", "monitoring"]
    for f in files:
        args += ["-f", str(f)]
    out = subprocess.run([*args, "config", "-q"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env=engine())
    assert out.returncode == 0 and out.stdout == "", out.stderr
    # what they mount is in the repository (compose resolves bind sources to paths)
    assert binds(services["prometheus"]) == {"/etc/prometheus/prometheus.yml": PROMETHEUS_YML}
    assert binds(services["grafana"]) == {
        "/etc/grafana/provisioning": MONITORING / "grafana" / "provisioning",
        "/var/lib/grafana/dashboards": DASHBOARD.parent}
    # published on loopback only by default
    for name, port in (("prometheus", 9090), ("grafana", 3000)):
        (published,) = services[name]["ports"]
        assert (published["host_ip"], published["published"], published["target"]) == (
            "127.0.0.1", str(port), port), published


@pytest.mark.usefixtures("docker_engine")
# -- 2. Prometheus's configuration -----------------------------------------------------------
@needs_prometheus
def test_prometheus_config_scrapes_the_servers_metrics(tmp_path: Path) -> None:
    out = subprocess.run(["promtool", "check", "config", str(PROMETHEUS_YML)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    prom = yaml_load(PROMETHEUS_YML)
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    # the server's label job (per-job series) is kept, not renamed to exported_job
    assert job["honor_labels"] is True
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    services = monitoring_config(tmp_path, [COMPOSE])["services"]
    assert host in services
    assert services[host]["environment"]["RPSAGG_HTTP_PORT"] == port
    assert services[host]["environment"]["RPSAGG_HOST"] == "0.0.0.0"  # reachable by name


@pytest.mark.usefixtures("docker_engine")
# -- 3. Grafana's provisioning and dashboard -------------------------------------------------
@needs_prometheus
def test_grafana_dashboard_queries_parse_and_use_the_provisioned_source(
    tmp_path: Path,
) -> None:
    (ds,) = yaml_load(DATASOURCES)["datasources"]
    services = monitoring_config(tmp_path, [COMPOSE])["services"]
    url = urllib.parse.urlsplit(ds["url"])
    assert url.hostname in services and url.port == 9090 and ds["type"] == "prometheus"
    (provider,) = yaml_load(PROVIDERS)["providers"]
    assert binds(services["grafana"])[provider["options"]["path"]] == DASHBOARD.parent
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "rpsagg" and dash["panels"]
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == ds["uid"], panel["title"]
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == ds["uid"], panel["title"]
    # every query parses: promtool checks them as recording rules
    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(dashboard_exprs())
    ]}]}))
    out = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_dashboard_names_only_series_the_server_exports() -> None:
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families
    from service_util import base_config, in_process_server

    from rpsagg_server.http import create_app

    with in_process_server(base_config()) as srv, TestClient(
            create_app(srv.running.state, CollectorRegistry())) as http:
        text = http.get("/metrics").text
    exported = set()
    for fam in text_string_to_metric_families(text):
        exported.add(fam.name)
        exported |= {s.name for s in fam.samples}
        if fam.type == "counter":
            exported.add(fam.name + "_total")
        if fam.type == "histogram":
            exported |= {fam.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    used = {name for e in dashboard_exprs() for name in re.findall(r"\brpsagg_\w+", e)}
    used.add(variable_metric())
    assert used and used <= exported, used - exported


ESTIMATED = ("rpsagg_round_estimated_relative_error", "rpsagg_round_estimated_squared_error",
             "rpsagg_round_estimated_squared_error_stderr")


def test_grafana_dashboard_charts_the_estimated_error_with_its_band() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    # every metric of the error estimate is charted
    for name in ESTIMATED:
        assert any(re.search(rf"\b{name}\b", t["expr"]) for p in panels
                   for t in p["targets"]), name
    # the band: a series filled down to another series of the same panel
    bands = 0
    for p in panels:
        legends = {t.get("legendFormat") for t in p["targets"]}
        for o in p["fieldConfig"]["overrides"]:
            if o["matcher"]["id"] == "byRegexp":  # a legend with the job's name in it
                assert any(re.fullmatch(o["matcher"]["options"], legend.replace(
                    "{{job}}", "default")) for legend in legends), (p["title"], o)
                continue
            assert o["matcher"]["options"] in legends, (p["title"], o)
            for prop in o["properties"]:
                if prop["id"] == "custom.fillBelowTo":
                    assert prop["value"] in legends, (p["title"], prop)
                    bands += 1
    assert bands >= 1
    # no two panels overlap on Grafana's 24-column grid
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]


def test_grafana_dashboard_selects_jobs_with_its_variable() -> None:
    var = job_variable()
    assert var["type"] == "query" and var["multi"] is True and var["includeAll"] is True
    assert var["datasource"]["uid"] == "rpsagg-prometheus"
    assert var["definition"] == var["query"]
    # a series every job has from its start (rpsagg_current_round is 0 before round 1)
    assert variable_metric() in ("rpsagg_current_round", "rpsagg_clients_connected")
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        for t in p["targets"]:
            # every rpsagg_* selector of the query picks the variable's jobs
            selectors = re.findall(r"\brpsagg_\w+(\{[^}]*\})?", t["expr"])
            assert selectors, (p["title"], t["expr"])
            for labels in selectors:
                assert 'job=~"$job"' in labels, (p["title"], t["expr"])
            # the legend names the job, or the panel is repeated per job and its title does
            if p.get("repeat") == "job":
                assert "$job" in p["title"], p["title"]
            else:
                assert "{{job}}" in t["legendFormat"], (p["title"], t["legendFormat"])
                # an aggregation keeps the label job, so each job is its own series
                for by in re.findall(r"\bby \(([^)]*)\)", t["expr"]):
                    assert "job" in by.replace(" ", "").split(","), (p["title"], t["expr"])


# -- 4. a real Prometheus against a live server ----------------------------------------------
def query(prom: str, expr: str) -> list[dict[str, Any]]:
    """Run an instant query through Prometheus's HTTP API; its result vector."""
    body = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def poll(what: str, fn: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@needs_prometheus
@pytest.mark.timeout(240)
def test_real_prometheus_scrapes_a_live_server(tmp_path: Path) -> None:
    n, rounds = 3, 3
    http_port, prom_port = free_port(), free_port()
    port_file = tmp_path / "grpc-port"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = subprocess.Popen(server_command([
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port",
            str(http_port), "--n", str(n), "--k", "16", "--d", "64", "--task",
            "power-iteration", "--data", "synthetic", "--data-r", "2", "--rounds",
            str(rounds), "--round-timeout", "60", "--db", str(tmp_path / "server.db"),
            "--eval", "--linger", "-1", "--port-file", str(port_file),
        ]), stderr=subprocess.PIPE)
        procs.append(server)
        grpc_port = wait_port_file(port_file, server)
        # the repository's scrape job (honor_labels), scraping this server every second
        (scrape,) = yaml_load(PROMETHEUS_YML)["scrape_configs"]
        scrape["static_configs"] = [{"targets": [f"127.0.0.1:{http_port}"]}]
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [scrape],
        }))
        prometheus = subprocess.Popen([
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(prometheus)
        prom = f"http://127.0.0.1:{prom_port}"
        clients = [subprocess.Popen(client_command([
            "--server", f"127.0.0.1:{grpc_port}", "--client-id", f"client-{i}", "--insecure",
            "--quiet"]), stderr=subprocess.PIPE) for i in range(n)]
        procs += clients
        for c in clients:
            _, err = c.communicate(timeout=150)
            assert c.returncode == 0, err.decode()[-2000:]

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{prom}/-/ready", timeout=5) as res:
                    return bool(res.status == 200)
            except OSError:
                assert prometheus.poll() is None, prometheus.communicate()[1].decode()[-2000:]
                return False

        poll("Prometheus ready", ready)
        # a scrape after the last round finished (the server's state changes atomically on
        # its event loop, so that scrape also holds the last round's gauges)
        poll("every round done in Prometheus", lambda: [
            r for r in query(prom, 'rpsagg_rounds_total{state="done"}')
            if float(r["value"][1]) == rounds])
        ok = query(prom, 'rpsagg_submissions_total{status="ok"}')
        assert [float(r["value"][1]) for r in ok] == [float(n * rounds)]
        up = query(prom, 'up{job="rpsagg"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
        api = get_json(f"http://127.0.0.1:{http_port}/api/rounds/{rounds}")
        rel = {r["metric"]["series"]: float(r["value"][1])
               for r in query(prom, "rpsagg_round_relative_error")}
        assert rel == pytest.approx(api["relative_error"], rel=1e-12)
        est = api["error_estimate"]
        for name, key in zip(ESTIMATED, ("relative_error", "squared_error",
                                         "squared_error_stderr"), strict=True):
            got = [float(r["value"][1]) for r in query(prom, name)]
            want = [] if est[key] is None else [est[key]]  # (NaN in /metrics: null in JSON)
            assert [g for g in got if g == g] == pytest.approx(want, rel=1e-12), name
        # the task is measured after the round (a worker thread): wait for the last one
        last = poll("the last round's task progress", lambda: get_json(
            f"http://127.0.0.1:{http_port}/api/rounds/{rounds}")["task_progress"])
        want = last["eigenvector_distance"]
        poll("the task gauge of the last round", lambda: [
            r for r in query(prom, "rpsagg_task_eigenvector_distance")
            if float(r["value"][1]) == pytest.approx(want, rel=1e-12)])
        wire = query(prom, "rpsagg_bytes_received_total")
        total = sum(get_json(f"http://127.0.0.1:{http_port}/api/rounds/{i}")["bytes"]["wire"]
                    for i in range(1, rounds + 1))
        assert float(wire[0]["value"][1]) == total
        # a second job (created over the API, no clients: its round 1 stays open)
        req = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/api/jobs", method="POST",
            data=json.dumps({"n": 2, "k": 4, "d": 16, "rounds": 1}).encode())
        with urllib.request.urlopen(req, timeout=10) as res:
            second = json.load(res)["id"]
        # the dashboard's variable finds both: the label job of the per-job series, kept as
        # the server sets it (honor_labels; the default job's id is "default")
        def variable_values() -> list[str] | None:
            values: list[str] = get_json(f"{prom}/api/v1/label/job/values?" + urllib.parse
                                         .urlencode({"match[]": variable_metric()}))["data"]
            return values if sorted(values) == sorted(["default", second]) else None

        found = poll("both jobs in the variable", variable_values)
        # every query of the Grafana dashboard runs against the real series, for those jobs
        for expr in dashboard_exprs():
            query(prom, with_jobs(expr, found))
        current = {r["metric"]["job"]: r["value"][1] for r in query(prom, with_jobs(
            'rpsagg_current_round{job=~"$job"}', found))}
        assert current == {"default": str(rounds), second: "1"}
        # the server-wide series have no job label of their own: they keep the scrape job's
        assert {r["metric"]["job"] for r in query(prom, "rpsagg_jobs")} == {"rpsagg"}
        assert query(prom, "rpsagg_current_round")[0]["value"][1] == str(rounds)
    finally:
        kill_all(procs)
