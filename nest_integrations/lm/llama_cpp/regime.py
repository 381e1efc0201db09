"""The exact/fast thread regime: which threads a one-token step runs on, and whether exact
verify rows are decoded together or one at a time. ``ThreadRegime`` is the one object that
holds it.

Lossless methods equal ``Llama``'s greedy decoding because every verify row gets the bits of a
one-token step. Two things can break that, and the regime answers both:

- **the weight type.** A T-row decode of some weight types rounds otherwise than their
  one-token steps (their multi-row kernels differ). That is checked once per model
  (``rows_one_at_a_time``, the LM's ``lm.exactness.checked``); where it does not hold, exact
  verify rows are decoded one at a time.
- **the KV cache's length at 2+ threads.** ggml's flash attention splits a one-token decode's KV
  cells across threads once the view spans 512 cells, but only for an F16 or F32 cache, and the
  merged partial softmaxes round differently from a verify row. llama.cpp pads the view to a
  multiple of 256 cells, so while no cell past the 256th is in use (``SPLIT_FREE_CELLS``; the
  pool's ``cells_bound``) steps never split. Past it, with ``exact_steps``: by default
  (``steps_as_llama``) steps run on every thread, as ``Llama``'s, and verify rows are decoded
  one at a time; otherwise one-token decodes run on one thread, bit-exact with rows decoded
  together. Batches always run on ``threads``. A BF16 cache never splits (every one-token step
  takes the row path), at the price of a slower prompt decode.

Relaxed decoding (NEST) needs no bit-exact rows: inside ``inexact`` steps run on every thread
and rows are decoded together.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from nest_integrations.lm.llama_cpp.sequences import SequencePool

#: KV cache types whose one-token decodes ggml's flash attention splits over threads (its
#: split-KV path, past 512 cells), so that they are exact only on one thread.
SPLIT_KV_TYPES = frozenset({"F16"})
#: KV cells in use up to which a one-token decode never takes that split path: llama.cpp pads
#: the attended view to a multiple of 256 cells (``llama_kv_cache::get_n_kv``) and ggml splits
#: views of 512 or more (``use_split_kv_path`` in ``ggml-cpu/ops.cpp``), so while no cell past
#: the 256th is in use, exact one-token steps run on every thread too.
SPLIT_FREE_CELLS = 256


class ThreadRegime:
    """The exact/fast regime of one context (see the module docstring).

    ``exact_steps`` (lifted by ``inexact``): verify rows must equal one-token steps.
    ``steps_as_llama``: where an exact step's attention may split, True (default) runs steps on
    every thread as ``Llama``'s do and verify rows one at a time; False runs steps on one
    thread, bit-exact with rows decoded together. ``rows_exact``: whether a T-row decode of this
    model gives every row the bits of a one-token step (None: not checked yet).
    """

    def __init__(self, threads: int, kv_type: str, cells: SequencePool) -> None:
        self.threads, self.kv_type, self.cells = threads, kv_type, cells
        self.exact_steps = True
        self.steps_as_llama = True
        self.rows_exact: bool | None = None
        self.current_step_threads = 0  # what the context's one-token decodes run on now

    # ----------------------------------------------------------------------------- threads

    @property
    def can_split(self) -> bool:
        """Whether ggml may split a one-token step's attention over threads here (2+ threads,
        an F16 cache: ``SPLIT_KV_TYPES``)."""
        return self.threads > 1 and self.kv_type in SPLIT_KV_TYPES

    def past_split_free(self, n: int = 1) -> bool:
        """Whether, after ``n`` more tokens are placed, an exact one-token step would take
        ggml's split path (2+ threads, an F16 cache, a cell past ``SPLIT_FREE_CELLS`` possibly
        in use): it then rounds otherwise than a row of a multi-token decode."""
        return (self.exact_steps and self.can_split
                and self.cells.cells_bound + n > SPLIT_FREE_CELLS)

    def step_threads(self, n: int = 1) -> int:
        """The threads a one-token decode runs on after ``n`` more tokens are placed: one for an
        exact step that would split (``past_split_free``) unless ``steps_as_llama``, else
        ``threads``."""
        if not self.steps_as_llama and self.past_split_free(n):
            return 1
        return self.threads

    def apply(self, lib: Any, ctx: Any) -> None:
        """Set the context's one-token threads for the next decode (its tokens placed)."""
        step = self.step_threads(0)
        if step != self.current_step_threads:
            lib.llama_set_n_threads(ctx, step, self.threads)
            self.current_step_threads = step

    @contextmanager
    def inexact(self) -> Iterator[None]:
        """Within the block exact steps are not required (``exact_steps`` off)."""
        before = self.exact_steps
        self.exact_steps = False
        try:
            yield
        finally:
            self.exact_steps = before

    # ----------------------------------------------------------------------------- what it means

    @property
    def split_steps(self) -> bool:
        """Whether one-token steps now run on every thread where an exact one would run on one
        (inside ``inexact`` at 2+ threads over an F16 cache)."""
        return self.can_split and not self.exact_steps

    @property
    def step_regimes(self) -> bool:
        """Whether exact decoding changes regime with the cache's length (2+ threads, an F16
        cache, outside ``inexact``)."""
        return self.can_split and self.exact_steps

    @property
    def exact_curve_context(self) -> int:
        """Cached positions the curve of exact steps is measured after: past the cells where the
        regime changes when ``step_regimes``, else 0."""
        return SPLIT_FREE_CELLS + 64 if self.step_regimes else 0

    def steps_on_every_thread(self) -> bool:
        """Whether the next exact step runs on every thread with verify rows decoded together:
        not past ``SPLIT_FREE_CELLS`` at 2+ threads over an F16 cache."""
        return not self.past_split_free(1)

    def rows_one_at_a_time(self, check: Callable[[], bool]) -> bool:
        """Whether this model's T-row decodes are not exact, so exact verify rows are decoded
        one at a time. ``check`` (the LM's check, run on first use) gives ``rows_exact``."""
        if self.rows_exact is None:
            self.rows_exact = True  # the check's own passes decode their rows together
            try:
                self.rows_exact = check()
            except BaseException:
                self.rows_exact = None
                raise
        return not self.rows_exact

    def rows_split_now(self, check: Callable[[], bool]) -> bool:
        """Whether exact verify passes may now decode their rows one at a time: always for a
        model with ``rows_one_at_a_time``, and at 2+ threads over an F16 cache with
        ``steps_as_llama``."""
        return self.exact_steps and (self.rows_one_at_a_time(check)
                                     or (self.steps_as_llama and self.can_split))

    def rows_split(self, n: int, k: int, check: Callable[[], bool]) -> bool:
        """Whether a pass of ``n`` tokens with ``k`` rows wanted decodes its rows one at a time:
        an exact pass of several rows, all of them wanted, on a model with
        ``rows_one_at_a_time``, or whose steps there split their attention over threads as
        ``Llama``'s do (``steps_as_llama``, ``past_split_free``)."""
        if n < 2 or k != n or not self.exact_steps:
            return False
        return self.rows_one_at_a_time(check) or (self.steps_as_llama
                                                  and self.past_split_free(n))


__all__ = ["SPLIT_FREE_CELLS", "SPLIT_KV_TYPES", "ThreadRegime"]
