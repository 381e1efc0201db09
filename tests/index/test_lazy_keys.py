"""Lazy token keys (``index/lazy_cache.py``): LRU eviction under a byte cap, oversized entries,
missing/corrupt files, persistence, orphans, two processes at once, the mode record and CLI,
and the oracle: an engine on a lazy cache (cold, then warm) equals one on pre-encoded keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nest_integrations import assembly, cli
from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from tests.engines import make_engine
from nest_integrations.index.base import KeyStore
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.lazy_cache import LazyKeyCache, lazy_cache_stats
from nest_integrations.index.lazy_mode import configure_lazy, parse_size, read_mode, set_eager_mode
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage
from tests.fakes import FakeLM

REPO = Path(__file__).resolve().parents[2]
D = 16
#: Bytes of one cached entry of a 4-token passage: 20-byte header + 4 * (2*16 fp16 + 4 id + 8 off).
ENTRY = 20 + 4 * (2 * D + 12)


def four_token(i: int) -> Passage:
    """Passage ``i``: four FakeLM tokens, so every entry is ``ENTRY`` bytes."""
    return Passage(id=f"p{i}", text=f"w{i} alpha beta gamma", doc_id=f"d{i}")


def cached_ids(cache: LazyKeyCache, passages: list[Passage]) -> set[str]:
    """Ids of ``passages`` in the cache, read straight from the index (recency untouched)."""
    from nest_integrations.index.keys import content_hash

    rows = cache._lookup([content_hash(p.text) for p in passages])
    return {p.id for p in passages if content_hash(p.text) in rows}


@pytest.fixture
def lm() -> FakeLM:
    return FakeLM(key_dim=D)


def open_cache(tmp_path: Path, lm: FakeLM, max_bytes: int) -> LazyKeyCache:
    configure_lazy(tmp_path / "keys", max_bytes=max_bytes)
    return LazyKeyCache.open(tmp_path / "keys", lm)


def test_port_and_same_keys_as_the_disk_store(tmp_path: Path, lm: FakeLM) -> None:
    """The cache is a KeyStore; ensure_keys through it returns the disk store's keys, exactly."""
    passages = [four_token(i) for i in range(3)] + [
        Passage(id="u", text="Ünïcödé — текст 日本語 🎉 end"), Passage(id="e", text="")]
    with open_cache(tmp_path, lm, 10**6) as cache, DiskKeyStore.open(tmp_path / "eager", lm) as ds:
        assert isinstance(cache, KeyStore)
        cold = ensure_keys(cache, lm, passages)
        warm = cache.get_keys(passages)
        eager = ensure_keys(ds, lm, passages)
        for c, w, e, p in zip(cold, warm, eager, passages):
            assert c.passage_id == w.passage_id == e.passage_id == p.id
            assert c.keys.dtype == w.keys.dtype == e.keys.dtype == np.float16
            np.testing.assert_array_equal(c.keys, e.keys)
            np.testing.assert_array_equal(w.keys, e.keys)
            np.testing.assert_array_equal(w.token_ids, e.token_ids)
            np.testing.assert_array_equal(w.offsets, e.offsets)
        assert cache.stats()["n_entries"] == 5


def test_lru_eviction_under_the_cap(tmp_path: Path, lm: FakeLM) -> None:
    """Entries leave in least-recently-used order, a get refreshes recency, entries put in one
    call go last, and the bytes used never exceed the cap after a put."""
    ps = [four_token(i) for i in range(12)]
    with open_cache(tmp_path, lm, 3 * ENTRY) as cache:
        for i in range(3):
            ensure_keys(cache, lm, [ps[i]])
        assert cache.stats()["bytes_used"] == 3 * ENTRY
        assert cache.get_keys([ps[0]])[0] is not None  # p0 is now the most recent
        ensure_keys(cache, lm, [ps[3]])
        assert cached_ids(cache, ps) == {"p0", "p2", "p3"}  # p1 was least recently used
        ensure_keys(cache, lm, [ps[4], ps[5]])
        assert cached_ids(cache, ps) == {"p3", "p4", "p5"}  # p2 then p0 went
        ensure_keys(cache, lm, ps[6:9])  # a full cap in one call: every older entry goes
        assert cached_ids(cache, ps) == {"p6", "p7", "p8"}
        ensure_keys(cache, lm, ps[9:12])
        cache.get_keys([ps[10]])
        cache.get_keys([ps[11]])
        files = sorted(f.name for f in (cache.namespace_dir / "data").rglob("*.key"))
        cache.put_keys([ps[9]], cache.get_keys([ps[9]]))  # a re-put refreshes, never rewrites
        assert sorted(f.name for f in (cache.namespace_dir / "data").rglob("*.key")) == files
        ensure_keys(cache, lm, [ps[0]])
        assert cached_ids(cache, ps) == {"p0", "p9", "p11"}  # p10 was least recently used
        s = cache.stats()
        assert s["bytes_used"] <= 3 * ENTRY and s["n_entries"] == 3
        on_disk = sum(f.stat().st_size for f in (cache.namespace_dir / "data").rglob("*.key"))
        assert on_disk == s["bytes_used"]  # evicted files are gone, kept ones are counted


