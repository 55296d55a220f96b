"""A real PyTorch model with BatchNorm through the mod and the strategy, as a Flower user
sends one: ``ArrayRecord(model.state_dict())`` and back with ``to_torch_state_dict()``.

The state dict holds float32 weights, BatchNorm's float32 running statistics and its int64
``num_batches_tracked`` counters (0-d arrays). With the ``"full"`` estimator (every value
sent exactly) one round of ``RandProjSpatialFedAvg`` must give what Flower's own ``FedAvg``
gives for the same client models; with a compressing estimator the round must load back
into the module (strict) with every dtype and shape kept.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from torch import nn

from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.records import PLAIN_PREFIX, STYPE_RAW

from .flower_util import FakeGrid, context, seeds, sent

pytestmark = pytest.mark.unit

STATS = ["bn.running_mean", "bn.running_var"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))  # type: ignore[no-any-return]


def _local_training(node: int):  # type: ignore[no-untyped-def]
    """A ClientApp body: ``node`` SGD steps on random data (train mode, so BatchNorm's
    running statistics and counter move: the counter ends at received + node)."""

    def app(msg: Message, ctxt: Context) -> Message:
        net = Net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict(), strict=True)
        net.train()
        gen = torch.Generator().manual_seed(node)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(node):
            x = torch.randn(16, 1, 8, 8, generator=gen)
            y = torch.randint(0, 3, (16,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
        metrics = MetricRecord({"num-examples": 100 * node})
        return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()),
                                   "metrics": metrics}), reply_to=msg)

    return app


def _round(strategy: FedAvg, initial: ArrayRecord) -> tuple[ArrayRecord, list[Message]]:
    messages = list(strategy.configure_train(1, initial, ConfigRecord(), FakeGrid([1, 2, 3])))  # type: ignore[arg-type]
    mod = make_rpsagg_mod(iter(seeds(70)).__next__)
    replies = [mod(m, context(m.metadata.dst_node_id), _local_training(m.metadata.dst_node_id))
               if isinstance(strategy, RandProjSpatialFedAvg)
               else _local_training(m.metadata.dst_node_id)(m, context(m.metadata.dst_node_id))
               for m in messages]
    for reply in replies:
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    new, _ = strategy.aggregate_train(1, replies)
    assert new is not None
    return new, replies


def _initial() -> ArrayRecord:
    torch.manual_seed(0)
    net = Net()
    net.bn.num_batches_tracked.fill_(5)
    return ArrayRecord(net.state_dict())


def test_full_estimator_gives_flowers_fedavg_on_a_batchnorm_state_dict() -> None:
    """Float arrays: the weighted mean, as FedAvg (float32 rounding apart: 1e-6 relative).
    The counters: every client moved from 5 to 5 + node, weights 100, 200, 300, so the mean
    is 5 + 14/6 = 7.33; FedAvg leaves that float in an int64 tensor's place, rpsagg rounds
    it to 7 in the int64 dtype."""
    fedavg, _ = _round(FedAvg(fraction_evaluate=0.0), _initial())
    strategy = RandProjSpatialFedAvg("full", k=1, uncompressed=STATS,
                                     nonces=iter(seeds(9)).__next__, fraction_evaluate=0.0)
    ours, replies = _round(strategy, _initial())
    for reply in replies:  # the counters and statistics travel raw beside the values
        carried = sent(reply, strategy, _initial()).arrays
        for key in ["bn.num_batches_tracked", *STATS]:
            assert carried[PLAIN_PREFIX + key].stype == STYPE_RAW
    state = ours.to_torch_state_dict()
    Net().load_state_dict(state, strict=True)
    reference = fedavg.to_torch_state_dict()
    assert list(state) == list(reference)
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            assert value.dtype == torch.int64 and value.shape == ()
            assert int(value) == 7 and float(reference[key]) == pytest.approx(5 + 14 / 6)
            continue
        assert value.dtype == torch.float32 and value.shape == reference[key].shape
        np.testing.assert_allclose(value.numpy(), reference[key].numpy(), rtol=1e-6,
                                   atol=1e-7, err_msg=key)


def test_compressed_round_loads_back_into_the_module() -> None:
    """Rand-Proj-Spatial at k = d/10: the statistics and counters exact (FedAvg's weighted
    mean, the counter rounded), the weights a noisy estimate of the mean but finite and in
    their dtype; the new state dict loads (strict) and runs a forward pass in eval mode."""
    fedavg, _ = _round(FedAvg(fraction_evaluate=0.0), _initial())
    d = sum(p.numel() for p in Net().parameters())
    ours, _ = _round(RandProjSpatialFedAvg("rand-proj-spatial", k=d // 10, uncompressed=STATS,
                                           nonces=iter(seeds(11)).__next__,
                                           fraction_evaluate=0.0), _initial())
    state = ours.to_torch_state_dict()
    reference = fedavg.to_torch_state_dict()
    for key in STATS:
        np.testing.assert_allclose(state[key].numpy(), reference[key].numpy(), rtol=1e-6)
    assert int(state["bn.num_batches_tracked"]) == 7
    weights = [key for key in state if key not in STATS and "num_batches" not in key]
    assert all(state[key].dtype == torch.float32 for key in weights)
    assert not all(torch.equal(state[key], reference[key]) for key in weights)  # compressed
    net = Net()
    net.load_state_dict(state, strict=True)
    net.eval()
    out = net(torch.zeros(2, 1, 8, 8))
    assert out.shape == (2, 3) and bool(torch.isfinite(out).all())
