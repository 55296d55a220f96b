"""``rpsagg-client``: run the server's task on this client's data shard until the job is done."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from rpsagg.tasks import DATA_SOURCES, DataUnavailable, load_shard, make_task
from rpsagg_client.client import AggregationClient

log = logging.getLogger("rpsagg.client")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpsagg-client", description=__doc__)
    env = os.environ.get
    p.add_argument("--server", default=env("RPSAGG_SERVER", "127.0.0.1:50051"), help="HOST:PORT")
    p.add_argument("--client-id", default=env("RPSAGG_CLIENT_ID") or env("HOSTNAME")
                   or socket.gethostname(),
                   help="default: $RPSAGG_CLIENT_ID, else the host name (a container's id)")
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
    return p


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
        for rnd in client.rounds():
            assert rnd.global_state is not None or joined.task == "mean"
            state = rnd.global_state
            vectors = task.client_vectors(state if state is not None else task.initial_state(0),
                                          shard, rnd.task_step)
            try:
                ack = client.submit(rnd, vectors)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                  grpc.StatusCode.NOT_FOUND):
                    log.info("[Client] round %d closed before submission: %s", rnd.round_id,
                             exc.details())
                    continue
                raise
            log.debug("[Client] round %d acked (%d received)", rnd.round_id, ack.received)
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
    if args.token_file and not args.token:
        args.token = Path(args.token_file).read_text().strip()
    # Ctrl-C (or SIGTERM) ends the client at once: everything acked is durable on the server,
    # and nothing else is worth finishing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: os._exit(130))
    try:
        return run(args)
    except grpc.RpcError as exc:
        print(f"rpsagg-client: {exc.code().name}: {exc.details()}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