def test_every_put_stays_within_the_cap(tmp_path: Path, lm: FakeLM) -> None:
    """Random puts and gets of passages of different sizes: after each put the cache holds at
    most the cap, its index agrees with the files, and every read is exact."""
    rng = np.random.default_rng(0)
    ps = [Passage(id=f"q{i}", text=" ".join(f"t{i}x{j}" for j in range(1 + i % 9)))
          for i in range(40)]  # fmt: skip
    cap = 9 * ENTRY
    with open_cache(tmp_path, lm, cap) as cache:
        for _ in range(60):
            chosen = [ps[j] for j in rng.choice(len(ps), size=3, replace=False)]
            got = ensure_keys(cache, lm, chosen)
            for p, k in zip(chosen, got):
                ids, _ = lm.tokenize_with_offsets(p.text)
                assert k.token_ids.tolist() == list(ids)
            assert cache.stats()["bytes_used"] <= cap
        assert sum(f.stat().st_size for f in (cache.namespace_dir / "data").rglob("*.key")) == \
            cache.stats()["bytes_used"]  # fmt: skip


def test_oversized_entry_is_returned_but_not_kept(tmp_path: Path, lm: FakeLM) -> None:
    """An entry larger than the whole cap is handed back but not cached, and evicts nothing."""
    small, big = four_token(0), Passage(id="big", text=" ".join(f"b{i}" for i in range(50)))
    with open_cache(tmp_path, lm, 2 * ENTRY) as cache:
        ensure_keys(cache, lm, [small])
        (k,) = ensure_keys(cache, lm, [big])
        assert len(k) == 50 and k.passage_id == "big"
        ids, _ = lm.tokenize_with_offsets(big.text)
        assert k.token_ids.tolist() == list(ids)
        assert cache.get_keys([big]) == [None]
        assert cached_ids(cache, [small]) == {"p0"}
        assert cache.stats()["bytes_used"] == ENTRY


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate"])
def test_missing_or_corrupt_file_is_a_miss(tmp_path: Path, lm: FakeLM, damage: str) -> None:
    """A file deleted or damaged behind the cache's back reads as a miss: its row is dropped,
    the passage is encoded again and cached again, the others are untouched."""
    ps = [four_token(i) for i in range(3)]
    with open_cache(tmp_path, lm, 10**6) as cache:
        first = ensure_keys(cache, lm, ps)
        (f,) = [x for x in (cache.namespace_dir / "data").rglob("*.key")
                if x.name.startswith(__import__("hashlib").sha256(ps[1].text.encode())
                                     .hexdigest())]  # fmt: skip
        if damage == "delete":
            f.unlink()
        elif damage == "flip":
            data = bytearray(f.read_bytes())
            data[-3] ^= 0xFF
            f.write_bytes(bytes(data))
        else:
            f.write_bytes(f.read_bytes()[:50])
        got = cache.get_keys(ps)
        assert got[1] is None and got[0] is not None and got[2] is not None
        assert len(cache) == 2 and cache.stats()["bytes_used"] == 2 * ENTRY
        before = lm.encoded_passages
        again = ensure_keys(cache, lm, ps)
        assert lm.encoded_passages == before + 1  # only the damaged one
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a.keys, b.keys)
        assert len(cache) == 3 and not f.exists()


