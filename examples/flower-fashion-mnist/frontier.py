"""The frontier: test accuracy against wire bytes up, at about 30x, 100x and 300x fewer bytes
than FedAvg, with and without client error feedback, over several seeds, FedAvg beside.

    python frontier.py                  # cnn and mlp, 3 seeds, 20 rounds: ~40 min on 2 cores
    python frontier.py --models mlp --seeds 1 --rounds 5   # a quick look
    python frontier.py --report-only --out DIR  # the table and plot from DIR's JSON

Each model's budgets are set by measurement, not arithmetic: for a ratio r the run takes
the largest number k of 4-bit Rand-Proj-Spatial codes whose reply (a real ``Message`` from
``rpsagg_mod``, counted by ``rpsagg_flower.wire.wire_bytes``) fits in FedAvg's reply over r.
A ratio whose budget is below the reply's fixed bytes (Flower's ``Message`` and metrics,
rpsagg's framing, arrays sent uncompressed) is reported as out of reach with those bytes.
Every budget is run twice: with FedAvg's step (the server applies the decoded mean, no
optimizer) and with client error feedback (each node keeps what the server did not apply
of its update, ``e = v - lr * decode(own message)``, and the server steps by the
contractive ``lr = k / (d (1 + q))``, ``q`` the 4-bit rounding's relative variance, as
``benchmark.py``'s ``_control`` derives it).

Models (``benchmark.fmnist_task``: 5 clients of 1,000 IID training images each, one local
epoch of SGD with momentum, the 10,000 test images):

* ``cnn``: the example's CNN (``fmnist_app.cnn``, d = 20,586, BatchNorm statistics sent
  uncompressed): FedAvg's reply is 90,113 B and a compressed reply has ~945 B of fixed
  bytes, so 100x and 300x are out of its reach; ~80x (k = 400) is measured instead.
* ``mlp``: a 784-256-10 perceptron (``fmnist_app.mlp``, d = 203,530, no buffers).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the thread pools are sized before numpy and torch start
    from benchmark import THREAD_VARS, _argv_threads

    for _var in THREAD_VARS:
        os.environ[_var] = str(_argv_threads(sys.argv[1:]))

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
from benchmark import (
    HERE,
    Config,
    Nodes,
    Task,
    compressed_size,
    environment,
    fmnist_task,
    pin_threads,
    run,
)
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity
from fmnist_app import cnn, mlp

from rpsagg_flower import RandProjSpatialFedAvg, ServerSGD, make_rpsagg_mod
from rpsagg_flower.wire import wire_bytes

BITS = 4
ARCHS = {"cnn": cnn, "mlp": mlp}


def _trained(arrays: ArrayRecord) -> ArrayRecord:
    """``arrays`` as after training: each floating-point array moved by its own amount (a
    fresh model's equal arrays, BatchNorm's ones and zeros, would otherwise travel once),
    the integer counters as they are (equal after training too)."""
    out = {}
    for i, (key, arr) in enumerate(arrays.items()):
        a = arr.numpy()
        out[key] = Array((a + 0.01 * (i + 1)).astype(a.dtype)
                         if np.issubdtype(a.dtype, np.floating) else a)
    return ArrayRecord(out)


def _probe_app(examples: int) -> ClientApp:
    """A ClientApp that answers as the benchmark's does (the model and its two metrics, a
    shard of ``examples``), with :func:`_trained`'s model: what a reply weighs does not
    depend on the training."""
    app = ClientApp(mods=[make_rpsagg_mod()])

    @app.train()
    def fit(msg: Message, ctxt: Context) -> Message:
        new = _trained(msg.content.array_records["arrays"])
        metrics = MetricRecord({"train-loss": 1.0, "num-examples": examples})
        return Message(RecordDict({"arrays": new, "metrics": metrics}), reply_to=msg)

    return app


def reply_bytes(task: Task, k: int | None, examples: int) -> int:
    """Wire bytes of one node's reply (a shard of ``examples``): FedAvg's (``k`` None) or
    4-bit Rand-Proj-Spatial's."""
    arrays = task.initial()
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    if k is None:
        metrics = MetricRecord({"train-loss": 1.0, "num-examples": examples})
        instruction = Message(RecordDict({"arrays": arrays}), dst_node_id=1, message_type="train")
        return wire_bytes(Message(RecordDict({"arrays": _trained(arrays), "metrics": metrics}),
                                  reply_to=instruction))
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=k, value_bits=BITS,
                                     uncompressed=task.uncompressed, fraction_evaluate=0.0,
                                     min_train_nodes=1, min_available_nodes=1)
    with strategy.driving():
        msg = next(iter(strategy.configure_train(1, arrays, ConfigRecord(), Nodes(1))))  # type: ignore[arg-type]
    reply = _probe_app(examples)(msg, context)
    if reply.has_error():
        raise RuntimeError(reply.error.reason)
    return wire_bytes(reply)


