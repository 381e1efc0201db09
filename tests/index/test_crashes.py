"""Real crashes: a child process is SIGKILLed at chosen points of a write, then the parent
reopens what it left (issue 20, item 6).

The child runs the library unchanged on the tiny random Llama (saved by the ``tiny_lm_path``
fixture and loaded the same way as ``tiny_lm``); ``tests/_crash.py`` makes it kill itself at the
``n``-th matching file-system call, before or after it runs. After each kill:

- DReSD build: the datastore is not live yet (or still the old version), the next build resumes
  from what was finished without recomputing it, and the result equals a clean build;
- lazy key cache: reopening it gives the same answers (token ids and citations) as a cache
  filled without a crash, ``prune`` removes the dead writer's files, the byte count is right;
- key store: during a manifest write (creating ``store.json`` or a namespace manifest, and the
  rewrite that records trained codec tables): the store reopens, every passage committed before
  is there with its keys, none is half-written, and finishing the ingest gives the clean keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.dresd import DatastoreError, DresdDatastore, PassageSource, build_datastore
from nest_integrations.config import NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.lazy_cache import LazyKeyCache
from nest_integrations.index.lazy_mode import configure_lazy
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Passage
from tests._crash import KillAt, run_child
from tests.dresd_texts import TEXTS, CountingSource  # ten one-sentence passages

PASSAGES = [Passage(id=f"p{i}", text=t, doc_id=f"d{i}") for i, t in enumerate(TEXTS)]
#: Longer passages (each holds all ten texts): enough tokens to train an int8 codec.
LONG = [Passage(id=f"long{i}", text=" ".join(TEXTS[i:] + TEXTS[:i]), doc_id=f"long{i}")
        for i in range(5)]

#: The child's side: the tiny model and the passages, as the parent has them.
CHILD = """
import os, sys
sys.path.insert(0, os.environ["REPO_TESTS"])
from nest_integrations.lm.hf import HFLanguageModel
from test_crashes import LONG, PASSAGES
lm = HFLanguageModel.from_pretrained(os.environ["TINY"], dtype="fp32")
root = os.environ["ROOT"]
"""


def _same(got, want, dtype=None) -> None:
    assert np.asarray(got.token_ids).tolist() == np.asarray(want.token_ids).tolist()
    np.testing.assert_array_equal(got.offsets, want.offsets)
    w = np.asarray(want.keys)
    np.testing.assert_array_equal(np.asarray(got.keys), w if dtype is None else w.astype(dtype))


def child(script: str, tiny_lm_path: Path, root: Path, kill: KillAt | None = None) -> None:
    run_child(CHILD + script, kill, TINY=str(tiny_lm_path), ROOT=str(root),
              REPO_TESTS=str(Path(__file__).parent))


# ---------------------------------------------------------------------------------- DReSD


DRESD_BUILD = """
from nest_integrations.dresd import PassageSource, build_datastore
build_datastore(lm, PassageSource(PASSAGES, lm, batch_size=3), root)
"""


@pytest.fixture(scope="module")
def clean_dresd(tiny_lm, tmp_path_factory):
    return build_datastore(tiny_lm, PassageSource(PASSAGES, tiny_lm, batch_size=3),
                           tmp_path_factory.mktemp("clean") / "ds")


#: Each child run costs a few seconds (a fresh interpreter loads torch and the model): one kill
#: point per scenario runs in the quick subset, the others in the slow set.
SLOW = pytest.mark.slow


def _slow(*values):
    return pytest.param(*values, marks=SLOW)


DRESD_KILLS = [
    KillAt("replace", r"index\.faiss$"),  # assemble: the new version folder half-built
    _slow(KillAt("replace", r"part-000001\.npz$")),  # collect: batch 1 encoded, not saved
    _slow(KillAt("fsync", r"pca\.npz\.tmp$")),  # pca: written, not renamed
    _slow(KillAt("replace", r"red-000002\.npy$", when="after")),  # reduce: batch 2 saved
    _slow(KillAt("replace", r"CURRENT$")),  # the version is complete, not switched to
]


@pytest.mark.parametrize("kill", DRESD_KILLS, ids=str)
def test_dresd_build_killed_then_resumed_equals_a_clean_build(
    tiny_lm, tiny_lm_path, tmp_path, clean_dresd, kill
):
    root = tmp_path / "ds"
    child(DRESD_BUILD, tiny_lm_path, root, kill)
    with pytest.raises(DatastoreError, match="unfinished.*resume"):
        DresdDatastore.open(root, tiny_lm)
    done = {i for i in range(4) if (root / ".build" / f"part-{i:06d}.npz").exists()}
    src = CountingSource(PASSAGES, tiny_lm, batch_size=3)
    ds = build_datastore(tiny_lm, src, root)
    assert src.calls == [i for i in range(4) if i not in done]  # finished batches reused
    assert done or kill.match.startswith("part")
    for name in ("tokens", "bounds", "offsets", "keys"):
        np.testing.assert_array_equal(getattr(ds, name), getattr(clean_dresd, name), name)
    assert [ds.passage(p) for p in range(ds.n_passages)] == \
        [clean_dresd.passage(p) for p in range(clean_dresd.n_passages)]
    q = clean_dresd.keys[::7].astype(np.float32)
    np.testing.assert_array_equal(ds.index.search(q, 5)[1], clean_dresd.index.search(q, 5)[1])
    # What the dead builder left is gone: one version folder, no unfinished build.
    assert sorted(p.name for p in root.iterdir() if p.name != "CURRENT") == [ds.vdir.name]


@SLOW
def test_dresd_rebuild_killed_keeps_the_old_version_live(tiny_lm, tiny_lm_path, tmp_path):
    root = tmp_path / "ds"
    old = build_datastore(tiny_lm, PassageSource(PASSAGES[:4], tiny_lm, batch_size=3), root)
    child(DRESD_BUILD, tiny_lm_path, root, KillAt("replace", r"CURRENT$"))
    live = DresdDatastore.open(root, tiny_lm)
    assert live.vdir == old.vdir and live.n_passages == 4
    ds = build_datastore(tiny_lm, PassageSource(PASSAGES, tiny_lm, batch_size=3), root)
    assert ds.n_passages == len(PASSAGES)
    assert sorted(p.name for p in root.iterdir() if p.name != "CURRENT") == [ds.vdir.name]


# ---------------------------------------------------------------------------------- lazy cache


LAZY_FILL = """
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.lazy_cache import LazyKeyCache
cache = LazyKeyCache.open(root, lm)
for i in range(0, len(PASSAGES), 4):  # three queries' worth of passages, one put each
    ensure_keys(cache, lm, PASSAGES[i : i + 4], batch_size=2)
