"""`nest calibrate`: the fitted objective equals the engine's p_M, the split keeps held-out
documents out of retrieval, results round-trip per model, and the CLI runs on a real Chroma
collection (tiny random Llama, so everything here is fast)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nest_integrations.calibrate import (
    CalibrationText,
    calibrate_passages,
    calibration_path,
    load_calibration,
    load_calibration_record,
    save_calibration,
    score_text,
    split_corpus,
)
from nest_integrations.calibrate.scoring import ScorePool
from nest_integrations.evaluation.entities import generate_corpus
from nest_integrations.types import Passage


def _corpus(n_per_kind: int = 3) -> list[Passage]:
    """One passage per generated entity document (frames shared across documents)."""
    docs = generate_corpus(seed=3, per_kind=n_per_kind).documents
    return [Passage(id=f"p-{d.id}", text=d.text, doc_id=d.id, metadata={"chunk_index": 0})
            for d in docs]


def _retriever(passages):
    from nest_integrations.evaluation.retrieval import BM25Retriever

    return BM25Retriever(passages)


def test_pool_objective_equals_the_engine_mixture(tiny_lm):
    """Oracle: the grid's teacher-forced NLL equals -log p_M(true) from nest_distribution."""
    from nest_integrations.core.mixture import nest_distribution
    from nest_integrations.core.token_memory import TokenMemory
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    from nest_integrations.index.keys import ensure_keys

    passages = _corpus()
    store = InMemoryKeyStore()
    text = CalibrationText("x", "The founding year of", " Qux Labs is 1901. It grew.", True)
    mem_passages = passages[:5]
    scored = score_text(tiny_lm, store, mem_passages, text, n_neighbors=16)
    pool = ScorePool([scored])
    for mu, alpha, tau in [(0.05, 0.3, 0.1), (2.0, 0.7, 0.02), (0.5, 0.0, 1.0)]:
        got = pool.nll(pool.p_knn_true(mu), alpha, tau)
        p_ids, r_ids = tiny_lm.tokenize(text.prefix), tiny_lm.tokenize(text.rest)
        with torch.inference_mode():
            logits, queries = tiny_lm.forward(p_ids + r_ids, tiny_lm.new_cache())
        rows = slice(len(p_ids) - 1, len(p_ids) - 1 + len(r_ids))
        memory = TokenMemory(ensure_keys(store, tiny_lm, mem_passages))
        dist = nest_distribution(logits[rows], queries[rows], memory, n_neighbors=16,
                                 alpha=alpha, tau=tau, mu=mu)
        p_true = dist.p.gather(1, torch.as_tensor(r_ids)[:, None])[:, 0].double()
        want = float(-torch.log(p_true).mean())
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert pool.base_nll() == pytest.approx(
        float(-torch.log_softmax(logits[rows].double(), -1)
              .gather(1, torch.as_tensor(r_ids)[:, None]).mean()), rel=1e-6)


def test_split_holds_documents_out(tiny_lm):
    passages = _corpus()
    in_t, out_t, held = split_corpus(passages, tiny_lm, n_texts=4, prefix_tokens=6,
                                     score_tokens=16, seed=1)
    assert len(held) == 4 and len(out_t) == 4 and len(in_t) == 4
    assert {t.doc_id for t in out_t} == held
    assert not {t.doc_id for t in in_t} & held
    for t in in_t + out_t:
        doc = next(p for p in passages if p.doc_id == t.doc_id)
        assert doc.text.startswith(t.prefix) and (t.prefix + t.rest) in doc.text
    with pytest.raises(ValueError, match="at least 2 documents"):
        split_corpus(passages[:1], tiny_lm)


