"""Reading the user's vectors, checked: ``.npy`` and ``.npz`` files, text files and text
lines (the formats: :mod:`rpsagg_client.vectors`).

Every loader gives a ``(rounds, m, d)`` (or ``(lines, 1, d)``) float64 array whose values
are finite, within float32's range, and whose vectors' norms are too; every problem is a
:class:`VectorError` whose message is one line naming the file and the line or index.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
FLOAT32_MAX = float(np.finfo(np.float32).max)
# a number as text, ASCII only: Python's float() also takes "1_000", full-width and other
# scripts' digits, which a CSV file should not silently hold
_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                     r"|inf|infinity|nan)", re.IGNORECASE | re.ASCII)


class VectorError(ValueError):
    """Bad or missing input vectors; the message is one line naming the file and where."""


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _python_number(text: str) -> bool:
    """Whether Python's ``float`` reads ``text`` (which the ASCII forms do not cover)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_bad(a: FloatArray) -> tuple[int, ...] | None:
    """The index of the first NaN or infinity of ``a`` (None when all are finite)."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), a.shape))


def _first_huge(a: FloatArray) -> tuple[int, ...] | None:
    """The index of the first value beyond float32's range (None when all are within)."""
    huge = np.abs(a) > FLOAT32_MAX
    if not huge.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(huge)), a.shape))


def _first_long(a: FloatArray) -> tuple[tuple[int, ...], float] | None:
    """The index (all axes but the last) and norm of the first vector of ``a`` whose
    Euclidean norm is beyond float32's range (values within it: the squares fit float64)."""
    norms = np.sqrt(np.sum(np.square(a), axis=-1))
    long = norms > FLOAT32_MAX
    if not long.any():
        return None
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(long)), norms.shape))
    return at, float(norms[at])


def _long_message(norm: float) -> str:
    return (f"the vector's norm {norm:g} is beyond float32's largest finite value "
            f"{FLOAT32_MAX:.8g} (a rotation can put all of it in one sent float32 value); "
            "scale the vectors down")


def _huge_message(value: float) -> str:
    return (f"{value:g} is beyond float32's largest finite value {FLOAT32_MAX:.8g} (values "
            "are sent as float32)")


def _where(index: tuple[int, ...], ndim: int) -> str:
    """``index 17`` / ``row 4, index 17`` / ``round 4, vector 1, index 17`` (0-based)."""
    names = {1: ("index",), 2: ("row", "index"), 3: ("round", "vector", "index")}[ndim]
    return ", ".join(f"{n} {i}" for n, i in zip(names, index, strict=True))


def _as_rounds(name: str, raw: np.ndarray) -> FloatArray:
    """A loaded array as ``(rounds, m, d)`` float64, checked: real numbers, finite, 1-3 axes."""
    if raw.dtype.kind not in "fiub":
        raise VectorError(f"{name}: holds {raw.dtype} values; expected real numbers")
    if not 1 <= raw.ndim <= 3:
        raise VectorError(f"{name}: has shape {raw.shape}; expected (d,), (rounds, d) or "
                          "(rounds, m, d)")
    if 0 in raw.shape:
        raise VectorError(f"{name}: is empty (shape {raw.shape})")
    a = np.asarray(raw, dtype=np.float64)
    bad = _first_bad(a)
    if bad is not None:
        raise VectorError(f"{name}: {a[bad]} at {_where(bad, a.ndim)}; every value must be "
                          "finite")
    huge = _first_huge(a)
    if huge is not None:
        raise VectorError(f"{name}: at {_where(huge, a.ndim)}, {_huge_message(a[huge])}")
    long = _first_long(a)
    if long is not None:
        names = ("row",) if a.ndim == 2 else ("round", "vector")
        at = "".join(f", {n} {i}" for n, i in zip(names, long[0], strict=False))
        raise VectorError(f"{name}{at}: {_long_message(long[1])}")
    if a.ndim == 1:  # (d,): one round
        return a[None, None, :]
    return a[:, None, :] if a.ndim == 2 else a  # (rounds, d): one vector per round


def _npy_truncation(name: str, fp: IO[bytes], total: int) -> VectorError | None:
    """Why an ``.npy`` is short (None when its data is complete): header vs bytes present."""
    try:
        version = np.lib.format.read_magic(fp)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(fp) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(fp))
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        return VectorError(f"{name}: not a readable .npy file ({_one_line(exc)})")
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = total - fp.tell()
    if have >= want:
        return None
    count = have // max(1, dtype.itemsize)
    where = (_where(tuple(int(i) for i in np.unravel_index(count, shape)), len(shape))
             if 1 <= len(shape) <= 3 else f"flat index {count}")
    return VectorError(f"{name}: truncated .npy: the header announces shape {shape} "
                       f"({want} bytes of data) but the file holds {have}; it ends at "
                       f"{where}")


