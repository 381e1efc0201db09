"""Attribution: per-token sources merged into span citations (NEST §8).

A source is ``(passage index, token position)``. Consecutive output tokens from the same
passage at consecutive positions form one run. A run's char ranges come from the output's token
ends and the passage's token offsets; the citation is then made **exact** against both texts:

    output_text[c.start:c.end] == c.text == passage.text[c.passage_start:c.passage_end]
    (and source_text[c.source_start:c.source_end] == c.text)

under any tokenizer. The two ranges decode the same tokens, but tokenizers disagree with their
own offsets at the edges: SentencePiece decodes a mid-output "▁The" as " The" while the passage's
first token covers "The"; a run that ends inside a multi-byte character holds U+FFFD in the
output; WordPiece decodes "Rome." as "Rome ."; normalizers change characters. The rules:

- **Whitespace rule**: a citation never starts or ends with whitespace. Both ranges are trimmed
  of leading and trailing whitespace (``str.isspace``), each on its own, so a space that only one
  side holds (the SentencePiece case) is never cited.
- If the trimmed texts still differ, the run is **split** into the longest exactly matching
  pieces (``difflib`` matching blocks of the two texts), each trimmed again; pieces shorter than
  ``MIN_PIECE_CHARS`` non-space characters or without a letter or digit are dropped. A piece's
  ``n_tokens`` counts the run's tokens whose output text overlaps it.
- **Word rule**: a citation never starts or ends inside a word or a number, in the output or in
  the passage (``snap_to_words``: its edges move inward, in both texts at once, past any partial
  word; "Aruba is King" cited from "ruba is King" becomes "is King", a number's decimal or
  thousands separator counts as inside it, and so does a hyphen or an apostrophe between two
  letters or digits: "just-in-time", "Cambodia's"). Dangling brackets and separators at its
  edges go too.
- A run whose texts share nothing citable gives no citation (its tokens keep their sources).
- **Clause rule** (``clause_rule``, with ``build_citations(..., clauses=True)``): a copy or
  verbatim citation on a document other than the answer's is kept only when it covers a whole
  clause of the output (``whole_clause``): scraps of another document ("of state of" cited from
  Niue's profile in an answer about Aruba) would make a wrong answer look checked. The answer's
  document (``answer_document``) is the evidence's document when the answer has evidence,
  otherwise the document with the most cited characters (ties: the one cited first). The rule
  judges the runs' pieces before they merge; a dropped piece's tokens keep their sources.
- **Adjacent runs merge**: two citations of one passage whose gap reads the same in the output
  and in the passage ("equivalent to" + "\n\n   " + "if not expression") are one citation.

Without the output text (``text=None`` and ``token_ends`` carrying none) the ranges are used as
computed (exact for byte-level BPE over a round-tripping passage, not in general).
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from nest_integrations.types import Citation, Passage

Source = tuple[int, int] | None

#: Shortest split piece kept (characters, whitespace excluded).
MIN_PIECE_CHARS = 3


def source_runs(sources: Sequence[Source]) -> list[tuple[int, int]]:
    """Maximal runs ``[i, j)`` of output tokens with consecutive positions in one passage."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(sources):
        if sources[i] is None:
            i += 1
            continue
        j = i + 1
        while j < len(sources) and continues_run(sources[j - 1], sources[j]):
            j += 1
        runs.append((i, j))
        i = j
    return runs


def build_citations(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    kind: str = "copy",
    text: str | None = None,
    *,
    clauses: bool = False,
    evidence_doc: str | None = None,
    cache: dict[tuple, list[Citation]] | None = None,
) -> list[Citation]:
    """Exact span citations for an output whose token ``i`` ends at char ``token_ends[i]``.

    Args:
        sources: per output token, ``(passage index, token position)`` or None.
        token_ends: char offset in the output text where each token ends (non-decreasing).
        passages: the memory's passages, by index.
        offsets: per passage, the ``(m, 2)`` char range of each token in the passage text.
        kind: ``Citation.kind``.
        text: the output text; defaults to ``token_ends.text`` when the ends carry it (as
            ``text_stream.OutputText.ends`` does). With it every citation is exact (see the
            module docstring).
        clauses: apply the clause rule (needs the text): pieces on a document other than the
            answer's (``answer_document``: ``evidence_doc``, else the most cited) are kept only
            when they cover a whole clause.
        evidence_doc: the document of the answer's evidence, if any (with ``clauses``).
        cache: ``run_pieces``' cache (a stream's, which has computed most runs already).
    """
    text = _text_of(token_ends, text)
    cites = run_pieces(sources, token_ends, passages, offsets, kind, text, cache)
    if text is None:
        return cites
    if clauses:
        verdicts = clause_rule(cites, text, answer_document(cites, evidence_doc))
        cites = [c for c, keep in zip(cites, verdicts) if keep]
    return merge_adjacent(cites, passages, text)


