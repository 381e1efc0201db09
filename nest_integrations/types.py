"""Plain data shared by every layer: passages, token keys, citations, stats and results.

Nothing here imports a framework; everything is a dataclass that converts to JSON with
``to_dict()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Passage:
    """One retrievable chunk of a source document (NEST stage 1 works on these).

    Attributes:
        id: Stable passage id (derived from content at ingest; never a row number).
        text: The passage text, exactly ``source_text[char_start:char_end]``.
        doc_id: Id of the source document the passage was cut from.
        score: Retrieval score from stage 1 (higher is better), when known.
        char_start: Offset of the passage in its source document, when known.
        char_end: End offset (exclusive) in the source document, when known.
        metadata: Source metadata: ``source``, ``title``, ``url``, ``chunk_index`` and any
            user metadata.
    """

    id: str
    text: str
    doc_id: str = ""
    score: float | None = None
    char_start: int | None = None
    char_end: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassageKeys:
    """The token memory of one passage (NEST stage 2), as stored in the key store.

    A passage tokenised to ``m`` tokens ``d[0..m-1]`` and encoded after the model's passage
    prefix (``LanguageModel.passage_prefix``: ``[BOS, "\n"]`` for the HF adapter) gives ``m``
    keys: key ``j`` is the LM vector after reading ``prefix + d[0..j-1]`` and its value is
    ``d[j]``.

    Attributes:
        passage_id: The passage this memory belongs to.
        keys: ``(m, d)`` key vectors (stored fp16; upcast to fp32 before distances).
        token_ids: ``(m,)`` int64 passage tokens; ``token_ids[j]`` is the value of key ``j``.
        offsets: ``(m, 2)`` int32 char range of each token inside the passage text.
    """

    passage_id: str
    keys: np.ndarray
    token_ids: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class Citation:
    """A run of output text copied from one passage (consecutive tokens, consecutive positions).

    Invariant: ``passage_text[passage_start:passage_end] == text`` and, when the source
    offsets are known, ``source_text[source_start:source_end] == text``.
    """

    text: str
    start: int
    end: int
    passage_id: str
    doc_id: str
    passage_start: int
    passage_end: int
    source_start: int | None
    source_end: int | None
    n_tokens: int
    metadata: dict[str, Any] = field(default_factory=dict)
    #: ``"copy"``: text NEST copied from the passage (a citation); ``"verbatim"``: text a
    #: lossless method generated that matches the passage verbatim (provenance), or text that
    #: ``attribution.attribute`` found verbatim in a passage; ``"support"``: a passage sentence
    #: that supports an answer sentence written in other words (``attribution``): ``text`` is
    #: the *passage* sentence (``passage_text[passage_start:passage_end] == text``), ``start``
    #: and ``end`` are the answer sentence's span.
    kind: str = "copy"
    #: How strongly the passage supports the span (``"support"`` only; None otherwise).
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class UnsupportedSentence:
    """An answer sentence (or clause) that no passage supports: ``answer[start:end] == text``.

    The hallucination signal of ``attribution.attribute`` (and of ``NestResult.unsupported``
    when the engine attributes its answers).
    """

    text: str
    start: int
    end: int
    #: The best support score found (below the threshold), when a scorer ran.
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class NestStats:
    """Counters and timings of one generation. Times are seconds."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    copied_tokens: int = 0
    attributed_tokens: int = 0
    n_passages: int = 0
    n_keys: int = 0
    mean_lambda: float = 0.0
    time_retrieval: float = 0.0
    time_keys: float = 0.0
    time_lm: float = 0.0
    time_knn: float = 0.0
    time_total: float = 0.0
    finish_reason: str = ""
    #: the decoding method that produced the answer (the answer policy's when the call names
    #: none)
    decoding: str = ""
    # drafting (the loop and the method's drafter fill these; 0 / None for plain decoding)
    #: seconds in the drafter's ``propose`` (corpus search, KNN-SSD's layer-skip passes)
    time_draft: float = 0.0
    #: forward passes of a draft model (KNN-SSD's layer-skip passes), outside ``forward_passes``
    draft_forwards: int = 0
    #: corpus continuations merged into the drafts (DReSD, REST)
    draft_candidates: int = 0
    #: verify steps whose draft was a token tree, and the tree nodes they verified
    tree_steps: int = 0
    tree_nodes: int = 0
    #: KNN-SSD routing: the skip set used (a domain, ``"mixed"`` or ``"explicit"``), the
    #: nearest anchor's domain and cosine similarity, whether the router fell back, its seconds
    route_skip_set: str | None = None
    route_domain: str | None = None
    route_similarity: float | None = None
    route_fallback: bool = False
    time_route: float = 0.0
    #: look-ahead (``NestConfig.lookahead``): guessed tokens fed after a committed token, and
    #: how many of them a later pass took instead of computing them again
    ahead_fed: int = 0
    ahead_tokens: int = 0
    #: a lossless method with drafts: whether its verify passes gave each row the bits of a
    #: one-token step (``lm.exact_rows``), so the answer is greedy's exactly; None otherwise
    exact_rows: bool | None = None

    @property
    def accepted_per_verify(self) -> float:
        """Mean draft tokens accepted per verification step."""
        return self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def attribution_ratio(self) -> float:
        """Share of output tokens that carry a corpus source (NEST Table 2)."""
        return self.attributed_tokens / self.new_tokens if self.new_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(
            accepted_per_verify=self.accepted_per_verify,
            tokens_per_forward=self.tokens_per_forward,
            attribution_ratio=self.attribution_ratio,
            tokens_per_second=self.tokens_per_second,
        )
        return d


