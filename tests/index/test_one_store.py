"""One store, both backends (issue 55 item 1): a collection ingested once serves torch and
llama.cpp. Keys live per (model fingerprint, key source) namespace; a model of the backend that
has no namespace yet gets its own, filled on first use by the engine, or all at once by
``nest ingest --backend ...`` without PATHs (keys only, no passage added). Another model or key
source of a backend present is still refused, and no refusal writes anything.

Quick tests use ``FakeLM``s named as each backend names its models; the end-to-end test ingests
a small file with the real default model on torch and asks on the real llama.cpp backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.keys import ensure_keys
from nest_integrations.index.namespaces import admits, list_namespaces, read_store_manifest
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage
from tests.fakes import FakeLM

PASSAGES = [Passage(id=f"p{i}", text=f"passage {i} says something about topic {i}")
            for i in range(4)]


def backend_lm(backend: str, name: str = "SmolLM2-135M-Instruct", seed: int = 0,
               key_source: str = "ffn_input") -> FakeLM:
    """A FakeLM whose fingerprint reads as a model of ``backend`` (``namespaces``'s rule)."""
    lm = FakeLM(key_dim=16, seed=seed, key_source=key_source, name=name)
    tag = "llama.cpp-Q8_0-" if backend == "llama.cpp" else ""
    lm.fingerprint = f"{name}@{tag}{seed:016x}"
    return lm


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its bytes."""
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


def test_a_store_of_one_backend_admits_the_other_in_its_own_namespace(tmp_path: Path) -> None:
    """Keys of torch stay as they were; llama.cpp keys of the same passages go to a namespace
    of their own, and both read back their own keys."""
    torch_lm = backend_lm("torch")
    llama_lm = backend_lm("llama.cpp", seed=1, key_source="final_norm")
    with DiskKeyStore.open(tmp_path, torch_lm) as store:
        torch_keys = ensure_keys(store, torch_lm, PASSAGES)
    before = snapshot(tmp_path / "ns")
    with DiskKeyStore.open(tmp_path, llama_lm) as store:
        assert store.get_keys(PASSAGES) == [None] * len(PASSAGES)  # filled on first use
        llama_keys = ensure_keys(store, llama_lm, PASSAGES[:2])
        assert len(store) == 2
    after = snapshot(tmp_path / "ns")
    assert {k: v for k, v in after.items() if k in before} == before  # torch's untouched
    spaces = {n["fingerprint"]: n["key_source"] for n in list_namespaces(tmp_path)}
    assert spaces == {torch_lm.fingerprint: "ffn_input", llama_lm.fingerprint: "final_norm"}
    assert read_store_manifest(tmp_path)["fingerprint"] == torch_lm.fingerprint
    with DiskKeyStore.open(tmp_path, torch_lm) as store:
        got = store.get_keys(PASSAGES)
        assert all(np.array_equal(g.keys, k.keys) for g, k in zip(got, torch_keys))
    with DiskKeyStore.open(tmp_path, llama_lm) as store:
        got = store.get_keys(PASSAGES)
        assert got[2:] == [None, None]
        assert all(np.array_equal(g.keys, k.keys) for g, k in zip(got, llama_keys))
        assert not np.array_equal(got[0].keys, torch_keys[0].keys)


def test_another_model_of_a_backend_present_is_refused_without_writing(tmp_path: Path) -> None:
    """A second llama.cpp model (another GGUF) or a second torch model is refused once its
    backend has a namespace, naming what the store holds; nothing is written by the refusal."""
    torch_lm = backend_lm("torch")
    llama_lm = backend_lm("llama.cpp", seed=1, key_source="final_norm")
    for lm in (torch_lm, llama_lm):
        with DiskKeyStore.open(tmp_path, lm) as store:
            ensure_keys(store, lm, PASSAGES)
    before = snapshot(tmp_path)
    for other in (backend_lm("llama.cpp", name="other", seed=2, key_source="final_norm"),
                  backend_lm("torch", name="other", seed=3),
                  backend_lm("torch", key_source="block_input")):
        assert not admits(tmp_path, read_store_manifest(tmp_path), other)
        with pytest.raises(KeyStoreMismatchError) as err:
            DiskKeyStore.open(tmp_path, other)
        msg = str(err.value)
        assert other.fingerprint in msg and torch_lm.fingerprint in msg
        assert llama_lm.fingerprint in msg and "persist dir" in msg
    assert snapshot(tmp_path) == before


def test_a_refused_codec_writes_nothing_either(tmp_path: Path) -> None:
    """Asking the other backend's new namespace for another codec than the store's is refused
    before any write (the store's codec is the store's, whichever backend asks)."""
    torch_lm = backend_lm("torch")
    with DiskKeyStore.open(tmp_path, torch_lm) as store:
        ensure_keys(store, torch_lm, PASSAGES)
    before = snapshot(tmp_path)
    with pytest.raises(KeyStoreMismatchError, match="fp16.*int8"):
        DiskKeyStore.open(tmp_path, backend_lm("llama.cpp", seed=1, key_source="final_norm"),
                          codec="int8")
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------- end to end, real models


@pytest.mark.slow
def test_ingest_once_on_torch_then_ask_on_llama_cpp(tmp_path: Path, capsys) -> None:
    """``nest ingest`` on torch, then ``nest ask --backend llama.cpp`` on the same collection
    answers without re-ingesting: no passage is added, torch's keys are untouched, llama.cpp's
    namespace holds the passages the query retrieved; ``nest ingest --backend llama.cpp``
    without PATHs then encodes the rest (keys only) and ``nest info`` lists both namespaces."""
    pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")
    from nest_integrations import assembly, paths
    from nest_integrations.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "assert.md").write_text(
        "# The assert statement\n\nThe assert statement is a convenient way to insert debugging "
        "assertions into a program. When the expression is false, assert raises AssertionError."
        "\n", encoding="utf-8")
    (docs / "pass.md").write_text(
        "# The pass statement\n\npass is a null operation: when it is executed, nothing "
        "happens. It is useful as a placeholder.\n", encoding="utf-8")
    store = str(tmp_path / "store")
    keys = paths.keys_dir(store)
    assert main(["ingest", str(docs), "--persist-dir", store, "--backend", "torch",
                 "--dtype", "fp32", "--json"]) == 0
    ingested = json.loads(capsys.readouterr().out)
    n = ingested["passages"]
    assert n >= 2 and ingested["keys_added"] == n
    torch_ns = snapshot(keys / "ns")

    assert main(["ask", "What does the assert statement do?", "--persist-dir", store,
                 "--backend", "llama.cpp", "--max-new-tokens", "24", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"].strip() and result["stats"]["new_tokens"] > 0
    assert assembly.open_store(None, store).count() == n  # no passage duplicated
    spaces = {s["fingerprint"]: s for s in list_namespaces(keys)}
    llama = [f for f in spaces if "@llama.cpp-" in f]
    assert len(spaces) == 2 and len(llama) == 1 and spaces[llama[0]]["key_source"] == "final_norm"
    after = snapshot(keys / "ns")
    assert {k: v for k, v in after.items() if k in torch_ns} == torch_ns

    assert main(["ingest", "--persist-dir", store, "--backend", "llama.cpp", "--json"]) == 0
    filled = json.loads(capsys.readouterr().out)
    assert filled["passages"] == n and filled["added"] == 0
    assert assembly.open_store(None, store).count() == n
    assert main(["info", "--persist-dir", store, "--no-model", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    listed = {s["backend"]: s["n_passages"] for s in info["key_store"]["namespaces"]}
    assert listed == {"torch": n, "llama.cpp": n}

    # Bad input: an unknown collection is named, and no key is written.
    before = snapshot(keys)
    assert main(["ingest", "--persist-dir", store, "--collection", "nope", "--backend",
                 "llama.cpp"]) == 2
    assert "no collection 'nope'" in capsys.readouterr().err
    assert snapshot(keys) == before


def test_a_lazy_store_caches_each_backend_in_its_own_namespace(tmp_path: Path) -> None:
    """``--keys lazy``: each backend's keys go to a cache namespace of their own; a torch eager
    store left in the dir is read through by torch only."""
    from nest_integrations.index.lazy_cache import LazyKeyCache, lazy_cache_stats
    from nest_integrations.index.lazy_mode import configure_lazy

    keys = tmp_path / "keys"
    torch_lm = backend_lm("torch")
    llama_lm = backend_lm("llama.cpp", seed=1, key_source="final_norm")
    with DiskKeyStore.open(keys, torch_lm) as store:
        torch_keys = ensure_keys(store, torch_lm, PASSAGES[:2])
    configure_lazy(keys, max_bytes=10**6)
    with LazyKeyCache.open(keys, llama_lm) as cache:
        assert cache.source is None  # the eager store holds torch's keys, not llama.cpp's
        ensure_keys(cache, llama_lm, PASSAGES)
    with LazyKeyCache.open(keys, torch_lm) as cache:
        got = cache.get_keys(PASSAGES)
        assert all(np.array_equal(g.keys, k.keys) for g, k in zip(got, torch_keys))
        assert got[2:] == [None, None] and cache.source_hits == 2
    spaces = {s["fingerprint"]: s["n_entries"] for s in lazy_cache_stats(keys)["namespaces"]}
    assert spaces == {llama_lm.fingerprint: len(PASSAGES), torch_lm.fingerprint: 0}
