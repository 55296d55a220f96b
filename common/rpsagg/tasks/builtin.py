"""The built-in tasks: mean, power iteration, k-means and linear regression."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rpsagg.synthetic import correlated_vectors
from rpsagg.tasks.base import FloatArray, Shard, Task


def _mix(*words: int) -> int:
    """A data seed from integers (SplitMix64-style; data only, never a transform)."""
    from rpsagg.spec import MASK64, mix64

    z = 0
    for w in words:
        z = mix64((z ^ (w & MASK64)) & MASK64)
    return z


@dataclass
class MeanTask(Task):
    """Plain mean estimation: one round per call, the caller supplies the vectors.

    The global state is empty. ``m = params["vectors"]`` (default 1) vectors per client per
    round, each slot's mean estimated separately. The ``rpsagg-client`` command feeds the
    user's own vectors (``--vectors``) or synthetic ones with correlation R
    (``correlated_vectors(n, d, R, seed=mix(seed, step))[index]``; slot j > 0 mixes j in).
    """

    name = "mean"

    def __post_init__(self) -> None:
        if self.m < 1:
            raise ValueError(f"mean parameter 'vectors' must be >= 1; got {self.m}")

    @property
    def m(self) -> int:
        return int(self.params.get("vectors", 1))

    def initial_state(self, seed: int) -> FloatArray:
        return np.zeros((0,))

    def apply(self, state: FloatArray, estimate: FloatArray) -> FloatArray:
        return np.zeros((0,))

    def client_vectors(self, state: FloatArray, shard: Shard, step: int) -> FloatArray:
        seeds = [_mix(shard.seed, step)] + [_mix(shard.seed, step, j) for j in range(1, self.m)]
        return np.stack([correlated_vectors(shard.n, self.d, shard.r, seed=s)[shard.index]
                         for s in seeds])


@dataclass
class PowerIterationTask(Task):
    """Distributed power iteration for the top eigenvector of ``sum_i X_i^T X_i``.

    Client i sends ``X_i^T X_i v / rows_i``; the server normalizes the estimated mean.
    """

    name = "power-iteration"

    def initial_state(self, seed: int) -> FloatArray:
        v = np.random.default_rng(seed).standard_normal(self.d)
        return np.asarray(v / np.linalg.norm(v))

    def apply(self, state: FloatArray, estimate: FloatArray) -> FloatArray:
        v = estimate[0]
        norm = float(np.linalg.norm(v))
        return state if norm == 0.0 else np.asarray(v / norm)

    def client_vectors(self, state: FloatArray, shard: Shard, step: int) -> FloatArray:
        x = shard.x
        return np.asarray((x.T @ (x @ state)) / max(1, x.shape[0]))[None, :]

    def metric(self, state: FloatArray, shard: Shard) -> float | None:
        """Rayleigh quotient ``v^T X^T X v / rows`` on the shard."""
        xv = shard.x @ state
        return float(xv @ xv) / max(1, shard.x.shape[0])


@dataclass
class KMeansTask(Task):
    """Distributed Lloyd's k-means; ``m = params["centroids"]`` vectors per submission.

    Each round, client i assigns its points to the nearest current centroid and computes
    its local centroids (the mean of its points in each cluster); the server's new
    centroids are the estimated mean of the clients' local centroids.

    What is sent depends on ``params["updates"]``:

    * ``1`` (default): the *update* ``local centroid - current centroid`` per cluster, zero
      for a cluster the client has no point in; the server adds the estimated mean update
      to the current centroids. The mean is the same as below, but the compressed vectors
      shrink as Lloyd's algorithm converges, and an empty cluster adds no error.
    * ``0``: the local centroids themselves (the paper's description), the current
      centroid for an empty cluster. Under heavy compression this diverges: an empty
      cluster's centroid is re-estimated from copies of itself with an error proportional
      to its own norm, round after round (``docs/reproduction.md``, k-means).

    The initial centroids are ``init_scale * N(0, I / d)`` from the seed (the server has no
    data); the first assignment then splits the data by random directions.
    """

    name = "kmeans"

    def __post_init__(self) -> None:
        if self.m < 1:
            raise ValueError(f"kmeans parameter 'centroids' must be >= 1; got {self.m}")
        _ = self.sends_updates  # validates params["updates"]

    @property
    def m(self) -> int:
        return int(self.params.get("centroids", 10))

    @property
    def sends_updates(self) -> bool:
        """Whether clients send centroid updates (``params["updates"]``, default 1)."""
        flag = float(self.params.get("updates", 1.0))
        if flag not in (0.0, 1.0):
            raise ValueError(f"kmeans parameter 'updates' must be 0 or 1; got {flag}")
        return flag == 1.0

    def initial_state(self, seed: int) -> FloatArray:
        rng = np.random.default_rng(seed)
        scale = float(self.params.get("init_scale", 1.0))
        return np.asarray(scale * rng.standard_normal((self.m, self.d)) / np.sqrt(self.d))

    def apply(self, state: FloatArray, estimate: FloatArray) -> FloatArray:
        est = estimate.reshape(self.m, self.d)
        if self.sends_updates:
            return np.asarray(state.reshape(self.m, self.d) + est)
        return np.asarray(est)

    def client_vectors(self, state: FloatArray, shard: Shard, step: int) -> FloatArray:
        cent = state.reshape(self.m, self.d)
        x = shard.x
        dist = (x * x).sum(1)[:, None] - 2.0 * x @ cent.T + (cent * cent).sum(1)[None, :]
        assign = np.argmin(dist, axis=1)
        out = cent.copy()
        for j in range(self.m):
            members = x[assign == j]
            if members.shape[0]:
                out[j] = members.mean(axis=0)
        if self.sends_updates:
            out -= cent  # exactly zero for the empty clusters
        return out

    def metric(self, state: FloatArray, shard: Shard) -> float | None:
        """Mean squared distance of the shard's points to their nearest centroid."""
        cent = state.reshape(self.m, self.d)
        x = shard.x
        dist = (x * x).sum(1)[:, None] - 2.0 * x @ cent.T + (cent * cent).sum(1)[None, :]
        return float(np.maximum(dist.min(axis=1), 0.0).mean())


@dataclass
class LinRegTask(Task):
    """Distributed least squares by SGD: client i sends ``X_i^T (X_i w - y_i) / rows_i``;
    the server steps ``w <- w - lr * mean`` with ``lr = params["lr"]``."""

    name = "linreg"

    def initial_state(self, seed: int) -> FloatArray:
        return np.zeros(self.d)

    def apply(self, state: FloatArray, estimate: FloatArray) -> FloatArray:
        return np.asarray(state - float(self.params.get("lr", 0.1)) * estimate[0])

    def client_vectors(self, state: FloatArray, shard: Shard, step: int) -> FloatArray:
        if shard.y is None:
            raise ValueError("linreg needs a shard with targets y")
        resid = shard.x @ state - shard.y
        return np.asarray(shard.x.T @ resid / max(1, shard.x.shape[0]))[None, :]

    def metric(self, state: FloatArray, shard: Shard) -> float | None:
        """Mean squared residual on the shard."""
        if shard.y is None:
            return None
        resid = shard.x @ state - shard.y
        return float(resid @ resid) / max(1, shard.x.shape[0])


TASKS: dict[str, type[Task]] = {
    t.name: t for t in (MeanTask, PowerIterationTask, KMeansTask, LinRegTask)
}


def make_task(name: str, d: int, params: dict[str, float] | None = None) -> Task:
    """Build a task by name (``mean``, ``power-iteration``, ``kmeans``, ``linreg``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}")
    if d < 1:
        raise ValueError(f"d must be >= 1; got {d}")
    return TASKS[name](d, dict(params or {}))
