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

import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO

import numpy as np

from rpsagg_client.vectorfiles import (
    FLOAT32_MAX,
    FloatArray,
    VectorError,
    load_npy,
    load_npz,
    load_text,
    parse_line,
    text_lines,
)

STDIN = "-"
STDIN_NAME = "<stdin>"


class VectorsEnded(VectorError):
    """The vectors ran out before a round that needs them."""


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
        self._lines = text_lines(fp)
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


__all__ = ["FLOAT32_MAX", "STDIN", "ArraySource", "FloatArray", "StreamSource", "VectorError",
           "VectorSource", "VectorsEnded", "describe", "load_npy", "load_npz", "load_text",
           "open_vectors", "parse_line"]
