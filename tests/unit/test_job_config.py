"""A created job's configuration (``job_config``): the job's settings are checked by their
rules and the checks between fields, the server's own values (checked when it started) are
taken as they are, without their rules running again."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rpsagg_server.settings import rules
from rpsagg_server.settings.jobspec import JOB_KEYS
from rpsagg_server.settings.process import ServerSettings
from rpsagg_server.settings.rules import field_infos
from rpsagg_server.settings.serverconfig import ServerConfig, job_config

pytestmark = pytest.mark.unit

SERVER = ServerConfig(no_default_job=True, insecure=True, db=":memory:")
SMALL = {"n": 4, "k": 16, "d": 256, "rounds": 1}


def test_every_job_rule_runs_and_no_server_rule_but_the_jobs_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    check = rules.check_field

    def spy(table: Any, name: str, value: Any) -> Any:
        seen.append(name)
        return check(table, name, value)

    monkeypatch.setattr(rules, "check_field", spy)
    cfg = job_config(SERVER, SMALL, "/tmp/job.db")
    assert (cfg.n, cfg.k, cfg.d, cfg.db) == (4, 16, 256, "/tmp/job.db")
    assert set(JOB_KEYS) <= set(seen)
    # of the server's settings, only those the job sets (its database and its ending)
    server_checked = set(seen) & set(field_infos(ServerSettings))
    assert server_checked == {"db", "port_file", "on_finished_job", "no_default_job"}
    assert cfg.insecure and cfg.no_default_job is False


@pytest.mark.parametrize(("settings", "message"), [
    ({"n": 0}, "--n must be >= 1; got 0"),
    ({"estimator": "nope"}, "--estimator must be one of"),
    ({"k": 300, "d": 256}, "--k must be in [1, d] = [1, 256]; got 300"),
])
def test_a_job_setting_is_refused_by_its_rule_or_a_check_between_fields(
        settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        job_config(SERVER, {**SMALL, **settings}, ":memory:")
