"""A start reopens the created jobs that run, and only those: its cost does not grow with
the jobs that ended (:mod:`~rpsagg_server.jobs.endedjobs`).

Per row of the catalog (its module docstring tells the crash story):

- ``running``: reopened (resumed from its database);
- ``queued``: started later, when there is room (the host's scheduling);
- ended with a summary (closed): nothing is opened;
- ended with no summary and a database (a crash between its end and its close, an older
  catalog, a cancel acknowledged before its own database had it): opened, cancelled again
  if it was, and closed, one at a time, before the next is opened;
- ended with no database (it never ran): a row, nothing opened.

A job that cannot be reopened (:data:`~.jobruntime.CANNOT_OPEN`) is logged; a running one
is shown failed (in memory only: the next start tries again). Any other error propagates.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from rpsagg_server.domain.jobstate import ENDED, JobState
from rpsagg_server.jobs import jobviews
from rpsagg_server.jobs.catalog import JobRecord
from rpsagg_server.jobs.jobruntime import CANNOT_OPEN

if TYPE_CHECKING:
    from rpsagg_server.jobs.jobhost import JobHost

log = logging.getLogger("rpsagg.server")


def to_open(host: JobHost, rec: JobRecord) -> bool:
    """Whether a start opens this row's job (module docstring)."""
    if rec.kind != "created" or rec.state == JobState.QUEUED or jobviews.closed(rec):
        return False
    return rec.state not in ENDED or os.path.exists(host.catalog.job_db(rec.id))


async def restore(host: JobHost, records: dict[str, JobRecord]) -> None:
    """Reopen the jobs a start opens (module docstring), then start the retention and
    what is queued."""
    for rec in [r for r in records.values() if to_open(host, r)]:
        try:
            if rec.state in ENDED:
                await _close_again(host, rec)
            else:
                await host.open_record(rec)
        except CANNOT_OPEN as exc:
            log.error("[Jobs] job %s cannot be reopened: %s", rec.id, exc)
            if rec.state not in ENDED:  # in memory only: the next start tries again
                records[rec.id] = dataclasses.replace(
                    rec, state=JobState.FAILED, failure=f"cannot be reopened: {exc}")
    await host.retention.start()
    await host.schedule()


async def _close_again(host: JobHost, rec: JobRecord) -> None:
    """An ended job that was not closed: its end applied again if its database lacks it (a
    cancel), then closed, its summary recorded."""
    rt = await host.open_record(rec, install=False)
    if rec.state == JobState.CANCELLED:
        await rt.engine.cancel(rec.failure or "cancelled")
    host.jobs[rt.id] = rt  # as a job that ends: closed by the same path
    await host.ended.retire(rt, keep=False)