def budget(task: Task, ratio: float, fedavg: int, examples: int) -> tuple[int | None, int]:
    """The largest k whose reply fits ``fedavg / ratio`` bytes (None: even k = 1 does not),
    and the reply's bytes at that k (at k = 1 when none fits)."""
    d, limit = compressed_size(task), fedavg / ratio
    smallest = reply_bytes(task, 1, examples)
    if smallest > limit:
        return None, smallest
    lo, hi = 1, d  # reply_bytes(lo) fits; find the last k that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if reply_bytes(task, mid, examples) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo, reply_bytes(task, lo, examples)


def ef_lr(d: int, k: int) -> float:
    """The contractive step of error feedback for k 4-bit codes of a d-vector."""
    q = 2.0 * np.log(k) / (2**BITS - 1) ** 2
    return 1.0 / (d / k * (1.0 + q))


def configs(task: Task, ratios: list[float], examples: int
            ) -> tuple[list[Config], list[dict[str, Any]]]:
    """FedAvg, then each reachable ratio without and with error feedback; and one line per
    ratio (its k and reply bytes, or why it is out of reach)."""
    fedavg = reply_bytes(task, None, examples)
    d = compressed_size(task)
    out, plan = [Config("FedAvg", "fedavg")], []
    for ratio in ratios:
        k, size = budget(task, ratio, fedavg, examples)
        plan.append({"ratio": ratio, "k": k, "reply-bytes": size, "fedavg-reply-bytes": fedavg,
                     "budget-bytes": fedavg / ratio, "d": d})
        if k is None:
            print(f"[frontier] {task.name} ~{ratio:g}x: out of reach: the budget is "
                  f"{fedavg / ratio:,.0f} B a reply, a reply with one code weighs {size:,} B",
                  flush=True)
            continue
        print(f"[frontier] {task.name} ~{ratio:g}x: k = {k:,} 4-bit codes, {size:,} B a reply "
              f"({fedavg / size:.1f}x)", flush=True)
        label = f"~{ratio:g}x, k={k}"
        out.append(Config(label, "rand-proj-spatial", k=k, value_bits=BITS,
                          budget=f"~{ratio:g}x"))
        lr = ef_lr(d, k)
        out.append(Config(label, "rand-proj-spatial", k=k, value_bits=BITS,
                          control=f"error feedback, lr {lr:.3g}",
                          optimizer=lambda lr=lr: ServerSGD(lr=lr),  # type: ignore[misc]
                          error_feedback=True, budget=f"~{ratio:g}x"))
    return out, plan


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: mean bytes a reply, the ratio to FedAvg, the last round's
    accuracy (mean, sample standard deviation over seeds) and its gap to each seed's FedAvg."""
    last = str(max(int(r) for r in results[0]["rounds"]))
    base = {r["seed"]: r for r in results if r["method"] == "fedavg"}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for res in results:
        groups.setdefault((res["label"], res["control"]), []).append(res)
    fedavg_up = np.mean([np.mean([v["bytes-up"] for k, v in r["rounds"].items() if k != "0"])
                         for r in base.values()])
    rows = []
    for (label, control), runs in groups.items():
        up = float(np.mean([np.mean([v["bytes-up"] for k, v in r["rounds"].items() if k != "0"])
                            for r in runs])) / runs[0]["clients"]
        acc = [r["rounds"][last]["test-accuracy"] for r in runs]
        gaps = [100 * (r["rounds"][last]["test-accuracy"]
                       - base[r["seed"]]["rounds"][last]["test-accuracy"]) for r in runs]
        rows.append({"label": label, "control": control, "reply-bytes": up,
                     "ratio": fedavg_up / runs[0]["clients"] / up, "accuracy": float(np.mean(acc)),
                     "accuracy-sd": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
                     "gap-pt": float(np.mean(gaps)),
                     "gap-sd": float(np.std(gaps, ddof=1)) if len(gaps) > 1 else 0.0,
                     "gaps": gaps, "seeds": [r["seed"] for r in runs], "rounds": int(last),
                     "error-feedback": control != "none", "method": runs[0]["method"]})
    return rows


