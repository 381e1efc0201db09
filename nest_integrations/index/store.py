"""The on-disk token-key store: NEST's stage-2 memory, precomputed per passage and persisted.

Passages are encoded on their own (NEST spec §5), so their keys can be computed once at ingest and
loaded at query time. Entries are addressed by (model fingerprint, key source, passage content
hash); the same text under two passage ids is stored once.

Layout under ``path``::

    store.json                     the model fingerprint + key source the store was built with,
                                   its key codec (``key_codec``; absent in v1 stores: fp16) and
                                   the model's dtype (``model_dtype``: fp32, bf16, ...; absent
                                   in older stores)

The fingerprint does not depend on the dtype (``HFLanguageModel.fingerprint``), so a store
encoded in fp32 is read by the same model loaded in bf16 and vice versa: the keys are
interchangeable (``benchmarks/results/bf16_keys.md``). ``open`` logs a note when they differ.
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

Namespace names, manifests and codec resolution are in ``index.namespaces``; encoding keys and
filling a store (``ensure_keys``) in ``index.keys``; the shard files' row dtypes, index schema and
memmaps in ``index.store_shards``.

Example::

    store = DiskKeyStore.open(keys_dir(persist_dir), lm)
    memory = ensure_keys(store, lm, passages)     # index.keys: encodes only passages not stored
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nest_integrations.index import _disk
from nest_integrations.index import codecs as _codecs
from nest_integrations.index import namespaces as _ns
from nest_integrations.index.base import KeyStoreCorruptError, KeyStoreMismatchError
from nest_integrations.index.codecs import KeyCodec
from nest_integrations.index.keys import content_hash, empty_keys
from nest_integrations.index.store_shards import _ID_DTYPE, _OFF_DTYPE, _SCHEMA, _Rows, _ShardMap
from nest_integrations.types import Passage, PassageKeys

LOG = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 1 << 30  # keys bytes per shard file before a new one is started
__all__ = ["DEFAULT_SHARD_BYTES", "DiskKeyStore"]


class DiskKeyStore(_disk.IndexedFolder):
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
        model_dtype: str | None = None,
    ) -> None:
        _codecs.check_key_dim(key_dim)
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.key_source = key_source
        self.key_dim = key_dim
        requested = _ns.requested_codec(codec, dtype)
        recorded = _ns.recorded_codec(self.path, fingerprint, key_source)
        wanted = _ns.resolve_codec(requested or recorded or "fp16", key_dim, recorded)
        self.namespace_dir = self.path / "ns" / _ns.namespace_name(
            fingerprint, key_source, _ns.codec_tag(wanted)
        )
        self.built_with = _ns.open_root(self.path, fingerprint, key_source, wanted, model_dtype)
        manifest = _ns.open_namespace(
            self.namespace_dir, fingerprint, key_source, key_dim, wanted, requested is not None
        )
        self.codec: KeyCodec = _codecs.load_codec(_ns.manifest_codec_params(manifest))
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
        A model of the other backend than the store's (torch, llama.cpp) gets its own
        namespace beside the existing ones, empty until ``ensure_keys`` fills it (the engine's
        first queries, or ``nest ingest --backend ...``): one store serves both backends
        (``namespaces.admits``). Refuses (``KeyStoreMismatchError``) another model or key
        source of a backend the store holds keys of, or another codec than the store's,
        unless ``allow_new_namespace`` (then ``lm`` or the codec gets its own namespace).
        """
        built = _ns.read_store_manifest(path)
        if built is not None and not allow_new_namespace:
            if not _ns.admits(path, built, lm):
                raise KeyStoreMismatchError(_ns.mismatch_message(path, built, lm))
            _log_new_namespace(Path(path), built, lm)
            requested = _ns.requested_codec(codec, dtype)
            recorded = _ns.recorded_codec(Path(path), lm.fingerprint, lm.key_source)
            if requested is not None and recorded is not None:
                want = _ns.resolve_codec(requested, lm.key_dim, recorded)
                if _ns.codec_id(want) != _ns.codec_id(recorded):
                    raise KeyStoreMismatchError(
                        f"key store at {path} holds {_ns.describe_codec(recorded)} keys, but "
                        f"{_ns.describe_codec(want)} was asked for; open it without a codec "
                        f"(drop --key-codec: it uses {recorded['codec']}), or ingest into a new "
                        "persist dir with "
                        f"`nest ingest ... --key-codec {want['codec']}`"
                    )
        lm_dtype = model_dtype_name(lm)
        recorded_dtype = (built or {}).get("model_dtype")
        if lm_dtype and recorded_dtype and recorded_dtype != lm_dtype:
            LOG.info(
                "key store at %s was encoded by the model in %s; this one runs in %s. The keys "
                "are interchangeable (measured: benchmarks/results/bf16_keys.md); passages "
                "encoded from now on use %s", path, recorded_dtype, lm_dtype, lm_dtype,
            )
        return cls(
            path,
            fingerprint=lm.fingerprint,
            key_source=lm.key_source,
            key_dim=lm.key_dim,
            dtype=dtype,
            codec=codec,
            shard_bytes=shard_bytes,
            model_dtype=lm_dtype,
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
            m = _ns.read_json(self.namespace_dir / "manifest.json", _ns.NS_FIELDS)
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
            with _disk.write_transaction(self._db):  # the write lock, across processes too
                f = self.namespace_dir / "manifest.json"
                m = _ns.read_json(f, _ns.NS_FIELDS)
                trained_here = not m.get("codec_fingerprint")
                if trained_here:
                    LOG.info("training the %s key codec on %d keys", self.codec.name, len(sample))
                    self.codec.train(sample)
                    self.codec.save(self.namespace_dir)  # tables first, then the manifest
                    m = {**m, "codec_fingerprint": self.codec.fingerprint()}
                    _disk.write_json_atomic(f, m)
                else:
                    self._load_tables(m)
            self._manifest = m
            return trained_here

    def as_stored(self, k: PassageKeys) -> PassageKeys:
        """``k`` with its keys as a later ``get_keys`` returns them (coded, then decoded)."""
        keys = np.asarray(k.keys)
        if self.codec.name in _ns.RAW_CODECS:
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
            with _disk.write_transaction(self._db):  # the write lock, across processes too
                present = self._lookup(list(todo))
                new = [(h, rows) for h, rows in todo.items() if h not in present]
                if new:
                    self._append(new)
        LOG.debug("put_keys: %d new of %d passages", len(new), len(passages))

    # -- whole-namespace access ---------------------------------------------------------------

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

    def close(self) -> None:
        with self._lock:
            self._maps.clear()
            self._db.close()

    def __repr__(self) -> str:
        return (
            f"DiskKeyStore({str(self.path)!r}, fingerprint={self.fingerprint!r}, "
            f"key_source={self.key_source!r}, key_dim={self.key_dim}, codec={self.codec.name!r})"
        )

    # -- internals --------------------------------------------------------------------------

    def _validated(self, p: Passage, k: PassageKeys) -> _Rows:
        """(codes, token_ids, offsets, n_chars) in storage dtypes, or ValueError."""
        keys, ids, offs = _disk.checked_rows(
            p, k, self.key_dim, f"store ({self.fingerprint}, key source {self.key_source!r})"
        )
        if self.codec.name in _ns.RAW_CODECS:
            with np.errstate(over="ignore"):  # overflow is reported below
                floats = np.ascontiguousarray(keys, dtype=self.dtype)
        else:
            floats = np.asarray(keys, dtype=np.float32)
        if not np.isfinite(floats).all():
            raise ValueError(
                f"passage {p.id!r}: keys are not finite in {floats.dtype.name} (fp16 overflows "
                "above 65504); open the store with dtype='float32' (--key-codec fp32)"
            )
        m = len(ids)
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
            return empty_keys(passage_id, self.key_dim, self.dtype)
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


def _log_new_namespace(path: Path, built: dict[str, Any], lm: Any) -> None:
    """Say so when ``lm`` opens a namespace of its own in a store built by the other backend."""
    if (built["fingerprint"], built["key_source"]) == (lm.fingerprint, lm.key_source):
        return
    if (path / "ns" / _ns.namespace_name(lm.fingerprint, lm.key_source)).is_dir():
        return
    LOG.info(
        "key store at %s was built by the %s backend; %s keys (key source %r) get their own "
        "namespace there, encoded as queries retrieve passages (`nest ingest --backend %s` "
        "encodes them all now, without re-adding passages)", path,
        _ns.fingerprint_backend(built["fingerprint"]), _ns.fingerprint_backend(lm.fingerprint),
        lm.key_source, _ns.fingerprint_backend(lm.fingerprint),
    )


def model_dtype_name(lm: Any) -> str | None:
    """``"fp32"``, ``"bf16"`` or ``"fp16"`` for a model with a torch ``dtype`` (else None)."""
    from nest_integrations.lm.backend import SHORT_NAMES

    from nest_integrations.lm.port import port_of

    return SHORT_NAMES.get(port_of(lm).build().weights)
