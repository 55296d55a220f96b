"""The server's event loop (``--event-loop``): uvloop by default where installed, asyncio's
own on request; a job runs to its end on either, with the same estimates as the library.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from service_util import check_rounds_against_inprocess, run_local_job

from rpsagg_server.process import eventloop

pytestmark = pytest.mark.service

N, K, D, ROUNDS = 3, 8, 64, 2


def test_auto_is_uvloop_where_installed() -> None:
    pytest.importorskip("uvloop")  # a dependency of rpsagg-server on Linux: installed here
    assert eventloop.resolve("auto") == "uvloop"
    assert eventloop.resolve("asyncio") == "asyncio"
    with pytest.raises(ValueError, match="must be auto, uvloop or asyncio"):
        eventloop.resolve("trio")


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_run_uses_the_named_loop(choice: str) -> None:
    async def main() -> str:
        await asyncio.sleep(0)
        return eventloop.running_name()

    assert eventloop.run(main(), choice) == choice


def test_freeze_startup_heap_moves_survivors_out_of_collections() -> None:
    gc.unfreeze()
    try:
        kept = [object() for _ in range(1000)]
        eventloop.freeze_startup_heap()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_a_job_runs_to_its_end_on_either_loop(choice: str, tmp_path: Path) -> None:
    db = run_local_job(tmp_path, N, K, D, ROUNDS, data_r=1, extra=["--event-loop", choice])
    log = (tmp_path / "server.log").read_text()
    assert f"(insecure, {choice} loop)" in log, log[-2000:]
    assert check_rounds_against_inprocess(db, N, K, D, "rand-proj-spatial") == ROUNDS
