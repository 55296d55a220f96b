"""What ``rpsagg-client``'s two commands do: take part in a job (:func:`run`) and save a
done round's estimate (:func:`fetch_result`).

:mod:`rpsagg_client.cli` parses the flags and calls these; the exit statuses are in its
docstring. Bad input (the user's vectors do not fit the job) is one line on standard error
and exit status :data:`BAD_INPUT`, with nothing sent.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from rpsagg.commandline import ExitStatus
from rpsagg.tasks import EXTERNAL_DATA, DataUnavailable, Shard, Task, load_shard, make_task
from rpsagg_client.client import AggregationClient
from rpsagg_client.report import estimated_error_text, fmt_bytes, round_line
from rpsagg_client.vectors import (
    ArraySource,
    FloatArray,
    VectorError,
    VectorsEnded,
    VectorSource,
    describe,
    open_vectors,
)
from rpsagg_wire.v1.messages import RoundState
from rpsagg_wire.v1.serde import JoinReply, RoundInfo, RoundResult, Submission

log = logging.getLogger("rpsagg.client")
#: exit status of bad input vectors, as of bad flags (rpsagg.commandline)
BAD_INPUT = ExitStatus.USAGE
#: a submitted round whose line is not printed yet: round id, what was sent, how it went
Pending = tuple[int, Submission | None, str]


class _Leave(Exception):
    """Ends :func:`run` early with an exit status (its message already printed)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _client(args: argparse.Namespace) -> AggregationClient:
    return AggregationClient(
        args.server, args.client_id, token=args.token, tls_ca=args.tls_ca,
        tls_cert=args.tls_cert, tls_key=args.tls_key, insecure=args.insecure,
        timeout=args.timeout, retry_budget=args.retry_budget, job=args.job,
    )


def of_job(args: argparse.Namespace) -> str:
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

    Parameters
    ----------
    args : argparse.Namespace
        The parsed flags of ``rpsagg-client`` (:mod:`rpsagg_client.cli`).

    Returns
    -------
    int
        The exit status: 0 when the job is over, :data:`BAD_INPUT` for bad input.
    """
    source: VectorSource | None = None
    if args.vectors:
        try:
            source = open_vectors(vectors_path(args.vectors, args.client_id))
        except VectorError as exc:
            return _bad_input(str(exc))
    client = _client(args)
    try:
        with client:
            if source is not None:
                _check_job(client, args, source)
            joined = _join(client, source)
            _take_part(client, args, joined, source)
    except _Leave as leave:
        return leave.status
    _say_how_the_job_ended(client, args)
    return 0


def _check_job(client: AggregationClient, args: argparse.Namespace,
               source: VectorSource) -> None:
    """What the job needs (GetRound), checked against the user's vectors before joining."""
    info = client.current_round()  # what the job needs, before joining it
    if info.job_done:
        which = f"the job {args.job}" if args.job else "the server's job"
        print(f"rpsagg-client: {which} is already over", file=sys.stderr)
        raise _Leave(0)
    if info.task != "mean":
        raise _Leave(_bad_input(f"--vectors needs a server running --task mean; this one "
                                f"runs {info.task}"))
    try:
        source.check_job(info.d, info.m, info.total_rounds, info.task_step)
        _check_encodes(client, info, source)
    except VectorError as exc:
        raise _Leave(_bad_input(str(exc))) from None
    log.info("[Client] %s: %s", source.name, describe(source))


def _join(client: AggregationClient, source: VectorSource | None) -> JoinReply:
    """Join the job (saying d with the user's vectors: a server started with --d 0 takes
    the first join's); a refused d and a job that wants the user's vectors are bad input."""
    try:
        joined = client.join(source.d if source is not None else 0)
    except grpc.RpcError as exc:
        if source is not None and exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise _Leave(_bad_input(f"{source.name}: {exc.details()}")) from None
        raise
    if source is None and joined.data_hint == EXTERNAL_DATA:
        raise _Leave(_bad_input("the server's job averages the clients' own vectors: pass "
                                "--vectors PATH (or set RPSAGG_VECTORS)"))
    return joined


def _load_shard(args: argparse.Namespace, joined: JoinReply, d: int) -> Shard:
    """This client's shard of the built-in data (synthetic when it is unavailable)."""
    params = joined.task_params
    data = args.data or joined.data_hint.split(":")[0] or "synthetic"
    try:
        return load_shard(data, joined.task, joined.client_index, joined.n, d,
                          r=float(params.get("data_r", 0.0)),
                          seed=int(params.get("seed", 0)), path=args.data_path)
    except DataUnavailable as exc:
        print(f"rpsagg-client: {exc}; using synthetic data instead", file=sys.stderr)
        return load_shard("synthetic", joined.task, joined.client_index, joined.n, d,
                          r=float(params.get("data_r", 0.0)))


