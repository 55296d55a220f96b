"""The estimator registry: every scheme by name, and building an estimator from options.

The only place that maps scheme names to estimators. Everything else asks an estimator
what it sends (:attr:`Estimator.wire <rpsagg._estimator.Estimator.wire>`) or the registry
what a scheme is (:func:`scheme_traits`, :func:`message_traits`).
"""

from __future__ import annotations

from collections.abc import Callable

from rpsagg._blockwise import BlockwiseRandProjSpatial
from rpsagg._coordinates import FullEstimator, Induced, RandK, RandKWangni, wangni_probabilities
from rpsagg._decode import DEFAULT_RTOL
from rpsagg._eden import Eden
from rpsagg._estimator import DecodeResult, Estimator, FloatArray
from rpsagg._projection import resolve_projection
from rpsagg._qsgd import Qsgd
from rpsagg._spatial import SCHEME, SCHEMES, RandKSpatial, RandProjSpatial
from rpsagg._transform import transform_option
from rpsagg._wireprofile import SchemeTraits

__all__ = [
    "DEFAULT_ESTIMATOR",
    "ESTIMATOR_NAMES",
    "QUANTIZABLE",
    "QUANTIZER_NAMES",
    "DecodeResult",
    "Estimator",
    "FloatArray",
    "RandProjSpatial",
    "estimator_from_options",
    "make_estimator",
    "message_codebook",
    "message_traits",
    "names_where",
    "round_encoding",
    "scheme_traits",
    "wangni_probabilities",
]

_FLOAT: dict[str, type[Estimator]] = {
    cls.name: cls
    for cls in (FullEstimator, RandK, RandKSpatial, RandProjSpatial, RandKWangni, Induced)
}
_QUANTIZERS: dict[str, type[Estimator]] = {cls.name: cls for cls in (Eden, Qsgd)}
_TRAITS = {name: cls.traits for name, cls in (_FLOAT | _QUANTIZERS).items()}

ESTIMATOR_NAMES = tuple(_FLOAT)
#: Quantizer baselines (``bits=``): every coordinate, rotated (EDEN) or not (QSGD), as codes.
QUANTIZER_NAMES = tuple(_QUANTIZERS)
#: The estimator a server runs unless told otherwise.
DEFAULT_ESTIMATOR = RandProjSpatial.name


#: One byte per message scheme, for compact binary formats (rpsagg-flower's packed reply):
#: fixed, a code is never reused for another scheme. Blockwise Rand-Proj-Spatial's message
#: schemes (:data:`BLOCK_SCHEME_PREFIX` and the block size) have one code of their own.
MESSAGE_SCHEME_CODES = {"full": 1, "rand-k": 2, "rand-k-spatial": 3, "rand-proj-spatial": 4,
                        "rand-k-wangni": 5, "induced": 6, "eden": 7, "qsgd": 8,
                        "rand-proj-spatial:dct": 9, "rand-proj-spatial:hblocks": 10}
#: How blockwise Rand-Proj-Spatial's message schemes start (``rand-proj-spatial:block=<b>``).
BLOCK_SCHEME_PREFIX = f"{RandProjSpatial.name}:block="


def scheme_traits(name: str) -> SchemeTraits:
    """What the scheme ``name`` (an ``--estimator`` name) is; ``ValueError`` if unknown."""
    if name not in _TRAITS:
        raise ValueError(
            f"unknown estimator {name!r}; expected one of "
            f"{', '.join(ESTIMATOR_NAMES + QUANTIZER_NAMES)}"
        )
    return _TRAITS[name]


def names_where(test: Callable[[SchemeTraits], bool]) -> tuple[str, ...]:
    """The scheme names whose traits pass ``test``, in registry order."""
    return tuple(name for name, traits in _TRAITS.items() if test(traits))


#: Estimators whose k values may be sent as b-bit codes (``value_bits``).
QUANTIZABLE = names_where(lambda t: t.quantizable)


#: The message schemes that name a projection other than the SRHT, and that projection.
_NAMED_PROJECTIONS = {scheme: proj for proj, scheme in SCHEMES.items() if proj != "srht"}


def _class_of_message(scheme: str) -> type[Estimator]:
    if scheme in _NAMED_PROJECTIONS:
        return RandProjSpatial
    if scheme.startswith(SCHEME + ":block="):
        return BlockwiseRandProjSpatial
    scheme_traits(scheme)  # raises for an unknown name
    return (_FLOAT | _QUANTIZERS)[scheme]


def message_traits(scheme: str) -> tuple[SchemeTraits, str]:
    """The traits behind a message scheme (``Encoded.scheme``) and its projection.

    Returns
    -------
    traits : SchemeTraits
        Of the estimator that sends such messages.
    projection : str
        ``"srht"``, ``"dct"`` or ``"hblocks"`` for a seeded projection, ``""`` otherwise.
    """
    traits = _class_of_message(scheme).traits
    if scheme in _NAMED_PROJECTIONS:
        return traits, _NAMED_PROJECTIONS[scheme]
    return traits, "srht" if traits.takes_projection else ""


