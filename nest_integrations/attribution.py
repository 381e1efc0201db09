"""Post-hoc attribution of any text to passages, with exact offsets (issue 23).

``attribute(text, passages)`` checks a text written by any model (ours, a hosted chat model, a
person) against the passages it should rest on. The text is split into sentences, and long
sentences into clauses (``split_units``: exact offsets, ``text[start:end]`` is the unit). For
each unit:

- **Verbatim**: the longest runs of tokens that also occur in a passage, at least
  ``min_verbatim_tokens`` long and inside one sentence, become ``Citation(kind="verbatim")``.
  Tokens are the LM's (``lm.tokenize_with_offsets``) when an ``lm`` is given, else words
  (``word_tokens``: runs of letters/digits, single CJK characters, single punctuation marks);
  ``Attribution.tokenizer`` says which. The char ranges are made exact with
  ``core.citations.exact_pieces``, so by construction
  ``text[c.start:c.end] == c.text == passage.text[c.passage_start:c.passage_end]``
  (and ``== source[c.source_start:c.source_end]``).
- **Support**: a unit that is not (almost) all verbatim (or holds a value, with
  ``check_values``, outside its verbatim runs) is compared with every sentence and
  clause of the passages by the ``scorer``; the best one, when its score reaches the
  threshold, becomes ``Citation(kind="support", score=...)``: ``c.text`` is the *passage*
  sentence (``passage.text[c.passage_start:c.passage_end] == c.text``), ``c.start``/``c.end``
  the answer unit's span.
- **Unsupported**: otherwise the unit is listed in ``Attribution.unsupported``.

Scorers (``AttributionConfig.scorer``):

- ``"embedding"``: cosine of sentence embeddings (the package's MiniLM embedder by default,
  the one Chroma uses; any object with ``embed(texts)`` or ``embed_documents(texts)``);
- ``"keys"``: token-level kNN over the LM's own hidden states: each unit token's key (the
  unit encoded like a passage) against the stored keys of the passage sentence (NEST's key
  store; encoded on the fly without one), mean of the best cosine per token (centred keys);
- ``"combined"``: the mean of the two;
- ``"fuzzy"``: the plain string baseline (what LangChain's recipes do): ``difflib`` matched
  characters of the unit within the candidate, over the unit's length.

With ``check_values`` (default on) a candidate counts only when its passage holds every
*value* of the unit (numbers and names: capitalised words, the first one unless it is a
function word or opens a lead-in phrase), and its sentence every quoted term (a code name
such as "assert" or `__debug__`), so "in 1912" is not supported by "in 1921", nor "X's CEO is
Y" by a passage on Z, nor 'the "|" operator' by the sentence on "^".
Thresholds per scorer (``DEFAULT_THRESHOLDS``) are chosen on the dev split of
``benchmarks/bench_attribution.py``.

Usage::

    from nest_integrations.attribution import attribute

    a = attribute("Rome was founded in 753 BC.", ["Rome was founded, by legend, in 753 BC."])
    a.sentences[0].verdict, a.citations, a.unsupported

Framework-free: imports ``core``, ``types`` and (lazily) the embedder and the key store.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from nest_integrations.core.citations import exact_pieces, make_citation, trim_span
from nest_integrations.types import Citation, Passage, UnsupportedSentence

LOG = logging.getLogger(__name__)

SCORERS = ("embedding", "keys", "combined", "fuzzy")
VERDICTS = ("verbatim", "support", "unsupported")

#: Support thresholds per scorer, chosen on the DEV split of ``bench_attribution.py`` (with
#: ``check_values``) by its rule (``choose_threshold``): among the thresholds whose dev support
#: precision is >= 92% (a margin over the 90% test target), the middle of the range with the
#: highest dev recall; never on test. Test-split figures in benchmarks/results/attribution.md.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "embedding": 0.6159,
    "keys": 0.6661,
    "combined": 0.51,
    "fuzzy": 0.5577,
}

__all__ = [
    "Attribution",
    "AttributionConfig",
    "Attributor",
    "DEFAULT_THRESHOLDS",
    "SCORERS",
    "SentenceAttribution",
    "SentenceStream",
    "UnsupportedSentence",
    "attribute",
    "split_sentences",
    "split_units",
    "word_tokens",
]


# --------------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class AttributionConfig:
    """How ``attribute`` decides.

    Attributes:
        min_verbatim_tokens: shortest verbatim run cited, in tokens of the tokenizer used. 6:
            the shortest run (word tokens) that cites nothing in sentences of unrelated
            documents and in 1% of fabricated ones (5: 3%; bench_attribution.py).
        support_threshold: lowest support score; None = ``DEFAULT_THRESHOLDS[scorer]``.
        scorer: ``"embedding"``, ``"keys"``, ``"combined"`` or ``"fuzzy"`` (module docstring).
        check_values: a candidate counts (else its score is 0) only when its passage holds
            every value (number, name) of the unit.
        verbatim_coverage: a unit whose non-space characters are at least this much covered by
            verbatim citations has the verdict ``"verbatim"`` (no support search).
        max_clause_chars: sentences longer than this are split into clauses.
        min_clause_chars: clauses shorter than this are merged into a neighbour.
        k: passages retrieved when a retriever is used.
        tokenizer: ``"auto"`` (the LM's when one is given, else words), ``"lm"`` or ``"words"``.
    """

    min_verbatim_tokens: int = 6
    support_threshold: float | None = None
    scorer: str = "embedding"
    check_values: bool = True
    verbatim_coverage: float = 0.8
    max_clause_chars: int = 160
    min_clause_chars: int = 25
    k: int = 4
    tokenizer: str = "auto"

    def __post_init__(self) -> None:
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}: use one of {SCORERS}")
        if self.tokenizer not in ("auto", "lm", "words"):
            raise ValueError(f"tokenizer must be 'auto', 'lm' or 'words', not {self.tokenizer!r}")
        for name in ("min_verbatim_tokens", "max_clause_chars", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0 <= self.min_clause_chars <= self.max_clause_chars:
            raise ValueError("min_clause_chars must be between 0 and max_clause_chars")
        if not 0.0 < self.verbatim_coverage <= 1.0:
            raise ValueError(f"verbatim_coverage must be in (0, 1], got {self.verbatim_coverage}")
        if self.support_threshold is not None and not -1.0 <= self.support_threshold <= 1.0:
            raise ValueError(f"support_threshold must be in [-1, 1], got {self.support_threshold}")

    @property
    def threshold(self) -> float:
        """The support threshold in use."""
        if self.support_threshold is not None:
            return float(self.support_threshold)
        return DEFAULT_THRESHOLDS[self.scorer]

    def replace(self, **changes: Any) -> "AttributionConfig":
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------------- results


@dataclass
class SentenceAttribution:
    """The verdict on one answer unit (a sentence, or a clause of a long one).

    Attributes:
        text, start, end: the unit, ``answer[start:end] == text``.
        verdict: ``"verbatim"``, ``"support"`` or ``"unsupported"``.
        score: the best support score (1.0 for a verbatim unit; None when nothing was scored).
        passage_id: the passage of the support citation, or of the best candidate.
        coverage: share of the unit's non-space characters covered by verbatim citations.
    """

    text: str
    start: int
    end: int
    verdict: str
    score: float | None = None
    passage_id: str | None = None
    coverage: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Attribution:
    """What ``attribute`` returns.

    Attributes:
        text: the attributed text, as given.
        citations: verbatim and support citations, in text order.
        unsupported: the units no passage supports.
        sentences: one verdict per unit, in text order.
        passages: the passages the text was checked against.
        tokenizer: the tokens of verbatim runs: ``"words"`` or the LM's name.
        scorer: the support scorer used; ``threshold``: its threshold.
        time: seconds spent.
    """

    text: str
    citations: list[Citation] = field(default_factory=list)
    unsupported: list[UnsupportedSentence] = field(default_factory=list)
    sentences: list[SentenceAttribution] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    tokenizer: str = "words"
    scorer: str = "embedding"
    threshold: float = 0.0
    time: float = 0.0

    @property
    def supported_ratio(self) -> float:
        """Share of units with a verbatim or support verdict (1.0 for no units)."""
        if not self.sentences:
            return 1.0
        return sum(s.verdict != "unsupported" for s in self.sentences) / len(self.sentences)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "citations": [c.to_dict() for c in self.citations],
            "unsupported": [u.to_dict() for u in self.unsupported],
            "sentences": [s.to_dict() for s in self.sentences],
            "passages": [dataclasses.asdict(p) for p in self.passages],
            "tokenizer": self.tokenizer,
            "scorer": self.scorer,
            "threshold": self.threshold,
            "supported_ratio": self.supported_ratio,
            "time": self.time,
        }


# --------------------------------------------------------------------------------- splitting

#: Words whose trailing period does not end a sentence.
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al mr mrs ms dr prof st jr sr no fig approx ca c inc ltd co".split()
)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_END = re.compile(  # ". " (closing quotes kept), CJK ends, blank lines, list items
    r"[.!?]+[\"')\]»”’]*(?=\s)|[。！？]+[」』）]*|\n\s*\n|\n(?=\s*(?:[-*•]|\d+\.)\s)"
)
_CLAUSE = re.compile(
    r"[;:](?=\s)|,(?=\s+(?:and|but|or|which|while|who|whose|where|although|whereas|because|"
    r"so|yet|then|when)\b)|\s[–—-]\s"
)
_WORD_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def split_units(
    text: str, max_clause_chars: int = 160, min_clause_chars: int = 25
) -> list[tuple[int, int]]:
    """Sentences of ``text`` as ``(start, end)`` spans (whitespace-trimmed, exact), with
    sentences longer than ``max_clause_chars`` split into clauses (at ``;``, ``:``, dashes and
    ", and/but/which/..."); clauses shorter than ``min_clause_chars`` join a neighbour."""
    units = []
    for s, e in split_sentences(text):
        if e - s <= max_clause_chars:
            units.append((s, e))
        else:
            units.extend(_clauses(text, s, e, min_clause_chars))
    return units


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentences of ``text`` as whitespace-trimmed ``(start, end)`` spans (no clause split);
    a period after an abbreviation or an initial, or before a lower-case word, ends none."""
    spans, start = [], 0
    for m in _END.finditer(text):
        end = m.end()
        if m.group().startswith(".") and _abbreviation(text, m.start()):
            continue
        spans.append((start, end))
        start = end
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        s, e = trim_span(text, s, e)
        if s < e and any(ch.isalnum() for ch in text[s:e]):
            out.append((s, e))
        elif s < e and out:  # stray punctuation joins the previous sentence
            out[-1] = (out[-1][0], e)
    return out


def _abbreviation(text: str, dot: int) -> bool:
    """Whether the period at ``dot`` ends an abbreviation or an initial (no sentence end)."""
    m = re.search(r"([\w.]+)$", text[:dot])
    if not m:
        return False
    word = m.group(1).lower().rstrip(".")
    if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return True
    nxt = text[dot + 1 :].lstrip()
    return bool(nxt) and nxt[0].islower()  # "... approx. three" / lowercase goes on


def _clauses(text: str, s: int, e: int, min_chars: int) -> list[tuple[int, int]]:
    cuts = [s] + [s + m.end() for m in _CLAUSE.finditer(text[s:e])] + [e]
    pieces = [trim_span(text, a, b) for a, b in zip(cuts, cuts[1:])]
    pieces = [(a, b) for a, b in pieces if a < b]
    merged: list[tuple[int, int]] = []
    for a, b in pieces:
        if merged and (b - a < min_chars or merged[-1][1] - merged[-1][0] < min_chars):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged or [(s, e)]


def word_tokens(text: str) -> tuple[list[str], np.ndarray]:
    """The word tokenizer of verbatim runs: tokens and their ``(m, 2)`` char ranges."""
    found = [(m.group(), m.start(), m.end()) for m in _WORD_TOKEN.finditer(text)]
    offsets = np.array([(s, e) for _, s, e in found], dtype=np.int64).reshape(-1, 2)
    return [t for t, _, _ in found], offsets


# --------------------------------------------------------------------------------- embedder port


@runtime_checkable
class Embedder(Protocol):
    """Anything with ``embed_documents(texts) -> list[list[float]]`` (LangChain's
    ``Embeddings``, ``MiniLMEmbedder``); ``embed(texts) -> ndarray`` is used when present."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...


def default_embedder() -> Any:
    """The package's registered MiniLM embedder (the one Chroma collections use), shared."""
    from nest_integrations.embeddings import shared_embedder

    return shared_embedder()


def _embed(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    if callable(getattr(embedder, "embed", None)):
        m = np.asarray(embedder.embed(list(texts)), dtype=np.float32)
    elif callable(getattr(embedder, "embed_documents", None)):
        m = np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)
    else:
        raise TypeError(
            f"embedder {type(embedder).__name__} has neither embed(texts) nor "
            "embed_documents(texts)"
        )
    m = m.reshape(len(texts), -1)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


# --------------------------------------------------------------------------------- the attributor


@dataclass
class _Candidate:
    passage: int
    start: int
    end: int
    text: str


class Attributor:
    """Attribution with fixed parts: what the framework edges hold and call.

    Args:
        config: an ``AttributionConfig`` (default: its defaults).
        embedder: for the ``"embedding"``/``"combined"`` scorers (default: the package's MiniLM,
            loaded on first use).
        lm: a ``LanguageModel``: tokens of verbatim runs (``tokenizer="auto"``) and the keys of
            the ``"keys"``/``"combined"`` scorers.
        key_store: where passage keys are read from (and stored); default an in-memory store.
        retriever: a ``PassageRetriever`` used when a call gives no passages.
    """

    def __init__(
        self,
        config: AttributionConfig | None = None,
        *,
        embedder: Any = None,
        lm: Any = None,
        key_store: Any = None,
        retriever: Any = None,
    ) -> None:
        if config is not None and not isinstance(config, AttributionConfig):
            raise TypeError(f"config must be an AttributionConfig, not {type(config).__name__}")
        self.config = config or AttributionConfig()
        self.embedder = embedder
        self.lm = lm
        self.key_store = key_store
        self.retriever = retriever
        if retriever is not None and not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"retriever {type(retriever).__name__} has no retrieve(query, k)")
        if self.config.scorer in ("keys", "combined") and lm is None:
            raise ValueError(f"the {self.config.scorer!r} scorer needs an lm (its hidden states)")
        if self.config.tokenizer == "lm" and lm is None:
            raise ValueError("tokenizer='lm' needs an lm")
        self._embed_cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public
    def __call__(
        self,
        text: str,
        passages: Sequence[Passage | str] | None = None,
        *,
        question: str | None = None,
        span: tuple[int, int] | None = None,
    ) -> Attribution:
        """Attribute ``text`` to ``passages`` (or to what the retriever finds for ``question``,
        else for ``text``).

        ``span=(start, end)`` judges only the units inside ``text[start:end]`` (verbatim runs
        are still found over all of ``text``; ``citations``, ``sentences`` and ``unsupported``
        hold those units'): how the engine attributes each sentence of a stream once it is
        complete (``text`` is then the answer up to that sentence's end)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        if question is not None and not isinstance(question, str):
            raise TypeError(f"question must be a str or None, not {type(question).__name__}")
        t0 = time.perf_counter()
        cfg = self.config
        plist = self._passages(text, passages, question)
        use_lm = self.lm is not None and cfg.tokenizer != "words"
        result = Attribution(
            text=text, passages=plist, scorer=cfg.scorer, threshold=cfg.threshold,
            tokenizer=str(getattr(self.lm, "name", "lm")) if use_lm else "words",
        )
        units = split_units(text, cfg.max_clause_chars, cfg.min_clause_chars)
        if span is not None:
            lo, hi = _check_span(span, len(text))
            units = [(s, e) for s, e in units if lo <= s and e <= hi]
        if not units:
            result.time = time.perf_counter() - t0
            return result
        tokenize = self._lm_tokens if use_lm else word_tokens
        verbatim = self._verbatim(text, plist, tokenize)
        coverage = [_coverage(text, s, e, verbatim) for s, e in units]
        todo = [i for i, ((s, e), c) in enumerate(zip(units, coverage))
                if c < cfg.verbatim_coverage
                or (cfg.check_values and _uncovered_value(text, s, e, verbatim))]
        scores = self._support(text, [units[i] for i in todo], plist) if todo and plist else {}
        support: list[Citation] = []
        position = {i: n for n, i in enumerate(todo)}
        for i, (s, e) in enumerate(units):
            unit = SentenceAttribution(text[s:e], s, e, "verbatim", 1.0, coverage=coverage[i])
            if i in position:
                best = scores.get(position[i])
                score, cand = best if best is not None else (None, None)
                unit.score = score
                if cand is not None:
                    unit.passage_id = plist[cand.passage].id
                if score is not None and score >= cfg.threshold and cand is not None:
                    unit.verdict = "support"
                    support.append(_support_citation(plist[cand.passage], cand, s, e, score,
                                                     len(tokenize(text[s:e])[0])))
                else:
                    unit.verdict = "unsupported"
                    result.unsupported.append(UnsupportedSentence(text[s:e], s, e, score))
            else:
                unit.passage_id = _main_passage(s, e, verbatim)
            result.sentences.append(unit)
        if span is not None:
            verbatim = [c for c in verbatim if any(c.start < e and s < c.end for s, e in units)]
        result.citations = sorted(verbatim + support, key=lambda c: (c.start, c.end, c.kind))
        result.time = time.perf_counter() - t0
        LOG.debug("attributed %d units in %.3f s", len(units), result.time)
        return result

    # ------------------------------------------------------------------ passages
    def _passages(
        self, text: str, passages: Sequence[Passage | str] | None, question: str | None
    ) -> list[Passage]:
        from nest_integrations.retrieval.in_memory import as_passage

        if passages is None:
            if self.retriever is None:
                raise ValueError("attribute needs passages= or a retriever=")
            query = question if question and question.strip() else text
            if not query.strip():
                return []
            found = self.retriever.retrieve(query, self.config.k)
            passages = found
        if isinstance(passages, (str, Passage)):
            raise TypeError("passages must be a list of Passage or str, not a single one")
        out, seen = [], set()
        for p in passages:
            if not isinstance(p, (Passage, str)):
                raise TypeError(f"a passage must be a Passage or a str, not {type(p).__name__}")
            p = as_passage(p)
            if p.id not in seen:
                seen.add(p.id)
                out.append(p)
        return out

    # ------------------------------------------------------------------ verbatim
    def _lm_tokens(self, text: str) -> tuple[list[int], np.ndarray]:
        ids, off = self.lm.tokenize_with_offsets(text)
        return list(ids), np.asarray(off, dtype=np.int64).reshape(-1, 2)

    def _verbatim(self, text: str, passages: Sequence[Passage], tokenize: Any) -> list[Citation]:
        """Greedy left-to-right longest runs of answer tokens found in a passage."""
        if not passages:
            return []
        a_tok, a_off = tokenize(text)
        # a run stays inside one sentence, so a sentence's verdict never depends on the text
        # after it (what lets the engine judge each streamed sentence as soon as it ends)
        ends = np.array([e for _, e in split_sentences(text)], dtype=np.int64)
        sid = np.searchsorted(ends, a_off[:, 1], side="left") if len(a_off) else a_off[:, 0]
        p_tok, p_off = zip(*(tokenize(p.text) for p in passages))
        where: dict[Any, list[tuple[int, int]]] = {}
        for pi, toks in enumerate(p_tok):
            for j, t in enumerate(toks):
                where.setdefault(t, []).append((pi, j))
        n, min_len = len(a_tok), self.config.min_verbatim_tokens
        cites: list[Citation] = []
        i = 0
        while i < n:
            best = (0, -1, -1)
            for pi, j in where.get(a_tok[i], ()):
                toks, length = p_tok[pi], 1
                while (i + length < n and j + length < len(toks)
                       and toks[j + length] == a_tok[i + length]
                       and sid[i + length] == sid[i]):
                    length += 1
                if length > best[0]:
                    best = (length, pi, j)
            length, pi, j = best
            if length < min_len:
                i += 1
                continue
            s, e = int(a_off[i, 0]), int(a_off[i + length - 1, 1])
            ps, pe = int(p_off[pi][j, 0]), int(p_off[pi][j + length - 1, 1])
            for s2, e2, ps2, pe2 in exact_pieces(text, s, e, passages[pi].text, ps, pe):
                n_tok = int(((a_off[:, 1] > s2) & (a_off[:, 0] < e2)).sum())
                cites.append(make_citation(passages[pi], s2, e2, ps2, pe2, max(n_tok, 1),
                                           "verbatim"))
            i += length
        return cites

    # ------------------------------------------------------------------ support
    def _support(
        self, text: str, units: Sequence[tuple[int, int]], passages: Sequence[Passage]
    ) -> dict[int, tuple[float, _Candidate]]:
        """Per unit index, the best ``(score, candidate)`` over the passages' sentences."""
        cfg = self.config
        cands = _candidates(passages, cfg.max_clause_chars, cfg.min_clause_chars)
        if not cands:
            return {}
        utexts = [text[s:e] for s, e in units]
        if cfg.scorer == "embedding":
            m = self._embedding_scores(utexts, cands)
        elif cfg.scorer == "fuzzy":
            m = self._fuzzy_scores(utexts, cands)
        elif cfg.scorer == "keys":
            m = self._key_scores(utexts, cands, passages)
        else:
            m = 0.5 * (self._embedding_scores(utexts, cands)
                       + self._key_scores(utexts, cands, passages))
        if cfg.check_values:
            m = m * _value_overlap(utexts, cands, passages)
        best = m.argmax(axis=1)
        return {i: (float(m[i, b]), cands[int(b)]) for i, b in enumerate(best)}

    def _fuzzy_scores(self, units: Sequence[str], cands: Sequence[_Candidate]) -> np.ndarray:
        """The string baseline (a method, so a benchmark can swap the matcher)."""
        return _fuzzy_scores(units, cands)

    def _embedding_scores(self, units: Sequence[str], cands: Sequence[_Candidate]) -> np.ndarray:
        with self._lock:
            if self.embedder is None:
                self.embedder = default_embedder()
            missing = list(dict.fromkeys(c.text for c in cands if c.text not in self._embed_cache))
            if missing:
                if len(self._embed_cache) + len(missing) > 50_000:  # a long-lived one stays bounded
                    self._embed_cache.clear()
                for t, v in zip(missing, _embed(self.embedder, missing)):
                    self._embed_cache[t] = v
            cm = np.stack([self._embed_cache[c.text] for c in cands])
        um = _embed(self.embedder, units)
        return um @ cm.T

    def _key_scores(
        self, units: Sequence[str], cands: Sequence[_Candidate], passages: Sequence[Passage]
    ) -> np.ndarray:
        """BERTScore-style recall over LM keys: per unit token, the best cosine with the
        candidate's tokens, averaged; keys centred on the passages' mean key."""
        from nest_integrations.index.keys import ensure_keys

        with self._lock:
            if self.key_store is None:
                from nest_integrations.index.in_memory_store import InMemoryKeyStore

                self.key_store = InMemoryKeyStore()
        pkeys = ensure_keys(self.key_store, self.lm, list(passages))
        unit_ids = [list(self.lm.tokenize(u)) for u in units]
        ukeys = self.lm.encode_passages(unit_ids)
        allk = [np.asarray(pk.keys, dtype=np.float32) for pk in pkeys if len(pk)]
        if not allk:
            return np.zeros((len(units), len(cands)), dtype=np.float32)
        mean = np.concatenate(allk).mean(axis=0)
        cand_rows = []
        for c in cands:
            pk = pkeys[c.passage]
            off = np.asarray(pk.offsets).reshape(-1, 2)
            rows = np.nonzero((off[:, 1] > c.start) & (off[:, 0] < c.end))[0]
            k = np.asarray(pk.keys, dtype=np.float32)[rows] - mean
            cand_rows.append(k / np.maximum(np.linalg.norm(k, axis=1, keepdims=True), 1e-6))
        out = np.zeros((len(units), len(cands)), dtype=np.float32)
        for i, uk in enumerate(ukeys):
            if not len(uk):
                continue
            u = np.asarray(uk, dtype=np.float32) - mean
            u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-6)
            for j, ck in enumerate(cand_rows):
                if len(ck):
                    out[i, j] = float((u @ ck.T).max(axis=1).mean())
        return out


