"""Key codecs (issue 15 part 2): fp16 / int8 / pq round trips, the coded ``DiskKeyStore``
(persistence, codec mismatch, v1 stores, concurrent training) and the exact-citation invariant
of the engine under each codec (tiny random Llama with the real tokenizer, real FAISS)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.config import NestConfig
from tests.engines import make_engine
from nest_integrations.index import codecs
from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.codecs import CodecNotTrainedError, load_codec, make_codec
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.namespaces import list_namespaces, read_store_manifest
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage
from tests.fakes import FakeLM
from tests.invariants import cited_text_matches_source, citations_cover_copied_tokens

REPO = Path(__file__).resolve().parents[2]
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def _clustered(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Keys like an LM's: a low-rank part, per-dimension scales and offsets, small noise."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((8, d)).astype(np.float32)
    x = rng.standard_normal((n, 8)).astype(np.float32) @ basis
    x *= rng.uniform(0.2, 3.0, d).astype(np.float32)
    x += rng.uniform(-2, 2, d).astype(np.float32)
    return x + 0.05 * rng.standard_normal((n, d)).astype(np.float32)


def _passages(n: int, words: int = 40, prefix: str = "p", seed: int = 0) -> list[Passage]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, words)) + f" {prefix}{i}"
        out.append(Passage(f"{prefix}{i}", text, doc_id=f"d{i}", char_start=0,
                           char_end=len(text)))
    return out


# --------------------------------------------------------------------------- codec round trips


def test_fp16_round_trip_is_fp16_rounding() -> None:
    x = _clustered(500, 64)
    c = make_codec("fp16", 64)
    codes = c.encode(x)
    assert codes.shape == (500, 128) and codes.dtype == np.uint8
    np.testing.assert_array_equal(c.decode(codes), x.astype(np.float16))


def test_int8_round_trip_within_half_a_step() -> None:
    x = _clustered(3000, 64)
    c = make_codec("int8", 64)
    with pytest.raises(CodecNotTrainedError):
        c.encode(x)
    c.train(x[:1000])
    y = x[1000:]
    inside = (y >= c.lo) & (y <= c.lo + 255 * c.scale)
    err = np.abs(c.decode(c.encode(y)) - y)
    assert c.encode(y).shape == (2000, 64)
    bound = np.broadcast_to(c.scale / 2 + 1e-4, y.shape)
    assert (err[inside] <= bound[inside]).all()
    assert inside.mean() > 0.99  # the margin keeps held-out keys in range


def test_pq_reconstruction_error_is_well_below_the_variance() -> None:
    x = _clustered(4000, 64)
    c = make_codec("pq", 64)
    assert c.code_size == 8  # d / 8 bytes per key
    c.train(x[:3000])
    y = x[3000:]
    mse = ((c.decode(c.encode(y)) - y) ** 2).sum(1).mean()
    var = ((y - y.mean(0)) ** 2).sum(1).mean()
    assert mse < 0.2 * var, (mse, var)  # 13% measured on this data


@pytest.mark.parametrize("name", ["int8", "pq"])
def test_saved_tables_decode_alike(tmp_path: Path, name: str) -> None:
    x = _clustered(3000, 64)
    c = make_codec(name, 64)
    c.train(x)
    c.save(tmp_path)
    back = load_codec(c.params(), tmp_path)
    assert back.fingerprint() == c.fingerprint()
    np.testing.assert_array_equal(back.decode(c.encode(x[:50])), c.decode(c.encode(x[:50])))


# ------------------------------------------------------------------------------- coded stores


@pytest.mark.parametrize("name", ["fp16", "int8", "pq"])
def test_store_persists_decoded_keys_across_reopen(tmp_path: Path, name: str) -> None:
    lm = FakeLM(key_dim=32)
    ps = _passages(80)  # 80 x 41 = 3280 keys: enough to train pq
    with DiskKeyStore.open(tmp_path, lm, codec=name) as s:
        first = ensure_keys(s, lm, ps, batch_size=16)
        fp, st = s.codec_fingerprint, s.stats()
        assert s.codec.trained and st["codec"] == name
        assert st["code_bytes"] == {"fp16": 64, "int8": 32, "pq": 4}[name]
        assert (fp is not None) == (name != "fp16")
    assert read_store_manifest(tmp_path)["key_codec"]["codec"] == name
    with DiskKeyStore.open(tmp_path, lm) as s:  # the recorded codec, not fp16
        assert s.codec.name == name and s.codec_fingerprint == fp
        again = s.get_keys(ps)
        assert lm.encode_calls > 0
        before = lm.encode_calls
        assert ensure_keys(s, lm, ps) and lm.encode_calls == before  # nothing re-encoded
    for a, b in zip(first, again):
        assert b is not None and b.keys.dtype == (np.float16 if name == "fp16" else np.float32)
        np.testing.assert_array_equal(a.keys, b.keys)  # ensure_keys returns what get_keys will
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.offsets, b.offsets)
    exact = lm.encode_passages([lm.tokenize_with_offsets(ps[0].text)[0]])[0]
    diff = again[0].keys.astype(np.float32) - exact
    err = np.abs(diff).max()
    # Measured (keys of |x| <= 3.6): fp16 1e-3, int8 0.017, pq 1.45.
    assert err <= {"fp16": 1e-2, "int8": 0.1, "pq": 2.0}[name]
    # Error relative to the keys' spread around their mean: measured fp16 2e-4, int8 0.007,
    # pq 0.31. A codec that decodes every key to the mean scores 1.03, another passage's keys
    # 1.36: a broken codec fails here.
    rel = np.linalg.norm(diff) / np.linalg.norm(exact - exact.mean(0))
    assert rel <= {"fp16": 1e-3, "int8": 0.02, "pq": 0.5}[name], rel
    assert name == "fp16" or err > 0  # lossy codecs are really lossy


def test_too_few_keys_to_train_is_a_clear_error(tmp_path: Path) -> None:
    lm = FakeLM(key_dim=32)
    with DiskKeyStore.open(tmp_path, lm, codec="pq") as s:
        with pytest.raises(ValueError, match="needs at least 2,048 keys"):
            ensure_keys(s, lm, _passages(3))
        assert len(s) == 0 and s.codec_fingerprint is None


def test_another_codec_is_refused_unless_a_new_namespace_is_allowed(tmp_path: Path) -> None:
    lm = FakeLM(key_dim=32)
    ps = _passages(10)
    with DiskKeyStore.open(tmp_path, lm) as s:
        ensure_keys(s, lm, ps)
    with pytest.raises(KeyStoreMismatchError, match=r"fp16.*int8.*new persist dir"):
        DiskKeyStore.open(tmp_path, lm, codec="int8")
    with pytest.raises(KeyStoreMismatchError, match="fp16"):
        DiskKeyStore.open(tmp_path, lm, dtype="float32")
    with DiskKeyStore.open(tmp_path, lm, codec="int8", allow_new_namespace=True) as s8:
        assert s8.codec.name == "int8" and len(s8) == 0  # its own namespace beside fp16
        ensure_keys(s8, lm, _passages(10, prefix="q"))
        assert s8.codec_ready()
    names = {n["namespace"]: n for n in list_namespaces(tmp_path)}
    assert len(names) == 2 and any("--int8--" in n for n in names)
    with DiskKeyStore.open(tmp_path, lm) as s:  # the store's own codec is unchanged
        assert s.codec.name == "fp16" and len(s) == 10


def test_v1_store_still_opens_and_reads(tmp_path: Path) -> None:
    """A format-version-1 store (store.json without key_codec, manifest with only dtype) reads
    as fp16, keys unchanged; asking it for int8 is refused."""
    lm = FakeLM(key_dim=32)
    ps = _passages(12)
    with DiskKeyStore.open(tmp_path, lm) as s:
        keys = ensure_keys(s, lm, ps)
        ns = s.namespace_dir
    (tmp_path / "store.json").write_text(json.dumps(
        {"format_version": 1, "fingerprint": lm.fingerprint, "key_source": lm.key_source}))
    (ns / "manifest.json").write_text(json.dumps({
        "format_version": 1, "fingerprint": lm.fingerprint, "key_source": lm.key_source,
        "key_dim": 32, "dtype": "float16"}))  # fmt: skip
    with DiskKeyStore.open(tmp_path, lm) as s:
        assert s.codec.name == "fp16" and s.namespace_dir == ns and len(s) == 12
        for a, b in zip(keys, s.get_keys(ps)):
            assert b.keys.dtype == np.float16
            np.testing.assert_array_equal(a.keys, b.keys)
    with DiskKeyStore.open(tmp_path, lm, dtype="float16") as s:
        assert s.codec.name == "fp16"
    with pytest.raises(KeyStoreMismatchError, match="int8"):
        DiskKeyStore.open(tmp_path, lm, codec="int8")


def test_two_processes_training_at_once_agree(tmp_path: Path) -> None:
    """Two processes fill an untrained pq store at once: one set of tables wins, and every
    key either wrote reads back identically in a third process."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(REPO)!r})
        from tests.fakes import FakeLM
        from tests.index.test_key_codecs import _passages
        from nest_integrations.index.keys import ensure_keys
        from nest_integrations.index.store import DiskKeyStore
        lm = FakeLM(key_dim=32)
        s = DiskKeyStore.open({str(tmp_path)!r}, lm, codec="pq")
        keys = ensure_keys(s, lm, _passages(70, prefix=sys.argv[1], seed=len(sys.argv[1])))
        np.save({str(tmp_path)!r} + "/out-" + sys.argv[1] + ".npy",
                np.concatenate([k.keys for k in keys]))
        print(s.codec_fingerprint)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, tag], stdout=subprocess.PIPE,
                              text=True, cwd=REPO) for tag in ("a", "bb")]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0].startswith("pq-")
    lm = FakeLM(key_dim=32)
    with DiskKeyStore.open(tmp_path, lm) as s:
        assert s.codec_fingerprint == outs[0] and len(s) == 140
        for tag in ("a", "bb"):
            got = np.concatenate([k.keys for k in s.get_keys(
                _passages(70, prefix=tag, seed=len(tag)))])
            np.testing.assert_array_equal(got, np.load(tmp_path / f"out-{tag}.npy"))


