"""Acceptance 1: a server and 10 client processes over real gRPC on loopback, 5 rounds.

Each round's estimate must equal ``Estimator.decode`` run in this process on the same seeds
and values (<= 1e-12).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from service_util import (
    check_rounds_against_inprocess,
    run_local_job,
)

pytestmark = pytest.mark.service

N, K, D, ROUNDS = 10, 8, 128, 5


@pytest.mark.timeout(240)
def test_ten_client_processes_five_rounds(tmp_path: Path) -> None:
    db = run_local_job(tmp_path, N, K, D, ROUNDS, data_r=3, extra=["--eval"])
    assert check_rounds_against_inprocess(db, N, K, D, "rand-proj-spatial") == ROUNDS
