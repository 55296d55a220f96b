"""The figures (matplotlib, Agg backend): one function per experiment."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {
    "rand-k": "tab:blue",
    "rand-k-spatial(max)": "tab:orange",
    "rand-k-spatial(avg)": "tab:orange",
    "rand-k-spatial(opt)": "tab:orange",
    "rand-proj-spatial(max)": "tab:purple",
    "rand-proj-spatial(avg)": "tab:purple",
    "rand-proj-spatial(corr)": "tab:purple",
    "rand-proj-spatial(auto)": "tab:green",
    "rand-k-wangni": "tab:red",
    "induced": "tab:brown",
}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _f(row: dict[str, Any], key: str) -> float:
    return float(row[key])


def plot_full_correlation(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """MSE against k per n: simulated points (2 s.e. bars) and closed-form lines."""
    ns = sorted({int(r["n"]) for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(4 * len(ns), 3.4), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for label, color in COLORS.items():
            pts = sorted((r for r in rows if int(r["n"]) == n and r["estimator"] == label),
                         key=lambda r: int(r["k"]))
            if not pts:
                continue
            ks = [int(r["k"]) for r in pts]
            ax.errorbar(ks, [_f(r, "mse") for r in pts], yerr=[2 * _f(r, "se") for r in pts],
                        fmt="o", color=color, ms=4, label=f"{label} (sim.)")
            ax.plot(ks, [_f(r, "closed_form") for r in pts], "-", color=color, lw=1,
                    label=f"{label} (closed form)")
        ax.set_yscale("log")
        ax.set_xlabel("k")
        ax.set_title(f"n = {n}, d = {rows[0]['d']}")
    axes[0][0].set_ylabel("MSE")
    axes[0][0].legend(fontsize=6)
    return _save(fig, path)


def plot_varying_correlation(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """MSE against R per (n, k), one panel each."""
    panels = sorted({(int(r["n"]), int(r["k"])) for r in rows})
    cols = min(4, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.0 * nrows), squeeze=False)
    for idx, (n, k) in enumerate(panels):
        ax = axes[idx // cols][idx % cols]
        for label, color in COLORS.items():
            pts = sorted((r for r in rows if (int(r["n"]), int(r["k"])) == (n, k)
                          and r["estimator"] == label), key=lambda r: float(r["r"]))
            if not pts:
                continue
            style = "--" if label.endswith("(auto)") else "-"
            rs = [_f(r, "r") for r in pts]
            if pts[0].get("exact") not in (None, ""):
                ax.plot(rs, [_f(r, "exact") for r in pts], "s" + style, color=color, ms=3,
                        lw=1, label=f"{label} (exact)")
                continue
            ax.errorbar(rs, [_f(r, "mse") for r in pts], yerr=[2 * _f(r, "se") for r in pts],
                        fmt="o" + style, color=color, ms=3, lw=1, label=f"{label} (sim.)")
        ax.set_title(f"n = {n}, k = {k}", fontsize=9)
        ax.set_xlabel("R")
        ax.set_ylabel("MSE")
    for idx in range(len(panels), nrows * cols):
        axes[idx // cols][idx % cols].axis("off")
    axes[0][0].legend(fontsize=6)
    return _save(fig, path)


def plot_rank(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Fraction of trials with rank S < nk, with 95% Wilson intervals."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ds = sorted({int(r["d"]) for r in rows})
    for j, frac in enumerate((8, 4, 2, 1)):
        pts = [r for r in rows if int(r["nk"]) * frac == int(r["d"])]
        pts.sort(key=lambda r: int(r["d"]))
        x = [ds.index(int(r["d"])) + 0.15 * (j - 1.5) for r in pts]
        p = [_f(r, "p_deficient") for r in pts]
        lo = [pi - _f(r, "ci_low") for pi, r in zip(p, pts, strict=True)]
        hi = [_f(r, "ci_high") - pi for pi, r in zip(p, pts, strict=True)]
        ax.errorbar(x, p, yerr=[lo, hi], fmt="o", ms=4, label=f"nk = d/{frac}")
    ax.set_xticks(range(len(ds)), [str(d) for d in ds])
    ax.set_xlabel("d (k = 4, n = nk/4)")
    ax.set_ylabel("P(rank S < nk)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_task(rows: Sequence[dict[str, Any]], out: Path, task: str) -> list[Path]:
    """Per split: squared error and task loss against the iteration, a column per (n, k).

    Lines are means over runs, bands one standard deviation. The error panels are
    logarithmic, and so is a loss panel whose means span more than a factor of 20 (a
    diverging estimator would flatten the others). On a log axis ``m - s`` may be <= 0, so
    the band there is ``[m^2 / (m + s), m + s]``: the upper deviation mirrored in log space.
    """
    paths = []
    for split in sorted({r["split"] for r in rows}):
        sub = [r for r in rows if r["split"] == split]
        panels = sorted({(int(r["n"]), int(r["k"])) for r in sub})
        fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels), 5.6),
                                 squeeze=False)
        for col, (n, k) in enumerate(panels):
            series = {}
            for label in COLORS:
                pts = sorted((r for r in sub if (int(r["n"]), int(r["k"])) == (n, k)
                              and r["estimator"] == label), key=lambda r: int(r["iteration"]))
                if pts:
                    series[label] = pts
            losses = [_f(r, "loss_mean") for pts in series.values() for r in pts]
            positive = [v for v in losses if v > 0]
            log_loss = bool(positive) and len(positive) == len(losses) and (
                max(positive) > 20 * min(positive))
            for label, pts in series.items():
                it = [int(r["iteration"]) for r in pts]
                for row, key in enumerate(("sq_err", "loss")):
                    ax = axes[row][col]
                    log = row == 0 or log_loss
                    m = [_f(r, f"{key}_mean") for r in pts]
                    s = [_f(r, f"{key}_std") for r in pts]
                    style = "--" if label.endswith("(auto)") else "-"
                    ax.plot(it, m, style, color=COLORS[label], lw=1.2, label=label)
                    lo = [a * a / (a + b) if log and a > 0 else a - b
                          for a, b in zip(m, s, strict=True)]
                    ax.fill_between(it, lo, [a + b for a, b in zip(m, s, strict=True)],
                                    color=COLORS[label], alpha=0.15)
            axes[0][col].set_title(f"{task} {split}: n = {n}, k = {k}", fontsize=9)
            axes[0][col].set_yscale("log")
            if log_loss:
                axes[1][col].set_yscale("log")
            axes[1][col].set_xlabel("iteration")
        axes[0][0].set_ylabel("squared error of the mean")
        axes[1][0].set_ylabel({"power-iteration": "||v_t - v_top||", "kmeans": "k-means objective",
                               "linreg": "training MSE"}[task])
        axes[0][0].legend(fontsize=6)
        paths.append(_save(fig, out / f"{task}-{split}.png"))
    return paths


def plot_timing(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Encode (per client) and decode (per round) wall-clock per estimator and task."""
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        sub = [r for r in rows if r["task"] == task]
        sub = [r for r in sub if (r["n"], r["k"]) == (sub[0]["n"], sub[0]["k"])]
        labels = [r["estimator"] for r in sub]
        x = range(len(sub))
        ax.bar([i - 0.2 for i in x], [_f(r, "encode_ms") for r in sub], 0.4,
               label="encode (ms, one client)")
        ax.bar([i + 0.2 for i in x], [_f(r, "decode_ms") for r in sub], 0.4,
               label="decode (ms, one round)")
        ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{task}: n = {sub[0]['n']}, k = {sub[0]['k']}, d = {sub[0]['d']}",
                     fontsize=9)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


