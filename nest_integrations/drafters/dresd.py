"""DReSD drafting (DReSD spec §2.3): nearest neighbours of the current hidden state in a
corpus-wide datastore propose what followed them in the corpus; the loop verifies exactly.

Per step:

1. query = PCA((DecodeState.hidden - μ)/σ), L2-normalised (the vector that produced the last
   committed token ``x``; it comes from the verify pass already run);
2. top-``k`` rows by cosine similarity (FAISS inner product);
3. first-token filter: keep row g only if ``tokens[g] == x`` (index order kept);
4. up to ``num_drafts`` drafts ``tokens[g+1 : g+1+draft_len]`` (cut at the passage end and at
   EOS), merged into a token tree on their shared prefixes (``shape="tree"``), or only the best
   one as a chain (``shape="chain"``).

Every draft token carries its corpus position as its source, so accepted tokens come back as
verbatim-match provenance (``Citation.kind == "verbatim"``).

Options (``drafter_options``): ``datastore`` (path; default ``<persist dir>/dresd/<collection>``
of the engine's Chroma retriever), ``k`` (50), ``num_drafts``, ``draft_len``, ``shape``,
``max_nodes`` (tree size cap), ``min_score`` (no draft when the best surviving neighbour's cosine
similarity is below it: saves verify work on steps unlikely to be accepted; -1 = off).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Method, Source

LOG = logging.getLogger(__name__)

SHAPES = ("tree", "chain")
#: Defaults measured on 2 CPU cores with SmolLM2-135M (benchmarks/results/lossless.md): one chain
#: beats a 4-draft tree there (a verify forward costs ~linearly more per extra token on CPU), and
#: drafts whose best neighbour has cosine < 0.8 were accepted ~0.2 tokens per step against ~1.0
#: above it (4 probe prompts disjoint from the benchmark's), so they are not worth a verify pass.
DEFAULTS: dict[str, Any] = {
    "k": 50, "num_drafts": 4, "draft_len": 8, "shape": "chain", "max_nodes": 32, "min_score": 0.8,
}  # fmt: skip

_CACHE: "OrderedDict[tuple[str, str, str], Any]" = OrderedDict()
_CACHE_LOCK = threading.Lock()


@dataclass
class DraftStats:
    """Counters summed over the generations of a process (for benchmarks)."""

    proposals: int = 0
    drafts: int = 0
    nodes: int = 0
    trees: int = 0
    search_seconds: float = 0.0
    #: set to a list to record ``(best score, draft nodes, accepted)`` per verified draft
    history: list | None = None

    def reset(self) -> None:
        self.proposals = self.drafts = self.nodes = self.trees = 0
        self.search_seconds = 0.0
        if self.history is not None:
            self.history = []


#: Process-wide counters of every DReSD drafter (reset them before a measurement).
STATS = DraftStats()


def open_datastore(path: str | Path, lm: Any) -> Any:
    """The datastore at ``path`` for ``lm`` (cached: the 2 most recently used stay open)."""
    from nest_integrations.dresd.datastore import DresdDatastore

    root = Path(path)
    current = root / "CURRENT"
    version = current.read_text().strip() if current.exists() else ""
    key = (str(root.resolve()), version, lm.fingerprint)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    ds = DresdDatastore.open(root, lm)
    with _CACHE_LOCK:
        _CACHE[key] = ds
        while len(_CACHE) > 2:
            _CACHE.popitem(last=False)
    return ds


def default_datastore_for(ctx: DrafterContext) -> Path:
    """``<persist dir>/dresd/<collection>`` of the engine's Chroma retriever (``nest`` in the
    default persist dir otherwise)."""
    from nest_integrations.dresd.datastore import default_datastore_path

    retriever = getattr(ctx.engine, "retriever", None)
    collection = getattr(retriever, "collection_name", None) or "nest"
    persist = getattr(retriever, "persist_dir", None)
    return default_datastore_path(collection, persist)


@dataclass
class DresdDrafter:
    """Dense-retrieval drafts for one generation."""

    datastore: Any
    k: int = DEFAULTS["k"]
    num_drafts: int = DEFAULTS["num_drafts"]
    draft_len: int = DEFAULTS["draft_len"]
    shape: str = DEFAULTS["shape"]
    max_nodes: int = DEFAULTS["max_nodes"]
    min_score: float = DEFAULTS["min_score"]
    stats: DraftStats = field(default_factory=lambda: STATS)
    _registered: dict[int, int] = field(default_factory=dict)
    _best: float = -1.0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"dresd shape={self.shape!r} is invalid: allowed one of {SHAPES}")
        for name in ("k", "num_drafts", "draft_len", "max_nodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"dresd {name} must be >= 1, got {getattr(self, name)!r}")

    @classmethod
    def from_context(cls, ctx: DrafterContext) -> "DresdDrafter":
        opts = {**DEFAULTS, **(ctx.options or {})}
        path = opts.get("datastore") or default_datastore_for(ctx)
        ds = open_datastore(path, ctx.lm)
        return cls(
            ds, k=int(opts["k"]), num_drafts=int(opts["num_drafts"]),
            draft_len=int(opts["draft_len"]), shape=str(opts["shape"]),
            max_nodes=int(opts["max_nodes"]), min_score=float(opts["min_score"]),
        )  # fmt: skip

    # ----------------------------------------------------------------------------- drafting

    def candidates(
        self, hidden: Any, last: int, length: int, eos: frozenset[int]
    ) -> list[tuple[int, list[int]]]:
        """``(row, draft tokens)`` of up to ``num_drafts`` neighbours that pass the first-token
        filter, best first (duplicates dropped)."""
        ds = self.datastore
        scores, rows = ds.search(hidden, self.k)
        scores = scores[rows >= 0]
        rows = rows[rows >= 0]
        if len(rows) == 0:
            return []
        keep = np.asarray(ds.tokens[rows]) == last
        rows, scores = rows[keep], scores[keep]
        self._best = float(scores[0]) if len(scores) else -1.0
        if self._best < self.min_score:  # no neighbour is close enough to be worth a verify
            return []
        out: list[tuple[int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for g in rows:
            g = int(g)
            end = int(ds.bounds[ds.passage_of(g) + 1])
            seq = [int(t) for t in ds.tokens[g + 1 : min(g + 1 + length, end)]]
            for i, t in enumerate(seq):
                if t in eos:
                    seq = seq[:i]
                    break
            if not seq or tuple(seq) in seen:
                continue
            seen.add(tuple(seq))
            out.append((g, seq))
            if len(out) >= self.num_drafts:
                break
        return out

    def propose(self, state: DecodeState) -> Draft | None:
        if state.hidden is None:
            return None
        length = min(self.draft_len, state.budget)  # the loop already left room for its token
        if length < 1:
            return None
        ctx = state.context_ids
        if not ctx:
            return None
        t0 = time.perf_counter()
        cands = self.candidates(state.hidden, ctx[-1], length, state.eos)
        if self.shape == "chain" or state.generator is not None:  # sampling: one chain
            cands = cands[:1]
        self.stats.search_seconds += time.perf_counter() - t0
        self.stats.proposals += 1
        return corpus_draft(state, cands, self.datastore, self._registered, self.stats,
                            self.max_nodes)

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        if self.stats.history is not None:
            self.stats.history.append((self._best, len(draft), n_accepted))


def _trie(
    cands: list[tuple[int, list[int]]], max_nodes: int
) -> tuple[list[int], list[int], list[int]]:
    """Merge drafts on shared prefixes: node tokens, parents (topological) and the corpus row
    of each node (from the first, i.e. best, draft that supplies it)."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for g, seq in cands:
        parent = -1
        for i, t in enumerate(seq):
            node = child.get((parent, t))
            if node is None:
                if len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                child[(parent, t)] = node
                tokens.append(t)
                parents.append(parent)
                rows.append(g + 1 + i)
            parent = node
    return tokens, parents, rows


