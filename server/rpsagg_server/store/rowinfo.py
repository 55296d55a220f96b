"""A round row's ``info`` column, typed: what a round row holds besides its arrays.

:class:`RowInfo` (with :class:`ArchivedSummary` and :class:`DecodeMetrics`) is the one place
the column's JSON is written (:meth:`RowInfo.to_json`) and read (:meth:`RowInfo.from_json`).
Every key is present in a row of the current schema version; rows of older versions are
brought to this shape by :mod:`rpsagg_server.store.migrations`, so reading has no fallbacks for
them. A NaN float is stored as ``null`` (JSON has no NaN) and read back as NaN.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from rpsagg_server.readmodel.views import EstimatedError

#: the keys of a decoded round's metrics (all present, or none: a round not decoded)
DECODE_KEYS = ("n_prime", "beta", "c", "seconds", "r_hat", "eval_errors", "shape",
               "estimated_error")


@dataclass(frozen=True)
class ArchivedSummary:
    """A finished round's submissions summed up (its payloads are not read back).

    Attributes
    ----------
    contributors : tuple of (str, int)
        ``(client_id, client_seed)`` of every committed submission.
    payload_bytes, wire_bytes : int
        Seeds, values and indices received; serialized Submit requests received.
    m : int
        Vectors per submission.
    arrivals : tuple of (str, float, int, int)
        ``(client_id, received_at, wire_bytes, payload_bytes)`` in commit order.
    """

    contributors: tuple[tuple[str, int], ...]
    payload_bytes: int
    wire_bytes: int
    m: int
    arrivals: tuple[tuple[str, float, int, int], ...]


@dataclass(frozen=True)
class DecodeMetrics:
    """What a decoded round's decode produced besides its estimate.

    Attributes
    ----------
    n_prime : int
    beta, c, seconds, r_hat : float
        ``c`` and ``r_hat`` are NaN where the scheme has none.
    eval_errors : tuple of float or None
        The figures of :class:`~rpsagg_server.readmodel.views.EvalErrors` (three in rows written
        before ``||x_bar||^2`` was recorded, four since), or None outside evaluation mode.
    shape : tuple of int
        The estimate's ``(m, d)``.
    estimated_error : EstimatedError or None
    """

    n_prime: int
    beta: float
    c: float
    seconds: float
    r_hat: float
    eval_errors: tuple[float, ...] | None
    shape: tuple[int, ...]
    estimated_error: EstimatedError | None


@dataclass(frozen=True)
class RowInfo:
    """A round row's timestamps, budget, priors, summary and metrics.

    Attributes
    ----------
    first_at, deadline, closed_at, finished_at : float or None
        Unix seconds (None until they happen).
    k, value_bits : int
        The round's values per client and bits per value.
    r_priors : tuple of (float or None), or None
        ``transform=auto``: each vector slot's correlation prior; else None.
    archived : ArchivedSummary or None
        A finished round's summary (None until it finishes).
    decoded : DecodeMetrics or None
        A decoded round's metrics (None for a round without an estimate).
    """

    first_at: float | None
    deadline: float | None
    closed_at: float | None
    finished_at: float | None
    k: int
    value_bits: int
    r_priors: tuple[float | None, ...] | None = None
    archived: ArchivedSummary | None = None
    decoded: DecodeMetrics | None = None

    def to_json(self) -> str:
        """The ``info`` column's text."""
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of :meth:`to_json` (every key of the current version)."""
        out: dict[str, Any] = {
            "first_at": self.first_at, "deadline": self.deadline,
            "closed_at": self.closed_at, "finished_at": self.finished_at,
            "k": self.k, "value_bits": self.value_bits,
            "r_priors": None if self.r_priors is None else list(self.r_priors),
            "archived": None if self.archived is None else _archived_dict(self.archived),
        }
        if self.decoded is not None:
            out.update(_decoded_dict(self.decoded))
        return out

    @classmethod
    def from_json(cls, text: str) -> RowInfo:
        """Read an ``info`` column of the current version; raises ``ValueError`` (or
        ``KeyError``, ``TypeError``) for one that is not."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RowInfo:
        """:meth:`from_json` of an already parsed object."""
        if not isinstance(d, dict):
            raise ValueError(f"a round's info must be a JSON object; got {type(d).__name__}")
        priors = d["r_priors"]
        return cls(
            first_at=_opt_float(d["first_at"]), deadline=_opt_float(d["deadline"]),
            closed_at=_opt_float(d["closed_at"]), finished_at=_opt_float(d["finished_at"]),
            k=int(d["k"]), value_bits=int(d["value_bits"]),
            r_priors=None if priors is None else tuple(_opt_float(p) for p in priors),
            archived=None if d["archived"] is None else _archived(d["archived"]),
            decoded=_decoded(d) if "n_prime" in d else None,
        )


def _archived_dict(a: ArchivedSummary) -> dict[str, Any]:
    return {"contributors": [[c, str(seed)] for c, seed in a.contributors],
            "payload_bytes": a.payload_bytes, "wire_bytes": a.wire_bytes, "m": a.m,
            "arrivals": [list(x) for x in a.arrivals]}


def _archived(d: dict[str, Any]) -> ArchivedSummary:
    return ArchivedSummary(
        contributors=tuple((str(c), int(seed)) for c, seed in d["contributors"]),
        payload_bytes=int(d["payload_bytes"]), wire_bytes=int(d["wire_bytes"]), m=int(d["m"]),
        arrivals=tuple((str(c), float(t), int(w), int(p)) for c, t, w, p in d["arrivals"]))


def _decoded_dict(o: DecodeMetrics) -> dict[str, Any]:
    e = o.estimated_error
    return {
        "n_prime": o.n_prime, "beta": o.beta, "c": _json_float(o.c), "seconds": o.seconds,
        "r_hat": _json_float(o.r_hat),
        "eval_errors": None if o.eval_errors is None else list(o.eval_errors),
        "shape": list(o.shape),
        "estimated_error": None if e is None else [
            _json_float(e.squared_error), _json_float(e.squared_error_stderr),
            _json_float(e.mean_norm_squared), e.method],
    }


def _decoded(d: dict[str, Any]) -> DecodeMetrics:
    missing = [k for k in DECODE_KEYS if k not in d]
    if missing:
        raise KeyError(f"a decoded round's info lacks {', '.join(missing)}")
    ev, se = d["eval_errors"], d["estimated_error"]
    return DecodeMetrics(
        n_prime=int(d["n_prime"]), beta=float(d["beta"]), c=_nan_float(d["c"]),
        seconds=float(d["seconds"]), r_hat=_nan_float(d["r_hat"]),
        eval_errors=None if ev is None else tuple(float(x) for x in ev),
        shape=tuple(int(x) for x in d["shape"]),
        estimated_error=None if se is None else EstimatedError(
            _nan_float(se[0]), _nan_float(se[1]), _nan_float(se[2]), str(se[3])),
    )


def _json_float(x: float) -> float | None:
    return None if math.isnan(x) else x


def _nan_float(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _opt_float(x: float | None) -> float | None:
    return None if x is None else float(x)