def message_codebook(scheme: str) -> str:
    """The code book of a message scheme's quantized values (``rpsagg._quantize``)."""
    return _class_of_message(scheme).codebook


def r_hat_schemes() -> tuple[str, ...]:
    """The message schemes whose messages estimate the correlation R."""
    out: list[str] = []
    for name in names_where(lambda t: t.supports_r_hat):
        out.extend(SCHEMES.values() if _TRAITS[name].takes_projection else (name,))
    return tuple(out)


def round_encoding(estimator: Estimator) -> tuple[str, str, int]:
    """What a client needs to encode for ``estimator``: ``(spec_version, projection, block)``.

    ``spec_version`` is the oldest wire format that defines the encoding (a client speaking
    it or any later version can encode), ``projection`` is ``"srht"``/``"dct"`` for
    Rand-Proj-Spatial and ``""`` for schemes without one, ``block`` is the blockwise block
    size (0 when not blockwise). These are the ``RoundInfo`` fields of ``docs/protocol.md``.
    """
    wire = estimator.wire
    return wire.spec_version, wire.projection, wire.block_size


def estimator_from_options(
    name: str,
    *,
    n: int,
    k: int,
    d: int,
    transform: str | float = "avg",
    prior_r: float | None = None,
    projection: str = "auto",
    block_size: int = 0,
    value_bits: int = 32,
    bits: int = 0,
) -> Estimator:
    """Build ``name`` from a job's whole option set, passing it only the options it takes.

    A server's configuration and a client's ``RoundInfo`` carry every option whatever the
    scheme; this is :func:`make_estimator` with those that do not apply to ``name`` left
    out (``k`` for the quantizers, ``transform`` and ``prior_r`` for schemes without a
    transform, ``prior_r`` unless ``transform="auto"``, ``projection`` and ``block_size``
    (0: none) for schemes without a projection). A ``transform`` string other than
    ``avg``, ``max``, ``one`` and ``auto`` is read as the number R (``--transform 2.5``).
    """
    traits = scheme_traits(name)
    if traits.takes_bits:
        return make_estimator(name, n=n, d=d, bits=bits)
    if not traits.takes_transform:
        transform, prior_r = "avg", None
    else:
        transform = transform_option(transform, n)
    if not traits.takes_projection:
        projection, block_size = "auto", 0
    return make_estimator(
        name, n=n, k=k, d=d, transform=transform,
        prior_r=prior_r if transform == "auto" else None, projection=projection,
        block_size=block_size or None, value_bits=value_bits,
    )  # fmt: skip


