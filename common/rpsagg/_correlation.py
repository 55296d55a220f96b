"""Estimating the inter-client correlation R from the sketches alone.

With ``D`` the transform's dimension (d' for the SRHT, d for the randomized DCT and Rand-k),
``E[(D/k) G^T G] = I`` and ``G G^T = I_k``::

    sum_i ||x_i||^2          ~ (D/k) sum_i ||y_i||^2
    sum_{i != l} <x_i, x_l>  ~ (D/k)^2 (||sum_i G_i^T y_i||^2 - sum_i ||y_i||^2)

are both unbiased; R_hat is their ratio. Using the previous rounds' (smoothed) R_hat as the
prior of ``transform="auto"`` keeps the current round unbiased.

A submission of ``m`` vectors (k-means: one update per centroid) is tracked per vector slot
(:class:`VectorCorrelationTracker`): the slots' correlations differ (measured on k-means
with Fashion-MNIST, non-IID n = 50: R/(n - 1) from 0.16 to 0.74 in the same round, as
clusters are shared by more or fewer clients), so the c that fits slot 0 does not fit the
others (``docs/reproduction.md``, "Tasks").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rpsagg._encoded import Encoded
from rpsagg._estimators import message_traits, r_hat_schemes
from rpsagg._projection import joint_operator, operator_dim
from rpsagg.spec import randk_indices


def correlation_terms(encoded: Sequence[Encoded]) -> tuple[float, float]:
    """Unbiased estimates of ``sum_{i != l} <x_i, x_l>`` and ``sum_i ||x_i||^2``.

    Parameters
    ----------
    encoded : sequence of Encoded
        Messages of one round (Rand-Proj-Spatial, Rand-k or Rand-k-Spatial), distinct seeds.

    Returns
    -------
    (cross, norms) : tuple of float
    """
    batch = list(encoded)
    if not batch:
        raise ValueError("estimate_correlation needs at least one message")
    first = batch[0]
    try:
        traits, projection = message_traits(first.scheme)
    except ValueError:
        traits = None
    if traits is None or not traits.supports_r_hat:
        raise ValueError(
            f"estimate_correlation supports {', '.join(r_hat_schemes())}; got {first.scheme!r}"
        )
    if any(m.scheme != first.scheme or m.k != first.k or m.d != first.d for m in batch):
        raise ValueError("mixed schemes/k/d in one estimate_correlation call")
    if len({m.seed for m in batch}) != len(batch):
        raise ValueError("the same seed appears twice in one estimate_correlation call")
    k = first.k
    y = np.stack([m.values.astype(np.float64) for m in batch])
    if projection:
        dim = operator_dim(projection, first.d)
        back = joint_operator(projection, [m.seed for m in batch], k, dim).adjoint(y)
    else:
        dim = first.d
        back = np.zeros(dim)
        for m, row in zip(batch, y, strict=True):
            back[randk_indices(m.seed, k, dim)] += row
    sq = float(np.sum(y * y))
    scale = dim / k
    cross = scale * scale * (float(back @ back) - sq)
    return cross, scale * sq


def estimate_correlation(encoded: Sequence[Encoded]) -> float:
    """R_hat: the correlation ``sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2`` from sketches.

    Parameters
    ----------
    encoded : sequence of Encoded
        One round's messages (Rand-Proj-Spatial, Rand-k or Rand-k-Spatial).

    Returns
    -------
    float
        The ratio of the two unbiased estimates of :func:`correlation_terms`; 0.0 when every
        sketch is zero. Not clipped: it can fall outside ``[-1, n'-1]`` by sampling noise.
    """
    cross, norms = correlation_terms(encoded)
    return 0.0 if norms == 0.0 else cross / norms


@dataclass
class CorrelationTracker:
    """Exponentially smoothed correlation across rounds, for ``transform="auto"`` and for
    target mode's planning.

    Tracks the correlation *fraction* ``R_hat / (n' - 1)`` (the clients' mean pairwise
    correlation, in ``[-1/(n' - 1), 1]``) so rounds with different numbers of arrivals
    combine; :meth:`prior` converts back to R for ``n`` clients, at least 0, the range of
    the transforms; :meth:`planning_prior` keeps a negative R (vectors that disagree: the
    mean is small against them and the relative error larger), at least -1.

    Attributes
    ----------
    alpha : float
        Weight of the newest round (0 < alpha <= 1).
    fraction : float or None
        Smoothed fraction, None before the first round with two or more messages.
    last : float or None
        The newest round's fraction alone (not persisted: None after a restore).
    """

    alpha: float = 0.5
    fraction: float | None = None
    last: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1]; got {self.alpha}")

    def update(self, encoded: Sequence[Encoded]) -> float:
        """Fold in one round; returns that round's R_hat."""
        batch = list(encoded)
        r_hat = estimate_correlation(batch)
        self._fold(r_hat, len(batch))
        return r_hat

    def fold(self, r_hat: float, count: int) -> None:
        """Fold in a round's R_hat from ``count`` messages (fewer than two: nothing)."""
        self._fold(r_hat, count)

    def _fold(self, r_hat: float, count: int) -> None:
        if count >= 2:  # the fraction's own range; R_hat's noise may step outside it
            frac = float(np.clip(r_hat / (count - 1), -1.0 / (count - 1), 1.0))
            self.last = frac
            self.fraction = (
                frac
                if self.fraction is None
                else ((1.0 - self.alpha) * self.fraction + self.alpha * frac)
            )

    def prior(self, n: int) -> float | None:
        """Prior R for ``n`` clients, in ``[0, n - 1]`` (the transforms' range: a negative
        correlation decodes as none); None until a round has been seen."""
        return None if self.fraction is None else max(0.0, self.fraction) * max(0, n - 1)

    def planning_prior(self, n: int) -> float | None:
        """The R to plan a budget for: the least of the smoothed prior and the newest
        round's own, so a falling correlation is met at once while a rising one waits for
        the smoothing (the error grows faster as R falls than it shrinks as R rises)."""
        if self.fraction is None:
            return None
        frac = self.fraction if self.last is None else min(self.fraction, self.last)
        return max(-1.0, frac * max(0, n - 1))  # R >= -1: ||sum_i x_i||^2 >= 0


@dataclass
class VectorCorrelationTracker:
    """One :class:`CorrelationTracker` per vector slot of a submission.

    Vector j of every client is decoded with the prior of slot j, learned from the sketches
    of vector j alone. With ``m = 1`` this is exactly one :class:`CorrelationTracker`.

    Attributes
    ----------
    m : int
        Vectors per submission.
    alpha : float
        Weight of the newest round in every slot.
    slots : list of CorrelationTracker
        The per-slot trackers.
    """

    m: int
    alpha: float = 0.5
    slots: list[CorrelationTracker] = field(init=False)

    def __post_init__(self) -> None:
        if self.m < 1:
            raise ValueError(f"m must be >= 1; got {self.m}")
        self.slots = [CorrelationTracker(alpha=self.alpha) for _ in range(self.m)]

    def update(self, batches: Sequence[Sequence[Encoded]]) -> list[float]:
        """Fold in one round (``batches[j]``: every client's message of vector j); returns
        the round's R_hat per slot. All or nothing: a batch that R_hat rejects raises
        before any slot changes."""
        if len(batches) != self.m:
            raise ValueError(f"expected {self.m} batches (one per vector); got {len(batches)}")
        lists = [list(batch) for batch in batches]
        r_hats = [estimate_correlation(batch) for batch in lists]
        for slot, r_hat, batch in zip(self.slots, r_hats, lists, strict=True):
            slot._fold(r_hat, len(batch))
        return r_hats

    def fold(self, r_hats: Sequence[float], counts: Sequence[int]) -> None:
        """Fold in one round whose R_hat per slot was formed elsewhere (a blockwise
        decode's, :attr:`rpsagg.ErrorEstimate.r_hat`); ``counts[j]``: slot j's messages."""
        if len(r_hats) != self.m or len(counts) != self.m:
            raise ValueError(f"expected {self.m} R_hat values and counts (one per vector); "
                             f"got {len(r_hats)} and {len(counts)}")
        for slot, r_hat, count in zip(self.slots, r_hats, counts, strict=True):
            slot._fold(float(r_hat), int(count))

    def priors(self, n: int) -> list[float | None]:
        """Prior R of every slot for ``n`` clients (None for a slot not seen yet)."""
        return [slot.prior(n) for slot in self.slots]

    def planning_priors(self, n: int) -> list[float | None]:
        """:meth:`CorrelationTracker.planning_prior` of every slot."""
        return [slot.planning_prior(n) for slot in self.slots]

    @property
    def fractions(self) -> list[float | None]:
        """The smoothed fraction of every slot (what a server persists)."""
        return [slot.fraction for slot in self.slots]

    def restore(self, fractions: float | Sequence[float | None] | None) -> None:
        """Set the slots' state from :attr:`fractions`; a single number (the state a
        tracker of one slot for all vectors persisted) is given to every slot."""
        if fractions is None or isinstance(fractions, int | float):
            values: list[float | None] = [
                None if fractions is None else float(fractions)] * self.m
        else:
            values = [None if f is None else float(f) for f in fractions]
            if len(values) != self.m:
                raise ValueError(f"expected {self.m} fractions; got {len(values)}")
        for slot, value in zip(self.slots, values, strict=True):
            slot.fraction = value
