"""Decoding rounds on a Ray cluster (``--decode-backend ray``, extra ``rpsagg-server[ray]``).

A round's messages go to Ray's object store once (one object: the seeds and the float32
values of every vector, the codes and scales of quantized ones); tasks read them from there
(zero-copy on their node) and return estimates. The fan-out:

* Rand-Proj-Spatial (one joint system per vector): one task per vector of the round.
* Blockwise Rand-Proj-Spatial: one task per group of consecutive blocks per vector, each
  running :meth:`~rpsagg.BlockwiseRandProjSpatial.decode_blocks`, the same code
  as the local decode, with the betas computed once on the server (cached there), so the
  estimate equals the local decode bit for bit.

Every result carries the decode's error estimate, as the local decode's does: a
Rand-Proj-Spatial task returns its decode's; for blockwise the server sums the blocks'
from their solves (:meth:`~rpsagg.BlockwiseRandProjSpatial.assemble` with the batch).

Each task decodes with its node's local decode (numpy on every core, or the estimator's
PyTorch device). Ray retries a task whose worker died (``max_retries``): a killed worker
costs the time of its task, not the round. Faults: a task that raises, or a cluster that
cannot be reached, raises here, and the round fails with a decode error like any other
decode failure (the server keeps running; its submissions stay durable).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

# Ray's C++ core installs abseil's failure signal handler in every driver process, SIGTERM
# included: a SIGTERM to the server then went through its stack dump and watchdog before the
# server's own graceful stop, and a stop that took a while ended in SIGABRT (exit -6). The
# server owns its signals. Ray reads this when it is imported, which in the server happens
# only through this module (config.py checks for Ray without importing it).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

from rpsagg import (
    BlockwiseRandProjSpatial,
    DecodeResult,
    Encoded,
    ErrorEstimate,
    Estimator,
    RandProjSpatial,
)

FloatArray = NDArray[np.float64]
log = logging.getLogger("rpsagg.server")

# Ray's own default is 3; a decode task is pure (a function of the object-store payload), so
# re-running it is always safe.
TASK_RETRIES = 3

_lock = threading.Lock()
_remote: Any = None


@dataclass(frozen=True)
class Payload:
    """One round's messages as they sit in the object store."""

    scheme: str
    k: int
    d: int
    seeds: NDArray[np.uint64]  # (m, n')
    values: NDArray[np.float32]  # (m, n', k): the values (of quantized messages: decoded)
    value_bits: int = 32
    codes: NDArray[np.uint32] | None = None  # (m, n', k) for quantized messages
    scales: NDArray[np.float32] | None = None  # (m, n', scales per message)

    def batch(self, j: int) -> list[Encoded]:
        """The messages of vector ``j`` (quantized ones with their codes and scales, so that
        the error estimate keeps their rounding variance, as in the local decode)."""
        if self.codes is None or self.scales is None:
            return [
                Encoded(self.scheme, int(s), self.k, self.d, v)
                for s, v in zip(self.seeds[j], self.values[j], strict=True)
            ]
        return [
            Encoded(self.scheme, int(s), self.k, self.d, v, value_bits=self.value_bits,
                    codes=c, scales=sc)
            for s, v, c, sc in zip(self.seeds[j], self.values[j], self.codes[j],
                                   self.scales[j], strict=True)
        ]


def _codes(m: Encoded) -> NDArray[np.uint32]:
    if m.codes is None:
        raise ValueError("a round mixes quantized and float32 messages")
    return m.codes