def load_npy(path: Path) -> FloatArray:
    """An ``.npy`` file as ``(rounds, m, d)``."""
    name = str(path)
    with path.open("rb") as fp:
        short = _npy_truncation(name, fp, path.stat().st_size)
        if short is not None:
            raise short
        fp.seek(0)
        try:
            raw = np.load(fp, allow_pickle=False)
        except (ValueError, EOFError, OSError, SyntaxError) as exc:
            raise VectorError(f"{name}: not a readable .npy file ({_one_line(exc)})") from None
    return _as_rounds(name, raw)


def load_npz(path: Path) -> FloatArray:
    """An ``.npz`` file's array ``vectors`` (or its only array) as ``(rounds, m, d)``."""
    name = str(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            key = "vectors" if "vectors" in keys else keys[0] if len(keys) == 1 else None
            if key is None:
                raise VectorError(f"{name}: holds arrays {', '.join(keys) or '(none)'}; name "
                                  "the one to use 'vectors' (or keep only one)")
            raw = z[key]
    except VectorError:
        raise
    except (ValueError, EOFError, OSError, SyntaxError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError, KeyError) as exc:
        # NotImplementedError: a compression method zipfile cannot read; RuntimeError: an
        # encrypted member
        raise VectorError(f"{name}: not a readable .npz file ({_one_line(exc)})") from None
    if not isinstance(raw, np.ndarray):  # numpy hands a member that is not .npy as bytes
        raise VectorError(f"{name}: its member {key!r} is not an .npy array (an .npz holds "
                          ".npy files, as numpy.savez writes them)")
    return _as_rounds(f"{name}[{key}]", raw)


def parse_line(name: str, lineno: int, line: str, d: int | None) -> FloatArray:
    """One text line as a vector; ``d``: the length it must have (None: any)."""
    text = line.strip()
    fields = text.split(",") if "," in text else text.split()
    for col, f in enumerate(fields):
        if _NUMBER.fullmatch(f.strip()) is None:
            what = "an empty field" if not f.strip() else f"{f.strip()!r} is not a number"
            raise VectorError(f"{name} line {lineno}: {what} at index {col}"
                              + (" (numbers are written in ASCII, e.g. 1000, -0.5, 1e-3)"
                                 if _python_number(f) else ""))
    v = np.array([f.strip() for f in fields], dtype=np.float64)
    if d is not None and v.size != d:
        raise VectorError(f"{name} line {lineno}: {v.size} values; expected d = {d}"
                          + (" (a short line)" if v.size < d else ""))
    bad = _first_bad(v)
    if bad is not None:
        raise VectorError(f"{name} line {lineno}: {v[bad]} at index {bad[0]}; every value "
                          "must be finite")
    huge = _first_huge(v)
    if huge is not None:
        raise VectorError(f"{name} line {lineno}: at index {huge[0]}, "
                          f"{_huge_message(v[huge])}")
    long = _first_long(v)
    if long is not None:
        raise VectorError(f"{name} line {lineno}: {_long_message(long[1])}")
    return v


def text_lines(fp: IO[str]) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the lines that hold a vector (no blanks, no comments)."""
    for lineno, line in enumerate(fp, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            yield lineno, line


def load_text(path: Path) -> FloatArray:
    """A text file of one vector per line as ``(lines, 1, d)`` (grouped by m later)."""
    name = str(path)
    rows: list[FloatArray] = []
    first = 0
    try:
        with path.open(encoding="utf-8") as fp:
            for lineno, line in text_lines(fp):
                v = parse_line(name, lineno, line, None)
                if not rows:
                    first = lineno
                elif v.size != rows[0].size:
                    short = " (a short line)" if v.size < rows[0].size else ""
                    raise VectorError(f"{name} line {lineno}: {v.size} values; line {first} "
                                      f"has {rows[0].size}{short}")
                rows.append(v)
    except UnicodeDecodeError as exc:
        raise VectorError(f"{name}: not a text file ({exc.reason} at byte {exc.start}); "
                          "use .npy or .npz for binary data") from None
    if not rows:
        raise VectorError(f"{name}: holds no vector (one per line)")
    return np.stack(rows)[:, None, :]