def table(task: str, rows: list[dict[str, Any]], plan: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summary`'s rows, and the ratios out of reach."""
    head = ["configuration", "server step", "bytes a reply", "vs FedAvg",
            f"accuracy r{rows[0]['rounds']}", "gap to FedAvg (pt)", "per seed"]
    lines = [f"**{task}**, seeds {', '.join(map(str, rows[0]['seeds']))}", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        step = ("FedAvg's" if r["method"] == "fedavg" or r["control"] == "none"
                else r["control"])
        lines.append(f"| {r['label']} | {step} | {r['reply-bytes']:,.0f} | {r['ratio']:.1f}x | "
                     f"{r['accuracy']:.4f} ± {r['accuracy-sd']:.4f} | "
                     f"{r['gap-pt']:+.2f} ± {r['gap-sd']:.2f} | "
                     + ", ".join(f"{g:+.2f}" for g in r["gaps"]) + " |")
    for p in plan:
        if p["k"] is None:
            lines.append(f"\n~{p['ratio']:g}x is out of reach: {p['budget-bytes']:,.0f} B a "
                         f"reply, and a reply with a single code weighs {p['reply-bytes']:,} B.")
    return "\n".join(lines)


def _bytes_panel(ax: Any, task: str, rows: list[dict[str, Any]],
                 plan: list[dict[str, Any]]) -> None:
    """Accuracy (mean, error bars one standard deviation over seeds) against bytes a reply;
    each ratio's budget dotted, what no reply can reach shaded."""
    for ef, marker, color, name in ((False, "o", "tab:blue", "FedAvg's step"),
                                    (True, "^", "tab:red", "error feedback")):
        pts = sorted((r for r in rows if r["method"] != "fedavg" and r["error-feedback"] == ef),
                     key=lambda r: r["reply-bytes"])
        ax.errorbar([r["reply-bytes"] for r in pts], [r["accuracy"] for r in pts],
                    yerr=[r["accuracy-sd"] for r in pts], marker=marker, color=color,
                    capsize=3, label=f"Rand-Proj-Spatial 4-bit, {name}")
    base = next(r for r in rows if r["method"] == "fedavg")
    ax.errorbar([base["reply-bytes"]], [base["accuracy"]], yerr=[base["accuracy-sd"]],
                marker="s", color="black", capsize=3, label="FedAvg")
    ax.axhline(base["accuracy"] - 0.01, color="0.5", ls="--", lw=0.8, label="FedAvg - 1 point")
    floor = min(p["reply-bytes"] for p in plan if p["k"] is None) if any(
        p["k"] is None for p in plan) else None
    if floor is not None:  # a reply with one code: the fixed bytes
        ax.axvspan(1, floor, color="0.9", zorder=0,
                   label=f"below a reply's fixed bytes ({floor:,} B)")
    lo = min(p["budget-bytes"] for p in plan) / 1.5
    for i, p in enumerate(sorted(plan, key=lambda p: p["ratio"])):
        ax.axvline(p["budget-bytes"], color="0.6", ls=":", lw=0.8)
        ax.annotate(f"{p['ratio']:g}x" + ("" if p["k"] else " (out of reach)"),
                    (p["budget-bytes"], 0.02 + 0.06 * (i % 2)), xycoords=("data", "axes fraction"),
                    fontsize=8, color="0.35", rotation=90, ha="right", va="bottom")
    ax.set(xscale="log", xlim=(lo, base["reply-bytes"] * 1.6), xlabel="wire bytes a reply (log)",
           ylabel="test accuracy, last round",
           title=f"{task}, d = {plan[0]['d']:,}: the frontier")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _rounds_panel(ax: Any, task: str, runs: list[dict[str, Any]]) -> None:
    """Accuracy per round, the mean over seeds, of every configuration."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for res in runs:
        groups.setdefault((res["label"], res["control"]), []).append(res)
    hues = iter(("tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown"))
    color: dict[str, str] = {}
    for (label, control), group in groups.items():
        rounds = sorted(int(r) for r in group[0]["rounds"])
        acc = [float(np.mean([g["rounds"][str(r)]["test-accuracy"] for g in group]))
               for r in rounds]
        if group[0]["method"] == "fedavg":
            ax.plot(rounds, acc, color="black", lw=2, label="FedAvg")
            continue
        if label not in color:
            color[label] = next(hues)
        hue = color[label]
        ef = control != "none"
        ax.plot(rounds, acc, color=hue, ls="--" if ef else "-", marker="^" if ef else "o",
                ms=3, label=label + (", error feedback" if ef else ""))
    ax.set(xlabel="round", ylabel="test accuracy (mean over seeds)", ylim=(0.6, None),
           title=f"{task}: per round (dashed: error feedback)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def plot(runs: dict[str, list[dict[str, Any]]], summaries: dict[str, list[dict[str, Any]]],
         plans: dict[str, list[dict[str, Any]]], caption: str, path: Path) -> None:
    """One column per model: the frontier (:func:`_bytes_panel`) above, accuracy per round
    (:func:`_rounds_panel`) below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(summaries), figsize=(6.4 * len(summaries), 9.6),
                             squeeze=False)
    for col, task in enumerate(summaries):
        _bytes_panel(axes[0][col], task, summaries[task], plans[task])
        _rounds_panel(axes[1][col], task, runs[task])
    fig.text(0.005, 0.005, caption, fontsize=7, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=sorted(ARCHS))
    ap.add_argument("--ratios", type=float, nargs="+", default=[30, 100, 300])
    ap.add_argument("--cnn-extra-ratio", type=float, default=80,
                    help="a ratio the CNN can reach, measured beside the others (0: none)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--examples-per-client", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "frontier")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    pin_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # the ServerApp
    command = "frontier.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    summaries: dict[str, list[dict[str, Any]]] = {}
    plans: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for name in args.models:
        path = args.out / f"{name}.json"
        if not args.report_only:
            results: list[dict[str, Any]] = []
            plan: list[dict[str, Any]] = []
            ratios = sorted(set(args.ratios) | ({args.cnn_extra_ratio} if name == "cnn"
                                                and args.cnn_extra_ratio else set()))
            for seed in args.seeds:
                task = fmnist_task(args.clients, args.examples_per_client, seed, arch=ARCHS[name])
                chosen, plan = configs(task, ratios, args.examples_per_client)
                for cfg in chosen:
                    results.append(run(task, cfg, args.clients, args.rounds, seed))
                    results[-1]["environment"] = environment(args.threads)
                    results[-1]["command"] = command
                    path.write_text(json.dumps({"plan": plan, "runs": results}, indent=1))
        saved = json.loads(path.read_text())
        summaries[name], plans[name] = summary(saved["runs"]), saved["plan"]
        runs[name] = saved["runs"]
        print(table(f"fmnist-{name}", summaries[name], plans[name]))
    first = runs[args.models[0]][0]
    env = first["environment"]
    commands = dict.fromkeys(r[0]["command"] for r in runs.values())  # each model's, once
    caption = (f"{' and '.join(commands)}; {env['threads']} thread(s), {env['cpu']}, "
               f"{env['cpu-count']} CPUs; " + ", ".join(f"{k} {v}"
                                                      for k, v in env["versions"].items()))
    plot(runs, summaries, plans, caption, args.out / "frontier.png")
    print(f"[frontier] {args.out / 'frontier.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
