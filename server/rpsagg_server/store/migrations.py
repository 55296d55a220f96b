"""The job database's schema version (SQLite's ``user_version``) and its migrations.

:func:`open_schema` runs when a :class:`~rpsagg_server.store.database.Store` opens its database: a
new database gets the tables at :data:`CURRENT_VERSION`; a database of an older version is
brought to the current one by the functions of :data:`MIGRATIONS` (``MIGRATIONS[v]`` takes a
database from version ``v`` to ``v + 1``), all in one transaction with the version's update,
so a migration that fails leaves the file as it was. A database of a newer version than
this code knows is refused (:class:`SchemaError`) before anything is written to it.

Version 0 is every database written before versions were recorded (rpsagg 0.1.0 and the
development versions before it). Its rows' ``info`` lacks keys that were added over time,
and the code that read it filled them in; :func:`complete_info_v0` fills them once, so that
:class:`~rpsagg_server.store.rowinfo.RowInfo` reads every row without such fallbacks.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from rpsagg_server.settings.jobspec import JOB_DEFAULTS
from rpsagg_server.store.rowinfo import DECODE_KEYS, RowInfo
from rpsagg_server.store.rows import SCHEMA
from rpsagg_wire.v1 import serde

__all__ = ["CURRENT_VERSION", "MIGRATIONS", "SchemaError", "complete_info_v0", "open_schema",
           "schema_version"]


class SchemaError(sqlite3.DatabaseError):
    """The database's schema version is newer than this code's, or a migration failed; the
    message (one line) says which and why. Nothing was written to the database.

    A subclass of :class:`sqlite3.DatabaseError`, so that whoever opens a store reports it
    as a database that cannot be opened (the server: exit 2 with the message)."""


def _info_v0_to_v1(conn: sqlite3.Connection) -> None:
    """Version 0 -> 1: every round row's ``info`` gets every key of :class:`RowInfo`."""
    job = _job_settings(conn)
    rows = conn.execute("SELECT round_id, info, length(estimate) FROM rounds "
                        "ORDER BY round_id").fetchall()
    for round_id, text, estimate_bytes in rows:
        try:
            info = json.loads(text)
            if not isinstance(info, dict):
                raise ValueError(f"a JSON {type(info).__name__}, not an object")
            full = complete_info_v0(info, job, estimate_bytes,
                                    functools.partial(_first_value_bits, conn, round_id))
            new = RowInfo.from_dict(full).to_json()
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"round {round_id}'s info cannot be read ({exc})") from None
        conn.execute("UPDATE rounds SET info = ? WHERE round_id = ?", (new, round_id))


#: ``MIGRATIONS[v]`` takes a database of version ``v`` to version ``v + 1``
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_info_v0_to_v1]
#: the schema version this code writes
CURRENT_VERSION = len(MIGRATIONS)


#: the schema of a new database: every table made, none found (a table made meanwhile by
#: another connection fails the script, which then takes the path of an existing database)
_NEW_SCHEMA = SCHEMA.replace("CREATE TABLE IF NOT EXISTS", "CREATE TABLE")


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's ``user_version`` (0: a new database, or one of before versions)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_version(conn: sqlite3.Connection) -> int:
    """The database's version; raises :class:`SchemaError` for one newer than this code's
    (before anything is written)."""
    return _refuse_newer(schema_version(conn))


def _refuse_newer(version: int) -> int:
    if version > CURRENT_VERSION:
        raise SchemaError(
            f"the database's schema version is {version}, newer than this server's "
            f"({CURRENT_VERSION}): it was written by a newer rpsagg-server; run that "
            "version, or use a new file")
    return version


