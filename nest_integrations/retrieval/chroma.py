"""Chroma-backed passage store: NEST stage-1 retrieval plus corpus ingestion.

Passages (<= ~200 LM tokens, see ``nest_integrations.ingest``) are Chroma records: id = passage
id, document = passage text, metadata = ``doc_id``, ``passage_id``, ``source``, ``title``,
``chunk_index``, ``char_start``, ``char_end``, ``n_tokens``, ``nest_scope`` and the user's own
keys. Embeddings always come from our embedder and are passed explicitly; collections are created
with the registered ``NestEmbeddingFunction`` (cosine space), so Chroma's downloading default
never runs. Token keys are *not* stored in Chroma: ingest fills the on-disk key store next to it
(``paths.keys_dir(persist_dir)``).

Usage::

    store = ChromaPassageStore.from_persist_dir("store", collection="docs")
    report = store.ingest(["docs/"], progress=True)       # idempotent; replaces changed files
    passages = store.retrieve("how do I open a file?", k=5)

    ChromaPassageStore.from_url("http://localhost:8000", "docs")   # a `chroma run` server
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import urlsplit

from nest_integrations import paths
from nest_integrations.embeddings import NestEmbeddingFunction
from nest_integrations.ingest import (
    MAX_PASSAGE_TOKENS,
    IngestIssue,
    TokenCounter,
    default_token_counter,
    load_documents,
    split_documents,
    token_counter_for,
)
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

#: Passages embedded and written per Chroma call (also capped by the client's max batch size).
WRITE_CHUNK = 256
#: Passages per ``ensure_keys`` call during ingest (bounds memory; keys are also batched inside).
KEYS_CHUNK = 64


class CollectionNotFoundError(LookupError):
    """The collection does not exist; the message lists the existing ones."""


class ChromaConnectionError(ConnectionError):
    """A Chroma server could not be reached."""


@dataclass
class IngestReport:
    """What one ``ingest`` call did (``str()`` is a one-paragraph summary)."""

    collection: str
    location: str
    documents: int = 0
    passages: int = 0
    added: int = 0
    unchanged: int = 0
    removed: int = 0
    tokens: int = 0
    keys_added: int = 0
    issues: list[IngestIssue] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["issues"] = [str(i) for i in self.issues]
        return d

    def __str__(self) -> str:
        text = (
            f"{self.documents} documents -> {self.passages} passages ({self.tokens} tokens) in "
            f"collection {self.collection!r} at {self.location}: {self.added} added, "
            f"{self.unchanged} unchanged, {self.removed} removed; "
            f"{self.keys_added} passages newly encoded into the key store ({self.seconds:.1f} s)"
        )
        if self.issues:
            text += f"; {len(self.issues)} input(s) skipped"
        return text


class ChromaPassageStore:
    """A Chroma collection of NEST passages (implements ``PassageRetriever``).

    Constructors do no I/O; use the classmethods to build a client::

        ChromaPassageStore.from_persist_dir(persist_dir=None, collection="nest")   # embedded
        ChromaPassageStore.from_url("http://localhost:8000", collection="nest")    # server
        ChromaPassageStore.from_client(client, collection="nest")                  # your client

    Args:
        client: a chromadb client (``PersistentClient``, ``HttpClient``, ...).
        collection: collection name (3-512 chars of ``[a-zA-Z0-9._-]``).
        persist_dir: the store folder whose ``keys/`` holds token keys (default
            ``$NEST_HOME/store``; for a server, keys still live locally).
        embedding_function: default ``NestEmbeddingFunction()`` (packaged all-MiniLM-L6-v2).
        lm: the ``LanguageModel`` whose tokenizer measures passages and whose keys are stored;
            ``None`` loads ``HFLanguageModel.from_default()`` when keys are needed.
        with_keys: fill the key store during ingest (default True).
        token_count: passage-length function; default ``lm``'s tokenizer, else the default
            model's tokenizer (loaded without the weights).
        max_passage_tokens: passage budget in tokens (NEST: 200).
        location: how to name the store in messages (a path or URL).
    """

    def __init__(
        self,
        client: Any,
        collection: str = "nest",
        *,
        persist_dir: str | os.PathLike[str] | None = None,
        embedding_function: NestEmbeddingFunction | None = None,
        lm: Any = None,
        with_keys: bool = True,
        token_count: TokenCounter | None = None,
        max_passage_tokens: int = MAX_PASSAGE_TOKENS,
        location: str | None = None,
    ) -> None:
        self.client = client
        self.collection_name = collection
        self.persist_dir = Path(persist_dir) if persist_dir is not None else None
        self.embedding_function = embedding_function or NestEmbeddingFunction()
        self.lm = lm
        self.with_keys = with_keys
        self.token_count = token_count
        self.max_passage_tokens = max_passage_tokens
        self.location = location or "the given Chroma client"
        self._collection: Any = None
        self._max_batch: int | None = None

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str | os.PathLike[str] | None = None,
        collection: str = "nest",
        **kwargs: Any,
    ) -> "ChromaPassageStore":
        """An embedded ``PersistentClient`` at ``paths.chroma_dir(persist_dir)`` (default
        ``$NEST_HOME/store/chroma``)."""
        import chromadb

        root = Path(persist_dir) if persist_dir is not None else paths.default_persist_dir()
        folder = paths.chroma_dir(root)
        folder.mkdir(parents=True, exist_ok=True)
        client = chromadb.PersistentClient(path=str(folder), settings=_settings())
        return cls(client, collection, persist_dir=root, location=str(folder), **kwargs)

    @classmethod
    def from_url(
        cls,
        url: str,
        collection: str = "nest",
        *,
        persist_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> "ChromaPassageStore":
        """An ``HttpClient`` for a Chroma server (``chroma run``) at ``url``, e.g.
        ``http://localhost:8000``. Token keys stay in ``persist_dir``/keys on this machine."""
        import chromadb

        host, port, ssl = parse_chroma_url(url)
        try:
            client = chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=_settings())
            client.heartbeat()
        except Exception as exc:  # chromadb raises many types for a dead server
            raise ChromaConnectionError(
                f"cannot reach a Chroma server at {url} ({type(exc).__name__}: {exc}). "
                f"Start one with `chroma run --path <db dir> --port {port}`, or drop "
                "--chroma-url to use the embedded store."
            ) from exc
        root = Path(persist_dir) if persist_dir is not None else paths.default_persist_dir()
        return cls(client, collection, persist_dir=root, location=url, **kwargs)

    @classmethod
    def from_client(
        cls, client: Any, collection: str = "nest", **kwargs: Any
    ) -> "ChromaPassageStore":
        """Wrap an existing chromadb client."""
        return cls(client, collection, **kwargs)

    # ----------------------------------------------------------------------------- reading

    def list_collections(self) -> list[str]:
        """Names of the collections in this Chroma database, sorted."""
        return sorted(_name(c) for c in self.client.list_collections())

    def exists(self) -> bool:
        return self.collection_name in self.list_collections()

    def count(self) -> int:
        """Number of passages in the collection."""
        return int(self._read_collection().count())

    def retrieve(self, query: str, k: int, where: dict[str, Any] | None = None) -> list[Passage]:
        """The ``k`` passages most similar to ``query``, best first; ``score`` is the cosine
        similarity (for a collection in another space, the matching similarity)."""
        col = self._read_collection()
        n = min(int(k), col.count())
        if n <= 0:
            return []
        emb = self.embedding_function.embedder.embed([query])
        res = col.query(
            query_embeddings=emb,
            n_results=n,
            where=where,
            include=["documents", "metadatas", "distances"],
        )
        space = _space(col)
        return [
            _passage(pid, text, meta, _similarity(dist, space))
            for pid, text, meta, dist in zip(
                res["ids"][0],
                res["documents"][0],
                res["metadatas"][0],
                res["distances"][0],
                strict=True,
            )
        ]

    def get_passages(self, ids: Sequence[str]) -> list[Passage]:
        """Passages by id, in the order given; unknown ids are left out."""
        col = self._read_collection()
        found: dict[str, Passage] = {}
        for chunk in _chunks(list(ids), self._batch()):
            res = col.get(ids=chunk, include=["documents", "metadatas"])
            for pid, text, meta in zip(res["ids"], res["documents"], res["metadatas"], strict=True):
                found[pid] = _passage(pid, text, meta, None)
        return [found[i] for i in ids if i in found]

    def iter_passages(self, batch_size: int | None = None) -> Iterator[Passage]:
        """Every passage in the collection (e.g. to build a BM25 index for hybrid search)."""
        col = self._read_collection()
        size = batch_size or self._batch()
        offset = 0
        while True:
            res = col.get(limit=size, offset=offset, include=["documents", "metadatas"])
            if not res["ids"]:
                return
            for pid, text, meta in zip(res["ids"], res["documents"], res["metadatas"], strict=True):
                yield _passage(pid, text, meta, None)
            offset += len(res["ids"])

    def stats(self) -> dict[str, Any]:
        """Passages, documents and tokens of the collection (reads all metadata)."""
        col = self._read_collection()
        docs: set[str] = set()
        tokens = passages = 0
        offset, size = 0, self._batch()
        while True:
            res = col.get(limit=size, offset=offset, include=["metadatas"])
            if not res["ids"]:
                break
            for meta in res["metadatas"]:
                meta = meta or {}
                passages += 1
                tokens += int(meta.get("n_tokens") or 0)
                docs.add(str(meta.get("doc_id", "")))
            offset += len(res["ids"])
        return {
            "collection": self.collection_name,
            "location": self.location,
            "passages": passages,
            "documents": len(docs),
            "tokens": tokens,
            "space": _space(col),
        }

    # ----------------------------------------------------------------------------- writing

    def ingest(
        self,
        sources: Iterable[Any] = (),
        *,
        texts: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
        metadatas: Sequence[dict[str, Any] | None] | None = None,
        strict: bool = False,
        progress: bool = False,
        with_keys: bool | None = None,
    ) -> IngestReport:
        """Load, split, embed and store documents; fill the token-key store.

        Idempotent: passages already stored are skipped, so re-ingesting unchanged inputs adds
        nothing. A changed file (or document) replaces its passages: new ones are written first,
        then the file's old passages that are not in the new set are deleted (files removed
        from disk are not pruned: use ``delete_documents``). Bad inputs are
        skipped and listed in ``report.issues``; with ``strict=True`` the first one raises
        ``IngestError`` before anything is written.

        Args:
            sources: paths (files/folders) and/or LangChain/LlamaIndex document objects; see
                ``nest_integrations.ingest.load_documents``.
            texts, ids, metadatas: raw strings as documents, with optional ids and metadata.
            strict: stop at the first bad input, writing nothing.
            progress: tqdm progress bars on stderr.
            with_keys: override the store's ``with_keys``.
        """
        start = time.perf_counter()
        docs, issues = load_documents(
            sources, texts=texts, ids=ids, metadatas=metadatas, strict=strict, progress=progress
        )
        report = IngestReport(self.collection_name, self.location, issues=issues)
        report.documents = len(docs)
        keys = self.with_keys if with_keys is None else with_keys
        passages = split_documents(
            docs, self._token_counter(keys), self.max_passage_tokens, progress
        )
        report.passages = len(passages)
        report.tokens = sum(int(p.metadata.get("n_tokens", 0)) for p in passages)
        if docs:
            if keys:
                self.key_store().close()  # refuse a key store of another model before writing
            report.added, report.unchanged = self._write(passages, progress)
            # A file with a bad line keeps its old passages: bad input never deletes data.
            damaged = {f"file:{i.location}" for i in issues}
            report.removed = self._remove_stale(docs, passages, damaged)
            if keys:
                report.keys_added = self._fill_keys(passages, progress)
        report.seconds = time.perf_counter() - start
        LOG.info("ingest: %s", report)
        return report

    def add_passages(
        self, passages: Sequence[Passage], *, progress: bool = False, with_keys: bool | None = None
    ) -> tuple[int, int]:
        """Store ready-made passages (ids, text, metadata kept as given; metadata made
        Chroma-safe). Returns ``(added, unchanged)``. Nothing is replaced or deleted."""
        from nest_integrations.ingest import flatten_metadata

        prepared = []
        for p in passages:
            meta = flatten_metadata(
                {
                    **p.metadata,
                    "doc_id": p.doc_id,
                    "char_start": p.char_start,
                    "char_end": p.char_end,
                }
            )
            prepared.append(dataclasses.replace(p, metadata=meta))
        added, unchanged = self._write(prepared, progress)
        if self.with_keys if with_keys is None else with_keys:
            self._fill_keys(prepared, progress)
        return added, unchanged

    def delete_documents(self, doc_ids: Sequence[str]) -> int:
        """Delete every passage of the given documents (e.g. files removed from disk, which
        ``ingest`` does not prune). Returns the number of passages deleted."""
        col = self._read_collection()
        doomed: list[str] = []
        for chunk in _chunks(list(doc_ids), 100):
            where = {"doc_id": chunk[0]} if len(chunk) == 1 else {"doc_id": {"$in": list(chunk)}}
            doomed += col.get(where=where, include=[])["ids"]
        for chunk in _chunks(doomed, self._batch()):
            col.delete(ids=list(chunk))
        return len(doomed)

    def delete_collection(self) -> None:
        """Drop the collection (token keys are shared by content and stay)."""
        self.client.delete_collection(self.collection_name)
        self._collection = None

    def key_store(self) -> Any:
        """The ``DiskKeyStore`` for this store's persist dir and LM (loads the LM if needed)."""
        from nest_integrations.index.store import DiskKeyStore

        return DiskKeyStore.open(self.keys_dir, self._lm())

    @property
    def keys_dir(self) -> Path:
        """Folder of the token-key store (``<persist_dir>/keys``)."""
        root = self.persist_dir if self.persist_dir is not None else paths.default_persist_dir()
        return paths.keys_dir(root)

    # ----------------------------------------------------------------------------- internals

    def _write(self, passages: Sequence[Passage], progress: bool) -> tuple[int, int]:
        """Add passages not stored yet (embedding only those). Returns ``(added, unchanged)``."""
        from tqdm.auto import tqdm

        col = self._write_collection()
        present: set[str] = set()
        for chunk in _chunks([p.id for p in passages], self._batch()):
            present.update(col.get(ids=chunk, include=[])["ids"])
        new = [p for p in passages if p.id not in present]
        step = max(1, min(WRITE_CHUNK, self._batch()))
        with tqdm(
            total=len(new), desc="embedding", unit="passage", disable=not progress or not new
        ) as bar:
            for chunk in _chunks(new, step):
                embeddings = self.embedding_function.embedder.embed([p.text for p in chunk])
                col.add(
                    ids=[p.id for p in chunk],
                    embeddings=embeddings,
                    documents=[p.text for p in chunk],
                    metadatas=[dict(p.metadata) for p in chunk],
                )
                bar.update(len(chunk))
        return len(new), len(passages) - len(new)

    def _remove_stale(
        self, docs: Sequence[Any], passages: Sequence[Passage], keep: Iterable[str] = ()
    ) -> int:
        """Delete passages of the ingested scopes (files/documents) that are not current;
        scopes in ``keep`` are left alone."""
        col = self._write_collection()
        current = {p.id for p in passages}
        scopes = sorted({d.scope or f"doc:{d.doc_id}" for d in docs} - set(keep))
        stale: list[str] = []
        for chunk in _chunks(scopes, 100):
            where = {"nest_scope": chunk[0]} if len(chunk) == 1 else {"nest_scope": {"$in": chunk}}
            offset, size = 0, self._batch()
            while True:
                res = col.get(where=where, limit=size, offset=offset, include=[])
                if not res["ids"]:
                    break
                stale.extend(i for i in res["ids"] if i not in current)
                offset += len(res["ids"])
        for chunk in _chunks(stale, self._batch()):
            col.delete(ids=chunk)
        if stale:
            LOG.info("removed %d outdated passages", len(stale))
        return len(stale)

    def _fill_keys(self, passages: Sequence[Passage], progress: bool) -> int:
        """Encode and store token keys of passages that have none. Returns how many were new."""
        from tqdm.auto import tqdm

        from nest_integrations.index.store import ensure_keys

        lm = self._lm()
        # Similar lengths side by side: the LM's padded batches then waste little compute.
        ordered = sorted(passages, key=lambda p: int(p.metadata.get("n_tokens") or len(p.text)))
        with self.key_store() as store:
            before = len(store)
            with tqdm(
                total=len(passages), desc="token keys", unit="passage", disable=not progress
            ) as bar:
                for chunk in _chunks(ordered, KEYS_CHUNK):
                    ensure_keys(store, lm, chunk, batch_size=16)
                    bar.update(len(chunk))
            return len(store) - before

    def _token_counter(self, keys: bool) -> TokenCounter:
        if self.token_count is not None:
            return self.token_count
        if self.lm is not None or keys:
            return token_counter_for(self._lm())
        return default_token_counter()

    def _lm(self) -> Any:
        if self.lm is None:
            from nest_integrations.lm.hf import HFLanguageModel

            LOG.info("loading the default language model for token keys")
            self.lm = HFLanguageModel.from_default()
        return self.lm

    def _batch(self) -> int:
        if self._max_batch is None:
            self._max_batch = int(self.client.get_max_batch_size())
        return self._max_batch

    def _read_collection(self) -> Any:
        if self._collection is None:
            from chromadb.errors import NotFoundError

            try:
                self._collection = self.client.get_collection(
                    self.collection_name, embedding_function=self.embedding_function
                )
            except NotFoundError as exc:
                existing = self.list_collections()
                listed = ", ".join(repr(n) for n in existing) if existing else "none"
                raise CollectionNotFoundError(
                    f"no collection {self.collection_name!r} in {self.location} (existing: "
                    f"{listed}). Create it with `nest ingest PATH... --collection "
                    f"{self.collection_name}` (or `nest ingest --sample`)."
                ) from exc
        return self._collection

    def _write_collection(self) -> Any:
        if self._collection is None:
            self._collection = self.client.get_or_create_collection(
                self.collection_name,
                embedding_function=self.embedding_function,
                configuration={"hnsw": {"space": "cosine"}},
            )
        return self._collection


