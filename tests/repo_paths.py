"""Where the tests find the repository: its root and the tests' own folder (a test module
sits one level down, in the folder of its group), and what a distribution of it declares."""

import re
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def requirement_names(folder: str, extras: bool = False) -> set[str]:
    """The distribution names (lower case) in ``folder``'s ``pyproject.toml``: its
    ``[project] dependencies``, and with ``extras`` those of every optional extra too."""
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
    wanted = list(project.get("dependencies", []))
    if extras:
        for extra in project.get("optional-dependencies", {}).values():
            wanted += extra
    return {re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0].lower() for spec in wanted}
