"""KNN-SSD: layer-skip forward (identity oracle), the KV invariant after drafting, the lossless
oracle (self-speculative greedy == Hugging Face greedy ``generate``) with good and bad skip
sets through the engine, profiles (fingerprint, tiny search, resume), anchors and routing, CLI
and bad input. Tiny random Llama here; the real model in tests/knn_ssd/test_knn_ssd_real.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from nest_integrations.knn_ssd.domains import DOMAINS, domain_prompts, read_prompts
from nest_integrations.knn_ssd.profile import (
    MIXED,
    Profile,
    ProfileError,
    load_profile,
    profile_path,
    update_profile,
)
from nest_integrations.knn_ssd.router import Router, kmeans_anchors
from nest_integrations.builders.knn_ssd_selfspec import draft_chain, self_speculative_generate
from nest_integrations.lm.layer_skip import LayerSkipError, SkipSet, decoder_layers

import faiss  # noqa: E402,F401  (a required dependency: imported, so a broken install fails)

CODE = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"
PROSE = "The Roman Empire was the post-Republican state of ancient Rome, ruled by emperors."


def _n(lm) -> int:
    return len(decoder_layers(lm.model))


def _all(lm) -> SkipSet:
    n = _n(lm)
    return SkipSet.from_lists(n, range(n), range(n))


def _hf_greedy(lm, ids: list[int], n: int) -> list[int]:
    """Hugging Face ``generate`` (greedy, no end token: exactly ``n`` tokens): the oracle."""
    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    new = out[0, len(ids) :].tolist()
    assert len(new) == n, "HF generate stopped early: the oracle needs n tokens"
    return new


def _cache_snapshot(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


# ----------------------------------------------------------------------------- layer skipping


def test_empty_skip_set_equals_the_full_forward(tiny_lm):
    """Skipping nothing is the ordinary forward, cache and all."""
    ids = tiny_lm.tokenize(PROSE)
    a, b = tiny_lm.new_cache(), tiny_lm.new_cache()
    full, _ = tiny_lm.forward(ids, a)
    skip = tiny_lm.forward_skip(ids, b, SkipSet(_n(tiny_lm)))
    torch.testing.assert_close(skip, full)
    assert b.get_seq_length() == a.get_seq_length() == len(ids)


def test_skipped_sublayers_pass_their_input_through(tiny_lm):
    """Oracle: with every sublayer skipped the model is head(norm(embed(x))); with one MLP
    skipped it is the layers run by hand without that MLP."""
    ids = tiny_lm.tokenize(CODE)
    m = tiny_lm.model
    x = torch.tensor([ids])
    with torch.no_grad():
        expect = m.lm_head(m.model.norm(m.model.embed_tokens(x)))[0]
    got = tiny_lm.forward_skip(ids, tiny_lm.new_cache(), _all(tiny_lm))
    torch.testing.assert_close(got, expect.float())
    # Skip MLP 1 only: compare with the last layer's MLP output removed by hand.
    layer = m.model.layers[1]
    got = tiny_lm.forward_skip(ids, tiny_lm.new_cache(), SkipSet.from_lists(_n(tiny_lm), [], [1]))
    with torch.no_grad():
        out = m.model(input_ids=x, output_hidden_states=True)
        h1 = out.hidden_states[1]  # input of layer 1
        pos = torch.arange(len(ids)).unsqueeze(0)
        pe = m.model.rotary_emb(h1, pos)
        mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)[None, None]
        attn, _ = layer.self_attn(layer.input_layernorm(h1), attention_mask=mask,
                                  position_embeddings=pe)
        manual = m.lm_head(m.model.norm(h1 + attn))[0]
    torch.testing.assert_close(got, manual.float(), atol=1e-4, rtol=1e-4)


def test_models_without_skippable_layers_are_refused(tmp_path):
    """A GPT-2 layout (transformer.h[i].attn) gets a clear LayerSkipError."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(LayerSkipError, match="model.layers"):
        decoder_layers(model)


