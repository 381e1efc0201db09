"""Reading a decode's outputs out of llama.cpp: its logits and embeddings buffers as numpy
arrays (``floats``, or ``row_argmax`` read in place), and the keys: the embeddings output
(``"final_norm"``) or another layer's tensor copied out by llama.cpp's eval callback
(``KeyCapture``)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

#: The default key source: llama.cpp's embeddings output (the final norm's output).
KEY_SOURCE = "final_norm"
#: Key sources and the llama.cpp graph tensor each reads (None: the embeddings output):
#: ``"ffn_input"`` is the paper's key, the last layer's pre-FFN norm output (``ffn_norm-<L>``
#: in llama.cpp's graph, copied out by its eval callback: ``KeyCapture``).
KEY_LAYERS = {"final_norm": None, "ffn_input": "ffn_norm"}


def key_layer(key_source: str) -> str | None:
    """The graph tensor a key source reads (``KEY_LAYERS``), or a ValueError naming them."""
    if key_source not in KEY_LAYERS:
        raise ValueError(f"key_source={key_source!r} is not available on the llama.cpp "
                         f"backend: one of {', '.join(map(repr, KEY_LAYERS))}; use "
                         "backend='torch' for other layers")
    return KEY_LAYERS[key_source]


# ``struct ggml_tensor`` (ggml.h) offsets on 64-bit platforms: type, ne[4], nb[4], data, name.
_T_TYPE, _T_NE, _T_NB, _T_DATA, _T_NAME = 0, 16, 48, 248, 256
_GGML_TYPE_F32 = 0

#: ctypes float array types by length, for the outputs of steps and verify passes (up to
#: ``_CACHED_ROWS`` rows); a prompt's rarer, larger outputs make their type each time.
_FLOAT_ARRAYS: dict[int, Any] = {}
_CACHED_ROWS = 64


class KeyCapture:
    """llama.cpp's eval callback (``cb_eval``): while ``on``, asks the scheduler for the tensor
    named ``name`` and copies its rows (``(rows, n_embd)`` fp32) into ``rows`` after each graph
    computes it; off, it asks for nothing (the scheduler then computes the graph in one piece)."""

    def __init__(self, lib: Any, layer: str, index: int, width: int) -> None:
        self.layer = layer  #: the tensor's name in every layer (``"ffn_norm"``)
        self.name, self.width = f"{layer}-{index}".encode(), width
        self.on = False
        self.rows: list[np.ndarray] = []
        self.error: str | None = None
        self.fn = lib.ggml_backend_sched_eval_callback(self._call)

    def _call(self, t: int, ask: bool, _user: Any) -> bool:
        if not self.on:
            return False  # an ask: nothing needed (no after-call follows a False)
        if ctypes.string_at(t + _T_NAME) != self.name:
            return not ask  # an ask: not this one; after a compute: go on
        if ask:
            return True
        ne = (ctypes.c_int64 * 4).from_address(t + _T_NE)
        nb1 = ctypes.c_size_t.from_address(t + _T_NB + 8).value
        kind = ctypes.c_int32.from_address(t + _T_TYPE).value
        if kind != _GGML_TYPE_F32 or ne[0] != self.width or nb1 != 4 * self.width:
            # raising here would only be printed by ctypes (and a False stops the graph): keep
            # the reason for ``take``, and let the decode finish
            self.error = (f"llama.cpp tensor {self.name.decode()} is not a contiguous fp32 "
                          f"(rows, {self.width}) matrix (type {kind}, ne {list(ne)})")
            return True
        data = ctypes.c_void_p.from_address(t + _T_DATA).value
        self.rows.append(floats(data, ne[1], ne[0]))
        return True

    def take(self, n: int) -> np.ndarray:
        """The rows captured since the last ``take`` (``n`` expected)."""
        rows, self.rows = stack(self.rows, self.width), []
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(error)
        if len(rows) != n:
            raise RuntimeError(f"llama.cpp's graph gave {len(rows)} rows of "
                               f"{self.name.decode()} for {n} outputs: this model's graph does "
                               "not name its key tensor so; use key_source='final_norm'")
        return rows


def stack(parts: list[np.ndarray], width: int) -> np.ndarray:
    """The row blocks of a decode's batches as one ``(rows, width)`` array."""
    if len(parts) == 1:
        return parts[0]  # already a copy of its own (``floats``)
    return np.concatenate(parts) if parts else np.zeros((0, width), np.float32)


def _view(ptr: Any, rows: int, width: int) -> np.ndarray:
    """A view of the ``(rows, width)`` float32 block at ``ptr`` (a ctypes float pointer or an
    address), valid until llama.cpp's next decode. It is built with a cached ctypes array type
    and ``np.frombuffer``, not ``np.ctypeslib.as_array``, whose buffer-protocol format parsing
    is slow when cold, as it is right after each decode: a step reads its outputs once."""
    n = rows * width
    kind = _FLOAT_ARRAYS.get(n)
    if kind is None:
        kind = ctypes.c_float * n
        if rows <= _CACHED_ROWS:
            _FLOAT_ARRAYS[n] = kind
    address = ptr if isinstance(ptr, int) else ctypes.cast(ptr, ctypes.c_void_p).value
    if not address:
        raise RuntimeError("llama.cpp returned no output buffer")
    return np.frombuffer(kind.from_address(address), dtype=np.float32).reshape(rows, width)


def floats(ptr: Any, rows: int, width: int) -> np.ndarray:
    """A copy of the ``(rows, width)`` float32 block at ``ptr`` (see ``_view``)."""
    return _view(ptr, rows, width).copy()


def row_argmax(ptr: Any, rows: int, width: int) -> np.ndarray:
    """The argmax of each row of the ``(rows, width)`` float32 block at ``ptr`` (int64, the
    first maximum), read in place: a greedy step reads llama.cpp's logits once, instead of
    copying them, wrapping the copy in a tensor and reading that."""
    return _view(ptr, rows, width).argmax(axis=1).astype(np.int64, copy=False)


__all__ = ["KEY_LAYERS", "KEY_SOURCE", "KeyCapture", "floats", "key_layer", "row_argmax",
           "stack"]
