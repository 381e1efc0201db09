"""The corpus-wide FAISS index over a key store, checked against numpy brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.store import DiskKeyStore, content_hash, ensure_keys
from nest_integrations.types import Passage, PassageKeys
from tests.fakes import FakeLM

pytest.importorskip("faiss")

from nest_integrations.index.faiss_index import (  # noqa: E402
    CorpusTokenIndex,
    build_faiss_index,
    default_index_path,
)

D = 24


@pytest.fixture
def store(tmp_path: Path) -> DiskKeyStore:
    """A store of 80 passages with random keys (no exact ties), spread over several shards."""
    rng = np.random.default_rng(0)
    s = DiskKeyStore(tmp_path, fingerprint="rand", key_source="ffn_input", key_dim=D,
                     shard_bytes=D * 2 * 500)  # fmt: skip
    passages, keys = [], []
    for i in range(80):
        m = int(rng.integers(1, 40))
        text = " ".join(f"w{i}_{j}" for j in range(m))
        offs = np.array([[0, 0]] * m)
        passages.append(Passage(id=f"p{i}", text=text))
        vecs = rng.standard_normal((m, D))
        keys.append(PassageKeys(f"p{i}", vecs, rng.integers(2, 999, m), offs))
    s.put_keys(passages, keys)
    yield s
    s.close()


def brute_force(store: DiskKeyStore, queries: np.ndarray, k: int, metric: str):
    """Exact top-k over every stored key: (distances, [(content_hash, position)])."""
    chunks = list(store.iter_all())
    keys = np.concatenate([c.keys for c in chunks]).astype(np.float64)
    ids = [(h, int(p)) for c in chunks for h, p in zip(c.content_hashes, c.positions)]
    if metric == "l2":
        dist = ((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
        order = np.argsort(dist, axis=1)[:, :k]
    else:
        dist = queries @ keys.T
        order = np.argsort(-dist, axis=1)[:, :k]
    return np.take_along_axis(dist, order, 1), [[ids[j] for j in row] for row in order]


def assert_same_hits(got_d, got_ids, ref_d, ref_ids) -> None:
    """Same distances; same ids, except where ties make the order ambiguous."""
    np.testing.assert_allclose(got_d, ref_d, rtol=1e-4, atol=1e-3)
    for gd, gi, ri in zip(got_d, got_ids, ref_ids):
        tied = np.isclose(gd[:, None], gd[None, :], rtol=1e-5, atol=1e-5).sum(1) > 1
        assert [g for g, t in zip(gi, tied) if not t] == [r for r, t in zip(ri, tied) if not t]
        assert set(gi) == set(ri) or tied.any()


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_flat_search_equals_numpy_brute_force(store: DiskKeyStore, metric: str) -> None:
    """kind="flat" returns exactly the numpy top-k over all stored keys."""
    queries = np.random.default_rng(1).standard_normal((12, D)).astype(np.float32)
    index = build_faiss_index(store, kind="flat", metric=metric, batch_rows=100)
    assert len(index) == store.stats()["n_tokens"]
    got_d, got_ids = index.search(queries, 10)
    assert_same_hits(got_d, got_ids, *brute_force(store, queries, 10, metric))


def test_hits_point_at_the_stored_key_and_value(store: DiskKeyStore) -> None:
    """A stored key's own nearest neighbour is itself, with its passage hash and position."""
    chunk = next(store.iter_all(batch_rows=50))
    index = build_faiss_index(store)
    d, ids = index.search(chunk.keys[:20], 1)
    np.testing.assert_allclose(d[:, 0], 0.0, atol=1e-4)
    assert [i[0] for i in ids] == list(zip(chunk.content_hashes[:20], chunk.positions[:20]))
    _, rows = index.search_rows(chunk.keys[:20], 1)
    np.testing.assert_array_equal(index.token_ids[rows[:, 0]], chunk.token_ids[:20])


def test_ivf_probing_every_list_is_exact(store: DiskKeyStore) -> None:
    """IVF with nprobe == nlist equals flat search; the default nprobe returns valid hits."""
    queries = np.random.default_rng(2).standard_normal((8, D)).astype(np.float32)
    ivf = build_faiss_index(store, kind="ivf", nlist=8, nprobe=8)
    assert_same_hits(*ivf.search(queries, 5), *brute_force(store, queries, 5, "l2"))
    ivf_default = build_faiss_index(store, kind="ivf")
    _, ids = ivf_default.search(queries, 5)
    hashes = {c for ch in store.iter_all() for c in ch.content_hashes}
    assert all(h in hashes for row in ids for h, _ in row)


def test_save_and_load_round_trip(store: DiskKeyStore) -> None:
    """A saved index loads next to its store and answers identically."""
    queries = np.random.default_rng(3).standard_normal((5, D)).astype(np.float32)
    index = build_faiss_index(store, kind="ivf", nlist=4)
    path = default_index_path(store, "ivf")
    index.save(path)
    loaded = CorpusTokenIndex.load(path, store=store)
    d1, i1 = index.search(queries, 7)
    d2, i2 = loaded.search(queries, 7)
    np.testing.assert_array_equal(d1, d2)
    assert i1 == i2 and loaded.meta == index.meta


def test_load_refuses_an_index_of_another_model(store: DiskKeyStore, tmp_path: Path) -> None:
    """An index built from one model's keys is refused for another model's store."""
    build_faiss_index(store).save(tmp_path / "idx")
    lm = FakeLM(key_dim=D)
    with DiskKeyStore.open(tmp_path / "other", lm) as other:
        with pytest.raises(KeyStoreMismatchError, match="rebuild"):
            CorpusTokenIndex.load(tmp_path / "idx", store=other)


def test_index_over_fake_lm_keys_and_empty_store(tmp_path: Path) -> None:
    """An empty store gives an empty index; FakeLM keys index with the right passage hashes."""
    lm = FakeLM(key_dim=8)
    with DiskKeyStore.open(tmp_path, lm) as s:
        empty = build_faiss_index(s, kind="ivf")
        assert len(empty) == 0 and empty.search(np.zeros((2, 8), np.float32), 3)[1] == [[], []]
        p = Passage(id="a", text="alpha beta gamma delta")
        keys = ensure_keys(s, lm, [p])[0]
        _, ids = build_faiss_index(s).search(keys.keys[3:4].astype(np.float32), 1)
    assert ids == [[(content_hash(p.text), 3)]]
