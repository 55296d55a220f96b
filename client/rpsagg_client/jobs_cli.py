"""``rpsagg-jobs``: create, list, show, cancel and wait for the jobs of an rpsagg server.

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
    when it was created. ``--json``: the server's answer as it is (with ``past_jobs``, the
    jobs of earlier starts of the server).
``show ID``
    One job as JSON.
``cancel ID``
    Cancel a queued or running job (``POST /api/jobs/ID/cancel``).
``wait ID [--timeout S] [--interval S]``
    Poll the job until it has ended; a line on standard error whenever its state or its
    number of done rounds changes. Exit status 0 when it is done, 1 when it failed or was
    cancelled, 3 when ``--timeout`` seconds passed first.

``--url``, ``--token``, ``--token-file`` and ``--ca`` may come before or after the command;
they default to the environment variables ``RPSAGG_URL``, ``RPSAGG_ADMIN_TOKEN``,
``RPSAGG_ADMIN_TOKEN_FILE`` and ``RPSAGG_TLS_CA`` (a flag overrides them). The token goes
as ``Authorization: Bearer TOKEN``: creating and cancelling jobs needs one of the server's
``--admin-tokens`` (unless it runs ``--insecure``); reading them may need one of its
``--http-tokens``. ``--ca``: the CA that signed the certificate of a server whose dashboard
speaks HTTPS (``--url https://...``). The token is never printed.

Exit status: 0 on success; 2 for any error (the server unreachable, an HTTP error, a bad
``KEY=VALUE``, an unreadable file), with one line ``rpsagg-jobs: ...`` on standard error
that carries the server's reason; ``wait``: 1 and 3 as above; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

PROG = "rpsagg-jobs"
DEFAULT_URL = "http://127.0.0.1:8000"
#: the states in which a job has ended
ENDED = ("done", "failed", "cancelled")
#: exit statuses (the module docstring)
EXIT_ENDED_BADLY = 1
EXIT_ERROR = 2
EXIT_TIMEOUT = 3
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


class JobsError(Exception):
    """A failure that ``rpsagg-jobs`` reports as one line and exit status 2."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed (the token would go along to wherever they point): a 3xx
    answer is an error that names where it points."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: Any, newurl: str) -> None:
        return None


