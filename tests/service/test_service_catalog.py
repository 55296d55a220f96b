"""One catalog of every job, one string id each (``rpsagg_server.jobs``).

* The default job and the past jobs (``--on-finished-job new`` moved them to ``<db>.jobs/``)
  are rows of the catalog, with their ids (``default``; the archive's file stem), and
  ``GET /api/jobs`` and ``GET /api/jobs/{id}`` answer from it; a second start lists a past
  job once.
* A ``--d 0`` job is the default job in the state ``waiting``, served by the server's one
  gRPC server: ``GET /api/jobs/default`` says ``waiting`` before the first join, and
  ``running`` with the join's d after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_util import base_config, in_process_server, run_local_job

from rpsagg_server.http.service import create_service_app

pytestmark = pytest.mark.service

N, K, D, ROUNDS = 2, 8, 64, 2


@pytest.mark.timeout(240)
def test_the_default_job_and_past_jobs_are_in_the_one_catalog(tmp_path: Path) -> None:
    db = Path(run_local_job(tmp_path, n=N, k=K, d=D, rounds=ROUNDS, data_r=0.0))
    cfg = base_config(n=N, k=K, d=D, rounds=ROUNDS, db=str(db), on_finished_job="new")
    for _start in range(2):  # the second start lists the past job once, as the first
        with in_process_server(cfg) as srv:
            (moved,) = (db.parent / "job.db.jobs").glob("*.db")
            host = srv.running.host
            kinds = {r.id: r.kind for r in host.catalog.all()}
            assert kinds == {"default": "default", moved.stem: "past"}
            with TestClient(create_service_app(host)) as http:
                listed = http.get("/api/jobs").json()
                past = http.get(f"/api/jobs/{moved.stem}").json()
                default = http.get("/api/jobs/default").json()
    assert [j["id"] for j in listed["jobs"]] == ["default"]
    assert [p["file"] for p in listed["past_jobs"]] == [moved.name]
    assert (past["id"], past["kind"], past["state"], past["default"]) == (
        moved.stem, "past", "done", False)
    assert (past["rounds"], past["rounds_done"], past["clients"]) == (ROUNDS, ROUNDS, N)
    assert past["settings"]["d"] == D
    assert (default["kind"], default["state"], default["default"]) == ("default", "running",
                                                                      True)


@pytest.mark.timeout(120)
def test_a_d0_job_waits_for_its_first_join_in_the_catalog(tmp_path: Path) -> None:
    from rpsagg_client import AggregationClient

    d = 48
    cfg = base_config(n=1, k=K, d=0, data="external", rounds=1, db=str(tmp_path / "job.db"))
    with in_process_server(cfg) as srv:
        host = srv.running.host
        with TestClient(create_service_app(host)) as http:
            job = http.get("/api/jobs/default").json()
            assert (job["state"], job["kind"], job["settings"]["d"]) == ("waiting", "default", 0)
            assert http.get("/api/jobs").json()["jobs"][0]["state"] == "waiting"
            assert 'rpsagg_jobs{state="waiting"} 1.0' in http.get("/metrics").text
            with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True,
                                   retry_budget=30) as a:
                assert a.current_round().d == 0
                assert a.join(d=d).client_index == 0  # retried while the job opens
                assert a.current_round().d == d
            job = http.get("/api/jobs/default").json()
    assert (job["state"], job["settings"]["d"]) == ("running", d)
    assert host.default() is not None and host.waiting_for_d("") is None
