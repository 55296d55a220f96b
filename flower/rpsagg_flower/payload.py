"""A model update as one flat vector.

A model is an ``ArrayRecord``. The update of its floating-point arrays (less those named
uncompressed) is flattened in the record's key order into one float64 vector of ``d``
coordinates (:func:`flatten`), and the mean update is cut back into arrays of the original
shapes and dtypes (:func:`apply_update`). The other arrays (:attr:`Layout.plain_keys`:
integers, booleans, excluded names) travel as they are and are averaged
(:func:`mean_plain`). A compressed reply marks arrays in bitmaps, one bit per array in
record order (:func:`marks_to_bytes`; :data:`MARK_ZERO`, :data:`MARK_ABSENT`); its
encoding as Flower records is :mod:`rpsagg_flower.records`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

#: Reply ``ConfigRecord`` entry: bitmap of the arrays whose update is exactly zero.
MARK_ZERO = "zero"
#: Reply ``ConfigRecord`` entry: bitmap of the arrays the ClientApp's reply did not carry.
MARK_ABSENT = "absent"


@dataclass(frozen=True)
class Layout:
    """Keys, shapes and dtypes of a model's arrays, in record order, and which of them are
    compressed.

    Floating-point arrays are compressed (flattened into the update vector) unless named in
    ``uncompressed``; every other array (integer counters such as BatchNorm's
    ``num_batches_tracked``, boolean masks) and the named ones travel uncompressed beside
    the sketch and are averaged by the server. ``frozen`` arrays are neither: they never
    travel up and the server keeps them. Build one with ``Layout.of``.

    Attributes
    ----------
    keys : tuple of str
        The arrays' keys, in record order.
    shapes : tuple of tuple of int
        Their shapes.
    dtypes : tuple of numpy.dtype
        Their dtypes.
    compressed : tuple of bool
        Per array: part of the flattened update (every array when empty).
    frozen : tuple of bool
        Per array: frozen, never sent (none when empty).
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    compressed: tuple[bool, ...] = ()
    frozen: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.compressed:  # older callers: every array compressed
            object.__setattr__(self, "compressed", tuple(True for _ in self.keys))
        if not self.frozen:
            object.__setattr__(self, "frozen", tuple(False for _ in self.keys))

    @property
    def d(self) -> int:
        """Coordinates of the flattened (compressed) part of the model."""
        return sum(int(np.prod(s)) for s, c in zip(self.shapes, self.compressed, strict=True)
                   if c)

    @property
    def compressed_sizes(self) -> tuple[int, ...]:
        """Coordinates of each compressed array, in record order (the layers of per-layer
        compression)."""
        return tuple(int(np.prod(s)) for s, c in zip(self.shapes, self.compressed, strict=True)
                     if c)

    @property
    def compressed_keys(self) -> tuple[str, ...]:
        """The compressed arrays, in record order."""
        return tuple(k for k, c in zip(self.keys, self.compressed, strict=True) if c)

    @property
    def plain_keys(self) -> tuple[str, ...]:
        """The arrays that travel uncompressed, in record order."""
        return tuple(k for k, c, f in zip(self.keys, self.compressed, self.frozen, strict=True)
                     if not (c or f))

    def plain_arrays(self, absent: Sequence[bool] | None = None
                     ) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """The arrays that travel uncompressed.

        Parameters
        ----------
        absent : sequence of bool, optional
            One flag per array, as in a reply's bitmap: those flagged are left out (None:
            none absent).

        Returns
        -------
        list of tuple
            ``(key, shape, dtype)`` of each, in record order.
        """
        gone = [False] * len(self.keys) if absent is None else absent
        return [(key, shape, dtype) for key, shape, dtype, c, f, no
                in zip(self.keys, self.shapes, self.dtypes, self.compressed, self.frozen,
                       gone, strict=True) if not (c or f or no)]

    @property
    def frozen_keys(self) -> tuple[str, ...]:
        """The frozen arrays (never sent up, kept by the server), in record order."""
        return tuple(k for k, f in zip(self.keys, self.frozen, strict=True) if f)

    def coordinate_mask(self, included: Sequence[bool]) -> NDArray[np.bool_]:
        """The coordinates of the flattened update that belong to some compressed arrays.

        Parameters
        ----------
        included : sequence of bool
            One flag per compressed array, in record order.

        Returns
        -------
        ndarray of bool
            ``d`` flags, true on the coordinates of the flagged arrays.

        Raises
        ------
        ValueError
            When ``included`` has not one flag per compressed array.
        """
        sizes = self.compressed_sizes
        if len(included) != len(sizes):
            raise ValueError(f"{len(included)} flags for {len(sizes)} compressed arrays")
        return np.repeat(np.asarray(included, dtype=bool), sizes)

    def compressed_slices(self) -> dict[str, slice]:
        """Each compressed array's coordinates in the flattened update, by key."""
        out, offset = {}, 0
        for key, size in zip(self.compressed_keys, self.compressed_sizes, strict=True):
            out[key] = slice(offset, offset + size)
            offset += size
        return out

    @classmethod
    def of(cls, record: ArrayRecord, uncompressed: Iterable[str] = (),
           frozen: Iterable[str] = ()) -> Layout:
        """The layout of a model.

        Parameters
        ----------
        record : ArrayRecord
            The model's arrays.
        uncompressed : iterable of str
            Floating-point arrays to send as they are.
        frozen : iterable of str
            Arrays never sent.

        Returns
        -------
        Layout
            The floating-point arrays of ``record`` not named in ``uncompressed`` or
            ``frozen`` are compressed.

        Raises
        ------
        ValueError
            When ``record`` has no arrays, ``uncompressed`` or ``frozen`` names an array
            the record lacks, or no array is left to compress.
        """
        arrays = record.to_numpy_ndarrays()
        if not arrays:
            raise ValueError("the model's ArrayRecord has no arrays")
        keys = tuple(record.keys())
        excluded, fixed = set(uncompressed), set(frozen)
        for what, names in (("uncompressed", excluded), ("frozen", fixed)):
            unknown = sorted(names - set(keys))
            if unknown:
                raise ValueError(f"{what} names arrays the model lacks: {unknown}; "
                                 f"its arrays are {list(keys)}")
        compressed = tuple(bool(np.issubdtype(a.dtype, np.floating))
                           and key not in excluded and key not in fixed
                           for key, a in zip(keys, arrays, strict=True))
        if not any(compressed):
            raise ValueError(
                "no floating-point array left to compress (rpsagg compresses floating-point "
                f"arrays that are not frozen; the model's are "
                f"{[str(a.dtype) for a in arrays]})"
            )
        return cls(
            keys,
            tuple(tuple(int(s) for s in a.shape) for a in arrays),
            tuple(a.dtype for a in arrays),
            compressed,
            tuple(key in fixed for key in keys),
        )


