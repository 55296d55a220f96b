"""Faults injected through the store (docs/reliability.md's fault table).

Every test keeps a client-side ledger of acks and checks, at the end, the invariants of the
submission state machine: zero acked submissions missing from the database, no committed
submission missing from memory (the decoded round's contributors are exactly the committed
set), the round completes, and the server accepts new work afterwards (a second round).
Delays and failures come from a second SQLite connection holding the write lock, a small
tmpfs filled to the last byte, and the store's busy timeout; states are awaited by polling
with a bound (``wait_until``), never by fixed sleeps. The only sleeps are the durations of
injected faults.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from service_util import (
    InProcessServer,
    base_config,
    committed_clients,
    encode_round,
    in_process_server,
    joined_job,
    wait_until,
    write_lock,
)

from rpsagg_client import AggregationClient
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import Submission

pytestmark = pytest.mark.service

N, K, D = 4, 8, 128


@contextmanager
def _job(db: Path, **changes: object) -> Iterator[tuple[InProcessServer, list[AggregationClient]]]:
    with joined_job(db, N, K, D, client_timeout=5, retry_budget=30, **changes) as job:
        yield job


def _encode(clients: list[AggregationClient], seed: int) -> tuple[int, dict[str, Submission]]:
    return encode_round(clients, D, seed)


def _hasty(srv: InProcessServer, cid: str, timeout: float) -> AggregationClient:
    """A client that never retries: its first answer is what the test sees."""
    return AggregationClient(f"127.0.0.1:{srv.port}", cid, insecure=True, timeout=timeout,
                             retry_budget=0)


def _finish_and_check(srv: InProcessServer, clients: list[AggregationClient], db: Path,
                      round_id: int, subs: dict[str, Submission], acked: set[str]) -> None:
    """Submit whatever is missing, then check the invariants and that new work is accepted."""
    for c in clients:
        if c.client_id not in acked:
            c.submit_encoded(subs[c.client_id])
            acked.add(c.client_id)
    res = clients[0].result(round_id, wait=True, timeout=60)
    assert res.state == "done", res.reason
    in_db = committed_clients(str(db), round_id)
    assert acked <= in_db  # zero acked submissions lost
    # no committed submission missing from memory: the decode used exactly the committed set
    assert {c.client_id for c in res.contributors} == in_db
    assert res.n_prime == len(in_db) == N
    # the server accepts new work: the next round runs to the end
    nxt, subs2 = _encode(clients, seed=99)
    assert nxt == round_id + 1
    for c in clients:
        assert not c.submit_encoded(subs2[c.client_id]).duplicate
    res2 = clients[0].result(nxt, wait=True, timeout=60)
    assert res2.state == "done" and res2.n_prime == N
    assert srv.running.state.readiness()["database"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_cancelled_submit_is_committed_and_acknowledged_on_retry(tmp_path: Path,
                                                                 how: str) -> None:
    """Item 1: the caller goes away (its 0.5 s deadline expires, or it cancels the call once
    the server has queued the write) while the write waits 2 s for a lock held by another
    connection; the write commits, so memory has it and the identical retry is acknowledged
    as a duplicate (today: UNIQUE-constraint errors and a submission the decode misses).
    """
    db = tmp_path / "cancel.db"
    with _job(db) as (srv, clients):
        rid, subs = _encode(clients, seed=1)
        engine = srv.running.engine
        hasty = _hasty(srv, "c0", timeout=0.5)
        hasty_channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
        try:
            with write_lock(str(db)):
                t0 = time.monotonic()
                if how == "deadline":
                    with pytest.raises(grpc.RpcError) as info:
                        hasty.submit_encoded(subs["c0"])
                    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                else:
                    submit = hasty_channel.unary_unary(serde.method_path("Submit"),
                                                       serde.serializer("Submit"),
                                                       serde.deserializer("Submit"))
                    call = submit.future(subs["c0"], timeout=30)
                    wait_until(lambda: engine.current is not None
                               and "c0" in engine.current.pending, 10, "c0's queued write")
                    assert call.cancel()
                assert "c0" in engine.current.pending  # still queued: the lock holds it
                time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))  # the fault: a 2 s lock
        finally:
            hasty.close()
            hasty_channel.close()
        # the queued write commits after the lock is released (busy timeout 5 s > 2 s)
        wait_until(lambda: "c0" in committed_clients(str(db), rid), 20, "c0's commit")
        again = clients[0].submit_encoded(subs["c0"])
        assert again.duplicate and again.received == 1
        view = srv.running.state.round_detail(rid)
        assert view is not None and view.clients_arrived == ("c0",)
        _finish_and_check(srv, clients, db, rid, subs, {"c0"})
        # still acknowledged after its round has finished (item 12)
        assert clients[0].submit_encoded(subs["c0"]).duplicate


@pytest.mark.timeout(120)
def test_writer_survives_lock_past_busy_timeout(tmp_path: Path) -> None:
    """Item 2: a lock held past the busy timeout fails the transaction; the caller gets
    UNAVAILABLE with the reason, readiness turns false, the writer keeps serving, and a
    retrying client is acked once the lock is gone.
    """
    db = tmp_path / "lock.db"
    with _job(db) as (srv, clients):
        srv.running.store.set_busy_timeout(0.3)
        rid, subs = _encode(clients, seed=2)
        ready = srv.running.state.readiness
        acked: set[str] = set()
        hasty = _hasty(srv, "c0", timeout=5)
        try:
            with write_lock(str(db)):
                with pytest.raises(grpc.RpcError) as info:
                    hasty.submit_encoded(subs["c0"])
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "locked" in (info.value.details() or "")
                wait_until(lambda: not ready()["database"], 10, "readiness false")
                # a client that retries UNAVAILABLE (its budget 30 s) is acked after the lock
                errors: list[BaseException] = []

                def retrying() -> None:
                    try:
                        clients[1].submit_encoded(subs["c1"])
                    except BaseException as exc:  # reported below
                        errors.append(exc)

                t = threading.Thread(target=retrying)
                t.start()
                time.sleep(1.0)  # the fault lasts 1 s more while c1 retries
            t.join(60)
            assert not t.is_alive() and not errors, errors
            acked.add("c1")
        finally:
            hasty.close()
        wait_until(lambda: ready()["database"], 10, "readiness true again")
        # nothing of the failed write was kept: c0's retry is a fresh commit, not a duplicate
        assert "c0" not in committed_clients(str(db), rid)
        assert not clients[0].submit_encoded(subs["c0"]).duplicate
        acked.add("c0")
        _finish_and_check(srv, clients, db, rid, subs, acked)


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        pytest.skip(f"cannot mount a tmpfs for the full-disk test: {detail.decode().strip()}")


def _fill(fs: Path) -> Path:
    """Write a file until the file system has no byte left."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


