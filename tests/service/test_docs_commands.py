"""The shell blocks of docs/jobs.md and docs/tuning-k.md, run by bash as they are written
against a real ``rpsagg-server``: the only changes are the addresses (the server takes free
ports; ``127.0.0.1:8000`` and ``HOST:50051`` become them) and, for the tuning page's server,
a few rounds instead of ten. ``tests/unit/test_docs_blocks.py`` names these tests as where
the blocks run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from http_util import Service, free_port, get_json
from repo_paths import ROOT
from service_util import kill_all, wait_port_file

pytestmark = pytest.mark.service

BIN = Path(sys.executable).parent


def shell_blocks(page: str) -> list[str]:
    """The page's ```bash blocks, in order."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def _env(**more: str) -> dict[str, str]:
    """The installed commands first on PATH; no RPSAGG_ variable of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **more}


def _bash(script: str, cwd: Path, env: dict[str, str], timeout: float = 120
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(240)
def test_the_jobs_page_runs_as_written(tmp_path: Path) -> None:
    create, clients, follow = shell_blocks("jobs.md")
    server = Service(tmp_path, "jobs", "--insecure", "--no-default-job", default=())
    procs: list[subprocess.Popen[str]] = []
    try:
        env = _env(RPSAGG_URL=server.url)  # `rpsagg-jobs list` names no --url: its default
        create = create.replace("http://127.0.0.1:8000", server.url)
        made = _bash(create + 'echo "JOB=$JOB"\n', tmp_path, env)
        assert made.returncode == 0, made.stderr
        job = re.search(r"^JOB=(j[0-9a-f]{8})$", made.stdout, re.M)
        assert job is not None, made.stdout
        assert re.search(rf"^{job.group(1)} +(queued|running) ", made.stdout, re.M), made.stdout
        settings = server.job(job.group(1))["settings"]
        assert (settings["estimator"], settings["n"], settings["rounds"]) == ("rand-k", 5, 20)

        client = clients.split("#")[0].strip().replace("HOST:50051", server.target)
        for i in range(settings["n"]):  # the page: "each client names the job"
            procs.append(subprocess.Popen(
                ["bash", "-c", f"{client} --client-id c{i} --quiet"], cwd=tmp_path,
                env={**env, "JOB": job.group(1)}, stderr=subprocess.PIPE, text=True))
        statuses = []
        for line in follow.strip().splitlines():  # each line, with its exit status
            ran = _bash(line, tmp_path, {**env, "JOB": job.group(1)}, timeout=180)
            statuses.append(ran.returncode)
            if line.startswith("rpsagg-jobs show"):
                assert ran.returncode == 0 and '"id"' in ran.stdout, ran.stderr
        # show, wait (done: 0), cancel (an ended job: refused, 2), remove (0)
        assert statuses == [0, 0, 2, 0], statuses
        assert all(p.wait(60) == 0 for p in procs), [p.stderr.read() for p in procs if p.stderr]
        status, _ = server.api(f"/api/jobs/{job.group(1)}")
        assert status == 404  # removed
    finally:
        kill_all(procs)
        server.close()


@pytest.mark.timeout(240)
def test_the_tuning_pages_target_mode_server_runs_as_written(tmp_path: Path) -> None:
    (block,) = shell_blocks("tuning-k.md")
    line = block.strip()
    assert line.startswith("rpsagg-server ") and "--target-rel-error 0.05" in line
    http, port_file = free_port(), tmp_path / "port"
    server = subprocess.Popen(
        ["bash", "-c", f"{line} --grpc-port 0 --http-port {http} --port-file {port_file} "
         "--rounds 3 --db rounds.db"], cwd=tmp_path, env=_env(), stderr=subprocess.PIPE)
    procs = [server]
    try:
        port = wait_port_file(port_file, server)
        n = int(re.search(r"--n (\d+)", line).group(1))  # type: ignore[union-attr]
        for i in range(n):
            procs.append(subprocess.Popen(
                [str(BIN / "rpsagg-client"), "--server", f"127.0.0.1:{port}", "--insecure",
                 "--client-id", f"c{i}", "--quiet"], cwd=tmp_path, env=_env()))
        assert all(p.wait(180) == 0 for p in procs[1:])
        listed = get_json(f"http://127.0.0.1:{http}/api/rounds")
        rounds = listed["rounds"] if isinstance(listed, dict) else listed
        ks = [r["k"] for r in sorted(rounds, key=lambda r: r["round_id"])]
        # the first round sends --k-max; the next the smallest k the target allows
        assert ks[0] == 1024 and all(8 <= k <= 1024 for k in ks) and len(ks) == 3, ks
    finally:
        kill_all(procs)