def _checked_arrays(record: ArrayRecord, layout: Layout) -> list[NDArray[np.generic]]:
    if tuple(record.keys()) != layout.keys:
        raise ValueError(
            f"the arrays' keys {list(record.keys())} differ from the model's {list(layout.keys)}"
        )
    arrays = record.to_numpy_ndarrays()
    for key, arr, shape in zip(layout.keys, arrays, layout.shapes, strict=True):
        if tuple(arr.shape) != shape:
            raise ValueError(f"array {key!r} has shape {arr.shape}; the model's is {shape}")
    return arrays


def flatten(record: ArrayRecord, layout: Layout) -> FloatArray:
    """The compressed arrays of a model as one vector.

    Parameters
    ----------
    record : ArrayRecord
        The model's arrays.
    layout : Layout
        ``record``'s layout.

    Returns
    -------
    ndarray of float64
        The compressed arrays, flattened and concatenated in record order (``layout.d``
        coordinates).

    Raises
    ------
    ValueError
        When ``record``'s keys or shapes are not ``layout``'s.
    """
    arrays = _checked_arrays(record, layout)
    parts = [np.asarray(arr, dtype=np.float64).reshape(-1)
             for arr, c in zip(arrays, layout.compressed, strict=True) if c]
    return np.concatenate(parts)


def plain_arrays(record: ArrayRecord, layout: Layout) -> dict[str, NDArray[np.generic]]:
    """The arrays of ``record`` that travel uncompressed, by key (shapes and dtypes checked
    against ``layout``)."""
    arrays = _checked_arrays(record, layout)
    out = {}
    for key, arr, dtype, c in zip(layout.keys, arrays, layout.dtypes, layout.compressed,
                                  strict=True):
        if not c:
            if arr.dtype != dtype:
                raise ValueError(f"array {key!r} is {arr.dtype}; the model's is {dtype}")
            out[key] = arr
    return out


def reply_arrays(record: ArrayRecord, layout: Layout
                 ) -> tuple[dict[str, NDArray[np.generic]], tuple[bool, ...]]:
    """The arrays a ClientApp's reply carries, by key, and the ``absent`` flags (one per
    array of ``layout``, in record order: a sent array the reply lacks).

    A reply may carry a subset of the model's arrays, in any order; frozen arrays are
    ignored (never sent). ``ValueError`` for an array the model lacks, another shape, or
    an uncompressed array of another dtype."""
    extra = [key for key in record if key not in layout.keys]
    if extra:
        raise ValueError(f"the reply has arrays the model lacks: {extra}; the model's are "
                         f"{list(layout.keys)}")
    out: dict[str, NDArray[np.generic]] = {}
    for key, shape, dtype, c, f in zip(layout.keys, layout.shapes, layout.dtypes,
                                       layout.compressed, layout.frozen, strict=True):
        if f or key not in record:
            continue
        arr = record[key].numpy()
        if tuple(arr.shape) != shape:
            raise ValueError(f"array {key!r} has shape {arr.shape}; the model's is {shape}")
        if not c and arr.dtype != dtype:
            raise ValueError(f"array {key!r} is {arr.dtype}; the model's is {dtype}")
        out[key] = arr
    absent = tuple(not f and key not in record for key, f in zip(layout.keys, layout.frozen,
                                                                  strict=True))
    return out, absent