def test_skip_set_validation_and_round_trip():
    s = SkipSet.from_switches([1, 0, 0, 0, 1, 1])
    assert s.attn == {0} and s.mlp == {1, 2} and s.size == 3
    assert SkipSet.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="out of range"):
        SkipSet.from_lists(2, [5])


# ----------------------------------------------------------------------------- KV invariant


@pytest.mark.parametrize("which", ["none", "some", "all"])
def test_drafting_restores_the_committed_cache(tiny_lm, which):
    """After a draft, every layer's KV equals the committed full-model KV (cropped back), and
    the next full forward equals one from a fresh cache."""
    n = _n(tiny_lm)
    skip = {"none": SkipSet(n), "some": SkipSet.from_lists(n, [1], [0]), "all": _all(tiny_lm)}
    ids = tiny_lm.tokenize(PROSE)
    cache = tiny_lm.new_cache()
    tiny_lm.forward(ids[:-1], cache)
    before = _cache_snapshot(cache)
    chain = draft_chain(tiny_lm, cache, ids[-1], skip[which], max_len=6, threshold=0.0)
    assert len(chain.tokens) == 6 and chain.forwards == 6
    assert tiny_lm.cache_length(cache) == len(ids) - 1
    for (k0, v0), layer in zip(before, cache.layers):
        assert torch.equal(k0, layer.keys) and torch.equal(v0, layer.values)
    verify = [ids[-1], *chain.tokens]
    got, _ = tiny_lm.forward(verify, cache)
    fresh, _ = tiny_lm.forward(ids + chain.tokens, tiny_lm.new_cache())
    torch.testing.assert_close(got, fresh[-len(verify):], atol=1e-5, rtol=1e-5)


def test_draft_stops_on_low_confidence_and_max_length(tiny_lm):
    ids = tiny_lm.tokenize(PROSE)
    cache = tiny_lm.new_cache()
    tiny_lm.forward(ids[:-1], cache)
    one = draft_chain(tiny_lm, cache, ids[-1], _all(tiny_lm), max_len=12, threshold=1.01)
    assert len(one.tokens) == 1  # nothing is that confident: the first token ends the draft
    capped = draft_chain(tiny_lm, cache, ids[-1], _all(tiny_lm), max_len=3, threshold=0.0)
    assert len(capped.tokens) == 3


def test_sampled_drafts_carry_their_distributions(tiny_lm):
    """Sampling: each draft token is drawn from its q row (warped draft distribution)."""
    ids = tiny_lm.tokenize(PROSE)
    cache = tiny_lm.new_cache()
    tiny_lm.forward(ids[:-1], cache)
    gen = torch.Generator().manual_seed(0)
    chain = draft_chain(tiny_lm, cache, ids[-1], SkipSet.from_lists(_n(tiny_lm), [1]),
                        max_len=4, threshold=0.0, temperature=0.7, top_p=0.9, generator=gen)
    assert chain.q is not None and chain.q.shape == (4, tiny_lm.vocab_size)
    torch.testing.assert_close(chain.q.sum(-1), torch.ones(4), atol=1e-4, rtol=0)
    assert all(float(chain.q[i, t]) > 0 for i, t in enumerate(chain.tokens))


# ----------------------------------------------------------------------------- lossless oracle


@pytest.mark.parametrize("which", ["none", "some", "all"])
def test_self_speculative_greedy_equals_greedy(tiny_lm, which):
    """Good (nothing skipped: every draft accepted) and bad (everything skipped) sets."""
    n = _n(tiny_lm)
    skip = {"none": SkipSet(n), "some": SkipSet.from_lists(n, [0], [1]), "all": _all(tiny_lm)}
    for text in (CODE, PROSE):
        ids = tiny_lm.tokenize(text)
        ref = _hf_greedy(tiny_lm, ids, 20)
        out, stats = self_speculative_generate(tiny_lm, ids, skip[which], 20, threshold=0.0,
                                               stop_at_eos=False)
        assert out == ref
        assert stats.tokens == 20 and stats.drafted > 0
        if which == "none":
            assert stats.accepted == stats.drafted  # the full model drafts itself


