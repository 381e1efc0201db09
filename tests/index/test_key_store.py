"""DiskKeyStore and ensure_keys: round trips, dedup, mismatch refusal, persistence, crash safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.index.base import KeyStore, KeyStoreMismatchError
from nest_integrations.index.base import KeyStoreCorruptError
from nest_integrations.index.keys import content_hash, ensure_keys
from nest_integrations.index.namespaces import list_namespaces, read_store_manifest
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage, PassageKeys
from tests.fakes import FakeLM

REPO = Path(__file__).resolve().parents[2]
TEXTS = [
    "The Eiffel Tower is in Paris.",
    "Water boils at 100 degrees Celsius at sea level.",
    "  Leading spaces, trailing spaces and\nnew lines  ",
    "Ünïcödé — текст 日本語 text with emoji 🎉 inside.",
    "one",
    " ".join(f"word{i}" for i in range(300)),  # a long passage
]


def make_passages(texts: list[str] = TEXTS, prefix: str = "p") -> list[Passage]:
    return [Passage(id=f"{prefix}{i}", text=t, doc_id="doc") for i, t in enumerate(texts)]


def expected_keys(lm: FakeLM, text: str) -> tuple[np.ndarray, list[int], np.ndarray]:
    ids, offsets = lm.tokenize_with_offsets(text)
    return lm.encode_passages([ids])[0], ids, offsets


@pytest.fixture
def lm() -> FakeLM:
    return FakeLM(key_dim=16)


@pytest.fixture
def store(tmp_path: Path, lm: FakeLM) -> DiskKeyStore:
    with DiskKeyStore.open(tmp_path / "keys", lm) as s:
        yield s


def test_store_implements_the_keystore_port(store: DiskKeyStore, lm: FakeLM) -> None:
    """DiskKeyStore satisfies the KeyStore protocol, and behaves as it says through the port
    alone: absent keys are None, put keys come back exactly (by text, whatever the passage id),
    and a second put of the same text leaves the first keys untouched."""
    assert isinstance(store, KeyStore)
    port: KeyStore = store
    passages = make_passages(TEXTS[:3])
    assert port.get_keys(passages) == [None, None, None]
    keys = []
    for p in passages[:2]:
        k, ids, offsets = expected_keys(lm, p.text)
        keys.append(PassageKeys(p.id, k, np.asarray(ids), np.asarray(offsets)))
    port.put_keys(passages[:2], keys)
    other = PassageKeys(passages[0].id, keys[0].keys + 1, keys[0].token_ids, keys[0].offsets)
    port.put_keys(passages[:1], [other])  # already present: ignored
    got = port.get_keys(make_passages(TEXTS[:3], prefix="renamed"))
    assert got[2] is None
    for want, back in zip(keys, got[:2]):
        assert back is not None
        np.testing.assert_array_equal(back.keys, want.keys.astype(np.float16))
        np.testing.assert_array_equal(back.token_ids, want.token_ids)
        np.testing.assert_array_equal(back.offsets, want.offsets)


@pytest.mark.parametrize("dtype,tol", [("float16", 2e-3), ("float32", 0.0)])
def test_round_trip_in_a_fresh_store_object(
    tmp_path: Path, lm: FakeLM, dtype: str, tol: float
) -> None:
    """Keys read back equal the keys computed (fp16 tolerance); ids and offsets are exact."""
    passages = make_passages()
    with DiskKeyStore.open(tmp_path, lm, dtype=dtype) as s:
        ensure_keys(s, lm, passages, batch_size=4)
    with DiskKeyStore.open(tmp_path, lm) as s:
        got = s.get_keys(passages)
        assert s.dtype.name == dtype
    for p, k in zip(passages, got):
        keys, ids, offsets = expected_keys(lm, p.text)
        assert k is not None and k.passage_id == p.id
        assert k.keys.dtype == np.dtype(dtype) and k.keys.shape == keys.shape
        np.testing.assert_allclose(k.keys.astype(np.float32), keys, rtol=tol, atol=tol)
        assert k.token_ids.dtype == np.int64 and k.token_ids.tolist() == ids
        assert k.offsets.dtype == np.int32
        np.testing.assert_array_equal(k.offsets, offsets)
        assert "".join(p.text[a:b] for a, b in k.offsets) == p.text


def test_ensure_keys_returns_what_get_keys_returns(store: DiskKeyStore, lm: FakeLM) -> None:
    """The first (encoding) call and later (loading) calls give identical memories."""
    passages = make_passages()
    first = ensure_keys(store, lm, passages)
    later = store.get_keys(passages)
    for a, b in zip(first, later):
        assert b is not None and a.passage_id == b.passage_id
        assert a.keys.dtype == b.keys.dtype
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_absent_passages_get_none(store: DiskKeyStore, lm: FakeLM) -> None:
    """get_keys returns None for passages never stored."""
    ensure_keys(store, lm, make_passages()[:2])
    got = store.get_keys(make_passages())
    assert [k is None for k in got] == [False, False] + [True] * (len(TEXTS) - 2)


def test_stored_hashes_agrees_with_get_keys(store: DiskKeyStore, lm: FakeLM) -> None:
    """stored_hashes (an index query, used to list what a large ingest must still encode)
    names exactly the passages get_keys finds."""
    ensure_keys(store, lm, make_passages()[:2])
    hashes = [content_hash(p.text) for p in make_passages()]
    found = {h for h, k in zip(hashes, store.get_keys(make_passages())) if k is not None}
    assert store.stored_hashes(hashes) == found and len(found) == 2


def test_put_is_idempotent(store: DiskKeyStore, lm: FakeLM) -> None:
    """Putting an existing text again changes nothing, even with different keys."""
    passages = make_passages()
    ensure_keys(store, lm, passages)
    before = store.stats()
    shard_bytes = sorted(f.stat().st_size for f in store.namespace_dir.glob("0*"))
    original = store.get_keys(passages)[0]
    other = PassageKeys("p0", original.keys + 1, original.token_ids, original.offsets)
    store.put_keys([passages[0]], [other])
    store.put_keys(passages, store.get_keys(passages))
    assert store.stats()["n_passages"] == before["n_passages"]
    assert store.stats()["n_tokens"] == before["n_tokens"]
    assert sorted(f.stat().st_size for f in store.namespace_dir.glob("0*")) == shard_bytes
    np.testing.assert_array_equal(store.get_keys([passages[0]])[0].keys, original.keys)


def test_same_text_under_two_ids_is_stored_once(store: DiskKeyStore, lm: FakeLM) -> None:
    """Entries are addressed by content hash: two ids, one entry, each read keeps its id."""
    a = Passage(id="a", text="Shared text about owls.")
    b = Passage(id="b", text="Shared text about owls.", doc_id="other-doc")
    out = ensure_keys(store, lm, [a, b])
    assert len(store) == 1 and lm.encoded_passages == 1
    assert [k.passage_id for k in out] == ["a", "b"]
    assert [k.passage_id for k in store.get_keys([b, a])] == ["b", "a"]
    assert content_hash(a.text) == content_hash(b.text) != content_hash(a.text + " ")


def test_ensure_keys_encodes_each_passage_once(tmp_path: Path, lm: FakeLM) -> None:
    """Nothing is encoded twice: not within a call, not across calls, not after reopening."""
    passages = make_passages() + make_passages(prefix="dup")  # every text twice
    with DiskKeyStore.open(tmp_path, lm) as s:
        ensure_keys(s, lm, passages, batch_size=2, progress=True)
        assert lm.encoded_passages == len(TEXTS)
        assert lm.tokenize_calls == len(TEXTS)
        ensure_keys(s, lm, passages)
    with DiskKeyStore.open(tmp_path, lm) as s:
        ensure_keys(s, lm, passages + make_passages(["a brand new passage"], prefix="new"))
    assert lm.encoded_passages == len(TEXTS) + 1


def test_empty_passage_gets_empty_keys(store: DiskKeyStore, lm: FakeLM) -> None:
    """A passage with no tokens gets 0 keys, is stored, and is never re-tokenised."""
    passages = [Passage(id="e", text=""), Passage(id="x", text="some text")]
    out = ensure_keys(store, lm, passages)
    assert len(out[0]) == 0 and out[0].keys.shape == (0, 16) and out[0].offsets.shape == (0, 2)
    calls = lm.tokenize_calls
    got = ensure_keys(store, lm, passages)
    assert lm.tokenize_calls == calls
    assert len(got[0]) == 0 and len(got[1]) == 2
    assert [len(k) for k in store.get_keys(passages)] == [0, 2]


def test_store_built_by_another_model_is_refused(tmp_path: Path, lm: FakeLM) -> None:
    """Opening a store built by model A with model B raises a clear KeyStoreMismatchError."""
    ensure_keys(DiskKeyStore.open(tmp_path, lm), lm, make_passages())
    other = FakeLM(key_dim=16, seed=1, name="other-lm")
    with pytest.raises(KeyStoreMismatchError) as err:
        DiskKeyStore.open(tmp_path, other)
    msg = str(err.value)
    assert lm.fingerprint in msg and other.fingerprint in msg
    assert "nest ingest" in msg and "persist dir" in msg and str(tmp_path) in msg


def test_other_key_source_is_refused_and_never_mixed(tmp_path: Path, lm: FakeLM) -> None:
    """Another key layer of the same model is refused, or gets its own namespace."""
    passages = make_passages()
    ensure_keys(DiskKeyStore.open(tmp_path, lm), lm, passages)
    block = FakeLM(key_dim=16, key_source="block_input")
    with pytest.raises(KeyStoreMismatchError, match="block_input"):
        DiskKeyStore.open(tmp_path, block)
    with DiskKeyStore.open(tmp_path, block, allow_new_namespace=True) as s:
        assert s.get_keys(passages) == [None] * len(passages)
        assert s.built_with["key_source"] == "ffn_input"
    assert {n["key_source"] for n in list_namespaces(tmp_path)} == {"ffn_input", "block_input"}
    assert read_store_manifest(tmp_path)["fingerprint"] == lm.fingerprint


def test_ensure_keys_refuses_an_lm_that_does_not_match_the_store(
    store: DiskKeyStore, lm: FakeLM
) -> None:
    """ensure_keys never writes another model's keys into a namespace."""
    with pytest.raises(KeyStoreMismatchError):
        ensure_keys(store, FakeLM(key_dim=16, seed=7), make_passages())
    assert len(store) == 0


