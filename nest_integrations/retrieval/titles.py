"""Title match (issue 22, ``NestConfig.title_match``): the document a question names goes first.

Dense retrieval ranks by meaning, so a document that *mentions* the question's entity (a
disambiguation note, a neighbouring entry that cites it, a topic sharing its words) can outrank
the document *titled* with it; and ``span_passages=1`` then copies from the wrong one. With
``title_match`` the engine reads the question's entity (``core.question.question_entity``) and

1. moves every retrieved passage whose document title equals it (case, whitespace and
   surrounding quotes aside) to the front, in retrieval order, the rest keeping theirs;
2. where none of the retrieved passages has that title and the retriever can look titles up
   (``passages_titled``, on ``ChromaPassageStore``, ``InMemoryRetriever`` and the hybrid
   retriever), puts the titled document's first passage first and drops the last one, so the
   list keeps its length.

Exact titles only: "Korvanta Systems (disambiguation)" is not "Korvanta Systems". Matched
passages carry ``metadata["title_match"] = True``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from nest_integrations.types import Passage

_SPACE = re.compile(r"\s+")
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"
#: Passages a title lookup reads per call (the first passage of each titled document is kept).
LOOKUP_LIMIT = 32


def _clean(text: str) -> str:
    return _SPACE.sub(" ", str(text)).strip().strip(_QUOTES).strip()


def norm_title(text: str) -> str:
    """A title or entity as compared: case-folded, whitespace collapsed, quotes stripped."""
    return _clean(text).casefold()


def title_variants(entity: str) -> list[str]:
    """Spellings of ``entity`` to look up in a store that matches titles exactly."""
    e = _clean(entity)
    out = [e, e.lower(), e[:1].upper() + e[1:], e.title(), e.capitalize()]
    return list(dict.fromkeys(v for v in out if v))


def title_of(p: Passage) -> str:
    return str((p.metadata or {}).get("title") or "")


def first_passages(passages: Sequence[Passage]) -> list[Passage]:
    """The first passage (lowest ``chunk_index``, else char_start) of each document, in the
    order the documents first appear."""
    best: dict[str, Passage] = {}

    def pos(p: Passage) -> tuple[int, int]:
        ci = (p.metadata or {}).get("chunk_index")
        ci = ci if isinstance(ci, int) and not isinstance(ci, bool) else 0
        return ci, p.char_start or 0

    for p in passages:
        key = p.doc_id or p.id
        if key not in best or pos(p) < pos(best[key]):
            best[key] = p
    return list(best.values())


def title_first(
    passages: Sequence[Passage],
    entity: str | Sequence[str] | None,
    lookup: Callable[[Sequence[str], int], Sequence[Passage]] | None = None,
) -> list[Passage]:
    """``passages`` with the passages of the document titled ``entity`` first (see the module
    docstring). ``entity`` may be a list of candidate names (``core.question.question_entities``,
    longest first): the first that is a title wins. ``lookup(titles, limit)`` returns stored
    passages whose title is one of ``titles``; it is called at most once, with every
    candidate's spellings, and only when no retrieved passage matches any candidate."""
    passages = list(passages)
    names = [entity] if isinstance(entity, str) else list(entity or [])
    wanted = list(dict.fromkeys(w for w in (norm_title(n) for n in names) if w))
    if not wanted or not passages:
        return passages
    for want in wanted:
        hit = [p for p in passages if norm_title(title_of(p)) == want]
        if hit:
            hit_ids = {p.id for p in hit}
            return [_mark(p) for p in hit] + [p for p in passages if p.id not in hit_ids]
    if lookup is None:
        return passages
    spellings = list(dict.fromkeys(v for n in names for v in title_variants(n)))
    found = first_passages(lookup(spellings, LOOKUP_LIMIT))
    ids = {p.id for p in passages}
    for want in wanted:
        extra = [p for p in found if norm_title(title_of(p)) == want and p.id not in ids]
        if extra:
            return [_mark(extra[0])] + passages[: len(passages) - 1]
    return passages


def prompt_passages(passages: Sequence[Passage], n: int, titled_only: bool = False) -> list[Passage]:
    """The ``n`` passages an RA prompt holds: the first ``n``, or with ``titled_only``
    (``NestConfig.title_context``) the title-matched ones when there are any."""
    if n <= 0:
        return []
    if titled_only:
        titled = [p for p in passages if (p.metadata or {}).get("title_match")]
        if titled:
            return titled[:n]
    return list(passages[:n])


def _mark(p: Passage) -> Passage:
    return dataclasses.replace(p, metadata={**(p.metadata or {}), "title_match": True})


def lookup_of(retriever: Any) -> Callable[[Sequence[str], int], Sequence[Passage]] | None:
    """The retriever's ``passages_titled`` (an optional capability), else None."""
    fn = getattr(retriever, "passages_titled", None)
    return fn if callable(fn) else None


__all__ = ["LOOKUP_LIMIT", "first_passages", "lookup_of", "norm_title", "prompt_passages",
           "title_first",
           "title_variants"]
