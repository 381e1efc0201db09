"""Choosing the evidence of an answer before decoding (``core.evidence``): the sentence of the
prompt's passages that best answers the question, and the window NEST copies from.

Scorers (``EVIDENCE_SCORERS``):

- ``"overlap"``: the IDF-weighted share of the question's content words the sentence holds
  (``core.evidence.overlap_scores``);
- ``"embedding"``: the cosine of question and sentence under the retriever's embedder (the
  packaged MiniLM when it has none), the sentence read after its document's title (a sentence
  that names its subject by a pronoun is still about it);
- ``"combined"``: their mean.

The window runs from the best sentence to the end of its passage (at most ``window_chars``
characters, cut at a sentence end): an explanation goes on where the passage goes on, and the
model's own end-of-answer decides where a short answer stops (``Guards.eos_guard``).

Only a sentence about the question's subject may answer (``on_subject``): where the question
names one (``conversation.subject_of``), a sentence answers if its document is about it (its
title is found in the subject's words, ``retrieval.titles``), or if it says the subject and
something the question asks of it (a content word beyond the subject's). A definitional
question ("What is X?", "How does X work?": ``conversation.definitional_subject``) asks
nothing beyond its subject: a document about X answers it, or a sentence that opens with X
(its grammatical subject: "The return policy allows ..."), and a document's lead counts as
one (``EVIDENCE_LEAD``) only in a document about X. Where no sentence is about the subject and
no passage's document is (the corpus does not hold it), there is no evidence and
``Choice.absent`` names the subject (the policy then answers without the passages:
``policy.answer``).

Between a lead and an attribute, what the question asks beyond its subject decides
(``asked_beyond``: its content words not in the subject, its documents' headings or a
capitalised context): a sentence that states an asked word, as written or inflected, answers
("priced" for "price"); a question that asks nothing beyond its subject gets its document's
lead. A line that only names its document (``is_title_line``: a headword, a fact sheet's name)
is a heading, and a sentence that announces a block is quoted with it (``_through_block``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from nest_integrations.core.evidence import (
    STOP_WORDS,
    EvidenceSpan,
    content_words,
    overlap_scores,
    sentence_spans,
)
from nest_integrations.policy.conversation import definitional_subject, subject_of
from nest_integrations.retrieval.titles import TitleIndex, normalize
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

EVIDENCE_SCORERS = ("overlap", "embedding", "combined")
#: How much more a document's opening sentence counts when choosing the sentence that answers
#: (``choose_evidence``): reference text defines its subject first, often without repeating its
#: name, so "What is X?" and "How does X work?" are answered by X's lead, while a sentence that
#: holds the attribute asked for outscores it. Chosen on the dev split (``docs/decisions.md``,
#: "The sentence that answers"; ``python -m benchmarks.evidence_rank``): the pick opens with the
#: gold lead on 74/80 open-ended prompts at 0.1, 75/80 at 0.2 (64/80 before), and from 0.3 two of
#: 96 entity picks are lost.
EVIDENCE_LEAD = 0.2


#: A heading: a line underlined with a run of one of ``* = - ~ ^ #`` (reStructuredText, pydoc
#: topics), or a Markdown ``#`` line. It names a topic and says nothing about it.
_HEADING = re.compile(r"^[ \t]*(?:([*=\-~^#])\1{2,}[ \t]*$|#{1,6}[ \t]+\S)", re.MULTILINE)


@dataclass(frozen=True)
class Candidate:
    """One sentence of the prompt's passages as a candidate evidence sentence, with its scores:
    ``overlap`` and ``cosine`` (0.0 where that scorer did not run) and ``score``, the chosen
    scorer's (``gate``: the same with the question's every word, title words too: how much of
    the question the sentence holds, what ``evidence_min`` was chosen on); ``lead``: it opens its document (the first sentence of the document's first
    passage that is neither a heading nor on an indented line, as a grammar block); ``heading``: it is a heading; ``position``: its index among its
    passage's sentences."""

    passage: Passage
    start: int
    end: int
    overlap: float
    cosine: float
    score: float
    lead: bool
    heading: bool
    position: int
    gate: float = 0.0

    @property
    def text(self) -> str:
        return self.passage.text[self.start:self.end]

    @property
    def doc_id(self) -> str:
        return self.passage.doc_id or self.passage.id


