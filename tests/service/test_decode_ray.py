"""The Ray decode backend (``--decode-backend ray``) on a real two-node Ray cluster.

The module's fixture starts a head and a second node with ``ray start --block`` (each in its
own process group, one CPU each, explicit free ports, a private temp dir), waits for both
nodes with a deadline, and at the end stops exactly those process groups. (Ray binds the
host's routable address: a multi-node cluster cannot be confined to loopback.)
``pytest -k ray`` selects these tests.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from service_util import (
    check_blockwise_rounds_bitwise,
    check_rounds_against_inprocess,
    run_local_job,
)

import rpsagg

pytestmark = pytest.mark.service

RAY = str(Path(sys.executable).with_name("ray"))
# A multi-node Ray cluster always uses the host's routable address (it maps 127.0.0.1 to it;
# a loopback-only cluster is single-node), so the nodes here listen there, as any Ray would.
# Ray 2.60 protects a cluster with a token, by default one shared through ~/.ray/auth_token,
# which any other Ray started by this user on the machine rewrites (a run failed with
# InvalidAuthToken that way): this cluster, its drivers and the server get their own.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}
# Ray reads its auth settings when it is imported: this process's driver needs them first.
os.environ.update(RAY_ENV)
ray = pytest.importorskip("ray", reason="scripts/setup-env.sh test installs rpsagg-server[ray]")
from rpsagg_experiments.launch import stop_processes  # noqa: E402
from rpsagg_server.decode import raydecode  # noqa: E402

START_TIMEOUT = 180.0


def free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_args(ports: list[int], temp_dir: str) -> list[str]:
    return [
        "--num-cpus", "1",
        "--object-store-memory", str(150 * 2**20), "--temp-dir", temp_dir,
        "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
        "--metrics-export-port", str(ports[2]), "--dashboard-agent-listen-port", str(ports[3]),
        "--dashboard-agent-grpc-port", str(ports[4]), "--runtime-env-agent-port", str(ports[5]),
        "--min-worker-port", "0", "--max-worker-port", "0", "--disable-usage-stats", "--block",
    ]


@dataclass(frozen=True)
class Cluster:
    address: str
    groups: list[int]  # process groups of the nodes (each `ray start` leads its own)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    temp_dir = tempfile.mkdtemp(prefix="rsg", dir="/tmp")  # short: unix socket paths
    env = {**os.environ, **RAY_ENV}
    ports = free_ports(14)
    address = f"127.0.0.1:{ports[0]}"
    head_args = [
        RAY, "start", "--head", "--port", str(ports[0]), "--include-dashboard", "false",
        "--ray-client-server-port", str(ports[1]), *node_args(ports[2:8], temp_dir),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(head_args, env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # the head's GCS accepts connections
            with closing(socket.socket()) as s:
                if s.connect_ex(("127.0.0.1", ports[0])) == 0:
                    break
            assert procs[0].poll() is None, "ray head exited"
            assert time.monotonic() < deadline, "ray head did not start"
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [RAY, "start", "--address", address, *node_args(ports[8:14], temp_dir)],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        raydecode.connect(address)
        while sum(1 for n in ray.nodes() if n["Alive"]) < 2:
            assert all(p.poll() is None for p in procs), "a ray node exited"
            assert time.monotonic() < deadline, "the second ray node did not join"
            time.sleep(0.2)
        yield Cluster(address, [p.pid for p in procs])
    finally:
        ray.shutdown()
        workers = _cluster_workers([p.pid for p in procs])
        # each `ray start` leads its own process group: SIGTERM, then SIGKILL after 10 s
        stop_processes(list(reversed(procs)), grace=10.0, group=True)
        for pid in workers:  # workers normally exit with their raylet; make sure
            with contextlib.suppress(OSError):
                if (Path("/proc") / str(pid) / "cmdline").read_bytes().startswith(b"ray::"):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def encode_all(est: rpsagg.Estimator, n: int, d: int, salt: int) -> list[rpsagg.Encoded]:
    rng = np.random.default_rng(salt)
    base = rng.standard_normal(d)
    return [est.encode(base + rng.standard_normal(d), 7919 * salt + i) for i in range(n)]


def test_ray_block_groups_cover_every_block() -> None:
    assert raydecode.block_groups(1, 8) == [(0, 1)]
    assert raydecode.block_groups(10, 2) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    for blocks in range(1, 40):
        for workers in range(1, 6):
            groups = raydecode.block_groups(blocks, workers)
            assert groups[0][0] == 0 and groups[-1][1] == blocks
            assert all(b1 == a2 for (_, b1), (a2, _) in itertools.pairwise(groups))


def test_ray_blockwise_decode_equals_local_bitwise(ray_cluster: Cluster) -> None:
    n, k, d = 8, 128, 3 * 2**12 + 5  # 4 blocks of 2^12, the last one zero-padded
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=2**12,
                                method="cg")
    batches = [encode_all(est, n, d, salt) for salt in (1, 2)]
    got = raydecode.decode_vectors(est, batches)
    for batch, result in zip(batches, got, strict=True):
        want = est.decode_with_info(batch)
        assert np.array_equal(result.estimate, want.estimate)
        assert result.beta == want.beta and result.c == want.c
        assert result.solve is not None and want.solve is not None
        assert result.solve.iterations == want.solve.iterations
        # the blocks' error estimates, summed on the server, as the local decode's
        assert result.error_estimate == want.error_estimate


@pytest.mark.parametrize("block_size", [2**12, 0], ids=["blockwise", "whole"])
def test_ray_quantized_decode_equals_local_bitwise(ray_cluster: Cluster,
                                                   block_size: int) -> None:
    # 8-bit values (blockwise: one scale per block, docs/wire-format.md section 15): the
    # codes and scales travel to the tasks, so the error estimate keeps the rounding variance
    n, k, d = 6, 96, 3 * 2**12 + 5
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, value_bits=8,
                                block_size=block_size or None, projection="srht",
                                method="cg")  # as the float test above
    batches = [encode_all(est, n, d, salt) for salt in (3, 4)]
    assert batches[0][0].scales is not None
    assert batches[0][0].scales.size == (4 if block_size else 1)
    for batch, result in zip(batches, raydecode.decode_vectors(est, batches), strict=True):
        want = est.decode_with_info(batch)
        assert np.array_equal(result.estimate, want.estimate)
        assert result.error_estimate == want.error_estimate
        assert want.error_estimate is not None and want.error_estimate.quantization > 0


def test_ray_whole_vector_decode_equals_local_bitwise(ray_cluster: Cluster) -> None:
    n, k, d = 6, 100, 1000
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=1.5)
    batches = [encode_all(est, n, d, salt) for salt in (3, 4, 5)]
    got = raydecode.decode_vectors(est, batches)
    for batch, result in zip(batches, got, strict=True):
        want = est.decode_with_info(batch)
        assert np.array_equal(result.estimate, want.estimate)
        assert result.error_estimate is not None
        assert result.error_estimate == want.error_estimate


def test_ray_decodes_each_vector_with_its_own_estimator(ray_cluster: Cluster) -> None:
    """transform=auto decodes vector j with slot j's prior: a list of estimators
    that differ in the prior gives each vector its own c and beta, bit for bit as locally."""
    for kwargs in ({"n": 6, "k": 100, "d": 1000},
                   {"n": 8, "k": 128, "d": 2 * 2**12 + 5, "block_size": 2**12, "method": "cg"}):
        n, d = int(kwargs["n"]), int(kwargs["d"])
        base = rpsagg.make_estimator("rand-proj-spatial", transform="auto", **kwargs)
        ests = [base.with_prior(p) for p in (0.5, 0.6 * (n - 1), None)]
        batches = [encode_all(base, n, d, salt) for salt in (6, 7, 8)]
        got = raydecode.decode_vectors(ests, batches)
        assert len({r.c for r in got}) == 3  # three priors, three transforms
        for est, batch, result in zip(ests, batches, got, strict=True):
            want = est.decode_with_info(batch)
            assert np.array_equal(result.estimate, want.estimate)
            assert result.beta == want.beta and result.c == want.c


def _cluster_workers(groups: list[int]) -> dict[int, bytes]:
    """Ray worker processes of this test's nodes (pid -> title). Workers lead their own
    sessions; their parent, the raylet, is in a node's process group."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if not title.startswith(b"ray::"):
                continue
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if os.getpgid(ppid) in groups:
                found[int(entry.name)] = title
        except (OSError, ProcessLookupError, ValueError, IndexError):
            continue
    return found


