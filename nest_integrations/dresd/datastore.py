"""The DReSD datastore: one key per corpus token position, one contiguous token array.

Layout of a datastore folder ``ROOT``::

    ROOT/CURRENT             name of the live version folder (replaced atomically)
    ROOT/v-<id>/meta.json    fingerprint (model, key source, PCA digest), sizes, index params
    ROOT/v-<id>/tokens.npy   (n,) int32: every passage's token ids, passages back to back
    ROOT/v-<id>/bounds.npy   (P+1,) int64: passage p holds rows bounds[p]:bounds[p+1]
    ROOT/v-<id>/offsets.npy  (n, 2) int32: char range of each token in its passage text
    ROOT/v-<id>/pca.npz      the key transform (z-score mean/std, PCA components)
    ROOT/v-<id>/index.faiss  inner-product FAISS index, fp16 storage: the only copy of the
                             (n, 64) unit keys; row g is the key whose value is tokens[g]
    ROOT/v-<id>/passages.jsonl  id, text, doc_id, metadata of each passage
    ROOT/.build/             an unfinished build (resumed by the next build of the same source)

Key convention (the NEST key store's, DReSD spec §2.3): key row ``g`` is the LM's
``key_source`` vector at the position that *produced* ``tokens[g]``. At decode time the query is
``DecodeState.hidden`` (the vector that produced the last committed token ``x``); a neighbour
``g`` survives the first-token filter when ``tokens[g] == x`` and drafts
``tokens[g+1 : g+1+L]`` (cut at its passage's end).

Build stages (each resumable; ``callback(stage, done, total)`` after every batch):
``collect`` (raw keys + tokens per batch of passages into ``.build/part-*.npz``), ``pca`` (fit on
at most ``pca_sample`` rows, strided), ``reduce`` (64-d unit fp16 keys per part), ``index``
(assemble the version folder, build the FAISS index, switch ``CURRENT``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from nest_integrations.dresd.index import build_index, read_index, reconstruct_all, write_index
from nest_integrations.dresd.pca import KeyTransform, fit_transform
from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

FORMAT_VERSION = 1
PCA_DIM = 64
PCA_SAMPLE = 1_000_000

Callback = Callable[[str, int, int], None]

__all__ = [
    "DatastoreError",
    "DatastoreMismatchError",
    "DresdDatastore",
    "SourceBatch",
    "PassageSource",
    "build_datastore",
    "default_datastore_path",
]


class DatastoreError(FileNotFoundError):
    """A DReSD datastore is missing or unfinished."""


class DatastoreMismatchError(ValueError):
    """A DReSD datastore was built for another model or key source."""


# --------------------------------------------------------------------------------- sources


@dataclass
class SourceBatch:
    """Passages with their tokens, ``(m, 2)`` char offsets and ``(m, d)`` raw key vectors."""

    passages: list[Passage]
    token_ids: list[np.ndarray]
    offsets: list[np.ndarray]
    keys: list[np.ndarray]


class Source(Protocol):
    #: identifies the source's content (an unfinished build resumes only for the same spec)
    spec: dict[str, Any]
    n_batches: int

    def batch(self, i: int) -> SourceBatch: ...


class PassageSource:
    """Passages encoded on their own (``lm.encode_passages``), or read from a NEST key store
    (``key_store``: a ``DiskKeyStore`` for ``lm``; missing keys are computed and stored there
    by ``ensure_keys``), in batches of ``batch_size`` passages."""

    def __init__(
        self,
        passages: Sequence[Passage],
        lm: Any,
        *,
        key_store: Any = None,
        batch_size: int = 64,
        name: str = "passages",
    ) -> None:
        self.passages = [p for p in passages if p.text]
        self.lm = lm
        self.key_store = key_store
        self.batch_size = batch_size
        ids = hashlib.sha256()
        for p in self.passages:
            ids.update(p.id.encode() + b"\0" + hashlib.sha256(p.text.encode()).digest())
        self.spec = {"kind": name, "n_passages": len(self.passages), "hash": ids.hexdigest()[:16],
                     "batch_size": batch_size}  # fmt: skip
        self.n_batches = math.ceil(len(self.passages) / batch_size)

    def batch(self, i: int) -> SourceBatch:
        chunk = self.passages[i * self.batch_size : (i + 1) * self.batch_size]
        if self.key_store is not None:
            from nest_integrations.index.keys import ensure_keys

            pk = ensure_keys(self.key_store, self.lm, chunk, batch_size=16)
            return SourceBatch(
                chunk, [k.token_ids for k in pk], [k.offsets for k in pk], [k.keys for k in pk]
            )
        toks, offs = zip(*(self.lm.tokenize_with_offsets(p.text) for p in chunk))
        keys = self.lm.encode_passages(list(toks))
        return SourceBatch(chunk, [np.asarray(t) for t in toks], list(offs), keys)


# --------------------------------------------------------------------------------- build


def default_datastore_path(name: str, persist_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<persist_dir>/dresd/<name>`` (default persist dir ``$NEST_HOME/store``); ``name`` is a
    collection name, or ``prompts-<file stem>`` for a response cache."""
    from nest_integrations import paths

    root = Path(persist_dir) if persist_dir is not None else paths.default_persist_dir()
    return root / "dresd" / name


