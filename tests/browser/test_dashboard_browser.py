"""The dashboard page in a real browser while client processes run rounds.

Headless Debian Chromium (``/usr/bin/chromium``) driven by Selenium through the matching
``/usr/bin/chromedriver`` (``scripts/setup-env.sh test`` installs both) loads ``/`` from a
live ``rpsagg-server`` subprocess on loopback. Screenshots go to ``test-output/`` at the
repository root (the images of ``docs/dashboard.md`` in ``docs/img`` are
``dashboard-overview.png``, ``dashboard-round.png`` and ``dashboard-clients.png`` from there,
reduced to 128 colours).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_util import free_port, get_json
from repo_paths import ROOT
from service_util import client_command, kill_all, server_command, wait_port_file

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
OUTPUT = ROOT / "test-output"
N, K, D, ROUNDS = 4, 16, 256, 8

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, "
    "/usr/bin/chromedriver); scripts/setup-env.sh test installs them as root",
)]


def post_json(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as res:
        return json.load(res)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,900"):
        opts.add_argument(arg)
    opts.add_experimental_option("prefs", {
        "download.default_directory": str(tmp_path / "downloads"),
        "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=opts, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


class LiveServer:
    """An ``rpsagg-server`` subprocess with the dashboard on a loopback port."""

    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.http_port = free_port()
        port_file = tmp_path / "grpc-port"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.server = subprocess.Popen(server_command([
            "--insecure", "--host", "127.0.0.1", "--grpc-port", "0",
            "--http-port", str(self.http_port), "--n", str(N), "--k", str(K), "--d", str(D),
            "--task", "mean", "--data-r", "3", "--rounds", str(ROUNDS),
            "--round-timeout", "120", "--db", str(tmp_path / "server.db"), "--linger", "-1",
            "--port-file", str(port_file), *flags,
        ]), stderr=subprocess.PIPE)
        self.procs.append(self.server)
        self.grpc_port = wait_port_file(port_file, self.server)
        self.url = f"http://127.0.0.1:{self.http_port}"

    def start_client(self, i: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(client_command([
            "--server", f"127.0.0.1:{self.grpc_port}", "--client-id", f"client-{i}",
            "--insecure",
        ]), stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def api(self, path: str) -> Any:
        return get_json(self.url + path)

    def post(self, path: str, body: Any) -> Any:
        return post_json(self.url + path, body)

    def close(self) -> None:
        kill_all(self.procs)


def wait_for(driver: Any, what: str, cond: Any, timeout: float = 40.0) -> Any:
    """Poll ``cond(driver)`` until it is truthy (``timeout`` bounds the wait only)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=[StaleElementReferenceException])
    return wait.until(cond, message=what)


# The page redraws once a second, so reads go through one script each (no stale elements).
def text_of(driver: Any, element_id: str) -> str:
    text: str = driver.execute_script(
        "return document.getElementById(arguments[0]).textContent.trim()", element_id)
    return text


def points(driver: Any, chart: str, series: str) -> list[int]:
    """Round ids of the points drawn for ``series`` in the SVG chart ``chart``."""
    rounds: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "`#${arguments[0]} circle.pt[data-series='${arguments[1]}']`), "
        "(c) => c.getAttribute('data-round'))", chart, series)
    return sorted(int(r) for r in rounds)


def drawn(driver: Any, chart: str, series: str) -> dict[int, float]:
    """Round id -> the exact value (``data-value``) of each point of ``series``."""
    pairs: list[list[str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "`#${arguments[0]} circle.pt[data-series='${arguments[1]}']`), "
        "(c) => [c.getAttribute('data-round'), c.getAttribute('data-value')])", chart, series)
    return {int(r): float(v) for r, v in pairs}


def table_rounds(driver: Any) -> list[int]:
    """Round ids of the rows of the recent-rounds table, top to bottom."""
    rounds: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#rounds-table tbody tr'), "
        "(r) => r.dataset.round)")
    return [int(r) for r in rounds]


def is_visible(driver: Any, element_id: str) -> bool:
    """Whether the element is rendered (not ``display: none``, nor inside such a parent):
    what the user sees, so a stylesheet that overrides ``hidden`` shows here."""
    shown: bool = driver.execute_script(
        "return document.getElementById(arguments[0]).getClientRects().length > 0",
        element_id)
    return shown


