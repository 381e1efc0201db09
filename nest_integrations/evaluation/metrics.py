"""Evaluation metrics: pure functions, each with a hand-computed case in
tests/evaluation/test_evaluation.py.

The official NEST evaluation had bugs that these functions avoid on purpose (spec §12):

- E1: answer-level recall checks **every** gold answer (a hit if any one matches);
- E3: outputs are cut at EOS and stop strings before scoring (``cut_at_eos``, ``cut_at_stop``);
- E4: ROUGE is called in the library's order, ``scorer.score(target, prediction)``, so
  precision and recall are not swapped;
- E2 (skipping examples) is a runner concern: the runner scores every example it builds.

Perplexity is corpus-level: ``exp(sum of NLL / number of scored tokens)``, the WikiText habit.
Mixture log-probabilities are computed in log space (logsumexp), as kNN-LM does.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from typing import Any, Iterable, Sequence

from nest_integrations.core.tokens import cut_at_eos

#: ROUGE variants reported (F-measure), as in the paper's Table 1.
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"\u2013", "\u2014", "\u2018", "\u2019", "\u201c", "\u201d"}


# ----------------------------------------------------------------------------- text clean-up


def cut_at_stop(text: str, stops: Iterable[str]) -> str:
    """``text`` up to the earliest occurrence of any non-empty stop string (E3)."""
    cut = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: NFKC, lower case, no punctuation or articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# ----------------------------------------------------------------------------- QA


def answer_recall(prediction: str, answers: Iterable[str]) -> float:
    """Answer-level recall (ALR): 1.0 if **any** normalised gold answer occurs in the
    normalised prediction as a whole-word substring, else 0.0 (E1: every answer is checked).
    Empty answers are ignored; with no usable answer the result is 0.0."""
    pred = f" {normalize_answer(prediction)} "
    for a in answers:
        norm = normalize_answer(a)
        if norm and f" {norm} " in pred:
            return 1.0
    return 0.0


def answer_token_recall(prediction: str, answers: Iterable[str]) -> float:
    """Graded companion of ALR: the best, over gold answers, share of an answer's normalised
    words that occur in the prediction (bag of words, with multiplicity). 0.0 without answers."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for a in answers:
        gold = normalize_answer(a).split()
        if not gold:
            continue
        pool: dict[str, int] = {}
        for w in pred:
            pool[w] = pool.get(w, 0) + 1
        hit = 0
        for w in gold:
            if pool.get(w, 0) > 0:
                pool[w] -= 1
                hit += 1
        best = max(best, hit / len(gold))
    return best


# ----------------------------------------------------------------------------- ROUGE


def rouge_scorer(use_stemmer: bool = True) -> Any:
    """A ``rouge_score`` scorer for ROUGE-1/2/L (``pip install rouge-score``)."""
    from nest_integrations._optional import require

    mod = require("rouge_score.rouge_scorer", extra="eval", package="rouge-score")
    return mod.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)


def rouge(prediction: str, reference: str, scorer: Any = None) -> dict[str, dict[str, float]]:
    """ROUGE-1/2/L of ``prediction`` against ``reference``: ``{type: {"p", "r", "f"}}``.

    The library's signature is ``score(target, prediction)``; passing them the other way round
    (the official code's E4 bug) swaps precision and recall.
    """
    scorer = scorer or rouge_scorer()
    scores = scorer.score(reference, prediction)  # (target, prediction): the library's order
    return {
        k: {"p": float(s.precision), "r": float(s.recall), "f": float(s.fmeasure)}
        for k, s in scores.items()
    }


# ----------------------------------------------------------------------------- perplexity


def log_mixture(log_p_lm: float, p_knn: float, lam: float) -> float:
    """log(lam * p_LM + (1 - lam) * p_kNN) from log p_LM, computed with logsumexp (Eq. 3)."""
    terms = []
    if lam > 0:
        terms.append(math.log(lam) + log_p_lm)
    if lam < 1 and p_knn > 0:
        terms.append(math.log1p(-lam) + math.log(p_knn))
    if not terms:
        return -math.inf
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """Corpus-level perplexity ``exp(nll_sum / n_tokens)`` (NaN for no tokens)."""
    if n_tokens <= 0:
        return math.nan
    return math.exp(nll_sum / n_tokens)


# ----------------------------------------------------------------------------- attribution


def span_lengths(token_sources: Sequence[Any]) -> list[int]:
    """Lengths of maximal runs of consecutive tokens copied from one passage at consecutive
    positions (NEST Table 2's attribution length). ``None`` marks an unattributed token;
    a source is ``(passage_id, position)``."""
    runs: list[int] = []
    prev = None
    for src in token_sources:
        if src is None:
            prev = None
            continue
        if prev is not None and src[0] == prev[0] and src[1] == prev[1] + 1:
            runs[-1] += 1
        else:
            runs.append(1)
        prev = src
    return runs


def attribution_ratio(token_sources: Sequence[Any]) -> float:
    """Share of output tokens that carry a corpus source (NEST Table 2)."""
    if not token_sources:
        return 0.0
    return sum(s is not None for s in token_sources) / len(token_sources)


def citation_hits(cited_doc_ids: Iterable[str], gold_doc_id: str | None) -> tuple[int, int]:
    """``(correct, total)`` citations: a citation is correct when its document is the gold
    document. Without a gold document the pair is ``(0, 0)`` (precision undefined)."""
    if gold_doc_id is None:
        return 0, 0
    cited = list(cited_doc_ids)
    return sum(d == gold_doc_id for d in cited), len(cited)


def ratio(num: float, den: float) -> float | None:
    """``num / den``, or None when ``den`` is 0 (a metric that does not apply)."""
    return num / den if den else None


def mean(values: Iterable[float]) -> float | None:
    """Arithmetic mean, or None for no values."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


__all__ = [
    "ROUGE_TYPES",
    "answer_recall",
    "answer_token_recall",
    "attribution_ratio",
    "citation_hits",
    "cut_at_eos",
    "cut_at_stop",
    "log_mixture",
    "mean",
    "normalize_answer",
    "perplexity",
    "ratio",
    "rouge",
    "rouge_scorer",
    "span_lengths",
]
