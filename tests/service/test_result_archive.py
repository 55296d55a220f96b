"""Finished rounds' arrays in the store behind a bounded cache
(:mod:`rpsagg_server.rounds.archive`).

The cache on its own (the bound in bytes, least recently used out, a round larger than the
bound never kept, a scan that does not evict, one read shared by concurrent readers), and a
real in-process server (engine, SQLite file, grpc.aio, the public client, the dashboard's
routes): with no cache at all every old round's estimate and global state are read back bit
for bit, and a row missing from the database is an error to the caller (GetResult
``UNAVAILABLE``, the download 503) while the job goes on. The subprocess test with RSS
figures is ``test_service_memory.py``.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_util import base_config, in_process_server

from rpsagg_client import AggregationClient
from rpsagg_server.http import create_app
from rpsagg_server.rounds.archive import RoundArchive
from rpsagg_server.rounds.liveround import RoundArrays
from rpsagg_server.store.database import ReadError, Store, StoredRound
from rpsagg_server.store.rowinfo import DecodeMetrics, RowInfo

pytestmark = pytest.mark.service


def _row(rid: int, d: int, state: str = "done") -> StoredRound:
    est = np.arange(d, dtype=np.float64) + rid
    nxt = -est
    return StoredRound(
        round_id=rid, nonce=rid, state=state, reason="", task_step=rid - 1, transform="one",
        r_prior=None, global_state=np.zeros(d).tobytes(), global_shape=(d,), opened_at=0.0,
        info=_info(d, state), estimate=est.tobytes() if state == "done" else None,
        next_state=nxt.tobytes() if state == "done" else None)


def _info(d: int, state: str) -> RowInfo:
    decoded = None if state != "done" else DecodeMetrics(
        n_prime=1, beta=1.0, c=1.0, seconds=0.0, r_hat=0.0, eval_errors=None, shape=(1, d),
        estimated_error=None)
    return RowInfo(first_at=None, deadline=None, closed_at=None, finished_at=None, k=1,
                   value_bits=32, decoded=decoded)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(str(tmp_path / "a.db"))
    yield s
    s.close()


def _fill(store: Store, rows: list[StoredRound]) -> None:
    from rpsagg_server.store.database import _op_round

    store._write_sync([_op_round(r) for r in rows])


def test_the_cache_keeps_at_most_its_bytes_least_recently_used_out(store: Store) -> None:
    d = 64  # a round: 512 bytes of estimate + 512 of state
    _fill(store, [_row(r, d) for r in range(1, 6)] + [_row(6, d, "failed")])
    arc = RoundArchive(store, 3 * 1024)
    for rid in (1, 2, 3):
        a = arc.get(rid)
        assert a.estimate is not None and a.state is not None
        assert a.estimate.shape == (1, d) and a.state.shape == (d,)
        assert np.array_equal(a.estimate[0], np.arange(d) + rid)
        assert np.array_equal(a.state, -(np.arange(d) + rid))
        assert not a.estimate.flags.writeable  # views of the row's bytes, never written
    assert arc.cached() == [1, 2, 3] and arc.cached_bytes == 3 * 1024 and arc.reads == 3
    arc.get(1)  # a hit makes it the most recently used
    arc.get(4)  # evicts 2, the least recently used
    assert arc.cached() == [3, 1, 4] and arc.hits == 1 and arc.reads == 4
    f = arc.get(6)  # a failed round: no estimate; its state is the one it started from
    assert f.estimate is None and np.array_equal(f.state, np.zeros(d))
    assert arc.cached() == [1, 4, 6] and arc.cached_bytes == 2 * 1024 + 512
    arc.get(5, keep=False)  # a scan does not evict
    assert arc.cached() == [1, 4, 6]
    arc.put(7, RoundArrays(np.zeros((1, 8 * d)), None))  # larger than the bound: not kept
    assert arc.cached() == [1, 4, 6] and arc.cached_bytes <= arc.max_bytes
    with pytest.raises(ReadError, match="round 9 is not in the database"):
        arc.get(9)
    assert 9 not in arc.cached()


def test_concurrent_reads_of_one_round_share_one_read(store: Store) -> None:
    d = 1 << 16
    _fill(store, [_row(1, d)])
    arc = RoundArchive(store, 1 << 30)
    gate = threading.Event()
    real = store.round
    calls = []

    def slow(rid: int) -> StoredRound:
        calls.append(rid)
        gate.wait(10)
        return real(rid)

    store.round = slow  # type: ignore[method-assign]
    out: list[RoundArrays] = []
    threads = [threading.Thread(target=lambda: out.append(arc.get(1))) for _ in range(8)]
    for t in threads:
        t.start()
    while not calls:  # the first reader is inside the read; the others queue behind it
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join(10)
    assert calls == [1] and len(out) == 8 and all(o is out[0] for o in out)


def test_no_cache_serves_every_old_round_bit_for_bit(tmp_path: Path) -> None:
    d, rounds = 300, 4
    cfg = base_config(db=str(tmp_path / "job.db"), n=1, k=16, d=d, rounds=rounds,
                      data="external", round_timeout=60.0, result_cache_bytes=0)
    rng = np.random.default_rng(1)
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True) as a:
            a.join()
            first = {}
            for _ in range(rounds):
                rnd = a.current_round()
                a.submit(rnd, rng.standard_normal(d))
                res = a.result(rnd.round_id, wait=True)
                first[rnd.round_id] = res
            assert srv.running.engine.archive.cached() == []  # nothing kept
            for rid, res in first.items():
                again = a.result(rid, wait=False)
                assert again.estimate.tobytes() == res.estimate.tobytes()
                assert again.global_state.tobytes() == res.global_state.tobytes()
                got = http.get(f"/api/rounds/{rid}/estimate?format=json").json()["estimate"]
                assert np.array_equal(np.array(got), res.estimate[0])
            # round 0: the newest finished round
            assert a.result(0, wait=False).estimate.tobytes() == first[rounds].estimate.tobytes()


def test_a_failed_read_is_the_callers_error_and_the_job_goes_on(tmp_path: Path) -> None:
    d = 256
    db = tmp_path / "job.db"
    cfg = base_config(db=str(db), n=1, k=16, d=d, rounds=3, data="external",
                      round_timeout=60.0, result_cache_bytes=0)
    rng = np.random.default_rng(2)
    with in_process_server(cfg) as srv:
        http = TestClient(create_app(srv.running.state, CollectorRegistry()))
        with AggregationClient(f"127.0.0.1:{srv.port}", "a", insecure=True,
                               retry_budget=0.5) as a:
            a.join()
            rnd = a.current_round()
            a.submit(rnd, rng.standard_normal(d))
            assert a.result(rnd.round_id, wait=True).state == "done"
            conn = sqlite3.connect(db, timeout=30)  # the row goes behind the server's back
            with conn:
                conn.execute("DELETE FROM rounds WHERE round_id = 1")
            conn.close()
            with pytest.raises(grpc.RpcError) as err:
                a.result(1, wait=False)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "round 1's result could not be read back" in err.value.details()
            assert "not in the database" in err.value.details()
            res = http.get("/api/rounds/1/estimate?format=npy")
            assert res.status_code == 503 and "round 1 is not in the database" in res.text
            assert srv.running.store.writable()
            for _ in range(2):  # the job goes on
                rnd = a.current_round()
                a.submit(rnd, rng.standard_normal(d))
                res2 = a.result(rnd.round_id, wait=True)
                assert res2.state == "done"
            assert a.result(2, wait=False).estimate is not None
