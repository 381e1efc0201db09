"""Self-speculative decoding with a layer-skip draft (Draft & Verify; KNN-SSD spec §3.5-3.6).

``draft_chain`` is the drafting half, shared by the engine's drafter
(``nest_integrations.drafters.knn_ssd``) and by ``self_speculative_generate``, a small greedy
verify-and-commit loop of its own that the skip-set search, the tests and the benchmark use to
count drafts and acceptances without the engine.

Draft loop (one chain, adaptive length): feed the pending token through the skip model, take
the argmax (or a sample, when sampling) as the next draft token, and stop when the draft's top
probability is below ``threshold`` (paper 0.8; that last token is kept), at ``max_draft``
tokens (paper 12), at the budget, or before an EOS token. Then crop the cache back to the
committed length, so verification reads only full-model KV.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from nest_integrations.core.sampling import sample, warp
from nest_integrations.lm.layer_skip import SkipSet

#: The paper's draft settings (KNN-SSD / Draft & Verify code).
DEFAULT_THRESHOLD = 0.8
DEFAULT_MAX_DRAFT = 12


@dataclass
class ChainDraft:
    """A drafted chain: tokens, their draft distributions (sampling only) and its cost."""

    tokens: list[int]
    q: torch.Tensor | None
    forwards: int
    seconds: float


def draft_chain(
    lm: Any,
    cache: Any,
    pending: int,
    skip: SkipSet,
    *,
    max_len: int,
    threshold: float = DEFAULT_THRESHOLD,
    eos: frozenset[int] | set[int] = frozenset(),
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> ChainDraft:
    """Draft up to ``max_len`` tokens after ``pending`` (not yet in ``cache``) with ``skip``.

    ``cache`` is restored to its committed length before returning (every layer cropped), so
    the caller's next full forward sees exactly the KV it had. Greedy when ``temperature`` is 0;
    otherwise each token is drawn (with ``generator``) from ``q = warp(p_draft)``, the same
    temperature/top-p warp the loop applies to the target, and ``q`` is returned for the
    speculative-sampling rule. The confidence stop reads the unwarped draft ``p``.
    """
    start = time.perf_counter()
    committed = lm.cache_length(cache)
    tokens: list[int] = []
    qs: list[torch.Tensor] = []
    forwards = 0
    try:
        feed = pending
        while len(tokens) < max_len:
            logits = lm.forward_skip([feed], cache, skip)[-1]  # (V,)
            forwards += 1
            p = torch.softmax(logits, dim=-1)
            if temperature > 0.0:
                q = warp(p, temperature, top_p)
                tok = sample(q, generator)
            else:
                tok, q = int(p.argmax()), None
            if tok in eos:  # drafts never carry EOS: the verify step's own token handles it
                break
            tokens.append(tok)
            if q is not None:
                qs.append(q)
            if float(p.max()) < threshold:
                break
            feed = tok
    finally:
        lm.crop_cache(cache, committed)  # every layer back to the committed, full-model KV
    q_all = torch.stack(qs) if qs else None
    return ChainDraft(tokens, q_all, forwards, time.perf_counter() - start)


@dataclass
class SpecStats:
    """Counters of one or more self-speculative generations (paper metrics, §3.7).

    ``steps`` verify passes, ``drafted`` draft tokens proposed, ``accepted`` draft tokens
    committed, ``tokens`` generated tokens, ``draft_forwards`` skip-model passes.
    """

    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    draft_seconds: float = 0.0
    seconds: float = 0.0
    verify_lengths: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """alpha = accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """M = tokens committed per verify step (accepted drafts + the bonus token)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add(self, other: "SpecStats") -> None:
        for name in ("tokens", "steps", "drafted", "accepted", "draft_forwards"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.draft_seconds += other.draft_seconds
        self.seconds += other.seconds
        self.verify_lengths.extend(other.verify_lengths)

    def as_dict(self) -> dict[str, float]:
        return {
            "tokens": self.tokens,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_forwards": self.draft_forwards,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted": round(self.mean_accepted, 4),
            "seconds": round(self.seconds, 4),
        }


def self_speculative_generate(
    lm: Any,
    prompt_ids: Sequence[int],
    skip: SkipSet | None,
    max_new_tokens: int,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_draft: int = DEFAULT_MAX_DRAFT,
    stop_at_eos: bool = True,
) -> tuple[list[int], SpecStats]:
    """Greedy self-speculative decoding; ``skip=None`` is plain greedy decoding (no drafts).

    Output equals plain greedy decoding token for token (the oracle the tests check). Returns
    the generated ids and the counters.
    """
    if max_new_tokens < 1:
        return [], SpecStats()
    eos = lm.eos_token_ids if stop_at_eos else frozenset()
    stats = SpecStats()
    start = time.perf_counter()
    cache = lm.new_cache()
    logits, _ = lm.forward(list(prompt_ids), cache)
    pending = int(logits[-1].argmax())
    out = [pending]
    while len(out) < max_new_tokens and pending not in eos:
        committed = lm.cache_length(cache)
        budget = max_new_tokens - len(out)  # tokens left after pending
        draft: list[int] = []
        if skip is not None and budget > 1:
            chain = draft_chain(
                lm, cache, pending, skip, max_len=min(max_draft, budget - 1),
                threshold=threshold, eos=eos,
            )
            draft = chain.tokens
            stats.draft_forwards += chain.forwards
            stats.draft_seconds += chain.seconds
        logits, _ = lm.forward([pending, *draft], cache)  # verify: one full forward
        preds = logits.argmax(-1).tolist()  # preds[i] follows draft[:i]
        n = 0
        while n < len(draft) and draft[n] == preds[n]:
            n += 1
        new = draft[:n] + [preds[n]]
        lm.crop_cache(cache, committed + 1 + n)  # pending + accepted drafts
        stats.steps += 1
        stats.drafted += len(draft)
        stats.accepted += n
        stats.verify_lengths.append(1 + len(draft))
        for tok in new:
            out.append(tok)
            if tok in eos or len(out) >= max_new_tokens:
                break
        pending = out[-1]
    stats.tokens = len(out)
    stats.seconds = time.perf_counter() - start
    return out, stats


def greedy_reference(lm: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                     stop_at_eos: bool = True) -> list[int]:
    """Plain greedy decoding without any cache tricks: the oracle for equality tests."""
    out, _ = self_speculative_generate(lm, prompt_ids, None, max_new_tokens,
                                       stop_at_eos=stop_at_eos)
    return out
