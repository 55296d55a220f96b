"""The multi-threaded decode products: the same bits as one thread, on every path.

``JointSRHT(threads=T)`` splits each product between threads so that each output element
sees the same operations in the same order: the compiled tile kernels split tiles (adjoint)
or clients (forward); the numpy passes split rows for the passes before the FWHT and
columns for the adjoint's sum. These tests hold it to exact equality (not a tolerance)
against ``threads=1``, on the tile kernels and on the numpy passes with each FWHT backend
(with ``RPSAGG_NATIVE=0`` only the numpy passes exist, and run).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rpsagg
from rpsagg import _fwht, _srht, spec
from rpsagg._decode import joint_solve
from rpsagg._srht import JointSRHT, _split, default_threads
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit


def _paths() -> list[str]:
    out = ["passes-numpy"]
    if spec.NATIVE is not None:
        out += ["tiles", "passes-native"]
    if _fwht._FAST is not None:
        out.append("passes-fht-cpu")
    return out


@pytest.fixture(params=_paths())
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The product path: the tile kernels, or the numpy passes with one FWHT backend."""
    name = str(request.param)
    monkeypatch.setattr(_srht, "PRODUCTS", "tiles" if name == "tiles" else "passes")
    assert _srht.product_path() == ("tiles" if name == "tiles" else "passes")
    if name != "passes-fht-cpu":
        monkeypatch.setattr(_fwht, "_FAST", None)
        monkeypatch.setattr(_fwht, "BATCH_THREADS", False)
    if name == "passes-numpy":
        monkeypatch.setattr(_fwht, "_NATIVE", None)
    return name


def test_split_covers_the_range() -> None:
    for count, parts, align in [(10, 3, 1), (4096, 3, 512), (7, 16, 1), (1000, 2, 512), (1, 4, 8)]:
        ranges = _split(count, parts, align)
        assert ranges[0][0] == 0 and ranges[-1][1] == count
        assert all(a < b for a, b in ranges)
        assert all(b1 == a2 for (_, b1), (a2, _) in itertools.pairwise(ranges))
        assert all(a % align == 0 for a, _ in ranges)
        assert len(ranges) <= parts
    assert default_threads() >= 1


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_threaded_products_equal_one_thread_bitwise(backend: str, threads: int) -> None:
    # tiles: k = 40 -> m = 8, 16 tiles of 256 (3, 7 threads: uneven ranges); 11 clients for
    # the forward's split (3 and 7 do not divide 11)
    n, k, d_pad = 11, 40, 4096
    seeds = [101 * (i + 1) for i in range(n)]
    # a budget of 4 clients per chunk: several chunks, the last one partial
    budget = 4 * 8 * d_pad
    one = JointSRHT.from_seeds(seeds, k, d_pad, budget, threads=1)
    many = JointSRHT.from_seeds(seeds, k, d_pad, budget, threads=threads)
    np.testing.assert_array_equal(many.signs, one.signs)
    np.testing.assert_array_equal(many.rows, one.rows)
    rng = np.random.default_rng(threads)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((n, k))
    assert np.array_equal(many.forward(u), one.forward(u))
    assert np.array_equal(many.adjoint(z), one.adjoint(z))
    y = one.forward(u)
    for c in (0.9, 1.0):
        x1, i1 = joint_solve(one, y, c, method="cg")
        xt, it = joint_solve(many, y, c, method="cg")
        assert np.array_equal(xt, x1) and it.iterations == i1.iterations


def test_one_client_per_chunk_still_splits_columns(backend: str) -> None:
    # d' so large against the budget that each chunk is one client: the sign multiply and
    # the adjoint's sum are split by columns, the FWHT runs on one row. (Tiles: 128 tiles
    # between 4 threads; the forward's 3 clients on 3 of them.)
    n, k, d_pad = 3, 16, 1 << 14
    seeds = [7, 8, 9]
    one = JointSRHT.from_seeds(seeds, k, d_pad, 8 * d_pad, threads=1)
    many = JointSRHT.from_seeds(seeds, k, d_pad, 8 * d_pad, threads=4)
    z = np.random.default_rng(0).standard_normal((n, k))
    assert np.array_equal(many.adjoint(z), one.adjoint(z))
    u = np.random.default_rng(1).standard_normal(d_pad)
    assert np.array_equal(many.forward(u), one.forward(u))


def test_estimator_threads_option() -> None:
    n, k, d = 12, 64, 2000
    xs = correlated_vectors(n, d, r=3.0, seed=2)
    one = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="cg", threads=1)
    many = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="cg", threads=3)
    default = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, method="cg")
    msgs = [one.encode(x, 55 + i) for i, x in enumerate(xs)]
    want = one.decode(msgs)
    assert np.array_equal(many.decode(msgs), want)
    assert np.array_equal(default.decode(msgs), want)
    with pytest.raises(ValueError, match="threads"):
        rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, threads=0)
    with pytest.raises(ValueError, match="rand-proj-spatial only"):
        rpsagg.make_estimator("rand-k", n=n, k=k, d=d, threads=2)
    with pytest.raises(ValueError, match="threads"):
        JointSRHT.from_seeds([1], 2, 8, threads=0)


def test_threaded_decode_works_in_a_forked_child() -> None:
    # The pools are process-wide; a child forked after a threaded decode must not wait on
    # its parent's (absent) pool threads.
    import multiprocessing

    seeds = [3, 4, 5, 6]
    op = JointSRHT.from_seeds(seeds, 8, 1024, threads=2)
    u = np.random.default_rng(0).standard_normal(1024)
    want = op.forward(u)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_forward_in_child, (seeds, u)).get(timeout=60)
    assert np.array_equal(got, want)


def _forward_in_child(seeds: list[int], u: np.ndarray) -> np.ndarray:
    return JointSRHT.from_seeds(seeds, 8, 1024, threads=2).forward(u)
