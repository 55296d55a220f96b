"""The dashboard of a job over the clients' own vectors, in a real browser (headless Debian
Chromium, as ``test_dashboard_browser.py``): no error charts but a notice saying there is no
evaluation reference, and a done round's view links to its estimate in every format."""

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
    LiveServer,
    browser,
    fetch_in_page,
    is_visible,
    pytestmark,
    text_of,
    wait_for,
)

__all__ = ["browser", "pytestmark"]
N, D = 4, 256  # the LiveServer's n and d


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
        for card in ("rel-card", "mse-card", "task-card", "eval-off"):
            assert not is_visible(browser, card), card
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