@pytest.mark.timeout(120)
def test_full_disk_is_reported_and_recovers(tmp_path: Path) -> None:
    """Item 2: with the database on a full tmpfs a Submit fails UNAVAILABLE saying the disk
    is full, readiness is false; once space is freed the server recovers by itself.
    """
    fs = tmp_path / "fs"
    _mount_tmpfs(fs, "8m")
    try:
        db = fs / "full.db"
        with _job(db) as (srv, clients):
            rid, subs = _encode(clients, seed=3)
            ready = srv.running.state.readiness
            assert clients[0].submit_encoded(subs["c0"]).received == 1
            filler = _fill(fs)
            hasty = _hasty(srv, "c1", timeout=5)
            try:
                with pytest.raises(grpc.RpcError) as info:
                    hasty.submit_encoded(subs["c1"])
            finally:
                hasty.close()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "full" in (info.value.details() or ""), info.value.details()
            wait_until(lambda: not ready()["database"], 10, "readiness false")
            filler.unlink()  # space returns
            wait_until(lambda: ready()["database"], 10, "readiness true again")
            assert "c1" not in committed_clients(str(db), rid)
            assert not clients[1].submit_encoded(subs["c1"]).duplicate
            _finish_and_check(srv, clients, db, rid, subs, {"c0", "c1"})
    finally:
        subprocess.run(["umount", str(fs)], capture_output=True, timeout=30)


@pytest.mark.timeout(120)
def test_identical_retry_after_close_is_a_duplicate_in_every_state(tmp_path: Path) -> None:
    """Item 12: an identical retry of a committed submission is acknowledged while its round
    decodes, after it is done, after it failed, and after a restart; a different or new
    submission after the close is still refused.
    """
    db = tmp_path / "closed.db"
    cfg = base_config(db=str(db), n=N, k=K, d=D, rounds=1, round_timeout=1.0, min_clients=3)
    target_of = lambda srv: f"127.0.0.1:{srv.port}"  # noqa: E731
    with in_process_server(cfg) as srv:
        srv.running.store.set_busy_timeout(0.2)
        clients = [AggregationClient(target_of(srv), f"c{i}", insecure=True, timeout=5,
                                     retry_budget=30) for i in range(N)]
        try:
            for c in clients:
                c.join()
            # round 1: two of the minimum three arrive -> failed at the deadline
            r1, subs1 = _encode(clients, seed=4)
            for c in clients[:2]:
                c.submit_encoded(subs1[c.client_id])
            res1 = clients[0].result(r1, wait=True, timeout=30)
            assert res1.state == "failed"
            assert clients[0].submit_encoded(subs1["c0"]).duplicate
            with pytest.raises(grpc.RpcError) as info:
                clients[2].submit_encoded(subs1["c2"])
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # round 2: three arrive; the lock holds the round in decoding (its row cannot
            # commit; the engine retries it), where retries are answered from memory
            r2, subs2 = _encode(clients, seed=5)
            assert r2 == r1 + 1
            for c in clients[:3]:
                c.submit_encoded(subs2[c.client_id])
            with write_lock(str(db)):
                wait_until(lambda: clients[0].current_round().state == "decoding", 30,
                           "round 2 decoding")
                assert clients[1].submit_encoded(subs2["c1"]).duplicate
                with pytest.raises(grpc.RpcError) as info:
                    clients[3].submit_encoded(subs2["c3"])
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                other = clients[1].encode(clients[0].current_round(), np.ones(D))
                with pytest.raises(grpc.RpcError) as info:
                    clients[1].submit_encoded(other)
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            res2 = clients[0].result(r2, wait=True, timeout=30)
            assert res2.state == "done" and res2.job_done
            assert {c.client_id for c in res2.contributors} == committed_clients(str(db), r2)
            assert clients[2].submit_encoded(subs2["c2"]).duplicate
        finally:
            for c in clients:
                c.close()
    with ExitStack() as stack:  # after a restart, from the database
        srv = stack.enter_context(in_process_server(cfg))
        c1, c2 = (stack.enter_context(AggregationClient(target_of(srv), cid, insecure=True,
                                                        timeout=5)) for cid in ("c1", "c2"))
        assert c2.submit_encoded(subs2["c2"]).duplicate
        assert c1.submit_encoded(subs1["c1"]).duplicate
        with pytest.raises(grpc.RpcError) as info:
            c1.submit_encoded(other)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
