"""HTML to text for ingestion: the stored source text of an HTML page is its extracted text
(tags dropped, entities decoded, ``<script>``/``<style>`` skipped, block elements on their own
lines); passage offsets index that text. Re-exported from ``ingest.documents``.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any


class _TextExtractor(HTMLParser):
    BLOCK = {
        "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
        "footer", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "dt", "dd", "hr",
    }  # fmt: skip
    SKIP = {"script", "style", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self.parts.append(data)


def html_to_text(markup: str) -> tuple[str, str]:
    """``(title, text)`` of an HTML page; the text is what passages of the page index into."""
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    raw = html.unescape("".join(parser.parts))
    lines = [re.sub(r"[ \t\r\f\v]+", " ", ln).strip() for ln in raw.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"
    title = re.sub(r"\s+", " ", "".join(parser.title)).strip()
    return title, text
