"""Blockwise rounds in the service (``--block-size``): configuration, announcement, decode.

A job run with ``--block-size`` (float32 and 8-bit values) decodes, bit for bit, to what the
library decodes from the job's stored messages (tests/service/test_decode_ray.py does the same
through the Ray backend).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from service_util import base_config, check_blockwise_rounds_bitwise, in_process_server

from rpsagg.projections import AUTO_BLOCK_SIZE, AUTO_BLOCK_THRESHOLD
from rpsagg_client import AggregationClient
from rpsagg_server.process.grpcserver import max_request_bytes
from rpsagg_server.settings.flags import load_config
from rpsagg_server.settings.serverconfig import AUTO, ServerConfig

pytestmark = pytest.mark.service

BASE = ["--insecure", "--d", "1000", "--k", "64"]


def test_block_size_from_every_source(tmp_path: Path) -> None:
    assert load_config(BASE).block_size == 0
    assert load_config([*BASE, "--block-size", "128"]).block_size == 128
    assert load_config(BASE, env={"RPSAGG_BLOCK_SIZE": "256"}).block_size == 256
    toml = tmp_path / "c.toml"
    toml.write_text('block-size = 64\n')
    assert load_config([*BASE, "--config", str(toml)]).block_size == 64
    toml.write_text('block_size = "auto"\n')
    cfg = load_config([*BASE, "--config", str(toml)])
    assert cfg.block_size == AUTO and cfg.block_size_for(1000) == 0
    assert load_config([*BASE, "--block-size", "auto"]).block_size == AUTO
    assert load_config(BASE, env={"RPSAGG_BLOCK_SIZE": "AUTO"}).block_size == AUTO


def test_auto_goes_blockwise_above_its_stated_d() -> None:
    cfg = replace_cfg(block_size=AUTO)
    assert cfg.block_size_for(AUTO_BLOCK_THRESHOLD) == 0
    assert cfg.block_size_for(AUTO_BLOCK_THRESHOLD + 1) == AUTO_BLOCK_SIZE == 1 << 18
    assert replace_cfg(block_size=64).block_size_for(10**9) == 64


def replace_cfg(**changes: object) -> ServerConfig:
    return base_config(**changes)


@pytest.mark.parametrize(("argv", "match"), [
    (["--block-size", "48"], "power of two >= 2 or auto; got '48'"),
    (["--block-size", "1"], "power of two >= 2 or auto; got '1'"),
    (["--block-size", "-4"], "power of two >= 2 or auto"),
    (["--block-size", "many"], "power of two >= 2 or auto"),
    (["--block-size", "8"], r"--k must be >= the number of blocks ceil\(d / block size\) = 125"),
    (["--block-size", "64", "--estimator", "rand-k"], "--block-size applies to --estimator"),
    (["--block-size", "64", "--estimator", "eden", "--bits", "2"], "applies to --estimator"),
    (["--block-size", "64", "--d", "0", "--data", "external"], "--block-size needs --d"),
    (["--block-size", "8", "--target-rel-error", "0.5", "--k-min", "100", "--k-max", "200"],
     r"--k-min must be >= the number of blocks"),
])
def test_block_size_refusals(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_config([*BASE, *argv])


def test_k_min_defaults_to_one_value_per_block() -> None:
    """--target-rel-error with --block-size and no --k-min: the least k a round may use is
    what the block layout allows (one value per block), not 1, which the layout refuses;
    an explicit --k-min below it is still refused, in one line."""
    target = ["--target-rel-error", "0.5", "--block-size", "256"]  # d = 1000: 4 blocks
    cfg = load_config([*BASE, *target])
    assert cfg.k_min is None and cfg.least_k == 4
    assert load_config([*BASE, "--target-rel-error", "0.5"]).least_k == 1  # one transform
    assert load_config([*BASE, *target, "--k-min", "6"]).least_k == 6
    for given in ("1", "3"):
        with pytest.raises(ValueError) as info:
            load_config([*BASE, *target, "--k-min", given])
        assert str(info.value) == ("--k-min must be >= the number of blocks ceil(d / block "
                                   f"size) = 4 with --block-size 256; got {given}")
    with pytest.raises(ValueError, match=r"--k-min must be in \[1, k-max\]"):
        load_config([*BASE, "--target-rel-error", "0.5", "--k-min", "0"])


def test_round_info_announces_the_block_size_and_the_client_follows() -> None:
    cfg = base_config(d=128, k=16, block_size=32, value_bits=8, rounds=1)
    with in_process_server(cfg) as srv:
        client = AggregationClient(f"127.0.0.1:{srv.port}", "c0", insecure=True)
        try:
            client.join()
            rnd = client.current_round()
            assert (rnd.block_size, rnd.value_bits, rnd.spec_version) == (
                32, 8, "rpsagg-seed-v5")
            est = client.estimator_for(rnd)
            assert est.name == "rand-proj-spatial:block=32" and est.value_bits == 8
            sub = client.encode(rnd, np.arange(128.0))
            v = sub.vectors[0]
            assert v.scales is not None and v.scales.size == 4 and v.scale == 0.0
            assert v.payload_bytes == 16 + 4 * 4
        finally:
            client.close()
        wire = srv.running.engine.wire
        assert wire.block_size == 32
        # the request limit counts the 4 block scales of each vector (4 bytes each, +25 %)
        unblocked = dataclasses.replace(wire, block_size=0)
        assert max_request_bytes(cfg, 1, wire) - max_request_bytes(cfg, 1, unblocked) == 20


@pytest.mark.parametrize("value_bits", [32, 8])
@pytest.mark.timeout(300)
def test_service_blockwise_decode_is_the_library_decode_bitwise(
    tmp_path: Path, value_bits: int
) -> None:
    from service_util import run_local_job

    n, k, d, b, rounds = 4, 48, 1000, 128, 2  # 8 blocks, the last one short
    db = run_local_job(tmp_path, n, k, d, rounds, data_r=2,
                       extra=["--block-size", str(b), "--value-bits", str(value_bits)])
    assert check_blockwise_rounds_bitwise(db, n, k, d, b, value_bits) == rounds
