"""RAG-copy: lossless copy drafts from the passages in the prompt, with verbatim provenance.

The prompt holds the top retrieved passages (RA, as plain in-context RAG does). Drafts are the
passage text that follows the latest n-gram of the context found in a passage (passages are
searched in retrieval order, so a sentence frame shared by many documents is drafted from the
best-ranked one). Verification is exact, so the answer is token for token the RAG answer of the
same model and retrieval; the speed-up comes from accepted copies, and every accepted copy
carries its passage and exact offsets (``Citation.kind == "verbatim"``).

This is the lossless floor that relaxed NEST must beat on answer quality (issue 10, LLMA
arXiv 2304.04487 is the same idea with reference documents).
"""

from __future__ import annotations

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Method, Source
from nest_integrations.drafters.prompt_lookup import adapt_length


class PassageCopyDrafter:
    """n-gram lookup into the prompt passages' own token arrays (one per generation)."""

    def __init__(self, ctx: DrafterContext) -> None:
        opts = ctx.options
        self.max_ngram = int(opts.get("max_ngram", 4))
        self.min_ngram = int(opts.get("min_ngram", 2))
        self.num_tokens = self.max_tokens = int(opts.get("num_tokens", 16))
        n_ra = ctx.config.ra_passages or METHOD.ra_passages
        self.passages = list(ctx.passages[:n_ra])
        self.lm = ctx.lm
        self._tokens: list[list[int]] | None = None
        self._index: list[int] = []  # passage index in state.passages

    def _prepare(self, state: DecodeState) -> None:
        self._tokens = []
        for p in self.passages:
            ids, offsets = self.lm.tokenize_with_offsets(p.text)
            self._index.append(_set_offsets(state, p, offsets))
            self._tokens.append(list(ids))

    def propose(self, state: DecodeState) -> Draft | None:
        if self._tokens is None:
            self._prepare(state)
        n_draft = min(self.num_tokens, state.budget)
        ctx = state.context_ids
        if n_draft < 1 or not state.out_ids:
            return None
        for n in range(min(self.max_ngram, len(state.out_ids)), self.min_ngram - 1, -1):
            pattern = ctx[-n:]
            for k, toks in enumerate(self._tokens):  # type: ignore[arg-type]
                pos = _find(toks, pattern)
                if pos is None:
                    continue
                start = pos + n
                cont = toks[start : start + n_draft]
                cut = next((i for i, t in enumerate(cont) if t in state.eos), len(cont))
                cont = cont[:cut]
                if cont:
                    sources: list[Source] = [(self._index[k], start + i) for i in range(len(cont))]
                    return Draft(cont, sources)
        return None

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        self.num_tokens = adapt_length(self.num_tokens, len(draft), n_accepted, self.max_tokens)


def _set_offsets(state: DecodeState, passage, offsets) -> int:
    for i, p in enumerate(state.passages):
        if p.id == passage.id:
            state.offsets[i] = offsets
            return i
    return state.add_passage(passage, offsets)


def _find(seq: list[int], pattern: list[int]) -> int | None:
    """First occurrence of ``pattern`` in ``seq`` (None when absent)."""
    n, first = len(pattern), pattern[0]
    for i in range(len(seq) - n + 1):
        if seq[i] == first and seq[i : i + n] == pattern:
            return i
    return None


METHOD = Method(
    "rag-copy",
    PassageCopyDrafter,
    ra_passages=3,
    description="lossless RAG: passages in the prompt, copy drafts from them, verbatim provenance",
)
