"""``rpsagg-jobs``: the requests it makes, its output, exit statuses and error lines.

The server is a stand-in for the jobs API (a ``ThreadingHTTPServer`` on 127.0.0.1 that
records each request and answers what the test says): these tests check the command's side
of the API (request formation, argument parsing, exit codes, messages), not the server.
"""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rpsagg_client.jobs_cli import main

pytestmark = pytest.mark.service

TOKEN = "s3cret-Admin-t0ken"


@dataclass
class Seen:
    """One request as the stand-in received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]]


@dataclass
class FakeApi:
    """Records requests; ``answer`` says what to reply (status, JSON or bytes, headers)."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    answer: Callable[[Seen], Answer] = lambda s: (404, {"detail": "Not Found"})


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                    body)
        api: FakeApi = self.server.api
        api.seen.append(seen)
        status, payload, *extra = api.answer(seen)
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for key, value in (extra[0] if extra else {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, *args: Any) -> None:
        pass


def _serve(api: FakeApi, context: ssl.SSLContext | None = None) -> Iterator[FakeApi]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.api = api  # type: ignore[attr-defined]
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    scheme = "https" if context is not None else "http"
    api.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No defaults from the environment of the test run (and no proxy in between)."""
    for name in ("RPSAGG_URL", "RPSAGG_ADMIN_TOKEN", "RPSAGG_ADMIN_TOKEN_FILE",
                 "RPSAGG_TLS_CA", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                 "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    yield from _serve(FakeApi())


def job(job_id: str = "j1", state: str = "running", **fields: Any) -> dict[str, Any]:
    """A JOB as the API describes it."""
    out: dict[str, Any] = {
        "id": job_id, "state": state, "default": False,
        "settings": {"estimator": "rand-k", "n": 10, "k": 102, "d": 1024, "rounds": 3},
        "rounds": 3, "rounds_done": 0, "bytes_up": 0, "payload_bytes": 0,
        "created_at": 1_750_000_000.0, "started_at": None, "finished_at": None,
        "failure": "", "last_rel_error": None, "clients": 0,
    }
    out.update(fields)
    return out


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``rpsagg-jobs ARGV`` in this process: (exit status, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rpsagg-jobs: "), err
    return lines[0]


# -- create --------------------------------------------------------------------------------
def test_create_posts_the_settings_and_prints_only_the_id(
        api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    api.answer = lambda s: (201, job("j-42", "queued", settings=s.json(), rounds=50))
    token_file = tmp_path / "admin.token"
    token_file.write_text(f"# the admin token\n\n  {TOKEN}\n")
    rc, out, err = cli(capsys, "--url", api.url, "--token-file", str(token_file), "create",
                       "estimator=rand-k", "n=10", "eval=true", "round-timeout=2.5",
                       "data=synthetic:r=2.0", "seed=null", "mean_vectors=[1, 2]",
                       "name=NaN", "rounds=50", "empty=")
    assert rc == 0, err
    assert out == "j-42\n"  # only the id: JOB=$(rpsagg-jobs create ...)
    (seen,) = api.seen
    assert (seen.method, seen.path) == ("POST", "/api/jobs")
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.json() == {
        "estimator": "rand-k", "n": 10, "eval": True, "round_timeout": 2.5,
        "data": "synthetic:r=2.0", "seed": None, "mean_vectors": [1, 2], "name": "NaN",
        "rounds": 50, "empty": "",
    }
    assert one_error_line(err) == \
        "rpsagg-jobs: created job j-42 (queued): rand-k, n=10, 50 rounds"
    assert TOKEN not in out + err


def test_create_reads_a_settings_file_or_stdin_under_the_key_values(
        api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    api.answer = lambda s: (201, job("j2", "running"))
    settings = tmp_path / "job.json"
    settings.write_text(json.dumps({"estimator": "rand-proj-spatial", "n": 5, "k": 3}))
    rc, out, _ = cli(capsys, "--url", api.url, "create", "--file", str(settings), "k=4")
    assert (rc, out) == (0, "j2\n")
    assert api.seen[-1].json() == {"estimator": "rand-proj-spatial", "n": 5, "k": 4}
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"d": 16, "transform": "auto"}'))
    rc, out, _ = cli(capsys, "create", "--file", "-", "--url", api.url)  # flags after too
    assert (rc, out) == (0, "j2\n")
    assert api.seen[-1].json() == {"d": 16, "transform": "auto"}
    assert "authorization" not in api.seen[-1].headers  # no token given: none sent


@pytest.mark.parametrize("status, detail, line", [
    (400, {"detail": "n must be >= 1; got 0"},
     "rpsagg-jobs: POST /api/jobs: 400 Bad Request: n must be >= 1; got 0"),
    (422, {"detail": [{"loc": ["body", "n"], "msg": "Input should be a valid integer",
                       "type": "int_parsing"}]},
     "rpsagg-jobs: POST /api/jobs: 422 Unprocessable Entity: n: Input should be a valid "
     "integer"),
    (500, b"Internal Server Error\nTraceback ...", "rpsagg-jobs: POST /api/jobs: 500 Internal "
     "Server Error"),
    (201, b"<html>dashboard</html>", "rpsagg-jobs: POST /api/jobs: the answer is not JSON; "
     "is {url} the server's HTTP (dashboard) port?"),
])
def test_a_refused_create_is_one_line_with_the_servers_reason(
        api: FakeApi, capsys: pytest.CaptureFixture[str], status: int, detail: Any,
        line: str) -> None:
    api.answer = lambda s: (status, detail)
    rc, out, err = cli(capsys, "--url", api.url, "create", "n=0")
    # a refused setting is usage (2); a failing server, or not the server, a failure (1)
    assert (rc, out) == (2 if 400 <= status < 500 else 1, "")
    assert one_error_line(err) == line.format(url=api.url)


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "bad.json").write_text('{"n": 1,}')
    (tmp / "two.token").write_text("a\nb\n")
    (tmp / "ok.token").write_text("tok\n")
    missing = str(tmp / "missing.json")
    return [
        (["create", "n"], "bad setting 'n': expected KEY=VALUE"),
        (["create", "=5"], "bad setting '=5': expected KEY=VALUE"),
        (["create", "n k=5"], "bad setting 'n k=5'"),
        (["create", "--file", missing], f"--file {missing}: No such file or directory"),
        (["create", "--file", str(tmp / "bad.json")], "not JSON (line 1, column 9"),
        (["create", "--file", str(tmp / "list.json")],
         "expected a JSON object of settings; got list"),
        (["--token-file", missing, "list"], f"--token-file {missing}: No such file"),
        (["--token-file", str(tmp / "two.token"), "list"], "expected one token (one line)"),
        (["--token", "x", "list", "--token-file", str(tmp / "ok.token")],
         "give --token or --token-file, not both"),
        (["--token", "has space", "list"], "--token: the token has whitespace"),
        (["--url", "ftp://host/", "list"], "--url ftp://host/: expected http://HOST:PORT"),
        (["--url", "http://host:99999", "list"], "the port is not a number"),
        (["--url", "http://admin:pw@host:80", "list"],
         "--url http://host:80: credentials in the URL are not used"),
        (["show", ""], "the job id is empty"),
    ]


def test_bad_input_is_one_line_exit_2_and_nothing_is_sent(
        api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv, message in _bad_inputs(tmp_path):
        rc, out, err = cli(capsys, "--url", api.url, *argv)
        assert (rc, out) == (2, ""), argv
        assert message in one_error_line(err), (argv, err)
        assert "pw" not in err and "has space" not in err
    assert api.seen == []


def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["wait", "j1", "--interval", "0"], ["wait"], ["frobnicate"], []):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "usage: rpsagg-jobs" in capsys.readouterr().err


# -- list, show, cancel --------------------------------------------------------------------
def test_list_prints_a_table_or_the_json(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    created = 1_750_000_000.0
    answer = {"jobs": [job("default", "running", default=True, rounds=50, rounds_done=12,
                           bytes_up=1536, created_at=created),
                       job("j-2", "queued", rounds=0, created_at=None)],
              "past_jobs": [{"file": "rpsagg-20250101.db", "state": "done"}]}
    api.answer = lambda s: (200, answer)
    rc, out, err = cli(capsys, "--url", api.url, "list")
    assert rc == 0, err
    header, first, second = out.splitlines()
    assert header.split() == ["ID", "STATE", "ROUNDS", "BYTES", "UP", "CREATED"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
    assert first.split() == ["default*", "running", "12/50", "1.5", "KiB", *when.split()]
    assert second.split() == ["j-2", "queued", "0/-", "0", "B", "-"]
    assert header.index("STATE") == first.index("running") == second.index("queued")
    assert one_error_line(err) == ("rpsagg-jobs: 1 past job of earlier starts of the server "
                                   "(--json lists them)")
    assert [(s.method, s.path) for s in api.seen] == [("GET", "/api/jobs")]
    rc, out, err = cli(capsys, "list", "--json", "--url", api.url)
    assert (rc, err) == (0, "")
    assert json.loads(out) == answer


def test_list_says_what_the_server_keeps_of_ended_jobs(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    oldest = 1_750_000_000.0
    kept = {"keep_finished_jobs": 1000, "keep_finished_for": 90 * 86400.0, "ended_jobs": 12,
            "ended_bytes": 700_416, "oldest_finished_at": oldest}
    api.answer = lambda s: (200, {"jobs": [job("j1", "done")], "past_jobs": [],
                                  "retention": kept})
    rc, out, err = cli(capsys, "--url", api.url, "list")
    assert rc == 0 and out.splitlines()[1].split()[:2] == ["j1", "done"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(oldest))
    assert one_error_line(err) == (f"rpsagg-jobs: 12 ended jobs kept (684.0 KiB), the oldest "
                                   f"ended {when}; the server keeps the last 1000 for 90 days")
    api.answer = lambda s: (200, {"jobs": [job("j1", "done")], "past_jobs": [], "retention": {
        **kept, "keep_finished_for": 0, "ended_jobs": 1, "ended_bytes": 0,
        "oldest_finished_at": None}})
    rc, out, err = cli(capsys, "--url", api.url, "list")
    assert one_error_line(err) == ("rpsagg-jobs: 1 ended job kept (0 B); the server keeps the "
                                   "last 1000")


def test_list_of_a_server_without_jobs(api: FakeApi,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (200, {"jobs": [], "past_jobs": []})
    assert cli(capsys, "--url", api.url, "list") == (0, "", "rpsagg-jobs: no jobs\n")
    api.answer = lambda s: (200, {"past_jobs": []})  # a server from before jobs
    rc, out, err = cli(capsys, "--url", api.url, "list")
    assert (rc, out) == (1, "")
    assert "does not host several jobs" in one_error_line(err)


def test_show_prints_the_job_and_quotes_its_id(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (200, job("a b/c"))
    rc, out, err = cli(capsys, "--url", api.url + "/", "show", "a b/c")
    assert (rc, err) == (0, "")
    assert json.loads(out) == job("a b/c")
    assert api.seen[0].path == "/api/jobs/a%20b%2Fc"
    api.answer = lambda s: (404, {"detail": "no job 'nope'"})
    rc, out, err = cli(capsys, "--url", api.url, "show", "nope")
    assert (rc, out) == (2, "")
    assert one_error_line(err) == "rpsagg-jobs: GET /api/jobs/nope: 404 Not Found: no job 'nope'"
    api.answer = lambda s: (404, {"detail": "Not Found"})  # the framework's: no such route
    rc, out, err = cli(capsys, "--url", api.url, "show", "nope")
    assert "the server has no such route" in one_error_line(err)


def test_cancel_posts_to_the_jobs_cancel_route(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (200, job("j1", "cancelled", rounds_done=2, rounds=10))
    rc, out, err = cli(capsys, "--url", api.url, "--token", TOKEN, "cancel", "j1")
    assert (rc, out) == (0, "")
    assert one_error_line(err) == "rpsagg-jobs: cancelled job j1 (cancelled, 2/10 rounds done)"
    (seen,) = api.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/api/jobs/j1/cancel", b"")
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    api.answer = lambda s: (409, {"detail": "job j1 has already ended (done)"})
    rc, out, err = cli(capsys, "--url", api.url, "--token", TOKEN, "cancel", "j1")
    assert (rc, out) == (2, "")
    assert one_error_line(err) == ("rpsagg-jobs: POST /api/jobs/j1/cancel: 409 Conflict: "
                                   "job j1 has already ended (done)")


def test_remove_deletes_an_ended_job_and_refuses_a_running_one(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (200, job("j1", "done", rounds_done=10, rounds=10))
    rc, out, err = cli(capsys, "--url", api.url, "--token", TOKEN, "remove", "j1")
    assert (rc, out) == (0, "")
    assert one_error_line(err) == ("rpsagg-jobs: removed job j1 (done, 10/10 rounds done): its "
                                   "rounds and its row")
    assert [(s.method, s.path, s.body) for s in api.seen] == [
        ("GET", "/api/jobs/j1", b""), ("DELETE", "/api/jobs/j1", b"")]
    assert api.seen[1].headers["authorization"] == f"Bearer {TOKEN}"
    api.seen.clear()
    api.answer = lambda s: (200, job("j2", "running"))  # a DELETE would cancel it
    rc, out, err = cli(capsys, "--url", api.url, "--token", TOKEN, "remove", "j2")
    assert (rc, out) == (2, "")
    assert one_error_line(err) == ("rpsagg-jobs: job j2 is running: only an ended job is "
                                   "removed (cancel it first: rpsagg-jobs cancel ID)")
    assert [s.method for s in api.seen] == ["GET"]


# -- wait ----------------------------------------------------------------------------------
def _script(*jobs: dict[str, Any]) -> Callable[[Seen], Answer]:
    """Answer the i-th GET with the i-th job (the last one from then on)."""
    calls = iter(range(1 << 30))

    def answer(seen: Seen) -> Answer:
        assert (seen.method, seen.path) == ("GET", "/api/jobs/j1")
        return 200, jobs[min(next(calls), len(jobs) - 1)]
    return answer


def test_wait_reports_each_change_and_exits_0_when_done(
        api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = _script(job(state="queued"), job(state="queued"), job(), job(),
                         job(rounds_done=1, bytes_up=2048, last_rel_error=0.5),
                         job(rounds_done=1, bytes_up=2048, last_rel_error=0.5),
                         job(state="done", rounds_done=3, bytes_up=6144,
                             last_rel_error=0.0123456))
    rc, out, err = cli(capsys, "--url", api.url, "wait", "j1", "--interval", "0.01")
    assert (rc, out) == (0, "")
    assert err.splitlines() == [
        "rpsagg-jobs: job j1: queued",
        "rpsagg-jobs: job j1: running, 0/3 rounds done, 0 B up",
        "rpsagg-jobs: job j1: running, 1/3 rounds done, 2.0 KiB up, relative error 0.5",
        "rpsagg-jobs: job j1: done, 3/3 rounds done, 6.0 KiB up, relative error 0.01235",
    ]
    assert len(api.seen) == 7


@pytest.mark.parametrize("state, failure", [("failed", "3 rounds failed in a row"),
                                            ("cancelled", "")])
def test_wait_exits_1_when_the_job_failed_or_was_cancelled(
        api: FakeApi, capsys: pytest.CaptureFixture[str], state: str, failure: str) -> None:
    api.answer = _script(job(), job(state=state, rounds_done=1, failure=failure))
    rc, out, err = cli(capsys, "--url", api.url, "wait", "j1", "--interval", "0.01")
    assert (rc, out) == (1, "")
    last = err.splitlines()[-1]
    assert last.startswith(f"rpsagg-jobs: job j1: {state}, 1/3 rounds done")
    assert last.endswith(failure)


def test_wait_exits_5_at_its_timeout(api: FakeApi,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = _script(job(rounds_done=2))
    start = time.monotonic()
    rc, out, err = cli(capsys, "--url", api.url, "wait", "j1", "--timeout", "0.3",
                       "--interval", "0.05")
    assert time.monotonic() - start < 5
    assert (rc, out) == (5, "")
    lines = err.splitlines()
    assert lines[0] == "rpsagg-jobs: job j1: running, 2/3 rounds done, 0 B up"
    assert lines[-1].startswith("rpsagg-jobs: job j1 is still running after ")
    assert lines[-1].endswith("(2/3 rounds done); giving up (--timeout)")
    assert len(lines) == 2 and len(api.seen) >= 3


def test_wait_of_an_unknown_job_is_an_error(api: FakeApi,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (404, {"detail": "no job 'j9'"})
    rc, _, err = cli(capsys, "--url", api.url, "wait", "j9")
    assert rc == 2 and "404 Not Found: no job 'j9'" in one_error_line(err)


# -- tokens and connections ----------------------------------------------------------------
def test_tokens_from_the_environment_and_refusals_name_the_problem(
        api: FakeApi, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refusals(argv: list[str], answers: list[Answer]) -> list[str]:
        lines = []
        for answer in answers:
            api.answer = lambda s, a=answer: a  # type: ignore[misc]
            rc, out, err = cli(capsys, "--url", api.url, *argv)
            assert (rc, out) == (4, "")  # the credentials refused
            lines.append(one_error_line(err).removeprefix("rpsagg-jobs: "))
        return lines

    no_token = ("no token was given (--token, --token-file, RPSAGG_ADMIN_TOKEN or "
                "RPSAGG_ADMIN_TOKEN_FILE)")
    assert refusals(["list"], [
        (401, {"detail": "unauthorized"}, {"WWW-Authenticate": "Bearer"}),
        (403, {"detail": "creating and cancelling jobs needs --admin-tokens on the server "
                         "(or --insecure)"}),
    ]) == [
        f"GET /api/jobs: 401 unauthorized: {no_token}",
        "GET /api/jobs: 403 forbidden: creating and cancelling jobs needs --admin-tokens on the"
        f" server (or --insecure); {no_token}",
    ]
    monkeypatch.setenv("RPSAGG_ADMIN_TOKEN", TOKEN)
    assert refusals(["create", "n=3"], [
        (403, {"detail": "not an admin token"}),
        (403, {"detail": "forbidden"}),
        (403, {"detail": f"forbidden: you sent {TOKEN}"}),  # never printed, even echoed
    ]) == [
        "POST /api/jobs: 403 forbidden: not an admin token",
        "POST /api/jobs: 403 forbidden: the server does not accept this token (creating and "
        "cancelling jobs needs one of its --admin-tokens)",
        "POST /api/jobs: 403 forbidden: forbidden: you sent ***",
    ]
    assert api.seen[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert refusals(["show", "j1"], [(403, {"detail": "forbidden"})]) == [
        "GET /api/jobs/j1: 403 forbidden: the server does not accept this token (reading "
        "needs one of its --http-tokens or --admin-tokens)"]

    # the flag overrides the environment; the token file of the environment comes last
    api.answer = lambda s: (200, job())
    assert cli(capsys, "--url", api.url, "--token", "flag-token", "show", "j1")[0] == 0
    assert api.seen[-1].headers["authorization"] == "Bearer flag-token"
    monkeypatch.delenv("RPSAGG_ADMIN_TOKEN")
    (tmp_path / "t").write_text("file-token\n")
    monkeypatch.setenv("RPSAGG_ADMIN_TOKEN_FILE", str(tmp_path / "t"))
    assert cli(capsys, "--url", api.url, "show", "j1")[0] == 0
    assert api.seen[-1].headers["authorization"] == "Bearer file-token"


def test_the_url_comes_from_rpsagg_url_and_may_lack_the_scheme(
        api: FakeApi, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    api.answer = lambda s: (200, job())
    monkeypatch.setenv("RPSAGG_URL", api.url.removeprefix("http://"))
    rc, out, _ = cli(capsys, "show", "j1")
    assert rc == 0 and json.loads(out)["id"] == "j1"


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc, out, err = cli(capsys, "--url", f"http://127.0.0.1:{port}", "--token", TOKEN, "list")
    assert (rc, out) == (1, "")
    assert one_error_line(err) == (
        f"rpsagg-jobs: GET /api/jobs: cannot reach http://127.0.0.1:{port}: connection "
        "refused (is the server running, and --url its HTTP port?)")


def test_a_redirect_is_not_followed(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = lambda s: (307, {}, {"Location": "http://user:pw@elsewhere:1/api/jobs"})
    rc, _, err = cli(capsys, "--url", api.url, "--token", TOKEN, "create", "n=1")
    assert rc == 2
    assert one_error_line(err).startswith(
        "rpsagg-jobs: POST /api/jobs: 307: the server redirects to "
        "http://elsewhere:1/api/jobs; pass that as --url")
    assert len(api.seen) == 1


def _certs(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 that it signed: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("server")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_with_the_servers_ca(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ca, cert, key = _certs(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for tls in _serve(FakeApi(answer=lambda s: (200, job())), context):
        rc, out, err = cli(capsys, "--url", tls.url, "--ca", str(ca), "show", "j1")
        assert (rc, err) == (0, "")
        assert json.loads(out)["id"] == "j1"
        monkeypatch.setenv("RPSAGG_TLS_CA", str(ca))
        assert cli(capsys, "--url", tls.url, "show", "j1")[0] == 0
        monkeypatch.delenv("RPSAGG_TLS_CA")
        rc, out, err = cli(capsys, "--url", tls.url, "show", "j1")  # the system's roots
        assert (rc, out) == (1, "")
        assert "TLS: the server's certificate is not trusted" in one_error_line(err)
        assert "--ca FILE names the CA that signed it" in err
        rc, _, err = cli(capsys, "--url", tls.url.replace("https:", "http:"), "show", "j1")
        assert rc == 1 and "does it speak HTTPS?" in one_error_line(err)
        assert len(tls.seen) == 2
    for plain in _serve(FakeApi()):  # https:// to a port that speaks HTTP
        rc, _, err = cli(capsys, "--url", plain.url.replace("http:", "https:"), "--ca", str(ca),
                         "show", "j1")
        assert rc == 1 and "does the port speak HTTPS? if not: --url http://" in err
        assert plain.seen == []


def test_the_console_script(api: FakeApi) -> None:
    """``rpsagg-jobs`` is installed with the client package."""
    api.answer = lambda s: (201, job("j-7", "queued"))
    script = Path(sys.executable).parent / "rpsagg-jobs"
    proc = subprocess.run([str(script), "--url", api.url, "create", "n=2"],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "j-7\n"), proc.stderr
    assert proc.stderr.startswith("rpsagg-jobs: created job j-7 (queued)")


def test_a_server_that_does_not_answer_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # listens, never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        rc, out, err = cli(capsys, "--url", url, "--request-timeout", "0.2", "show", "j1")
        assert (rc, out) == (1, "")
        assert one_error_line(err) == (f"rpsagg-jobs: GET /api/jobs/j1: {url}: no answer "
                                       "within 0.2 s (--request-timeout)")
        # its older name, before the command, still works, with a line saying so
        rc, out, err = cli(capsys, "--url", url, "--timeout", "0.2", "show", "j1")
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        "rpsagg-jobs: --timeout before the command is deprecated; use --request-timeout "
        "(wait's own --timeout is how long to wait)",
        f"rpsagg-jobs: GET /api/jobs/j1: {url}: no answer within 0.2 s (--request-timeout)"]
