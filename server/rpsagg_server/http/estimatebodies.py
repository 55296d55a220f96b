"""A done round's estimate as a download body: ``.npy``, JSON or CSV, in byte chunks.

Every format carries the same numbers bit for bit: ``.npy`` holds the float64 values
themselves, JSON and CSV each value's shortest round-trip decimal (Python's ``repr``), which
parses back to the identical float64. The values are ``(m, d)``: one row per vector slot.
The ``.npy`` shape is ``(d,)`` for m = 1, else ``(m, d)``; JSON's ``"estimate"`` a list of d
numbers (of m lists when m > 1), a value that is not finite ``null``; CSV one line per
vector slot (``nan``/``inf`` as Python writes them, which ``rpsagg-client --vectors``
refuses).

Formatting decimals is the expensive part (about 0.4 s per 2^20 values, holding the
interpreter lock), so the server runs :func:`write_body` in a worker process
(:mod:`rpsagg_server.http.renders`); this module needs nothing but NumPy, so that process
starts light.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: values per chunk (512 KiB of float64)
CHUNK = 1 << 16
#: the formats :func:`write_body` writes (``npy`` is cheap and streamed directly)
DECIMAL_FORMATS = ("json", "csv")


def _chunks(row: NDArray[np.float64]) -> Iterator[NDArray[np.float64]]:
    for lo in range(0, row.size, CHUNK):
        yield row[lo:lo + CHUNK]


def decimals(chunk: NDArray[np.float64], null: str) -> bytes:
    """Comma-separated shortest round-trip decimals (``null`` for NaN or an infinity)."""
    values = chunk.tolist()
    if not bool(np.all(np.isfinite(chunk))):
        return ",".join(repr(x) if math.isfinite(x) else null for x in values).encode()
    return ",".join(map(repr, values)).encode()


def npy_stream(values: NDArray[np.float64]) -> Iterator[bytes]:
    """An ``.npy`` file (format 1.0, little-endian float64), header first, then the data.

    Parameters
    ----------
    values : ndarray, shape (m, d)
        The estimate.

    Yields
    ------
    bytes
        The header, then at most :data:`CHUNK` values per piece.
    """
    m, d = values.shape
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {
        "descr": "<f8", "fortran_order": False, "shape": (d,) if m == 1 else (m, d)})
    yield head.getvalue()
    for row in values:
        for chunk in _chunks(row):
            yield np.ascontiguousarray(chunk, dtype="<f8").tobytes()


def json_stream(head: dict[str, Any], values: NDArray[np.float64]) -> Iterator[bytes]:
    """A JSON document: the fields of ``head``, then ``"estimate"``.

    Parameters
    ----------
    head : dict
        The leading fields (the round's provenance), in order.
    values : ndarray, shape (m, d)
        The estimate.

    Yields
    ------
    bytes
        Pieces of at most :data:`CHUNK` values each, besides the head.
    """
    text = json.dumps(head, separators=(",", ":"))
    m = values.shape[0]
    yield ((text[:-1] + ("," if head else "")) + '"estimate":' + ("[" if m == 1 else "[[")).encode()
    for j, row in enumerate(values):
        if j:
            yield b"],["
        for i, chunk in enumerate(_chunks(row)):
            yield (b"," if i else b"") + decimals(chunk, "null")
    yield b"]}" if m == 1 else b"]]}"


def csv_stream(values: NDArray[np.float64]) -> Iterator[bytes]:
    """One line per vector slot, d comma-separated values.

    Parameters
    ----------
    values : ndarray, shape (m, d)
        The estimate.

    Yields
    ------
    bytes
        Pieces of at most :data:`CHUNK` values each, and the line ends.
    """
    for row in values:
        for i, chunk in enumerate(_chunks(row)):
            yield (b"," if i else b"") + decimals(chunk, "nan")
        yield b"\n"


def write_body(path: str, fmt: str, head: dict[str, Any], values: NDArray[np.float64]) -> int:
    """Write the ``fmt`` body (``json`` or ``csv``) of an estimate to ``path``.

    The body is written to ``path + ".part"`` and renamed into place, so ``path`` exists
    only complete. Raises ``OSError`` when the write fails (the partial file removed).

    Parameters
    ----------
    path : str
        Where the body goes.
    fmt : {"json", "csv"}
        The format.
    head : dict
        The JSON document's leading fields (unused for CSV).
    values : ndarray, shape (m, d)
        The estimate.

    Returns
    -------
    int
        The body's size in bytes.
    """
    if fmt not in DECIMAL_FORMATS:
        raise ValueError(f"no decimal body format {fmt!r}; one of {DECIMAL_FORMATS}")
    part = path + ".part"
    size = 0
    try:
        with open(part, "wb") as f:
            for piece in json_stream(head, values) if fmt == "json" else csv_stream(values):
                f.write(piece)
                size += len(piece)
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return size