def _indented(text: str, start: int) -> bool:
    """Whether the line a sentence starts on is indented (a code or grammar block, a list's
    continuation): no document's lead is said there."""
    line = text.rfind("\n", 0, start) + 1
    return text[line:start].startswith(("  ", "\t"))


def is_heading(sentence: str) -> bool:
    """Whether ``sentence`` is (or holds) a heading line (``_HEADING``)."""
    return _HEADING.search(sentence) is not None


#: How a sentence ends when it says something, before closing quotes and brackets (a title line
#: ends with none of these).
_SAYS = tuple(".!?:;")
_CLOSERS = "\"')]\u201d\u2019"
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
#: The most words a document's untitled first line may have and still be read as its title.
TITLE_LINE_WORDS = 12


def is_title_line(passage: Passage, start: int, end: int) -> bool:
    """Whether the sentence ``passage.text[start:end]`` is a line that names its document
    rather than says something: a whole line with no sentence-end punctuation that is the
    passage's title (``metadata["title"]``, compared normalized), or its document's first line,
    of at most ``TITLE_LINE_WORDS`` words, standing as its own paragraph. A dictionary entry's
    headword ("interlacing" above "A video display system ..."), a fact sheet's or a Markdown
    file's name line: none of them is the sentence that defines the subject."""
    text = passage.text
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    sentence = text[start:end].strip()
    if not sentence or text[line_start:start].strip() or text[end:line_end].strip():
        return False  # part of a line: prose
    if sentence.rstrip(_CLOSERS).endswith(_SAYS):
        return False
    title = (passage.metadata or {}).get("title")
    if isinstance(title, str) and title.strip() and normalize(sentence) == normalize(title):
        return True
    return (line_start == 0 and opens_document(passage) and _BLANK_LINE.match(text, line_end)
            is not None and len(sentence.split()) <= TITLE_LINE_WORDS)


def opens_document(passage: Passage) -> bool:
    """Whether ``passage`` is its document's first: it starts at offset 0, or is chunk 0."""
    meta = passage.metadata or {}
    if passage.char_start is not None:
        return passage.char_start == 0
    return meta.get("chunk_index") in (0, "0")


def candidates(question: str, passages: Sequence[Passage], scorer: str = "combined",
               retriever: Any = None) -> list[Candidate]:
    """Every sentence of ``passages`` (in passage, then text order) with its scores."""
    if scorer not in EVIDENCE_SCORERS:
        raise ValueError(f"evidence scorer {scorer!r} is unknown: choose one of "
                         f"{EVIDENCE_SCORERS}")
    spans = [(p, s, e) for p in passages for s, e in sentence_spans(p.text)]
    if not spans:
        return []
    texts = [p.text[s:e] for p, s, e in spans]
    zero = np.zeros(len(spans))
    overlap = _overlap_beyond_title(question, spans, texts) if scorer != "embedding" else zero
    raw = overlap_scores(question, texts) if scorer != "embedding" else zero
    cosine = (_cosines(question, [_titled(p, t) for (p, _, _), t in zip(spans, texts)], retriever)
              if scorer in ("embedding", "combined") else zero)
    score, gate = overlap + cosine, raw + cosine
    if scorer == "combined":
        score, gate = score / 2.0, gate / 2.0
    out, position, lead_seen = [], 0, set()
    prev = None
    for i, ((p, s, e), text) in enumerate(zip(spans, texts)):
        position = position + 1 if p is prev else 0
        prev = p
        heading = is_heading(text) or is_title_line(p, s, e)
        lead = (not heading and not _indented(p.text, s) and opens_document(p)
                and p.id not in lead_seen)
        if lead:
            lead_seen.add(p.id)
        out.append(Candidate(p, s, e, float(overlap[i]), float(cosine[i]), float(score[i]),
                             lead, heading, position, float(gate[i])))
    return out


