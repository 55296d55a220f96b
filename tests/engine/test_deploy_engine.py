"""docker-compose.yml on a real Docker engine (``scripts/engine.sh``), as users run it.

Every test builds with the real images (Compose v2, BuildKit; built once per session, the
engine's build cache reusing layers whose inputs did not change), runs its own compose
project, talks to it only through ports published on 127.0.0.1, waits on states with a
bound, and ends with ``down -v``. No skips: where no engine can be had, the tests fail.

1. plain: the server turns healthy, the job's rounds are all done, every client container
   exits 0, the API and /metrics answer from the host; meanwhile a second job, created from
   the host with ``rpsagg-jobs`` through the published HTTP port, runs to its end with the
   ``jobs`` profile's replicas (``RPSAGG_JOB``; the profile's ``jobs`` service waits for
   it), after the images were rebuilt under another project: neither re-creates the
   running server; then ``down`` and ``up`` again run a new default job to its end
   while the first one is kept (``/api/jobs``), and the created job with it.
2. the TLS override with the certificates of ``scripts/make-test-ca.sh``: the job ends, the
   published gRPC port speaks TLS under the test CA and refuses a plain-text client.
3. the ray profile: every round decoded by Ray tasks on the worker containers (the server's
   log names the nodes), no round failed, every long-running container healthy; the nodes'
   image decodes with the compiled tile products.
4. faults mid-job: ``docker kill`` of the server, then ``docker start``: the job resumes;
   ``up --build --force-recreate`` (every container new, as a changed image makes them) lets
   the job go on, the clients rejoining under the same ids (their container names); a killed
   client rejoins as the same client; a client beyond n is refused for good with exit
   status 3 and one line; at the end every submission a client saw acknowledged is in its
   decoded round.
5. docker-compose.vectors.yml (the user's own vectors, one file per replica): each round's
   estimate downloaded from the host is the library's decode of the stored messages.
6. the compiled kernels: both images load ``rpsagg._fast`` and have no compiler; the server
   image's decode runs the tile products and decodes the host's messages (an SRHT round
   and an hblocks one) to the host library's bits.
7. the README's compose block, run by bash as written: every command succeeds, the job it
   creates ends done and its replicas exit 0.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_util import (
    COMPOSE,
    COMPOSE_TLS,
    ROOT,
    Project,
    build_images,
    docker,
    engine,
    get_json,
    get_text,
    project,
    wait_for,
)

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("docker_engine")]

ACK = re.compile(r"^\[(?P<cid>[^\]]+)\] round (?P<rid>\d+): sent .*, acked as \d+ of \d+",
                 re.MULTILINE)

# what a container's library runs: the compiled module, the product path, numpy and scipy
KERNELS = """
import json, numpy, scipy, rpsagg, rpsagg.spec as s
from rpsagg.projections import product_path
print(json.dumps({"native": getattr(s.NATIVE, "__file__", None),
                  "hblocks": hasattr(s.NATIVE, "hb_pipe"), "products": product_path(),
                  "fwht": rpsagg.FWHT_BACKEND, "numpy": numpy.__version__,
                  "scipy": scipy.__version__}))
"""

# decodes the rounds of an .npz on stdin (NAME_nkd, NAME_seeds, NAME_values), writes the
# estimates as an .npz on stdout
DECODE = """
import io, sys, numpy as np, rpsagg
src = np.load(io.BytesIO(sys.stdin.buffer.read()))
out = {}
for name in sorted({f.rpartition("_")[0] for f in src.files}):
    n, k, d = (int(v) for v in src[name + "_nkd"])
    est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
    out[name] = est.decode([rpsagg.Encoded(est.name, int(s), k, d, v)
                            for s, v in zip(src[name + "_seeds"], src[name + "_values"])])
