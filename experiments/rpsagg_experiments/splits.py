"""The real data sets of the paper's tasks and their IID and non-IID client splits.

Reuses :mod:`rpsagg.tasks.data` for the images and the UJIIndoorLoc table; adds the
Fashion-MNIST labels (needed for the non-IID split) and the splits themselves:

- IID: a random permutation of the rows cut into n contiguous blocks (paper: "random
  shuffling").
- non-IID, Fashion-MNIST (McMahan et al.): rows sorted by label, cut into 2n shards, two
  random shards per client.
- non-IID, UJIIndoorLoc: rows sorted by the target (longitude), n contiguous blocks.
"""

from __future__ import annotations

import functools
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rpsagg.tasks.base import FloatArray, Shard
from rpsagg.tasks.data import FASHION_DIR, DataUnavailable, load_fashion_mnist, load_ujiindoorloc

FASHION_LABELS = "t10k-labels-idx1-ubyte.gz"
SPLITS = ("iid", "noniid")


@dataclass(frozen=True)
class Dataset:
    """Rows ``x`` (and targets ``y``), with ``labels`` for the non-IID split (or None)."""

    x: FloatArray
    y: FloatArray | None
    labels: np.ndarray | None


@functools.lru_cache(maxsize=2)
def fashion_mnist(directory: str | None = None) -> Dataset:
    """Fashion-MNIST test set, 32x32 (d = 1024), with labels."""
    where = Path(directory) if directory else FASHION_DIR
    x = load_fashion_mnist(where)
    path = where / FASHION_LABELS
    if not path.exists():
        raise DataUnavailable(f"Fashion-MNIST labels not found at {path}")
    raw = gzip.decompress(path.read_bytes())
    if int.from_bytes(raw[:4], "big") != 2049:
        raise ValueError(f"{path} is not an IDX label file")
    labels = np.frombuffer(raw[8:], dtype=np.uint8).astype(np.int64)
    return Dataset(x, None, labels)


@functools.lru_cache(maxsize=2)
def ujiindoorloc(path: str | None = None) -> Dataset:
    """UJIIndoorLoc as in the paper (10,000 rows, 512 features, standardized longitude)."""
    x, y = load_ujiindoorloc(path)
    return Dataset(x, y, None)


def split_rows(data: Dataset, n: int, split: str, seed: int) -> list[np.ndarray]:
    """Row indices of each of the n clients.

    Parameters
    ----------
    data : Dataset
    n : int
        Number of clients.
    split : {"iid", "noniid"}
    seed : int
        Seed of the shuffle (IID) or of the shard assignment (non-IID by label).
    """
    rows = data.x.shape[0]
    rng = np.random.default_rng(seed)
    if split == "iid":
        return list(np.array_split(rng.permutation(rows), n))
    if split != "noniid":
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}")
    if data.labels is not None:
        order = np.argsort(data.labels, kind="stable")
        shards = np.array_split(order, 2 * n)
        pick = rng.permutation(2 * n)
        return [np.concatenate([shards[pick[2 * i]], shards[pick[2 * i + 1]]]) for i in range(n)]
    if data.y is None:
        raise ValueError("a non-IID split needs labels or targets")
    return list(np.array_split(np.argsort(data.y, kind="stable"), n))


def shards(data: Dataset, n: int, split: str, seed: int) -> list[Shard]:
    """The clients' :class:`~rpsagg.tasks.base.Shard` objects for a split."""
    out = []
    for i, idx in enumerate(split_rows(data, n, split, seed)):
        out.append(Shard(data.x[idx], None if data.y is None else data.y[idx], index=i, n=n))
    return out
