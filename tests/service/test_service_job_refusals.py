"""What a standing service refuses, on a real ``rpsagg-server`` process: cancels that win over
the scheduler, settings outside the protocol's ranges (at start and at creation), job bodies
that are not settings, oversized and cut-short bodies, reserved job names, and random JSON
bodies (hypothesis): never a 500, and nothing recorded unless the answer is 201.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from http_util import Service, call
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_util import server_command, wait_until

from rpsagg_client import AggregationClient
from rpsagg_server.settings.bounds import DOUBLE_EXACT, INT64_MAX, MAX_SECONDS, UINT32_MAX
from rpsagg_server.settings.serverconfig import JOB_KEYS

pytestmark = pytest.mark.service

#: a small job of the clients' own vectors (d from the settings, no data set to load)
SMALL = {"task": "mean", "data": "external", "n": 2, "k": 8, "d": 64}
#: what a creation may answer (anything else, a 500 first, is a defect)
ANSWERS = {201, 400, 401, 403, 409, 413, 503}


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[Service]:
    """A standing service with no default job (``--insecure``: anyone creates)."""
    svc = Service(tmp_path, "empty", "--insecure", "--no-default-job",
                  "--jobs-memory-bytes", str(256 << 20), default=())
    try:
        yield svc
    finally:
        svc.close()


def _job_ids(svc: Service) -> list[str]:
    status, body = svc.api("/api/jobs")
    assert status == 200, body
    return [j["id"] for j in body["jobs"]]


def _db_files(svc: Service) -> set[str]:
    folder = svc.tmp / "jobs.db.d"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


@pytest.mark.timeout(180)
def test_a_cancel_answered_200_wins_over_the_start(empty: Service) -> None:
    """Created then cancelled at once, 20 times: every cancel answers ``cancelled``, no job
    ever runs after it and no client can join it (before: 16 of 20 ran)."""
    svc = empty
    ids = [f"c{i}" for i in range(20)]
    for job_id in ids:
        assert svc.api("/api/jobs", "POST", {**SMALL, "rounds": 0, "id": job_id})[0] == 201
        status, job = svc.api(f"/api/jobs/{job_id}/cancel", "POST")
        assert (status, job["state"]) == (200, "cancelled"), (job_id, status, job)
    # the scheduler starts jobs oldest first: once a later job runs, it has passed them all
    assert svc.api("/api/jobs", "POST", {**SMALL, "rounds": 0, "id": "probe"})[0] == 201
    wait_until(lambda: svc.job("probe")["state"] == "running", 30, "the probe job running")
    assert {svc.job(j)["state"] for j in ids} == {"cancelled"}
    for job_id in ids:  # a client that comes is told the job ended, cancelled
        client = AggregationClient(svc.target, "x0", insecure=True, job=job_id,
                                   retry_budget=2)
        try:
            with pytest.raises(grpc.RpcError) as err:  # an ended job takes no new client
                client.join(d=64)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, job_id
            assert "the job has ended (failed: cancelled" in str(err.value.details())
            info = client.current_round()
            assert info.job_done and "cancelled" in info.job_failure, (job_id, info)
        finally:
            client.close()


#: the reproductions: a body, and what its one-line refusal names
BAD_BODIES: list[tuple[Any, str]] = [
    ({"rounds": 18446744073709551616}, "rounds must be at most"),
    ({"rounds": 10**400}, "rounds must be at most"),
    ({"round_timeout": 1e16}, "round_timeout must be at most"),
    ({"round_timeout": 1e300}, "round_timeout must be at most"),
    ({**SMALL, "d": 1024, "estimator": "rand-proj-spatial", "block_size": 2048},
     "block_size 2048 is above d = 1024"),
    ({**SMALL, "d": 1024, "estimator": "rand-proj-spatial", "block_size": 1 << 30},
     "block_size 1073741824 is above d = 1024"),
    ({"transform": "foo"}, "transform must be one of"),
    ({"transform": -1}, "transform R must be in"),
    ({"transform": 1e308}, "transform R must be in"),
    ({"n": 10**400}, "n must be at most"),
    ({"seed": 10**400}, "seed must be at most"),
    ({"seed": INT64_MAX + 1}, "seed must be at most"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"task": "mean", "mean_vectors": 10**400}, "mean_vectors must be at most"),
    ({"task": "kmeans", "centroids": 0}, "centroids must be >= 1"),
    ({"task": "kmeans", "centroids": -3}, "centroids must be >= 1"),
    ({"id": "catalog"}, "reserved"),
    ({"id": "CATALOG"}, "reserved"),
]
#: raw bodies that are not settings: the body, and what the refusal names
BAD_RAW: list[tuple[bytes, str]] = [
    (b'{"transform": NaN}', "NaN is not a JSON number"),
    (b'{"lr": NaN}', "NaN is not a JSON number"),
    (b'{"lr": Infinity}', "Infinity is not a JSON number"),
    (b'{"data": "external", "task": "mean", "data_r": NaN}', "NaN is not a JSON number"),
    (b'{"lr": 1e400}', "lr must be a finite number"),
    (b"[" * 30_000, "nested too deeply"),
    (b"", "it is empty"),
    (b"  \n", "it is empty"),
]


@pytest.mark.timeout(180)
def test_bad_settings_are_one_line_400s_that_record_nothing(empty: Service) -> None:
    svc = empty
    files = _db_files(svc)
    for body, reason in BAD_BODIES:
        status, answer = svc.api("/api/jobs", "POST", body)
        assert status == 400, (body, status, answer)
        assert reason in answer["detail"] and "\n" not in answer["detail"], (body, answer)
    for raw, reason in BAD_RAW:
        status, answer = call(svc.url + "/api/jobs", "POST", raw=raw)
        assert status == 400, (raw[:40], status, answer)
        assert reason in answer["detail"] and "\n" not in answer["detail"], (raw[:40], answer)
    assert _job_ids(svc) == []
    assert _db_files(svc) == files  # the catalog's files alone
    # the largest values the protocol holds are taken, and a job runs with them
    edge = {**SMALL, "n": 1, "rounds": INT64_MAX, "round_timeout": MAX_SECONDS,
            "seed": INT64_MAX, "id": "edge"}
    assert svc.api("/api/jobs", "POST", edge)[0] == 201
    wait_until(lambda: svc.job("edge")["state"] == "running", 30, "the edge job running")
    client = AggregationClient(svc.target, "e0", insecure=True, job="edge")
    try:
        client.join(d=64)
        rnd = client.current_round()
        assert rnd.total_rounds == INT64_MAX
        assert not client.submit(rnd, np.ones(64)).duplicate
        res = client.result(rnd.round_id, wait=True, timeout=30)
        assert res.state == "done"
        nxt = client.current_round()  # its deadline is not running yet: a fresh round
        assert nxt.round_id == 2 and nxt.deadline_unix_ms == 0
    finally:
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("flags", "names"), [
    (("--round-timeout", "1e300"), "--round-timeout must be at most"),
    (("--round-timeout", "1e16"), "--round-timeout must be at most"),
    (("--rounds", "18446744073709551616"), "--rounds must be at most"),
    (("--linger", "inf"), "--linger must be a finite number"),
    (("--lr", "nan"), "--lr must be a finite number"),
    (("--transform", "foo"), "--transform must be one of"),
    (("--estimator", "rand-proj-spatial", "--block-size", str(1 << 30)),
     "--block-size 1073741824 is above d = 1024"),
    (("--estimator", "rand-proj-spatial", "--block-size", "2048"),
     "--block-size 2048 is above d = 1024"),
    (("--seed", str(UINT32_MAX**3)), "--seed must be at most"),
    (("--seed", "-1"), "--seed must be >= 0"),
])
def test_flags_out_of_range_stop_the_start_with_one_line(tmp_path: Path, flags: tuple[str, ...],
                                                          names: str) -> None:
    proc = subprocess.run(server_command(["--insecure", "--db", str(tmp_path / "x.db"),
                                          "--grpc-port", "0", "--http-port", "0", "--d", "1024",
                                          *flags]),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], lines
    assert not (tmp_path / "x.db").exists()


def _server_rss_peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _send_until_answered(port: int, head: bytes, chunks: Iterator[bytes]) -> tuple[bytes, int]:
    """Send ``head`` then ``chunks`` until the server answers or closes; ``(answer, body
    bytes sent)``."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head)
        s.setblocking(False)
        for chunk in chunks:
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break  # answered
            except BlockingIOError:
                pass
            except OSError:
                break
            try:
                s.setblocking(True)
                s.sendall(chunk)
                sent += len(chunk)
            except OSError:  # closed by the server
                break
            finally:
                s.setblocking(False)
        s.setblocking(True)
        answer = b""
        try:
            while data := s.recv(65536):
                answer += data
        except OSError:
            pass
    return answer, sent


