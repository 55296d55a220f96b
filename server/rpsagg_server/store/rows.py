"""The store's rows: the SQLite schema and the row dataclasses the engine reads and writes.

One representation of a round per layer: the engine's
:class:`~rpsagg_server.rounds.liveround.LiveRound` turns into a :class:`StoredRound` to be written
and back at a restart (:mod:`rpsagg_server.rounds.rowcodec`). The schema's version (SQLite's
``user_version``) and the migrations of older versions are :mod:`rpsagg_server.store.migrations`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpsagg_server.store.rowinfo import RowInfo
from rpsagg_wire.v1.messages import RoundState

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY, idx INTEGER NOT NULL UNIQUE, joined_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round_id INTEGER PRIMARY KEY, nonce TEXT NOT NULL, state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '', task_step INTEGER NOT NULL, transform TEXT NOT NULL,
    r_prior REAL, global_state BLOB NOT NULL, global_shape TEXT NOT NULL,
    opened_at REAL NOT NULL, info TEXT NOT NULL DEFAULT '{}',
    estimate BLOB, next_state BLOB);
CREATE TABLE IF NOT EXISTS submissions (
    round_id INTEGER NOT NULL, client_id TEXT NOT NULL, client_seed TEXT NOT NULL,
    digest BLOB NOT NULL, payload BLOB NOT NULL, received_at REAL NOT NULL,
    PRIMARY KEY (round_id, client_id));
"""


@dataclass(frozen=True)
class StoredRound:
    """A round row as stored (``info``: timestamps, budget, summary and metrics, typed).

    ``arrays`` False: read without its arrays (``Store.rounds(arrays=False)``):
    ``global_state`` is empty, ``next_state`` None, ``estimate`` empty where the row has
    one (None where it has none); such a row is never written back.
    """

    round_id: int
    nonce: int
    state: RoundState
    reason: str
    task_step: int
    transform: str
    r_prior: float | None
    global_state: bytes
    global_shape: tuple[int, ...]
    opened_at: float
    info: RowInfo
    estimate: bytes | None
    next_state: bytes | None
    arrays: bool = True


@dataclass(frozen=True)
class StoredSubmission:
    """A committed submission: its canonical bytes (the deterministic serialization its
    ``digest``, their SHA-256, was computed from when the request was parsed; the request's
    own bytes for this project's clients, which serialize deterministically) and when it
    arrived.
    """

    round_id: int
    client_id: str
    client_seed: int
    digest: bytes
    payload: bytes
    received_at: float
