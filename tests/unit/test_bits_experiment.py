"""``rpsagg-experiments bits``: cost accounting, the Pareto frontier and the prior rule."""

from __future__ import annotations

import math

import pytest

from rpsagg._correlation import CorrelationTracker
from rpsagg_experiments.bits import Point, floored_prior, pareto, points, run_point

pytestmark = pytest.mark.unit


def test_pareto_keeps_only_points_no_cheaper_point_beats() -> None:
    rows = [{"bits_per_client": b, "mse": m, "id": i}
            for i, (b, m) in enumerate([(10, 5.0), (20, 6.0), (20, 4.0), (30, 4.0), (40, 1.0),
                                        (5, 9.0)])]
    assert [r["id"] for r in pareto(rows)] == [5, 0, 2, 4]


def test_floored_prior_never_rounds_up_to_max() -> None:
    tracker = CorrelationTracker()
    assert floored_prior(tracker, 10) is None
    tracker.fraction = 0.999  # type: ignore[misc]
    assert floored_prior(tracker, 10) == pytest.approx(0.98 * 9)
    tracker.fraction = 1.0  # type: ignore[misc]
    assert floored_prior(tracker, 10) == pytest.approx(9.0)


def test_grid_covers_the_issue() -> None:
    full = points(quick=False)
    synthetic = [p for p in full if p.setting != "power-iteration"]
    assert {p.setting for p in full} == {"R=0", "R=4.5", "R=9", "power-iteration"}
    for scheme in ("rand-k", "rand-k-spatial", "rand-proj-spatial"):
        assert {p.bits for p in synthetic if p.scheme == scheme} == {1, 2, 4, 8, 32}
    assert {p.bits for p in full if p.scheme == "eden"} == {1, 2, 4, 8}
    assert {p.bits for p in full if p.scheme == "qsgd"} == {1, 2, 4, 8}
    assert all(10 * p.k <= 1024 for p in full if p.scheme.startswith("rand-proj-spatial"))


@pytest.mark.parametrize(
    ("point", "size"),
    [
        (Point("R=9", "rand-proj-spatial", 32, 4, 3, r=9.0), 64 + 4 * 32 + 32),
        (Point("R=0", "rand-k", 16, 32, 3, r=0.0), 64 + 32 * 16),
        (Point("R=4.5", "eden", 1024, 2, 3, r=4.5), 64 + 2 * 1024 + 32),
        (Point("R=4.5", "qsgd", 1024, 2, 3, r=4.5), 64 + 3 * 1024 + 32),
    ],
)
def test_rows_report_the_message_size(point: Point, size: int) -> None:
    row = run_point(point)
    assert row["bits_per_client"] == size
    assert row["bits_per_coordinate"] == size / 1024
    assert row["trials"] == 3 and math.isfinite(row["mse"]) and row["mse"] > 0


def test_rps_with_8_bit_values_beats_eden_1_bit_at_full_correlation() -> None:
    # The issue's target: at R = n - 1 Rand-Proj-Spatial with quantized values (k = 102, 8-bit
    # values: 0.89 bits per coordinate) has a smaller squared error than EDEN at 1 bit (1.09
    # bits per coordinate; vNMSE 0.571 / n = 0.057 for identical unit vectors), so EDEN's
    # 1-bit point is off the frontier there. Measured ~0.026 vs ~0.057; the test asks for a
    # gap of Z = 4 combined standard errors over independent trials.
    rps = run_point(Point("R=9", "rand-proj-spatial", 102, 8, 40, r=9.0))
    eden = run_point(Point("R=9", "eden", 1024, 1, 40, r=9.0))
    assert rps["bits_per_client"] < eden["bits_per_client"]
    gap = eden["mse"] - rps["mse"]
    assert gap > 4 * math.hypot(rps["se"], eden["se"]), (rps["mse"], eden["mse"])
