"""Key codecs: how token keys are stored on disk (``nest ingest --key-codec fp16|int8|pq``).

A codec turns ``(n, d)`` float keys into ``(n, code_size)`` bytes and back. Only keys are
compressed: token ids and character offsets are stored exactly, so citations stay exact under
every codec; what a lossy codec changes is which neighbours are found and how far they are.

- ``fp16`` (default): IEEE half precision, 2 bytes per dimension; lossless for the kNN at the
  precision the engine searches in (keys are upcast to fp32 on the device).
- ``fp32``: 4 bytes per dimension, for models whose activations overflow fp16 (> 65504).
- ``int8``: per-dimension scalar quantisation, 1 byte per dimension (half of fp16). Each
  dimension ``j`` is mapped linearly from ``[lo_j, hi_j]`` onto 0..255 (values outside are
  clipped); ``lo``/``hi`` are the per-dimension min/max of a training sample, widened by
  ``margin`` of the range.
- ``pq``: FAISS product quantisation, ``m`` sub-vectors of ``d / m`` dimensions, each coded by
  one byte (256 centroids, trained with k-means on a sample). The default ``m = d / 8`` gives
  ``d / 8`` bytes per key: 1/16 of fp16.

int8 halves fp16's bytes with no measurable change; pq costs recall and raises lambda, so
recalibrate after a switch to pq (``benchmarks/results/key_codecs.md``).

Trained codecs (``int8``, ``pq``) must be trained once, on a sample of the corpus's keys, before
the first key is stored; their tables are saved with the store (``save``/``load``) and their
``fingerprint`` (a digest of name, shape and tables) is recorded in the store manifest, so keys
coded with one set of tables are never decoded with another.

Example::

    codec = make_codec("int8", key_dim=576)
    codec.train(sample_keys)                 # (n, 576) float32, n >= a few thousand rows
    codes = codec.encode(keys)               # (m, 576) uint8
    approx = codec.decode(codes)             # (m, 576) float32
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

LOG = logging.getLogger(__name__)

CODECS = ("fp16", "fp32", "int8", "pq")
DEFAULT_CODEC = "fp16"
#: Rows a trained codec wants for training (PQ: about 40 points per centroid, 256 centroids).
MIN_TRAIN_ROWS = {"int8": 256, "pq": 2048}
WANT_TRAIN_ROWS = {"int8": 20_000, "pq": 20_000}

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "KeyCodec",
    "CodecNotTrainedError",
    "make_codec",
    "load_codec",
    "check_key_dim",
]


def check_key_dim(key_dim: Any) -> None:
    """Raise ValueError unless ``key_dim`` is an integer >= 1 (not a bool)."""
    if not isinstance(key_dim, int) or isinstance(key_dim, bool) or key_dim < 1:
        raise ValueError(f"key_dim={key_dim!r} is invalid: allowed an integer >= 1")


class CodecNotTrainedError(RuntimeError):
    """A trained codec (int8, pq) was asked to code keys before ``train``."""


class KeyCodec:
    """Base class: raw float codecs (``fp16``, ``fp32``). Subclasses add training."""

    name = "fp16"
    needs_training = False

    def __init__(self, key_dim: int, dtype: str = "float16") -> None:
        check_key_dim(key_dim)
        self.key_dim = key_dim
        self.dtype = np.dtype(dtype).newbyteorder("<")

    # -- sizes and identity -------------------------------------------------------------------
    @property
    def code_size(self) -> int:
        """Bytes per stored key."""
        return self.key_dim * self.dtype.itemsize

    @property
    def trained(self) -> bool:
        return True

    def params(self) -> dict[str, Any]:
        """JSON-able description (recorded in the namespace manifest)."""
        return {"codec": self.name, "key_dim": self.key_dim}

    def fingerprint(self) -> str:
        """Digest of the name, shape and trained tables: equal fingerprints decode alike."""
        h = hashlib.sha256(json.dumps(self.params(), sort_keys=True).encode())
        for arr in self._tables():
            h.update(np.ascontiguousarray(arr).tobytes())
        return f"{self.name}-{h.hexdigest()[:16]}"

    # -- coding -------------------------------------------------------------------------------
    def train(self, sample: np.ndarray) -> None:
        """Fit the codec to a sample of keys (a no-op for raw codecs)."""

    def encode(self, keys: np.ndarray) -> np.ndarray:
        """``(n, d)`` float keys -> ``(n, code_size)`` uint8 codes."""
        keys = self._check(keys)
        with np.errstate(over="ignore"):  # overflow is reported below
            out = np.ascontiguousarray(keys, dtype=self.dtype)
        if not np.isfinite(out).all():
            raise ValueError(
                f"keys are not finite in {self.dtype.name} (fp16 overflows above 65504); "
                "use the fp32 codec"
            )
        return out.view(np.uint8).reshape(len(out), self.code_size)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """``(n, code_size)`` uint8 codes -> ``(n, d)`` keys (this codec's float dtype)."""
        codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1, self.code_size)
        return codes.view(self.dtype).reshape(len(codes), self.key_dim)

    # -- persistence --------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """Write the trained tables to ``folder/codec.npz`` (atomically; raw codecs: nothing)."""
        if not self.needs_training:
            return
        if not self.trained:
            raise CodecNotTrainedError(f"the {self.name} codec is not trained; nothing to save")
        folder = Path(folder)
        buf = io.BytesIO()
        np.savez(buf, **{f"t{i}": t for i, t in enumerate(self._tables())})
        tmp = folder / f"codec.npz.{id(self)}.tmp"
        tmp.write_bytes(buf.getvalue())
        tmp.replace(folder / "codec.npz")

    def load(self, folder: str | Path) -> None:
        """Read the trained tables saved by ``save``."""
        if not self.needs_training:
            return
        f = Path(folder) / "codec.npz"
        with np.load(f) as z:
            self._set_tables([z[f"t{i}"] for i in range(len(z.files))])

    # -- internals ----------------------------------------------------------------------------
    def _tables(self) -> list[np.ndarray]:
        return []

    def _set_tables(self, tables: list[np.ndarray]) -> None:  # pragma: no cover - raw codecs
        pass

    def _check(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys)
        if keys.ndim != 2 or keys.shape[1] != self.key_dim:
            raise ValueError(f"keys have shape {keys.shape}; the codec codes d={self.key_dim}")
        return keys

    def _need_trained(self) -> None:
        if not self.trained:
            raise CodecNotTrainedError(
                f"the {self.name} codec must be trained on a sample of keys before it codes any"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params()})"


