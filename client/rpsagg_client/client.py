"""``AggregationClient``: join, follow rounds, encode and submit locally, fetch results.

Every call has a deadline; UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential
backoff and full jitter until ``retry_budget`` seconds have passed, and so is CANCELLED on
Join and the idempotent reads (GetRound, GetResult; a WatchRounds stream is re-opened): a
server that stops with a call accepted but not yet handled cancels it (a ``--d 0`` server
does so to the joins in flight when it starts the job with the d it learned; a repeated
Join of the same client id is answered with the same index). A retried Submit sends
byte-identical bytes, which the server acknowledges again instead of treating as a second
submission. Reads carry this client's id, so the server knows who has been told that the
job is done (its drained job end). Every request names the job it is for (``job``: an id
that ``rpsagg-jobs create`` printed; ``""`` for the server's default job), so one server
can host several jobs.

Examples
--------
>>> client = AggregationClient("127.0.0.1:50051", "alice", insecure=True)  # doctest: +SKIP
>>> client.join()                                                           # doctest: +SKIP
>>> for rnd in client.rounds():                                             # doctest: +SKIP
...     client.submit(rnd, my_gradient(rnd.global_state))
...     result = client.result(rnd.round_id)
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from numpy.typing import ArrayLike

from rpsagg import SPEC_VERSION, SPEC_VERSIONS, Estimator, check_spec_version
from rpsagg.schemes import estimator_from_options
from rpsagg.spec import derive_round_seed
from rpsagg_wire.v1 import serde
from rpsagg_wire.v1.messages import ACCEPTING, FINISHED, RoundState
from rpsagg_wire.v1.serde import (
    GetResultRequest,
    GetRoundRequest,
    JoinReply,
    JoinRequest,
    RoundEvent,
    RoundInfo,
    RoundResult,
    Submission,
    SubmitReply,
    VectorPayload,
    WatchRequest,
)

log = logging.getLogger("rpsagg.client")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
READ_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                  grpc.StatusCode.CANCELLED)


class AggregationClient:
    """A client of the rpsagg aggregation service.

    Parameters
    ----------
    target : str
        ``HOST:PORT`` of the server.
    client_id : str
        This client's id (1..128 characters of ``[A-Za-z0-9._-]``).
    token : str, optional
        Sent as ``authorization: Bearer <token>`` on every call.
    tls_ca : str, optional
        PEM file of the CA that signed the server's certificate (TLS). Without it and
        without ``insecure`` the system roots are used.
    tls_cert, tls_key : str, optional
        Client certificate and key (mTLS).
    insecure : bool
        Plain-text channel (explicit; development only).
    timeout : float
        Deadline of each call in seconds (``result(wait=True)`` uses ``wait_timeout``).
    retry_budget : float
        Seconds to keep retrying UNAVAILABLE before giving up.
    job : str
        The job this client takes part in: every request carries it (the ``job`` field).
        ``""`` (the default): the server's default job (the one its flags started), or its
        only open job when it has no default job; ``"default"`` names the default job
        explicitly. A server that hosts no job of that id refuses the calls.

    Attributes
    ----------
    job : str
        The ``job`` given (see Parameters).
    job_failure : str or None
        None until a reply said the job is over; then ``""`` when it finished its rounds,
        else why it failed (``--max-failed-rounds`` on the server). Once it is set,
        :meth:`rounds` asks the server nothing more: a server whose job has ended stops
        as soon as every joined client has been told.
    job_id : int or None
        The id of the job this client met first (``RoundInfo.job_id``; None until a reply
        carried one: servers before the field send 0).
    job_replaced : bool
        A later reply carried another job id: the server was restarted into a new job
        (``--on-finished-job new``) before this client was told that its job ended. The job
        this client took part in is over; :meth:`rounds` ends, as at ``job_done``.
    """

    def __init__(
        self,
        target: str,
        client_id: str,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        insecure: bool = False,
        timeout: float = 10.0,
        wait_timeout: float = 60.0,
        retry_budget: float = 60.0,
        backoff: float = 0.1,
        max_backoff: float = 3.0,
        job: str = "",
    ) -> None:
        self.target = target
        self.client_id = client_id
        self.job = job
        self.timeout = timeout
        self.wait_timeout = wait_timeout
        self.retry_budget = retry_budget
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.index: int | None = None
        self.job_failure: str | None = None
        self.job_id: int | None = None
        self.job_replaced = False
        self._finished: dict[int, RoundResult] = {}
        self._metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        options = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                   ("grpc.max_send_message_length", 256 * 1024 * 1024)]
        if insecure:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=Path(tls_ca).read_bytes() if tls_ca else None,
                private_key=Path(tls_key).read_bytes() if tls_key else None,
                certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None,
            )
            self._channel = grpc.secure_channel(target, creds, options=options)
        self._calls = {
            name: self._channel.unary_unary(
                serde.method_path(name), request_serializer=serde.serializer(name),
                response_deserializer=serde.deserializer(name), _registered_method=True)
            for name in ("Join", "GetRound", "Submit", "GetResult")
        }
        self._watch = self._channel.unary_stream(
            serde.method_path("WatchRounds"), request_serializer=serde.serializer("WatchRounds"),
            response_deserializer=serde.deserializer("WatchRounds"), _registered_method=True)
        self._estimators: dict[tuple[str, int, int, int, str, int, int, int], Estimator] = {}

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, name: str, request: Any, timeout: float | None = None,
              retry_deadline: bool = True) -> Any:
        give_up = time.monotonic() + self.retry_budget
        attempt = 0
        retry_on = RETRYABLE + ((grpc.StatusCode.DEADLINE_EXCEEDED,) if retry_deadline else ())
        if name in ("Join", "GetRound", "GetResult"):
            retry_on = READ_RETRYABLE
        while True:
            try:
                return self._calls[name](request, timeout=timeout or self.timeout,
                                         metadata=self._metadata)
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in retry_on or time.monotonic() >= give_up:
                    raise
                pause = random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))
                attempt += 1
                log.debug("[Client.%s]%s %s; retry %d in %.2fs", name, self._job_note, code.name,
                          attempt, pause)
                time.sleep(pause)

    @property
    def _job_note(self) -> str:
        """`` job ID`` for log lines when a job is named, else empty."""
        return f" job {self.job}" if self.job else ""

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> AggregationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API -------------------------------------------------------------------------------
    def join(self, d: int = 0) -> JoinReply:
        """Join; sets :attr:`index` (this client's data shard among the n clients).

        ``d``: the length of this client's vectors, if it wants to say (0: not said). A
        server started with ``--d 0`` takes the first join's d for the job; any server
        refuses a d other than its own (INVALID_ARGUMENT).
        """
        reply: JoinReply = self._call("Join", JoinRequest(self.client_id, d, job=self.job))
        self.index = reply.client_index
        return reply

    def current_round(self) -> RoundInfo:
        """The server's current round."""
        info: RoundInfo = self._call("GetRound", GetRoundRequest(self.client_id, job=self.job))
        if info.job_id:
            if self.job_id is None:
                self.job_id = info.job_id
            elif info.job_id != self.job_id:
                self.job_replaced = True
                return info  # another job's state: not this client's job's end
        if info.job_done:
            self.job_failure = info.job_failure
        return info

    def encode(
        self, rnd: RoundInfo, vectors: ArrayLike, client_seed: int | None = None
    ) -> Submission:
        """Encode ``vectors`` (shape ``(m, d)`` or ``(d,)``) for ``rnd`` with a fresh seed.

        Vector ``j`` is encoded with ``derive_round_seed(client_seed, rnd.nonce,
        client_id, j)``. In evaluation mode the raw vectors ride along as references.
        """
        xs = np.asarray(vectors, dtype=np.float64)
        if xs.ndim == 1:
            xs = xs[None, :]
        if xs.shape != (rnd.m, rnd.d):
            raise ValueError(f"round {rnd.round_id} expects vectors of shape ({rnd.m}, {rnd.d});"
                             f" got {xs.shape}")
        seed = secrets.randbits(64) if client_seed is None else client_seed
        est = self.estimator_for(rnd)
        payloads = []
        for j, x in enumerate(xs):
            enc = est.encode(x, derive_round_seed(seed, rnd.nonce, self.client_id, j))
            ref = x if rnd.eval else None
            if enc.codes is None or enc.scales is None:
                payloads.append(VectorPayload(values=enc.values, indices=enc.indices,
                                              reference=ref))
            elif est.scale_counts is not None:  # blockwise: a scale per block, scale 0
                payloads.append(VectorPayload(
                    values=np.empty(0, np.float32), indices=enc.indices, reference=ref,
                    codes=enc.codes, value_bits=enc.value_bits, scales=enc.scales))
            else:
                payloads.append(VectorPayload(
                    values=np.empty(0, np.float32), indices=enc.indices, reference=ref,
                    codes=enc.codes, value_bits=enc.value_bits, scale=float(enc.scales[0])))
        # the round's own version: it defines this encoding, every later version encodes the
        # round the same way, and a server older than this client speaks it
        return Submission(round_id=rnd.round_id, client_id=self.client_id, client_seed=seed,
                          vectors=tuple(payloads), spec_version=rnd.spec_version or SPEC_VERSION,
                          job=self.job)

    def estimator_for(self, rnd: RoundInfo) -> Estimator:
        """The encoder ``rnd`` announces (scheme, projection, block size, spec version).

        A server from before these fields sends none: its Rand-Proj-Spatial is the SRHT of
        ``rpsagg-seed-v1``. Raises ``ValueError`` when the round needs a wire format this
        client does not speak.
        """
        if rnd.spec_version:
            try:
                check_spec_version(SPEC_VERSION, rnd.spec_version)
            except ValueError:
                raise ValueError(
                    f"round {rnd.round_id} needs wire format {rnd.spec_version!r}; this "
                    f"client speaks {', '.join(SPEC_VERSIONS)}"
                ) from None
        # a round without a projection, from a server before the field, uses the SRHT
        # (schemes without a projection ignore it)
        projection = rnd.projection or "srht"
        key = (rnd.scheme, rnd.n, rnd.k, rnd.d, projection, rnd.block_size, rnd.value_bits,
               rnd.bits)
        est = self._estimators.get(key)
        if est is None:
            est = estimator_from_options(
                rnd.scheme, n=rnd.n, k=rnd.k, d=rnd.d, projection=projection,
                block_size=rnd.block_size, value_bits=rnd.value_bits, bits=rnd.bits,
            )
            self._estimators[key] = est
        return est

    def submit(self, rnd: RoundInfo, vectors: ArrayLike) -> SubmitReply:
        """Encode and submit; returns once the server has durably committed it."""
        return self.submit_encoded(self.encode(rnd, vectors))

    def submit_encoded(self, submission: Submission) -> SubmitReply:
        """Submit an already encoded submission (retries resend identical bytes).

        A submission that names no job is sent for this client's :attr:`job`; one that
        names a job is sent as it is.
        """
        if self.job and not submission.job:
            submission = replace(submission, job=self.job)
        reply: SubmitReply = self._call("Submit", submission)
        return reply

    def result(self, round_id: int = 0, wait: bool = True,
               timeout: float | None = None) -> RoundResult:
        """A round's result; with ``wait`` blocks until it is done or failed."""
        deadline = time.monotonic() + (timeout or self.wait_timeout)
        while True:
            left = max(0.5, deadline - time.monotonic())
            res: RoundResult = self._call(
                "GetResult", GetResultRequest(round_id, wait, self.client_id, job=self.job),
                timeout=min(left, 30.0))
            if res.state in FINISHED:
                self._finished[res.round_id] = res
            if res.job_done:
                # a job ends on a failed round only when it failed as a whole
                self.job_failure = ("" if res.state == RoundState.DONE
                                    else f"its last round failed: {res.reason}")
            if not wait or res.state in FINISHED or time.monotonic() >= deadline:
                return res

    def finished_result(self, round_id: int) -> RoundResult | None:
        """The result of a finished round this client has already fetched, or None (no call)."""
        return self._finished.get(round_id)

    def rounds(self, poll: float = 0.2) -> Iterator[RoundInfo]:
        """Yield each new round this client has not seen, until the server's job is done.

        After a yielded round, the next call waits for that round to finish (the caller
        is expected to submit in between). When it ends, :attr:`job_failure` says whether
        the job finished its rounds.
        """
        seen = 0
        while self.job_failure is None and not self.job_replaced:
            info = self.current_round()
            if info.job_done and seen and seen not in self._finished:
                # the job ended between this client's submission and its next look: fetch
                # the last round's result now, while the server still answers, so the
                # caller can report it (no wait: the round is over; one try, no retries: a
                # server stopping after its drain must not hold this client back)
                try:
                    res: RoundResult = self._calls["GetResult"](
                        GetResultRequest(seen, False, self.client_id, job=self.job),
                        timeout=self.timeout, metadata=self._metadata)
                except grpc.RpcError:
                    return
                if res.state in FINISHED:
                    self._finished[res.round_id] = res
            if info.job_done or self.job_replaced:
                return
            if info.round_id > seen and info.state in ACCEPTING:
                seen = info.round_id
                yield info
            elif info.round_id:
                self.result(info.round_id, wait=True)  # sets job_failure at the job's end
            else:
                time.sleep(poll)

    def watch(self) -> Iterator[RoundEvent]:
        """Stream round events (no deadline; ends after the event with ``job_done``).

        The call starts at once; its first event is the current round's state at the
        moment of subscription, so every later transition is guaranteed to be seen. A
        stream broken by UNAVAILABLE or CANCELLED, or ended by the server before the job
        is done, is re-opened (backoff as for calls, ``retry_budget`` seconds per outage);
        the re-opened stream starts again with the current state, so an event may repeat.
        """
        first = self._watch(WatchRequest(self.client_id, job=self.job), metadata=self._metadata)
        return self._watch_events(first)

    def _watch_events(self, stream: Iterator[RoundEvent]) -> Iterator[RoundEvent]:
        give_up: float | None = None  # end of the retry budget of the current outage
        attempt = 0
        while True:
            err: grpc.RpcError | None = None
            try:
                for ev in stream:
                    give_up, attempt = None, 0
                    yield ev
                    if ev.job_done:
                        return
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                err = exc
            now = time.monotonic()
            give_up = now + self.retry_budget if give_up is None else give_up
            if now >= give_up:
                if err is not None:
                    raise err
                return
            pause = random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))
            attempt += 1
            log.debug("[Client.WatchRounds]%s %s; re-open %d in %.2fs", self._job_note,
                      "ended" if err is None else err.code().name, attempt, pause)
            time.sleep(pause)
            stream = self._watch(WatchRequest(self.client_id, job=self.job),
                                 metadata=self._metadata)
