"""A job as the jobs API shows it (``GET /api/jobs/{id}``, the ``past_jobs`` list), from
its catalog row and, while it is open, its runtime."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rpsagg.tasks import make_task
from rpsagg_server.domain.jobstate import ENDED, JobState
from rpsagg_server.jobs.catalog import JOB_STATES, JobRecord
from rpsagg_server.jobs.jobruntime import JobRuntime
from rpsagg_server.rounds.results import no_round_info
from rpsagg_server.settings.serverconfig import JOB_KEYS, ServerConfig, job_config
from rpsagg_wire.v1.messages import RoundInfo, RoundState


def summary(rt: JobRuntime) -> dict[str, Any]:
    """What :func:`describe` shows of a job's rounds, from its runtime: what an ended
    created job's catalog row keeps (written as it closes), so that it is described without
    being opened."""
    rounds = rt.state.rounds()
    last = next((r for r in rounds if r.state == RoundState.DONE), None)
    est = None if last is None else last.estimated_error
    rel = None if est is None or not math.isfinite(est.relative_error) \
        else float(est.relative_error)
    return {"rounds": rt.cfg.rounds, "rounds_done": rt.engine.progress.steps_done,
            "bytes_up": sum(r.wire_bytes for r in rounds),
            "payload_bytes": sum(r.payload_bytes for r in rounds),
            "last_rel_error": rel, "clients": len(rt.state.clients())}


def closed(rec: JobRecord) -> bool:
    """Whether a created job ended and was closed: its summary is in its row, its rounds
    in its database (read on demand, :mod:`~rpsagg_server.jobs.endedjobs`)."""
    return rec.kind == "created" and rec.state in ENDED and "rounds_done" in rec.summary


def describe(rec: JobRecord, settings: dict[str, Any], rt: JobRuntime | None,
             default: bool) -> dict[str, Any]:
    """A job: its row's state and times, its settings, and its progress (its runtime's
    rounds; an ended or past job's summary; nothing yet for a queued or waiting one)."""
    out: dict[str, Any] = {
        "id": rec.id, "default": default, "kind": rec.kind, "state": rec.state,
        "failure": rec.failure, "created_at": rec.created_at, "started_at": rec.started_at,
        "finished_at": rec.finished_at, "settings": settings}
    if rt is None:
        s = rec.summary
        out.update(rounds=int(s.get("rounds", settings.get("rounds", 10))),
                   rounds_done=int(s.get("rounds_done", 0)),
                   bytes_up=int(s.get("bytes_up", 0)),
                   payload_bytes=int(s.get("payload_bytes", 0)),
                   last_rel_error=s.get("last_rel_error"), clients=int(s.get("clients", 0)))
        return out
    out.update(summary(rt), memory_estimate=rt.memory)
    return out


def past_entry(rec: JobRecord) -> dict[str, Any]:
    """A past job as the ``past_jobs`` list shows it (the fields of
    :class:`~rpsagg_server.jobs.pastjobs.PastJob`)."""
    s = rec.summary
    return {"file": s.get("file", rec.id + ".db"), "state": rec.state, "failure": rec.failure,
            "config": dict(rec.settings), "rounds": int(s.get("rounds", 0)),
            "rounds_done": int(s.get("rounds_done", 0)), "started_at": rec.started_at,
            "last_round_at": rec.finished_at, "clients": int(s.get("clients", 0))}


def runtime_state(rt: JobRuntime) -> JobState:
    """An open job's state as its engine says (what the default job's row is written
    from)."""
    p = rt.engine.progress
    return (JobState.CANCELLED if p.cancelled else JobState.FAILED if p.job_failure
            else JobState.DONE if p.job_done else JobState.RUNNING)


def runtime_settings(rt: JobRuntime) -> dict[str, Any]:
    """Every job setting of an open job."""
    public = rt.cfg.public_dict()
    return {k: public[k] for k in JOB_KEYS}


