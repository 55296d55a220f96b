"""R̂, the correlation of a round's updates, from the messages the strategy decoded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpsagg import BlockwiseRandProjSpatial, Encoded, Estimator, FullEstimator, correlation_terms
from rpsagg.schemes import r_hat_schemes


def r_hat(est: Estimator, msgs: Sequence[Encoded]) -> float | None:
    """``sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2`` of the vectors behind ``msgs``.

    From the sketches for the schemes of ``rpsagg.schemes.r_hat_schemes()`` (ratio of
    unbiased estimates);
    blockwise Rand-Proj-Spatial sums both terms over its blocks (each block is a
    Rand-Proj-Spatial sketch of its own coordinates, and inner products add up over
    disjoint coordinates); exact for ``"full"``. None for the other schemes, whose
    messages do not give unbiased cross terms.
    """
    if not msgs:
        return None
    if isinstance(est, BlockwiseRandProjSpatial):
        cross = norms = 0.0
        for j in range(est.blocks):
            c, s = correlation_terms(est.block_messages(msgs, j))
            cross, norms = cross + c, norms + s
    elif isinstance(est, FullEstimator):
        xs = np.stack([m.values.astype(np.float64) for m in msgs])
        total = xs.sum(axis=0)
        norms = float(np.sum(xs * xs))
        cross = float(total @ total) - norms
    elif est.wire.scheme in r_hat_schemes():
        cross, norms = correlation_terms(msgs)
    else:
        return None
    return 0.0 if norms == 0.0 else float(cross / norms)
