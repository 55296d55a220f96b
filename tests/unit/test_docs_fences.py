"""Fenced code blocks in the Markdown of the repository close where their authors meant them to.

A fence left open swallows the rest of the page; CommonMark closes a fence only with a line of
the same character, at least as long as the opening, followed by nothing but spaces. Checked in
README.md, CHANGELOG.md, docs/**/*.md and examples/*/README.md, each problem as file:line:

- a fence still open at the end of the file;
- a line that would close the fence but carries text after it (```` ``` text ````): it does
  not close, it is a line of the block;
- a bare fence line of the other character, or shorter than the opening (```` ``` ```` in a
  block opened with four backticks), that no fence inside the block opened: the author meant
  it to close the block, and it does not.

A longer fence holds shorter ones (a ```` ```` ```` block showing a ```` ```python ```` block):
inside it, fences of the other character or shorter are followed as nested blocks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.unit

# a fence line: any indentation (fences sit in list items too), three or more ` or ~, the rest
_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<rest>.*)$")


def _fence(line: str) -> tuple[str, int, str] | None:
    """``(character, length, the rest of the line)`` for a fence line, else None."""
    match = _FENCE.match(line)
    if match is None:
        return None
    fence = match.group("fence")
    return fence[0], len(fence), match.group("rest")


def _opens(char: str, rest: str) -> bool:
    """Whether a fence line outside a block opens one: a backtick run followed by more
    backticks on its line is inline code, not a fence."""
    return not (char == "`" and "`" in rest)


def fence_problems(text: str) -> list[tuple[int, str]]:
    """The fence problems of a Markdown text: ``(line number, what)``, in line order."""
    problems: list[tuple[int, str]] = []
    opened: tuple[str, int, int] | None = None  # character, length, line of the open fence
    inner: list[tuple[str, int]] = []  # fences opened inside a block of a longer fence
    for number, line in enumerate(text.splitlines(), 1):
        found = _fence(line)
        if found is None:
            continue
        char, length, rest = found
        if opened is None:
            if _opens(char, rest):
                opened, inner = (char, length, number), []
            continue
        o_char, o_length, o_line = opened
        bare = not rest.strip()
        if char == o_char and length >= o_length:
            if bare:
                opened = None
            else:
                problems.append((number, f"text after a closing fence {char * length!r} (the "
                                 f"block opened at line {o_line} stays open)"))
        elif not bare:
            if _opens(char, rest):
                inner.append((char, length))
        elif inner and inner[-1][0] == char and length >= inner[-1][1]:
            inner.pop()
        else:
            problems.append((number, f"{char * length!r} does not close the block opened with "
                             f"{o_char * o_length!r} at line {o_line}"))
    if opened is not None:
        problems.append((opened[2], f"fence {opened[0] * opened[1]!r} never closed"))
    return problems


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(ROOT.glob("examples/*/README.md"))]


def test_every_fence_in_the_markdown_closes() -> None:
    pages = _pages()
    assert len(pages) > 10
    found = [f"{page.relative_to(ROOT)}:{number}: {what}"
             for page in pages
             for number, what in fence_problems(page.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


GOOD = [
    "text\n```bash\nls\n```\nmore\n",
    "```\na\n```   \n",  # spaces after a closing fence
    "````markdown\n```python\nx = 1\n```\n````\n",  # a block shown in a block
    "~~~\n```python\nx = 1\n```\n~~~\n",  # backticks in a tilde block
    "- item\n\n    ```yaml\n    a: 1\n    ```\n",  # in a list item
    "inline ```code``` at the start of a line\n",
    "```\n````\n",  # a longer run closes too
]
BAD = [
    ("```yaml\na: 1\n``` The page at `/`\n\nmore\n", [3, 1]),  # text after the close
    ("```bash\nls\n", [1]),  # never closed
    ("````\ncode\n```\n", [3, 1]),  # shorter than the opening
    ("```\ncode\n~~~\n", [3, 1]),  # the other character
    ("```\na\n```\n\n```python\nb\n", [5]),  # the second block stays open
]


@pytest.mark.parametrize("text", GOOD)
def test_the_checker_passes_well_formed_fences(text: str) -> None:
    assert fence_problems(text) == []


@pytest.mark.parametrize(("text", "lines"), BAD)
def test_the_checker_catches_broken_fences(text: str, lines: list[int]) -> None:
    assert [number for number, _ in fence_problems(text)] == lines
