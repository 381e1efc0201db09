"""The on-disk token-key store: NEST's stage-2 memory, precomputed per passage and persisted.

Passages are encoded on their own (NEST spec §5), so their keys can be computed once at ingest and
loaded at query time. Entries are addressed by (model fingerprint, key source, passage content
hash); the same text under two passage ids is stored once.

Layout under ``path``::

    store.json                     the model fingerprint + key source the store was built with,
                                   and its key codec (``key_codec``; absent in v1 stores: fp16)
    ns/<namespace>/manifest.json   one namespace per (fingerprint, key source, codec): key_dim,
                                   codec params and, once trained, the codec fingerprint
    ns/<namespace>/codec.npz       trained codec tables (int8, pq only)
    ns/<namespace>/index.sqlite    content_hash -> (shard, row_start, n_rows); committed shard sizes
    ns/<namespace>/000000.keys     (rows, code_size) uint8 codes of the keys, append-only (for
                                   fp16/fp32 the codes are the raw little-endian floats)
    ns/<namespace>/000000.ids      (rows,) int32 token ids; row j of a passage is token_ids[j]
    ns/<namespace>/000000.offs     (rows, 2) int32 char range of each token in the passage text

Write protocol: under sqlite's write lock (``BEGIN IMMEDIATE``, which also serialises writers in
other processes) a writer cuts each shard file back to its committed size, dropping rows that a
crashed writer appended but never indexed; appends the new rows; flushes and fsyncs them; and only
then inserts the index rows and the new committed size in one transaction. An index row therefore
never points at missing data, and committed rows are never rewritten.

Reads are one sqlite query plus one contiguous ``np.memmap`` slice per passage, decoded by the
codec (``nest_integrations.index.codecs``). Token ids and offsets are never compressed, so
citations are exact under every codec.

A trained codec (int8, pq) is trained once per namespace, on the keys of the first passages
``ensure_keys`` encodes (about ``codecs.WANT_TRAIN_ROWS`` rows), under the same write lock; its
tables are saved to ``codec.npz`` and then its fingerprint is recorded in the manifest (a store
is trained iff the manifest names a codec fingerprint). Format version 1 namespaces (``dtype``
float16/float32, no ``codec``) read as the fp16/fp32 codecs.

Example::

    store = DiskKeyStore.open(keys_dir(persist_dir), lm)
    memory = ensure_keys(store, lm, passages)     # encodes only passages not stored yet
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from nest_integrations.index import codecs as _codecs
from nest_integrations.index import _disk
from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.codecs import KeyCodec
from nest_integrations.types import Passage, PassageKeys

LOG = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: codec-coded keys (``codec`` in the manifest); 1: raw fp16/fp32
DTYPES = ("float16", "float32")
_DTYPE_CODECS = {"float16": "fp16", "float32": "fp32"}  # the v1 ``dtype=`` spelling
_RAW_CODECS = ("fp16", "fp32")  # these share the v1 namespace name
DEFAULT_SHARD_BYTES = 1 << 30  # keys bytes per shard file before a new one is started
_ID_DTYPE = np.dtype("<i4")
_OFF_DTYPE = np.dtype("<i4")
_NS_FIELDS = ("format_version", "fingerprint", "key_source", "key_dim", "dtype")
_Rows = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # keys, token ids, offsets, n_chars
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    content_hash TEXT PRIMARY KEY, shard INTEGER NOT NULL, row_start INTEGER NOT NULL,
    n_rows INTEGER NOT NULL, n_chars INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shards (shard INTEGER PRIMARY KEY, n_rows INTEGER NOT NULL);
"""

__all__ = [
    "DiskKeyStore",
    "KeyChunk",
    "KeyStoreCorruptError",
    "content_hash",
    "ensure_keys",
    "list_namespaces",
    "read_store_manifest",
    "train_codec",
]


class KeyStoreCorruptError(RuntimeError):
    """A key-store manifest or shard is missing, unreadable or inconsistent with the index."""


class KeyChunk(NamedTuple):
    """A run of consecutive stored rows, whole passages only (see ``DiskKeyStore.iter_all``)."""

    content_hashes: list[str]  # (n,) the content hash of each row's passage
    keys: np.ndarray  # (n, d) float32
    token_ids: np.ndarray  # (n,) int64, the value of each key
    positions: np.ndarray  # (n,) int32, row j of a passage has position j


