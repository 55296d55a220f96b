"""What RandProjSpatialFedAvg compresses and how: :class:`CompressionConfig`, one checked
object apart from FedAvg's own settings.

``RandProjSpatialFedAvg(CompressionConfig("rand-proj-spatial", k=250), min_train_nodes=10)``
takes it whole; ``RandProjSpatialFedAvg("rand-proj-spatial", k=250, min_train_nodes=10)`` is
the same, its compression keywords gathered into one (:meth:`CompressionConfig.split`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rpsagg import ESTIMATOR_NAMES, QUANTIZER_NAMES
from rpsagg.schemes import DEFAULT_ESTIMATOR, scheme_traits
from rpsagg_flower.payload import Layout


@dataclass(frozen=True)
class CompressionConfig:
    """The compression of a Flower strategy's training rounds, checked when built.

    Parameters
    ----------
    estimator : str
        A name of ``rpsagg.ESTIMATOR_NAMES`` or ``rpsagg.QUANTIZER_NAMES``.
    k : int, optional
        Values per client (``1 <= k <= d``); not for ``"eden"`` and ``"qsgd"``.
    transform : {"avg", "max", "one", "auto"} or float
        The spatial estimators' transform; ``"auto"`` uses the smoothed R̂ of earlier rounds
        (``rpsagg.CorrelationTracker``; avg in the first round).
    value_bits : int
        32, or 1..31 to send the values of ``rand-k``, ``rand-k-spatial`` and
        ``rand-proj-spatial`` as unbiased b-bit codes with one float32 scale.
    bits : int, optional
        Bits per coordinate of ``"eden"`` (1, 2, 4, 8) and ``"qsgd"`` (1..16).
    block_size : int, "auto" or None
        Rand-Proj-Spatial: encode blocks of this many (a power of two) coordinates
        independently (with ``value_bits < 32``, one float32 scale per block). ``"auto"``:
        blocks of 2^18 when the model has more than 2^20 coordinates, else one transform.
        None: one transform.
    projection : {"auto", "srht", "dct", "hblocks"}
        Rand-Proj-Spatial's projection (``rpsagg.make_estimator``).
    weighted : bool
        Weight each update by the reply's ``weighted_by_key`` metric, as FedAvg does
        (clients scale before encoding, the server divides by the mean weight); False:
        the plain mean of the updates.
    correlation_alpha : float
        Smoothing of R̂ across rounds for ``transform="auto"`` and ``target_rel_error``.
    uncompressed : tuple of str
        Floating-point arrays to send uncompressed beside the sketch (e.g. BatchNorm
        statistics); arrays that are not floating point always are. The server averages
        them as FedAvg does (integers rounded, booleans by weighted majority).
    missing_payload : {"raise", "drop"}
        A reply without the rpsagg payload (a ClientApp without the rpsagg mod):
        ``"raise"`` fails the run with a ``RuntimeError``; ``"drop"`` leaves it out of the
        round with a warning.
    error_feedback : bool
        Clients keep the part of their update the server did not apply in their context
        state and add it to the next round's update (error feedback); the server applies
        ``lr`` times the decoded mean. Needs a ``ServerSGD`` without momentum (or none).
    solver : {"auto", "exact", "cg"}
        The spatial decoders' joint solver (``rpsagg.make_estimator``'s ``method``):
        ``"auto"`` builds the dense ``nk x nk`` Gram matrix of a small system only where
        that is cheaper than the Krylov solver (``docs/flower.md``, "Decode time");
        ``"cg"`` and ``"exact"`` force one or the other.
    error_tol : float, "auto" or None
        Rand-Proj-Spatial with the SRHT (blockwise included): the conjugate gradients also
        stop once the solve moves the estimate by at most ``error_tol`` times a lower
        bound on the estimator's RMS error (``rpsagg.make_estimator``'s ``error_tol``).
        ``"auto"`` (default): 1e-2 for blockwise rounds (a model of more than 2^20
        compressed coordinates, or ``block_size`` given), none for the others. None: the
        residual target alone, every round. The other decoders ignore it.
    per_layer : bool or mapping of str to int
        Compress each compressed array on its own (one estimator message per array, its
        own seed) instead of the flattened update: ``True`` splits the budget ``k`` in
        proportion to the arrays' sizes (``max(1, round(k d_j / d))``; for ``"eden"`` and
        ``"qsgd"`` each array is quantized on its own), a mapping gives each array's ``k``
        by name. ``rpsagg.r-hat`` and ``rpsagg.beta`` are not reported per layer, and
        ``transform="auto"`` then stays at ``"avg"``.
    target_rel_error : float, optional
        Choose each round's k: the smallest k in ``[k_min, k]`` whose predicted relative
        error, for the last round's number of replies at the least of the smoothed and the
        newest R̂ (0 while none is known; a negative R̂ as it is, down to -1), is at most
        this (``rpsagg.planning.BudgetPolicy``, the server's rule); ``k`` when none is, and
        in round 1. Needs ``k``, an estimator that takes k (not ``"eden"`` or ``"qsgd"``)
        and ``per_layer=False``. The k a round used is its metric ``rpsagg.k``.
    k_min : int
        The smallest k ``target_rel_error`` may choose (``1 <= k_min <= k``).
    frozen : tuple of str
        Arrays known not to be trained (a frozen backbone, an embedding not being tuned):
        clients never send them and the server keeps them bit for bit. Arrays that a
        client did not change are detected anyway (the reply's ``zero`` bitmap); naming
        them here saves the bitmap's check and keeps them out of ``d``.
    partial : {"refuse", "allow"}
        A reply that carries only some of the model's arrays (a PEFT/LoRA ClientApp that
        returns its adapters only): ``"refuse"`` fails the run with a ``RuntimeError``
        naming the node and the arrays it lacks; ``"allow"`` averages each array over the
        replies that carry it (``docs/flower.md``, "Frozen arrays and partial replies").

    Raises
    ------
    ValueError
        Settings that do not fit: an unknown ``estimator``, ``partial``,
        ``missing_payload``, ``solver``, ``error_tol`` or ``block_size``;
        ``target_rel_error`` that is not positive, or without ``k >= k_min >= 1``, an
        estimator that takes k and ``per_layer=False``.

    Examples
    --------
    >>> from rpsagg_flower import CompressionConfig
    >>> config = CompressionConfig("rand-proj-spatial", k=4096, value_bits=4)
    >>> config.k, config.value_bits
    (4096, 4)
    """

    estimator: str = DEFAULT_ESTIMATOR
    k: int | None = None
    transform: str | float = "avg"
    value_bits: int = 32
    bits: int | None = None
    block_size: int | str | None = "auto"
    projection: str = "auto"
    weighted: bool = True
    correlation_alpha: float = 0.5
    uncompressed: tuple[str, ...] = ()
    missing_payload: str = "raise"
    error_feedback: bool = False
    solver: str = "auto"
    error_tol: float | str | None = "auto"
    per_layer: bool | Mapping[str, int] = False
    target_rel_error: float | None = None
    k_min: int = 1
    frozen: tuple[str, ...] = field(default=())
    partial: str = "refuse"

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked, normalized values
        set_(self, "uncompressed", tuple(self.uncompressed))
        set_(self, "frozen", tuple(self.frozen))
        if isinstance(self.per_layer, Mapping):
            set_(self, "per_layer", dict(self.per_layer))
        else:
            set_(self, "per_layer", bool(self.per_layer))
        _one_of("partial", self.partial, ("refuse", "allow"))
        _one_of("missing_payload", self.missing_payload, ("raise", "drop"))
        _one_of("solver", self.solver, ("auto", "exact", "cg"))
        if self.estimator not in ESTIMATOR_NAMES + QUANTIZER_NAMES:
            raise ValueError(f"unknown estimator {self.estimator!r}; expected one of "
                             f"{', '.join(ESTIMATOR_NAMES + QUANTIZER_NAMES)}")
        if self.block_size not in ("auto", None) and not isinstance(self.block_size, int):
            raise ValueError(f"block_size must be an int, 'auto' or None; got "
                             f"{self.block_size!r}")
        tol = self.error_tol
        if tol is not None and tol != "auto":
            if isinstance(tol, bool | str) or not 0 < float(tol) < 1:
                raise ValueError(f"error_tol must be in (0, 1), 'auto' or None; got {tol!r}")
            set_(self, "error_tol", float(tol))
        self._check_target()
        set_(self, "k_min", int(self.k_min))

    def _check_target(self) -> None:
        target = self.target_rel_error
        if target is None:
            return
        if not (isinstance(target, int | float) and target > 0):
            raise ValueError(f"target_rel_error must be a positive number; got {target!r}")
        if not scheme_traits(self.estimator).takes_k or self.per_layer:
            raise ValueError("target_rel_error chooses k: it needs an estimator that takes k "
                             "(not eden or qsgd) and per_layer=False")
        if self.k is None or not 1 <= self.k_min <= self.k:
            raise ValueError(f"target_rel_error needs k (the largest k a round may use) >= "
                             f"k_min >= 1; got k={self.k!r}, k_min={self.k_min!r}")
        object.__setattr__(self, "target_rel_error", float(target))

    @classmethod
    def split(cls, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``options`` as this class's keywords and the others (FedAvg's)."""
        names = {f.name for f in fields(cls)}
        ours = {key: value for key, value in options.items() if key in names}
        return ours, {key: value for key, value in options.items() if key not in names}


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be {', '.join(map(repr, allowed[:-1]))} or "
                         f"{allowed[-1]!r}; got {value!r}")


def layer_budgets(per_layer: bool | Mapping[str, int], k: int | None, layout: Layout
                  ) -> tuple[int, ...]:
    """Each compressed array's k under ``per_layer``: the mapping's (every compressed array
    must have one), or ``k`` split in proportion to the arrays' sizes,
    ``max(1, round(k d_j / d))`` (0 each without ``k``: a target decides)."""
    keys, sizes = layout.compressed_keys, layout.compressed_sizes
    if isinstance(per_layer, Mapping):
        missing = [key for key in keys if key not in per_layer]
        if missing:
            raise ValueError(f"per_layer gives no k for the arrays {missing}")
        return tuple(int(per_layer[key]) for key in keys)
    return tuple(max(1, round(k * size / layout.d)) if k else 0 for size in sizes)


__all__ = ["CompressionConfig", "layer_budgets"]
