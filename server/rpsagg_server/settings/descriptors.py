"""The process's file descriptors, split between the dashboard's connections, gRPC's and a
reserve (the open jobs' databases, logs, gRPC's own pipes, the listening sockets).

The dashboard and gRPC share one process, so one descriptor limit (``RLIMIT_NOFILE``):
:func:`descriptor_budget` gives each port its cap (``--http-max-connections``,
``--grpc-max-connections``, automatic by default) and the start-up log states the split
(:meth:`DescriptorBudget.describe`), the jobs it may hold open at once included; a limit
they do not fit in stops the start with one line. The dashboard's protocol
(:mod:`rpsagg_server.http.connections`) and gRPC's guard (:mod:`rpsagg_server.rpc.guard`)
enforce the caps.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

#: descriptors an explicit ``--http-max-connections`` must leave to gRPC, SQLite and the rest
GRPC_RESERVE = 128
#: the listen backlog, which is also how many connections asyncio's loop accepts at a time
#: before any of them is counted (and refused): at most this many beyond the cap, briefly.
#: (uvicorn's default, 2048, would let one burst of a flood take every descriptor.)
ACCEPT_BACKLOG = 64
#: the automatic cap: this fraction of the descriptor limit, at most AUTO_MAX
AUTO_FRACTION = 4
AUTO_MAX = 1024
#: descriptors kept for the health probes' reserve, the database, logs, gRPC's own pipes
#: and the listening sockets
OTHER_RESERVE = 64
#: descriptors a running job holds: its database's two connections, each with its
#: write-ahead log, and their shared memory (5, counted in ``/proc/PID/fd``), and one more
#: for its task's data file
JOB_DESCRIPTORS = 6
#: descriptors an ended job open to be read holds: one connection, its log, the shared
#: memory (3 counted), and one more
READER_DESCRIPTORS = 4
#: the automatic gRPC cap: what the dashboard's cap and the reserves leave, at most this
GRPC_AUTO_MAX = 4096
#: the gRPC cap is at least this (a tiny descriptor limit is then the operator's to raise)
GRPC_MIN = 16


def descriptor_limit() -> int | None:
    """The process's soft ``RLIMIT_NOFILE`` (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(requested: int, limit: int | None) -> int:
    """The HTTP connection cap for ``--http-max-connections requested`` (0: automatic).

    Automatic: a quarter of the descriptor limit ``limit``, at most 1024 (256 of 1024).
    An explicit cap must leave :data:`GRPC_RESERVE` descriptors, besides the
    :data:`ACCEPT_BACKLOG` a burst of accepts may hold for an instant.

    Raises
    ------
    ValueError
        If ``requested`` is negative or leaves fewer than :data:`GRPC_RESERVE` descriptors.
    """
    if requested < 0:
        raise ValueError(f"--http-max-connections must be >= 0 (0: automatic); got {requested}")
    if requested == 0:
        return AUTO_MAX if limit is None else max(1, min(AUTO_MAX, limit // AUTO_FRACTION))
    most = None if limit is None else limit - GRPC_RESERVE - ACCEPT_BACKLOG
    if most is not None and requested > most:
        raise ValueError(
            f"--http-max-connections {requested} leaves fewer than {GRPC_RESERVE} of the "
            f"process's {limit} file descriptors (ulimit -n) to gRPC and the database; "
            f"use at most {max(0, most)} or raise the limit")
    return requested


@dataclass(frozen=True)
class DescriptorBudget:
    """How the process's descriptors are split between the two ports.

    Attributes
    ----------
    limit : int or None
        The descriptor limit (None: unlimited).
    http : int
        Dashboard connections at most (0: no dashboard).
    grpc : int
        gRPC connections at most.
    reserve : int
        The rest: the dashboard's accept burst, the open jobs' and everything else.
    jobs : tuple of int
        The running jobs and the ended ones open to be read, at most at once (their
        descriptors are in :attr:`reserve`).
    """

    limit: int | None
    http: int
    grpc: int
    reserve: int
    jobs: tuple[int, int] = (0, 0)

    def describe(self) -> str:
        """One line for the start-up log."""
        lim = "unlimited" if self.limit is None else str(self.limit)
        return (f"file descriptors: limit {lim}; gRPC connections at most {self.grpc}, "
                f"dashboard connections at most {self.http}, {self.reserve} reserved (with "
                f"{jobs_descriptors(*self.jobs)} for {self.jobs[0]} running jobs and "
                f"{self.jobs[1]} ended ones read at once)")


def jobs_descriptors(running: int, readers: int) -> int:
    """Descriptors of ``running`` jobs and ``readers`` ended ones open to be read."""
    return running * JOB_DESCRIPTORS + readers * READER_DESCRIPTORS


def descriptor_budget(http_requested: int | None, grpc_requested: int,
                      limit: int | None, jobs: tuple[int, int] = (0, 0)) -> DescriptorBudget:
    """Split ``limit`` descriptors between the dashboard (``--http-max-connections``; None:
    no dashboard), gRPC (``--grpc-max-connections``; 0 is automatic for either) and the
    jobs open at once at most (``jobs``: running, ended ones read; :func:`jobs_descriptors`).

    Automatic: the dashboard gets :func:`connection_cap`'s share, gRPC what is left after
    the dashboard's accept burst (:data:`ACCEPT_BACKLOG`), :data:`OTHER_RESERVE` and the
    jobs', at most :data:`GRPC_AUTO_MAX` (at 1024 with 16 running jobs and 4 read: 256 and
    528).

    Raises
    ------
    ValueError
        If a cap is negative, or the caps (automatic gRPC at least :data:`GRPC_MIN`) leave
        fewer than the reserves: one line naming what to change.
    """
    http = 0 if http_requested is None else connection_cap(http_requested, limit)
    if grpc_requested < 0:
        raise ValueError(f"--grpc-max-connections must be >= 0 (0: automatic); "
                         f"got {grpc_requested}")
    reserve = (OTHER_RESERVE + (ACCEPT_BACKLOG if http_requested is not None else 0)
               + jobs_descriptors(*jobs))
    if grpc_requested == 0:
        left = GRPC_AUTO_MAX if limit is None else limit - http - reserve
        if left < GRPC_MIN:
            fewer = -(-(GRPC_MIN - left) // JOB_DESCRIPTORS)
            raise ValueError(
                f"{jobs[0]} running jobs (--max-jobs) with {http} dashboard connections leave "
                f"fewer than {GRPC_MIN} of the process's {limit} file descriptors (ulimit -n) "
                f"to gRPC; use --max-jobs {jobs[0] - fewer} or raise the limit"
                if fewer < jobs[0] else
                f"a limit of {limit} file descriptors (ulimit -n) is too low for a server "
                f"with {http} dashboard connections; raise it")
        grpc = min(GRPC_AUTO_MAX, left)
    else:
        grpc = grpc_requested
        if limit is not None and http + grpc + reserve > limit:
            raise ValueError(
                f"--grpc-max-connections {grpc} with {http} dashboard connections leaves "
                f"fewer than {reserve} of the process's {limit} file descriptors (ulimit -n) "
                f"to the jobs' databases and the rest; use at most "
                f"{max(0, limit - http - reserve)} or raise the limit")
    return DescriptorBudget(limit, http, grpc, reserve, jobs)
