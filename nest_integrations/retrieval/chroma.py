"""Chroma-backed passage store: NEST stage-1 retrieval (read-only; no model inside).

Passages (<= ~200 LM tokens, see ``nest_integrations.ingest``) are Chroma records: id = passage
id, document = passage text, metadata = ``doc_id``, ``passage_id``, ``source``, ``title``,
``chunk_index``, ``char_start``, ``char_end``, ``n_tokens``, ``nest_scope`` and the user's own
keys. Query embeddings come from our embedder and are passed explicitly; collections carry the
registered ``NestEmbeddingFunction``, so Chroma's downloading default never runs. Token keys are
*not* stored in Chroma: they live in the on-disk key store next to it
(``paths.keys_dir(persist_dir)``). Writing (splitting, adding, key filling, stale removal) is
the ingest pipeline's job: ``nest_integrations.ingest.IngestPipeline``.

Usage::

    store = ChromaPassageStore.from_persist_dir("store", collection="docs")
    passages = store.retrieve("how do I open a file?", k=5)

    ChromaPassageStore.from_url("http://localhost:8000", "docs")   # a `chroma run` server
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit

from nest_integrations import paths
from nest_integrations.embedders.minilm import NestEmbeddingFunction
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)


class CollectionNotFoundError(LookupError):
    """The collection does not exist; the message lists the existing ones."""


class ChromaConnectionError(ConnectionError):
    """A Chroma server could not be reached."""


class EmbeddingFunctionConflictError(ValueError):
    """The collection was made with another embedding function than NEST's (plain
    ``chromadb``'s ``default``, say); the message says how to use it. Nothing was changed."""


class InvalidCollectionNameError(ValueError):
    """A collection name that Chroma would refuse; the message states the rule."""


#: Chroma's rule for collection names (chromadb 1.x validates it in Rust).
COLLECTION_NAME_RULE = (
    "3-512 characters from [a-zA-Z0-9._-], starting and ending with a letter or digit, "
    "with no '..' and not an IPv4 address"
)
_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]", re.ASCII)


def validate_collection_name(name: Any) -> str:
    """``name`` if Chroma accepts it as a collection name, else ``InvalidCollectionNameError``
    naming the rule (checked before anything is created, so a bad name writes nothing)."""
    if not isinstance(name, str):
        raise InvalidCollectionNameError(
            f"collection name must be a string, got {type(name).__name__}"
        )
    if not _NAME_RE.fullmatch(name) or ".." in name or _is_ipv4(name):
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
        raise InvalidCollectionNameError(
            f"invalid collection name {shown}: a Chroma collection name has "
            f"{COLLECTION_NAME_RULE} (e.g. 'my-docs')"
        )
    return name


