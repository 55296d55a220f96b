"""RandProjSpatialFedAvg with Flower's messages: decode, shapes and dtypes, n' < n, metrics,
replies that do not fit the round."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from rpsagg import ESTIMATOR_NAMES, Encoded, estimate_correlation, make_estimator
from rpsagg.spec import derive_round_seed, mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.payload import Layout, flatten
from rpsagg_flower.settings import KEY_NONCE, RoundEncoding
from rpsagg_flower.wire import wire_bytes

from .flower_util import FakeGrid, error_reply, model, resend, run_round, seeds, sent

pytestmark = pytest.mark.unit

SHAPES = {"w": ((6, 8), "float64"), "b": ((12,), "float64")}  # d = 60
NODES = [5, 6, 7, 8, 9]


def updates(d: int, identical: bool = False) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(3)
    common = rng.standard_normal(d)
    return {n: common if identical else common + rng.standard_normal(d) for n in NODES}


def settings_of(name: str) -> dict[str, object]:
    if name in ("eden", "qsgd"):
        return {"estimator": name, "bits": 2}
    return {"estimator": name, "k": 15}


def expected_update(strategy: RandProjSpatialFedAvg, rnd_messages: list[Message],
                    replies: list[Message], ups: dict[int, np.ndarray],
                    client_seeds: list[int], weights: dict[int, float] | None,
                    name: str, d: int, k: int = 15) -> tuple[np.ndarray, list[Encoded]]:
    """The same round done with rpsagg directly: encode each arrived update (times its
    weight) with the seed the service would derive, decode, divide by the mean weight."""
    enc = RoundEncoding.from_config(rnd_messages[0].content["config"])
    assert enc is not None
    nodes = [r.metadata.src_node_id for r in replies]
    extra = {"bits": 2} if name in ("eden", "qsgd") else {"k": k}
    est = make_estimator(name, n=len(rnd_messages), d=d, **extra)  # type: ignore[arg-type]
    w = {n: 1.0 if weights is None else weights[n] for n in nodes}
    msgs = [est.encode(w[n] * ups[n], derive_round_seed(s, enc.nonce, str(n)))
            for n, s in zip(nodes, client_seeds, strict=True)]
    return est.decode(msgs) / np.mean([w[n] for n in nodes]), msgs


@pytest.mark.parametrize("name", [*ESTIMATOR_NAMES, "eden", "qsgd"])
def test_round_matches_rpsagg_decode(name: str) -> None:
    """Every estimator name: the applied update is exactly rpsagg's decode of the messages
    the clients would send (same seeds derivation, weights, n), reordered as they arrived."""
    drawn: list[int] = []
    source = seeds(500)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    weights = {n: float(i + 1) for i, n in enumerate(NODES)}
    strategy = RandProjSpatialFedAvg(**settings_of(name))  # type: ignore[arg-type]
    arrays = model(SHAPES)
    ups = updates(60)
    rnd = run_round(strategy, arrays, ups, weights=weights, mod=make_rpsagg_mod(draw))
    assert rnd.arrays is not None
    expected, _ = expected_update(strategy, rnd.messages, rnd.replies, ups, drawn, weights,
                                  name, 60)
    got = flatten(rnd.arrays, Layout.of(rnd.arrays))
    np.testing.assert_array_equal(got, expected)


def test_shapes_and_dtypes_restored() -> None:
    """Arrays of float16/32/64 and of several ranks come back in their shapes and dtypes,
    each the old values plus its part of the update, rounded once to its dtype."""
    shapes = {"conv": ((2, 3, 2, 2), "float32"), "half": ((7,), "float16"),
              "scalar": ((), "float64"), "dense": ((4, 5), "float64")}
    arrays = model(shapes, fill=None, seed=1)
    layout = Layout.of(arrays)
    d = layout.d
    drawn: list[int] = []
    source = seeds(900)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=9)
    rng = np.random.default_rng(2)
    # updates representable in every dtype (multiples of 1/64, small): the ClientApp's reply
    # then carries exactly old + update, and the mod's delta is exactly the update
    ups = {n: np.round(rng.standard_normal(d) * 8) / 64 for n in NODES}
    base = flatten(arrays, layout)
    ups = {n: flatten(_add(arrays, u), layout) - base for n, u in ups.items()}
    weights = {n: 10.0 for n in NODES}
    rnd = run_round(strategy, arrays, ups, weights=weights, mod=make_rpsagg_mod(draw))
    assert rnd.arrays is not None
    assert list(rnd.arrays.keys()) == list(shapes)
    expected, _ = expected_update(strategy, rnd.messages, rnd.replies, ups, drawn, weights,
                                  "rand-proj-spatial", d, k=9)
    offset = 0
    for (key, (shape, dtype)), new, old in zip(shapes.items(), rnd.arrays.to_numpy_ndarrays(),
                                               arrays.to_numpy_ndarrays(), strict=True):
        assert new.shape == shape and new.dtype == np.dtype(dtype), key
        size = int(np.prod(shape))
        want = (old.astype(np.float64).reshape(-1) + expected[offset : offset + size])
        np.testing.assert_array_equal(new.reshape(-1), want.astype(dtype), err_msg=key)
        offset += size


def _add(arrays: ArrayRecord, update: np.ndarray) -> ArrayRecord:
    out, offset = {}, 0
    for key, arr in zip(arrays.keys(), arrays.to_numpy_ndarrays(), strict=True):
        part = update[offset : offset + arr.size].reshape(arr.shape)
        out[key] = Array(np.asarray(arr.astype(np.float64) + part).astype(arr.dtype))
        offset += arr.size
    return ArrayRecord(out)


def test_fewer_replies_than_sampled() -> None:
    """n' = 3 of n = 5 (one node silent, one reply an error): decoded with beta for n' = 3,
    the mean of the three updates that arrived; n-prime says 3."""
    drawn: list[int] = []
    source = seeds(1300)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15, weighted=False)
    arrays = model(SHAPES)
    ups = updates(60)

    def one_fails(replies: list[Message]) -> list[Message]:
        return [*replies[:-1], error_reply(replies[-1])]

    rnd = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(draw), missing=(6,),
                    extra_replies=one_fails)
    assert rnd.arrays is not None and rnd.metrics is not None
    assert len(rnd.messages) == 5 and rnd.metrics["rpsagg.n-prime"] == 3
    good = rnd.replies[:-1]
    expected, _ = expected_update(strategy, rnd.messages, good, ups, drawn[:3], None,
                                     "rand-proj-spatial", 60)
    est = make_estimator("rand-proj-spatial", n=5, k=15, d=60)
    assert rnd.metrics["rpsagg.beta"] == est.beta_for(3) != est.beta_for(5)
    np.testing.assert_array_equal(flatten(rnd.arrays, Layout.of(rnd.arrays)), expected)


def test_metrics() -> None:
    """payload bytes up are the compressed records' count_bytes, bytes up the replies' wire
    bytes (test_wire checks the uncompressed figure); R_hat is rpsagg's estimate from the
    sketches."""
    drawn: list[int] = []
    source = seeds(1700)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15, weighted=False)
    arrays = model(SHAPES)
    ups = updates(60)
    rnd = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(draw))
    assert rnd.metrics is not None
    m = rnd.metrics
    up = sum(r.content["arrays"].count_bytes() for r in rnd.replies)
    assert m["rpsagg.payload-bytes-up"] == up
    assert m["rpsagg.bytes-up"] == sum(wire_bytes(r) for r in rnd.replies) > up
    assert m["rpsagg.bytes-up-uncompressed"] > 5 * arrays.count_bytes()
    assert m["rpsagg.compression-ratio"] == pytest.approx(
        m["rpsagg.bytes-up-uncompressed"] / m["rpsagg.bytes-up"])
    assert m["rpsagg.payload-bytes"] == 5 * (8 + 4 * 15)
    _, msgs = expected_update(strategy, rnd.messages, rnd.replies, ups, drawn, None,
                              "rand-proj-spatial", 60)
    assert m["rpsagg.r-hat"] == pytest.approx(estimate_correlation(msgs), rel=1e-12)
    assert m["rpsagg.decode-seconds"] >= 0


def test_r_hat_of_identical_updates_with_full() -> None:
    """``full`` sends the vectors: R_hat is exact, n - 1 for identical updates."""
    strategy = RandProjSpatialFedAvg("full", k=60, weighted=False)
    rnd = run_round(strategy, model(SHAPES), updates(60, identical=True))
    assert rnd.metrics is not None
    assert rnd.metrics["rpsagg.r-hat"] == pytest.approx(4.0, rel=1e-6)


def test_blockwise_r_hat_sums_the_blocks() -> None:
    """Blockwise R_hat: the per-block correlation terms add up (each block is an SRHT sketch
    of its own coordinates); for identical updates it is unbiased for n - 1, and with
    blocks of 16 and k = 16 out of d = 60 its spread is wide, so check it against the
    terms computed block by block with rpsagg."""
    from rpsagg import correlation_terms
    from rpsagg._blockwise import block_budgets, block_seed

    drawn: list[int] = []
    source = seeds(2100)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=16, block_size=16, weighted=False)
    ups = updates(60, identical=True)
    rnd = run_round(strategy, model(SHAPES), ups, mod=make_rpsagg_mod(draw))
    assert rnd.metrics is not None
    enc = RoundEncoding.from_config(rnd.messages[0].content["config"])
    assert enc is not None and enc.block_size == 16
    nodes = [r.metadata.src_node_id for r in rnd.replies]
    cross = norms = 0.0
    for j, kb in enumerate(block_budgets(16, 4)):
        block = []
        for n, s in zip(nodes, drawn, strict=True):
            x = np.zeros(64)
            x[:60] = ups[n]
            seed = block_seed(derive_round_seed(s, enc.nonce, str(n)), j)
            block.append(make_estimator("rand-proj-spatial", n=5, k=kb, d=16, projection="srht")
                         .encode(x[16 * j : 16 * (j + 1)], seed))
        c, q = correlation_terms(block)
        cross, norms = cross + c, norms + q
    assert rnd.metrics["rpsagg.r-hat"] == pytest.approx(cross / norms, rel=1e-9)


@pytest.mark.parametrize("value_bits", [32, 8])
def test_big_model_is_encoded_blockwise(value_bits: int) -> None:
    """A model of more than 2^20 coordinates is encoded in blocks of 2^18 by default, with
    float32 values or b-bit codes (one scale per block, docs/wire-format.md section 15)."""
    shapes = {"emb": ((1 << 20,), "float32"), "head": ((64,), "float32")}
    arrays = model(shapes)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=64, weighted=False,
                                     value_bits=value_bits)
    rng = np.random.default_rng(4)
    ups = {n: rng.standard_normal((1 << 20) + 64).astype(np.float32).astype(np.float64)
           for n in NODES[:2]}
    rnd = run_round(strategy, arrays, ups)
    enc = RoundEncoding.from_config(rnd.messages[0].content["config"])
    assert enc is not None and enc.block_size == 1 << 18
    reply = sent(rnd.replies[0], strategy, arrays)
    assert reply.meta["scheme"] == "rand-proj-spatial:block=262144"
    assert rnd.arrays is not None and rnd.metrics is not None
    assert [a.shape for a in rnd.arrays.to_numpy_ndarrays()] == [(1 << 20,), (64,)]
    # wire bytes: a reply of well under 1 KB, half of it Flower's objects, against 4 MiB
    assert rnd.metrics["rpsagg.compression-ratio"] > 5_000
    if value_bits < 32:  # the replies carry a scale per block: 5 blocks of 2^18
        scales = [a for name, a in reply.arrays.items() if name.startswith("scale")]
        assert [a.shape for a in scales] == [(5,)]


def test_replies_that_do_not_fit_are_dropped() -> None:
    """A reply of another round (its nonce), a second reply of one node and an uncompressed
    reply (with ``missing_payload="drop"``) are left out; the round decodes the others."""
    strategy = RandProjSpatialFedAvg("rand-k", k=15, weighted=False, missing_payload="drop")
    arrays = model(SHAPES)
    ups = updates(60)
    old = run_round(strategy, arrays, ups, server_round=1)

    def tamper(replies: list[Message]) -> list[Message]:
        stale = old.replies[0]  # node old.replies[0] answered round 1: a different nonce
        stale_node = stale.metadata.src_node_id
        kept = [r for r in replies if r.metadata.src_node_id != stale_node]
        plain = kept.pop()  # replace its content by the ClientApp's uncompressed arrays
        raw = RecordDict({"arrays": arrays, "metrics": plain.content["metrics"]})
        plain_reply = Message(raw, reply_to=_instruction(plain.metadata.src_node_id))
        return [stale, kept[0], kept[0], *kept[1:], plain_reply]

    rnd = run_round(strategy, arrays, ups, server_round=2, extra_replies=tamper)
    assert rnd.metrics is not None
    assert rnd.metrics["rpsagg.n-prime"] == 3


def test_replies_with_bad_values_are_dropped() -> None:
    """A reply whose values are not finite, or whose indices fall outside the model, is left
    out before the decode (which would refuse the whole batch)."""
    strategy = RandProjSpatialFedAvg("rand-k-wangni", k=15, weighted=False)
    arrays = model(SHAPES)

    def spoil(replies: list[Message]) -> list[Message]:
        first = sent(replies[0], strategy, arrays).arrays
        vals = np.frombuffer(first["values"].data, "<f4").copy()
        vals[0] = np.nan
        first["values"] = Array(dtype="float32", shape=(vals.size,), stype=first["values"].stype,
                                data=vals.tobytes())
        second = sent(replies[1], strategy, arrays).arrays
        idx = np.frombuffer(second["indices"].data, "<i4").copy()
        idx[0] = 60
        second["indices"] = Array(dtype="int32", shape=(idx.size,),
                                  stype=second["indices"].stype, data=idx.tobytes())
        resend(replies[0], strategy, arrays, first)
        resend(replies[1], strategy, arrays, second)
        return replies

    rnd = run_round(strategy, arrays, updates(60), extra_replies=spoil)
    assert rnd.arrays is not None and rnd.metrics is not None
    assert rnd.metrics["rpsagg.n-prime"] == 3


def _instruction(node: int) -> Message:
    return Message(RecordDict({}), dst_node_id=node, message_type="train")


def test_no_usable_reply_keeps_the_model() -> None:
    strategy = RandProjSpatialFedAvg("rand-k", k=15)
    rnd = run_round(strategy, model(SHAPES), updates(60),
                    extra_replies=lambda rs: [error_reply(r) for r in rs])
    assert rnd.arrays is None and rnd.metrics is None


def test_settings_that_do_not_fit_the_model_fail_before_sending() -> None:
    grid = FakeGrid(NODES)
    with pytest.raises(ValueError, match="k must be"):
        RandProjSpatialFedAvg("rand-k", k=61).configure_train(
            1, model(SHAPES), ConfigRecord(), grid)  # type: ignore[arg-type]
    ints = ArrayRecord({"count": Array(np.zeros(3, np.int64))})
    with pytest.raises(ValueError, match="floating-point"):
        RandProjSpatialFedAvg("rand-k", k=2).configure_train(
            1, ints, ConfigRecord(), grid)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown estimator"):
        RandProjSpatialFedAvg("top-k", k=2)


def test_nonce_is_fresh_each_round_and_sent_as_8_bytes() -> None:
    strategy = RandProjSpatialFedAvg("rand-k", k=15)
    grid = FakeGrid(NODES)
    sent = []
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, model(SHAPES), ConfigRecord(), grid))  # type: ignore[arg-type]
        raw = msgs[0].content["config"][KEY_NONCE]
        assert isinstance(raw, bytes) and len(raw) == 8
        sent.append(raw)
    assert sent[0] != sent[1]


def test_transform_auto_uses_the_tracked_correlation() -> None:
    """Round 1 decodes with avg (no prior); the next round's estimator has the prior of the
    smoothed R_hat (identical updates: close to n - 1)."""
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=30, transform="auto",
                                     weighted=False)
    arrays = model(SHAPES)
    ups = updates(60, identical=True)
    run_round(strategy, arrays, ups, server_round=1)
    assert strategy.tracker.fraction is not None
    prior = strategy.tracker.prior(5)
    grid = FakeGrid(NODES)
    list(strategy.configure_train(2, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
    plan = strategy._plan
    assert plan is not None
    want = make_estimator("rand-proj-spatial", n=5, k=30, d=60, transform="auto",
                          prior_r=prior)
    assert plan.estimator.transform == want.transform  # type: ignore[attr-defined]


def test_solver_cg_decodes_as_the_exact_solver() -> None:
    """``solver="cg"`` (Krylov) against ``"auto"`` (nk = 40 <= 512: the exact solver) on
    the same replies: the same estimate to the Krylov solver's tolerance (rtol 1e-10 on the
    residual; 1e-6 on the estimate leaves room for the conditioning)."""
    arrays = model(SHAPES)
    ups = updates(60)
    got = []
    for solver in ("auto", "cg"):
        strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=10, weighted=False,
                                         solver=solver, nonces=iter(seeds(3)).__next__)
        by_node = make_rpsagg_mod(context_seeds=lambda msg, ctxt: mix64(9 + ctxt.node_id))
        rnd = run_round(strategy, arrays, ups, mod=by_node)  # FedAvg samples in random order
        assert rnd.arrays is not None
        got.append(np.concatenate([a.ravel() for a in rnd.arrays.to_numpy_ndarrays()]))
    np.testing.assert_allclose(got[1], got[0], rtol=1e-6, atol=1e-6 * np.abs(got[0]).max())
    with pytest.raises(ValueError, match="solver must be"):
        RandProjSpatialFedAvg("rand-proj-spatial", k=10, solver="lu")


@pytest.mark.parametrize("per_layer, ks", [(True, (10, 2)), ({"w": 6, "b": 6}, (6, 6))])
def test_per_layer_matches_rpsagg_decode_of_each_layer(per_layer, ks) -> None:  # type: ignore[no-untyped-def]
    """Per-layer compression: each array is its own estimator message (budget k = 12 split
    10/2 by size, or given by name), seeded with ``"<node>/<layer>"``; the new model is
    each layer's rpsagg decode of the replies, weighted as FedAvg does."""
    arrays = model(SHAPES)
    ups = updates(60)
    weights = {n: float(n) for n in NODES}
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=12, per_layer=per_layer,
                                     nonces=iter(seeds(31)).__next__)
    by_node = make_rpsagg_mod(context_seeds=lambda msg, ctxt: mix64(31 + ctxt.node_id))
    rnd = run_round(strategy, arrays, ups, weights=weights, mod=by_node)
    assert rnd.arrays is not None and rnd.metrics is not None
    enc = RoundEncoding.from_config(rnd.messages[0].content["config"])
    assert enc is not None and enc.layer_k == ks
    carried = sent(rnd.replies[0], strategy, arrays).arrays
    assert sorted(carried.keys()) == ["values/0", "values/1"]
    assert [carried[f"values/{j}"].shape for j in (0, 1)] == [(ks[0],), (ks[1],)]
    nodes = [r.metadata.src_node_id for r in rnd.replies]
    want = []
    for j, (lo, hi) in enumerate([(0, 48), (48, 60)]):
        est = make_estimator("rand-proj-spatial", n=len(NODES), k=ks[j], d=hi - lo)
        msgs = [est.encode(weights[n] * ups[n][lo:hi],
                           derive_round_seed(mix64(31 + n), enc.nonce, f"{n}/{j}"))
                for n in nodes]
        want.append(est.decode(msgs))
    expect = np.concatenate(want) / np.mean([weights[n] for n in nodes])
    got = flatten(rnd.arrays, Layout.of(rnd.arrays)) - flatten(arrays, Layout.of(arrays))
    np.testing.assert_allclose(got, expect, rtol=1e-9, atol=1e-12)  # a float64 model
    assert rnd.metrics["rpsagg.n-prime"] == len(NODES) and "rpsagg.beta" not in rnd.metrics