def _profile(lm, tmp_path, skips: dict[str, SkipSet], anchors: dict[str, np.ndarray]) -> str:
    path = tmp_path / "p.json"

    def change(p):
        p.skips.update(skips)
        for d, a in anchors.items():
            p.anchors[d] = a
            p.anchor_info[d] = {"n_prompts": len(a), "min_self_similarity": 0.5}

    update_profile(lm, path, change)
    return str(path)


@pytest.mark.parametrize("domain", DOMAINS)
def test_engine_knn_ssd_equals_greedy_for_every_domain(tiny_lm, tmp_path, domain):
    """decoding="knn-ssd" (routed by a profile; good and bad sets) == decoding="greedy"."""
    from tests.engines import make_engine

    n = _n(tiny_lm)
    prompt = domain_prompts(domain, "eval", 1)[0].text
    vec = tiny_lm.domain_vector(tiny_lm.tokenize(prompt)).numpy()[None]
    engine = make_engine(tiny_lm, decoding="greedy")
    ref = engine.generate(prompt, max_new_tokens=16).token_ids
    for skip in (SkipSet(n), _all(tiny_lm)):
        path = _profile(tiny_lm, tmp_path, {domain: skip}, {domain: vec})
        res = engine.generate(prompt, max_new_tokens=16, decoding="knn-ssd",
                              drafter_options={"profile": path, "threshold": 0.0})
        assert res.token_ids == ref
        assert res.stats.drafted_tokens > 0


def test_routing_and_draft_counters_land_in_the_generation_stats(tiny_lm, tmp_path):
    """The route the drafter took and its layer-skip passes are in the generation's NestStats
    (no drafter-side dict): a profile route, then an explicit set."""
    from nest_integrations.config import NestConfig
    from nest_integrations.drafters import get_method
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.drafters.knn_ssd import KnnSsdDrafter
    from nest_integrations.decoding.plain import decode_ids
    from nest_integrations.types import NestStats

    domain = DOMAINS[0]
    ids = tiny_lm.tokenize(domain_prompts(domain, "eval", 1)[0].text)
    vec = tiny_lm.domain_vector(ids).numpy()[None]
    path = _profile(tiny_lm, tmp_path, {domain: SkipSet(_n(tiny_lm))}, {domain: vec})
    explicit = SkipSet.from_lists(_n(tiny_lm), [1]).to_dict()
    for options, skip_set in (({"profile": path, "threshold": 0.0}, domain),
                              ({"skip": explicit, "threshold": 0.0}, "explicit")):
        stats = NestStats()
        ctx = DrafterContext(tiny_lm, NestConfig(), ids, [], options=options, stats=stats)
        drafter = KnnSsdDrafter.from_context(ctx)
        out, _ = decode_ids(tiny_lm, get_method("knn-ssd"), ids, 10, drafter=drafter,
                            stats=stats, eos=frozenset())
        assert len(out) == 10 and stats.route_skip_set == skip_set
        assert stats.draft_forwards >= stats.drafted_tokens > 0 and stats.time_draft > 0
        if skip_set == domain:  # routed: the nearest anchor is the prompt's own vector
            assert stats.route_domain == domain and stats.route_similarity > 0.99
            assert not stats.route_fallback
        else:
            assert stats.route_domain is None and stats.route_similarity is None


def test_the_prefill_vector_is_the_domain_vector(tiny_lm):
    """The loop's prefill, wrapped in capture_prompt_vector, yields the prompt's domain vector
    (what the anchors are built from) without a pass of its own."""
    ids = tiny_lm.tokenize(CODE)
    with tiny_lm.capture_prompt_vector() as slot:
        tiny_lm.forward(ids, tiny_lm.new_cache(), last=1)
    assert len(slot) == 1
    torch.testing.assert_close(slot[0], tiny_lm.domain_vector(ids), rtol=1e-4, atol=1e-5)


