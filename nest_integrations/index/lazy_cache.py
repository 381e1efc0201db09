"""Lazy token keys: passages are encoded when a query first retrieves them, and their keys are
kept in an on-disk LRU cache with a size cap (``nest ingest --keys lazy --key-cache-size 2GB``).

This is the NEST paper's own approach for corpora too large to encode up front: only passages
that stage 1 actually retrieves are ever encoded, and a bounded cache keeps the hot ones.

The persist dir's mode (``lazy.json``), switching modes and the cache's codec tables are in
``index.lazy_mode``; ``nest info``'s view of the caches (``lazy_cache_stats``) in
``index.lazy_stats``.

Layout under ``<persist_dir>/keys``::

    lazy.json                        mode, byte cap and codec of this persist dir
    lazy/<namespace>/manifest.json   fingerprint, key source, key_dim, codec params + fingerprint
    lazy/<namespace>/codec.npz       trained codec tables (int8, pq)
    lazy/<namespace>/index.sqlite    content_hash -> (file, n_rows, bytes, last_used), WAL mode
    lazy/<namespace>/data/<hh>/<content_hash>-<nonce>.key   one file per passage

One namespace per (model fingerprint, key source, codec name). Each ``.key`` file is a 20-byte
header (magic, version, n_rows, code_size, crc32 of the payload), the codec's codes, the int32
token ids and the int32 (start, end) char offsets.

Write protocol (``put_keys``), under sqlite's write lock (``BEGIN IMMEDIATE``, which also
serialises writers in other processes): write each new file to a temp name, fsync it and rename it
to a fresh unique name; insert its index row; evict least-recently-used rows until the byte total
is within the cap; commit; only then unlink the evicted files. So an index row never points at a
missing file: a crash before the commit leaves orphan files (``prune`` removes them), a crash
after it leaves unreferenced files too, and a re-put of an evicted passage gets a new file name.
A file found missing or corrupt at read time (deleted by hand, disk damage) is a miss: its row is
dropped and the passage is encoded again.

Recency is a logical clock in the index (one tick per ``get_keys``/``put_keys`` call, across
processes): ``get_keys`` refreshes the hits, ``put_keys`` stamps the new entries last, so entries
put in one call are evicted after every older one. An entry larger than the whole cap is returned
to the caller (``ensure_keys`` hands back what it encoded) but not kept. The cap counts the
``.key`` files only (not the sqlite index, about 100 bytes per entry).

Example::

    configure_lazy(keys_dir(persist_dir), max_bytes=parse_size("2GB"))
    with LazyKeyCache.open(keys_dir(persist_dir), lm) as cache:
        keys = ensure_keys(cache, lm, passages)   # encodes misses, evicts LRU beyond the cap
        cache.stats()["bytes_used"]
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nest_integrations.index import _disk
from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.index.codecs import DEFAULT_CODEC, check_key_dim
from nest_integrations.index.keys import content_hash
from nest_integrations.index.lazy_mode import (
    DEFAULT_MAX_BYTES,
    FORMAT_VERSION,
    LAZY_DIR,
    MODE_FILE,
    open_codec,
    parse_size,
    read_mode,
)
from nest_integrations.index.lazy_stats import _db_stats, lazy_cache_stats  # noqa: F401
from nest_integrations.index.namespaces import lazy_namespace_name, list_namespaces
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.types import Passage, PassageKeys

LOG = logging.getLogger(__name__)

_MAGIC = b"NLKC"
_HEADER = struct.Struct("<4sHHIII")  # magic, version, reserved, n_rows, code_size, crc32
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    content_hash TEXT PRIMARY KEY, file TEXT NOT NULL, n_rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL, last_used INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_lru ON entries (last_used, content_hash);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('clock', 0), ('total_bytes', 0);
"""

__all__ = ["LazyKeyCache", "lazy_cache_stats", "prune_all"]


