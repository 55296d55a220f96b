"""Admission passes (under load): Submit requests are admitted in passes, many at once.

Every request taken into one pass is answered on its own: a bad request beside good ones
is refused alone, two requests of one client in the same pass are decided one after the
other (an identical one is a duplicate, a different one ALREADY_EXISTS), a caller that goes
away before its pass leaves its submission committed, and a write that the database refuses
or a bug while admitting one request fails only that one. The requests are put into one
pass on the server's own event loop (one synchronous batch of :meth:`Intake.admit` calls),
so "the same pass" does not depend on timing. Each test ends by checking the database
against the acks and decoding the round.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_util import (
    InProcessServer,
    committed_clients,
    encode_round,
    joined_job,
)

from rpsagg_client import AggregationClient
from rpsagg_server.domain.errors import DomainError
from rpsagg_server.rpc.refusals import status_of
from rpsagg_server.store.database import Store, StoredSubmission
from rpsagg_server.store.writer import WriteError
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import Submission

pytestmark = pytest.mark.service

N, K, D = 4, 8, 128


@contextmanager
def _job(db: Path, **changes: object) -> Iterator[tuple[InProcessServer, list[AggregationClient]]]:
    with joined_job(db, N, K, D, client_timeout=10, **changes) as job:
        yield job


def _encode(clients: list[AggregationClient], seed: int) -> tuple[int, dict[str, Submission]]:
    return encode_round(clients, D, seed)


def _one_pass(srv: InProcessServer, requests: list[tuple[bytes, str | None]],
              cancel: frozenset[int] = frozenset()) -> list[Any]:
    """Admit ``requests`` (raw bytes, bound client id) in one pass; the answers in order
    (a SubmitReply, the DomainError or another exception). Requests whose index is in
    ``cancel`` have their caller go away before the pass runs: their answer is None."""
    intake = srv.running.engine.intake

    async def run() -> list[Any]:
        futs = [intake.admit(raw, 0.0, bound) for raw, bound in requests]  # no await between
        assert len(intake._arrived) == len(requests)  # all wait for the same pass
        for i in cancel:
            futs[i].cancel()
        out: list[Any] = []
        for i, f in enumerate(futs):
            if i in cancel:
                out.append(None)
                continue
            try:
                out.append(await f)
            except Exception as exc:  # DomainError: a refusal; anything else: a server bug
                out.append(exc)
        return out

    result: list[Any] = srv.call(run())  # type: ignore[assignment]
    return result


def _raw(sub: Submission) -> bytes:
    return serde.serializer("Submit")(sub)


def _finish(clients: list[AggregationClient], db: Path, round_id: int,
            subs: dict[str, Submission], acked: set[str]) -> None:
    """Submit the rest, then: every ack is in the database, the decode used exactly the
    committed set, and the next round takes work."""
    for c in clients:
        if c.client_id not in acked:
            reply = c.submit_encoded(subs[c.client_id])
            assert not reply.duplicate
            acked.add(c.client_id)
    res = clients[0].result(round_id, wait=True, timeout=60)
    assert res.state == "done", res.reason
    in_db = committed_clients(str(db), round_id)
    assert acked == in_db
    assert {c.client_id for c in res.contributors} == in_db
    nxt, subs2 = _encode(clients, seed=99)
    assert nxt == round_id + 1
    assert not clients[0].submit_encoded(subs2["c0"]).duplicate


def test_one_pass_answers_each_request_on_its_own(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with _job(db) as (srv, clients):
        round_id, subs = _encode(clients, seed=1)
        other = clients[1].encode(clients[1].current_round(),
                                  np.full(D, 3.0))  # a different submission of c1
        answers = _one_pass(srv, [
            (_raw(subs["c0"]), None),
            (b"\xff\x00 not a SubmitRequest", None),   # malformed
            (_raw(subs["c1"]), None),
            (_raw(subs["c1"]), None),                  # c1 again, identical: a duplicate
            (_raw(other), None),                        # c1 again, different
            (_raw(subs["c2"]), "c3"),                   # the token of c3 names c2
            (_raw(replace(subs["c2"], client_id="stranger")), None),  # never joined
        ])
        c0, bad, c1, c1_again, c1_other, wrong_token, stranger = answers
        assert not c0.duplicate and not c1.duplicate
        assert c1_again.duplicate
        refused = {"bad": bad, "c1_other": c1_other, "wrong_token": wrong_token,
                   "stranger": stranger}
        assert all(isinstance(e, DomainError) for e in refused.values())
        assert {k: status_of(e).name for k, e in refused.items()} == {  # type: ignore[arg-type]
            "bad": "INVALID_ARGUMENT", "c1_other": "ALREADY_EXISTS",
            "wrong_token": "PERMISSION_DENIED", "stranger": "FAILED_PRECONDITION"}
        assert committed_clients(str(db), round_id) == {"c0", "c1"}
        _finish(clients, db, round_id, subs, {"c0", "c1"})


def test_a_caller_gone_before_its_pass_leaves_its_submission_committed(tmp_path: Path,
                                                                        ) -> None:
    db = tmp_path / "b.db"
    with _job(db) as (srv, clients):
        round_id, subs = _encode(clients, seed=2)
        answers = _one_pass(srv, [(_raw(subs["c0"]), None), (_raw(subs["c1"]), None)],
                            cancel=frozenset({0}))
        assert answers[0] is None and not answers[1].duplicate
        # c0's caller went away, but its write was queued: committed, in memory, and an
        # identical retry is acknowledged as a duplicate
        assert committed_clients(str(db), round_id) == {"c0", "c1"}
        assert "c0" in srv.running.engine.current.subs
        assert clients[0].submit_encoded(subs["c0"]).duplicate
        _finish(clients, db, round_id, subs, {"c0", "c1"})


def test_a_write_refused_by_the_database_fails_only_itself(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with _job(db) as (srv, clients):
        round_id, subs = _encode(clients, seed=3)
        # a row for c1 that the server does not know of (written behind its back): c1's
        # insert breaks the primary key, the other writes of the pass commit
        conn = sqlite3.connect(db, timeout=30)
        conn.execute("INSERT INTO submissions(round_id, client_id, client_seed, digest, "
                     "payload, received_at) VALUES (?, 'c1', '1', x'00', x'00', 0)",
                     (round_id,))
        conn.commit()
        answers = _one_pass(srv, [(_raw(subs[c]), None) for c in ("c0", "c1", "c2")])
        assert not answers[0].duplicate and not answers[2].duplicate
        assert isinstance(answers[1], DomainError) and status_of(answers[1]).name == "UNAVAILABLE"
        assert "UNIQUE" in answers[1].message
        assert set(srv.running.engine.current.subs) == {"c0", "c2"}  # nothing of c1's kept
        conn.execute("DELETE FROM submissions WHERE client_id = 'c1'")
        conn.commit()
        conn.close()
        _finish(clients, db, round_id, subs, {"c0", "c2"})


def test_a_bug_in_one_request_fails_it_alone(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # an unexpected exception while admitting one request (a server bug, injected) is that
    # request's answer (gRPC: UNKNOWN); the pass goes on and the others are committed
    from rpsagg_server.rounds import submissions

    real = submissions.validate_submission

    def buggy(sub: Submission, *args: Any) -> None:
        if sub.client_id == "c1":
            raise RuntimeError("injected bug")
        real(sub, *args)

    monkeypatch.setattr(submissions, "validate_submission", buggy)
    db = tmp_path / "f.db"
    with _job(db) as (srv, clients):
        round_id, subs = _encode(clients, seed=6)
        answers = _one_pass(srv, [(_raw(subs[c]), None) for c in ("c0", "c1", "c2")])
        assert isinstance(answers[1], RuntimeError)
        assert not answers[0].duplicate and not answers[2].duplicate
        assert committed_clients(str(db), round_id) == {"c0", "c2"}
        monkeypatch.setattr(submissions, "validate_submission", real)
        _finish(clients, db, round_id, subs, {"c0", "c2"})


def test_store_commit_submissions_reports_one_outcome_per_write(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "d.db"))

    def sub(cid: str) -> StoredSubmission:
        return StoredSubmission(round_id=1, client_id=cid, client_seed=7, digest=b"d",
                                payload=b"p", received_at=1.0)

    async def run() -> tuple[list[WriteError | None], list[WriteError | None]]:
        first = await store.commit_submissions([sub("a"), sub("b")])
        second = await store.commit_submissions([sub("c"), sub("a"), sub("d")])
        return first, second

    try:
        first, second = asyncio.run(run())
        assert first == [None, None]
        assert second[0] is None and second[2] is None
        assert isinstance(second[1], WriteError) and "UNIQUE" in second[1].reason
        assert sorted(s.client_id for s in store.submissions(1)) == ["a", "b", "c", "d"]
    finally:
        store.close()


@pytest.mark.parametrize("rows", [1, 3])
def test_store_group_commit_of_one_kind_of_row_is_one_transaction(tmp_path: Path,
                                                                   rows: int) -> None:
    """Rows of one kind commit with one executemany; a full disk fails them all."""
    store = Store(str(tmp_path / "e.db"))
    try:
        big = b"x" * 200_000
        store.set_max_pages(store.page_count() + 2)  # room for nothing this big

        async def run() -> list[WriteError | None]:
            return await store.commit_submissions([StoredSubmission(
                round_id=1, client_id=f"c{i}", client_seed=1, digest=b"d", payload=big,
                received_at=1.0) for i in range(rows)])

        out = asyncio.run(run())
        assert all(isinstance(e, WriteError) and "full" in e.reason for e in out)
        assert store.submissions(1) == []
        assert not store.writable()
        store.set_max_pages(1_000_000)

        async def again() -> list[WriteError | None]:
            return await store.commit_submissions([StoredSubmission(
                round_id=1, client_id=f"c{i}", client_seed=1, digest=b"d", payload=big,
                received_at=1.0) for i in range(rows)])

        assert asyncio.run(again()) == [None] * rows
        assert len(store.submissions(1)) == rows
        assert store.writable()
    finally:
        store.close()
