"""The transforms T of the Rand-Proj-Spatial family.

All are affine, ``T(l) = (1 - c) + c l``; what differs is how ``c`` depends on the number
``n'`` of clients whose messages are decoded together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Transform:
    """A member of the family, resolved to ``c`` for any ``n'``.

    Attributes
    ----------
    kind : str
        ``"max"``, ``"one"``, ``"avg"``, ``"corr"`` or ``"auto"``.
    r : float or None
        The correlation R of ``corr(R)`` (relative to ``n``), or the prior of ``auto``.
    n : int
        Number of clients the transform was specified for.
    """

    kind: str
    r: float | None
    n: int

    def c_for(self, n_prime: int) -> float:
        """Coefficient ``c`` of ``T(l) = (1 - c) + c l`` when ``n'`` messages are decoded.

        ``corr(R)`` keeps the correlation fraction ``R / (n - 1)`` fixed as ``n'`` varies
        (identical vectors have R = n - 1 for any n). With one message every T gives
        ``T(1) = 1`` and ``c`` is irrelevant; 0 is returned.
        """
        if n_prime <= 1:
            return 0.0
        if self.kind == "max":
            return 1.0
        if self.kind == "one":
            return 0.0
        if self.kind == "avg" or (self.kind == "auto" and self.r is None):
            return n_prime / (2.0 * (n_prime - 1))
        assert self.r is not None
        frac = 0.0 if self.n <= 1 else self.r / (self.n - 1)
        return min(1.0, max(0.0, frac))

    def label(self) -> str:
        """Human-readable name, e.g. ``avg`` or ``corr(4)``."""
        if self.kind in ("max", "one", "avg"):
            return self.kind
        if self.kind == "auto":
            return "auto" if self.r is None else f"auto({self.r:.3g})"
        return f"corr({self.r:g})"


#: the transforms chosen by name (any other ``transform`` is a number R)
TRANSFORM_NAMES = ("avg", "max", "one", "auto")


def transform_option(transform: str | float, n: int) -> str | float:
    """A job's ``transform`` option as the estimators take it: a name of
    :data:`TRANSFORM_NAMES`, or the number R (given as a number or as its text, as on a
    command line: ``--transform 2.5``).

    Parameters
    ----------
    transform : str or float
        The option as given.
    n : int
        Clients decoded together (R must be in ``[0, n - 1]``).

    Returns
    -------
    str or float
        The name, or R as a float.

    Raises
    ------
    ValueError
        For text that is neither a name nor a number, or an R outside ``[0, n - 1]``
        (non-finite included).
    """
    if isinstance(transform, str) and transform not in TRANSFORM_NAMES:
        try:
            transform = float(transform)
        except ValueError:
            raise ValueError(f"transform must be one of {', '.join(TRANSFORM_NAMES)} or a "
                             f"number R; got {transform!r}") from None
    parse_transform(transform, n)
    return transform


def parse_transform(transform: str | float, n: int, prior_r: float | None = None) -> Transform:
    """Build a :class:`Transform` from the user-facing ``transform`` argument.

    Parameters
    ----------
    transform : {"avg", "max", "one", "auto"} or float
        The estimators' ``transform`` argument; a float R in ``[0, n - 1]`` is corr(R).
    n : int
        Clients decoded together.
    prior_r : float, optional
        The correlation prior of ``"auto"`` (None: avg while there is no prior).

    Returns
    -------
    Transform

    Raises
    ------
    ValueError
        For an unknown name, an R outside ``[0, n - 1]`` or a non-finite prior.
    """
    if isinstance(transform, bool):
        raise ValueError(
            f"transform must be 'max', 'one', 'avg', 'auto' or a float R; got {transform!r}"
        )
    if isinstance(transform, int | float):
        r = float(transform)
        if not math.isfinite(r) or not 0.0 <= r <= max(0, n - 1):
            raise ValueError(f"transform R must be in [0, n-1] = [0, {n - 1}]; got {transform}")
        return Transform("corr", r, n)
    if transform in TRANSFORM_NAMES[:3]:
        return Transform(transform, None, n)
    if transform == "auto":
        if prior_r is not None and not math.isfinite(prior_r):
            raise ValueError(f"prior_r must be finite; got {prior_r}")
        return Transform("auto", prior_r, n)
    raise ValueError(
        f"transform must be 'max', 'one', 'avg', 'auto' or a float R; got {transform!r}"
    )
