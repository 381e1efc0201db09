"""The drafter port: what the one verify-and-commit loop (``decoding.loop``) needs from a
drafting method, shaped like Hugging Face's candidate generators.

Per generation ``Method.make_drafter(ctx)`` builds a drafter (it may keep state). Before each
verify step the loop calls ``propose(state)``: a ``Draft``, or None for an ordinary decoding
step; after it, ``update(state, draft, n_accepted)``. The loop owns the KV cache, EOS, stop
strings, streaming, citations and stats. The target distribution is ``p`` (p_M for NEST, p_LM
otherwise), the draft's ``q``, as in the speculative-decoding papers and HF.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.core.evidence import EvidenceSpan
from nest_integrations.core.mixture import Distribution
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.lm.base import LanguageModel
from nest_integrations.lm.port import LayerSkip
from nest_integrations.retrieval.base import PassageRetriever
from nest_integrations.types import NestStats, Passage, RouteStats

#: NEST's relaxed rule (Eq. 7) on p_M with its LM guards; exact on p_M with
#: ``NestConfig.strict_acceptance``. Needs the target-first schedule.
RELAXED = "relaxed"
#: Lossless: exact greedy acceptance at ``temperature == 0``, speculative sampling above it.
LOSSLESS = "lossless"

#: Where a token comes from: ``(passage index in DecodeState.passages, token position in that
#: passage)``, or None for model-generated text.
Source = tuple[int, int] | None
#: A passage a drafter registers with the generation: ``(index, passage, token char offsets)``.
#: ``index`` is where sources point: the next free one for a new passage, or that of a passage
#: the generation holds without offsets (it gets these). ``Draft.new_passages`` carries them to
#: the loop, ``decoding.commits.Commit.new_passages`` on to the text stream.
PassageUpdate = tuple[int, Passage, Any]


@dataclass
class Draft:
    """Proposed tokens and where they come from.

    Attributes:
        tokens: the draft token ids, in order (a chain), or the nodes of a token tree in
            topological order (each parent before its children) when ``parents`` is set.
        sources: per token, a ``Source`` or None; None for the whole draft when the method
            has no corpus provenance (KNN-SSD). Accepted tokens keep their source: NEST's
            become citations, lossless methods' become verbatim-match provenance.
        q: ``(L, V)`` draft probabilities per token for speculative sampling; None means a
            deterministic draft (q is one-hot on the token), which is what copy drafters are.
        parents: token tree: ``parents[i]`` is the index of node i's parent, ``-1`` for a
            child of the current position. None means a chain (``parents[i] == i - 1``).
        chosen_first: ``tokens[0]`` was drawn from the target distribution at the current
            position by the drafter itself (NEST's span start), so it is committed without a
            check. A one-token draft with ``chosen_first`` is an ordinary decoding step.
        quoted: every token is already decided by the drafter (NEST's evidence quote,
            ``core.evidence``): a target-first loop commits them all in one pass that only
            extends the cache, with no check. A draft-first (lossless) loop verifies it as any
            draft.
        new_passages: passages this draft's sources (or the drafter's later ``cite``s) point
            to that ``DecodeState.passages`` does not hold yet, or holds without offsets
            (``DecodeState.passage_index`` builds them). The loop registers them as it receives
            the draft, accepted or not; a draft with no tokens only registers them (it is an
            ordinary step otherwise).
        forwards: passes of a draft model the drafter ran for this draft (KNN-SSD's layer-skip
            passes; ``NestStats.drafting.forwards``); an empty draft may carry them too.
        candidates: corpus continuations the draft merges (DReSD, REST;
            ``NestStats.drafting.candidates``).
        route: a routing decision made for this generation (KNN-SSD's ``RouteStats``), on the
            first draft after it was made; the loop records it (``NestStats.route``).
    """

    tokens: list[int]
    sources: list[Source] | None = None
    q: torch.Tensor | None = None
    parents: list[int] | None = None
    chosen_first: bool = False
    quoted: bool = False
    new_passages: tuple[PassageUpdate, ...] = ()
    forwards: int = 0
    candidates: int = 0
    route: RouteStats | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class ScratchPasses:
    """Passes a drafter may run on the target's KV cache, which it gets back as it was: the
    loop hands one to a self-speculative drafter (``DecodeState.scratch``) instead of the LM
    and its cache. ``forward_skip`` runs only inside ``with scratch:``; leaving the block crops
    the cache back to the committed tokens, as the full model computed them."""

    def __init__(self, lm: LanguageModel, cache: Any, layer_skip: LayerSkip | None) -> None:
        self._lm, self._cache, self._skip = lm, cache, layer_skip
        self._start: int | None = None

    def __enter__(self) -> "ScratchPasses":
        if self._start is not None:
            raise RuntimeError("ScratchPasses: a scratch block is already open")
        self._start = self._lm.cache_length(self._cache)
        return self

    def __exit__(self, *exc: object) -> None:
        start, self._start = self._start, None
        self._lm.crop_cache(self._cache, start)  # every layer back to the committed KV

    def forward_skip(self, ids: Sequence[int], skip: Any) -> torch.Tensor:
        """The logits of ``ids`` after the cache with ``skip``'s sublayers skipped
        (``lm.port.LayerSkip``); their KV stays until the block ends."""
        if self._skip is None:
            raise ValueError("this language model cannot skip layers (no lm.port.LayerSkip)")
        if self._start is None:
            raise RuntimeError("ScratchPasses.forward_skip runs inside `with scratch:`, "
                               "which gives the cache back when it ends")
        return self._skip.forward_skip(ids, self._cache, skip)


@dataclass
class DecodeState:
    """What a drafter may read at a decision point (the loop owns and updates it; a drafter
    writes nothing here: what it adds comes back in its ``Draft``).

    Attributes:
        prompt_ids: the prompt's token ids.
        out_ids: committed output tokens so far (the loop's own list: read it, never write).
        pending: the last committed token when the KV cache does not hold it yet (the loop
            will feed it in the same forward pass as the draft), else None.
        dist: the target distribution at the next position when known (``.p`` is ``(1, V)``;
            for NEST a ``StepDistribution`` with ``.lam`` and ``.hits``), else None.
        hidden: ``(key_dim,)`` LM vector (the ``key_source`` vector) at the position that
            produced the last committed token, from the verify pass already run, or None.
        prompt_vector: the mean final-layer hidden state (after the final norm) of the
            prompt, fp32 ``(d,)``, taken from the loop's own prefill pass when the drafter has
            ``wants_prompt_vector = True`` and the LM can capture it
            (``capture_prompt_vector``); else None. KNN-SSD routes on it.
        budget: output tokens left before ``max_new_tokens``.
        config: the generation's ``NestConfig``.
        eos: token ids that end generation; drafts never need to contain them.
        passages: the generation's passages (a tuple: the loop's copy as of this step);
            sources index into it. A drafter that cites text outside it (DReSD) registers
            passages through ``passage_index`` and its draft's ``new_passages``.
        offsets: per passage, its ``(m, 2)`` token character offsets, or None when the
            generation holds none for it (citations into it need them); a tuple as well.
        memory: NEST's token memory (``TokenMemory``) when the method uses it, else None.
        scratch: layer-skipped passes on the target's KV cache that leave it as they found it
            (``ScratchPasses``), for a self-speculative drafter (KNN-SSD); the drafter gets no
            LM handle or cache to write through.
        generator: the generation's RNG (sampling mode), or None when greedy.
        choose_token: a token from a ``(V,)`` target row with the generation's temperature,
            top-p and RNG (greedy: argmax). Use it, not your own sampling, so the loop's
            speculative-sampling rule sees the same distribution.
        next_token: ``next_token(dist, row)``: the token the verifier commits at a target
            distribution's row (``choose_token``, then the policy's LM guards).

    A drafter's own counters (``drafting.forwards``, ``drafting.candidates``, the KNN-SSD
    ``route``) come back in its ``Draft``: the state holds no stats to write to.
    """

    prompt_ids: list[int]
    out_ids: list[int]
    budget: int
    config: NestConfig
    eos: frozenset[int]
    passages: Sequence[Passage]
    offsets: Sequence[Any]
    choose_token: Callable[[torch.Tensor], int]
    next_token: Callable[[Distribution, int], int] | None = None
    pending: int | None = None
    dist: Distribution | None = None
    hidden: torch.Tensor | None = None
    prompt_vector: torch.Tensor | None = None
    memory: TokenMemory | None = None
    generator: torch.Generator | None = None
    scratch: ScratchPasses | None = None

    @property
    def context_ids(self) -> list[int]:
        """Prompt plus committed output (including ``pending``)."""
        return self.prompt_ids + self.out_ids

    def passage_index(self, passage: Passage, offsets: Any, new: list[PassageUpdate]) -> int:
        """The index sources use for ``passage`` (with its ``(m, 2)`` token char offsets), with
        the registrations ``new`` a drafter is collecting for its next ``Draft.new_passages``:
        the passage's index when the generation (or ``new``) holds it, else the next free one,
        and then it is added to ``new``. A passage held without offsets (a lossless method's
        retrieved passages carry none) is added to ``new`` too, so it gets these. Reads the
        state only: the loop registers ``new`` when the draft comes back."""
        for i, p in enumerate(self.passages):
            if p.id == passage.id:
                if self.offsets[i] is None and all(u[0] != i for u in new):
                    new.append((i, passage, offsets))
                return i
        for i, p, _ in new:
            if p.id == passage.id:
                return i
        i = len(self.passages) + sum(u[0] >= len(self.passages) for u in new)
        new.append((i, passage, offsets))
        return i


class Drafter(Protocol):
    """A drafting method for one generation.

    A drafter may also set ``wants_prompt_vector = True``: the loop then captures the prompt's
    mean final-layer hidden state during its prefill into ``DecodeState.prompt_vector``
    (no extra forward pass). One that never reads ``DecodeState.hidden`` may set
    ``wants_hidden = False``: the prefill then skips the prompt's last key vector where it
    costs a pass of its own (llama.cpp, ``forward_logits``), and ``hidden`` is None until the
    first step. A copy drafter may define ``cite(state, token) -> Source``: the loop asks it
    for the source of each token a plain step commits (the lossless schedule), so a copy the
    drafter did not draft (its cost model skipped the verify pass) is still cited. Each of the
    three is a protocol below (``WantsPromptVector``, ``WantsHidden``, ``CitesTokens``), checked
    once per generation by ``decoding.drafts.Drafts``; a drafter that has none gets the defaults
    (no prompt vector, key rows read, no citation of plain steps).
    """

    def propose(self, state: DecodeState) -> Draft | None:
        """Draft tokens to verify next, or None for an ordinary decoding step."""

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        """Called after ``draft`` was verified: ``n_accepted`` of its tokens were committed
        (for a tree: the length of the accepted path)."""


@runtime_checkable
class CitesTokens(Protocol):
    """A copy drafter that cites the tokens plain steps commit (``Drafter``'s docstring)."""

    def cite(self, state: DecodeState, token: int) -> Source: ...


@runtime_checkable
class QuotesFirst(Protocol):
    """A drafter whose answer may open with a quote it decided before any pass (NEST's
    evidence first): ``opening_quote`` is that ``quoted`` draft, or None. The loop asks before
    the prefill, runs the prompt and the quote in one pass, and shows a quote that nothing
    checks (``Guards.quote_check`` off) before that pass."""

    def opening_quote(self, state: DecodeState) -> Draft | None: ...


@runtime_checkable
class WantsPromptVector(Protocol):
    """A drafter that may read ``DecodeState.prompt_vector`` (default: it does not)."""

    wants_prompt_vector: bool


@runtime_checkable
class WantsHidden(Protocol):
    """A drafter that says whether it reads ``DecodeState.hidden`` (default: it does)."""

    wants_hidden: bool


@dataclass
class DrafterContext:
    """What a drafter factory gets: the engine's parts and the generation's setup.

    ``options`` holds the method's ``drafter_options`` (each drafter parses them into its own
    option dataclass, ``drafters.corpus.parse_options``); ``stats`` is the generation's, where a
    decision made before decoding (KNN-SSD's route) is recorded.
    """

    lm: LanguageModel
    config: NestConfig
    prompt_ids: list[int]
    passages: list[Passage]
    memory: TokenMemory | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: the engine's retriever: a datastore-backed drafter finds its collection's datastore by it
    retriever: PassageRetriever | None = None
    stats: NestStats = field(default_factory=NestStats)
    prompt_passages: list[Passage] | None = None  # the RA prompt's (None: the first ra_passages)
    guards: Guards = field(default_factory=Guards)  # the answer policy's output guards
    #: the answer's evidence (``core.evidence``): a copying drafter copies it first, and only it
    evidence: EvidenceSpan | None = None


@dataclass(frozen=True)
class Method:
    """A decoding method: a drafter factory plus how the loop treats it.

    Attributes:
        name: the ``decoding=`` value.
        make_drafter: builds the drafter of one generation; None = no drafts (greedy).
        verifier: the acceptance rule, by name in ``verifiers.VERIFIERS``: ``RELAXED`` (NEST's
            Eq. 7 with its LM guards) or ``LOSSLESS`` (exact greedy, or speculative sampling
            when ``temperature > 0``).
        uses_memory: build NEST's token memory and mix p_kNN into the target (p = p_M).
            False: the target is p_LM.
        needs_target: the drafter needs the target distribution at the next position before
            it can propose (NEST picks its span start from p_M). False lets the loop feed the
            pending token and the draft in one forward pass, as HF's assisted decoding does.
        ra_passages: passages put in the prompt when the config asks for none (RA methods).
        description: one line for ``--help`` and docs.
    """

    name: str
    make_drafter: Callable[[DrafterContext], Drafter] | None
    verifier: str = LOSSLESS
    uses_memory: bool = False
    needs_target: bool = False
    ra_passages: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.verifier, str) or not self.verifier:
            raise ValueError(f"method {self.name!r}: verifier must be a verifier name, "
                             f"e.g. {RELAXED!r} or {LOSSLESS!r}; got {self.verifier!r}")
        if self.verifier == RELAXED and not self.needs_target:
            raise ValueError(f"method {self.name!r}: the relaxed verifier checks each draft "
                             "token against the target before feeding it: set needs_target=True")


