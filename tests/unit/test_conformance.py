"""The conformance kit: docs/wire-vectors.json is what its generator writes, it covers every
tag, projection and quantizer of docs/wire-format.md, the runner (conformance/run.py) passes
rpsagg's own adapter, and it fails adapters that make the mistakes an implementer could make.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import run as runner  # conformance/run.py (tests/conftest.py puts conformance/ on sys.path)
from repo_paths import ROOT, TESTS

from rpsagg import spec
from rpsagg.quantize import TAG_QROUND

pytestmark = pytest.mark.unit

VECTORS_PATH = ROOT / "docs" / "wire-vectors.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
RUNNER = ROOT / "conformance" / "run.py"
ADAPTER = ROOT / "conformance" / "adapters" / "rpsagg_adapter.py"
BROKEN = TESTS / "conformance_broken_adapter.py"


def run_kit(*command: str) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so the runner shows it needs only the standard library
    return subprocess.run(
        [sys.executable, "-S", str(RUNNER), "--timeout", "60", "--", *command],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )


# -- the vectors file ------------------------------------------------------------------------
def test_vectors_file_is_the_generator_output(tmp_path: Path) -> None:
    out = tmp_path / "wire-vectors.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-wire-vectors.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == VECTORS_PATH.read_text(encoding="utf-8"), (
        "docs/wire-vectors.json differs from scripts/gen-wire-vectors.py's output: a number "
        "the spec produces changed (a new spec version), or the file was edited by hand")


def test_vectors_cover_every_tag_projection_and_quantizer() -> None:
    # every tag the library defines (spec.TAG_* and the rounding stream) has keys and words
    library_tags = {v for n, v in vars(spec).items() if n.startswith("TAG_")} | {TAG_QROUND}
    named = {spec._tag(raw.encode()) for raw in VECTORS["tags"].values()}
    assert named == library_tags
    for keys in VECTORS["keys"].values():
        assert set(keys) == set(VECTORS["tags"])
    assert set(VECTORS["tag_words"]) == set(VECTORS["tags"])
    # every projection: SRHT, DCT, hblocks, blockwise SRHT
    assert VECTORS["srht_cases"] and VECTORS["dct_cases"] and VECTORS["hblocks_cases"]
    assert {c["scheme"] for c in VECTORS["blockwise_cases"]} >= {"rand-proj-spatial:block=64"}
    # every quantizer at several widths, every projection quantized, x = 0 for each code book
    widths: dict[str, set[int]] = {}
    for c in VECTORS["quantized_cases"]:
        width = c["options"].get("value_bits", c["options"].get("bits"))
        widths.setdefault(c["message_scheme"], set()).add(width)
    assert widths["rand-k"] >= {1, 3, 8, 16}
    assert widths["rand-k-spatial"] >= {4}
    assert widths["rand-proj-spatial"] >= {1, 3, 4, 8}
    assert widths["rand-proj-spatial:dct"] >= {2, 3, 4}
    assert widths["rand-proj-spatial:hblocks"] >= {1, 3, 4, 8}
    assert widths["qsgd"] >= {1, 2, 4, 8, 16}
    assert widths["eden"] == {1, 2, 4, 8}
    zero = {c["message_scheme"] for c in VECTORS["quantized_cases"] if c.get("x") == "zero"}
    assert zero >= {"rand-k", "rand-proj-spatial:hblocks", "qsgd", "eden"}
    assert set(VECTORS["lloyd_max_centroids"]) == {"1", "2", "4", "8"}
    # uniform codes past 16 bits, up to the 31 a Vector carries
    assert set().union(*widths.values()) >= {17, 24, 31}
    # every scheme the service offers has encode vectors, and decoders have refusals
    assert VECTORS["qsgd_norm_cases"] and VECTORS["wangni_cases"] and VECTORS["induced_cases"]
    assert any(c["c"] is None for c in VECTORS["wangni_cases"])  # at most k non-zero: all kept
    refused = " ".join(c["why"] for c in VECTORS["refusal_cases"])
    for what in ("value_bits 0", "eden bits 3", "block size 1", "value_count other than k",
                 "NaN scale", "negative scale", "non-zero padding bits", "an unknown spec"):
        assert what in refused
    assert any(c["request"]["message"].get("scale_bits") == "0x80000000"
               for c in VECTORS["decode_cases"])  # -0.0 is accepted


def test_one_tolerance_rule() -> None:
    # docs/wire-format.md section 11 and the file's own description state the same rule
    doc = (ROOT / "docs" / "wire-format.md").read_text(encoding="utf-8")
    rule = "* max(1, ||x||_2)"
    assert rule in VECTORS["about"] and f"dct_abs_tolerance {rule}" in doc
    assert f"hblocks_abs_tolerance {rule}" in doc
    assert "tolerance * ||x||_2" not in VECTORS["about"]
    assert runner.tolerance(1e-6, [3.0, 4.0]) == pytest.approx(5e-6)
    assert runner.tolerance(1e-6, [0.1]) == 1e-6


# -- the runner --------------------------------------------------------------------------------
def test_rpsagg_passes_every_check() -> None:
    proc = run_kit(sys.executable, str(ADAPTER))
    total = len(runner.build_checks(VECTORS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"{total} of {total} checks passed"
    assert total >= 250


# (mistake, the vector groups that must fail): each a point an independent client had to guess
BROKEN_CASES = [
    ("sorted_rows", {"srht_cases", "dct_cases", "hblocks_cases"}),
    ("little_endian_tags", {"keys"}),
    ("binary32_quantizer_input", {"quantized_cases", "blockwise_quantized_cases"}),
    ("rounding_keyed_by_another_seed", {"quantized_cases", "blockwise_quantized_cases"}),
    ("scale_rounded_to_nearest", {"quantized_cases", "qsgd_norm_cases",
                                  "blockwise_quantized_cases"}),
    ("eden_scale_rounded_up", {"quantized_cases"}),
    ("qsgd_zero_codes", {"quantized_cases"}),
    ("dct_off_by_1e5", {"dct_cases"}),
    ("hblocks_without_second_signs", {"hblocks_cases"}),
    ("block_seed_without_inner_mix", {"blockwise_cases", "blockwise_quantized_cases"}),
    ("block_rounding_keyed_by_the_message_seed", {"blockwise_quantized_cases"}),
    ("one_scale_for_all_blocks", {"blockwise_quantized_cases"}),
    ("centroid_table_off_by_an_ulp", {"lloyd_max_centroids"}),
    ("qsgd_norm_by_dot", {"qsgd_norm_cases"}),
    ("induced_ties_to_the_higher_index", {"induced_cases"}),
    ("never_refuses", {"refusal_cases"}),
]


@pytest.mark.parametrize(("mistake", "groups"), BROKEN_CASES, ids=[m for m, _ in BROKEN_CASES])
def test_a_wrong_adapter_fails(mistake: str, groups: set[str]) -> None:
    proc = run_kit(sys.executable, str(BROKEN), mistake)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    failed = set(summary.split("failed in: ")[1].split(", "))
    assert failed == groups, summary
    assert all(line.startswith("FAIL ") for line in proc.stdout.strip().splitlines()[:-1])


def test_an_implementation_that_exits_is_an_error() -> None:
    proc = run_kit(sys.executable, str(BROKEN), "exits_early")
    assert proc.returncode == 2
    assert "the implementation exited (status 3) before answering" in proc.stderr


def test_an_implementation_that_does_not_answer_times_out(tmp_path: Path) -> None:
    silent = tmp_path / "silent.py"
    silent.write_text("import sys\nfor line in sys.stdin:\n    pass\n")
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--timeout", "0.5", "--", sys.executable, str(silent)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "no reply within 0.5 s" in proc.stderr


def test_a_missing_command_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, str(RUNNER)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "give the implementation's command" in proc.stderr