def test_put_keys_without_ensure_keys_trains_on_them(tmp_path: Path) -> None:
    """A writer that puts keys directly (the Ray encoder) trains the codec on its first batch."""
    lm = FakeLM(key_dim=32)
    ps = _passages(20)
    keys = [lm.encode_passages([lm.tokenize_with_offsets(p.text)[0]])[0] for p in ps]
    from nest_integrations.types import PassageKeys

    pks = [PassageKeys(p.id, k, np.asarray(lm.tokenize_with_offsets(p.text)[0]),
                       np.asarray(lm.tokenize_with_offsets(p.text)[1]).reshape(-1, 2))
           for p, k in zip(ps, keys)]
    with DiskKeyStore.open(tmp_path, lm, codec="int8") as s:
        s.put_keys(ps, pks)
        assert s.codec_ready() and len(s) == 20
        np.testing.assert_allclose(s.get_keys(ps)[0].keys, keys[0],
                                   atol=float(s.codec.scale.max()))


# ----------------------------------------------------------------- the engine under each codec

PASSAGE_TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western "
    "Asia, and was ruled by emperors."
)
UNRELATED_TEXT = (
    "Photosynthesis is a process used by plants and other organisms to convert light energy "
    "into chemical energy."
)


def _p(text: str, doc: str) -> Passage:
    pid = hashlib.sha1(text.encode()).hexdigest()[:16]
    return Passage(pid, text, doc_id=doc, char_start=0, char_end=len(text))


