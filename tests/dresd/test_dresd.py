"""DReSD: datastore build (resumable, fingerprinted), FAISS recall, drafting with verbatim
provenance, bad input, and the lossless oracle (greedy DReSD == greedy decoding) on the tiny
random Llama."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nest_integrations.dresd import (
    DatastoreError,
    DatastoreMismatchError,
    DresdDatastore,
    PassageSource,
    build_datastore,
)
from nest_integrations.builders.dresd_responses import PromptSource, read_prompts
from nest_integrations.dresd.pca import fit_transform
from nest_integrations.types import Passage

import faiss  # noqa: E402,F401  (a required dependency: imported, so a broken install fails)
from tests.dresd_texts import TEXTS, CountingSource


def _passages(n: int = 10) -> list[Passage]:
    return [Passage(id=f"p{i}", text=t, doc_id=f"d{i}") for i, t in enumerate(TEXTS[:n])]


@pytest.fixture(scope="module")
def built(tiny_lm, tmp_path_factory):
    path = tmp_path_factory.mktemp("dresd") / "ds"
    ds = build_datastore(tiny_lm, PassageSource(_passages(), tiny_lm, batch_size=3), path)
    return path, ds


def test_build_layout_and_keys(tiny_lm, built):
    path, ds = built
    toks = [tiny_lm.tokenize(t) for t in TEXTS]
    assert ds.tokens.tolist() == [t for ts in toks for t in ts]  # ONE contiguous array
    assert ds.bounds.tolist() == list(np.cumsum([0] + [len(t) for t in toks]))
    assert ds.keys.dtype == np.float16 and ds.keys.shape == (len(ds), 64)
    np.testing.assert_allclose(np.linalg.norm(ds.keys.astype(np.float32), axis=1), 1, atol=2e-3)
    assert ds.meta["fingerprint"]["model"] == tiny_lm.fingerprint
    assert ds.meta["fingerprint"]["key_source"] == "ffn_input"
    assert ds.meta["index"]["kind"] == "flat"
    assert (path / "CURRENT").exists() and not (path / ".build").exists()
    # a key row is the transformed LM vector that produced that token (NEST key convention)
    raw = tiny_lm.encode_passages([toks[1]])[0]
    np.testing.assert_allclose(ds.query(raw[3]), ds.keys[ds.bounds[1] + 3 : ds.bounds[1] + 4],
                               atol=2e-3)  # fmt: skip


def test_resume_after_kill_equals_uninterrupted(tiny_lm, built, tmp_path):
    _, full = built

    def boom(stage, done, total):
        if stage == "collect" and done == 2:
            raise KeyboardInterrupt("killed")

    src = CountingSource(_passages(), tiny_lm, batch_size=3)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(tiny_lm, src, tmp_path / "ds", callback=boom)
    with pytest.raises(DatastoreError, match="unfinished.*resume"):
        DresdDatastore.open(tmp_path / "ds", tiny_lm)
    assert src.calls == [0, 1]

    def boom2(stage, done, total):  # a second kill, in the PCA-reduce stage
        if stage == "reduce" and done == 3:
            raise RuntimeError("killed again")

    src2 = CountingSource(_passages(), tiny_lm, batch_size=3)
    with pytest.raises(RuntimeError):
        build_datastore(tiny_lm, src2, tmp_path / "ds", callback=boom2)
    assert src2.calls == [2, 3]  # finished batches are not recomputed
    src3 = CountingSource(_passages(), tiny_lm, batch_size=3)
    ds = build_datastore(tiny_lm, src3, tmp_path / "ds")
    assert src3.calls == []
    assert ds.tokens.tolist() == full.tokens.tolist()
    np.testing.assert_array_equal(ds.keys, full.keys)
    q = full.keys[:5].astype(np.float32)
    assert (ds.index.search(q, 5)[1] == full.index.search(q, 5)[1]).all()


def test_rebuild_keeps_old_version_live_until_switch(tiny_lm, tmp_path):
    path = tmp_path / "ds"
    build_datastore(tiny_lm, PassageSource(_passages(4), tiny_lm), path)

    def boom(stage, done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_datastore(tiny_lm, PassageSource(_passages(6), tiny_lm), path, callback=boom)
    ds = DresdDatastore.open(path, tiny_lm)  # the old version is untouched
    assert ds.n_passages == 4
    ds = build_datastore(tiny_lm, PassageSource(_passages(6), tiny_lm), path)
    assert ds.n_passages == 6
    assert len([d for d in path.iterdir() if d.name.startswith("v-")]) == 1


def test_mismatched_model_and_missing_store(tiny_lm, built, tmp_path):
    path, _ = built

    class Other:
        fingerprint = "other-model@0123456789abcdef"
        key_source = "ffn_input"

    with pytest.raises(DatastoreMismatchError, match="other-model.*rebuild"):
        DresdDatastore.open(path, Other())
    with pytest.raises(DatastoreError, match="no DReSD datastore.*nest dresd build"):
        DresdDatastore.open(tmp_path / "nowhere", tiny_lm)


def test_prompts_file_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        read_prompts(empty)
    with pytest.raises(FileNotFoundError):
        read_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_prompts(bad)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('"plain"\n{"prompt": "a"}\n{"text": "raw"}\n')
    assert len(read_prompts(ok)) == 3


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_index_recall_at_50(kind):
    from nest_integrations.dresd.index import build_index, recall_at

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((40, 64))
    x = centers[rng.integers(0, 40, 20000)] + 0.5 * rng.standard_normal((20000, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(20000, 200, replace=False)] + 0.05 * rng.standard_normal((200, 64))
    index, params = build_index(x.astype(np.float32), kind)
    assert params["kind"] == kind
    assert recall_at(index, x, q, 50) >= 0.9


def test_pca_is_deterministic_and_orthonormal():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((500, 20)) @ rng.standard_normal((20, 20))
    a, b = fit_transform(x, 8), fit_transform(x.copy(), 8)
    np.testing.assert_array_equal(a.components, b.components)
    np.testing.assert_allclose(a.components @ a.components.T, np.eye(8), atol=1e-5)
    assert np.all(np.diff(a.explained) <= 1e-7)


def _state(lm, ds, context, hidden, budget=16):
    from nest_integrations.config import NestConfig
    from nest_integrations.drafters.base import DecodeState

    return DecodeState(
        prompt_ids=list(context), out_ids=[], budget=budget, config=NestConfig(),
        eos=lm.eos_token_ids, passages=[], offsets=[],
        choose_token=lambda p: int(p.argmax()), hidden=hidden,
    )  # fmt: skip


def test_propose_drafts_corpus_continuation_with_exact_sources(tiny_lm, built):
    from nest_integrations.drafters.dresd import DresdDrafter

    _, ds = built
    p = 2
    toks = tiny_lm.tokenize(TEXTS[p])
    j = 4  # context = passage tokens up to and including toks[j]
    raw = tiny_lm.encode_passages([toks])[0]
    state = _state(tiny_lm, ds, toks[: j + 1], torch.from_numpy(raw[j]))
    draft = DresdDrafter(ds, num_drafts=3, draft_len=5, shape="tree").propose(state)
    assert draft is not None
    # the best neighbour is the key itself: its continuation is the first chain of the tree
    assert draft.tokens[:5] == toks[j + 1 : j + 6]
    registered = {i: (passage, offs) for i, passage, offs in draft.new_passages}
    assert sorted(registered) == list(range(len(registered)))  # the state held none
    for tok, (pi, pos) in zip(draft.tokens, draft.sources):
        passage, offs = registered[pi]
        s, e = offs[pos]
        assert tiny_lm.tokenize(passage.text)[pos] == tok
        assert passage.text[s:e] == tiny_lm.detokenize([tok])
    if draft.parents is not None:
        assert all(-1 <= q < i for i, q in enumerate(draft.parents))


def test_drafter_counters_land_in_the_generation_stats(tiny_lm, tmp_path):
    """DReSD's and REST's search time and candidates are in the generation's NestStats
    (no process-global counters), on a datastore of the model's own responses; unknown
    options are refused by name."""
    from nest_integrations.drafters import get_method
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.builders.dresd_responses import prompt_ids
    from nest_integrations.decoding.plain import decode_ids
    from nest_integrations.types import NestStats

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    ds = build_datastore(tiny_lm, PromptSource(read_prompts(prompts), tiny_lm,
                                               max_new_tokens=12), tmp_path / "in")
    ids = prompt_ids(tiny_lm, {"prompt": PROMPTS[0]})
    for name, extra in (("dresd", {"min_score": -1.0}), ("rest", {})):
        stats = NestStats()
        options = {"datastore": str(ds.root), **extra}
        ctx = DrafterContext(tiny_lm, None, ids, [], options=options, stats=stats)
        method = get_method(name)
        decode_ids(tiny_lm, method, ids, 12, drafter=method.make_drafter(ctx), stats=stats)
        assert stats.draft_candidates >= stats.verify_steps > 0, name
        assert stats.time_draft > 0 and stats.accepted_tokens > 0, name
        with pytest.raises(ValueError, match=f"unknown drafter option.*{name}"):
            method.make_drafter(DrafterContext(tiny_lm, None, ids, [],
                                               options={**options, "beam": 2}))


def test_draft_into_a_retrieved_passage_without_offsets_fills_them_in(tiny_lm, built):
    """A lossless method's retrieved passages come without token offsets; when DReSD drafts
    from one of them, its offsets must be registered (a crash when citing it, before)."""
    from nest_integrations.drafters.dresd import DresdDrafter

    _, ds = built
    p = 2
    toks = tiny_lm.tokenize(TEXTS[p])
    j = 4
    raw = tiny_lm.encode_passages([toks])[0]
    state = _state(tiny_lm, ds, toks[: j + 1], torch.from_numpy(raw[j]))
    state.passages, state.offsets = (ds.passage(p),), (None,)  # as the loop holds it
    draft = DresdDrafter(ds, num_drafts=1, draft_len=5, shape="chain").propose(state)
    assert draft is not None and draft.tokens[:5] == toks[j + 1 : j + 6]
    assert draft.sources[0][0] == 0 and len(state.passages) == 1
    ((i, passage, offsets),) = draft.new_passages  # the draft gives the loop the offsets
    assert i == 0 and passage.id == state.passages[0].id and offsets is not None
    s, e = offsets[draft.sources[0][1]]
    assert state.passages[0].text[s:e] == tiny_lm.detokenize([draft.tokens[0]])


def test_first_token_filter_and_budget(tiny_lm, built):
    from nest_integrations.drafters.corpus import trie as _trie
    from nest_integrations.drafters.dresd import DresdDrafter

    _, ds = built
    toks = tiny_lm.tokenize(TEXTS[2])
    raw = tiny_lm.encode_passages([toks])[0]
    # last context token is not what followed any near neighbour -> no draft
    state = _state(tiny_lm, ds, toks[:4] + [7], torch.from_numpy(raw[4]))
    drafter = DresdDrafter(ds, k=3, num_drafts=3, draft_len=5, min_score=-1.0)
    cands = drafter.candidates(state.hidden, 7, 5, tiny_lm.eos_token_ids)
    assert all(int(ds.tokens[g]) == 7 for g, _ in cands)  # the first-token filter
    assert cands == [] and drafter.propose(state) is None  # no neighbour holds token 7
    last = toks[4]  # the true last token: exactly the neighbours holding it pass the filter
    rows = [int(g) for g in ds.search(state.hidden, 3)[1] if g >= 0]
    kept = drafter.candidates(state.hidden, last, 5, tiny_lm.eos_token_ids)
    assert [g for g, _ in kept] == [g for g in rows if int(ds.tokens[g]) == last]
    assert 0 < len(kept) < len(rows)  # some neighbours kept, some filtered out
    state = _state(tiny_lm, ds, toks[:5], torch.from_numpy(raw[4]), budget=2)
    draft = DresdDrafter(ds, shape="chain", draft_len=5).propose(state)
    assert draft is not None and len(draft) <= 2 and draft.parents is None
    far = _state(tiny_lm, ds, toks[:5], -torch.from_numpy(raw[4]))  # opposite direction
    assert DresdDrafter(ds, min_score=0.99).propose(far) is None  # below the score threshold
    tokens, parents, rows = _trie([(0, [1, 2, 3]), (5, [1, 2, 4]), (9, [6])], 32)
    assert tokens == [1, 2, 3, 4, 6] and parents == [-1, 0, 1, 1, -1] and rows == [1, 2, 3, 8, 10]


# --------------------------------------------------------------------------------- oracle

PROMPTS = [
    "Name three colours.",
    "What is a list in Python?",
    "Describe the sea.",
    "Who was Julius Caesar?",
]


def _greedy(engine, prompt, n, **kw):
    return engine.generate([{"role": "user", "content": prompt}], max_new_tokens=n, **kw)


class ForkSource:
    """Every response twice: the copy has the same keys but its second half changed, so two
    neighbours pass the first-token filter and their drafts fork into a token tree."""

    def __init__(self, inner):
        self.inner, self.n_batches = inner, inner.n_batches
        self.spec = {**inner.spec, "kind": "fork"}

    def batch(self, i):
        from nest_integrations.dresd import SourceBatch

        b = self.inner.batch(i)
        out = SourceBatch(list(b.passages), list(b.token_ids), list(b.offsets), list(b.keys))
        for p, t, o, k in zip(b.passages, b.token_ids, b.offsets, b.keys):
            t2 = np.array(t)
            t2[len(t2) // 2 :] = (t2[len(t2) // 2 :] + 1) % 49152
            out.passages.append(Passage(id="fork-" + p.id, text=p.text, doc_id=p.doc_id))
            out.token_ids.append(t2)
            out.offsets.append(o)
            out.keys.append(k)
        return out


def test_oracle_greedy_dresd_equals_greedy(tiny_lm, tmp_path):
    """Lossless: the same tokens as plain greedy decoding, with an in-domain datastore (the
    model's own responses: many acceptances) and an unrelated one (few)."""
    from nest_integrations.config import NestConfig
    from tests.engines import make_engine

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    n = 24
    ind = build_datastore(tiny_lm, PromptSource(read_prompts(prompts), tiny_lm,
                                                max_new_tokens=n), tmp_path / "in")  # fmt: skip
    ood = build_datastore(tiny_lm, PassageSource(_passages(), tiny_lm), tmp_path / "ood")
    fork = build_datastore(tiny_lm, ForkSource(PromptSource(read_prompts(prompts), tiny_lm,
                                                            max_new_tokens=n)), tmp_path / "fork")
    engine = make_engine(tiny_lm, None, config=NestConfig(temperature=0.0))
    acc, n_citations, tree_steps = {}, 0, 0
    for name, ds in (("in", ind), ("ood", ood), ("fork", fork)):
        acc[name] = 0
        for p in PROMPTS + ["Tell me about rivers."]:
            ref = _greedy(engine, p, n, decoding="greedy")
            for shape in ("tree", "chain") if name != "fork" else ("tree",):
                res = _greedy(engine, p, n, decoding="dresd",
                              drafter_options={"datastore": str(ds.root), "shape": shape,
                                                "min_score": -1.0})
                assert res.token_ids == ref.token_ids, (name, p, shape)
                acc[name] += res.stats.accepted_tokens
                tree_steps += res.stats.tree_steps if name == "fork" else 0
                for c in res.citations if name != "fork" else []:  # exact corpus slices
                    assert c.kind == "verbatim"
                    n_citations += 1
                    assert res.text[c.start : c.end] == c.text
    assert n_citations > 0
    assert tree_steps > 0  # the fork datastore made the loop verify real token trees
    assert acc["fork"] > 4 * max(1, acc["ood"]), acc
    assert acc["in"] > 4 * max(1, acc["ood"]), acc
    assert acc["in"] >= len(PROMPTS) * n  # most of every in-domain answer came from drafts


def test_batched_responses_and_keys_match_sequential_greedy(tiny_lm):
    from nest_integrations.builders.dresd_responses import (
        batched_greedy,
        greedy_with_keys,
        keys_in_context,
        prompt_ids,
    )

    pids = [prompt_ids(tiny_lm, {"prompt": p}) for p in PROMPTS[:3]]
    batched = batched_greedy(tiny_lm, pids, 12)
    for p, resp in zip(pids, batched):
        ids, keys = greedy_with_keys(tiny_lm, p, 12)
        assert resp == ids
        # the keys the model computed while generating, one cached step at a time
        cache = tiny_lm.new_cache()
        _, k = tiny_lm.forward(p, cache)
        stepwise = [k[-1]] + [tiny_lm.forward([t], cache)[1][-1] for t in resp[:-1]]
        sequential = torch.stack(stepwise).numpy() if resp else keys
        np.testing.assert_allclose(keys_in_context(tiny_lm, p, resp), sequential, atol=1e-4)
        np.testing.assert_allclose(keys, sequential, atol=1e-4)


def test_default_datastore_location_follows_the_engines_collection(tmp_path):
    from types import SimpleNamespace

    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.drafters.corpus import default_datastore_for

    retriever = SimpleNamespace(collection_name="docs", persist_dir=tmp_path)
    ctx = DrafterContext(lm=None, config=None, prompt_ids=[], passages=[], retriever=retriever)
    assert default_datastore_for(ctx) == tmp_path / "dresd" / "docs"
