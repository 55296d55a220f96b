"""A request's ``job`` read from its bytes without parsing them (protobuf's wire format
walked by hand: no generated code, no copy of a submission's vectors).

The server routes each request to its job's engine by this field before the full parse
(:mod:`rpsagg_wire.v1.serde`), which then reports any malformed bytes.
"""

from __future__ import annotations

#: the field number of ``job`` in every request message
JOB_FIELD = 30


def peek_job(raw: bytes) -> str:
    """The ``job`` field (30) of a request's bytes, found by walking its top-level fields
    without parsing the rest (a submission's vectors are skipped by their lengths, not
    read); ``""`` when absent. Malformed bytes also give ``""``: the full parse that
    follows reports them."""
    pos, end, found = 0, len(raw), ""
    try:
        while pos < end:
            key, pos = _varint(raw, pos)
            number, kind = key >> 3, key & 7
            if kind == 0:
                _, pos = _varint(raw, pos)
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            elif kind == 2:
                size, pos = _varint(raw, pos)
                if number == JOB_FIELD:
                    found = raw[pos:pos + size].decode("utf-8")
                pos += size
            else:
                return ""
    except (IndexError, UnicodeDecodeError):
        return ""
    return found if pos == end else ""


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
