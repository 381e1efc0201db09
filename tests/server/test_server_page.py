"""The playground page at ``/`` in real headless Chromium (Debian's chromium + chromium-driver).

Skips with the reason when the browser, its driver or selenium is missing; `.ci/run` installs
them, and in CI such a skip fails the run (tests/allowed_skips.txt does not list it). The test
writes only under its tmp path; `python benchmarks/screenshot_playground.py` makes the README's
benchmarks/results/playground.png.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import API_KEY

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("NEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("NEST_CHROMEDRIVER", "/usr/bin/chromedriver")
QUESTION = "What is belly dance?"  # a Wikipedia lead: the source has a title and a link


@pytest.fixture(scope="session")  # session: set up (or skipped) before the live server loads
def browser() -> Any:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.exists(path) or shutil.which(path)):
            pytest.skip(f"{path} not found: apt-get install -y {pkg} (see .ci/run)")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
              "--window-size=1280,1000", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_playground_streams_highlights_and_shows_exact_sources(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    """Ask on the page: the answer streams in, copied spans are highlighted, and clicking each
    one shows its source passage with exactly that text marked, plus title and link."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    d.get(live_server.url + "/")
    assert d.title == "NEST playground"
    WebDriverWait(d, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#preset option"))
    q = d.find_element(By.ID, "question")
    q.clear()
    q.send_keys(QUESTION)
    d.find_element(By.ID, "max-tokens").clear()
    d.find_element(By.ID, "max-tokens").send_keys("40")
    d.find_element(By.ID, "api-key").send_keys(API_KEY)
    d.find_element(By.ID, "send").click()
    WebDriverWait(d, 90).until(lambda d: d.find_element(By.TAG_NAME, "body")
                               .get_attribute("data-state") == "done")
    assert not d.find_element(By.ID, "error").is_displayed(), d.find_element(By.ID, "error").text
    answer = d.find_element(By.ID, "answer").text
    assert answer.strip()
    marks = d.find_elements(By.CSS_SELECTOR, "#answer mark.cite")
    assert marks, answer
    span_texts = d.execute_script(  # the span text without its footnote number
        "return [...document.querySelectorAll('#answer mark.cite')]"
        ".map(m => m.firstChild.textContent)"
    )
    hrefs: list[str] = []
    for mark, span in zip(marks, span_texts):
        mark.click()
        WebDriverWait(d, 10).until(
            lambda d: d.find_element(By.ID, "source-body").is_displayed()
            and d.execute_script(
                "const m = document.querySelector('#source-text mark');"
                "return m ? m.textContent : null"
            ) == span
        )
        title = d.find_element(By.ID, "source-title")
        assert title.text
        hrefs.append(title.get_attribute("href") or "")
    # The stats panel is filled from the final chunk.
    assert d.find_element(By.ID, "s-attr").text.endswith("%")
    assert d.find_element(By.ID, "s-fwd").text != "–"
    assert any(h.startswith("https://") for h in hrefs), hrefs  # Wikipedia sources link out
    marks[0].click()  # the screenshot shows the first span's source
    WebDriverWait(d, 10).until(lambda d: d.execute_script(
        "const m = document.querySelector('#source-text mark'); return m ? m.textContent : null"
    ) == span_texts[0])
    shot = tmp_path / "playground.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
