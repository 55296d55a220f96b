"""The quickstart app (``examples/flower-quickstart``), as ``docs/flower-start.md`` shows it.

* The page's titled code blocks are the app's files, byte for byte, so the page cannot
  drift from what runs here.
* ``flwr run`` of the app on Flower's simulation engine (a SuperLink started with
  ``--simulation``, two virtual SuperNodes on Ray; ``federation.py`` of the Fashion-MNIST
  example, runtime dependency installation off) for three rounds. ``flwr run --stream``
  exits with 0 even when the run fails, so the run's outcome is read from the SuperLink
  (``flwr list --run-id``: ``finished:completed``), then the ServerApp's lines: every round
  decoded, each reply compressed, the model learning.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.service

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower-quickstart"
PAGE = ROOT / "docs" / "flower-start.md"
sys.path.insert(0, str(ROOT / "examples" / "flower-fashion-mnist"))

from federation import LocalFederation, live_members  # noqa: E402

SHOWN = ("client_app.py", "server_app.py", "pyproject.toml")
# a fenced block with a title: ```python title="client_app.py" ... ```
BLOCK = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
ROUND = re.compile(r"^round (\d+): ([\d.]+)x fewer bytes up than FedAvg, "
                   r"eval-loss ([\d.]+)$", re.MULTILINE)


def test_the_page_shows_the_apps_files() -> None:
    blocks = BLOCK.findall(PAGE.read_text())
    assert sorted(name for name, _ in blocks) == sorted(SHOWN), (
        f"{PAGE.name} should show each of {SHOWN} once, as a titled block")
    for name, text in blocks:
        assert text == (APP / name).read_text(), (
            f"the {name} block of {PAGE.name} differs from {APP / name}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quickstart_app_runs_on_the_simulation_engine(tmp_path: Path) -> None:
    rounds = 3
    started = time.monotonic()
    fed = LocalFederation(2, workdir=tmp_path / "fed", simulation=True)
    with fed:
        # run() asks the SuperLink for the run's status: finished:completed, or it raises
        out = fed.run(APP, {"num-server-rounds": rounds}, timeout=180)
    assert fed.groups_ended and not any(live_members(g) for g in fed.groups_ended), (
        "a Flower process outlived the federation")

    lines = [(int(r), float(ratio), float(loss)) for r, ratio, loss in ROUND.findall(out)]
    assert [r for r, _, _ in lines] == list(range(1, rounds + 1)), out[-4000:]
    # d = 1,010 float32 coordinates, k = 250 of them a reply: a reply is ~3.4x smaller on
    # the wire than FedAvg's (its Message and metrics are the same size in both)
    assert all(3.0 < ratio < 4.0 for _, ratio, _ in lines), lines
    losses = [loss for _, _, loss in lines]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.6 * losses[0], losses
    assert "rpsagg_mod: rand-proj-spatial" in out  # the ClientApps' mod compressed
    print(f"quickstart: {rounds} rounds in {time.monotonic() - started:.1f} s: {lines}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failed_run_is_reported_as_failed(tmp_path: Path) -> None:
    """``flwr run --stream`` exits 0 when the ServerApp fails (here the strategy refuses
    k = 0 of d = 1,010): the federation's ``run`` reads the run's status from the SuperLink
    and raises, so no test or benchmark takes a failed run for a finished one."""
    fed = LocalFederation(2, workdir=tmp_path / "fed", simulation=True)
    with fed, pytest.raises(RuntimeError, match=r"flwr run \d+ ended finished:failed"):
        fed.run(APP, {"num-server-rounds": 1, "k": 0}, timeout=180)
