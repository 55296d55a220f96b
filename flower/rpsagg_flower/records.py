"""A model update's compressed form as Flower records.

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
  over the model's arrays in record order
  (:func:`rpsagg_flower.payload.marks_to_bytes`, one bit per array, ``ceil(arrays / 8)``
  bytes each): ``zero`` (the array's update is exactly zero and is left out of the
  sketch) and ``absent`` (the ClientApp's reply did not carry the array). The sketch is
  the estimator's message of the compressed arrays that are neither, concatenated in
  record order (:meth:`rpsagg_flower.payload.Layout.coordinate_mask`).

rpsagg-flower 0.1 sent these two records as they are (:data:`REPLY_CONFIG`, the arrays
apart or as one :func:`bundle`); the server still reads them.

Arrays the strategy names ``frozen`` are in no sketch, bitmap bit or ``plain/`` entry: they
never travel up, and the server keeps them as they are.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from numpy.typing import NDArray

from rpsagg import Encoded, Estimator
from rpsagg.quantize import dequantize, pack_codes, unpack_codes
from rpsagg.schemes import check_batch
from rpsagg.spec import derive_round_seed
from rpsagg_flower.payload import MARK_ABSENT, MARK_ZERO, Layout, marks_from_bytes
from rpsagg_flower.settings import nonce_from_bytes, nonce_to_bytes

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
    (:func:`rpsagg_flower.reply.pack_reply`).

    Parameters
    ----------
    msg : Encoded or None
        The estimator's message, or None for no sketch.
    client_seed, nonce : int
        The client's 64-bit seed and the round's nonce.
    plain : mapping of str to ndarray, optional
        The uncompressed arrays, by key.
    marks : mapping of str to bytes, optional
        The bitmaps, by entry name.
    scheme : str
        The scheme written when ``msg`` is None.

    Returns
    -------
    tuple of ArrayRecord and ConfigRecord
        The raw arrays and their description.
    """
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
    and the node id, so a client cannot choose its projection.

    Parameters
    ----------
    est : Estimator
        The round's estimator.
    arrays : ArrayRecord
        The reply's raw arrays (the view, :func:`encoded_to_records`).
    meta : ConfigRecord
        The view's description: seed, nonce, scheme, count, value bits.
    nonce : int
        This round's nonce.
    node_id : int
        The replying node's id.

    Returns
    -------
    Encoded
        The message, checked as the decoder checks it.

    Raises
    ------
    ValueError
        For a reply that does not fit ``est`` or the round.
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
