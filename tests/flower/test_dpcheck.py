"""Flower's server-side clipping wrappers meet the check record and fail with the refusal;
a strategy driven directly (its own ``start()``, ``driving()``) or under client-side
clipping asks for none; any other driver asks until one check record comes back."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

from rpsagg_flower import RandProjSpatialFedAvg, make_rpsagg_mod
from rpsagg_flower.dpcheck import CHECK_RECORD, REFUSAL
from rpsagg_flower.settings import KEY_CHECK
from rpsagg_flower.wire import wire_bytes

from .flower_util import FakeGrid, adding_app, context, model, seeds

pytestmark = pytest.mark.unit

SHAPES = {"w": ((6, 8), "float32"), "b": ((12,), "float32")}
UPDATES = {1: np.linspace(-1.0, 1.0, 60), 2: np.linspace(2.0, -1.0, 60)}


def _strategy() -> RandProjSpatialFedAvg:
    return RandProjSpatialFedAvg("rand-proj-spatial", k=20, nonces=iter(seeds(900)).__next__)


def _asks(messages: Iterable[Message]) -> list[bool]:
    return [bool(m.content["config"].get(KEY_CHECK, False)) for m in messages]


def _replies(messages: list[Message]) -> list[Message]:
    """The nodes' replies, in node order (FedAvg samples them in a random order), with
    client seeds in that order."""
    mod = make_rpsagg_mod(iter(seeds(500)).__next__)
    return [mod(m, context(m.metadata.dst_node_id), adding_app(UPDATES[m.metadata.dst_node_id],
                                                              None))
            for m in sorted(messages, key=lambda m: m.metadata.dst_node_id)]


class PassThrough:
    """A strategy wrapper of a user's own that changes nothing (a logging wrapper, say)."""

    def __init__(self, strategy: RandProjSpatialFedAvg) -> None:
        self.strategy = strategy

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: FakeGrid) -> list[Message]:
        return list(self.strategy.configure_train(server_round, arrays, config, grid))  # type: ignore[arg-type]

    def aggregate_train(self, server_round: int, replies: list[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)


@pytest.mark.parametrize("wrapper", [
    lambda s: DifferentialPrivacyServerSideFixedClipping(s, 1.0, 0.5, 2),
    lambda s: DifferentialPrivacyServerSideAdaptiveClipping(s, 0.0, 2),
])
def test_server_side_clipping_fails_on_the_check_record(wrapper) -> None:  # type: ignore[no-untyped-def]
    """Under Flower's server-side clipping wrappers the first round asks for the check
    record; the wrapper converts it to NumPy before anything else of the replies and fails
    with the refusal, which names the client-side clipping to use; the strategy it wraps
    never aggregates."""
    inner = _strategy()
    dp = wrapper(inner)
    messages = list(dp.configure_train(1, model(SHAPES), ConfigRecord(), FakeGrid([1, 2])))
    assert _asks(messages) == [True, True]
    replies = _replies(messages)
    assert [next(iter(r.content.array_records)) for r in replies] == [CHECK_RECORD] * 2
    with pytest.raises(TypeError) as exc:
        dp.aggregate_train(1, replies)
    assert str(exc.value) == f"Unsupported serialization type for numpy conversion: '{REFUSAL}'"
    assert "DifferentialPrivacyClientSideFixedClipping" in REFUSAL
    assert "client_mods(fixedclipping_mod)" in REFUSAL
    assert inner._plan is not None  # configured, never aggregated


def test_another_driver_asks_until_a_check_record_comes_back() -> None:
    """A wrapper that is not a clipping one: round 1 asks, its replies bring the record back
    (its bytes counted in the round's wire bytes, not in FedAvg's counterpart), and no later
    round asks; the models are those of the strategy driven directly, bit for bit."""
    wrapped, direct = PassThrough(_strategy()), _strategy()
    arrays = {"wrapped": model(SHAPES), "direct": model(SHAPES)}
    for rnd in (1, 2, 3):
        messages = wrapped.configure_train(rnd, arrays["wrapped"], ConfigRecord(), FakeGrid([1, 2]))
        assert _asks(messages) == [rnd == 1] * 2
        replies = _replies(messages)
        new, metrics = wrapped.aggregate_train(rnd, replies)
        with direct.driving():
            plain = list(direct.configure_train(rnd, arrays["direct"], ConfigRecord(),
                                                FakeGrid([1, 2])))
        assert _asks(plain) == [False, False]
        plain_replies = _replies(plain)
        new_direct, metrics_direct = direct.aggregate_train(rnd, plain_replies)
        assert new is not None and new_direct is not None and metrics and metrics_direct
        for key in SHAPES:
            np.testing.assert_array_equal(new[key].numpy(), new_direct[key].numpy())
        extra = sum(wire_bytes(r) for r in replies) - sum(wire_bytes(r) for r in plain_replies)
        assert metrics["rpsagg.bytes-up"] - metrics_direct["rpsagg.bytes-up"] == extra  # type: ignore[operator]
        if rnd == 1:  # docs/flower.md and dpcheck's docstring: about 790 B a reply
            assert extra / 2 == pytest.approx(790, abs=10)
        else:
            assert extra == 0
        key = "rpsagg.bytes-up-uncompressed"  # FedAvg's counterpart: no check record
        assert metrics[key] == metrics_direct[key]
        arrays = {"wrapped": new, "direct": new_direct}


def test_client_side_clipping_asks_for_no_check() -> None:
    """Flower's client-side clipping wrappers put the clipping norm in the config: no
    server-side clipping is there to check."""
    dp = DifferentialPrivacyClientSideFixedClipping(_strategy(), 0.0, 1.0, 2)
    messages = list(dp.configure_train(1, model(SHAPES), ConfigRecord(), FakeGrid([1, 2])))
    assert _asks(messages) == [False, False]


class AppGrid(FakeGrid):
    """A grid whose nodes answer in this process, through the rpsagg mod."""

    def __init__(self, node_ids: list[int]) -> None:
        super().__init__(node_ids)
        self.sent: list[Message] = []

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        self.sent += messages
        return _replies(messages)


@pytest.mark.parametrize("wrapped", [False, True])
def test_start_drives_the_strategy(wrapped: bool) -> None:
    """``strategy.start()`` (Flower's loop) asks for no check: nothing can stand between
    it and the strategy; nor does a client-side clipping wrapper's ``start()`` (the norm in
    the config), and both runs train."""
    strategy = _strategy()
    grid = AppGrid([1, 2])
    driver: FedAvg = (DifferentialPrivacyClientSideFixedClipping(strategy, 0.0, 1e9, 2)
                      if wrapped else strategy)
    result = driver.start(grid, model(SHAPES), num_rounds=2)  # type: ignore[arg-type]
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train) == 4 and _asks(train) == [False] * 4
    assert result.arrays is not None