buf = io.BytesIO()
np.savez(buf, **out)
sys.stdout.buffer.write(buf.getvalue())
"""


@pytest.fixture
def plain(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    build_images("server", "client")
    yield from project(request, tmp_path, RPSAGG_N="3", RPSAGG_ROUNDS="4",
                       RPSAGG_ROUND_TIMEOUT="20")


def _check_job(p: Project, rounds: int, n: int) -> None:
    """Every round of the job is done with all n clients, and every client exited 0."""
    job = p.wait_job_over(timeout=180)
    assert job["state"] == "done" and job["steps_done"] == rounds, job
    items = get_json(p.url() + f"/api/rounds?limit={rounds + 5}")["rounds"]
    assert len(items) == rounds and all(r["state"] == "done" for r in items), items
    clients = p.wait_exited("client", timeout=90)
    assert len(clients) == n
    assert all(c["ExitCode"] == 0 for c in clients), clients


def _jobs_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``rpsagg-jobs --url URL ARGS`` on the host (the client package of this checkout)."""
    return subprocess.run([sys.executable, "-m", "rpsagg_client.jobs_cli", "--url", url, *args],
                          capture_output=True, text=True, timeout=60)


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with these labels in a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values = [smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples
              if smp.name == name and smp.labels == labels]
    assert len(values) == 1, (name, labels, values)
    return float(values[0])


def _container_id(p: Project, service: str) -> str:
    """The id of the service's one container."""
    ids = [c["ID"] for c in p.containers() if c["Service"] == service]
    assert len(ids) == 1, ids
    return str(ids[0])


def _jobs(base: str) -> dict[str, dict[str, Any]]:
    """``/api/jobs``'s jobs by id."""
    return {j["id"]: j for j in get_json(base + "/api/jobs")["jobs"]}


@pytest.mark.timeout(600)
def test_plain_job_then_down_and_up_runs_a_second(plain: Project) -> None:
    p = plain
    p.profiles = ["jobs"]  # its services start only when scaled; `down` removes them too
    p.compose("up", "-d")
    p.wait_healthy("server", timeout=120)
    base = p.url()
    assert get_text(base + "/readyz")
    assert not [c for c in p.containers() if c["Service"] in ("jobs", "job-client")]

    # a second job, created from the host through the published port, and its replicas
    d, rounds2 = 256, 3
    made = _jobs_cli(base, "create", "estimator=rand-k", "n=2", "k=32", f"d={d}",
                     f"rounds={rounds2}", "task=mean", "data=synthetic",
                     "round_timeout=20")
    assert made.returncode == 0, made.stderr
    job = made.stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", job), made.stdout
    # the images rebuilt meanwhile under another project (their labels name it, so the tags
    # move to new image ids): the jobs profile's services leave the running server alone
    server_id = _container_id(p, "server")
    build_images("server", "client", project=f"{p.name}-rebuild")
    tagged = docker("image", "inspect", "--format", "{{.Id}}", "rpsagg-server:latest").strip()
    assert docker("inspect", "--format", "{{.Image}}", server_id).strip() != tagged
    p.configure(RPSAGG_JOB=job)
    p.compose("up", "-d", "--scale", "job-client=2", "job-client")
    assert _container_id(p, "server") == server_id

    _check_job(p, rounds=4, n=3)
    status = p.status()
    assert status["config"]["n"] == 3 and status["clients_joined"] == 3
    # the clients' ids are their compose names, not container ids
    assert sorted(c["client_id"] for c in status["clients"]) == [
        f"{p.name}-client-{i}" for i in (1, 2, 3)]
    # the compose service of rpsagg-jobs waits for the second job (bounded, polling)
    waited = p.compose_run("run", "--rm", "-T", "jobs", "wait", job, "--timeout", "150",
                           timeout=200)
    assert waited.returncode == 0, waited.stderr[-2000:]
    assert _container_id(p, "server") == server_id
    replicas = p.wait_exited("job-client", timeout=90)
    assert len(replicas) == 2 and all(c["ExitCode"] == 0 for c in replicas), replicas
    jobs = _jobs(base)
    assert set(jobs) == {"default", job}, jobs
    assert jobs["default"]["state"] == "done" and jobs["default"]["rounds_done"] == 4, jobs
    second = jobs[job]
    assert second["state"] == "done" and second["rounds_done"] == rounds2, second
    assert second["clients"] == 2 and second["bytes_up"] > 0, second
    items = get_json(base + f"/api/jobs/{job}/rounds?limit=10")["rounds"]
    assert len(items) == rounds2 and all(r["state"] == "done" for r in items), items
    with urllib.request.urlopen(base + f"/api/jobs/{job}/rounds/{rounds2}/estimate?format=npy",
                                timeout=10) as resp:
        import numpy as np

        estimate = np.load(io.BytesIO(resp.read()))
    assert estimate.shape[-1] == d and np.isfinite(estimate).all(), estimate.shape
    assert {f"{p.name}-job-client-{i}" for i in (1, 2)} == {
        c["client_id"] for c in get_json(base + f"/api/jobs/{job}/status")["clients"]}
    metrics = get_text(base + "/metrics")
    assert _sample(metrics, "rpsagg_rounds_total", state="done", job="default") == 4
    assert _sample(metrics, "rpsagg_rounds_total", state="done", job=job) == rounds2
    assert _sample(metrics, "rpsagg_submissions_total", status="ok", job="default") == 12
    assert _sample(metrics, "rpsagg_submissions_total", status="ok", job=job) == 2 * rounds2
    assert get_json(base + "/api/jobs")["past_jobs"] == []

    # a second `up` after `down` (the volume keeps the finished job): a new job, to its end;
    # the created job stays listed, done
    p.compose("down", "--timeout", "10")
    assert not p.containers()
    p.compose("up", "-d")
    p.wait_healthy("server", timeout=120)
    _check_job(p, rounds=4, n=3)
    listed = get_json(p.url() + "/api/jobs")
    past = listed["past_jobs"]
    assert len(past) == 1 and past[0]["state"] == "done" and past[0]["rounds_done"] == 4, past
    kept = {j["id"]: j for j in listed["jobs"]}
    assert kept[job]["state"] == "done", kept
    assert "Exited (0)" not in p.logs("server")  # the server itself never restarted


