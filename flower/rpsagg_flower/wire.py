"""Bytes on the wire: a reply's size as Flower 1.42 sends it.

Flower does not send a ``Message`` as one protobuf. It deflates the message into a tree of
inflatable objects (the ``Message`` with its metadata, its ``RecordDict``, each record, each
``Array`` of an ``ArrayRecord`` and each of the array's ``ArrayChunk``\\ s), and pushes the
content of every object, each once (identical objects, such as two all-zero chunks, share
an object id), to the SuperLink: a header (type, children's object ids, body length) and a
body (JSON references to the children, an ``Array``'s dtype, shape and stype, a chunk's
data, a record's entries). :func:`wire_bytes` adds up those contents, walking the tree
through the objects' public ``children``, ``object_id`` and ``deflate`` (what Flower's own
walk uses). The message's ``ObjectTree`` and the requests' framing (object ids repeated in
each push, run and node ids) travel as well and are not counted; the link's bytes, framing
and polling included, are measured by ``examples/flower-fashion-mnist/link_bytes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from flwr.app import ArrayRecord, Message, RecordDict


class Inflatable(Protocol):
    """What Flower pushes as one object: a ``Message``, a record, an ``Array``, a chunk."""

    @property
    def object_id(self) -> str: ...

    @property
    def children(self) -> Mapping[str, Inflatable] | None: ...

    def deflate(self) -> bytes: ...


def _objects(obj: Inflatable, into: dict[str, Inflatable]) -> dict[str, Inflatable]:
    """Every distinct object of ``obj``'s tree by its id, ``obj`` included (as Flower's
    object store holds them: an object occurring twice is one)."""
    for child_id, child in (obj.children or {}).items():
        if child_id not in into:
            _objects(child, into)
            into[child_id] = child
    return into


def wire_bytes(obj: Message | RecordDict | Inflatable,
               sizes: dict[str, int] | None = None) -> int:
    """Bytes of the object contents Flower pushes for ``obj`` and everything it holds.

    Parameters
    ----------
    obj : Message, RecordDict or InflatableObject
        A reply (its metadata counted too), a reply's content, or one record.
    sizes : dict of str to int, optional
        A cache of deflated sizes by object id, filled here: objects already in it (the
        same model's chunks in several replies) are not deflated again.

    Returns
    -------
    int
        The sum of ``len(o.deflate())`` over the distinct objects of ``obj``'s object tree
        (``obj`` included): what ``flwr`` writes to its object store and pushes.
    """
    cache = {} if sizes is None else sizes
    tree = _objects(obj, {})
    tree[obj.object_id] = obj
    total = 0
    for object_id, o in tree.items():
        if object_id not in cache:
            cache[object_id] = len(o.deflate())
        total += cache[object_id]
    return total


def distinct_wire_bytes(record: ArrayRecord) -> int:
    """Wire bytes of ``record`` were none of its data chunks alike.

    :func:`wire_bytes` counts an object once however often it occurs, as Flower pushes it;
    a model fresh from initialization has identical arrays (BatchNorm's zero biases and
    running means) that trained ones no longer share. This is the count for trained
    arrays of the same dtypes and shapes: FedAvg's reply of this model.

    Parameters
    ----------
    record : ArrayRecord
        The arrays.

    Returns
    -------
    int
        The record's deflated size (with one child id per array), plus each ``Array``'s,
        plus each of its chunks' (every chunk counted, repeats too).
    """
    # the record's header lists its children's ids, identical arrays once: 64 hex digits
    # and a comma for each repeat
    repeats = len(record) - len(record.children)
    return len(record.deflate()) + 65 * repeats + sum(
        len(arr.deflate()) + sum(len(chunk.deflate()) for _, chunk in arr.slice_array())
        for arr in record.values())


__all__ = ["distinct_wire_bytes", "wire_bytes"]