def run_pieces(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    kind: str = "copy",
    text: str | None = None,
    cache: dict[tuple, list[Citation]] | None = None,
) -> list[Citation]:
    """The exact, whole-word citations of each run (a split run gives several), in output
    order, before the clause rule and before adjacent ones merge (``build_citations``).

    ``cache``: a run's pieces by what they depend on (the run, its char range and the text
    around it), so that a stream recomputes only the runs that changed."""
    text = _text_of(token_ends, text)
    cites: list[Citation] = []
    for i, j in source_runs(sources):
        if cache is None or text is None:
            cites.extend(_citations(sources, token_ends, passages, offsets, i, j, kind, text))
            continue
        s, e = int(token_ends[i - 1]) if i > 0 else 0, int(token_ends[j - 1])
        key = (i, j, sources[i], sources[j - 1], kind, s, e, text[max(0, s - 2) : e + 2])
        if key not in cache:  # word edges read two characters either side of the run
            cache[key] = _citations(sources, token_ends, passages, offsets, i, j, kind, text)
        cites.extend(cache[key])
    return cites


def merge_adjacent(cites: Sequence[Citation], passages: Sequence[Passage],
                   text: str) -> list[Citation]:
    """``cites`` (in output order) with each two neighbours of one passage and kind joined where
    the gap between them reads the same in ``text`` and in the passage."""
    by_id = {p.id: p for p in passages}
    out = []
    for group in adjacent_groups(cites, passages, text):
        first, last = cites[group[0]], cites[group[-1]]
        if len(group) == 1:
            out.append(first)
        else:
            out.append(make_citation(by_id[first.passage_id], first.start, last.end,
                                     first.passage_start, last.passage_end,
                                     sum(cites[k].n_tokens for k in group), first.kind))
    return out


def adjacent_groups(cites: Sequence[Citation], passages: Sequence[Passage],
                    text: str) -> list[list[int]]:
    """The indices of ``cites`` that ``merge_adjacent`` joins into one citation, group by group
    (in output order)."""
    by_id = {p.id: p for p in passages}
    groups: list[list[int]] = []
    for k, c in enumerate(cites):
        prev = cites[groups[-1][-1]] if groups else None
        passage = by_id.get(c.passage_id)
        if (prev is not None and passage is not None and prev.passage_id == c.passage_id
                and prev.kind == c.kind and c.start >= prev.end
                and c.passage_start >= prev.passage_end
                and text[prev.end:c.start] == passage.text[prev.passage_end:c.passage_start]):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


#: Characters that end a clause (the clause rule), and the brackets that open and close one.
CLAUSE_MARKS = ".,;:!?"
OPEN_BRACKETS = "([{"
CLOSE_BRACKETS = ")]}"
#: The citation kinds the clause rule judges (support citations cite a whole sentence anyway).
CLAUSE_RULE_KINDS = ("copy", "verbatim")


def clause_start(text: str, i: int) -> bool:
    """Whether a clause of ``text`` starts at ``i``: only whitespace before it, or, past
    whitespace, a line break, one of ``CLAUSE_MARKS`` or an opening bracket; or ``text[i]``
    itself opens a bracket."""
    if i < len(text) and text[i] in OPEN_BRACKETS:
        return True
    while i > 0 and text[i - 1].isspace():
        if text[i - 1] == "\n":
            return True
        i -= 1
    return i == 0 or text[i - 1] in CLAUSE_MARKS or text[i - 1] in OPEN_BRACKETS


def clause_end(text: str, i: int, open_end: bool = False) -> bool | None:
    """Whether a clause of ``text`` ends at ``i``: ``text[i - 1]`` is one of ``CLAUSE_MARKS`` or
    a closing bracket, or, past whitespace, a line break, one of them, or the end of the text.

    ``open_end``: the text may still go on (a stream), so only whitespace up to its end says
    nothing yet: None."""
    if i > 0 and (text[i - 1] in CLAUSE_MARKS or text[i - 1] in CLOSE_BRACKETS):
        return True
    while i < len(text) and text[i].isspace():
        if text[i] == "\n":
            return True
        i += 1
    if i == len(text):
        return None if open_end else True
    return text[i] in CLAUSE_MARKS or text[i] in CLOSE_BRACKETS


