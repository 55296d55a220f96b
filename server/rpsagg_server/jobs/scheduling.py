"""What the server takes on: which queued jobs start when (``--max-jobs`` running at once,
oldest first), and whether a new job fits (its memory estimate beside the open and queued
jobs' within ``--jobs-memory-bytes``, its request limit under ``--max-request-bytes``, at
most :data:`MAX_QUEUED` waiting)."""

from __future__ import annotations

from collections.abc import Iterable

from rpsagg_server.domain.errors import InvalidRequest, NotReady
from rpsagg_server.domain.jobstate import JobState
from rpsagg_server.jobs.catalog import JobRecord
from rpsagg_server.jobs.jobruntime import JobRuntime
from rpsagg_server.jobs.sizing import Need

#: jobs waiting for a slot, at most
MAX_QUEUED = 1000


def queued(records: Iterable[JobRecord]) -> list[JobRecord]:
    """The queued jobs, oldest first (the order they start in)."""
    return sorted((r for r in records if r.state == JobState.QUEUED), key=lambda r: r.seq)


def count_queued(records: Iterable[JobRecord]) -> int:
    """How many jobs are queued (no order needed: :func:`queued` sorts them)."""
    return sum(r.state == JobState.QUEUED for r in records)


def committed_memory(runtimes: Iterable[JobRuntime], records: Iterable[JobRecord]) -> int:
    """The estimates of the jobs that hold or will hold memory: open and queued."""
    return sum(rt.memory for rt in runtimes) + sum(
        int(r.settings.get("_memory", 0)) for r in records if r.state == JobState.QUEUED)


def check_fits(need: Need, limit: int, budget: int, committed: int, request_limit: int,
               n_queued: int) -> None:
    """Refuse a new job that does not fit (:class:`~rpsagg_server.domain.errors.InvalidRequest`
    naming the setting, or :class:`~rpsagg_server.domain.errors.NotReady` when too many wait)."""
    left = budget - committed
    if need.memory > left:
        raise InvalidRequest(
            f"d: a job of d = {need.cfg.d}, m = {need.m}, n = {need.cfg.n} is estimated "
            f"at {need.memory / 2**20:.1f} MiB; {max(left, 0) / 2**20:.1f} MiB of the "
            f"jobs' {budget / 2**20:.1f} MiB (--jobs-memory-bytes) are left")
    if limit > request_limit:
        raise InvalidRequest(
            f"d: this job's submissions may take {limit} bytes; the server takes "
            f"requests of at most {request_limit} bytes (--max-request-bytes)")
    if n_queued >= MAX_QUEUED:
        raise NotReady(f"{n_queued} jobs are queued already; try again later")
