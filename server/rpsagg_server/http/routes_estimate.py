"""``GET /api/rounds/{id}/estimate``: a done round's decoded mean, as JSON, ``.npy`` or CSV.

Every format carries the same numbers bit for bit (:mod:`rpsagg_server.http.estimatebodies`):
``.npy`` the float64 values, JSON and CSV each value's shortest round-trip decimal. The
shape is ``(d,)`` for one vector per round and ``(m, d)`` for m (``--mean-vectors``); CSV
has one vector per line, the format ``rpsagg-client --vectors`` reads.

Provenance (the round, n', scheme, projection, block size (0: one transform), value bits
(32: float32 values), transform, n, k, d, m, shape, bytes received, contributors) is in the
JSON document and, for every format, in ``X-Rpsagg-*`` response headers (the contributors'
ids, comma-separated, when they take at most :data:`CONTRIBUTORS_HEADER_MAX` bytes; k is 0
for schemes that take none).

``.npy`` is streamed from the values in chunks. JSON and CSV bodies are formatted once per
round and format in a worker process and kept on disk within ``--http-body-cache-bytes``
(:mod:`rpsagg_server.http.renders`), so concurrent downloads neither repeat that work nor
take the event loop's time from gRPC; they carry a ``Content-Length``. When too many
distinct bodies wait to be formatted, a download is answered 503 with ``Retry-After``; a
failed render is 503 with its reason.

A round whose estimate left the server's bounded cache (``--result-cache-bytes``) is read
back from the database in a worker thread; a failed read is answered 503 with the reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, BinaryIO, Literal

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import StreamingResponse
from numpy.typing import NDArray
from starlette.concurrency import run_in_threadpool

from rpsagg_server.http.deps import StateDep
from rpsagg_server.http.estimatebodies import CHUNK, csv_stream, json_stream, npy_stream
from rpsagg_server.http.renders import BodyCache, RenderBusy, RenderError
from rpsagg_server.readmodel.state import ServerState
from rpsagg_server.readmodel.views import EstimateInfo, EstimateView
from rpsagg_server.store.database import ReadError
from rpsagg_wire.v1.messages import RoundState

__all__ = ["CHUNK", "csv_stream", "json_stream", "npy_stream", "provenance", "router"]

router = APIRouter(prefix="/api/rounds", tags=["rounds"])

MEDIA = {"json": "application/json", "npy": "application/octet-stream",
         "csv": "text/csv; charset=utf-8"}
#: bytes per read of a rendered body
READ_BYTES = 1 << 18
#: the longest ``X-Rpsagg-Contributors`` sent (longer lists are in the JSON document only)
CONTRIBUTORS_HEADER_MAX = 4096
#: seconds a refused download is told to wait (``Retry-After``)
RETRY_AFTER_S = 2


def provenance(est: EstimateInfo, m: int) -> dict[str, Any]:
    """What the estimate came from, as the JSON document's leading fields."""
    return {
        "round_id": est.round_id, "scheme": est.scheme, "projection": est.projection,
        "block_size": est.block_size, "value_bits": est.value_bits, "transform": est.transform,
        "n": est.n, "n_prime": est.n_prime, "k": est.k, "d": est.d, "m": m,
        "bytes": {"wire": est.wire_bytes, "payload": est.payload_bytes},
        "contributors": list(est.contributors),
        "shape": [est.d] if m == 1 else [m, est.d],
    }


def _headers(est: EstimateInfo, fmt: str) -> dict[str, str]:
    contributors = ",".join(est.contributors)  # ids are [A-Za-z0-9._-]
    return {
        "X-Rpsagg-M": str(est.m),
        "X-Rpsagg-Shape": str(est.d) if est.m == 1 else f"{est.m},{est.d}",
        "X-Rpsagg-Projection": est.projection,
        "X-Rpsagg-Block-Size": str(est.block_size), "X-Rpsagg-Value-Bits": str(est.value_bits),
        **({"X-Rpsagg-Contributors": contributors}
           if len(contributors) <= CONTRIBUTORS_HEADER_MAX else {}),
        "Content-Disposition":
            f'attachment; filename="rpsagg-round-{est.round_id}-estimate.{fmt}"',
        "X-Rpsagg-Round": str(est.round_id), "X-Rpsagg-N-Prime": str(est.n_prime),
        "X-Rpsagg-Scheme": est.scheme, "X-Rpsagg-Transform": est.transform,
        "X-Rpsagg-N": str(est.n), "X-Rpsagg-K": str(est.k), "X-Rpsagg-D": str(est.d),
        "X-Rpsagg-Wire-Bytes": str(est.wire_bytes),
        "X-Rpsagg-Payload-Bytes": str(est.payload_bytes),
        "Cache-Control": "no-cache",
    }