def _is_ipv4(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


class ChromaPassageStore:
    """A Chroma collection of NEST passages, read-only (implements ``PassageRetriever``).

    Constructors do no I/O; use the classmethods to build a client::

        ChromaPassageStore.from_persist_dir(persist_dir, collection="docs")     # embedded
        ChromaPassageStore.from_url("http://localhost:8000", collection="docs")  # server
        ChromaPassageStore.from_client(client, collection="docs")                # your client

    ``nest_integrations.assembly.open_store`` picks one of these from (collection, persist_dir,
    chroma_url) with the package defaults; ``IngestPipeline(store, lm)`` writes into it.

    Args:
        client: a chromadb client (``PersistentClient``, ``HttpClient``, ...).
        collection: collection name (:data:`COLLECTION_NAME_RULE`; else
            ``InvalidCollectionNameError``, a ``ValueError``).
        persist_dir: the store folder whose ``keys/`` holds token keys (default
            ``$NEST_HOME/store``; for a server, keys still live locally).
        embedding_function: default ``NestEmbeddingFunction()`` (packaged all-MiniLM-L6-v2).
        location: how to name the store in messages (a path or URL).
    """

    def __init__(
        self,
        client: Any,
        collection: str,
        *,
        persist_dir: str | os.PathLike[str] | None = None,
        embedding_function: NestEmbeddingFunction | None = None,
        location: str | None = None,
    ) -> None:
        self.client = client
        self.collection_name = validate_collection_name(collection)
        self.persist_dir = Path(persist_dir) if persist_dir is not None else None
        self.embedding_function = embedding_function or NestEmbeddingFunction()
        self.location = location or "the given Chroma client"
        self._titles: Any = None  # the collection's title index, loaded on first use
        self._collection: Any = None
        self._max_batch: int | None = None

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str | os.PathLike[str] | None,
        collection: str,
        **kwargs: Any,
    ) -> "ChromaPassageStore":
        """An embedded ``PersistentClient`` at ``paths.chroma_dir(persist_dir)`` (default
        ``$NEST_HOME/store/chroma``)."""
        import chromadb

        validate_collection_name(collection)  # before the store folder is created
        root = paths.persist_root(persist_dir)
        folder = paths.chroma_dir(root)
        paths.ensure_dir(folder)
        client = chromadb.PersistentClient(path=str(folder), settings=_settings())
        return cls(client, collection, persist_dir=root, location=str(folder), **kwargs)

    @classmethod
    def from_url(
        cls,
        url: str,
        collection: str,
        *,
        persist_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> "ChromaPassageStore":
        """An ``HttpClient`` for a Chroma server (``chroma run``) at ``url``, e.g.
        ``http://localhost:8000``. Token keys stay in ``persist_dir``/keys on this machine."""
        import chromadb

        validate_collection_name(collection)
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
        root = paths.persist_root(persist_dir)
        return cls(client, collection, persist_dir=root, location=url, **kwargs)

    @classmethod
    def from_client(cls, client: Any, collection: str, **kwargs: Any) -> "ChromaPassageStore":
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

    def stored_embeddings(self, ids: Sequence[str]) -> list[Any] | None:
        """The stored vectors of passages ``ids`` (the ones stage 1 ranked them by), in order;
        None when one is missing (the answer policy's relevance gate reads them instead of
        embedding the passages again)."""
        if not ids:
            return []
        res = self._read_collection().get(ids=list(ids), include=["embeddings"])
        found = dict(zip(res["ids"], res["embeddings"], strict=True))
        return [found[i] for i in ids] if all(i in found for i in ids) else None

    def passages_titled(self, titles: Sequence[str], limit: int = 32) -> list[Passage]:
        """Up to ``limit`` stored passages whose metadata ``title`` is one of ``titles``
        (exact match: the answer policy looks a named document up here, ``policy.answer``)."""
        titles = [str(t) for t in titles if str(t)]
        if not titles or limit < 1:
            return []
        col = self._read_collection()
        where = {"title": titles[0]} if len(titles) == 1 else {"title": {"$in": titles}}
        res = col.get(where=where, limit=int(limit), include=["documents", "metadatas"])
        return [
            _passage(pid, text, meta, None)
            for pid, text, meta in zip(res["ids"], res["documents"], res["metadatas"], strict=True)
        ]

    def title_index(self, refresh: bool = False) -> Any:
        """The collection's ``retrieval.titles.TitleIndex`` (document id -> title), kept in
        ``<persist dir>/titles/<collection>.json``: built at ingest (``refresh=True``), and
        rebuilt from the stored metadata whenever the collection's passage count differs from
        the one it was built at (a store written by other tools, or a server's)."""
        from nest_integrations.retrieval.titles import TitleIndex

        count = self.count()
        if not refresh and self._titles is not None and self._titles.count == count:
            return self._titles
        path = self.titles_path()
        index = None if refresh or path is None else TitleIndex.load(path)
        if index is None or index.count != count:
            titles: dict[str, str] = {}
            for pid, meta in self._iter_metadata():
                title = str(meta.get("title") or "")
                if title:
                    titles.setdefault(str(meta.get("doc_id") or pid), title)
            index = TitleIndex(titles, count)
            if path is not None:
                try:
                    index.save(path)
                except OSError as exc:  # a read-only store: the index still serves this process
                    LOG.warning("could not save the title index at %s: %s", path, exc)
        self._titles = index
        return index

    def titles_path(self) -> Path | None:
        """Where the title index is kept (None for a store without a persist dir)."""
        if self.persist_dir is None:
            return None
        return self.persist_dir / "titles" / f"{self.collection_name}.json"

    def _iter_metadata(self) -> Iterator[tuple[str, dict[str, Any]]]:
        col = self._read_collection()
        offset = 0
        while True:
            res = col.get(limit=self.max_batch_size, offset=offset, include=["metadatas"])
            if not res["ids"]:
                return
            yield from zip(res["ids"], (m or {} for m in res["metadatas"]))
            offset += len(res["ids"])

    def get_passages(self, ids: Sequence[str]) -> list[Passage]:
        """Passages by id, in the order given; unknown ids are left out."""
        col = self._read_collection()
        found: dict[str, Passage] = {}
        for chunk in _chunks(list(ids), self.max_batch_size):
            res = col.get(ids=chunk, include=["documents", "metadatas"])
            for pid, text, meta in zip(res["ids"], res["documents"], res["metadatas"], strict=True):
                found[pid] = _passage(pid, text, meta, None)
        return [found[i] for i in ids if i in found]

    def iter_passages(self, batch_size: int | None = None) -> Iterator[Passage]:
        """Every passage in the collection (e.g. to build a BM25 index for hybrid search)."""
        col = self._read_collection()
        size = batch_size or self.max_batch_size
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
        offset, size = 0, self.max_batch_size
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

    @property
    def keys_dir(self) -> Path:
        """Folder of the token-key store (``<persist_dir>/keys``)."""
        return paths.keys_dir(paths.persist_root(self.persist_dir))

    @property
    def max_batch_size(self) -> int:
        """Records per Chroma call that the client accepts (asked once)."""
        if self._max_batch is None:
            self._max_batch = int(self.client.get_max_batch_size())
        return self._max_batch

    def with_collection(self, collection: str) -> "ChromaPassageStore":
        """The same client and store folder, another collection."""
        return type(self)(
            self.client,
            collection,
            persist_dir=self.persist_dir,
            embedding_function=self.embedding_function,
            location=self.location,
        )

    def reopen(self) -> None:
        """Forget the cached collection handle (after the collection was dropped or created)."""
        self._collection = None
        self._titles = None

    # ----------------------------------------------------------------------------- internals

    def writable_collection(self) -> Any:
        """The collection for writing, created (cosine space) when missing; one made with
        another embedding function raises ``EmbeddingFunctionConflictError`` and is left as
        it is."""
        try:
            col = self.client.get_or_create_collection(
                self.collection_name,
                embedding_function=self.embedding_function,
                configuration={"hnsw": {"space": "cosine"}},
            )
        except ValueError as exc:
            raise self._conflict(exc) from exc
        self.reopen()  # the reader reopens it (it may have been missing until now)
        return col

    def _conflict(self, exc: ValueError) -> ValueError:
        """Chroma's "Embedding function conflict" as an ``EmbeddingFunctionConflictError``
        that says what to do (any other ``ValueError`` is returned as it is)."""
        found = re.search(r"Embedding function conflict: new: \S+ vs persisted: (\S+)", str(exc))
        if found is None:
            return exc
        name, theirs, ours = self.collection_name, found.group(1), self.embedding_function.name()
        try:  # read without an embedding function: no conflict, nothing embedded or written
            records = int(self.client.get_collection(name, embedding_function=None).count())
        except Exception:  # noqa: BLE001 - the count only words the advice
            records = -1
        if records == 0:
            client = ("chromadb.HttpClient(...)" if "://" in self.location else
                      f"chromadb.PersistentClient(path={self.location!r})")
            fix = (f"It is empty: delete it (in Python, `{client}.delete_collection({name!r})`) "
                   f"and run `nest ingest PATH... --collection "
                   f"{name}` again, or ingest into a new collection: `nest ingest PATH... "
                   f"--collection {name}-nest`.")
        else:
            held = f"It holds {records:,} records" if records > 0 else "It may hold records"
            fix = (f"{held}, embedded by {theirs!r}: ingest their documents into a new "
                   f"collection with `nest ingest PATH... --collection {name}-nest` and use "
                   "that one.")
        return EmbeddingFunctionConflictError(
            f"collection {name!r} in {self.location} was made with the embedding function "
            f"{theirs!r} (e.g. by plain chromadb), not NEST's {ours!r}; NEST left it as it is. "
            f"{fix} To make collections for NEST in your own code, pass NEST's embedding: "
            "chromadb `embedding_function=NestEmbeddingFunction()` (from "
            "nest_integrations.embedders.minilm), langchain-chroma `embedding_function="
            "NestEmbeddings()`, LlamaIndex `embed_model=NestEmbedding()`."
        )

    def _read_collection(self) -> Any:
        """The collection, opened once; a missing one raises ``CollectionNotFoundError``, one
        made with another embedding function ``EmbeddingFunctionConflictError``."""
        if self._collection is None:
            from chromadb.errors import NotFoundError

            try:
                self._collection = self.client.get_collection(
                    self.collection_name, embedding_function=self.embedding_function
                )
            except ValueError as exc:  # chromadb's NotFoundError is not a ValueError
                raise self._conflict(exc) from exc
            except NotFoundError as exc:
                existing = self.list_collections()
                listed = ", ".join(repr(n) for n in existing) if existing else "none"
                raise CollectionNotFoundError(
                    f"no collection {self.collection_name!r} in {self.location} (existing: "
                    f"{listed}). Create it with `nest ingest PATH... --collection "
                    f"{self.collection_name}` (or `nest ingest --sample`)."
                ) from exc
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
