"""Chaos run (not a test): a job on loopback under random faults, checked against invariants.

A ``rpsagg-server`` subprocess runs ``--rounds`` rounds of the ``mean`` task with ``--clients``
client processes (the public :class:`AggregationClient`). Between rounds' work the script
injects, at random (``--seed``), one fault at a time:

- ``client-kill``: SIGKILL of a client process, restarted at once with the same id (its
  submissions are deterministic per round, so a retry after a lost ack is byte-identical);
- ``server-kill``: SIGKILL of the server, restarted on the same database and port;
- ``stall``: SIGSTOP of the server for 1-6 s (past the clients' deadlines), then SIGCONT;
- ``lock-storm``: a second sqlite3 connection holds ``BEGIN IMMEDIATE`` for 0.5-3 s, or
  sometimes 7 s (past the store's 5 s busy timeout).

Each client appends every ack it receives (round, client, digest of its request) to a ledger
file and fsyncs it before going on; a client killed between an ack and its ledger line loses
that line only, so the ledger is a lower bound of the acks. The invariants, checked at the
end from the ledger, the database file and GetResult:

1. every acked submission is in the database, byte-identical (same digest);
2. every committed submission of a finished ``done`` round is among its decoded
   contributors (and every contributor is committed);
3. all rounds complete (the job is done within a bound);
4. after each fault the server accepts work: within ``--recover`` seconds it answers
   GetRound and commits a submission or finishes a round;
5. a client's identical retry of a committed submission is acknowledged, never refused
   (docs/protocol.md), whatever state its round is in.

It prints acked / committed / decoded counts, the faults injected and the errors the clients
saw, lists each violation, and exits 1 if there was one (0 otherwise).

    python bench/chaos.py                    # 50 rounds
    python bench/chaos.py --rounds 5         # short mode: under a minute
    python bench/chaos.py --rounds 50 --seed 3 --clients 8 --keep
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from rpsagg_client import AggregationClient
from rpsagg_experiments.launch import ServerExited, ServerProcess, stop_processes
from rpsagg_wire.v1 import serde

FAULTS = ("client-kill", "server-kill", "stall", "lock-storm")


# -- a client process ---------------------------------------------------------------------------
def submission_for(client: AggregationClient, rnd: serde.RoundInfo, seed: int) -> serde.Submission:
    """The same bytes for the same (job seed, client, round), in any process."""
    key = hashlib.sha256(f"{seed}/{client.client_id}/{rnd.round_id}".encode()).digest()
    client_seed = int.from_bytes(key[:8], "little") | 1
    rng = np.random.default_rng(int.from_bytes(key[8:16], "little"))
    return client.encode(rnd, rng.normal(size=(rnd.m, rnd.d)), client_seed=client_seed)


def worker(target: str, client_id: str, ledger_path: str, seed: int, think: float) -> int:
    """Take part in every round until the job is done; append each ack to the ledger.

    Before submitting to a round the client "computes" for up to ``think`` seconds, so
    submissions spread over the round and faults land in the middle of rounds.
    """
    pace = random.Random(f"{seed}/{client_id}/{os.getpid()}")
    client = AggregationClient(target, client_id, insecure=True, timeout=3.0,
                               wait_timeout=10.0, retry_budget=30.0)
    handled = 0  # newest round this process has submitted to (or was refused by)
    with Path(ledger_path).open("a") as ledger:

        def record(entry: dict[str, Any]) -> None:
            ledger.write(json.dumps(entry) + "\n")
            ledger.flush()
            os.fsync(ledger.fileno())

        while True:
            submitting = 0  # the round of the Submit in flight, for the error record
            try:
                if client.index is None:
                    client.join()
                rnd = client.current_round()
                if rnd.job_done:
                    return 0
                if rnd.round_id > handled and rnd.state in ("open", "collecting"):
                    time.sleep(pace.uniform(0.0, think))
                    sub = submission_for(client, rnd, seed)
                    submitting = rnd.round_id
                    reply = client.submit_encoded(sub)
                    digest = serde.parse_request("Submit", serde.serializer("Submit")(sub)).digest
                    record({"ack": rnd.round_id, "client": client_id, "digest": digest.hex(),
                            "duplicate": reply.duplicate})
                    handled = rnd.round_id
                elif rnd.round_id:
                    client.result(rnd.round_id, wait=True, timeout=5.0)
                else:
                    time.sleep(0.1)
            except grpc.RpcError as exc:
                code = exc.code()
                record({"error": code.name, "client": client_id, "submit": submitting,
                        "detail": (exc.details() or "")[:200]})
                if code in (grpc.StatusCode.FAILED_PRECONDITION,
                            grpc.StatusCode.ALREADY_EXISTS):
                    handled = max(handled, _round_of(client))
                time.sleep(0.2)


def _round_of(client: AggregationClient) -> int:
    try:
        return client.current_round().round_id
    except grpc.RpcError:
        return 0


# -- the orchestrator ------------------------------------------------------------------------
class Chaos:
    """The server and client processes of one run, the faults, and the checks."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.db = work / "chaos.db"
        self.rng = random.Random(args.seed)
        self.port = 0
        self.server: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.clients: dict[str, subprocess.Popen[bytes]] = {}
        self.faults: Counter[str] = Counter()
        self.violations: list[str] = []
        self.log = (work / "server.log").open("ab")

    # processes
    def start_server(self) -> None:
        self.starts += 1
        a = self.args
        server = ServerProcess([
            "--insecure", "--host", "127.0.0.1",
            "--grpc-port", str(self.port), "--http-port", "0", "--n", str(a.clients),
            "--k", str(a.k), "--d", str(a.d), "--task", "mean", "--rounds", str(a.rounds),
            "--round-timeout", str(a.round_timeout), "--min-clients", "1",
            "--transform", a.transform, "--db", str(self.db), "--linger", "-1",
        ], self.work / f"port-{self.starts}", stdout=self.log, stderr=self.log)
        try:
            server.start()
        except (ServerExited, TimeoutError):
            raise SystemExit(
                f"server start {self.starts} failed; see {self.work}/server.log") from None
        self.server, self.port = server.proc, server.port

    def start_client(self, cid: str) -> None:
        self.clients[cid] = subprocess.Popen(
            [sys.executable, __file__, "--worker", cid, "--target", f"127.0.0.1:{self.port}",
             "--ledger", str(self.work / f"ledger-{cid}.jsonl"), "--seed", str(self.args.seed),
             "--think", str(self.args.think)],
            stdout=subprocess.DEVNULL, stderr=(self.work / f"client-{cid}.log").open("ab"))

    # observations (the database file and the public API only)
    def db_counts(self) -> tuple[int, int, bool]:
        """(committed submissions, finished rounds, job done) from the database file."""
        with closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)) as conn:
            subs = conn.execute("SELECT count(*) FROM submissions").fetchone()[0]
            fin = conn.execute(
                "SELECT count(*) FROM rounds WHERE state IN ('done', 'failed')").fetchone()[0]
            done = conn.execute("SELECT value FROM meta WHERE key = 'job_done'").fetchone()
        return int(subs), int(fin), done is not None and done[0] == "1"

    def job_done(self) -> bool:
        return self.db_counts()[2]

    def answers(self) -> bool:
        with AggregationClient(f"127.0.0.1:{self.port}", "chaos-probe", insecure=True,
                               timeout=2.0, retry_budget=0) as probe:
            try:
                probe.current_round()
                return True
            except grpc.RpcError:
                return False

    def accepts_work_after(self, fault: str, before: tuple[int, int, bool]) -> bool:
        """Invariant 4: GetRound answers and a submission commits or a round finishes."""
        end = time.monotonic() + self.args.recover
        answered = False
        while time.monotonic() < end:
            answered = answered or self.answers()
            now = self.db_counts()
            if answered and (now[0] > before[0] or now[1] > before[1] or now[2]):
                return True
            time.sleep(0.2)
        self.violations.append(
            f"no progress within {self.args.recover:.0f}s after {fault} #{self.faults[fault]} "
            f"(GetRound answered: {answered}; submissions/finished rounds before "
            f"{before[:2]}, now {self.db_counts()[:2]})")
        return False

    # faults
    def inject(self, fault: str) -> None:
        self.faults[fault] += 1
        assert self.server is not None
        if fault == "client-kill":
            cid = self.rng.choice(sorted(self.clients))
            proc = self.clients[cid]
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            self.start_client(cid)
        elif fault == "server-kill":
            self.server.kill()
            self.server.wait(10)
            self.start_server()
        elif fault == "stall":
            os.kill(self.server.pid, signal.SIGSTOP)
            time.sleep(self.rng.uniform(1.0, 6.0))
            os.kill(self.server.pid, signal.SIGCONT)
        elif fault == "lock-storm":
            hold = 7.0 if self.rng.random() < 0.25 else self.rng.uniform(0.5, 3.0)
            conn = sqlite3.connect(str(self.db), timeout=10, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                time.sleep(hold)
                conn.execute("ROLLBACK")
            finally:
                conn.close()

    def run(self) -> int:
        a = self.args
        t0 = time.monotonic()
        self.start_server()
        for i in range(a.clients):
            self.start_client(f"client-{i}")
        schedule = list(FAULTS)  # each kind at least once, then at random
        self.rng.shuffle(schedule)
        bound = time.monotonic() + a.rounds * (a.round_timeout + 15) + 120
        while not self.job_done():
            if time.monotonic() > bound:
                self.violations.append(f"the job did not finish within {bound - t0:.0f}s")
                break
            time.sleep(self.rng.uniform(0.1, 0.8))
            if self.job_done():
                break
            fault = schedule.pop() if schedule else self.rng.choice(FAULTS)
            before = self.db_counts()
            self.inject(fault)
            if not self.accepts_work_after(fault, before):
                # wedged (a violation already): restart it so the rest of the run still tests
                self.faults["restart-after-wedge"] += 1
                assert self.server is not None
                self.server.kill()
                self.server.wait(10)
                self.start_server()
        self.check(time.monotonic() - t0)
        return 1 if self.violations else 0

    def check(self, seconds: float) -> None:
        """Invariants 1-3 and the report."""
        acks: dict[tuple[int, str], str] = {}
        refused: set[tuple[int, str]] = set()  # Submit calls that got an error, by round
        errors: Counter[str] = Counter()
        for path in self.work.glob("ledger-*.jsonl"):
            for line in path.read_text().splitlines():
                e = json.loads(line)
                if "ack" in e:
                    acks[(e["ack"], e["client"])] = e["digest"]
                else:
                    errors[f"{e['error']}: {e['detail'][:70]}"] += 1
                    if e["submit"] and e["error"] in ("FAILED_PRECONDITION", "ALREADY_EXISTS",
                                                      "NOT_FOUND", "UNKNOWN"):
                        refused.add((e["submit"], e["client"]))
        with closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)) as conn:
            committed = {(int(r), str(c)): bytes(dg).hex() for r, c, dg in conn.execute(
                "SELECT round_id, client_id, digest FROM submissions")}
            rounds = [int(r[0]) for r in conn.execute("SELECT round_id FROM rounds")]
        for key, digest in sorted(acks.items()):
            if committed.get(key) != digest:
                why = "missing" if key not in committed else "other bytes"
                self.violations.append(f"acked but not in the database: round {key[0]} "
                                       f"{key[1]} ({why})")
        # docs/protocol.md: an identical retry of a committed submission is acknowledged
        # (duplicate = true) in every later state of its round; a refusal leaves the client
        # unable to tell "committed" from "missed"
        for key in sorted(refused & set(committed)):
            self.violations.append(f"round {key[0]}: {key[1]}'s identical retry of a committed "
                                   "submission was refused")
        states: Counter[str] = Counter()
        decoded = 0
        with AggregationClient(f"127.0.0.1:{self.port}", "chaos-probe", insecure=True,
                               timeout=10.0, retry_budget=10.0) as probe:
            for rid in sorted(rounds):
                try:
                    res = probe.result(rid, wait=False)
                except grpc.RpcError as exc:
                    self.violations.append(f"round {rid}: GetResult failed: {exc.code().name}")
                    continue
                states[res.state] += 1
                if res.state != "done":
                    continue
                got = {c.client_id for c in res.contributors}
                want = {c for r, c in committed if r == rid}
                decoded += len(got)
                for c in sorted(want - got):
                    self.violations.append(f"round {rid}: {c} committed but not decoded")
                for c in sorted(got - want):
                    self.violations.append(f"round {rid}: {c} decoded but not committed")
        if states["done"] != self.args.rounds:
            self.violations.append(f"{states['done']} of {self.args.rounds} rounds done")
        print(f"chaos: {self.args.rounds} rounds, {self.args.clients} clients, seed "
              f"{self.args.seed}, {seconds:.1f}s, server starts {self.starts}")
        print(f"  acked {len(acks)}  committed {len(committed)}  decoded {decoded}")
        print(f"  rounds: {dict(states)}")
        print(f"  faults: {dict(sorted(self.faults.items()))}")
        for what, count in errors.most_common(8):
            print(f"  client saw {count:4d} x {what}")
        print(f"  violations: {len(self.violations)}")
        for v in self.violations[:40]:
            print(f"    - {v}")

    def close(self) -> None:
        # SIGCONT first (a stalled server cannot act on SIGTERM), SIGKILL after 10 s
        stop_processes([*self.clients.values()] + ([self.server] if self.server else []),
                       grace=10.0)
        self.log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=6, help="client processes (= n)")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--transform", default="one")
    p.add_argument("--round-timeout", type=float, default=2.0)
    p.add_argument("--think", type=float, default=1.0,
                   help="each client waits up to this long before submitting to a round")
    p.add_argument("--recover", type=float, default=20.0,
                   help="seconds the server has to accept work after a fault (the longest "
                   "fault, a 7 s lock, + a restart + the clients' 3 s backoff + --think is "
                   "about 16 s; a wedge never recovers, so this only sets how soon it is seen)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--ledger", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.target, args.worker, args.ledger, args.seed, args.think)
    work = Path(tempfile.mkdtemp(prefix="rpsagg-chaos-"))
    chaos = Chaos(args, work)
    try:
        status = chaos.run()
    finally:
        chaos.close()
        if args.keep or chaos.violations:
            print(f"  work directory (database, ledgers, logs): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