def _readme_compose_block() -> str:
    """The bash block under the README's "In Docker Compose" heading, as written."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## In Docker Compose", 1)[1]
    m = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert m is not None, "the README's compose section has no bash block"
    return m.group(1)


@pytest.mark.timeout(900)
def test_readme_compose_block_runs_as_written(tmp_path: Path) -> None:
    """The README's compose commands, run by bash as they are written (``-e``: every one must
    succeed), in the checkout. Only the environment isolates them from the developer's: the
    project name, ports picked by compose on 127.0.0.1 and an empty env file (what
    ``COMPOSE_PROJECT_NAME``, ``RPSAGG_*_PUBLISH`` and ``COMPOSE_ENV_FILES`` set without
    changing a command). The created job must end done (its ``wait`` exits 0 only then),
    with every replica exiting 0; ``down -v`` afterwards removes the volume."""
    block = _readme_compose_block()
    assert "docker compose up -d --build" in block and "jobs wait $JOB" in block, block
    build_images("server", "client")  # the session's images: the block's --build reuses them
    name = f"rpsagg-t{socket.gethostname()[:8].lower()}-readme-{secrets.token_hex(3)}"
    name = re.sub(r"[^a-z0-9-]+", "-", name)
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    env = engine()
    env.update(COMPOSE_PROJECT_NAME=name, COMPOSE_ENV_FILES=str(env_file),
               RPSAGG_GRPC_PUBLISH="127.0.0.1:", RPSAGG_HTTP_PUBLISH="127.0.0.1:")
    # the job's replicas exit once they have seen it done; `down` (the block's last line)
    # removes them, so before it their states are waited for (bounded) and written down
    last = block.rstrip().splitlines()[-1]
    assert last.startswith("docker compose --profile jobs down"), last
    replicas = tmp_path / "replicas.txt"
    check = (
        "states() { docker compose --profile jobs ps -a --format '{{.Service}} {{.State}} "
        "{{.ExitCode}}' job-client; }\n"
        "for _ in $(seq 240); do states | grep -qv ' exited ' || break; sleep 0.5; done\n"
        f"states > {replicas}\n")
    script = tmp_path / "readme-compose.sh"
    script.write_text("set -e\n" + block.replace(last, check + last))
    try:
        out = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=840)
        assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
        # `wait`'s last line: the created job is done with all its rounds
        assert re.search(r"^rpsagg-jobs: job \S+: done, (\d+)/\1 rounds done, ", out.stderr,
                         re.MULTILINE), out.stderr[-3000:]
        rows = [line.split() for line in replicas.read_text().splitlines() if line.strip()]
        assert len(rows) == 4 and all(r == ["job-client", "exited", "0"] for r in rows), rows
    finally:
        subprocess.run(["docker", "compose", "--profile", "jobs", "down", "-v",
                        "--remove-orphans", "--timeout", "10"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)


@pytest.mark.timeout(600)
def test_tls_override(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    build_images("server", "client")
    certs = tmp_path / "certs"
    subprocess.run([str(ROOT / "scripts" / "make-test-ca.sh"), "-o", str(certs)], check=True,
                   capture_output=True, timeout=60)
    gen = project(request, tmp_path, RPSAGG_N="2", RPSAGG_ROUNDS="3",
                  RPSAGG_CERTS=str(certs))
    p = next(gen)
    try:
        p.files = [COMPOSE, COMPOSE_TLS]
        p.compose("up", "-d")
        p.wait_healthy("server", timeout=120)
        _check_job(p, rounds=3, n=2)
        assert p.status()["config"]["settings"]["tls"] is True
        # creating a job needs the admin token the override mounts (--admin-tokens)
        http_port = int(p.compose("port", "server", "8000").strip().rpartition(":")[2])
        body = json.dumps({"n": 1, "k": 8, "d": 64, "task": "mean", "rounds": 1}).encode()
        for token, status in ((None, 401), ("not-a-token", 403),
                              ((certs / "admin.token").read_text().strip(), 201)):
            req = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/jobs", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
            if token is not None:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, timeout=10) as res:
                    got = res.status
            except urllib.error.HTTPError as exc:
                got = exc.code
            assert got == status, (token is None, got)
        grpc_port = int(p.compose("port", "server", "50051").strip().rpartition(":")[2])
        # TLS under the test CA, for the name the certificate carries
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            assert tls.selected_alpn_protocol() == "h2"
        # a plain-text HTTP/2 client gets no gRPC answer from a TLS port
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            with pytest.raises(grpc.RpcError) as err:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds,
                                 options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        next(gen, None)


@pytest.mark.timeout(900)
def test_ray_profile_decodes_every_round_on_the_workers(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    settings = {"RPSAGG_SERVER_IMAGE": "rpsagg-ray:latest", "RPSAGG_SERVER_EXTRAS": "[ray]",
                "RPSAGG_DECODE_BACKEND": "ray", "RPSAGG_RAY_TOKEN": secrets.token_hex(32),
                "RPSAGG_RAY_WORKERS": "2", "RPSAGG_N": "3", "RPSAGG_ROUNDS": "4",
                "RPSAGG_ROUND_TIMEOUT": "60"}
    build_images("ray-head", "client", profile="ray")
    # the Ray nodes' image (server, head, workers) decodes with the compiled tile products
    kernels = json.loads(docker("run", "--rm", "--entrypoint", "python", "rpsagg-ray:latest",
                                "-c", KERNELS))
    assert kernels["products"] == "tiles" and kernels["hblocks"], kernels
    gen = project(request, tmp_path, **settings)
    p = next(gen)
    try:
        p.profiles = ["ray"]
        p.compose("up", "-d")
        p.wait_healthy("server", timeout=240)
        _check_job(p, rounds=4, n=3)
        # which nodes decoded: the worker containers (by host name = container id), never the
        # server or the head (both have no CPUs for tasks)
        log = p.logs("server")
        assert "decode error" not in log.lower()
        nodes = re.findall(r"\[Ray\] (\d+) decode tasks ran on (.+)$", log, re.MULTILINE)
        assert len(nodes) == 4, log[-3000:]
        hosts = {h for _, line in nodes for h in re.findall(r"\(([0-9a-f]{12})\)", line)}
        workers = {docker("inspect", "-f", "{{.Config.Hostname}}", c["Name"]).strip()
                   for c in p.containers() if c["Service"] == "ray-worker"}
        assert hosts and hosts <= workers, (hosts, workers)
        # every long-running container is healthy, the clients are done
        for service in ("server", "ray-head", "ray-worker"):
            p.wait_healthy(service, timeout=120)
    finally:
        next(gen, None)


def _acked(log: str) -> set[tuple[str, int]]:
    return {(m["cid"], int(m["rid"])) for m in ACK.finditer(log)}


@pytest.mark.timeout(900)
def test_server_killed_and_clients_recreated_mid_job(plain: Project) -> None:
    p = plain
    rounds = 150
    p.configure(RPSAGG_ROUNDS=str(rounds), RPSAGG_ROUND_TIMEOUT="8")
    p.compose("up", "-d")
    p.wait_healthy("server", timeout=120)

    def steps() -> int:
        return int((p.status().get("job") or {}).get("steps_done", 0))

    def at_least(k: int) -> bool:
        return steps() >= k

    # 1. kill -9 of the server mid-job, then start it again: the job resumes
    wait_for("round 5", lambda: at_least(5), timeout=120, every=0.2)
    server = next(c["Name"] for c in p.containers() if c["Service"] == "server")
    docker("kill", server)
    docker("start", server)
    p.wait_healthy("server", timeout=120)
    before = steps()
    assert before < rounds, "the job ended before the kill: make it longer"

    # 2. `up --build` mid-job re-creating every container (as a changed image would): the
    # server resumes the job from the volume, the new client containers rejoin as the same
    # clients (their ids are their names)
    wait_for("more rounds after the restart", lambda: at_least(before + 5), timeout=180)
    assert steps() < rounds - 20, "the job is nearly over before the re-creation"
    old = {c["Name"]: c["ID"] for c in p.containers()}
    logs_before = p.logs("client")
    p.compose("up", "-d", "--build", "--force-recreate")
    new = {c["Name"]: c["ID"] for c in p.containers()}
    assert new.keys() == old.keys() and not set(new.values()) & set(old.values())
    new = {name: cid for name, cid in new.items() if "-client-" in name}
    p.wait_healthy("server", timeout=120)

    # 3. a client beyond n is refused for good: exit 3, one line, no retries
    run = p.compose_run("run", "--rm", "--no-deps", "-T", "client", timeout=120)
    assert run.returncode == 3, (run.returncode, run.stderr[-2000:])
    refusal = [ln for ln in run.stderr.splitlines() if ln.startswith("rpsagg-client:")]
    assert len(refusal) == 1 and "RESOURCE_EXHAUSTED" in refusal[0], run.stderr[-2000:]

    # 4. a killed client container, started again, rejoins as the same client
    victim = sorted(new)[0]
    mark = steps() + 3
    wait_for("more rounds", lambda: at_least(mark), timeout=180)
    assert steps() < rounds - 5, "the job is nearly over before the client's kill"
    docker("kill", victim)
    docker("start", victim)

    _check_job(p, rounds=rounds, n=3)
    status = p.status()
    assert sorted(c["client_id"] for c in status["clients"]) == sorted(new)
    # nothing acknowledged is lost: every ack a client printed is in its decoded round
    acked = _acked(logs_before) | _acked(p.logs("client"))
    assert len(acked) >= rounds  # the clients did see acks throughout
    arrived: dict[int, set[str]] = {}
    for rid in sorted({r for _, r in acked}):
        view = get_json(p.url() + f"/api/rounds/{rid}")
        assert view["state"] == "done", view
        arrived[rid] = set(view["clients"]["arrived"])
    lost = sorted((c, r) for c, r in acked if c not in arrived[r])
    assert not lost, f"acknowledged but not decoded: {lost}"
    joins = re.findall(rf"\[Client\] {re.escape(victim)} joined as index (\d+)", p.logs("client"))
    assert len(joins) >= 2 and len(set(joins)) == 1, joins


@pytest.mark.timeout(600)
def test_own_vectors_override(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """docker-compose.vectors.yml: replica N reads vectors/N.npy, the server learns d from
    the first join; each round's estimate, downloaded from the host, is the library's
    decode of the messages the server stored, bit for bit."""
    import numpy as np
    from service_util import round_messages

    from rpsagg import make_estimator

    n, k, d, rounds = 3, 50, 200, 2
    build_images("server", "client")
    folder = tmp_path / "vectors"
    folder.mkdir()
    folder.chmod(0o755)
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((rounds, d))
    xs = {i: shared + 0.5 * rng.standard_normal((rounds, d)) for i in range(1, n + 1)}
    for i, x in xs.items():
        np.save(folder / f"{i}.npy", x)
        (folder / f"{i}.npy").chmod(0o644)
    gen = project(request, tmp_path, RPSAGG_N=str(n), RPSAGG_K=str(k),
                  RPSAGG_ROUNDS=str(rounds), RPSAGG_VECTORS_DIR=str(folder))
    p = next(gen)
    try:
        p.files = [COMPOSE, ROOT / "docker-compose.vectors.yml"]
        p.compose("up", "-d")
        _check_job(p, rounds=rounds, n=n)
        status = p.status()
        assert status["config"]["d"] == d  # learnt from the first join
        got = {}
        for rid in range(1, rounds + 1):
            with urllib.request.urlopen(p.url() + f"/api/rounds/{rid}/estimate?format=npy",
                                        timeout=10) as resp:
                got[rid] = np.load(io.BytesIO(resp.read()))
        # the server's whole data folder, its write-ahead log included (whether or not the
        # stop got to checkpoint it), copied once the server stopped writing
        p.compose("stop", "server")
        p.compose("cp", "server:/data", str(tmp_path / "data"))
        est = make_estimator("rand-proj-spatial", n=n, k=k, d=d)
        decoded = dict(round_messages(str(tmp_path / "data" / "rpsagg.db"), est.name, k, d))
        assert sorted(decoded) == list(range(1, rounds + 1))
        for rid, msgs in decoded.items():
            assert got[rid].shape == (d,)
            assert np.array_equal(got[rid], est.decode(msgs)), rid
        # which file each replica read: its index's vectors arrived (the round's clients)
        clients = sorted(c["client_id"] for c in status["clients"])
        assert clients == [f"{p.name}-client-{i}" for i in range(1, n + 1)]
    finally:
        next(gen, None)


def _host_kernels() -> dict[str, object]:
    import numpy
    import scipy

    import rpsagg
    from rpsagg import spec
    from rpsagg.projections import product_path

    return {"hblocks": hasattr(spec.NATIVE, "hb_pipe"), "products": product_path(),
            "fwht": rpsagg.FWHT_BACKEND, "numpy": numpy.__version__,
            "scipy": scipy.__version__}


@pytest.mark.timeout(600)
def test_images_run_the_compiled_kernels() -> None:
    """Both images load the compiled kernels (their build stage compiles them and fails
    without them) and carry no compiler; the server image's decode runs the tile products,
    as the host library does, and gives the host's bits for the same messages: an SRHT
    round (d a power of two, where the tiles and the numpy passes differ in the last bits)
    and an hblocks one (d = 3000)."""
    import numpy as np

    import rpsagg

    build_images("server", "client")
    host = _host_kernels()
    assert host["products"] == "tiles", "the host library was built without rpsagg._fast"
    for image in ("rpsagg-server:latest", "rpsagg-client:latest"):
        got = json.loads(docker("run", "--rm", "--entrypoint", "python", image, "-c", KERNELS))
        assert str(got.pop("native")).startswith("/opt/venv/lib/python3.11/site-packages/"
                                                   "rpsagg/_fast."), (image, got)
        # bit for bit needs the same path, numpy and scipy on both sides (docs/scaling.md)
        assert got == host, f"{image} runs {got}, the host {host}"
        compilers = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                           "command -v gcc cc c99 x86_64-linux-gnu-gcc || true")
        assert compilers.strip() == "", (image, compilers)

    rounds: dict[str, Any] = {}
    expected = {}
    for name, n, k, d in (("srht", 20, 128, 2**16), ("hblocks", 10, 64, 3000)):
        est = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d)
        rng = np.random.default_rng(d)
        xs = rng.standard_normal(d) + 0.5 * rng.standard_normal((n, d))
        msgs = [est.encode(x, seed=1000 + i) for i, x in enumerate(xs)]
        rounds[f"{name}_nkd"] = np.array([n, k, d])
        rounds[f"{name}_seeds"] = np.array([m.seed for m in msgs], dtype=np.uint64)
        rounds[f"{name}_values"] = np.stack([m.values for m in msgs])
        expected[name] = est.decode(msgs)
    buf = io.BytesIO()
    np.savez(buf, **rounds)
    run = subprocess.run(["docker", "run", "--rm", "-i", "--entrypoint", "python",
                          "rpsagg-server:latest", "-c", DECODE], input=buf.getvalue(),
                         env=engine(), capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    got = np.load(io.BytesIO(run.stdout))
    for name, want in expected.items():
        assert np.array_equal(got[name], want), (
            name, float(np.abs(got[name] - want).max() / np.abs(want).max()))


@pytest.mark.timeout(900)
def test_tls_override_with_an_https_dashboard_is_healthy(request: pytest.FixtureRequest,
                                                          tmp_path: Path) -> None:
    """The TLS override with ``RPSAGG_HTTP_TLS=true``: the dashboard serves HTTPS only, and
    the image's HEALTHCHECK speaks HTTPS to it (pinned to the server's own certificate), so
    the server turns healthy (before: "Remote end closed connection without response",
    unhealthy forever). /readyz answers over HTTPS under the test CA; plain HTTP gets no
    response."""
    import http.client

    build_images("server", "client")
    certs = tmp_path / "certs"
    subprocess.run([str(ROOT / "scripts" / "make-test-ca.sh"), "-o", str(certs)], check=True,
                   capture_output=True, timeout=60)
    gen = project(request, tmp_path, RPSAGG_N="2", RPSAGG_ROUNDS="2",
                  RPSAGG_CERTS=str(certs), RPSAGG_HTTP_TLS="true")
    p = next(gen)
    try:
        p.files = [COMPOSE, COMPOSE_TLS]
        p.compose("up", "-d", "server")
        p.wait_healthy("server", timeout=180)
        name = next(c["Name"] for c in p.containers() if c["Service"] == "server")
        health = json.loads(docker("inspect", "--format", "{{json .State.Health}}", name))
        assert health["Status"] == "healthy"
        assert any(r["ExitCode"] == 0 and "HTTPS 200" in r["Output"] for r in health["Log"])
        port = int(p.compose("port", "server", "8000").strip().rpartition(":")[2])
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        conn = http.client.HTTPSConnection("localhost", port, timeout=10, context=ctx)
        try:
            conn.request("GET", "/readyz")
            assert conn.getresponse().status == 200
        finally:
            conn.close()
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
                plain.request("GET", "/readyz")
                plain.getresponse()
        finally:
            plain.close()
    finally:
        next(gen, None)