def test_namespace_key_dim_or_dtype_mismatch_is_refused(tmp_path: Path, lm: FakeLM) -> None:
    """A namespace holding other key_dim or dtype cannot be opened with the wrong layout."""
    DiskKeyStore.open(tmp_path, lm).close()
    kw = dict(fingerprint=lm.fingerprint, key_source=lm.key_source)
    with pytest.raises(KeyStoreMismatchError, match="key_dim=16"):
        DiskKeyStore(tmp_path, key_dim=32, **kw)
    with pytest.raises(KeyStoreMismatchError, match="float16"):
        DiskKeyStore(tmp_path, key_dim=16, dtype="float32", **kw)


def test_put_with_wrong_shapes_is_refused(store: DiskKeyStore) -> None:
    """Keys of the wrong dimension, or mismatched row counts, are refused before writing."""
    p = Passage(id="p", text="a b c")
    ids, offs = np.array([5, 6, 7]), np.array([[0, 1], [1, 3], [3, 5]])
    with pytest.raises(KeyStoreMismatchError):
        store.put_keys([p], [PassageKeys("p", np.zeros((3, 8)), ids, offs)])
    with pytest.raises(ValueError, match="m=3"):
        store.put_keys([p], [PassageKeys("p", np.zeros((2, 16)), ids, offs)])
    with pytest.raises(ValueError, match="float32"):
        store.put_keys([p], [PassageKeys("p", np.full((3, 16), 1e6), ids, offs)])
    assert len(store) == 0


