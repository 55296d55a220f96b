"""End to end with Flower's own processes on 127.0.0.1, both engines, and Ctrl-C.

* the deployment engine: a SuperLink, two SuperNodes and ``flwr run`` of the Fashion-MNIST
  example app with Rand-Proj-Spatial; and a run whose clients reply with some arrays
  only, which fails under the strategy's default;
* the simulation engine: a SuperLink started with ``--simulation`` and ``flwr run`` with
  two virtual SuperNodes on Ray (``flwr[simulation]``);
* ``run_comparison.py --quick`` interrupted with SIGINT while a run is in flight: no
  Flower process outlives it.

Flower's runtime dependency installation is off in every process (``federation.py``): the
app runs in .venv-flower, where rpsagg-flower is installed from the repository. Bounded:
the SuperLink must answer within 60 s, a run must finish within 300 s (pytest-timeout
ends a test at 420 s); every process runs in its own process group and each test checks
that none of the processes the federation started, nor their descendants, is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.service

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

from federation import LocalFederation, descendants, live_members, process_state  # noqa: E402

RUN = {"method": "rand-proj-spatial", "k": 785, "clients": 2, "num-server-rounds": 2,
       "examples-per-client": 300, "seed": 7}


def _check_run(out: dict) -> None:
    assert out["d"] == 7850 and sorted(out["rounds"]) == ["0", "1", "2"]
    for rnd in ("1", "2"):
        r = out["rounds"][rnd]
        # both nodes' replies decoded; a tenth of the floats, raw bytes instead of .npy
        assert r["rpsagg.n-prime"] == 2
        assert r["rpsagg.payload-bytes"] == 2 * (8 + 4 * 785)
        # on the wire (docs/flower.md, Bytes on the wire): ~7.1x, the replies' per-array and
        # per-record overhead beside the payload's ~10x
        assert r["rpsagg.compression-ratio"] > 6.5
        assert r["train-loss"] > 0  # the ClientApps' metrics, aggregated as by FedAvg
    # the int64 step counter travelled uncompressed: 300 images in batches of 64 are
    # 5 steps a round on each node, and its mean over the nodes is exact
    assert [out["rounds"][r]["steps"] for r in ("0", "1", "2")] == [0, 5, 10]
    # the zero model predicts one class (accuracy 0.1 on the balanced test set); two rounds
    # of SGD on 600 images, sent compressed, must have learnt something real
    acc = [out["rounds"][r]["test-accuracy"] for r in ("0", "1", "2")]
    assert acc[0] == pytest.approx(0.1)
    assert acc[2] > 0.4, f"test accuracy per round: {acc}"


def _run(tmp_path: Path, simulation: bool, **config: object) -> dict:
    """One run of the example app with ``RUN`` updated by ``config``; its results JSON."""
    results = tmp_path / "rps.json"
    fed = LocalFederation(2, workdir=tmp_path / "fed", simulation=simulation)
    with fed:
        fed.run(EXAMPLE, {**RUN, **config, "results-path": str(results)}, timeout=300)
    assert fed.groups_ended, "stop() ended no process group"
    assert not any(live_members(g) for g in fed.groups_ended), (
        "a Flower process outlived the federation")
    return dict(json.loads(results.read_text()))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_deployment_engine_trains_with_compressed_updates(tmp_path: Path) -> None:
    _check_run(_run(tmp_path, simulation=False))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_deployment_engine_trains_a_batchnorm_cnn(tmp_path: Path) -> None:
    """``model="cnn"``: the PyTorch CNN with BatchNorm (fmnist_app/cnn.py) as its state_dict,
    k = d/10 of its 20,586 weights, the running statistics and int64 counters uncompressed.
    300 images in batches of 32 are 10 steps a round on each node: the counter's mean is
    exact (0, 10, 20). Two rounds on 600 images must beat chance (0.1) by far."""
    out = _run(tmp_path, simulation=False, **{"model": "cnn", "k": 2058, "lr": 0.01,
                                              "batch-size": 32})
    assert out["model"] == "cnn" and out["d"] == 20586
    assert [out["rounds"][r]["steps"] for r in ("0", "1", "2")] == [0, 10, 20]
    for rnd in ("1", "2"):
        assert out["rounds"][rnd]["rpsagg.n-prime"] == 2
        assert out["rounds"][rnd]["rpsagg.payload-bytes"] == 2 * (8 + 4 * 2058)
    acc = [out["rounds"][r]["test-accuracy"] for r in ("0", "1", "2")]
    assert acc[2] > 0.4, f"test accuracy per round: {acc}"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_deployment_engine_partial_replies_fail_the_run_by_default(tmp_path: Path) -> None:
    """The CNN's clients fine-tune the classifier head alone and reply with it alone
    (``train-only="head"``, ``reply="trained"``). Under the strategy's default the run
    fails, ``flwr run`` saying which arrays the replies lack, instead of going on with an
    unchanged model. (With ``partial="allow"`` such replies train as full ones:
    ``test_frozen_partial.py``, and the example's ``benchmark.py --partial``.)"""
    head = {"model": "cnn", "k": 2058, "lr": 0.01, "batch-size": 32, "train-only": "head",
            "reply": "trained"}
    with pytest.raises(RuntimeError) as failed:
        _run(tmp_path, simulation=False, **head)
    text = str(failed.value)
    lacks = re.search(r"carries only some of the model's arrays: it lacks \[([^\]]*)\]", text)
    assert lacks is not None, text[-3000:]
    assert {"'conv1.weight'", "'bn2.running_var'"} <= set(lacks.group(1).split(", ")), lacks[0]
    assert "'fc.weight'" not in lacks.group(1), lacks[0]
    assert "partial='allow'" in text, text[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_simulation_engine_trains_with_compressed_updates(tmp_path: Path) -> None:
    """The same app and run config on Flower's simulation engine (Ray): the same checks
    (the virtual SuperNodes get their partition ids from the engine)."""
    out = _run(tmp_path, simulation=True)
    _check_run(out)
    assert "ray" in (tmp_path / "fed" / "flwr-run.log").read_text().lower()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ctrl_c_leaves_no_flower_process(tmp_path: Path) -> None:
    """SIGINT to run_comparison.py while a ServerApp runs: it exits with 130 and every
    process it had started (SuperLink, SuperNodes, flower-superexec in its own session,
    flwr-serverapp, flwr-clientapp) is gone."""
    with _sigint_as_at_a_terminal():
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE / "run_comparison.py"), "--quick", "--rounds", "50",
             "--out", str(tmp_path / "out")],
            cwd=EXAMPLE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    seen: set[int] = set()
    deadline = time.monotonic() + 180
    try:
        while True:  # until a flwr-serverapp runs under the script (bounded)
            tree = descendants([proc.pid])
            seen |= tree
            names = {_cmdline(p) for p in tree}
            if any("flwr-serverapp" in n for n in names) and any(
                    "flwr-clientapp" in n for n in names):
                break
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, f"no ServerApp within 180 s: {names}"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(_stuck(proc, seen)) from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out.decode()
    assert b"interrupted" in out
    deadline = time.monotonic() + 10
    while (alive := [p for p in seen if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, [_cmdline(p) for p in alive]


@contextlib.contextmanager
def _sigint_as_at_a_terminal() -> Iterator[None]:
    """SIGINT at its default in the processes started inside, as a terminal starts them.

    A test run in the background of a shell without job control (``./test.sh &``) has
    SIGINT ignored (POSIX), and an ignored signal stays ignored across ``exec``: the script
    would never see the Ctrl-C. A handler here instead is reset to the default at ``exec``,
    and Python then raises KeyboardInterrupt as at a terminal."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _stuck(proc: subprocess.Popen[bytes], seen: set[int]) -> str:
    """What a script that did not end after SIGINT was doing: its processes' states, and
    every thread's stack (SIGABRT: PYTHONFAULTHANDLER prints them before it dies)."""
    tree = sorted(seen | descendants([proc.pid]))
    states = [f"{p} {_state(p)} {_cmdline(p)[:120]}" for p in tree]
    with contextlib.suppress(OSError):  # its signals: pending, blocked, ignored, caught
        states.append(" ".join(line for line in Path(f"/proc/{proc.pid}/status").read_text()
                               .splitlines() if line.startswith(("ShdPnd", "Sig"))))
    os.kill(proc.pid, signal.SIGABRT)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        out = b"(no stack dump within 20 s)"
    return ("run_comparison.py did not end within 60 s of SIGINT; its processes then:\n"
            + "\n".join(states) + "\n" + out.decode(errors="replace")[-6000:])


def _state(pid: int) -> str:
    return process_state(pid) or "gone"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("gone", "Z")
