"""Token keys of passages: encoding them with the LM, and filling any ``KeyStore`` with them.

``encode_keys`` tokenises and encodes passages (NEST spec §5: each passage on its own, so keys can
be computed once at ingest); ``ensure_keys`` loads the stored keys of passages and encodes and
stores the missing ones, training a store's int8/pq codec first when it is not trained yet. Keys
are addressed by ``content_hash`` of the passage text, in every store.

Example::

    store = DiskKeyStore.open(keys_dir(persist_dir), lm)
    memory = ensure_keys(store, lm, passages)     # encodes only passages not stored yet
    fresh = encode_keys(lm, passages, np.dtype(np.float16))   # no store involved
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Sequence

import numpy as np

from nest_integrations.index import _disk
from nest_integrations.index import codecs as _codecs
from nest_integrations.index.base import KeyStoreMismatchError
from nest_integrations.types import Passage, PassageKeys

LOG = logging.getLogger(__name__)

__all__ = ["check_lm", "content_hash", "empty_keys", "encode_keys", "ensure_keys", "train_codec"]


def content_hash(text: str) -> str:
    """The address of a passage's keys: sha256 of its utf-8 text, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_keys(lm: Any, batch: Sequence[Passage], dtype: np.dtype) -> list[PassageKeys]:
    """Tokenise (``lm.tokenize_with_offsets``) and encode (``lm.encode_passages``) a batch of
    passages in one call: one ``PassageKeys`` per passage, keys in ``dtype`` (empty passages
    get 0 keys). Raises ValueError when the LM returns keys of the wrong number or shape."""
    tokenised = [lm.tokenize_with_offsets(p.text) for p in batch]
    nonempty = [i for i, (ids, _) in enumerate(tokenised) if len(ids)]
    vecs = lm.encode_passages([list(tokenised[i][0]) for i in nonempty]) if nonempty else []
    if len(vecs) != len(nonempty):
        raise ValueError(f"encode_passages returned {len(vecs)} arrays for {len(nonempty)} inputs")
    out = [empty_keys(p.id, lm.key_dim, dtype) for p in batch]
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


def check_lm(store: Any, lm: Any) -> None:
    """Refuse (``KeyStoreMismatchError``) to fill a store with another model's keys."""
    theirs = [getattr(store, a, None) for a in ("fingerprint", "key_source", "key_dim")]
    ours = [lm.fingerprint, lm.key_source, lm.key_dim]
    if any(t is not None and t != o for t, o in zip(theirs, ours)):
        raise KeyStoreMismatchError(
            f"key store {store!r} holds keys of model {theirs[0]} (key source {theirs[1]!r}, "
            f"d={theirs[2]}) but the LM is {ours[0]} (key source {ours[1]!r}, d={ours[2]})"
        )


def empty_keys(passage_id: str, key_dim: int, dtype: np.dtype) -> PassageKeys:
    """The keys of a passage without tokens."""
    return PassageKeys(
        passage_id=passage_id,
        keys=np.zeros((0, key_dim), dtype=dtype),
        token_ids=np.zeros(0, dtype=np.int64),
        offsets=np.zeros((0, 2), dtype=np.int32),
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
    check_lm(store, lm)
    dtype = np.dtype(getattr(store, "dtype", np.float16))
    found = store.get_keys(passages)
    missing: dict[str, Passage] = {}
    for p, k in zip(passages, found):
        if k is None:
            missing.setdefault(content_hash(p.text), p)
    todo = list(missing.values())
    computed: dict[str, PassageKeys] = {}
    codec = getattr(store, "codec", None)
    training = bool(todo) and needs_training(store)
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
        keys = encode_keys(lm, batch, dtype)
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
    if not needs_training(store):
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


def needs_training(store: Any) -> bool:
    """Whether ``store`` has a trained codec (int8, pq) that is not trained yet."""
    codec = getattr(store, "codec", None)
    if codec is None or not getattr(codec, "needs_training", False):
        return False
    ready = getattr(store, "codec_ready", None)
    return not (ready() if callable(ready) else codec.trained)
