"""The torch side's thread regime, behind one object: ``TORCH_THREADS`` (a ``TorchThreads``),
what an LM on torch's pool declares as its ``regime`` (``lm.port.Regime``; the llama.cpp
backend's is its context's ``lm.llama_cpp.regime.ThreadRegime``).

On torch every one-token step and every verify pass runs on torch's intra-op pool at its
current count (``lm.backend.configure_threads`` sets it for the process), so there is one
regime: no step changes threads with the cache's length. ``on_one_thread`` puts torch's pool on
one thread while another runtime decodes (the llama.cpp backend's ``decoding_session``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class TorchThreads:
    """The regime of an LM on torch's pool (module docstring)."""

    #: steps never move between thread counts here
    split_steps = False
    step_regimes = False
    exact_curve_context = 0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before = 0

    @property
    def threads(self) -> int:
        """torch's intra-op threads now."""
        import torch

        return torch.get_num_threads()

    def steps_on_every_thread(self) -> bool:
        return True

    @contextmanager
    def on_one_thread(self) -> Iterator[None]:
        """torch's intra-op threads set to one within the block; nested and concurrent blocks
        share it, and the last one out restores the count.

        For the llama.cpp backend's decoding (``LlamaCppLanguageModel.decoding_session``):
        between its decodes the engine runs a few small torch ops a step (kNN, the mixture,
        verification), and torch's idle workers then spin on the cores llama.cpp's threads
        need. Measured on the AMD EPYC, llama.cpp at 2 threads, the default engine on 12
        grounded and QA prompts: 42-45 tok/s with torch on 2 threads, 51-57 with torch on one."""
        import torch

        with self._lock:
            if self._users == 0:
                self._before = torch.get_num_threads()
                if self._before != 1:
                    torch.set_num_threads(1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._before != 1:
                    torch.set_num_threads(self._before)


#: The process's torch regime.
TORCH_THREADS = TorchThreads()

__all__ = ["TORCH_THREADS", "TorchThreads"]
