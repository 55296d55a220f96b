"""What a request must be to be admitted: a well-formed client id, the client its token
belongs to, and a submission that fits its round (wire format version, shape, content).

Each check raises the :mod:`rpsagg_server.domain.errors` refusal that says why; the admission
(:mod:`rpsagg_server.rounds.submissions`) and the servicer call them.
"""

from __future__ import annotations

import math

import numpy as np

from rpsagg import SPEC_VERSIONS, check_spec_version
from rpsagg.schemes import WireProfile
from rpsagg.spec import SpecTooOld, UnknownSpecVersion
from rpsagg_server.domain.errors import Forbidden, InvalidRequest, PreconditionFailed
from rpsagg_server.settings.serverconfig import ServerConfig
from rpsagg_wire.v1.serde import Submission

__all__ = ["MAX_CLIENT_ID", "check_bound", "check_client_id", "check_submission_spec",
           "validate_submission"]

MAX_CLIENT_ID = 128


def check_client_id(client_id: str) -> None:
    """Client ids are 1..128 characters of ``[A-Za-z0-9._-]``."""
    ok = 1 <= len(client_id) <= MAX_CLIENT_ID and all(
        ch.isascii() and (ch.isalnum() or ch in "._-") for ch in client_id
    )
    if not ok:
        raise InvalidRequest(
            f"client_id must be 1..{MAX_CLIENT_ID} characters of [A-Za-z0-9._-]; "
            f"got {client_id!r}")


def check_bound(bound: str | None, client_id: str) -> None:
    """Refuse (:class:`~rpsagg_server.domain.errors.Forbidden`) a request naming another client
    than ``bound``, the client its token belongs to (None: a token for any client, or no
    tokens)."""
    if bound is not None and bound != client_id:
        raise Forbidden(
            f"this token belongs to client {bound!r}, not {client_id!r}")


def check_submission_spec(sub: Submission, wire: WireProfile) -> None:
    """Refuse a submission encoded with a wire format that cannot describe this round.

    ``wire``: the round's messages; their ``spec_version`` is the round's (the least version
    that defines what the round uses, :data:`rpsagg.spec.FEATURE_SPEC`). A version the
    server does not speak is an invalid request (the message names the versions it speaks); a
    known version older than the round's (e.g. ``rpsagg-seed-v1`` for a round of the
    randomized DCT) is a failed precondition, naming what needs the round's version
    (:attr:`~rpsagg.schemes.WireProfile.spec_reason`: the projection, quantized values,
    quantized blockwise values). No ``spec_version`` (a client from before the field)
    counts as ``rpsagg-seed-v1``.
    """
    try:
        check_spec_version(sub.spec_version, wire.spec_version)
    except SpecTooOld as exc:
        raise PreconditionFailed(f"submission {exc}; {wire.spec_reason} "
                                 "(see RoundInfo.spec_version)") from None
    except UnknownSpecVersion:
        raise InvalidRequest(
            f"submission encoded with spec version {sub.spec_version!r}, which "
            f"this server does not speak; it speaks {', '.join(SPEC_VERSIONS)}"
            ) from None


def validate_submission(sub: Submission, cfg: ServerConfig, m: int, wire: WireProfile) -> None:
    """Check the shape and content of a submission against the job; raises
    :class:`~rpsagg_server.domain.errors.InvalidRequest`.

    Each vector is checked against the round's :class:`~rpsagg.schemes.WireProfile` (its
    estimator's :attr:`~rpsagg.Estimator.wire`, built once per admission pass); the
    evaluation references against the configuration."""
    if len(sub.vectors) != m:
        raise InvalidRequest(f"expected m={m} vector(s) per submission for task {cfg.task!r}; "
                             f"got {len(sub.vectors)}")
    for j, v in enumerate(sub.vectors):
        try:
            wire.validate(v, f"vectors[{j}]")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        if cfg.eval:
            if v.reference is None:
                raise InvalidRequest(f"vectors[{j}] lacks its reference vector (the server "
                                     "runs in evaluation mode)")
            if v.reference.size != cfg.d:
                raise InvalidRequest(f"vectors[{j}].reference has {v.reference.size} values; "
                                     f"expected d={cfg.d}")
            if not np.all(np.isfinite(v.reference)):
                raise InvalidRequest(f"vectors[{j}].reference contains NaN or Inf")
            with np.errstate(over="ignore"):
                norm2 = float(np.add.reduce(np.square(v.reference)))  # no BLAS threads
            if not math.isfinite(norm2):  # 1e200 is finite, its square is not
                raise InvalidRequest(f"vectors[{j}].reference has a squared norm that overflows "
                                     "float64; the evaluation could not use it")
        elif v.reference is not None:
            raise InvalidRequest(f"vectors[{j}] carries a reference vector but the server is "
                                 "not in evaluation mode")
