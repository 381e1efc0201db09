"""The context's sequences and KV cells: a cache, a token tree's branch or a passage being
encoded is a sequence id of one unified KV cache (``kv_unified``), and copying a prefix to
another sequence only tags its cells (``llama_memory_seq_cp``).

``SequencePool`` hands out and takes back sequence ids and keeps an upper bound of the KV cells
in use (``cells_bound``), which decides the thread regime (``regime.ThreadRegime``).
``LlamaCppCache`` is what the LM port hands the engine: one sequence and the positions it holds.
"""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from nest_integrations.lm.llama_cpp.library import Handles

if TYPE_CHECKING:
    from nest_integrations.lm.llama_cpp.trees import TokenTree

#: Sequences of the context's unified KV cache: caches, tree branches, passage batches.
MAX_SEQUENCES = 64


@dataclass(eq=False)
class LlamaCppCache:
    """A KV cache of ``LlamaCppLanguageModel``: one sequence of its context and the positions it
    holds (opaque to the engine)."""

    seq: int
    length: int = 0
    tree: TokenTree | None = None
    #: the sequences the cache holds: its own, then its token tree's branches until
    #: ``select_cache``/``crop_cache`` drop them; its finalizer gives all of them back (a cache
    #: collected right after ``forward_tree`` must not keep its branches' cells taken: every
    #: later sequence would be laid out after them and round differently)
    held: list[int] = field(default_factory=list, repr=False)
    _finalizer: Any = field(default=None, repr=False)
    released: bool = False  # ``release_cache`` gave its sequences back: no more use


def check_usable(cache: LlamaCppCache, tree_ok: bool = False) -> None:
    """A ValueError if the cache was released, or (unless ``tree_ok``) holds a token tree."""
    if cache.released:
        raise ValueError("this cache was released (release_cache): take a new_cache")
    if cache.tree is not None and not tree_ok:
        raise ValueError("the cache holds a token tree: call select_cache (or crop_cache) "
                         "after forward_tree before the next forward")


def release_cache(cache: LlamaCppCache) -> None:
    """Give the cache's sequences back now, not when it is collected: a cache kept alive by a
    reference cycle would otherwise cost the next ``new_cache`` a full ``gc.collect()``, slow in
    a process holding many objects. The cache cannot be used afterwards."""
    if cache._finalizer is not None:
        cache._finalizer()  # runs once: later calls (and collection) do nothing
    cache.released = True


def release_held(pool: SequencePool, held: list[int]) -> None:
    """A collected cache's finalizer: its sequence and any token-tree branches it still holds
    go back to the pool (emptied at the next ``take``)."""
    for seq in held:
        pool.release(seq)


