"""The task interface shared by the server (state updates) and the clients (local vectors)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Shard:
    """One client's local data.

    Attributes
    ----------
    x : ndarray, shape (rows, d)
        Features (power iteration, k-means, linear regression).
    y : ndarray, shape (rows,) or None
        Targets (linear regression).
    r : float
        Correlation R of the synthetic ``mean`` vectors.
    seed : int
        Data seed of the synthetic ``mean`` vectors.
    index, n : int
        The client's index and the number of clients.
    """

    x: FloatArray
    y: FloatArray | None = None
    r: float = 0.0
    seed: int = 0
    index: int = 0
    n: int = 1


@dataclass
class Task(ABC):
    """A distributed computation driven by rounds of mean estimation.

    Each round the server sends ``global_state``; every client computes ``m`` vectors of
    length ``d`` from its shard (:meth:`client_vectors`); the server estimates their mean
    and folds it into the next state (:meth:`apply`).

    Attributes
    ----------
    d : int
        Vector length.
    params : dict
        Task parameters (learning rate, number of centroids, ...), sent to clients at join.
    """

    d: int
    params: dict[str, float] = field(default_factory=dict)

    name: ClassVar[str] = ""

    @property
    def m(self) -> int:
        """Vectors per submission."""
        return 1

    @abstractmethod
    def initial_state(self, seed: int) -> FloatArray:
        """The first round's global state (server side; shape depends on the task)."""

    @abstractmethod
    def apply(self, state: FloatArray, estimate: FloatArray) -> FloatArray:
        """Next global state from the estimated mean, shape ``(m, d)`` (server side)."""

    @abstractmethod
    def client_vectors(self, state: FloatArray, shard: Shard, step: int) -> FloatArray:
        """The client's ``(m, d)`` vectors for a round (client side)."""

    def metric(self, state: FloatArray, shard: Shard) -> float | None:
        """An optional task-specific quality figure on a shard (for logs)."""
        return None
