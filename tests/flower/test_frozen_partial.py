"""Arrays no client changed stay bit for bit (``zero`` bitmap, ``frozen=[...]``), and
replies that carry a subset of the arrays (``partial="allow"``) are averaged per array;
by default such a reply fails the run loudly."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result

from rpsagg import ESTIMATOR_NAMES, make_estimator
from rpsagg.spec import derive_round_seed, mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.payload import MARK_ABSENT, MARK_ZERO, Layout
from rpsagg_flower.settings import KEY_NONCE, RoundEncoding, nonce_from_bytes

from .flower_util import FakeGrid, context, model, run_round, seeds, sent

pytestmark = pytest.mark.unit

# a frozen float32 "embedding" first, then the trained arrays: d = 20 + 48 + 12
SHAPES = {"emb": ((5, 4), "float32"), "w": ((6, 8), "float64"), "b": ((12,), "float64")}
NODES = [5, 6, 7, 8, 9]
ALL = [*ESTIMATOR_NAMES, "eden", "qsgd"]


def settings_of(name: str) -> dict[str, object]:
    if name in ("eden", "qsgd"):
        return {"estimator": name, "bits": 2}
    return {"estimator": name, "k": 15}


def frozen_updates(rng: np.random.Generator, zero: Iterable[str] = ("emb",)
                   ) -> dict[int, np.ndarray]:
    """Correlated updates that are exactly zero on the arrays ``zero``."""
    layout = Layout.of(model(SHAPES))
    common = rng.standard_normal(layout.d)
    out = {}
    for n in NODES:
        u = common + rng.standard_normal(layout.d)
        for key, where in layout.compressed_slices().items():
            if key in zero:
                u[where] = 0.0
        out[n] = u
    return out


def _drawer(start: int) -> tuple[list[int], Callable[[], int]]:
    drawn: list[int] = []
    source = seeds(start)

    def draw() -> int:
        drawn.append(next(source))
        return drawn[-1]

    return drawn, draw


@pytest.mark.parametrize("named", [False, True], ids=["detected", "named-frozen"])
@pytest.mark.parametrize("name", ALL)
def test_frozen_array_is_bit_identical_after_5_rounds(name: str, named: bool) -> None:
    """Every estimator: an array no client changes is bit-identical after 5 rounds, whether
    the replies mark it (``zero`` bitmap) or the strategy names it ``frozen``; the trained
    arrays move. (Before, Rand-Proj-Spatial's joint sketch moved it by up to 0.3.)"""
    arrays = model(SHAPES, fill=None, seed=4)
    emb = arrays["emb"].numpy().tobytes()
    strategy = RandProjSpatialFedAvg(**settings_of(name),  # type: ignore[arg-type]
                                     frozen=["emb"] if named else (),
                                     nonces=iter(seeds(70)).__next__)
    rng = np.random.default_rng(11)
    current = arrays
    for rnd in range(1, 6):
        out = run_round(strategy, current, frozen_updates(rng), server_round=rnd,
                        mod=make_rpsagg_mod(iter(seeds(1000 * rnd)).__next__))
        assert out.arrays is not None and out.metrics is not None
        assert out.metrics["rpsagg.unchanged-arrays"] == 1
        current = out.arrays
    assert current["emb"].numpy().dtype == np.float32
    assert current["emb"].numpy().tobytes() == emb
    assert not np.array_equal(current["w"].numpy(), arrays["w"].numpy())


def test_frozen_array_per_layer_and_with_a_momentum_step() -> None:
    """Per-layer compression and a server optimizer with state (Adam): still bit-identical."""
    from rpsagg_flower import ServerAdam

    arrays = model(SHAPES, fill=None, seed=4)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15, per_layer=True,
                                     server_optimizer=ServerAdam(lr=0.1))
    rng = np.random.default_rng(12)
    current = arrays
    for rnd in range(1, 6):
        # the embedding trains in round 1 only: Adam's moments are nonzero there after
        zero = ("emb",) if rnd > 1 else ()
        out = run_round(strategy, current, frozen_updates(rng, zero), server_round=rnd)
        assert out.arrays is not None
        if rnd == 1:
            after_first = out.arrays["emb"].numpy().tobytes()
        current = out.arrays
    assert current["emb"].numpy().tobytes() == after_first