def _overlap_beyond_title(question: str, spans: Sequence[tuple[Passage, int, int]],
                          texts: Sequence[str]) -> np.ndarray:
    """``overlap_scores`` of each sentence with the question's words beyond its document's
    title: the words that name the subject hold no answer (every sentence of the document is
    about it), so "What is X?" asked of X's document scores every sentence 0 there and the
    lead answers (``EVIDENCE_LEAD``), while "What is the Z of X?" scores the sentence with Z.
    IDF is over all the candidates."""
    words = content_words(question)
    out = np.zeros(len(spans))
    groups: dict[str, list[int]] = {}
    for i, (p, _, _) in enumerate(spans):
        groups.setdefault(str((p.metadata or {}).get("title") or ""), []).append(i)
    for title, idx in groups.items():
        named = set(content_words(title))
        rest = [w for w in words if w not in named]
        if rest:
            out[idx] = overlap_scores(" ".join(rest), texts)[idx]
    return out


def choose_evidence(
    question: str,
    passages: Sequence[Passage],
    scorer: str = "overlap",
    retriever: Any = None,
    window_chars: int = 1200,
    lead: float = EVIDENCE_LEAD,
) -> EvidenceSpan | None:
    """The evidence window for ``question`` in ``passages`` (the RA prompt's), or None when no
    passage has a sentence.

    The sentence that answers is the best-scoring one that is not a heading, a document's
    opening sentence counting ``lead`` more (ties: the earlier, in stage-1 then text order).
    Its window (what NEST may copy; the answer ends where the window ends):

    - an attribute (a sentence that is not its document's lead): that sentence alone;
    - a document's lead (what the subject is, how it works): the lead and what follows it in
      its passage, up to ``window_chars``, ending at a sentence end and never on a sentence
      that announces a block (``_window_end``).

    Only sentences about the question's subject compete (``on_subject``); None when there
    are none. ``EvidenceSpan.score`` is the best ``gate`` score of any of them (the policy's
    ``evidence_min`` asks whether the passages hold the question at all, with the question's
    every word, as it was chosen)."""
    return choose(question, passages, scorer, retriever, window_chars, lead).evidence


@dataclass(frozen=True)
class Choice:
    """``choose``'s answer: the ``evidence`` (None: none), and ``absent``: the question's
    subject where no passage's sentence or document is about it (``on_subject``), else None."""

    evidence: EvidenceSpan | None
    absent: str | None = None


def choose(question: str, passages: Sequence[Passage], scorer: str = "overlap",
           retriever: Any = None, window_chars: int = 1200, lead: float = EVIDENCE_LEAD
           ) -> Choice:  # fmt: skip
    """``choose_evidence``'s choice, and the subject the passages are not about (``Choice``)."""
    every = candidates(question, passages, scorer, retriever)
    cands, about, subject = on_subject(question, every)
    if not cands:
        return Choice(None, subject if every and about == set() else None)
    pool = [c for c in cands if not c.heading] or cands

    names = " ".join([subject or ""] + [c.text for c in cands if c.heading and (
        about is None or c.doc_id in about)])  # the subject, as the question and its headings say
    asked = asked_beyond(question, names)
    stating = _stating(asked, pool)

    def opens(c: Candidate) -> bool:  # a lead answers for its document's subject only
        return c.lead and (about is None or c.doc_id in about) and not stating

    leads = [c for c in pool if opens(c)] if about and not asked else []
    # a question that asks nothing beyond what its document is called: that document's lead;
    # one that asks for an attribute a sentence states: the best of those sentences
    best = max(leads or stating or pool, key=lambda c: c.score + lead * opens(c))  # the first
    p = best.passage
    said = _through_block(p.text, best.start, best.end, window_chars)
    end = _window_end(p.text, best.start, said, window_chars) if opens(best) else said
    top = max(c.gate for c in cands)
    LOG.debug("evidence (%s %.3f, lead=%s): %r", scorer, best.score, best.lead,
              best.text[:80])
    return Choice(EvidenceSpan(p.id, best.start, end, float(top), sentence_end=said))