def _read(state: ServerState, round_id: int) -> EstimateView:
    """The round's estimate with its values (read back from the database when evicted)."""
    try:
        est = state.estimate(round_id)
    except ReadError as exc:
        raise HTTPException(503, f"round {round_id}'s estimate could not be read back: "
                            f"{exc.reason}") from None
    if est is None:  # it was there a moment ago; a new job replaced the state
        raise HTTPException(404, f"round {round_id} has no estimate any more")
    return est


def _missing(state: ServerState, round_id: int) -> HTTPException:
    view = state.round_detail(round_id)
    if view is None:
        newest = state.rounds(limit=1)
        known = f"rounds 1..{newest[0].round_id} exist" if newest else "no round exists yet"
        return HTTPException(404, f"round {round_id} not found ({known})")
    why = (f"failed ({view.reason})" if view.state == RoundState.FAILED
           else f"is {view.state}; it has no estimate until it is done")
    return HTTPException(409, f"round {round_id} {why}")


async def _file_chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    """A rendered body's bytes, read in worker threads; the file closed at the end (or
    when the client goes away)."""
    try:
        while chunk := await anyio.to_thread.run_sync(f.read, READ_BYTES):
            yield chunk
    finally:
        f.close()


def bodies(request: Request) -> BodyCache:
    """The app's :class:`BodyCache` (made at the first use)."""
    cache: BodyCache | None = getattr(request.app.state, "bodies", None)
    if cache is None:
        raise RuntimeError("the app has no body cache (create_app makes it)")
    return cache


@router.get(
    "/{round_id}/estimate", summary="A done round's estimate (JSON, .npy or CSV)",
    response_class=StreamingResponse,
    responses={
        200: {"content": {MEDIA["json"]: {}, MEDIA["npy"]: {}, "text/csv": {}},
              "description": "The estimate; provenance in the X-Rpsagg-* headers (and in "
              "the JSON document)"},
        404: {"description": "No round with this id"},
        409: {"description": "The round has no estimate (not finished, or failed)"},
        503: {"description": "The estimate could not be read back from the database or "
              "formatted, or too many bodies are being formatted (then with Retry-After)"},
    })
async def get_estimate(
    request: Request,
    state: StateDep,
    round_id: Annotated[int, Path(ge=1, description="Round id (rounds count from 1).")],
    format: Annotated[Literal["json", "npy", "csv"], Query(
        description="json (default): provenance and the values; npy: a NumPy .npy file; "
        "csv: one vector per line.")] = "json",
) -> StreamingResponse:
    """The decoded mean of a done round, with what it came from: n' (clients decoded),
    scheme, projection, block size, value bits, transform, n, k, d, m and the bytes
    received. Shape ``(d,)``, or ``(m, d)``
    for m vectors per round. Every format gives the same float64 values."""
    info = state.estimate_info(round_id)
    if info is None:
        raise _missing(state, round_id)
    headers = _headers(info, format)
    if format == "npy":
        est = await run_in_threadpool(_read, state, round_id)
        return StreamingResponse(npy_stream(est.values), media_type=MEDIA[format],
                                 headers=headers)

    def load() -> tuple[dict[str, Any], NDArray[np.float64]]:
        est = _read(state, round_id)
        return provenance(est, est.values.shape[0]), est.values

    try:
        f, size = await bodies(request).open(round_id, format, load,
                                             job=getattr(request.app.state, "job", ""))
    except RenderBusy as exc:
        raise HTTPException(503, f"{exc}; try again shortly",
                            headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except RenderError as exc:
        raise HTTPException(503, f"round {round_id}'s {format} body could not be formatted: "
                            f"{exc.reason}") from None
    headers["Content-Length"] = str(size)
    return StreamingResponse(_file_chunks(f), media_type=MEDIA[format], headers=headers)