def make_estimator(
    name: str,
    *,
    n: int,
    k: int | None = None,
    d: int,
    transform: str | float = "avg",
    prior_r: float | None = None,
    method: str = "auto",
    rtol: float = DEFAULT_RTOL,
    block_size: int | None = None,
    bits: int | None = None,
    value_bits: int = 32,
    projection: str = "auto",
    device: str | None = None,
    threads: int | None = None,
    error_tol: float | None = None,
) -> Estimator:
    """Build an estimator by name.

    Parameters
    ----------
    name : str
        ``"full"``, ``"rand-k"``, ``"rand-k-spatial"``, ``"rand-proj-spatial"``,
        ``"rand-k-wangni"``, ``"induced"``, ``"eden"`` or ``"qsgd"``.
    n, k, d : int
        Number of clients (``>= 1``), per-client budget (``1 <= k <= d``; not used by
        ``"eden"`` and ``"qsgd"``, which send every coordinate), dimension.
    transform : {"avg", "max", "one", "auto"} or float
        Spatial schemes only. A float R in ``[0, n-1]`` is the corr(R) transform;
        ``"auto"`` uses corr(``prior_r``), or avg while there is no prior.
    prior_r : float, optional
        Prior correlation for ``transform="auto"`` (e.g. a smoothed
        :func:`estimate_correlation` of earlier rounds); clipped to ``[0, n-1]``.
    method : {"auto", "exact", "cg"}
        Rand-Proj-Spatial's joint solver.
    rtol : float
        Relative residual target of the matrix-free solver.
    block_size : int, optional
        Rand-Proj-Spatial only: a power of two; encode and decode each block of
        ``block_size`` coordinates independently (for very large d; see
        ``docs/performance.md``). The message scheme becomes
        ``rand-proj-spatial:block=<block_size>``.
    bits : int, optional
        ``"eden"`` (1, 2, 4 or 8 bits per coordinate of the rotated vector) and ``"qsgd"``
        (``s = 2^bits - 1`` levels plus a sign bit, bits in [1, 16]) only; required there.
    value_bits : int
        ``"rand-k"``, ``"rand-k-spatial"`` and ``"rand-proj-spatial"``: bits per sent value
        (1..32); below 32 the k values are sent as unbiased stochastically rounded b-bit
        codes with one float32 scale per message (``rpsagg._quantize``); with
        ``block_size``, one float32 scale per block (``rpsagg._blockwise``).
    projection : {"auto", "srht", "dct", "hblocks"}
        Rand-Proj-Spatial only: the seeded projection (see :class:`RandProjSpatial`;
        ``"auto"``: the SRHT when d is a power of two, the randomized DCT otherwise). The
        blockwise estimator always uses the SRHT.
    device : str, optional
        Rand-Proj-Spatial only: decode on this PyTorch device (``"cuda"``, ``"cpu"``;
        the ``rpsagg[torch]`` extra). None (default): numpy.
    threads : int, optional
        Rand-Proj-Spatial only: CPU threads of the numpy decode (default: all cores).
    error_tol : float, optional
        Rand-Proj-Spatial with the SRHT (blockwise too), numpy decode: the conjugate
        gradients also stop once the solve moves the estimate by at most ``error_tol``
        times a lower bound on the estimator's RMS error (``RandProjSpatial``); None
        (default): ``rtol`` alone.

    Returns
    -------
    Estimator
    """
    if name in _QUANTIZERS:
        if transform != "avg" or prior_r is not None or block_size is not None or (
            projection != "auto" or device is not None or threads is not None
        ):
            raise ValueError(
                f"transform, prior_r, block_size, projection, device and threads do not apply "
                f"to {name!r}"
            )
        if value_bits != 32:
            raise ValueError(f"{name!r} takes bits=, not value_bits=")
        if bits is None:
            raise ValueError(f"{name!r} needs bits=")
        if k is not None and k != d:
            raise ValueError(f"{name!r} sends every coordinate; leave k out (or k = d)")
        quantizer: Callable[[int, int, int], Estimator] = _QUANTIZERS[name]
        return quantizer(n, d, bits)
    if bits is not None:
        raise ValueError(f"bits applies to {' and '.join(map(repr, QUANTIZER_NAMES))}; use "
                         f"value_bits for {name!r}")
    if k is None:
        raise ValueError(f"{name!r} needs k=")
    if value_bits != 32 and name not in (*QUANTIZABLE, *_NAMED_PROJECTIONS):
        raise ValueError(f"value_bits applies to {', '.join(QUANTIZABLE)}, not {name!r}")
    if error_tol is not None and name not in (SCHEME, *_NAMED_PROJECTIONS):
        raise ValueError(f"error_tol applies to rand-proj-spatial only, not {name!r}")
    est = _make_float_estimator(
        name, n, k, d, transform, prior_r, method, rtol, block_size, projection, device, threads,
        error_tol,
    )
    if value_bits != 32:
        est._set_value_bits(value_bits)
    return est


def _make_float_estimator(
    name: str,
    n: int,
    k: int,
    d: int,
    transform: str | float,
    prior_r: float | None,
    method: str,
    rtol: float,
    block_size: int | None,
    projection: str,
    device: str | None,
    threads: int | None,
    error_tol: float | None = None,
) -> Estimator:
    if name in _NAMED_PROJECTIONS:  # the message scheme names its projection
        name, projection = SCHEME, resolve_projection(_NAMED_PROJECTIONS[name], d)
    if projection != "auto" and name != SCHEME:
        raise ValueError(f"projection applies to rand-proj-spatial only, not {name!r}")
    if block_size is not None:
        if name != SCHEME:
            raise ValueError(f"block_size applies to rand-proj-spatial only, not {name!r}")
        if projection not in ("auto", "srht"):
            raise ValueError(
                f"the blockwise estimator uses the SRHT; got projection={projection!r}"
            )
        return BlockwiseRandProjSpatial(
            n, k, d, block_size, transform, prior_r, method, rtol, device=device,
            threads=threads, error_tol=error_tol,
        )
    if name == SCHEME:
        return RandProjSpatial(n, k, d, transform, prior_r, method, rtol, projection,
                               device=device, threads=threads, error_tol=error_tol)
    if device is not None or threads is not None:
        raise ValueError(f"device and threads apply to rand-proj-spatial only, not {name!r}")
    if name == RandKSpatial.name:
        return RandKSpatial(n, k, d, transform, prior_r)
    if transform != "avg" or prior_r is not None:
        raise ValueError(f"transform applies to the spatial estimators only, not {name!r}")
    simple: Callable[[int, int, int], Estimator] = _FLOAT[scheme_traits(name).name]
    return simple(n, k, d)
