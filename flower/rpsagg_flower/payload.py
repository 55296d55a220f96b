"""A model update as one flat vector, and its compressed form as Flower records.

A model is an ``ArrayRecord``. The update of its floating-point arrays (less those named
uncompressed) is flattened in the record's key order into one float64 vector of ``d``
coordinates (:func:`flatten`), and the mean update is cut back into arrays of the original
shapes and dtypes (:func:`apply_update`). The other arrays (:attr:`Layout.plain_keys`:
integers, booleans, excluded names) travel as they are and are averaged
(:func:`mean_plain`).

A compressed reply carries (:func:`encoded_to_records`):

* an ``ArrayRecord`` with ``values`` (float32), or ``codes`` (the packed ``value_bits``-bit
  codes, ``rpsagg.quantize.pack_codes``) and ``scale`` (one float32), and ``indices``
  (int32) for the schemes that send coordinates, and the uncompressed arrays in NumPy's
  format under ``plain/<key>`` (:data:`PLAIN_PREFIX`). The sketch's ``Array`` objects hold raw
  little-endian bytes (``stype`` :data:`STYPE_RAW`) rather than NumPy's ``.npy`` format,
  whose 128-byte header per array would cost more than a small sketch;
* a ``ConfigRecord`` :data:`REPLY_CONFIG` with the client's 64-bit ``seed`` and the round's
  ``nonce`` (8 bytes each), the message ``scheme``, the value ``count`` and ``value-bits``.
"""

from __future__ import annotations

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
#: Key of the reply's ``ConfigRecord`` with the seed and the message's description.
REPLY_CONFIG = "rpsagg"
#: Prefix of the uncompressed arrays' keys in a compressed reply's ``ArrayRecord``.
PLAIN_PREFIX = "plain/"


@dataclass(frozen=True)
class Layout:
    """Keys, shapes and dtypes of a model's arrays, in record order, and which of them are
    compressed.

    Floating-point arrays are compressed (flattened into the update vector) unless named in
    ``uncompressed``; every other array (integer counters such as BatchNorm's
    ``num_batches_tracked``, boolean masks) and the named ones travel uncompressed beside
    the sketch (:data:`PLAIN_PREFIX`) and are averaged by the server (:func:`mean_plain`).
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    compressed: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.compressed:  # older callers: every array compressed
            object.__setattr__(self, "compressed", tuple(True for _ in self.keys))

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
        return tuple(k for k, c in zip(self.keys, self.compressed, strict=True) if not c)

    @classmethod
    def of(cls, record: ArrayRecord, uncompressed: Iterable[str] = ()) -> Layout:
        """The layout of ``record``: its floating-point arrays not named in ``uncompressed``
        are compressed. ``ValueError`` when ``uncompressed`` names an array the record lacks
        or when no array is left to compress."""
        arrays = record.to_numpy_ndarrays()
        if not arrays:
            raise ValueError("the model's ArrayRecord has no arrays")
        keys = tuple(record.keys())
        excluded = set(uncompressed)
        unknown = sorted(excluded - set(keys))
        if unknown:
            raise ValueError(f"uncompressed names arrays the model lacks: {unknown}; "
                             f"its arrays are {list(keys)}")
        compressed = tuple(bool(np.issubdtype(a.dtype, np.floating)) and key not in excluded
                           for key, a in zip(keys, arrays, strict=True))
        if not any(compressed):
            raise ValueError(
                "no floating-point array left to compress (rpsagg compresses floating-point "
                f"arrays; the model's are {[str(a.dtype) for a in arrays]})"
            )
        return cls(
            keys,
            tuple(tuple(int(s) for s in a.shape) for a in arrays),
            tuple(a.dtype for a in arrays),
            compressed,
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
    """The compressed arrays of ``record`` (which must have ``layout``) as one float64
    vector."""
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


def apply_update(record: ArrayRecord, layout: Layout, update: FloatArray,
                 plain: Mapping[str, NDArray[np.generic]] | None = None) -> ArrayRecord:
    """``record + update`` for the compressed arrays, each in its own shape and dtype (sums
    in float64); the uncompressed arrays are replaced by ``plain``'s (kept when None)."""
    base = flatten(record, layout)
    if update.shape != base.shape:
        raise ValueError(f"an update of {update.size} coordinates for a model of {base.size}")
    old = dict(zip(record.keys(), record.to_numpy_ndarrays(), strict=True))
    out: dict[str, Array] = {}
    offset = 0
    for key, shape, dtype, c in zip(layout.keys, layout.shapes, layout.dtypes,
                                    layout.compressed, strict=True):
        if not c:
            value = old[key] if plain is None else plain[key]
            out[key] = Array(np.array(value, dtype=dtype).reshape(shape))
            continue
        size = int(np.prod(shape))
        new = base[offset : offset + size] + update[offset : offset + size]
        # np.array, not ascontiguousarray: that would turn a 0-d array into shape (1,)
        out[key] = Array(np.array(new, dtype=dtype).reshape(shape))
        offset += size
    return ArrayRecord(out)