def build_datastore(
    lm: Any,
    source: Source,
    path: str | os.PathLike[str],
    *,
    dim: int = PCA_DIM,
    pca_sample: int = PCA_SAMPLE,
    index_kind: str = "auto",
    progress: bool = False,
    callback: Callback | None = None,
) -> "DresdDatastore":
    """Build (or resume building) the datastore of ``source`` at ``path`` for ``lm``.

    A kill at any point leaves the previous version (if any) live and the finished batches in
    ``path/.build``; the next call with the same source, model and settings resumes there.
    """
    root = Path(path)
    work = root / ".build"
    spec = {
        "format_version": FORMAT_VERSION,
        "source": source.spec,
        "model": lm.fingerprint,
        "key_source": str(lm.key_source),
        "dim": dim,
        "pca_sample": pca_sample,
        "index": index_kind,
    }
    n_parts = source.n_batches
    if n_parts == 0:
        raise ValueError("nothing to build a DReSD datastore from: the source has no passages")
    if work.exists():
        old = _read_json(work / "build.json")
        if old != spec:
            LOG.warning("discarding an unfinished build at %s (other source or settings)", work)
            shutil.rmtree(work)
        else:
            LOG.info("resuming the unfinished build at %s", work)
    work.mkdir(parents=True, exist_ok=True)
    _write_json(work / "build.json", spec)
    t0 = time.perf_counter()

    # 1. collect: raw keys and tokens, one file per batch
    parts = [work / f"part-{i:06d}.npz" for i in range(n_parts)]
    with _bar(progress, n_parts, "dresd: encoding", "batch") as bar:
        bar.update(sum(p.exists() for p in parts))
        for i, part in enumerate(parts):
            if part.exists():
                continue
            _save_part(part, source.batch(i))
            bar.update(1)
            if callback:
                callback("collect", i + 1, n_parts)

    # 2. PCA on a strided sample of at most pca_sample rows
    pca_file = work / "pca.npz"
    lengths = [int(np.load(p)["tokens"].shape[0]) for p in parts]
    n = sum(lengths)
    if n < 2:
        raise ValueError(f"a DReSD datastore needs at least 2 tokens; the source has {n}")
    if not pca_file.exists():
        stride = max(1, math.ceil(n / pca_sample))
        sample, seen = [], 0
        for part in parts:
            keys = np.load(part)["keys"]
            first = (-seen) % stride
            sample.append(keys[first::stride].astype(np.float32))
            seen += len(keys)
        transform = fit_transform(np.concatenate(sample), dim)
        _atomic(pca_file, transform.save)
        if callback:
            callback("pca", 1, 1)
    transform = KeyTransform.load(pca_file)

    # 3. reduce every part to unit fp16 keys
    reduced = [work / f"red-{i:06d}.npy" for i in range(n_parts)]
    with _bar(progress, n_parts, "dresd: PCA keys", "batch") as bar:
        bar.update(sum(r.exists() for r in reduced))
        for i, (part, red) in enumerate(zip(parts, reduced)):
            if red.exists():
                continue
            keys = transform(np.load(part)["keys"]).astype(np.float16)
            _atomic(red, lambda f, k=keys: np.save(f, k))
            bar.update(1)
            if callback:
                callback("reduce", i + 1, n_parts)

    # 4. assemble a new version folder, index it, switch CURRENT
    version = f"v-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    vdir = root / version
    if vdir.exists():
        shutil.rmtree(vdir)
    vdir.mkdir()
    tokens, offsets, bounds, passages = [], [], [0], []
    for part in parts:
        z = np.load(part)
        tokens.append(z["tokens"])
        offsets.append(z["offsets"])
        for length in z["lengths"]:
            bounds.append(bounds[-1] + int(length))
        passages.extend(json.loads(str(z["passages"])))
    keys = np.concatenate([np.load(r) for r in reduced])
    np.save(vdir / "tokens.npy", np.concatenate(tokens).astype(np.int32))
    np.save(vdir / "offsets.npy", np.concatenate(offsets).astype(np.int32))
    np.save(vdir / "bounds.npy", np.asarray(bounds, dtype=np.int64))
    shutil.copyfile(pca_file, vdir / "pca.npz")
    with open(vdir / "passages.jsonl", "w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    with _bar(progress, 1, "dresd: FAISS index", "index") as bar:
        index, params = build_index(keys.astype(np.float32), index_kind)
        write_index(index, vdir / "index.faiss")
        bar.update(1)
    meta = {
        "format_version": FORMAT_VERSION,
        "fingerprint": {
            "model": lm.fingerprint,
            "key_source": str(lm.key_source),
            "pca": transform.digest(),
            "dim": transform.dim,
        },
        "source": source.spec,
        "n_tokens": int(n),
        "n_passages": len(passages),
        "pca_fit_rows": transform.n_fit,
        "pca_explained": float(transform.explained.sum()),
        "index": params,
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    _write_json(vdir / "meta.json", meta)
    if callback:
        callback("index", 1, 1)
    _atomic_text(root / "CURRENT", version)
    for old in root.glob("v-*"):  # the previous version, and any a killed build left half-made
        if old.name != version and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    LOG.info("built DReSD datastore %s: %d tokens, %d passages, %s index", root, n,
             len(passages), params["kind"])  # fmt: skip
    return DresdDatastore.open(root, lm)


def _save_part(path: Path, b: SourceBatch) -> None:
    keep = [i for i, t in enumerate(b.token_ids) if len(t)]
    meta = [
        {"id": b.passages[i].id, "text": b.passages[i].text, "doc_id": b.passages[i].doc_id,
         "metadata": _jsonable(b.passages[i].metadata)}
        for i in keep
    ]  # fmt: skip
    d = int(np.asarray(b.keys[keep[0]]).shape[1]) if keep else 1

    def write(f: Any) -> None:
        np.savez(
            f,
            tokens=np.concatenate([np.asarray(b.token_ids[i], np.int32) for i in keep])
            if keep else np.zeros(0, np.int32),
            offsets=np.concatenate([np.asarray(b.offsets[i], np.int32).reshape(-1, 2)
                                    for i in keep]) if keep else np.zeros((0, 2), np.int32),
            keys=np.concatenate([np.asarray(b.keys[i], np.float16) for i in keep])
            if keep else np.zeros((0, d), np.float16),
            lengths=np.asarray([len(b.token_ids[i]) for i in keep], np.int64),
            passages=np.array(json.dumps(meta, ensure_ascii=False)),
        )  # fmt: skip

    _atomic(path, write)


# --------------------------------------------------------------------------------- load


class DresdDatastore:
    """A built datastore (memory-mapped), ready for ``search`` and drafting.

    Open it with ``DresdDatastore.open(path, lm)``; ``lm`` is checked against the fingerprint.
    """

    def __init__(self, root: Path, vdir: Path, meta: dict[str, Any]) -> None:
        self.root = root
        self.vdir = vdir
        self.meta = meta
        self.tokens: np.ndarray = np.load(vdir / "tokens.npy", mmap_mode="r")
        self.bounds: np.ndarray = np.load(vdir / "bounds.npy")
        self.offsets: np.ndarray = np.load(vdir / "offsets.npy", mmap_mode="r")
        self._keys: np.ndarray | None = None
        self.transform = KeyTransform.load(vdir / "pca.npz")
        self.index = read_index(vdir / "index.faiss", meta["index"])
        with open(vdir / "passages.jsonl", encoding="utf-8") as f:
            self._passages = [json.loads(line) for line in f if line.strip()]
        if len(self._passages) + 1 != len(self.bounds) or self.index.ntotal != len(self.tokens):
            raise DatastoreError(f"DReSD datastore at {root} is inconsistent: rebuild it")

    @classmethod
    def open(cls, path: str | os.PathLike[str], lm: Any = None) -> "DresdDatastore":
        """The live version at ``path``; with ``lm``, refuse a datastore built for another model
        or key source (``DatastoreMismatchError``)."""
        root = Path(path)
        current = root / "CURRENT"
        if not current.exists():
            if (root / ".build").exists():
                raise DatastoreError(
                    f"the DReSD datastore at {root} is unfinished (a build was interrupted): "
                    "rerun the same `nest dresd build ...` command to resume it"
                )
            raise DatastoreError(
                f"no DReSD datastore at {root}: build one with `nest dresd build --collection "
                "NAME` or `nest dresd build --from-prompts FILE.jsonl` (or pass "
                "drafter_options={'datastore': PATH})"
            )
        vdir = root / current.read_text().strip()
        meta = _read_json(vdir / "meta.json")
        if meta is None:
            raise DatastoreError(f"DReSD datastore at {root} has no meta.json: rebuild it")
        if lm is not None:
            check_fingerprint(meta, lm, root)
        return cls(root, vdir, meta)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def keys(self) -> np.ndarray:
        """``(n, p)`` fp16 unit keys, read back from the index (the only stored copy)."""
        if self._keys is None:
            self._keys = reconstruct_all(self.index).astype(np.float16)
        return self._keys

    @property
    def n_passages(self) -> int:
        return len(self._passages)

    def nbytes(self) -> int:
        """Bytes on disk of the live version."""
        return sum(f.stat().st_size for f in self.vdir.iterdir() if f.is_file())

    def query(self, hidden: Any) -> np.ndarray:
        """``(1, p)`` unit query from a ``(d,)`` LM vector (torch or numpy)."""
        if hasattr(hidden, "detach"):
            hidden = hidden.detach().float().cpu().numpy()
        return self.transform(np.asarray(hidden, dtype=np.float32).reshape(1, -1))

    def search(self, hidden: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows by cosine similarity to the transformed ``hidden``: ``(k,)`` scores
        and ``(k,)`` rows (-1 where fewer)."""
        scores, rows = self.index.search(self.query(hidden), k)
        return scores[0], rows[0]

    def passage_of(self, row: int) -> int:
        """Index of the passage holding token row ``row``."""
        return int(np.searchsorted(self.bounds, row, side="right") - 1)

    def passage(self, p: int) -> Passage:
        d = self._passages[p]
        return Passage(id=d["id"], text=d["text"], doc_id=d.get("doc_id", ""),
                       metadata=dict(d.get("metadata") or {}))  # fmt: skip

    def passage_offsets(self, p: int) -> np.ndarray:
        return np.asarray(self.offsets[self.bounds[p] : self.bounds[p + 1]])

    def stats(self) -> dict[str, Any]:
        n = len(self)
        size = self.nbytes()
        return {
            "path": str(self.root),
            "n_tokens": n,
            "n_passages": self.n_passages,
            "bytes_on_disk": size,
            "bytes_per_token": size / max(1, n),
            **{k: self.meta[k] for k in ("fingerprint", "source", "index", "pca_explained")},
        }


def check_fingerprint(meta: dict[str, Any], lm: Any, root: Path) -> None:
    fp = meta["fingerprint"]
    if (fp["model"], fp["key_source"]) != (lm.fingerprint, str(lm.key_source)):
        raise DatastoreMismatchError(
            f"the DReSD datastore at {root} was built for model {fp['model']} (key source "
            f"{fp['key_source']!r}), but the engine runs {lm.fingerprint} (key source "
            f"{str(lm.key_source)!r}): rebuild it with `nest dresd build` for this model"
        )


# --------------------------------------------------------------------------------- helpers


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def __enter__(self) -> "_NoBar":
        return self
    def __exit__(self, *a: Any) -> None: ...


def _bar(progress: bool, total: int, desc: str, unit: str) -> Any:
    if not progress:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit)


def _atomic(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_text(path: Path, text: str) -> None:
    _atomic(path, lambda f: f.write(text.encode("utf-8")))


def _write_json(path: Path, obj: Any) -> None:
    _atomic_text(path, json.dumps(obj, indent=2, sort_keys=True))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(meta, default=str))

