"""Every shell block of the README, the docs and the examples' READMEs either runs in a named
test (which reads it from its page) or is named a placeholder, with why it cannot run as
written here (another machine's address, certificates a reader makes, an hour of work).
The Python blocks: ``tests/unit/test_docs.py`` (``PLACEHOLDER_EXAMPLES``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.unit

#: (page, the block's first line) -> the test that runs it as written
RUNS = {
    ("README.md", 'set -a; eval "$(scripts/engine.sh up)"; set +a   # a Docker engine with '
     "Compose v2 and BuildKit"):
        "tests/engine/test_deploy_engine.py::test_readme_compose_block_runs_as_written",
    ("docs/vectors.md", "# 1. a server for d = 1000: 3 clients send 400 floats each (instead "
     "of 1000), one round"):
        "tests/service/test_docs_walkthrough.py::test_own_vectors_walkthrough_runs_as_written",
    ("docs/jobs.md", "JOB=$(rpsagg-jobs --url http://127.0.0.1:8000 create estimator=rand-k "
     "n=5 k=64 d=4096 \\"):
        "tests/service/test_docs_commands.py::test_the_jobs_page_runs_as_written",
    ("docs/jobs.md", 'rpsagg-client --server HOST:50051 --job "$JOB" --insecure   # or '
     "RPSAGG_JOB=$JOB"):
        "tests/service/test_docs_commands.py::test_the_jobs_page_runs_as_written",
    ("docs/jobs.md", 'rpsagg-jobs show "$JOB"      # state, rounds done, bytes on the wire, '
     "the estimated error"):
        "tests/service/test_docs_commands.py::test_the_jobs_page_runs_as_written",
    ("docs/tuning-k.md", "rpsagg-server --insecure --n 10 --d 1024 --k 1024 "
     "--target-rel-error 0.05 --k-min 8 --k-max 1024"):
        "tests/service/test_docs_commands.py::"
        "test_the_tuning_pages_target_mode_server_runs_as_written",
    ("docs/library.md", "rpsagg-simulate --n 10 --k 32 --d 1024 --r 0 9 --trials 50"):
        "tests/unit/test_docs.py::test_the_libraries_simulate_example_runs_as_written",
    ("docs/install.md", "scripts/build-wheels.sh"):
        "tests/service/test_wheels.py::"
        "test_the_wheels_install_and_run_a_job_from_the_installed_commands",
    ("docs/install.md", "python3.11 -m venv venv"):
        "tests/service/test_wheels.py::"
        "test_the_wheels_install_and_run_a_job_from_the_installed_commands",
}

#: (page, the block's first line) -> why it does not run as written in a test
PLACEHOLDERS = {
    ("README.md", "./run.sh     # main job: sets up .venv, then runs a local cluster (server "
     "+ 10 clients over gRPC)"):
        "the project's own two commands: CI runs ./test.sh (.ci/run); ./run.sh's cluster runs "
        "in tests/service/test_service_cluster.py and its --help in tests/unit/test_docs.py",
    ("docs/index.md", "./run.sh     # main job: sets up .venv, then runs a local cluster "
     "(server + 10 clients over gRPC)"): "the README's two commands, as above",
    ("docs/install.md", "./run.sh                      # sets up .venv, then runs a local "
     "cluster"): "the README's main command, then a shell's `source`",
    ("README.md", "# on A (TLS and tokens are required unless --insecure is given "
     "explicitly)"): "two machines: a.example.org, a reader's certificates and tokens",
    ("README.md", "./test.sh -m unit      # the library, the commands and the files: no "
     "server, Docker or browser"): "the test suite's own commands",
    ("docs/dashboard.md", "openssl rand -hex 24 > certs/http.tokens           # one line per "
     "reader; any string works"):
        "machine A of the TLS set-up of docs/deploy.md, its certificates made by the reader "
        "(tests/service/test_http_exposure.py checks the same flags and Prometheus' scrape)",
    ("docs/deploy.md", 'set -a; eval "$(scripts/engine.sh up)"; set +a   # DOCKER_HOST=..., '
     "one NAME=value a line"):
        "the engine and the demo (the README's block, which runs in "
        "tests/engine/test_deploy_engine.py)",
    ("docs/deploy.md", "docker compose --profile monitoring up --build"):
        "Prometheus and Grafana images (tests/engine/test_deploy_monitoring.py runs the "
        "profile with its own project name and ports)",
    ("docs/deploy.md", "# on A: a test CA, a server certificate for the name clients dial, "
     "tokens (into ./certs)"): "two machines, A and the clients' (tests/engine/"
     "test_deploy_engine.py::test_tls_override runs the override on one)",
    ("docs/deploy.md", "docker compose up -d                     # the demo job, as above"):
        "a running demo project (tests/engine/test_deploy_engine.py runs its second job)",
    ("docs/performance.md", ".venv/bin/python bench/suite.py --json results/bench-suite.json"
     "   # everything, ~6 min idle"): "benchmarks of minutes, not tests",
    ("docs/performance.md", 'set -a; eval "$(scripts/engine.sh up)"; set +a'):
        "a benchmark through the Docker engine",
    ("docs/reference/cli.md", "rpsagg-client --server a.example.org:50051 --token-file "
     "c0.token --tls-ca ca.pem"): "another machine's server and a reader's token",
    ("docs/reproduction.md", "scripts/setup-env.sh test                    # installs "
     "rpsagg-experiments (experiments/) and"):
        "the paper's experiments: an hour on two cores (tests/unit/test_experiments.py runs "
        "each on reduced grids)",
    ("docs/scaling.md", "pip install 'rpsagg-server[ray]'"):
        "a Ray cluster of several machines (tests/service/test_decode_ray.py runs a local "
        "one)",
    ("docs/scaling.md", "RPSAGG_SERVER_IMAGE=rpsagg-ray:latest     # the server runs the Ray "
     "nodes' image"): "a .env file's lines (the Ray profile runs in "
     "tests/engine/test_deploy_engine.py)",
    ("docs/scaling.md", "# on the machine with the head: publish its GCS port to the private "
     "network, e.g. in a"): "several machines",
    ("docs/service.md", "# server (TLS and tokens are required unless --insecure is given "
     "explicitly)"): "two machines, a reader's certificates and tokens (HOST)",
    ("examples/flower-fashion-mnist/README.md", "scripts/setup-env.sh test            # from "
     "the repository root: creates .venv-flower"):
        "the example's runs, tens of minutes (tests/flower/test_e2e.py runs its app on both "
        "engines)",
    ("examples/flower-fashion-mnist/README.md", "flower-superlink --insecure "
     "--disable-runtime-dependency-installation --port 9093  # add --simulation for Ray"):
        "a SuperLink and SuperNodes (tests/flower/test_e2e.py starts them)",
    ("examples/flower-fashion-mnist/README.md", "cd examples/flower-fashion-mnist"):
        "the benchmark: hours on two cores",
    ("examples/flower-fashion-mnist/README.md", "../../.venv-flower/bin/python frontier.py "
     "--out measured/frontier      # ~25 min on 2 cores"):
        "the frontier: 36 training runs, ~25 min on two cores (tests/flower/test_frontier.py "
        "runs the script on a small run)",
    ("docs/flower-start.md", 'pip install ./common "./flower[simulation]"'):
        "an install into the reader's environment (scripts/setup-env.sh test installs the "
        "same into .venv-flower, where tests/flower/test_quickstart_app.py runs the app)",
    ("examples/flower-quickstart/README.md", 'pip install ./common "./flower[simulation]"'):
        "the same install, as above",
    ("docs/flower.md", ".venv-flower/bin/python examples/flower-fashion-mnist/link_bytes.py "
     "--models cnn wide --nodes 3 --rounds 3"):
        "a benchmark of minutes on real Flower processes (tests/flower/test_link_bytes.py "
        "checks its counting proxy to the byte)",
    ("docs/flower-start.md", "cd examples/flower-quickstart"):
        "Flower's local SuperLink on fixed ports, left running; "
        "tests/flower/test_quickstart_app.py runs the app with flwr run on a SuperLink of "
        "its own and checks the run's status",
}

SHELL = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(ROOT.glob("examples/*/README.md"))]


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in _pages():
        for body in SHELL.findall(page.read_text(encoding="utf-8")):
            first = next(line for line in body.splitlines() if line.strip())
            out.append((page.relative_to(ROOT).as_posix(), first.rstrip()))
    return out


def test_every_shell_block_runs_in_a_test_or_is_a_named_placeholder() -> None:
    blocks = set(_blocks())
    assert not RUNS.keys() & PLACEHOLDERS.keys()
    unnamed = blocks - RUNS.keys() - PLACEHOLDERS.keys()
    assert not unnamed, sorted(unnamed)
    stale = (RUNS.keys() | PLACEHOLDERS.keys()) - blocks
    assert not stale, sorted(stale)
    assert all(reason.strip() for reason in PLACEHOLDERS.values())


@pytest.mark.parametrize("page, test", sorted({(p, t) for (p, _), t in RUNS.items()}))
def test_the_test_that_runs_a_block_exists_and_reads_its_page(page: str, test: str) -> None:
    path, name = test.split("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    assert re.search(rf"^def {name}\(", source, re.M), test
    stem = Path(page).name if page != "README.md" else "README.md"
    assert stem in source or Path(page).name in source, (test, page)
