"""Routing a request without a job id on a server without a default job: the only open job,
counted once while it starts (installed, its record still queued until the catalog says
running). Before, such a job counted twice and a client's join was refused ("2 open jobs")
for as long as the catalog write took."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rpsagg_server.decode.decodepool import DecodePool
from rpsagg_server.domain.errors import PreconditionFailed
from rpsagg_server.jobs.catalog import Catalog
from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.settings.flags import load_config

pytestmark = pytest.mark.unit


def _host(tmp_path: Path, *queued: str) -> JobHost:
    cfg = load_config(["--insecure", "--no-default-job", "--db", str(tmp_path / "s.db")],
                      env={})
    catalog = Catalog(cfg.db)
    for job_id in queued:
        catalog.add(job_id, {"n": 1})
    catalog.close()
    return JobHost(cfg, DecodePool(1))


def test_a_starting_job_is_the_only_open_job(tmp_path: Path) -> None:
    host = _host(tmp_path, "j1")
    try:
        starting = SimpleNamespace(engine=SimpleNamespace(job_done=False))
        host.jobs["j1"] = starting  # type: ignore[assignment]  # installed, still queued
        assert host.route("") is starting
    finally:
        host.catalog.close()


def test_two_open_jobs_need_a_name(tmp_path: Path) -> None:
    host = _host(tmp_path, "j1", "j2")
    try:
        host.jobs["j1"] = SimpleNamespace(  # type: ignore[assignment]
            engine=SimpleNamespace(job_done=False))
        with pytest.raises(PreconditionFailed, match="no default job and 2 open jobs"):
            host.route("")
    finally:
        host.catalog.close()