class SequencePool:
    """Sequence ids ``0 .. MAX_SEQUENCES - 1`` of one context, and where their cells lie.

    ``cells_bound`` is an upper bound of the KV cells in use (one past the highest: llama.cpp's
    ``used_max_p1``). llama.cpp places each new token in the first free cell at or after its
    head (or from cell 0), and its head never passes the highest cell in use + 1, so a decode of
    n tokens raises that cell by at most n. The one sequence laid out from cell 0 with no other
    cell in use (``_sole``) holds the cells equal to its positions, so removing its tail lowers
    the bound; any other layout only raises it.

    Not thread-safe: ``LlamaCppLanguageModel`` locks around every call.
    """

    def __init__(self, handles: Handles) -> None:
        self.handles = handles
        self.mem = handles.lib.llama_get_memory(handles.ctx)
        self._free = list(range(MAX_SEQUENCES - 1, -1, -1))
        self._released: list[int] = []  # sequences of collected caches, cleared on next use
        self.cells_bound = 0
        #: the one sequence that holds the cells in use at cells equal to its positions from
        #: cell 0, when one does (None: laid out otherwise, the bound only grows)
        self._sole: int | None = None

    def new_cache(self) -> LlamaCppCache:
        """An empty cache: a free sequence, given back when the cache is collected (a
        generation's cache is freed when it ends) or released (``release_cache``).

        With no other live cache, a prompt is laid out in the KV cache from cell 0, as a fresh
        ``Llama`` lays it out; a prefill of 64+ tokens depends on that layout in its last bits
        (flash attention's KV tiles), so it then equals ``Llama``'s bit for bit. Every row
        depends on it: a sequence laid out after another live cache's cells rounds otherwise
        (``docs/decisions.md``, 'llama.cpp (issue 35)'), so a dead cache that a reference cycle
        keeps uncollected is collected here first."""
        if self.live():
            gc.collect()  # runs cache finalizers: their sequences are released
        seq = self.take()
        cache = LlamaCppCache(seq, held=[seq])
        cache._finalizer = weakref.finalize(cache, release_held, self, cache.held)
        return cache

    def take(self) -> int:
        """A free, empty sequence id."""
        self.handles.check_open()
        self._collect()
        if not self._free:
            raise RuntimeError(f"all {MAX_SEQUENCES} llama.cpp sequences are in use (live "
                               "caches, tree branches): drop unused caches")
        if self.live() == 0:  # every cell free and the head at cell 0, as when fresh
            self.handles.lib.llama_memory_clear(self.mem, False)
            self.cells_bound, self._sole = 0, None
        seq = self._free.pop()
        self.remove(seq, 0)
        return seq

    def live(self) -> int:
        """Sequences in use (taken and not yet released)."""
        return MAX_SEQUENCES - len(self._free) - len(self._released)

    def give_back(self, seq: int) -> None:
        """Return an emptied sequence to the pool."""
        self._free.append(seq)

    def release(self, seq: int) -> None:
        """A collected cache's sequence: emptied and reused at the next ``take`` (a finalizer
        may run on any thread, so it only records it)."""
        self._released.append(seq)

    def _collect(self) -> None:
        while self._released:
            seq = self._released.pop()
            if not self.handles.closed:
                self.remove(seq, 0)
            self._free.append(seq)

    def remove(self, seq: int, start: int) -> None:
        """Drop positions ``>= start`` of ``seq``."""
        self.handles.check_open()
        if not self.handles.lib.llama_memory_seq_rm(self.mem, seq, int(start), -1):
            raise RuntimeError(f"llama.cpp could not remove positions {start}.. of sequence {seq}")
        if seq == self._sole:  # its cells from ``start`` on are free, and llama.cpp's head there
            self.cells_bound = min(self.cells_bound, max(0, int(start)))

    def copy(self, src: int, dst: int, start: int, end: int) -> None:
        """Add ``dst`` to the cells of ``src`` at positions ``[start, end)`` (no data copied:
        the cache is unified)."""
        if end > start:
            self.handles.lib.llama_memory_seq_cp(self.mem, src, dst, int(start), int(end))
            self._sole = None  # cells held by two sequences: removing one's tail frees none

    def place(self, seqs: Sequence[Sequence[int]], pos: Sequence[int]) -> None:
        """Update ``cells_bound`` for a decode of these tokens (token i at ``pos[i]`` in the
        sequences ``seqs[i]``; see the class docstring)."""
        n = len(pos)
        sole = seqs[0][0] if n and len(seqs[0]) == 1 else None
        contiguous = (sole is not None and self._sole in (None, sole)
                      and (self._sole is not None or self.cells_bound == 0)
                      and all(len(s) == 1 and s[0] == sole for s in seqs)
                      and list(pos) == list(range(self.cells_bound, self.cells_bound + n)))
        self._sole = sole if contiguous else None
        self.cells_bound += n

    @contextmanager
    def scratch(self, seq: int, length: int) -> Iterator[int]:
        """A scratch sequence holding ``seq``'s first ``length`` positions, dropped afterwards:
        ``seq`` and the cells' layout are left as they were (the scratch's cells were the free
        ones after them: ``cells_bound``)."""
        sole, bound = self._sole, self.cells_bound
        scratch = self.take()
        try:
            self.copy(seq, scratch, 0, length)
            yield scratch
        finally:
            self.remove(scratch, 0)
            self.give_back(scratch)
            if sole == seq:
                self._sole, self.cells_bound = sole, bound


__all__ = ["MAX_SEQUENCES", "LlamaCppCache", "SequencePool", "check_usable", "release_cache",
           "release_held"]