class LazyKeyCache(_disk.IndexedFolder):
    """Token keys encoded at query time, kept on disk in an LRU cache of at most ``max_bytes``.

    Implements the ``KeyStore`` port (``ensure_keys`` fills it). Safe to share between threads
    and between processes.

    Open the cache of a lazy persist dir for a model::

        cache = LazyKeyCache.open(keys_dir, lm)        # reads lazy.json; read-through to eager
        keys = ensure_keys(cache, lm, passages)

    Args:
        keys_dir: the key-store folder of a persist dir (``paths.keys_dir``).
        fingerprint, key_source, key_dim: the model the keys come from.
        max_bytes: the cap on the ``.key`` files' total size.
        codec: ``fp16`` (default), ``fp32``, or ``int8``/``pq`` (tables trained at ingest by
            ``train_lazy_codec``).
        source: a read-through ``KeyStore`` (the eager store) consulted on cache misses.

    Raises:
        KeyStoreMismatchError: the namespace exists with another key_dim or codec.
        ValueError: a trained codec that has no tables for this model yet.
    """

    def __init__(
        self,
        keys_dir: str | os.PathLike[str],
        *,
        fingerprint: str,
        key_source: str | int,
        key_dim: int,
        max_bytes: int = DEFAULT_MAX_BYTES,
        codec: str = DEFAULT_CODEC,
        source: Any = None,
    ) -> None:
        check_key_dim(key_dim)
        self.path = Path(keys_dir)
        self.fingerprint = fingerprint
        self.key_source = key_source
        self.key_dim = key_dim
        self.max_bytes = parse_size(max_bytes)
        self.source = source
        self.namespace_dir = self.path / LAZY_DIR / lazy_namespace_name(fingerprint, key_source, codec)
        self.codec = open_codec(self.namespace_dir, fingerprint, key_source, key_dim, codec)
        # What get_keys returns and ensure_keys casts fresh keys to: raw codecs keep their dtype,
        # trained ones decode to float32.
        self.dtype = np.dtype(np.float16 if codec == "fp16" else np.float32)
        self.hits = self.misses = self.source_hits = 0  # this process's counters
        self._data = self.namespace_dir / "data"
        self._data.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = _disk.open_index(self.namespace_dir / "index.sqlite", _SCHEMA)

    @classmethod
    def open(
        cls,
        keys_dir: str | os.PathLike[str],
        lm: Any,
        *,
        read_through: bool = True,
    ) -> LazyKeyCache:
        """The cache of the lazy key folder ``keys_dir`` for ``lm`` (cap and codec from
        ``lazy.json``); with ``read_through``, an eager store of the same model there is read
        on misses."""
        mode = read_mode(keys_dir)
        if mode is None:
            raise ValueError(f"{keys_dir} is not in lazy key mode (no {MODE_FILE}); run "
                             "`nest ingest --keys lazy` first")
        source = _eager_source(keys_dir, lm) if read_through else None
        return cls(keys_dir, fingerprint=lm.fingerprint, key_source=lm.key_source,
                   key_dim=lm.key_dim, max_bytes=int(mode["max_bytes"]), codec=mode["codec"],
                   source=source)  # fmt: skip

    # -- the KeyStore port ------------------------------------------------------------------

    def get_keys(self, passages: Sequence[Passage]) -> list[PassageKeys | None]:
        """Cached keys of each passage (by content hash), else the read-through source's, else
        None. Hits become the most recently used entries."""
        hashes = [content_hash(p.text) for p in passages]
        with self._lock:
            rows = self._lookup(hashes)
            loaded: dict[str, PassageKeys | None] = {}
            for h, (file, n_rows, _) in rows.items():
                loaded[h] = self._read_file(file, n_rows)
            bad = [(h, rows[h][0]) for h, k in loaded.items() if k is None]
            good = [h for h, k in loaded.items() if k is not None]
            if good or bad:
                self._touch(good, bad)
        out: list[PassageKeys | None] = []
        for p, h in zip(passages, hashes):
            k = loaded.get(h)
            out.append(None if k is None else _disk.renamed(k, p.id))
        self.hits += sum(k is not None for k in out)
        missing = [i for i, k in enumerate(out) if k is None]
        if missing and self.source is not None:
            found = self.source.get_keys([passages[i] for i in missing])
            for i, k in zip(missing, found):
                if k is not None:
                    out[i] = PassageKeys(k.passage_id, np.asarray(k.keys).astype(self.dtype),
                                         k.token_ids, k.offsets)
                    self.source_hits += 1
        self.misses += sum(k is None for k in out)
        return out

    def put_keys(self, passages: Sequence[Passage], keys: Sequence[PassageKeys]) -> None:
        """Cache keys (entries already cached are refreshed, not rewritten), then evict least
        recently used entries until the total is within ``max_bytes``."""
        if len(passages) != len(keys):
            raise ValueError(f"put_keys got {len(passages)} passages but {len(keys)} key sets")
        blobs: dict[str, tuple[bytes, int]] = {}
        for p, k in zip(passages, keys):
            h = content_hash(p.text)
            if h not in blobs:
                blobs[h] = self._blob(p, k)
        if not blobs:
            return
        with self._lock:
            evicted = self._insert(blobs)
        for f in evicted:  # after the commit: no row points at them any more
            (self._data / f).unlink(missing_ok=True)

    def as_stored(self, k: PassageKeys) -> PassageKeys:
        """``k`` as a later ``get_keys`` returns it (through the codec; ``ensure_keys`` hands
        this back for freshly encoded passages, so a cold query equals a warm one)."""
        keys = np.asarray(k.keys)
        if len(keys) and self.codec.needs_training:
            keys = self.codec.decode(self.codec.encode(keys))
        return PassageKeys(k.passage_id, keys.astype(self.dtype), k.token_ids, k.offsets)

    def codec_ready(self) -> bool:
        """Always: a trained codec's tables come from ``nest ingest`` (``train_lazy_codec``)."""
        return True

    # -- maintenance ----------------------------------------------------------------------------

    def prune(self) -> dict[str, int]:
        """Remove orphan files (a crashed writer's) and rows whose file is gone, recount the byte
        total and evict down to the cap. Returns what was removed."""
        with self._lock:
            with _disk.write_transaction(self._db):
                known = dict(self._db.execute("SELECT file, content_hash FROM entries"))
                on_disk = {str(f.relative_to(self._data)): f for f in self._data.rglob("*")
                           if f.is_file()}  # fmt: skip
                orphans = [f for name, f in on_disk.items() if name not in known]
                gone = [h for name, h in known.items() if name not in on_disk]
                self._delete_rows(gone)
                (total,) = self._db.execute(
                    "SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'total_bytes'", (total,))
                evicted = self._evict()
            for f in orphans:
                f.unlink(missing_ok=True)
            for f in evicted:
                (self._data / f).unlink(missing_ok=True)
        if orphans or gone or evicted:
            LOG.info("lazy key cache prune: %d orphan files, %d dangling rows, %d evicted",
                     len(orphans), len(gone), len(evicted))
        return {"orphan_files": len(orphans), "dangling_rows": len(gone), "evicted": len(evicted)}

    def stats(self) -> dict[str, Any]:
        """Mode, cap, use and identity of this cache (for ``nest info``)."""
        with self._lock:
            s = _db_stats(self._db)
        return {
            "mode": "lazy",
            "path": str(self.namespace_dir),
            "fingerprint": self.fingerprint,
            "key_source": self.key_source,
            "key_dim": self.key_dim,
            "codec": self.codec.name,
            "max_bytes": self.max_bytes,
            **s,
            "read_through": None if self.source is None else str(getattr(self.source, "path", "")),
            "hits": self.hits,
            "misses": self.misses,
            "source_hits": self.source_hits,
        }

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self.source is not None and hasattr(self.source, "close"):
            self.source.close()

    def __repr__(self) -> str:
        return (f"LazyKeyCache({str(self.path)!r}, fingerprint={self.fingerprint!r}, "
                f"key_source={self.key_source!r}, key_dim={self.key_dim}, "
                f"codec={self.codec.name!r}, max_bytes={self.max_bytes})")

    # -- internals ----------------------------------------------------------------------------

    def _blob(self, p: Passage, k: PassageKeys) -> tuple[bytes, int]:
        """The file bytes of one passage's keys, and its row count; ValueError on bad keys."""
        keys, ids, offs = _disk.checked_rows(
            p, k, self.key_dim, f"cache ({self.fingerprint}, key source {self.key_source!r})"
        )
        m = len(ids)
        codes = self.codec.encode(keys) if m else np.zeros((0, self.codec.code_size), np.uint8)
        payload = b"".join((
            np.ascontiguousarray(codes, np.uint8).tobytes(),
            ids.astype("<i4").tobytes(),
            offs.astype("<i4").tobytes(),
        ))  # fmt: skip
        header = _HEADER.pack(_MAGIC, FORMAT_VERSION, 0, m, self.codec.code_size,
                              zlib.crc32(payload))
        return header + payload, m

    def _read_file(self, file: str, n_rows: int) -> PassageKeys | None:
        """Keys from a ``.key`` file, or None (logged) when it is missing or corrupt."""
        try:
            data = (self._data / file).read_bytes()
        except OSError:
            LOG.warning("lazy key cache file %s is missing: treated as a miss", file)
            return None
        cs = self.codec.code_size
        try:
            magic, version, _, m, code_size, crc = _HEADER.unpack_from(data)
            payload = memoryview(data)[_HEADER.size:]
            ok = (magic == _MAGIC and version == FORMAT_VERSION and m == n_rows and code_size == cs
                  and len(payload) == m * (cs + 12) and zlib.crc32(payload) == crc)
        except struct.error:
            ok = False
        if not ok:
            LOG.warning("lazy key cache file %s is corrupt: treated as a miss", file)
            return None
        codes = np.frombuffer(payload, np.uint8, m * cs).reshape(m, cs)
        ids = np.frombuffer(payload, "<i4", m, offset=m * cs)
        offs = np.frombuffer(payload, "<i4", 2 * m, offset=m * (cs + 4)).reshape(m, 2)
        keys = self.codec.decode(codes) if m else np.zeros((0, self.key_dim))
        return PassageKeys(
            passage_id="",
            keys=np.array(keys, dtype=self.dtype),  # own copy, writable
            token_ids=ids.astype(np.int64),
            offsets=offs.astype(np.int32),
        )

    def _lookup(self, hashes: Sequence[str]) -> dict[str, tuple[str, int, int]]:
        """content_hash -> (file, n_rows, bytes) for the cached ones."""
        return _disk.lookup(
            self._db, "SELECT content_hash, file, n_rows, bytes FROM entries", hashes
        )

    def _tick(self) -> int:
        """The next value of the shared logical clock (inside a write transaction)."""
        self._db.execute("UPDATE meta SET value = value + 1 WHERE key = 'clock'")
        return int(self._db.execute("SELECT value FROM meta WHERE key = 'clock'").fetchone()[0])

    def _touch(self, good: list[str], bad: list[tuple[str, str]]) -> None:
        """Refresh the recency of hits; drop the rows of unreadable files (if still theirs)."""
        with _disk.write_transaction(self._db):
            if good:
                tick = self._tick()
                self._db.executemany("UPDATE entries SET last_used = ? WHERE content_hash = ?",
                                     [(tick, h) for h in good])
            for h, file in bad:
                row = self._db.execute("SELECT bytes FROM entries WHERE content_hash = ? AND "
                                       "file = ?", (h, file)).fetchone()
                if row:
                    self._db.execute("DELETE FROM entries WHERE content_hash = ?", (h,))
                    self._add_total(-row[0])
        for _, file in bad:  # a corrupt file is no use to anyone; a missing one is a no-op
            (self._data / file).unlink(missing_ok=True)

    def _insert(self, blobs: dict[str, tuple[bytes, int]]) -> list[str]:
        """Write and index the new blobs, evict beyond the cap; returns files to unlink."""
        with _disk.write_transaction(self._db):  # the write lock, across processes too
            tick = self._tick()
            present = self._lookup(list(blobs))
            if present:
                self._db.executemany("UPDATE entries SET last_used = ? WHERE content_hash = ?",
                                     [(tick, h) for h in present])
            budget, rows = self.max_bytes, []
            for h, (blob, m) in blobs.items():
                if h in present:
                    continue
                if len(blob) > budget:  # larger than the cap (or the rest of it): not kept
                    LOG.debug("lazy key cache: entry of %d bytes does not fit the cap", len(blob))
                    continue
                budget -= len(blob)
                rows.append((h, self._write_file(h, blob), m, len(blob), tick))
            self._db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", rows)
            self._add_total(sum(r[3] for r in rows))
            evicted = self._evict()
        LOG.debug("lazy key cache: %d new entries, %d evicted", len(rows), len(evicted))
        return evicted

    def _write_file(self, h: str, blob: bytes) -> str:
        """Write ``blob`` atomically (tmp + fsync + rename) under a fresh name; returns it."""
        name = f"{h[:2]}/{h}-{uuid.uuid4().hex[:12]}.key"
        final = self._data / name
        final.parent.mkdir(exist_ok=True)
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return name

    def _evict(self) -> list[str]:
        """Delete least-recently-used rows until the total is within the cap (inside a write
        transaction); returns their files."""
        evicted: list[str] = []
        total = self._total()
        while total > self.max_bytes:
            batch = self._db.execute(
                "SELECT content_hash, file, bytes FROM entries "
                "ORDER BY last_used, content_hash LIMIT 256"
            ).fetchall()
            if not batch:
                break
            drop = []
            for h, f, b in batch:
                if total <= self.max_bytes:
                    break
                drop.append(h)
                evicted.append(f)
                total -= b
            self._delete_rows(drop)
        return evicted

    def _delete_rows(self, hashes: Sequence[str]) -> None:
        for i in range(0, len(hashes), _disk.SQL_CHUNK):
            part = list(hashes[i : i + _disk.SQL_CHUNK])
            marks = ",".join("?" * len(part))
            (freed,) = self._db.execute(
                f"SELECT COALESCE(SUM(bytes), 0) FROM entries WHERE content_hash IN ({marks})",
                part).fetchone()  # fmt: skip
            self._db.execute(f"DELETE FROM entries WHERE content_hash IN ({marks})", part)
            self._add_total(-freed)

    def _total(self) -> int:
        return int(self._db.execute("SELECT value FROM meta WHERE key = 'total_bytes'")
                   .fetchone()[0])  # fmt: skip

    def _add_total(self, delta: int) -> None:
        if delta:
            self._db.execute("UPDATE meta SET value = value + ? WHERE key = 'total_bytes'",
                             (int(delta),))


