"""KNN-SSD (arXiv 2505.16162) as a drafter: self-speculative drafts from the target model with
sublayers skipped, the skip set chosen per prompt by the nearest domain anchor.

Per generation (``make_drafter``): load the model's profile; at the first step take the prompt's
vector (mean final-layer hidden state) from the loop's own prefill pass (no extra forward), pick
the nearest anchor's domain by cosine and take its skip set (fallback: the ``mixed`` set, else
no drafts; see ``knn_ssd.router``). Per step (``propose``): feed the
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

``drafter_options`` are read into ``KnnSsdOptions``. The routing decision is ``drafter.route``
(set at the first step when routed) and the result's ``NestStats.route``; draft counters go to
``NestStats.drafting`` (``forwards``, ...) and ``timing.draft``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nest_integrations.core.sampling import sample, warp
from nest_integrations.drafters.base import (
    LOSSLESS, DecodeState, Draft, DrafterContext, Method, ScratchPasses,
)  # fmt: skip
from nest_integrations.drafters.corpus import parse_options
from nest_integrations.types import NestStats, RouteStats
from nest_integrations.lm.port import LayerSkip, port_of
from nest_integrations.lm.serialized import unwrap

if TYPE_CHECKING:
    from nest_integrations.lm.layer_skip import SkipSet

LOG = logging.getLogger(__name__)

#: The paper's draft settings (KNN-SSD / Draft & Verify code).
DEFAULT_THRESHOLD = 0.8
DEFAULT_MAX_DRAFT = 12


@dataclass
class KnnSsdOptions:
    """``drafter_options`` of ``decoding="knn-ssd"`` (see the module docstring).

    Attributes:
        profile: a profile name, a path to a profile JSON, a ``Profile``, or None (the
            model's ``"default"`` profile).
        domain: force this domain's skip set instead of routing.
        skip: force an explicit ``SkipSet`` (or its dict); no profile needed.
        threshold: stop drafting when the draft's top probability is below it.
        max_draft: longest draft.
        min_similarity: the router's fallback floor (None: the profile's).
        cost_model: None (default): the paper's stop (``threshold``, ``max_draft``).
            ``"auto"``, a ``lm.cost.CostCurve``, its JSON dict or a list of c(T)/c(1)
            ratios: the draft also stops at the length the measured verify cost and the
            skip set's draft cost pay for at the acceptance measured so far in the
            generation (``lm.cost.DraftPlanner``; 0 = a plain step).
    """

    profile: Any = None
    domain: str | None = None
    skip: Any = None
    threshold: float = DEFAULT_THRESHOLD
    max_draft: int = DEFAULT_MAX_DRAFT
    min_similarity: float | None = None
    cost_model: Any = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {self.max_draft}")


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
    **kw: Any,
) -> ChainDraft:
    """``draft_chain_on`` over ``lm``'s ``cache`` (restored before returning): Self-SD's
    drafting half outside the decode loop (``builders.knn_ssd_selfspec``)."""
    return draft_chain_on(ScratchPasses(lm, cache, check_layer_skip(lm)), pending, skip, **kw)


def draft_chain_on(
    scratch: ScratchPasses,
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
    """Draft up to ``max_len`` tokens after ``pending`` (not yet in the cache) with ``skip``.

    The passes run in one ``scratch`` block, so the cache is restored to its committed length
    before returning (every layer cropped) and the caller's next full forward sees exactly the
    KV it had. Greedy when ``temperature`` is 0; otherwise each token is drawn (with
    ``generator``) from ``q = warp(p_draft)``, the same temperature/top-p warp the loop applies
    to the target, and ``q`` is returned for the speculative-sampling rule. The confidence stop
    reads the unwarped draft ``p``.
    """
    start = time.perf_counter()
    tokens: list[int] = []
    qs: list[torch.Tensor] = []
    forwards = 0
    with scratch:
        feed = pending
        while len(tokens) < max_len:
            logits = scratch.forward_skip([feed], skip)[-1]  # (V,)
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
    q_all = torch.stack(qs) if qs else None
    return ChainDraft(tokens, q_all, forwards, time.perf_counter() - start)


def check_layer_skip(lm: Any) -> LayerSkip:
    """``lm``'s layer skipping (``lm.port.LayerSkip``), else a ``ValueError`` (no
    ``forward_skip``) with the model's own reason when it gives one
    (``Capabilities.layer_skip_unsupported``: the llama.cpp backend's)."""
    port = port_of(lm)
    if port.layer_skip is None:
        name = type(unwrap(lm)).__name__
        raise ValueError(port.caps.layer_skip_unsupported
                         or f"decoding='knn-ssd' needs a language model with forward_skip() "
                            f"(HFLanguageModel); got {name}")
    return port.layer_skip


class KnnSsdDrafter:
    """Layer-skip self-speculative drafter for one generation; its routing decision is
    ``drafter.route`` (also written to the generation's ``NestStats``).

    With a ``router`` and no ``route`` the drafter routes at its first ``propose``, from
    ``DecodeState.prompt_vector``: the mean final-layer state the loop captured during its own
    prefill (``wants_prompt_vector``), so routing adds no forward pass. An LM that cannot
    capture it gets ``lm.domain_vector(prompt)`` (one base-model pass) instead.
    """

    def __init__(self, lm: Any, route: Any = None, *, router: Any = None,
                 threshold: float = DEFAULT_THRESHOLD,
                 max_draft: int = DEFAULT_MAX_DRAFT, cost_model: Any = None,
                 profile_cost: dict[str, Any] | None = None) -> None:  # fmt: skip
        check_layer_skip(lm)
        if route is None and router is None:
            raise ValueError("KnnSsdDrafter needs a route or a router")
        KnnSsdOptions(threshold=threshold, max_draft=max_draft)  # the same checks
        self.lm = lm
        self.route = route
        self.router = router
        #: routed drafters read the prompt's vector from the loop's prefill
        self.wants_prompt_vector = route is None
        self.threshold = threshold
        self.max_draft = max_draft
        self.cost_model = cost_model
        self.profile_cost = profile_cost
        self.planner: Any = None
        if route is not None:
            self._plan()

    def _plan(self) -> None:
        """Set up the draft-length planner for the chosen skip set (cost_model option)."""
        from nest_integrations.lm.cost import planner_for

        if self.cost_model is None or self.skip is None:
            return
        self.planner = planner_for(self.cost_model, self.lm, self.max_draft,
                                   draft_cost=draft_cost_fraction(self.skip, self.profile_cost))

    @property
    def skip(self) -> "SkipSet | None":
        return None if self.route is None else self.route.skip

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "KnnSsdDrafter":
        from nest_integrations.knn_ssd.profile import Profile, load_profile
        from nest_integrations.knn_ssd.router import Route, Router
        from nest_integrations.lm.layer_skip import SkipSet, decoder_layers

        opts = parse_options(KnnSsdOptions, ctx.options, "knn-ssd")
        lm = ctx.lm
        decoder_layers(check_layer_skip(lm).model)  # a clear error for unskippable models
        kw = {"threshold": opts.threshold, "max_draft": opts.max_draft,
              "cost_model": opts.cost_model}
        if opts.skip is not None:  # an explicit set: Self-SD with a fixed skip set, no profile
            skip = opts.skip if isinstance(opts.skip, SkipSet) else SkipSet.from_dict(opts.skip)
            route = Route(None, float("nan"), skip, "explicit", False, 0.0)
            return cls(lm, route, **kw).record(ctx.stats)
        profile = opts.profile
        if not isinstance(profile, Profile):
            profile = load_profile(lm, profile)
        else:
            profile.check_model(lm)
        kw["profile_cost"] = profile.cost_model
        domain = opts.domain
        if domain is not None:  # Self-SD (Fix) or (Mix): one named set, no routing
            if domain not in profile.skips:
                raise ValueError(f"the KNN-SSD profile has no skip set for domain {domain!r}; "
                                 f"it has {sorted(profile.skips)}")
            route = Route(domain, float("nan"), profile.skips[domain], domain, False, 0.0)
            return cls(lm, route, **kw).record(ctx.stats)
        if not profile.anchors:
            raise ValueError("the KNN-SSD profile has no anchors: run `nest knn-ssd "
                             "anchors --domain NAME --prompts FILE` for each domain")
        return cls(lm, router=Router(profile, opts.min_similarity), **kw)

    def record(self, stats: NestStats) -> "KnnSsdDrafter":
        """Write a routing decision made before decoding to the generation's ``NestStats``
        (``DrafterContext.stats``); one made while decoding comes back in a ``Draft``."""
        stats.route = self.route_stats()
        return self

    def route_stats(self) -> RouteStats:
        """The routing decision as the generation's stats record it."""
        r = self.route
        return RouteStats(
            skip_set=r.skip_name, domain=r.domain,
            similarity=None if r.similarity != r.similarity else float(r.similarity),
            fallback=bool(r.fallback), seconds=float(r.seconds))

    def route_from(self, state: DecodeState) -> None:
        """Route on the prefill's prompt vector (see the class docstring) and record it."""
        start = time.perf_counter()
        vector = state.prompt_vector
        if vector is None:
            LOG.debug("KNN-SSD: the LM gave no prefill vector; embedding the prompt")
            vector = self.lm.domain_vector(state.prompt_ids)
        domain, sim = self.router.nearest(vector.numpy())
        self.route = self.router.decide(domain, sim, time.perf_counter() - start)
        r = self.route
        LOG.info("KNN-SSD: prompt routed to %s (nearest %s, cos %.3f%s) in %.2f ms",
                 r.skip_name, r.domain, r.similarity, ", fallback" if r.fallback else "",
                 1000 * r.seconds)
        self._plan()

    def propose(self, state: DecodeState) -> Draft | None:
        route = None
        if self.route is None:  # routed now: the first draft carries the decision
            self.route_from(state)
            route = self.route_stats()
        none = None if route is None else Draft([], route=route)
        # The lossless schedule always has a pending token (the loop feeds it with the draft).
        if self.skip is None or state.pending is None or state.scratch is None:
            return none
        max_len = min(self.max_draft, state.budget)
        if self.planner is not None:
            max_len = self.planner.length(max_len)
        if max_len < 1:
            return none
        cfg = state.config
        sampling = state.generator is not None and cfg.temperature > 0
        chain = draft_chain_on(
            state.scratch, state.pending, self.skip, max_len=max_len,
            threshold=self.threshold, eos=state.eos,
            temperature=cfg.temperature if sampling else 0.0, top_p=cfg.top_p,
            generator=state.generator,
        )  # fmt: skip
        return Draft(chain.tokens, None, q=chain.q if chain.tokens else None,
                     forwards=chain.forwards, route=route)

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        if self.planner is not None:
            self.planner.observe(len(draft), n_accepted)


def draft_cost_fraction(skip: "SkipSet", profile_cost: dict[str, Any] | None) -> float:
    """Seconds of one draft pass with ``skip`` as a fraction of a one-token full pass: from the
    profile's measured per-sublayer costs (``builders.knn_ssd_search.CostModel``) when it has them,
    else the share of sublayers kept."""
    try:  # CostModel.draft(skip) / CostModel.verify(1) (builders.knn_ssd_search), from its dict
        c = profile_cost or {}
        if c and int(c["n_layers"]) == skip.n_layers and float(c["full"]) > 0:
            n = skip.n_layers
            kept = (float(c["base"]) + (n - len(skip.attn)) * float(c["attn"])
                    + (n - len(skip.mlp)) * float(c["mlp"]))
            return min(kept / float(c["full"]), 1.0)
    except (KeyError, TypeError, ValueError):
        LOG.debug("profile cost model %r is not a CostModel", profile_cost)
    return 1.0 - skip.size / (2 * skip.n_layers)


METHOD = Method(
    "knn-ssd", KnnSsdDrafter.from_context, verifier=LOSSLESS,
    description="lossless self-speculative drafts with a kNN-routed per-domain layer-skip set",
)