def test_routing_adds_no_forward_pass(tiny_lm, tmp_path, monkeypatch):
    """A routed KNN-SSD generation runs the base model exactly once per counted pass (the
    verify loop's forward_passes plus the drafter's draft_forwards): the route's prompt vector
    comes from the prefill. The output equals greedy and the route is recorded. Control: with
    an LM that cannot capture the vector, the drafter embeds the prompt and the count sees
    one more base-model pass."""
    from nest_integrations.lm.hf import HFLanguageModel
    from tests.engines import make_engine

    domain = DOMAINS[1]
    prompt = domain_prompts(domain, "eval", 1)[0].text
    vec = tiny_lm.domain_vector(tiny_lm.tokenize(prompt)).numpy()[None]
    path = _profile(tiny_lm, tmp_path, {domain: SkipSet.from_lists(_n(tiny_lm), [1]),
                                        "other": _all(tiny_lm)}, {domain: vec, "other": -vec})
    greedy = make_engine(tiny_lm, decoding="greedy").generate(prompt, max_new_tokens=12)

    def run() -> tuple[object, int]:
        calls = []
        handle = tiny_lm.model.base_model.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            res = make_engine(tiny_lm, decoding="knn-ssd").generate(
                prompt, max_new_tokens=12, drafter_options={"profile": path, "threshold": 0.0})
        finally:
            handle.remove()
        s = res.stats
        assert s.route_skip_set == domain and s.route_similarity > 0.99 and not s.route_fallback
        assert s.drafted_tokens > 0 and s.draft_forwards > 0
        assert res.token_ids == greedy.token_ids
        return res, len(calls) - s.forward_passes - s.draft_forwards

    assert run()[1] == 0
    declared = HFLanguageModel.capabilities.fget  # an LM that declares no prompt vector
    monkeypatch.setattr(HFLanguageModel, "capabilities",
                        property(lambda lm: replace(declared(lm), prompt_vector=False)))
    assert run()[1] == 1


def test_engine_sampling_runs_with_draft_distributions(tiny_lm):
    from nest_integrations import NestConfig
    from tests.engines import make_engine

    cfg = NestConfig(temperature=0.8, top_p=0.95, seed=3)
    engine = make_engine(tiny_lm, config=cfg, decoding="knn-ssd",
                        drafter_options={"skip": SkipSet.from_lists(_n(tiny_lm), [1]).to_dict(),
                                         "threshold": 0.0})
    res = engine.generate(PROSE, max_new_tokens=12)
    assert len(res.token_ids) == 12 and res.stats.drafted_tokens > 0


# ----------------------------------------------------------------------------- profiles


def test_profile_of_another_model_is_refused_and_left_intact(tiny_lm, tmp_path):
    path = tmp_path / "p.json"
    data = Profile("other-model@0123456789abcdef", _n(tiny_lm), tiny_lm.key_dim).to_json()
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(ProfileError, match="other-model"):
        load_profile(tiny_lm, path)
    with pytest.raises(ProfileError, match="other-model"):
        update_profile(tiny_lm, path, lambda p: p.skips.update({"x": SkipSet(_n(tiny_lm))}))
    assert path.read_bytes() == before
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(tiny_lm, path)


def test_missing_profile_names_the_commands(tiny_lm, tmp_path, monkeypatch):
    from tests.engines import make_engine

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    with pytest.raises(ProfileError, match="nest knn-ssd search"):
        make_engine(tiny_lm, decoding="knn-ssd").generate(PROSE, max_new_tokens=4)


def test_default_profile_is_found_automatically(tiny_lm, tmp_path, monkeypatch):
    """With no options the drafter loads $NEST_HOME/knn_ssd/<fingerprint>/default.json."""
    from tests.engines import make_engine

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    path = profile_path(tiny_lm)
    assert path.parent.parent == tmp_path / "knn_ssd" and path.name == "default.json"
    vec = tiny_lm.domain_vector(tiny_lm.tokenize(PROSE)).numpy()[None]
    update_profile(tiny_lm, None, lambda p: (p.skips.update({"prose": SkipSet(_n(tiny_lm))}),
                                             p.anchors.update({"prose": vec})))
    res = make_engine(tiny_lm, decoding="knn-ssd").generate(PROSE, max_new_tokens=8)
    assert res.token_ids == make_engine(tiny_lm).generate(PROSE, max_new_tokens=8,
                                                         decoding="greedy").token_ids