class JobsApi:
    """The jobs API of an rpsagg server's HTTP port (standard library only).

    Parameters
    ----------
    url : str
        The server's HTTP base URL (``http://HOST:PORT`` or ``https://HOST:PORT``, with a
        path prefix when a proxy serves it under one); ``HOST:PORT`` means ``http://``.
    token : str, optional
        Sent as ``Authorization: Bearer <token>``.
    ca : str, optional
        PEM file of the CA for an ``https://`` URL (default: the system's roots).
    timeout : float
        Seconds each request may take.

    Raises
    ------
    JobsError
        A malformed URL or token, or an unreadable CA file.

    Examples
    --------
    >>> api = JobsApi("http://127.0.0.1:8000", token="s3cret")          # doctest: +SKIP
    >>> job = api.create({"estimator": "rand-k", "n": 10, "rounds": 5})  # doctest: +SKIP
    >>> api.wait(job["id"])["state"]                                     # doctest: +SKIP
    'done'
    """

    def __init__(self, url: str, *, token: str | None = None, ca: str | None = None,
                 timeout: float = 10.0) -> None:
        self.url = normalize_url(url)
        if token is not None:
            check_token(token, "the token")
        self._token = token
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if self.url.startswith("https://"):
            try:
                context = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:
                raise JobsError(f"--ca {ca}: {_os_reason(exc)}") from None
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    # -- the API ---------------------------------------------------------------------------
    def create(self, settings: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/jobs``: a new job with these settings; returns the job."""
        return _job(self.request("POST", "/api/jobs", settings), "POST /api/jobs")

    def jobs(self) -> dict[str, Any]:
        """``GET /api/jobs``: ``{"jobs": [...], "past_jobs": [...]}``."""
        answer = self.request("GET", "/api/jobs")
        if not isinstance(answer, dict) or not isinstance(answer.get("jobs"), list):
            raise JobsError("GET /api/jobs: the answer has no list of jobs; this server does "
                            "not host several jobs (an rpsagg-server from before them?)")
        return answer

    def get(self, job_id: str) -> dict[str, Any]:
        """``GET /api/jobs/ID``: one job."""
        path = _job_path(job_id)
        return _job(self.request("GET", path), f"GET {path}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        """``POST /api/jobs/ID/cancel``: cancel a queued or running job; returns the job."""
        path = _job_path(job_id) + "/cancel"
        return _job(self.request("POST", path), f"POST {path}")

    def wait(self, job_id: str, *, timeout: float | None = None, interval: float = 2.0,
             on_change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll ``GET /api/jobs/ID`` every ``interval`` seconds until the job has ended.

        Parameters
        ----------
        job_id : str
        timeout : float, optional
            Give up after this many seconds (None: wait as long as it takes).
        interval : float
            Seconds between two polls.
        on_change : callable, optional
            Called with the job at the first poll and whenever its state or its
            ``rounds_done`` changed.

        Returns
        -------
        dict
            The job as last seen: ended (``state`` in :data:`ENDED`), or, at the timeout,
            not.
        """
        give_up = None if timeout is None else time.monotonic() + timeout
        seen: tuple[Any, Any] | None = None
        while True:
            job = self.get(job_id)
            now = (job.get("state"), job.get("rounds_done"))
            if now != seen and on_change is not None:
                on_change(job)
            seen = now
            if job.get("state") in ENDED:
                return job
            pause = interval
            if give_up is not None:
                left = give_up - time.monotonic()
                if left <= 0:
                    return job
                pause = min(pause, left)
            time.sleep(pause)

    # -- plumbing --------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the answer's JSON.

        Raises
        ------
        JobsError
            The server unreachable, an HTTP error status (the message carries the server's
            ``detail``), or an answer that is not JSON.
        """
        what = f"{method} {path}"
        headers = {"Accept": "application/json", "User-Agent": PROG}
        data = None
        if body is not None:
            try:
                data = json.dumps(body, allow_nan=False).encode()
            except ValueError as exc:
                raise JobsError(f"{what}: the settings are not valid JSON: {exc}") from None
            headers["Content-Type"] = "application/json"
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers,
                                     method=method)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise JobsError(self._http_error(what, exc)) from None
        except urllib.error.URLError as exc:
            raise JobsError(f"{what}: cannot reach {self.url}: "
                            f"{self._reason(exc.reason)}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise JobsError(f"{what}: {self.url}: {self._reason(exc)}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise JobsError(f"{what}: the answer is not JSON; is {self.url} the server's "
                            "HTTP (dashboard) port?") from None

    def _reason(self, exc: BaseException | str) -> str:
        """Why a connection failed, in words."""
        if isinstance(exc, str):
            return exc
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (is the server running, and --url its HTTP port?)"
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout:g} s (--timeout)"
        if isinstance(exc, socket.gaierror):
            return f"unknown host ({exc.strerror})"
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (f"TLS: the server's certificate is not trusted ({exc.verify_message}); "
                    "--ca FILE names the CA that signed it")
        if isinstance(exc, ssl.SSLError):
            return f"TLS: {exc.reason or exc} (does the port speak HTTPS? if not: --url http://...)"
        if isinstance(exc, http.client.HTTPException | ConnectionResetError):
            hint = "" if self.url.startswith("https://") else " (does it speak HTTPS?)"
            return f"the answer is not HTTP: {exc.__class__.__name__}{hint}"
        return _os_reason(exc)

    def _http_error(self, what: str, exc: urllib.error.HTTPError) -> str:
        """The one line for an HTTP error status, with the server's ``detail``."""
        status = exc.code
        try:
            raw = exc.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        detail = _detail(raw) or str(exc.reason)
        if self._token:  # never printed, even where a server would echo it
            detail = detail.replace(self._token, "***")
        head = f"{what}: {status}"
        if 300 <= status < 400:
            where = exc.headers.get("Location", "") if exc.headers else ""
            return (f"{head}: the server redirects to {_safe_url(where) or '?'}; pass that "
                    "as --url (redirects are not followed: the token would go along)")
        if status in (401, 403):
            word = "unauthorized" if status == 401 else "forbidden"
            # the server's reason, unless it is only the status's name (the dashboard's)
            parts = [] if detail.lower() in (word, str(exc.reason).lower()) else [detail]
            if self._token is None:
                parts.append("no token was given (--token, --token-file, RPSAGG_ADMIN_TOKEN "
                             "or RPSAGG_ADMIN_TOKEN_FILE)")
            elif not parts and what.startswith("GET"):
                parts.append("the server does not accept this token (reading needs one of "
                             "its --http-tokens or --admin-tokens)")
            elif not parts:
                parts.append("the server does not accept this token (creating and "
                             "cancelling jobs needs one of its --admin-tokens)")
            return f"{head} {word}: {'; '.join(parts)}"
        if status == 404 and detail == "Not Found":  # the framework's: no such route
            return (f"{head} Not Found: the server has no such route (an rpsagg-server from "
                    "before jobs, or --url not its HTTP port?)")
        if status == 405:
            return f"{head} Method Not Allowed: the server does not take {what.split()[0]} here"
        if detail == str(exc.reason):
            return f"{head} {detail}"
        return f"{head} {exc.reason}: {detail}"


def normalize_url(url: str) -> str:
    """``url`` without a trailing ``/``; ``HOST:PORT`` becomes ``http://HOST:PORT``.

    Raises
    ------
    JobsError
        Not an http(s) URL with a host, or one with credentials, a query or a fragment.
    """
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    shown = _safe_url(url)
    if parts.username is not None or parts.password is not None:
        raise JobsError(f"--url {shown}: credentials in the URL are not used; pass the token "
                        "with --token-file")
    try:
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        raise JobsError(f"--url {shown}: the port is not a number in 0..65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JobsError(f"--url {shown}: expected http://HOST:PORT or https://HOST:PORT")
    if parts.query or parts.fragment:
        raise JobsError(f"--url {shown}: no query or fragment, please")
    return url.rstrip("/")


def check_token(token: str, source: str) -> None:
    """Refuse a token that cannot go in an HTTP header (never showing it).

    Raises
    ------
    JobsError
        Empty, or with whitespace, control or non-ASCII characters.
    """
    if not token:
        raise JobsError(f"{source}: the token is empty")
    if not all(33 <= ord(c) < 127 for c in token):
        raise JobsError(f"{source}: the token has whitespace, control or non-ASCII characters")


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
        raise JobsError(f"{source} {path}: {_os_reason(exc)}") from None
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
        reason = (_os_reason(exc) if isinstance(exc, OSError) else "not UTF-8 text")
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


# -- formatting ----------------------------------------------------------------------------
def fmt_bytes(b: float) -> str:
    """``123 B``, ``4.1 KiB``, ``2.0 MiB``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if b < 1024:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def fmt_rounds(job: dict[str, Any]) -> str:
    """``12/50``; ``12/-`` for a job that runs until stopped (``rounds`` 0)."""
    rounds = job.get("rounds") or 0
    return f"{job.get('rounds_done') or 0}/{rounds if rounds else '-'}"


def fmt_time(t: Any) -> str:
    """A unix time as local ``YYYY-MM-DD HH:MM:SS``; ``-`` for none."""
    if not isinstance(t, int | float) or not math.isfinite(t):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def jobs_table(jobs: Sequence[dict[str, Any]]) -> str:
    """The ``list`` table: id (``*``: the default job), state, rounds, bytes, created."""
    rows = [("ID", "STATE", "ROUNDS", "BYTES UP", "CREATED")]
    for job in jobs:
        rows.append((f"{job.get('id', '?')}{'*' if job.get('default') else ''}",
                     str(job.get("state", "?")), fmt_rounds(job),
                     fmt_bytes(job.get("bytes_up") or 0), fmt_time(job.get("created_at"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def summary(job: dict[str, Any], sent: dict[str, Any] | None = None) -> str:
    """What a job is: ``rand-k, n=10, k=102, d=1024, 50 rounds``."""
    settings = job.get("settings")
    if not isinstance(settings, dict) or not settings:
        settings = sent or {}
    parts = [str(settings["estimator"])] if settings.get("estimator") else []
    parts += [f"{key}={settings[key]}" for key in ("task", "n", "k", "d")
              if settings.get(key) not in (None, "")]
    rounds = job.get("rounds", settings.get("rounds"))
    if isinstance(rounds, int):
        parts.append(f"{rounds} rounds" if rounds else "rounds until stopped")
    return ", ".join(parts)


def progress(job: dict[str, Any]) -> str:
    """The ``wait`` line: ``job ID: running, 12/50 rounds done, 1.2 MiB up, relative error
    0.0123``."""
    parts = [str(job.get("state", "?"))]
    if job.get("state") != "queued":
        parts.append(f"{fmt_rounds(job)} rounds done")
        parts.append(f"{fmt_bytes(job.get('bytes_up') or 0)} up")
        err = job.get("last_rel_error")
        if isinstance(err, int | float) and math.isfinite(err):
            parts.append(f"relative error {err:.4g}")
    if job.get("failure"):
        parts.append(str(job["failure"]))
    return f"job {job.get('id', '?')}: {', '.join(parts)}"


def _job(answer: Any, what: str) -> dict[str, Any]:
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
        raise JobsError(f"{what}: the answer is not a job")
    return answer


def _job_path(job_id: str) -> str:
    if not job_id:
        raise JobsError("the job id is empty")
    return "/api/jobs/" + urllib.parse.quote(job_id, safe="")


def _detail(raw: bytes) -> str:
    """The server's reason, one line: a JSON body's ``detail`` (FastAPI's list of
    validation errors joined), else the body's first line."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    detail: Any = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        items = []
        for d in detail:
            if isinstance(d, dict):
                loc = ".".join(str(x) for x in d.get("loc", ()) if x != "body")
                items.append(f"{loc}: {d.get('msg', '')}" if loc else str(d.get("msg", "")))
            else:
                items.append(str(d))
        detail = "; ".join(items)
    elif detail is None:
        detail = text.splitlines()[0] if text and not text.startswith(("<", "{")) else ""
    line = " ".join(str(detail).split())
    return line if len(line) <= 300 else line[:297] + "..."


def _os_reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__


def _safe_url(url: str) -> str:
    """``url`` without credentials (never printed)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


# -- the command ---------------------------------------------------------------------------
def _connection(p: argparse.ArgumentParser, top: bool) -> None:
    """The connection flags, at the top (their defaults) and after a command (SUPPRESS:
    given there, they override the top's)."""
    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    env = os.environ.get
    p.add_argument("--url", default=default(env("RPSAGG_URL") or DEFAULT_URL),
                   help="the server's HTTP (dashboard) URL (also RPSAGG_URL; default "
                   f"{DEFAULT_URL})")
    p.add_argument("--token", default=default(None),
                   help="bearer token: an admin token to create or cancel (default "
                   "$RPSAGG_ADMIN_TOKEN)")
    p.add_argument("--token-file", default=default(None), metavar="FILE",
                   help="read the token from FILE (default $RPSAGG_ADMIN_TOKEN_FILE)")
    p.add_argument("--ca", default=default(env("RPSAGG_TLS_CA") or None), metavar="FILE",
                   help="CA of the server's certificate for an https:// URL (also "
                   "RPSAGG_TLS_CA)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _connection(p, top=True)
    p.add_argument("--timeout", dest="http_timeout", type=_positive, default=10.0,
                   metavar="S", help="seconds each request may take (default 10)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("create", help="create a job; prints its id")
    c.add_argument("--file", metavar="JSON", help="a JSON object of settings ('-': stdin)")
    c.add_argument("settings", nargs="*", metavar="KEY=VALUE",
                   help="a setting (VALUE parsed as JSON when it is, else a string)")
    lst = sub.add_parser("list", help="a table of the server's jobs")
    lst.add_argument("--json", action="store_true", help="the server's answer as JSON")
    show = sub.add_parser("show", help="one job as JSON")
    show.add_argument("id", metavar="ID")
    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("id", metavar="ID")
    w = sub.add_parser("wait", help="wait until a job has ended (exit 0: done, 1: failed or "
                       "cancelled, 3: --timeout)")
    w.add_argument("id", metavar="ID")
    w.add_argument("--timeout", dest="wait_timeout", type=_positive, default=None,
                   metavar="S", help="give up after S seconds (exit 3; default: no limit)")
    w.add_argument("--interval", type=_positive, default=2.0, metavar="S",
                   help="seconds between polls (default 2)")
    for cmd in (c, lst, show, cancel, w):
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
    """Run the parsed command; raises :class:`JobsError` for the errors of exit status 2."""
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
    elif args.command == "show":
        print(json.dumps(api.get(args.id), indent=2))
    elif args.command == "cancel":
        job = api.cancel(args.id)
        _err(f"cancelled job {job['id']} ({job.get('state', '?')}, {fmt_rounds(job)} rounds "
             "done)")
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
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `rpsagg-jobs list | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
