"""R̂, the correlation of a round's updates, from the messages the strategy decoded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rpsagg import BlockwiseRandProjSpatial, Encoded, Estimator, correlation_terms
from rpsagg.projections import block_seed

#: Schemes whose sketches give unbiased correlation terms (``rpsagg.correlation_terms``).
SKETCHED = ("rand-proj-spatial", "rand-proj-spatial:dct", "rand-k", "rand-k-spatial")


def r_hat(est: Estimator, msgs: Sequence[Encoded]) -> float | None:
    """``sum_{i != l} <x_i, x_l> / sum_i ||x_i||^2`` of the vectors behind ``msgs``.

    From the sketches for the schemes of :data:`SKETCHED` (ratio of unbiased estimates);
    blockwise Rand-Proj-Spatial sums both terms over its blocks (each block is a
    Rand-Proj-Spatial sketch of its own coordinates, and inner products add up over
    disjoint coordinates); exact for ``"full"``. None for the other schemes, whose
    messages do not give unbiased cross terms.
    """
    if not msgs:
        return None
    if est.name in SKETCHED:
        cross, norms = correlation_terms(msgs)
    elif isinstance(est, BlockwiseRandProjSpatial):
        cross = norms = 0.0
        offset = 0
        for j, kb in enumerate(est.budgets):
            block = [
                Encoded("rand-proj-spatial", block_seed(m.seed, j), kb, est.block_size,
                        m.values[offset : offset + kb])
                for m in msgs
            ]
            c, s = correlation_terms(block)
            cross, norms = cross + c, norms + s
            offset += kb
    elif est.name == "full":
        xs = np.stack([m.values.astype(np.float64) for m in msgs])
        total = xs.sum(axis=0)
        norms = float(np.sum(xs * xs))
        cross = float(total @ total) - norms
    else:
        return None
    return 0.0 if norms == 0.0 else float(cross / norms)