def _ship(tiny_lm, tmp_path, monkeypatch, model: str | None = None) -> None:
    """Pretend the package ships a default profile for the tiny model's name (routed to
    'prose'), built for ``model`` (default: the tiny model's fingerprint)."""
    import nest_integrations.knn_ssd.profile as profile_mod

    shipped = tmp_path / "package" / "default.json"
    shipped.parent.mkdir(parents=True)
    prof = Profile.empty(tiny_lm)
    prof.model = model or tiny_lm.fingerprint
    prof.skips["prose"] = SkipSet.from_lists(_n(tiny_lm), [1])
    prof.anchors["prose"] = tiny_lm.domain_vector(tiny_lm.tokenize(PROSE)).numpy()[None]
    shipped.write_text(json.dumps(prof.to_json()))
    monkeypatch.setattr(profile_mod, "shipped_profile_path", lambda lm: shipped)
    monkeypatch.setenv("NEST_HOME", str(tmp_path / "home"))


def test_the_shipped_profile_is_used_when_nest_home_has_none(tiny_lm, tmp_path, monkeypatch):
    from tests.engines import make_engine

    _ship(tiny_lm, tmp_path, monkeypatch)
    res = make_engine(tiny_lm, decoding="knn-ssd").generate(PROSE, max_new_tokens=8,
                                                           drafter_options={"threshold": 0.0})
    assert res.stats.route_skip_set == "prose" and res.stats.drafted_tokens > 0
    assert res.token_ids == make_engine(tiny_lm).generate(PROSE, max_new_tokens=8,
                                                         decoding="greedy").token_ids
    assert load_profile(tiny_lm).source.endswith("package/default.json")
    # Only the default name falls back to the package; a named profile must exist.
    with pytest.raises(ProfileError, match="no KNN-SSD profile"):
        load_profile(tiny_lm, "mine")
    # $NEST_HOME's own profile wins over the shipped one.
    update_profile(tiny_lm, None, lambda p: p.skips.update({"own": SkipSet(_n(tiny_lm))}))
    assert sorted(load_profile(tiny_lm).skips) == ["own"]


def test_a_shipped_profile_of_another_model_keeps_the_build_one_error(tiny_lm, tmp_path,
                                                                       monkeypatch):
    from tests.engines import make_engine

    _ship(tiny_lm, tmp_path, monkeypatch, model=tiny_lm.fingerprint.split("@")[0] + "@" + "0" * 16)
    with pytest.raises(ProfileError, match="nest knn-ssd search") as err:
        make_engine(tiny_lm, decoding="knn-ssd").generate(PROSE, max_new_tokens=4)
    assert "a different model of the same name" in str(err.value)


def test_the_package_ships_a_complete_profile_for_the_embedded_model():
    """The shipped SmolLM2 profile parses, is for the embedded model's name, and holds a skip
    set and anchors for every built-in domain plus the Mix set (the model-free part; the
    real-model check is in tests/knn_ssd/test_knn_ssd_real.py)."""
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME

    class _Named:
        fingerprint = f"{DEFAULT_MODEL_NAME}@x"

    import nest_integrations.knn_ssd.profile as profile_mod

    path = profile_mod.shipped_profile_path(_Named())
    assert path.is_file(), path
    prof = Profile.from_json(json.loads(path.read_text()), str(path))
    assert prof.model.startswith(f"{DEFAULT_MODEL_NAME}@") and prof.n_layers == 30
    assert set(prof.skips) == {*DOMAINS, MIXED} and set(prof.anchors) == set(DOMAINS)
    assert all(len(a) == 10 for a in prof.anchors.values())
    assert "storage" not in json.dumps(prof.search), "no local paths in the shipped file"