def content_hash(text: str) -> str:
    """The address of a passage's keys: sha256 of its utf-8 text, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class DiskKeyStore:
    """Persistent token keys of passages for one (model fingerprint, key source) namespace.

    Implements the ``KeyStore`` port. Safe to share between threads and between processes.

    Open it for a language model (refuses a store built by another model or key source)::

        store = DiskKeyStore.open("store/keys", lm)
        keys = ensure_keys(store, lm, passages)      # list[PassageKeys], one per passage
        store.get_keys(passages)                     # later: cheap reads, None when absent

    Or name the namespace directly::

        store = DiskKeyStore("store/keys", fingerprint=lm.fingerprint, key_source="ffn_input",
                             key_dim=576)

    Args:
        path: Store root folder (created when absent).
        fingerprint: Model fingerprint (weights + tokenizer) the keys come from.
        key_source: The LM vector the keys are (``NestConfig.key_source``).
        key_dim: Key dimension d; must equal the namespace's when it exists.
        codec: How keys are coded on disk: ``"fp16"``, ``"fp32"``, ``"int8"``, ``"pq"``, or a
            ``KeyCodec`` (e.g. ``make_codec("pq", 576, m=144)``). ``None``: the codec recorded
            in ``store.json`` (fp16 for a v1 or new store). fp16/fp32 share one namespace per
            (fingerprint, key source); int8/pq namespaces live beside it under their own names.
        dtype: The v1 spelling of the raw codecs: ``"float16"`` (fp16) or ``"float32"`` (fp32).
        shard_bytes: Key bytes per shard file before the next shard is started.

    Raises:
        KeyStoreMismatchError: The namespace exists with another key_dim or codec.
        KeyStoreCorruptError: A manifest or codec table is missing or unreadable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fingerprint: str,
        key_source: str | int,
        key_dim: int,
        dtype: str | None = None,
        codec: str | KeyCodec | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        if not isinstance(key_dim, int) or isinstance(key_dim, bool) or key_dim < 1:
            raise ValueError(f"key_dim={key_dim!r} is invalid: allowed an integer >= 1")
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.key_source = key_source
        self.key_dim = key_dim
        requested = _requested_codec(codec, dtype)
        recorded = _recorded_codec(self.path, fingerprint, key_source)
        wanted = _resolve_codec(requested or recorded or "fp16", key_dim, recorded)
        self.namespace_dir = self.path / "ns" / _namespace_name(
            fingerprint, key_source, _codec_tag(wanted)
        )
        self.built_with = _open_root(self.path, fingerprint, key_source, wanted)
        manifest = _open_namespace(
            self.namespace_dir, fingerprint, key_source, key_dim, wanted, requested is not None
        )
        self.codec: KeyCodec = _codecs.load_codec(_manifest_codec_params(manifest))
        self._manifest = manifest
        if manifest.get("codec_fingerprint"):
            self._load_tables(manifest)
        # the dtype keys come back in: fp16 for fp16, float32 for the others
        self.dtype = np.dtype("float16" if self.codec.name == "fp16" else "float32")
        self._row_bytes = self.codec.code_size
        self._rows_per_shard = max(1, shard_bytes // self._row_bytes)
        self._lock = threading.RLock()
        self._maps: dict[int, _ShardMap] = {}
        self._db = _disk.open_index(self.namespace_dir / "index.sqlite", _SCHEMA)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        lm: Any,
        *,
        allow_new_namespace: bool = False,
        dtype: str | None = None,
        codec: str | KeyCodec | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> DiskKeyStore:
        """The store at ``path`` for ``lm``'s fingerprint, key source and key dimension.

        ``codec`` (or the v1 ``dtype``) ``None`` opens the codec the store was built with.
        Refuses (``KeyStoreMismatchError``) a store that was built by another model or key
        source, or with another codec, unless ``allow_new_namespace`` (then ``lm`` or the codec
        gets its own namespace beside the existing ones).
        """
        built = read_store_manifest(path)
        if built is not None and not allow_new_namespace:
            if (built["fingerprint"], built["key_source"]) != (lm.fingerprint, lm.key_source):
                raise KeyStoreMismatchError(_mismatch_message(path, built, lm))
            requested = _requested_codec(codec, dtype)
            recorded = _recorded_codec(Path(path), lm.fingerprint, lm.key_source)
            if requested is not None and recorded is not None:
                want = _resolve_codec(requested, lm.key_dim, recorded)
                if _codec_id(want) != _codec_id(recorded):
                    raise KeyStoreMismatchError(
                        f"key store at {path} holds {_describe(recorded)} keys, but "
                        f"{_describe(want)} was asked for; open it without a codec (drop "
                        f"--key-codec: it uses {recorded['codec']}), or ingest into a new "
                        "persist dir with "
                        f"`nest ingest ... --key-codec {want['codec']}`"
                    )
        return cls(
            path,
            fingerprint=lm.fingerprint,
            key_source=lm.key_source,
            key_dim=lm.key_dim,
            dtype=dtype,
            codec=codec,
            shard_bytes=shard_bytes,
        )

    # -- the codec ----------------------------------------------------------------------------

    @property
    def codec_fingerprint(self) -> str | None:
        """Digest of the codec and its trained tables (None while a trained codec is not)."""
        return self._manifest.get("codec_fingerprint")

    def codec_ready(self) -> bool:
        """True when the codec can code keys: raw, or trained (here or by another process)."""
        with self._lock:
            if self.codec.trained:
                return True
            m = _read_json(self.namespace_dir / "manifest.json", _NS_FIELDS)
            if m.get("codec_fingerprint"):
                self._load_tables(m)
                self._manifest = m
            return self.codec.trained

    def train_codec(self, sample: np.ndarray) -> bool:
        """Train the codec on ``sample`` keys ``(n, d)`` and save its tables, under the store's
        write lock. When another process (or an earlier call) trained it already, its tables
        are loaded instead and ``sample`` is unused. Returns True when this call trained it.

        Raises:
            ValueError: ``sample`` has fewer keys than the codec needs
                (``codecs.MIN_TRAIN_ROWS``).
        """
        if not self.codec.needs_training:
            return False
        sample = np.asarray(sample, dtype=np.float32).reshape(-1, self.key_dim)
        with self._lock:
            if self.codec_ready():
                return False
            need = _codecs.MIN_TRAIN_ROWS[self.codec.name]
            if len(sample) < need:
                raise ValueError(
                    f"the {self.codec.name} key codec needs at least {need:,} keys (tokens) to "
                    f"train, but only {len(sample):,} were given; ingest more text at once "
                    f"(about {_codecs.WANT_TRAIN_ROWS[self.codec.name]:,} tokens give good "
                    "tables), or use --key-codec fp16"
                )
            self._db.execute("BEGIN IMMEDIATE")  # the write lock, across processes too
            try:
                f = self.namespace_dir / "manifest.json"
                m = _read_json(f, _NS_FIELDS)
                trained_here = not m.get("codec_fingerprint")
                if trained_here:
                    LOG.info("training the %s key codec on %d keys", self.codec.name, len(sample))
                    self.codec.train(sample)
                    self.codec.save(self.namespace_dir)  # tables first, then the manifest
                    m = {**m, "codec_fingerprint": self.codec.fingerprint()}
                    _disk.write_json_atomic(f, m)
                else:
                    self._load_tables(m)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._manifest = m
            return trained_here

    def as_stored(self, k: PassageKeys) -> PassageKeys:
        """``k`` with its keys as a later ``get_keys`` returns them (coded, then decoded)."""
        keys = np.asarray(k.keys)
        if self.codec.name in _RAW_CODECS:
            return PassageKeys(k.passage_id, keys.astype(self.dtype), k.token_ids, k.offsets)
        if not self.codec_ready():
            raise _codecs.CodecNotTrainedError(
                f"the {self.codec.name} codec of {self.namespace_dir} is not trained yet"
            )
        coded = self.codec.decode(self.codec.encode(keys)) if len(keys) else keys
        return PassageKeys(k.passage_id, coded.astype(self.dtype), k.token_ids, k.offsets)

    def _load_tables(self, manifest: dict[str, Any]) -> None:
        """Load ``codec.npz`` and check it against the manifest's codec fingerprint."""
        want = manifest.get("codec_fingerprint")
        if not self.codec.needs_training:
            return
        try:
            self.codec.load(self.namespace_dir)
        except (OSError, ValueError, KeyError) as exc:
            raise KeyStoreCorruptError(
                f"key codec tables {self.namespace_dir / 'codec.npz'} are unreadable ({exc}); "
                f"delete {self.namespace_dir} and re-run `nest ingest`"
            ) from exc
        got = self.codec.fingerprint()
        if got != want:
            raise KeyStoreCorruptError(
                f"key codec tables {self.namespace_dir / 'codec.npz'} have fingerprint {got} but "
                f"the manifest records {want}; delete {self.namespace_dir} and re-run `nest ingest`"
            )

    # -- the KeyStore port ------------------------------------------------------------------

    def get_keys(self, passages: Sequence[Passage]) -> list[PassageKeys | None]:
        """Stored keys of each passage (looked up by content hash), or None when absent.

        Keys come back decoded: fp16 for the fp16 codec (upcast before distances), float32
        for the others.
        """
        hashes = [content_hash(p.text) for p in passages]
        with self._lock:
            found = self._lookup(hashes)
            return [
                None if h not in found else self._read(p.id, *found[h])
                for p, h in zip(passages, hashes)
            ]

    def stored_hashes(self, hashes: Sequence[str]) -> set[str]:
        """Which of ``hashes`` (``content_hash`` of passage texts) have keys: one index query,
        no key reads (for listing what is missing in a large corpus)."""
        with self._lock:
            return set(self._lookup(list(hashes)))

    def put_keys(self, passages: Sequence[Passage], keys: Sequence[PassageKeys]) -> None:
        """Persist keys; entries already present (same text) are left untouched."""
        if len(passages) != len(keys):
            raise ValueError(f"put_keys got {len(passages)} passages but {len(keys)} key sets")
        if self.codec.needs_training and keys and not self.codec_ready():
            # Keys put directly (not via ensure_keys): train on them when they are enough.
            self.train_codec(np.concatenate([np.asarray(k.keys).reshape(-1, self.key_dim)
                                             for k in keys]))
        todo: dict[str, _Rows] = {}
        for p, k in zip(passages, keys):
            h = content_hash(p.text)
            if h not in todo:
                todo[h] = self._validated(p, k)
        if not todo:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # the write lock, across processes too
            try:
                present = self._lookup(list(todo))
                new = [(h, rows) for h, rows in todo.items() if h not in present]
                if new:
                    self._append(new)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        LOG.debug("put_keys: %d new of %d passages", len(new), len(passages))

    # -- whole-namespace access ---------------------------------------------------------------

    def iter_all(self, batch_rows: int = 65536) -> Iterator[KeyChunk]:
        """Every stored row, in storage order, as chunks of whole passages (about ``batch_rows``
        rows each; a longer passage is a chunk of its own). Keys are decoded to float32."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows={batch_rows!r} is invalid: allowed an integer >= 1")
        with self._lock:
            entries = self._db.execute(
                "SELECT content_hash, shard, row_start, n_rows FROM entries WHERE n_rows > 0 "
                "ORDER BY shard, row_start"
            ).fetchall()
        batch: list[tuple[str, int, int, int]] = []
        n = 0
        for e in entries:
            if batch and (e[1] != batch[0][1] or n + e[3] > batch_rows):
                yield self._chunk(batch)
                batch, n = [], 0
            batch.append(e)
            n += e[3]
        if batch:
            yield self._chunk(batch)

    def stats(self) -> dict[str, Any]:
        """Size and identity of this namespace (for ``nest info``)."""
        with self._lock:
            n_passages, n_tokens = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(n_rows), 0) FROM entries"
            ).fetchone()
            (n_shards,) = self._db.execute("SELECT COUNT(*) FROM shards").fetchone()
        n_bytes = sum(f.stat().st_size for f in self.namespace_dir.iterdir() if f.is_file())
        return {
            "path": str(self.path),
            "namespace": self.namespace_dir.name,
            "fingerprint": self.fingerprint,
            "key_source": self.key_source,
            "key_dim": self.key_dim,
            "dtype": self.dtype.name,
            "codec": self.codec.name,
            "codec_params": self.codec.params(),
            "codec_fingerprint": self.codec_fingerprint,
            "code_bytes": self.codec.code_size,
            "n_passages": int(n_passages),
            "n_tokens": int(n_tokens),
            "n_shards": int(n_shards),
            "bytes_on_disk": int(n_bytes),
            "bytes_per_token": n_bytes / n_tokens if n_tokens else 0.0,
            "built_with": self.built_with,
        }

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._maps.clear()
            self._db.close()

    def __enter__(self) -> DiskKeyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DiskKeyStore({str(self.path)!r}, fingerprint={self.fingerprint!r}, "
            f"key_source={self.key_source!r}, key_dim={self.key_dim}, codec={self.codec.name!r})"
        )

    # -- internals --------------------------------------------------------------------------

    def _validated(self, p: Passage, k: PassageKeys) -> _Rows:
        """(keys, token_ids, offsets, n_chars) in storage dtypes, or ValueError."""
        keys = np.asarray(k.keys)
        if keys.ndim != 2 or keys.shape[1] != self.key_dim:
            raise KeyStoreMismatchError(
                f"keys of passage {p.id!r} have shape {keys.shape}; this store holds "
                f"key_dim={self.key_dim} ({self.fingerprint}, key source {self.key_source!r})"
            )
        if self.codec.name in _RAW_CODECS:
            with np.errstate(over="ignore"):  # overflow is reported below
                floats = np.ascontiguousarray(keys, dtype=self.dtype)
        else:
            floats = np.asarray(keys, dtype=np.float32)
        ids = np.asarray(k.token_ids).reshape(-1)
        offs = np.asarray(k.offsets).reshape(-1, 2)
        m = ids.shape[0]
        if floats.shape[0] != m or offs.shape[0] != m:
            raise ValueError(
                f"passage {p.id!r}: keys {keys.shape}, token_ids {ids.shape} and offsets "
                f"{offs.shape} must all have m={m} rows"
            )
        if m and (ids.min() < 0 or ids.max() > np.iinfo(_ID_DTYPE).max):
            raise ValueError(f"passage {p.id!r}: token ids out of int32 range")
        if m and (offs.min() < 0 or offs.max() > len(p.text)):
            raise ValueError(f"passage {p.id!r}: offsets fall outside its {len(p.text)} chars")
        if not np.isfinite(floats).all():
            raise ValueError(
                f"passage {p.id!r}: keys are not finite in {floats.dtype.name} (fp16 overflows "
                "above 65504); open the store with dtype='float32' (--key-codec fp32)"
            )
        codes = self.codec.encode(floats) if m else np.zeros((0, self._row_bytes), np.uint8)
        return codes, ids.astype(_ID_DTYPE), offs.astype(_OFF_DTYPE), len(p.text)

    def _lookup(self, hashes: Sequence[str]) -> dict[str, tuple[int, int, int]]:
        """content_hash -> (shard, row_start, n_rows) for the stored ones."""
        return _disk.lookup(
            self._db, "SELECT content_hash, shard, row_start, n_rows FROM entries", hashes
        )

    def _append(self, new: list[tuple[str, _Rows]]) -> None:
        """Place ``new`` after the last shard's committed end (starting a shard when it is full),
        write and fsync the rows, then index them. Runs inside the caller's write transaction."""
        tail = self._db.execute("SELECT shard, n_rows FROM shards ORDER BY shard DESC LIMIT 1")
        shard, end = tail.fetchone() or (0, 0)
        starts = {shard: end}  # committed end of each shard we write to
        entries = []  # (content_hash, shard, row_start, n_rows, n_chars)
        for h, rows in new:
            m = len(rows[1])
            if end > 0 and end + m > self._rows_per_shard:
                shard, end = shard + 1, 0
                starts[shard] = 0
            entries.append((h, shard, end, m, rows[3]))
            end += m
        ends = {s: r + m for _, s, r, m, _ in entries}  # last entry of each shard wins
        for s in ends:
            rows_of_s = [rows for (_, rows), e in zip(new, entries) if e[1] == s]
            self._write_shard(s, starts[s], rows_of_s)
        self._db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", entries)
        self._db.executemany("INSERT OR REPLACE INTO shards VALUES (?, ?)", list(ends.items()))

    def _write_shard(self, shard: int, start: int, rows: list[_Rows]) -> None:
        """Append rows to the shard's three files at row ``start`` (truncating past it), fsync."""
        for col, row_bytes in ((0, self._row_bytes), (1, 4), (2, 8)):
            fd = os.open(self._shard_path(shard, col), os.O_RDWR | os.O_CREAT, 0o644)
            with os.fdopen(fd, "r+b") as f:
                f.truncate(start * row_bytes)  # drop rows of a writer that crashed pre-commit
                f.seek(start * row_bytes)
                for r in rows:
                    if r[col].size:
                        f.write(memoryview(np.ascontiguousarray(r[col])).cast("B"))
                f.flush()
                os.fsync(f.fileno())

    def _shard_path(self, shard: int, col: int) -> Path:
        return self.namespace_dir / f"{shard:06d}.{('keys', 'ids', 'offs')[col]}"

    def _map(self, shard: int, need_rows: int) -> _ShardMap:
        """Memmaps of a shard covering at least ``need_rows`` rows (remapped as it grows)."""
        m = self._maps.get(shard)
        if m is None or m.rows < need_rows:
            m = _ShardMap.open(self, shard)
            if m.rows < need_rows:
                raise KeyStoreCorruptError(
                    f"key store shard {self._shard_path(shard, 0)} holds {m.rows} rows but the "
                    f"index points at row {need_rows}: the store is corrupt; delete "
                    f"{self.namespace_dir} and re-run `nest ingest`"
                )
            self._maps[shard] = m
        return m

    def _read(self, passage_id: str, shard: int, start: int, n: int) -> PassageKeys:
        if n == 0:
            return _empty_keys(passage_id, self.key_dim, self.dtype)
        m = self._map(shard, start + n)
        rows = slice(start, start + n)
        return PassageKeys(
            passage_id=passage_id,
            keys=self._decode(np.array(m.keys[rows])),  # (n, d) out of the page cache
            token_ids=m.ids[rows].astype(np.int64),
            offsets=np.array(m.offs[rows]),
        )

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        """(n, code_size) uint8 codes -> (n, d) keys in ``self.dtype``."""
        if not self.codec.trained and not self.codec_ready():
            raise KeyStoreCorruptError(
                f"key store namespace {self.namespace_dir} holds keys but its "
                f"{self.codec.name} codec has no trained tables; delete it and re-run "
                "`nest ingest`"
            )
        return self.codec.decode(codes).astype(self.dtype, copy=False)

    def _chunk(self, batch: list[tuple[str, int, int, int]]) -> KeyChunk:
        """One KeyChunk from entries of one shard sorted by row_start."""
        lo, hi = batch[0][2], batch[-1][2] + batch[-1][3]
        m = self._map(batch[0][1], hi)
        n = sum(e[3] for e in batch)
        rows: slice | np.ndarray = slice(lo, hi)
        if hi - lo != n:  # gaps between entries: gather their rows
            rows = np.concatenate([np.arange(r, r + k) for _, _, r, k in batch])
        return KeyChunk(
            content_hashes=[h for h, _, _, k in batch for _ in range(k)],
            keys=self._decode(np.asarray(m.keys[rows])).astype(np.float32, copy=False),
            token_ids=m.ids[rows].astype(np.int64),
            positions=np.concatenate([np.arange(k, dtype=np.int32) for *_, k in batch]),
        )


class _ShardMap(NamedTuple):
    rows: int
    keys: np.ndarray  # (rows, code_size) uint8 memmap
    ids: np.ndarray  # (rows,) memmap
    offs: np.ndarray  # (rows, 2) memmap

    @classmethod
    def open(cls, store: DiskKeyStore, shard: int) -> _ShardMap:
        paths = [store._shard_path(shard, c) for c in range(3)]
        sizes = [p.stat().st_size if p.exists() else 0 for p in paths]
        rows = min(sizes[0] // store._row_bytes, sizes[1] // 4, sizes[2] // 8)
        if rows == 0:
            empty = np.zeros((0, store._row_bytes), np.uint8)
            return cls(0, empty, np.zeros(0, _ID_DTYPE), np.zeros((0, 2), _OFF_DTYPE))
        return cls(
            rows,
            np.memmap(paths[0], dtype=np.uint8, mode="r", shape=(rows, store._row_bytes)),
            np.memmap(paths[1], dtype=_ID_DTYPE, mode="r", shape=(rows,)),
            np.memmap(paths[2], dtype=_OFF_DTYPE, mode="r", shape=(rows, 2)),
        )


def ensure_keys(
    store: Any,
    lm: Any,
    passages: Sequence[Passage],
    *,
    batch_size: int = 16,
    progress: bool = False,
) -> list[PassageKeys]:
    """Keys of every passage: stored ones are loaded, missing ones are encoded once and stored.

    Missing passages are tokenised with ``lm.tokenize_with_offsets`` and encoded with
    ``lm.encode_passages`` in batches of ``batch_size``; a text that appears twice is encoded
    once. A passage with no tokens gets an empty ``PassageKeys``. Keys come back exactly as a
    later ``get_keys`` returns them (in the store dtype; through the codec when it is lossy).

    A store whose codec (int8, pq) is not trained yet is trained first, on the keys of the
    first missing passages (about ``codecs.WANT_TRAIN_ROWS`` rows, or all of them when fewer),
    which are then stored too; fewer keys than ``codecs.MIN_TRAIN_ROWS`` is a ``ValueError``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: allowed an integer >= 1")
    _check_lm(store, lm)
    dtype = np.dtype(getattr(store, "dtype", np.float16))
    found = store.get_keys(passages)
    missing: dict[str, Passage] = {}
    for p, k in zip(passages, found):
        if k is None:
            missing.setdefault(content_hash(p.text), p)
    todo = list(missing.values())
    computed: dict[str, PassageKeys] = {}
    codec = getattr(store, "codec", None)
    training = bool(todo) and _needs_training(store)
    want_rows = _codecs.WANT_TRAIN_ROWS.get(getattr(codec, "name", ""), 0)
    pending: list[tuple[list[Passage], list[PassageKeys]]] = []  # encoded, kept for training
    pending_rows = 0
    as_stored = getattr(store, "as_stored", None)
    bar = None
    if progress and todo:
        from nest_integrations._optional import require

        bar = require("tqdm.auto", package="tqdm").tqdm(total=len(todo), desc="encoding passages")
    for i in range(0, len(todo), batch_size):
        batch = todo[i : i + batch_size]
        keys = _encode(lm, batch, dtype)
        ready = [(batch, keys)]
        if training:
            pending.append((batch, keys))
            pending_rows += sum(len(k.token_ids) for k in keys)
            if pending_rows < want_rows and i + batch_size < len(todo):
                if bar is not None:
                    bar.update(len(batch))
                continue
            store.train_codec(np.concatenate([k.keys for _, ks in pending for k in ks]))
            ready, pending, training = pending, [], False
        for b, ks in ready:
            store.put_keys(b, ks)
            if as_stored is not None:
                ks = [as_stored(k) for k in ks]
            computed.update((content_hash(p.text), k) for p, k in zip(b, ks))
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    if todo:
        LOG.info("encoded %d of %d passages", len(todo), len(passages))
    return [
        k if k is not None else _disk.renamed(computed[content_hash(p.text)], p.id)
        for p, k in zip(passages, found)
    ]


def train_codec(
    store: Any, lm: Any, passages: Sequence[Passage], *, batch_size: int = 16
) -> bool:
    """Train ``store``'s codec (int8, pq) unless it is ready, on the keys of the first of
    ``passages`` (about ``codecs.WANT_TRAIN_ROWS`` rows); those keys are stored too. For
    writers that fill the store without ``ensure_keys`` (e.g. the Ray encoder), call it first.
    Returns True when the codec was trained by this call."""
    if not _needs_training(store):
        return False
    want = _codecs.WANT_TRAIN_ROWS[store.codec.name]
    sample: list[Passage] = []
    rows = 0
    for p in passages:  # token counts from metadata when present, else a cheap overestimate
        sample.append(p)
        rows += int(p.metadata.get("n_tokens") or len(p.text) // 3 + 1)
        if rows >= want:
            break
    ensure_keys(store, lm, sample, batch_size=batch_size)
    return True


def _needs_training(store: Any) -> bool:
    codec = getattr(store, "codec", None)
    if codec is None or not getattr(codec, "needs_training", False):
        return False
    ready = getattr(store, "codec_ready", None)
    return not (ready() if callable(ready) else codec.trained)


def read_store_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The root manifest (``store.json``: the fingerprint and key source the store was built
    with), or None for a store that does not exist yet."""
    f = Path(path) / "store.json"
    if not f.exists():
        return None
    return _read_json(f, ("format_version", "fingerprint", "key_source"))


def list_namespaces(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The manifest of every namespace in the store at ``path``."""
    root = Path(path) / "ns"
    if not root.is_dir():
        return []
    return [
        {**_read_json(d / "manifest.json", _NS_FIELDS), "namespace": d.name}
        for d in sorted(root.iterdir())
        if d.is_dir()
    ]


# -- helpers ---------------------------------------------------------------------------------


def _encode(lm: Any, batch: Sequence[Passage], dtype: np.dtype) -> list[PassageKeys]:
    """Tokenise and encode a batch of passages (empty ones get 0 keys)."""
    tokenised = [lm.tokenize_with_offsets(p.text) for p in batch]
    nonempty = [i for i, (ids, _) in enumerate(tokenised) if len(ids)]
    vecs = lm.encode_passages([list(tokenised[i][0]) for i in nonempty]) if nonempty else []
    if len(vecs) != len(nonempty):
        raise ValueError(f"encode_passages returned {len(vecs)} arrays for {len(nonempty)} inputs")
    out = [_empty_keys(p.id, lm.key_dim, dtype) for p in batch]
    for i, v in zip(nonempty, vecs):
        ids, offs = tokenised[i]
        v = np.asarray(v)
        if v.shape != (len(ids), lm.key_dim):
            raise ValueError(
                f"encode_passages gave keys of shape {v.shape} for passage {batch[i].id!r}; "
                f"expected ({len(ids)}, {lm.key_dim})"
            )
        out[i] = PassageKeys(
            passage_id=batch[i].id,
            keys=v.astype(dtype),
            token_ids=np.asarray(ids, dtype=np.int64),
            offsets=np.asarray(offs, dtype=np.int32).reshape(-1, 2),
        )
    return out


def _check_lm(store: Any, lm: Any) -> None:
    """Refuse to fill a store with another model's keys."""
    theirs = [getattr(store, a, None) for a in ("fingerprint", "key_source", "key_dim")]
    ours = [lm.fingerprint, lm.key_source, lm.key_dim]
    if any(t is not None and t != o for t, o in zip(theirs, ours)):
        raise KeyStoreMismatchError(
            f"key store {store!r} holds keys of model {theirs[0]} (key source {theirs[1]!r}, "
            f"d={theirs[2]}) but the LM is {ours[0]} (key source {ours[1]!r}, d={ours[2]})"
        )


def _empty_keys(passage_id: str, key_dim: int, dtype: np.dtype) -> PassageKeys:
    return PassageKeys(
        passage_id=passage_id,
        keys=np.zeros((0, key_dim), dtype=dtype),
        token_ids=np.zeros(0, dtype=np.int64),
        offsets=np.zeros((0, 2), dtype=np.int32),
    )


def _namespace_name(fingerprint: str, key_source: str | int, codec_tag: str | None = None) -> str:
    """A readable, filesystem-safe and collision-free folder name for a namespace. The raw
    codecs (``codec_tag`` None) keep the v1 name; int8/pq namespaces get their own."""
    parts: list[Any] = [fingerprint, key_source] + ([codec_tag] if codec_tag else [])
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{fingerprint}--{key_source}").strip("-.")
    tag = f"--{codec_tag}" if codec_tag else ""
    return f"{slug[:64]}{tag}--{digest}"


def _requested_codec(codec: str | KeyCodec | None, dtype: str | None) -> Any:
    """The codec asked for: a name, a KeyCodec, or None; ``dtype`` is the v1 alias."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is invalid: allowed one of {DTYPES}")
        alias = _DTYPE_CODECS[dtype]
        name = codec.name if isinstance(codec, KeyCodec) else codec
        if codec is not None and name != alias:
            raise ValueError(f"dtype={dtype!r} and codec={name!r} disagree; pass only codec")
        return codec if codec is not None else alias
    if codec is not None and not isinstance(codec, KeyCodec) and codec not in _codecs.CODECS:
        raise ValueError(f"key codec {codec!r} is unknown: allowed one of {_codecs.CODECS}")
    return codec


def _resolve_codec(
    want: str | KeyCodec | dict[str, Any], key_dim: int, recorded: dict[str, Any] | None
) -> dict[str, Any]:
    """Codec params (``KeyCodec.params()``) for ``want``: a bare name takes the recorded
    options when the recorded codec has that name, else the codec's defaults."""
    if isinstance(want, dict):
        return {**want, "key_dim": key_dim}
    if isinstance(want, KeyCodec):
        if want.key_dim != key_dim:
            raise KeyStoreMismatchError(f"codec {want!r} codes d={want.key_dim}, keys have d={key_dim}")
        return want.params()
    if recorded is not None and recorded["codec"] == want:
        return {**recorded, "key_dim": key_dim}
    return _codecs.make_codec(want, key_dim).params()


def _recorded_codec(path: Path, fingerprint: str, key_source: str | int) -> dict[str, Any] | None:
    """The codec params the store at ``path`` was built with: ``store.json``'s ``key_codec``;
    for a v1 store, its namespace's dtype (fp16/fp32); None for a new store."""
    built = read_store_manifest(path)
    if built is None:
        return None
    if isinstance(built.get("key_codec"), dict):
        return dict(built["key_codec"])
    f = path / "ns" / _namespace_name(fingerprint, key_source) / "manifest.json"
    if f.exists():
        return _manifest_codec_params(_read_json(f, _NS_FIELDS))
    return {"codec": "fp16"}


def _manifest_codec_params(m: dict[str, Any]) -> dict[str, Any]:
    """Codec params of a namespace manifest (v1: from its dtype)."""
    if isinstance(m.get("codec"), dict):
        return {**m["codec"], "key_dim": m["key_dim"]}
    if m.get("dtype") not in DTYPES:
        raise KeyStoreCorruptError(f"key store manifest has an unknown dtype: {m}")
    return {"codec": _DTYPE_CODECS[m["dtype"]], "key_dim": m["key_dim"]}


def _codec_id(params: dict[str, Any]) -> dict[str, Any]:
    """Params that identify a codec independently of key_dim."""
    return {k: v for k, v in params.items() if k != "key_dim"}


def _codec_tag(params: dict[str, Any]) -> str | None:
    """None for the raw codecs (v1 namespace name); else e.g. ``int8`` or ``pq-m72``."""
    name = params["codec"]
    if name in _RAW_CODECS:
        return None
    default = _codecs.make_codec(name, params["key_dim"]).params()
    extra = {k: v for k, v in params.items() if default.get(k) != v}
    if name == "pq":
        extra.pop("m", None)
        return f"pq-m{params['m']}" + (f"-{_short(extra)}" if extra else "")
    return name + (f"-{_short(extra)}" if extra else "")


def _short(d: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


def _describe(params: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in _codec_id(params).items() if k != "codec")
    return f"{params['codec']}" + (f" ({extra})" if extra else "")


def _mismatch_message(path: str | os.PathLike[str], built: dict[str, Any], lm: Any) -> str:
    return (
        f"key store at {path} was built by model {built['fingerprint']} (key source "
        f"{built['key_source']!r}); this engine uses model {lm.fingerprint} (key source "
        f"{lm.key_source!r}). Re-run `nest ingest` with the engine's model and key source, "
        "or pass a different persist dir."
    )


def _open_root(
    path: Path, fingerprint: str, key_source: str | int, codec: dict[str, Any]
) -> dict[str, Any]:
    """Read ``store.json``, creating it for a new store (this namespace is then 'built with',
    and its codec is the store's ``key_codec``)."""
    built = read_store_manifest(path)
    if built is not None:
        return built
    ns_root = path / "ns"
    if ns_root.is_dir() and any(ns_root.iterdir()):
        raise KeyStoreCorruptError(
            f"key store at {path} has data but no store.json manifest; delete {path} and "
            "re-run `nest ingest`, or pass a different persist dir"
        )
    # A raw-codec store stays readable by v1 code (which ignores ``key_codec``).
    version = 1 if codec["codec"] in _RAW_CODECS else FORMAT_VERSION
    manifest = {"format_version": version, "fingerprint": fingerprint}
    _disk.write_json_atomic(
        path / "store.json",
        {**manifest, "key_source": key_source, "key_codec": _codec_id(codec)},
        exclusive=True,
    )
    return read_store_manifest(path) or manifest


def _open_namespace(
    ns: Path,
    fingerprint: str,
    key_source: str | int,
    key_dim: int,
    codec: dict[str, Any],
    explicit: bool,
) -> dict[str, Any]:
    """Read or create a namespace manifest; refuse one that disagrees on key_dim or (when the
    codec was asked for explicitly) on the codec."""
    f = ns / "manifest.json"
    if not f.exists():
        if (ns / "index.sqlite").exists():
            raise KeyStoreCorruptError(
                f"key store namespace {ns} has an index but no manifest.json; delete {ns} and "
                "re-run `nest ingest`"
            )
        ns.mkdir(parents=True, exist_ok=True)
        decoded = "float16" if codec["codec"] == "fp16" else "float32"
        _disk.write_json_atomic(f, {
            "format_version": FORMAT_VERSION, "fingerprint": fingerprint,
            "key_source": key_source, "key_dim": key_dim, "dtype": decoded,
            "codec": _codec_id(codec),
        }, exclusive=True)  # fmt: skip
    m = _read_json(f, _NS_FIELDS)
    if (m["fingerprint"], m["key_source"]) != (fingerprint, key_source):
        raise KeyStoreCorruptError(f"key store manifest {f} does not describe its folder: {m}")
    theirs = _manifest_codec_params(m)
    if m["key_dim"] != key_dim or (explicit and _codec_id(theirs) != _codec_id(codec)):
        raise KeyStoreMismatchError(
            f"key store namespace {ns} holds key_dim={m['key_dim']} {_describe(theirs)} keys "
            f"(dtype {m['dtype']}) of {fingerprint} (key source {key_source!r}) but was opened "
            f"with key_dim={key_dim} codec {_describe(codec)}; use the same model and codec, "
            "or a different persist dir"
        )
    return m


def _read_json(f: Path, required: Sequence[str]) -> dict[str, Any]:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KeyStoreCorruptError(f"key store manifest {f} is unreadable: {exc}") from exc
    missing = [k for k in required if not isinstance(data, dict) or k not in data]
    if missing:
        raise KeyStoreCorruptError(f"key store manifest {f} lacks {missing}; it is corrupt")
    if not isinstance(data["format_version"], int) or data["format_version"] > FORMAT_VERSION:
        raise KeyStoreCorruptError(
            f"key store manifest {f} has format_version {data['format_version']}; this version "
            f"of nest-integrations reads up to {FORMAT_VERSION}: upgrade the package"
        )
    return data
