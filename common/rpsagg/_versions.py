"""Wire-format versions: their ids and the one table of what each defines.

:mod:`rpsagg.spec` re-exports everything here; ``docs/wire-format.md``'s table of versions
is the normative text.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The derivation this library encodes with. ``rpsagg-seed-v2`` adds the subsampled
#: randomized DCT (projection ``"dct"``, stream ``rpsSHIFT``) to ``rpsagg-seed-v1``;
#: ``rpsagg-seed-v3`` adds quantized values (``value_bits``, EDEN, QSGD: packed codes, their
#: code books and the client's rounding stream ``rpsQRND_``). Each keeps every number of
#: the one before: an SRHT message encodes identically under all of them.
#: ``rpsagg-seed-v4`` adds the overlapping-blocks Hadamard projection (projection
#: ``"hblocks"``, stream ``rpsSIGN2``; ``rpsagg._hblocks``). ``rpsagg-seed-v5`` adds quantized
#: blockwise values (one float32 scale per block; ``rpsagg._blockwise``).
SPEC_V1 = "rpsagg-seed-v1"
SPEC_V2 = "rpsagg-seed-v2"
SPEC_V3 = "rpsagg-seed-v3"
SPEC_V4 = "rpsagg-seed-v4"
SPEC_V5 = "rpsagg-seed-v5"
SPEC_VERSION = SPEC_V5
#: Every version this library decodes, oldest first.
SPEC_VERSIONS = (SPEC_V1, SPEC_V2, SPEC_V3, SPEC_V4, SPEC_V5)

#: A message's values are b-bit codes with one float32 scale (§13).
QUANTIZED = "quantized values"
#: A blockwise message's values are b-bit codes with one float32 scale per block (§15).
QUANTIZED_BLOCKWISE = "quantized blockwise values"
#: The one table of version rules: every feature a message may use (the projections by
#: name) and the oldest version that defines it. A message needs the newest version among
#: its features' (:func:`required_spec`): rounds announce that version, encoders stamp it
#: and decoders refuse an older claim, naming the feature that needs it.
FEATURE_SPEC: dict[str, str] = {
    "srht": SPEC_V1,
    "dct": SPEC_V2,
    QUANTIZED: SPEC_V3,
    "hblocks": SPEC_V4,
    QUANTIZED_BLOCKWISE: SPEC_V5,
}


def message_features(projection: str, value_bits: int, block_size: int) -> tuple[str, ...]:
    """The keys of :data:`FEATURE_SPEC` a message uses.

    Parameters
    ----------
    projection : str
        Its projection (``""`` for schemes without one).
    value_bits : int
        Bits per value (32: float32 values; fewer: codes, :data:`QUANTIZED`).
    block_size : int
        Blockwise block size (0: not blockwise); quantized blockwise values are
        :data:`QUANTIZED_BLOCKWISE`.

    Returns
    -------
    tuple of str
    """
    out = [projection] if projection else []
    if value_bits < 32:
        out.append(QUANTIZED)
        if block_size:
            out.append(QUANTIZED_BLOCKWISE)
    return tuple(out)


def required_spec(features: Sequence[str]) -> tuple[str, str]:
    """The least version that defines every one of ``features`` (keys of
    :data:`FEATURE_SPEC`), and the feature that needs it (``""``: none, v1).

    Returns
    -------
    (version, feature) : tuple of str
    """
    version, needs = SPEC_V1, ""
    for feature in features:
        if feature not in FEATURE_SPEC:
            raise ValueError(f"no wire-format version defines {feature!r}")
        if not needs or SPEC_VERSIONS.index(FEATURE_SPEC[feature]) > SPEC_VERSIONS.index(version):
            version, needs = FEATURE_SPEC[feature], feature
    return version, needs


def check_spec_version(sent: str, required: str = SPEC_V1) -> str:
    """The version a message claims (``""``: a sender from before versions were sent, v1).

    Raises ``ValueError`` (``UnknownSpecVersion``) for a version this library does not
    speak and ``ValueError`` (``SpecTooOld``) for one older than ``required``.
    """
    version = sent or SPEC_V1
    if version not in SPEC_VERSIONS:
        raise UnknownSpecVersion(
            f"spec version {sent!r} is not spoken here; known: {', '.join(SPEC_VERSIONS)}"
        )
    if SPEC_VERSIONS.index(version) < SPEC_VERSIONS.index(required):
        shown = version if sent else f"{SPEC_V1} (no spec_version sent)"
        raise SpecTooOld(f"encoded with {shown}; this needs {required} or later")
    return version


class UnknownSpecVersion(ValueError):
    """A wire-format version this library does not implement."""


class SpecTooOld(ValueError):
    """A known wire-format version that lacks what is asked for."""
