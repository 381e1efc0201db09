"""RAG-copy: lossless copy drafts from the passages in the prompt, with verbatim provenance.

The prompt holds the top retrieved passages (RA, as plain in-context RAG does). Drafts are the
passage text that follows the latest n-gram of the context found in a passage (passages are
searched in retrieval order, so a sentence frame shared by many documents is drafted from the
best-ranked one). Verification is exact, so the answer is token for token the RAG answer of the
same model and retrieval; the speed-up comes from accepted copies, and every accepted copy
carries its passage and exact offsets (``Citation.kind == "verbatim"``).

This is the lossless floor that relaxed NEST must beat on answer quality (LLMA, arXiv
2304.04487, is the same idea with reference documents).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nest_integrations.core.tokens import cut_at_eos
from nest_integrations.drafters.base import (
    LOSSLESS,
    DecodeState,
    Draft,
    DrafterContext,
    Method,
    Source,
)
from nest_integrations.drafters.corpus import (
    AdaptiveLength,
    NgramOptions,
    find_ngram,
    parse_options,
)


@dataclass
class RagCopyOptions(NgramOptions):
    """``drafter_options`` of ``decoding="rag-copy"`` (see ``NgramOptions``)."""

    method = "rag-copy"
    max_ngram: int = 4
    min_ngram: int = 2
    num_tokens: int = 16


class RagCopyDrafter(AdaptiveLength):
    """n-gram lookup into the prompt passages' own token arrays (one per generation)."""

    wants_hidden = False  # drafts from text, not from the hidden state

    def __init__(self, ctx: DrafterContext) -> None:
        self.options = parse_options(RagCopyOptions, ctx.options, METHOD.name)
        self.num_tokens = self.options.num_tokens
        self.use_cost_model(ctx.lm, backend_default=True)  # on llama.cpp: the cost model
        n_ra = ctx.config.ra_passages or METHOD.ra_passages
        self.passages = (list(ctx.prompt_passages) if ctx.prompt_passages is not None
                         else list(ctx.passages[:n_ra]))
        self.lm = ctx.lm
        self._tokens: list[list[int]] | None = None
        self._index: list[int] = []  # passage index in state.passages
        self._unsent: list = []  # registrations not yet carried by a draft (``new_passages``)

    def _prepare(self, state: DecodeState) -> None:
        self._tokens = []
        for p in self.passages:
            ids, offsets = self.lm.tokenize_with_offsets(p.text)
            self._index.append(state.passage_index(p, offsets, self._unsent))
            self._tokens.append(list(ids))

    def propose(self, state: DecodeState) -> Draft | None:
        """``AdaptiveLength.propose``; the first draft (an empty one when there is none)
        also registers the prompt passages with their offsets (``Draft.new_passages``)."""
        draft = super().propose(state)
        if not self._unsent:
            return draft
        new, self._unsent = tuple(self._unsent), []
        return replace(draft, new_passages=new) if draft is not None else Draft([], [],
                                                                               new_passages=new)

    def cite(self, state: DecodeState, token: int) -> Source:
        """``AdaptiveLength.cite``, but None while the passages it would cite are not yet
        registered (a plain step before any ``propose``: a two-token budget)."""
        source = super().cite(state, token)
        return None if self._unsent else source

    def continuation(self, state: DecodeState, n_draft: int) -> Draft | None:
        if self._tokens is None:
            self._prepare(state)
        ctx = state.context_ids
        if not state.out_ids:
            return None
        opts = self.options
        for n in range(min(opts.max_ngram, len(state.out_ids)), opts.min_ngram - 1, -1):
            pattern = ctx[-n:]
            for k, toks in enumerate(self._tokens):  # type: ignore[arg-type]
                pos = find_ngram(toks, pattern)
                if pos is None:
                    continue
                start = pos + n
                cont = cut_at_eos(toks[start : start + n_draft], state.eos)
                if cont:
                    sources: list[Source] = [(self._index[k], start + i) for i in range(len(cont))]
                    return Draft(cont, sources)
        return None


METHOD = Method(
    "rag-copy",
    RagCopyDrafter,
    verifier=LOSSLESS,
    ra_passages=3,
    description="lossless RAG: passages in the prompt, copy drafts from them, verbatim provenance",
)
