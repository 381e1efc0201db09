"""Prompt-lookup decoding (Saxena 2023; HF ``PromptLookupCandidateGenerator``) as a drafter.

The draft is what followed the most recent earlier occurrence of the context's last n-gram
(n from ``max_ngram`` down to ``min_ngram``), searched over the prompt plus the output. It is
verified exactly against p_LM, so the output equals greedy decoding. When the match lies inside a
passage the prompt holds (RA), accepted tokens carry that passage as verbatim provenance.
"""

from __future__ import annotations

from dataclasses import dataclass

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Source


@dataclass
class PromptLookupDrafter:
    """n-gram lookup over the context (one instance per generation).

    Attributes:
        max_ngram: longest suffix n-gram to match (HF default 2... we use 3, then back off).
        min_ngram: shortest n-gram to match.
        num_tokens: draft length (HF's ``prompt_lookup_num_tokens`` default is 10).
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 10

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "PromptLookupDrafter":
        opts = ctx.options
        return cls(
            max_ngram=int(opts.get("max_ngram", 3)),
            min_ngram=int(opts.get("min_ngram", 1)),
            num_tokens=int(opts.get("num_tokens", 10)),
        )

    def propose(self, state: DecodeState) -> Draft | None:
        n_draft = min(self.num_tokens, state.budget)
        if n_draft < 1:
            return None
        ctx = state.context_ids
        for n in range(min(self.max_ngram, len(ctx) - 1), self.min_ngram - 1, -1):
            start = _last_match(ctx, ctx[-n:], n)
            if start is None:
                continue
            cont = ctx[start + n : start + n + n_draft]
            cont = _cut_at(cont, state.eos)
            if cont:
                return Draft(cont, [None] * len(cont))
        return None

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        self.num_tokens = adapt_length(self.num_tokens, len(draft), n_accepted, self.max_tokens)

    def __post_init__(self) -> None:
        self.max_tokens = self.num_tokens


def adapt_length(current: int, drafted: int, accepted: int, maximum: int) -> int:
    """Draft length for the next step: grow by 2 after a full acceptance, else shrink to one
    more than what was accepted (a rejected token costs a verify row; on CPU a long rejected
    draft costs up to twice a one-token step). Bounded to ``[2, maximum]``."""
    if accepted >= drafted:
        return min(maximum, current + 2)
    return max(2, min(current, accepted + 1))


def _last_match(seq: list[int], pattern: list[int], n: int) -> int | None:
    """Start of the most recent earlier occurrence of ``pattern`` (not the suffix itself)."""
    first = pattern[0]
    for i in range(len(seq) - n - 1, -1, -1):
        if seq[i] == first and seq[i : i + n] == pattern:
            return i
    return None


def _cut_at(tokens: list[int], stop: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[:i]
    return tokens


__all__ = ["PromptLookupDrafter", "Source"]
