"""``backend="auto"``: the faster exact engine for the embedded model on this machine.

Where the llama.cpp extra is installed (``llama_cpp`` importable, the embedded GGUF present),
``auto`` runs the default model on whichever backend steps it faster, among those whose verify
rows are exact (lossless methods equal greedy decoding there), measured once per machine:

- ``measure_step_costs`` loads both engines as they run by default (torch at the ``auto`` dtype,
  llama.cpp's ``DEFAULT_QUANT``), prefills a fixed prompt, and times ``STEPS`` one-token steps
  of each, interleaved (the fastest of each, the least disturbed estimate on a shared machine;
  a couple of seconds once the models are on disk);
- ``choose_backend`` is the rule, a pure function of those costs and exactness verdicts: the
  cheapest exact engine, else the cheapest; a tie goes to torch;
- ``decide`` caches the record (costs, verdicts, choice) beside the row-exactness verdicts, in
  ``$NEST_HOME/exactness/<machine>.json`` (section ``backends``), one entry per thread count,
  torch version and llama-cpp-python version; deleting the file measures again.

``auto`` means torch, without measuring, where llama.cpp cannot run the request: the extra is
not installed (silently), a model other than the embedded one (a ``.gguf`` path or a quantisation
name means llama.cpp), a device other than the CPU, an explicit torch dtype, KNN-SSD, or a key
source other than the default. ``nest info`` prints the decision and its reason;
``--backend torch|llama.cpp`` (``backend=``) overrides it.

Usage::

    decide().backend                            # "llama.cpp" or "torch" (measured once)
    choose_backend({"torch": 0.058, "llama.cpp": 0.010}, {"torch": True, "llama.cpp": True})
"""

from __future__ import annotations

import importlib.util
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

LOG = logging.getLogger(__name__)

#: One-token steps timed per backend (after one untimed warm-up step).
STEPS = 8
#: The fixed prompt the steps follow (the quickstart question, as a chat prompt).
PROMPT = "How does the assert statement work in Python?"
#: The backends ``choose_backend`` prefers on a tie, first first.
PREFERENCE = ("torch", "llama.cpp")

__all__ = ["PROMPT", "STEPS", "Decision", "cached", "choose_backend", "decide",
           "llama_cpp_available", "measure_step_costs", "resolve_backend"]


@dataclass(frozen=True)
class Decision:
    """What ``backend="auto"`` resolved to, and why (``nest info`` prints ``reason``)."""

    backend: str
    reason: str
    #: the cached measurement when one decided it: ``{"seconds": {...}, "exact": {...}, ...}``
    record: dict[str, Any] = field(default_factory=dict)
    #: only a measurement can decide (``decide(measure=False)`` before one is cached):
    #: ``backend`` is then torch, the answer until it is measured
    pending: bool = False


def resolve_backend(backend: str | None = None, *, model: Any = None, device: Any = None,
                    dtype: Any = None, decoding: str | None = None,
                    key_source: Any = None) -> str:  # fmt: skip
    """The runtime to run on (``lm.backend.BACKENDS``): ``backend``, else the process default,
    else ``$NEST_BACKEND``, else ``"auto"`` (``lm.backend.requested_backend``), with ``"auto"``
    resolved for this request by ``decide``."""
    from nest_integrations.lm.backend import requested_backend

    name = requested_backend(backend)
    if name != "auto":
        return name
    return decide(model, device, dtype, decoding, key_source).backend


def choose_backend(seconds: Mapping[str, float], exact: Mapping[str, bool]) -> str:
    """The backend with the cheapest one-token step among the exact ones (all of them when
    none is exact); a tie goes to the earlier of ``PREFERENCE``."""
    if not seconds:
        raise ValueError("choose_backend needs the step cost of at least one backend")
    pool = [b for b in seconds if exact.get(b, False)] or list(seconds)
    rank = {b: i for i, b in enumerate(PREFERENCE)}
    return min(pool, key=lambda b: (float(seconds[b]), rank.get(b, len(rank))))


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python is importable (located, not imported) and the embedded GGUF
    that the llama.cpp backend runs is installed."""
    if "llama_cpp" in sys.modules:
        if sys.modules["llama_cpp"] is None:  # blocked (how Python marks a refused import)
            return False
    elif importlib.util.find_spec("llama_cpp") is None:
        return False
    try:
        from nest_integrations.lm.default import gguf_path

        gguf_path()
    except (ImportError, OSError):
        return False
    return True


def _cannot_run(model: Any, device: Any, dtype: Any, decoding: str | None,
                key_source: Any) -> str | None:  # fmt: skip
    """Why the request can only run on one backend (``"llama.cpp: ..."``/``"torch: ..."``),
    else None (the measurement decides)."""
    from nest_integrations.config import NestConfig
    from nest_integrations.lm.backend import default_dtype, parse_dtype
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME

    if model not in (None, DEFAULT_MODEL_NAME):
        name = str(model)
        if name.lower().endswith(".gguf") or _is_quant(name):
            return "llama.cpp: the model is a GGUF file"
        return "torch: the model is not the embedded one"
    if device not in (None, "cpu", "auto"):
        return f"torch: device {device!r}"
    if parse_dtype(dtype if dtype is not None else default_dtype()) not in (None, "auto"):
        return f"torch: dtype {dtype or default_dtype()!r} asked for"
    if decoding == "knn-ssd":
        return "torch: KNN-SSD skips layers, which llama.cpp cannot"
    if key_source not in (None, NestConfig().key_source, "final_norm"):
        return f"torch: key source {key_source!r}"
    return None


def _is_quant(name: str) -> bool:
    return name.upper().replace("-", "_") in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16",
                                              "IQ4_NL")


def decide(model: Any = None, device: Any = None, dtype: Any = None, decoding: str | None = None,
           key_source: Any = None, *, measure: bool = True) -> Decision:  # fmt: skip
    """What ``backend="auto"`` runs this request on (module docstring). ``measure=False``
    reports a missing measurement as torch instead of measuring (``nest info --no-model``)."""
    forced = _cannot_run(model, device, dtype, decoding, key_source)
    if forced is not None:
        backend, why = forced.split(": ", 1)
        return Decision(backend, why)
    if not llama_cpp_available():
        return Decision("torch", "the llama.cpp extra is not installed (pip install "
                                 "'nest-integrations[llamacpp]')")
    key = _cache_key()
    if not measure and cached(key) is None:
        return Decision("torch", "not measured on this machine yet (the first model load "
                                 "measures it)", pending=True)
    try:
        record = _choices().get(key, measure_step_costs)
    except Exception as exc:  # noqa: BLE001 - a failed measurement must not stop the request
        LOG.warning("backend auto: measuring the engines failed (%s); running torch, and "
                    "measuring again next time", exc)
        return Decision("torch", f"the measurement failed ({exc}); not cached")
    return Decision(str(record["choice"]), _explain(record), dict(record))


_CHOICES: Any = None


def _choices() -> Any:
    """The ``backends`` section of this machine's file under ``$NEST_HOME/exactness``."""
    global _CHOICES
    if _CHOICES is None:
        from nest_integrations.lm.row_exact import MachineCache

        _CHOICES = MachineCache("backends")
    return _CHOICES


