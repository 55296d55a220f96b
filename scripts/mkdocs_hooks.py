"""MkDocs hooks of the documentation site (mkdocs.yml names this file under ``hooks``).

- A page of docs/ may link a file of the repository outside docs/ (``../proto/...``): the site
  has no copy of it, so the link becomes the repository path as code, and a target that does
  not exist is a warning (which fails ``mkdocs build --strict``).
- A line ``<!-- argparse: package.module:function -->`` becomes the ``--help`` of the parser
  that function returns, and of each of its subcommands: the command-line reference is
  generated from the parsers the commands run, never copied.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.rpsagg")

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    source = (docs / page.file.src_path).parent

    def repo_file(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        path = (source / target).resolve()
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            rel = ""
        if not rel or not path.exists():
            log.warning("%s: link to %s, which is not a file of the repository",
                        page.file.src_path, target)
            return match.group(0)
        if rel.strip("/") in text.strip("`").strip("/"):
            return text
        return f"{text} (`{rel}`)"

    markdown = _LINK.sub(repo_file, markdown)
    return _ARGPARSE.sub(lambda m: _parser_help(m.group(1), page.file.src_path), markdown)


_ARGPARSE = re.compile(r"^<!-- argparse: ([\w.]+:\w+) -->$", re.M)


def _helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    yield parser.prog, parser.format_help()
    for action in parser._actions:  # the subcommands' parsers (argparse has no public list)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _helps(sub)


def _parser_help(target: str, page: str) -> str:
    module, function = target.split(":")
    # the help as a user's terminal of 100 columns shows it, without this machine's RPSAGG_*
    saved = {k: v for k, v in os.environ.items() if k.startswith("RPSAGG_") or k == "COLUMNS"}
    for key in saved:
        del os.environ[key]
    os.environ["COLUMNS"] = "100"
    try:
        parser = getattr(importlib.import_module(module), function)()
        blocks = [f"### `{prog}`\n\n```text\n{text.rstrip()}\n```\n"
                  for prog, text in _helps(parser)]
    except Exception as exc:  # a broken reference fails the strict build, with the reason
        log.warning("%s: argparse %s: %s", page, target, exc)
        return f"`{target}`"
    finally:
        del os.environ["COLUMNS"]
        os.environ.update(saved)
    return "\n".join(blocks)
