"""The per-query token memory (NEST stage 2) and its exact fp32 nearest-neighbour search.

The memory is the union of the keys of the b retrieved passages: N rows, each a key vector,
its value token, and where that token sits (passage index, token position). Search is exact
brute force in fp32 (N is at most about 40 x 200 = 8000), so no ANN index is involved.

On a CPU the search runs on host arrays (torch's product, then numpy: in place, one sort): a
NEST step searches right after a decode has evicted the caches, where each small torch op costs
10-50 us. (numpy's BLAS product was faster, 0.08 against 0.22 ms for 900 x 576 keys, but its
OpenBLAS threads spin after a call and starved llama.cpp's decode at 2 threads.) On another
device it runs in torch; both give the same neighbours up to fp32 rounding of the distances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from nest_integrations.types import PassageKeys


@dataclass
class Hits:
    """The r_eff nearest unmasked keys of each query, nearest first.

    Attributes:
        dist: ``(T, r_eff)`` fp32 squared L2 distances, clamped at >= 0.
        rows: ``(T, r_eff)`` int64 memory rows.
    """

    dist: torch.Tensor
    rows: torch.Tensor

    @property
    def empty(self) -> bool:
        return self.rows.shape[-1] == 0


class TokenMemory:
    """Keys, values and sources of the retrieved passages, with a mask of used keys.

    Row layout: passage ``p`` occupies rows ``starts[p] .. starts[p] + lengths[p] - 1``, and
    row ``starts[p] + j`` is the key whose value is token ``j`` of that passage.
    """

    def __init__(self, passage_keys: Sequence[PassageKeys], device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.lengths = [len(pk) for pk in passage_keys]
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(int).tolist()
        self.passage_ids = [pk.passage_id for pk in passage_keys]
        self.offsets = [pk.offsets for pk in passage_keys]
        n = int(sum(self.lengths))
        dims = {pk.keys.shape[1] for pk in passage_keys if len(pk)}
        if len(dims) > 1:
            raise ValueError(f"passage keys have mixed dimensions {sorted(dims)}")
        self.dim = dims.pop() if dims else 0
        if n:
            keys = np.concatenate([pk.keys for pk in passage_keys if len(pk)], axis=0)
            values = np.concatenate([pk.token_ids for pk in passage_keys if len(pk)])
        else:
            keys = np.zeros((0, self.dim), dtype=np.float32)
            values = np.zeros((0,), dtype=np.int64)
        # (N, d) fp32: keys are stored in fp16 and uploaded as they are (half the bytes to a
        # GPU), then upcast on the device: distances are always computed in fp32.
        self.keys = torch.from_numpy(np.ascontiguousarray(keys)).to(self.device).float()
        self.key_sq = (self.keys * self.keys).sum(-1)  # (N,)
        self.values = torch.from_numpy(values.astype(np.int64)).to(self.device)  # (N,)
        self.passage_of = torch.repeat_interleave(
            torch.arange(len(self.lengths)), torch.tensor(self.lengths, dtype=torch.long)
        ).to(self.device)  # (N,)
        # Host mirrors: per-row lookups (source, value, used) never sync with a GPU.
        self.values_host = values.astype(np.int64)  # (N,) the values, in host memory
        self._values_list = self.values_host.tolist()
        self.passage_host = np.repeat(np.arange(len(self.lengths)), self.lengths)  # (N,)
        self._passage_list = self.passage_host.tolist()
        self._used_host = np.zeros(n, dtype=bool)
        # (N,) bool: the device's copy, or on a CPU the host mirror itself (one write per mask)
        self.used = (torch.from_numpy(self._used_host) if self.device.type == "cpu"
                     else torch.zeros(n, dtype=torch.bool, device=self.device))
        self._n_used = 0  # keys masked so far (the count of _used_host, kept by mask)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_available(self) -> int:
        return len(self) - self._n_used

    def source(self, row: int) -> tuple[int, int]:
        """(passage index, token position) of a row."""
        p = self._passage_list[row]
        return p, row - self.starts[p]

    def value(self, row: int) -> int:
        return self._values_list[row]

    def mask(self, rows: Sequence[int]) -> None:
        """Mark keys as used so they are never retrieved again in this generation."""
        if len(rows):
            rows = list(rows)
            self._used_host[rows] = True
            if self.device.type != "cpu":
                self.used[torch.as_tensor(rows, dtype=torch.long, device=self.device)] = True
            self._n_used = int(self._used_host.sum())

    def is_used(self, row: int) -> bool:
        """Whether ``row`` was masked (from the host mirror: no device sync)."""
        return bool(self._used_host[row])

    def search(self, queries: torch.Tensor, r: int) -> Hits:
        """Exact top-r_eff search over unmasked keys; r_eff = min(r, available keys).

        Args:
            queries: ``(T, d)`` query vectors (any float dtype; computed in fp32).
        """
        t = queries.shape[0]
        r_eff = min(r, self.n_available)
        if r_eff == 0:
            empty = torch.zeros((t, 0), device=self.device)
            return Hits(empty, empty.long())
        if self.device.type == "cpu":
            return self._search_host(queries, r_eff)
        return self._search_device(queries, r_eff)

    def _search_host(self, queries: torch.Tensor, r_eff: int) -> Hits:
        """``search`` on host arrays (a CPU memory). Equal distances are ordered by row."""
        qt = queries.detach().cpu().float()
        q = qt.numpy()
        # ||q - k||^2 = -2 q.k + ||k||^2 + ||q||^2, in fp32, clamped (cancellation can go < 0);
        # in place: each fresh buffer costs on caches a decode has just evicted.
        # The product through torch, whose pool keeps to the engine's threads: numpy's BLAS
        # (OpenBLAS) spins its own threads after a call, and at 2+ threads they took the cores
        # from llama.cpp's next decode (the default on held-out leads at 2 threads: 15 tok/s
        # against 49 with OPENBLAS_NUM_THREADS=1).
        dist = (qt @ self.keys.T).numpy()  # (T, N)
        dist *= -2.0
        dist += self.key_sq.numpy()
        dist += (q * q).sum(-1, keepdims=True)
        np.maximum(dist, 0.0, out=dist)
        if self._n_used:
            dist[:, self._used_host] = np.inf
        if r_eff >= self.n_available:  # every unmasked key: one sort, masked ones (inf) last
            rows = np.argsort(dist, axis=1, kind="stable")[:, :r_eff]
        else:  # the r_eff nearest, then sorted by distance (equal ones by row)
            rows = np.sort(np.argpartition(dist, r_eff - 1, axis=1)[:, :r_eff], axis=1)
            rows = np.take_along_axis(rows, np.argsort(np.take_along_axis(dist, rows, 1), axis=1,
                                                       kind="stable"), 1)
        near = dist[0, rows] if len(dist) == 1 else np.take_along_axis(dist, rows, 1)
        return Hits(torch.from_numpy(near), torch.from_numpy(rows.astype(np.int64, copy=False)))

    def _search_device(self, queries: torch.Tensor, r_eff: int) -> Hits:
        """``search`` in torch, on the memory's device (a GPU)."""
        q = queries.to(self.device, torch.float32)
        dist = (q * q).sum(-1, keepdim=True) + self.key_sq[None, :] - 2.0 * (q @ self.keys.T)
        dist = dist.clamp_min_(0.0)  # (T, N)
        if self._n_used:
            dist = dist.masked_fill(self.used[None, :], float("inf"))
        top = torch.topk(dist, r_eff, dim=-1, largest=False, sorted=True)
        return Hits(top.values, top.indices)

    def span(self, row: int, n: int, stop_ids: frozenset[int] = frozenset()) -> list[int]:
        """Rows of up to ``n`` corpus tokens starting at ``row``, cut at the passage end and
        before any stop (EOS) token; never crossing into another passage."""
        p = self._passage_list[row]
        end = min(row + n, self.starts[p] + self.lengths[p])
        rows = []
        for r in range(row, end):
            if self._values_list[r] in stop_ids:
                break
            rows.append(r)
        return rows