def test_per_layer_mapping_must_name_every_compressed_array() -> None:
    with pytest.raises(ValueError, match=r"no k for the arrays \['b'\]"):
        RandProjSpatialFedAvg("rand-k", k=4, per_layer={"w": 4}).configure_train(
            1, model(SHAPES), ConfigRecord(), FakeGrid(NODES))  # type: ignore[arg-type]


def test_target_rel_error_moves_k_to_the_smallest_that_meets_it() -> None:
    """Round 1 has no R_hat yet: it sends the largest k. From round 2 on, k is the smallest
    whose predicted relative error for the last round's replies at the smoothed R_hat meets
    the target: identical updates (R ~ n - 1) need far fewer values than independent ones;
    each round reports k, the target and the decode's estimated error."""
    target = 0.5
    ks = {}
    for identical in (True, False):
        strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=60, weighted=False,
                                         target_rel_error=target, k_min=2)
        arrays = model(SHAPES)
        ups = updates(60, identical=identical)
        first = run_round(strategy, arrays, ups, server_round=1)
        assert first.metrics is not None and first.metrics["rpsagg.k"] == 60
        assert first.metrics["rpsagg.target-rel-error"] == target
        assert "rpsagg.estimated-relative-error" in first.metrics
        second = run_round(strategy, arrays, ups, server_round=2)
        assert second.metrics is not None
        k = int(second.metrics["rpsagg.k"])
        r = strategy.tracker.prior(5)
        assert r is not None
        enc = RoundEncoding.from_config(second.messages[0].content["config"])
        assert enc is not None and enc.k == k  # what the clients were told
        est = make_estimator("rand-proj-spatial", n=5, k=k, d=60)
        prior_r = strategy.tracker.fraction
        assert prior_r is not None
        ks[identical] = k
        if k > 2:  # the smallest k: one value fewer misses the target at the planned R
            r1 = first.metrics["rpsagg.r-hat"]
            smaller = make_estimator("rand-proj-spatial", n=5, k=k - 1, d=60)
            assert smaller.predicted_relative_error(min(4.0, max(0.0, r1))) > target
        assert est.predicted_relative_error(min(4.0, max(0.0, first.metrics["rpsagg.r-hat"]))) \
            <= target
    assert ks[True] < ks[False]


