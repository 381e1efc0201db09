"""Skip-set search (spec §3.4): Bayesian optimisation over the 2L sublayer switches.

``optuna``'s TPE sampler (seed 42) proposes a skip/keep switch per attention and MLP sublayer;
each trial runs exact greedy self-speculative decoding (``knn_ssd_selfspec.self_speculative_generate``)
on the domain's search prompts and returns its speed-up over plain decoding. Known-good shapes
are probed first (``SEED_SETS``), as the Draft & Verify recipe allows.

Objective (``objective=``):

- ``"model"`` (default, for shared CPUs): the speed-up predicted by a cost model measured once
  per search — the seconds of a one-token full forward, of the non-sublayer part (embeddings,
  norms, head), of one attention and one MLP sublayer, and of a verify pass as ``a + b·k`` for
  k tokens — applied to the trial's exact counts of draft passes and verify lengths. The counts
  are deterministic (greedy), so the value does not depend on what else runs on the machine.
- ``"wallclock"``: measured tokens/s of the trial divided by measured plain greedy tokens/s on
  the same prompts (the paper's objective; use it on a quiet machine or a GPU).

The cost model is measured once per profile (by its first search) and stored in it, so every
domain's search (and the Mix set's) weighs draft cost against acceptance the same way.

Resumable: trials live in an optuna SQLite study next to the profile
(``<profile dir>/search.db``), named by domain, objective and prompt set; running the same
search again continues up to the trial budget. The best set is written into the profile JSON.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from nest_integrations.knn_ssd.profile import update_profile
from nest_integrations.builders.knn_ssd_selfspec import (
    DEFAULT_MAX_DRAFT,
    DEFAULT_THRESHOLD,
    SpecStats,
    self_speculative_generate,
)
from nest_integrations.lm.layer_skip import SkipSet, decoder_layers

LOG = logging.getLogger(__name__)

OBJECTIVES = ("model", "wallclock")


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward pass, measured on this machine (see the module docstring)."""

    full: float  # one-token full forward
    base: float  # one-token forward with every sublayer skipped
    attn: float  # one attention sublayer (one token)
    mlp: float  # one MLP sublayer (one token)
    verify_a: float  # verify pass of k tokens: a + b * k
    verify_b: float
    n_layers: int

    def draft(self, skip: SkipSet) -> float:
        """Predicted seconds of one draft pass with ``skip``: a one-token verify pass scaled by
        the share of the skip-forward's time that ``skip`` keeps (ratios of passes timed side
        by side are steadier on a busy machine than absolute times)."""
        kept = (self.base + (self.n_layers - len(skip.attn)) * self.attn
                + (self.n_layers - len(skip.mlp)) * self.mlp)
        return self.verify(1) * min(kept / self.full, 1.0) if self.full > 0 else 0.0

    def verify(self, k: int) -> float:
        return self.verify_a + self.verify_b * k

    def speedup(self, stats: SpecStats, skip: SkipSet) -> float:
        """Predicted plain-decoding time over self-speculative time for ``stats``' tokens
        (prefill excluded from both)."""
        spec = sum(self.verify(k) for k in stats.verify_lengths)
        spec += stats.draft_forwards * self.draft(skip)
        plain = (stats.tokens - 1) * self.verify(1)
        return plain / spec if spec > 0 else 0.0


def measure_cost_model(lm: Any, context_ids: Sequence[int], repeats: int = 7) -> CostModel:
    """Time one-token forwards with no, all-attention, all-MLP and all sublayers skipped, and
    verify passes of 1, 4, 8 and 13 tokens, after ``context_ids`` in the cache.

    The passes are timed round-robin and each keeps its minimum over ``repeats``: on a shared
    machine the minimum is the least disturbed estimate, and interleaving spreads drift evenly.
    """
    n = len(decoder_layers(lm.model))
    cache = lm.new_cache()
    lm.forward(list(context_ids), cache)
    committed = lm.cache_length(cache)
    tok = list(context_ids)[-1]
    everything = range(n)
    ks = [1, 4, 8, 13]
    passes: dict[str, tuple[SkipSet | None, int]] = {
        "full": (SkipSet(n), 1),
        "no_attn": (SkipSet.from_lists(n, everything, []), 1),
        "no_mlp": (SkipSet.from_lists(n, [], everything), 1),
        "base": (SkipSet.from_lists(n, everything, everything), 1),
        **{f"verify{k}": (None, k) for k in ks},
    }
    best = dict.fromkeys(passes, float("inf"))
    for r in range(repeats + 1):  # round 0 is a warm-up
        for name, (skip, k) in passes.items():
            start = time.perf_counter()
            if skip is None:
                lm.forward([tok] * k, cache)
            else:
                lm.forward_skip([tok] * k, cache, skip)
            elapsed = time.perf_counter() - start
            lm.crop_cache(cache, committed)
            if r:
                best[name] = min(best[name], elapsed)
    vs = [best[f"verify{k}"] for k in ks]
    mean_k, mean_v = sum(ks) / len(ks), sum(vs) / len(vs)
    b = sum((k - mean_k) * (v - mean_v) for k, v in zip(ks, vs)) / sum(
        (k - mean_k) ** 2 for k in ks)
    b = max(b, 0.0)
    full = best["full"]
    return CostModel(
        full=full, base=best["base"], attn=max(full - best["no_attn"], 0.0) / n,
        mlp=max(full - best["no_mlp"], 0.0) / n, verify_a=max(mean_v - b * mean_k, 0.0),
        verify_b=b, n_layers=n,
    )


