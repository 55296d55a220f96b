"""What every rpsagg command shares: one table of exit statuses, the form of its ``--help``
(plain text, every default shown, flags in groups that each show an example) and flags that
an environment variable may set, under a name that says whose setting it is.

The commands: ``rpsagg-server``, ``rpsagg-client``, ``rpsagg-jobs``, ``rpsagg-simulate``,
``rpsagg-cluster`` and ``rpsagg-experiments``; ``docs/reference/cli.md`` shows their help and
the table, ``docs/reference/environment.md`` every variable.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitStatus(IntEnum):
    """The exit statuses of every rpsagg command (:data:`MEANINGS` says what each means)."""

    DONE = 0
    FAILURE = 1
    USAGE = 2
    REFUSED = 3
    CREDENTIALS = 4
    TIMEOUT = 5
    INTERRUPTED = 130


#: what each exit status means, whichever command returns it
MEANINGS: dict[ExitStatus, str] = {
    ExitStatus.DONE: "done",
    ExitStatus.FAILURE: "failed: the work did not end as asked (the server unreachable, a "
    "job that failed or was cancelled, an error on the way); running it again may mend it",
    ExitStatus.USAGE: "usage: a bad flag, value, setting or input file, named in one line on "
    "standard error; nothing was done",
    ExitStatus.REFUSED: "refused for good by the server (every client slot of the job taken, "
    "an invalid request): the same command is refused again",
    ExitStatus.CREDENTIALS: "the server refuses the credentials (a missing or wrong token)",
    ExitStatus.TIMEOUT: "a wait ran out (--timeout) before the work ended",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}


#: the variables that are not a flag's, read by the library or by every command of a
#: distribution (the environment reference lists them beside the flags' own)
PROCESS_VARIABLES: dict[str, str] = {
    "RPSAGG_LOG_LEVEL": "the log level of rpsagg-server (default INFO) and rpsagg-client "
    "(default WARNING): DEBUG, INFO, WARNING, ERROR",
    "RPSAGG_ADMIN_TOKEN": "rpsagg-jobs: the bearer token when neither --token nor "
    "--token-file is given",
    "RPSAGG_ADMIN_TOKEN_FILE": "rpsagg-jobs: the file of the bearer token, after "
    "RPSAGG_ADMIN_TOKEN",
    "RPSAGG_CACHE_DIR": "where the Monte Carlo values of beta are cached (default "
    "$XDG_CACHE_HOME/rpsagg, else ~/.cache/rpsagg)",
    "RPSAGG_FWHT": "numpy or native: force the fast Walsh-Hadamard transform's backend "
    "(default: the compiled one where it was built)",
    "RPSAGG_NATIVE": "0: do not use the compiled kernels (rpsagg._fast) even where built",
    "RPSAGG_NATIVE_REQUIRED": "1 at build time (pip install, scripts/build-wheels.sh): fail "
    "when the compiled kernels do not build, instead of installing without them",
    "RPSAGG_PRODUCTS": "passes: compute the decode's projections in passes instead of tiles "
    "(benchmarks)",
    "RPSAGG_UJI_ZIP": "the UJIIndoorLoc archive of the linreg task and the experiments",
}


def exit_statuses(*statuses: ExitStatus, notes: Mapping[ExitStatus, str] | None = None) -> str:
    """A command's ``--help`` epilog: the statuses it returns, each with its meaning (and the
    command's own ``notes`` on it)."""
    lines = ["exit status:"]
    for status in sorted({ExitStatus.DONE, ExitStatus.FAILURE, ExitStatus.USAGE, *statuses}):
        note = (notes or {}).get(status)
        lines.append(f"  {int(status):<4} {MEANINGS[status]}" + (f" ({note})" if note else ""))
    return "\n".join(lines)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Plain text: a description's or an epilog's paragraphs filled to the terminal, its
    indented lines (examples) kept as written but a table row's wrapped under its text; each
    flag's help ends with its environment variable and its default."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        def fill(line: str, first: str, hang: str) -> str:
            return textwrap.fill(line, width, initial_indent=first, subsequent_indent=hang,
                                 break_on_hyphens=False)

        out: list[str] = []
        for block in re.split(r"\n\s*\n", text.strip("\n")):
            lines, prose = block.splitlines(), []
            while lines and not lines[0].startswith(" "):  # a paragraph: filled
                prose.append(lines.pop(0).strip())
            rows = [fill(" ".join(prose), indent, indent)] if prose else []
            for line in lines:  # indented: examples as written, a table row wrapped
                row = re.match(r"(\s*)(\d+\s+)", line)
                if row is None or len(indent + line) <= width:
                    rows.append(indent + line)
                else:
                    rows.append(fill(line.strip(), indent + row.group(1),
                                     indent + " " * row.end()))
            out.append("\n".join(rows))
        return "\n\n".join(out)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.help == argparse.SUPPRESS:
            return action.help
        extra = []
        source = getattr(action, "environment", None)
        if isinstance(source, EnvironmentVariable):
            extra.append(f"env {source.name}")
        shown = _default_text(action, source)
        if shown is not None and "default" not in text:
            extra.append(f"default: {shown}")
        if extra:  # a value may hold %, which argparse's formatting would read
            added = "; ".join(extra).replace("%", "%%")
            text = f"{text} ({added})" if text else f"({added})"
        return text


