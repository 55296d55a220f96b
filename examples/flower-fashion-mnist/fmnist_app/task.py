"""Data and model: Fashion-MNIST (Debian's ``dataset-fashion-mnist``) and softmax regression.

The model is multinomial logistic regression on the 784 pixels (a 784 x 10 weight matrix
and 10 biases, d = 7,850 parameters), trained with plain minibatch SGD in numpy, and an
int64 counter of the SGD steps behind the model (like BatchNorm's ``num_batches_tracked``:
an integer array, which travels uncompressed beside the sketch).
"""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
DATA_DIR = Path(os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
FEATURES, CLASSES = 784, 10


def _idx(path: Path, magic: int) -> NDArray[np.uint8]:
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: install Fashion-MNIST with 'apt-get install dataset-fashion-mnist' "
            "(or point FMNIST_DIR at a folder with the four IDX files)"
        )
    raw = gzip.decompress(path.read_bytes())
    head = np.frombuffer(raw[:4], dtype=">u4")[0]
    if head != magic:
        raise ValueError(f"{path} is not an IDX file of magic {magic} (got {head})")
    ndim = magic & 0xFF
    dims = np.frombuffer(raw[4 : 4 + 4 * ndim], dtype=">u4").astype(int)
    return np.frombuffer(raw[4 + 4 * ndim :], dtype=np.uint8).reshape(dims)


@functools.lru_cache(maxsize=2)  # partition() reads the training set once per client
def load(split: str) -> tuple[FloatArray, NDArray[np.int64]]:
    """Images (``(N, 784)`` in [0, 1]) and labels of ``"train"`` (60,000) or ``"t10k"``."""
    x = _idx(DATA_DIR / f"{split}-images-idx3-ubyte.gz", 2051).reshape(-1, FEATURES) / 255.0
    y = _idx(DATA_DIR / f"{split}-labels-idx1-ubyte.gz", 2049).astype(np.int64)
    x.flags.writeable = y.flags.writeable = False  # cached: shared by every caller
    return x, y


def partition(partition_id: int, num_partitions: int, limit: int = 0) -> tuple[FloatArray,
                                                                               NDArray[np.int64]]:
    """Client ``partition_id``'s IID shard of the training set (a fixed permutation, seed 0);
    ``limit`` > 0 keeps only that many examples of it."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} not in [0, {num_partitions})")
    x, y = load("train")
    order = np.random.default_rng(0).permutation(len(y))
    mine = np.array_split(order, num_partitions)[partition_id]
    if limit > 0:
        mine = mine[:limit]
    return x[mine], y[mine]


def init_model() -> list[FloatArray]:
    """Zero weights and biases, float32 as a framework would keep them."""
    return [np.zeros((FEATURES, CLASSES), np.float32), np.zeros(CLASSES, np.float32)]


def steps_per_epoch(examples: int, batch: int) -> int:
    """Minibatches in one epoch of ``examples`` examples."""
    return -(-examples // batch)


def _logits(w: FloatArray, b: FloatArray, x: FloatArray) -> FloatArray:
    z = x @ w + b
    return z - z.max(axis=1, keepdims=True)


def train(
    w: FloatArray, b: FloatArray, x: FloatArray, y: NDArray[np.int64], *, epochs: int,
    lr: float, batch: int, seed: int,
) -> tuple[FloatArray, FloatArray, float]:
    """Minibatch SGD on the cross-entropy; returns the new (w, b) and the last epoch's loss."""
    w, b = w.astype(np.float64), b.astype(np.float64)
    rng = np.random.default_rng(seed)
    loss = 0.0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        total = 0.0
        for start in range(0, len(y), batch):
            idx = order[start : start + batch]
            z = _logits(w, b, x[idx])
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            total += float(-np.log(p[np.arange(len(idx)), y[idx]] + 1e-12).sum())
            p[np.arange(len(idx)), y[idx]] -= 1.0
            w -= lr * (x[idx].T @ p) / len(idx)
            b -= lr * p.mean(axis=0)
        loss = total / len(y)
    return w, b, loss


def evaluate(w: FloatArray, b: FloatArray, x: FloatArray, y: NDArray[np.int64]) -> tuple[float,
                                                                                        float]:
    """Cross-entropy loss and accuracy."""
    z = _logits(np.asarray(w, np.float64), np.asarray(b, np.float64), x)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean()), float((z.argmax(axis=1) == y).mean())
