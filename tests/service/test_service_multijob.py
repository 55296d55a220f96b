"""A standing service: jobs created over the HTTP API while the default job runs, in one
``rpsagg-server`` process, with real client processes (``rpsagg-client --job``), old
clients without a job id, scoped tokens, a cancel mid-round, bad job bodies, and kill -9 with
three jobs running.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from http_util import D, K, N, Service, call
from service_util import (
    check_rounds_against_inprocess,
    client_command,
    make_certs,
    wait_until,
)

from rpsagg_client import AggregationClient
from rpsagg_server.store.database import Store

pytestmark = pytest.mark.service


@pytest.fixture
def insecure(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path, "a", "--insecure")
    try:
        yield svc
    finally:
        svc.close()


def _estimate_npy(svc: Service, prefix: str, round_id: int) -> np.ndarray:
    status, body = svc.api(f"{prefix}/rounds/{round_id}/estimate?format=npy")
    assert status == 200, (status, body)
    return np.load(io.BytesIO(body))


@pytest.mark.timeout(240)
def test_three_jobs_beside_the_default_job(insecure: Service) -> None:
    """Three jobs with other estimators and d, created while the default job runs; clients of
    each as processes (``--job``), the default job's as old clients (no job id); every
    estimate equals the library's decode of that job's stored messages, over the API too."""
    svc = insecure
    specs = {
        "rand-k": dict(estimator="rand-k", n=2, k=24, d=200, task="mean", rounds=2,
                       data_r=0.5),
        "rand-k-spatial": dict(estimator="rand-k-spatial", n=3, k=20, d=64, task="mean",
                               rounds=2, data_r=2),
        "rand-proj-spatial": dict(estimator="rand-proj-spatial", n=2, k=32, d=512,
                                  task="mean", rounds=3, data_r=1, transform="max"),
    }
    ids = {name: svc.create(**spec) for name, spec in specs.items() if name != "rand-k"}
    # one through the CLI, as a user would
    cli = subprocess.run(client_command(
        ["--url", svc.url, "create", *(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                       for k, v in specs["rand-k"].items())],
        module="rpsagg_client.jobs_cli"), capture_output=True, timeout=60)
    assert cli.returncode == 0, cli.stderr.decode()
    ids["rand-k"] = cli.stdout.decode().strip()
    # a created job is queued in its answer and starts right after it
    wait_until(lambda: all(svc.job(i)["state"] == "running" for i in ids.values()), 20,
               "the created jobs running")
    listed = {j["id"]: j for j in svc.api("/api/jobs")[1]["jobs"]}
    assert set(listed) == {"default", *ids.values()}
    assert listed["default"]["default"] and listed["default"]["state"] == "running"
    for name, job_id in ids.items():
        assert listed[job_id]["state"] == "running"
        assert listed[job_id]["settings"]["estimator"] == name
    clients = [svc.client(f"old-{i}", "--insecure") for i in range(N)]
    for name, job_id in ids.items():
        n = int(specs[name]["n"])  # type: ignore[call-overload]
        clients += [svc.client(f"{name}-{i}", "--insecure", "--job", job_id)
                    for i in range(n)]
    for p in clients:
        assert p.wait(180) == 0, p.stderr.read().decode() if p.stderr else ""
    wait_until(lambda: all(svc.job(i)["state"] == "done" for i in ids.values()), 30,
               "every created job done")
    waited = subprocess.run(client_command(["--url", svc.url, "wait", ids["rand-k"],
                                            "--timeout", "30"],
                                           module="rpsagg_client.jobs_cli"),
                            capture_output=True, timeout=60)
    assert waited.returncode == 0, waited.stderr.decode()
    wait_until(lambda: svc.job("default")["state"] == "done", 30, "the default job done")
    assert svc.job("default")["finished_at"] is not None
    # a created job's settings: what it was given, and every other setting's default
    assert svc.job(ids["rand-k"])["settings"] | specs["rand-k"] == \
        svc.job(ids["rand-k"])["settings"]
    assert svc.job(ids["rand-k"])["settings"]["min_clients"] == 1
    checked = check_rounds_against_inprocess(str(svc.tmp / "jobs.db"), N, K, D,
                                             "rand-proj-spatial")
    assert checked == 2
    for name, job_id in ids.items():
        spec = specs[name]
        job = svc.job(job_id)
        assert job["rounds_done"] == spec["rounds"] and job["bytes_up"] > 0
        assert job["last_rel_error"] is not None and job["last_rel_error"] > 0
        if name == "rand-proj-spatial":  # transform max: check it against the stored rounds
            _check_max_transform(svc.job_db(job_id), spec)
        else:
            assert check_rounds_against_inprocess(
                svc.job_db(job_id), int(spec["n"]), int(spec["k"]),  # type: ignore
                int(spec["d"]), name) == spec["rounds"]  # type: ignore[call-overload]
        store = Store(svc.job_db(job_id))
        try:
            for r in store.rounds():
                assert r.state == "done" and r.estimate is not None
                stored = np.frombuffer(r.estimate, dtype="<f8").reshape(1, -1)
                got = _estimate_npy(svc, f"/api/jobs/{job_id}", r.round_id)
                assert np.array_equal(got.reshape(stored.shape), stored)
        finally:
            store.close()
    # the default job's paths keep meaning the default job
    status, rounds = svc.api("/api/rounds")
    assert status == 200 and {r["round_id"] for r in rounds["rounds"]} == {1, 2}
    status, text = svc.api("/metrics")
    assert status == 200
    body = text.decode() if isinstance(text, bytes) else str(text)
    for job_id in ("default", *ids.values()):
        assert f'job="{job_id}"' in body
    assert 'rpsagg_jobs{state="done"} 4.0' in body
    # /docs documents the jobs API and a job's own API
    status, schema = svc.api("/openapi.json")
    assert status == 200
    assert {"/api/jobs", "/api/jobs/{job_id}", "/api/jobs/{job_id}/cancel", "/api/rounds",
            "/api/rounds/{round_id}/estimate", "/api/status"} <= set(schema["paths"])
    assert svc.api("/docs")[0] == 200
    assert schema["paths"]["/api/jobs"]["get"]["summary"] == "Every job of this server"


def _check_max_transform(db: str, spec: dict[str, Any]) -> None:
    from rpsagg import make_estimator
    from rpsagg_server.decode.decoding import messages
    from rpsagg_wire.v1 import serde

    n, k, d = int(spec["n"]), int(spec["k"]), int(spec["d"])
    est = make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform="max")
    store = Store(db)
    try:
        clients = {cid: idx for cid, idx, _ in store.clients()}
        done = 0
        for r in store.rounds():
            assert r.state == "done" and r.estimate is not None
            subs = [serde.decode_submission(s.payload) for s in store.submissions(r.round_id)]
            subs.sort(key=lambda s: clients[s.client_id])
            got = np.frombuffer(r.estimate, dtype="<f8").reshape(-1, d)
            want = est.decode(messages(subs, r.nonce, est.name, k, d, 0))
            assert np.max(np.abs(got[0] - want)) <= 1e-12
            done += 1
        assert done == spec["rounds"]
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_bad_job_bodies_are_400_and_create_nothing(tmp_path: Path) -> None:
    svc = Service(tmp_path, "bad", "--insecure", "--jobs-memory-bytes", str(64 << 20))
    try:
        bad = [
            ({"n": 4, "colour": "blue"}, "unknown job setting 'colour'"),
            ({"n": 0}, "n must be >= 1; got 0"),
            ({"n": 2, "data_r": 1.5}, "data_r must be in [0, n-1] = [0, 1]"),
            ({"n": "ten"}, "n must be an integer; got 'ten'"),
            ({"eval": 1}, "eval must be true or false"),
            ({"n": True}, "n must be a number"),
            ({"estimator": "rand-x"}, "estimator must be one of"),
            ({"d": 1 << 21, "k": 64, "task": "mean"}, "MiB (--jobs-memory-bytes) are left"),
            ({"d": 0, "data": "external", "task": "mean"}, "d must be >= 1"),
            ({"id": "default"}, "exists already"),
            ({"id": "no spaces"}, "id must be"),
        ]
        for body, reason in bad:
            status, answer = svc.api("/api/jobs", "POST", body)
            assert status in (400, 409), (body, status, answer)
            detail = answer["detail"]
            assert reason in detail and "\n" not in detail, (body, detail)
        for raw in (b"[1, 2]", b"{not json", b'"text"'):
            status, answer = call(svc.url + "/api/jobs", "POST", raw=raw)
            assert status == 400 and "\n" not in answer["detail"], (raw, answer)
        jobs = svc.api("/api/jobs")[1]["jobs"]
        assert [j["id"] for j in jobs] == ["default"]
        assert not (tmp_path / "jobs.db.d").exists() or \
            sorted(p.name for p in (tmp_path / "jobs.db.d").iterdir()
                   if p.suffix == ".db") == ["catalog.db"]
    finally:
        svc.close()


@pytest.mark.timeout(120)
def test_cancel_mid_round(insecure: Service) -> None:
    """A cancel is recorded, fails the current round (its acked submissions stay stored),
    refuses further submissions, and tells the job's clients it ended."""
    svc = insecure
    job_id = svc.create(n=3, k=16, d=128, task="mean", rounds=3, data_r=2)
    clients = [AggregationClient(svc.target, f"c{i}", insecure=True, job=job_id)
               for i in range(3)]
    try:
        for c in clients:
            c.join()
        rnd = clients[0].current_round()
        xs = np.random.default_rng(3).normal(size=(3, 128))
        for c in clients[:2]:
            assert not c.submit(rnd, xs[c.index]).duplicate
        status, job = svc.api(f"/api/jobs/{job_id}/cancel", "POST")
        assert status == 200 and job["state"] == "cancelled", job
        res = clients[0].result(rnd.round_id, wait=True, timeout=20)
        assert res.state == "failed" and "cancelled" in res.reason
        info = clients[2].current_round()
        assert info.job_done and "cancelled" in info.job_failure
        with pytest.raises(grpc.RpcError, match=r"round 1 is finished \(failed\); no more"):
            clients[2].submit(rnd, xs[2])
        assert svc.api(f"/api/jobs/{job_id}/cancel", "POST")[0] == 409
        store = Store(svc.job_db(job_id))
        try:
            assert len(store.submissions(rnd.round_id)) == 2
        finally:
            store.close()
        # DELETE of the ended job removes its data and row (a cancel is POST .../cancel)
        assert svc.api(f"/api/jobs/{job_id}", "DELETE")[0] == 200
        assert svc.api(f"/api/jobs/{job_id}")[0] == 404
        assert not os.path.exists(svc.job_db(job_id))
        # the default job was not touched
        assert svc.job("default")["state"] == "running"
        assert svc.api("/api/jobs/nope/cancel", "POST")[0] == 404
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(120)
def test_a_cancel_of_the_default_job_is_recorded_before_its_answer(tmp_path: Path) -> None:
    """The default job's cancel answers 200 with the job cancelled, as a created job's does
    (its row was written by a watcher after the answer, so the answer and the reads right
    after it said running), and its end is in the job's database: a restart shows it
    cancelled, without a round."""
    svc = Service(tmp_path, "a", "--insecure")
    try:
        wait_until(lambda: svc.api("/api/jobs/default/status")[1]["current_round"], 20,
                   "the default job's first round")
        status, job = svc.api("/api/jobs/default/cancel", "POST")
        assert status == 200 and job["state"] == "cancelled", job
        assert svc.job("default")["state"] == "cancelled"
        assert svc.api("/api/jobs/default/status")[1]["current_round"] is None
        assert svc.api("/api/jobs/default/cancel", "POST")[0] == 409
    finally:
        svc.close()
    again = Service(tmp_path, "b", "--insecure")
    try:
        job = again.job("default")
        assert job["state"] == "cancelled" and job["failure"] == "cancelled over the API", job
        assert again.api("/api/jobs/default/status")[1]["current_round"] is None
    finally:
        again.close()


