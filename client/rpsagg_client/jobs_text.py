"""How ``rpsagg-jobs`` shows jobs: the ``list`` table and one-line summaries.

Pure functions of a job as the server's jobs API answers it (a JSON object); nothing here
talks to the server.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any


def fmt_bytes(b: float) -> str:
    """``123 B``, ``4.1 KiB``, ``2.0 MiB``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if b < 1024:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def fmt_rounds(job: dict[str, Any]) -> str:
    """``12/50``; ``12/-`` for a job that runs until stopped (``rounds`` 0)."""
    rounds = job.get("rounds") or 0
    return f"{job.get('rounds_done') or 0}/{rounds if rounds else '-'}"


def fmt_time(t: Any) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS``; ``-`` for none."""
    if not isinstance(t, int | float) or not math.isfinite(t):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def jobs_table(jobs: Sequence[dict[str, Any]]) -> str:
    """The ``list`` table: id (``*``: the default job), state, rounds, bytes, created."""
    rows = [("ID", "STATE", "ROUNDS", "BYTES UP", "CREATED")]
    for job in jobs:
        rows.append((f"{job.get('id', '?')}{'*' if job.get('default') else ''}",
                     str(job.get("state", "?")), fmt_rounds(job),
                     fmt_bytes(job.get("bytes_up") or 0), fmt_time(job.get("created_at"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def summary(job: dict[str, Any], sent: dict[str, Any] | None = None) -> str:
    """What a job is: ``rand-k, n=10, k=102, d=1024, 50 rounds``."""
    settings = job.get("settings")
    if not isinstance(settings, dict) or not settings:
        settings = sent or {}
    parts = [str(settings["estimator"])] if settings.get("estimator") else []
    parts += [f"{key}={settings[key]}" for key in ("task", "n", "k", "d")
              if settings.get(key) not in (None, "")]
    rounds = job.get("rounds", settings.get("rounds"))
    if isinstance(rounds, int):
        parts.append(f"{rounds} rounds" if rounds else "rounds until stopped")
    return ", ".join(parts)


def progress(job: dict[str, Any]) -> str:
    """The ``wait`` line: ``job ID: running, 12/50 rounds done, 1.2 MiB up, relative error
    0.0123``."""
    parts = [str(job.get("state", "?"))]
    if job.get("state") != "queued":
        parts.append(f"{fmt_rounds(job)} rounds done")
        parts.append(f"{fmt_bytes(job.get('bytes_up') or 0)} up")
        err = job.get("last_rel_error")
        if isinstance(err, int | float) and math.isfinite(err):
            parts.append(f"relative error {err:.4g}")
    if job.get("failure"):
        parts.append(str(job["failure"]))
    return f"job {job.get('id', '?')}: {', '.join(parts)}"


def retention_line(kept: dict[str, Any]) -> str:
    """The ``list`` line on what the server keeps of its ended jobs (``retention`` of
    ``GET /api/jobs``): ``12 ended jobs kept (3.4 MiB), the oldest ended 2026-11-28 10:00;
    the server keeps the last 1000 for 90 days``."""
    n = int(kept.get("ended_jobs", 0))
    line = f"{n} ended job{'s' if n != 1 else ''} kept ({fmt_bytes(kept.get('ended_bytes', 0))})"
    if kept.get("oldest_finished_at"):
        line += f", the oldest ended {fmt_time(kept['oldest_finished_at'])}"
    days = float(kept.get("keep_finished_for") or 0) / 86400
    age = f" for {days:g} days" if days else ""
    return f"{line}; the server keeps the last {kept.get('keep_finished_jobs', '?')}{age}"
