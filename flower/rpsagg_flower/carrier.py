"""Where a packed reply travels: one record of the reply's content.

The packed reply (:func:`rpsagg_flower.reply.pack_reply`) replaces the ClientApp's
``ArrayRecord`` under the same name (``"arrays"`` by default), so the reply has the records
FedAvg's reply has, no more (beside, in a checked round, :mod:`rpsagg_flower.dpcheck`'s
check record):

* a ``ConfigRecord`` with the one bytes entry :data:`REPLY_KEY` (36 B on the wire beyond
  the packed bytes for the example's CNN), while the packed reply fits in one of Flower's
  array chunks (:data:`CONFIG_LIMIT`, 5 MiB by default);
* else an ``ArrayRecord`` holding the one ``uint8`` ``Array`` :data:`REPLY_KEY` (``stype``
  :data:`STYPE_REPLY`), which Flower cuts into chunks (about 340 B more, negligible there).

:func:`read_reply` finds it again on the server, and reads rpsagg-flower 0.1's replies too.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from rpsagg_flower.dpcheck import CHECK_RECORD
from rpsagg_flower.payload import Layout
from rpsagg_flower.records import REPLY_CONFIG, unbundle
from rpsagg_flower.reply import unpack_reply

#: The packed reply's key in its record (a ``ConfigRecord`` entry or the one ``Array``).
REPLY_KEY = "rpsagg"
#: ``Array.stype`` of a packed reply carried as an ``Array`` (:data:`CONFIG_LIMIT`).
STYPE_REPLY = "rpsagg.reply"
#: Largest packed reply sent as a ``ConfigRecord`` entry: one of Flower's array chunks (5 MiB;
#: Flower's ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, not public API:
#: ``tests/flower/test_reply.py`` checks that they agree), so the record is about as large as
#: Flower's largest objects at most; a larger one travels as an ``Array`` that Flower chunks.
CONFIG_LIMIT = 5 * 2**20


def reply_record(packed: bytes) -> ConfigRecord | ArrayRecord:
    """The record that carries ``packed``: a ``ConfigRecord`` of one bytes entry
    :data:`REPLY_KEY` up to :data:`CONFIG_LIMIT` bytes, else an ``ArrayRecord`` of one
    ``uint8`` ``Array`` (``stype`` :data:`STYPE_REPLY`)."""
    if len(packed) <= CONFIG_LIMIT:
        return ConfigRecord({REPLY_KEY: packed})
    return ArrayRecord({REPLY_KEY: Array(dtype="uint8", shape=(len(packed),),
                                         stype=STYPE_REPLY, data=packed)})


def _carried(record: object) -> bytes | None:
    """The packed reply ``record`` carries, or None when it is no carrier."""
    if isinstance(record, ConfigRecord) and list(record.keys()) == [REPLY_KEY]:
        value = record[REPLY_KEY]
        return value if isinstance(value, bytes) else None
    if isinstance(record, ArrayRecord) and list(record.keys()) == [REPLY_KEY]:
        arr = record[REPLY_KEY]
        if arr.stype == STYPE_REPLY:
            if arr.dtype != "uint8" or tuple(arr.shape) != (len(arr.data),):
                raise ValueError(f"the compressed reply's Array is {arr.dtype}{list(arr.shape)} "
                                 f"with {len(arr.data)} B; it must be uint8 of its bytes")
            return bytes(arr.data)
    return None


def payload_records(content: RecordDict) -> list[str]:
    """The names of the records that carry a compressed reply (the packed reply's record;
    for rpsagg-flower 0.1's replies the ``rpsagg`` ``ConfigRecord`` and the
    ``ArrayRecord``\\ s); for a reply without one, its ``ArrayRecord``\\ s."""
    carriers = [name for name, rec in content.items() if _carried(rec) is not None]
    if carriers:
        return carriers
    names = list(content.array_records)
    return [*names, REPLY_CONFIG] if REPLY_CONFIG in content.config_records else names


def payload_bytes(content: RecordDict) -> int:
    """Flower's ``count_bytes`` (data and keys) of :func:`payload_records`: a reply's
    payload without Flower's objects around it."""
    return sum(content[name].count_bytes() for name in payload_records(content))


@dataclass(frozen=True)
class Reply:
    """A compressed reply, read (:func:`read_reply`).

    Attributes
    ----------
    arrays : ArrayRecord
        Its raw arrays (the view :mod:`rpsagg_flower.records` reads).
    meta : ConfigRecord
        Its description: seed, nonce, scheme, count, value bits, bitmaps.
    records : tuple of str
        The names of the reply's records that carry it.
    model_record : str
        The name under which the ClientApp's ``ArrayRecord`` was (where a FedAvg reply
        carries the model).
    """

    arrays: ArrayRecord
    meta: ConfigRecord
    records: tuple[str, ...]
    model_record: str


def read_reply(content: RecordDict, layout: Layout) -> Reply | None:
    """The compressed reply in ``content`` for a model of ``layout``: packed
    (:func:`unpack_reply`) or rpsagg-flower 0.1's records; None when ``content`` carries
    neither (a ClientApp without the mod). ``ValueError`` for a malformed one."""
    carriers = [(name, packed) for name, rec in content.items()
                if (packed := _carried(rec)) is not None]
    if carriers:
        if len(carriers) > 1:
            raise ValueError(f"the reply has {len(carriers)} compressed replies "
                             f"({[n for n, _ in carriers]})")
        name, packed = carriers[0]
        others = [n for n in content.array_records if n not in (name, CHECK_RECORD)]
        if others:
            raise ValueError(f"the reply has ArrayRecords {others} beside its compressed reply")
        arrays, meta = unpack_reply(packed, layout)
        return Reply(arrays, meta, (name,), name)
    if REPLY_CONFIG not in content.config_records:
        return None
    names = list(content.array_records)
    if len(names) != 1:
        raise ValueError(f"{len(names)} ArrayRecords in a compressed reply")
    return Reply(unbundle(content.array_records[names[0]]), content.config_records[REPLY_CONFIG],
                 (names[0], REPLY_CONFIG), names[0])


__all__ = [
    "CONFIG_LIMIT",
    "REPLY_KEY",
    "STYPE_REPLY",
    "Reply",
    "payload_bytes",
    "payload_records",
    "read_reply",
    "reply_record",
]