class SentenceStream:
    """Attribute a growing text one complete sentence at a time (the engine's stream).

    ``feed(text)`` judges the sentences of ``text`` that are complete (a later sentence has
    begun, so their end is final) and not judged yet, against the text up to their end
    (``Attributor.__call__`` with ``span``); ``feed(text, final=True)`` judges the rest. Each
    sentence is judged once, and a sentence's verdict never depends on the text after it
    (verbatim runs stay inside a sentence), so feeding the text piece by piece gives the same
    ``support`` and verdicts as feeding it whole (raw scores may differ in the 7th digit: the
    embedder batches the units differently). ``support`` holds the support citations only
    (the engine cites its copies itself).
    """

    def __init__(self, attributor: Attributor, passages: Sequence[Passage | str]) -> None:
        self.attributor = attributor
        self.passages = list(passages)
        self.done = 0  # sentences starting before this char are judged
        self.support: list[Citation] = []
        self.unsupported: list[UnsupportedSentence] = []
        self.sentences: list[SentenceAttribution] = []
        self.time = 0.0

    def feed(self, text: str, final: bool = False) -> Attribution | None:
        """The attribution of the sentences completed by ``text`` (None when there are none;
        its ``citations`` are the new support citations)."""
        sentences = split_sentences(text)
        if not final:
            sentences = sentences[:-1]  # the last one may still grow
        new = [(s, e) for s, e in sentences if s >= self.done]
        if not new:
            return None
        end = len(text) if final else new[-1][1]
        found = self.attributor(text[:end], self.passages, span=(new[0][0], end))
        found.citations = [c for c in found.citations if c.kind == "support"]
        self.done = end
        self.support += found.citations
        self.unsupported += found.unsupported
        self.sentences += found.sentences
        self.time += found.time
        return found


