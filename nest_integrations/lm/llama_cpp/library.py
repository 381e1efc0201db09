"""llama-cpp-python, set up once per process, and the C objects of one loaded model.

``llama_cpp_module`` imports llama-cpp-python (an ImportError naming the ``llamacpp`` extra
where it is missing); ``init`` sends llama.cpp's messages to this module's logger and runs
``llama_backend_init``, once. ``Handles`` holds one model's C objects (model, context, decode
batch) and frees them together, on ``close`` or when collected.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from pathlib import Path
from typing import Any

from nest_integrations import _optional

LOG = logging.getLogger(__name__)

#: llama.cpp's log levels (``enum ggml_log_level``) as ``logging`` levels, one lower (its
#: errors are warnings here: the calls that fail raise their own errors); 5 continues a line.
_LOG_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO,
               4: logging.WARNING}
_log_callback: Any = None  # kept alive while llama.cpp holds it
_INIT_LOCK = threading.Lock()
_initialised = False


def llama_cpp_module() -> Any:
    """``llama_cpp`` (llama-cpp-python), or an ImportError naming the ``llamacpp`` extra."""
    return _optional.require("llama_cpp", extra="llamacpp")


def init(lib: Any) -> None:
    """Once per process: llama.cpp's messages to this module's logger, ``llama_backend_init``."""
    global _initialised, _log_callback
    with _INIT_LOCK:
        if _initialised:
            return
        last = [logging.DEBUG]

        def forward(level: int, text: bytes, _user: Any) -> None:
            lvl = last[0] if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
            last[0] = lvl
            if LOG.isEnabledFor(lvl):
                LOG.log(lvl, "llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

        _log_callback = lib.llama_log_callback(forward)
        lib.llama_log_set(_log_callback, ctypes.c_void_p(0))
        lib.llama_backend_init()
        _initialised = True


class Handles:
    """One loaded model's C objects: the model, its context and a decode batch of
    ``batch_tokens`` tokens in up to ``max_sequences`` sequences each. ``close`` frees them
    (else collection does); what reads them calls ``check_open`` first."""

    def __init__(self, lib: Any, model: Any, ctx: Any, *, path: Path, batch_tokens: int,
                 max_sequences: int) -> None:
        self.lib, self.model, self.ctx, self.path = lib, model, ctx, path
        self.batch = lib.llama_batch_init(batch_tokens, 0, max_sequences)
        self.closed = False
        self._finalizer = weakref.finalize(self, _free, lib, model, ctx, self.batch)

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"the llama.cpp model {self.path.name} was closed")

    def close(self) -> None:
        self.closed = True
        self._finalizer()


def _free(lib: Any, model: Any, ctx: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)


__all__ = ["Handles", "init", "llama_cpp_module"]