def whole_clause(text: str, start: int, end: int, open_end: bool = False) -> bool | None:
    """Whether ``text[start:end]`` covers a whole clause: it starts at a clause start and ends at
    a clause end (``clause_start``, ``clause_end``; None when ``open_end`` leaves its end not
    known yet)."""
    if not clause_start(text, start):
        return False
    return clause_end(text, end, open_end)


def document_of(citation: Citation) -> str:
    """The document a citation names: its ``doc_id``, else its passage (a passage of no
    document is one of its own)."""
    return citation.doc_id if citation.doc_id is not None else citation.passage_id


def answer_document(cites: Sequence[Citation], evidence_doc: str | None = None) -> str | None:
    """The answer's document: ``evidence_doc`` when the answer has evidence, otherwise the
    document of ``cites`` with the most cited characters (whitespace excluded; ties: the one
    cited first); None without either."""
    if evidence_doc is not None:
        return evidence_doc
    chars: dict[str, int] = {}
    for c in cites:
        if c.kind in CLAUSE_RULE_KINDS:
            d = document_of(c)
            chars[d] = chars.get(d, 0) + sum(not ch.isspace() for ch in c.text)
    return max(chars, key=lambda d: chars[d]) if chars else None  # max keeps the first of ties


def clause_rule(cites: Sequence[Citation], text: str, document: str | None,
                open_end: bool = False) -> list[bool | None]:
    """Per citation of ``text``: kept (True) when it is on ``document`` (the answer's), is not
    a copy or verbatim citation, or covers a whole clause (``whole_clause``); else dropped
    (False).

    Streams (``decoding.text_stream``) pass what they know so far: ``document=None`` when the
    answer's document is not known yet (no evidence: the most cited one can change) and
    ``open_end`` while the text goes on; a verdict they cannot know yet is None."""
    out: list[bool | None] = []
    for c in cites:
        if c.kind not in CLAUSE_RULE_KINDS or (document is not None
                                               and document_of(c) == document):
            out.append(True)
            continue
        whole = whole_clause(text, c.start, c.end, open_end)
        out.append(True if whole else None if whole is None or document is None else False)
    return out


def continues_run(prev: Source, cur: Source) -> bool:
    """Whether token source ``cur`` extends the run ending at ``prev``: the same passage, the
    next position."""
    return prev is not None and cur is not None and cur[0] == prev[0] and cur[1] == prev[1] + 1


def _text_of(token_ends: Sequence[int], text: str | None) -> str | None:
    return text if text is not None else getattr(token_ends, "text", None)


def _citations(
    sources: Sequence[Source],
    token_ends: Sequence[int],
    passages: Sequence[Passage],
    offsets: Sequence[np.ndarray],
    i: int,
    j: int,
    kind: str,
    text: str | None,
) -> list[Citation]:
    p, first = sources[i]  # type: ignore[misc]
    last = sources[j - 1][1]  # type: ignore[index]
    passage = passages[p]
    ps, pe = int(offsets[p][first, 0]), int(offsets[p][last, 1])
    s = int(token_ends[i - 1]) if i > 0 else 0
    e = int(token_ends[j - 1])
    if text is None:  # no output text to check against: the ranges as computed
        return [make_citation(passage, s, e, ps, pe, j - i, kind)]
    pieces = [snapped for piece in exact_pieces(text, s, e, passage.text, ps, pe)
              if (snapped := snap_to_words(text, passage.text, *piece)) is not None]
    if len(pieces) == 1:
        (s2, e2, ps2, pe2), = pieces
        return [make_citation(passage, s2, e2, ps2, pe2, j - i, kind)]
    out = []
    for s2, e2, ps2, pe2 in pieces:  # a split run: count the tokens overlapping each piece
        n = sum(
            1
            for k in range(i, j)
            if int(token_ends[k]) > s2 and (int(token_ends[k - 1]) if k > 0 else 0) < e2
        )
        out.append(make_citation(passage, s2, e2, ps2, pe2, max(n, 1), kind))
    return out


