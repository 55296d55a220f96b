"""What every experiment shares: deterministic seeds, a two-process pool with a progress
bar, and CSV output."""

from __future__ import annotations

import csv
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

from rpsagg.spec import MASK64, mix64

T = TypeVar("T")
R = TypeVar("R")

#: Distinct tags so that no two experiments share a seed stream.
TAGS = {
    "full-correlation": 0x46554C4C,
    "varying-correlation": 0x56415259,
    "rank": 0x52414E4B,
    "tasks": 0x5441534B,
    "timing": 0x54494D45,
    "bits": 0x42495453,
}


def seed_of(*words: int) -> int:
    """A 64-bit seed from integers: a SplitMix64 chain, distinct for distinct tuples
    (up to 64-bit collisions).

    Parameters
    ----------
    *words : int
        E.g. ``(tag, run, iteration, client)``.

    Returns
    -------
    int
        In ``[0, 2^64)``.
    """
    z = 0x9E3779B97F4A7C15
    for w in words:
        z = mix64((z ^ (int(w) & MASK64)) & MASK64)
    return z


_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _progress(total: int, desc: str, enabled: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the experiments extra
        return None
    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)


def parallel_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int = 2,
    desc: str = "",
    progress: bool = True,
) -> list[R]:
    """``[fn(x) for x in items]`` over ``workers`` processes, in input order.

    Parameters
    ----------
    fn : callable
        A picklable (module-level) function.
    items : sequence
        Independent work items (runs, grid points).
    workers : int
        Processes; 1 runs in this process (no pickling; easier to debug).
    desc : str
        Progress bar label.
    progress : bool
        Show a progress bar on stderr.

    Returns
    -------
    list
        Results in the order of ``items``.
    """
    bar = _progress(len(items), desc, progress)
    out: list[Any] = [None] * len(items)
    try:
        if workers <= 1 or len(items) <= 1:
            for i, item in enumerate(items):
                out[i] = fn(item)
                if bar is not None:
                    bar.update(1)
            return out
        # Spawned workers import numpy afresh with one BLAS thread each: two workers on two
        # cores, no oversubscription.
        for var in _BLAS_VARS:
            os.environ.setdefault(var, "1")
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
                if bar is not None:
                    bar.update(1)
        return out
    finally:
        if bar is not None:
            bar.close()


def write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write dict rows (the first row's keys are the header) to ``path``; returns it."""
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        if not rows:
            return path
        writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV written by :func:`write_csv`."""
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))