def _take_part(client: AggregationClient, args: argparse.Namespace, joined: JoinReply,
               source: VectorSource | None) -> None:
    """Every round until the job is over: its vectors, encoded and submitted, and a line
    for the previous round once it is over."""
    first = client.current_round()
    task = make_task(joined.task, first.d, joined.task_params)
    shard = _load_shard(args, joined, first.d) if source is None else None
    log.info("[Client] %s joined%s as index %d of %d (task %s, data %s)", args.client_id,
             of_job(args), joined.client_index, joined.n, joined.task,
             source.name if source is not None else args.data or joined.data_hint)
    pending: Pending | None = None
    for rnd in client.rounds():
        _report(client, args, joined, pending)
        vectors = _round_vectors(args, rnd, source, task, joined.task, shard)
        pending = _submit(client, args, rnd, vectors, source, joined.n)
    _report(client, args, joined, pending)


def _report(client: AggregationClient, args: argparse.Namespace, joined: JoinReply,
            pending: Pending | None) -> None:
    """The previous round is over: one line for it (unless ``--quiet``)."""
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
    print(round_line(args.client_id, rid, sent, note, res, joined.n, args.job), flush=True)


def _round_vectors(args: argparse.Namespace, rnd: RoundInfo, source: VectorSource | None,
                   task: Task, task_name: str, shard: Shard | None) -> FloatArray:
    """The round's vectors: the user's next ones, or the task's on this client's shard
    (``task_name``: the task's name as the join gave it)."""
    if source is not None:
        try:
            return source.vectors(rnd.task_step)
        except VectorsEnded as exc:
            if rnd.total_rounds == 0:  # a job until stopped: this client is done
                print(f"rpsagg-client: {exc}; leaving the job{of_job(args)}", file=sys.stderr)
                raise _Leave(0) from None
            raise _Leave(_bad_input(f"{exc}, but the job runs {rnd.total_rounds} rounds; "
                                    "leaving it")) from None
        except VectorError as exc:
            raise _Leave(_bad_input(f"{exc}; leaving the job")) from None
    assert shard is not None
    assert rnd.global_state is not None or task_name == "mean"
    state = rnd.global_state
    return task.client_vectors(state if state is not None else task.initial_state(0), shard,
                               rnd.task_step)


def _submit(client: AggregationClient, args: argparse.Namespace, rnd: RoundInfo,
            vectors: FloatArray, source: VectorSource | None, n: int) -> Pending:
    """Encode and submit the round's vectors; what to say of the round once it is over."""
    try:
        sub = client.encode(rnd, vectors)
    except ValueError as exc:
        if source is None:
            raise
        raise _Leave(_bad_input(f"{source.name}: round step {rnd.task_step + 1}: {exc}; "
                                "leaving the job")) from None
    try:
        ack = client.submit_encoded(sub)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            log.info("[Client]%s round %d closed before submission: %s", of_job(args),
                     rnd.round_id, exc.details())
            return (rnd.round_id, None, f"the round closed first: {exc.details()}")
        raise
    log.debug("[Client]%s round %d acked (%d received)", of_job(args), rnd.round_id,
              ack.received)
    return (rnd.round_id, sub, f"acked as {ack.received} of {n}")


def _say_how_the_job_ended(client: AggregationClient, args: argparse.Namespace) -> None:
    """The job is over: replaced by another, failed, or done (exit status 0 either way)."""
    if client.job_replaced:  # its job ended unseen: the server runs another one now
        which = f"the job {args.job} that {args.client_id}" if args.job else \
            f"the job {args.client_id}"
        print(f"rpsagg-client: {which} joined has ended; the server now runs a new job "
              "(another job id), which this client does not join", file=sys.stderr)
    elif client.job_failure:  # the job is over either way: exit 0 (a restart cannot help)
        print(f"rpsagg-client: the job{of_job(args)} failed: {client.job_failure}",
              file=sys.stderr)
    else:
        log.info("[Client] %s: the job%s is done", args.client_id, of_job(args))


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
    if res.state != RoundState.DONE or res.estimate is None:
        why = f"failed: {res.reason}" if res.state == RoundState.FAILED else (
            f"is {res.state}; it has no estimate yet" + ("" if args.wait else
                                                          " (--wait waits for it)"))
        print(f"rpsagg-client: round {res.round_id}{of_job(args)} {why}", file=sys.stderr)
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
