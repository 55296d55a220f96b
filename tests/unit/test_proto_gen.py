"""The committed generated protobuf code is exactly what scripts/gen-proto.sh produces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.unit

GENERATED = ("aggregation_pb2.py", "aggregation_pb2.pyi")


def test_regenerating_the_protobuf_code_changes_nothing(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run([str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True, env=env)
    for name in GENERATED:
        fresh = (tmp_path / "rpsagg_wire" / "v1" / name).read_bytes()
        committed = (ROOT / "wire" / "rpsagg_wire" / "v1" / name).read_bytes()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"
    committed_files = {p.name for p in (ROOT / "wire" / "rpsagg_wire" / "v1").glob("*_pb2*")}
    assert committed_files == set(GENERATED), "generated code that gen-proto.sh does not make"


def test_only_the_serde_module_imports_generated_code() -> None:
    offenders = []
    for base in ("common", "wire", "server", "client", "experiments"):
        for path in (ROOT / base).rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or path.name == "serde.py":
                continue
            if "import aggregation_pb2" in path.read_text():
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_round_states_are_the_wire_enum_in_its_order() -> None:
    """``RoundState``'s members are the proto enum's values, by position (serde maps the
    numbers by position)."""
    from rpsagg_wire.v1 import serde
    from rpsagg_wire.v1.messages import RoundState

    names = [f"ROUND_STATE_{s.name}" for s in RoundState]
    assert names == list(serde.pb.RoundState.keys())
    assert [serde.pb.RoundState.Value(n) for n in names] == list(range(len(names)))
    assert [serde._state_number(s) for s in RoundState] == list(range(len(names)))
