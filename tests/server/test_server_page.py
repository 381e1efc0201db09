"""The playground page at ``/`` in real headless Chromium (Debian's chromium + chromium-driver):
the streamed answer with its copied spans, and the "attribute this text" box.

Skips with the reason when the browser, its driver or selenium is missing; `.ci/run` installs
them, and in CI such a skip fails the run (tests/allowed_skips.txt does not list it). The test
writes only under its tmp path; `python -m benchmarks.screenshot_playground` makes the README's
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


#: A text "another model" wrote about a served Wikipedia lead: one sentence copied, one
#: paraphrased, one made up.
ATTRIBUTE = (
    "Harry Potter is a series of seven children's fantasy novels written by British author "
    "J. K. Rowling. The books follow a young wizard and his friends Ron Weasley and Hermione "
    "Granger, who study at Hogwarts School of Witchcraft and Wizardry. The first novel was "
    "published in Paris in 1975."
)
MADE_UP = "The first novel was published in Paris in 1975."


def test_playground_attributes_pasted_text_with_support_in_a_second_colour(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    """Paste a text into "attribute this text": verbatim spans are highlighted as copies are,
    supported sentences in a second colour (clicking one shows the passage sentence that
    supports it, marked at its exact offsets), unsupported sentences are underlined and
    listed; the page shows what /v1/attributions returns."""
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    d.get(live_server.url + "/")
    WebDriverWait(d, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#preset option"))
    key = d.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys(API_KEY)
    d.find_element(By.ID, "attr-text").send_keys(ATTRIBUTE)
    d.find_element(By.ID, "attr-send").click()
    WebDriverWait(d, 120).until(lambda d: d.find_element(By.TAG_NAME, "body")
                                .get_attribute("data-attr-state") == "done")
    assert not d.find_element(By.ID, "error").is_displayed(), d.find_element(By.ID, "error").text
    api = httpx.post(live_server.url + "/v1/attributions", json={"text": ATTRIBUTE},
                     headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120).json()
    notes = [a["url_citation"] for a in api["annotations"]]
    support = [u for u in notes if u["kind"] == "support"]
    verbatim = [u for u in notes if u["kind"] == "verbatim"]
    assert support and verbatim, notes
    assert [u["text"] for u in api["unsupported"]] == [MADE_UP]

    out = d.find_element(By.ID, "attr-answer")
    assert out.text.replace("\n", "").startswith("Harry Potter")
    sup_marks = d.find_elements(By.CSS_SELECTOR, "#attr-answer mark.support")
    cite_marks = d.find_elements(By.CSS_SELECTOR, "#attr-answer mark.cite")
    assert len(sup_marks) == len(support)
    # a verbatim run that crosses into a supported sentence is drawn in two pieces (one key)
    assert len({m.get_attribute("data-key") for m in cite_marks}) == len(verbatim)
    colour = "return getComputedStyle(arguments[0]).backgroundColor"
    assert d.execute_script(colour, sup_marks[0]) != d.execute_script(colour, cite_marks[0])
    (gap,) = d.find_elements(By.CSS_SELECTOR, "#attr-answer .unsupported")
    assert gap.text == MADE_UP
    assert [li.text for li in d.find_elements(By.CSS_SELECTOR, "#attr-unsupported li")] == [
        MADE_UP]
    assert "1 unsupported" in d.find_element(By.ID, "attr-summary").text

    source_mark = (
        "const m = document.querySelector('#source-text mark');"
        "return m ? [m.textContent, m.className] : null"
    )
    # a supported sentence: its footnote opens the supporting passage sentence, in blue
    sup_marks[0].find_element(By.XPATH, "./sup").click()
    WebDriverWait(d, 10).until(
        lambda d: d.execute_script(source_mark) == [support[0]["cited_text"], "support"])
    assert "support 0." in d.find_element(By.ID, "source-meta").text
    # a verbatim span (drawn whole): the same text, marked in the passage
    texts = [d.execute_script("return arguments[0].firstChild.textContent", m)
             for m in cite_marks]
    whole = [(m, t) for m, t in zip(cite_marks, texts) if t in {u["cited_text"] for u in verbatim}]
    assert whole, texts
    first, span = whole[0]
    first.click()
    WebDriverWait(d, 10).until(lambda d: d.execute_script(source_mark) == [span, ""])
    shot = tmp_path / "attribute.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