def _make(ctx: DrafterContext) -> DresdDrafter:
    return DresdDrafter.from_context(ctx)


#: ``decoding="dresd"`` (registered in ``drafters/__init__.py``).
METHOD = Method(
    "dresd", _make,
    description="lossless DReSD: dense-retrieval drafts from a corpus-wide token datastore",
)  # fmt: skip


def corpus_draft(
    state: DecodeState, cands: list, datastore: Any, registered: dict, stats: Any, max_nodes: int
) -> Draft | None:
    """The draft (chain or token tree) of corpus candidates, each token sourced to its corpus
    position; passages are registered with the generation once (``registered`` maps datastore
    passage -> generation passage index)."""
    if not cands:
        return None
    tokens, parents, rows = _trie(cands, max_nodes)
    stats.drafts += len(cands)
    stats.nodes += len(tokens)
    sources: list[Source] = []
    for r in rows:
        p = datastore.passage_of(r)
        if p not in registered:  # the drafter lives for one generation
            registered[p] = state.add_passage(datastore.passage(p), datastore.passage_offsets(p))
        sources.append((registered[p], r - int(datastore.bounds[p])))
    tree = any(p != i - 1 for i, p in enumerate(parents))
    stats.trees += tree
    return Draft(tokens, sources, parents=parents if tree else None)
