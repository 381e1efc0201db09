"""Serialised model calls: one policy for every engine the assembly builds or an adapter is
handed. A wrapped model's method calls run one at a time per model, process-wide, so
generations in threads (LangChain ``batch``, LlamaIndex ``achat``) interleave step by step.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any

from nest_integrations.lm.base import Capabilities, capabilities_of

_CALL_LOCKS: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_CALL_LOCKS_LOCK = threading.Lock()


class SerializedLM:
    """A language model whose method calls run one at a time, process-wide per model.

    Every wrapper of the same model shares one lock, so engines built at different times still
    take turns. Attributes pass through unchanged; ``wrapped`` is the model itself. ``port``
    is the model's typed port (``lm.port.LMPort``), resolved once here, its calls serialised.
    """

    def __init__(self, lm: Any) -> None:
        from nest_integrations.lm.port import resolve_port

        self.wrapped = lm
        with _CALL_LOCKS_LOCK:
            try:
                self._lock = _CALL_LOCKS.setdefault(lm, threading.RLock())
            except TypeError:  # not weak-referenceable: one lock per class
                self._lock = _CALL_LOCKS.setdefault(type(lm), threading.RLock())
        self.port = resolve_port(lm, calls=self)

    @property
    def capabilities(self) -> Capabilities:
        """The model's own record (read now: the chat template may change)."""
        return capabilities_of(self.wrapped)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.wrapped, name)
        if not inspect.ismethod(value):
            return value
        lock = self._lock

        @functools.wraps(value)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        self.__dict__[name] = locked  # bound once: later lookups skip __getattr__
        return locked

    def __repr__(self) -> str:
        return f"SerializedLM({self.wrapped!r})"


def serialized(lm: Any) -> Any:
    """``lm`` with its calls serialised (see ``SerializedLM``); idempotent."""
    return lm if isinstance(lm, SerializedLM) else SerializedLM(lm)


def unwrap(lm: Any) -> Any:
    """The model inside a ``SerializedLM`` (or ``lm`` itself)."""
    return lm.wrapped if isinstance(lm, SerializedLM) else lm