@pytest.mark.parametrize("bad", [dict(target_rel_error=0.0), dict(target_rel_error=0.1, k=None),
                                 dict(target_rel_error=0.1, estimator="eden", bits=2),
                                 dict(target_rel_error=0.1, k_min=0)])
def test_target_rel_error_settings_are_checked(bad: dict) -> None:  # type: ignore[type-arg]
    args: dict = {"estimator": "rand-proj-spatial", "k": 15}  # type: ignore[type-arg]
    args.update(bad)
    with pytest.raises(ValueError):
        RandProjSpatialFedAvg(**args)


def test_error_tol_reaches_the_srht_decoders_only() -> None:
    """``error_tol`` goes to the SRHT decoders (blockwise, or d' = d a power of two); the
    other projections and estimators decode with ``rtol`` alone (a strategy's round may
    use any of them)."""
    def built(**kw: object) -> object:
        enc = RoundEncoding(**{"scheme": "rand-proj-spatial", "k": 40, "nonce": 1,
                               **kw})  # type: ignore[arg-type]
        return enc.estimator(5, error_tol=1e-3)

    blockwise = built(d=3 * 256, block_size=256, value_bits=8)
    assert all(sub.error_tol == 1e-3 for sub in blockwise._sub.values())  # type: ignore[attr-defined]
    assert built(d=1024).error_tol == 1e-3  # type: ignore[attr-defined]
    assert built(d=1000).error_tol is None  # type: ignore[attr-defined]  # hblocks
    assert built(d=1000, projection="srht").error_tol == 1e-3  # type: ignore[attr-defined]
    rand_k = RoundEncoding("rand-k", 40, 1000, 1).estimator(5, error_tol=1e-3)
    assert not hasattr(rand_k, "error_tol")
    for bad in (2.0, 0.0, "fast", True):
        with pytest.raises(ValueError, match="error_tol must be"):
            RandProjSpatialFedAvg("rand-proj-spatial", k=10, error_tol=bad)  # type: ignore[arg-type]
    # "auto", the strategy's default: 1e-2 for blockwise decodes alone
    assert RandProjSpatialFedAvg("rand-proj-spatial", k=10).error_tol == "auto"
    auto = RoundEncoding("rand-proj-spatial", 40, 3 * 256, 1, block_size=256).estimator(
        5, error_tol="auto")
    assert all(sub.error_tol == 1e-2 for sub in auto._sub.values())  # type: ignore[attr-defined]
    whole = RoundEncoding("rand-proj-spatial", 40, 1024, 1).estimator(5, error_tol="auto")
    assert whole.error_tol is None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="error_tol must be"):
        RoundEncoding("rand-proj-spatial", 40, 1024, 1).estimator(5, error_tol="fast")