def attribute(
    text: str,
    passages: Sequence[Passage | str] | None = None,
    *,
    retriever: Any = None,
    question: str | None = None,
    config: AttributionConfig | None = None,
    embedder: Any = None,
    lm: Any = None,
    key_store: Any = None,
) -> Attribution:
    """Attribute ``text`` to ``passages`` (``Passage`` objects or strings), or to the passages
    ``retriever`` finds for ``question`` (else for ``text``). See the module docstring and
    ``Attributor`` for the parts; a long-lived ``Attributor`` caches passage embeddings."""
    return Attributor(
        config, embedder=embedder, lm=lm, key_store=key_store, retriever=retriever
    )(text, passages, question=question)


# --------------------------------------------------------------------------------- helpers


def _check_span(span: Any, n: int) -> tuple[int, int]:
    ok = isinstance(span, tuple) and len(span) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in span)
    if not ok or not 0 <= span[0] <= span[1] <= n:
        raise ValueError(f"span must be a (start, end) tuple with 0 <= start <= end <= {n}, "
                         f"got {span!r}")
    return span[0], span[1]


def _candidates(
    passages: Sequence[Passage], max_clause_chars: int, min_clause_chars: int
) -> list[_Candidate]:
    """Every sentence of every passage, and the clauses of its long sentences."""
    out, seen = [], set()
    for pi, p in enumerate(passages):
        spans = split_sentences(p.text) + split_units(p.text, max_clause_chars, min_clause_chars)
        for s, e in spans:
            if (pi, s, e) not in seen:
                seen.add((pi, s, e))
                out.append(_Candidate(pi, s, e, p.text[s:e]))
    return out


