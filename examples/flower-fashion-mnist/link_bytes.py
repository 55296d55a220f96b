"""Bytes on the TCP links between the SuperNodes and the SuperLink, per round and per node.

    python link_bytes.py                          # the CNN: FedAvg and Rand-Proj-Spatial
    python link_bytes.py --models cnn wide        # and the 2,002,001-parameter model
    python link_bytes.py --models cnn --configs fedavg rps-k4096-4bit --nodes 2 --rounds 3

Each SuperNode connects to a counting TCP proxy of its own (:class:`LinkProxy`, on a free
port of 127.0.0.1) instead of the SuperLink's Fleet API port; the proxy forwards every
byte both ways and counts them: "up" (SuperNode -> SuperLink) and "down" (SuperLink ->
SuperNode). Flower 1.42's Fleet API is protobuf over plain HTTP/1.1 (``--insecure``), so
the proxy also splits each stream into its HTTP requests and responses and records one
:class:`Exchange` per request (path, bytes each way, times): the rounds are cut at each
node's ``pull-messages`` that returns a training message (the k-th such pull starts round
k), and the bytes are sorted into the reply (``push-messages``, ``push-object``), the
received model (that pull, ``pull-object``, ``confirm-message-received``), the run's setup
(``get-run``, ``get-fab``: round 1), polling (empty ``pull-messages`` every 3 s,
``send-node-heartbeat``) and the node's registration (before round 1).

Beside the TCP bytes: the strategy's reply bytes, ``rpsagg.bytes-up`` (the replies'
``rpsagg_flower.wire.wire_bytes``, which the example's ``CountingFedAvg`` reports for
FedAvg as well), per node. Counted: TCP payload bytes (HTTP start lines, headers and
bodies); not counted: TCP/IP headers, handshakes, acknowledgements.

Models (``--models``): ``cnn``, the example app's CNN with BatchNorm (``fmnist_app.cnn``,
d = 20,586), configurations ``fedavg``, ``rps-k4096-4bit`` (the benchmark's ~30x budget)
and ``rps-k2058`` (``run_comparison.py --model cnn --k 2058``: d/10 float32 values);
``wide``, the benchmark's 2,002,001-parameter linear model (``W`` float32 1000 x 2000,
``b`` float16, ``s`` float64) as a small Flower app written into the work folder, with
``fedavg`` and ``rps-k20020`` (d/100). Every configuration runs on a fresh federation
(a SuperLink, ``--nodes`` SuperNodes: ``federation.LocalFederation``), then the nodes idle
for ``--idle`` seconds to measure the polling alone. The JSON goes to ``--out``
(default ``measured/link-bytes/link-bytes.json``): the command, date, machine and
versions; per configuration the strategy's reply bytes per round, per node each segment
(``before``, the rounds, ``after``: from the end of the run through the idle seconds) with
its bytes per request path (``up``, ``down``, of which ``up-head``, ``down-head``: HTTP
start lines and headers), the proxy's raw TCP totals beside the parsed HTTP totals (equal
when every byte was parsed), one request's header sizes per path, and ``summary``: per
round the mean over the nodes (the printed table's rows), round 1, the mean of the later
rounds (``steady``), before round 1, and the idle rate. Ctrl-C stops every process it
started (exit status 130).

The code is in ``linkbytes/`` beside this file (the proxy, the HTTP split, the rounds, the
runs, the report); this file is its command line.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from linkbytes.report import report, save, summary  # noqa: E402
from linkbytes.runs import CONFIGS, DEFAULT_CONFIGS, run_one  # noqa: E402


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="link-bytes-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=["cnn"])
    ap.add_argument("--configs", nargs="+",
                    help="configurations to run, where a model has them (default: "
                         + "; ".join(f"{m}: {' '.join(c)}" for m, c in DEFAULT_CONFIGS.items())
                         + ")")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=12.0,
                    help="seconds of polling alone measured after each run")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=HERE / "measured" / "link-bytes"
                    / "link-bytes.json")
    ap.add_argument("--workdir", type=Path,
                    help="keep the federations' logs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    command = "link_bytes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    results = []
    try:
        with _workdir(args.workdir) as work:
            for model in args.models:
                for name in args.configs or DEFAULT_CONFIGS[model]:
                    if name not in CONFIGS[model]:
                        continue
                    print(f"[link-bytes] {model} {name}: {args.nodes} SuperNodes, "
                          f"{args.rounds} rounds", flush=True)
                    res = run_one(model, name, args.nodes, args.rounds, args.idle, work,
                                  args.timeout)
                    res["summary"] = summary(res)
                    s = res["summary"]["steady"]
                    print(f"[link-bytes] {model} {name}: {res['run-seconds']:.0f} s; after "
                          f"round 1 per node and round {s['tcp-up']:,.0f} B up, "
                          f"{s['tcp-down']:,.0f} B down, reply {s['strategy-reply']:,.0f} B",
                          flush=True)
                    results.append(res)
    except KeyboardInterrupt:  # the federation's with-block has ended every process
        print("[link-bytes] interrupted; every Flower process stopped", file=sys.stderr)
        return 130
    table = report(results)
    print(table)
    save(args.out, command, started, results, table)
    print(f"[link-bytes] {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