class Fp32Codec(KeyCodec):
    name = "fp32"

    def __init__(self, key_dim: int) -> None:
        super().__init__(key_dim, "float32")


class Int8Codec(KeyCodec):
    """Per-dimension scalar quantisation to 0..255 over ``[lo, hi]`` of a training sample."""

    name = "int8"
    needs_training = True

    def __init__(self, key_dim: int, margin: float = 0.02) -> None:
        super().__init__(key_dim, "float32")
        self.margin = float(margin)
        self.lo: np.ndarray | None = None
        self.scale: np.ndarray | None = None  # (hi - lo) / 255

    @property
    def code_size(self) -> int:
        return self.key_dim

    @property
    def trained(self) -> bool:
        return self.lo is not None

    def params(self) -> dict[str, Any]:
        return {**super().params(), "margin": self.margin}

    def train(self, sample: np.ndarray) -> None:
        x = self._check(sample).astype(np.float32)
        if len(x) < 2:
            raise ValueError(f"int8 training needs at least 2 keys, got {len(x)}")
        lo, hi = x.min(axis=0), x.max(axis=0)
        pad = (hi - lo) * self.margin
        lo, hi = lo - pad, hi + pad
        span = np.maximum(hi - lo, 1e-6)  # a constant dimension still decodes to its value
        self.lo = lo.astype(np.float32)
        self.scale = (span / 255.0).astype(np.float32)

    def encode(self, keys: np.ndarray) -> np.ndarray:
        self._need_trained()
        x = self._check(keys).astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("keys are not finite")
        q = np.rint((x - self.lo) / self.scale)
        return np.clip(q, 0, 255).astype(np.uint8)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        self._need_trained()
        c = np.asarray(codes, dtype=np.uint8).reshape(-1, self.key_dim)
        return (c.astype(np.float32) * self.scale + self.lo).astype(np.float32)

    def _tables(self) -> list[np.ndarray]:
        return [] if self.lo is None else [self.lo, self.scale]

    def _set_tables(self, tables: list[np.ndarray]) -> None:
        lo, scale = tables
        if lo.shape != (self.key_dim,) or scale.shape != (self.key_dim,):
            raise ValueError(f"int8 tables have shapes {lo.shape}, {scale.shape}")
        self.lo, self.scale = lo.astype(np.float32), scale.astype(np.float32)


