"""The error estimated from the messages on the dashboard, in a real browser (headless Debian
Chromium, as ``test_dashboard_browser.py``).

Without ``--eval`` the error charts draw every done round's estimate (the values the API
gives, with their standard errors and a running mean) and the round bar is full once the job
is done; with ``--eval`` they draw it beside the measured error and a calibration panel plots
estimated against measured. A job over the clients' own vectors charts the estimate too, and
a done round's view links to its estimate in every format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_util import client_command
from test_dashboard_browser import (  # the page helpers and the browser fixture
    OUTPUT,
    ROUNDS,
    LiveServer,
    browser,
    drawn,
    fetch_in_page,
    is_visible,
    points,
    pytestmark,
    text_of,
    wait_for,
)

__all__ = ["browser", "pytestmark"]
N, D = 4, 256  # the LiveServer's n and d


def positive(rounds: list[dict[str, Any]], *path: str) -> dict[int, float]:
    """Round id -> the value at ``path`` of every round where it is positive (what a log
    axis can draw)."""
    out = {}
    for r in rounds:
        v: Any = r
        for key in path:
            v = None if v is None else v[key]
        if v is not None and v > 0:
            out[r["round_id"]] = float(v)
    return out


def spread_count(driver: Any, chart: str, series: str) -> int:
    """Error bars drawn for ``series`` (one per point with a standard error)."""
    count: int = driver.execute_script(
        "return document.querySelectorAll("
        "`#${arguments[0]} g[data-series='${arguments[1]}'] line.errbar`).length",
        chart, series)
    return count


def bar_fraction(driver: Any) -> float:
    """The drawn width of the round card's bar over its track's."""
    frac: float = driver.execute_script(
        "const bar = document.getElementById('progress-bar');"
        "return bar.getBoundingClientRect().width"
        " / bar.parentElement.getBoundingClientRect().width")
    return frac


def finish_job(server: LiveServer, clients: int) -> list[dict[str, Any]]:
    """Run ``clients`` client processes to the end of the job; every round, oldest first."""
    procs = [server.start_client(i) for i in range(clients)]
    for proc in procs:
        _, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err.decode()[-2000:]
    rounds: list[dict[str, Any]] = server.api(f"/api/rounds?limit={ROUNDS + 5}")["rounds"]
    assert sorted(r["round_id"] for r in rounds if r["state"] == "done") == list(
        range(1, ROUNDS + 1))
    return sorted(rounds, key=lambda r: int(r["round_id"]))


@pytest.mark.timeout(180)
def test_job_without_eval_charts_the_estimated_error_and_fills_the_bar(
    browser: Any, tmp_path: Path
) -> None:
    server = LiveServer(tmp_path)
    try:
        rounds = finish_job(server, N)
        rel = positive(rounds, "error_estimate", "relative_error")
        sq = positive(rounds, "error_estimate", "squared_error")
        assert rel and sq  # (an estimate <= 0 by chance is left off the log axis)

        browser.set_window_size(1280, 1250)
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        wait_for(browser, "the estimated relative error",
                 lambda d: drawn(d, "rel-chart", "estimated") == rel)
        assert drawn(browser, "mse-chart", "estimated") == sq
        # one error bar per point (every estimate has its standard error here)
        assert all(r["error_estimate"]["squared_error_stderr"] is not None for r in rounds)
        assert spread_count(browser, "rel-chart", "estimated") == len(rel)
        assert spread_count(browser, "mse-chart", "estimated") == len(sq)
        # from 6 rounds with an estimate, the relative error gets a running mean over 5
        # rounds (the squared error, which follows the vectors' norms, does not)
        values = [r["error_estimate"]["relative_error"] for r in rounds
                  if r["error_estimate"]["relative_error"] is not None]
        means = [sum(values[max(0, i - 2):i + 3]) / len(values[max(0, i - 2):i + 3])
                 for i in range(len(values))]
        want_line = len(values) >= 6 and sum(m > 0 for m in means) > 1
        for chart, want in (("rel-chart", int(want_line)), ("mse-chart", 0)):
            assert browser.execute_script(
                "return document.querySelectorAll(`#${arguments[0]} "
                "polyline[data-series='estimated_mean']`).length", chart) == want, chart
        # nothing measured without --eval: no measured series, no calibration
        for series in ("estimate", "rand_k", "rand_k_spatial"):
            assert points(browser, "rel-chart", series) == []
        assert not is_visible(browser, "calib-card")
        assert is_visible(browser, "eval-off")
        legend = text_of(browser, "rel-legend")
        assert "estimated (± 1 s.e.)" in legend and "mean of 5 rounds" in legend
        # the table's newest row: the estimate ± its standard error, as the page formats them
        last = rounds[-1]["error_estimate"]
        if last["relative_error"] is not None:
            assert browser.execute_script(
                "return document.querySelector('#rounds-table tbody tr').cells[9].textContent"
                " === fmtNum(arguments[0]) + ' ± ' + fmtNum(arguments[1])",
                last["relative_error"], last["relative_error_stderr"])

        # the job is done: the round card's bar is full at once (no animation from empty)
        wait_for(browser, "job done", lambda d: "job done" in text_of(d, "round-state").lower())
        assert text_of(browser, "round-progress") == (
            f"{N} of {N} clients arrived in the last round")
        assert bar_fraction(browser) == pytest.approx(1.0, abs=1e-3)
        assert not is_visible(browser, "auth")  # no --http-tokens: no token form
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-estimate.png"))
    finally:
        server.close()


@pytest.mark.timeout(180)
def test_eval_job_shows_estimate_beside_measured_and_calibration(
    browser: Any, tmp_path: Path
) -> None:
    server = LiveServer(tmp_path, "--eval")
    try:
        rounds = finish_job(server, N)
        browser.set_window_size(1280, 1500)
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        rel = positive(rounds, "error_estimate", "relative_error")
        wait_for(browser, "the estimated relative error",
                 lambda d: drawn(d, "rel-chart", "estimated") == rel)
        # beside the measured error of the same rounds
        assert drawn(browser, "rel-chart", "estimate") == positive(
            rounds, "relative_error", "estimate")
        assert drawn(browser, "mse-chart", "estimate") == positive(
            rounds, "squared_error", "estimate")
        assert drawn(browser, "mse-chart", "estimated") == positive(
            rounds, "error_estimate", "squared_error")
        assert not is_visible(browser, "eval-off")

        # calibration: one point (measured, estimated) per round, both positive
        assert is_visible(browser, "calib-card")
        want = {r["round_id"]: (r["squared_error"]["estimate"],
                                r["error_estimate"]["squared_error"]) for r in rounds
                if r["squared_error"]["estimate"] > 0
                and (r["error_estimate"]["squared_error"] or 0) > 0}
        assert want
        pairs = browser.execute_script(
            "return Array.from(document.querySelectorAll("
            "\"#calib-chart circle.pt[data-series='calibration']\"), (c) => ["
            "c.getAttribute('data-round'), c.getAttribute('data-x'),"
            " c.getAttribute('data-value')])")
        assert {int(r): (float(x), float(y)) for r, x, y in pairs} == want
        assert browser.execute_script(
            "return document.querySelectorAll(\"#calib-chart line.diagonal\").length") == 1
        assert spread_count(browser, "calib-chart", "calibration") == len(want)
        inside = sum(abs(r["error_estimate"]["squared_error"] - r["squared_error"]["estimate"])
                     <= r["error_estimate"]["squared_error_stderr"] for r in rounds)
        assert text_of(browser, "calib-line").startswith(
            f"{len(rounds)} rounds; the measured error is within one standard error of the "
            f"estimate in {inside} ")
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-calibration.png"))
    finally:
        server.close()


@pytest.mark.timeout(180)
def test_external_job_has_no_error_charts_and_links_each_estimate(
    browser: Any, tmp_path: Path
) -> None:
    rng = np.random.default_rng(8)
    server = LiveServer(tmp_path, "--data", "external", "--rounds", "2")
    try:
        procs = []
        for i in range(N):
            np.save(tmp_path / f"x{i}.npy", rng.standard_normal((2, D)))
            procs.append(subprocess.Popen(client_command([
                "--server", f"127.0.0.1:{server.grpc_port}", "--client-id", f"client-{i}",
                "--insecure", "--vectors", str(tmp_path / f"x{i}.npy")]),
                stderr=subprocess.PIPE))
        server.procs.extend(procs)
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-2000:]

        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        wait_for(browser, "the external-data notice", lambda d: is_visible(d, "external-note"))
        notice = " ".join(text_of(browser, "external-note").split())
        assert "no evaluation reference" in notice
        for card in ("task-card", "eval-off", "calib-card"):
            assert not is_visible(browser, card), card
        # the error charts draw the estimate, as in every mode
        rounds = server.api("/api/rounds")["rounds"]
        wait_for(browser, "the estimated error", lambda d: drawn(d, "rel-chart", "estimated")
                 == positive(rounds, "error_estimate", "relative_error"))
        assert drawn(browser, "mse-chart", "estimated") == positive(
            rounds, "error_estimate", "squared_error")
        assert "task step 2 of 2" in text_of(browser, "job-line")

        browser.get(server.url + "/#round/2")
        wait_for(browser, "round 2's estimate links", lambda d: text_of(d, "detail-id") == "2"
                 and is_visible(d, "detail-estimate"))
        assert f"n\u2032 = {N}, d = {D}" in text_of(browser, "detail-estimate")
        doc = json.loads(fetch_in_page(browser, "est-json")["body"])
        assert (doc["round_id"], doc["n_prime"], doc["d"]) == (2, N, D)
        csv_res = fetch_in_page(browser, "est-csv")
        assert csv_res["type"].startswith("text/csv")
        assert "attachment" in csv_res["disposition"]
        values = np.array(csv_res["body"].strip().split(","), dtype=np.float64)
        assert np.array_equal(values, np.array(doc["estimate"], dtype=np.float64))
        npy = fetch_in_page(browser, "est-npy")
        assert npy["type"] == "application/octet-stream"
        assert "rpsagg-round-2-estimate.npy" in npy["disposition"]
        OUTPUT.mkdir(exist_ok=True)
        browser.save_screenshot(str(OUTPUT / "dashboard-external-round.png"))

        browser.get(server.url + "/#round/1")  # a done round: links to round 1's estimate
        wait_for(browser, "round 1's links", lambda d: text_of(d, "detail-id") == "1")
        assert browser.execute_script(
            "return document.getElementById('est-npy').getAttribute('href')"
        ) == "/api/rounds/1/estimate?format=npy"
    finally:
        server.close()


@pytest.mark.timeout(180)
def test_target_job_draws_the_target_and_each_rounds_k(browser: Any, tmp_path: Path) -> None:
    target = 2.0
    server = LiveServer(tmp_path, "--target-rel-error", str(target), "--k-min", "4",
                        "--k-max", "64")
    try:
        rounds = finish_job(server, N)
        ks = {r["round_id"]: float(r["k"]) for r in rounds}
        assert all(4 <= k <= 64 for k in ks.values())
        assert server.api("/api/status")["config"]["target_rel_error"] == target
        browser.get(server.url + "/")
        wait_for(browser, "each round's k", lambda d: drawn(d, "k-chart", "k") == ks)
        assert is_visible(browser, "k-card")
        assert browser.execute_script(
            "return document.querySelector(\"#rel-chart g.hline[data-series='target']\")"
            ".getAttribute('data-value')") == "2"
        assert drawn(browser, "rel-chart", "estimated") == positive(
            rounds, "error_estimate", "relative_error")
        browser.save_screenshot(str(OUTPUT / "dashboard-target.png"))
    finally:
        server.close()


@pytest.mark.timeout(90)
def test_page_code_on_made_up_rounds(browser: Any, tmp_path: Path) -> None:
    # The page's own code on made-up data. 50 rounds (25 at k = 8, then 25 at k = 16):
    # beyond 40 points the standard error is a band, and the running mean of round 25 (the
    # last at k = 8) is over rounds 23 to 25 only. A done job whose last round decoded with
    # 1 of 4 clients: the bar is full all the same.
    server = LiveServer(tmp_path)
    try:
        browser.get(server.url + "/")
        wait_for(browser, "page connected", lambda d: text_of(d, "conn") == "live")
        out = browser.execute_script("""
            const rounds = [];
            for (let i = 1; i <= 50; i++) {
              const rel = i <= 25 ? 1 + (i % 3) : 0.1 * (1 + (i % 3));
              rounds.push({ round_id: i, k: i <= 25 ? 8 : 16, error_estimate: {
                relative_error: rel, relative_error_stderr: rel / 4 } });
            }
            const st = { config: { scheme: "s", k: 8 } };
            const series = estimatedSeries(st, rounds, true);
            const svg = document.createElementNS(SVG_NS, "svg");
            drawLogChart(svg, series, {});
            const mean = series[1].points.find((p) => p.x === 25).y;
            return { bands: svg.querySelectorAll("polygon.band").length,
                     bars: svg.querySelectorAll("line.errbar").length,
                     dots: svg.querySelectorAll("circle.pt[data-series='estimated']").length,
                     mean, want: (rounds[22].error_estimate.relative_error
                       + rounds[23].error_estimate.relative_error
                       + rounds[24].error_estimate.relative_error) / 3 };""")
        assert (out["bands"], out["bars"], out["dots"]) == (1, 0, 50)
        assert out["mean"] == pytest.approx(out["want"], rel=1e-12)

        browser.execute_async_script("""
            const done = arguments[arguments.length - 1];
            tick = () => {};  // no more polls: the made-up status stays on the page
            const settle = () => {
              if (inFlight) { setTimeout(settle, 20); return; }
              clearTimeout(timer);
              const last = { round_id: 8, state: "done", timestamps: {},
                             clients: { arrived: ["c0"], expected: 4, missing: [] } };
              renderRound({ current_round: null, latest_round: last, beta: null,
                            job: { done: true, steps_done: 8, rounds_planned: 8,
                                   state: "done" } });
              done();
            };
            settle();""")
        assert text_of(browser, "round-progress") == "1 of 4 clients arrived in the last round"
        assert bar_fraction(browser) == pytest.approx(1.0, abs=1e-3)
    finally:
        server.close()