def test_calibrate_fits_saves_and_loads_per_model(tiny_lm, tmp_path, caplog):
    from nest_integrations.index.in_memory_store import InMemoryKeyStore

    passages = _corpus()
    res = calibrate_passages(tiny_lm, InMemoryKeyStore(), _retriever(passages), passages, n_texts=3,
                             prefix_tokens=6, score_tokens=12, n_passages=4, n_neighbors=32,
                             progress=False)
    o = res["overrides"]
    assert set(o) == {"knn_temperature", "rrc_offset", "rrc_scale"}
    ppl = res["ppl"]
    # This corpus has feasible points (measured: held-out PPL 2.6e3 calibrated vs 1.9e5 base),
    # so the constraint must hold at the chosen point, and copying must help in corpus.
    assert res["feasible"]
    assert ppl["held_out"]["calibrated"] <= ppl["held_out"]["base"] * (1 + 1e-9)
    assert ppl["in_corpus"]["calibrated"] < ppl["in_corpus"]["base"]
    assert ppl["in_corpus"]["calibrated"] > 0 and math.isfinite(ppl["held_out"]["calibrated"])
    assert 0 < res["suggested"]["relaxation"] <= 1 and 0 < res["suggested"]["span_threshold"] < 1
    assert res["n_texts"] == {"in_corpus": 3, "held_out": 3}
    assert res["split"]["held_out_documents"] == 3

    root = tmp_path / "store"
    assert load_calibration(root, "c1", tiny_lm) is None
    f = save_calibration(root, "c1", tiny_lm, res)
    assert f == calibration_path(root, "c1") and f.is_file()
    assert load_calibration(root, "c1", tiny_lm) == o
    got = load_calibration(root, "c1", tiny_lm, include_suggested=True)
    assert got["relaxation"] == res["suggested"]["relaxation"]

    class Other:
        fingerprint = "other@0000"
        key_source = tiny_lm.key_source
        name = "other"

    assert load_calibration(root, "c1", Other()) is None  # another model's entry never used
    save_calibration(root, "c1", Other(), {**res, "overrides": {"knn_temperature": 9.0}})
    assert load_calibration(root, "c1", tiny_lm) == o  # the first model's entry is kept
    assert load_calibration(root, "c1", Other()) == {"knn_temperature": 9.0}
    assert len(json.loads(f.read_text())["models"]) == 2

    f.write_text("{not json")
    assert load_calibration(root, "c1", tiny_lm) is None  # a broken file is ignored, logged
    assert "unreadable calibration" in caplog.text
    save_calibration(root, "c2", tiny_lm, {**res, "overrides": {"rrc_scale": -1.0}})
    assert load_calibration(root, "c2", tiny_lm) is None  # invalid values are never returned
    assert load_calibration_record(root, "c2", tiny_lm)["overrides"] == {"rrc_scale": -1.0}
    with pytest.raises(ValueError, match="collection"):
        calibration_path(root, "../evil")


def test_held_out_documents_never_reach_the_memory(tiny_lm):
    from nest_integrations.index.in_memory_store import InMemoryKeyStore
    import nest_integrations.calibrate.scoring as cal

    passages = _corpus()
    calls: list[list[str]] = []
    real = cal.score_text

    def spy(lm, store, ps, text, *a, **kw):
        calls.append([p.doc_id for p in ps])
        return real(lm, store, ps, text, *a, **kw)

    cal.score_text = spy
    try:
        res = calibrate_passages(tiny_lm, InMemoryKeyStore(), _retriever(passages), passages,
                                 n_texts=3, prefix_tokens=6, score_tokens=8, n_passages=6,
                                 n_neighbors=16, seed=5, progress=False)
    finally:
        cal.score_text = real
    _, _, held = split_corpus(passages, tiny_lm, n_texts=3, prefix_tokens=6, score_tokens=8,
                              seed=5)
    assert len(calls) == 6 and all(len(c) <= 6 for c in calls) and any(calls)
    assert not any(set(c) & held for c in calls)
    assert res["n_tokens"]["held_out"] > 0


def test_nest_calibrate_cli_on_a_chroma_collection(tiny_lm, tmp_path, monkeypatch, capsys):
    """`nest calibrate` end to end on a real embedded Chroma collection; the stored entry is
    what `load_calibration` returns; a missing collection is a clear error."""
    from nest_integrations import assembly
    from nest_integrations.cli import main
    from nest_integrations.ingest import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    root = tmp_path / "store"
    corpus = generate_corpus(seed=4, per_kind=2)
    path = corpus.write_jsonl(tmp_path / "c.jsonl")
    store = ChromaPassageStore.from_persist_dir(root, "ents")
    report = IngestPipeline(store, tiny_lm).ingest([path])
    assert report.documents == 8
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: tiny_lm)
    rc = main(["calibrate", "--collection", "ents", "--persist-dir", str(root),
               "--n-texts", "2", "--passages", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "knn_temperature (mu)" in out and "saved to" in out
    got = load_calibration(root, "ents", tiny_lm)
    assert got is not None and set(got) == {"knn_temperature", "rrc_offset", "rrc_scale"}
    rc = main(["calibrate", "--collection", "nope", "--persist-dir", str(root)])
    assert rc != 0
    assert not calibration_path(root, "nope").exists()


def test_log_mixture_equals_the_log_of_the_mixture():
    """``core.mixture.log_mixture`` (used by the grid and by evaluation perplexity) is the log
    of Eq. 3; lambda 1 gives log p_LM exactly; ``min_weight`` keeps an underflowed lambda with a
    kNN miss finite."""
    from nest_integrations.core.mixture import log_mixture, mixture

    g = torch.Generator().manual_seed(0)
    p_lm = torch.rand(50, generator=g, dtype=torch.float64) * 0.9 + 0.05
    p_knn = torch.rand(50, generator=g, dtype=torch.float64)
    lam = torch.rand(50, generator=g, dtype=torch.float64)
    lam[:3] = 1.0
    want = torch.log(mixture(p_lm[:, None], p_knn[:, None], lam)[:, 0])
    got = log_mixture(torch.log(p_lm), p_knn, lam)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[:3], torch.log(p_lm[:3]))
    zero = torch.zeros(1, dtype=torch.float64)
    assert log_mixture(torch.log(p_lm[:1]), zero, zero) == -math.inf
    floored = log_mixture(torch.log(p_lm[:1]), zero, zero, min_weight=1e-12)
    assert float(floored) == pytest.approx(math.log(1e-12) + math.log(float(p_lm[0])))
