"""Post-hoc attribution of any text to passages, with exact offsets.

``attribute(text, passages)`` checks a text written by any model (ours, a hosted chat model, a
person) against the passages it should rest on. The text is split into sentences, and long
sentences into clauses (``split_units``: exact offsets, ``text[start:end]`` is the unit). For
each unit:

- **Verbatim**: the longest runs of tokens that also occur in a passage, at least
  ``min_verbatim_tokens`` long and inside one sentence, become ``Citation(kind="verbatim")``.
  Tokens are the LM's (``lm.tokenize_with_offsets``) when an ``lm`` is given, else words
  (``word_tokens``); ``Attribution.tokenizer`` says which. By construction
  ``text[c.start:c.end] == c.text == passage.text[c.passage_start:c.passage_end]``.
- **Support**: a unit that is not (almost) all verbatim (or holds a value, with
  ``check_values``, outside its verbatim runs) is compared with every sentence and clause of
  the passages by the ``scorer``; the best one, when its score reaches the threshold, becomes
  ``Citation(kind="support", score=...)``: ``c.text`` is the *passage* sentence,
  ``c.start``/``c.end`` the answer unit's span.
- **Unsupported**: otherwise the unit is listed in ``Attribution.unsupported``.

Scorers (``AttributionConfig.scorer``): ``"embedding"`` (cosine of MiniLM sentence embeddings,
the embedder Chroma uses; any object with ``embed`` or ``embed_documents``), ``"keys"`` (token
kNN over the LM's hidden states against the passages' stored NEST keys), ``"combined"`` (their
mean) and ``"fuzzy"`` (``difflib``, the string baseline). With ``check_values`` a candidate
counts only when its passage holds every value (number, name) of the unit and its sentence every
quoted term (``values.py``).

Modules: ``config`` (``AttributionConfig``, thresholds), ``results`` (``Attribution``,
``SentenceAttribution``), ``splitting`` (units, word tokens, candidate sentences), ``verbatim``
(runs), ``values`` (the value check), ``scorers`` (support scores; the embedder port is
``embedders.port``),
``attributor`` (``Attributor``, ``attribute``), ``streaming`` (``SentenceStream``, and
``unaccounted``: the units of an answer neither cited nor flagged).

Usage::

    from nest_integrations.attribution import attribute

    a = attribute("Rome was founded in 753 BC.", ["Rome was founded, by legend, in 753 BC."])
    a.sentences[0].verdict, a.citations, a.unsupported

Framework-free: imports ``core``, ``types`` and (lazily) the embedder and the key store.
"""

from __future__ import annotations

from nest_integrations.attribution.attributor import Attributor, attribute
from nest_integrations.attribution.config import DEFAULT_THRESHOLDS, SCORERS, AttributionConfig
from nest_integrations.attribution.results import VERDICTS as VERDICTS  # the verdict names
from nest_integrations.attribution.results import Attribution, SentenceAttribution
from nest_integrations.attribution.splitting import split_sentences, split_units, word_tokens
from nest_integrations.attribution.streaming import SentenceStream, unaccounted
from nest_integrations.types import UnsupportedSentence

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
    "unaccounted",
    "word_tokens",
]
