"""The user's own vectors for ``rpsagg-client --vectors PATH``: files and a stream on stdin.

Formats (PATH's suffix decides; ``-`` is standard input):

* ``.npy``: shape ``(d,)`` (one round), ``(rounds, d)`` (one vector per round) or
  ``(rounds, m, d)`` (m vectors per round, ``--mean-vectors m`` on the server).
* ``.npz``: its array ``vectors``, or its only array; shapes as for ``.npy``.
* anything else: text, one vector per line, values separated by commas (or by white space
  when a line has no comma); blank lines and lines starting with ``#`` are skipped. With m
  vectors per round, m consecutive lines make a round.
* ``-``: the same text on standard input, read as the rounds come (one vector per round, m
  lines with m vectors per round): what a long-running process feeds.

The vectors of task step t (the t-th round that finishes with an estimate; a failed round
is retried on the same step) are row t of a file, and the next unread vector(s) of a
stream. A whole file is read and checked before the client contacts the server; a stream
line is checked as it is read. Every problem is a :class:`VectorError`, whose message is one
line naming the file and the line or index: a wrong d, NaN or Inf, a value beyond float32's
range (values are sent as float32) or a vector whose norm is (a rotation can put all of it
in one value), a truncated or malformed ``.npy``, an ``.npz`` whose member is not an
``.npy`` array or is compressed in a way Python's zipfile cannot read, a short or
malformed line (text numbers in their ASCII forms only: ``1e3``, ``-0.5``,
``inf``; not ``1_000`` nor other scripts' digits), a file that ends before the job. The
client also encodes every vector of a file once with the job's encoder before it joins, so
values whose encoding overflows (a transform or a square beyond float32 or float64) are
refused then too.
"""

from __future__ import annotations

import re
import sys
import zipfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
STDIN = "-"
STDIN_NAME = "<stdin>"
FLOAT32_MAX = float(np.finfo(np.float32).max)
# a number as text, ASCII only: Python's float() also takes "1_000", full-width and other
# scripts' digits, which a CSV file should not silently hold
_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                     r"|inf|infinity|nan)", re.IGNORECASE | re.ASCII)


class VectorError(ValueError):
    """Bad or missing input vectors; the message is one line naming the file and where."""


class VectorsEnded(VectorError):
    """The vectors ran out before a round that needs them."""


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


def _text_lines(fp: IO[str]) -> Iterator[tuple[int, str]]:
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
            for lineno, line in _text_lines(fp):
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


class VectorSource(ABC):
    """The vectors a client contributes, round by round.

    Attributes
    ----------
    name : str
        The file (``<stdin>`` for a stream), for messages.
    d : int
        Vector length.
    """

    name: str
    d: int

    def check_job(self, d: int, m: int, total_rounds: int, first_step: int) -> None:
        """Refuse a job these vectors cannot serve (before the client joins it).

        ``d`` 0: the job takes its d from the first join (this client's join says its d);
        ``total_rounds`` 0: the job runs until stopped; ``first_step``: the task step the
        job is at.
        """
        if d and self.d != d:
            raise VectorError(f"{self.name}: vectors of length {self.d}; the server's d is {d}")

    @abstractmethod
    def vectors(self, step: int) -> FloatArray:
        """The ``(m, d)`` vectors of task step ``step`` (:class:`VectorsEnded` past the end)."""