BITS_COLORS = {"rand-k": "tab:blue", "rand-k-spatial": "tab:orange",
               "rand-proj-spatial": "tab:purple", "rand-proj-spatial(auto)": "tab:pink",
               "eden": "tab:green", "qsgd": "tab:red"}
BITS_MARKERS = {1: "v", 2: "s", 4: "D", 8: "^", 32: "o"}


def plot_bits(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Squared error against bits per coordinate, one panel per setting, Pareto frontier in
    black: colour = scheme, marker = value bits (sketches) or bits (EDEN, QSGD)."""
    from rpsagg_experiments.bits import pareto

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    cols = 2
    nrows = (len(settings) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 5 * nrows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        sub = [r for r in rows if r["setting"] == setting]
        for scheme in BITS_COLORS:
            for bits in sorted({int(r["bits"]) for r in sub if r["scheme"] == scheme}):
                pts = sorted((_f(r, "bits_per_coordinate"), _f(r, "mse")) for r in sub
                             if r["scheme"] == scheme and int(r["bits"]) == bits)
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker=BITS_MARKERS.get(bits, "o"), ms=4, lw=0.8,
                        color=BITS_COLORS[scheme], alpha=0.8, label=f"{scheme}/{bits}b")
        front = pareto(list(sub))
        ax.step([_f(r, "bits_per_coordinate") for r in front], [_f(r, "mse") for r in front],
                where="post", color="black", lw=1.6, label="Pareto frontier")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(0.05, 40)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("bits per coordinate (per client, with seed and scale)")
        ax.set_ylabel("squared error of the mean")
        ax.set_title(setting if setting == "power-iteration" else f"n = 10, d = 1024, {setting}")
        ax.grid(True, which="both", alpha=0.2)
    for ax in list(axes.flat)[len(settings):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path
