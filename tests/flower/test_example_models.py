"""The Flower example's PyTorch models (``model = "cnn"`` or ``"mlp"``): its ClientApp, in
this process, trains each on its shard and replies through the rpsagg mod; the strategy
decodes the replies into a model of the same arrays."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from rpsagg_flower import RandProjSpatialFedAvg
from rpsagg_flower.payload import Layout

from .flower_util import FakeGrid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-fashion-mnist"
sys.path.insert(0, str(EXAMPLE))

from fmnist_app.client_app import app  # noqa: E402
from fmnist_app.models import MODELS, torch_model  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("model", "d"), [("cnn", 20_586), ("mlp", 203_530)])
def test_the_example_trains_each_torch_model(model: str, d: int) -> None:
    """Two nodes of 100 images, one round at k = d/100 4-bit codes: every reply is a
    compressed one, both are decoded, the new model has the initial model's arrays, shapes
    and dtypes, and its compressed arrays moved."""
    arch = torch_model(model)
    assert arch is not None
    initial = arch.initial(1)
    plain = arch.buffer_names()
    assert Layout.of(initial, plain).d == d
    strategy = RandProjSpatialFedAvg("rand-proj-spatial", k=d // 100, value_bits=4,
                                     uncompressed=plain, fraction_evaluate=0.0,
                                     min_train_nodes=2, min_available_nodes=2)
    with strategy.driving():
        messages = list(strategy.configure_train(1, initial, ConfigRecord(), FakeGrid([1, 2])))  # type: ignore[arg-type]
    run_config = {"model": model, "examples-per-client": 100, "local-epochs": 1, "lr": 0.01,
                  "batch-size": 32, "seed": 1}
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        ctxt = Context(run_id=1, node_id=node, state=RecordDict(), run_config=run_config,  # type: ignore[arg-type]
                       node_config={"partition-id": node - 1, "num-partitions": 2})
        replies.append(app(msg, ctxt))
    assert [r.has_error() for r in replies] == [False, False], [
        r.error.reason for r in replies if r.has_error()]
    new, metrics = strategy.aggregate_train(1, replies)
    assert new is not None and metrics is not None
    assert metrics["rpsagg.n-prime"] == 2 and metrics["rpsagg.k"] == d // 100
    assert list(new.keys()) == list(initial.keys())
    for key in initial:
        before, after = initial[key].numpy(), new[key].numpy()
        assert (after.shape, after.dtype) == (before.shape, before.dtype), key
    moved = [key for key in initial if key not in plain
             and np.issubdtype(initial[key].numpy().dtype, np.floating)
             and not np.array_equal(new[key].numpy(), initial[key].numpy())]
    assert moved == [key for key in initial if key not in plain
                     and np.issubdtype(initial[key].numpy().dtype, np.floating)]


def test_an_unknown_model_is_named() -> None:
    with pytest.raises(ValueError) as exc:
        torch_model("resnet")
    assert str(exc.value) == f"model must be one of {', '.join(MODELS)}; got 'resnet'"
    assert torch_model("softmax") is None