@pytest.mark.timeout(180)
def test_scoped_tokens_and_admin_tokens(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("c0 tok-default\nteam-a a0 tok-a\nteam-b * tok-b\n")
    admin = tmp_path / "admin"
    admin.write_text("adm-1\n")
    svc = Service(tmp_path, "sec", "--tls-cert", certs.server_cert, "--tls-key",
                  certs.server_key, "--tokens", str(tokens), "--admin-tokens", str(admin))
    try:
        spec = {"id": "team-a", "n": 1, "k": 8, "d": 64, "task": "mean", "rounds": 1}
        assert svc.api("/api/jobs", "POST", spec)[0] == 401
        assert svc.api("/api/jobs", "POST", spec, token="tok-a")[0] == 403
        assert svc.api("/api/jobs", "POST", spec, token="adm-1")[0] == 201
        assert svc.create("adm-1", id="team-b", n=2, k=8, d=64, task="mean", rounds=1) \
            == "team-b"
        assert svc.api("/api/jobs/team-b/cancel", "POST", token="tok-b")[0] == 403

        def client(cid: str, token: str, job: str) -> AggregationClient:
            return AggregationClient(svc.target, cid, token=token, tls_ca=certs.ca,
                                     job=job, retry_budget=2)

        ok = client("a0", "tok-a", "team-a")
        wrong_job = client("a0", "tok-a", "team-b")
        default = client("a0", "tok-a", "")
        any_b = client("b7", "tok-b", "team-b")
        other_in_a = client("a1", "tok-a", "team-a")
        try:
            ok.join()
            any_b.join()
            for c, what in ((wrong_job, "for job 'team-a', not 'team-b'"),
                            (default, "for job 'team-a', not 'default'"),
                            (other_in_a, "belongs to client 'a0'")):
                with pytest.raises(Exception, match=what):
                    c.join()
        finally:
            for c in (ok, wrong_job, default, any_b, other_in_a):
                c.close()
    finally:
        svc.close()


@pytest.mark.timeout(300)
def test_kill_9_with_three_jobs_running_then_restart(tmp_path: Path) -> None:
    """kill -9 with the default job and two created jobs mid-round, one job queued behind
    ``--max-jobs 3`` and one cancelled: after a restart every running job resumes its round
    with its acks, the cancelled one stays cancelled, and the queued one starts when a slot
    frees."""
    svc = Service(tmp_path, "a", "--insecure", "--max-jobs", "3")
    grpc_port, http_port = svc.port, svc.http_port
    xs = np.random.default_rng(5).normal(size=(N, D))
    spec = dict(n=N, k=K, d=D, task="mean", rounds=2)
    clients: list[AggregationClient] = []
    try:
        a, b = svc.create(**spec), svc.create(**spec)
        cancelled = svc.create(**spec)
        assert svc.api(f"/api/jobs/{cancelled}/cancel", "POST")[0] == 200
        queued = svc.create(**spec)
        assert svc.job(queued)["state"] == "queued"
        acked: dict[str, Any] = {}
        rounds: dict[str, Any] = {}
        for job in ("", a, b):
            cs = [AggregationClient(svc.target, f"c{i}", insecure=True, job=job, timeout=5,
                                    retry_budget=60) for i in range(N)]
            clients += cs
            for c in cs:
                c.join()
            rounds[job] = rnd = cs[0].current_round()
            sub = cs[0].encode(rnd, xs[cs[0].index])
            assert not cs[0].submit_encoded(sub).duplicate
            acked[job] = (cs, sub)
        os.kill(svc.proc.pid, signal.SIGKILL)
        svc.proc.wait(10)

        again = Service(tmp_path, "b", "--insecure", "--max-jobs", "3", grpc_port=grpc_port,
                        http_port=http_port)
        svc.procs.append(again.proc)
        states = {j["id"]: j["state"] for j in again.api("/api/jobs")[1]["jobs"]}
        assert states == {"default": "running", a: "running", b: "running",
                          cancelled: "cancelled", queued: "queued"}
        for job, (cs, sub) in acked.items():
            rnd = rounds[job]
            now = cs[0].current_round()
            assert (now.round_id, now.nonce, now.state) == (rnd.round_id, rnd.nonce,
                                                             "collecting")
            assert cs[0].submit_encoded(sub).duplicate  # acked before the kill: kept
        # job a finishes: the queued job takes its slot
        cs_a = acked[a][0]
        for r in range(2):
            rnd = cs_a[0].current_round()
            for c in cs_a[(1 if r == 0 else 0):]:
                c.submit(rnd, xs[c.index])
            assert cs_a[0].result(rnd.round_id, wait=True, timeout=60).state == "done"
        wait_until(lambda: again.job(queued)["state"] == "running", 30, "the queued job")
        assert again.job(a)["state"] == "done"
        assert again.job(cancelled)["state"] == "cancelled"
        late = AggregationClient(again.target, "z0", insecure=True, job=cancelled,
                                 retry_budget=2)
        try:
            info = late.current_round()
            assert info.job_done and "cancelled" in info.job_failure
        finally:
            late.close()
    finally:
        for c in clients:
            c.close()
        svc.close()


def test_unknown_job_and_no_default_job(tmp_path: Path) -> None:
    svc = Service(tmp_path, "empty", "--insecure", "--no-default-job", default=())
    try:
        assert svc.api("/api/jobs")[1]["jobs"] == []
        assert svc.api("/api/status")[0] == 404
        c = AggregationClient(svc.target, "c0", insecure=True, retry_budget=1)
        try:
            with pytest.raises(Exception, match="no default job"):
                c.join()
        finally:
            c.close()
        job_id = svc.create(n=1, k=8, d=64, task="mean", rounds=1)
        old = AggregationClient(svc.target, "c0", insecure=True, retry_budget=5)
        named = AggregationClient(svc.target, "c1", insecure=True, job="nope",
                                  retry_budget=1)
        try:
            old.join()  # no job id: the only open job
            assert old.current_round().n == 1
            with pytest.raises(Exception, match="no job 'nope'"):
                named.join()
        finally:
            old.close()
            named.close()
        assert svc.job(job_id)["clients"] == 1
        proc = svc.client("c0", "--insecure", "--job", job_id)
        assert proc.wait(60) == 0, proc.stderr.read().decode() if proc.stderr else ""
        wait_until(lambda: svc.job(job_id)["state"] == "done", 30, "the job done")
    finally:
        svc.close()


@pytest.mark.timeout(120)
def test_memory_bound_refuses_then_frees_when_a_job_ends(tmp_path: Path) -> None:
    """A job is refused while the open jobs' estimates leave no room for it, and fits once
    one of them has ended (an ended job keeps one round cached).

    Estimates (docs/architecture.md, "Jobs"): d = 2^16, m = 1, n = 1, k = 64 is
    64 B x 2^16 + 8 x 64 + min(64 MiB, 32 B x 2^16) = 6 MiB + 512 B; ended, 16 B x 2^16 =
    1 MiB. The default job (d = 128) takes about 12 KiB. A budget of 10 MiB holds one such
    job, not two; one running beside one ended (7 MiB) fits."""
    svc = Service(tmp_path, "mem", "--insecure", "--jobs-memory-bytes", str(10 << 20))
    try:
        spec = dict(n=1, k=64, d=1 << 16, task="mean", rounds=1, data_r=0)
        first = svc.create(**spec)
        status, answer = svc.api("/api/jobs", "POST", spec)
        assert status == 400 and "6.0 MiB" in answer["detail"], answer
        c = AggregationClient(svc.target, "c0", insecure=True, job=first)
        try:
            c.join()
            rnd = c.current_round()
            c.submit(rnd, np.ones(1 << 16))
            assert c.result(rnd.round_id, wait=True, timeout=30).state == "done"
        finally:
            c.close()
        wait_until(lambda: svc.job(first)["state"] == "done", 30, "the first job done")
        assert svc.create(**spec)
    finally:
        svc.close()


@pytest.mark.timeout(180)
def test_catalog_write_faults(insecure: Service) -> None:
    """The catalog's writes: slow (its lock held for 1 s: the create waits and succeeds),
    failing (held past SQLite's 5 s busy timeout: 503, nothing created, a cancel changes
    nothing), and a caller that goes away (the job is created all the same and listed)."""
    import threading
    import time

    from service_util import write_lock

    svc = insecure
    catalog = str(svc.tmp / "jobs.db.d" / "catalog.db")
    spec = dict(n=1, k=8, d=64, task="mean", rounds=1)
    running = svc.create(**spec)
    held, release = threading.Event(), threading.Event()

    def hold(seconds: float) -> None:
        with write_lock(catalog):
            held.set()
            release.wait(seconds)

    holder = threading.Thread(target=hold, args=(1.0,))
    holder.start()
    assert held.wait(10)
    started = time.monotonic()
    slow = svc.create(**spec)
    assert time.monotonic() - started >= 0.5  # it waited for the lock
    holder.join(10)

    held.clear()
    release.clear()
    holder = threading.Thread(target=hold, args=(30.0,))
    holder.start()
    try:
        assert held.wait(10)
        status, answer = svc.api("/api/jobs", "POST", {**spec, "id": "never"})
        assert status == 503 and "could not be recorded" in answer["detail"], answer
        status, answer = svc.api(f"/api/jobs/{running}/cancel", "POST")
        assert status == 503 and "could not be recorded" in answer["detail"], answer
    finally:
        release.set()
        holder.join(10)
    ids = [j["id"] for j in svc.api("/api/jobs")[1]["jobs"]]
    assert ids == ["default", running, slow]
    assert svc.job(running)["state"] == "running"

    # the caller goes away as soon as its request is sent
    body = json.dumps({**spec, "id": "orphan"}).encode()
    with socket.create_connection(("127.0.0.1", svc.http_port), timeout=10) as s:
        s.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_until(lambda: svc.api("/api/jobs/orphan")[0] == 200, 20, "the orphan job listed")
    wait_until(lambda: svc.job("orphan")["state"] == "running", 20, "the orphan job running")