def test_persistence_across_reopen(tmp_path: Path, lm: FakeLM) -> None:
    """Entries, recency and the byte total survive closing and reopening the cache."""
    ps = [four_token(i) for i in range(4)]
    with open_cache(tmp_path, lm, 3 * ENTRY) as cache:
        ensure_keys(cache, lm, ps[:3])
        cache.get_keys([ps[0]])
    with LazyKeyCache.open(tmp_path / "keys", lm) as cache:
        before = lm.encoded_passages
        got = ensure_keys(cache, lm, ps[:3])
        assert lm.encoded_passages == before and all(len(k) == 4 for k in got)
    with LazyKeyCache.open(tmp_path / "keys", lm) as cache:
        cache.get_keys([ps[1]])
        cache.get_keys([ps[2]])
        ensure_keys(cache, lm, [ps[3]])  # p0 is now the least recently used
        assert cached_ids(cache, ps) == {"p1", "p2", "p3"}
        assert cache.stats()["bytes_used"] == 3 * ENTRY


def test_crash_between_file_and_row_leaves_an_orphan_that_prune_removes(
    tmp_path: Path, lm: FakeLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer failing after writing a file but before committing its row leaves no row (the
    passage is a miss) and an orphan file; prune removes it, and writes go on correctly."""
    ps = [four_token(i) for i in range(3)]
    with open_cache(tmp_path, lm, 10**6) as cache:
        ensure_keys(cache, lm, ps[:1])
        real = LazyKeyCache._write_file

        def write_then_crash(self, h, blob):
            real(self, h, blob)
            raise OSError("simulated crash after the file write")

        monkeypatch.setattr(LazyKeyCache, "_write_file", write_then_crash)
        with pytest.raises(OSError):
            ensure_keys(cache, lm, ps[1:2])
        monkeypatch.undo()
        files = list((cache.namespace_dir / "data").rglob("*.key"))
        assert len(files) == 2 and len(cache) == 1
        assert cache.get_keys(ps[1:2]) == [None]
        assert cache.prune() == {"orphan_files": 1, "dangling_rows": 0, "evicted": 0}
        assert len(list((cache.namespace_dir / "data").rglob("*.key"))) == 1
        ensure_keys(cache, lm, ps)
        assert len(cache) == 3 and cache.stats()["bytes_used"] == 3 * ENTRY


FILLER = """
    import sys
    import numpy as np
    from nest_integrations.index.lazy_cache import LazyKeyCache
    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.types import Passage
    from tests.fakes import FakeLM
    lm = FakeLM(key_dim=16)
    seed, cap = int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(seed)
    ps = [Passage(id=f"p{i}", text=f"passage {i} " + "tok " * (i % 7)) for i in range(60)]
    with LazyKeyCache.open(sys.argv[1], lm) as cache:
        for _ in range(200):
            chosen = [ps[j] for j in rng.choice(60, size=4, replace=False)]
            for p, k in zip(chosen, ensure_keys(cache, lm, chosen)):
                ids, offs = lm.tokenize_with_offsets(p.text)
                want = lm.encode_passages([ids])[0].astype(np.float16)
                assert k.token_ids.tolist() == list(ids), p.id
                assert np.array_equal(k.keys, want) and np.array_equal(k.offsets, offs), p.id
            for p, k in zip(chosen, cache.get_keys(chosen)):  # hits (maybe evicted: None)
                if k is not None:
                    assert k.token_ids.tolist() == list(lm.tokenize_with_offsets(p.text)[0])
            used = cache.stats()["bytes_used"]
            assert used <= cap, (used, cap)
    print("ok")
"""


def test_two_processes_fill_the_cache_at_once(tmp_path: Path) -> None:
    """Two processes encode and read overlapping passages into one small cache at the same
    time: every read is exact, the cap holds, and the index matches the files at the end."""
    lm = FakeLM(key_dim=16)
    cap = 12 * ENTRY
    configure_lazy(tmp_path / "keys", max_bytes=cap)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(FILLER), str(tmp_path / "keys"), seed, str(cap)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for seed in ("1", "2")
    ]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0 and out.strip() == "ok", err
    with LazyKeyCache.open(tmp_path / "keys", lm) as cache:
        s = cache.stats()
        assert 0 < s["bytes_used"] <= cap
        files = list((cache.namespace_dir / "data").rglob("*"))
        assert sum(f.stat().st_size for f in files if f.is_file()) == s["bytes_used"]
        assert cache.prune() == {"orphan_files": 0, "dangling_rows": 0, "evicted": 0}


def test_mode_record_open_key_store_and_read_through(tmp_path: Path, lm: FakeLM) -> None:
    """lazy.json makes open_key_store return the cache; eager keys already stored are read
    through (not re-encoded, not counted in the cap); switching back to eager is allowed."""
    persist = tmp_path / "store"
    ps = [four_token(i) for i in range(4)]
    with assembly.open_key_store(persist, lm) as eager:
        assert isinstance(eager, DiskKeyStore)
        ensure_keys(eager, lm, ps[:2])
    configure_lazy(persist / "keys", max_bytes="1MB")
    assert read_mode(persist / "keys") == {
        "format_version": 1, "keys": "lazy", "max_bytes": 10**6, "codec": "fp16"}
    with assembly.open_key_store(persist, lm) as cache:
        assert isinstance(cache, LazyKeyCache)
        before = lm.encoded_passages
        got = ensure_keys(cache, lm, ps)
        assert lm.encoded_passages == before + 2  # p0, p1 came from the eager store
        assert cache.source_hits == 2 and len(cache) == 2
        assert all(len(k) == 4 for k in got)
    stats = lazy_cache_stats(persist / "keys")
    assert stats["max_bytes"] == 10**6 and stats["namespaces"][0]["n_entries"] == 2
    assert set_eager_mode(persist / "keys") and read_mode(persist / "keys") is None
    with assembly.open_key_store(persist, lm) as eager:
        assert isinstance(eager, DiskKeyStore)


@pytest.mark.parametrize("name", ["int8", "pq"])
def test_trained_codec_comes_from_ingest_and_cold_equals_warm(
    tmp_path: Path, lm: FakeLM, name: str
) -> None:
    """A lazy int8/pq cache needs tables trained on a sample first; then a cold read (freshly
    encoded) equals a warm one (decoded from disk), at the codec's bytes per key."""
    from nest_integrations.index.lazy_mode import train_lazy_codec

    keys = tmp_path / "keys"
    configure_lazy(keys, max_bytes="1MB", codec=name)
    with pytest.raises(ValueError, match="no trained tables"):
        LazyKeyCache.open(keys, lm)
    sample = [four_token(i) for i in range(80)]  # the corpus the cache will see
    codec = train_lazy_codec(keys, lm, name, sample)
    assert codec.trained and train_lazy_codec(keys, lm, name, sample[:3]).fingerprint() == \
        codec.fingerprint()  # tables are kept, not retrained  # fmt: skip
    ps = [four_token(i) for i in range(3)]
    with LazyKeyCache.open(keys, lm) as cache:
        cold = ensure_keys(cache, lm, ps)
        warm = cache.get_keys(ps)
        for c, w, p in zip(cold, warm, ps):
            np.testing.assert_array_equal(c.keys, w.keys)
            exact = lm.encode_passages([lm.tokenize_with_offsets(p.text)[0]])[0]
            if name == "int8":
                assert np.abs(w.keys - exact).max() < 0.05 * np.ptp(exact)  # lossy but close
        assert cache.stats()["bytes_used"] == 3 * (20 + 4 * (codec.code_size + 12))
        assert codec.code_size == {"int8": D, "pq": D // 8}[name]


def test_threads_share_one_cache(tmp_path: Path, lm: FakeLM) -> None:
    """Four threads encode and read through one cache object: reads exact, cap kept."""
    from concurrent.futures import ThreadPoolExecutor

    ps = [four_token(i) for i in range(30)]
    with open_cache(tmp_path, lm, 10 * ENTRY) as cache:

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(40):
                chosen = [ps[j] for j in rng.choice(len(ps), size=3, replace=False)]
                for p, k in zip(chosen, ensure_keys(cache, lm, chosen)):
                    assert k.passage_id == p.id
                    assert k.token_ids.tolist() == list(lm.tokenize_with_offsets(p.text)[0])
                assert cache.stats()["bytes_used"] <= 10 * ENTRY

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
        assert len(cache) == 10 and cache.prune()["orphan_files"] == 0


def test_parse_size() -> None:
    """Sizes with decimal and binary units; bad ones name the rule."""
    assert parse_size("2GB") == 2 * 10**9 and parse_size("500MB") == 5 * 10**8
    assert parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size("4096") == 4096
    for bad in ("", "lots", "-1MB", "0", "3XB"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


def test_cli_ingest_lazy_encodes_nothing_and_info_shows_the_cache(
    tmp_path: Path, lm: FakeLM, capsys, monkeypatch
) -> None:
    """`nest ingest --keys lazy` writes passages without loading the LM or encoding keys,
    records the mode and cap; `nest info` shows them; a query-time engine fills the cache."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("Owls hunt at night.\n\nThey have silent feathers.\n")
    never = lambda *a, **k: pytest.fail("lazy ingest must not load the LM")  # noqa: E731
    monkeypatch.setattr(assembly, "shared_model", never)
    store = ["--persist-dir", str(tmp_path / "store"), "--collection", "lazy-col"]
    assert cli.main(["ingest", str(notes), *store, "--key-cache-size", "1MB"]) == 2  # not lazy
    assert "applies to lazy keys only" in capsys.readouterr().err
    assert cli.main(["ingest", str(notes), *store, "--keys", "lazy", "--key-cache-size",
                     "1MB"]) == 0  # fmt: skip
    assert "lazy: encoded when a query retrieves them" in capsys.readouterr().out
    keys = tmp_path / "store" / "keys"
    assert read_mode(keys)["max_bytes"] == 10**6 and not (keys / "ns").exists()
    assert cli.main(["ingest", str(notes), *store, "--key-cache-size", "2MB"]) == 0  # stays lazy
    assert read_mode(keys)["max_bytes"] == 2 * 10**6
    capsys.readouterr()
    passages = list(assembly.open_store("lazy-col", tmp_path / "store").iter_passages())
    with assembly.open_key_store(tmp_path / "store", lm) as cache:
        ensure_keys(cache, lm, passages)
    assert cli.main(["info", "--json", "--no-model", *store]) == 0
    info = json.loads(capsys.readouterr().out)["key_store"]
    assert info["mode"] == "lazy" and info["lazy"]["max_bytes"] == 2 * 10**6
    assert info["lazy"]["namespaces"][0]["n_entries"] == len(passages) >= 1
    assert cli.main(["info", "--no-model", *store]) == 0
    assert "lazy (keys encoded at query time), cap 2.0 MB" in capsys.readouterr().out
    assert cli.main(["ingest", str(notes), *store, "--key-cache-size", "10B"]) == 0
    assert lazy_cache_stats(keys)["namespaces"][0]["bytes_used"] == 0  # a lower cap applies now
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: lm)
    assert cli.main(["ingest", str(notes), *store, "--keys", "eager"]) == 0  # lazy -> eager
    assert read_mode(keys) is None and "passages newly encoded" in capsys.readouterr().out
    with assembly.open_key_store(tmp_path / "store", lm) as eager:
        assert isinstance(eager, DiskKeyStore) and len(eager) == len(passages)


PASSAGES = [
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western Asia.",
    "Owls are birds from the order Strigiformes, which includes over 200 species of mostly "
    "solitary and nocturnal birds of prey typified by an upright stance.",
    "The assert statement is a convenient way to insert debugging assertions into a program.",
]


def _generate(engine: NestEngine, passages: list[Passage]) -> tuple:
    res = engine.generate("The Roman Empire", max_new_tokens=32, passages=passages)
    cites = [(c.start, c.end, c.passage_id, c.passage_start, c.passage_end, c.text)
             for c in res.citations]  # fmt: skip
    return res.text, list(res.token_ids), cites, res.stats.copied_tokens


def test_oracle_engine_on_lazy_cache_equals_pre_encoded_keys(tmp_path: Path, tiny_lm) -> None:
    """A NestEngine whose key store is a lazy cache (cold, then warm after reopening) produces
    exactly the tokens and citations of one whose keys were pre-encoded in a DiskKeyStore."""
    cfg = NestConfig(span_threshold=1.0, min_citation_tokens=1)  # the tiny model copies spans
    ps = [Passage(id=f"r{i}", text=t, doc_id=f"d{i}") for i, t in enumerate(PASSAGES)]
    with DiskKeyStore.open(tmp_path / "eager", tiny_lm) as ds:
        ensure_keys(ds, tiny_lm, ps)
        want = _generate(make_engine(tiny_lm, None, ds, cfg), ps)
    assert want[3] > 0 and want[2]  # the oracle copies and cites
    configure_lazy(tmp_path / "keys", max_bytes="10MB")
    with LazyKeyCache.open(tmp_path / "keys", tiny_lm) as cache:
        assert _generate(make_engine(tiny_lm, None, cache, cfg), ps) == want  # cold
        assert cache.misses == len(ps) and len(cache) == len(ps)
    with LazyKeyCache.open(tmp_path / "keys", tiny_lm) as cache:
        assert _generate(make_engine(tiny_lm, None, cache, cfg), ps) == want  # warm
        assert cache.hits == len(ps) and cache.misses == 0