def exact_pieces(
    out: str, s: int, e: int, src: str, ps: int, pe: int
) -> list[tuple[int, int, int, int]]:
    """Exactly matching, whitespace-trimmed pieces ``(start, end, src_start, src_end)`` of the
    output range ``out[s:e]`` and the source range ``src[ps:pe]`` (see the module docstring)."""
    s, e = max(0, min(s, len(out))), max(0, min(e, len(out)))
    ps, pe = max(0, min(ps, len(src))), max(0, min(pe, len(src)))
    so, eo = trim_span(out, s, e)
    sp, ep = trim_span(src, ps, pe)
    if so < eo and out[so:eo] == src[sp:ep]:
        return [(so, eo, sp, ep)]
    a_text, b_text = out[s:e], src[ps:pe]
    if not a_text or not b_text:
        return []
    pieces = []
    matcher = SequenceMatcher(None, a_text, b_text, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        if not size:
            continue
        a0, a1 = trim_span(a_text, a, a + size)
        if a1 - a0 < MIN_PIECE_CHARS or not any(ch.isalnum() for ch in a_text[a0:a1]):
            continue
        b0 = b + (a0 - a)
        pieces.append((s + a0, s + a1, ps + b0, ps + b0 + (a1 - a0)))
    return pieces


#: Characters a citation does not start with, and does not end with (after the word rule).
_NO_START = " \t\r\n,;:.)]}»”’"
_NO_END = " \t\r\n,;([{«“‘-"
#: Characters that join the letters or digits on their two sides into one word.
_JOINERS = "-'’"


def word_edge(text: str, i: int) -> bool:
    """Whether position ``i`` of ``text`` is not inside a word or a number: a letter or digit on
    both sides is inside, and so is a ``.`` or ``,`` between two digits ("77.5", "1,000") and a
    hyphen or an apostrophe between two letters or digits ("just-in-time", "Cambodia's")."""
    if i <= 0 or i >= len(text):
        return True
    a, b = text[i - 1], text[i]
    if a.isalnum() and b.isalnum():
        return False
    after = text[i + 1] if i + 1 < len(text) else ""
    before = text[i - 2] if i >= 2 else ""
    if b in ".," and a.isdigit() and after.isdigit():
        return False
    if a in ".," and b.isdigit() and before.isdigit():
        return False
    if b in _JOINERS and a.isalnum() and after.isalnum():
        return False
    if a in _JOINERS and b.isalnum() and before.isalnum():
        return False
    return True


def snap_to_words(
    out: str, src: str, s: int, e: int, ps: int, pe: int
) -> tuple[int, int, int, int] | None:
    """An exact piece (``out[s:e] == src[ps:pe]``) narrowed until both its edges are word edges
    in both texts, then past edge whitespace and dangling separators or brackets (the word rule
    of the module docstring); None when nothing citable is left."""
    while s < e and not (word_edge(out, s) and word_edge(src, ps)):
        s, ps = s + 1, ps + 1
    while e > s and not (word_edge(out, e) and word_edge(src, pe)):
        e, pe = e - 1, pe - 1
    while s < e and out[s] in _NO_START:
        s, ps = s + 1, ps + 1
    while e > s and out[e - 1] in _NO_END:
        e, pe = e - 1, pe - 1
    piece = out[s:e]
    if len(piece.replace(" ", "")) < MIN_PIECE_CHARS or not any(ch.isalnum() for ch in piece):
        return None
    return s, e, ps, pe


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` narrowed past leading and trailing whitespace (``str.isspace``) of
    ``text``: the whitespace rule of citations, and of passages (``ingest.splitter``)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def make_citation(
    passage: Passage, s: int, e: int, ps: int, pe: int, n: int, kind: str,
    score: float | None = None,
) -> Citation:
    """The citation of output span ``[s, e)`` to ``passage.text[ps:pe]`` (source offsets from
    ``passage.char_start`` when known)."""
    src_start = passage.char_start + ps if passage.char_start is not None else None
    return Citation(
        text=passage.text[ps:pe],
        start=s,
        end=e,
        passage_id=passage.id,
        doc_id=passage.doc_id,
        passage_start=ps,
        passage_end=pe,
        source_start=src_start,
        source_end=src_start + (pe - ps) if src_start is not None else None,
        n_tokens=n,
        metadata=dict(passage.metadata),
        kind=kind,
        score=score,
    )