def mean_plain(parts: Sequence[Mapping[str, NDArray[np.generic]]], weights: Sequence[float],
               layout: Layout) -> dict[str, NDArray[np.generic]]:
    """The weighted mean of the replies' uncompressed arrays, as FedAvg averages, in each
    array's own dtype: floating point as is, integers rounded to the nearest, booleans by
    weighted majority (true where the true replies weigh at least half)."""
    w = np.asarray(weights, dtype=np.float64)
    if len(parts) != w.size or w.size == 0 or w.sum() <= 0:
        raise ValueError("mean_plain needs one positive-sum weight per reply")
    w = w / w.sum()
    out: dict[str, NDArray[np.generic]] = {}
    for key, dtype in zip(layout.keys, layout.dtypes, strict=True):
        if key not in layout.plain_keys:
            continue
        mean = sum(wi * np.asarray(p[key], dtype=np.float64) for wi, p in zip(w, parts,
                                                                              strict=True))
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


def encoded_to_records(
    msg: Encoded, client_seed: int, nonce: int,
    plain: Mapping[str, NDArray[np.generic]] | None = None,
) -> tuple[ArrayRecord, ConfigRecord]:
    """The compressed reply's records for the message ``msg`` (encoded with the transform
    seed derived from ``client_seed`` and ``nonce``), with the uncompressed arrays ``plain``
    (raw little-endian bytes in their own dtype and shape, keys prefixed by
    :data:`PLAIN_PREFIX`)."""
    arrays: dict[str, Array] = {}
    _put(arrays, msg, "")
    for key, value in (plain or {}).items():
        arrays[PLAIN_PREFIX + key] = _raw(np.asarray(value))
    meta = ConfigRecord(
        {
            "seed": nonce_to_bytes(client_seed),
            "nonce": nonce_to_bytes(nonce),
            "scheme": msg.scheme,
            "count": int(msg.values.size),
            "value-bits": int(msg.value_bits),
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
    msgs: Sequence[Encoded], client_seed: int, nonce: int,
    plain: Mapping[str, NDArray[np.generic]] | None = None,
) -> tuple[ArrayRecord, ConfigRecord]:
    """Per-layer compression: the records of one message per layer (``values/<j>``,
    ``codes/<j>``, ``scale/<j>``, ``indices/<j>``; ``count`` a list), as
    :func:`encoded_to_records` writes one."""
    arrays: dict[str, Array] = {}
    for j, msg in enumerate(msgs):
        _put(arrays, msg, f"/{j}")
    for key, value in (plain or {}).items():
        arrays[PLAIN_PREFIX + key] = _raw(np.asarray(value))
    meta = ConfigRecord(
        {
            "seed": nonce_to_bytes(client_seed),
            "nonce": nonce_to_bytes(nonce),
            "scheme": msgs[0].scheme,
            "count": [int(m.values.size) for m in msgs],
            "value-bits": int(msgs[0].value_bits),
        }
    )
    return ArrayRecord(arrays), meta


def layer_seed(client_seed: int, nonce: int, node_id: int, layer: int) -> int:
    """Layer ``layer``'s transform seed: ``derive_round_seed`` with the id
    ``"<node>/<layer>"`` (the flattened update's is ``"<node>"``)."""
    return derive_round_seed(client_seed, nonce, f"{node_id}/{layer}")


def records_to_layers(
    ests: Sequence[Estimator], arrays: ArrayRecord, meta: ConfigRecord, nonce: int,
    node_id: int,
) -> list[Encoded]:
    """The per-layer messages of one compressed reply (:func:`layers_to_records`);
    ``ValueError`` for a reply that does not fit the round."""
    client_seed, scheme, counts, value_bits = _meta(meta, nonce)
    if not (isinstance(counts, list) and len(counts) == len(ests)):
        raise ValueError(f"the reply has counts {counts!r:.60}; the round has {len(ests)} "
                         f"layers")
    return [_one(est, arrays, scheme, int(count), value_bits,
                 layer_seed(client_seed, nonce, node_id, j), f"/{j}")
            for j, (est, count) in enumerate(zip(ests, counts, strict=True))]


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


def records_to_plain(arrays: ArrayRecord, layout: Layout) -> dict[str, NDArray[np.generic]]:
    """The uncompressed arrays of one compressed reply, by key; ``ValueError`` for one that
    is missing or differs from the model's shape or dtype."""
    out = {}
    for key, shape, dtype in zip(layout.keys, layout.shapes, layout.dtypes, strict=True):
        if key not in layout.plain_keys:
            continue
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
