"""MkDocs hooks of the documentation site (mkdocs.yml names this file under ``hooks``).

A page of docs/ may link a file of the repository outside docs/ (``../proto/...``): the site
has no copy of it, so the link becomes the repository path as code, and a target that does
not exist is a warning (which fails ``mkdocs build --strict``).
"""

from __future__ import annotations

import logging
import re
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

    return _LINK.sub(repo_file, markdown)