@pytest.mark.timeout(120)
def test_large_bodies_are_413_before_they_are_read_and_a_cut_body_408(tmp_path: Path) -> None:
    svc = Service(tmp_path, "bodies", "--insecure", "--no-default-job",
                  "--http-header-timeout", "2", default=())
    try:
        peak = _server_rss_peak_mib(svc.proc.pid)
        mib = b"x" * (1 << 20)
        # Content-Length above the bound: answered from the headers, no body byte read
        head = (b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (100 << 20))
        with socket.create_connection(("127.0.0.1", svc.http_port), timeout=20) as s:
            s.sendall(head)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert b"connection: close" in answer.lower()
        # chunked: stopped once past the bound
        chunked = (b"%x\r\n" % len(mib) + mib + b"\r\n" for _ in range(100))
        answer, sent = _send_until_answered(
            svc.http_port, b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
            b"chunked\r\n\r\n", chunked)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert sent < 64 << 20, sent  # the sender was stopped long before the 100 MiB
        assert _server_rss_peak_mib(svc.proc.pid) - peak < 40
        # a body cut short: 408 at the deadline, then closed
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", svc.http_port), timeout=20) as s:
            s.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"n\":")
            answer = b""
            while data := s.recv(65536):
                answer += data
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert time.monotonic() - start < 10
        assert _job_ids(svc) == []
    finally:
        svc.close()


