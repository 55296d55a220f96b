"""``GET /api/rounds/{id}/estimate``: a done round's decoded mean, as JSON, ``.npy`` or CSV.

The body is streamed in chunks of :data:`CHUNK` values, so a large d is never built as one
string in memory. Every format carries the same numbers bit for bit: ``.npy`` holds the
float64 values themselves, JSON and CSV each value's shortest round-trip decimal (Python's
``repr``), which parses back to the identical float64. The shape is ``(d,)`` for one vector
per round and ``(m, d)`` for m (``--mean-vectors``); CSV has one vector per line, the format
``rpsagg-client --vectors`` reads.

Provenance (the round, n', scheme, transform, n, k, d, bytes received) is in the JSON
document and, for every format, in ``X-Rpsagg-*`` response headers.

A round whose estimate left the server's bounded cache (``--result-cache-bytes``) is read
back from the database in the worker thread that serves the request; a failed read is
answered 503 with the reason.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import StreamingResponse
from numpy.typing import NDArray

from rpsagg_server.http.deps import StateDep
from rpsagg_server.store import ReadError
from rpsagg_server.views import EstimateView

router = APIRouter(prefix="/api/rounds", tags=["rounds"])

#: values per streamed chunk (512 KiB of float64)
CHUNK = 1 << 16
MEDIA = {"json": "application/json", "npy": "application/octet-stream",
         "csv": "text/csv; charset=utf-8"}


def provenance(est: EstimateView) -> dict[str, Any]:
    """What the estimate came from, as the JSON document's leading fields."""
    m, d = est.values.shape
    return {
        "round_id": est.round_id, "scheme": est.scheme, "transform": est.transform,
        "n": est.n, "n_prime": est.n_prime, "k": est.k, "d": est.d, "m": m,
        "bytes": {"wire": est.wire_bytes, "payload": est.payload_bytes},
        "contributors": list(est.contributors),
        "shape": [d] if m == 1 else [m, d],
    }


def _headers(est: EstimateView, fmt: str) -> dict[str, str]:
    return {
        "Content-Disposition":
            f'attachment; filename="rpsagg-round-{est.round_id}-estimate.{fmt}"',
        "X-Rpsagg-Round": str(est.round_id), "X-Rpsagg-N-Prime": str(est.n_prime),
        "X-Rpsagg-Scheme": est.scheme, "X-Rpsagg-Transform": est.transform,
        "X-Rpsagg-N": str(est.n), "X-Rpsagg-K": str(est.k), "X-Rpsagg-D": str(est.d),
        "X-Rpsagg-Wire-Bytes": str(est.wire_bytes),
        "X-Rpsagg-Payload-Bytes": str(est.payload_bytes),
        "Cache-Control": "no-cache",
    }


def _chunks(row: NDArray[np.float64]) -> Iterator[NDArray[np.float64]]:
    for lo in range(0, row.size, CHUNK):
        yield row[lo:lo + CHUNK]


def _decimal(chunk: NDArray[np.float64], null: str) -> str:
    """Comma-separated shortest round-trip decimals (``null`` for NaN or an infinity)."""
    values = chunk.tolist()
    if not bool(np.all(np.isfinite(chunk))):
        return ",".join(repr(x) if math.isfinite(x) else null for x in values)
    return ",".join(map(repr, values))


def npy_stream(values: NDArray[np.float64]) -> Iterator[bytes]:
    """An ``.npy`` file (format 1.0, little-endian float64), header first, then the data."""
    m, d = values.shape
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {
        "descr": "<f8", "fortran_order": False, "shape": (d,) if m == 1 else (m, d)})
    yield head.getvalue()
    for row in values:
        for chunk in _chunks(row):
            yield np.ascontiguousarray(chunk, dtype="<f8").tobytes()


def json_stream(est: EstimateView) -> Iterator[bytes]:
    """The provenance fields, then ``"estimate"``: a list of d numbers (of m lists when
    m > 1); a value that is not finite is ``null``."""
    head = json.dumps(provenance(est), separators=(",", ":"))
    m = est.values.shape[0]
    yield (head[:-1] + ',"estimate":' + ("[" if m == 1 else "[[")).encode()
    for j, row in enumerate(est.values):
        if j:
            yield b"],["
        for i, chunk in enumerate(_chunks(row)):
            yield ((b"," if i else b"") + _decimal(chunk, "null").encode())
    yield b"]}" if m == 1 else b"]]}"


def csv_stream(values: NDArray[np.float64]) -> Iterator[bytes]:
    """One line per vector slot, d comma-separated values (``nan``/``inf`` as Python
    writes them, which ``rpsagg-client --vectors`` refuses)."""
    for row in values:
        for i, chunk in enumerate(_chunks(row)):
            yield ((b"," if i else b"") + _decimal(chunk, "nan").encode())
        yield b"\n"


@router.get(
    "/{round_id}/estimate", summary="A done round's estimate (JSON, .npy or CSV)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {MEDIA["json"]: {}, MEDIA["npy"]: {}, "text/csv": {}},
              "description": "The estimate; provenance in the X-Rpsagg-* headers (and in "
              "the JSON document)"},
        404: {"description": "No round with this id"},
        409: {"description": "The round has no estimate (not finished, or failed)"},
        503: {"description": "The estimate could not be read back from the database"},
    })
def get_estimate(
    state: StateDep,
    round_id: Annotated[int, Path(ge=1, description="Round id (rounds count from 1).")],
    format: Annotated[Literal["json", "npy", "csv"], Query(
        description="json (default): provenance and the values; npy: a NumPy .npy file; "
        "csv: one vector per line.")] = "json",
) -> StreamingResponse:
    """The decoded mean of a done round, streamed in chunks, with what it came from: n'
    (clients decoded), scheme, transform, n, k, d and the bytes received. Shape ``(d,)``,
    or ``(m, d)`` for m vectors per round. Every format gives the same float64 values."""
    try:
        est = state.estimate(round_id)  # an evicted round's is read from the database
    except ReadError as exc:
        raise HTTPException(503, f"round {round_id}'s estimate could not be read back: "
                            f"{exc.reason}") from None
    if est is None:
        view = state.round_detail(round_id)
        if view is None:
            newest = state.rounds(limit=1)
            known = (f"rounds 1..{newest[0].round_id} exist" if newest
                     else "no round exists yet")
            raise HTTPException(404, f"round {round_id} not found ({known})")
        why = (f"failed ({view.reason})" if view.state == "failed"
               else f"is {view.state}; it has no estimate until it is done")
        raise HTTPException(409, f"round {round_id} {why}")
    body = (json_stream(est) if format == "json" else npy_stream(est.values)
            if format == "npy" else csv_stream(est.values))
    return StreamingResponse(body, media_type=MEDIA[format], headers=_headers(est, format))
