"""MkDocs hooks of the documentation site (mkdocs.yml names this file under ``hooks``).

- A page of docs/ may link a file of the repository outside docs/ (``../proto/...``): the site
  has no copy of it, so the link becomes the repository path as code, and a target that does
  not exist is a warning (which fails ``mkdocs build --strict``).
- A mention of another page as code, ```docs/scaling.md```, links that page in the site
  (outside code blocks; the text stays as it is).
- A line ``<!-- argparse: package.module:function -->`` becomes the ``--help`` of the parser
  that function returns, and of each of its subcommands: the command-line reference is
  generated from the parsers the commands run, never copied.
- A line ``<!-- environment -->`` becomes the tables of the environment variables that the
  commands read: each command's from its parser (the server's from its settings models),
  the library's from ``rpsagg.commandline.PROCESS_VARIABLES``; ``<!-- exit-statuses -->``
  the table of exit statuses every command keeps (``rpsagg.commandline.MEANINGS``).
- CHANGELOG.md is the site's page ``changelog.md`` (generated, never copied into docs/).
- A line ``<!-- openapi -->`` becomes the HTTP API's reference, rendered from the OpenAPI
  schema of the server's app (built in memory, nothing served, on an in-memory database);
  the schema itself is a file of the site, ``reference/openapi.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
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
    markdown = _link_mentions(markdown, docs, page.file.src_path)
    markdown = _ARGPARSE.sub(lambda m: _parser_help(m.group(1), page.file.src_path), markdown)
    markdown = _ENVIRONMENT.sub(lambda _m: render_environment(), markdown)
    markdown = _EXIT_STATUSES.sub(lambda _m: _render_exit_statuses(), markdown)
    if _OPENAPI.search(markdown):
        if _SCHEMA:
            markdown = _OPENAPI.sub(lambda _m: _render_openapi(_SCHEMA), markdown)
        else:
            log.warning("%s: no OpenAPI schema to render", page.file.src_path)
    return markdown


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    # the repository's CHANGELOG.md, a page of the site as it is (one file, no copy)
    changelog = Path(config["docs_dir"]).resolve().parent / "CHANGELOG.md"
    files.append(File.generated(config, CHANGELOG_PAGE, content=changelog.read_text()))
    _SCHEMA.clear()
    try:
        _SCHEMA.update(_openapi_schema())
    except Exception as exc:  # the strict build fails, with the reason
        log.warning("the server's OpenAPI schema: %s", exc)
        return files
    files.append(File.generated(config, OPENAPI_JSON,
                                content=json.dumps(_SCHEMA, indent=2) + "\n"))
    return files


_OPENAPI = re.compile(r"^<!-- openapi -->$", re.M)
_SCHEMA: dict[str, Any] = {}
OPENAPI_JSON = "reference/openapi.json"  # in the site, beside reference/http.md
CHANGELOG_PAGE = "changelog.md"  # the site's page of CHANGELOG.md


def _openapi_schema() -> dict[str, Any]:
    from rpsagg_server.decode.decodepool import DecodePool
    from rpsagg_server.http.service import create_service_app
    from rpsagg_server.jobs.jobhost import JobHost
    from rpsagg_server.settings.flags import load_config

    cfg = load_config(["--insecure", "--db", ":memory:", "--n", "2", "--k", "1", "--d", "4"],
                      env={})
    schema: dict[str, Any] = create_service_app(JobHost(cfg, DecodePool(1))).openapi()
    return schema


def _type(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    kind = str(schema.get("type", "any"))
    if "enum" in schema:
        kind += " (" + ", ".join(f"`{v}`" for v in schema["enum"]) + ")"
    return kind


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _render_openapi(schema: dict[str, Any]) -> str:
    info = schema.get("info", {})
    out = [_cell(info.get("summary", "")), "", _cell(info.get("description", "")), ""]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out += [f"### `{method.upper()} {path}`", "", f"**{_cell(op.get('summary', ''))}**",
                    ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | what |",
                        "| --- | --- | --- | --- | --- |"]
                for prm in params:
                    kind = _cell(_type(prm.get("schema", {})))
                    what = prm.get("description", prm.get("schema", {}).get("description", ""))
                    needed = "yes" if prm.get("required") else "no"
                    out.append(f"| `{prm['name']}` | {prm['in']} | {kind} | {needed}"
                               f" | {_cell(what)} |")
                out.append("")
            codes = ", ".join(f"`{code}` {_cell(r.get('description', ''))}"
                              for code, r in op.get("responses", {}).items())
            out += [f"Responses: {codes}", ""]
    return "\n".join(out)


_MENTION = re.compile(r"(?<![\[`])`docs/([\w/.-]+\.md)`(?![`\]])")


def _link_mentions(markdown: str, docs: Path, src: str) -> str:
    """```docs/x.md``` -> ``[`docs/x.md`](relative/x.md)`` outside fenced blocks, where the
    page exists."""
    depth = src.count("/")
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            line = _MENTION.sub(
                lambda m: f"[`docs/{m.group(1)}`]({'../' * depth}{m.group(1)})"
                if (docs / m.group(1)).is_file() else m.group(0), line)
        out.append(line)
    return "\n".join(out)


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


_ENVIRONMENT = re.compile(r"^<!-- environment -->$", re.M)
_EXIT_STATUSES = re.compile(r"^<!-- exit-statuses -->$", re.M)
#: the commands whose flags read variables: (title, parser)
_ENV_COMMANDS = (("rpsagg-server", "rpsagg_server.settings.flags:_parser"),
                 ("rpsagg-client", "rpsagg_client.cli:_parser"),
                 ("rpsagg-jobs", "rpsagg_client.jobs_cli:_parser"))


def render_environment() -> str:
    """The environment reference's tables (Markdown), from the parsers and the library."""
    from rpsagg.commandline import PROCESS_VARIABLES, environment_variables

    out = []
    for title, target in _ENV_COMMANDS:
        module, function = target.split(":")
        parser = getattr(importlib.import_module(module), function)()
        out += [f"### {title}", "", "| variable | flag | what |", "| --- | --- | --- |"]
        out += [f"| `{name}` | `{flag}` | {_cell(what).replace('%%', '%')} |"
                for name, flag, what in environment_variables(parser)]
        out.append("")
    out += ["### The library and every command", "", "| variable | what |", "| --- | --- |"]
    out += [f"| `{name}` | {_cell(what)} |" for name, what in PROCESS_VARIABLES.items()]
    return "\n".join(out) + "\n"


def _render_exit_statuses() -> str:
    from rpsagg.commandline import MEANINGS

    rows = [f"| {int(status)} | `{status.name}` | {_cell(what)} |"
            for status, what in MEANINGS.items()]
    return "\n".join(["| status | name | meaning |", "| --- | --- | --- |", *rows]) + "\n"
