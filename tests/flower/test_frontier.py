"""The example's frontier script (``examples/flower-fashion-mnist/frontier.py``) on a small
run: budgets set by real replies, a ratio out of reach reported, the runs' bytes those the
plan found, the table and the plot written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

import benchmark  # noqa: E402
import frontier  # noqa: E402

ARGS = ["--models", "cnn", "--seeds", "1", "--rounds", "1", "--clients", "2",
        "--examples-per-client", "64", "--ratios", "30", "300", "--cnn-extra-ratio", "0",
        "--threads", "1"]


@pytest.mark.timeout(300)
def test_frontier_sets_budgets_by_real_replies(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert frontier.main([*ARGS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "cnn.json").read_text())
    plan = {p["ratio"]: p for p in saved["plan"]}
    task = benchmark.fmnist_task(2, 64, 1)
    fedavg = frontier.reply_bytes(task, None, 64)
    assert plan[30]["fedavg-reply-bytes"] == fedavg == 90_113  # the CNN's FedAvg reply
    # 30x: the largest k whose reply fits; 300x: not even one code fits
    k = plan[30]["k"]
    assert plan[30]["reply-bytes"] <= fedavg / 30 < frontier.reply_bytes(task, k + 1, 64)
    assert plan[300]["k"] is None and plan[300]["reply-bytes"] > fedavg / 300
    assert f"~300x is out of reach: {fedavg / 300:,.0f} B a reply" in out
    runs = saved["runs"]
    assert [(r["label"], r["control"].split(",")[0]) for r in runs] == [
        ("FedAvg", "none"), (f"~30x, k={k}", "none"), (f"~30x, k={k}", "error feedback")]
    d = benchmark.compressed_size(task)
    assert runs[2]["control"] == f"error feedback, lr {frontier.ef_lr(d, k):.3g}"
    # the runs' replies weigh what the plan measured (2 clients a round)
    assert [r["rounds"]["1"]["bytes-up"] for r in runs] == [
        2 * fedavg, 2 * plan[30]["reply-bytes"], 2 * plan[30]["reply-bytes"]]
    assert "| FedAvg | FedAvg's | 90,113 | 1.0x |" in out
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
