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
import math
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from rpsagg.tasks import DATA_SOURCES, EXTERNAL_DATA, DataUnavailable, load_shard, make_task
from rpsagg_client.client import AggregationClient
from rpsagg_client.identity import default_client_id
from rpsagg_client.vectors import (
    ArraySource,
    VectorError,
    VectorsEnded,
    VectorSource,
    describe,
    open_vectors,
)
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.serde import RoundInfo, RoundResult, Submission

log = logging.getLogger("rpsagg.client")
BAD_INPUT = 2  # exit status of bad input vectors (argparse's for bad flags)

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
               res: RoundResult | None, n: int, job: str = "") -> str:
    """The line printed for a finished round (see the module docstring).

    Parameters
    ----------
    client_id : str
        This client's id; the line starts with ``[client_id]``.
    round_id : int
        The round.
    sent : Submission or None
        What this client sent in the round (None: nothing; ``note`` says why).
    note : str
        How the submission went (``acked as 3 of 10``), or why nothing was sent.
    res : RoundResult or None
        The round's result, if known.
    n : int
        The job's number of clients.
    job : str, optional
        The job's id (``--job``): the line says ``[client_id] job ID round N:``.

    Returns
    -------
    str
    """
    head = f"[{client_id}] {f'job {job} ' if job else ''}round {round_id}:"
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
        end = f"round done with {res.n_prime}/{n} clients{estimated_error_text(res)}"
    elif res.state == "failed":
        end = f"round failed: {res.reason}"
    else:
        end = f"round {res.state}"
    return f"{head} {body}; {end}"


def estimated_error_text(res: RoundResult) -> str:
    """``", estimated relative error 0.0123 +- 0.0004"`` for a result that carries the
    server's estimate (its squared error where the relative one is not defined); empty
    for one that does not (a server that does not send it)."""
    rel, sq = res.est_relative_error, res.est_sq_error
    if math.isfinite(rel):
        mean = res.est_mean_sq_norm
        err = res.est_sq_error_stderr / mean if mean > 0 else math.nan
        return f", estimated relative error {rel:.4g}{_pm(err)}"
    if math.isfinite(sq):
        return f", estimated squared error {sq:.4g}{_pm(res.est_sq_error_stderr)}"
    return ""


def _pm(stderr: float) -> str:
    return f" +- {stderr:.2g}" if math.isfinite(stderr) else ""


def _client(args: argparse.Namespace) -> AggregationClient:
    return AggregationClient(
        args.server, args.client_id, token=args.token, tls_ca=args.tls_ca,
        tls_cert=args.tls_cert, tls_key=args.tls_key, insecure=args.insecure,
        timeout=args.timeout, retry_budget=args.retry_budget, job=args.job,
    )


def _of_job(args: argparse.Namespace) -> str:
    """`` (job ID)`` for messages when ``--job`` is given, else empty."""
    return f" (job {args.job})" if args.job else ""


def vectors_path(template: str, client_id: str) -> str:
    """``--vectors`` with ``{client_id}`` and ``{replica}`` filled in.

    ``{replica}`` is N of a compose replica's id ``<project>-<service>-N`` (so that every
    replica of one service reads its own file, e.g. ``/vectors/{replica}.npy``); a
    :class:`~rpsagg_client.vectors.VectorError` when the id has no such number.
    """
    if "{" not in template:
        return template
    replica = client_id.rsplit("-", 1)[-1]
    if "{replica}" in template and not replica.isdigit():
        raise VectorError(f"--vectors {template}: {{replica}} needs a client id ending in "
                          f"-N (a compose replica's name); this client is {client_id!r}")
    return template.replace("{client_id}", client_id).replace("{replica}", replica)


def _bad_input(message: str) -> int:
    print(f"rpsagg-client: {message}", file=sys.stderr, flush=True)
    return BAD_INPUT


