"""Screenshot of the playground page (``nest serve``'s ``/``) for the README.

Ingests part of the shipped sample corpus (the pydoc topics and Wikipedia leads of
``benchmarks/server.py``) into a temporary store, starts ``nest serve`` on a free loopback port, asks
one question in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, as in
``tests/server/test_server_page.py``), clicks the first copied span so its source is shown
with the span marked, and saves the page. The test suite never writes this file.

Usage::

    python -m benchmarks.screenshot_playground         # writes benchmarks/results/playground.png
    python -m benchmarks.screenshot_playground --out /tmp/p.png --question "What is Futurism?"
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks.server import build_store, start_server

CHROMIUM = os.environ.get("NEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("NEST_CHROMEDRIVER", "/usr/bin/chromedriver")
API_KEY = "bench"  # the key start_server gives `nest serve`


def chromium() -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise SystemExit(f"{path} not found: apt-get install -y chromium chromium-driver")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--force-device-scale-factor=1"):  # fmt: skip
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


def shoot(url: str, question: str, max_tokens: int, out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = chromium()
    try:
        d.get(url + "/")
        WebDriverWait(d, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#preset option"))
        for field, value in (("question", question), ("max-tokens", str(max_tokens)),
                             ("api-key", API_KEY)):  # fmt: skip
            el = d.find_element(By.ID, field)
            el.clear()
            el.send_keys(value)
        d.find_element(By.ID, "send").click()
        body = d.find_element(By.TAG_NAME, "body")
        WebDriverWait(d, 300).until(lambda _: body.get_attribute("data-state") == "done")
        marks = d.find_elements(By.CSS_SELECTOR, "#answer mark.cite")
        if marks:  # show the first copied span's source, the span marked in it
            marks[0].click()
            source = d.find_element(By.ID, "source-body")
            WebDriverWait(d, 10).until(lambda _: source.is_displayed())
        else:
            print("warning: the answer copied nothing; no source is shown", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(out))
    finally:
        d.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.screenshot_playground",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=harness.RESULTS / "playground.png")
    ap.add_argument("--question", default="What is belly dance?")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--wiki", type=int, default=6, help="Wikipedia leads to ingest")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    args = ap.parse_args(argv)
    harness.setup()
    with tempfile.TemporaryDirectory(prefix="nest-shot-") as tmp:
        store = build_store(Path(tmp), args.wiki, "playground")
        proc, url = start_server(store, "playground", args.threads)
        try:
            shoot(url, args.question, args.max_tokens, args.out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
