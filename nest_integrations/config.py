"""NEST's configuration: one frozen, validated object with named presets.

Names are descriptive; each docstring gives the paper's symbol (arXiv 2405.19325, Eqs. 2-7).
Every default lives here once. ``NestConfig.from_preset("paper")`` gives the paper's 7B setting.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Union

KeySource = Union[Literal["ffn_input", "block_input", "final_norm"], int]
KEY_SOURCES = ("ffn_input", "block_input", "final_norm")
#: ``attribution.SCORERS`` (config is an inner layer: the names are repeated, a test pins them).
ATTRIBUTE_SCORERS = ("embedding", "keys", "combined", "fuzzy")

#: Fewest words of a shown citation in relaxed modes (measured: see ``core.topic``).
RELAXED_MIN_CITATION_WORDS = 3


@dataclass(frozen=True, kw_only=True)
class NestConfig:
    """All NEST hyperparameters, in seven groups (fields are declared in the same groups).

    Pass fields by name (``NestConfig(relaxation=0.05)``; positional arguments are refused) or
    start from a preset (``NestConfig.from_preset("grounded", n_passages=4)``); the groups are
    documentation only.

    Retrieval and prompt (stage 1, the token memory, RA-NEST):
        n_passages: b, passages retrieved in stage 1 (paper: 40).
        hybrid_retrieval: fuse BM25 with dense scores using the paper's sharpness weighting.
        title_match: put the passages of the document titled with the question's entity first
            (``core.question.question_entity``: "What is X?", "... of X?", a quoted name),
            looking the title up in the store when retrieval missed it
            (``retrieval.titles``). On in ``grounded`` (issue 22), off in ``paper``.
        title_context: with ``title_match``, a question that asks for a fact
            (``core.question.asks_for_fact``) about an entity whose titled document was
            retrieved gets an RA prompt of that document's passages only (up to
            ``ra_passages``), so a note that merely mentions the entity is not in it.
            Descriptive questions keep the top passages (measured: it lowered their
            ROUGE-L on dev). On in ``grounded``.
        ra_passages: RA-NEST: put this many top passages in the prompt (0 = off; paper RA: 3).
        key_source: which LM vector is the key/query: ``"ffn_input"`` (the paper's: output of
            the last layer's pre-FFN norm), ``"block_input"`` (HF hidden_states[-2], the
            official code), ``"final_norm"`` (hidden_states[-1]) or an int index into
            hidden_states.
        n_neighbors: r, tokens retrieved from the token memory per step (paper: 1024). Fewer
            available keys means r_eff = min(r, available).

    Mixture (p_kNN, RRC and p_M; Eqs. 2-4):
        knn_temperature: mu, inverse temperature of p_kNN. ``None`` means 1/sqrt(d) for key
            dimension d (our reading of the paper; the official code uses the same). 0.25 in
            ``grounded``: SmolLM2's keys lie a few squared units apart (nearest ~19, 1024th ~57;
            ``benchmarks/knn_spread.py``), so at 1/sqrt(576) about 935 of the 1,024 neighbours
            carry weight and p_kNN is the passages' unigram distribution; at 0.25 about 72 do
            (dev split: the junk on "Who was X?" gone, ROUGE-L unchanged).
        rrc_offset: alpha, offset of Relative Retrieval Confidence (Eq. 4; paper 0.3).
        rrc_scale: tau, scale of Relative Retrieval Confidence (Eq. 4; paper 0.1).
        lm_temperature: T_LM, p_LM = softmax(logits / T_LM). The official code hard-codes 0.7.
        fixed_lm_weight: if set, lambda is this constant instead of RRC (the paper's
            two-stage kNN-LM baseline uses 0.7). Weight on p_LM, not on p_kNN.

    Spans (when a copy starts, how long, from where; Eqs. 5-6):
        span_copying: False turns spans off (token-level two-stage kNN-LM with RRC).
        span_threshold: delta of Eq. 6: propose a span when lambda <= delta (paper 0.5).
        max_span: n, draft length in tokens (paper 64).
        lookahead: the longest guess fed after a committed token (0 = off, the paper). A
            one-token pass of the target-first schedule also feeds the prompt-lookup
            continuation of the context, and a later pass over the same tokens reuses those
            rows (``DecodeLoop.feed``): fewer passes, the same tokens up to the numerics of a
            wider pass. On in ``grounded``.
        span_passages: start spans only from neighbours in the top this-many stage-1 passages
            (None = any retrieved passage, the paper). Ties a copy to the passages the question
            is about instead of any document sharing the sentence frame.
        mask_token_mode: also mask the neighbour a token-mode token was cited to (the paper
            masks only copied spans), so one key cannot emit the same token again and again
            ("the the the ...") while lambda is small.

    Verification (which draft tokens are kept; Eq. 7):
        relaxation: gamma of Eq. 7: accept a draft token iff p_M(w) > (gamma/2) * max p_M.
            Smaller is more lenient (paper: 5e-4 for 7B, 5e-3 for 13B, 5e-2 for 70B).
        strict_acceptance: accept only draft tokens equal to argmax p_M, and mask no keys, so
            the output equals greedy decoding of p_M exactly (spans only save forward passes).

    Guards (the LM's veto on a copy; ours, off in the paper):
        confidence_guard: reject a draft token where the LM alone puts more than this mass on
            another token (None = off, the paper). Stops copies that overrun an end of answer or
            swap the entity the LM is sure of.
        eos_guard: end the answer where the LM alone would end it (an end token is its top
            token, or end tokens carry more than this mass), whatever the copy proposes (None =
            off, the paper). Stops copies that run on past the answer.
        lm_agreement: a gamma for the LM alone: a draft or chosen token must also pass Eq. 7
            on p_LM (``p_LM(w) > (lm_agreement/2) * max p_LM``), else the LM's top token is
            taken (None = off). Relaxed acceptance then only where the (RA) LM and the kNN
            agree that a token is plausible (issue 22, an option).
        pick_agreement: a gamma for the LM alone, for chosen tokens: the mixture picks a token
            (a token-mode token, a span's first token, a correction) only among those the LM
            alone accepts by Eq. 7 with this gamma (``core.verification.plausible_choice``);
            draft tokens after it are verified as before (None = off, the paper, and
            ``grounded``). At small lambda p_kNN puts its mass on the passages' frequent
            tokens, and a copy starting with one is committed unchecked ("Fred Rogers was a,
            and author,,"). On dev, 0.01 removed most such answers but lost more ROUGE-L where
            the junk token opened a good copy of the lead than it won, so it is an option;
            ``grounded`` sharpens p_kNN instead (``knn_temperature``).

    Answer routing (issue 22, ``core.question``):
        fact_decoding: a lossless ``decoding=`` method (``"rag-copy"`` in ``grounded``) that
            answers, instead of NEST's relaxed copying, a question that asks for a fact
            (``core.question.asks_for_fact``: who/when/where/which/how many, "what is the
            <attribute> of <X>?"). Lossless w.r.t. the RA prompt's LM, the answer is then
            in-context RAG's greedy answer token for token, cited where it is verbatim; relaxed
            copying stays for descriptive questions and completions. None = off (``paper``).
            Applies only when the call's method is relaxed (``decoding="nest"``).

    On-topic guards (issue 22, ``core.topic``; None = on in relaxed modes, i.e. Eq. 7
    acceptance, and off in lossless ones, where they would change greedy output):
        stop_on_repeat: a sentence or line that repeats an earlier one (case and whitespace
            aside) ends the answer and is not emitted (``finish_reason == "repeat"``).
        lock_document: once a copy of at least ``core.topic.LOCK_MIN_TOKENS`` tokens is
            accepted, its document is the answer's: spans and token-mode citations from other
            documents are no longer proposed.
        min_citation_words: citations show only with at least this many words (None: 3 in
            relaxed modes, measured in ``core.topic``; 1 in lossless ones).

    Sampling (the token choice from p_M):
        temperature: sampling temperature on p_M; 0 means greedy (the paper's setting).
        top_p: nucleus sampling mass (with temperature > 0).
        seed: random seed for sampling mode.

    Citations (what is reported as a source):
        cite_token_mode: attribute a token-mode token when it equals the nearest neighbour's
            value (the official code's rule, NEST §8).
        min_citation_tokens: citations in ``NestResult.citations`` and the framework
            annotations span at least this many tokens; shorter attributions (token-mode ones)
            stay in ``token_sources`` and the stats.
        attribute: after generation, attribute the answer to its passages
            (``attribution.attribute``): support citations (kind ``"support"``) for sentences
            the engine did not copy, and ``NestResult.unsupported``; ``stream`` reports each
            sentence's with the chunk that completes it (``StreamChunk.support``). Off by
            default: see benchmarks/results/attribution.md for its precision and cost.
        attribute_scorer: the support scorer when ``attribute`` is on: ``"embedding"`` (the
            MiniLM embedder), ``"keys"`` (the LM's own keys), ``"combined"`` or ``"fuzzy"``.
    """

    # -- retrieval and prompt
    n_passages: int = 40
    hybrid_retrieval: bool = False
    title_match: bool = False
    title_context: bool = False
    ra_passages: int = 0
    key_source: KeySource = "ffn_input"
    n_neighbors: int = 1024
    # -- mixture
    knn_temperature: float | None = None
    rrc_offset: float = 0.3
    rrc_scale: float = 0.1
    lm_temperature: float = 1.0
    fixed_lm_weight: float | None = None
    # -- spans
    span_copying: bool = True
    span_threshold: float = 0.5
    max_span: int = 64
    lookahead: int = 0
    span_passages: int | None = None
    mask_token_mode: bool = False
    # -- verification
    relaxation: float = 5e-4
    strict_acceptance: bool = False
    # -- guards
    confidence_guard: float | None = None
    eos_guard: float | None = None
    lm_agreement: float | None = None
    pick_agreement: float | None = None
    # -- answer routing
    fact_decoding: str | None = None
    # -- on-topic guards
    stop_on_repeat: bool | None = None
    lock_document: bool | None = None
    min_citation_words: int | None = None
    # -- sampling
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    # -- citations
    cite_token_mode: bool = True
    min_citation_tokens: int = 2
    attribute: bool = False
    attribute_scorer: str = "embedding"

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> None:
            value = getattr(self, name)
            raise ValueError(f"NestConfig.{name}={value!r} is invalid: allowed {allowed}")

        for name in ("n_passages", "n_neighbors", "max_span"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "an integer >= 1")
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) \
                or self.lookahead < 0:
            bad("lookahead", "an integer >= 0 (0 = off)")
        if self.knn_temperature is not None and not (
            math.isfinite(self.knn_temperature) and self.knn_temperature > 0
        ):
            bad("knn_temperature", "None (= 1/sqrt(d)) or a float > 0")
        for name in ("rrc_offset",):
            if not math.isfinite(getattr(self, name)):
                bad(name, "a finite float")
        if not (math.isfinite(self.rrc_scale) and self.rrc_scale > 0):
            bad("rrc_scale", "a float > 0")
        if not (0.0 <= self.span_threshold <= 1.0):
            bad("span_threshold", "a float in [0, 1]")
        if not (0.0 < self.relaxation <= 1.0):
            bad("relaxation", "a float in (0, 1]")
        if not (math.isfinite(self.lm_temperature) and self.lm_temperature > 0):
            bad("lm_temperature", "a float > 0")
        if isinstance(self.key_source, bool) or not (
            self.key_source in KEY_SOURCES or isinstance(self.key_source, int)
        ):
            bad("key_source", f"one of {KEY_SOURCES} or an int index into hidden_states")
        if self.fixed_lm_weight is not None and not (0.0 <= self.fixed_lm_weight <= 1.0):
            bad("fixed_lm_weight", "None or a float in [0, 1]")
        if isinstance(self.ra_passages, bool) or not isinstance(self.ra_passages, int) or (
            self.ra_passages < 0
        ):
            bad("ra_passages", "an integer >= 0")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad("temperature", "a float >= 0 (0 = greedy)")
        if not (0.0 < self.top_p <= 1.0):
            bad("top_p", "a float in (0, 1]")
        if self.span_passages is not None and (
            isinstance(self.span_passages, bool)
            or not isinstance(self.span_passages, int)
            or self.span_passages < 1
        ):
            bad("span_passages", "None or an integer >= 1")
        if self.confidence_guard is not None and not (0.0 < self.confidence_guard <= 1.0):
            bad("confidence_guard", "None or a float in (0, 1]")
        if self.eos_guard is not None and not (0.0 < self.eos_guard <= 1.0):
            bad("eos_guard", "None or a float in (0, 1]")
        for name in ("lm_agreement", "pick_agreement"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not 0.0 < value <= 1.0):
                bad(name, "None or a float in (0, 1]")
        if isinstance(self.min_citation_tokens, bool) or not isinstance(
            self.min_citation_tokens, int
        ) or self.min_citation_tokens < 1:
            bad("min_citation_tokens", "an integer >= 1")
        if self.attribute_scorer not in ATTRIBUTE_SCORERS:
            bad("attribute_scorer", f"one of {ATTRIBUTE_SCORERS}")
        if self.fact_decoding is not None and (
            not isinstance(self.fact_decoding, str) or not self.fact_decoding.strip()
        ):
            bad("fact_decoding", "None or a lossless decoding method name such as 'rag-copy'")
        for name in ("title_match", "title_context"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")
        for name in ("stop_on_repeat", "lock_document"):
            if not (getattr(self, name) is None or isinstance(getattr(self, name), bool)):
                bad(name, "None (on in relaxed modes), True or False")
        if self.min_citation_words is not None and (
            isinstance(self.min_citation_words, bool)
            or not isinstance(self.min_citation_words, int)
            or self.min_citation_words < 1
        ):
            bad("min_citation_words", "None or an integer >= 1")

    def repeat_guard(self, relaxed: bool) -> bool:
        """``stop_on_repeat`` resolved for a verifier that is ``relaxed`` or not."""
        return relaxed if self.stop_on_repeat is None else self.stop_on_repeat

    def document_lock(self, relaxed: bool) -> bool:
        """``lock_document`` resolved for a verifier that is ``relaxed`` or not."""
        return relaxed if self.lock_document is None else self.lock_document

    def citation_min_words(self, relaxed: bool) -> int:
        """``min_citation_words`` resolved for a verifier that is ``relaxed`` or not."""
        if self.min_citation_words is not None:
            return self.min_citation_words
        return RELAXED_MIN_CITATION_WORDS if relaxed else 1

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "NestConfig":
        """Build a config from a named preset (see ``PRESETS``), with field overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown NEST preset {name!r}: choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> "NestConfig":
        """A copy with some fields changed (validated again)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown NestConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Named presets. ``paper`` is the 7B setting of NEST (App. A); the larger models differ only
#: in gamma. ``official-code`` reproduces the released code's hidden choices.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "paper-13b": {"relaxation": 5e-3},
    "paper-70b": {"relaxation": 5e-2},
    "paper-ra": {"relaxation": 5e-1, "ra_passages": 3},
    "official-code": {"lm_temperature": 0.7, "key_source": "block_input"},
    "knn-lm": {"span_copying": False, "fixed_lm_weight": 0.7},
    "lossless": {"strict_acceptance": True},
    # The default of every entry point (issue 10; README "What we chose"): RA-NEST whose spans
    # start only in the top passage, with the LM's veto where it is confident (0.3) or would end
    # the answer, gamma = 0.05, 8 passages. Entity QA dev set, 40 questions: 35/40 correct vs in-context
    # RAG's 33/40, 98.7% of cited characters on the gold document, 1.4% run-on. Issue 22 added
    # fact routing (lossless w.r.t. the RA prompt) and the title match / title context, chosen
    # on the quality dev split (benchmarks/results/quality_dev_*.md). Issue 21 added the
    # look-ahead (speed) and knn_temperature 0.25 (quality_dev_dtype_mu.md: the "Who was X?"
    # junk gone, ROUGE-L unchanged).
    "grounded": {
        "n_passages": 8,
        "ra_passages": 3,
        "relaxation": 5e-2,
        "span_passages": 1,
        "confidence_guard": 0.3,
        "eos_guard": 0.5,
        "mask_token_mode": True,
        "fact_decoding": "rag-copy",
        "title_match": True,
        "title_context": True,
        "lookahead": 8,
        "knn_temperature": 0.25,
    },
}