def _fuzzy_scores(units: Sequence[str], cands: Sequence[_Candidate]) -> np.ndarray:
    """difflib: characters of the unit matched in the candidate, over the unit's length."""
    out = np.zeros((len(units), len(cands)), dtype=np.float32)
    for i, u in enumerate(units):
        ul = u.lower()
        for j, c in enumerate(cands):
            sm = SequenceMatcher(None, ul, c.text.lower(), autojunk=False)
            out[i, j] = sum(b.size for b in sm.get_matching_blocks()) / max(len(ul), 1)
    return out


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NAME = re.compile(r"(?<![\w])[A-Z][\w'’-]*")
#: Capitalised at the start of a sentence without being a name: English function words and
#: sentence adverbs (a closed class; what an answer sentence commonly opens with).
_OPENERS = frozenset("""
a an the this that these those it its it's they their them he his him she her we our you your
i my there here what which who whom whose when where why how whether if unless although though
while because since as so thus hence therefore however moreover furthermore also additionally
overall indeed instead still yet but and or nor not no yes both either neither each every all
some many most much more few several any such one two three first second then today now
in on at by for from with without within into onto of to about above after against among
around before behind below beneath between beyond during except inside like near off over
through throughout toward towards under until unlike upon via according despite
""".split())
_LEAD_IN = re.compile(r"\W*\w+(?:\s+\w+){0,2},")  # "Put simply," / "In 1912," / "Rome,"


