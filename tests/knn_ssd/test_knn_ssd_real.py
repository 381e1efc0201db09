"""KNN-SSD on the real embedded model (slow): the router picks the right domain for held-out
prompts of every domain, and greedy KNN-SSD equals greedy decoding with a skip set that drafts
well and one that drafts badly, on prompts of every domain."""

from __future__ import annotations

import numpy as np
import pytest

from nest_integrations.knn_ssd.domains import DOMAINS, domain_prompts
from nest_integrations.knn_ssd.profile import MIXED, Profile
from nest_integrations.knn_ssd.router import Router, domain_vectors, kmeans_anchors
from nest_integrations.lm.layer_skip import SkipSet

import faiss  # noqa: E402,F401  (a required dependency: imported, so a broken install fails)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile(default_lm):
    """Anchors from 20 train prompts per domain (10 centroids each, as in the paper); a good and a bad set."""
    prof = Profile(default_lm.fingerprint, 30, default_lm.key_dim)
    for d in DOMAINS:
        texts = [p.text for p in domain_prompts(d, "train", 20)]
        prof.anchors[d] = kmeans_anchors(domain_vectors(default_lm, texts), k=10)
    prof.skips = {
        "good": SkipSet.from_lists(30, [16, 20, 24, 28]),  # a few deep attention sublayers
        "bad": SkipSet.from_lists(30, range(1, 30, 2), range(1, 30, 2)),  # the paper's fallback
    }
    return prof


def test_router_picks_the_right_domain_for_held_out_prompts(default_lm, profile):
    router = Router(profile, min_similarity=-1.0)
    hits = []
    for d in DOMAINS:
        for p in domain_prompts(d, "eval", 2):
            got, _ = router.nearest(default_lm.domain_vector(default_lm.tokenize(p.text)).numpy())
            hits.append((d, got))
    assert all(d == got for d, got in hits), hits


@pytest.mark.parametrize("domain", DOMAINS)
def test_greedy_knn_ssd_equals_greedy_on_every_domain(default_lm, profile, domain):
    from tests.engines import make_engine

    prompt = domain_prompts(domain, "eval", 1)[0].text
    engine = make_engine(default_lm, decoding="greedy")
    ref = engine.generate(prompt, max_new_tokens=10)
    drafted = {}
    for name in ("good", "bad"):
        res = engine.generate(prompt, max_new_tokens=10, decoding="knn-ssd",
                              drafter_options={"profile": profile, "domain": name})
        assert res.token_ids == ref.token_ids, name
        drafted[name] = (res.stats.accepted_tokens, res.stats.drafted_tokens)
    assert drafted["bad"][1] > 0 and drafted["good"][1] > 0
    # Routed (no forced domain): every anchor domain lacks a set, so the Mix set is used.
    profile.skips[MIXED] = profile.skips["good"]
    try:
        res = engine.generate(prompt, max_new_tokens=10, decoding="knn-ssd",
                              drafter_options={"profile": profile})
    finally:
        del profile.skips[MIXED]
    assert res.token_ids == ref.token_ids
    assert np.isfinite(res.stats.time_total)


def test_a_fresh_install_routes_with_the_shipped_profile(default_lm, tmp_path, monkeypatch):
    """A fresh $NEST_HOME (no profile built): decoding="knn-ssd" loads the profile shipped in
    the package for the embedded model, routes a held-out prompt of every domain to a skip
    set, and answers exactly like greedy decoding."""
    from nest_integrations.knn_ssd.profile import load_profile, shipped_profile_path
    from tests.engines import make_engine

    monkeypatch.setenv("NEST_HOME", str(tmp_path / "fresh-home"))
    assert load_profile(default_lm).source == str(shipped_profile_path(default_lm))
    engine = make_engine(default_lm, decoding="greedy")
    routed = []
    for d in DOMAINS:
        prompt = domain_prompts(d, "eval", 1)[0].text
        ref = engine.generate(prompt, max_new_tokens=16)
        res = engine.generate(prompt, max_new_tokens=16, decoding="knn-ssd")
        assert res.token_ids == ref.token_ids, d
        assert res.stats.route_skip_set is not None, d
        routed.append((d, res.stats.route_domain))
    assert all(d == got for d, got in routed), routed
    assert not (tmp_path / "fresh-home" / "knn_ssd").exists()  # nothing had to be built
