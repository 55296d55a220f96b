"""Server optimizers: the decoded mean update as a pseudo-gradient (Reddi et al., 2021).

A compressed round gives the server an unbiased but noisy estimate ``g`` of the clients'
mean update. FedAvg adds ``g`` to the model (a step of 1); these optimizers take ``g`` as a
pseudo-gradient instead, as Flower's FedAvgM, FedAdagrad, FedAdam and FedYogi do with the
exact mean, so that a step below 1, momentum or an adaptive step can tame the variance the
compression adds. Each ``ServerOptimizer.step`` returns the update to apply.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


class ServerOptimizer(ABC):
    """Turns each round's decoded mean update into the step applied to the model.

    Parameters
    ----------
    lr : float
        The server learning rate (``> 0``).
    """

    def __init__(self, lr: float) -> None:
        if not (np.isfinite(lr) and lr > 0):
            raise ValueError(f"the server learning rate must be positive; got {lr!r}")
        self.lr = float(lr)

    @abstractmethod
    def step(self, update: FloatArray) -> FloatArray:
        """The step to add to the model for the round's mean update.

        Parameters
        ----------
        update : ndarray of float64
            The round's decoded mean update (the pseudo-gradient), flattened over the
            compressed arrays.

        Returns
        -------
        ndarray of float64
            The step, of ``update``'s shape.
        """

    def reset(self) -> None:  # noqa: B027 (optional: stateless optimizers keep nothing)
        """Forget the state (momentum, second moments) of earlier rounds."""

    def describe(self) -> str:
        """One line for the strategy's summary.

        Returns
        -------
        str
            The class and its settings, e.g. ``ServerSGD(lr=0.1, momentum=0)``.
        """
        return f"{type(self).__name__}(lr={self.lr:g})"


class ServerSGD(ServerOptimizer):
    """``x += lr * m`` with ``m = momentum * m + g`` (FedAvgM; ``momentum=0``: a plain step,
    ``lr=1``: FedAvg).

    Parameters
    ----------
    lr : float
        The server learning rate.
    momentum : float
        Server momentum in ``[0, 1)``.
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.0) -> None:
        super().__init__(lr)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {momentum!r}")
        self.momentum = float(momentum)
        self._m: FloatArray | None = None

    def step(self, update: FloatArray) -> FloatArray:
        if self.momentum == 0.0:
            return self.lr * update
        if self._m is None or self._m.shape != update.shape:
            self._m = np.zeros_like(update)
        self._m = self.momentum * self._m + update
        return self.lr * self._m

    def reset(self) -> None:
        self._m = None

    def describe(self) -> str:
        return f"ServerSGD(lr={self.lr:g}, momentum={self.momentum:g})"


class _Adaptive(ServerOptimizer):
    def __init__(self, lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3) -> None:
        super().__init__(lr)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0 and tau > 0):
            raise ValueError(f"need 0 <= beta1, beta2 < 1 and tau > 0; got {beta1}, {beta2}, "
                             f"{tau}")
        self.beta1, self.beta2, self.tau = float(beta1), float(beta2), float(tau)
        self._m: FloatArray | None = None
        self._v: FloatArray | None = None

    @abstractmethod
    def _second(self, v: FloatArray, g2: FloatArray) -> FloatArray: ...

    def step(self, update: FloatArray) -> FloatArray:
        if self._m is None or self._v is None or self._m.shape != update.shape:
            self._m = np.zeros_like(update)
            self._v = np.zeros_like(update)
        self._m = self.beta1 * self._m + (1.0 - self.beta1) * update
        self._v = self._second(self._v, update * update)
        return self.lr * self._m / (np.sqrt(self._v) + self.tau)

    def reset(self) -> None:
        self._m = self._v = None

    def describe(self) -> str:
        return (f"{type(self).__name__}(lr={self.lr:g}, beta1={self.beta1:g}, "
                f"beta2={self.beta2:g}, tau={self.tau:g})")


class ServerAdagrad(_Adaptive):
    """FedAdagrad: ``v += g^2``, ``x += lr * m / (sqrt(v) + tau)``.

    Parameters
    ----------
    lr : float
        The server learning rate.
    beta1 : float
        Decay of the first moment ``m = beta1 m + (1 - beta1) g``, in ``[0, 1)``.
    beta2 : float
        Decay of the second moment, in ``[0, 1)`` (not used: the sum keeps every round).
    tau : float
        The adaptivity constant added to ``sqrt(v)`` (``> 0``).
    """

    def _second(self, v: FloatArray, g2: FloatArray) -> FloatArray:
        return v + g2


class ServerAdam(_Adaptive):
    """FedAdam: ``v = beta2 v + (1 - beta2) g^2``, ``x += lr * m / (sqrt(v) + tau)``.

    Parameters
    ----------
    lr : float
        The server learning rate.
    beta1 : float
        Decay of the first moment ``m = beta1 m + (1 - beta1) g``, in ``[0, 1)``.
    beta2 : float
        Decay of the second moment, in ``[0, 1)``.
    tau : float
        The adaptivity constant added to ``sqrt(v)`` (``> 0``).
    """

    def _second(self, v: FloatArray, g2: FloatArray) -> FloatArray:
        return self.beta2 * v + (1.0 - self.beta2) * g2


class ServerYogi(_Adaptive):
    """FedYogi: ``v -= (1 - beta2) g^2 sign(v - g^2)``, ``x += lr * m / (sqrt(v) + tau)``.

    Parameters
    ----------
    lr : float
        The server learning rate.
    beta1 : float
        Decay of the first moment ``m = beta1 m + (1 - beta1) g``, in ``[0, 1)``.
    beta2 : float
        Decay of the second moment, in ``[0, 1)``.
    tau : float
        The adaptivity constant added to ``sqrt(v)`` (``> 0``).
    """

    def _second(self, v: FloatArray, g2: FloatArray) -> FloatArray:
        return v - (1.0 - self.beta2) * g2 * np.sign(v - g2)


def make_server_optimizer(name: str, lr: float, momentum: float = 0.0) -> ServerOptimizer:
    """A server optimizer by name (the Fashion-MNIST example's run config uses it).

    Parameters
    ----------
    name : {"sgd", "adagrad", "adam", "yogi"}
        ``"sgd"``: ``ServerSGD`` (with ``momentum``: FedAvgM); the others ``ServerAdagrad``,
        ``ServerAdam``, ``ServerYogi`` with their default betas and tau.
    lr : float
        The server learning rate.
    momentum : float
        ``"sgd"`` only: the server momentum.

    Returns
    -------
    ServerOptimizer
        A new optimizer, with no state.

    Raises
    ------
    ValueError
        An unknown name, or settings out of range.
    """
    if name == "sgd":
        return ServerSGD(lr, momentum)
    table: dict[str, type[_Adaptive]] = {"adagrad": ServerAdagrad, "adam": ServerAdam,
                                         "yogi": ServerYogi}
    if name not in table:
        raise ValueError(f"unknown server optimizer {name!r}; expected sgd, adagrad, adam "
                         f"or yogi")
    return table[name](lr)


__all__ = ["ServerAdagrad", "ServerAdam", "ServerOptimizer", "ServerSGD", "ServerYogi",
           "make_server_optimizer"]
