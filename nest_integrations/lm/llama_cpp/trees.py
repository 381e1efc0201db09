"""Token trees (DReSD-tree, REST) in one decode: each leaf gets a sequence, and a node belongs
to the sequences of the leaves below it, so it attends to the cache, its ancestors and itself
(llama.cpp's mask follows a token's first sequence). ``select_path`` keeps the accepted path in
the cache's own sequence and drops the branches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from nest_integrations.lm.llama_cpp.sequences import MAX_SEQUENCES, LlamaCppCache

if TYPE_CHECKING:
    from nest_integrations.lm.llama_cpp.context import LlamaCppRuntime


@dataclass
class TokenTree:
    """The token tree of a cache's last ``forward_tree``, until ``select_cache``."""

    start: int
    depth: list[int]
    parents: list[int]
    seq_of: list[int]  # per node, a leaf sequence below it (its cells hold the node's path)
    branches: list[int]  # the sequences to drop afterwards


def tree_leaves(parents: Sequence[int]) -> list[int]:
    """The leaves of a tree of ``parents`` (checked: ``parents[i] < i``), at most
    ``MAX_SEQUENCES // 2`` of them (each takes a sequence)."""
    has_child = {p for p in parents if p >= 0}
    leaves = [i for i in range(len(parents)) if i not in has_child]
    if len(leaves) > MAX_SEQUENCES // 2:
        raise ValueError(f"a token tree may have at most {MAX_SEQUENCES // 2} leaves on "
                         f"llama.cpp, got {len(leaves)}")
    return leaves


def decode_tree(rt: LlamaCppRuntime, cache: LlamaCppCache, ids: list[int], par: list[int],
                leaves: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Decode the tree after the cache's positions (node i at ``length + depth(i)``) and record
    it in ``cache.tree``: fp32 ``(T, V)`` logits and ``(T, d)`` keys."""
    from nest_integrations.lm.tree import tree_depths

    pool, start = rt.sequences, cache.length
    branches: list[int] = []
    try:
        for _ in leaves[1:]:
            branches.append(pool.take())
    except BaseException:
        for s in branches:
            pool.give_back(s)
        raise
    cache.held.extend(branches)  # given back with the cache if it is dropped as it is
    leaf_seq = dict(zip(leaves, [cache.seq] + branches))
    for s in branches:  # each branch sequence starts with the cached prefix
        pool.copy(cache.seq, s, 0, start)
    node_seqs: list[list[int]] = [[] for _ in ids]
    for leaf in leaves:  # a node belongs to the sequences of the leaves below it
        node = leaf
        while node >= 0:
            node_seqs[node].append(leaf_seq[leaf])
            node = par[node]
    depth = tree_depths(par)
    cache.tree = TokenTree(start, depth, par, [s[0] for s in node_seqs], branches)
    try:
        logits, keys = rt.decode(ids, node_seqs, [start + d for d in depth], keys=True)
    except BaseException:
        drop_branches(rt, cache)
        pool.remove(cache.seq, start)
        raise
    cache.length = start + len(ids)
    return logits, keys


def select_path(rt: LlamaCppRuntime, cache: LlamaCppCache, keep: list[int]) -> None:
    """Keep the root-to-node path ``keep`` (``keep[j]`` at depth j) of the cache's tree in its
    own sequence, and drop the branches."""
    tree = cache.tree
    assert tree is not None
    start = tree.start
    if not all(0 <= k < len(tree.depth) and tree.depth[k] == j
               and (j == 0 or tree.parents[k] == keep[j - 1])
               for j, k in enumerate(keep)):
        raise ValueError(f"keep={keep} is not a root-to-node path of the token tree")
    pool, seq = rt.sequences, cache.seq
    path_seq = tree.seq_of[keep[-1]] if keep else seq
    if path_seq == seq:  # the path is on the cache's own branch: cut what follows it
        pool.remove(seq, start + len(keep))
    else:
        pool.remove(seq, start)
        pool.copy(path_seq, seq, start, start + len(keep))
    drop_branches(rt, cache)
    cache.length = start + len(keep)


def drop_branches(rt: LlamaCppRuntime, cache: LlamaCppCache) -> None:
    """Give the tree's branch sequences back and forget the tree."""
    assert cache.tree is not None
    del cache.held[1:]  # not the finalizer's to give back any more
    for s in cache.tree.branches:
        rt.sequences.remove(s, 0)
        rt.sequences.give_back(s)
    cache.tree = None


__all__ = ["TokenTree", "decode_tree", "drop_branches", "select_path", "tree_leaves"]