class ArraySource(VectorSource):
    """A whole file, read and checked up front: ``(rounds, m, d)``, or text lines that m at a
    time make a round."""

    def __init__(self, name: str, data: FloatArray, text: bool) -> None:
        self.name, self.data, self.text = name, data, text
        self.d = int(data.shape[2])
        self.m = int(data.shape[1])
        self.rounds = int(data.shape[0])

    def check_job(self, d: int, m: int, total_rounds: int, first_step: int) -> None:
        super().check_job(d, m, total_rounds, first_step)
        if self.text and m != self.m:
            if self.data.shape[0] % m:
                raise VectorError(f"{self.name}: {self.data.shape[0]} lines do not make whole "
                                  f"rounds of m = {m} vectors (the server's --mean-vectors)")
            self.data = self.data.reshape(-1, m, self.d)
            self.m, self.rounds = m, int(self.data.shape[0])
        elif self.m != m:
            raise VectorError(f"{self.name}: {self.m} vector(s) per round; the server's job "
                              f"takes m = {m}")
        if total_rounds and self.rounds < total_rounds:
            raise VectorError(f"{self.name}: ends after {self.rounds} round(s) of vectors, "
                              f"but the job runs {total_rounds} rounds")
        if first_step >= self.rounds:
            raise VectorError(f"{self.name}: ends after {self.rounds} round(s) of vectors, "
                              f"but the job is at round step {first_step + 1} already")

    def vectors(self, step: int) -> FloatArray:
        if step >= self.rounds:
            raise VectorsEnded(f"{self.name}: ends after {self.rounds} round(s) of vectors; "
                               f"round step {step + 1} needs more")
        return np.asarray(self.data[step])


class StreamSource(VectorSource):
    """Text on a stream, one vector per line, read as the rounds come: a new task step
    reads the next ``m`` vectors; a retried step (after a failed round) sends the same."""

    def __init__(self, fp: IO[str], name: str = STDIN_NAME) -> None:
        self.name = name
        self._lines = _text_lines(fp)
        self.m = 1
        self.read = 0  # vectors handed out
        self._held: list[FloatArray] = [self._read(None)]  # d from the first line
        self.d = int(self._held[0].size)
        self._step: int | None = None
        self._current: FloatArray | None = None

    def _read(self, d: int | None) -> FloatArray:
        try:
            lineno, line = next(self._lines)
        except StopIteration:
            raise VectorsEnded(f"{self.name}: ended after {self.read} vector(s)") from None
        except UnicodeDecodeError as exc:
            raise VectorError(f"{self.name}: not text ({exc.reason})") from None
        return parse_line(self.name, lineno, line, d)

    def check_job(self, d: int, m: int, total_rounds: int, first_step: int) -> None:
        super().check_job(d, m, total_rounds, first_step)
        self.m = m

    def vectors(self, step: int) -> FloatArray:
        if self._current is not None and step == self._step:
            return self._current
        rows = []
        for _ in range(self.m):
            rows.append(self._held.pop(0) if self._held else self._read(self.d))
            self.read += 1
        self._step, self._current = step, np.stack(rows)
        return self._current


def open_vectors(path: str, stdin: IO[str] | None = None) -> VectorSource:
    """The vectors at ``path`` (``-``: a stream on ``stdin``, default ``sys.stdin``).

    A file is read and checked whole; a stream's first line is read now (it fixes d).

    Raises
    ------
    VectorError
        A missing, unreadable or malformed file, NaN or Inf, an empty stream.
    """
    if path == STDIN:
        return StreamSource(sys.stdin if stdin is None else stdin)
    p = Path(path)
    if not p.is_file():
        raise VectorError(f"{path}: no such file" if not p.exists() else f"{path}: not a file")
    try:
        suffix = p.suffix.lower()
        if suffix == ".npy":
            return ArraySource(path, load_npy(p), text=False)
        if suffix == ".npz":
            return ArraySource(path, load_npz(p), text=False)
        return ArraySource(path, load_text(p), text=True)
    except PermissionError as exc:
        raise VectorError(f"{path}: cannot read it ({exc.strerror})") from None


def describe(source: VectorSource) -> str:
    """``rounds x m x d`` of a file, or ``a stream of d-vectors``, for the client's log."""
    if isinstance(source, ArraySource):
        return f"{source.rounds} round(s) of {source.m} x {source.d}"
    return f"a stream of vectors of length {source.d}"


__all__ = ["STDIN", "ArraySource", "StreamSource", "VectorError", "VectorSource",
           "VectorsEnded", "describe", "load_npy", "load_npz", "load_text", "open_vectors",
           "parse_line"]
