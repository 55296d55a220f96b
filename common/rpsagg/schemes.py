"""The schemes (``--estimator`` names) and what their messages carry.

The registry's public face, for the wire edge, the server and the client: what a scheme is
before any estimator is built (:func:`scheme_traits`, :func:`names_where`), what a
received message's scheme is (:func:`message_traits`, :func:`message_codebook`,
:func:`r_hat_schemes`), building an estimator from a job's whole option set
(:func:`estimator_from_options`), and an estimator's description of its messages
(:class:`WireProfile`, ``Estimator.wire``), which validates a received vector, and the
check that a batch of messages can be decoded together (:func:`check_batch`). Nothing
outside the registry matches scheme names.

Examples
--------
>>> from rpsagg.schemes import estimator_from_options, scheme_traits
>>> scheme_traits("induced").sends_indices, scheme_traits("rand-k").sends_indices
(True, False)
>>> est = estimator_from_options("eden", n=4, k=8, d=128, transform="max", bits=2)
>>> est.wire.scheme
'eden'
"""

from rpsagg._estimators import (
    BLOCK_SCHEME_PREFIX,
    DEFAULT_ESTIMATOR,
    MESSAGE_SCHEME_CODES,
    estimator_from_options,
    message_codebook,
    message_traits,
    names_where,
    r_hat_schemes,
    scheme_traits,
)
from rpsagg._transform import TRANSFORM_NAMES, transform_option
from rpsagg._validation import check_batch
from rpsagg._wireprofile import SchemeTraits, WireProfile

__all__ = [
    "BLOCK_SCHEME_PREFIX",
    "DEFAULT_ESTIMATOR",
    "MESSAGE_SCHEME_CODES",
    "TRANSFORM_NAMES",
    "SchemeTraits",
    "WireProfile",
    "check_batch",
    "estimator_from_options",
    "message_codebook",
    "message_traits",
    "names_where",
    "r_hat_schemes",
    "scheme_traits",
    "transform_option",
]