def test_error_tol_round_decodes_close_to_the_default() -> None:
    """A blockwise round (a model of 2^20 + 64 coordinates, blocks of 2^18, k = 4,096:
    nk / b = 0.05 with 3 clients: c = 3/4, conjugate gradients) decoded with
    ``error_tol=1e-3`` against a solve to the residual target alone: the solve's bound
    (``rpsagg._decode.error_stop_scale``) keeps every block's decode within
    1e-3 sqrt((1 - rho) / (2 - rho)) of its own norm, so the mean update (the model's
    change) within 1e-3 of its norm; checked at 1e-3, and that the option took effect; the
    same at the default ("auto": 1e-2 in a blockwise round) within 1e-2."""
    shapes = {"emb": ((1 << 20,), "float32"), "head": ((64,), "float32")}
    arrays = model(shapes)
    rng = np.random.default_rng(4)
    ups = {n: rng.standard_normal((1 << 20) + 64).astype(np.float32).astype(np.float64)
           for n in NODES[:3]}
    got = []
    for error_tol in (None, 1e-3, "auto"):
        strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=4096, weighted=False,
                                         value_bits=8, error_tol=error_tol,
                                         nonces=iter(seeds(3)).__next__)
        by_node = make_rpsagg_mod(context_seeds=lambda msg, ctxt: mix64(9 + ctxt.node_id))
        rnd = run_round(strategy, arrays, ups, mod=by_node)
        assert rnd.arrays is not None
        new = np.concatenate([a.ravel() for a in rnd.arrays.to_numpy_ndarrays()])
        old = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
        got.append(new.astype(np.float64) - old)
    assert 0 < np.linalg.norm(got[1] - got[0]) <= 1e-3 * np.linalg.norm(got[0])
    # the default, "auto": 1e-2 in a blockwise round
    assert 0 < np.linalg.norm(got[2] - got[0]) <= 1e-2 * np.linalg.norm(got[0])


