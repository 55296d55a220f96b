"""Local cluster launcher (the README's main command, ``./run.sh``).

Starts ``rpsagg-server`` and ``n`` ``rpsagg-client`` processes on this machine, follows the
rounds over gRPC and prints one line per round: round, clients, bytes up (vs raw float32),
the error the server estimated from the messages (every mode), the measured error next to
Rand-k's (evaluation mode), decode time. After the job the server
and its dashboard stay up until Ctrl-C (``--exit``: finish with the job); Ctrl-C stops
every process and exits with status 0. Runs on loopback with ``--insecure`` (no TLS, no
tokens), and says so.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from rpsagg import add_version_flag
from rpsagg.commandline import ExitStatus, Parser, exit_statuses, plain
from rpsagg.schemes import DEFAULT_ESTIMATOR
from rpsagg.tasks.data import FASHION_DIR, FASHION_IMAGES
from rpsagg_experiments.launch import LocalJob, ServerExited, ServerProcess
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import FINISHED, RoundState


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="rpsagg-cluster", description=plain(__doc__),
               epilog=exit_statuses(ExitStatus.INTERRUPTED))
    add_version_flag(p, f"protocol {serde.PROTOCOL}")
    job = p.add_argument_group(
        "the job", "e.g. --estimator rand-k --k 64 --rounds 20 --no-eval")
    job.add_argument("--n", type=int, default=10, help="client processes")
    job.add_argument("--k", type=int, default=102, help="floats per client per vector")
    job.add_argument("--d", type=int, default=1024, help="vector length")
    job.add_argument("--estimator", default=DEFAULT_ESTIMATOR, help="the estimator")
    job.add_argument("--transform", default="avg", help="Rand-Proj-Spatial's transform")
    job.add_argument("--rounds", type=int, default=10, help="rounds to run")
    job.add_argument("--round-timeout", type=float, default=60.0, metavar="S",
                     help="seconds from a round's first submission to its deadline")
    job.add_argument("--no-eval", dest="eval", action="store_false",
                     help="turn evaluation mode off (no reference vectors, no errors)")
    data = p.add_argument_group("the task and its data",
                                "e.g. --task mean --data synthetic --data-r 9")
    data.add_argument("--task", default="power-iteration", help="the clients' task")
    data.add_argument("--data", default="fashion-mnist",
                      choices=("synthetic", "fashion-mnist", "ujiindoorloc"),
                      help="the built-in data the clients use")
    data.add_argument("--data-path", default=None, metavar="PATH",
                      help="the data's file or directory (default: its usual place)")
    data.add_argument("--data-r", type=float, default=0.0, metavar="R",
                      help="synthetic data correlation R")
    server = p.add_argument_group("the server", "e.g. --http-port 8080 --db run.db --exit")
    server.add_argument("--grpc-port", type=int, default=0, metavar="PORT",
                        help="0 = any free port")
    server.add_argument("--http-port", type=int, default=8000, metavar="PORT",
                        help="the dashboard's port")
    server.add_argument("--db", default=None, help="SQLite path (default: a fresh temporary "
                        "file)")
    server.add_argument("--exit", action="store_true",
                        help="stop the server and the dashboard when the job is done "
                        "(default: they stay up until Ctrl-C)")
    return p


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:,.0f} {unit}" if unit == "B" else f"{b:,.1f} {unit}"
        b /= 1024
    return f"{b}"


def relative_errors(http_port: int, round_id: int) -> tuple[float, float, float] | None:
    """The round's errors relative to ``||x_bar||^2`` from the dashboard's API, or None."""
    import json
    import urllib.request

    url = f"http://127.0.0.1:{http_port}/api/rounds/{round_id}"
    try:
        with urllib.request.urlopen(url, timeout=5) as res:
            rel = json.load(res).get("relative_error")
    except (OSError, ValueError):
        return None
    if not rel:
        return None
    return float(rel["estimate"]), float(rel["rand_k"]), float(rel["rand_k_spatial"])


def _fmt_err(x: float) -> str:
    return "   n/a  " if math.isnan(x) else f"{x:.3e}"


BETA_HINT = ("the first decode for these (n, k, d) on this machine runs beta's Monte Carlo "
             "(about a minute; cached afterwards)")


class LongWait:
    """Says every ``every`` seconds how long a wait has lasted, once it passed ``after``.

    ``start(label, hint)`` begins a wait (ending any other), ``stop()`` ends it and returns
    only when no further line can be printed. Lines go through ``emit``.
    """

    def __init__(self, emit: Callable[[str], None], after: float = 5.0,
                 every: float = 10.0) -> None:
        self.emit = emit
        self.after, self.every = after, every
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, label: str, hint: str = "") -> None:
        """Begin waiting for ``label`` (the hint is printed with the first line)."""
        self.stop()
        self._stopped = stopped = threading.Event()
        began = time.monotonic()

        def run() -> None:
            delay, first = self.after, True
            while not stopped.wait(delay):
                line = f"[cluster] {label}: {time.monotonic() - began:.0f} s"
                self.emit(line + (f" ({hint})" if first and hint else ""))
                delay, first = self.every, False

        self._thread = threading.Thread(target=run, daemon=True, name="rpsagg-long-wait")
        self._thread.start()

    def stop(self) -> None:
        """End the current wait, if any."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def run(args: argparse.Namespace) -> int:
    """Start the cluster, follow it to the end (or Ctrl-C), stop every process."""
    from rpsagg_client.client import AggregationClient

    data = args.data
    fashion = Path(args.data_path or FASHION_DIR) / FASHION_IMAGES
    if data == "fashion-mnist" and not fashion.exists():
        print(f"[cluster] Fashion-MNIST not found at {fashion}: install the Debian package "
              "with 'apt-get install -y dataset-fashion-mnist' (./run.sh does this as root).\n"
              f"[cluster] Falling back to synthetic data (R={args.data_r}).", flush=True)
        data = "synthetic"
    workdir = Path(tempfile.mkdtemp(prefix="rpsagg-cluster-"))
    db = args.db or str(workdir / "rpsagg.db")
    server_args = [
        "--insecure", "--host", "127.0.0.1", "--grpc-port", str(args.grpc_port),
        "--http-port", str(args.http_port), "--n", str(args.n), "--k", str(args.k),
        "--d", str(args.d), "--task", args.task, "--data", data, "--data-r", str(args.data_r),
        "--estimator", args.estimator, "--transform", args.transform,
        "--rounds", str(args.rounds), "--round-timeout", str(args.round_timeout),
        "--db", db, "--linger", "1" if args.exit else "-1",
    ] + (["--eval"] if args.eval else [])
    print("[cluster] note: --insecure on loopback (127.0.0.1): no TLS and no tokens; "
          "use --tls-cert/--tls-key/--tokens for anything else.", flush=True)
    interrupted = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    env = dict(os.environ, RPSAGG_LOG_LEVEL=os.environ.get("RPSAGG_LOG_LEVEL", "WARNING"))
    waiting = LongWait(lambda line: print(line, flush=True))
    # server and clients stay in this process group: a terminal's Ctrl-C reaches them too
    job = LocalJob(ServerProcess(server_args, workdir / "port", env=env, start_timeout=120,
                                 stop_grace=5.0), client_env=env)
    try:
        waiting.start("waiting for the server to start")
        try:
            job.server.start()
        except ServerExited as exc:
            print(f"[cluster] the server exited with {exc.returncode}", file=sys.stderr)
            return 1
        except TimeoutError:
            print("[cluster] the server did not start in 120 s", file=sys.stderr)
            return 1
        waiting.stop()
        server = job.server.proc
        assert server is not None
        target = job.target
        dash = (f"http://127.0.0.1:{args.http_port}/" if args.http_port else "disabled")
        print(f"[cluster] server on {target}; dashboard: {dash}", flush=True)
        print(f"[cluster] {args.n} clients, task {args.task} on {data}, {args.estimator}"
              f"({args.transform}), k={args.k}, d={args.d}, {args.rounds} rounds, "
              f"eval {'on' if args.eval else 'off'}", flush=True)
        for i in range(args.n):
            cmd = ["--quiet", "--server", target, "--client-id", f"client-{i}", "--insecure",
                   "--data", data]
            if args.data_path:
                cmd += ["--data-path", args.data_path]
            job.start_client(cmd)
        # errors relative to ||x_bar||^2 come from the dashboard's API; without a dashboard
        # the gRPC result's absolute squared errors are shown
        relative = bool(args.http_port) and args.eval
        # the estimated error in the measured columns' unit (relative without evaluation)
        est_relative = relative or not args.eval
        print(f"{'round':>5} {'clients':>8} {'bytes up':>12} {'raw f32':>12} "
              f"{'est.rel' if est_relative else 'est.sq':>10} "
              f"{'rel.error' if relative else 'sq.error':>10} {'Rand-k':>10} "
              f"{'R-k-Spatial':>11} {'decode':>9}", flush=True)
        total_up = total_raw = 0.0
        with AggregationClient(target, "cluster-monitor", insecure=True,
                               retry_budget=10) as mon:
            decoded = False
            for ev in mon.watch():
                if ev.state == RoundState.DECODING and ev.round_id:
                    waiting.start(f"round {ev.round_id} decoding", "" if decoded else BETA_HINT)
                if ev.state in FINISHED and ev.round_id:
                    waiting.stop()
                    decoded = decoded or ev.state == RoundState.DONE
                    res = mon.result(ev.round_id, wait=False)
                    if res.state == RoundState.FAILED:
                        print(f"{res.round_id:>5} failed: {res.reason}", flush=True)
                    else:
                        raw = res.n_prime * (res.estimate.shape[0] if res.estimate is not None
                                             else 1) * args.d * 4
                        errs = (res.eval_sq_error, res.eval_sq_error_rand_k,
                                res.eval_sq_error_rand_k_spatial)
                        if relative:
                            errs = (relative_errors(args.http_port, res.round_id)
                                    or (math.nan, math.nan, math.nan))
                        est = (res.est_relative_error if est_relative
                               else res.est_sq_error)
                        total_up += res.payload_bytes
                        total_raw += raw
                        print(f"{res.round_id:>5} {res.n_prime:>4}/{args.n:<3} "
                              f"{_fmt_bytes(res.payload_bytes):>12} {_fmt_bytes(raw):>12} "
                              f"{_fmt_err(est):>10} {_fmt_err(errs[0]):>10} "
                              f"{_fmt_err(errs[1]):>10} {_fmt_err(errs[2]):>11} "
                              f"{res.decode_seconds * 1000:>6.0f} ms", flush=True)
                if ev.job_done:
                    break
        if total_raw:
            print(f"[cluster] done: {_fmt_bytes(total_up)} sent up instead of "
                  f"{_fmt_bytes(total_raw)} raw float32 ({total_raw / total_up:.1f}x less)",
                  flush=True)
        job.wait_clients(60)
        if args.exit:
            server.wait(30)
            return 0
        print(f"[cluster] job done. The server ({target}) and the dashboard ({dash}) stay up "
              "until Ctrl-C (./run.sh --exit finishes with the job).", flush=True)
        code = server.wait()  # returns early only if the server dies; Ctrl-C raises
        print(f"[cluster] the server exited with {code}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n[cluster] Ctrl-C: stopping the server and the clients", flush=True)
        return 0
    except grpc.RpcError as exc:
        if interrupted:
            print("\n[cluster] Ctrl-C: stopping the server and the clients", flush=True)
            return 0
        print(f"[cluster] lost the server: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        waiting.stop()
        job.stop()
        if args.db is None:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-cluster`` (and ``./run.sh``)."""
    args = _parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