def validate_draft(draft: Draft, vocab_size: int) -> None:
    """Raise ValueError on a malformed draft (a drafter bug, reported with its shape)."""
    n = len(draft.tokens)
    if draft.sources is not None and len(draft.sources) != n:
        raise ValueError(f"draft has {n} tokens but {len(draft.sources)} sources")
    if draft.q is not None and tuple(draft.q.shape) != (n, vocab_size):
        raise ValueError(f"draft q has shape {tuple(draft.q.shape)}, expected ({n}, {vocab_size})")
    if draft.parents is not None:
        if len(draft.parents) != n or any(not (-1 <= p < i) for i, p in enumerate(draft.parents)):
            raise ValueError("draft tree parents must satisfy -1 <= parents[i] < i")


def first_branch(draft: Draft) -> Draft:
    """A token tree's first root-to-leaf path (from the current position, each node's first
    child) as a chain, with its sources and draft probabilities; a chain as it is. For an LM
    whose verify rows cost a step each (llama.cpp's ``rows_one_at_a_time``), where a tree's
    other branches would be steps spent on tokens off the accepted path."""
    if draft.parents is None:
        return draft
    path: list[int] = []
    node = -1
    while True:
        child = next((i for i, p in enumerate(draft.parents) if p == node), None)
        if child is None:
            break
        path.append(child)
        node = child
    return Draft([draft.tokens[i] for i in path],
                 None if draft.sources is None else [draft.sources[i] for i in path],
                 None if draft.q is None else draft.q[path], None, draft.chosen_first)


def as_sources(sources: Sequence[Source] | None, n: int) -> list[Source]:
    return list(sources) if sources is not None else [None] * n
