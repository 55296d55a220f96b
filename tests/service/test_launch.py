"""The launcher (rpsagg_experiments.launch): the port wait, the failures it reports, and that no
process outlives a job, whichever way the job ends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from rpsagg_experiments.launch import (
    LocalJob,
    ServerExited,
    ServerProcess,
    group_members,
    host_port,
)

pytestmark = pytest.mark.service

SMALL = ["--insecure", "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
         "--n", "2", "--k", "8", "--d", "128", "--task", "mean", "--rounds", "1",
         "--round-timeout", "120", "--db", ":memory:", "--linger", "-1"]


def test_group_members_lists_a_live_group_only() -> None:
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        assert group_members(proc.pid) == [proc.pid]
    finally:
        proc.kill()
        proc.wait(10)
    assert group_members(proc.pid) == []


def test_host_port_brackets_ipv6_addresses() -> None:
    assert host_port("127.0.0.1", 5) == "127.0.0.1:5"
    assert host_port("localhost", 5) == "localhost:5"
    assert host_port("::1", 5) == "[::1]:5"
    assert host_port("[::1]", 5) == "[::1]:5"


@pytest.mark.timeout(120)
def test_a_server_that_exits_before_its_port_is_reported_with_its_status(
        tmp_path: Path) -> None:
    server = ServerProcess([*SMALL, "--k", "0"], tmp_path / "port", stderr=subprocess.PIPE)
    with pytest.raises(ServerExited) as info:
        server.start()
    assert info.value.returncode == 2  # a user error: one line on stderr, exit 2
    assert server.proc is not None and server.proc.poll() == 2


@pytest.mark.timeout(60)
def test_the_port_wait_is_bounded_and_kills_the_server(tmp_path: Path) -> None:
    # a "server" that never writes its port: the wait ends after the bound, process killed
    server = ServerProcess([], tmp_path / "port", prefix=["sh", "-c", "exec sleep 600", "sh"],
                           start_timeout=0.5)
    with pytest.raises(TimeoutError):
        server.start()
    assert server.proc is not None and server.proc.poll() == -signal.SIGKILL


@pytest.mark.timeout(180)
def test_leaving_a_job_by_an_exception_stops_the_server_and_every_client(
        tmp_path: Path) -> None:
    job = LocalJob(ServerProcess(SMALL, tmp_path / "port", stderr=subprocess.DEVNULL))
    with pytest.raises(RuntimeError, match="the caller failed"), job:
        assert job.server.port > 0 and job.target == f"127.0.0.1:{job.server.port}"
        # one client of two: it joins and waits for a round that never starts
        job.start_client(["--server", job.target, "--client-id", "c0", "--insecure"],
                         stderr=subprocess.DEVNULL)
        raise RuntimeError("the caller failed")
    assert len(job.processes) == 2
    assert all(p.poll() is not None for p in job.processes)
    # asked first (SIGTERM), not killed: the server shuts down cleanly
    assert job.processes[0].returncode == 0
    assert job.processes[1].returncode != -signal.SIGKILL


@pytest.mark.timeout(120)
def test_own_group_stops_every_process_under_a_wrapper(tmp_path: Path) -> None:
    # the server runs as a child of a shell (as under py-spy): its group is signalled
    wrapper = ["sh", "-c", '"$@"; exit $?', "sh"]
    server = ServerProcess(SMALL, tmp_path / "port", prefix=wrapper, own_group=True,
                           stderr=subprocess.DEVNULL)
    with server:
        assert server.proc is not None
        pgid = os.getpgid(server.proc.pid)
        assert pgid == server.proc.pid != os.getpgid(0)
    assert group_members(pgid) == []  # nothing of the group is left (zombies aside)
