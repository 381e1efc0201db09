"""Rendering a NestResult for people: the answer with numbered inline markers, then sources.

Markers number source *passages*: every span copied from the same passage gets the same
``[n]``, and the source list under the answer shows each copied span with its location.
Single-token attributions (token mode, where the emitted token merely equals its nearest
neighbour's value, NEST §8) are counted in the stats but not marked, so that a lone " the"
does not read as a quotation; ``min_tokens=1`` shows them too. Spans a lossless method
generated that match a passage verbatim (``Citation.kind == "verbatim"``) are marked the same
way and labelled "verbatim match" in the source list; a support citation (a passage sentence
that backs an answer sentence written in other words) is labelled "supports" with its score.
A sentence no passage supports (``NestResult.unsupported``) is flagged ``[!]`` and listed
under the sources.
"""

from __future__ import annotations

import re

from nest_integrations import output
from nest_integrations.types import Citation, NestResult


def number_sources(citations: list[Citation]) -> dict[str, int]:
    """Passage id -> marker number, in order of first citation."""
    numbers: dict[str, int] = {}
    for c in citations:
        numbers.setdefault(c.passage_id, len(numbers) + 1)
    return numbers


def shown(result: NestResult, min_tokens: int = 2) -> list[Citation]:
    """The citations worth marking for a reader: spans of at least ``min_tokens`` tokens."""
    return [c for c in result.citations if c.n_tokens >= min_tokens]


#: The inline flag of an answer sentence no passage supports.
UNSUPPORTED_MARK = "[!]"


def with_markers(result: NestResult, min_tokens: int = 2) -> str:
    """The answer text with ``[n]`` right after each cited span (``marker_place``: never after
    an uncited word, never inside a word or a line of code), each passage's number once per
    place (a span that goes on, within a sentence, from where the same passage's last one was
    marked takes that marker over), and ``[!]`` after each sentence no passage supports."""
    cites = sorted(shown(result, min_tokens), key=lambda c: (c.start, c.end))
    numbers = number_sources(cites)
    text = result.text
    places: dict[int, list[str]] = {}
    last: dict[str, int] = {}  # passage id -> where its last marker went
    for c in cites:
        mark, at = f"[{numbers[c.passage_id]}]", marker_place(text, c.end)
        before = last.get(c.passage_id)
        if (before is not None and before < at and not text[before : c.start].strip()
                and not text[:before].endswith((".", "!", "?"))):
            places[before].remove(mark)  # a run on within a sentence: one marker, at its end
        marks = places.setdefault(at, [])
        if mark not in marks:
            marks.append(mark)
        last[c.passage_id] = at
    for u in result.unsupported:
        marks = places.setdefault(marker_place(text, u.end), [])
        if UNSUPPORTED_MARK not in marks:
            marks.append(UNSUPPORTED_MARK)
    out, pos = [], 0
    for at in sorted(places):
        out.append(text[pos:at] + "".join(places[at]))
        pos = at
    out.append(text[pos:])
    return "".join(out)


_CODE_INDENT = re.compile(r"(?: {3,}|\t)\S")


def marker_place(text: str, end: int) -> int:
    """Where the marker of a span ending at ``end`` goes: right after its last non-space
    character, moved on only to the end of the word (the run of non-space characters) that
    character is in, so that "big." is marked "big.[1]" and "expression1" never
    "expression[1]1"; no word the span does not reach comes before its marker. A span ending
    in a line of code (indented by three spaces or a tab, or inside a ``` fence) is marked at
    the end of that line, so the code stays whole."""
    end = max(0, min(end, len(text)))
    while end > 0 and text[end - 1].isspace():  # a span that ends with its spaces: before them
        end -= 1
    if end == 0:
        return 0
    line_start = text.rfind("\n", 0, end - 1) + 1
    line_end = text.find("\n", end - 1)
    line_end = len(text) if line_end < 0 else line_end
    if _in_code(text, line_start):
        return len(text[:line_end].rstrip())
    while end < len(text) and not text[end].isspace():
        end += 1
    return end


def _in_code(text: str, line_start: int) -> bool:
    """Whether the line at ``line_start`` is code: indented, or inside a ``` fence."""
    if _CODE_INDENT.match(text, line_start):
        return True
    fences = sum(1 for line in text[:line_start].splitlines() if line.lstrip().startswith("```"))
    return fences % 2 == 1


def source_lines(result: NestResult, width: int = 100, min_tokens: int = 2) -> list[str]:
    """One header line per cited passage, and one line per copied span under it."""
    cites = shown(result, min_tokens)
    numbers = number_sources(cites)
    lines: list[str] = []
    for pid, n in numbers.items():
        spans = [c for c in cites if c.passage_id == pid]
        first = output.citation_fields(spans[0])
        title = output.citation_label(first)
        where = first["url"] or first["source"] or ""
        lines.append(f"[{n}] {title}  (doc {first['doc_id']}, passage {pid}) {where}".rstrip())
        for c in spans:
            loc = (
                f"chars {c.source_start}-{c.source_end} of the source"
                if c.source_start is not None
                else f"chars {c.passage_start}-{c.passage_end} of the passage"
            )
            if c.metadata.get("page") is not None:
                loc = f"page {c.metadata['page']}, {loc}"
            text = _clip(c.text, width)
            how = {"verbatim": "verbatim match, ",
                   "support": f"supports (score {c.score or 0:.2f}), "}.get(c.kind, "")
            lines.append(f"    {loc}, {how}{c.n_tokens} tokens: \"{text}\"")
    return lines


def render(result: NestResult, min_tokens: int = 2, backend: str | None = None) -> str:
    """Answer with markers, a blank line, the sources, and a one-line summary (ending with the
    ``backend`` that ran it, when given)."""
    s = result.stats
    parts = [with_markers(result, min_tokens).strip(), ""]
    if shown(result, min_tokens):
        parts += ["Sources:", *source_lines(result, min_tokens=min_tokens), ""]
    else:
        parts += ["Sources: none (no span was copied from the corpus)", ""]
    if result.unsupported:
        parts += [f"{UNSUPPORTED_MARK} Unsupported: no passage supports "
                  f"{len(result.unsupported)} sentence(s):",
                  *(f"    \"{_clip(u.text, 100)}\"" for u in result.unsupported), ""]
    parts.append(
        f"{s.new_tokens} tokens in {s.time_total:.1f}s ({s.tokens_per_second:.1f} tok/s, "
        f"first token {s.time_to_first_token:.2f}s), {s.forward_passes} forward passes, {s.attribution_ratio:.0%} attributed, "
        f"{len(result.passages)} passages searched" + (f", on {backend}" if backend else "")
    )
    return "\n".join(parts)


def _clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with "..."."""
    text = " ".join(text.split())
    return text[: width - 3] + "..." if len(text) > width else text