def test_zero_arrays_are_left_out_of_the_sketch() -> None:
    """The replies' bitmaps mark the zero array, and the sketch is the estimator's message
    of the other 60 coordinates: the applied update is exactly rpsagg's decode with d = 60
    (k, seeds, n as in the full round), and nothing of it reaches the zero array."""
    drawn, draw = _drawer(300)
    arrays = model(SHAPES, fill=None, seed=4)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15, weighted=False)
    ups = frozen_updates(np.random.default_rng(5))
    out = run_round(strategy, arrays, ups, mod=make_rpsagg_mod(draw))
    assert out.arrays is not None and out.metrics is not None
    for r in out.replies:
        meta = sent(r, strategy, arrays).meta
        assert meta[MARK_ZERO] == bytes([0b001]) and meta[MARK_ABSENT] == bytes([0])
        assert meta["count"] == 15
    enc = RoundEncoding.from_config(out.messages[0].content["config"])
    assert enc is not None and enc.d == 80
    est = make_estimator("rand-proj-spatial", n=5, k=15, d=60)
    nodes = [r.metadata.src_node_id for r in out.replies]
    msgs = [est.encode(ups[n][20:], derive_round_seed(s, enc.nonce, str(n)))
            for n, s in zip(nodes, drawn, strict=True)]
    expected = est.decode(msgs)
    got = np.concatenate([out.arrays["w"].numpy().reshape(-1) - arrays["w"].numpy().reshape(-1),
                          out.arrays["b"].numpy() - arrays["b"].numpy()])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert "rpsagg.beta" in out.metrics  # one group: the joint decode's figures are reported


def test_an_array_some_replies_mark_is_part_of_the_others_decode() -> None:
    """Node 5's update of ``b`` is zero, the others' are not: node 5's sketch covers ``w``
    only and is decoded with the replies of the same arrays (here: alone, d = 48), the
    others jointly over ``w`` and ``b`` (d = 60); array a's update is
    ``sum_i w_i u_i[a] / sum_i w_i`` with node 5 contributing exactly zero to ``b``."""
    drawn, draw = _drawer(400)
    arrays = model(SHAPES, seed=4)
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15)
    rng = np.random.default_rng(6)
    ups = frozen_updates(rng)
    ups[5][68:] = 0.0  # node 5: b unchanged
    weights = {n: float(i + 1) for i, n in enumerate(NODES)}
    out = run_round(strategy, arrays, ups, weights=weights, mod=make_rpsagg_mod(draw))
    assert out.arrays is not None and out.metrics is not None
    enc = RoundEncoding.from_config(out.messages[0].content["config"])
    assert enc is not None
    nodes = [r.metadata.src_node_id for r in out.replies]
    seed_of = dict(zip(nodes, drawn, strict=True))
    est48 = make_estimator("rand-proj-spatial", n=5, k=15, d=48)
    est60 = make_estimator("rand-proj-spatial", n=5, k=15, d=60)
    alone = est48.decode([est48.encode(weights[5] * ups[5][20:68],
                                       derive_round_seed(seed_of[5], enc.nonce, "5"))])
    rest = [n for n in nodes if n != 5]
    joint = est60.decode([est60.encode(weights[n] * ups[n][20:],
                                       derive_round_seed(seed_of[n], enc.nonce, str(n)))
                          for n in rest])
    total = np.zeros(60)
    total[:48] += alone / 5
    total += joint * 4 / 5
    expected = total / np.mean(list(weights.values()))
    got = np.concatenate([out.arrays["w"].numpy().reshape(-1), out.arrays["b"].numpy()])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert out.arrays["emb"].numpy().tobytes() == arrays["emb"].numpy().tobytes()
    assert "rpsagg.beta" not in out.metrics  # two groups decoded apart


def test_frozen_names_are_checked_and_sent() -> None:
    with pytest.raises(ValueError, match=r"frozen names arrays the model lacks: \['nope'\]"):
        run_round(RandProjSpatialFedAvg("rand-k", k=5, frozen=["nope"]), model(SHAPES),
                  frozen_updates(np.random.default_rng(0)))
    strategy = RandProjSpatialFedAvg("rand-k", k=5, frozen=["emb"])
    out = run_round(strategy, model(SHAPES), frozen_updates(np.random.default_rng(0)))
    enc = RoundEncoding.from_config(out.messages[0].content["config"])
    assert enc is not None and enc.frozen == ("emb",) and enc.d == 60
    # a frozen array sends no bit and no plain/ entry: the sketch has the round's k values
    assert all(sent(r, strategy, model(SHAPES)).meta["count"] == 5 for r in out.replies)
    assert all(not any(k.startswith("plain/") for k in sent(r, strategy, model(SHAPES)).arrays)
               for r in out.replies)


# --- partial replies: a LoRA-style model whose clients return their adapters only

LORA = {"W0": ((8, 6), "float32"), "A": ((2, 6), "float64"), "B": ((8, 2), "float64")}