def open_schema(conn: sqlite3.Connection,
                migrations: list[Callable[[sqlite3.Connection], None]] | None = None,
                pragmas: str = "") -> int:
    """Create the tables of a new database, or migrate an older one, in one transaction.

    ``conn`` is in autocommit mode (``isolation_level=None``). A database of a newer
    version is refused (:class:`SchemaError`) before anything is written, ``pragmas``
    (statements, each ending in ``;``, such as the journal mode) included; they run before
    the schema. Returns the number of migrations run (0: a new database, or one of the
    current version). Raises :class:`SchemaError` when a migration fails (rolled back: the
    file is unchanged). ``migrations``: :data:`MIGRATIONS` unless given (tests).

    A new database takes one probe and one script: a call per statement would take the
    interpreter lock back after each, and on a loaded server each of those waits is long
    (a job starts sooner). An existing one is read, then migrated.
    """
    steps = MIGRATIONS if migrations is None else migrations
    current = len(steps)
    version, has_tables = conn.execute(
        "SELECT user_version, EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table') "
        "FROM pragma_user_version").fetchone()
    _refuse_newer(int(version))
    if not has_tables:
        try:
            conn.executescript(f"{pragmas}BEGIN IMMEDIATE;{_NEW_SCHEMA}"
                               f"PRAGMA user_version = {current};COMMIT;")
            return 0
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if "already exists" not in str(exc):
                raise
    elif pragmas:
        conn.executescript(pragmas)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = check_version(conn)
        fresh = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                             "name = 'rounds'").fetchone() is None
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        ran = 0 if fresh else current - version
        if ran:
            for v in range(version, current):
                try:
                    steps[v](conn)
                except (sqlite3.Error, ValueError) as exc:
                    raise SchemaError(
                        f"migrating the database from schema version {v} to {v + 1} "
                        f"failed: {exc}; the database is unchanged") from None
        if version != current:
            conn.execute(f"PRAGMA user_version = {current}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return ran


def complete_info_v0(info: dict[str, Any], job: dict[str, Any], estimate_bytes: int | None,
                     first_value_bits: Callable[[], int | None]) -> dict[str, Any]:
    """A version-0 row's ``info`` with what the code of before filled in when it read one.

    Parameters
    ----------
    info : dict
        The row's ``info`` as stored.
    job : dict
        The job's settings (meta ``config``, defaults for the keys it lacks).
    estimate_bytes : int or None
        Length of the row's ``estimate`` (None: the round has none).
    first_value_bits : callable
        The value width of the round's first stored submission (None: no submission).
    """
    out = {key: info.get(key) for key in ("first_at", "deadline", "closed_at", "finished_at",
                                          "r_priors", "archived")}
    out["k"] = int(info.get("k") or job["k"])  # before per-round k: the job's
    # before per-round widths: the job's --value-bits, which its submissions were packed
    # with (the database does not hold the flag); 32 for a round without one
    out["value_bits"] = int(info.get("value_bits") or first_value_bits() or 32)
    archived = out["archived"]
    if archived is not None:
        out["archived"] = {"arrivals": [], "m": 1, **archived}
    if estimate_bytes is not None:  # a decoded round
        out.update({key: info.get(key) for key in DECODE_KEYS})
        d = int(job["d"])
        if out["shape"] is None:  # before the shape was stored: (m, d) of the estimate
            out["shape"] = [estimate_bytes // 8 // d if d else 1, d]
    return out


def _job_settings(conn: sqlite3.Connection) -> dict[str, Any]:
    """The job's settings as its database holds them (the defaults for the keys an older
    database lacks, as :class:`~rpsagg_server.rounds.recovery.Recovery` compares them)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
    saved = {} if row is None else json.loads(row[0])
    return {**JOB_DEFAULTS, **saved}


def _first_value_bits(conn: sqlite3.Connection, round_id: int) -> int | None:
    """The value width of a round's first stored submission (None: it has none)."""
    row = conn.execute("SELECT payload FROM submissions WHERE round_id = ? "
                       "ORDER BY received_at, rowid LIMIT 1", (round_id,)).fetchone()
    if row is None:
        return None
    sub = serde.decode_submission(bytes(row[0]))
    return int(sub.vectors[0].value_bits) if sub.vectors else None