def _run(code: str, *args: str) -> str:
    """Run ``code`` in a fresh python process at the repo root; return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


WRITER = """
    import sys
    from nest_integrations.index.keys import ensure_keys
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.types import Passage
    from tests.fakes import FakeLM
    lm = FakeLM(key_dim=16)
    lo, hi = int(sys.argv[2]), int(sys.argv[3])
    passages = [Passage(id=f"p{i}", text=f"passage {i} " + "tok " * (i % 50))
                for i in range(lo, hi)]
    with DiskKeyStore.open(sys.argv[1], lm) as store:
        for i in range(0, len(passages), 7):
            ensure_keys(store, lm, passages[i : i + 7], batch_size=3)
    print(lm.encoded_passages)
"""


def _numbered(lo: int, hi: int) -> list[Passage]:
    return [Passage(id=f"p{i}", text=f"passage {i} " + "tok " * (i % 50)) for i in range(lo, hi)]


def test_keys_persist_across_process_restarts(tmp_path: Path) -> None:
    """Keys written by one process are read, unchanged, by another; nothing is re-encoded."""
    assert _run(WRITER, str(tmp_path), "0", "40").strip() == "40"
    reader = """
        import json, sys
        import numpy as np
        from nest_integrations.index.keys import ensure_keys
        from nest_integrations.index.store import DiskKeyStore
        from tests.fakes import FakeLM
        from tests.index.test_key_store import _numbered
        lm = FakeLM(key_dim=16)
        store = DiskKeyStore.open(sys.argv[1], lm)
        keys = ensure_keys(store, lm, _numbered(0, 40))
        ids, _ = lm.tokenize_with_offsets(_numbered(5, 6)[0].text)
        err = float(np.abs(keys[5].keys - lm.encode_passages([ids])[0]).max())
        print(json.dumps({"encoded": lm.encoded_passages - 1, "n": len(store), "err": err}))
    """
    out = json.loads(_run(reader, str(tmp_path)))
    assert out["encoded"] == 0 and out["n"] == 40 and out["err"] < 2e-3


def test_two_processes_writing_at_once_stay_consistent(tmp_path: Path, lm: FakeLM) -> None:
    """Concurrent writers with overlapping passages: each text stored once, all reads exact."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), str(tmp_path), lo, hi],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for lo, hi in (("0", "60"), ("30", "90"))
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    passages = _numbered(0, 90)
    with DiskKeyStore.open(tmp_path, lm) as s:
        got = s.get_keys(passages)
        assert len(s) == 90
        assert s.stats()["n_tokens"] == sum(len(k) for k in got)
    for p, k in zip(passages, got):
        keys, ids, _ = expected_keys(lm, p.text)
        assert k.token_ids.tolist() == ids
        np.testing.assert_allclose(k.keys.astype(np.float32), keys, atol=2e-3, rtol=2e-3)


