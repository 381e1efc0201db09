"""``Attributor``: split the text, cite its verbatim runs, score the rest against the passages'
sentences, and give each unit a verdict. ``attribute`` is the one-call form."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

import numpy as np

from nest_integrations.attribution.config import AttributionConfig
from nest_integrations.embedders.port import default_embedder, embed
from nest_integrations.attribution.results import Attribution, SentenceAttribution
from nest_integrations.attribution.scorers import fuzzy_scores, key_scores
from nest_integrations.attribution.splitting import Candidate, candidates, split_units, word_tokens
from nest_integrations.attribution.values import uncovered_value, value_overlap
from nest_integrations.attribution.verbatim import coverage, main_passage, verbatim_runs
from nest_integrations.core.citations import make_citation
from nest_integrations.types import Citation, Passage, UnsupportedSentence

LOG = logging.getLogger(__name__)


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

    def __init__(self, config: AttributionConfig | None = None, *, embedder: Any = None,
                 lm: Any = None, key_store: Any = None, retriever: Any = None) -> None:
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
            tokenizer=str(self.lm.name) if use_lm and self.lm is not None else "words",
        )
        units = split_units(text, cfg.max_clause_chars, cfg.min_clause_chars)
        if span is not None:
            lo, hi = _check_span(span, len(text))
            units = [(s, e) for s, e in units if lo <= s and e <= hi]
        if not units:
            result.time = time.perf_counter() - t0
            return result
        tokenize = self._lm_tokens if use_lm else word_tokens
        verbatim = verbatim_runs(text, plist, tokenize, cfg.min_verbatim_tokens)
        covered = [coverage(text, s, e, verbatim) for s, e in units]
        todo = [i for i, ((s, e), c) in enumerate(zip(units, covered))
                if c < cfg.verbatim_coverage
                or (cfg.check_values and uncovered_value(text, s, e, verbatim))]
        scores = self._support(text, [units[i] for i in todo], plist) if todo and plist else {}
        support: list[Citation] = []
        position = {i: n for n, i in enumerate(todo)}
        for i, (s, e) in enumerate(units):
            unit = SentenceAttribution(text[s:e], s, e, "verbatim", 1.0, coverage=covered[i])
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
                unit.passage_id = main_passage(s, e, verbatim)
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

    # ------------------------------------------------------------------ support
    def _support(
        self, text: str, units: Sequence[tuple[int, int]], passages: Sequence[Passage]
    ) -> dict[int, tuple[float, Candidate]]:
        """Per unit index, the best ``(score, candidate)`` over the passages' sentences."""
        cfg = self.config
        cands = candidates(passages, cfg.max_clause_chars, cfg.min_clause_chars)
        if not cands:
            return {}
        utexts = [text[s:e] for s, e in units]
        # with check_values a candidate that holds no unit's values scores 0 whatever its
        # similarity: only the others are scored (embedding them is most of the cost)
        gate = value_overlap(utexts, cands, passages) if cfg.check_values else None
        live = (list(range(len(cands))) if gate is None
                else [j for j in range(len(cands)) if gate[:, j].any()])
        m = np.zeros((len(units), len(cands)), dtype=np.float32)
        if live:
            scored = [cands[j] for j in live]
            if cfg.scorer == "embedding":
                sc = self._embedding_scores(utexts, scored)
            elif cfg.scorer == "fuzzy":
                sc = self._fuzzy_scores(utexts, scored)
            elif cfg.scorer == "keys":
                sc = self._key_scores(utexts, scored, passages)
            else:
                sc = 0.5 * (self._embedding_scores(utexts, scored)
                            + self._key_scores(utexts, scored, passages))
            m[:, live] = sc if gate is None else sc * gate[:, live]
        best = m.argmax(axis=1)
        return {i: (float(m[i, b]), cands[int(b)]) for i, b in enumerate(best)}

    def _fuzzy_scores(self, units: Sequence[str], cands: Sequence[Candidate]) -> np.ndarray:
        """The string baseline (a method, so a benchmark can swap the matcher)."""
        return fuzzy_scores(units, cands)

    def _embedding_scores(self, units: Sequence[str], cands: Sequence[Candidate]) -> np.ndarray:
        with self._lock:
            if self.embedder is None:
                self.embedder = default_embedder()
            missing = list(dict.fromkeys(c.text for c in cands if c.text not in self._embed_cache))
            if missing:
                if len(self._embed_cache) + len(missing) > 50_000:  # a long-lived one stays bounded
                    self._embed_cache.clear()
                for t, v in zip(missing, embed(self.embedder, missing)):
                    self._embed_cache[t] = v
            cm = np.stack([self._embed_cache[c.text] for c in cands])
        um = embed(self.embedder, units)
        return um @ cm.T

    def _key_scores(
        self, units: Sequence[str], cands: Sequence[Candidate], passages: Sequence[Passage]
    ) -> np.ndarray:
        with self._lock:
            if self.key_store is None:
                from nest_integrations.index.in_memory_store import InMemoryKeyStore

                self.key_store = InMemoryKeyStore()
        return key_scores(self.lm, self.key_store, units, cands, passages)


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


def _check_span(span: Any, n: int) -> tuple[int, int]:
    ok = isinstance(span, tuple) and len(span) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in span)
    if not ok or not 0 <= span[0] <= span[1] <= n:
        raise ValueError(f"span must be a (start, end) tuple with 0 <= start <= end <= {n}, "
                         f"got {span!r}")
    return span[0], span[1]


def _support_citation(passage: Passage, cand: Candidate, s: int, e: int, score: float,
                      n_tokens: int) -> Citation:
    return make_citation(passage, s, e, cand.start, cand.end, max(n_tokens, 1), "support",
                     round(score, 4))