"""
QUESTIONS = ["What is the Roman Empire?", "What does the assert statement do?",
             "Where is Paris?", "What is a generator function in Python?"]


def _answers(lm, cache) -> list[tuple]:
    engine = NestEngine(lm, InMemoryRetriever(PASSAGES), cache, NestConfig())
    out = []
    for q in QUESTIONS:
        r = engine.generate(q, max_new_tokens=12)
        out.append((r.token_ids, r.text, [c.to_dict() for c in r.citations]))
    return out


def _cap(tiny_lm) -> int:
    """A cap that holds about 6 of the 10 passages: the fill evicts."""
    return sum(len(tiny_lm.tokenize(t)) for t in TEXTS) * (tiny_lm.key_dim * 2 + 12) * 6 // 10


@pytest.fixture(scope="module")
def clean_answers(tiny_lm, tmp_path_factory):
    keys = tmp_path_factory.mktemp("clean-lazy") / "keys"
    configure_lazy(keys, max_bytes=_cap(tiny_lm))
    with LazyKeyCache.open(keys, tiny_lm) as cache:
        for i in range(0, len(PASSAGES), 4):
            ensure_keys(cache, tiny_lm, PASSAGES[i : i + 4], batch_size=2)
        return _answers(tiny_lm, cache)


LAZY_KILLS = [
    KillAt("replace", r"\.key$", n=6),  # second put: files renamed, no index row committed
    _slow(KillAt("fsync", r"[0-9a-f]{12}\.tmp$", n=3)),  # a key file written, not renamed
    _slow(KillAt("replace", r"\.key$", n=6, when="after")),
    _slow(KillAt("unlink", r"\.key$")),  # after a commit, while unlinking the evicted files
]


@pytest.mark.parametrize("kill", LAZY_KILLS, ids=str)
def test_lazy_cache_fill_killed_then_reopened_gives_identical_answers(
    tiny_lm, tiny_lm_path, tmp_path, clean_answers, kill
):
    keys = tmp_path / "keys"
    configure_lazy(keys, max_bytes=_cap(tiny_lm))
    child(LAZY_FILL, tiny_lm_path, keys, kill)
    with LazyKeyCache.open(keys, tiny_lm) as cache:
        held = cache.get_keys(PASSAGES)  # every entry left reads back whole, or not at all
        fresh = ensure_keys(InMemoryKeyStore(), tiny_lm, PASSAGES, batch_size=2)  # as the child
        for k, want in zip(held, fresh):
            if k is not None:
                _same(k, want, np.float16)
        # killed in the first put (fsync): nothing committed; later: the first put's entries
        assert any(k is not None for k in held) == (kill.func != "fsync")
        removed = cache.prune()
        data = list((cache.namespace_dir / "data").rglob("*"))
        files = [f for f in data if f.is_file()]
        assert not [f for f in files if not f.name.endswith(".key")], files  # no temp files
        assert len(files) == len(cache)  # no orphans, no row without its file
        assert cache.stats()["bytes_used"] == sum(f.stat().st_size for f in files)
        assert cache.stats()["bytes_used"] <= _cap(tiny_lm)
        if kill.func in ("fsync", "replace"):
            assert sum(removed.values()) >= 1, removed  # the dead writer's files were found
        assert _answers(tiny_lm, cache) == clean_answers


# ---------------------------------------------------------------------------------- key store


STORE_FILL = """
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.store import DiskKeyStore
store = DiskKeyStore.open(root, lm, codec=os.environ.get("CODEC") or None,
                          allow_new_namespace=bool(os.environ.get("CODEC")))
