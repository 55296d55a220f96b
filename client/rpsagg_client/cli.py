"""``rpsagg-client``: take part in the server's job until it is done, or fetch an estimate.

``rpsagg-client [flags]`` runs the server's task on this client's data: its shard of the
built-in data, or with ``--vectors PATH`` the user's own vectors (``.npy``, ``.npz``, CSV,
or ``-`` for a stream on standard input; :mod:`rpsagg_client.vectors`). It prints one line
per round once the round is over (bytes this client sent, whether its submission was
acknowledged, how the round ended, and a done round's error as the server estimated it
from the messages: relative error +- its standard error); ``--quiet`` turns the lines off.

``rpsagg-client result --round N --out FILE.npy`` saves a done round's estimate (the latest
done round for ``--round 0``) and prints what it is, with its estimated error.

``--job ID`` names the job to take part in, on a server that hosts several (``rpsagg-jobs
create`` prints a new job's id); without it the client takes part in the server's default
job (the one its flags started), or its only open job. The lines then name the job.

``--server``, ``--client-id``, ``--job``, ``--token``, ``--token-file``, ``--tls-*``,
``--vectors`` and ``--quiet`` also read an environment variable (``RPSAGG_SERVER``...,
``RPSAGG_CLIENT_TLS_CERT`` for the client's certificate; ``docs/reference/environment.md``);
a flag overrides it.

Exit statuses: :class:`rpsagg.commandline.ExitStatus`, as every rpsagg command: 0 when the
job is over (done, or failed on the server: a restart cannot help); 2 for bad input (a
vector file that does not fit the job; one line naming it); 3 when the server refuses this
client for good (every client slot of the job is taken by other ids, or the request is
invalid); 4 when it refuses the credentials; 1 for anything else (e.g. the server stayed
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

from rpsagg import add_version_flag
from rpsagg.commandline import ExitStatus, Parser, add_flag, exit_statuses
from rpsagg.tasks import DATA_SOURCES
from rpsagg_client.commands import BAD_INPUT, fetch_result, log, of_job, run, vectors_path
from rpsagg_client.identity import default_client_id
from rpsagg_client.report import estimated_error_text, fmt_bytes, round_line, wire_bytes
from rpsagg_wire.v1 import serde

#: exit statuses (the module docstring): refusals that no restart can change
EXIT_REFUSED = ExitStatus.REFUSED
EXIT_CREDENTIALS = ExitStatus.CREDENTIALS
_REFUSED = {grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_REFUSED,
            grpc.StatusCode.INVALID_ARGUMENT: EXIT_REFUSED,
            grpc.StatusCode.UNAUTHENTICATED: EXIT_CREDENTIALS,
            grpc.StatusCode.PERMISSION_DENIED: EXIT_CREDENTIALS}

USAGE = """rpsagg-client [options]                  take part in the job until it is done
       rpsagg-client result --out FILE.npy [--round N] [--wait] [options]
                                                save a done round's estimate"""
DESCRIPTION = """\
Take part in a job of an rpsagg server until it is done: each round, compute this client's
vector (its shard of the built-in data, or your own with --vectors), encode it to k floats
and a seed, submit it, and print one line (bytes sent, whether it was acknowledged, how the
round ended, and the error the server estimated from the messages). Without --job the client
takes part in the server's default job, or its only open job.

  rpsagg-client --server HOST:50051 --client-id c0 --token "$TOKEN" --tls-ca ca.pem
  rpsagg-client --server 127.0.0.1:50051 --insecure --vectors x0.npy
  rpsagg-client result --server 127.0.0.1:50051 --insecure --round 0 --out mean.npy
"""
_NOTES = {ExitStatus.DONE: "the job is over: done, or failed on the server, which a restart "
          "of this client cannot mend",
          ExitStatus.FAILURE: "e.g. the server unreachable for the whole --retry-budget",
          ExitStatus.USAGE: "also vectors that do not fit the job, with nothing sent",
          ExitStatus.CREDENTIALS: "also a token of another client id"}


