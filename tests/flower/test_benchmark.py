"""The example's benchmark (examples/flower-fashion-mnist/benchmark.py), run small: the
CNN with BatchNorm on 2 clients for one round, evaluated on the test set's first 1,000
images (``--test-examples``), FedAvg and the 4-bit Rand-Proj-Spatial configurations.

What the README's tables rest on: bytes up counted from the replies on the wire (FedAvg's
reply 90,113 B; the ~30x budget at most 1/30 of it on the wire), every compressed round
decoded from both replies with its decode time reported, a rerun giving the same numbers
(everything seeded, Flower's node sampling included, the thread pools pinned) and the
machine, versions and threads recorded; on a second thread count the bytes are the same and
the accuracies close.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

import benchmark  # noqa: E402

ARGS = ["--tasks", "fmnist", "--clients", "2", "--rounds", "1", "--examples-per-client", "64",
        "--test-examples", "1000", "--only", "4-bit"]
METRICS = ("test-accuracy", "test-loss", "bytes-up")


def _run(out: Path, threads: int = 1) -> list[dict]:
    assert benchmark.main([*ARGS, "--threads", str(threads), "--out", str(out)]) == 0
    return list(json.loads((out / "fmnist.json").read_text()))


@pytest.mark.timeout(300)
def test_small_benchmark_counts_bytes_and_repeats_exactly(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    first = _run(tmp_path / "a")
    table = capsys.readouterr().out
    labels = [(r["label"], r["control"]) for r in first]
    assert labels[0] == ("FedAvg", "none") and len(labels) == 5  # 4-bit at 2 budgets, +-VC
    fedavg = first[0]["rounds"]["1"]
    assert fedavg["payload-bytes-up"] == 2 * 84_996  # two state_dicts in NumPy's format
    assert fedavg["bytes-up"] == 2 * 90_113  # on the wire: headers, metadata, ids
    env = first[0]["environment"]
    assert env["threads"] == env["torch-threads"] == 1
    assert {"torch", "numpy", "flwr", "rpsagg"} <= set(env["versions"]) and env["cpu-count"]
    for res in first[1:]:
        rnd = res["rounds"]["1"]
        assert rnd["rpsagg.decode-seconds"] > 0
        # the budgets are set on the wire: k = 4,096 4-bit codes for ~30x (30.1x), 400 for
        # ~80x (78.6x; 100x is below a reply's overhead alone)
        wire_ratio = 30 if res["k"] == 4096 else 78
        assert rnd["bytes-up"] * wire_ratio <= fedavg["bytes-up"], res["label"]
        assert rnd["bytes-up"] == rnd["rpsagg.bytes-up"]  # the strategy's count agrees
        # the strategy's FedAvg figure counts no two arrays alike; FedAvg's real replies
        # here share one (two BatchNorm layers' equal num_batches_tracked): 371 B less
        assert rnd["rpsagg.compression-ratio"] == pytest.approx(
            fedavg["bytes-up"] / rnd["bytes-up"], rel=1e-2)
    assert "| Rand-Proj-Spatial k=4096, 4-bit | none |" in table
    assert "1 thread(s);" in table
    assert (tmp_path / "a" / "fmnist.png").stat().st_size > 10_000
    again = _run(tmp_path / "b")
    for a, b in zip(first, again, strict=True):
        for key in METRICS:
            assert a["rounds"]["1"][key] == b["rounds"]["1"][key], (a["label"], key)
    threads = torch.get_num_threads()
    try:  # a second thread count: other float sums, the same bytes, close accuracies
        other = _run(tmp_path / "c", threads=2)
    finally:
        torch.set_num_threads(threads)
    assert other[0]["environment"]["threads"] == 2
    for a, c in zip(first, other, strict=True):
        assert a["rounds"]["1"]["bytes-up"] == c["rounds"]["1"]["bytes-up"], a["label"]
        assert abs(a["rounds"]["1"]["test-accuracy"] - c["rounds"]["1"]["test-accuracy"]
                   ) < 0.05, a["label"]


@pytest.mark.timeout(300)
def test_partial_benchmark_head_only_clients(tmp_path: Path) -> None:
    """Head-only training leaves every array but the head exactly as received, and names
    an unknown parameter. ``--partial`` (2 clients, one round; node 2 fine-tunes the head
    alone): its five runs, the partial reply smaller on the wire than the full one and
    decoded (``partial="allow"``); ``--partial`` is refused for the wide task."""
    from fmnist_app import cnn

    arrays = cnn.initial(3)
    x, y = torch.zeros((8, 1, 28, 28)), torch.arange(8).numpy() % 10
    head, _ = cnn.train(arrays, x + 1.0, y, epochs=1, lr=0.1, batch=4, seed=1,
                        trainable=cnn.HEAD)
    for key in arrays:
        same = head[key].numpy().tobytes() == arrays[key].numpy().tobytes()
        assert same == (key not in cnn.HEAD), key
    with pytest.raises(ValueError, match="trainable: no parameters"):
        cnn.train(arrays, x, y, epochs=1, lr=0.1, batch=4, seed=1, trainable=("fc.w",))

    argv = ["--tasks", "fmnist", "--clients", "2", "--rounds", "1",
            "--examples-per-client", "64", "--test-examples", "1000", "--partial",
            "--threads", "1",
            "--out", str(tmp_path)]
    assert benchmark.main(argv) == 0
    runs = {r["label"]: r for r in json.loads((tmp_path / "fmnist.json").read_text())}
    assert [r["client-mix"] for r in runs.values()] == [
        "all", "mixed", "all", "mixed", "mixed-partial"]
    full, partial = (runs[f"Rand-Proj-Spatial k=4096, 4-bit, even nodes train the head, "
                          f"reply {how}"]["rounds"]["1"] for how in ("in full", "with it alone"))
    assert partial["bytes-up"] < full["bytes-up"]
    assert partial["rpsagg.decode-seconds"] > 0 and 0.0 < partial["test-accuracy"] <= 1.0
    with pytest.raises(SystemExit):
        benchmark.main(["--tasks", "wide", "--partial", "--out", str(tmp_path)])