def _training_corpus() -> list[Passage]:
    """Real text (the shipped sample corpus) for training the tables: > 2,048 tokens."""
    from nest_integrations.ingest import sample_corpus_path

    files = sorted(p for p in Path(sample_corpus_path()).rglob("*") if p.is_file())
    text = " ".join(f.read_text(encoding="utf-8", errors="replace") for f in files)[:20000]
    return [_p(text[i : i + 800], "train") for i in range(0, len(text), 800)]


def _generate(lm, store):
    cfg = NestConfig(span_threshold=1.0, min_citation_tokens=1)
    engine = make_engine(lm, key_store=store, config=cfg)
    passages = [_p(PASSAGE_TEXT, "rome"), _p(UNRELATED_TEXT, "bio")]
    return engine.generate(PASSAGE_TEXT[:40], max_new_tokens=24, passages=passages)


@pytest.mark.parametrize("name", ["int8", "pq"])
def test_citations_stay_exact_under_lossy_codecs(tiny_lm, tmp_path: Path, name: str) -> None:
    with DiskKeyStore.open(tmp_path, tiny_lm, codec=name) as s:
        ensure_keys(s, tiny_lm, _training_corpus())
        assert s.codec_ready()
        res = _generate(tiny_lm, s)
    assert res.citations, res.text
    for c in res.citations:
        p = next(p for p in res.passages if p.id == c.passage_id)
        assert c.text == p.text[c.passage_start : c.passage_end] == res.text[c.start : c.end]
    cited_text_matches_source(res, {"rome": PASSAGE_TEXT, "bio": UNRELATED_TEXT})
    citations_cover_copied_tokens(res)


