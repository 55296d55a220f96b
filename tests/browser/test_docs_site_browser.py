"""The documentation site in a real browser: ``mkdocs build --strict`` into a temporary folder,
served over loopback HTTP, opened in headless Debian Chromium (as the dashboard's browser test
does) and searched with Material's search box. The screenshot is saved as
``test-output/docs-search.png``."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from repo_paths import ROOT
from test_dashboard_browser import (  # the browser fixture and its skip rule
    browser,
    pytestmark,
)

OUTPUT = ROOT / "test-output"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built strictly, served on a loopback port the kernel chose; its base URL."""
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr
    handler = functools.partial(_Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()




def test_site_opens_and_its_search_finds_pages(browser: Any, site: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(site)
    assert browser.title.startswith("rpsagg")
    # the landing page's navigation names the sections of the site
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute(
        "textContent")
    for section in ("Getting started", "How-to", "Reference", "Explanation"):
        assert section in nav, section
    # Material's search (the box in the header at this width): type, wait for the results
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    WebDriverWait(browser, 20).until(lambda d: box.is_displayed() and box.is_enabled())
    box.click()
    box.send_keys("target-rel-error")
    items = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item") or None)
    meta = browser.find_element(By.CSS_SELECTOR, ".md-search-result__meta").text
    assert items and "matching" in meta.lower(), meta
    links = [a.get_attribute("href") for a in browser.find_elements(
        By.CSS_SELECTOR, "li.md-search-result__item a")]
    assert any("/service/" in (href or "") for href in links), links
    OUTPUT.mkdir(exist_ok=True)
    browser.save_screenshot(str(OUTPUT / "docs-search.png"))
    # a result opens its page
    browser.find_element(By.CSS_SELECTOR, "li.md-search-result__item a").click()
    WebDriverWait(browser, 20).until(lambda d: d.current_url != site)
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text


__all__ = ["browser", "pytestmark"]  # used by pytest, not by name
