"""Small on-disk helpers shared by the key store (``store.py``) and the lazy key cache
(``lazy_cache.py``): their sqlite index connection, batched content-hash lookups, atomic JSON
manifests, checking the keys of a passage before they are written, and renaming a
``PassageKeys`` to the passage that asked for it."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.types import Passage, PassageKeys

SQL_CHUNK = 500  # host parameters per IN (...) query
_T = TypeVar("_T", bound="IndexedFolder")


def open_index(path: Path, schema: str) -> sqlite3.Connection:
    """The sqlite index at ``path``: WAL, autocommit (transactions are explicit, ``BEGIN
    IMMEDIATE`` is the cross-process write lock), shareable between threads (callers lock)."""
    db = sqlite3.connect(path, timeout=120.0, isolation_level=None, check_same_thread=False)
    # Switching to WAL takes an exclusive lock that sqlite does not wait for (no busy handler),
    # so two processes creating the same index at once retry instead of failing.
    _retry_locked(lambda: _set_wal(db))
    db.execute("PRAGMA synchronous=NORMAL")  # data is fsynced before the row that points at it
    _retry_locked(lambda: db.executescript(schema))
    return db


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction under sqlite's write lock (``BEGIN IMMEDIATE``, which also
    serialises writers in other processes): committed when the block ends, rolled back when it
    raises (anything, KeyboardInterrupt included)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


class IndexedFolder:
    """What the key store and the lazy cache share: an ``entries`` table in the sqlite index
    ``self._db`` (guarded by ``self._lock``) that counts their passages, and ``close`` on
    leaving a ``with`` block."""

    _db: sqlite3.Connection
    _lock: threading.RLock

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _set_wal(db: sqlite3.Connection) -> None:
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        db.execute("PRAGMA journal_mode=WAL")


def _retry_locked(op: Callable[[], Any], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            op()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def lookup(db: sqlite3.Connection, select: str, hashes: Sequence[str]) -> dict[str, tuple]:
    """``content_hash -> the other selected columns`` for the rows of ``hashes`` that exist.
    ``select`` is ``"SELECT content_hash, <cols> FROM <table>"``."""
    found: dict[str, tuple] = {}
    unique = list(dict.fromkeys(hashes))
    for i in range(0, len(unique), SQL_CHUNK):
        part = unique[i : i + SQL_CHUNK]
        rows = db.execute(f"{select} WHERE content_hash IN ({','.join('?' * len(part))})", part)
        found.update((r[0], tuple(r[1:])) for r in rows)
    return found


def write_json_atomic(f: Path, data: dict[str, Any], *, exclusive: bool = False) -> None:
    """Write ``f`` atomically (tmp + fsync + rename). ``exclusive`` keeps an existing ``f``
    (a concurrent creator may win; both wrote the same description)."""
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f"{f.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        if not exclusive:
            os.replace(tmp, f)
            return
        try:
            os.link(tmp, f)  # fails if f exists: never overwrite another creator's manifest
        except FileExistsError:
            pass
        except OSError:  # filesystems without hard links
            if not f.exists():
                os.replace(tmp, f)
    finally:
        tmp.unlink(missing_ok=True)


def renamed(k: PassageKeys, passage_id: str) -> PassageKeys:
    """``k`` under ``passage_id`` (keys are shared by every passage with the same text)."""
    if k.passage_id == passage_id:
        return k
    return PassageKeys(passage_id, k.keys, k.token_ids, k.offsets)


def checked_rows(
    p: Passage, k: PassageKeys, key_dim: int, holder: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(keys (m, d), token ids (m,), offsets (m, 2))`` of ``k``, after checking that they fit
    passage ``p``'s text and ``holder`` (e.g. ``"store (<fingerprint>, key source 'x')"``), which
    holds ``key_dim``-dimensional keys.

    Raises:
        KeyStoreMismatchError: keys of another dimension.
        ValueError: row counts that disagree, token ids out of int32 range, or offsets
            outside the text.
    """
    keys = np.asarray(k.keys)
    if keys.ndim != 2 or keys.shape[1] != key_dim:
        raise KeyStoreMismatchError(
            f"keys of passage {p.id!r} have shape {keys.shape}; this {holder} holds "
            f"key_dim={key_dim} keys"
        )
    ids = np.asarray(k.token_ids).reshape(-1)
    offs = np.asarray(k.offsets).reshape(-1, 2)
    m = ids.shape[0]
    if keys.shape[0] != m or offs.shape[0] != m:
        raise ValueError(
            f"passage {p.id!r}: keys {keys.shape}, token_ids {ids.shape} and offsets "
            f"{offs.shape} must all have m={m} rows"
        )
    if m and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"passage {p.id!r}: token ids out of int32 range")
    if m and (offs.min() < 0 or offs.max() > len(p.text)):
        raise ValueError(f"passage {p.id!r}: offsets fall outside its {len(p.text)} chars")
    return keys, ids, offs
