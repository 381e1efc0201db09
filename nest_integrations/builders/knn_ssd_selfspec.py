"""Self-speculative decoding with a layer-skip draft (Draft & Verify; KNN-SSD spec §3.5-3.6).

``self_speculative_generate`` runs the KNN-SSD drafter (``nest_integrations.drafters.knn_ssd``,
whose ``draft_chain`` is the drafting half, re-exported here) with a fixed skip set through the
one decoding loop (``decoding.plain.decode_ids``) without an engine, for the skip-set search, which counts
drafts and acceptances (``SpecStats``).

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

from nest_integrations.drafters import get_method
from nest_integrations.drafters.base import DecodeState, Draft
from nest_integrations.drafters.knn_ssd import (
    DEFAULT_MAX_DRAFT,
    DEFAULT_THRESHOLD,
    ChainDraft,
    KnnSsdDrafter,
    draft_chain,
)
from nest_integrations.lm.layer_skip import SkipSet
from nest_integrations.decoding.plain import decode_ids

__all__ = ["ChainDraft", "SpecStats", "draft_chain", "self_speculative_generate"]


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


class _Lengths:
    """Wraps a drafter to record the length of every draft it has verified."""

    def __init__(self, drafter: KnnSsdDrafter) -> None:
        self.drafter = drafter
        self.lengths: list[int] = []

    def propose(self, state: DecodeState) -> Draft | None:
        return self.drafter.propose(state)

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        self.lengths.append(len(draft))
        self.drafter.update(state, draft, n_accepted)


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
    """Greedy self-speculative decoding through the one loop (``decoding="knn-ssd"`` with the
    fixed set ``skip``); ``skip=None`` is plain greedy decoding (no drafts).

    The output equals greedy decoding token for token (the loop's exact verifier); it stops
    before an end token unless ``stop_at_eos`` is False. Returns the generated ids and the
    counters (``steps`` counts every verify pass after the prefill, drafted or not).
    """
    if max_new_tokens < 1:
        return [], SpecStats()
    from nest_integrations.knn_ssd.router import Route

    start = time.perf_counter()
    drafter = None
    if skip is not None:
        route = Route(None, float("nan"), skip, "explicit", False, 0.0)
        drafter = _Lengths(KnnSsdDrafter(lm, route, threshold=threshold, max_draft=max_draft))
    eos = None if stop_at_eos else frozenset()
    out, ns = decode_ids(lm, get_method("knn-ssd"), list(prompt_ids), max_new_tokens,
                         drafter=drafter, eos=eos)  # fmt: skip
    steps = ns.forward_passes - 1  # one pass per step after the prefill
    drafted = drafter.lengths if drafter is not None else []
    stats = SpecStats(
        tokens=len(out), steps=steps, drafted=ns.drafted_tokens, accepted=ns.accepted_tokens,
        draft_forwards=ns.draft_forwards, draft_seconds=ns.time_draft,
        seconds=time.perf_counter() - start,
        verify_lengths=[1 + n for n in drafted] + [1] * (steps - len(drafted)),
    )  # fmt: skip
    return out, stats
