"""Prompt-lookup decoding (Saxena 2023; HF ``PromptLookupCandidateGenerator``) as a drafter.

The draft is what followed the most recent earlier occurrence of the context's last n-gram
(n from ``max_ngram`` down to ``min_ngram``), searched over the prompt plus the output. It is
verified exactly against p_LM, so the output equals greedy decoding. When the match lies inside a
passage the prompt holds (RA), accepted tokens carry that passage as verbatim provenance.
"""

from __future__ import annotations

from dataclasses import dataclass

from nest_integrations.core.tokens import cut_at_eos
from nest_integrations.drafters import corpus
from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Source


@dataclass
class PromptLookupOptions(corpus.NgramOptions):
    """``drafter_options`` of ``decoding="prompt-lookup"`` (see ``NgramOptions``); HF's
    default n-gram is 2 (we use 3, then back off) and its ``prompt_lookup_num_tokens`` 10."""

    method = "prompt-lookup"  # the defaults are NgramOptions'


class PromptLookupDrafter(corpus.AdaptiveLength):
    """n-gram lookup over the context (one instance per generation)."""

    wants_hidden = False  # drafts from text, not from the hidden state

    def __init__(self, options: PromptLookupOptions | None = None, **kwargs: int) -> None:
        self.options = options if options is not None else PromptLookupOptions(**kwargs)
        self.num_tokens = self.options.num_tokens

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "PromptLookupDrafter":
        drafter = cls(corpus.parse_options(PromptLookupOptions, ctx.options, "prompt-lookup"))
        drafter.use_cost_model(ctx.lm, backend_default=True)  # on llama.cpp: the cost model
        return drafter

    def continuation(self, state: DecodeState, n_draft: int) -> Draft | None:
        ctx = state.context_ids
        opts = self.options
        for n in range(min(opts.max_ngram, len(ctx) - 1), opts.min_ngram - 1, -1):
            start = corpus.find_ngram(ctx, ctx[-n:], last=True, end=len(ctx) - 1)
            if start is None:
                continue
            cont = cut_at_eos(ctx[start + n : start + n + n_draft], state.eos)
            if cont:
                return Draft(cont, [None] * len(cont))
        return None


__all__ = ["PromptLookupDrafter", "PromptLookupOptions", "Source"]
