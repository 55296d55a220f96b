"""The tasks shared by client and server, and the data sources."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from repo_paths import ROOT

from rpsagg import make_estimator
from rpsagg.tasks import DataUnavailable, load_shard, make_task, synthetic_shard
from rpsagg.tasks.base import Shard
from rpsagg.tasks.data import _resize_bilinear, load_fashion_mnist, load_ujiindoorloc

pytestmark = pytest.mark.unit

N, D = 4, 32


def _run(task_name: str, params: dict[str, float], rounds: int, est_name: str = "full"):  # type: ignore[no-untyped-def]
    task = make_task(task_name, D, params)
    shards = [synthetic_shard(task_name, i, N, D, r=1.0, seed=5, rows=200) for i in range(N)]
    est = make_estimator(est_name, n=N, k=D, d=D)
    state = task.initial_state(0)
    for step in range(rounds):
        vecs = np.stack([task.client_vectors(state, s, step) for s in shards])  # (N, m, D)
        mean = np.stack(
            [
                est.decode([est.encode(vecs[i, j], 100 * i + j) for i in range(N)])
                for j in range(task.m)
            ]
        )
        state = task.apply(state, mean)
    return task, shards, state


def test_power_iteration_finds_the_top_eigenvector() -> None:
    _, shards, v = _run("power-iteration", {}, 60)
    cov = sum(s.x.T @ s.x / s.x.shape[0] for s in shards) / N
    _, vecs = np.linalg.eigh(cov)
    assert abs(float(vecs[:, -1] @ v)) > 0.999
    assert np.linalg.norm(v) == pytest.approx(1.0)


def test_linreg_sgd_lowers_the_loss() -> None:
    # The clients send X_i^T (X_i w - y_i) / rows_i; their mean is the gradient of half the
    # mean squared residual, whose Hessian is H = mean_i X_i^T X_i / rows_i. Gradient
    # descent contracts for lr < 2 / lambda_max(H); lr = 1 / lambda_max(H) is the classic
    # safe step (a fixed lr would depend on the data's realisation).
    shards = [synthetic_shard("linreg", i, N, D, r=1.0, seed=5, rows=200) for i in range(N)]
    hessian = sum(s.x.T @ s.x / s.x.shape[0] for s in shards) / N
    lr = 1.0 / float(np.linalg.eigvalsh(hessian)[-1])
    task, shards, w = _run("linreg", {"lr": lr}, 200)
    before = np.mean([task.metric(np.zeros(D), s) for s in shards])
    after = np.mean([task.metric(w, s) for s in shards])
    assert after < 0.2 * before


def test_kmeans_sends_m_vectors_and_lowers_the_distortion() -> None:
    task, shards, cent = _run("kmeans", {"centroids": 3}, 10)
    assert task.m == 3 and cent.shape == (3, D)
    start = np.mean([task.metric(task.initial_state(0), s) for s in shards])
    assert np.mean([task.metric(cent, s) for s in shards]) < start


def test_kmeans_modes_agree_without_compression_and_updates_are_zero_for_empty_clusters() -> None:
    # Both modes describe the same Lloyd step: with the exact mean, one round from the same
    # state gives the same centroids. A centroid far from every point gets no point; in
    # update mode its row is exactly zero (so compression adds no error there), in centroid
    # mode it is the centroid itself.
    upd, lit = (
        make_task("kmeans", D, {"centroids": 3}),
        make_task("kmeans", D, {"centroids": 3, "updates": 0}),
    )
    shards = [synthetic_shard("kmeans", i, N, D, r=1.0, seed=5, rows=200) for i in range(N)]
    state = upd.initial_state(0)
    state[2] = 1e6  # no point is nearest to this one
    v_upd = np.stack([upd.client_vectors(state, s, 0) for s in shards])
    v_lit = np.stack([lit.client_vectors(state, s, 0) for s in shards])
    assert np.all(v_upd[:, 2] == 0.0) and np.all(v_lit[:, 2] == 1e6)
    np.testing.assert_allclose(v_upd + state[None], v_lit, rtol=0, atol=1e-9)
    np.testing.assert_allclose(
        upd.apply(state, v_upd.mean(0)), lit.apply(state, v_lit.mean(0)), rtol=0, atol=1e-9
    )
    with pytest.raises(ValueError, match="'updates' must be 0 or 1"):
        make_task("kmeans", D, {"updates": 0.5})
    with pytest.raises(ValueError, match="'centroids' must be >= 1"):
        make_task("kmeans", D, {"centroids": 0})


def test_kmeans_under_compression_converges_in_update_mode_only() -> None:
    # Three well-separated blobs (centres N(0, 4 I), noise 0.5 per coordinate: exact Lloyd's
    # distortion is about d * 0.25 = 8) split IID over n = 4 clients; four centroids, one of
    # them parked at 5x the data's largest entry so that no point is ever nearest to it.
    # Rand-k at k = d/2: the error variance of a mean of n vectors is (1/n)(d/k - 1) = 1/4 of
    # their mean square norm. Sending updates, an error e in a centroid comes back in the next
    # update as -e (plus the clients' fresh local means) and is re-estimated with relative
    # variance 1/4, so it shrinks by about 2x per round: after 30 rounds the distortion is
    # within 2% of exact Lloyd's, and the parked centroid's updates are exact zeros. Sending
    # whole centroids, the parked centroid is re-estimated from copies of itself every round
    # and some coordinates are zeroed for good (probability (1 - k/d)^n = 1/16 each), so it
    # drifts into the data and the distortion stays far above Lloyd's.
    rng = np.random.default_rng(7)
    centres = 2.0 * rng.standard_normal((3, D))
    shards = []
    for _ in range(N):
        shards.append(Shard(centres[rng.integers(0, 3, 200)] + 0.5 * rng.standard_normal((200, D))))
    far = 5 * max(float(np.abs(s.x).max()) for s in shards)

    def run(est_name: str, k: int, updates: float) -> tuple[float, NDArray[np.float64]]:
        task = make_task("kmeans", D, {"centroids": 4, "updates": updates})
        est = make_estimator(est_name, n=N, k=k, d=D)
        state = task.initial_state(1)
        state[3] = far
        for step in range(30):
            vecs = np.stack([task.client_vectors(state, s, step) for s in shards])
            mean = np.stack(
                [
                    est.decode([est.encode(vecs[i, j], 1000 * step + 10 * i + j) for i in range(N)])
                    for j in range(task.m)
                ]
            )
            state = task.apply(state, mean)
        return float(np.mean([task.metric(state, s) for s in shards])), state

    lloyd, _ = run("full", D, 1.0)
    assert 7.0 < lloyd < 9.0
    compressed, state = run("rand-k", D // 2, 1.0)
    assert compressed <= 1.02 * lloyd
    assert np.all(state[3] == far)  # the empty cluster's centroid never moved
    literal, state_literal = run("rand-k", D // 2, 0.0)
    assert literal > 2.0 * lloyd
    assert not np.allclose(state_literal[3], far)


def test_mean_task_vectors_have_the_requested_correlation() -> None:
    task = make_task("mean", D)
    xs = np.stack(
        [
            task.client_vectors(
                task.initial_state(0), synthetic_shard("mean", i, N, D, r=2.0, seed=9), 3
            )[0]
            for i in range(N)
        ]
    )
    gram = xs @ xs.T
    r = (gram.sum() - np.trace(gram)) / np.trace(gram)
    assert r == pytest.approx(2.0)


def test_unknown_task_and_bad_shards_fail_early() -> None:
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope", D)
    with pytest.raises(ValueError, match="index must be in"):
        synthetic_shard("mean", 5, N, D)
    with pytest.raises(ValueError, match="unknown data source"):
        load_shard("mnist", "mean", 0, N, D)


def test_bilinear_resize_keeps_corners_and_constant_images() -> None:
    img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    out = _resize_bilinear(img, 7)
    assert out[0, 0, 0] == 0 and out[0, -1, -1] == 15 and out[0, 0, -1] == 3
    assert out[0, 3, 3] == pytest.approx(7.5)
    np.testing.assert_allclose(_resize_bilinear(np.full((2, 28, 28), 9, np.uint8), 32), 9.0)


def test_fashion_mnist_loader_reads_idx_and_reports_a_missing_package(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailable, match="apt-get install -y dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)
    images = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    header = np.array([2051, 3, 28, 28], dtype=">u4").tobytes()
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.tobytes()))
    x = load_fashion_mnist(tmp_path)
    assert x.shape == (3, 1024) and x.min() >= 0.0 and x.max() <= 1.0


def test_ujiindoorloc_loader_checks_the_hash(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailable, match=r"archive\.ics\.uci\.edu"):
        load_ujiindoorloc(tmp_path / "missing.zip")
    fake = tmp_path / "fake.zip"
    fake.write_bytes(b"not the archive")
    with pytest.raises(ValueError, match="SHA-256"):
        load_ujiindoorloc(fake)


def test_ujiindoorloc_shard_when_the_archive_is_present() -> None:
    path = ROOT.parent / "shared" / "data" / "ujiindoorloc.zip"
    if not path.exists():
        pytest.skip(f"UJIIndoorLoc archive not present at {path}")
    shard = load_shard("ujiindoorloc", "linreg", 1, 10, 512, path=str(path))
    assert shard.x.shape == (1000, 512) and shard.y is not None and shard.y.shape == (1000,)
    assert shard.x.min() >= 0.0 and shard.x.max() <= 1.0
