"""Prompt-lookup decoding (Saxena 2023; HF ``PromptLookupCandidateGenerator``) as a drafter.

The draft is what followed the most recent earlier occurrence of the context's last n-gram
(n from ``max_ngram`` down to ``min_ngram``), searched over the prompt plus the output. It is
verified exactly against p_LM, so the output equals greedy decoding. When the match lies inside a
passage the prompt holds (RA), accepted tokens carry that passage as verbatim provenance.
"""

from __future__ import annotations

from dataclasses import dataclass

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Source
from nest_integrations.drafters.corpus import (
    adapt_length,
    check_at_least,
    cut_at_eos,
    find_ngram,
    parse_options,
)


@dataclass
class PromptLookupOptions:
    """``drafter_options`` of ``decoding="prompt-lookup"``.

    Attributes:
        max_ngram: longest suffix n-gram to match (HF default 2... we use 3, then back off).
        min_ngram: shortest n-gram to match.
        num_tokens: longest draft (HF's ``prompt_lookup_num_tokens`` default is 10); the
            length adapts to acceptance below it (``adapt_length``).
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 10

    def __post_init__(self) -> None:
        check_at_least("prompt-lookup", self, ("max_ngram", "min_ngram", "num_tokens"))


class PromptLookupDrafter:
    """n-gram lookup over the context (one instance per generation)."""

    def __init__(self, options: PromptLookupOptions | None = None, **kwargs: int) -> None:
        self.options = options if options is not None else PromptLookupOptions(**kwargs)
        self.num_tokens = self.options.num_tokens

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "PromptLookupDrafter":
        return cls(parse_options(PromptLookupOptions, ctx.options, "prompt-lookup"))

    def propose(self, state: DecodeState) -> Draft | None:
        n_draft = min(self.num_tokens, state.budget)
        if n_draft < 1:
            return None
        ctx = state.context_ids
        opts = self.options
        for n in range(min(opts.max_ngram, len(ctx) - 1), opts.min_ngram - 1, -1):
            start = find_ngram(ctx, ctx[-n:], last=True, end=len(ctx) - 1)
            if start is None:
                continue
            cont = cut_at_eos(ctx[start + n : start + n + n_draft], state.eos)
            if cont:
                return Draft(cont, [None] * len(cont))
        return None

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        self.num_tokens = adapt_length(self.num_tokens, len(draft), n_accepted,
                                       self.options.num_tokens)  # fmt: skip


__all__ = ["PromptLookupDrafter", "PromptLookupOptions", "Source"]