def _value_spans(text: str) -> list[tuple[int, int]]:
    """Where the *values* of ``text`` are: numbers, and capitalised words. The first word
    counts when it is not an opener (``_OPENERS``) nor the start of a short lead-in phrase
    ending in a comma ("Broadly speaking, ..."): in "Brouthort is the headquarters city of
    Biziom Labs." the value is the first word."""
    spans = [m.span() for m in _NUMBER.finditer(text)]
    first = re.match(r"\W*(\w+)", text)
    for m in _NAME.finditer(text):
        if first and m.start() == first.start(1) and (
                m.group().lower() in _OPENERS or _LEAD_IN.match(text)):
            continue
        spans.append(m.span())
    return spans


#: A quoted or back-ticked term: in technical text, a code name ("assert", `__debug__`).
_QUOTED_TERM = re.compile(r'["“`]([^"”`\n]{1,40})["”`]')


def _quoted_terms(text: str) -> set[str]:
    """The quoted terms of ``text``, lower-cased."""
    return {m.group(1).lower() for m in _QUOTED_TERM.finditer(text)}


def _values(text: str) -> set[str]:
    """The values of ``text`` (``_value_spans``), names lower-cased."""
    return {text[a:b].lower() for a, b in _value_spans(text)}


def _value_overlap(
    units: Sequence[str], cands: Sequence[_Candidate], passages: Sequence[Passage]
) -> np.ndarray:
    """Per (unit, candidate): 1 when the candidate's passage holds every value of the unit
    and the candidate sentence itself every quoted term (or the unit has none), else 0. All
    or nothing: with a share, one wrong value among a long sentence's many names lowered the
    score by too little to matter (dev split of ``bench_attribution.py``). Numbers must
    appear as they are; a name may differ in its ending ("Persian" / "Persia": the first
    ``max(5, len - 3)`` letters). A quoted term must be in the sentence, not just the passage:
    a topic that lists "|" and "^" does not support "the "|" operator yields the XOR"."""
    out = np.ones((len(units), len(cands)), dtype=np.float32)
    texts = [p.text.lower() for p in passages]
    found: dict[tuple[str, int], bool] = {}

    def holds(v: str, pi: int) -> bool:
        if (v, pi) not in found:
            stem = v if v[:1].isdigit() else v[: max(5, len(v) - 3)]
            tail = r"(?!\w)" if v[:1].isdigit() or stem == v else r""
            found[(v, pi)] = re.search(rf"(?<!\w){re.escape(stem)}{tail}", texts[pi]) is not None
        return found[(v, pi)]

    for i, u in enumerate(units):
        vals, terms = _values(u), _quoted_terms(u)
        if not vals and not terms:
            continue
        for j, c in enumerate(cands):
            ct = c.text.lower()
            out[i, j] = float(all(holds(v, c.passage) for v in vals)
                              and all(t in ct for t in terms))
    return out


