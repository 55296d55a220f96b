"""The compiled tile kernels of the joint SRHT products against the numpy passes and H.

``JointSRHT.forward`` / ``adjoint`` run by tiles of 2^m coordinates when the compiled
kernels are built (``rpsagg._fast.tile_forward`` / ``tile_adjoint``). They add in another
order than the numpy passes (FWHTs of d' and a column sum), so the two agree to rounding,
not bit for bit.

Tolerance (relative, in the 2-norm): both compute each output as sums of +-z or +-u
terms; a sum of L terms carries rounding errors of at most ~L u relative to the sum of
the terms' magnitudes, and ~sqrt(L) u for the random-signed inputs here (u = 1.1e-16).
Per output element L = log2 d' butterfly levels (<= 20) plus the n client terms of the
adjoint (<= 300): sqrt(320) u = 2e-15 for the largest case. 1e-13 leaves a factor 50 and
still catches any error in a sign, a row or a tile (those are O(1)).
"""

from __future__ import annotations

import numpy as np
import pytest

from rpsagg import _srht, spec
from rpsagg._srht import JointSRHT, forward_groups, product_path, srht_matrix, tile_bits

pytestmark = [pytest.mark.unit, pytest.mark.skipif(
    spec.NATIVE is None,
    reason="compiled kernels absent (RPSAGG_NATIVE=0); test_spec checks they are built",
)]