def _check_encodes(client: AggregationClient, info: RoundInfo, source: VectorSource) -> None:
    """Encode every vector of a file once with the job's encoder (as the first round
    announces it), before joining: values whose encoding overflows (a transformed value
    beyond float32, a square beyond float64) are refused now, not in the middle of the job.
    A stream's vectors are checked as they are encoded."""
    if not isinstance(source, ArraySource):
        return
    rnd = replace(info, d=info.d or source.d)
    try:
        est = client.estimator_for(rnd)
    except ValueError:
        return  # a wire format this client does not speak: the join's own error says so
    for step in range(info.task_step, source.rounds):
        for j, x in enumerate(source.vectors(step)):
            try:
                est.encode(x, step * 1_000_003 + j)
            except ValueError as exc:
                where = f"round step {step + 1}" + (f", vector {j}" if source.m > 1 else "")
                raise VectorError(f"{source.name}: {where}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Join, then for every round compute the task's vectors (or read the user's) and submit.

    With ``--vectors`` the input is read and checked before the client contacts the server,
    and checked against the job (task, d, m, rounds; from GetRound) before it joins: bad
    input is one line on stderr and exit status 2, with nothing sent.
    """
    source: VectorSource | None = None
    if args.vectors:
        try:
            source = open_vectors(vectors_path(args.vectors, args.client_id))
        except VectorError as exc:
            return _bad_input(str(exc))
    client = _client(args)
    with client:
        if source is not None:
            info = client.current_round()  # what the job needs, before joining it
            if info.job_done:
                which = f"the job {args.job}" if args.job else "the server's job"
                print(f"rpsagg-client: {which} is already over", file=sys.stderr)
                return 0
            if info.task != "mean":
                return _bad_input(f"--vectors needs a server running --task mean; this one "
                                  f"runs {info.task}")
            try:
                source.check_job(info.d, info.m, info.total_rounds, info.task_step)
                _check_encodes(client, info, source)
            except VectorError as exc:
                return _bad_input(str(exc))
            log.info("[Client] %s: %s", source.name, describe(source))
        try:  # says d: a server started with --d 0 takes the first join's
            joined = client.join(source.d if source is not None else 0)
        except grpc.RpcError as exc:
            if source is not None and exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                return _bad_input(f"{source.name}: {exc.details()}")
            raise
        hint = joined.data_hint
        if source is None and hint == EXTERNAL_DATA:
            return _bad_input("the server's job averages the clients' own vectors: pass "
                              "--vectors PATH (or set RPSAGG_VECTORS)")
        params = joined.task_params
        first = client.current_round()
        task = make_task(joined.task, first.d, params)
        shard = None
        if source is None:
            data = args.data or hint.split(":")[0] or "synthetic"
            try:
                shard = load_shard(data, joined.task, joined.client_index, joined.n, first.d,
                                   r=float(params.get("data_r", 0.0)),
                                   seed=int(params.get("seed", 0)), path=args.data_path)
            except DataUnavailable as exc:
                print(f"rpsagg-client: {exc}; using synthetic data instead", file=sys.stderr)
                shard = load_shard("synthetic", joined.task, joined.client_index, joined.n,
                                   first.d, r=float(params.get("data_r", 0.0)))
        log.info("[Client] %s joined%s as index %d of %d (task %s, data %s)", args.client_id,
                 _of_job(args), joined.client_index, joined.n, joined.task,
                 source.name if source is not None else args.data or hint)
        pending: tuple[int, Submission | None, str] | None = None

        def report() -> None:  # the previous round is over: one line for it
            if pending is None or args.quiet:
                return
            rid, sent, note = pending
            # the result the client already waited for; no new call once the job is over
            # (the server may be stopping after its drain)
            res: RoundResult | None = client.finished_result(rid)
            if res is None and client.job_failure is None and not client.job_replaced:
                try:
                    res = client.result(rid, wait=False)
                except grpc.RpcError:
                    res = None
            print(round_line(args.client_id, rid, sent, note, res, joined.n, args.job),
                  flush=True)

        for rnd in client.rounds():
            report()
            pending = None
            if source is not None:
                try:
                    vectors = source.vectors(rnd.task_step)
                except VectorsEnded as exc:
                    if rnd.total_rounds == 0:  # a job until stopped: this client is done
                        print(f"rpsagg-client: {exc}; leaving the job{_of_job(args)}",
                              file=sys.stderr)
                        return 0
                    return _bad_input(f"{exc}, but the job runs {rnd.total_rounds} rounds; "
                                      "leaving it")
                except VectorError as exc:
                    return _bad_input(f"{exc}; leaving the job")
            else:
                assert shard is not None
                assert rnd.global_state is not None or joined.task == "mean"
                state = rnd.global_state
                vectors = task.client_vectors(
                    state if state is not None else task.initial_state(0), shard,
                    rnd.task_step)
            try:
                sub = client.encode(rnd, vectors)
            except ValueError as exc:
                if source is None:
                    raise
                return _bad_input(f"{source.name}: round step {rnd.task_step + 1}: {exc}; "
                                  "leaving the job")
            try:
                ack = client.submit_encoded(sub)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                  grpc.StatusCode.NOT_FOUND):
                    log.info("[Client]%s round %d closed before submission: %s", _of_job(args),
                             rnd.round_id, exc.details())
                    pending = (rnd.round_id, None, f"the round closed first: {exc.details()}")
                    continue
                raise
            log.debug("[Client]%s round %d acked (%d received)", _of_job(args), rnd.round_id,
                      ack.received)
            pending = (rnd.round_id, sub, f"acked as {ack.received} of {joined.n}")
        report()
    if client.job_replaced:  # its job ended unseen: the server runs another one now
        which = f"the job {args.job} that {args.client_id}" if args.job else \
            f"the job {args.client_id}"
        print(f"rpsagg-client: {which} joined has ended; the server now runs a new job "
              "(another job id), which this client does not join", file=sys.stderr)
    elif client.job_failure:  # the job is over either way: exit 0 (a restart cannot help)
        print(f"rpsagg-client: the job{_of_job(args)} failed: {client.job_failure}",
              file=sys.stderr)
    else:
        log.info("[Client] %s: the job%s is done", args.client_id, _of_job(args))
    return 0


def fetch_result(args: argparse.Namespace) -> int:
    """``rpsagg-client result``: write a done round's estimate to ``--out`` (GetResult)."""
    out = Path(args.out)
    if out.suffix.lower() != ".npy":
        return _bad_input(f"--out {args.out}: the estimate is written as .npy; name the file "
                          "FILE.npy")
    if args.round < 0:
        return _bad_input(f"--round must be >= 0 (0: the latest done round); got {args.round}")
    with _client(args) as client:
        res = client.result(args.round, wait=args.wait)
        info = client.current_round()
    if res.state != "done" or res.estimate is None:
        why = f"failed: {res.reason}" if res.state == "failed" else (
            f"is {res.state}; it has no estimate yet" + ("" if args.wait else
                                                          " (--wait waits for it)"))
        print(f"rpsagg-client: round {res.round_id}{_of_job(args)} {why}", file=sys.stderr)
        return 1
    est = np.asarray(res.estimate, dtype=np.float64)
    values = est[0] if est.ndim == 2 and est.shape[0] == 1 else est
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as fp:
        np.save(fp, values, allow_pickle=False)
    tmp.replace(out)
    which = f"job {args.job} round" if args.job else "round"
    print(f"{which} {res.round_id}: the mean of {res.n_prime} of {info.n} clients' vectors "
          f"({info.scheme}, transform {res.transform}, k={info.k}, d={info.d}, "
          f"{fmt_bytes(res.wire_bytes)} received{estimated_error_text(res)}), "
          f"shape {values.shape} -> {out}", flush=True)
    return 0


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
        print(f"rpsagg-client: {args.client_id}{_of_job(args)}: {exc.code().name}: "
              f"{exc.details()}{why}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