def finished_at(rt: JobRuntime) -> float | None:
    """When an ended job's last round finished (None while it runs)."""
    if not rt.engine.progress.job_done:
        return None
    return max((r.finished_at for r in rt.state.rounds(limit=1)
                if r.finished_at is not None), default=None)


class JobListing:
    """The jobs API's read side over the catalog's rows and the open jobs.

    Parameters
    ----------
    cfg : ServerConfig
        The server's configuration (a created job's settings are its defaults filled in).
    records : Mapping[str, JobRecord]
        The catalog's rows, as the host keeps them.
    jobs : Mapping[str, JobRuntime]
        The open jobs.
    """

    def __init__(self, cfg: ServerConfig, records: Mapping[str, JobRecord],
                 jobs: Mapping[str, JobRuntime]) -> None:
        self.cfg = cfg
        self.records = records
        self.jobs = jobs
        self.default_id: str | None = None
        self._full_settings: dict[str, dict[str, Any]] = {}
        self._ended_info: dict[str, RoundInfo] = {}

    def ended_info(self, job_id: str) -> RoundInfo | None:
        """GetRound's answer for a created job that ended without ever running (no runtime:
        queued, then cancelled or failed to start): ``job_done`` with why; None for any
        other job."""
        rec = self.records.get(job_id)
        if rec is None or rec.kind != "created" or rec.state not in ENDED \
                or job_id in self.jobs or closed(rec):
            return None
        info = self._ended_info.get(job_id)
        if info is None:  # made once: a row that ended never changes
            c = job_config(self.cfg, rec.job_settings, ":memory:")
            info = self._ended_info[job_id] = no_round_info(
                c, make_task(c.task, c.d, c.params).m, d=c.d, job_done=True,
                job_failure=rec.failure or str(rec.state))
        return info

    def describe(self, job_id: str) -> dict[str, Any]:
        """A job as ``GET /api/jobs/{id}`` shows it (KeyError when unknown): its catalog
        row, and its runtime while it is open."""
        rec = self.records[job_id]
        return describe(rec, self.settings(rec), self.jobs.get(job_id),
                        job_id == self.default_id)

    def settings(self, rec: JobRecord) -> dict[str, Any]:
        """A job's settings, every job setting (a created job's defaults filled in)."""
        if rec.kind != "created":
            return rec.job_settings
        full = self._full_settings.get(rec.id)
        if full is None:
            given = rec.job_settings
            try:
                self.remember(rec.id, job_config(self.cfg, given, ":memory:"))
            except ValueError:  # settings a later version refuses: shown as given
                self._full_settings[rec.id] = given
            full = self._full_settings[rec.id]
        return dict(full)

    def forget(self, job_id: str) -> None:
        """A removed job's settings and answer, no longer kept."""
        self._full_settings.pop(job_id, None)
        self._ended_info.pop(job_id, None)

    def remember(self, job_id: str, cfg: ServerConfig) -> None:
        """Keep a created job's every setting from its configuration (the one its creation
        validated: not validated again when it is first shown)."""
        public = cfg.public_dict()
        self._full_settings[job_id] = {k: public[k] for k in JOB_KEYS}

    def current(self) -> list[JobRecord]:
        """The jobs this server runs: the default first, then the created ones oldest
        first (not the past jobs)."""
        return sorted((r for r in self.records.values() if r.kind in ("default", "created")),
                      key=lambda r: r.seq)

    def past_jobs(self) -> list[dict[str, Any]]:
        """The past jobs (``--on-finished-job new``), newest first."""
        past = [r for r in self.records.values() if r.kind == "past"]
        past.sort(key=lambda r: r.started_at or 0.0, reverse=True)
        return [past_entry(r) for r in past]

    def list(self) -> list[dict[str, Any]]:
        """Every job this server runs (:meth:`current`), described."""
        return [self.describe(r.id) for r in self.current()]

    def counts(self) -> dict[str, int]:
        """The jobs this server runs, by state."""
        out: dict[str, int] = dict.fromkeys(JOB_STATES, 0)
        for rec in self.current():
            out[rec.state] += 1
        return out
