"""Bytes on the wire: a reply's size as Flower 1.42 sends it.

Flower does not send a ``Message`` as one protobuf. It deflates the message into a tree of
inflatable objects (the ``Message`` with its metadata, its ``RecordDict``, each record, each
``Array`` of an ``ArrayRecord`` and each of the array's ``ArrayChunk``\\ s), and pushes the
content of every object, each once (identical objects, such as two all-zero chunks, share
an object id), to the SuperLink: a header (type, children's object ids, body length) and a
body (JSON references to the children, an ``Array``'s dtype, shape and stype, a chunk's
data, a record's entries). :func:`wire_bytes` adds up those contents, as
``flwr.supercore.inflatable.get_all_nested_objects`` and each object's ``deflate`` produce
them. The message's ``ObjectTree`` and the requests' framing (object ids repeated in each
push, run and node ids) travel as well and are not counted.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import (
    InflatableObject,
    get_all_nested_objects,
    no_object_id_recompute,
)


def wire_bytes(obj: Message | RecordDict | InflatableObject,
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
    total = 0
    with no_object_id_recompute():
        for object_id, o in get_all_nested_objects(obj).items():
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
    with no_object_id_recompute():
        # the record's header lists its children's ids, identical arrays once: 64 hex
        # digits and a comma for each repeat
        repeats = len(record) - len(record.children)
        return len(record.deflate()) + 65 * repeats + sum(
            len(arr.deflate()) + sum(len(chunk.deflate()) for _, chunk in arr.slice_array())
            for arr in record.values())


__all__ = ["distinct_wire_bytes", "wire_bytes"]