class PQCodec(KeyCodec):
    """FAISS product quantisation: ``m`` sub-quantisers of 256 centroids (1 byte each)."""

    name = "pq"
    needs_training = True

    def __init__(self, key_dim: int, m: int | None = None) -> None:
        super().__init__(key_dim, "float32")
        m = m if m is not None else _default_pq_m(key_dim)
        if not isinstance(m, int) or m < 1 or key_dim % m:
            raise ValueError(
                f"pq m={m!r} is invalid for d={key_dim}: m must be a positive divisor of d"
            )
        self.m = m
        self._pq: Any = None
        self._trained = False

    @property
    def code_size(self) -> int:
        return self.m

    @property
    def trained(self) -> bool:
        return self._trained

    def params(self) -> dict[str, Any]:
        return {**super().params(), "m": self.m, "nbits": 8}

    def train(self, sample: np.ndarray) -> None:
        x = np.ascontiguousarray(self._check(sample), dtype=np.float32)
        if len(x) < 256:
            raise ValueError(
                f"pq training needs at least 256 keys (one per centroid), got {len(x)}; "
                f"about {WANT_TRAIN_ROWS['pq']:,} give good codebooks"
            )
        if len(x) < MIN_TRAIN_ROWS["pq"]:
            LOG.warning("training pq on only %d keys: codebooks will be coarse", len(x))
        pq = self._new()
        pq.train(x)
        self._pq, self._trained = pq, True

    def encode(self, keys: np.ndarray) -> np.ndarray:
        self._need_trained()
        x = np.ascontiguousarray(self._check(keys), dtype=np.float32)
        if not np.isfinite(x).all():
            raise ValueError("keys are not finite")
        if not len(x):
            return np.zeros((0, self.m), np.uint8)
        return self._pq.compute_codes(x)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        self._need_trained()
        c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1, self.m)
        if not len(c):
            return np.zeros((0, self.key_dim), np.float32)
        return self._pq.decode(c)

    def _tables(self) -> list[np.ndarray]:
        if not self._trained:
            return []
        import faiss

        return [faiss.vector_to_array(self._pq.centroids).astype(np.float32)]

    def _set_tables(self, tables: list[np.ndarray]) -> None:
        import faiss

        (cent,) = tables
        if cent.size != self.key_dim * 256:
            raise ValueError(f"pq centroids have {cent.size} values; expected {self.key_dim * 256}")
        pq = self._new()
        faiss.copy_array_to_vector(np.ascontiguousarray(cent, np.float32).ravel(), pq.centroids)
        if hasattr(pq, "sync_transposed_centroids"):
            pq.sync_transposed_centroids()
        self._pq, self._trained = pq, True

    def _new(self) -> Any:
        import faiss

        pq = faiss.ProductQuantizer(self.key_dim, self.m, 8)
        pq.cp.min_points_per_centroid = 1  # small samples: we log once instead of FAISS per sub-vector
        pq.cp.verbose = False
        return pq


def _default_pq_m(key_dim: int) -> int:
    """``d / 8`` sub-vectors when 8 divides d, else the largest divisor of d not above d / 8."""
    target = max(1, key_dim // 8)
    return next(m for m in range(target, 0, -1) if key_dim % m == 0)


def make_codec(name: str, key_dim: int, **options: Any) -> KeyCodec:
    """A new (untrained, for int8/pq) codec. ``options``: ``margin`` (int8), ``m`` (pq)."""
    if name not in CODECS:
        raise ValueError(f"key codec {name!r} is unknown: allowed one of {CODECS}")
    if name == "fp16":
        _no_options(name, options)
        return KeyCodec(key_dim)
    if name == "fp32":
        _no_options(name, options)
        return Fp32Codec(key_dim)
    if name == "int8":
        return Int8Codec(key_dim, **options)
    return PQCodec(key_dim, **options)


def load_codec(params: dict[str, Any], folder: str | Path | None = None) -> KeyCodec:
    """The codec described by ``params`` (``KeyCodec.params()``), with tables from ``folder``."""
    p = dict(params)
    name, key_dim = p.pop("codec"), p.pop("key_dim")
    p.pop("nbits", None)
    codec = make_codec(name, key_dim, **p)
    if codec.needs_training and folder is not None and (Path(folder) / "codec.npz").exists():
        codec.load(folder)
    return codec


def _no_options(name: str, options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"the {name} codec takes no options, got {sorted(options)}")
