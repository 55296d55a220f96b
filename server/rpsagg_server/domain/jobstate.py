"""A job's state: :class:`JobState`, what the catalog records and the jobs API shows.

A member equals its name as a string (the catalog's column, the API's JSON, the metrics'
labels).
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Where a job stands."""

    WAITING = "waiting"  # a --d 0 job open for its first join, which says d
    QUEUED = "queued"  # recorded; starts when a slot is free (--max-jobs)
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: the states a job ends in
ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
#: the states a job may still leave
OPEN_STATES = tuple(s for s in JobState if s not in ENDED)
#: the states of the job a server's flags started, as its read model shows them
DEFAULT_JOB_STATES = (JobState.RUNNING, JobState.DONE, JobState.FAILED)