def on_subject(question: str, cands: Sequence[Candidate]
               ) -> tuple[list[Candidate], set[str] | None, str | None]:  # fmt: skip
    """The candidates that may answer ``question``, the documents about its subject (None
    where the question names no subject, or no candidate's document has a title: nothing to
    judge by, every candidate stays), and the subject.

    The subject is ``conversation.subject_of``'s, read with the candidates' titles. A document
    is about it when its title is found in the subject's words (``TitleIndex.match``: "assert"
    in "assert statement", "Python (programming language)" for "Python"). A candidate stays
    when its document is about the subject, or when it names the subject (all its content
    words) and holds a content word the question asks beyond it ("capital" in "What was the
    Roman Empire's capital?"); a definitional question asks nothing beyond its subject
    (``conversation.definitional_subject``): its documents stay, and a sentence that opens
    with the subject (``_opens_with``: what a definition of it says first)."""
    index = TitleIndex.from_passages(c.passage for c in cands)
    subject = subject_of(question, index) if len(index) else None
    if not subject:
        return list(cands), None, None
    named = set(content_words(subject))
    about = {d for m in index.match(subject) for d in m.doc_ids}
    about |= {c.doc_id for c in cands if c.doc_id not in index.titles}  # untitled: unknown
    # a document whose own heading the question says is about what it asks ("dictionary
    # displays" under the heading "Dictionary displays", whatever its stored title)
    about |= {c.doc_id for c in cands if c.heading and _said_in(c.text, question)}
    definitional = definitional_subject(question) is not None
    asked = set() if definitional else set(content_words(question)) - named

    def stays(c: Candidate) -> bool:
        if c.doc_id in about or (definitional and _opens_with(c.text, subject)):
            return True
        words = set(content_words(c.text))
        return bool(named) and named <= words and bool(asked & words)

    kept = [c for c in cands if stays(c)]
    if len(kept) < len(cands):
        LOG.debug("evidence: %d of %d sentences are about %r (documents %s)", len(kept),
                  len(cands), subject, sorted(about))
    return kept, about, subject


def asked_beyond(question: str, names: str) -> set[str]:
    """The content words ``question`` asks beyond its subject (``names``: the subject as the
    question writes it, its documents' titles or headings): ``{"price"}`` for "Tell me the
    Zivatrotek Max 2's price.", none for "What is the raise statement for?" under the heading
    'The "raise" statement'. A definitional question ("What is X?", "How does X work?") asks
    none; a capitalised word inside the question names a context or another entity ("in
    Python"), not an attribute."""
    if definitional_subject(question) is not None:
        return set()
    named = set(content_words(names))
    proper = {w for t in question.split()[1:] if t[:1].isupper() for w in content_words(t)}
    return {w for w in content_words(question) if not _holds(w, named) and w not in proper}


def _stating(asked: set[str], pool: Sequence[Candidate]) -> list[Candidate]:
    """The sentences of ``pool`` other than a lead that state what ``asked`` asks for: each holds
    one of its words (as written or inflected: "price", "priced") that no lead holds. Where
    there are any, one of them answers, and no lead counts more."""
    if not asked:
        return []
    leads = set().union(*(content_words(c.text) for c in pool if c.lead))
    asked = {w for w in asked if not _holds(w, leads)}
    return [c for c in pool if not c.lead
            and any(_holds(w, content_words(c.text)) for w in asked)]