@pytest.mark.timeout(120)
def test_page_follows_rounds_live_and_charts_every_finished_round(
    browser: Any, tmp_path: Path
) -> None:
    server = LiveServer(tmp_path, "--eval")
    try:
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        assert text_of(browser, "round-id") == "1"
        assert text_of(browser, "round-state").lower() == "open"
        assert not is_visible(browser, "eval-off")

        # All clients but one: round 1 collects and the page shows its progress.
        first = [server.start_client(i) for i in range(N - 1)]
        wait_for(browser, "progress of round 1",
                 lambda d: text_of(d, "round-progress") == f"{N - 1} of {N} clients arrived")
        assert text_of(browser, "round-id") == "1"
        assert text_of(browser, "round-state").lower() == "collecting"
        assert points(browser, "mse-chart", "estimate") == []

        # The last client arrives: the rounds run to the end of the job.
        last = server.start_client(N - 1)
        wait_for(browser, "round number advances", lambda d: int(text_of(d, "round-id")) > 1)
        for proc in [*first, last]:
            _, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err.decode()[-2000:]
        rounds = server.api(f"/api/rounds?limit={ROUNDS + 5}")["rounds"]
        done = sorted(r["round_id"] for r in rounds if r["state"] == "done")
        assert done == list(range(1, ROUNDS + 1))
        wait_for(browser, "last round shown",
                 lambda d: text_of(d, "round-id") == str(ROUNDS)
                 and "job done" in text_of(d, "round-state").lower())
        wait_for(browser, "a point per finished round",
                 lambda d: points(d, "mse-chart", "estimate") == done)
        for series in ("rand_k", "rand_k_spatial"):
            assert points(browser, "mse-chart", series) == done
        for series in ("wire", "payload", "raw"):
            assert points(browser, "bytes-chart", series) == done
        assert table_rounds(browser) == done[::-1]

        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard.png"))
        assert (OUTPUT / "dashboard.png").stat().st_size > 10_000

        # A phone-sized window: everything fits the width (no sideways scrolling).
        browser.set_window_size(390, 844)
        wait_for(browser, "phone layout", lambda d: d.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"))
        browser.save_screenshot(str(OUTPUT / "dashboard-phone.png"))
    finally:
        server.close()


@pytest.mark.timeout(90)
def test_page_without_eval_says_the_error_is_estimated_and_asks_no_token(
    browser: Any, tmp_path: Path
) -> None:
    server = LiveServer(tmp_path)  # neither --eval nor --http-tokens
    try:
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        assert is_visible(browser, "eval-off")
        notice = " ".join(text_of(browser, "eval-off").split())
        assert "Evaluation mode is off" in notice
        assert "estimated from the messages" in notice
        for chart in ("rel-chart", "mse-chart"):
            assert text_of(browser, chart) == "no finished round yet"
        # no token form: the API answers without one (the form's own display: flex must not
        # override its hidden attribute)
        assert not is_visible(browser, "auth")
        assert browser.execute_script(
            "return getComputedStyle(document.getElementById('auth')).display") == "none"
        assert not is_visible(browser, "calib-card")
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-no-eval.png"))
    finally:
        server.close()


def click_round_link(driver: Any, round_id: int) -> None:
    """Click round ``round_id``'s link in the recent-rounds table (a real click)."""
    from selenium.webdriver.common.by import By

    link = wait_for(driver, f"link of round {round_id}", lambda d: d.find_element(
        By.CSS_SELECTOR, f"#rounds-table tbody tr[data-round='{round_id}'] a.round-link"))
    link.click()


def fetch_in_page(driver: Any, element_id: str) -> dict[str, str]:
    """Fetch the href of link ``element_id`` from the page: content type and body."""
    out: dict[str, str] = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(document.getElementById(arguments[0]).href).then(async (r) => done("
        "{type: r.headers.get('content-type'), disposition: r.headers.get("
        "'content-disposition'), body: await r.text()}));", element_id)
    return out


@pytest.mark.timeout(240)
def test_task_panel_clients_view_round_detail_and_downloads(
    browser: Any, tmp_path: Path
) -> None:
    # Power iteration on synthetic data in evaluation mode: 3 client processes submit every
    # round; a 4th client joins from the test and never submits, so every round decodes at
    # its deadline with n' = 3 and the 4th is a straggler.
    from rpsagg_client import AggregationClient

    # (k = 64 of d = 256 instead of the module's 16: the iterate visibly converges)
    server = LiveServer(tmp_path, "--eval", "--task", "power-iteration", "--min-clients",
                        str(N - 1), "--round-timeout", "1", "--k", "64")
    idle = AggregationClient(f"127.0.0.1:{server.grpc_port}", f"client-{N - 1}",
                             insecure=True)
    try:
        idle.join()
        procs = [server.start_client(i) for i in range(N - 1)]
        for proc in procs:
            _, err = proc.communicate(timeout=150)
            assert proc.returncode == 0, err.decode()[-2000:]
        rounds = server.api(f"/api/rounds?limit={ROUNDS + 5}")["rounds"]
        done = sorted(r["round_id"] for r in rounds if r["state"] == "done")
        assert done == list(range(1, ROUNDS + 1))

        browser.set_window_size(1280, 1500)
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        # the relative errors of all three estimators, one point per finished round
        wait_for(browser, "relative errors", lambda d: points(d, "rel-chart", "estimate") == done)
        for series in ("rand_k", "rand_k_spatial"):
            assert points(browser, "rel-chart", series) == done
        # the task panel: distance to the top eigenvector and the eigenvalue gap per round
        # (and the starting state at round 0, so the fall to the noise floor shows)
        with_start = [0, *done]
        wait_for(browser, "task progress",
                 lambda d: points(d, "task-chart", "eigvec") == with_start)
        assert points(browser, "task-chart", "gap") == with_start
        start = server.api("/api/status")["task_start"]
        assert start is not None and 0.0 <= start["eigenvector_distance"] <= 1.0
        task = server.api(f"/api/rounds/{ROUNDS}")["task_progress"]
        line = text_of(browser, "task-line")
        assert f"after round {ROUNDS}: Rayleigh quotient" in line
        assert "distance to the top eigenvector" in line
        assert 0.0 <= task["eigenvector_distance"] <= 1.0
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-overview.png"))

        # downloads: the links serve every round as CSV and JSON attachments
        csv_res = fetch_in_page(browser, "dl-csv")
        assert csv_res["type"].startswith("text/csv")
        assert "attachment" in csv_res["disposition"]
        lines = csv_res["body"].strip().splitlines()
        assert lines[0].startswith("round_id,state,") and len(lines) == 1 + len(rounds)
        json_res = fetch_in_page(browser, "dl-json")
        assert [r["round_id"] for r in json.loads(json_res["body"])] == sorted(
            r["round_id"] for r in rounds)

        # round detail, reached by clicking the round in the table
        click_round_link(browser, ROUNDS)
        wait_for(browser, "round detail", lambda d: text_of(d, "detail-id") == str(ROUNDS)
                 and is_visible(d, "detail-decode"))
        assert not is_visible(browser, "rounds-table")
        detail = server.api(f"/api/rounds/{ROUNDS}")
        wait_for(browser, "contributors listed", lambda d: d.execute_script(
            "return Array.from(document.querySelectorAll('#detail-contributors tbody tr'),"
            " (r) => r.dataset.client)") == detail["clients"]["arrived"])
        assert sorted(detail["clients"]["arrived"]) == [f"client-{i}" for i in range(N - 1)]
        decode = " ".join(text_of(browser, "detail-decode").split())
        for needle in ("β (unbiasing)", "R̂ (from the sketches)", "relative error",
                       "Rayleigh quotient", "distance to the top eigenvector"):
            assert needle in decode
        timing = " ".join(text_of(browser, "detail-timing").split())
        for needle in ("first submission", "closed", "wire bytes", "raw float32"):
            assert needle in timing
        assert f"client-{N - 1}" in text_of(browser, "detail-missing")
        browser.save_screenshot(str(OUTPUT / "dashboard-round.png"))

        # the clients view: the idle client is a straggler that missed every round
        browser.get(server.url + "/#clients")
        wait_for(browser, "clients listed", lambda d: d.execute_script(
            "return document.querySelectorAll('#clients-table tbody tr').length") == N)
        api = {c["client_id"]: c for c in server.api("/api/clients")}
        rows = browser.execute_script(
            "return Array.from(document.querySelectorAll('#clients-table tbody tr'),"
            " (r) => [r.dataset.client, r.dataset.straggler,"
            " Array.from(r.cells, (c) => c.textContent)])")
        for cid, straggler, cells in rows:
            c = api[cid]
            assert straggler == str(c["straggler"]).lower()
            assert cells[4:6] == [str(c["rounds_contributed"]), str(c["rounds_missed"])]
        assert api[f"client-{N - 1}"]["straggler"] is True
        assert api[f"client-{N - 1}"]["rounds_missed"] == ROUNDS
        assert all(api[f"client-{i}"]["rounds_contributed"] == ROUNDS for i in range(N - 1))
        browser.save_screenshot(str(OUTPUT / "dashboard-clients.png"))
    finally:
        idle.close()
        server.close()


@pytest.mark.timeout(120)
def test_page_asks_for_a_token_and_sends_it(browser: Any, tmp_path: Path) -> None:
    # --http-tokens: the API answers only with the token; the page shows its form, a wrong
    # token is refused, the right one is kept for the tab (sessionStorage, a reload keeps
    # it) and sent with every request, downloads included.
    from selenium.webdriver.common.by import By

    token = "page-token-5e1b"
    tokens = tmp_path / "http.tokens"
    tokens.write_text(f"{token}\n")
    server = LiveServer(tmp_path, "--http-tokens", str(tokens))
    try:
        browser.get(server.url + "/")
        wait_for(browser, "the token form", lambda d: is_visible(d, "auth")
                 and text_of(d, "conn") == "token needed")
        assert text_of(browser, "round-id") == "\u2013"  # no data without the token (an en dash)

        def enter(value: str) -> None:
            field = browser.find_element(By.ID, "auth-token")
            field.clear()
            field.send_keys(value)
            browser.find_element(By.ID, "auth-submit").click()

        enter("not-the-token")
        wait_for(browser, "the wrong token refused",
                 lambda d: "refused" in text_of(d, "auth-msg") and is_visible(d, "auth"))
        assert text_of(browser, "conn") == "token needed"
        enter(token)
        wait_for(browser, "live with the token", lambda d: text_of(d, "conn") == "live")
        assert not is_visible(browser, "auth")
        assert text_of(browser, "round-id") == "1"
        assert browser.execute_script(
            "return sessionStorage.getItem('rpsagg-dashboard-token')") == token
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-token.png"))

        browser.refresh()  # the tab keeps its token
        wait_for(browser, "live after a reload", lambda d: text_of(d, "conn") == "live")
        assert not is_visible(browser, "auth")
        # the page's own requests carry the token; the same request without it is refused
        status = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/api/status').then((r) => done(r.status));")
        assert status == 401
        # a click on the CSV link downloads it with the token
        browser.find_element(By.ID, "dl-csv").click()
        saved = tmp_path / "downloads" / "rpsagg-rounds.csv"  # the server's file name
        wait_for(browser, "the CSV download", lambda d: saved.exists()
                 and saved.read_text().startswith("round_id,state,"))
        assert len(saved.read_text().strip().splitlines()) == 2  # header, round 1
    finally:
        server.close()


def job_rows(driver: Any) -> list[dict[str, str]]:
    """The job list's rows, top to bottom: id, state, link, and the rounds cell."""
    rows: list[dict[str, str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#jobs-table tbody tr'), (r) => ({"
        "id: r.dataset.job, state: r.dataset.state,"
        " href: r.querySelector('a.job-link').getAttribute('href'),"
        " rounds: r.cells[2].textContent}))")
    return rows


def above(driver: Any, upper: str, lower: str) -> bool:
    """Whether element ``upper`` is drawn above element ``lower``."""
    out: bool = driver.execute_script(
        "const y = (id) => document.getElementById(id).getBoundingClientRect().top;"
        "return y(arguments[0]) < y(arguments[1])", upper, lower)
    return out


@pytest.mark.timeout(180)
def test_page_lists_the_jobs_and_links_each_to_its_page(
    browser: Any, tmp_path: Path
) -> None:
    # A server of several jobs: the default job runs until stopped, a created job waits
    # behind it (--max-jobs 1) and another is cancelled while it waits.
    from selenium.webdriver.common.by import By

    server = LiveServer(tmp_path, "--rounds", "0", "--max-jobs", "1", "--eval")
    try:
        small = {"n": 2, "k": 4, "d": 16, "rounds": 3}
        queued = server.post("/api/jobs", small)["id"]
        gone = server.post("/api/jobs", small)["id"]
        assert server.post(f"/api/jobs/{gone}/cancel", {})["state"] == "cancelled"
        for i in range(N):
            server.start_client(i)
        wait_for(browser, "two rounds of the default job",
                 lambda _: server.api("/api/jobs/default")["rounds_done"] >= 2, timeout=60)

        # "/": the list first, each job linked to its page; the default job's page below
        browser.get(server.url + "/")
        wait_for(browser, "the job list", lambda d: text_of(d, "conn") == "live"
                 and [r["id"] for r in job_rows(d)] == ["default", queued, gone])
        rows = {r["id"]: r for r in job_rows(browser)}
        assert {i: (r["state"], r["href"]) for i, r in rows.items()} == {
            "default": ("running", "/jobs/default/"), queued: ("queued", f"/jobs/{queued}/"),
            gone: ("cancelled", f"/jobs/{gone}/")}
        assert rows["default"]["rounds"].endswith("(until stopped)")
        assert rows[queued]["rounds"] == "0/3"
        assert is_visible(browser, "default-note") and not is_visible(browser, "nav-jobs")
        assert above(browser, "jobs-table", "config-card")
        kept = text_of(browser, "jobs-kept")  # the cancelled job, the server's defaults
        assert kept.startswith("1 ended job kept (0 B, the oldest ended "), kept
        assert kept.endswith("the server keeps the last 1000 for 90 days, then removes the "
                             "oldest (--keep-finished-jobs, --keep-finished-for)."), kept
        wait_for(browser, "the default job's rounds", lambda d: len(table_rounds(d)) >= 2)
        assert browser.execute_script(
            "return document.getElementById('dl-csv').getAttribute('href')"
        ) == "/api/rounds/export.csv"
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-jobs.png"))

        # a queued job's page says so and has nothing else yet
        browser.find_element(By.CSS_SELECTOR, f"#jobs-table tr[data-job='{queued}'] a").click()
        wait_for(browser, "the queued job's page",
                 lambda d: text_of(d, "job-head-state") == "queued"
                 and text_of(d, "conn") == "live")
        assert browser.current_url == f"{server.url}/jobs/{queued}/"
        assert "Queued" in text_of(browser, "job-head-note")
        assert is_visible(browser, "nav-jobs") and not is_visible(browser, "jobs-table")
        for element in ("config-card", "rounds-table", "nav-overview", "nav-clients"):
            assert not is_visible(browser, element), element
        browser.get(f"{server.url}/jobs/{gone}/")
        wait_for(browser, "the cancelled job's page",
                 lambda d: text_of(d, "job-head-state") == "cancelled")
        assert text_of(browser, "job-head-note") == "Cancelled before it finished a round."

        # the default job cancelled: its page shows the rounds it finished, read (and
        # downloaded) under /api/jobs/default
        server.post("/api/jobs/default/cancel", {})
        wait_for(browser, "the default job's last round over", lambda _: server.api(
            "/api/jobs/default/status")["current_round"] is None)
        job = server.api("/api/jobs/default")
        assert job["state"] == "cancelled" and job["rounds_done"] >= 2
        rounds = server.api("/api/jobs/default/rounds?limit=100")["rounds"]
        done = sorted(r["round_id"] for r in rounds if r["state"] == "done")
        assert len(done) == job["rounds_done"]
        # (a log axis draws the positive estimates)
        drawable = sorted(r["round_id"] for r in rounds if r["state"] == "done"
                          and (r["error_estimate"]["relative_error"] or 0) > 0)
        browser.get(server.url + "/jobs/default/")
        wait_for(browser, "the cancelled default job's page",
                 lambda d: text_of(d, "job-head-state") == "cancelled"
                 and points(d, "rel-chart", "estimated") == drawable
                 and table_rounds(d) == [r["round_id"] for r in rounds][:15])
        assert text_of(browser, "job-head-note").startswith(
            f"Cancelled after {len(done)} finished round")
        wait_for(browser, "the round card", lambda d: "job cancelled" in text_of(
            d, "round-state").lower() and "job cancelled" in text_of(d, "job-line"))
        assert browser.execute_script(
            "return document.getElementById('dl-csv').getAttribute('href')"
        ) == "/api/jobs/default/rounds/export.csv"
        csv_res = fetch_in_page(browser, "dl-csv")
        assert len(csv_res["body"].strip().splitlines()) == 1 + len(rounds)
        browser.save_screenshot(str(OUTPUT / "dashboard-job-cancelled.png"))
        browser.get(f"{server.url}/jobs/default/#round/{done[0]}")
        wait_for(browser, "a round's estimate links", lambda d: is_visible(d, "detail-estimate"))
        assert browser.execute_script(
            "return document.getElementById('est-json').getAttribute('href')"
        ) == f"/api/jobs/default/rounds/{done[0]}/estimate?format=json"
        est = json.loads(fetch_in_page(browser, "est-json")["body"])
        assert est["round_id"] == done[0] and len(est["estimate"]) == D

        # the queued job runs once the default job has ended: its page shows it
        browser.get(f"{server.url}/jobs/{queued}/")
        wait_for(browser, "the created job running",
                 lambda d: text_of(d, "job-head-state") == "running"
                 and text_of(d, "conn") == "live" and is_visible(d, "config-card"))
        wait_for(browser, "its settings", lambda d: "2 · 4 · 16" in text_of(d, "config"))
    finally:
        server.close()
