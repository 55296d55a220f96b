"""Data sources for the tasks: synthetic (controllable correlation), Fashion-MNIST, UJIIndoorLoc.

Each loader returns one client's :class:`~rpsagg.tasks.base.Shard` given its index among
``n`` clients. Data randomness uses numpy Generators (data need not match across machines;
the transforms do, and they never come from here).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np

from rpsagg.tasks.base import FloatArray, Shard

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_IMAGES = "t10k-images-idx3-ubyte.gz"
UJI_SHA256 = "893512b82dfd7a7c345d84195b1c8019fbca0fa0d7820ce491ce5aa45ec3782f"
UJI_ENV = "RPSAGG_UJI_ZIP"
UJI_SOURCE = "https://archive.ics.uci.edu/dataset/310/ujiindoorloc (DOI 10.24432/C5MS59)"
DATA_SOURCES = ("synthetic", "fashion-mnist", "ujiindoorloc")
#: the clients' own vectors (``rpsagg-client --vectors``); not loadable here, never synthetic
EXTERNAL_DATA = "external"


class DataUnavailable(RuntimeError):
    """A real data set is not installed; the message says how to get it."""


def synthetic_shard(
    task: str, index: int, n: int, d: int, r: float = 0.0, seed: int = 0, rows: int = 64
) -> Shard:
    """Synthetic shard whose per-client vectors have correlation controlled by ``r``.

    For ``mean`` the vectors come from :func:`rpsagg.synthetic.correlated_vectors` with
    correlation exactly ``r``. For the other tasks a client's rows mix a shared random
    subspace (weight ``rho = r/(n-1)``) with a private one (weight ``1 - rho``), so the
    clients' vectors grow more alike as ``r`` approaches ``n - 1``.
    """
    if not 0 <= index < n:
        raise ValueError(f"index must be in [0, n) = [0, {n}); got {index}")
    if not 0.0 <= r <= max(0, n - 1):
        raise ValueError(f"r must be in [0, n-1] = [0, {n - 1}]; got {r}")
    if task == "mean":
        return Shard(np.zeros((0, d)), None, r, seed, index, n)
    rho = 0.0 if n <= 1 else r / (n - 1)
    p = max(1, min(8, d // 2))
    # [seed, 0] would be the stream of default_rng(seed) (SeedSequence ignores trailing zero
    # words), which the tasks' initial states use: the shared basis would start with the
    # power iteration's initial vector. A third word keeps the streams apart.
    shared = np.random.default_rng([seed, 0, 1]).standard_normal((p, d))
    rng = np.random.default_rng([seed, index + 1])
    private = rng.standard_normal((p, d))
    basis = np.sqrt(rho) * shared + np.sqrt(1.0 - rho) * private
    z = rng.standard_normal((rows, p)) * np.linspace(2.0, 0.5, p)[None, :]
    x = z @ basis / np.sqrt(d)
    y = None
    if task == "linreg":
        w_true = np.random.default_rng([seed, 10**6]).standard_normal(d)
        y = x @ w_true + 0.01 * rng.standard_normal(rows)
    return Shard(np.asarray(x), y, r, seed, index, n)


def _resize_bilinear(images: np.ndarray, size: int) -> FloatArray:
    """Resize ``(N, h, w)`` images to ``(N, size, size)`` (bilinear, align-corners)."""
    _, h, w = images.shape
    ys = np.linspace(0.0, h - 1.0, size)
    xs = np.linspace(0.0, w - 1.0, size)
    y0 = np.floor(ys).astype(int)
    x0 = np.floor(xs).astype(int)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (ys - y0)[None, :, None]
    wx = (xs - x0)[None, None, :]
    img = images.astype(np.float64)
    top = img[:, y0][:, :, x0] * (1 - wx) + img[:, y0][:, :, x1] * wx
    bot = img[:, y1][:, :, x0] * (1 - wx) + img[:, y1][:, :, x1] * wx
    return np.asarray(top * (1 - wy) + bot * wy)


def load_fashion_mnist(directory: Path | None = None) -> FloatArray:
    """The 10,000 Fashion-MNIST test images, resized to 32x32, in [0, 1]: shape (10000, 1024).

    Raises
    ------
    DataUnavailable
        When the Debian package ``dataset-fashion-mnist`` is not installed.
    """
    path = (directory or FASHION_DIR) / FASHION_IMAGES
    if not path.exists():
        raise DataUnavailable(
            f"Fashion-MNIST not found at {path}; install it with "
            "'apt-get install -y dataset-fashion-mnist'"
        )
    raw = gzip.decompress(path.read_bytes())
    magic, count, rows, cols = np.frombuffer(raw[:16], dtype=">u4")
    if magic != 2051:
        raise ValueError(f"{path} is not an IDX image file (magic {magic})")
    images = np.frombuffer(raw[16:], dtype=np.uint8).reshape(int(count), int(rows), int(cols))
    return _resize_bilinear(images, 32).reshape(int(count), 1024) / 255.0


def load_ujiindoorloc(path: str | os.PathLike[str] | None = None) -> tuple[FloatArray, FloatArray]:
    """UJIIndoorLoc as in the paper: 10,000 rows, the first 512 WAP features, longitude.

    RSSI values are mapped to ``[0, 1]`` (``(rssi + 110) / 110``; 100 = not detected -> 0)
    and the longitude is standardized. ``path`` defaults to ``$RPSAGG_UJI_ZIP``; the zip's
    SHA-256 is verified. Rows are a fixed subsample (seed 0) of ``trainingData.csv``.
    """
    where = path or os.environ.get(UJI_ENV)
    if not where or not Path(where).exists():
        raise DataUnavailable(
            f"UJIIndoorLoc zip not found (pass --data-path or set {UJI_ENV}); "
            f"the official archive is at {UJI_SOURCE}"
        )
    blob = Path(where).read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != UJI_SHA256:
        raise ValueError(f"{where}: SHA-256 {digest} does not match {UJI_SHA256}")
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        name = next(n for n in zf.namelist() if n.endswith("trainingData.csv"))
        table = np.loadtxt(io.TextIOWrapper(zf.open(name)), delimiter=",", skiprows=1,
                           usecols=range(521))
    rows = np.random.default_rng(0).choice(table.shape[0], size=10000, replace=False)
    rows.sort()
    rssi = table[rows, :512]
    x = np.where(rssi == 100, 0.0, (rssi + 110.0) / 110.0)
    lon = table[rows, 520]
    return np.asarray(x), np.asarray((lon - lon.mean()) / lon.std())


def load_shard(
    source: str,
    task: str,
    index: int,
    n: int,
    d: int,
    *,
    r: float = 0.0,
    seed: int = 0,
    path: str | None = None,
) -> Shard:
    """Client ``index``'s shard of ``source`` for ``task`` (contiguous blocks of rows).

    Raises
    ------
    DataUnavailable
        When a real data set is missing.
    ValueError
        When the data set's dimension does not match the server's ``d``.
    """
    if source == "synthetic":
        return synthetic_shard(task, index, n, d, r, seed)
    if source == "fashion-mnist":
        x_all = load_fashion_mnist(Path(path) if path else None)
        y_all = None
    elif source == "ujiindoorloc":
        x_all, y_all = load_ujiindoorloc(path)
    else:
        raise ValueError(f"unknown data source {source!r}; expected one of {DATA_SOURCES}")
    if x_all.shape[1] != d:
        raise ValueError(f"{source} has dimension {x_all.shape[1]} but the server's d is {d}")
    lo, hi = index * x_all.shape[0] // n, (index + 1) * x_all.shape[0] // n
    return Shard(x_all[lo:hi], None if y_all is None else y_all[lo:hi], r, seed, index, n)
