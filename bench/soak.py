"""Soak benchmark (not a test): the server's memory over many rounds, and after a restart.

It starts ``rpsagg-server --rounds 0`` (until stopped) as its own process on a temporary
database, drives rounds from this process (``--clients`` public clients, each submitting a
fixed vector encoded anew every round, one of them reading every round's result as a
client does) and reads the server's RSS from ``/proc`` after every round. Then it
restarts the server on that database (``kill -9``: the open round resumes), checks that
every ``--check`` evenly spaced old rounds' estimates are served bit for bit as they were
when the rounds finished (GetResult, and the dashboard's ``.npy`` download), runs
``--after`` more rounds, and compares the RSS with a fresh server's (a new database, the
same flags) after as many rounds. It prints the figures, writes them as JSON
(``--json``) and plots RSS against rounds (``--plot``).

    python bench/soak.py                                  # d = 2^20, 1,000 rounds (long)
    python bench/soak.py --d 65536 --rounds 1000          # 1,000 rounds at a smaller d
    python bench/soak.py --seconds 120 --d 16384          # time-bounded (CI-sized)
    python bench/soak.py --rounds 200 --plot docs/img/soak-rss.png --json /tmp/soak.json
    python bench/soak.py --replot new.json --before old.json --plot soak.png  # two runs

``--seconds S`` bounds the soak phase in time instead of rounds: a 24-hour soak scaled
down to what CI can run (the figures are per round, so the question "does RSS keep
growing?" is answered by the slope over the second half, printed in MiB per 1,000 rounds).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import ServerProcess


def rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def free_port() -> int:
    """A loopback port that was free a moment ago (uvicorn needs a fixed port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def digest(a: np.ndarray) -> str:
    """SHA-256 of an array's float64 bytes (bit-for-bit comparisons)."""
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f8").tobytes()).hexdigest()


class Soak:
    """One server on one database and the clients that drive its rounds."""

    def __init__(self, work: Path, db: Path, args: argparse.Namespace, name: str) -> None:
        self.args = args
        self.http = free_port()
        port_file = work / f"{name}.port"
        port_file.unlink(missing_ok=True)
        flags = [
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0",
            "--http-port", str(self.http), "--n", str(args.clients), "--k", str(args.k),
            "--d", str(args.d), "--task", "mean", "--data", "external", "--rounds", "0",
            "--round-timeout", "600", "--db", str(db), "--transform", "one",
            "--linger", "-1", "--estimator", args.estimator,
        ]
        if args.cache_bytes is not None:
            flags += ["--result-cache-bytes", str(args.cache_bytes)]
        self.log = open(work / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.server = ServerProcess(flags, port_file, stdout=self.log, stderr=self.log,
                                    env=dict(os.environ, RPSAGG_LOG_LEVEL="WARNING"),
                                    start_timeout=300)
        self.server.start()
        assert self.server.proc is not None
        self.pid = self.server.proc.pid
        target = f"127.0.0.1:{self.server.port}"
        self.clients = [AggregationClient(target, f"soak-{i}", insecure=True, timeout=60,
                                          wait_timeout=600) for i in range(args.clients)]
        for c in self.clients:
            c.join(args.d)
        rng = np.random.default_rng(0)
        self.xs = rng.standard_normal((args.clients, args.d))

    def round(self) -> tuple[int, str]:
        """Run the current round to its end; ``(round id, digest of its estimate)``."""
        rnd = self.clients[0].current_round()
        for c, x in zip(self.clients, self.xs, strict=True):
            c.submit(rnd, x)
        res = self.clients[0].result(rnd.round_id, wait=True)
        if res.state != "done" or res.estimate is None:
            raise SystemExit(f"round {rnd.round_id} ended {res.state}: {res.reason}")
        return rnd.round_id, digest(res.estimate)

    def result_digest(self, round_id: int) -> str:
        res = self.clients[0].result(round_id, wait=False)
        if res.estimate is None:
            raise SystemExit(f"round {round_id} has no estimate ({res.state})")
        return digest(res.estimate)

    def download_digest(self, round_id: int) -> str:
        url = f"http://127.0.0.1:{self.http}/api/rounds/{round_id}/estimate?format=npy"
        with urllib.request.urlopen(url, timeout=120) as resp:
            data = resp.read()
        return digest(np.load(io.BytesIO(data), allow_pickle=False))

    def rss(self) -> float:
        return rss_mib(self.pid)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for c in self.clients:
            c.close()
        if sig == signal.SIGKILL:
            assert self.server.proc is not None
            self.server.proc.kill()
            self.server.proc.wait(30)
        else:
            self.server.stop()
        self.log.close()


def run_rounds(soak: Soak, rounds: int | None, seconds: float | None,
               samples: list[tuple[int, float, float]], digests: dict[int, str],
               t0: float, label: str) -> None:
    """Rounds until ``rounds`` are done (or ``seconds`` passed); one RSS sample each."""
    done = 0
    end = None if seconds is None else time.monotonic() + seconds
    while (rounds is None or done < rounds) and (end is None or time.monotonic() < end):
        rid, dg = soak.round()
        digests[rid] = dg
        done += 1
        samples.append((rid, time.monotonic() - t0, soak.rss()))
        if done % 50 == 0 or done in (1, 10):
            print(f"  {label} round {rid}: RSS {samples[-1][2]:.0f} MiB, "
                  f"{samples[-1][1]:.0f} s", flush=True)


def at_round(samples: Sequence[tuple[int, float, float]], i: int) -> float:
    """RSS after the i-th round of a run (1-based)."""
    return samples[min(i, len(samples)) - 1][2]


def slope(samples: Sequence[tuple[int, float, float]]) -> float:
    """MiB per 1,000 rounds over the second half of a run (least squares)."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return float("nan")
    x = np.array([s[0] for s in half], dtype=float)
    y = np.array([s[2] for s in half], dtype=float)
    return float(np.polyfit(x, y, 1)[0] * 1000)


def plot(path: str, fig: dict[str, Any], before: dict[str, Any] | None = None) -> None:
    """RSS against rounds: the soak, the restarted server, the fresh one; ``before``: the
    figures of another run (e.g. of an earlier version) drawn dashed beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = fig["args"]
    f, ax = plt.subplots(figsize=(8, 4.2))
    runs = [(fig, "", "-")] + ([(before, " (before)", "--")] if before else [])
    colors = {"soak": "C0", "restarted": "C3", "fresh": "C2"}
    for run, tag, style in runs:
        for key, label in (("soak", "soak run"), ("restarted", "after kill -9 and restart"),
                           ("fresh", "fresh server (new database)")):
            s = run[key]
            if s:
                ax.plot([r[0] for r in s], [r[2] for r in s], style, label=label + tag,
                        lw=1.2, color=colors[key])
        # the RSS once each server was ready, before its next round
        last = run["soak"][-1][0] if run["soak"] else 0
        ax.plot([last], [run["rss_restarted_ready"]], "o" if not tag else "x",
                color=colors["restarted"], label="restarted, ready" + tag)
        ax.plot([0], [run["rss_fresh_ready"]], "o" if not tag else "x",
                color=colors["fresh"], label="fresh, ready" + tag)
    ax.set_xlabel("round")
    ax.set_ylabel("server RSS (MiB)")
    cache = a["cache_bytes"]
    cache_s = "default" if cache is None else f"{cache / 2**20:g} MiB"
    ax.set_title(f"rpsagg-server RSS, --rounds 0, d = {a['d']}, n = {a['clients']}, "
                 f"k = {a['k']}, --result-cache-bytes {cache_s}", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    f.tight_layout()
    f.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int, default=1 << 20)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--estimator", default="rand-proj-spatial")
    p.add_argument("--rounds", type=int, default=1000, help="rounds of the soak phase")
    p.add_argument("--seconds", type=float, default=None,
                   help="bound the soak phase in time instead (rounds then unbounded)")
    p.add_argument("--after", type=int, default=10,
                   help="rounds after the restart, and of the fresh server")
    p.add_argument("--check", type=int, default=10,
                   help="old rounds whose estimates are compared after the restart")
    p.add_argument("--cache-bytes", type=int, default=None,
                   help="--result-cache-bytes of the server (default: the server's)")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--plot", default=None, help="plot RSS against rounds here (PNG)")
    p.add_argument("--before", default=None,
                   help="a --json of another run to draw beside this one (dashed)")
    p.add_argument("--keep", default=None, help="keep the work folder here")
    p.add_argument("--replot", default=None,
                   help="plot the figures of this --json (to --plot) without running")
    args = p.parse_args()
    before = json.loads(Path(args.before).read_text()) if args.before else None
    if args.replot:
        plot(args.plot or "soak-rss.png", json.loads(Path(args.replot).read_text()), before)
        return
    work = Path(args.keep or tempfile.mkdtemp(prefix="rpsagg-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "soak.db"
    fig: dict[str, Any] = {"args": vars(args), "soak": [], "restarted": [], "fresh": []}
    digests: dict[int, str] = {}
    t0 = time.monotonic()
    rounds = None if args.seconds is not None else args.rounds
    bound = f"{args.seconds:g} s" if args.seconds else f"{args.rounds} rounds"
    print(f"soak: d={args.d} n={args.clients} k={args.k} {args.estimator}, {bound}; "
          f"work {work}", flush=True)
    try:
        soak = Soak(work, db, args, "soak")
        fig["rss_start"] = soak.rss()
        try:
            run_rounds(soak, rounds, args.seconds, fig["soak"], digests, t0, "soak")
            n_soak = len(fig["soak"])
            fig["soak_seconds"] = fig["soak"][-1][1]
        finally:
            soak.stop(signal.SIGKILL)
        # restart on the same database: the open round resumes
        t1 = time.monotonic()
        again = Soak(work, db, args, "restarted")
        fig["restart_seconds"] = time.monotonic() - t1
        fig["rss_restarted_ready"] = again.rss()
        try:
            ids = sorted(digests)
            step = max(1, len(ids) // max(1, args.check))
            check = sorted(set(ids[::step][:args.check]) | {ids[0], ids[-1]})
            bad = [r for r in check if again.result_digest(r) != digests[r]
                   or again.download_digest(r) != digests[r]]
            fig["checked_rounds"] = check
            fig["mismatched_rounds"] = bad
            fig["rss_restarted_after_reads"] = again.rss()
            run_rounds(again, args.after, None, fig["restarted"], digests, t0, "restarted")
        finally:
            again.stop()
        fresh_db = work / "fresh.db"
        fresh = Soak(work, fresh_db, args, "fresh")
        fig["rss_fresh_ready"] = fresh.rss()
        try:
            run_rounds(fresh, args.after, None, fig["fresh"], {}, t0, "fresh")
        finally:
            fresh.stop()
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    s, r, f = fig["soak"], fig["restarted"], fig["fresh"]
    fig["summary"] = out = {
        "rounds": n_soak, "rss_after_10": at_round(s, 10), "rss_after_last": s[-1][2],
        "ratio_last_to_10": s[-1][2] / at_round(s, 10),
        "max_rss": max(x[2] for x in s),
        "slope_mib_per_1000_rounds": slope(s),
        "rounds_per_second": n_soak / fig["soak_seconds"],
        "rss_restarted": r[-1][2] if r else fig["rss_restarted_ready"],
        "rss_fresh": f[-1][2] if f else fig["rss_fresh_ready"],
    }
    out["ratio_restarted_to_fresh"] = out["rss_restarted"] / out["rss_fresh"]
    print(f"\nsoak: {n_soak} rounds in {fig['soak_seconds']:.0f} s "
          f"({out['rounds_per_second']:.2f} rounds/s)")
    print(f"  RSS after 10 rounds {out['rss_after_10']:.0f} MiB, after {n_soak} "
          f"{out['rss_after_last']:.0f} MiB (x{out['ratio_last_to_10']:.2f}), max "
          f"{out['max_rss']:.0f} MiB, slope over the second half "
          f"{out['slope_mib_per_1000_rounds']:.1f} MiB per 1,000 rounds")
    print(f"  restart: ready in {fig['restart_seconds']:.1f} s at "
          f"{fig['rss_restarted_ready']:.0f} MiB; {len(fig['checked_rounds'])} old rounds "
          f"checked (GetResult and .npy), {len(fig['mismatched_rounds'])} differ; after "
          f"{len(r)} more rounds {out['rss_restarted']:.0f} MiB")
    print(f"  fresh server: ready {fig['rss_fresh_ready']:.0f} MiB, after {len(f)} rounds "
          f"{out['rss_fresh']:.0f} MiB; restarted / fresh x{out['ratio_restarted_to_fresh']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1))
    if args.plot:
        plot(args.plot, fig, before)
    if fig["mismatched_rounds"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
