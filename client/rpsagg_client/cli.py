"""``rpsagg-client``: run the server's task on this client's data shard until the job is done.

Prints one line per round once the round is over (bytes this client sent, whether its
submission was acknowledged, how the round ended); ``--quiet`` turns the lines off.

Exit status: 0 when the job is over (done, or failed on the server: a restart cannot help);
3 when the server refuses this client for good (every client slot of the job is taken by
other ids, or the request is invalid); 4 when it refuses the credentials (a wrong or missing
token, a token for another client id); 1 for anything else (e.g. the server stayed
unreachable for the whole retry budget), which a restart may mend; 130 on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from rpsagg.tasks import DATA_SOURCES, DataUnavailable, load_shard, make_task
from rpsagg_client.client import AggregationClient
from rpsagg_client.identity import default_client_id
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import RoundResult, Submission

log = logging.getLogger("rpsagg.client")

#: exit statuses (the module docstring): refusals that no restart can change
EXIT_REFUSED = 3
EXIT_CREDENTIALS = 4
_REFUSED = {grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_REFUSED,
            grpc.StatusCode.INVALID_ARGUMENT: EXIT_REFUSED,
            grpc.StatusCode.UNAUTHENTICATED: EXIT_CREDENTIALS,
            grpc.StatusCode.PERMISSION_DENIED: EXIT_CREDENTIALS}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpsagg-client", description=__doc__)
    env = os.environ.get
    p.add_argument("--server", default=env("RPSAGG_SERVER", "127.0.0.1:50051"), help="HOST:PORT")
    p.add_argument("--client-id", default=None,
                   help="default: $RPSAGG_CLIENT_ID; in a compose replica its container name "
                   "(project-service-N, stable when the container is re-created); else the "
                   "host name")
    p.add_argument("--token", default=env("RPSAGG_TOKEN"))
    p.add_argument("--token-file", default=env("RPSAGG_TOKEN_FILE"),
                   help="read the token from this file (e.g. a mounted secret)")
    p.add_argument("--tls-ca", default=env("RPSAGG_TLS_CA"), help="CA of the server cert")
    p.add_argument("--tls-cert", default=env("RPSAGG_TLS_CERT"), help="client cert (mTLS)")
    p.add_argument("--tls-key", default=env("RPSAGG_TLS_KEY"), help="client key (mTLS)")
    p.add_argument("--insecure", action="store_true", help="plain-text channel")
    p.add_argument("--data", choices=DATA_SOURCES, default=None,
                   help="data source (default: what the server suggests at join)")
    p.add_argument("--data-path", default=None, help="data file or directory")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline (s)")
    p.add_argument("--retry-budget", type=float, default=60.0,
                   help="seconds to keep retrying an unavailable server")
    p.add_argument("--quiet", action="store_true",
                   default=env("RPSAGG_QUIET", "") not in ("", "0"),
                   help="no line per round (also RPSAGG_QUIET=1)")
    return p


def fmt_bytes(b: float) -> str:
    """``123 B``, ``4.1 KiB``, ``2.0 MiB``."""
    for unit in ("B", "KiB", "MiB"):
        if b < 1024 or unit == "MiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def wire_bytes(sub: Submission) -> int:
    """Bytes of the Submit request less the evaluation references (the server's count)."""
    return serde.decode_submission(serde.encode_submission(sub)).wire_bytes


def round_line(client_id: str, round_id: int, sent: Submission | None, note: str,
               res: RoundResult | None, n: int) -> str:
    """The line printed for a finished round (see the module docstring)."""
    head = f"[{client_id}] round {round_id}:"
    if sent is None:
        body = f"nothing sent ({note})"
    else:
        coded = [v for v in sent.vectors if v.codes is not None]
        if coded:
            what = f"{sum(v.count for v in coded)} {coded[0].value_bits}-bit values + scale + seed"
        else:
            what = f"{sum(v.values.size for v in sent.vectors)} floats + seed"
        body = f"sent {fmt_bytes(wire_bytes(sent))} ({what}), {note}"
    if res is None:
        return f"{head} {body}"
    if res.state == "done":
        end = f"round done with {res.n_prime}/{n} clients"
    elif res.state == "failed":
        end = f"round failed: {res.reason}"
    else:
        end = f"round {res.state}"
    return f"{head} {body}; {end}"


def run(args: argparse.Namespace) -> int:
    """Join, then for every round compute the task's vectors on the shard and submit."""
    client = AggregationClient(
        args.server, args.client_id, token=args.token, tls_ca=args.tls_ca,
        tls_cert=args.tls_cert, tls_key=args.tls_key, insecure=args.insecure,
        timeout=args.timeout, retry_budget=args.retry_budget,
    )
    with client:
        joined = client.join()
        hint = joined.data_hint
        source = args.data or hint.split(":")[0] or "synthetic"
        params = joined.task_params
        first = client.current_round()
        task = make_task(joined.task, first.d, params)
        try:
            shard = load_shard(source, joined.task, joined.client_index, joined.n, first.d,
                               r=float(params.get("data_r", 0.0)),
                               seed=int(params.get("seed", 0)), path=args.data_path)
        except DataUnavailable as exc:
            print(f"rpsagg-client: {exc}; using synthetic data instead", file=sys.stderr)
            shard = load_shard("synthetic", joined.task, joined.client_index, joined.n,
                               first.d, r=float(params.get("data_r", 0.0)))
        log.info("[Client] %s joined as index %d of %d (task %s, data %s)", args.client_id,
                 joined.client_index, joined.n, joined.task, source)
        pending: tuple[int, Submission | None, str] | None = None

        def report() -> None:  # the previous round is over: one line for it
            if pending is None or args.quiet:
                return
            rid, sent, note = pending
            # the result the client already waited for; no new call once the job is over
            # (the server may be stopping after its drain)
            res: RoundResult | None = client.finished_result(rid)
            if res is None and client.job_failure is None:
                try:
                    res = client.result(rid, wait=False)
                except grpc.RpcError:
                    res = None
            print(round_line(args.client_id, rid, sent, note, res, joined.n), flush=True)

        for rnd in client.rounds():
            report()
            assert rnd.global_state is not None or joined.task == "mean"
            state = rnd.global_state
            vectors = task.client_vectors(state if state is not None else task.initial_state(0),
                                          shard, rnd.task_step)
            sub = client.encode(rnd, vectors)
            try:
                ack = client.submit_encoded(sub)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                  grpc.StatusCode.NOT_FOUND):
                    log.info("[Client] round %d closed before submission: %s", rnd.round_id,
                             exc.details())
                    pending = (rnd.round_id, None, f"the round closed first: {exc.details()}")
                    continue
                raise
            log.debug("[Client] round %d acked (%d received)", rnd.round_id, ack.received)
            pending = (rnd.round_id, sub, f"acked as {ack.received} of {joined.n}")
        report()
    if client.job_failure:  # the job is over either way: exit 0 (a restart cannot help)
        print(f"rpsagg-client: the job failed: {client.job_failure}", file=sys.stderr)
    else:
        log.info("[Client] %s: the job is done", args.client_id)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-client``."""
    logging.basicConfig(level=os.environ.get("RPSAGG_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = _parser().parse_args(argv)
    if args.client_id is None:
        args.client_id = default_client_id()
    if args.token_file and not args.token:
        args.token = Path(args.token_file).read_text().strip()
    # Ctrl-C (or SIGTERM) ends the client at once: everything acked is durable on the server,
    # and nothing else is worth finishing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: os._exit(130))
    try:
        return run(args)
    except grpc.RpcError as exc:
        code = _REFUSED.get(exc.code(), 1)
        why = " (refused for good: not retrying)" if code != 1 else ""
        print(f"rpsagg-client: {args.client_id}: {exc.code().name}: {exc.details()}{why}",
              file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
