"""The job database's schema version and its migrations (:mod:`rpsagg_server.store.migrations`).

A database of version 0 (what the code before versions wrote: the 0.1.0 fixture of
``test_store_fixture.py``, and rows of before fields that were added over time) is migrated
once, on open; a database of a newer version is refused at start with one line and exit 2;
a migration that fails leaves the file byte-identical and the start fails with one line.
The typed ``info`` of a round row round-trips through its JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from repo_paths import TESTS
from service_util import server_command

from rpsagg_server.readmodel.views import EstimatedError
from rpsagg_server.rounds.rowcodec import from_row
from rpsagg_server.store.database import Store
from rpsagg_server.store.migrations import CURRENT_VERSION, SchemaError, open_schema, schema_version
from rpsagg_server.store.rowinfo import ArchivedSummary, DecodeMetrics, RowInfo

pytestmark = pytest.mark.service

FIXTURE = TESTS / "fixtures" / "store-v0.1.0"
#: the fixture's job (test_store_fixture.FLAGS)
FLAGS = ["--insecure", "--n", "2", "--k", "8", "--d", "64", "--task", "mean",
         "--data", "external", "--rounds", "3", "--round-timeout", "600",
         "--grpc-port", "0", "--http-port", "0", "--linger", "-1"]


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "fixture")
    return tmp_path / "fixture" / "rpsagg.db"


def _edit(db: Path, *sql: tuple[str, tuple[object, ...]]) -> None:
    """Change the file with plain SQLite (no store), the log checkpointed into it."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for statement, args in sql:
            conn.execute(statement, args)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _version(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return schema_version(conn)
    finally:
        conn.close()


#: the tables of a job database
TABLES = {"meta", "clients", "rounds", "submissions"}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _sha(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def _start_fails(db: Path) -> str:
    """Start the server on ``db``; it must exit 2 with one line on stderr, returned."""
    proc = subprocess.run(server_command(["--db", str(db), *FLAGS]), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rpsagg-server:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_version_0_database_is_migrated_once(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    assert _version(db) == 0
    store = Store(str(db))
    try:
        rows = store.rounds()
        assert [r.info.k for r in rows] == [8, 8] and rows[0].info.decoded is not None
        assert rows[0].info.decoded.shape == (1, 64)
    finally:
        store.close()
    assert _version(db) == CURRENT_VERSION
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        info = json.loads(conn.execute("SELECT info FROM rounds WHERE round_id = 2").fetchone()[0])
        assert {"r_priors", "archived", "k", "value_bits"} <= set(info)
        assert open_schema(conn) == 0  # a second open migrates nothing
    finally:
        conn.close()
    assert _version(db) == CURRENT_VERSION


def test_a_new_database_gets_the_current_schema_in_one_script(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    statements: list[str] = []
    conn = sqlite3.connect(db, isolation_level=None)
    conn.set_trace_callback(statements.append)
    try:
        assert open_schema(conn, pragmas="PRAGMA journal_mode=WAL;") == 0
        conn.set_trace_callback(None)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert _tables(conn) == TABLES
    finally:
        conn.close()
    assert _version(db) == CURRENT_VERSION
    # the probe, then the script's statements (no statement of the existing-database path)
    assert statements[0].startswith("SELECT user_version")
    assert "BEGIN IMMEDIATE;" in statements and statements[-1] == "COMMIT;"
    assert not any(s.startswith("CREATE TABLE IF NOT EXISTS") for s in statements)


class _TablesMadeMeanwhile(sqlite3.Connection):
    """A connection whose probe sees an empty database while another connection has made
    the tables (and a row) between the probe and the new database's script."""

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if sql.startswith("SELECT user_version, EXISTS"):
            other = sqlite3.connect(self.execute("PRAGMA database_list").fetchone()[2],
                                    isolation_level=None)
            try:
                other.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                other.execute("INSERT INTO meta VALUES ('config', '{}')")
            finally:
                other.close()
            return super().execute("SELECT 0, 0")
        return super().execute(sql, *args)


def test_tables_made_meanwhile_take_the_existing_database_path(tmp_path: Path) -> None:
    db = tmp_path / "raced.db"
    conn = sqlite3.connect(db, isolation_level=None, factory=_TablesMadeMeanwhile)
    try:
        # the script's CREATE TABLE meta fails: rolled back, then the tables that are
        # missing are made and the version recorded, the other connection's row kept (no
        # round table: nothing to migrate)
        assert open_schema(conn) == 0
        assert not conn.in_transaction
        assert conn.execute("SELECT value FROM meta").fetchall() == [("{}",)]
        assert _tables(conn) == TABLES
    finally:
        conn.close()
    assert _version(db) == CURRENT_VERSION


def test_rows_of_before_are_completed_as_the_code_of_before_read_them(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    old = {"first_at": 1.0, "deadline": 2.0, "closed_at": 3.0, "finished_at": 4.0,
           "archived": {"contributors": [["c0", "5"]], "payload_bytes": 40,
                        "wire_bytes": 67},
           "n_prime": 1, "beta": 4.0, "c": None, "seconds": 0.1, "r_hat": None,
           "eval_errors": None}  # no k, value_bits, shape, r_priors, estimated_error
    _edit(db, ("UPDATE rounds SET info = ? WHERE round_id = 1", (json.dumps(old),)))
    store = Store(str(db))
    try:
        row = store.round(1)
    finally:
        store.close()
    info = row.info
    assert (info.k, info.value_bits, info.r_priors) == (8, 32, None)
    assert info.archived == ArchivedSummary((("c0", 5),), 40, 67, 1, ())
    assert info.decoded is not None and info.decoded.shape == (1, 64)
    assert info.decoded.estimated_error is None and math.isnan(info.decoded.c)
    live = from_row(row)
    assert live.outcome is not None and live.outcome.estimate.shape == (1, 64)
    assert live.m() == 1 and live.payload_bytes() == 40 and live.arrivals() == []


def test_a_database_of_a_newer_version_is_refused_with_one_line(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    _edit(db, (f"PRAGMA user_version = {CURRENT_VERSION + 1}", ()))
    before = _sha(db)
    line = _start_fails(db)
    assert f"schema version is {CURRENT_VERSION + 1}, newer than this server's" in line
    assert _sha(db) == before
    with pytest.raises(SchemaError, match="newer than this server's"):
        Store(str(db))


def test_a_failed_migration_leaves_the_file_byte_identical(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    _edit(db, ("UPDATE rounds SET info = ? WHERE round_id = 2", ("{not json",)))
    before = _sha(db)
    line = _start_fails(db)
    assert "migrating the database from schema version 0 to 1 failed: round 2's info " \
           "cannot be read" in line and "the database is unchanged" in line
    assert _sha(db) == before and _version(db) == 0


def test_a_migration_that_raises_midway_rolls_back(tmp_path: Path) -> None:
    db = _copy(tmp_path)
    before = _sha(db)

    def half(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE rounds SET info = '{}'")
        raise sqlite3.OperationalError("disk I/O error")

    conn = sqlite3.connect(db, isolation_level=None)
    try:
        with pytest.raises(SchemaError, match="disk I/O error; the database is unchanged"):
            open_schema(conn, [half])
    finally:
        conn.close()
    assert _sha(db) == before


def test_the_typed_info_round_trips() -> None:
    full = RowInfo(
        first_at=1.5, deadline=2.5, closed_at=3.5, finished_at=4.5, k=8, value_bits=4,
        r_priors=(0.5, None),
        archived=ArchivedSummary((("c0", 2**63 + 1),), 80, 134, 2,
                                 (("c0", 1.25, 67, 40),)),
        decoded=DecodeMetrics(n_prime=2, beta=4.0, c=0.5, seconds=0.1, r_hat=0.25,
                              eval_errors=(1.0, 2.0, 3.0, 4.0), shape=(2, 64),
                              estimated_error=EstimatedError(1.0, 0.5, 9.0, "free")))
    assert RowInfo.from_json(full.to_json()) == full
    bare = RowInfo(first_at=None, deadline=None, closed_at=None, finished_at=None, k=8,
                   value_bits=32)
    assert RowInfo.from_json(bare.to_json()) == bare
    nan = RowInfo.from_json(RowInfo(
        None, None, None, None, 8, 32, decoded=DecodeMetrics(
            1, 1.0, math.nan, 0.0, math.nan, None, (1, 4),
            EstimatedError(math.nan, 1.0, 1.0))).to_json())
    assert nan.decoded is not None and math.isnan(nan.decoded.c)
    assert math.isnan(nan.decoded.r_hat)
    assert nan.decoded.estimated_error is not None
    assert math.isnan(nan.decoded.estimated_error.squared_error)
    with pytest.raises(KeyError):
        RowInfo.from_json('{"first_at": null}')  # not the current shape: refused