def test_fp16_engine_output_equals_the_old_store(tiny_lm, tmp_path: Path) -> None:
    """fp16 keys through the coded store give the same tokens as the in-memory store and as a
    v1-layout store read back from disk."""
    ref = _generate(tiny_lm, InMemoryKeyStore())
    with DiskKeyStore.open(tmp_path, tiny_lm) as s:
        fresh = _generate(tiny_lm, s)
        ns = s.namespace_dir
    (tmp_path / "store.json").write_text(json.dumps({
        "format_version": 1, "fingerprint": tiny_lm.fingerprint,
        "key_source": tiny_lm.key_source}))  # fmt: skip
    (ns / "manifest.json").write_text(json.dumps({
        "format_version": 1, "fingerprint": tiny_lm.fingerprint,
        "key_source": tiny_lm.key_source, "key_dim": tiny_lm.key_dim, "dtype": "float16"}))
    with DiskKeyStore.open(tmp_path, tiny_lm) as s:
        assert len(s) == 2
        v1 = _generate(tiny_lm, s)
    assert ref.token_ids == fresh.token_ids == v1.token_ids
    assert [c.text for c in ref.citations] == [c.text for c in v1.citations]


def test_wanted_training_rows_are_known_for_trained_codecs() -> None:
    for name in ("int8", "pq"):
        assert codecs.MIN_TRAIN_ROWS[name] <= codecs.WANT_TRAIN_ROWS[name]


def test_nest_info_names_each_namespace_codec(tmp_path: Path, capsys) -> None:
    from nest_integrations.cli.info import _print_info, key_store_stats

    lm = FakeLM(key_dim=32)
    with DiskKeyStore.open(tmp_path, lm) as s:
        ensure_keys(s, lm, _passages(5))
    with DiskKeyStore.open(tmp_path, lm, codec="int8", allow_new_namespace=True) as s:
        ensure_keys(s, lm, _passages(10))
    stats = key_store_stats(tmp_path)
    assert sorted((s["codec"], s["code_bytes"], s["n_passages"]) for s in stats) == [
        ("fp16", 64, 5), ("int8", 32, 10)]
    _print_info({"chroma": "x", "collections": {},
                 "key_store": {"path": str(tmp_path), "namespaces": stats}}, None)
    out = capsys.readouterr().out
    assert "key codec   fp16: 64 bytes/key" in out
    assert "key codec   int8 (margin=0.02): 32 bytes/key, decoded as float32" in out


@pytest.mark.slow
def test_real_model_pq_store_copies_with_exact_citations(default_lm, tmp_path: Path) -> None:
    """SmolLM2-135M over a pq store (72 bytes/key) trained on the sample corpus still copies a
    quoted passage verbatim, and every citation is an exact slice."""
    corpus = _training_corpus()[:14]  # > 2,048 tokens
    with DiskKeyStore.open(tmp_path, default_lm, codec="pq") as s:
        ensure_keys(s, default_lm, corpus)
        assert s.codec.code_size == default_lm.key_dim // 8
        engine = make_engine(default_lm, key_store=s)
        passages = [_p(PASSAGE_TEXT, "rome"), _p(UNRELATED_TEXT, "bio")]
        res = engine.generate(PASSAGE_TEXT[:60], max_new_tokens=30, passages=passages)
    assert res.citations, res.text
    assert max(c.n_tokens for c in res.citations) >= 8
    cited_text_matches_source(res, {"rome": PASSAGE_TEXT, "bio": UNRELATED_TEXT})


@pytest.mark.parametrize("with_keys", [True, False])
def test_ingest_pipeline_trains_the_codec_on_a_sample_of_the_corpus(
    tiny_lm, tmp_path: Path, with_keys: bool
) -> None:
    """`nest ingest --key-codec int8` (with keys, or --no-keys) trains the tables during ingest on
    a shuffled sample of the corpus (not the shortest passages, not the first query's), records
    the codec, and later opens without naming it."""
    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    texts = [p.text for p in _training_corpus()]
    store = ChromaPassageStore.from_persist_dir(tmp_path / "store", "codec")
    pipe = IngestPipeline(store, tiny_lm, with_keys=with_keys, key_codec="int8")
    report = pipe.ingest(texts=texts, ids=[f"t{i}" for i in range(len(texts))])
    assert report.passages >= len(texts)
    with DiskKeyStore.open(store.keys_dir, tiny_lm) as s:  # no codec named: the recorded one
        assert s.codec.name == "int8" and s.codec_ready()
        stored = len(s)
    if with_keys:
        assert stored == report.keys_added == report.passages
    else:  # the training sample was encoded (here the whole small corpus is that sample)
        assert 0 < stored <= report.passages and report.keys_added == 0
