"""``rpsagg-server --decode-device``: rounds decoded by the PyTorch backend (on the CPU here).

The device decode must give the numpy decode's estimate (<= 1e-12, as every service round is
checked) and must really run on the device (the torch solver is counted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from service_util import (
    check_rounds_against_inprocess,
    run_local_job,
)

import rpsagg
from rpsagg.synthetic import correlated_vectors
from rpsagg_server.decode import decoding
from rpsagg_server.settings.flags import load_config
from rpsagg_wire.v1.serde import Submission, VectorPayload

pytest.importorskip("torch", reason="scripts/setup-env.sh test installs rpsagg[torch]")
import rpsagg._torch

pytestmark = pytest.mark.service

# nk = 4 * 160 = 640 > 512: the matrix-free solver (not the host's exact one) decodes.
N, K, D = 4, 160, 1024


def test_decode_device_flag_is_validated() -> None:
    assert load_config(["--insecure", "--decode-device", "cpu"], env={}).decode_device == "cpu"
    assert load_config(["--insecure"], env={"RPSAGG_DECODE_DEVICE": "cpu"}).decode_device == "cpu"
    assert load_config(["--insecure"], env={}).decode_device is None
    with pytest.raises(ValueError, match="decode device"):
        load_config(["--insecure", "--decode-device", "tpu"], env={})
    with pytest.raises(ValueError, match="rand-proj-spatial"):
        load_config(["--insecure", "--decode-device", "cpu", "--estimator", "rand-k"], env={})


def test_decode_threads_and_backend_flags_are_validated() -> None:
    cfg = load_config(["--insecure", "--decode-threads", "2"], env={})
    assert cfg.decode_threads == 2 and cfg.decode_backend == "local"
    assert decoding.DecodeOptions.from_config(cfg) == decoding.DecodeOptions(None, 2)
    with pytest.raises(ValueError, match="--decode-threads"):
        load_config(["--insecure", "--decode-threads", "0"], env={})
    with pytest.raises(ValueError, match="--decode-backend"):
        load_config(["--insecure", "--decode-backend", "dask"], env={})
    with pytest.raises(ValueError, match="--ray-address goes with"):
        load_config(["--insecure", "--ray-address", "127.0.0.1:6379"], env={})
    with pytest.raises(ValueError, match="rand-proj-spatial"):
        load_config(["--insecure", "--decode-backend", "ray", "--estimator", "rand-k"], env={})
    ray_cfg = load_config(["--insecure", "--decode-backend", "ray", "--ray-address", "h:1"],
                          env={})
    assert decoding.DecodeOptions.from_config(ray_cfg).ray_address == "h:1"


def test_decode_threads_option_gives_the_same_estimate() -> None:
    est = rpsagg.make_estimator("rand-proj-spatial", n=N, k=K, d=D)
    xs = correlated_vectors(N, D, r=1.0, seed=8)
    subs = []
    for i in range(N):
        cid = f"client-{i}"
        seed = rpsagg.spec.derive_round_seed(7 + i, 5, cid, 0)
        subs.append(Submission(1, cid, 7 + i, (VectorPayload(est.encode(xs[i], seed).values),)))
    one = decoding.decode_round(est, subs, 5, 1, tracker=None, evaluate=False,
                                options=decoding.DecodeOptions(threads=1))
    two = decoding.decode_round(est, subs, 5, 1, tracker=None, evaluate=False,
                                options=decoding.DecodeOptions(threads=2))
    assert np.array_equal(one.estimate, two.estimate)


def test_decode_round_on_device_equals_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = rpsagg._torch.joint_solve_torch

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rpsagg._torch, "joint_solve_torch", counting)
    est = rpsagg.make_estimator("rand-proj-spatial", n=N, k=K, d=D)
    xs = correlated_vectors(N, D, r=1.5, seed=4)
    nonce = 99
    subs = []
    for i in range(N):
        cid = f"client-{i}"
        seed = rpsagg.spec.derive_round_seed(1000 + i, nonce, cid, 0)
        enc = est.encode(xs[i], seed)
        subs.append(Submission(1, cid, 1000 + i, (VectorPayload(enc.values),)))
    want = decoding.decode_round(est, subs, nonce, 1, tracker=None, evaluate=False)
    assert not calls
    got = decoding.decode_round(est, subs, nonce, 1, tracker=None, evaluate=False,
                                options=decoding.DecodeOptions(device="cpu"))
    assert len(calls) == 1
    assert got.beta == want.beta and got.c == want.c
    rel = np.linalg.norm(got.estimate - want.estimate) / np.linalg.norm(want.estimate)
    assert rel <= 1e-10
    assert est.device is None  # the round's estimator itself is left as it was


@pytest.mark.timeout(240)
def test_service_rounds_decoded_on_device(tmp_path: Path) -> None:
    rounds = 2
    db = run_local_job(tmp_path, N, K, D, rounds, data_r=2, extra=["--decode-device", "cpu"])
    assert check_rounds_against_inprocess(db, N, K, D, "rand-proj-spatial") == rounds