@dataclass
class NestResult:
    """What ``NestEngine.generate`` returns.

    Attributes:
        text: The generated text (stop strings and EOS removed).
        token_ids: The generated token ids.
        citations: Span citations, in output order.
        stats: Counters and timings.
        passages: The stage-1 passages the memory was built from.
        token_sources: Per output token, ``(passage_id, token_position)`` or ``None``.
        unsupported: Sentences no passage supports (only with ``NestConfig.attribute``).
        mean_span_length: Mean length, in tokens, of maximal attributed runs (NEST Table 2).
    """

    text: str
    token_ids: list[int]
    citations: list[Citation]
    stats: NestStats
    passages: list[Passage] = field(default_factory=list)
    token_sources: list[tuple[str, int] | None] = field(default_factory=list)
    #: Answer sentences no passage supports (filled when ``NestConfig.attribute`` is on).
    unsupported: list[UnsupportedSentence] = field(default_factory=list)

    @property
    def mean_span_length(self) -> float:
        spans = [c for c in self.citations if c.kind != "support"]  # token runs only
        return sum(c.n_tokens for c in spans) / len(spans) if spans else 0.0

    def stats_dict(self) -> dict[str, Any]:
        """``stats.to_dict()`` with ``mean_span_length`` (what every output format reports)."""
        return {**self.stats.to_dict(), "mean_span_length": self.mean_span_length}

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "citations": [c.to_dict() for c in self.citations],
            "stats": self.stats_dict(),
            "passages": [dataclasses.asdict(p) for p in self.passages],
        }


@dataclass(frozen=True)
class StreamChunk:
    """One streamed text delta and the citation it belongs to (``None`` for LM text).

    The last chunk of a stream has ``text == ""`` and carries the whole ``result``
    (the same ``NestResult`` that ``generate`` returns), for usage and stats.
    ``citation`` of a copied delta is the citation as known so far: a run that keeps
    growing is reported again with the same ``passage_id`` and ``start`` and a larger ``end``.

    With ``NestConfig.attribute``, the delta that completes an answer sentence (the first
    delta after it that starts the next one) carries that sentence's ``support`` citations
    (kind ``"support"``, final: its span lies before this delta) and its ``unsupported``
    verdicts; those of the last sentence are only in ``result``.
    """

    text: str
    citation: Citation | None = None
    token_ids: tuple[int, ...] = ()
    result: NestResult | None = None
    support: tuple[Citation, ...] = ()
    unsupported: tuple[UnsupportedSentence, ...] = ()