def test_tiny_search_writes_a_loadable_profile_and_resumes(tiny_lm, tmp_path):
    pytest.importorskip("optuna")
    from nest_integrations.builders.knn_ssd_search import build_anchors, search_skip_set

    path = str(tmp_path / "prof.json")
    texts = [CODE, PROSE]
    res = search_skip_set(tiny_lm, "code", texts, trials=2, n_prompts=1, max_new_tokens=4,
                          profile=path, progress=False)
    prof = load_profile(tiny_lm, path)
    assert prof.skips["code"] == res.skip and prof.skips["code"].n_layers == _n(tiny_lm)
    assert prof.search["code"]["trials"] == 2 and prof.search["code"]["value"] > 0
    again = search_skip_set(tiny_lm, "code", texts, trials=3, n_prompts=1, max_new_tokens=4,
                            profile=path, progress=False)
    assert again.trials == 3  # resumed: one more trial, not three
    other = search_skip_set(tiny_lm, "prose", texts[::-1], trials=1, n_prompts=1,
                            max_new_tokens=4, profile=path, progress=False)
    shared = load_profile(tiny_lm, path).cost_model
    assert shared is not None and load_profile(tiny_lm, path).search["prose"]["cost_model"] == shared
    assert other.trials == 1 and prof.search["code"]["cost_model"] == shared
    info = build_anchors(tiny_lm, "code", texts, k=10, profile=path, progress=False)
    assert info["anchors"] == 2  # fewer prompts than k: the prompts are the anchors
    with pytest.raises(ValueError, match="no prompts"):
        search_skip_set(tiny_lm, "empty", ["  "], trials=2, profile=path, progress=False)
    with pytest.raises(ValueError, match="no prompts"):
        build_anchors(tiny_lm, "empty", [], profile=path, progress=False)
    assert set(load_profile(tiny_lm, path).skips) == {"code", "prose"}  # no "empty" entry


# ----------------------------------------------------------------------------- routing


def test_router_picks_the_nearest_domain_and_falls_back():
    prof = Profile("m@0", 2, 3)
    prof.skips = {"a": SkipSet.from_lists(2, [0]), "b": SkipSet.from_lists(2, [1]),
                  MIXED: SkipSet.from_lists(2, [], [1])}
    prof.anchors = {"a": np.array([[1, 0, 0], [0.9, 0.1, 0]], np.float32),
                    "b": np.array([[0, 1, 0]], np.float32)}
    router = Router(prof, min_similarity=0.5)
    assert router.nearest(np.array([2, 0.2, 0]))[0] == "a"
    route = router.decide(*router.nearest(np.array([0.1, 3, 0])))
    assert route.skip_name == "b" and not route.fallback
    far = router.decide(*router.nearest(np.array([0, 0, 1])))  # nothing close: Mix set
    assert far.fallback and far.skip_name == MIXED and far.skip == prof.skips[MIXED]
    del prof.skips[MIXED]
    assert Router(prof, 0.5).decide("c", 0.9).skip is None  # no set at all: plain decoding


def test_kmeans_anchors_are_centroids():
    rng = np.random.default_rng(0)
    pts = np.concatenate([rng.normal(0, 0.01, (20, 4)) + c for c in np.eye(4)[:2] * 5])
    anchors = kmeans_anchors(pts.astype(np.float32), k=2)
    assert anchors.shape == (2, 4)
    assert sorted(np.round(anchors[:, :2]).astype(int).tolist()) == [[0, 5], [5, 0]]


# ----------------------------------------------------------------------------- domains and CLI


def test_domain_prompt_splits_are_disjoint_and_stable():
    for domain in ("python-code", "python-docs"):
        train = domain_prompts(domain, "train", 20)
        evals = domain_prompts(domain, "eval", 20)
        assert len(train) == len(evals) == 20
        assert not {p.id for p in train} & {p.id for p in evals}
        assert domain_prompts(domain, "train", 5) == train[:5]
    with pytest.raises(ValueError, match="unknown domain"):
        domain_prompts("klingon")


