"""The README's library quick start runs, and the simulation command works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./run.sh", "./test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./test.sh" in ci


def test_readme_quick_start_runs() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Library quick start") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    rel_err = float(out.stdout.strip().splitlines()[-1])
    assert np.isfinite(rel_err) and rel_err > 0.0


def test_simulation_command_prints_every_estimator() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rpsagg.simulate",
            "--n",
            "3",
            "--k",
            "4",
            "--d",
            "32",
            "--trials",
            "3",
            "--r",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for name in ("rand-k ", "rand-k-spatial", "rand-proj-spatial", "rand-k-wangni", "induced"):
        assert name in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rpsagg.simulate", "--n", "3", "--k", "40", "--d", "32"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "k must be in [1, d]" in bad.stderr


def test_every_local_link_and_image_in_the_docs_exists() -> None:
    # Markdown links and images ](path) in README.md and docs/*.md that are not URLs or
    # anchors must name files of the repository (relative to the document).
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing
