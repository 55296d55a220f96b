"""Run the Fashion-MNIST app once per method on a local Flower federation; table and plot.

    python run_comparison.py                      # 10 SuperNodes, 20 rounds, k = 785 (d/10)
    python run_comparison.py --quick              # 2 nodes, 2 rounds, 300 images each
    python run_comparison.py --engine simulation  # Flower's simulation engine (Ray)

Each method is one ``flwr run`` of the app in this folder on the same federation (a
SuperLink and ``--clients`` SuperNodes on 127.0.0.1, or a simulation SuperLink with as
many virtual SuperNodes). The ServerApp writes one JSON file per method into ``--out``;
this script prints the table (test accuracy after chosen rounds and the bytes sent up per
round, counted from the replies) and writes ``accuracy.png`` beside the JSON files.
Ctrl-C ends every Flower process the script started (exit status 130).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from federation import LocalFederation  # noqa: E402

METHODS = ["fedavg", "rand-k", "rand-k-spatial", "rand-proj-spatial"]
LABELS = {"fedavg": "FedAvg (uncompressed)", "rand-k": "Rand-k",
          "rand-k-spatial": "Rand-k-Spatial(avg)", "rand-proj-spatial": "Rand-Proj-Spatial(avg)"}


def label(result: dict) -> str:
    name = LABELS.get(result["method"], result["method"])
    if result["method"] in ("rand-k-spatial", "rand-proj-spatial"):
        name = name.replace("(avg)", f"({result['transform']})")
    if result["value-bits"] != 32:
        name += f", {result['value-bits']}-bit values"
    return name


def table(results: list[dict]) -> str:
    """The comparison as a Markdown table."""
    last = max(int(r) for r in results[0]["rounds"])
    marks = sorted({r for r in (1, 5, 10, last) if r <= last})
    head = ["method", *[f"acc. round {r}" for r in marks], f"test loss round {last}",
            "bytes up / round", "vs FedAvg"]
    raw = max(res["rounds"][str(last)].get("rpsagg.bytes-up-uncompressed",
                                           res["rounds"][str(last)]["rpsagg.bytes-up"])
              for res in results)
    rows = []
    for res in results:
        rounds = res["rounds"]
        up = sum(rounds[str(r)]["rpsagg.bytes-up"] for r in range(1, last + 1)) / last
        rows.append([label(res), *[f"{rounds[str(r)]['test-accuracy']:.4f}" for r in marks],
                     f"{rounds[str(last)]['test-loss']:.4f}", f"{up:,.0f}",
                     f"{raw / up:.1f}x less" if up < raw else "1x"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Test accuracy per round and against cumulative bytes up, one line per method (from
    round 1; the starting model, round 0, has accuracy 0.1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        rounds = sorted(int(r) for r in res["rounds"] if int(r) >= 1)  # round 0: nothing sent
        acc = [res["rounds"][str(r)]["test-accuracy"] for r in rounds]
        ax1.plot(rounds, acc, marker=".", label=label(res))
        sent, total = [], 0.0
        for r in rounds:
            total += res["rounds"][str(r)].get("rpsagg.bytes-up", 0.0)
            sent.append(total / 2**20)
        ax2.plot(sent, acc, marker=".", label=label(res))
    ax1.set(xlabel="round", ylabel="test accuracy", title="Accuracy per round")
    ax2.set(xlabel="MiB sent up (all clients, cumulative)", ylabel="test accuracy",
            title="Accuracy per byte sent", xscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    d, n = results[0]["d"], results[0]["clients"]
    k = next((r["k"] for r in results if r["method"] != "fedavg"), d)  # FedAvg sends all d
    fig.suptitle(f"Fashion-MNIST softmax regression, {n} clients, d = {d:,}, k = {k}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, help="SuperNodes (default 10; --quick: 2)")
    ap.add_argument("--rounds", type=int, help="rounds (default 20; --quick: 2)")
    ap.add_argument("--k", type=int, default=785)
    ap.add_argument("--model", choices=["softmax", "cnn", "mlp"], default="softmax",
                    help="softmax regression (d = 7,850), the small CNN with BatchNorm of "
                         "fmnist_app/cnn.py (PyTorch; d = 20,586) or the perceptron of "
                         "fmnist_app/mlp.py (PyTorch; d = 203,530); PyTorch models train "
                         "at lr 0.01 in batches of 32")
    ap.add_argument("--transform", default="avg")
    ap.add_argument("--value-bits", type=int, default=32)
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--examples-per-client", type=int,
                    help="training images per node (default 0: its whole shard; --quick: 300)")
    ap.add_argument("--engine", choices=["deployment", "simulation"], default="deployment")
    ap.add_argument("--seed", type=int, default=1,
                    help="nonces and client seeds derived from it (0: fresh randomness)")
    ap.add_argument("--server-optimizer", default="sgd", help="sgd, adagrad, adam or yogi")
    ap.add_argument("--server-lr", type=float, default=1.0)
    ap.add_argument("--server-momentum", type=float, default=0.0)
    ap.add_argument("--error-feedback", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2 nodes, 2 rounds, 300 images each, FedAvg and "
                         "Rand-Proj-Spatial (each unless given: --quick --rounds 50 runs 50)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--report-only", action="store_true",
                    help="print the table and plot from the JSON files already in --out")
    args = ap.parse_args(argv)
    sizes = (2, 2, 300) if args.quick else (10, 20, 0)  # clients, rounds, examples
    args.clients, args.rounds, args.examples_per_client = (
        given if given is not None else default for given, default in zip(
            (args.clients, args.rounds, args.examples_per_client), sizes, strict=True))
    if args.quick and args.methods == METHODS:
        args.methods = ["fedavg", "rand-proj-spatial"]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        results = [json.loads((args.out / f"{m}.json").read_text()) for m in args.methods]
        print(table(results))
        plot(results, args.out / "accuracy.png")
        return 0
    try:
        results = _run(args)
    except KeyboardInterrupt:  # the federation's with-block has ended every process
        print("[fmnist] interrupted; every Flower process stopped", file=sys.stderr)
        return 130
    print(table(results))
    plot(results, args.out / "accuracy.png")
    print(f"[fmnist] plot: {args.out / 'accuracy.png'}")
    return 0


def _run(args: argparse.Namespace) -> list[dict]:
    results = []
    with LocalFederation(args.clients, simulation=args.engine == "simulation") as fed:
        print(f"[fmnist] SuperLink on 127.0.0.1:{fed.port}, {args.clients} "
              f"{'virtual ' if fed.simulation else ''}SuperNodes", flush=True)
        for method in args.methods:
            path = args.out / f"{method}.json"
            path.unlink(missing_ok=True)
            fed.run(HERE, {
                "method": method, "k": args.k, "transform": args.transform,
                "value-bits": args.value_bits, "clients": args.clients,
                "num-server-rounds": args.rounds, "results-path": str(path),
                "examples-per-client": args.examples_per_client, "seed": args.seed,
                "server-optimizer": args.server_optimizer, "server-lr": args.server_lr,
                "server-momentum": args.server_momentum, "error-feedback": args.error_feedback,
                "model": args.model,
                **({"lr": 0.01, "batch-size": 32} if args.model != "softmax" else {}),
            }, timeout=args.timeout)
            res = json.loads(path.read_text())
            last = res["rounds"][str(args.rounds)]
            print(f"[fmnist] {label(res)}: accuracy {last['test-accuracy']:.4f} after "
                  f"{args.rounds} rounds", flush=True)
            results.append(res)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
