"""The DReSD key transform: per-dimension z-score, PCA to 64 dimensions, L2 normalisation
(DReSD spec §2.2 steps 5-7), fitted by covariance eigendecomposition in numpy."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["KeyTransform", "fit_transform"]


@dataclass
class KeyTransform:
    """``k = normalize(((h - mean) / std) @ components.T)`` as fp32.

    Attributes:
        mean: ``(d,)`` per-dimension mean of the fitting sample.
        std: ``(d,)`` per-dimension standard deviation (floored at 1e-6).
        components: ``(p, d)`` principal axes, largest variance first (sign fixed so that the
            largest-magnitude entry of each axis is positive: deterministic across runs).
        explained: ``(p,)`` share of the z-scored variance each axis explains.
        n_fit: rows the transform was fitted on.
    """

    mean: np.ndarray
    std: np.ndarray
    components: np.ndarray
    explained: np.ndarray
    n_fit: int

    @property
    def dim(self) -> int:
        return int(self.components.shape[0])

    @property
    def in_dim(self) -> int:
        return int(self.components.shape[1])

    def __call__(self, h: np.ndarray) -> np.ndarray:
        """``(n, d)`` raw vectors -> ``(n, p)`` fp32 unit vectors (zero rows stay zero)."""
        x = np.asarray(h, dtype=np.float32).reshape(-1, self.in_dim)
        z = (x - self.mean) / self.std
        k = z @ self.components.T
        norm = np.linalg.norm(k, axis=1, keepdims=True)
        return (k / np.maximum(norm, 1e-12)).astype(np.float32)

    def digest(self) -> str:
        """16 hex of a hash of the parameters (goes into the datastore fingerprint)."""
        h = hashlib.sha256()
        for a in (self.mean, self.std, self.components):
            h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
        return h.hexdigest()[:16]

    def save(self, file: str | Path | Any) -> None:
        """Write to a path or a binary file object (``.npz``)."""
        np.savez(file, mean=self.mean, std=self.std, components=self.components,
                 explained=self.explained, n_fit=np.array(self.n_fit))  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> "KeyTransform":
        z = np.load(path)
        return cls(z["mean"], z["std"], z["components"], z["explained"], int(z["n_fit"]))


def fit_transform(sample: np.ndarray, dim: int = 64) -> KeyTransform:
    """Fit the z-score + PCA transform on ``(n, d)`` raw vectors (fp64 statistics)."""
    x = np.asarray(sample, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"PCA needs at least 2 vectors, got an array of shape {x.shape}")
    dim = min(dim, x.shape[1])
    mean = x.mean(axis=0)
    std = np.maximum(x.std(axis=0), 1e-6)
    z = (x - mean) / std
    cov = (z.T @ z) / max(1, len(z) - 1)
    vals, vecs = np.linalg.eigh(cov)  # ascending
    order = np.argsort(vals)[::-1][:dim]
    comps = vecs[:, order].T  # (p, d)
    signs = np.sign(comps[np.arange(dim), np.abs(comps).argmax(axis=1)])
    comps *= np.where(signs == 0, 1.0, signs)[:, None]
    explained = np.maximum(vals[order], 0) / max(float(np.maximum(vals, 0).sum()), 1e-12)
    return KeyTransform(
        mean.astype(np.float32), std.astype(np.float32), comps.astype(np.float32),
        explained.astype(np.float32), int(len(x)),
    )  # fmt: skip