def cached(key: str | None = None) -> dict[str, Any] | None:
    """The cached record of ``key`` (default: this process's settings), None when absent."""
    import json

    try:
        data = json.loads(_choices().path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = (data.get("backends") or {}).get(key or _cache_key()) if isinstance(data, dict) \
        else None
    return found if isinstance(found, dict) else None


def _cache_key() -> str:
    """``lm.cache_key`` of both engines of the default model, before either is loaded."""
    from importlib.metadata import PackageNotFoundError, version

    from nest_integrations.lm.backend import dtype_label
    from nest_integrations.lm.cache_key import engines_key
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME

    try:
        llama = version("llama_cpp_python")
    except PackageNotFoundError:
        llama = "?"
    return engines_key(DEFAULT_MODEL_NAME, f"{dtype_label(None, 'cpu')}+llama_cpp{llama}").text()


def _explain(record: Mapping[str, Any]) -> str:
    parts = []
    for b, s in sorted(record["seconds"].items(), key=lambda kv: kv[1]):
        exact = "exact" if record["exact"].get(b) else "NOT exact"
        parts.append(f"{b} {1e3 * s:.1f} ms a step ({exact})")
    return (f"measured on this machine at {record.get('threads', '?')} thread(s): "
            + ", ".join(parts) + "; cached in $NEST_HOME/exactness")


def measure_step_costs(steps: int = STEPS) -> dict[str, Any]:
    """Seconds of the fastest one-token step of the default model on each backend after the
    fixed ``PROMPT`` (steps interleaved; medians kept too), their exactness verdicts and
    ``choose_backend``'s pick: the record ``decide`` caches."""
    from nest_integrations.lm.backend import configured_threads
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel

    start = time.perf_counter()
    threads = configured_threads()
    torch_lm = HFLanguageModel.from_default()
    lms = {"torch": torch_lm,
           "llama.cpp": LlamaCppLanguageModel.from_default(threads=threads)}
    try:
        runs = {b: _Stepper(lm) for b, lm in lms.items()}
        times: dict[str, list[float]] = {b: [] for b in lms}
        for _ in range(steps + 1):  # the first round warms up
            for b, run in runs.items():
                times[b].append(run.step())
        # the least disturbed step of each: on a busy machine most steps wait for a core
        seconds = {b: min(t[1:]) for b, t in times.items()}
        medians = {b: statistics.median(t[1:]) for b, t in times.items()}
        exact = {b: bool(lm.exact_rows) for b, lm in lms.items()}
        dtype = str(torch_lm.dtype).removeprefix("torch.")
    finally:
        lms["llama.cpp"].close()
    record = {"seconds": seconds, "median_seconds": medians, "exact": exact,
              "choice": choose_backend(seconds, exact), "threads": threads, "torch_dtype": dtype, "steps": steps,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "took_s": round(time.perf_counter() - start, 2)}
    LOG.info("backend auto: %s (%s)", record["choice"], _explain(record))
    return record


class _Stepper:
    """One-token steps of an LM after the fixed prompt: each ``step`` feeds the last argmax."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.cache = lm.new_cache()
        logits, _ = lm.forward(lm.chat_prompt([{"role": "user", "content": PROMPT}]), self.cache,
                               last=1)
        self.next = int(logits[-1].argmax())

    def step(self) -> float:
        start = time.perf_counter()
        logits, _ = self.lm.forward([self.next], self.cache, last=1)
        elapsed = time.perf_counter() - start
        self.next = int(logits[-1].argmax())
        return elapsed
