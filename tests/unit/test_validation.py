"""Bad input raises ValueError naming the broken constraint."""

from __future__ import annotations

import numpy as np
import pytest

import rpsagg

pytestmark = pytest.mark.unit


def est(name: str = "rand-proj-spatial", **kw: object) -> rpsagg.Estimator:
    args: dict[str, object] = {"n": 4, "k": 4, "d": 20}
    args.update(kw)
    return rpsagg.make_estimator(name, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n must be >= 1"),
        ({"k": 0}, "k must be >= 1"),
        ({"k": 21}, r"k must be in \[1, d\]"),
        ({"d": 0}, "d must be >= 1"),
        ({"n": 2.5}, "n must be an integer"),
        ({"transform": "median"}, "transform must be"),
        ({"transform": 3.5}, r"transform R must be in \[0, n-1\]"),
        ({"transform": -1.0}, r"transform R must be in \[0, n-1\]"),
        ({"method": "qr"}, "method must be"),
    ],
)
def test_constructor_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        est(**kwargs)


def test_unknown_estimator_and_transform_on_non_spatial() -> None:
    with pytest.raises(ValueError, match="unknown estimator"):
        est("rand-q")
    with pytest.raises(ValueError, match="spatial estimators only"):
        est("rand-k", transform="max")


@pytest.mark.parametrize("name", rpsagg.ESTIMATOR_NAMES)
def test_encode_errors(name: str) -> None:
    e = est(name)
    good = np.ones(20)
    with pytest.raises(ValueError, match="finite"):
        e.encode(np.r_[good[:-1], np.nan], 1)
    with pytest.raises(ValueError, match="finite"):
        e.encode(np.r_[good[:-1], np.inf], 1)
    with pytest.raises(ValueError, match=r"shape \(20,\)"):
        e.encode(np.ones(21), 1)
    with pytest.raises(ValueError, match=r"shape \(20,\)"):
        e.encode(np.ones((2, 10)), 1)
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\^64\)"):
            e.encode(good, seed)
    with pytest.raises(ValueError, match="seed must be an integer"):
        e.encode(good, 1.0)  # type: ignore[arg-type]
    assert e.encode(good, 2**64 - 1).seed == 2**64 - 1


@pytest.mark.parametrize("name", rpsagg.ESTIMATOR_NAMES)
def test_decode_errors(name: str) -> None:
    e = est(name)
    x = np.arange(20.0)
    msgs = [e.encode(x, s) for s in (1, 2, 3)]
    with pytest.raises(ValueError, match="at least one message"):
        e.decode([])
    with pytest.raises(ValueError, match="same seed appears twice"):
        e.decode([msgs[0], msgs[1], msgs[0]])
    with pytest.raises(ValueError, match="5 messages but the estimator has n=4"):
        e.decode([e.encode(x, s) for s in range(5)])
    other = "rand-k" if name != "rand-k" else "induced"
    with pytest.raises(ValueError, match="mixed schemes"):
        e.decode([msgs[0], est(other).encode(x, 9)])
    with pytest.raises(ValueError, match="mixed k/d"):
        e.decode([msgs[0], est(name, k=3).encode(x, 9)])
    with pytest.raises(ValueError, match="mixed k/d"):
        e.decode([msgs[0], est(name, d=19).encode(x[:19], 9)])
    bad = rpsagg.Encoded(e.name, 9, 4, 20, np.r_[msgs[0].values[:-1], np.nan], msgs[0].indices)
    with pytest.raises(ValueError, match="non-finite"):
        e.decode([msgs[1], bad])
    if e.values_per_message is not None:
        short = rpsagg.Encoded(e.name, 9, 4, 20, msgs[0].values[:-1], None)
        with pytest.raises(ValueError, match="values; expected"):
            e.decode([short])
    with pytest.raises(ValueError, match="n_prime must be in"):
        e.beta_for(5)
    with pytest.raises(ValueError, match="n_prime must be in"):
        e.beta_for(0)


def test_indices_out_of_range_rejected() -> None:
    e = est("rand-k-wangni")
    bad = rpsagg.Encoded("rand-k-wangni", 1, 4, 20, np.ones(2), np.array([3, 20]))
    with pytest.raises(ValueError, match=r"indices outside \[0, d\)"):
        e.decode([bad])


def test_encoded_is_frozen_and_read_only() -> None:
    msg = est().encode(np.ones(20), 5)
    assert msg.values.dtype == np.float32 and msg.values.size == 4
    with pytest.raises(ValueError):
        msg.values[0] = 1.0
    with pytest.raises(AttributeError):
        msg.seed = 3  # type: ignore[misc]
    assert msg.payload_bytes == 8 + 4 * 4


def test_derive_round_seed_names_the_bad_argument() -> None:
    from rpsagg.spec import derive_round_seed

    assert derive_round_seed(1, 2, "a", 0) != derive_round_seed(1, 2, "a", 1)
    with pytest.raises(ValueError, match="client_seed must be in"):
        derive_round_seed(-1, 2, "a")
    with pytest.raises(ValueError, match="nonce must be in"):
        derive_round_seed(1, 2**64, "a")
    with pytest.raises(ValueError, match="vector_index must be an integer"):
        derive_round_seed(1, 2, "a", 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client_id must be a str"):
        derive_round_seed(1, 2, 7)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_size", [None, 8])
def test_srht_encoders_catch_non_finite_input_through_the_output(block_size: int | None) -> None:
    # The SRHT encoders skip the input scan: every sent value mixes every coordinate (of its
    # block), so a NaN/Inf anywhere in x must still be reported, and an overflow named.
    e = rpsagg.make_estimator("rand-proj-spatial", n=2, k=4, d=20, block_size=block_size)
    for pos in (0, 7, 19):
        for bad in (np.nan, np.inf, -np.inf):
            x = np.ones(20)
            x[pos] = bad
            with pytest.raises(ValueError, match="x must be finite"):
                e.encode(x, 3)
    with pytest.raises(ValueError, match="too large"):
        e.encode(np.full(20, 1e308), 3)


@pytest.mark.parametrize("name", ["full", "rand-k", "rand-proj-spatial", "induced"])
@pytest.mark.parametrize("d", [16, 20])
def test_values_beyond_binary32_are_refused_not_sent_as_infinity(name: str, d: int) -> None:
    # docs/wire-format.md section 7: a value that rounds to +-inf in binary32 is never sent.
    # 1e39 is finite in float64 but beyond binary32's 3.4028235e38 (the SRHT and DCT keep
    # the norm, so some sketch value of a constant vector is at least as large).
    e = rpsagg.make_estimator(name, n=2, k=4, d=d)
    with pytest.raises(ValueError, match=r"beyond binary32's largest finite value 3\.4028235e\+38"):
        e.encode(np.full(d, 1e39), 3)
    if name != "induced":  # (its random part is scaled up by d / (k - k//2))
        # just below the limit is sent as it is (rounded to nearest)
        ok = e.encode(np.full(d, 3.0e38 / np.sqrt(d)), 3)
        assert np.all(np.isfinite(ok.values))
