"""KNN-SSD (arXiv 2505.16162) as a drafter: self-speculative drafts from the target model with
sublayers skipped, the skip set chosen per prompt by the nearest domain anchor.

Per generation (``make_drafter``): load the model's profile, embed the prompt (mean final-layer
hidden state), pick the nearest anchor's domain by cosine and take its skip set (fallback:
the ``mixed`` set, else no drafts; see ``knn_ssd.router``). Per step (``propose``): feed the
pending token through the skip model and draft greedily (or by sampling, with ``q``) until the
draft's top probability is below ``threshold`` (0.8) or ``max_draft`` (12) tokens, then crop the
cache back to the committed tokens. Verification is the loop's exact rule, so the output equals
greedy decoding token for token (or follows p_LM exactly when sampling).

``drafter_options`` (all optional):

- ``profile``: a profile name (in ``$NEST_HOME/knn_ssd/<model fingerprint>/``, default
  ``"default"``) or a path to a profile JSON; or a ready ``Profile`` object;
- ``domain``: force a domain's skip set instead of routing (``"mixed"`` = Self-SD (Mix));
  with ``skip`` (a ``SkipSet`` or its dict) force an explicit set (no profile needed);
- ``threshold`` (0.8), ``max_draft`` (12), ``min_similarity`` (router fallback floor).

Each drafter keeps its counters in ``drafter.stats`` and its routing decision in
``drafter.route``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Method

LOG = logging.getLogger(__name__)


class KnnSsdDrafter:
    """Layer-skip self-speculative drafter for one generation."""

    def __init__(self, lm: Any, route: Any, *, threshold: float, max_draft: int) -> None:
        if not hasattr(lm, "forward_skip"):
            raise ValueError(
                f"decoding='knn-ssd' needs a language model with forward_skip() "
                f"(HFLanguageModel); got {type(lm).__name__}"
            )
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.lm = lm
        self.route = route
        self.skip = route.skip
        self.threshold = threshold
        self.max_draft = max_draft
        self.stats = {"drafts": 0, "drafted": 0, "accepted": 0, "draft_forwards": 0,
                      "draft_seconds": 0.0, "route_seconds": route.seconds}

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "KnnSsdDrafter":
        from nest_integrations.knn_ssd.profile import Profile, load_profile
        from nest_integrations.knn_ssd.router import Route, Router
        from nest_integrations.knn_ssd.selfspec import DEFAULT_MAX_DRAFT, DEFAULT_THRESHOLD
        from nest_integrations.lm.layer_skip import SkipSet, decoder_layers

        opts = dict(ctx.options or {})
        lm = ctx.lm
        decoder_layers(getattr(lm, "model", None))  # a clear error for unskippable models
        threshold = float(opts.get("threshold", DEFAULT_THRESHOLD))
        max_draft = int(opts.get("max_draft", DEFAULT_MAX_DRAFT))
        skip = opts.get("skip")
        if skip is not None:  # an explicit set: Self-SD with a fixed skip set, no profile
            skip = skip if isinstance(skip, SkipSet) else SkipSet.from_dict(skip)
            route = Route(None, float("nan"), skip, "explicit", False, 0.0)
            return cls(lm, route, threshold=threshold, max_draft=max_draft)
        profile = opts.get("profile")
        if not isinstance(profile, Profile):
            profile = load_profile(lm, profile)
        else:
            profile.check_model(lm)
        router = Router(profile, opts.get("min_similarity"))
        domain = opts.get("domain")
        if domain is not None:  # Self-SD (Fix) or (Mix): one named set, no routing
            if domain not in profile.skips:
                raise ValueError(f"the KNN-SSD profile has no skip set for domain {domain!r}; "
                                 f"it has {sorted(profile.skips)}")
            route = Route(domain, float("nan"), profile.skips[domain], domain, False, 0.0)
        else:
            if not profile.anchors:
                raise ValueError("the KNN-SSD profile has no anchors: run `nest knn-ssd "
                                 "anchors --domain NAME --prompts FILE` for each domain")
            start = time.perf_counter()
            route = router.route(lm, ctx.prompt_ids)
            LOG.info("KNN-SSD: prompt routed to %s (nearest %s, cos %.3f%s) in %.1f ms",
                     route.skip_name, route.domain, route.similarity,
                     ", fallback" if route.fallback else "", 1000 * (time.perf_counter() - start))
        return cls(lm, route, threshold=threshold, max_draft=max_draft)

    def propose(self, state: DecodeState) -> Draft | None:
        from nest_integrations.knn_ssd.selfspec import draft_chain

        # The lossless schedule always has a pending token (the loop feeds it with the draft).
        if self.skip is None or state.pending is None:
            return None
        max_len = min(self.max_draft, state.budget)
        if max_len < 1:
            return None
        cfg = state.config
        sampling = state.generator is not None and cfg.temperature > 0
        chain = draft_chain(
            state.lm, state.cache, state.pending, self.skip, max_len=max_len,
            threshold=self.threshold, eos=state.eos,
            temperature=cfg.temperature if sampling else 0.0, top_p=cfg.top_p,
            generator=state.generator,
        )
        self.stats["draft_forwards"] += chain.forwards
        self.stats["draft_seconds"] += chain.seconds
        if not chain.tokens:
            return None
        self.stats["drafts"] += 1
        self.stats["drafted"] += len(chain.tokens)
        return Draft(chain.tokens, None, q=chain.q)

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        self.stats["accepted"] += n_accepted


def _make(ctx: DrafterContext) -> KnnSsdDrafter:
    return KnnSsdDrafter.from_context(ctx)


METHOD = Method(
    "knn-ssd", _make,
    description="lossless self-speculative drafts with a kNN-routed per-domain layer-skip set",
)