def test_crash_between_append_and_commit_leaves_a_consistent_store(tmp_path: Path) -> None:
    """A writer killed after appending data but before committing its index rows loses only
    its own uncommitted passages; the store stays readable and later writes are correct."""
    assert _run(WRITER, str(tmp_path), "0", "10").strip() == "10"
    crasher = """
        import os, sys
        from nest_integrations.index.keys import ensure_keys
        from nest_integrations.index.store import DiskKeyStore
        from tests.fakes import FakeLM
        from tests.index.test_key_store import _numbered
        lm = FakeLM(key_dim=16)
        store = DiskKeyStore.open(sys.argv[1], lm)
        write = store._write_shard
        def write_then_die(*args):
            write(*args)  # data appended and fsynced ...
            os._exit(3)   # ... and the process dies before the index rows commit
        store._write_shard = write_then_die
        ensure_keys(store, lm, _numbered(10, 20))
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(crasher), str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lm = FakeLM(key_dim=16)
    with DiskKeyStore.open(tmp_path, lm) as s:
        before = s.get_keys(_numbered(0, 20))
        assert [k is None for k in before] == [False] * 10 + [True] * 10
        keys_file = next(s.namespace_dir.glob("*.keys"))
        with open(keys_file, "ab") as f:
            f.write(b"\x01\x02\x03")  # plus a torn partial row
        ensure_keys(s, lm, [Passage(id="short", text="x")])  # far shorter than the orphans
        assert keys_file.stat().st_size == s.stats()["n_tokens"] * 16 * 2  # orphans cut off
        out = ensure_keys(s, lm, _numbered(0, 30))
        assert lm.encoded_passages == 21
    with DiskKeyStore.open(tmp_path, lm) as s:
        for p, k, k2 in zip(_numbered(0, 30), out, s.get_keys(_numbered(0, 30))):
            keys, ids, _ = expected_keys(lm, p.text)
            assert k2.token_ids.tolist() == ids == k.token_ids.tolist()
            np.testing.assert_allclose(k2.keys.astype(np.float32), keys, atol=2e-3, rtol=2e-3)


def test_corrupt_or_absent_manifests_raise_clear_errors(tmp_path: Path, lm: FakeLM) -> None:
    """A damaged or missing manifest is reported, never silently recreated over data."""
    with DiskKeyStore.open(tmp_path, lm) as s:
        ensure_keys(s, lm, make_passages())
        manifest = s.namespace_dir / "manifest.json"
    good = manifest.read_text()
    manifest.write_text("{not json")
    with pytest.raises(KeyStoreCorruptError, match="unreadable"):
        DiskKeyStore.open(tmp_path, lm)
    manifest.write_text(json.dumps({"format_version": 1, "fingerprint": lm.fingerprint}))
    with pytest.raises(KeyStoreCorruptError, match="lacks"):
        DiskKeyStore.open(tmp_path, lm)
    manifest.unlink()
    with pytest.raises(KeyStoreCorruptError, match="no manifest.json"):
        DiskKeyStore.open(tmp_path, lm)
    manifest.write_text(good)
    (tmp_path / "store.json").unlink()
    with pytest.raises(KeyStoreCorruptError, match="no store.json"):
        DiskKeyStore.open(tmp_path, lm)
    (tmp_path / "store.json").write_text("[]")
    with pytest.raises(KeyStoreCorruptError):
        DiskKeyStore.open(tmp_path, lm)


def test_index_pointing_past_a_truncated_shard_is_detected(
    store: DiskKeyStore, lm: FakeLM
) -> None:
    """Rows lost from a shard file surface as KeyStoreCorruptError on read, not garbage keys."""
    ensure_keys(store, lm, make_passages())
    keys_file = next(store.namespace_dir.glob("*.keys"))
    os.truncate(keys_file, keys_file.stat().st_size // 2)
    with DiskKeyStore.open(store.path, lm) as fresh:
        with pytest.raises(KeyStoreCorruptError, match="corrupt"):
            fresh.get_keys(make_passages()[-1:])


def test_shards_rotate_and_passages_stay_contiguous(tmp_path: Path, lm: FakeLM) -> None:
    """With a tiny shard size the store spans many shards; every passage is one slice."""
    passages = _numbered(0, 40)
    with DiskKeyStore.open(tmp_path, lm, shard_bytes=16 * 2 * 64) as s:
        out = ensure_keys(s, lm, passages, batch_size=5)
        assert s.stats()["n_shards"] > 3
        for a, b in zip(out, s.get_keys(passages)):
            np.testing.assert_array_equal(a.keys, b.keys)
            np.testing.assert_array_equal(a.token_ids, b.token_ids)


def test_stats_describe_the_namespace(store: DiskKeyStore, lm: FakeLM) -> None:
    """stats() counts passages and tokens and reports the on-disk size per token."""
    assert store.stats()["n_tokens"] == 0 and store.stats()["bytes_per_token"] == 0.0
    out = ensure_keys(store, lm, make_passages())
    st = store.stats()
    assert st["n_passages"] == len(TEXTS) and st["n_tokens"] == sum(len(k) for k in out)
    assert st["fingerprint"] == lm.fingerprint and st["key_source"] == "ffn_input"
    assert st["bytes_per_token"] >= 16 * 2 + 4 + 8  # fp16 key + int32 id + 2 int32 offsets


@pytest.mark.slow
def test_round_trip_with_the_real_model(tmp_path: Path, default_lm) -> None:
    """The real LM's passage keys survive the store within fp16 tolerance."""
    lm = default_lm
    passages = make_passages(TEXTS[:4])
    with DiskKeyStore.open(tmp_path, lm) as s:
        first = ensure_keys(s, lm, passages)
        got = s.get_keys(passages)
    for p, a, b in zip(passages, first, got):
        ids, offsets = lm.tokenize_with_offsets(p.text)
        ref = lm.encode_passages([ids])[0]
        assert b.token_ids.tolist() == list(ids)
        np.testing.assert_array_equal(b.offsets, np.asarray(offsets))
        np.testing.assert_array_equal(a.keys, b.keys)
        scale = float(np.abs(ref).max()) + 1.0
        np.testing.assert_allclose(b.keys.astype(np.float32), ref, atol=2e-3 * scale, rtol=2e-3)


def _open_and_insert(path: str, q) -> None:  # pragma: no cover - runs in a child process
    from nest_integrations.index import _disk

    try:
        db = _disk.open_index(Path(path), "CREATE TABLE IF NOT EXISTS t (a INTEGER);")
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t VALUES (1)")
        db.execute("COMMIT")
        db.close()
        q.put("ok")
    except Exception as exc:  # reported to the parent
        q.put(repr(exc))


def test_processes_creating_one_index_at_once_all_succeed(tmp_path: Path) -> None:
    """Switching a new sqlite index to WAL takes a lock sqlite does not wait for; processes
    that open a new key store or lazy cache at the same moment must not fail with 'database is
    locked' (they did, about 1 open in 50, before open_index retried)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    for trial in range(25):
        path = str(tmp_path / f"i{trial}.sqlite")
        q = ctx.Queue()
        procs = [ctx.Process(target=_open_and_insert, args=(path, q)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        results = [q.get(timeout=10) for _ in procs]
        assert results == ["ok"] * 4, results
