"""Rendering a NestResult for people: the answer with numbered inline markers, then sources.

Markers number source *passages*: every span copied from the same passage gets the same
``[n]``, and the source list under the answer shows each copied span with its location.
"""

from __future__ import annotations

from nest_integrations.types import Citation, NestResult


def number_sources(citations: list[Citation]) -> dict[str, int]:
    """Passage id -> marker number, in order of first citation."""
    numbers: dict[str, int] = {}
    for c in citations:
        numbers.setdefault(c.passage_id, len(numbers) + 1)
    return numbers


def with_markers(result: NestResult) -> str:
    """The answer text with ``[n]`` after each cited span."""
    numbers = number_sources(result.citations)
    out, pos = [], 0
    for c in result.citations:
        out.append(result.text[pos : c.end])
        out.append(f"[{numbers[c.passage_id]}]")
        pos = c.end
    out.append(result.text[pos:])
    return "".join(out)


def source_lines(result: NestResult, width: int = 100) -> list[str]:
    """One header line per cited passage, and one line per copied span under it."""
    numbers = number_sources(result.citations)
    lines: list[str] = []
    for pid, n in numbers.items():
        spans = [c for c in result.citations if c.passage_id == pid]
        meta = spans[0].metadata
        title = meta.get("title") or meta.get("source") or spans[0].doc_id
        where = meta.get("url") or meta.get("source") or ""
        lines.append(f"[{n}] {title}  (doc {spans[0].doc_id}, passage {pid}) {where}".rstrip())
        for c in spans:
            loc = (
                f"chars {c.source_start}-{c.source_end} of the source"
                if c.source_start is not None
                else f"chars {c.passage_start}-{c.passage_end} of the passage"
            )
            text = " ".join(c.text.split())
            if len(text) > width:
                text = text[: width - 3] + "..."
            lines.append(f"    {loc}, {c.n_tokens} tokens: \"{text}\"")
    return lines


def render(result: NestResult) -> str:
    """Answer with markers, a blank line, the sources, and a one-line summary."""
    s = result.stats
    parts = [with_markers(result).strip(), ""]
    if result.citations:
        parts += ["Sources:", *source_lines(result), ""]
    else:
        parts += ["Sources: none (no text was copied from the corpus)", ""]
    parts.append(
        f"{s.new_tokens} tokens in {s.time_total:.1f}s ({s.tokens_per_second:.1f} tok/s), "
        f"{s.forward_passes} forward passes, {s.attribution_ratio:.0%} attributed, "
        f"{len(result.passages)} passages searched"
    )
    return "\n".join(parts)
