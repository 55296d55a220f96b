"""rpsagg: communication-efficient distributed mean estimation with Rand-Proj-Spatial.

Clients compress their vectors with a seeded projection (the SRHT, or the randomized DCT when
d is not a power of two; ``Estimator.encode``) and send ``k``
floats plus a seed; the server regenerates every transform from its seed and decodes all
clients jointly (``Estimator.decode``).

The public surface is this package's namespace and the public modules
:mod:`rpsagg.spec` (seed derivation, the wire's integer streams),
:mod:`rpsagg.schemes` (the schemes and what their messages carry),
:mod:`rpsagg.projections` (the seeded projections and their joint operators),
:mod:`rpsagg.linalg` (the joint decode's solvers), :mod:`rpsagg.beta` (the unbiasing
scalars), :mod:`rpsagg.quantize` (b-bit value codes), :mod:`rpsagg.planning` (target
mode's budget rule), :mod:`rpsagg.device` (the decode
device), :mod:`rpsagg.simulate`, :mod:`rpsagg.synthetic` and :mod:`rpsagg.tasks`. Modules
whose names start with an underscore are internal: other packages import none of them.

Examples
--------
>>> import numpy as np, rpsagg
>>> est = rpsagg.make_estimator("rand-proj-spatial", n=4, k=16, d=100)
>>> xs = np.ones((4, 100))
>>> msgs = [est.encode(x, seed=s) for s, x in enumerate(xs)]
>>> est.decode(msgs).shape
(100,)
"""

from rpsagg._beta import BetaEstimate, cache_dir, spatial_beta
from rpsagg._blockwise import BlockwiseRandProjSpatial
from rpsagg._coordinates import FullEstimator, Induced, RandK, RandKWangni
from rpsagg._correlation import (
    CorrelationTracker,
    VectorCorrelationTracker,
    correlation_terms,
    estimate_correlation,
)
from rpsagg._dct import dct_matrix
from rpsagg._decode import SolveInfo
from rpsagg._encoded import Encoded
from rpsagg._error import ErrorEstimate
from rpsagg._error_coef import ErrorCoefficients
from rpsagg._estimators import (
    ESTIMATOR_NAMES,
    QUANTIZABLE,
    QUANTIZER_NAMES,
    DecodeResult,
    Estimator,
    make_estimator,
    round_encoding,
    wangni_probabilities,
)
from rpsagg._fwht import BACKEND as FWHT_BACKEND
from rpsagg._fwht import fwht
from rpsagg._planning import BudgetPlan, plan_budget, value_bytes
from rpsagg._projection import PROJECTIONS
from rpsagg._spatial import RandKSpatial, RandProjSpatial
from rpsagg._srht import srht_matrix
from rpsagg._version import __version__, add_version_flag, version_line
from rpsagg.spec import SPEC_VERSION, SPEC_VERSIONS, check_spec_version, padded_dim

__all__ = [
    "ESTIMATOR_NAMES",
    "FWHT_BACKEND",
    "PROJECTIONS",
    "QUANTIZABLE",
    "QUANTIZER_NAMES",
    "SPEC_VERSION",
    "SPEC_VERSIONS",
    "BetaEstimate",
    "BlockwiseRandProjSpatial",
    "BudgetPlan",
    "CorrelationTracker",
    "DecodeResult",
    "Encoded",
    "ErrorCoefficients",
    "ErrorEstimate",
    "Estimator",
    "FullEstimator",
    "Induced",
    "RandK",
    "RandKSpatial",
    "RandKWangni",
    "RandProjSpatial",
    "SolveInfo",
    "VectorCorrelationTracker",
    "__version__",
    "add_version_flag",
    "cache_dir",
    "check_spec_version",
    "correlation_terms",
    "dct_matrix",
    "estimate_correlation",
    "fwht",
    "make_estimator",
    "padded_dim",
    "plan_budget",
    "round_encoding",
    "spatial_beta",
    "srht_matrix",
    "value_bytes",
    "version_line",
    "wangni_probabilities",
]