def _default_text(action: argparse.Action, source: EnvironmentVariable | None) -> str | None:
    """A flag's default as its help shows it (None: nothing to show)."""
    default = source.default if source is not None else action.default
    if not action.option_strings or default is argparse.SUPPRESS:
        return None
    if default is None or action.nargs == 0:  # a switch is off unless given
        return None
    if isinstance(default, list | tuple):
        return " ".join(str(v) for v in default) if default else None
    return str(default)


def plain(doc: str) -> str:
    """A docstring as a command's description: reST's inline markup gone (````x```` -> x,
    ``:mod:`a.b``` -> a.b, ``:class:`~a.B``` -> B), a heading's underline dropped and the
    heading in lower case with a colon."""
    text = re.sub(r":[a-z]+:`~?([^`]*?)`", lambda m: m.group(1).split(".")[-1]
                  if m.group(0).count("~") else m.group(1), doc)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"^(\S[^\n]*)\n-{3,}$", lambda m: m.group(1).lower() + ":", text,
                  flags=re.M)


@dataclass(frozen=True)
class EnvironmentVariable:
    """The environment variable that sets a flag the command line leaves out.

    Parameters
    ----------
    name : str
        Its name (``RPSAGG_CLIENT_TLS_CERT``).
    default : object
        The flag's value when neither the flag nor the variable is given.
    deprecated : tuple of str
        Older names still read when ``name`` is not set, each with a line on standard error
        that names the new one.
    """

    name: str
    default: Any = None
    deprecated: tuple[str, ...] = ()

    def read(self, environ: Mapping[str, str], prog: str) -> str | None:
        """The variable's text, or the first deprecated name's (with its line), or None."""
        value = environ.get(self.name)
        if value:
            return value
        for old in self.deprecated:
            if environ.get(old):
                print(f"{prog}: {old} is deprecated; use {self.name} (the same value)",
                      file=sys.stderr, flush=True)
                return environ[old]
        return None


def add_flag(group: argparse._ActionsContainer, *names: str, env: str | None = None,
             deprecated: Sequence[str] = (), **kwargs: Any) -> argparse.Action:
    """``group.add_argument(*names, **kwargs)``; with ``env``, the variable that sets the flag
    when the command line leaves it out (``deprecated``: its older names, still read).

    The parser must be a :class:`Parser`: it reads the variables once the command line is
    parsed, so that ``--help`` shows their names, never their values (a token).
    """
    if env is None:
        return group.add_argument(*names, **kwargs)
    default = kwargs.pop("default", None)
    action = group.add_argument(*names, default=None, **kwargs)
    action.environment = EnvironmentVariable(env, default, tuple(deprecated))  # type: ignore[attr-defined]
    return action


def _from_text(action: argparse.Action, text: str) -> Any:
    """A variable's text as the flag's value: a switch is on for 1, true, yes or on."""
    if action.nargs == 0:
        return text.strip().lower() in ("1", "true", "yes", "on")
    convert: Callable[[str], Any] | None = action.type  # type: ignore[assignment]
    return convert(text) if convert is not None else text


class Parser(argparse.ArgumentParser):
    """An argument parser whose flags added by :func:`add_flag` read their variables, whose
    help is :class:`HelpFormatter`'s and whose ``--version`` is :func:`~rpsagg.add_version_flag`'s.
    """

    environ: Mapping[str, str] | None = None  # tests pass their own mapping

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        environ = os.environ if self.environ is None else self.environ
        for action in self._actions:
            source = getattr(action, "environment", None)
            if not isinstance(source, EnvironmentVariable) or \
                    getattr(parsed, action.dest, None) is not None:
                continue
            text = source.read(environ, self.prog)
            try:
                value = source.default if text is None else _from_text(action, text)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                self.error(f"{source.name}={text!r}: {exc}")
            setattr(parsed, action.dest, value)
        return parsed, rest


def environment_variables(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """The variables a parser's flags read: ``(name, flag, help)`` each, old names after the
    new one (the environment reference is generated from these)."""
    out = []
    for action in parser._actions:
        source = getattr(action, "environment", None)
        if isinstance(source, EnvironmentVariable):
            flag = action.option_strings[-1]
            out.append((source.name, flag, action.help or ""))
            out += [(old, flag, f"deprecated: {source.name}") for old in source.deprecated]
    return out