def lora_model() -> ArrayRecord:
    rng = np.random.default_rng(21)
    return ArrayRecord({"W0": Array(rng.standard_normal((8, 6)).astype(np.float32)),
                        "A": Array(0.3 * rng.standard_normal((2, 6))),
                        "B": Array(np.zeros((8, 2)))})


def lora_data(node: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ``node``'s regression data: y = (W0 + B* A*) x + noise, a rank-2 shift shared
    by the nodes plus a small node-specific one."""
    base = lora_model()["W0"].numpy().astype(np.float64)
    rng = np.random.default_rng(99)
    shift = rng.standard_normal((8, 2)) @ rng.standard_normal((2, 6))
    own = np.random.default_rng(node)
    x = own.standard_normal((40, 6))
    y = x @ (base + shift + 0.05 * own.standard_normal((8, 6))).T
    return x, y


def lora_loss(arrays: ArrayRecord) -> float:
    w = (arrays["W0"].numpy().astype(np.float64) + arrays["B"].numpy() @ arrays["A"].numpy())
    return float(np.mean([np.mean((x @ w.T - y) ** 2) for x, y in map(lora_data, NODES)]))


def lora_app(adapters_only: bool) -> Callable[[Message, Context], Message]:
    """Five steps of gradient descent on the adapters A, B (W0 frozen); returns A and B
    only, or every array (W0 as received)."""

    def app(msg: Message, ctxt: Context) -> Message:
        rec = msg.content["arrays"]
        w0 = rec["W0"].numpy().astype(np.float64)
        a, b = rec["A"].numpy().copy(), rec["B"].numpy().copy()
        x, y = lora_data(msg.metadata.dst_node_id)
        for _ in range(5):
            r = x @ (w0 + b @ a).T - y  # residuals (40 x 8)
            g = 2 * r.T @ x / r.size  # dL/dW
            a, b = a - 0.5 * b.T @ g, b - 0.5 * g @ a.T
        out = {"A": Array(a), "B": Array(b)}
        if not adapters_only:
            out = {"W0": rec["W0"], **out}
        metrics = MetricRecord({"num-examples": 40})
        return Message(RecordDict({"arrays": ArrayRecord(out), "metrics": metrics}),
                       reply_to=msg)

    return app


class AppGrid(FakeGrid):
    """A grid whose nodes run ``app`` under the mod: ``Strategy.start`` drives it as
    Flower's ServerApp runtime does."""

    def __init__(self, app: Callable[[Message, Context], Message]) -> None:
        super().__init__(NODES)
        self.app = app
        # the client seed from the node and the round's nonce: FedAvg samples the nodes
        # in random order, and both runs must give each node the same seed
        self.mod = make_rpsagg_mod(context_seeds=lambda m, c: mix64(
            m.metadata.dst_node_id + mix64(nonce_from_bytes(m.content["config"][KEY_NONCE]))))
        self.states = {n: context(n) for n in NODES}

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        return [self.mod(m, self.states[m.metadata.dst_node_id], self.app) for m in messages]


def lora_run(name: str, adapters_only: bool, rounds: int, **kwargs: object) -> Result:
    extra = {"bits": 4} if name in ("eden", "qsgd") else {"k": 14}
    random.seed(3)  # FedAvg samples the nodes with random.sample: the same order each run
    strategy = RandProjSpatialFedAvg(name, **extra, nonces=iter(seeds(800)).__next__,  # type: ignore[arg-type]
                                     fraction_evaluate=0.0, min_available_nodes=5,
                                     min_train_nodes=5, **kwargs)
    return strategy.start(grid=AppGrid(lora_app(adapters_only)),  # type: ignore[arg-type]
                          initial_arrays=lora_model(), num_rounds=rounds,
                          train_config=ConfigRecord({}))


def test_partial_replies_are_refused_loudly_by_default() -> None:
    """Adapters-only replies under the default: ``Strategy.start`` (what the ServerApp's
    main calls) raises, naming the node and the arrays the reply lacks, instead of logging
    "no usable reply" and going on with an unchanged model. Flower's ServerApp runtime
    then ends the run as failed with the exception's message (``docs/flower.md``)."""
    with pytest.raises(RuntimeError, match=r"from node \d+ carries only some of the model's "
                                           r"arrays: it lacks \['W0'\].*partial='allow'"):
        lora_run("rand-proj-spatial", adapters_only=True, rounds=3)


@pytest.mark.parametrize("name", ["rand-proj-spatial", "rand-k", "eden"])
def test_partial_replies_train_as_full_replies(name: str) -> None:
    """``partial="allow"``: clients that return A and B only give, round after round, the
    very model (bit for bit) that clients returning every array give with W0 untouched:
    both sketch A and B alone (W0 absent, or marked zero), with the same seeds. W0 stays
    bit-identical, and the loss falls (10 rounds, fixed seeds: a regression check of
    training, not a statistical claim)."""
    partial = lora_run(name, adapters_only=True, rounds=10, partial="allow")
    full = lora_run(name, adapters_only=False, rounds=10)
    for key in LORA:
        assert partial.arrays[key].numpy().tobytes() == full.arrays[key].numpy().tobytes(), key
    assert partial.arrays["W0"].numpy().tobytes() == lora_model()["W0"].numpy().tobytes()
    before, after = lora_loss(lora_model()), lora_loss(partial.arrays)
    assert after < 0.5 * before, (before, after)


def test_partial_replies_are_averaged_over_their_carriers() -> None:
    """Nodes 5 and 6 return ``w`` only, the others every array: ``b``'s update is the
    weighted mean over the three replies that carry it, ``w``'s over all five.

    Unbiasedness, statistically: Rand-k with k = 15 of d = 60, T = 400 rounds with fresh
    seeds. Per round and coordinate the applied update is unbiased for the carriers'
    weighted mean ``m``; its variance ``s^2`` is estimated from the T draws, so the mean
    of the T draws lies within ``5 s / sqrt(T)`` of ``m`` except with probability about
    6e-7 per coordinate (normal approximation; 60 coordinates: below 4e-5 in all)."""
    shapes = {"w": ((6, 8), "float64"), "b": ((12,), "float64")}
    rng = np.random.default_rng(8)
    ups = {n: rng.standard_normal(60) for n in NODES}
    weights = {n: float(i + 1) for i, n in enumerate(NODES)}
    lacking = {5, 6}
    strategy = RandProjSpatialFedAvg("rand-k", k=15, partial="allow",
                                     nonces=iter(seeds(9000)).__next__)
    drop_b = _dropping({"b"}, lacking)
    draws = []
    source = seeds(20000)
    for rnd in range(1, 401):
        out = run_round(strategy, model(shapes), ups, weights=weights, server_round=rnd,
                        mod=drop_b(make_rpsagg_mod(source.__next__)))
        assert out.arrays is not None
        draws.append(np.concatenate([out.arrays["w"].numpy().reshape(-1),
                                     out.arrays["b"].numpy()]))
    got = np.array(draws)
    w_all = np.array([weights[n] for n in NODES])
    carriers = np.array([n not in lacking for n in NODES])
    u = np.array([ups[n] for n in NODES])
    want = np.concatenate([w_all @ u[:, :48] / w_all.sum(),
                           w_all[carriers] @ u[carriers, 48:] / w_all[carriers].sum()])
    tol = 5 * got.std(axis=0, ddof=1) / np.sqrt(len(got))
    assert np.all(np.abs(got.mean(axis=0) - want) <= tol)


def _dropping(keys: set[str], nodes: set[int]) -> Callable:  # type: ignore[type-arg]
    """Wraps a mod so that the ClientApps of ``nodes`` leave ``keys`` out of their reply."""

    def wrap(mod: Callable) -> Callable:  # type: ignore[type-arg]
        def wrapped(msg: Message, ctxt: Context, app: Callable) -> Message:  # type: ignore[type-arg]
            if msg.metadata.dst_node_id not in nodes:
                return mod(msg, ctxt, app)

            def partial_app(m: Message, c: Context) -> Message:
                reply = app(m, c)
                rec = reply.content["arrays"]
                reply.content["arrays"] = ArrayRecord(
                    {k: rec[k] for k in rec if k not in keys})
                return reply

            return mod(msg, ctxt, partial_app)

        return wrapped

    return wrap


def test_an_array_no_reply_carries_stays() -> None:
    """``partial="allow"`` and every reply lacks ``b``: ``b`` is kept bit for bit."""
    shapes = {"w": ((6, 8), "float64"), "b": ((12,), "float64")}
    arrays = model(shapes, fill=None, seed=3)
    rng = np.random.default_rng(9)
    ups = {n: rng.standard_normal(60) for n in NODES}
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=15, partial="allow")
    mod = _dropping({"b"}, set(NODES))(make_rpsagg_mod())
    out = run_round(strategy, arrays, ups, mod=mod)
    assert out.arrays is not None
    assert out.arrays["b"].numpy().tobytes() == arrays["b"].numpy().tobytes()
    assert not np.array_equal(out.arrays["w"].numpy(), arrays["w"].numpy())
    with pytest.raises(ValueError, match="partial must be"):
        RandProjSpatialFedAvg("rand-k", k=5, partial="maybe")
