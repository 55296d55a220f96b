"""End to end with Flower's own processes on 127.0.0.1: a SuperLink, two SuperNodes and
``flwr run`` of the Fashion-MNIST example app with Rand-Proj-Spatial.

Bounded: the SuperLink must answer within 60 s, the run must finish within 300 s
(pytest-timeout ends the test at 420 s); every process runs in its own process group and
the test checks that none is left afterwards.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

from federation import LocalFederation, live_members  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_supernodes_train_with_compressed_updates(tmp_path: Path) -> None:
    results = tmp_path / "rps.json"
    fed = LocalFederation(2, workdir=tmp_path / "fed")
    with fed:
        groups = [p.pid for p in fed.procs]
        fed.run(EXAMPLE, {
            "method": "rand-proj-spatial", "k": 785, "clients": 2, "num-server-rounds": 2,
            "examples-per-client": 300, "results-path": str(results),
        }, timeout=300)
    assert not any(live_members(g) for g in groups), "a Flower process outlived the federation"

    out = json.loads(results.read_text())
    assert out["d"] == 7850 and sorted(out["rounds"]) == ["0", "1", "2"]
    for rnd in ("1", "2"):
        r = out["rounds"][rnd]
        # both nodes' replies decoded; a tenth of the floats, raw bytes instead of .npy
        assert r["rpsagg.n-prime"] == 2
        assert r["rpsagg.payload-bytes"] == 2 * (8 + 4 * 785)
        assert r["rpsagg.compression-ratio"] > 8
        assert r["train-loss"] > 0  # the ClientApps' metrics, aggregated as by FedAvg
    # the zero model predicts one class (accuracy 0.1 on the balanced test set); two rounds
    # of SGD on 600 images, sent compressed, must have learnt something real
    acc = [out["rounds"][r]["test-accuracy"] for r in ("0", "1", "2")]
    assert acc[0] == pytest.approx(0.1)
    assert acc[2] > 0.4, f"test accuracy per round: {acc}"
