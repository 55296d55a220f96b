"""Variance control: a server step below 1, server optimizers, client error feedback.

The problem: n = 4 clients, d = 256, every client's local optimum is ``c``; a client's
update is ``c - x`` (a full local step to its optimum). FedAvg (the exact mean, step 1)
lands on ``c`` in one round. Rand-k with k = 8 sends an unbiased estimate ``g`` of the mean
update ``u = c - x`` with ``E||g - u||^2 = (d/k - 1) ||u||^2 / n = 7.75 ||u||^2`` (the n
clients' index sets are independent; each coordinate estimate ``(d/k) u_j 1[j kept]`` has
variance ``(d/k - 1) u_j^2``, averaged over n independent clients). With a server step
``lr`` the error ``e = x - c`` evolves as ``e' = e - lr g``, so

    E||e'||^2 = ((1 - lr)^2 + lr^2 * 7.75) ||e||^2:

a factor 7.75 per round at lr = 1 (divergence), 0.81 + 0.0775 = 0.8875 at lr = 0.1
(convergence). Over 30 rounds: 7.75^30 ~ 5e26 against 0.8875^30 ~ 0.028. The tests take
bounds far from both (1e6 and 0.3) so that the fixed seeds' realisation, whose log-factor
per round has a standard deviation of well under 1 (it is a sum of 30 independent
per-round factors), cannot cross them by chance.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from rpsagg import make_estimator
from rpsagg.spec import derive_round_seed, mix64
from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.mod import MEMORY_KEY
from rpsagg_flower.optim import (
    ServerAdagrad,
    ServerAdam,
    ServerSGD,
    ServerYogi,
    make_server_optimizer,
)
from rpsagg_flower.settings import RoundEncoding

from .flower_util import FakeGrid, adding_app, seeds

pytestmark = pytest.mark.unit

D, N, K = 256, 4, 8
NODES = [1, 2, 3, 4]


def _loss_ratio(strategy: RandProjSpatialFedAvg, rounds: int, seed: int,
                local_step: float = 1.0) -> list[float]:
    """``||x_t - c||^2 / ||x_0 - c||^2`` per round of the quadratic problem, through the
    strategy, the mod and contexts kept per node across rounds (as a SuperNode keeps them)."""
    c = np.random.default_rng(seed).standard_normal(D)
    x = ArrayRecord({"w": Array(np.zeros(D, np.float64))})
    contexts = {n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(),
                           run_config={}) for n in NODES}
    # client seeds by node and round: FedAvg samples the nodes in random order
    mod = make_rpsagg_mod(context_seeds=lambda msg, ctxt: mix64(
        1_000_000 * seed + 1000 * int(msg.content["config"]["server-round"]) + ctxt.node_id))
    start = float(np.sum(c * c))
    out = []
    for rnd in range(1, rounds + 1):
        messages = list(strategy.configure_train(rnd, x, ConfigRecord(), FakeGrid(NODES)))  # type: ignore[arg-type]
        cur = x["w"].numpy()
        replies = [mod(m, contexts[m.metadata.dst_node_id],
                       adding_app(local_step * (c - cur), 1.0))
                   for m in messages]
        new, _ = strategy.aggregate_train(rnd, replies)
        assert new is not None
        x = new
        err = x["w"].numpy() - c
        out.append(float(err @ err) / start)
    return out


def _strategy(seed: int, **kwargs: object) -> RandProjSpatialFedAvg:
    return RandProjSpatialFedAvg("rand-k", k=K, weighted=False,
                                 nonces=iter(seeds(seed)).__next__, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_step_one_diverges_and_a_server_step_below_one_converges(seed: int) -> None:
    plain = _loss_ratio(_strategy(seed), 30, seed)
    damped = _loss_ratio(_strategy(seed, server_optimizer=ServerSGD(lr=0.1)), 30, seed)
    assert plain[-1] > 1e6, plain[-5:]
    assert damped[-1] < 0.3, damped[-5:]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_server_momentum_and_adaptive_optimizers_converge(seed: int) -> None:
    """FedAvgM (lr 0.05, momentum 0.5: the effective step lr / (1 - momentum) = 0.1 of the
    analysis above), FedAdam, FedYogi and FedAdagrad (lr 0.05: a per-coordinate step of
    about lr / rms(g) in the normalised units of the adaptive methods; Adagrad's shrinks as
    lr / sqrt(t), so it starts at 0.5) all drive the loss
    well below its start where the plain step diverges. The adaptive methods' noise floor
    is lr-sized per coordinate: 0.05^2 * d against ||c||^2 ~ d gives ~0.0025."""
    for opt in (ServerSGD(0.05, momentum=0.5), ServerAdam(0.05), ServerYogi(0.05),
                ServerAdagrad(0.5)):
        ratio = _loss_ratio(_strategy(seed, server_optimizer=opt), 60, seed)
        assert ratio[-1] < 0.3, (opt.describe(), ratio[-5:])


def test_error_feedback_memory_lives_in_the_context_state() -> None:
    """The memory after a round is exactly ``v - lr * decode(own message)`` with
    ``v = update + previous memory``; it persists in ``context.state`` between rounds."""
    strategy = _strategy(4, server_optimizer=ServerSGD(lr=K / D), error_feedback=True)
    rng = np.random.default_rng(4)
    update = rng.standard_normal(D)
    ctxt = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    client_seeds = iter(seeds(77))
    mod = make_rpsagg_mod(client_seeds.__next__)
    memory = np.zeros(D)
    x = ArrayRecord({"w": Array(np.zeros(D, np.float64))})
    replay = iter(seeds(77))
    for rnd in (1, 2, 3):
        msg = next(iter(strategy.configure_train(rnd, x, ConfigRecord(), FakeGrid(NODES))))
        enc = RoundEncoding.from_config(msg.content["config"])
        assert enc is not None and enc.error_feedback == pytest.approx(K / D)
        reply = mod(msg, ctxt, adding_app(update, 1.0))
        assert not reply.has_error()
        est = make_estimator("rand-k", n=1, k=K, d=D)
        v = update + memory
        sent = est.encode(v, derive_round_seed(next(replay), enc.nonce,
                                               str(msg.metadata.dst_node_id)))
        memory = v - (K / D) * est.decode([sent])
        np.testing.assert_allclose(ctxt.state.array_records[MEMORY_KEY]["e"].numpy(), memory,
                                   rtol=1e-12, atol=1e-12)
        strategy._plan = None  # only this node's reply: the round is not aggregated


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_error_feedback_restores_the_step_that_a_small_server_lr_takes_away(seed: int) -> None:
    """Rand-k with error feedback at lr = k/d: each round the server applies, per client,
    exactly the k kept coordinates of ``v = update + memory`` (lr * (d/k) * v_j = v_j), and
    the memory keeps the rest: the contractive compressor of classic error feedback (Stich
    et al., 2018), ``E||v - C(v)||^2 = (1 - k/d) ||v||^2``, no added variance. Clients take
    a local step of 0.02 towards ``c`` (error feedback sums the updates over rounds, so it
    needs gradient-like steps: a full step each round would be counted again each round).

    Without the memory, lr = k/d = 1/32 shrinks the expected step to 0.02/32 per round:
    E||e||^2 falls by about (1 - 0.02/32)^2 per round, to ~0.78 after 200 rounds. With the
    memory every coordinate is applied within ~d/k rounds on average, so the step is ~0.02
    per round, delayed: (1 - 0.02)^(2 * 200) ~ 3e-4, up to the delay. Bounds: > 0.6
    without, < 0.05 with."""
    lr = ServerSGD(lr=K / D)
    without = _loss_ratio(_strategy(seed, server_optimizer=lr), 200, seed, local_step=0.02)
    ef = _loss_ratio(_strategy(seed, server_optimizer=ServerSGD(lr=K / D),
                               error_feedback=True), 200, seed, local_step=0.02)
    assert without[-1] > 0.6, without[-5:]
    assert ef[-1] < 0.05, ef[-5:]


def test_error_feedback_needs_a_plain_server_step() -> None:
    with pytest.raises(ValueError, match="error_feedback needs a plain server step"):
        RandProjSpatialFedAvg("rand-k", k=4, server_optimizer=ServerAdam(0.1),
                              error_feedback=True)
    with pytest.raises(ValueError, match="unknown server optimizer"):
        make_server_optimizer("lamb", 0.1)
    with pytest.raises(ValueError, match="learning rate must be positive"):
        ServerSGD(lr=0.0)
