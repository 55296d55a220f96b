"""The domain's refusals: one hierarchy, mapped once to gRPC and once to HTTP.

- both edges' tables list every :class:`~rpsagg_server.domain.errors.DomainError` subclass;
- no domain module speaks gRPC or HTTP: no ``grpc``/``fastapi`` import, no status name, no
  HTTP status in a ``raise`` (the edge modules, where the mapping lives, are listed);
- :meth:`JobHost.restore` marks a job whose database cannot be reopened failed, but lets a
  programming error through.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from repo_paths import ROOT

from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.errors import StartupError, error_classes
from rpsagg_server.http.errors import HTTP_STATUS, http_status
from rpsagg_server.jobs import jobhost
from rpsagg_server.jobs.catalog import Catalog
from rpsagg_server.rpc.refusals import GRPC_STATUS, status_of
from rpsagg_server.settings.flags import load_config

pytestmark = pytest.mark.unit

SERVER = ROOT / "server" / "rpsagg_server"
#: the layers that speak a protocol: the gRPC and HTTP edges and the process that builds them
EDGE = {"rpc", "http", "process"}
# a status name as a word or a string, not as another enum's member (JobState.CANCELLED, or
# its definition ``CANCELLED = "cancelled"``)
STATUS_NAMES = re.compile(r"\bStatusCode\b|(?<![.\w])(" + "|".join(
    c.name for c in grpc.StatusCode if c.name != "OK") + r")\b(?!\s*=[^=])")
HTTP_CODES = range(400, 600)


def test_both_tables_cover_every_domain_error() -> None:
    classes = error_classes()
    assert len(classes) >= 8
    assert set(GRPC_STATUS) == set(classes)
    assert set(HTTP_STATUS) == set(classes)
    for cls in classes:
        exc = cls("why")
        assert status_of(exc) == GRPC_STATUS[cls] and http_status(exc) == HTTP_STATUS[cls]
        assert exc.message == str(exc) == "why"


def _domain_modules() -> list[Path]:
    # every module of the server but those of the edges' layers
    mods = [p for p in SERVER.rglob("*.py") if not EDGE & set(p.relative_to(SERVER).parts)]
    assert len(mods) > 20 and (SERVER / "rounds" / "engine.py") in mods
    assert (SERVER / "domain" / "errors.py") in mods
    assert SERVER / "jobs" / "jobhost.py" in mods
    return mods


def _protocol_words(source: str) -> list[str]:
    """What of gRPC or HTTP a module's source says (empty: nothing)."""
    found = [f"line {source.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for m in STATUS_NAMES.finditer(source)]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            found += [f"line {node.lineno}: import {n}" for n in names
                      if n.split(".")[0] in ("grpc", "fastapi", "starlette")]
        if isinstance(node, ast.Raise):
            found += [f"line {node.lineno}: raise with {c.value}" for c in ast.walk(node)
                      if isinstance(c, ast.Constant) and type(c.value) is int
                      and c.value in HTTP_CODES]
    return found


def test_the_protocol_check_finds_each_form() -> None:
    for source in ('raise Refused("NOT_FOUND", "x")', "import grpc",
                   "from fastapi import HTTPException", "raise Refused('x', 409)",
                   "x = grpc.StatusCode.UNAVAILABLE", 'code = "CANCELLED"',
                   "ok = name == CANCELLED"):
        assert _protocol_words(source), source
    for source in ('raise NotFound("no job")', "x = 404", "import asyncio",
                   "ok = s == JobState.CANCELLED", 'class S:\n    CANCELLED = "cancelled"'):
        assert not _protocol_words(source), source


@pytest.mark.parametrize("path", _domain_modules(), ids=lambda p: p.name)
def test_no_domain_module_speaks_grpc_or_http(path: Path) -> None:
    assert _protocol_words(path.read_text()) == []


def _host_with_one_running_job(tmp_path: Path) -> jobhost.JobHost:
    cfg = load_config(["--insecure", "--db", str(tmp_path / "s.db")], env={})
    catalog = Catalog(cfg.db)
    catalog.add("j1", {"n": 2})
    catalog.set_state("j1", "running")
    catalog.close()
    return jobhost.JobHost(cfg, DecodePool(1))


async def _restore(host: jobhost.JobHost) -> None:
    try:
        await host.restore()
    finally:
        host.catalog.close()


def test_a_job_that_cannot_be_reopened_is_marked_failed(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise StartupError("--db x: cannot open it (disk I/O error)")

    monkeypatch.setattr(jobhost, "open_job", broken)
    host = _host_with_one_running_job(tmp_path)
    asyncio.run(_restore(host))
    rec = host._records["j1"]
    assert rec.state == "failed" and rec.failure.startswith("cannot be reopened: --db x")


def _value_bug() -> None:
    int("j1")  # a ValueError of the code's own making, not of the job's database


def _type_bug() -> None:
    raise TypeError("open_job() got an unexpected keyword argument")


@pytest.mark.parametrize(("bug", "kind"), [(_value_bug, ValueError), (_type_bug, TypeError)])
def test_a_programming_error_is_not_taken_for_cannot_be_reopened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: Any, kind: type) -> None:
    # a ValueError of a bug used to be taken for a database that cannot be reopened
    async def buggy(*args: Any, **kwargs: Any) -> Any:
        bug()

    monkeypatch.setattr(jobhost, "open_job", buggy)
    host = _host_with_one_running_job(tmp_path)
    with pytest.raises(kind):
        asyncio.run(_restore(host))
    assert host._records["j1"].state == "running"