def _uncovered_value(text: str, s: int, e: int, cites: Sequence[Citation]) -> bool:
    """Whether a value of ``text[s:e]`` (``_value_spans``: a number, a name) lies outside
    every verbatim citation: a copied sentence with a changed year is not a verbatim one."""
    unit = text[s:e]
    spans = _value_spans(unit) + [m.span(1) for m in _QUOTED_TERM.finditer(unit)]
    for a, b in spans:
        if not any(c.start <= s + a and s + b <= c.end for c in cites):
            return True
    return False


def _coverage(text: str, s: int, e: int, cites: Iterable[Citation]) -> float:
    covered = np.zeros(e - s, dtype=bool)
    for c in cites:
        a, b = max(c.start, s), min(c.end, e)
        if a < b:
            covered[a - s : b - s] = True
    chars = np.array([not ch.isspace() for ch in text[s:e]], dtype=bool)
    return float((covered & chars).sum() / max(chars.sum(), 1))


def _main_passage(s: int, e: int, cites: Iterable[Citation]) -> str | None:
    share: dict[str, int] = {}
    for c in cites:
        overlap = min(c.end, e) - max(c.start, s)
        if overlap > 0:
            share[c.passage_id] = share.get(c.passage_id, 0) + overlap
    return max(share, key=share.__getitem__) if share else None


def _support_citation(passage: Passage, cand: _Candidate, s: int, e: int, score: float,
                      n_tokens: int) -> Citation:
    return make_citation(passage, s, e, cand.start, cand.end, max(n_tokens, 1), "support",
                     round(score, 4))