# --------------------------------------------------------------------------------- helpers


def _settings() -> Any:
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


def parse_chroma_url(url: str) -> tuple[str, int, bool]:
    """``(host, port, ssl)`` of ``http(s)://host[:port]`` (a bare ``host:port`` is http)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"invalid Chroma URL {url!r}: expected http://HOST:PORT")
    ssl = parts.scheme == "https"
    try:
        port = parts.port or (443 if ssl else 8000)
    except ValueError as exc:
        raise ValueError(f"invalid port in Chroma URL {url!r}") from exc
    return parts.hostname, port, ssl


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _name(collection: Any) -> str:
    return collection if isinstance(collection, str) else str(collection.name)


def _space(collection: Any) -> str:
    config = getattr(collection, "configuration", None) or {}
    for section in ("hnsw", "spann"):
        if isinstance(config.get(section), dict) and config[section].get("space"):
            return str(config[section]["space"])
    return str((collection.metadata or {}).get("hnsw:space", "l2"))


def _similarity(distance: float, space: str) -> float:
    """Chroma distance -> similarity (higher is better). Our embeddings are unit norm, so for
    l2 (squared) distance cos = 1 - d/2."""
    if space == "l2":
        return 1.0 - float(distance) / 2.0
    return 1.0 - float(distance)  # cosine and ip distances are 1 - similarity


def _passage(
    pid: str, text: str | None, meta: dict[str, Any] | None, score: float | None
) -> Passage:
    meta = dict(meta or {})

    def _int(key: str) -> int | None:
        value = meta.get(key)
        return (
            int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        )

    return Passage(
        id=pid,
        text=text or "",
        doc_id=str(meta.get("doc_id", "")),
        score=score,
        char_start=_int("char_start"),
        char_end=_int("char_end"),
        metadata=meta,
    )