def test_prompt_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x = 1"}\n"y = 2"\n\n')
    assert read_prompts(tmp_path / "a.jsonl") == ["x = 1", "y = 2"]
    (tmp_path / "b.txt").write_text("first\nprompt\n\nsecond\n")
    assert read_prompts(tmp_path / "b.txt") == ["first\nprompt", "second"]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        read_prompts(tmp_path / "empty.txt")


def test_cli_search_anchors_show(tiny_lm, tmp_path, monkeypatch, capsys):
    pytest.importorskip("optuna")
    from nest_integrations import cli
    from nest_integrations.cli import knn_ssd as kcli

    monkeypatch.setattr(kcli, "_load_lm", lambda model: tiny_lm)
    prompts = tmp_path / "code.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in (CODE, PROSE)))
    prof = str(tmp_path / "cli.json")
    base = ["--prompts", str(prompts), "--profile", prof]
    assert cli.main(["knn-ssd", "search", "--domain", "code", "--trials", "2",
                     "--n-prompts", "1", "--max-new-tokens", "4", *base]) == 0
    assert cli.main(["knn-ssd", "anchors", "--domain", "code", *base]) == 0
    capsys.readouterr()
    assert cli.main(["knn-ssd", "show", "--profile", prof, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["anchors"] == {"code": 2} and "code" in shown["domains"]
    (tmp_path / "empty.txt").write_text("")
    assert cli.main(["knn-ssd", "search", "--domain", "x", "--prompts",
                     str(tmp_path / "empty.txt"), "--profile", prof]) == 1
    assert "holds no prompts" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["qwen2", "mistral", "gemma2"])
def test_other_architectures_skip_and_stay_lossless(arch):
    """Qwen2, Mistral and Gemma2 (sandwich norms) layouts: skipping changes the draft logits,
    and self-speculative greedy still equals greedy."""
    import transformers

    from nest_integrations.lm.hf import HFLanguageModel
    from tests._tiny import smollm2_tokenizer

    cfg_cls, model_cls, extra = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {}),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 256}),
    }[arch]
    config = getattr(transformers, cfg_cls)(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    lm = HFLanguageModel(model, smollm2_tokenizer(), name=arch, key_source="final_norm")
    ids = lm.tokenize(PROSE)
    full, _ = lm.forward(ids, lm.new_cache())
    skipped = lm.forward_skip(ids, lm.new_cache(), _all(lm))
    assert not torch.allclose(full, skipped)
    ref = _hf_greedy(lm, ids, 12)
    for skip in (SkipSet.from_lists(3, [1], [2]), _all(lm)):
        out, stats = self_speculative_generate(lm, ids, skip, 12, threshold=0.0,
                                               stop_at_eos=False)
        assert out == ref and stats.drafted > 0


def test_draft_cost_fraction_matches_the_search_cost_model():
    """The planner's per-token draft cost is the search's CostModel.draft / verify(1) when the
    profile has per-sublayer costs, else the share of sublayers kept."""
    from dataclasses import asdict

    from nest_integrations.drafters.knn_ssd import draft_cost_fraction
    from nest_integrations.builders.knn_ssd_search import CostModel

    model = CostModel(full=1.0, base=0.1, attn=0.01, mlp=0.02, verify_a=0.9, verify_b=0.1,
                      n_layers=30)
    skip = SkipSet.from_lists(30, range(10), range(5))
    expect = model.draft(skip) / model.verify(1)
    assert draft_cost_fraction(skip, asdict(model)) == pytest.approx(expect)
    assert expect == pytest.approx(0.1 + 20 * 0.01 + 25 * 0.02)
    assert draft_cost_fraction(skip, None) == pytest.approx(1 - 15 / 60)
    assert draft_cost_fraction(skip, {"full": "x"}) == pytest.approx(1 - 15 / 60)
