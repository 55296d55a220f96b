"""rpsagg-flower: Rand-Proj-Spatial and the other rpsagg estimators inside Flower.

Two pieces, one per side:

* :data:`rpsagg_mod` (client): ``ClientApp(mods=[rpsagg_mod])`` replaces each training
  reply's arrays with the estimator's message of the model update (``k`` values and a
  64-bit seed);
* :class:`RandProjSpatialFedAvg` (server): FedAvg that sends the estimator's settings and a
  per-round nonce, decodes the replies jointly and reports bytes up, the compression ratio
  and the estimated correlation R̂ as metrics.

Examples
--------
>>> from rpsagg_flower import RandProjSpatialFedAvg, rpsagg_mod
>>> strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=256, transform="avg")
"""

import rpsagg
from rpsagg_flower.compression import CompressionConfig
from rpsagg_flower.mod import client_mods, make_rpsagg_mod, rpsagg_mod
from rpsagg_flower.optim import (
    ServerAdagrad,
    ServerAdam,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
    make_server_optimizer,
)
from rpsagg_flower.payload import Layout, apply_update, flatten
from rpsagg_flower.settings import RoundEncoding
from rpsagg_flower.strategy import RandProjSpatialFedAvg

#: every rpsagg distribution carries one version (rpsagg._version)
__version__ = rpsagg.__version__

__all__ = [
    "CompressionConfig",
    "Layout",
    "RandProjSpatialFedAvg",
    "RoundEncoding",
    "ServerAdagrad",
    "ServerAdam",
    "ServerOptimizer",
    "ServerSGD",
    "ServerYogi",
    "__version__",
    "apply_update",
    "client_mods",
    "flatten",
    "make_rpsagg_mod",
    "make_server_optimizer",
    "rpsagg_mod",
]
