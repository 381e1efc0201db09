"""The ingest pipeline: load -> split -> add to Chroma -> fill token keys -> remove stale -> report.

The write side of a ``ChromaPassageStore`` (which only reads). The pipeline owns the model that
measures passages and computes their token keys; keys go to the on-disk key store of the
store's persist dir (``store.keys_dir``), shared by every collection there.

Usage::

    from nest_integrations.assembly import open_store, shared_model
    from nest_integrations.ingest import IngestPipeline

    store = open_store("docs")                                  # $NEST_HOME/store
    report = IngestPipeline(store, shared_model()).ingest(["docs/"], progress=True)
    print(report)                                               # idempotent on re-ingest
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from nest_integrations.ingest.documents import IngestIssue, load_documents
from nest_integrations.ingest.splitter import (
    MAX_PASSAGE_TOKENS,
    TokenCounter,
    default_token_counter,
    flatten_metadata,
    split_documents,
    token_counter_for,
)
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

#: Passages embedded and written per Chroma call (also capped by the client's max batch size).
WRITE_CHUNK = 256
#: Passages per ``ensure_keys`` call (bounds memory; keys are also batched inside).
KEYS_CHUNK = 64


@dataclass
class IngestReport:
    """What one ``ingest`` call did (``str()`` is a one-paragraph summary)."""

    collection: str
    location: str
    documents: int = 0
    #: documents with a title of their own (a heading, ``metadata.title`` or a top-level
    #: ``title``), not their id or file name: the title index finds only these by name
    titled: int = 0
    passages: int = 0
    added: int = 0
    unchanged: int = 0
    removed: int = 0
    tokens: int = 0
    keys_added: int = 0
    #: where the keys of this run were encoded: "local" (this process) or "ray"; "" without keys
    keys_encoder: str = ""
    #: encoding workers (Ray actors; 1 in-process; 0 when Ray had nothing to encode)
    key_workers: int = 0
    #: the persist dir's key mode after this run: "eager" or "lazy" (``--keys lazy``: keys are
    #: encoded at query time into an LRU cache, ``index.lazy_cache``)
    keys_mode: str = "eager"
    #: what was read, e.g. ``{"pdf": "1 (2 pages)", "text": "2 (1 cp1252)"}``: a wrong
    #: encoding guess or a PDF with missing pages shows here
    formats: dict[str, str] = field(default_factory=dict)
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
            f"{self.keys_added} passages newly encoded into the key store"
        )
        if self.keys_encoder == "ray":
            text += f" on Ray ({self.key_workers} workers)"
        text += f" ({self.seconds:.1f} s)"
        if self.issues:
            text += f"; {len(self.issues)} input(s) skipped"
        return text


class IngestPipeline:
    """Writes documents into a ``ChromaPassageStore`` and fills its token-key store.

    Args:
        store: the ``ChromaPassageStore`` to write (its collection is created on first write,
            in cosine space, with the registered ``NestEmbeddingFunction``).
        lm: the ``LanguageModel`` whose tokenizer measures passages and whose keys are stored;
            ``None`` uses the shared default model (``assembly.shared_model``) when keys are
            needed.
        with_keys: fill the key store (default True); without keys they are computed on
            first use by the engine.
        token_count: passage-length function; default ``lm``'s tokenizer, else the default
            model's tokenizer (loaded without the weights).
        max_passage_tokens: passage budget in tokens (NEST: 200).
        ray_address: encode the token keys on Ray (``ingest.ray_keys``) instead of in this
            process: ``"local"`` starts a Ray instance here, ``"auto"`` or ``"HOST:PORT"``
            joins that cluster; ``None`` (default) encodes in-process.
        ray_workers: Ray encoding actors (default: one per GPU of the cluster, else per CPU).
        key_codec: how token keys are stored (``index.codecs``: ``"fp16"``, ``"fp32"``,
            ``"int8"``, ``"pq"``, or a ``KeyCodec``); ``None`` (default) uses the key store's
            recorded codec, fp16 for a new store. Another codec than the store's is refused.
        keys: ``"lazy"`` records lazy key mode for the persist dir (no keys encoded at ingest;
            ``index.lazy_cache``: encoded at query time into an LRU cache of
            ``key_cache_size``, with ``key_codec``'s name, fp16 by default); ``"eager"`` switches
            a lazy dir back; ``None`` (default) keeps the recorded mode.
        key_cache_size: the lazy cache's byte cap (an int or ``"2GB"``); None keeps the
            recorded cap (``lazy_mode.DEFAULT_MAX_BYTES`` for a new one).
    """

    def __init__(
        self,
        store: Any,
        lm: Any = None,
        *,
        with_keys: bool = True,
        token_count: TokenCounter | None = None,
        max_passage_tokens: int = MAX_PASSAGE_TOKENS,
        ray_address: str | None = None,
        ray_workers: int | None = None,
        key_codec: Any = None,
        keys: str | None = None,
        key_cache_size: int | str | None = None,
    ) -> None:
        if keys not in (None, "eager", "lazy"):
            raise ValueError(f"keys={keys!r} is invalid: allowed 'eager', 'lazy' or None")
        self.store = store
        self.keys = keys
        self.key_cache_size = key_cache_size
        self.key_codec = key_codec
        self.lm = lm
        self.with_keys = with_keys
        self.token_count = token_count
        self.max_passage_tokens = max_passage_tokens
        self.ray_address = ray_address
        self.ray_workers = ray_workers
        self._key_run = ("local", 1)  # (encoder, workers) of the last _fill_keys

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
        from disk are not pruned: use ``delete_documents``). Bad inputs are skipped and listed
        in ``report.issues``; with ``strict=True`` the first one raises ``IngestError`` before
        anything is written.

        ``sources``, ``texts``, ``ids``, ``metadatas``, ``strict`` and ``progress`` are those of
        ``nest_integrations.ingest.load_documents``; ``with_keys`` overrides the pipeline's.
        """
        start = time.perf_counter()
        docs, issues = load_documents(
            sources, texts=texts, ids=ids, metadatas=metadatas, strict=strict, progress=progress
        )
        report = IngestReport(self.store.collection_name, self.store.location, issues=issues)
        report.documents = len(docs)
        report.titled = sum(1 for d in docs if d.title and d.title not in (d.doc_id, d.source))
        report.formats = describe_formats(docs)
        keys = self.with_keys if with_keys is None else with_keys
        lazy = self.key_mode() == "lazy"
        keys = keys and not lazy  # lazy mode: keys are encoded at query time
        passages = split_documents(
            docs, self._token_counter(keys), self.max_passage_tokens, progress
        )
        report.passages = len(passages)
        report.tokens = sum(int(p.metadata.get("n_tokens", 0)) for p in passages)
        if docs:
            report.keys_mode = self._apply_key_mode(lazy, passages)
            if keys:
                self.key_store().close()  # refuse a key store of another model before writing
                if self.ray_address is not None:  # no Ray there: fail before writing
                    from nest_integrations.ingest.ray_keys import check_ray_address

                    check_ray_address(self.ray_address)
            report.added, report.unchanged = self._write(passages, progress)
            # A file with a bad line keeps its old passages: bad input never deletes data.
            damaged = {f"file:{i.location}" for i in issues}
            report.removed = self._remove_stale(docs, passages, damaged)
            self.store.title_index(refresh=True)  # kept with the store (retrieval.titles)
            if keys:
                report.keys_added = self._fill_keys(passages, progress)
                report.keys_encoder, report.key_workers = self._key_run
            elif not lazy and getattr(self.key_codec, "name", self.key_codec) in ("int8", "pq"):
                # --no-keys with a trained codec: train it now on a sample of the corpus, so
                # that the first query does not train it on just the passages it retrieved.
                with self.key_store() as store:
                    self._train_codec(store, passages)
        report.seconds = time.perf_counter() - start
        LOG.info("ingest: %s", report)
        return report

    def fill_keys(self, *, progress: bool = False) -> IngestReport:
        """Encode the token keys of every passage of the collection that has none for this
        pipeline's model, adding no passage: how a store ingested on one backend gets the other
        backend's keys in one pass (``nest ingest --backend llama.cpp`` without PATHs; the
        engine otherwise encodes them as queries retrieve passages). In lazy key mode nothing
        is encoded (keys are encoded at query time)."""
        start = time.perf_counter()
        report = IngestReport(self.store.collection_name, self.store.location)
        if not self.store.exists():
            raise ValueError(
                f"no collection {self.store.collection_name!r} at {self.store.location} to add "
                "token keys to: ingest documents first (`nest ingest PATH...` or `--sample`)"
            )
        passages = list(self.store.iter_passages())
        report.passages = report.unchanged = len(passages)
        report.tokens = sum(int(p.metadata.get("n_tokens", 0)) for p in passages)
        report.keys_mode = self.key_mode()
        if report.keys_mode == "eager" and passages:
            report.keys_added = self._fill_keys(passages, progress)
            report.keys_encoder, report.key_workers = self._key_run
        report.seconds = time.perf_counter() - start
        LOG.info("token keys: %s", report)
        return report

    def add_passages(
        self, passages: Sequence[Passage], *, progress: bool = False, with_keys: bool | None = None
    ) -> tuple[int, int]:
        """Store ready-made passages (ids, text, metadata kept as given; metadata made
        Chroma-safe). Returns ``(added, unchanged)``. Nothing is replaced or deleted."""
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
        self.store.title_index(refresh=True)
        if (self.with_keys if with_keys is None else with_keys) and self.key_mode() == "eager":
            self._fill_keys(prepared, progress)
        return added, unchanged

    def delete_documents(self, doc_ids: Sequence[str]) -> int:
        """Delete every passage of the given documents (e.g. files removed from disk, which
        ``ingest`` does not prune). Returns the number of passages deleted."""
        col = self._collection()
        doomed: list[str] = []
        for chunk in _chunks(list(doc_ids), 100):
            where = {"doc_id": chunk[0]} if len(chunk) == 1 else {"doc_id": {"$in": list(chunk)}}
            doomed += col.get(where=where, include=[])["ids"]
        for chunk in _chunks(doomed, self.store.max_batch_size):
            col.delete(ids=list(chunk))
        self.store.title_index(refresh=True)
        return len(doomed)

    def delete_collection(self) -> None:
        """Drop the collection (token keys are shared by content and stay)."""
        self.store.client.delete_collection(self.store.collection_name)
        self.store.reopen()
        path = self.store.titles_path()
        if path is not None:
            path.unlink(missing_ok=True)

    def key_mode(self) -> str:
        """``"lazy"`` or ``"eager"``: the requested mode, else the persist dir's recorded one."""
        from nest_integrations.index.lazy_mode import read_mode

        if self.keys is not None:
            return self.keys
        return "lazy" if read_mode(self.store.keys_dir) is not None else "eager"

    def _apply_key_mode(self, lazy: bool, passages: Sequence[Passage]) -> str:
        """Record the key mode in the persist dir (lazy: cap, codec; a trained codec is trained
        on a sample of ``passages``); an explicit ``keys="eager"`` switches a lazy dir back."""
        from nest_integrations.index import lazy_mode
        from nest_integrations.index.lazy_cache import prune_all

        if not lazy:
            if self.keys == "eager":
                lazy_mode.set_eager_mode(self.store.keys_dir)
            return "eager"
        codec = getattr(self.key_codec, "name", self.key_codec)
        record = lazy_mode.configure_lazy(
            self.store.keys_dir, max_bytes=self.key_cache_size, codec=codec
        )
        lazy_mode.train_lazy_codec(self.store.keys_dir, self._lm, record["codec"], passages)
        prune_all(self.store.keys_dir)  # a lowered cap applies now
        return "lazy"

    def key_store(self) -> Any:
        """The ``DiskKeyStore`` of the store's persist dir for this LM (loads it if needed)."""
        from nest_integrations.index.store import DiskKeyStore

        return DiskKeyStore.open(self.store.keys_dir, self._lm(), codec=self.key_codec)

    # ----------------------------------------------------------------------------- internals

    def _collection(self) -> Any:
        """The collection for writing (``ChromaPassageStore.writable_collection``)."""
        return self.store.writable_collection()

    def _write(self, passages: Sequence[Passage], progress: bool) -> tuple[int, int]:
        """Add passages not stored yet (embedding only those). Returns ``(added, unchanged)``."""
        from tqdm.auto import tqdm

        col = self._collection()
        batch = self.store.max_batch_size
        present: set[str] = set()
        for chunk in _chunks([p.id for p in passages], batch):
            present.update(col.get(ids=list(chunk), include=[])["ids"])
        new = [p for p in passages if p.id not in present]
        embedder = self.store.embedding_function.embedder
        with tqdm(
            total=len(new), desc="embedding", unit="passage", disable=not progress or not new
        ) as bar:
            for chunk in _chunks(new, max(1, min(WRITE_CHUNK, batch))):
                col.add(
                    ids=[p.id for p in chunk],
                    embeddings=embedder.embed([p.text for p in chunk]),
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
        col = self._collection()
        batch = self.store.max_batch_size
        current = {p.id for p in passages}
        scopes = sorted({d.scope or f"doc:{d.doc_id}" for d in docs} - set(keep))
        stale: list[str] = []
        for chunk in _chunks(scopes, 100):
            where = {"nest_scope": chunk[0]} if len(chunk) == 1 else {"nest_scope": {"$in": chunk}}
            offset = 0
            while True:
                res = col.get(where=where, limit=batch, offset=offset, include=[])
                if not res["ids"]:
                    break
                stale.extend(i for i in res["ids"] if i not in current)
                offset += len(res["ids"])
        for chunk in _chunks(stale, batch):
            col.delete(ids=list(chunk))
        if stale:
            LOG.info("removed %d outdated passages", len(stale))
        return len(stale)

    def _fill_keys(self, passages: Sequence[Passage], progress: bool) -> int:
        """Encode and store token keys of passages that have none. Returns how many were new."""
        from tqdm.auto import tqdm

        from nest_integrations.index.keys import ensure_keys

        lm = self._lm()
        if self.ray_address is not None:
            from nest_integrations.ingest.ray_keys import encode_keys_on_ray

            with self.key_store() as store:
                run = encode_keys_on_ray(
                    store, lm, passages, address=self.ray_address,
                    workers=self.ray_workers, progress=progress,
                )  # fmt: skip
            self._key_run = ("ray", run.workers)
            return run.encoded
        self._key_run = ("local", 1)
        # Similar lengths side by side: the LM's padded batches then waste little compute.
        ordered = sorted(passages, key=lambda p: int(p.metadata.get("n_tokens") or len(p.text)))
        with self.key_store() as store:
            before = len(store)
            self._train_codec(store, passages)  # int8/pq: on a shuffled sample, not the shortest
            with tqdm(
                total=len(passages), desc="token keys", unit="passage", disable=not progress
            ) as bar:
                for chunk in _chunks(ordered, KEYS_CHUNK):
                    ensure_keys(store, lm, list(chunk), batch_size=16)
                    bar.update(len(chunk))
            return len(store) - before

    def _train_codec(self, store: Any, passages: Sequence[Passage]) -> None:
        """Train a trained codec (int8, pq) that is not trained yet on a seeded shuffle of
        ``passages`` (their keys are stored too), so its tables see the whole corpus."""
        import random

        from nest_integrations.index.keys import train_codec

        if not passages or not getattr(store.codec, "needs_training", False):
            return
        if store.codec_ready():
            return
        shuffled = list(passages)
        random.Random(0).shuffle(shuffled)
        train_codec(store, self._lm(), shuffled)

    def _token_counter(self, keys: bool) -> TokenCounter:
        if self.token_count is not None:
            return self.token_count
        if self.lm is not None or keys:
            return token_counter_for(self._lm())
        return default_token_counter()

    def _lm(self) -> Any:
        if self.lm is None:
            from nest_integrations import assembly

            LOG.info("loading the default language model for token keys")
            self.lm = assembly.shared_model()
        return self.lm


def describe_formats(docs: Sequence[Any]) -> dict[str, str]:
    """Documents per source format, with PDF page totals and the non-UTF-8 encodings used."""
    by: dict[str, list[Any]] = {}
    for d in docs:
        by.setdefault(d.source_format, []).append(d)
    out: dict[str, str] = {}
    for fmt, group in sorted(by.items()):
        notes = []
        pages = sum(d.page_count or 0 for d in group)
        if pages:
            notes.append(f"{pages:,} pages")
        encodings: dict[str, int] = {}
        for d in group:
            if d.encoding and d.encoding not in ("utf-8", "ascii"):
                encodings[d.encoding] = encodings.get(d.encoding, 0) + 1
        notes += [f"{n:,} {e}" for e, n in sorted(encodings.items())]
        out[fmt] = f"{len(group):,}" + (f" ({', '.join(notes)})" if notes else "")
    return out


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


__all__ = ["IngestPipeline", "IngestReport"]
