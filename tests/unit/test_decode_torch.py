"""The PyTorch decode backend (``rpsagg[torch]``) against the numpy decode, on the CPU.

The same code runs on CUDA (``bench/bench_accel.py`` checks it there); here it runs on the
CPU device so it is never skipped. In float64 both decodes run the same algorithm (the same
conjugate-gradient recurrence and stopping rule, the same LSQR), so they differ only by the
rounding of the FWHT (a different summation order: a few ulps per element, amplified by at
most cond(M) < 10 over the iterations) -- far below the 1e-10 asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from repo_paths import ROOT

import rpsagg
from rpsagg._decode import joint_solve
from rpsagg._fwht import fwht
from rpsagg._srht import JointSRHT, srht_encode
from rpsagg.synthetic import correlated_vectors

pytestmark = pytest.mark.unit

torch = pytest.importorskip("torch", reason="scripts/setup-env.sh test installs rpsagg[torch]")
# One intra-op thread: on this shared 2-core machine torch's OpenMP pool spin-waits on busy
# cores (a 30-iteration solve took 4 s with 2 threads against 0.23 s with one).
torch.set_num_threads(1)
from rpsagg._torch import (  # noqa: E402
    TorchJointSRHT,
    fwht_torch,
    joint_solve_torch,
    resolve_device,
)


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_torch_is_installed_for_the_tests() -> None:
    # The set-up installs the extra; a missing torch must fail here, not skip silently.
    import importlib.util

    assert importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("n", [1, 2, 8, 64, 1 << 10, 1 << 13])
@pytest.mark.parametrize("radix", [1, 3, 7])
def test_fwht_torch_equals_numpy_butterfly(n: int, radix: int) -> None:
    rng = np.random.default_rng(n + radix)
    a = rng.standard_normal((3, n))
    want = fwht(a)
    got = fwht_torch(torch.from_numpy(a), radix).numpy()
    # entries of a @ H are sums of n terms of size ~1; rounding ~ log2(n) eps sqrt(n)
    assert np.max(np.abs(got - want)) <= 1e-12 * np.sqrt(n) * max(1, n.bit_length())
    single = fwht_torch(torch.from_numpy(a[0]), radix).numpy()
    np.testing.assert_allclose(single, want[0], rtol=0, atol=1e-12 * n)


def test_fwht_torch_is_the_sylvester_hadamard_product() -> None:
    n = 64
    cols = np.arange(n)
    h = 1.0 - 2.0 * (np.bitwise_count(cols[:, None] & cols[None, :]) & 1)  # tests only
    a = np.random.default_rng(1).standard_normal((5, n))
    for radix in (1, 2, 4, 7):
        np.testing.assert_allclose(
            fwht_torch(torch.from_numpy(a), radix).numpy(), a @ h, rtol=0, atol=1e-12
        )


def test_fwht_torch_rejects_non_powers_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        fwht_torch(torch.zeros(3, 12, dtype=torch.float64))


@pytest.mark.parametrize(("n", "k", "d_pad"), [(5, 16, 256), (3, 40, 64), (4, 2, 2)])
def test_operator_matches_numpy(n: int, k: int, d_pad: int) -> None:
    seeds = [7919 * (i + 1) for i in range(n)]
    ref = JointSRHT.from_seeds(seeds, k, d_pad)
    # a budget of one client per chunk exercises the chunk loop
    op = TorchJointSRHT.from_seeds(seeds, k, d_pad, "cpu", memory_budget=8 * d_pad, threads=2)
    np.testing.assert_array_equal(op.signs.numpy(), ref.signs)
    np.testing.assert_array_equal(op.rows.numpy(), ref.rows)
    rng = np.random.default_rng(n)
    u = rng.standard_normal(d_pad)
    z = rng.standard_normal((n, k))
    np.testing.assert_allclose(op.forward(torch.from_numpy(u)).numpy(), ref.forward(u),
                               rtol=0, atol=1e-13 * np.sqrt(d_pad))
    np.testing.assert_allclose(op.adjoint(torch.from_numpy(z)).numpy(), ref.adjoint(z),
                               rtol=0, atol=1e-13 * np.sqrt(n * k))


def test_device_sketch_equals_client_encode() -> None:
    # The benchmark builds its messages on the device with sketch(); it must be the encode.
    n, k, d_pad = 6, 50, 1 << 12
    seeds = [(2**64 - 1) - 104729 * i for i in range(n)]
    xs = np.random.default_rng(5).standard_normal((n, d_pad))
    op = TorchJointSRHT.from_seeds(seeds, k, d_pad, "cpu")
    got = torch.cat([op.sketch(torch.from_numpy(xs[:4]), 0),
                     op.sketch(torch.from_numpy(xs[4:]), 4)]).numpy()
    want = np.stack([srht_encode(x, s, k, d_pad) for x, s in zip(xs, seeds, strict=True)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


CASES = [  # (n, k, d, transform, method): each solver path of joint_solve
    (20, 100, 4096, "avg", "cg"),  # conjugate gradients
    (30, 40, 3000, 2.0, "cg"),  # corr(R), d not a power of two
    (10, 60, 1024, "max", "cg"),  # LSQR (c = 1)
    (6, 8, 64, "avg", "auto"),  # nk <= 512: the exact solver (on the host)
    (12, 8, 64, "max", "auto"),  # nk > d', singular K
    (16, 300, 8192, "one", "auto"),  # auto picks CG at nk = 4800
]


@pytest.mark.parametrize(("n", "k", "d", "transform", "method"), CASES)
def test_device_decode_matches_numpy_decode(
    n: int, k: int, d: int, transform: str | float, method: str
) -> None:
    xs = correlated_vectors(n, d, r=n / 3, seed=n * k)
    # the device decode is the SRHT's (any d, zero-padded to d'); "auto" would pick the
    # randomized DCT for a d that is not a power of two
    ref = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform,
                                method=method, projection="srht")
    dev = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, transform=transform,
                                method=method, device="cpu", projection="srht")
    msgs = [ref.encode(x, 1000003 * (i + 1)) for i, x in enumerate(xs)]
    want = ref.decode_with_info(msgs)
    got = dev.decode_with_info(msgs)
    assert got.solve is not None and want.solve is not None
    assert got.solve.method == want.solve.method
    assert got.solve.iterations == want.solve.iterations
    assert got.beta == want.beta
    assert rel_diff(got.estimate, want.estimate) <= 1e-10


def test_blockwise_device_decode_matches_numpy() -> None:
    n, k, d, b = 8, 96, 3000, 1024
    xs = correlated_vectors(n, d, r=2.0, seed=3)
    ref = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b, method="cg")
    dev = rpsagg.make_estimator("rand-proj-spatial", n=n, k=k, d=d, block_size=b, method="cg",
                                device="cpu")
    msgs = [ref.encode(x, 31 * (i + 1)) for i, x in enumerate(xs)]
    assert rel_diff(dev.decode(msgs), ref.decode(msgs)) <= 1e-10


def test_float32_device_solve_is_close_to_float64() -> None:
    # float32 (the GPU benchmark's precision): the FWHT's rounding is ~ log2(d') eps32
    # relative per product (eps32 = 6e-8, 12 levels: ~7e-7), CG stops at rtol 1e-6 and the
    # error in A^T z is at most cond(M) (< 10 here, nk <= d'/4) times the residual:
    # <= 10 * (1e-6 + 7e-7) ~ 2e-5. Tolerance 1e-4.
    n, k, d_pad, c = 20, 100, 4096, 0.95
    seeds = [17 * (i + 1) for i in range(n)]
    xs = correlated_vectors(n, d_pad, r=5.0, seed=11)
    y = np.stack([srht_encode(x, s, k, d_pad) for x, s in zip(xs, seeds, strict=True)])
    want, _ = joint_solve(JointSRHT.from_seeds(seeds, k, d_pad), y, c, method="cg")
    op = TorchJointSRHT.from_seeds(seeds, k, d_pad, "cpu", dtype="float32")
    got, info = joint_solve_torch(op, torch.from_numpy(y).float(), c, method="cg")
    assert got.dtype == torch.float32 and info.method == "cg"
    assert rel_diff(got.double().numpy(), want) <= 1e-4


def test_device_options_are_validated() -> None:
    with pytest.raises(ValueError, match="decode device"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="apply to rand-proj-spatial only"):
        rpsagg.make_estimator("rand-k", n=2, k=2, d=8, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            rpsagg.make_estimator("rand-proj-spatial", n=2, k=2, d=8, device="cuda")
    with pytest.raises(ValueError, match="device decoding supports the SRHT projection"):
        rpsagg.make_estimator("rand-proj-spatial", n=2, k=2, d=12, device="cpu")
    with pytest.raises(ValueError, match="float32 or float64"):
        TorchJointSRHT.from_seeds([1], 2, 8, "cpu", dtype="float16")


def test_bench_accel_smoke(tmp_path: Path) -> None:
    # The GPU machine runs this script once, without an install: its smoke mode (tiny
    # shapes, CPU device, PYTHONPATH=common only) must complete every section.
    root = ROOT
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root / "common")
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(root / "bench" / "bench_accel.py"), "--smoke", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for name in ("env", "check", "decode_2_20", "decode_2_27", "cpu_threads"):
        assert "error" not in res[name], (name, res[name])
    assert res["check"]["met"] and res["check"]["worst_rel_diff"] <= 1e-10
    assert res["decode_2_27"]["runs"][0]["finite"]
    cpu = res["cpu_threads"]
    assert [r["threads"] for r in cpu["rows"]] == [1, 2]
    assert all(r["iterations"] > 0 for r in cpu["rows"])
    # the section says which product path ran, and times one product of each kind
    assert cpu["products"] == res["env"]["decode_products"]
    assert cpu["products"] == ("passes" if os.environ.get("RPSAGG_NATIVE") == "0" else "tiles")
    assert all(r["products"] == cpu["products"] for r in cpu["rows"])
    assert all(r["forward_s"] > 0 and r["adjoint_s"] > 0 for r in cpu["rows"])
    if cpu["products"] == "tiles":  # and the numpy passes as the baseline (1 thread in smoke)
        assert [(r["threads"], r["products"]) for r in cpu["passes_rows"]] == [(1, "passes")]
    topo = res["env"]["cpu_topology"]
    assert topo["physical_cores"] >= 1 and topo["threads_per_core"] >= 1