def seed_sets(n: int) -> list[SkipSet]:
    """Known shapes probed before TPE: a few attention sublayers of the upper-middle layers,
    plus some MLPs, at growing sizes (deep layers are the most redundant)."""
    upper = list(range(n // 2, n - 1))
    return [
        SkipSet.from_lists(n, upper[::4]),
        SkipSet.from_lists(n, upper[::2]),
        SkipSet.from_lists(n, upper[::2], upper[1::4]),
        SkipSet.from_lists(n, range(1, n, 2), range(1, n, 2)),  # the paper code's fallback
    ]


def _switches(skip: SkipSet) -> dict[str, int]:
    n = skip.n_layers
    return {**{f"attn{i}": int(i in skip.attn) for i in range(n)},
            **{f"mlp{i}": int(i in skip.mlp) for i in range(n)}}


def evaluate(
    lm: Any,
    prompts: Sequence[Sequence[int]],
    skip: SkipSet | None,
    max_new_tokens: int,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_draft: int = DEFAULT_MAX_DRAFT,
) -> SpecStats:
    """Pooled counters of greedy self-speculative decoding of every prompt with ``skip``."""
    total = SpecStats()
    for ids in prompts:
        _, stats = self_speculative_generate(
            lm, ids, skip, max_new_tokens, threshold=threshold, max_draft=max_draft,
            stop_at_eos=False,
        )
        total.add(stats)
    return total


@dataclass
class SearchResult:
    domain: str
    skip: SkipSet
    value: float
    trials: int
    objective: str
    stats: dict[str, Any]
    storage: str


def search_skip_set(
    lm: Any, domain: str, texts: Sequence[str], *, trials: int = 40, n_prompts: int = 4,
    max_new_tokens: int = 24, prompt_tokens: int = 96,
    objective: str = "model",
    profile: str | None = None,
    storage_dir: str | Path | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_draft: int = DEFAULT_MAX_DRAFT,
    progress: bool = True,
    seed: int = 42,
) -> SearchResult:
    """Search a skip set for ``domain`` on (the first ``n_prompts`` of) ``texts`` and store the
    best one in the profile. See the module docstring."""
    try:
        import optuna
    except ImportError as exc:  # optional: only the search needs it
        raise ImportError("the KNN-SSD skip-set search needs optuna: "
                          "pip install 'nest-integrations[knn-ssd]' (or pip install optuna)"
                          ) from exc
    from tqdm.auto import tqdm

    from nest_integrations.knn_ssd.profile import profile_path

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if not domain or not domain.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"domain names are letters, digits, '-' and '_'; got {domain!r}")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"domain {domain!r} has no prompts: give at least one non-empty prompt")
    if trials < 1:
        raise ValueError(f"the trial budget must be >= 1, got {trials}")
    n = len(decoder_layers(lm.model))  # refuses models whose layers cannot be skipped
    prompts = [lm.tokenize(t)[-prompt_tokens:] for t in texts[:n_prompts]]
    path = profile_path(lm, profile)
    folder = Path(storage_dir) if storage_dir is not None else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{folder / 'search.db'}"
    key = hashlib.sha1(repr((prompts, max_new_tokens, threshold, max_draft)).encode()).hexdigest()
    study_name = f"{lm.fingerprint}|{domain}|{objective}|{key[:12]}"

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, max(trials // 3, 1)))
    study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                sampler=sampler, load_if_exists=True)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if "cost_model" in study.user_attrs:  # a resumed study keeps the model it started with
        cost = CostModel(**study.user_attrs["cost_model"])
    else:  # the profile's shared one, else measure it (stored in the profile below)
        from nest_integrations.knn_ssd.profile import load_profile

        shared = load_profile(lm, path).cost_model if path.is_file() else None
        cost = CostModel(**shared) if shared else measure_cost_model(lm, prompts[0])
        study.set_user_attr("cost_model", asdict(cost))
    if objective == "wallclock":
        if "plain_tps" not in study.user_attrs:
            plain = evaluate(lm, prompts, None, max_new_tokens)
            study.set_user_attr("plain_tps", plain.tokens_per_second)
        plain_tps = float(study.user_attrs["plain_tps"])
    if not done:
        for s in seed_sets(n)[: max(trials - 1, 1)]:
            study.enqueue_trial(_switches(s))

    def run_trial(trial: Any) -> float:
        attn = [i for i in range(n) if trial.suggest_categorical(f"attn{i}", [0, 1])]
        mlp = [i for i in range(n) if trial.suggest_categorical(f"mlp{i}", [0, 1])]
        skip = SkipSet.from_lists(n, attn, mlp)
        stats = evaluate(lm, prompts, skip, max_new_tokens, threshold=threshold,
                         max_draft=max_draft)
        value = (stats.tokens_per_second / plain_tps if objective == "wallclock"
                 else cost.speedup(stats, skip))
        trial.set_user_attr("stats", stats.as_dict())
        trial.set_user_attr("skipped", skip.size)
        return value

    todo = max(trials - len(done), 0)
    if todo:
        bar = tqdm(total=todo, desc=f"knn-ssd search {domain}", unit="trial",
                   disable=not progress)

        def tick(study: Any, trial: Any) -> None:
            bar.update(1)
            bar.set_postfix(best=f"{study.best_value:.3f}")

        torch_threads = torch.get_num_threads()
        try:
            study.optimize(run_trial, n_trials=todo, callbacks=[tick], catch=())
        finally:
            bar.close()
            torch.set_num_threads(torch_threads)
    best = study.best_trial
    skip = SkipSet.from_lists(
        n, [i for i in range(n) if best.params[f"attn{i}"]],
        [i for i in range(n) if best.params[f"mlp{i}"]],
    )
    n_done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    meta = {
        "objective": objective,
        "value": round(float(best.value), 4),
        "trials": n_done,
        "stats": best.user_attrs.get("stats", {}),
        "n_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "threshold": threshold,
        "max_draft": max_draft,
        "study": study_name,
        "storage": storage,
        "cost_model": study.user_attrs.get("cost_model"),
    }

    def change(p: Any) -> None:
        p.skips[domain] = skip
        p.search[domain] = meta
        if p.cost_model is None:
            p.cost_model = asdict(cost)

    update_profile(lm, path, change)
    LOG.info("knn-ssd %s: best %s, value %.3f after %d trials", domain, skip, best.value, n_done)
    return SearchResult(domain, skip, float(best.value), n_done, objective, meta["stats"],
                        storage)


