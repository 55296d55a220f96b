"""A model update as one flat vector, and its compressed form as Flower records.

A model is an ``ArrayRecord``. The update of its floating-point arrays (less those named
uncompressed) is flattened in the record's key order into one float64 vector of ``d``
coordinates (:func:`flatten`), and the mean update is cut back into arrays of the original
shapes and dtypes (:func:`apply_update`). The other arrays (:attr:`Layout.plain_keys`:
integers, booleans, excluded names) travel as they are and are averaged
(:func:`mean_plain`).

A compressed reply is described by two records (:func:`encoded_to_records`, the *view*
that :mod:`rpsagg_flower.reply` packs into the one record that travels, and that the
server's readers here check against the round):

* an ``ArrayRecord`` of raw arrays (little-endian bytes, ``stype`` :data:`STYPE_RAW`, no
  ``.npy`` header): ``values`` (float32), or ``codes`` (the packed ``value_bits``-bit
  codes, ``rpsagg.quantize.pack_codes``) and ``scale`` (float32), and ``indices`` (int32)
  for the schemes that send coordinates, and the uncompressed arrays under ``plain/<key>``
  (:data:`PLAIN_PREFIX`);
* a ``ConfigRecord`` with the client's 64-bit ``seed`` and the round's ``nonce`` (8 bytes
  each), the message ``scheme``, the value ``count`` and ``value-bits``, and two bitmaps
  over the model's arrays in record order (:func:`marks_to_bytes`, one bit per array,
  ``ceil(arrays / 8)`` bytes each): ``zero`` (the array's update is exactly zero and is
  left out of the sketch) and ``absent`` (the ClientApp's reply did not carry the array).
  The sketch is the estimator's message of the compressed arrays that are neither,
  concatenated in record order (:meth:`Layout.coordinate_mask`).

rpsagg-flower 0.1 sent these two records as they are (:data:`REPLY_CONFIG`, the arrays
apart or as one :func:`bundle`); the server still reads them.

Arrays the strategy names ``frozen`` are in no sketch, bitmap bit or ``plain/`` entry: they
never travel up, and the server keeps them as they are.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from numpy.typing import NDArray

from rpsagg import Encoded, Estimator
from rpsagg.quantize import dequantize, pack_codes, unpack_codes
from rpsagg.schemes import check_batch
from rpsagg.spec import derive_round_seed
from rpsagg_flower.settings import nonce_from_bytes, nonce_to_bytes

FloatArray = NDArray[np.float64]

#: ``Array.stype`` of raw little-endian bytes (no ``.npy`` header).
STYPE_RAW = "rpsagg.raw-le"
#: ``Array.stype`` of a bundle: several raw arrays in one (:func:`bundle`; rpsagg-flower
#: 0.1's replies).
STYPE_BUNDLE = "rpsagg.bundle"
#: Key of the bundle in rpsagg-flower 0.1's compressed reply's ``ArrayRecord``.
BUNDLE_KEY = "rpsagg"
#: Name of rpsagg-flower 0.1's reply ``ConfigRecord`` with the seed and the message's
#: description (the view's ``ConfigRecord``).
REPLY_CONFIG = "rpsagg"
#: Prefix of the uncompressed arrays' keys in a compressed reply's ``ArrayRecord``.
PLAIN_PREFIX = "plain/"
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


def _raw(arr: NDArray[np.generic], dtype: str | None = None) -> Array:
    """``arr`` as raw little-endian bytes (no NumPy header: 128 bytes less per array than
    ``Array(ndarray)``): 1-D in ``dtype`` when given (the sketch's values, codes, scales,
    indices), else in its own dtype and shape (the uncompressed arrays)."""
    arr = np.asarray(arr) if dtype is None else np.asarray(arr, dtype=dtype).reshape(-1)
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return Array(dtype=str(arr.dtype), shape=tuple(int(s) for s in arr.shape), stype=STYPE_RAW,
                 data=data)


def _raw_values(arr: Array, what: str) -> NDArray[np.generic]:
    """A raw array's values, in its dtype and shape; ``ValueError`` naming ``what`` when its
    dtype is unknown or its byte count does not match its shape."""
    try:
        dtype = np.dtype(arr.dtype)
    except TypeError:
        raise ValueError(f"{what} has an unknown dtype {arr.dtype!r}") from None
    count = int(np.prod(arr.shape, dtype=np.int64))
    if len(arr.data) != dtype.itemsize * count:
        raise ValueError(f"{what} has {len(arr.data)} bytes for {count} items of {dtype}")
    flat = np.frombuffer(arr.data, dtype=dtype.newbyteorder("<")).astype(dtype)
    return flat.reshape(tuple(arr.shape))


def _from_raw(record: ArrayRecord, key: str, dtype: str) -> NDArray[np.generic]:
    if key not in record:
        raise ValueError(f"the compressed reply lacks the array {key!r}")
    arr = record[key]
    if arr.stype != STYPE_RAW or arr.dtype != dtype or len(arr.shape) != 1:
        raise ValueError(f"array {key!r} is not a raw 1-D {dtype} array")
    return _raw_values(arr, f"array {key!r}")


def bundle(arrays: Mapping[str, Array]) -> ArrayRecord:
    """``arrays`` (raw, :data:`STYPE_RAW`) as one ``Array`` under :data:`BUNDLE_KEY`, as
    rpsagg-flower 0.1 sent a compressed reply's arrays (the reply now travels packed,
    :mod:`rpsagg_flower.reply`).

    Flower sends each ``Array`` as objects of their own, about 340 B beyond the data;
    a bundle sends one. Its bytes (``uint8``, ``stype`` :data:`STYPE_BUNDLE`) are the
    length of a header (4 bytes, little-endian), the header (compact JSON: one
    ``[key, dtype, shape]`` per array, in order) and the arrays' data concatenated.

    Parameters
    ----------
    arrays : mapping of str to Array
        Raw arrays, by key.

    Returns
    -------
    ArrayRecord
        One array, :data:`BUNDLE_KEY`.
    """
    entries, parts = [], []
    for key, arr in arrays.items():
        if arr.stype != STYPE_RAW:
            raise ValueError(f"array {key!r} is not raw ({arr.stype!r})")
        entries.append([key, arr.dtype, list(arr.shape)])
        parts.append(arr.data)
    head = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    data = b"".join([struct.pack("<I", len(head)), head, *parts])
    return ArrayRecord({BUNDLE_KEY: Array(dtype="uint8", shape=(len(data),),
                                          stype=STYPE_BUNDLE, data=data)})


def unbundle(record: ArrayRecord) -> ArrayRecord:
    """The raw arrays of a bundle (:func:`bundle`), by key; a record that is not one
    bundle is returned as it is (rpsagg-flower 0.1's first replies sent each array apart).
    ``ValueError`` for a malformed bundle."""
    if list(record.keys()) != [BUNDLE_KEY] or record[BUNDLE_KEY].stype != STYPE_BUNDLE:
        return record
    data = record[BUNDLE_KEY].data
    try:
        (size,) = struct.unpack_from("<I", data)
        entries = json.loads(data[4 : 4 + size].decode("utf-8"))
        offset = 4 + size
        out: dict[str, Array] = {}
        for key, dtype, shape in entries:
            shape = tuple(int(s) for s in shape)
            nbytes = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
            if not isinstance(key, str) or key in out or offset + nbytes > len(data):
                raise ValueError(f"entry {key!r:.40}")
            out[key] = Array(dtype=str(dtype), shape=shape, stype=STYPE_RAW,
                             data=bytes(data[offset : offset + nbytes]))
            offset += nbytes
    except (struct.error, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"the compressed reply's bundle is malformed: {exc}") from None
    if offset != len(data):
        raise ValueError(f"the compressed reply's bundle has {len(data) - offset} bytes "
                         f"past its arrays")
    return ArrayRecord(out)


def encoded_to_records(
    msg: Encoded | None, client_seed: int, nonce: int,
    plain: Mapping[str, NDArray[np.generic]] | None = None,
    marks: Mapping[str, bytes] | None = None, scheme: str = "",
) -> tuple[ArrayRecord, ConfigRecord]:
    """The compressed reply's view for the message ``msg`` (encoded with the transform
    seed derived from ``client_seed`` and ``nonce``), with the uncompressed arrays ``plain``
    (raw little-endian bytes in their own dtype and shape, keys prefixed by
    :data:`PLAIN_PREFIX`) and the bitmaps ``marks`` (:data:`MARK_ZERO`,
    :data:`MARK_ABSENT`). ``msg`` None: no sketch (every compressed array is zero or
    absent; ``count`` 0, ``scheme`` as given). The view travels packed
    (:func:`rpsagg_flower.reply.pack_reply`)."""
    arrays: dict[str, Array] = {}
    if msg is not None:
        _put(arrays, msg, "")
    for key, value in (plain or {}).items():
        arrays[PLAIN_PREFIX + key] = _raw(np.asarray(value))
    meta = ConfigRecord(
        {
            "seed": nonce_to_bytes(client_seed),
            "nonce": nonce_to_bytes(nonce),
            "scheme": scheme if msg is None else msg.scheme,
            "count": 0 if msg is None else int(msg.values.size),
            "value-bits": 32 if msg is None else int(msg.value_bits),
            **(marks or {}),
        }
    )
    return ArrayRecord(arrays), meta


def _put(arrays: dict[str, Array], msg: Encoded, suffix: str) -> None:
    if msg.codes is None:
        arrays["values" + suffix] = _raw(msg.values, "float32")
    else:
        assert msg.scales is not None
        packed = np.frombuffer(pack_codes(msg.codes, msg.value_bits), dtype=np.uint8)
        arrays["codes" + suffix] = _raw(packed, "uint8")
        arrays["scale" + suffix] = _raw(msg.scales, "float32")
    if msg.indices is not None:
        arrays["indices" + suffix] = _raw(msg.indices, "int32")


def layers_to_records(
    msgs: Sequence[Encoded | None], client_seed: int, nonce: int,
    plain: Mapping[str, NDArray[np.generic]] | None = None,
    marks: Mapping[str, bytes] | None = None, scheme: str = "",
) -> tuple[ArrayRecord, ConfigRecord]:
    """Per-layer compression: the records of one message per layer (``values/<j>``,
    ``codes/<j>``, ``scale/<j>``, ``indices/<j>``; ``count`` a list), as
    :func:`encoded_to_records` writes one. A layer whose message is None (zero or absent)
    has count 0 and no arrays."""
    arrays: dict[str, Array] = {}
    for j, msg in enumerate(msgs):
        if msg is not None:
            _put(arrays, msg, f"/{j}")
    for key, value in (plain or {}).items():
        arrays[PLAIN_PREFIX + key] = _raw(np.asarray(value))
    sent = [m for m in msgs if m is not None]
    meta = ConfigRecord(
        {
            "seed": nonce_to_bytes(client_seed),
            "nonce": nonce_to_bytes(nonce),
            "scheme": sent[0].scheme if sent else scheme,
            "count": [0 if m is None else int(m.values.size) for m in msgs],
            "value-bits": int(sent[0].value_bits) if sent else 32,
            **(marks or {}),
        }
    )
    return ArrayRecord(arrays), meta


def layer_seed(client_seed: int, nonce: int, node_id: int, layer: int) -> int:
    """Layer ``layer``'s transform seed: ``derive_round_seed`` with the id
    ``"<node>/<layer>"`` (the flattened update's is ``"<node>"``)."""
    return derive_round_seed(client_seed, nonce, f"{node_id}/{layer}")


def records_to_layers(
    ests: Sequence[Estimator], arrays: ArrayRecord, meta: ConfigRecord, nonce: int,
    node_id: int, included: Sequence[bool] | None = None,
) -> list[Encoded | None]:
    """The per-layer messages of one compressed reply (:func:`layers_to_records`), None
    for the layers not ``included`` (zero or absent); ``ValueError`` for a reply that does
    not fit the round."""
    client_seed, scheme, counts, value_bits = _meta(meta, nonce)
    if not (isinstance(counts, list) and len(counts) == len(ests)):
        raise ValueError(f"the reply has counts {counts!r:.60}; the round has {len(ests)} "
                         f"layers")
    flags = [True] * len(ests) if included is None else list(included)
    return [_one(est, arrays, scheme, int(count), value_bits,
                 layer_seed(client_seed, nonce, node_id, j), f"/{j}") if inc else None
            for j, (est, count, inc) in enumerate(zip(ests, counts, flags, strict=True))]


def reply_marks(meta: ConfigRecord, layout: Layout) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """The ``zero`` and ``absent`` flags of a compressed reply, one per array of
    ``layout`` (all False where the reply has no such bitmap, as rpsagg-flower 0.1.0's mod
    sent none); bits of frozen arrays are ignored. ``ValueError`` for a malformed bitmap."""
    count = len(layout.keys)
    out = []
    for what in (MARK_ZERO, MARK_ABSENT):
        flags = (marks_from_bytes(meta[what], count, what) if what in meta
                 else (False,) * count)
        out.append(tuple(b and not f for b, f in zip(flags, layout.frozen, strict=True)))
    return out[0], out[1]


def _meta(meta: ConfigRecord, nonce: int) -> tuple[int, object, object, object]:
    try:
        client_seed = nonce_from_bytes(meta["seed"])
        sent_nonce = nonce_from_bytes(meta["nonce"])
        scheme, count, value_bits = meta["scheme"], meta["count"], meta["value-bits"]
    except KeyError as exc:
        raise ValueError(f"the compressed reply lacks {exc.args[0]!r}") from None
    if sent_nonce != nonce:
        raise ValueError("the reply was encoded for another round (its nonce differs)")
    return client_seed, scheme, count, value_bits


def records_to_encoded(
    est: Estimator, arrays: ArrayRecord, meta: ConfigRecord, nonce: int, node_id: int
) -> Encoded:
    """The ``Encoded`` message of one compressed reply from node ``node_id``.

    Its transform seed is derived here from the reply's client seed, this round's ``nonce``
    and the node id, so a client cannot choose its projection. ``ValueError`` for a reply
    that does not fit ``est`` or the round.
    """
    client_seed, scheme, count, value_bits = _meta(meta, nonce)
    if not isinstance(count, int):
        raise ValueError("the compressed reply's scheme, count or value-bits is malformed")
    return _one(est, arrays, scheme, count, value_bits,
                derive_round_seed(client_seed, nonce, str(node_id)), "")


def _one(est: Estimator, arrays: ArrayRecord, scheme: object, count: int, value_bits: object,
         seed: int, suffix: str) -> Encoded:
    if not (isinstance(scheme, str) and isinstance(value_bits, int)):
        raise ValueError("the compressed reply's scheme, count or value-bits is malformed")
    if scheme != est.name or value_bits != est.value_bits:
        raise ValueError(
            f"the reply is {scheme!r} with {value_bits}-bit values; this round is "
            f"{est.name!r} with {est.value_bits}-bit values"
        )
    if count < 0 or (est.values_per_message is not None and count != est.values_per_message):
        raise ValueError(f"the reply has {count!r} values; expected {est.values_per_message}")
    indices = _from_raw(arrays, "indices" + suffix, "int32").astype(np.int64) if (
        "indices" + suffix in arrays
    ) else None
    if indices is not None and indices.size != count:
        raise ValueError(f"the reply has {indices.size} indices for {count} values")
    if est.value_bits == 32:
        values = _from_raw(arrays, "values" + suffix, "float32").astype(np.float32)
        if values.size != count:
            raise ValueError(f"the reply has {values.size} values; it says {count}")
        msg = Encoded(est.name, seed, est.k, est.d, values, indices)
    else:
        packed = _from_raw(arrays, "codes" + suffix, "uint8").tobytes()
        codes = unpack_codes(packed, count, est.value_bits)
        scales = _from_raw(arrays, "scale" + suffix, "float32").astype(np.float32)
        values32 = dequantize(est.codebook, codes, scales, est.value_bits, est.scale_counts)
        msg = Encoded(est.name, seed, est.k, est.d, values32, indices,
                      value_bits=est.value_bits, codes=codes, scales=scales)
    # the decoder's own checks (finite values, indices in [0, d), counts), one reply at a
    # time: a bad reply is dropped instead of failing the whole round's decode
    check_batch([msg], scheme=est.name, n=est.n, k=est.k, d=est.d,
                values_per_message=est.values_per_message, value_bits=est.value_bits,
                scales_per_message=1 if est.scale_counts is None else len(est.scale_counts))
    return msg


def records_to_plain(arrays: ArrayRecord, layout: Layout,
                     absent: Sequence[bool] | None = None) -> dict[str, NDArray[np.generic]]:
    """The uncompressed arrays of one compressed reply, by key (less those flagged
    ``absent``); ``ValueError`` for one that is missing or differs from the model's shape
    or dtype."""
    out = {}
    for key, shape, dtype in layout.plain_arrays(absent):
        name = PLAIN_PREFIX + key
        if name not in arrays:
            raise ValueError(f"the compressed reply lacks the uncompressed array {key!r}")
        arr = arrays[name]
        if arr.stype == STYPE_RAW:
            value = _raw_values(arr, f"uncompressed array {key!r}")
        else:  # NumPy's format, as rpsagg-flower 0.1.0's mod sent them
            try:
                value = arr.numpy()
            except (TypeError, ValueError) as exc:
                raise ValueError(f"uncompressed array {key!r} is not a NumPy array: "
                                 f"{exc}") from None
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise ValueError(f"uncompressed array {key!r} is {value.dtype}{list(value.shape)}; "
                             f"the model's is {dtype}{list(shape)}")
        out[key] = value
    return out
