"""The paper's claim for the three tasks, checked setting by setting.

The claim (Figure 4 and the appendix): Rand-Proj-Spatial(avg) has a lower squared error of
the mean estimate and a lower task loss than Rand-k-Spatial(avg) and Rand-k. For each
(task, split, n, k) this module reports, from the per-iteration summary rows of
:func:`rpsagg_experiments.optimization.summarize` (or the ``<task>.csv`` they are written
to), the squared error averaged over iterations and the last iteration's loss (mean and
standard deviation over runs) of every estimator, and whether the claim holds for each.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

CLAIMANT = "rand-proj-spatial(avg)"
RIVALS = ("rand-k-spatial(avg)", "rand-k")


def verdicts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, split, n, k) and estimator, with the setting's verdict.

    Parameters
    ----------
    rows : iterable of mappings
        Summary rows with keys ``task, split, n, k, estimator, iteration, runs,
        sq_err_mean, loss_mean, loss_std`` (values may be strings, as read from CSV).

    Returns
    -------
    list of dict
        Keys ``task, split, n, k, estimator, runs, sq_err_avg, final_loss_mean,
        final_loss_std, rps_beats_both_error, rps_beats_both_loss``; the two verdicts are
        ``"yes"``, ``"no"`` or ``""`` (a rival or Rand-Proj-Spatial(avg) was not run).
    """
    per: dict[tuple[str, str, int, int], dict[str, list[Mapping[str, Any]]]] = {}
    for r in rows:
        key = (str(r["task"]), str(r["split"]), int(r["n"]), int(r["k"]))
        per.setdefault(key, {}).setdefault(str(r["estimator"]), []).append(r)
    out: list[dict[str, Any]] = []
    for key in sorted(per, key=lambda s: (s[0], s[1], s[2], s[3])):
        stats: dict[str, dict[str, Any]] = {}
        for est, series in per[key].items():
            series = sorted(series, key=lambda r: int(r["iteration"]))
            last = series[-1]
            stats[est] = {
                "runs": int(last["runs"]),
                "sq_err_avg": sum(float(r["sq_err_mean"]) for r in series) / len(series),
                "final_loss_mean": float(last["loss_mean"]),
                "final_loss_std": float(last["loss_std"]),
            }
        err_ok = loss_ok = ""
        if CLAIMANT in stats and all(r in stats for r in RIVALS):
            me = stats[CLAIMANT]
            err_ok = _yes(all(me["sq_err_avg"] < stats[r]["sq_err_avg"] for r in RIVALS))
            loss_ok = _yes(all(me["final_loss_mean"] < stats[r]["final_loss_mean"]
                               for r in RIVALS))
        task, split, n, k = key
        for est, s in stats.items():
            out.append({"task": task, "split": split, "n": n, "k": k, "estimator": est, **s,
                        "rps_beats_both_error": err_ok, "rps_beats_both_loss": loss_ok})
    return out


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def markdown(verdict_rows: Sequence[Mapping[str, Any]], estimators: Sequence[str]) -> str:
    """A markdown table: one line per setting, the estimators' figures side by side.

    Parameters
    ----------
    verdict_rows : sequence of mappings
        Output of :func:`verdicts`.
    estimators : sequence of str
        Column order (estimators missing from a setting show as ``-``).

    Returns
    -------
    str
    """
    settings: dict[tuple[str, str, int, int], dict[str, Mapping[str, Any]]] = {}
    for r in verdict_rows:
        settings.setdefault((r["task"], r["split"], r["n"], r["k"]), {})[r["estimator"]] = r
    names = " / ".join(estimators)
    lines = [
        f"| task | split | n | k | runs | squared error (mean over iterations): {names} "
        f"| final loss (mean ± sd): {names} | RPS(avg) beats both: error / loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (task, split, n, k), by_est in settings.items():
        first = next(iter(by_est.values()))
        errs = " / ".join(f"{by_est[e]['sq_err_avg']:.4g}" if e in by_est else "-"
                          for e in estimators)
        losses = " / ".join(
            f"{by_est[e]['final_loss_mean']:.4g}±{by_est[e]['final_loss_std']:.2g}"
            if e in by_est else "-" for e in estimators)
        runs = max(int(r["runs"]) for r in by_est.values())
        lines.append(f"| {task} | {split} | {n} | {k} | {runs} | {errs} | {losses} | "
                     f"{first['rps_beats_both_error']} / {first['rps_beats_both_loss']} |")
    return "\n".join(lines)


def read_summary(path: Path) -> list[dict[str, str]]:
    """Rows of a ``<task>.csv`` written by the optimization experiments."""
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))
