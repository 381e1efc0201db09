"""KNN-SSD anchors and routing (spec §3.2-3.3, §3.6 steps 2-4).

- **Domain vector** of a prompt: the mean over its tokens of the final-layer hidden state
  (after the final norm), ``HFLanguageModel.domain_vector``.
- **Anchors**: K-means (faiss, 10 clusters, seed 42) over a domain's prompt vectors; the
  centroids are the anchors, as in the released code.
- **Routing**: 1-nearest anchor by cosine picks the domain and so its skip set, once per prompt.
- **Fallback** (documented): when the best cosine is below ``min_similarity`` — by default the
  lowest similarity any anchor prompt had to its own domain's nearest anchor, minus 0.05 — or
  the chosen domain has no skip set, the Self-SD (Mix) set ``mixed`` is used; without one the
  generation decodes without drafts (plain greedy speed, same output). The paper's code falls
  back to skipping odd layers, which drafts badly on small models.

Cost in decoding: no forward pass of its own. The decoding loop captures the prompt's mean
final-layer state during its prefill (``DecodeState.prompt_vector``) and the drafter routes on
it (``drafters.knn_ssd``): one mean and a few dozen cosines; ``Route.seconds`` reports it.
``Router.route`` (embed, then route) is for offline use (benchmarks, router checks).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from nest_integrations.knn_ssd.profile import MIXED, Profile
from nest_integrations.lm.layer_skip import SkipSet

LOG = logging.getLogger(__name__)

N_ANCHORS = 10
SIMILARITY_MARGIN = 0.05


def domain_vectors(lm: Any, texts: Sequence[str], progress: Any = None) -> np.ndarray:
    """``(n, d)`` float32 domain vectors of raw-text prompts."""
    rows = []
    for text in texts:
        rows.append(lm.domain_vector(lm.tokenize(text)).numpy())
        if progress is not None:
            progress.update(1)
    return np.stack(rows).astype(np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def kmeans_anchors(vectors: np.ndarray, k: int = N_ANCHORS, seed: int = 42) -> np.ndarray:
    """``(min(k, n), d)`` K-means centroids of ``vectors`` (faiss); all vectors when n <= k."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if len(vectors) == 0:
        raise ValueError("cannot build anchors from no prompts")
    if len(vectors) <= k:
        return vectors.copy()
    km = faiss.Kmeans(vectors.shape[1], k, niter=25, seed=seed, nredo=3, verbose=False,
                      min_points_per_centroid=1)
    km.train(vectors)
    return np.asarray(km.centroids, dtype=np.float32)


def self_similarity(vectors: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Each vector's best cosine to ``anchors``."""
    return (_unit(vectors) @ _unit(anchors).T).max(axis=1)


@dataclass(frozen=True)
class Route:
    """The routing decision for one prompt."""

    domain: str | None  # the nearest anchor's domain (None: no anchors)
    similarity: float
    skip: SkipSet | None  # None: decode without drafts
    skip_name: str | None  # the profile entry used ("mixed" on fallback)
    fallback: bool
    seconds: float


class Router:
    """1-NN cosine over a profile's anchors."""

    def __init__(self, profile: Profile, min_similarity: float | None = None) -> None:
        self.profile = profile
        labels, rows = [], []
        for d, a in sorted(profile.anchors.items()):
            labels += [d] * len(a)
            rows.append(a)
        self.labels = labels
        self.anchors = _unit(np.concatenate(rows)) if rows else np.zeros((0, profile.hidden_size))
        if min_similarity is None:
            floors = [float(i["min_self_similarity"]) for i in profile.anchor_info.values()
                      if "min_self_similarity" in i]
            min_similarity = float(profile.router.get(
                "min_similarity", min(floors) - SIMILARITY_MARGIN if floors else -1.0))
        self.min_similarity = float(min_similarity)

    def nearest(self, vector: np.ndarray) -> tuple[str | None, float]:
        if not self.labels:
            return None, float("-inf")
        sims = self.anchors @ _unit(np.asarray(vector, dtype=np.float32))
        i = int(np.argmax(sims))
        return self.labels[i], float(sims[i])

    def decide(self, domain: str | None, similarity: float, seconds: float = 0.0) -> Route:
        skips = self.profile.skips
        if domain is not None and similarity >= self.min_similarity and domain in skips:
            return Route(domain, similarity, skips[domain], domain, False, seconds)
        fallback = skips.get(MIXED)
        return Route(domain, similarity, fallback, MIXED if fallback else None, True, seconds)

    def route(self, lm: Any, prompt_ids: Sequence[int]) -> Route:
        """Embed the prompt and pick its skip set (timed)."""
        start = time.perf_counter()
        domain, sim = self.nearest(lm.domain_vector(prompt_ids).numpy())
        route = self.decide(domain, sim, time.perf_counter() - start)
        LOG.debug("KNN-SSD route: %s (cos %.3f, fallback %s) in %.1f ms", route.skip_name,
                  sim, route.fallback, 1000 * route.seconds)
        return route
