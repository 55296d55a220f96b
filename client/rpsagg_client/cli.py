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
``--vectors`` and ``--quiet`` also read an environment variable ``RPSAGG_<FLAG>``
(``--vectors`` -> ``RPSAGG_VECTORS``); a flag overrides it.

Exit status: 0 when the job is over (done, or failed on the server: a restart cannot help);
2 for bad input (a vector file that does not fit the job; one line naming it); 3 when the
server refuses this client for good (every client slot of the job is taken by other ids, or
the request is invalid); 4 when it refuses the credentials (a wrong or missing token, a
token for another client id); 1 for anything else (e.g. the server stayed unreachable for
the whole retry budget), which a restart may mend; 130 on Ctrl-C or SIGTERM.
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
from rpsagg.tasks import DATA_SOURCES
from rpsagg_client.commands import BAD_INPUT, fetch_result, log, of_job, run, vectors_path
from rpsagg_client.identity import default_client_id
from rpsagg_client.report import estimated_error_text, fmt_bytes, round_line, wire_bytes
from rpsagg_wire.v1 import serde

#: exit statuses (the module docstring): refusals that no restart can change
EXIT_REFUSED = 3
EXIT_CREDENTIALS = 4
_REFUSED = {grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_REFUSED,
            grpc.StatusCode.INVALID_ARGUMENT: EXIT_REFUSED,
            grpc.StatusCode.UNAUTHENTICATED: EXIT_CREDENTIALS,
            grpc.StatusCode.PERMISSION_DENIED: EXIT_CREDENTIALS}


def _connection(p: argparse.ArgumentParser) -> None:
    """The flags of every command: where the server is and how to reach it."""
    env = os.environ.get
    p.add_argument("--server", default=env("RPSAGG_SERVER", "127.0.0.1:50051"), help="HOST:PORT")
    p.add_argument("--client-id", default=None,
                   help="default: $RPSAGG_CLIENT_ID; in a compose replica its container name "
                   "(project-service-N, stable when the container is re-created); else the "
                   "host name")
    p.add_argument("--job", default=env("RPSAGG_JOB", ""), metavar="ID",
                   help="the job to take part in, on a server that hosts several (the id "
                   "'rpsagg-jobs create' printed; also RPSAGG_JOB); default: the server's "
                   "default job, or its only open job")
    p.add_argument("--token", default=env("RPSAGG_TOKEN"))
    p.add_argument("--token-file", default=env("RPSAGG_TOKEN_FILE"),
                   help="read the token from this file (e.g. a mounted secret)")
    p.add_argument("--tls-ca", default=env("RPSAGG_TLS_CA"), help="CA of the server cert")
    p.add_argument("--tls-cert", default=env("RPSAGG_TLS_CERT"), help="client cert (mTLS)")
    p.add_argument("--tls-key", default=env("RPSAGG_TLS_KEY"), help="client key (mTLS)")
    p.add_argument("--insecure", action="store_true", help="plain-text channel")
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline (s)")
    p.add_argument("--retry-budget", type=float, default=60.0,
                   help="seconds to keep retrying an unavailable server")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpsagg-client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version_flag(p, f"protocol {serde.PROTOCOL}")
    env = os.environ.get
    _connection(p)
    p.add_argument("--vectors", default=env("RPSAGG_VECTORS") or None, metavar="PATH",
                   help="your own vectors for --task mean: .npy of shape (d,), (rounds, d) or "
                   "(rounds, m, d); .npz; CSV, one vector per line; '-': one vector per line "
                   "on standard input, one per round (also RPSAGG_VECTORS). {client_id} and "
                   "{replica} (N of a compose replica <project>-client-N) are filled in")
    p.add_argument("--data", choices=DATA_SOURCES, default=None,
                   help="data source (default: what the server suggests at join)")
    p.add_argument("--data-path", default=None, help="data file or directory")
    p.add_argument("--quiet", action="store_true",
                   default=env("RPSAGG_QUIET", "") not in ("", "0"),
                   help="no line per round (also RPSAGG_QUIET=1)")
    return p


def _result_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rpsagg-client result",
        description="Save a done round's estimate (the decoded mean) as a .npy file: shape "
        "(d,), or (m, d) for m vectors per round.")
    _connection(p)
    p.add_argument("--round", type=int, default=0,
                   help="round id (default 0: the latest done round)")
    p.add_argument("--out", required=True, help="where to write it (FILE.npy)")
    p.add_argument("--wait", action="store_true",
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
        signal.signal(sig, lambda *_: os._exit(130))
    try:
        return command(args)
    except grpc.RpcError as exc:
        code = _REFUSED.get(exc.code(), 1)
        why = " (refused for good: not retrying)" if code != 1 else ""
        print(f"rpsagg-client: {args.client_id}{of_job(args)}: {exc.code().name}: "
              f"{exc.details()}{why}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


# re-exported: the commands (commands) and the lines (report) are importable here too
__all__ = ["BAD_INPUT", "EXIT_CREDENTIALS", "EXIT_REFUSED", "estimated_error_text",
           "fetch_result", "fmt_bytes", "log", "main", "round_line", "run", "vectors_path",
           "wire_bytes"]

if __name__ == "__main__":
    raise SystemExit(main())
