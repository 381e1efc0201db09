"""llama-cpp-python, set up once per process, and the C objects of one loaded model.

``llama_cpp_module`` imports llama-cpp-python (an ImportError naming the ``llamacpp`` extra
where it is missing); ``system_info`` is the installed wheel's ``llama_print_system_info()``
(without importing llama-cpp-python where it is not imported yet) and ``cpu_level`` the
instruction-set level it was built at (``scripts/install_llamacpp.sh``'s levels); ``init`` sends llama.cpp's messages to this module's logger and runs
``llama_backend_init``, once. ``Handles`` holds one model's C objects (model, context, decode
batch) and frees them together, on ``close`` or when collected.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import re
import sys
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


#: ``scripts/install_llamacpp.sh``'s levels, highest first, each with the features of
#: ``llama_print_system_info()`` a build at that level lists.
CPU_LEVELS = (("avx512", ("AVX2", "FMA", "F16C", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                          "AVX512_BF16")),
              ("avx2", ("AVX2", "FMA", "F16C")))


def system_info(lib: Any = None) -> str:
    """llama.cpp's ``llama_print_system_info()`` (``"CPU : SSE3 = 1 | AVX2 = 1 | ..."``): the
    CPU features the installed build was compiled with. Through ``lib`` (llama-cpp-python)
    when given or already imported; else straight from its shared library (ctypes, about
    10 ms, where importing llama-cpp-python costs 0.2-0.4 s: ``backend="auto"``'s cache key
    reads it on every run, torch runs included)."""
    if lib is None:
        lib = sys.modules.get("llama_cpp")
    spec = importlib.util.find_spec("llama_cpp") if lib is None else None
    if spec is not None and spec.origin and sys.platform.startswith("linux"):
        # where llama-cpp-python loads it from (its llama_cpp.py: _base_path)
        folder = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(
            os.path.dirname(spec.origin), "lib")
        shared = ctypes.CDLL(os.path.join(folder, "libllama.so"))
        shared.llama_print_system_info.restype = ctypes.c_char_p
        return bytes(shared.llama_print_system_info()).decode("utf-8", "replace")
    if lib is None:
        lib = llama_cpp_module()
    return bytes(lib.llama_print_system_info()).decode("utf-8", "replace")


def cpu_level(info: str) -> str:
    """The level of ``CPU_LEVELS`` whose features ``info`` (``system_info``) all lists, else
    ``"generic"``; ``"+amx"`` where the build has AMX kernels (``-march=native`` on a CPU with
    AMX). A pure function of the text."""
    on = {name for name, value in re.findall(r"(\w+) = (\d+)", info) if value != "0"}
    level = next((name for name, needs in CPU_LEVELS if on.issuperset(needs)), "generic")
    return level + ("+amx" if "AMX_INT8" in on else "")


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


__all__ = ["CPU_LEVELS", "Handles", "cpu_level", "init", "llama_cpp_module", "system_info"]
