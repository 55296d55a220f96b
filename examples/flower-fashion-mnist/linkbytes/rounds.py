"""A node's exchanges cut into rounds (at the pulls that return a training message) and
sorted by what they carry: the reply, the received model, the run's setup, polling, the
node's registration."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

from linkbytes.httpstream import Exchange
from linkbytes.proxy import LinkProxy

#: the Fleet API's paths (flwr.supernode.fleet_http_client) and what they carry
PULL = "/v1/fleet/pull-messages"
CATEGORY = {
    "/v1/fleet/push-messages": "reply", "/v1/fleet/push-object": "reply",
    "/v1/fleet/pull-object": "receive", "/v1/fleet/confirm-message-received": "receive",
    "/v1/fleet/get-run": "run-setup", "/v1/fleet/get-fab": "run-setup",
    "/v1/fleet/send-node-heartbeat": "poll",
    "/v1/fleet/register-node": "node-setup", "/v1/fleet/activate-node": "node-setup",
    "/v1/fleet/deactivate-node": "node-setup", "/v1/fleet/unregister-node": "node-setup",
}
CATEGORIES = ("reply", "receive", "run-setup", "poll", "node-setup", "other")


def _body(ex: Exchange) -> bytes:
    body = ex.response_body or b""
    enc = ex.response_headers.get("content-encoding", "").lower()
    if enc == "gzip":
        return gzip.decompress(body)
    if enc == "deflate":
        return zlib.decompress(body)
    return body


def pulled_messages(ex: Exchange) -> int:
    """How many messages a ``pull-messages`` exchange's response carried."""
    from flwr.proto.fleet_pb2 import PullMessagesResponse  # flwr: .venv-flower only

    resp = PullMessagesResponse()
    resp.ParseFromString(_body(ex))
    return len(resp.messages_list)


def category(ex: Exchange) -> str:
    if ex.path == PULL:
        return "receive" if pulled_messages(ex) else "poll"
    return CATEGORY.get(ex.path, "other")


def _zero() -> dict[str, int]:
    return {"up": 0, "down": 0, "up-head": 0, "down-head": 0, "requests": 0}


def segment(proxy: LinkProxy, t_run: float, t_end: float, rounds: int) -> dict[str, Any]:
    """One node's exchanges, cut into rounds and sorted into :data:`CATEGORIES`.

    Round k runs from the k-th ``pull-messages`` that returned a message (after ``t_run``,
    when ``flwr run`` started) to the next one, the last round to ``t_end`` (when
    ``flwr run`` returned); ``before`` is everything before round 1 (the node's
    registration, its polling while it waited). Exchanges are placed by their request's
    first byte.
    """
    exchanges = sorted(proxy.exchanges, key=lambda e: e.t_request)
    starts = [e.t_request for e in exchanges
              if e.path == PULL and e.t_request >= t_run and e.t_response is not None
              and pulled_messages(e)]
    if len(starts) != rounds:
        raise RuntimeError(f"a node pulled {len(starts)} messages in a run of {rounds} rounds")
    bounds = [*starts, t_end]
    names = ["before", *[str(r) for r in range(1, rounds + 1)], "after"]
    out: dict[str, dict[str, Any]] = {
        n: {"up": 0, "down": 0, "up-head": 0, "down-head": 0, "requests": 0, "seconds": 0.0,
            "by-category": {c: _zero() for c in CATEGORIES}, "by-path": {}} for n in names}
    for i, name in enumerate(names[1:-1]):
        out[name]["seconds"] = bounds[i + 1] - bounds[i]
    for ex in exchanges:
        idx = sum(1 for b in bounds if ex.t_request >= b)  # 0: before, rounds + 1: after
        seg = out[names[idx]]
        cat = category(ex)
        for bucket in (seg, seg["by-category"][cat],
                       seg["by-path"].setdefault(ex.path if ex.path != PULL or cat == "poll"
                                                 else PULL + " (with a message)", _zero())):
            bucket["up"] += ex.up
            bucket["down"] += ex.down
            bucket["up-head"] += ex.up_head
            bucket["down-head"] += ex.down_head
            bucket["requests"] += 1
    return out
