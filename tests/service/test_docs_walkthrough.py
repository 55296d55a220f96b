"""docs/vectors.md's walk-through, as written: the example files made by its recipe, its three
commands (the server, three clients, the download) and its numpy check. The only changes are
the ports: the server takes free ones (``--grpc-port 0``, a free ``--http-port``), the clients
and the download are pointed at them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from http_util import free_port
from repo_paths import ROOT
from service_util import kill_all, wait_port_file

pytestmark = pytest.mark.service

PAGE = ROOT / "docs" / "vectors.md"
BIN = Path(sys.executable).parent


@pytest.mark.timeout(180)
@pytest.mark.skipif(not Path("/usr/bin/curl").exists(), reason="the walk-through uses curl")
def test_own_vectors_walkthrough_runs_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text(encoding="utf-8")
    recipe = re.search(r"made with\n`(rng = .*?)` and\n`(np\.save\(.*?\))` for i = 0, 1, 2", text,
                       re.S)
    assert recipe is not None
    make = (f"import numpy as np\n{recipe.group(1)}\n"
            f"for i in range(3):\n    {recipe.group(2)}\n")
    subprocess.run([sys.executable, "-c", make], cwd=tmp_path, check=True, timeout=60)
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None
    lines = [line.split(" #")[0].strip() for line in block.group(1).replace("\\\n", " ")
             .splitlines() if line.strip() and not line.startswith("#")]
    server_line, clients_line, download_line = lines
    assert server_line.startswith("rpsagg-server ") and "rpsagg-client" in clients_line
    assert download_line.startswith("curl ") and "127.0.0.1:8000" in download_line

    http_port = free_port()
    port_file = tmp_path / "port"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RPSAGG_")},
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "RPSAGG_CACHE_DIR": str(tmp_path / "cache")}
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [str(BIN / "rpsagg-server"), *shlex.split(server_line)[1:], "--grpc-port", "0",
         "--http-port", str(http_port), "--port-file", str(port_file)],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        grpc_port = wait_port_file(port_file, server)
        clients = clients_line.replace("--vectors", f"--server 127.0.0.1:{grpc_port} --vectors")
        done = subprocess.run(["bash", "-c", clients], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        for i in range(3):  # each client's line, as the page quotes it
            assert f"[c{i}] round 1: sent 1.6 KiB (400 floats + seed)" in done.stdout
        download = download_line.replace("127.0.0.1:8000", f"127.0.0.1:{http_port}")
        subprocess.run(["bash", "-c", download + " -sSf"], cwd=tmp_path, env=env, check=True,
                       timeout=60)
    finally:
        kill_all([server])
        log.close()
    check = re.search(r"Check it against the exact mean with numpy:\n\n```python\n(.*?)```",
                      text, re.S)
    assert check is not None
    out = subprocess.run([sys.executable, "-c", check.group(1)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True)
    rel = float(out.stdout.strip())
    assert 0.3 < rel < 0.8, rel  # the page: 0.527-0.576 over five runs (new seeds each run)