def _eager_source(keys_dir: str | os.PathLike[str], lm: Any) -> Any:
    """The eager ``DiskKeyStore`` of ``lm`` in ``keys_dir`` when one exists (else None)."""
    try:
        spaces = list_namespaces(keys_dir)
    except Exception as exc:  # a damaged eager store must not stop lazy queries
        LOG.warning("eager key store at %s is unreadable (%s): not used as a source", keys_dir, exc)
        return None
    for ns in spaces:
        if (ns["fingerprint"], ns["key_source"], ns["key_dim"]) == (
            lm.fingerprint, lm.key_source, lm.key_dim
        ):
            try:
                source = DiskKeyStore.open(keys_dir, lm, allow_new_namespace=True)
            except (KeyStoreMismatchError, ValueError, OSError) as exc:
                LOG.warning("eager key store at %s cannot be read (%s): not used", keys_dir, exc)
                return None
            LOG.info("lazy keys read through the eager key store at %s", keys_dir)
            return source
    return None


def prune_all(keys_dir: str | os.PathLike[str]) -> None:
    """``prune`` every cache namespace of a lazy ``keys_dir`` under its recorded cap (no model
    needed: identities come from the manifests)."""
    mode = read_mode(keys_dir)
    root = Path(keys_dir) / LAZY_DIR
    if mode is None or not root.is_dir():
        return
    for ns in sorted(root.iterdir()):
        f = ns / "manifest.json"
        if not f.exists():
            continue
        m = json.loads(f.read_text(encoding="utf-8"))
        with LazyKeyCache(keys_dir, fingerprint=m["fingerprint"], key_source=m["key_source"],
                          key_dim=m["key_dim"], max_bytes=int(mode["max_bytes"]),
                          codec=m["codec"]["codec"]) as cache:  # fmt: skip
            cache.prune()