def _connection(p: argparse.ArgumentParser) -> None:
    """The flags of both commands: where the server is, who this client is, how to call."""
    where = p.add_argument_group(
        "the server and this client",
        "e.g. --server a.example.org:50051 --client-id c0 --token-file c0.token --tls-ca "
        "ca.pem")
    add_flag(where, "--server", env="RPSAGG_SERVER", default="127.0.0.1:50051",
             metavar="HOST:PORT", help="the server's gRPC address")
    add_flag(where, "--client-id", env="RPSAGG_CLIENT_ID", metavar="ID",
             help="this client's id; default: in a compose replica its container name "
             "(project-service-N, stable when the container is re-created), else the host "
             "name")
    add_flag(where, "--job", env="RPSAGG_JOB", default="", metavar="ID",
             help="the job to take part in, on a server that hosts several (the id "
             "'rpsagg-jobs create' printed); default: the server's default job, or its "
             "only open job")
    security = p.add_argument_group(
        "credentials and TLS",
        "e.g. --token-file c0.token --tls-ca ca.pem (mTLS: add --tls-cert c0.pem --tls-key "
        "c0.key); --insecure for a server started with --insecure")
    add_flag(security, "--token", env="RPSAGG_TOKEN", metavar="TOKEN",
             help="this client's token, one of the server's --tokens (sent as gRPC "
             "metadata; never printed)")
    add_flag(security, "--token-file", env="RPSAGG_TOKEN_FILE", metavar="FILE",
             help="read the token from this file (e.g. a mounted secret)")
    add_flag(security, "--tls-ca", env="RPSAGG_TLS_CA", metavar="FILE",
             help="PEM CA that signed the server's certificate")
    add_flag(security, "--tls-cert", env="RPSAGG_CLIENT_TLS_CERT",
             deprecated=("RPSAGG_TLS_CERT",), metavar="FILE",
             help="this client's PEM certificate, for a server that requires client "
             "certificates (mTLS)")
    add_flag(security, "--tls-key", env="RPSAGG_CLIENT_TLS_KEY",
             deprecated=("RPSAGG_TLS_KEY",), metavar="FILE",
             help="the key of --tls-cert")
    security.add_argument("--insecure", action="store_true",
                          help="a plain-text channel, without TLS")
    calls = p.add_argument_group("calls and retries", "e.g. --timeout 30 --retry-budget 600")
    calls.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="seconds each gRPC call may take")
    calls.add_argument("--retry-budget", type=float, default=60.0, metavar="S",
                       help="seconds to keep retrying a server that is unavailable")


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="rpsagg-client", usage=USAGE, description=DESCRIPTION,
               epilog=exit_statuses(ExitStatus.REFUSED, ExitStatus.CREDENTIALS,
                                    ExitStatus.INTERRUPTED, notes=_NOTES))
    add_version_flag(p, f"protocol {serde.PROTOCOL}")
    _connection(p)
    data = p.add_argument_group(
        "the data", "e.g. --vectors x0.npy (your own), --vectors /vectors/{replica}.npy (one "
        "file per compose replica), --data fashion-mnist --data-path ./fmnist")
    add_flag(data, "--vectors", env="RPSAGG_VECTORS", metavar="PATH",
             help="your own vectors for --task mean: .npy of shape (d,), (rounds, d) or "
             "(rounds, m, d); .npz; CSV, one vector per line; '-': one vector per line on "
             "standard input, one per round. {client_id} and {replica} (N of a compose "
             "replica <project>-client-N) are filled in")
    data.add_argument("--data", choices=DATA_SOURCES, default=None,
                      help="built-in data source; default: what the server suggests at join")
    data.add_argument("--data-path", default=None, metavar="PATH",
                      help="the data source's file or directory; default: its usual place")
    out = p.add_argument_group("output", "e.g. --quiet, or RPSAGG_LOG_LEVEL=INFO for a log")
    add_flag(out, "--quiet", env="RPSAGG_QUIET", action="store_true",
             help="no line per round")
    return p


def _result_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="rpsagg-client result",
        description="Save a done round's estimate (the decoded mean) as a .npy file: shape "
        "(d,), or (m, d) for m vectors per round; print what it is, with its estimated "
        "error.\n\n  rpsagg-client result --insecure --round 0 --out mean.npy\n",
        epilog=exit_statuses(ExitStatus.REFUSED, ExitStatus.CREDENTIALS,
                             ExitStatus.INTERRUPTED))
    _connection(p)
    which = p.add_argument_group("the round", "e.g. --round 3 --out round3.npy --wait")
    which.add_argument("--round", type=int, default=0, metavar="N",
                       help="round id (0: the latest done round)")
    which.add_argument("--out", required=True, metavar="FILE.npy", help="where to write it")
    which.add_argument("--wait", action="store_true",
                       help="wait for the round to finish if it is still running")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-client``."""
    logging.basicConfig(level=os.environ.get("RPSAGG_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = run
    if argv[:1] == ["result"]:
        args = _result_parser().parse_args(argv[1:])
        command = fetch_result
    else:
        args = _parser().parse_args(argv)
    if args.client_id is None:
        args.client_id = default_client_id()
    if args.token_file and not args.token:
        args.token = Path(args.token_file).read_text().strip()
    # Ctrl-C (or SIGTERM) ends the client at once: everything acked is durable on the server,
    # and nothing else is worth finishing.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: os._exit(ExitStatus.INTERRUPTED))
    try:
        return command(args)
    except grpc.RpcError as exc:
        code = _REFUSED.get(exc.code(), ExitStatus.FAILURE)
        why = " (refused for good: not retrying)" if code != ExitStatus.FAILURE else ""
        print(f"rpsagg-client: {args.client_id}{of_job(args)}: {exc.code().name}: "
              f"{exc.details()}{why}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED


# re-exported: the commands (commands) and the lines (report) are importable here too
__all__ = ["BAD_INPUT", "EXIT_CREDENTIALS", "EXIT_REFUSED", "estimated_error_text",
           "fetch_result", "fmt_bytes", "log", "main", "round_line", "run", "vectors_path",
           "wire_bytes"]

if __name__ == "__main__":
    raise SystemExit(main())