REL = 1e-13


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _passes(op: JointSRHT, u: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """forward(u), adjoint(z) by the numpy passes."""
    saved = _srht.PRODUCTS
    _srht.PRODUCTS = "passes"
    try:
        assert product_path() == "passes"
        return op.forward(u), op.adjoint(z)
    finally:
        _srht.PRODUCTS = saved


def _tiles(
    op: JointSRHT, u: np.ndarray, z: np.ndarray, m: int, groups: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """forward(u), adjoint(z) by the tile kernels with tiles of 2^m (the forward's tiles in
    ``groups`` groups, added in order)."""
    native = spec.NATIVE
    assert native is not None
    scale = 1.0 / float(np.sqrt(op.d_pad))
    part = np.empty((groups, op.n, op.k))
    native.tile_forward(u, op.rows, op.signs, op.k, m, groups, 0, groups * op.n, part)
    fwd = part[0].copy()
    for g in range(1, groups):
        fwd += part[g]
    fwd *= scale
    adj = np.empty(op.d_pad)
    native.tile_adjoint(z, op.rows, op.signs, op.k, m, 0, op.d_pad >> m, scale, adj)
    return fwd, adj


def test_tile_rule() -> None:
    # m = round(log2 k) + 3, clamped to [7, 16], to >= 4 tiles (unless that is < 7) and to
    # log2 d'; round(log2 k) steps up between 2^(j + 1/2) and the next integer
    assert tile_bits(1, 2) == 1
    assert tile_bits(1, 1 << 20) == 7
    assert tile_bits(22, 1 << 20) == 7  # log2 22 = 4.46
    assert tile_bits(23, 1 << 20) == 8  # log2 23 = 4.52
    assert tile_bits(1024, 1 << 20) == 13
    assert tile_bits(1448, 1 << 20) == 13  # log2 1448 = 10.49998
    assert tile_bits(1449, 1 << 20) == 14
    assert tile_bits(4096, 1 << 20) == 15
    assert tile_bits(1 << 20, 1 << 20) == 16
    assert tile_bits(10010, 1 << 18) == 16  # 4 tiles
    assert tile_bits(4096, 1 << 16) == 14  # 4 tiles
    assert tile_bits(4096, 1 << 12) == 10  # 4 tiles
    assert tile_bits(4096, 1 << 9) == 7  # 4 tiles
    assert tile_bits(4096, 1 << 8) == 7  # 2 tiles: m stays >= 7
    assert tile_bits(100, 128) == 7  # one tile
    assert _srht.PRODUCTS == "tiles" and product_path() == "tiles"  # the default, when built


# (n, k, d'): k from 1 to d', d' from 2 to 2^20, n up to 300; m at both clamps and at d'
SHAPES = [
    (1, 1, 2),  # m = 1 = log2 d'
    (2, 2, 4),
    (3, 1, 128),  # m = 7, one tile
    (5, 3, 1024),  # m = 7 (lower clamp), 8 tiles
    (300, 8, 512),  # 300 clients, m = 7, 4 tiles
    (4, 4096, 4096),  # k = d', m = 8: 16 tiles
    (6, 100, 1 << 14),  # m = 10
    (1, 1 << 16, 1 << 16),  # k = d', m = 12: 16 tiles
    (2, 100, 128),  # m = 7 = log2 d': one tile (a plain FWHT with a scatter)
    (3, 1000, 1 << 20),  # m = 13, 128 tiles
    (2, 1 << 13, 1 << 20),  # m = 15 (upper clamp), 32 tiles
]


@pytest.mark.parametrize(("n", "k", "d_pad"), SHAPES)
def test_tile_products_agree_with_numpy_passes(n: int, k: int, d_pad: int) -> None:
    seeds = [1000 * d_pad + 17 * i + k for i in range(n)]
    op = JointSRHT.from_seeds(seeds, k, d_pad)
    rng = np.random.default_rng(n * k + d_pad)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((n, k))
    want_f, want_a = _passes(op, u, z)
    got_f, got_a = op.forward(u), op.adjoint(z)
    assert _rel(got_f, want_f) <= REL
    assert _rel(got_a, want_a) <= REL
    # the public products are the kernels with the rule's m and groups
    m = tile_bits(k, d_pad)
    f, a = _tiles(op, u, z, m, forward_groups(n, k, d_pad >> m))
    assert np.array_equal(f, got_f) and np.array_equal(a, got_a)


def test_every_tile_size_agrees_with_numpy_passes() -> None:
    # every m from 0 (tiles of one coordinate) to log2 d' (one tile), across the kernel's
    # L1 block (2^11) so that the stages between blocks run too
    n, k, d_pad = 3, 50, 1 << 14
    op = JointSRHT.from_seeds([5, 6, 7], k, d_pad)
    rng = np.random.default_rng(4)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((n, k))
    want_f, want_a = _passes(op, u, z)
    for m in range(15):
        got_f, got_a = _tiles(op, u, z, m)
        assert _rel(got_f, want_f) <= REL, m
        assert _rel(got_a, want_a) <= REL, m
    # and the forward's tiles in 1 to 2^(14 - m) groups (uneven splits included)
    for m, groups in [(10, 3), (10, 16), (7, 5), (7, 128), (12, 4), (14, 1)]:
        got_f, _ = _tiles(op, u, z, m, groups)
        assert _rel(got_f, want_f) <= REL, (m, groups)


@pytest.mark.parametrize("d", [1, 2, 37, 64, 200])
def test_tile_products_equal_the_dense_matrix(d: int) -> None:
    d_pad = spec.padded_dim(d)
    seeds = [11 + d, 12 + d, 13 + d, 14 + d]
    k = max(1, min(d, 9))
    dense = np.vstack([srht_matrix(s, k, d) for s in seeds])  # (n k, d'), tests only
    op = JointSRHT.from_seeds(seeds, k, d_pad)
    rng = np.random.default_rng(d)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((len(seeds), k))
    want_f = (dense @ u).reshape(len(seeds), k)
    want_a = dense.T @ z.ravel()
    for m in range(d_pad.bit_length()):
        got_f, got_a = _tiles(op, u, z, m)
        assert _rel(got_f, want_f) <= REL, m
        assert _rel(got_a, want_a) <= REL, m
    assert _rel(op.forward(u), want_f) <= REL
    assert _rel(op.adjoint(z), want_a) <= REL


@pytest.mark.parametrize(
    ("n", "k", "d_pad"),
    [(7, 1, 1024), (13, 100, 1 << 14), (5, 1 << 12, 1 << 16), (1, 30, 4096)],
)
def test_tile_products_are_bitwise_the_same_for_any_threads(n: int, k: int, d_pad: int) -> None:
    # 8, 16, 16 and 16 tiles; 7, 13, 5 and 1 clients (x 8, 16, 16, 16 forward groups):
    # ranges uneven, some threads idle
    seeds = [31 * i + 3 for i in range(n)]
    rng = np.random.default_rng(k)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((n, k))
    one = JointSRHT.from_seeds(seeds, k, d_pad, threads=1)
    want_f, want_a = one.forward(u), one.adjoint(z)
    for threads in (2, 3, 7):
        many = JointSRHT.from_seeds(seeds, k, d_pad, threads=threads)
        assert np.array_equal(many.forward(u), want_f), threads
        assert np.array_equal(many.adjoint(z), want_a), threads


def test_forward_groups_rule() -> None:
    assert forward_groups(100, 1024, 128) == 16
    assert forward_groups(3, 5, 4) == 4  # no more groups than tiles
    assert forward_groups(100, 1 << 17, 1 << 12) == 1  # 100 MiB of partial sums per group
    assert forward_groups(100, 1 << 14, 1 << 12) == 5  # 5 x 12.5 MiB <= 64 MiB


def test_tile_kernels_reject_bad_arguments() -> None:
    native = spec.NATIVE
    assert native is not None
    op = JointSRHT.from_seeds([1, 2], 4, 64)
    z, u = np.zeros((2, 4)), np.zeros(64)
    out_a, part = np.empty(64), np.empty((2, 2, 4))
    with pytest.raises(ValueError, match="tile range"):
        native.tile_adjoint(z, op.rows, op.signs, 4, 3, 0, 9, 1.0, out_a)  # 8 tiles of 8
    with pytest.raises(ValueError, match="unit range"):
        native.tile_forward(u, op.rows, op.signs, 4, 3, 2, 0, 5, part)  # 2 x 2 units
    with pytest.raises(ValueError, match="groups"):
        native.tile_forward(u, op.rows, op.signs, 4, 3, 1, 0, 2, part)  # part of 2 groups
    with pytest.raises(ValueError, match="groups"):
        native.tile_forward(u, op.rows, op.signs, 4, 5, 3, 0, 2, np.empty((3, 2, 4)))  # 2 tiles
    with pytest.raises(ValueError, match="bad shapes"):
        native.tile_adjoint(z, op.rows, op.signs, 4, 7, 0, 1, 1.0, out_a)  # 2^7 > d'
    with pytest.raises(ValueError, match="bad shapes"):
        native.tile_forward(np.zeros(32), op.rows, op.signs, 4, 3, 2, 0, 4, part)
    bad_rows = op.rows.copy()
    bad_rows[1, 2] = 64
    with pytest.raises(ValueError, match="out of range"):
        native.tile_adjoint(z, bad_rows, op.signs, 4, 3, 0, 8, 1.0, out_a)
    bad_rows[1, 2] = -1
    with pytest.raises(ValueError, match="out of range"):
        native.tile_forward(u, bad_rows, op.signs, 4, 3, 2, 0, 1, part)
    with pytest.raises(TypeError, match="signs"):
        native.tile_adjoint(z, op.rows, op.signs.astype(np.float64), 4, 3, 0, 8, 1.0, out_a)


def test_a_chosen_tile_size_changes_no_value() -> None:
    """``JointSRHT(tile_log2=m)`` (what ``bench/bench_tiles.py`` times): every m gives the
    rule's products to rounding; an m outside [1, log2 d'] is refused."""
    import dataclasses

    op = JointSRHT.from_seeds([3, 5, 8], 300, 1 << 12)
    rng = np.random.default_rng(2)
    z, u = rng.standard_normal((3, 300)), rng.standard_normal(1 << 12)
    ref_adj, ref_fwd = op.adjoint(z), op.forward(u)
    for m in (7, 10, 12):
        other = dataclasses.replace(op, tile_log2=m)
        np.testing.assert_allclose(other.adjoint(z), ref_adj, rtol=0, atol=1e-12)
        np.testing.assert_allclose(other.forward(u), ref_fwd, rtol=0, atol=1e-12)
    for bad in (0, 13):
        with pytest.raises(ValueError, match="tile_log2 must be in"):
            dataclasses.replace(op, tile_log2=bad)