ensure_keys(store, lm, (LONG if os.environ.get("CODEC") else PASSAGES), batch_size=2)
"""
#: PASSAGES go into an fp16 store first; then LONG into a new int8 namespace of the same store
#: (its manifest created, then rewritten with the trained tables' fingerprint).


def _fill(tiny_lm_path, root, codec="", kill=None):
    run_child(CHILD + STORE_FILL, kill, TINY=str(tiny_lm_path), ROOT=str(root), CODEC=codec,
              REPO_TESTS=str(Path(__file__).parent))


@pytest.fixture(scope="module")
def clean_store(tiny_lm, tmp_path_factory):
    root = tmp_path_factory.mktemp("clean-store") / "keys"
    with DiskKeyStore.open(root, tiny_lm) as s:
        first = ensure_keys(s, tiny_lm, PASSAGES, batch_size=2)
    with DiskKeyStore.open(root, tiny_lm, codec="int8", allow_new_namespace=True) as s:
        second = ensure_keys(s, tiny_lm, LONG, batch_size=2)
    return first, second




STORE_KILLS = [
    ("second", KillAt("replace", r"/manifest\.json$")),  # the trained-codec rewrite
    _slow("first", KillAt("link", r"/store\.json$")),  # creating the root manifest
    _slow("first", KillAt("fsync", r"/manifest\.json\..*\.tmp$")),  # the fp16 ns manifest
    _slow("first", KillAt("link", r"/manifest\.json$")),
    _slow("second", KillAt("link", r"/manifest\.json$")),  # creating the int8 ns manifest
    _slow("second", KillAt("fsync", r"/manifest\.json\..*\.tmp$", n=2)),  # the rewrite's data
    _slow("second", KillAt("replace", r"/manifest\.json$", when="after")),
]


@pytest.mark.parametrize("phase, kill", STORE_KILLS, ids=lambda x: str(x))
def test_key_store_manifest_write_killed_loses_no_passage(
    tiny_lm, tiny_lm_path, tmp_path, clean_store, phase, kill
):
    root = tmp_path / "keys"
    first, second = clean_store
    if phase == "first":
        _fill(tiny_lm_path, root, kill=kill)
    with DiskKeyStore.open(root, tiny_lm) as s:  # (again, after a kill): the fp16 ingest
        ensure_keys(s, tiny_lm, PASSAGES, batch_size=2)
    if phase == "second":
        _fill(tiny_lm_path, root, codec="int8", kill=kill)
    for f in list(root.rglob("*.json")):  # every manifest there is whole
        json.loads(f.read_text())
    with DiskKeyStore.open(root, tiny_lm) as s:  # no passage of the committed ingest is lost
        for got, want in zip(s.get_keys(PASSAGES), first):
            _same(got, want)
    with DiskKeyStore.open(root, tiny_lm, codec="int8", allow_new_namespace=True) as s:
        assert all(k is None for k in s.get_keys(LONG))  # none half-written
        got = ensure_keys(s, tiny_lm, LONG, batch_size=2)  # finish the ingest
        for g, want in zip(got, second):
            _same(g, want)
        for g, want in zip(s.get_keys(LONG), second):
            _same(g, want)