def marks_to_bytes(flags: Sequence[bool]) -> bytes:
    """One bit per array (array ``j`` is bit ``j % 8`` of byte ``j // 8``)."""
    return np.packbits(np.asarray(flags, dtype=bool), bitorder="little").tobytes()


def marks_from_bytes(raw: object, count: int, what: str) -> tuple[bool, ...]:
    """Inverse of :func:`marks_to_bytes` for ``count`` arrays; ``ValueError`` naming
    ``what`` unless ``raw`` is ``ceil(count / 8)`` bytes with zero padding bits."""
    if not isinstance(raw, bytes) or len(raw) != (count + 7) // 8:
        raise ValueError(f"the {what!r} bitmap must be {(count + 7) // 8} bytes for {count} "
                         f"arrays; got {raw!r:.40}")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if bits[count:].any():
        raise ValueError(f"the {what!r} bitmap sets bits past the model's {count} arrays")
    return tuple(bool(b) for b in bits[:count])


def apply_update(record: ArrayRecord, layout: Layout, update: FloatArray,
                 plain: Mapping[str, NDArray[np.generic]] | None = None,
                 keep: Iterable[str] = ()) -> ArrayRecord:
    """A model plus a flattened update.

    Parameters
    ----------
    record : ArrayRecord
        The model's arrays.
    layout : Layout
        ``record``'s layout.
    update : ndarray of float64
        ``layout.d`` coordinates, as ``flatten`` orders them.
    plain : mapping of str to ndarray, optional
        New values of the uncompressed arrays (kept when None or when ``plain`` lacks
        them).
    keep : iterable of str
        Arrays to keep as they are.

    Returns
    -------
    ArrayRecord
        ``record + update`` for the compressed arrays, each in its own shape and dtype
        (sums in float64); frozen arrays and those named in ``keep`` bit for bit.

    Raises
    ------
    ValueError
        When ``update`` or ``record`` does not fit ``layout``.
    """
    base = flatten(record, layout)
    if update.shape != base.shape:
        raise ValueError(f"an update of {update.size} coordinates for a model of {base.size}")
    old = dict(zip(record.keys(), record.to_numpy_ndarrays(), strict=True))
    kept = set(keep) | set(layout.frozen_keys)
    out: dict[str, Array] = {}
    offset = 0
    for key, shape, dtype, c in zip(layout.keys, layout.shapes, layout.dtypes,
                                    layout.compressed, strict=True):
        if not c:
            value = plain[key] if plain is not None and key in plain and key not in kept \
                else old[key]
            out[key] = Array(np.array(value, dtype=dtype).reshape(shape))
            continue
        size = int(np.prod(shape))
        if key in kept:
            out[key] = Array(np.array(old[key], dtype=dtype).reshape(shape))
            offset += size
            continue
        new = base[offset : offset + size] + update[offset : offset + size]
        # np.array, not ascontiguousarray: that would turn a 0-d array into shape (1,)
        out[key] = Array(np.array(new, dtype=dtype).reshape(shape))
        offset += size
    return ArrayRecord(out)


def mean_plain(parts: Sequence[Mapping[str, NDArray[np.generic]]], weights: Sequence[float],
               layout: Layout) -> dict[str, NDArray[np.generic]]:
    """The weighted mean of the replies' uncompressed arrays, as FedAvg averages, in each
    array's own dtype: floating point as is, integers rounded to the nearest, booleans by
    weighted majority (true where the true replies weigh at least half).

    Each array is averaged over the replies that carry it (a partial reply may lack some);
    an array that no reply carries, or whose carriers' weights sum to 0, is left out of the
    result (the server keeps it). Where every carrier sends the same values, the mean is
    those values, bit for bit."""
    w_all = np.asarray(weights, dtype=np.float64)
    if len(parts) != w_all.size or w_all.size == 0 or w_all.sum() <= 0:
        raise ValueError("mean_plain needs one positive-sum weight per reply")
    out: dict[str, NDArray[np.generic]] = {}
    for key, dtype in zip(layout.keys, layout.dtypes, strict=True):
        if key not in layout.plain_keys:
            continue
        carriers = [(wi, p[key]) for wi, p in zip(w_all, parts, strict=True) if key in p]
        total = sum(wi for wi, _ in carriers)
        if not carriers or total <= 0:
            continue
        first = np.asarray(carriers[0][1])
        if all(np.array_equal(np.asarray(v), first) for _, v in carriers[1:]):
            out[key] = np.array(first, dtype=dtype)
            continue
        mean = sum((wi / total) * np.asarray(v, dtype=np.float64) for wi, v in carriers)
        mean = np.asarray(mean, dtype=np.float64)
        if dtype == np.bool_:
            out[key] = mean >= 0.5
        elif np.issubdtype(dtype, np.integer):
            out[key] = np.rint(mean).astype(dtype)
        else:
            out[key] = mean.astype(dtype)
    return out
