"""The jobs API of an rpsagg server's HTTP port, as a Python client: :class:`JobsApi`.

``rpsagg-jobs`` (:mod:`rpsagg_client.jobs_cli`) is the command over it. Standard library
only: ``urllib`` with redirects refused (the token would go along), the server's reasons
for an HTTP error status turned into one line, the token never shown.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, Any

from rpsagg.commandline import ExitStatus

#: the command's name, also the requests' ``User-Agent``
PROG = "rpsagg-jobs"
#: the states in which a job has ended
ENDED = ("done", "failed", "cancelled")


class JobsError(Exception):
    """A failure that ``rpsagg-jobs`` reports as one line, and its exit status: usage (a bad
    argument, file or setting, the server's 4xx answer to one) unless it says otherwise.

    Parameters
    ----------
    message : str
        The line (never a token).
    status : rpsagg.commandline.ExitStatus
        ``FAILURE`` for a server that cannot be reached or answers 5xx, ``CREDENTIALS`` for
        its 401 and 403.
    """

    def __init__(self, message: str, status: ExitStatus = ExitStatus.USAGE) -> None:
        super().__init__(message)
        self.status = status


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
                raise JobsError(f"--ca {ca}: {os_reason(exc)}") from None
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
                            "not host several jobs (an rpsagg-server from before them?)",
                            ExitStatus.FAILURE)
        return answer

    def get(self, job_id: str) -> dict[str, Any]:
        """``GET /api/jobs/ID``: one job."""
        path = _job_path(job_id)
        return _job(self.request("GET", path), f"GET {path}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        """``POST /api/jobs/ID/cancel``: cancel a queued or running job; returns the job."""
        path = _job_path(job_id) + "/cancel"
        return _job(self.request("POST", path), f"POST {path}")

    def remove(self, job_id: str) -> dict[str, Any]:
        """``DELETE /api/jobs/ID``: remove an ended job's data (a queued or running job is
        cancelled instead); returns the job as it was."""
        path = _job_path(job_id)
        return _job(self.request("DELETE", path), f"DELETE {path}")

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
            raise JobsError(self._http_error(what, exc), _status_of(exc.code)) from None
        except urllib.error.URLError as exc:
            raise JobsError(f"{what}: cannot reach {self.url}: "
                            f"{self._reason(exc.reason)}", ExitStatus.FAILURE) from None
        except (OSError, http.client.HTTPException) as exc:
            raise JobsError(f"{what}: {self.url}: {self._reason(exc)}",
                            ExitStatus.FAILURE) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise JobsError(f"{what}: the answer is not JSON; is {self.url} the server's "
                            "HTTP (dashboard) port?", ExitStatus.FAILURE) from None

    def _reason(self, exc: BaseException | str) -> str:
        """Why a connection failed, in words."""
        if isinstance(exc, str):
            return exc
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (is the server running, and --url its HTTP port?)"
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout:g} s (--request-timeout)"
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
        return os_reason(exc)

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


def _status_of(http_status: int) -> ExitStatus:
    """The exit status of an HTTP error status: the request as given is wrong (4xx, a
    redirect: usage), the credentials (401, 403), or the server failed (5xx)."""
    if http_status in (401, 403):
        return ExitStatus.CREDENTIALS
    return ExitStatus.FAILURE if http_status >= 500 else ExitStatus.USAGE


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


def _job(answer: Any, what: str) -> dict[str, Any]:
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
        raise JobsError(f"{what}: the answer is not a job", ExitStatus.FAILURE)
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


def os_reason(exc: BaseException) -> str:
    """Why an operating-system call failed, in words (its ``strerror``, else the message)."""
    return getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__


def _safe_url(url: str) -> str:
    """``url`` without credentials (never printed)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))
