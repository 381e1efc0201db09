"""Human-written questions: the Python FAQ of the Python 3.11 documentation (corpus C).

``faq/*.rst.txt`` (Debian's ``python3.11-doc``, unpacked: see ``docs/evaluation.md``) holds 175
questions: section headings that end in ``?``. A question's gold answer is its section, up to
the next heading, with its character range in the file, so a citation can be checked against it.

Usage::

    questions = load_faq(Path("pydoc311/usr/share/doc/python3.11/html/_sources/faq"))
    questions[0].question, questions[0].answer, questions[0].doc_id
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


@dataclass(frozen=True)
class FaqQuestion:
    """A FAQ heading that asks a question, and its section."""

    id: str
    question: str
    answer: str
    doc_id: str
    start: int
    end: int


def _headings(lines: list[str]) -> list[int]:
    """Indices of heading lines: a non-empty line underlined by a rule at least as long."""
    out = []
    for i in range(len(lines) - 1):
        text, under = lines[i].rstrip(), lines[i + 1].rstrip()
        if text.strip() and _UNDERLINE.match(under) and len(under) >= len(text.strip()):
            out.append(i)
    return out


def parse_faq(text: str, doc_id: str) -> list[FaqQuestion]:
    """The questions of one FAQ file (headings ending in ``?``) with their sections."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    heads = _headings([line.rstrip("\n") for line in lines])
    out = []
    for n, i in enumerate(heads):
        title = lines[i].strip()
        if not title.endswith("?"):
            continue
        body_start = starts[i + 2]
        body_end = starts[heads[n + 1]] if n + 1 < len(heads) else len(text)
        answer = text[body_start:body_end].strip()
        if not answer:
            continue
        start = text.index(answer, body_start)
        out.append(FaqQuestion(f"{doc_id}#{len(out)}", title, answer, doc_id, start,
                               start + len(answer)))
    return out


def load_faq(folder: str | Path) -> list[FaqQuestion]:
    """Every question of ``folder/*.rst.txt``, files in name order; ``doc_id`` is
    ``faq/<file>``."""
    folder = Path(folder)
    out: list[FaqQuestion] = []
    for path in sorted(folder.glob("*.rst.txt")):
        out += parse_faq(path.read_text(encoding="utf-8"), f"faq/{path.name}")
    return out


__all__ = ["FaqQuestion", "load_faq", "parse_faq"]