def build_anchors(
    lm: Any,
    domain: str,
    texts: Sequence[str],
    *,
    k: int = 10,
    profile: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Embed ``texts``, K-means them into ``k`` anchors and store them for ``domain``."""
    from tqdm.auto import tqdm

    from nest_integrations.knn_ssd.profile import MIXED, profile_path
    from nest_integrations.knn_ssd.router import domain_vectors, kmeans_anchors, self_similarity

    if domain == MIXED:
        raise ValueError(f"{MIXED!r} is the Self-SD (Mix) fallback set: it has no anchors")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"domain {domain!r} has no prompts: give at least one non-empty prompt")
    path = profile_path(lm, profile)
    if path.is_file():  # fail on another model's profile before the slow part
        from nest_integrations.knn_ssd.profile import load_profile

        load_profile(lm, path)
    with tqdm(total=len(texts), desc=f"knn-ssd anchors {domain}", unit="prompt",
              disable=not progress) as bar:
        vectors = domain_vectors(lm, texts, bar)
    anchors = kmeans_anchors(vectors, k)
    sims = self_similarity(vectors, anchors)
    info = {"n_prompts": len(texts), "min_self_similarity": round(float(sims.min()), 4),
            "mean_self_similarity": round(float(sims.mean()), 4)}

    def change(p: Any) -> None:
        p.anchors[domain] = anchors
        p.anchor_info[domain] = info

    update_profile(lm, path, change)
    return {"domain": domain, "anchors": len(anchors), **info, "profile": str(path)}
