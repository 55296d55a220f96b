"""A small CNN with BatchNorm for Fashion-MNIST, in PyTorch (the benchmark's model).

Two blocks of 3x3 convolution, BatchNorm, ReLU and 2x2 max-pooling (16 and 32 channels),
then a linear layer to the 10 classes: 20,586 trainable parameters, plus BatchNorm's
buffers (``running_mean`` and ``running_var``, float32, and ``num_batches_tracked``, an
int64 counter). The model travels as Flower users send one: ``ArrayRecord`` of the
module's ``state_dict()`` and back with ``to_torch_state_dict()``, so the int64 counters
cross the rpsagg mod beside the sketch.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch
from flwr.app import ArrayRecord
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F

#: Fashion-MNIST's pixel mean and standard deviation (the training set, in [0, 1])
MEAN, STD = 0.2860, 0.3530
#: BatchNorm's running statistics: averaged uncompressed, as the integer counters are (a
#: compressed running variance could come back negative)
BUFFERS = ("running_mean", "running_var")
#: the classifier head: what a client that fine-tunes on top of frozen features trains
HEAD = ("fc.weight", "fc.bias")


class Net(nn.Module):
    """conv(1->16) BN ReLU pool, conv(16->32) BN ReLU pool, linear(1568->10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def buffer_names(model: nn.Module | None = None) -> list[str]:
    """The state_dict keys of BatchNorm's running statistics (sent uncompressed)."""
    state = (model or Net()).state_dict()
    return [key for key in state if key.rsplit(".", 1)[-1] in BUFFERS]


def initial(seed: int) -> ArrayRecord:
    """The initial model's ``ArrayRecord`` (PyTorch's default initialization, seeded)."""
    torch.manual_seed(seed)
    return ArrayRecord(Net().state_dict())


def images(x: NDArray[np.floating]) -> torch.Tensor:
    """``(N, 784)`` pixels in [0, 1] as normalized ``(N, 1, 28, 28)`` float32 tensors."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(-1, 1, 28, 28)
    return (t - MEAN) / STD


def _model(arrays: ArrayRecord, net: type[nn.Module] = Net) -> nn.Module:
    model = net()
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)
    return model


def train(arrays: ArrayRecord, x: torch.Tensor, y: NDArray[np.int64], *, epochs: int,
          lr: float, batch: int, seed: int,
          trainable: Collection[str] | None = None,
          net: type[nn.Module] = Net) -> tuple[ArrayRecord, float]:
    """Minibatch SGD (momentum 0.9) from ``arrays``; the new model and the mean loss.

    Parameters
    ----------
    arrays : ArrayRecord
        The received model (a ``state_dict``).
    x, y : tensor of shape (N, 1, 28, 28), ndarray of shape (N,)
        This client's images (:func:`images`) and labels.
    epochs, batch : int
        Passes over the shard and the minibatch size.
    lr : float
        Learning rate.
    seed : int
        Seeds the minibatch order.
    trainable : collection of str, optional
        Train only these parameters (``state_dict`` keys, e.g. ``HEAD``); the others and
        BatchNorm's running statistics stay exactly as received (the model runs in eval
        mode: a frozen feature extractor). Default: every parameter, in train mode.
    net : type of torch.nn.Module
        The architecture ``arrays`` hold (default :class:`Net`; ``fmnist_app.mlp.MLP``).
    """
    model = _model(arrays, net)
    if trainable is None:
        model.train()
        params = list(model.parameters())
    else:
        model.eval()
        named = dict(model.named_parameters())
        unknown = sorted(set(trainable) - set(named))
        if unknown:
            raise ValueError(f"trainable: no parameters {unknown}; the model has {sorted(named)}")
        for name, param in named.items():
            param.requires_grad_(name in trainable)
        params = [named[name] for name in named if name in trainable]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    labels = torch.tensor(y, dtype=torch.int64)  # a copy: y may be read-only (cached)
    gen = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=gen)
        for lo in range(0, len(labels), batch):
            idx = order[lo : lo + batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), labels[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
    return ArrayRecord(model.state_dict()), total / max(count, 1)


@torch.no_grad()
def evaluate(arrays: ArrayRecord, x: torch.Tensor, y: NDArray[np.int64],
             net: type[nn.Module] = Net) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of the model ``arrays`` (of architecture ``net``) on
    ``(x, y)`` (eval mode: BatchNorm uses its running statistics)."""
    model = _model(arrays, net)
    model.eval()
    labels = torch.tensor(y, dtype=torch.int64)  # a copy: y may be read-only (cached)
    loss, correct = 0.0, 0
    for lo in range(0, len(labels), 2000):
        out = model(x[lo : lo + 2000])
        loss += float(F.cross_entropy(out, labels[lo : lo + 2000], reduction="sum"))
        correct += int((out.argmax(1) == labels[lo : lo + 2000]).sum())
    return loss / len(labels), correct / len(labels)
