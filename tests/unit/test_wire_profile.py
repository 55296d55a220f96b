"""Estimators describe their messages (``Estimator.wire``) and validate them.

Every scheme's profile is checked against what its ``encode`` actually produces, and each
way a received vector can break the profile is checked for its message.
"""

from __future__ import annotations

import numpy as np
import pytest

from rpsagg import make_estimator, padded_dim, round_encoding
from rpsagg._estimators import (
    ESTIMATOR_NAMES,
    QUANTIZABLE,
    QUANTIZER_NAMES,
    estimator_from_options,
    message_codebook,
    message_traits,
    scheme_traits,
)
from rpsagg.spec import SPEC_V1, SPEC_V2, SPEC_V3, SPEC_V4
from rpsagg_wire.v1.serde import VectorPayload

pytestmark = pytest.mark.unit

N, K, D = 4, 8, 24  # d not a power of two: rand-proj-spatial picks hblocks

# (make_estimator arguments, count name, count, exact, sends indices, spec, projection)
CASES = [
    ({"name": "full", "k": K}, "d", D, True, False, SPEC_V1, ""),
    ({"name": "rand-k", "k": K}, "k", K, True, False, SPEC_V1, ""),
    ({"name": "rand-k", "k": K, "value_bits": 4}, "k", K, True, False, SPEC_V3, ""),
    ({"name": "rand-k-spatial", "k": K}, "k", K, True, False, SPEC_V1, ""),
    ({"name": "rand-proj-spatial", "k": K}, "k", K, True, False, SPEC_V4, "hblocks"),
    ({"name": "rand-proj-spatial", "k": K, "projection": "dct"}, "k", K, True, False, SPEC_V2,
     "dct"),
    ({"name": "rand-proj-spatial", "k": K, "projection": "srht"}, "k", K, True, False,
     SPEC_V1, "srht"),
    ({"name": "rand-proj-spatial", "k": K, "block_size": 8}, "k", K, True, False, SPEC_V1,
     "srht"),
    ({"name": "rand-k-wangni", "k": K}, "d", D, False, True, SPEC_V1, ""),
    ({"name": "induced", "k": K}, "k", K, True, True, SPEC_V1, ""),
    ({"name": "eden", "bits": 2}, "d'", padded_dim(D), True, False, SPEC_V3, ""),
    ({"name": "qsgd", "bits": 3}, "d", D, True, False, SPEC_V3, ""),
]


def payload(est, x: np.ndarray, seed: int) -> VectorPayload:
    """What a client puts on the wire for ``x`` (as ``AggregationClient.encode`` does)."""
    enc = est.encode(x, seed)
    if enc.codes is None:
        return VectorPayload(enc.values, enc.indices)
    assert enc.scales is not None
    return VectorPayload(np.empty(0, np.float32), enc.indices, None, enc.codes,
                         enc.value_bits, float(enc.scales[0]))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[0].values())))
def test_profile_describes_what_encode_sends(case: tuple) -> None:
    kwargs, count_name, count, exact, indices, spec, projection = case
    est = make_estimator(n=N, d=D, **kwargs)
    wire = est.wire
    assert (wire.count_name, wire.max_values, wire.exact_count) == (count_name, count, exact)
    assert wire.sends_indices is indices
    assert wire.scheme == est.name and wire.traits.name == kwargs["name"]
    assert (wire.spec_version, wire.projection) == (spec, projection)
    assert round_encoding(est) == (spec, projection, kwargs.get("block_size", 0))
    assert wire.value_bits == est.value_bits
    # what the registry reads off a received message's scheme agrees with the estimator
    assert message_traits(wire.scheme) == (wire.traits, projection)
    assert message_codebook(wire.scheme) == wire.codebook
    rng = np.random.default_rng(3)
    for seed in range(20):
        x = rng.standard_normal(D)
        if seed % 2:
            x[rng.choice(D, D - 3, replace=False)] = 0.0  # Wangni keeps every non-zero
        p = payload(est, x, seed)
        est.validate(p, "vectors[0]")  # what encode sends is valid
        n_values = p.values.size if p.codes is None else p.codes.size
        assert n_values == count if exact else n_values <= count
        assert (p.indices is not None) is indices


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[0].values())))
def test_profile_rejects_a_wrong_count(case: tuple) -> None:
    kwargs, count_name, count, exact, *_ = case
    est = make_estimator(n=N, d=D, **kwargs)
    p = payload(est, np.ones(D), 1)
    n_bad = count + 1
    bad = VectorPayload(
        np.ones(n_bad, np.float32) if p.codes is None else np.empty(0, np.float32),
        None if p.indices is None else np.arange(n_bad) % D, None,
        None if p.codes is None else np.zeros(n_bad, np.uint32), p.value_bits, p.scale,
    )
    want = (f"vectors[2] has {n_bad} values; expected {count_name}={count}" if exact
            else f"vectors[2] has {n_bad} values; at most {count_name}={count}")
    with pytest.raises(ValueError, match=want.replace("[", r"\[").replace("]", r"\]")):
        est.validate(bad, "vectors[2]")