def test_a_compression_config_is_the_strategys_keywords_gathered() -> None:
    """``RandProjSpatialFedAvg(CompressionConfig(...), **fedavg)`` and the keyword shorthand
    build the same strategy: the same round encoding for a model, FedAvg's own arguments
    passed to FedAvg as they are; one config serves several strategies (it is frozen);
    giving the compression twice is refused."""
    import dataclasses

    from rpsagg_flower import CompressionConfig

    config = CompressionConfig("rand-proj-spatial", k=20, value_bits=4, frozen=["b"],
                               uncompressed=("c",))
    whole = RandProjSpatialFedAvg(config, min_train_nodes=3, fraction_train=0.5)
    short = RandProjSpatialFedAvg("rand-proj-spatial", k=20, value_bits=4, frozen=["b"],
                                  uncompressed=("c",), min_train_nodes=3, fraction_train=0.5)
    by_name = RandProjSpatialFedAvg(estimator="rand-proj-spatial", k=20, value_bits=4,
                                    frozen=["b"], uncompressed=("c",), min_train_nodes=3,
                                    fraction_train=0.5)
    arrays = model({"w": ((8, 8), "float32"), "b": ((8,), "float32"),
                    "c": ((4,), "float32")})
    encodings = [s.round_encoding(arrays, 7) for s in (whole, short, by_name)]
    assert encodings[0] == encodings[1] == encodings[2]
    assert encodings[0].frozen == ("b",) and encodings[0].d == 64
    assert short.compression == config == by_name.compression
    assert (whole.min_train_nodes, whole.fraction_train) == (3, 0.5)  # FedAvg's own
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.k = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="not both: k"):
        RandProjSpatialFedAvg(config, k=5)
    with pytest.raises(TypeError, match="estimator is given twice"):
        RandProjSpatialFedAvg("rand-k", estimator="rand-k", k=5)
    with pytest.raises(ValueError, match="partial must be 'refuse' or 'allow'"):
        CompressionConfig(partial="some")
    assert RandProjSpatialFedAvg().compression == CompressionConfig()  # Rand-Proj-Spatial
