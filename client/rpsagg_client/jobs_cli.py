"""``rpsagg-jobs``: create, list, show, cancel, remove and wait for the jobs of an rpsagg
server.

A server hosts several jobs at once; this command manages them over the server's HTTP API
(the dashboard's port, ``http://127.0.0.1:8000`` by default)::

    JOB=$(rpsagg-jobs create estimator=rand-k n=10 k=102 d=1024 rounds=50 eval=true)
    rpsagg-client --job "$JOB" ...          # on each of the 10 clients
    rpsagg-jobs wait "$JOB" && rpsagg-jobs show "$JOB"

Commands
--------
``create [--file JSON|-] [KEY=VALUE ...]``
    ``POST /api/jobs`` with the job's settings: the server flags' names in snake case
    (``estimator``, ``n``, ``k``, ``d``, ``transform``, ``task``, ``data``, ``rounds``,
    ``round_timeout``, ``min_clients``, ``value_bits``, ``bits``, ``eval``, ``seed``,
    ``block_size``, ...; ``round-timeout`` is taken for ``round_timeout``). ``--file`` reads a
    JSON object of settings (``-``: standard input); each ``KEY=VALUE`` sets one on top of
    it, the value parsed as JSON when it is JSON (``n=10``, ``eval=true``, ``seed=null``)
    and else taken as a string (``estimator=rand-k``, ``data=fashion-mnist``). Prints the
    new job's id on standard output (only the id: ``JOB=$(rpsagg-jobs create ...)``) and a
    one-line summary on standard error.
``list [--json]``
    A table of the server's jobs: id (``*`` marks the default job, the one the server's
    flags started), state, rounds done of all (``-``: until stopped), wire bytes received,
    when it was created; then a line on standard error saying what the server keeps of the
    ended jobs (how many, their bytes, its ``--keep-finished-jobs`` and
    ``--keep-finished-for``). ``--json``: the server's answer as it is (with ``past_jobs``,
    the jobs of earlier starts of the server, and ``retention``).
``show ID``
    One job as JSON.
``cancel ID``
    Cancel a queued or running job (``POST /api/jobs/ID/cancel``).
``remove ID``
    Remove an ended job: its rounds and its row (``DELETE /api/jobs/ID``); a queued or
    running job is refused (exit 2): cancel it first.
``wait ID [--timeout S] [--interval S]``
    Poll the job until it has ended; a line on standard error whenever its state or its
    number of done rounds changes. Exit status 0 when it is done, 1 when it failed or was
    cancelled, 5 when ``--timeout`` seconds passed first.

``--url``, ``--token``, ``--token-file``, ``--ca`` and ``--request-timeout`` (the seconds each
HTTP request may take) may come before or after the command;
they default to the environment variables ``RPSAGG_URL``, ``RPSAGG_ADMIN_TOKEN``,
``RPSAGG_ADMIN_TOKEN_FILE`` and ``RPSAGG_TLS_CA`` (a flag overrides them). The token goes
as ``Authorization: Bearer TOKEN``: creating, cancelling and removing jobs needs one of the server's
``--admin-tokens`` (unless it runs ``--insecure``); reading them may need one of its
``--http-tokens``. ``--ca``: the CA that signed the certificate of a server whose dashboard
speaks HTTPS (``--url https://...``). The token is never printed.

Exit statuses (:class:`rpsagg.commandline.ExitStatus`, as every rpsagg command), each with one
line ``rpsagg-jobs: ...`` on standard error that carries the server's reason: 0 on success;
1 when the server cannot be reached or fails (5xx); 2 for a bad argument, ``KEY=VALUE``,
file or setting (the server's 4xx answer to it included); 4 when the server refuses the
token (401, 403); ``wait``: 1 and 5 as above; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpsagg import add_version_flag
from rpsagg.commandline import ExitStatus, Parser, add_flag, exit_statuses
from rpsagg_client.jobs_api import (
    ENDED,
    PROG,
    JobsApi,
    JobsError,
    check_token,
    normalize_url,
    os_reason,
)
from rpsagg_client.jobs_text import (
    fmt_bytes,
    fmt_rounds,
    fmt_time,
    jobs_table,
    progress,
    retention_line,
    summary,
)

DEFAULT_URL = "http://127.0.0.1:8000"
#: exit statuses (the module docstring); an error's own is :attr:`JobsError.status`
EXIT_ENDED_BADLY = ExitStatus.FAILURE
EXIT_ERROR = ExitStatus.USAGE
EXIT_TIMEOUT = ExitStatus.TIMEOUT
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def read_token_file(path: str, source: str) -> str:
    """The token of a file: its one non-blank line that does not start with ``#``.

    Raises
    ------
    JobsError
        Unreadable, not UTF-8, or not exactly one token (the message never shows the text).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise JobsError(f"{source} {path}: {os_reason(exc)}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobsError(f"{source} {path}: not UTF-8 text (an invalid byte at offset "
                        f"{exc.start})") from None
    lines = [line.strip() for line in text.splitlines()]
    tokens = [line for line in lines if line and not line.startswith("#")]
    if len(tokens) != 1 or len(tokens[0].split()) != 1:
        raise JobsError(f"{source} {path}: expected one token (one line); found "
                        f"{len(tokens)} lines")
    check_token(tokens[0], f"{source} {path}")
    return tokens[0]


def parse_settings(items: Sequence[str], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``KEY=VALUE`` items on top of ``base``: each value parsed as JSON when it is JSON
    (``10``, ``true``, ``null``, ``[1, 2]``), else taken as a string; ``-`` in a key
    becomes ``_``.

    Raises
    ------
    JobsError
        An item without ``=`` or with a key that is not a name.
    """
    settings = dict(base or {})
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _KEY.match(key):
            raise JobsError(f"bad setting {item!r}: expected KEY=VALUE (e.g. n=10, "
                            "estimator=rand-k)")
        settings[key.replace("-", "_")] = _value(value)
    return settings


def _value(text: str) -> Any:
    """JSON when it is (without NaN and infinities), else the string itself."""
    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return text


def read_settings_file(path: str) -> dict[str, Any]:
    """A JSON object of settings from ``path`` (``-``: standard input).

    Raises
    ------
    JobsError
        Unreadable, not JSON, or not an object.
    """
    name = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = (os_reason(exc) if isinstance(exc, OSError) else "not UTF-8 text")
        raise JobsError(f"--file {name}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JobsError(f"--file {name}: not JSON (line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg})") from None
    if not isinstance(data, dict):
        raise JobsError(f"--file {name}: expected a JSON object of settings; got "
                        f"{type(data).__name__}")
    return data


# -- the command ---------------------------------------------------------------------------
DESCRIPTION = """\
Create, list, show, cancel, remove and wait for the jobs of an rpsagg server, over its HTTP
API (the dashboard's port). The connection flags may come before or after the command.

  JOB=$(rpsagg-jobs create estimator=rand-k n=10 k=102 d=1024 rounds=50 eval=true)
  rpsagg-client --job "$JOB" ...          # on each of the 10 clients
  rpsagg-jobs wait "$JOB" && rpsagg-jobs show "$JOB"
"""
_NOTES = {ExitStatus.FAILURE: "also: wait's job failed or was cancelled",
          ExitStatus.USAGE: "the server's 4xx answer included: an unknown job, a refused "
          "setting",
          ExitStatus.CREDENTIALS: "401, 403: --token is not one of the server's "
          "--admin-tokens or --http-tokens",
          ExitStatus.TIMEOUT: "wait --timeout"}
#: each command: its one-line help, and the example its own --help shows
_COMMANDS = {
    "create": ("create a job; prints its id (only the id, on standard output)",
               "rpsagg-jobs create estimator=rand-k n=10 k=102 d=1024 rounds=50 eval=true\n"
               "  rpsagg-jobs create --file job.json rounds=5"),
    "list": ("a table of the server's jobs, then what it keeps of the ended ones",
             "rpsagg-jobs list --url https://a.example.org:8000 --ca ca.pem"),
    "show": ("one job as JSON", "rpsagg-jobs show j3"),
    "cancel": ("cancel a queued or running job", "rpsagg-jobs cancel j3"),
    "remove": ("remove an ended job's rounds and row (a running job: cancel it first)",
               "rpsagg-jobs remove j3"),
    "wait": ("wait until a job has ended (exit 0: done, 1: failed or cancelled, 5: "
             "--timeout)", "rpsagg-jobs wait j3 --timeout 3600 --interval 5"),
}


def _connection(p: argparse.ArgumentParser, top: bool) -> None:
    """The connection flags, at the top (their defaults) and after a command (SUPPRESS:
    given there, they override the top's)."""
    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group(
        "the server", "e.g. --url https://a.example.org:8000 --ca ca.pem --token-file "
        "admin.token")
    def env(name: str) -> str | None:  # read once, at the top
        return name if top else None

    add_flag(g, "--url", env=env("RPSAGG_URL"), default=default(DEFAULT_URL),
             help="the server's HTTP (dashboard) URL")
    add_flag(g, "--token", default=default(None), metavar="TOKEN",
             help="bearer token: one of the server's --admin-tokens to create, cancel or "
             "remove; one of its --http-tokens may do to read (default: $RPSAGG_ADMIN_TOKEN, "
             "else the file $RPSAGG_ADMIN_TOKEN_FILE names)")
    add_flag(g, "--token-file", default=default(None), metavar="FILE",
             help="read the token from FILE")
    add_flag(g, "--ca", env=env("RPSAGG_TLS_CA"), default=default(None),
             metavar="FILE", help="PEM CA of the server's certificate, for an https:// URL")
    add_flag(g, "--request-timeout", dest="http_timeout", type=_positive,
             default=default(10.0), metavar="S", help="seconds each HTTP request may take")
    if top:  # its older name: the same flag, as wait's --timeout is another
        g.add_argument("--timeout", dest="old_http_timeout", type=_positive, default=None,
                       help=argparse.SUPPRESS)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    statuses = exit_statuses(ExitStatus.CREDENTIALS, ExitStatus.TIMEOUT,
                             ExitStatus.INTERRUPTED, notes=_NOTES)
    p = Parser(prog=PROG, description=DESCRIPTION, epilog=statuses)
    add_version_flag(p)
    _connection(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands", description="e.g. rpsagg-jobs wait j3 (each "
                           "command's --help shows its own example)")
    cmds = {name: sub.add_parser(name, help=short, description=f"{short}\n\n  {example}\n",
                                 epilog=statuses)
            for name, (short, example) in _COMMANDS.items()}
    c = cmds["create"].add_argument_group(
        "the job's settings", "the server flags' names in snake case (estimator, n, k, d, "
        "transform, task, data, rounds, round_timeout, value_bits, eval, seed, ...); "
        "e.g. n=10 eval=true estimator=rand-k")
    c.add_argument("--file", metavar="JSON", help="a JSON object of settings ('-': standard "
                   "input); each KEY=VALUE sets one on top of it")
    c.add_argument("settings", nargs="*", metavar="KEY=VALUE",
                   help="a setting: VALUE parsed as JSON when it is (n=10, eval=true, "
                   "seed=null), else a string (estimator=rand-k)")
    shown = cmds["list"].add_argument_group("output", "e.g. --json | jq -r '.jobs[].id'")
    shown.add_argument("--json", action="store_true",
                       help="the server's answer as JSON (with past_jobs and retention)")
    for name in ("show", "cancel", "remove", "wait"):
        cmds[name].add_argument("id", metavar="ID", help="the job's id")
    w = cmds["wait"].add_argument_group("waiting", "e.g. --timeout 3600 --interval 5")
    w.add_argument("--timeout", dest="wait_timeout", type=_positive, default=None,
                   metavar="S", help="give up after S seconds (exit 5; default: no limit)")
    w.add_argument("--interval", type=_positive, default=2.0, metavar="S",
                   help="seconds between polls")
    for cmd in cmds.values():
        _connection(cmd, top=False)
    return p


def _token(args: argparse.Namespace) -> str | None:
    """The token: --token, --token-file, $RPSAGG_ADMIN_TOKEN, $RPSAGG_ADMIN_TOKEN_FILE."""
    if args.token is not None and args.token_file is not None:
        raise JobsError("give --token or --token-file, not both")
    if args.token is not None:
        check_token(args.token, "--token")
        return str(args.token)
    if args.token_file is not None:
        return read_token_file(args.token_file, "--token-file")
    if os.environ.get("RPSAGG_ADMIN_TOKEN"):
        token = os.environ["RPSAGG_ADMIN_TOKEN"]
        check_token(token, "RPSAGG_ADMIN_TOKEN")
        return token
    if os.environ.get("RPSAGG_ADMIN_TOKEN_FILE"):
        return read_token_file(os.environ["RPSAGG_ADMIN_TOKEN_FILE"], "RPSAGG_ADMIN_TOKEN_FILE")
    return None


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; raises :class:`JobsError` for its errors (with their exit
    status)."""
    if getattr(args, "old_http_timeout", None) is not None:
        _err("--timeout before the command is deprecated; use --request-timeout (wait's own "
             "--timeout is how long to wait)")
        if args.http_timeout == 10.0:
            args.http_timeout = args.old_http_timeout
    api = JobsApi(args.url, token=_token(args), ca=args.ca, timeout=args.http_timeout)
    if args.command == "create":
        base = read_settings_file(args.file) if args.file else None
        settings = parse_settings(args.settings, base)
        job = api.create(settings)
        print(job["id"], flush=True)
        what = summary(job, settings)
        _err(f"created job {job['id']} ({job.get('state', '?')}){': ' + what if what else ''}")
    elif args.command == "list":
        answer = api.jobs()
        if args.json:
            print(json.dumps(answer, indent=2))
            return 0
        jobs = [j for j in answer["jobs"] if isinstance(j, dict)]
        if jobs:
            print(jobs_table(jobs), flush=True)
        else:
            _err("no jobs")
        past = answer.get("past_jobs")
        if isinstance(past, list) and past:
            _err(f"{len(past)} past job{'s' if len(past) != 1 else ''} of earlier starts of "
                 "the server (--json lists them)")
        kept = answer.get("retention")
        if isinstance(kept, dict):
            _err(retention_line(kept))
    elif args.command == "show":
        print(json.dumps(api.get(args.id), indent=2))
    elif args.command == "cancel":
        job = api.cancel(args.id)
        _err(f"cancelled job {job['id']} ({job.get('state', '?')}, {fmt_rounds(job)} rounds "
             "done)")
    elif args.command == "remove":
        state = api.get(args.id).get("state")
        if state not in ENDED:  # DELETE would cancel it: not what remove says
            raise JobsError(f"job {args.id} is {state}: only an ended job is removed (cancel "
                            "it first: rpsagg-jobs cancel ID)")
        job = api.remove(args.id)
        _err(f"removed job {job['id']} ({job.get('state', '?')}, {fmt_rounds(job)} rounds "
             "done): its rounds and its row")
    elif args.command == "wait":
        start = time.monotonic()
        job = api.wait(args.id, timeout=args.wait_timeout, interval=args.interval,
                       on_change=lambda j: _err(progress(j)))
        state = job.get("state")
        if state == "done":
            return 0
        if state in ENDED:
            return EXIT_ENDED_BADLY
        _err(f"job {job['id']} is still {state} after {time.monotonic() - start:.0f} s "
             f"({fmt_rounds(job)} rounds done); giving up (--timeout)")
        return EXIT_TIMEOUT
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpsagg-jobs``; returns the exit status (the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except JobsError as exc:
        _err(str(exc))
        return exc.status
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:  # e.g. `rpsagg-jobs list | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# re-exported: the API client (jobs_api) and the formatting (jobs_text) are importable here too
__all__ = ["DEFAULT_URL", "ENDED", "EXIT_ENDED_BADLY", "EXIT_ERROR", "EXIT_TIMEOUT", "PROG",
           "JobsApi", "JobsError", "check_token", "fmt_bytes", "fmt_rounds", "fmt_time",
           "jobs_table", "main", "normalize_url", "parse_settings", "progress",
           "read_settings_file", "read_token_file", "run", "summary"]

if __name__ == "__main__":
    raise SystemExit(main())
