"""The decode workers a server's jobs share (``rpsagg_server.decode.decodepool``): each job's work
runs in order, one item at a time; a job with a long decode holds one worker while the other
jobs' work goes on; a shut-down lane cancels what had not started."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from rpsagg_server.decode.decodepool import DecodePool

pytestmark = pytest.mark.unit

WAIT = 10.0  # seconds any wait below may take at most (they are all bounded)


def test_a_long_decode_holds_one_worker_and_other_jobs_go_on() -> None:
    pool = DecodePool(2)
    big, small = pool.lane("big"), pool.lane("small")
    release = threading.Event()
    started = threading.Event()

    def long_decode() -> str:
        started.set()
        assert release.wait(WAIT)
        return "big done"

    try:
        first = big.submit(long_decode)
        queued_behind = big.submit(lambda: "big second")
        assert started.wait(WAIT)
        # the big job's second item waits for its first; the small job's 20 items all run
        results = [small.submit(lambda i=i: i * i) for i in range(20)]
        assert [f.result(WAIT) for f in results] == [i * i for i in range(20)]
        assert not first.done() and not queued_behind.done()
        release.set()
        assert first.result(WAIT) == "big done"
        assert queued_behind.result(WAIT) == "big second"
    finally:
        release.set()
        pool.close()


def test_a_lane_runs_in_order_one_at_a_time_and_lanes_take_turns() -> None:
    pool = DecodePool(1)  # one worker: the order of the lanes' items shows the turns
    a, b = pool.lane("a"), pool.lane("b")
    gate = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def item(name: str) -> None:
        with lock:
            order.append(name)

    try:
        blocker = a.submit(lambda: gate.wait(WAIT))
        futures = [a.submit(item, f"a{i}") for i in range(3)]
        futures += [b.submit(item, f"b{i}") for i in range(3)]
        gate.set()
        assert blocker.result(WAIT) is True
        for f in futures:
            f.result(WAIT)
        # after a's first item, b's turn; then they alternate
        assert order == ["b0", "a0", "b1", "a1", "b2", "a2"]
    finally:
        gate.set()
        pool.close()


def test_a_shut_down_lane_cancels_what_had_not_started() -> None:
    pool = DecodePool(1)
    lane = pool.lane("job")
    gate, started = threading.Event(), threading.Event()

    def first() -> bool:
        started.set()
        return gate.wait(WAIT)

    try:
        running = lane.submit(first)
        waiting = lane.submit(lambda: "never")
        assert started.wait(WAIT)  # the first item has started: only the second is waiting
        lane.shutdown(wait=False, cancel_futures=True)
        with pytest.raises(CancelledError):
            waiting.result(WAIT)
        with pytest.raises(RuntimeError, match="shut down"):
            lane.submit(lambda: None)
        gate.set()
        assert running.result(WAIT) is True  # what had started finishes
        other = pool.lane("other")
        assert other.submit(lambda: 7).result(WAIT) == 7
    finally:
        gate.set()
        pool.close()


def test_an_exception_reaches_the_caller_and_the_lane_goes_on() -> None:
    pool = DecodePool(1)
    lane = pool.lane("job")
    try:
        def boom() -> None:
            raise ValueError("decode failed")

        failed = lane.submit(boom)
        after = lane.submit(lambda: "next")
        with pytest.raises(ValueError, match="decode failed"):
            failed.result(WAIT)
        assert after.result(WAIT) == "next"
    finally:
        pool.close()