def _running_task_pid(groups: list[int]) -> int | None:
    """A worker of this test's cluster currently running a decode task."""
    for pid, title in _cluster_workers(groups).items():
        if title == b"ray::_task":
            return pid
    return None


def test_ray_worker_killed_mid_decode_then_same_estimate(ray_cluster: Cluster) -> None:
    import threading

    n, k, d, b = 16, 2048, 2**20, 2**18  # 4 blocks of about a second each here
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b, method="cg")
    batch = encode_all(est, n, d, 6)
    want = est.decode(batch)
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["out"] = raydecode.decode_vectors(est, [batch])
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and worker.is_alive() and time.monotonic() < deadline:
        pid = _running_task_pid(ray_cluster.groups)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed = pid
        time.sleep(0.01)
    worker.join(300)
    assert not worker.is_alive(), "the decode did not finish after the kill"
    assert killed is not None, "no decode task was seen running"
    assert "error" not in result, result.get("error")
    out = result["out"]
    assert isinstance(out, list)
    assert np.array_equal(out[0].estimate, want)


@pytest.mark.timeout(300)
def test_ray_service_round_decoded_on_the_cluster(ray_cluster: Cluster, tmp_path: Path) -> None:
    n, k, d, rounds = 4, 160, 1024, 2
    db = run_local_job(tmp_path, n, k, d, rounds, data_r=2,
                       extra=["--decode-backend", "ray", "--ray-address", ray_cluster.address],
                       env={**os.environ, **RAY_ENV})
    assert check_rounds_against_inprocess(db, n, k, d, "rand-proj-spatial") == rounds


@pytest.mark.parametrize("value_bits", [32, 8])
@pytest.mark.timeout(300)
def test_ray_service_blockwise_job_is_the_library_decode_bitwise(
    ray_cluster: Cluster, tmp_path: Path, value_bits: int
) -> None:
    # --block-size: the rounds fan out per block group on the cluster, and every stored
    # estimate equals the library's decode of the stored messages bit for bit
    n, k, d, b, rounds = 4, 160, 1000, 128, 2
    db = run_local_job(tmp_path, n, k, d, rounds, data_r=2,
                       extra=["--decode-backend", "ray", "--ray-address", ray_cluster.address,
                              "--block-size", str(b), "--value-bits", str(value_bits)],
                       env={**os.environ, **RAY_ENV})
    assert check_blockwise_rounds_bitwise(db, n, k, d, b, value_bits) == rounds
    assert "decode tasks ran on" in (tmp_path / "server.log").read_text()
