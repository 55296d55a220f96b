"""Flower's server-side clipping wrappers cannot wrap RandProjSpatialFedAvg: they clip each
reply's uncompressed arrays, which a compressed reply does not carry, so the clipping would
be skipped without a word. The check below finds them by what they do, not by who calls.

* A strategy driven by its own ``start()``, or inside :meth:`DriverCheck.driving` (a loop
  of the user's own), has no wrapper around it: nothing to check.
* A round whose config has a clipping norm is under one of Flower's client-side clipping
  wrappers (they put it there): nothing to check.
* Otherwise the round's config asks the clients for a check record (:data:`CHECK_RECORD`):
  an ``ArrayRecord`` of one empty ``Array`` whose serialization type is :data:`REFUSAL`.
  A server-side clipping wrapper converts every ``ArrayRecord`` of every reply to NumPy
  before it calls the strategy, and that ``Array``'s conversion raises ``TypeError`` with
  the refusal in its message, before any clipping, noise or model update. A check record
  that reaches the strategy shows that no such wrapper is there: the strategy stops asking.
  It costs about 790 B a reply, in that round only (normally the first).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from flwr.app import Array, ArrayRecord, ConfigRecord, Message

from rpsagg_flower.settings import KEY_CHECK, KEY_CLIPPING_NORM

#: The name of the check record in a reply's content (its first ``ArrayRecord``).
CHECK_RECORD = KEY_CHECK

#: What a server-side clipping wrapper raises (``TypeError``, inside Flower's message
#: "Unsupported serialization type for numpy conversion: '...'").
REFUSAL = ("rpsagg: Flower's server-side clipping wrappers (DifferentialPrivacyServerSide"
           "FixedClipping, ...AdaptiveClipping) cannot wrap RandProjSpatialFedAvg: server-side "
           "clipping needs each client's uncompressed update; use client-side clipping: "
           "DifferentialPrivacyClientSideFixedClipping (or ...AdaptiveClipping) on the server "
           "and ClientApp(mods=client_mods(fixedclipping_mod)) (or adaptiveclipping_mod) on "
           "the clients")


def check_record() -> ArrayRecord:
    """The check record a client adds to its reply when the round's config asks for it."""
    return ArrayRecord({"refusal": Array(dtype="", shape=(), stype=REFUSAL, data=b"")})


def asked(config: ConfigRecord) -> bool:
    """Whether a round's config asks for the check record."""
    return bool(config.get(KEY_CHECK, False))


class DriverCheck:
    """The strategy's side of the check: whether a round asks for the check record."""

    def __init__(self) -> None:
        self._driving = 0  # inside start() or driving(), nested
        self._cleared = False  # a check record came back: no server-side wrapper

    @contextmanager
    def driving(self) -> Iterator[None]:
        """Within it, the strategy is driven directly (no wrapper): no round asks."""
        self._driving += 1
        try:
            yield
        finally:
            self._driving -= 1

    def ask(self, config: ConfigRecord, round_config: ConfigRecord) -> None:
        """Ask for the check record in ``round_config`` unless nothing needs checking
        (``config``: the round's config as the strategy's caller gave it)."""
        if not (self._driving or self._cleared or KEY_CLIPPING_NORM in config):
            round_config[KEY_CHECK] = True

    def seen(self, replies: Iterable[Message]) -> None:
        """Stop asking once a reply brought its check record back to the strategy."""
        if any(r.has_content() and CHECK_RECORD in r.content.array_records for r in replies):
            self._cleared = True
