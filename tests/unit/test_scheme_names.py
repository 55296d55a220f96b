"""Scheme names live in the estimator registry only.

Everything outside the registry asks an estimator what it sends (``Estimator.wire``) or the
registry what a scheme is (``rpsagg._estimators.scheme_traits``); a string literal naming a
scheme anywhere else is a scheme-name match in disguise. The scan is an AST walk over the
sources of the four packages in this repository, so docstrings and comments that mention a
scheme in prose do not count, while ``"rand-k"``, ``"rand-proj-spatial:dct"`` and the
constant head of ``f"rand-proj-spatial:block={b}"`` do.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repo_paths import ROOT

from rpsagg._estimators import ESTIMATOR_NAMES, QUANTIZER_NAMES

pytestmark = pytest.mark.unit

SCANNED = ("common", "server", "client", "wire", "flower")
#: The registry: the module that maps names to estimators and the modules whose estimator
#: classes declare their own ``name``.
REGISTRY = {
    "common/rpsagg/_estimators.py",
    "common/rpsagg/_coordinates.py",
    "common/rpsagg/_spatial.py",
    "common/rpsagg/_blockwise.py",
    "common/rpsagg/_eden.py",
    "common/rpsagg/_qsgd.py",
}
#: Literals that spell a scheme name but name something else, with the reason.
NOT_SCHEMES = {
    # the code books of quantized values are named after the quantizer that defines them
    ("common/rpsagg/_quantize.py", "qsgd"),
    ("common/rpsagg/_quantize.py", "eden"),
    ("common/rpsagg/quantize.py", "qsgd"),  # quantize()'s codebook argument (the same names)
    ("common/rpsagg/quantize.py", "eden"),
    # the beta cache's key namespace (on disk: renaming it would orphan every cached beta)
    ("common/rpsagg/_beta.py", "rand-proj-spatial"),
}
NAMES = ESTIMATOR_NAMES + QUANTIZER_NAMES


def names_a_scheme(text: str) -> bool:
    """A scheme name, or a message scheme built on one (``rand-proj-spatial:dct``)."""
    return any(text == name or text.startswith(name + ":") for name in NAMES)


def scheme_literals(source: str, filename: str = "<probe>") -> list[tuple[int, str]]:
    """``(line, literal)`` of every string constant in ``source`` that names a scheme."""
    tree = ast.parse(source, filename=filename)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and names_a_scheme(node.value)
    ]


def sources() -> list[Path]:
    """The hand-written Python sources of the four packages."""
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "_pb2" in path.name or "/.venv/" in rel or "/build/" in rel:
                continue
            out.append(path)
    return out


def test_the_scan_finds_scheme_literals() -> None:
    """The detector itself: what it must flag, and prose it must leave alone."""
    code = (
        'A = "rand-k"\nB = f"rand-proj-spatial:block={8}"\nC = ("eden", "qsgd")\n'
        'D = "rand-proj-spatial:dct"\n'
        'def f():\n    """Decode rand-k messages."""\n    return "full"\n'
        'E = "rand-kx"\nF = "full speed"\n'
    )
    found = sorted(scheme_literals(code))
    assert found == [(1, "rand-k"), (2, "rand-proj-spatial:block="), (3, "eden"), (3, "qsgd"),
                     (4, "rand-proj-spatial:dct"), (7, "full")]


def test_the_registry_modules_exist() -> None:
    """A renamed registry module must be renamed here too (else the scan skips nothing)."""
    for rel in REGISTRY | {rel for rel, _ in NOT_SCHEMES}:
        assert (ROOT / rel).is_file(), rel


@pytest.mark.parametrize("top", SCANNED)
def test_no_scheme_name_outside_the_registry(top: str) -> None:
    offenders = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(top + "/") or rel in REGISTRY:
            continue
        for line, literal in scheme_literals(path.read_text(), rel):
            if (rel, literal) not in NOT_SCHEMES:
                offenders.append(f"{rel}:{line}: {literal!r}")
    assert not offenders, (
        "scheme names outside the estimator registry (ask the estimator's wire profile or "
        "rpsagg._estimators.scheme_traits instead):\n" + "\n".join(offenders)
    )