def _holds(word: str, words: Any) -> bool:
    """Whether ``words`` hold ``word`` or an inflection of it (one of the two is the other plus
    at most two letters: "price" and "priced", "execute" and "executes")."""
    for w in words:
        short, long_ = (w, word) if len(w) <= len(word) else (word, w)
        if long_.startswith(short) and len(short) >= 4 and len(long_) - len(short) <= 2:
            return True
        if w == word:
            return True
    return False


_ARTICLE = frozenset(("a", "an", "the"))


def _said_in(heading: str, question: str) -> bool:
    """Whether ``heading`` (its words, a leading article aside) is a run of whole words of
    ``question`` (compared normalized, as titles are)."""
    words = normalize(heading).split()
    words = words[1:] if words[:1] and words[0] in _ARTICLE else words
    if not words or all(w in STOP_WORDS for w in words):
        return False
    return f" {' '.join(words)} " in f" {normalize(question)} "


def _opens_with(sentence: str, subject: str) -> bool:
    """Whether ``sentence`` opens with ``subject`` as its whole noun phrase (after an article;
    plurals and case aside; then a function word: "Context managers are ..." for "context
    manager", not "Escape sequences are ..." for "escape")."""
    def words(text: str) -> list[str]:
        w = normalize(text).split()
        return w[1:] if w[:1] and w[0] in _ARTICLE else w

    want, have = words(subject), words(sentence)
    head, after = have[:len(want)], have[len(want):len(want) + 1]
    return bool(want) and len(head) == len(want) and all(w in STOP_WORDS for w in after) \
        and content_words(" ".join(head)) == content_words(" ".join(want))


def _window_end(text: str, start: int, first_end: int, window_chars: int) -> int:
    """The end of the window that starts at ``start``: the last sentence end within
    ``window_chars`` of it (at least the first sentence's) that does not announce what follows
    (``_announces``: "... is equivalent to" before its code block), or the passage's own end
    (what a sentence announces is then all there)."""
    spans = sentence_spans(text)
    end = first_end
    for k, (s, e) in enumerate(spans):
        if s < first_end:
            continue
        if e - start > window_chars:
            break
        if k == len(spans) - 1 or not _announces(text[s:e]):
            end = e
    return end


def _through_block(text: str, start: int, end: int, window_chars: int) -> int:
    """Where the sentence that ends at ``end`` is said in full: where it announces a block
    ("... various numeric literals:", "... is equivalent to") that follows on indented lines
    (code, a grammar), the end of that block, as far as it fits ``window_chars`` from
    ``start``; else ``end``. A lead-in is never said without what it introduces."""
    if not _announces(text[start:end]):
        return end
    for s, e in sentence_spans(text):
        if s < end:
            continue
        if not _indented(text, s) or e - start > window_chars:
            break
        end = e
    return end


def _announces(sentence: str) -> bool:
    """Whether ``sentence`` introduces what follows it: it ends with ``:`` or without closing
    punctuation (a lead-in to a block, a list or code)."""
    tail = sentence.rstrip().rstrip("\"')]»”’")
    return not tail or tail[-1] not in ".!?"


def _titled(passage: Passage, sentence: str) -> str:
    """``sentence`` as the embedder reads it: after its document's title, so that a sentence
    that names its subject only by a pronoun ("Its capital is Lilongwe.") is still about it."""
    title = str((passage.metadata or {}).get("title") or "").strip()
    return f"{title}: {sentence}" if title and title.lower() not in sentence.lower() else sentence


def _cosines(question: str, texts: Sequence[str], retriever: Any) -> np.ndarray:
    from nest_integrations.embedders.port import default_embedder, embed
    from nest_integrations.retrieval.relevance import embedder_of

    embedder = embedder_of(retriever) or default_embedder()
    m = embed(embedder, [question, *texts])
    return np.clip(m[1:] @ m[0], 0.0, 1.0)


__all__ = ["EVIDENCE_SCORERS", "Candidate", "Choice", "candidates", "choose", "choose_evidence",
           "asked_beyond", "is_heading", "is_title_line", "on_subject", "opens_document"]
