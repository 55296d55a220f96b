"""Every command's help, exit statuses and environment variables, as the release promises:
plain text (no reST), every default shown, every flag in a group that shows an example, one
table of exit statuses, variables named by role (the older names still read, with a line)
and a reference page that lists every variable the repository reads."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import ROOT

from rpsagg.commandline import MEANINGS, ExitStatus, HelpFormatter, Parser, add_flag, plain

pytestmark = pytest.mark.unit

#: every command's parser: (module, function)
PARSERS = {"rpsagg-server": ("rpsagg_server.settings.flags", "_parser"),
           "rpsagg-client": ("rpsagg_client.cli", "_parser"),
           "rpsagg-client result": ("rpsagg_client.cli", "_result_parser"),
           "rpsagg-jobs": ("rpsagg_client.jobs_cli", "_parser"),
           "rpsagg-simulate": ("rpsagg.simulate", "_parser"),
           "rpsagg-cluster": ("rpsagg_experiments.cluster", "_parser"),
           "rpsagg-experiments": ("rpsagg_experiments.cli", "build_parser")}
#: the flags of the parser's own group (help, version, the server's --config)
UNGROUPED = {"-h", "--version", "--config"}
RST = re.compile(r"``|:(mod|class|func|meth|data|attr):`|^\s*[-=~]{3,}\s*$", re.M)


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, (module, function) in PARSERS.items():
        parser = getattr(importlib.import_module(module), function)()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from ((sub.prog, sub) for sub in action.choices.values())


def test_help_is_plain_text_with_groups_examples_defaults_and_exit_statuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    seen = 0
    for name, parser in _parsers():
        text = parser.format_help()
        assert not RST.search(text), (name, RST.search(text))
        assert "exit status:" in text and "  0    done" in text, name
        statuses = re.findall(r"^  (\d+) ", text.split("exit status:")[1], re.M)
        assert statuses and {int(s) for s in statuses} <= set(MEANINGS), (name, statuses)
        for group in parser._action_groups:
            flags = [a for a in group._group_actions if a.option_strings]
            if group.title in ("options", "positional arguments"):
                assert {a.option_strings[0] for a in flags} <= UNGROUPED, (name, group.title)
                continue
            assert group.description and "e.g." in group.description, (name, group.title)
        formatter = HelpFormatter(parser.prog)
        for action in parser._actions:
            shown = getattr(action, "environment", None)
            default = shown.default if shown is not None else action.default
            if action.option_strings and action.nargs != 0 and default not in (
                    None, argparse.SUPPRESS) and name != "rpsagg-server":
                assert "default" in (formatter._get_help_string(action) or ""), \
                    (name, action.option_strings)
        seen += 1
    assert seen == len(PARSERS) + 6  # rpsagg-jobs' six commands


def test_the_servers_flags_show_their_defaults_and_variables() -> None:
    from rpsagg_server.settings.flags import _FLAG_FIELDS, env_name

    text = " ".join(importlib.import_module("rpsagg_server.settings.flags")._parser()
                    .format_help().split())
    for field in _FLAG_FIELDS:
        assert f"env {env_name(field)})" in text or f"env {env_name(field)};" in text, field
    assert text.count("(default: ") >= len(_FLAG_FIELDS)
    assert "env RPSAGG_SERVER_TLS_CERT" in text and "env RPSAGG_TLS_CERT" not in text


def test_help_names_a_variable_and_never_shows_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RPSAGG_TOKEN", "s3cret-token-value")
    monkeypatch.setenv("RPSAGG_SERVER", "10.1.2.3:9")
    from rpsagg_client.cli import _parser

    text = _parser().format_help()
    assert "s3cret" not in text and "10.1.2.3" not in text
    assert "RPSAGG_TOKEN" in text and "127.0.0.1:50051" in text
    args = _parser().parse_args([])
    assert (args.token, args.server) == ("s3cret-token-value", "10.1.2.3:9")


def _client_args(env: dict[str, str], argv: list[str],
                 capsys: pytest.CaptureFixture[str]) -> tuple[argparse.Namespace, str]:
    from rpsagg_client.cli import _parser

    parser = _parser()
    parser.environ = env  # type: ignore[attr-defined]
    args = parser.parse_args(argv)
    return args, capsys.readouterr().err


def test_the_clients_certificate_is_named_by_role_and_the_old_name_still_read(
        capsys: pytest.CaptureFixture[str]) -> None:
    args, err = _client_args({"RPSAGG_CLIENT_TLS_CERT": "c.pem", "RPSAGG_CLIENT_TLS_KEY": "c.key"},
                             [], capsys)
    assert (args.tls_cert, args.tls_key, err) == ("c.pem", "c.key", "")
    args, err = _client_args({"RPSAGG_TLS_CERT": "old.pem", "RPSAGG_TLS_KEY": "old.key"}, [],
                             capsys)
    assert (args.tls_cert, args.tls_key) == ("old.pem", "old.key")
    assert err.splitlines() == [
        "rpsagg-client: RPSAGG_TLS_CERT is deprecated; use RPSAGG_CLIENT_TLS_CERT (the same value)",
        "rpsagg-client: RPSAGG_TLS_KEY is deprecated; use RPSAGG_CLIENT_TLS_KEY (the same value)"]
    # the new name wins over the old, and a flag over both, with no line
    args, err = _client_args({"RPSAGG_TLS_CERT": "old.pem", "RPSAGG_CLIENT_TLS_CERT": "new.pem"},
                             [], capsys)
    assert (args.tls_cert, err) == ("new.pem", "")
    args, err = _client_args({"RPSAGG_TLS_CERT": "old.pem"}, ["--tls-cert", "flag.pem"], capsys)
    assert (args.tls_cert, err) == ("flag.pem", "")
    args, err = _client_args({"RPSAGG_QUIET": "yes"}, [], capsys)
    assert args.quiet is True
    args, err = _client_args({"RPSAGG_QUIET": "0"}, [], capsys)
    assert args.quiet is False


def test_the_servers_certificate_is_named_by_role_and_the_old_name_still_read(
        capsys: pytest.CaptureFixture[str]) -> None:
    from rpsagg_server.settings.flags import load_config

    base = ["--db", ":memory:", "--n", "2", "--k", "1", "--d", "4", "--tls-key", "s.key",
            "--tokens", "tokens.txt"]
    cfg = load_config(base, env={"RPSAGG_SERVER_TLS_CERT": "s.pem"})
    assert (cfg.tls_cert, capsys.readouterr().err) == ("s.pem", "")
    cfg = load_config(base, env={"RPSAGG_TLS_CERT": "old.pem"})
    assert cfg.tls_cert == "old.pem"
    assert capsys.readouterr().err == ("rpsagg-server: RPSAGG_TLS_CERT is deprecated; use "
                                       "RPSAGG_SERVER_TLS_CERT (the same value)\n")
    cfg = load_config(base, env={"RPSAGG_TLS_CERT": "old.pem", "RPSAGG_SERVER_TLS_CERT": "s.pem"})
    assert (cfg.tls_cert, capsys.readouterr().err) == ("s.pem", "")
    cfg = load_config([*base, "--tls-cert", "flag.pem"], env={"RPSAGG_TLS_CERT": "old.pem"})
    assert cfg.tls_cert == "flag.pem"


def test_a_bad_variable_is_a_usage_error_that_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    parser = Parser(prog="p")
    add_flag(parser, "--n", env="RPSAGG_N_TEST", type=int, default=3)
    parser.environ = {"RPSAGG_N_TEST": "many"}  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([])
    assert exc.value.code == ExitStatus.USAGE
    assert "RPSAGG_N_TEST='many'" in capsys.readouterr().err
    parser.environ = {}  # type: ignore[attr-defined]
    assert parser.parse_args([]).n == 3


def test_plain_turns_rest_into_text() -> None:
    doc = "Run ``x --y``; see :mod:`a.b` and :class:`~a.b.C`.\n\nExamples\n--------\n    x\n"
    assert plain(doc) == "Run x --y; see a.b and C.\n\nexamples:\n    x\n"


def test_every_command_keeps_the_table(tmp_path: Path) -> None:
    """Usage errors are 2 for every command, and a client with no server to reach is 1
    (a failure a rerun may mend), as the jobs command with none."""
    bin_dir = Path(sys.executable).parent
    for command in ("rpsagg-server", "rpsagg-client", "rpsagg-jobs", "rpsagg-simulate",
                    "rpsagg-cluster", "rpsagg-experiments"):
        out = subprocess.run([str(bin_dir / command), "--no-such-flag"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == ExitStatus.USAGE, (command, out.stderr)
    from http_util import free_port

    port = free_port()
    for argv in ([str(bin_dir / "rpsagg-client"), "--insecure", "--server",
                  f"127.0.0.1:{port}", "--retry-budget", "0.5", "--quiet"],
                 [str(bin_dir / "rpsagg-jobs"), "--url", f"http://127.0.0.1:{port}", "list"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == ExitStatus.FAILURE, (argv, out.stderr)


# -- the environment reference -------------------------------------------------------------
def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" /
                                                  "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_environment_reference_lists_every_variable_the_repository_reads() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert "<!-- environment -->" in page
    generated = _hooks().render_environment()
    rendered = page.replace("<!-- environment -->", generated)
    listed = set(re.findall(r"^\| `(RPSAGG_[A-Z0-9_]+)`", rendered, re.M))
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    used: dict[str, str] = {}
    for name in files:  # the tests' own names and the history are not the product's
        path = ROOT / name
        if name.startswith("tests/") or name == "CHANGELOG.md" or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for var in re.findall(r"RPSAGG_[A-Z0-9_]*[A-Z0-9]", text):
            used.setdefault(var, name)
    used.pop("RPSAGG_FLAG", None)  # the pattern RPSAGG_<FLAG> as prose
    missing = {var: where for var, where in used.items() if var not in listed}
    assert not missing, missing
    # a compose file's own variable (not a server setting's) has the default the page gives
    for compose in ROOT.glob("docker-compose*.yml"):
        for var, default in re.findall(r"\$\{(RPSAGG_[A-Z_]+):-([^}]*)\}", compose.read_text()):
            if f"`{var}`" in generated:
                continue
            row = re.search(rf"^\| `{var}` \| ([^|]+) \|", page, re.M)
            assert row is not None, var
            shown = row.group(1).strip()
            assert shown == f"`{default}`" or (not default and shown == "empty"), (var, shown)