def _values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5000), st.integers(-(10**400), 10**400),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
        st.sampled_from(["mean", "kmeans", "linreg", "power-iteration", "external",
                         "synthetic", "avg", "max", "auto", "rand-k", "rand-proj-spatial",
                         "rand-k-spatial", "eden", "qsgd", "2.5", "1e308", "catalog"]))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                        max_leaves=6)


def _bodies() -> st.SearchStrategy[bytes]:
    keys = st.sampled_from([*JOB_KEYS, "id", "colour", ""])
    settings_ = st.dictionaries(keys, _values(), max_size=6)
    dumped = settings_.map(lambda d: json.dumps(d).encode())
    return st.one_of(dumped, dumped, dumped, _values().map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=40))


@pytest.mark.timeout(600)
def test_random_bodies_never_500_and_record_only_201s(tmp_path: Path) -> None:
    """150 random bodies (derandomized: the same every run). ``--max-jobs 1``: the first job
    created runs (no clients: it waits), the others stay queued, which costs nothing."""
    svc = Service(tmp_path, "fuzz", "--insecure", "--no-default-job", "--max-jobs", "1",
                  "--jobs-memory-bytes", str(1 << 30), default=())
    created: list[str] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(body=_bodies())
    def one(body: bytes) -> None:
        status, answer = call(svc.url + "/api/jobs", "POST", raw=body)
        assert status in ANSWERS, (body[:200], status, answer)
        if status == 201:
            created.append(answer["id"])
        else:
            assert isinstance(answer, dict) and "\n" not in str(answer.get("detail")), answer
        assert _job_ids(svc) == created, body[:200]

    try:
        one()
        assert created, "no body was a job: the strategy tests refusals only"
        assert svc.proc.poll() is None
        assert b"Traceback" not in svc.log.read_bytes()
    finally:
        svc.close()


def test_every_bound_is_what_its_field_holds() -> None:
    """The bounds are the fields' ranges: a uint32, a signed 64-bit SQLite integer, and for
    durations the whole seconds a double holds exactly, an int64 of milliseconds until the
    year 10,000 (1e16 s, which overflowed, is refused)."""
    assert np.iinfo(np.uint32).max == UINT32_MAX
    assert np.iinfo(np.int64).max == INT64_MAX
    assert float(DOUBLE_EXACT) == DOUBLE_EXACT and float(DOUBLE_EXACT + 1) == DOUBLE_EXACT
    # a deadline now + MAX_SECONDS, in milliseconds as the server computes it (a double),
    # fits an int64 until the year 10,000 (the largest second of year 9999: 2.5e11 s)
    year_9999_s = 253_402_300_799.0
    assert int((year_9999_s + MAX_SECONDS) * 1000) <= INT64_MAX
    assert float(int(MAX_SECONDS)) == MAX_SECONDS and MAX_SECONDS < 1e16


@pytest.mark.timeout(120)
def test_job_settings_are_one_list_from_model_to_record(empty: Service) -> None:
    """The model's fields, the command's job flags, the OpenAPI request properties and the
    settings a created job records are one set: adding a setting is one field."""
    from rpsagg_server.settings.flags import JOB_GROUP, _parser
    from rpsagg_server.settings.jobspec import JobSpec

    model = [f.name for f in dataclasses.fields(JobSpec)]
    flags = [a.dest for g in _parser()._action_groups if (g.title or "").startswith(JOB_GROUP)
             for a in g._group_actions]
    status, schema = call(empty.url + "/openapi.json")
    assert status == 200
    post = schema["paths"]["/api/jobs"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body["additionalProperties"] is False
    assert set(body["properties"]) - {"id"} == set(model)
    assert list(JOB_KEYS) == model == flags
    job_id = empty.create(**SMALL)
    assert list(empty.job(job_id)["settings"]) == model
    # the answers are documented: the 201 with its Location, one error body, the bearer
    assert "Location" in post["responses"]["201"]["headers"]
    assert {"400", "401", "403", "409", "413", "503"} <= set(post["responses"])
    assert {r["content"]["application/json"]["schema"]["$ref"]
            for code, r in post["responses"].items() if code != "201"} == \
        {"#/components/schemas/ErrorBody"}
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert post["security"] == [{"bearer": []}]
    assert schema["paths"]["/healthz"]["get"]["security"] == []