def test_indices_are_checked_where_sent() -> None:
    wangni = make_estimator("rand-k-wangni", n=N, k=K, d=D)
    vals = np.ones(3, np.float32)
    for idx, match in ((None, "needs indices for rand-k-wangni"),
                       (np.array([0, 1]), "has 2 indices for 3 values"),
                       (np.array([0, 1, D]), r"indices outside \[0, d\) = \[0, 24\)"),
                       (np.array([-1, 1, 2]), "indices outside")):
        with pytest.raises(ValueError, match=match):
            wangni.validate(VectorPayload(vals, idx))
    wangni.validate(VectorPayload(vals, np.array([0, 5, D - 1])))
    wangni.validate(VectorPayload(np.empty(0, np.float32), None))  # nothing kept (x = 0)
    rand_k = make_estimator("rand-k", n=N, k=3, d=D)
    with pytest.raises(ValueError, match="carries indices but rand-k sends none"):
        rand_k.validate(VectorPayload(vals, np.array([0, 1, 2])))


def test_values_bits_and_codes_are_checked() -> None:
    est = make_estimator("rand-k", n=N, k=3, d=D, value_bits=4)
    with pytest.raises(ValueError, match="sends 32-bit values; this job's rand-k sends 4-bit"):
        est.validate(VectorPayload(np.ones(3, np.float32)))
    codes = np.array([1, 2, 3], np.uint32)
    with pytest.raises(ValueError, match=r"message.scale must be finite and >= 0; got inf"):
        est.validate(VectorPayload(np.empty(0, np.float32), None, None, codes, 4, np.inf))
    qsgd = make_estimator("qsgd", n=N, d=3, bits=2)  # codes 0..2s = 0..6 in 3 bits
    with pytest.raises(ValueError, match="message: a QSGD code exceeds 2s = 6"):
        qsgd.validate(VectorPayload(np.empty(0, np.float32), None, None,
                                    np.array([1, 2, 7], np.uint32), 3, 1.0))
    qsgd.validate(VectorPayload(np.empty(0, np.float32), None, None,
                                np.array([1, 2, 6], np.uint32), 3, 1.0))
    eden = make_estimator("eden", n=N, d=4, bits=2)  # outer centroids are beyond +-1
    with pytest.raises(ValueError, match="message's values overflow float32"):
        eden.validate(VectorPayload(np.empty(0, np.float32), None, None,
                                    np.array([0, 1, 2, 3], np.uint32), 2, 3e38))
    est.validate(VectorPayload(np.empty(0, np.float32), None, None, codes, 4, 1.0))
    # a negative scale is refused; -0.0 is zero and accepted (docs/wire-format.md section 13)
    with pytest.raises(ValueError, match=r"message.scale must be finite and >= 0; got -1.0"):
        est.validate(VectorPayload(np.empty(0, np.float32), None, None, codes, 4, -1.0))
    negative_zero = VectorPayload(np.empty(0, np.float32), None, None, codes, 4, -0.0)
    est.validate(negative_zero)
    assert not np.any(est.wire.values_of(negative_zero))
    floats = make_estimator("rand-k", n=N, k=3, d=D)
    with pytest.raises(ValueError, match=r"message.values contains NaN or Inf"):
        floats.validate(VectorPayload(np.array([1, np.nan, 2], np.float32)))


def test_traits_of_the_registry() -> None:
    assert QUANTIZABLE == ("rand-k", "rand-k-spatial", "rand-proj-spatial")
    for name in ESTIMATOR_NAMES + QUANTIZER_NAMES:
        traits = scheme_traits(name)
        assert traits.name == name
        assert traits.takes_bits == (name in QUANTIZER_NAMES) == (not traits.takes_k)
    with pytest.raises(ValueError, match="unknown estimator 'bogus'"):
        scheme_traits("bogus")
    assert message_traits("rand-proj-spatial:dct")[1] == "dct"
    block, projection = message_traits("rand-proj-spatial:block=64")
    assert projection == "srht" and not block.supports_r_hat
    assert message_traits("rand-k")[1] == ""


def test_estimator_from_options_leaves_out_what_a_scheme_does_not_take() -> None:
    opts = {"n": N, "k": K, "d": D, "transform": "1.5", "projection": "srht",
            "block_size": 0, "value_bits": 32, "bits": 2}
    assert repr(estimator_from_options("rand-k", **opts)) == "RandK(n=4, k=8, d=24)"
    assert estimator_from_options("eden", **opts).wire.max_values == padded_dim(D)
    rps = estimator_from_options("rand-proj-spatial", **opts)
    assert rps.wire.projection == "srht" and rps.wire.transform == "corr(1.5)"
    spatial = estimator_from_options("rand-k-spatial", **{**opts, "transform": "auto"},
                                     prior_r=2.0)
    assert spatial.wire.transform is not None and "2" in spatial.wire.transform