def _scales(m: Encoded) -> NDArray[np.float32]:
    if m.scales is None:
        raise ValueError("a round mixes quantized and float32 messages")
    return m.scales


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` once per process (None: start a local one)."""
    import ray

    with _lock:
        if ray.is_initialized():
            return
        ray.init(address=address, namespace="rpsagg", log_to_driver=False,
                 configure_logging=False)


def _where() -> str:
    """The node a task runs on: its address and host name (a container's id)."""
    import socket

    import ray

    return f"{ray.util.get_node_ip_address()} ({socket.gethostname()})"


def _task(
    payload: Payload, estimator: Estimator, j: int, first: int, stop: int,
    betas: dict[int, float] | float,
) -> tuple[FloatArray, Any, float, str, ErrorEstimate | None]:
    """Body of a Ray task: blocks ``first .. stop-1`` of vector ``j`` (or the whole vector);
    the fourth item says on which node it ran; the fifth is the whole vector's error
    estimate (None for a range of blocks: the server sums the blocks' in ``assemble``)."""
    batch = payload.batch(j)
    if isinstance(estimator, BlockwiseRandProjSpatial):
        assert isinstance(betas, dict)
        out, infos, c = estimator.decode_blocks(batch, first, stop, betas)
        return out, infos, c, _where(), None
    assert isinstance(estimator, RandProjSpatial) and isinstance(betas, float)
    # the local decode, error estimate included (RandProjSpatial.error_from_sketches from
    # the solve's ||A^T y||^2, or one more adjoint product where the solver did not record it)
    result = estimator._decode(batch, betas)
    return (result.estimate, result.solve, 0.0 if result.c is None else result.c, _where(),
            result.error_estimate)


def _log_nodes(nodes: Sequence[str]) -> None:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    log.info("[Ray] %d decode tasks ran on %s", len(nodes),
             ", ".join(f"{node} x{c}" for node, c in sorted(counts.items())))


def _remote_task() -> Any:
    global _remote
    import ray

    with _lock:
        if _remote is None:
            _remote = ray.remote(max_retries=TASK_RETRIES, num_cpus=1)(_task)
        return _remote


def block_groups(blocks: int, workers: int) -> list[tuple[int, int]]:
    """Consecutive ranges of blocks, about two per worker (a straggler then costs half a
    share), never empty."""
    groups = max(1, min(blocks, 2 * workers))
    bounds = [blocks * g // groups for g in range(groups + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _payload(estimator: Estimator, batches: list[list[Encoded]]) -> Payload:
    """A round's messages as one object for the object store.

    Parameters
    ----------
    estimator : Estimator
        Vector 0's estimator (its scheme, k and d name the messages).
    batches : list of lists of Encoded
        One batch per vector, the same clients (and order) in each.
    """
    first = batches[0][0]
    quantized = first.codes is not None
    return Payload(
        estimator.name, estimator.k, estimator.d,
        np.array([[m.seed for m in b] for b in batches], dtype=np.uint64),
        np.stack([np.stack([m.values for m in b]) for b in batches]),
        first.value_bits,
        np.stack([np.stack([_codes(m) for m in b]) for b in batches]) if quantized else None,
        np.stack([np.stack([_scales(m) for m in b]) for b in batches]) if quantized else None,
    )


def _decode_blockwise(task: Any, ref: Any, payload: Payload,
                      estimators: Sequence[BlockwiseRandProjSpatial],
                      n_prime: int) -> list[DecodeResult]:
    """Blockwise vectors: one task per group of consecutive blocks per vector, the blocks
    then assembled here (their error estimates summed with the batch)."""
    import ray

    workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
    groups = block_groups(estimators[0].blocks, workers)
    futures = [[task.remote(ref, e, j, a, b, e.block_betas(n_prime)) for a, b in groups]
               for j, e in enumerate(estimators)]
    results = []
    nodes: list[str] = []
    for j, (e, row) in enumerate(zip(estimators, futures, strict=True)):
        parts = ray.get(row)
        infos = [i for _, part_infos, _, _, _ in parts for i in part_infos]
        nodes.extend(where for _, _, _, where, _ in parts)
        # with the batch, assemble sums the blocks' error estimates (the blocks' solves
        # carry their ||A^T y||^2)
        results.append(e.assemble([p for p, _, _, _, _ in parts], infos, parts[-1][2],
                                  n_prime, payload.batch(j)))
    _log_nodes(nodes)
    return results


def decode_vectors(estimators: Estimator | Sequence[Estimator],
                   batches: list[list[Encoded]]) -> list[DecodeResult]:
    """Decode every vector of a round on the cluster; results in order.

    Parameters
    ----------
    estimators : RandProjSpatial or BlockwiseRandProjSpatial, or a sequence of them
        Vector j's estimator (with any device or thread options for the workers; they
        differ only in the prior of ``transform="auto"``), or one for every vector.
    batches : list of lists of Encoded
        One batch per vector, the same clients (and order) in each.
    """
    import ray

    if isinstance(estimators, Estimator):
        estimators = [estimators] * len(batches)
    if len(estimators) != len(batches):
        raise ValueError(f"{len(estimators)} estimators for {len(batches)} vectors")
    estimator = estimators[0]
    for e in estimators:
        if not isinstance(e, RandProjSpatial | BlockwiseRandProjSpatial):
            raise ValueError(f"the Ray backend decodes rand-proj-spatial, not {e.name}")
    n_prime = len(batches[0])
    payload = _payload(estimator, batches)
    ref = ray.put(payload)  # once per round; every task reads it from the object store
    task = _remote_task()
    if isinstance(estimator, BlockwiseRandProjSpatial):
        blockwise = [cast(BlockwiseRandProjSpatial, e) for e in estimators]
        return _decode_blockwise(task, ref, payload, blockwise, n_prime)
    betas = [e.beta_for(n_prime) for e in estimators]
    outs = ray.get([task.remote(ref, e, j, 0, 1, beta)
                    for j, (e, beta) in enumerate(zip(estimators, betas, strict=True))])
    _log_nodes([where for _, _, _, where, _ in outs])
    return [DecodeResult(est, n_prime, beta, c, info, 0.0, error)
            for (est, info, c, _, error), beta in zip(outs, betas, strict=True)]
