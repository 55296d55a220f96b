"""Flower's server-side clipping wrappers cannot wrap RandProjSpatialFedAvg: they clip each
reply's uncompressed arrays, which a compressed reply does not carry, so the clipping would
be skipped without a word. Flower's public API gives a wrapped strategy no sign of its
wrapper (the wrapper passes the round's config and arrays unchanged), so the check finds
the wrapper among the strategy's callers: the one place this package reads stack frames.
"""

from __future__ import annotations

import sys

from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

_SERVER_SIDE_DP = (DifferentialPrivacyServerSideFixedClipping,
                   DifferentialPrivacyServerSideAdaptiveClipping)


def refuse_server_side_clipping() -> None:
    """Raise ``TypeError`` naming the client-side wrapper and mods to use when a Flower
    server-side clipping wrapper called the strategy's method that calls this."""
    frame = sys._getframe(2)
    while frame is not None:
        caller = frame.f_locals.get("self")
        if isinstance(caller, _SERVER_SIDE_DP):
            wrapper = type(caller).__name__
            kind = "Adaptive" if "Adaptive" in wrapper else "Fixed"
            raise TypeError(
                f"{wrapper} cannot wrap RandProjSpatialFedAvg: server-side clipping needs each "
                f"client's uncompressed update; use client-side clipping: "
                f"DifferentialPrivacyClientSide{kind}Clipping on the server and "
                f"ClientApp(mods=client_mods({kind.lower()}clipping_mod)) on the clients")
        frame = frame.f_back  # type: ignore[assignment]
