"""Plain data shared by every layer: passages, token keys, citations, stats and results.

Nothing here imports a framework; everything is a dataclass that converts to JSON with
``to_dict()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `import nest_integrations` loads no numpy (`nest --help`)
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
class Timings:
    """Seconds per stage of one generation."""

    retrieval: float = 0.0  # stage 1 and the answer policy's plan
    keys: float = 0.0  # stage 2: the token memory from the key store
    lm: float = 0.0  # the target's forward passes
    knn: float = 0.0  # the target distribution (p_M's kNN search and mixture)
    draft: float = 0.0  # the drafter's ``propose`` (corpus search, layer-skip passes)
    total: float = 0.0
    #: from the start of the call (the engine built, its model loaded) to the first committed
    #: token: retrieval, the plan, evidence, the prompt's prefill and the first step
    first_token: float = 0.0


@dataclass
class DraftStats:
    """What the drafts of one generation did (zeros for plain decoding)."""

    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    forwards: int = 0  # passes of a draft model (KNN-SSD's layer skipping), not the target's
    candidates: int = 0  # corpus continuations merged into the drafts (DReSD, REST)
    tree_steps: int = 0  # verify steps whose draft was a token tree
    tree_nodes: int = 0  # the tree nodes they verified


@dataclass
class RouteStats:
    """KNN-SSD's routing: the skip set used (a domain, ``"mixed"`` or ``"explicit"``), the
    nearest anchor's domain and cosine similarity, whether the router fell back, its seconds."""

    skip_set: str | None = None
    domain: str | None = None
    similarity: float | None = None
    fallback: bool = False
    seconds: float = 0.0


@dataclass
class LookaheadStats:
    """``NestConfig.lookahead``: guessed tokens fed after a committed token, and how many of
    them a later pass took instead of computing them again."""

    fed: int = 0
    taken: int = 0


class _Flat:
    """A flat name of a grouped stat (``stats.time_lm`` is ``stats.timing.lm``), read and
    written through: the names the public JSON keeps."""

    def __init__(self, group: str, name: str) -> None:
        self.group, self.name = group, name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.group), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.group), self.name, value)


@dataclass
class NestStats:
    """Counters and timings of one generation, grouped: ``timing``, ``drafting`` and the
    method-specific ``route`` (KNN-SSD) and ``lookahead``. The flat names of the JSON
    (``to_dict``: ``time_lm``, ``verify_steps``, ``route_domain``, ...) read and write the
    grouped fields."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    copied_tokens: int = 0
    attributed_tokens: int = 0
    n_passages: int = 0
    n_keys: int = 0
    mean_lambda: float = 0.0
    finish_reason: str = ""
    #: the method that produced the answer (the answer policy's when the call names none)
    decoding: str = ""
    #: a lossless method with drafts: whether its verify passes gave each row the bits of a
    #: one-token step (``lm.exact_rows``), so the answer is greedy's exactly; None otherwise
    exact_rows: bool | None = None
    #: raw text under a policy with a relevance gate (``AnswerPolicy.completion_relevance``):
    #: stage 1's top passage's relevance to the prompt; None where the gate did not run
    relevance: float | None = None
    #: evidence first (``AnswerPolicy.evidence``): ``"quoted"`` (the answer opens with the
    #: evidence sentence, checked by the model), ``"rejected"`` (the model rejected the quote,
    #: ``Guards.quote_check``: the answer was decoded without it), or ``""`` (no evidence)
    evidence: str = ""
    #: the LM's mean log-probability of the evidence quote as the answer, when one was checked
    quote_score: float | None = None
    timing: Timings = field(default_factory=Timings)
    drafting: DraftStats = field(default_factory=DraftStats)
    route: RouteStats = field(default_factory=RouteStats)
    lookahead: LookaheadStats = field(default_factory=LookaheadStats)

    verify_steps = _Flat("drafting", "verify_steps")
    drafted_tokens = _Flat("drafting", "drafted_tokens")
    accepted_tokens = _Flat("drafting", "accepted_tokens")
    draft_forwards = _Flat("drafting", "forwards")
    draft_candidates = _Flat("drafting", "candidates")
    tree_steps = _Flat("drafting", "tree_steps")
    tree_nodes = _Flat("drafting", "tree_nodes")
    time_retrieval = _Flat("timing", "retrieval")
    time_keys = _Flat("timing", "keys")
    time_lm = _Flat("timing", "lm")
    time_knn = _Flat("timing", "knn")
    time_draft = _Flat("timing", "draft")
    time_total = _Flat("timing", "total")
    time_to_first_token = _Flat("timing", "first_token")
    route_skip_set = _Flat("route", "skip_set")
    route_domain = _Flat("route", "domain")
    route_similarity = _Flat("route", "similarity")
    route_fallback = _Flat("route", "fallback")
    time_route = _Flat("route", "seconds")
    ahead_fed = _Flat("lookahead", "fed")
    ahead_tokens = _Flat("lookahead", "taken")

    @property
    def accepted_per_verify(self) -> float:
        """Mean draft tokens accepted per verification step."""
        d = self.drafting
        return d.accepted_tokens / d.verify_steps if d.verify_steps else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def attribution_ratio(self) -> float:
        """Share of output tokens that carry a corpus source (NEST Table 2)."""
        return self.attributed_tokens / self.new_tokens if self.new_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = self.timing.total
        return self.new_tokens / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON of every output format (``STATS_KEYS``, then the derived rates)."""
        d = {name: getattr(self, name) for name in STATS_KEYS}
        d.update(
            accepted_per_verify=self.accepted_per_verify,
            tokens_per_forward=self.tokens_per_forward,
            attribution_ratio=self.attribution_ratio,
            tokens_per_second=self.tokens_per_second,
        )
        return d


#: The keys of ``NestStats.to_dict()`` before the derived rates, in their published order.
STATS_KEYS: tuple[str, ...] = (
    "prompt_tokens", "new_tokens", "forward_passes", "verify_steps", "drafted_tokens",
    "accepted_tokens", "copied_tokens", "attributed_tokens", "n_passages", "n_keys",
    "mean_lambda", "time_retrieval", "time_keys", "time_lm", "time_knn", "time_total",
    "finish_reason", "decoding", "time_draft", "draft_forwards", "draft_candidates",
    "tree_steps", "tree_nodes", "route_skip_set", "route_domain", "route_similarity",
    "route_fallback", "time_route", "ahead_fed", "ahead_tokens", "exact_rows", "relevance",
    "time_to_first_token",
)


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
        unsupported: Sentences no passage supports (with ``NestConfig.attribute``, on in the
            default preset: every other sentence then has a citation).
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
        """``stats.to_dict()`` with ``mean_span_length`` and ``unsupported`` (the sentences no
        passage supports, as dicts): what every output format reports."""
        return {**self.stats.to_dict(), "mean_span_length": self.mean_span_length,
                "unsupported": [u.to_dict() for u in self.unsupported]}

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

    With ``NestConfig.attribute`` (on in the default preset), the delta that completes an
    answer sentence (the first delta after it that starts the next one) carries that
    sentence's ``support`` citations (kind ``"support"``, final: its span lies before this
    delta; also for a sentence found verbatim in a passage that no copy citation covers) and
    its ``unsupported`` verdicts; those of the last sentence are only in ``result``.
    """

    text: str
    citation: Citation | None = None
    token_ids: tuple[int, ...] = ()
    result: NestResult | None = None
    support: tuple[Citation, ...] = ()
    unsupported: tuple[UnsupportedSentence, ...] = ()
