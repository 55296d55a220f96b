"""A two-layer perceptron for Fashion-MNIST, in PyTorch: the frontier's larger model.

784 -> 256 (ReLU) -> 10: 203,530 parameters (795 KiB of float32), ten times the CNN's, with
no buffers, so a compressed reply carries only the sketch beside Flower's own framing. It
shares the CNN's input scaling, training loop and evaluation (:mod:`fmnist_app.cnn`).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F

from fmnist_app import cnn

#: the classifier head (the last layer)
HEAD = ("fc2.weight", "fc2.bias")
#: the same normalized ``(N, 1, 28, 28)`` tensors as the CNN's (flattened in ``forward``)
images = cnn.images


class MLP(nn.Module):
    """linear(784->256) ReLU linear(256->10)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def buffer_names() -> list[str]:
    """None: the MLP has no running statistics."""
    return []


def initial(seed: int) -> ArrayRecord:
    """The initial model's ``ArrayRecord`` (PyTorch's default initialization, seeded)."""
    torch.manual_seed(seed)
    return ArrayRecord(MLP().state_dict())


def train(arrays: ArrayRecord, x: torch.Tensor, y: NDArray[np.int64], **kw: object
          ) -> tuple[ArrayRecord, float]:
    """:func:`fmnist_app.cnn.train` for the MLP (the same keywords)."""
    return cnn.train(arrays, x, y, net=MLP, **kw)  # type: ignore[arg-type]


def evaluate(arrays: ArrayRecord, x: torch.Tensor, y: NDArray[np.int64]) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of the MLP ``arrays`` on ``(x, y)``."""
    return cnn.evaluate(arrays, x, y, net=MLP)
