"""``backend="auto"``: the faster exact engine for the embedded model on this machine.

Where the llama.cpp extra is installed (``llama_cpp`` importable, the embedded GGUF present),
``auto`` runs the default model on whichever backend answers faster, among those whose verify
rows are exact (lossless methods equal greedy decoding there), measured once per machine on a
short fixed answer, run as the default ``nest ask`` runs its LM (issue 63: one-token steps
chose llama.cpp where whole answers were close, torch verifying a copy in fewer passes):

- ``measure_answers`` loads both engines as they run by default (torch at the ``auto`` dtype,
  packed as the loader packs it; llama.cpp's ``DEFAULT_QUANT``) and times ``ROUNDS`` answers of
  each, interleaved, keeping each engine's fastest (the least disturbed on a shared machine).
  An answer (``AnswerWorkload``) is what the default (``nest`` decoding under the ``grounded``
  preset) does for the README question: the prefill of an RA-style prompt (``PASSAGES`` and
  ``QUESTION``, about 300 tokens; the README question's RA prompt is 316), the evidence quote
  copied from it (``COPY_TOKENS`` tokens verified in passes of up to ``COPY_ROWS`` rows: 93
  tokens in 2 passes there), then ``STEPS`` one-token steps; every pass with its key rows,
  inside the LM's ``inexact_rows`` and ``decoding_session``, as relaxed NEST runs them.
  Once per machine: 40-55 s with both model loads on the shared 2-core AMD EPYC under a load
  average of 4-6;
- ``choose_backend`` is the rule, a pure function of those seconds and exactness verdicts: the
  cheapest exact engine, else the cheapest; a tie goes to torch;
- ``decide`` caches the record (seconds, each part's seconds, verdicts, choice) beside the
  row-exactness verdicts, in ``$NEST_HOME/exactness/<machine>.json`` (section ``backends``),
  under ``cache_key``: the thread count, torch's version and the torch build in use (dtype
  and packing, ``torch_build``), llama-cpp-python's version and the CPU level its wheel was
  built at (``lm.llama_cpp.library.cpu_level``), and the workload's version (``WORKLOAD``);
  deleting the file measures again.

``auto`` means torch, without measuring, where llama.cpp cannot run the request: the extra is
not installed (silently), a model other than the embedded one (a ``.gguf`` path or a quantisation
name means llama.cpp), a device other than the CPU, an explicit torch dtype, KNN-SSD, or a key
source other than the default. ``nest info`` prints the decision, its reason and the figures
it chose by (``figures``); ``--backend torch|llama.cpp`` (``backend=``) overrides it.

Usage::

    decide().backend                            # "llama.cpp" or "torch" (measured once)
    choose_backend({"torch": 0.9, "llama.cpp": 0.6}, {"torch": True, "llama.cpp": True})
"""

from __future__ import annotations

import importlib.util
import logging
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Mapping

LOG = logging.getLogger(__name__)

#: The fixed answer (``AnswerWorkload``): the question, as the README asks it ...
QUESTION = "How does the assert statement work in Python?"
#: ... the passages of its RA-style prompt (about 260 tokens: the first paraphrases the Python
#: Language Reference's assert statement, the second is from its "Exceptions" section) ...
PASSAGES = (
    "The assert statement is a convenient way to insert debugging checks into a program. "
    "Its simple form, assert expression, evaluates the expression and raises AssertionError "
    "when the result is false. The extended form, assert expression1, expression2, also "
    "evaluates the second expression and passes its value to the AssertionError it raises, "
    "so the message can say what went wrong. Both forms run only while the built-in "
    "variable __debug__ is true: the interpreter sets it to true at start-up unless it was "
    "started with the -O option, and then the compiler emits no code for an assert at all. "
    "An assignment to __debug__ is illegal, and the value is fixed when the interpreter "
    "starts.",
    "Exceptions are a means of breaking out of the normal flow of control of a code block in "
    "order to handle errors or other exceptional conditions. An exception is raised at the "
    "point where the error is detected; it may be handled by the surrounding code block or by "
    "any code block that directly or indirectly invoked the code block where the error "
    "occurred. The raise statement raises one explicitly, and the try statement specifies "
    "exception handlers and clean-up code for a group of statements.",
)
#: ... the evidence quote copied from the first passage (tokens), verified in passes of at
#: most ``COPY_ROWS`` rows, then ``STEPS`` one-token steps; ``ROUNDS`` answers per engine.
COPY_TOKENS = 93
COPY_ROWS = 48
STEPS = 8
ROUNDS = 3
#: The workload's version in the cache key: a changed workload is measured again.
WORKLOAD = "answer1"
#: The backends ``choose_backend`` prefers on a tie, first first.
PREFERENCE = ("torch", "llama.cpp")

__all__ = ["COPY_ROWS", "COPY_TOKENS", "MEASURED_GAIN", "PASSAGES", "QUESTION", "ROUNDS", "STEPS",
           "WORKLOAD", "AnswerWorkload", "Decision", "cache_key", "cached", "choose_backend",
           "cpu_kind", "decide", "describe_workload", "figures", "llama_cpp_available",
           "measure_answers", "not_installed", "resolve_backend", "torch_build", "wheel_level"]


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
    """The backend with the fastest measured answer among the exact ones (all of them when
    none is exact); a tie goes to the earlier of ``PREFERENCE``."""
    if not seconds:
        raise ValueError("choose_backend needs the answer time of at least one backend")
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
        return Decision("torch", not_installed())
    key = cache_key()
    if not measure and cached(key) is None:
        return Decision("torch", "not measured on this machine yet (the first model load "
                                 "measures it)", pending=True)
    try:
        record = _choices().get(key, measure_answers)
    except Exception as exc:  # noqa: BLE001 - a failed measurement must not stop the request
        LOG.warning("backend auto: measuring the engines failed (%s); running torch, and "
                    "measuring again next time", exc)
        return Decision("torch", f"the measurement failed ({exc}); not cached")
    after = cache_key()  # the first torch load may have settled its dtype (``lm.auto_dtype``)
    if after != key:
        _choices().get(after, lambda: record)
    return Decision(str(record["choice"]), _explain(record), dict(record))


#: What the llama.cpp extra gave on each CPU kind this project measured it on (``cpu_kind``),
#: with the result file that holds the figure: what ``--fast`` would give, said before it is
#: installed. A kind not here was not measured.
MEASURED_GAIN = {
    "AMD EPYC, AVX-512": "the README question's cold `nest ask` took 4.7 s against torch's 8.3 s "
                         "(benchmarks/results/startup.md)",
    "Intel Xeon, AVX-512": "2.7x the tokens per second of torch's bf16 greedy decoding "
                           "(benchmarks/results/speed_all.md)",
}


def cpu_kind(cpuinfo: str | None = None) -> str:
    """This CPU as the project's figures name it: the model family ("AMD EPYC", "Intel Xeon",
    else the model name) and its widest vector level ("AVX-512", "AVX2"), from the Linux
    ``/proc/cpuinfo`` (``cpuinfo``: its text); "unknown" where it cannot be read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read(65536)
        except OSError:
            return "unknown"
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:64] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name, flags = fields.get("model name", ""), set(fields.get("flags", "").split())
    family = next((f for f in ("AMD EPYC", "Intel Xeon") if f.split()[1] in name), name)
    level = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return ", ".join(x for x in (family or "unknown", level) if x)


def not_installed(kind: str | None = None) -> str:
    """Why ``auto`` runs torch where the llama.cpp extra is missing, how to add it, and what it
    gave on this CPU kind (``MEASURED_GAIN``), or that it was not measured there."""
    kind = cpu_kind() if kind is None else kind
    gain = MEASURED_GAIN.get(kind)
    said = (f"on this CPU kind ({kind}) llama.cpp measured: {gain}" if gain else
            f"not measured on this CPU kind ({kind}); once installed, `nest info` measures both")
    return ("the llama.cpp extra is not installed (`bash scripts/quickstart.sh --fast` or "
            "`bash scripts/install.sh llamacpp` builds it once, about 6-7 min on 2 cores; "
            f"pip install 'nest-integrations[llamacpp]'); {said}")


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
    found = (data.get("backends") or {}).get(key or cache_key()) if isinstance(data, dict) \
        else None
    return found if isinstance(found, dict) else None


def cache_key() -> str:
    """``lm.cache_key`` of both engines of the default model, before either is loaded
    (``model|build|cpu|t<threads>|torch<version>``), its build naming the torch build in use
    (``torch_build``), llama-cpp-python's version, its wheel's CPU level (``wheel_level``) and
    the workload (``WORKLOAD``): ``fp32+packed+llama_cpp0.3.36-avx512+answer1``."""
    from importlib.metadata import PackageNotFoundError, version

    from nest_integrations.lm.cache_key import engines_key
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME

    try:
        llama = version("llama_cpp_python")
    except PackageNotFoundError:
        llama = "?"
    build = f"{torch_build()}+llama_cpp{llama}-{wheel_level()}+{WORKLOAD}"
    return engines_key(DEFAULT_MODEL_NAME, build).text()


def torch_build() -> str:
    """How the torch engine of the default model loads here, without loading it: the dtype
    ``"auto"`` gives on the CPU (fp32 where ``lm.auto_dtype`` remembers that bf16 rows were
    not exact) and ``+packed`` where the loader prepacks it (``lm.packing.packing_wanted``)."""
    import torch

    from nest_integrations import paths
    from nest_integrations.lm import auto_dtype
    from nest_integrations.lm.backend import SHORT_NAMES, resolve_dtype
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME
    from nest_integrations.lm.packing import packing_wanted

    cpu = torch.device("cpu")
    dtype = resolve_dtype("auto", cpu)
    folder = paths.models_dir() / DEFAULT_MODEL_NAME  # the converted model (not converted here)
    remembered = auto_dtype.key(str(folder), "auto", cpu, dtype, None, None, {})
    if remembered is not None and auto_dtype.recall(remembered) == "fp32":
        dtype = torch.float32
    name = SHORT_NAMES[str(dtype).removeprefix("torch.")]
    return name + ("+packed" if packing_wanted(None, cpu, dtype) else "")


def wheel_level() -> str:
    """The CPU level llama-cpp-python's wheel was built at (``avx512``, ``avx2``, ``generic``:
    ``lm.llama_cpp.library.cpu_level`` of its system info), ``"?"`` where it cannot be read."""
    from nest_integrations.lm.llama_cpp.library import cpu_level, system_info

    try:
        return cpu_level(system_info())
    except (ImportError, OSError, AttributeError) as exc:
        LOG.debug("llama.cpp's system info is unreadable: %s", exc)
        return "?"


def figures(record: Mapping[str, Any]) -> list[str]:
    """A measured record's figures, one line per engine, fastest first: the answer's seconds
    and its parts, exact or not (``nest info`` prints them)."""
    lines = []
    parts = record.get("parts") or {}
    for b, s in sorted(record["seconds"].items(), key=lambda kv: kv[1]):
        part = parts.get(b) or {}
        detail = ", ".join(f"{name} {1e3 * float(part[name]):.0f} ms"
                           for name in ("prefill", "copy", "steps") if name in part)
        exact = "exact" if record["exact"].get(b) else "NOT exact"
        lines.append(f"{b} {float(s):.3f} s an answer" + (f" ({detail})" if detail else "")
                     + f", {exact}" + (f", {record['builds'][b]}" if b in
                                      (record.get("builds") or {}) else ""))
    return lines


def describe_workload(record: Mapping[str, Any]) -> str:
    """What a record timed, in words: ``"one answer (288-token prompt, ...)"``."""
    w = record.get("workload") or {}
    if not w:
        return "one answer"
    return (f"one answer ({w['prompt_tokens']}-token prompt, a {w['copy_tokens']}-token copy in "
            f"{w['copy_passes']} passes, {w['steps']} steps; the fastest of {w['rounds']})")


def _explain(record: Mapping[str, Any]) -> str:
    return (f"measured on this machine at {record.get('threads', '?')} thread(s), "
            f"{describe_workload(record)}: " + "; ".join(figures(record))
            + "; cached in $NEST_HOME/exactness")


def measure_answers(rounds: int = ROUNDS) -> dict[str, Any]:
    """Seconds of the fastest of ``rounds`` fixed answers (``AnswerWorkload``) of the default
    model on each backend, run interleaved after one untimed answer each (medians kept too),
    each part's seconds in the fastest, the exactness verdicts and ``choose_backend``'s pick:
    the record ``decide`` caches."""
    from nest_integrations.lm.backend import configured_threads
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel
    from nest_integrations.lm.port import port_of

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    start = time.perf_counter()
    threads = configured_threads()
    lms = {"torch": HFLanguageModel.from_default(),
           "llama.cpp": LlamaCppLanguageModel.from_default(threads=threads)}
    try:
        runs = {b: AnswerWorkload(lm) for b, lm in lms.items()}
        times: dict[str, list[dict[str, float]]] = {b: [] for b in lms}
        for _ in range(rounds + 1):  # the first round warms up
            for b, run in runs.items():
                times[b].append(run.answer())
        best = {b: min(t[1:], key=lambda p: sum(p.values())) for b, t in times.items()}
        seconds = {b: sum(p.values()) for b, p in best.items()}
        medians = {b: statistics.median(sum(p.values()) for p in t[1:])
                   for b, t in times.items()}
        exact = {b: bool(lm.exact_rows) for b, lm in lms.items()}
        builds = {b: port_of(lm).build().label for b, lm in lms.items()}
        workload = runs["torch"].shape() | {"rounds": rounds}
    finally:
        lms["llama.cpp"].close()
    record = {"seconds": seconds, "parts": best, "median_seconds": medians, "exact": exact,
              "choice": choose_backend(seconds, exact), "threads": threads, "builds": builds,
              "llama_cpp_level": wheel_level(), "workload": workload,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "took_s": round(time.perf_counter() - start, 2)}
    LOG.info("backend auto: %s (%s)", record["choice"], _explain(record))
    return record


class AnswerWorkload:
    """The fixed answer on one LM (module docstring): ``answer()`` runs it on a fresh cache and
    returns each part's seconds (``prefill``, ``copy``, ``steps``)."""

    def __init__(self, lm: Any) -> None:
        from nest_integrations.lm.port import port_of

        self.lm, self.port = lm, port_of(lm)
        context = "\n\n".join(PASSAGES)
        self.prompt = lm.chat_prompt([{"role": "user", "content": (
            f"Answer the question from the background.\nBackground:\n{context}\n\n"
            f"Question: {QUESTION}")}])
        self.copy = list(lm.tokenize(PASSAGES[0]))[:COPY_TOKENS]
        if len(self.copy) < COPY_TOKENS:
            raise ValueError(f"the workload's passage is {len(self.copy)} tokens on {lm.name}, "
                             f"under COPY_TOKENS={COPY_TOKENS}")

    def shape(self) -> dict[str, int]:
        """The workload's sizes (the record's ``workload``)."""
        return {"prompt_tokens": len(self.prompt), "copy_tokens": len(self.copy),
                "copy_passes": -(-len(self.copy) // COPY_ROWS), "steps": STEPS}

    def answer(self) -> dict[str, float]:
        lm, port = self.lm, self.port
        session = port.session.decoding_session() if port.session is not None else nullcontext()
        with session, port.inexact_context():
            cache = lm.new_cache()
            try:
                t0 = time.perf_counter()
                logits, _ = lm.forward(self.prompt, cache, last=1)
                token = int(logits[-1].argmax())
                t1 = time.perf_counter()
                for i in range(0, len(self.copy), COPY_ROWS):  # the quote, a verify pass a chunk
                    logits, _ = lm.forward(self.copy[i:i + COPY_ROWS], cache)
                token = int(logits[-1].argmax())
                t2 = time.perf_counter()
                for _ in range(STEPS):
                    logits, _ = lm.forward([token], cache, last=1)
                    token = int(logits[-1].argmax())
                t3 = time.perf_counter()
            finally:
                if port.release is not None:
                    port.release.release_cache(cache)
        return {"prefill": t1 - t0, "copy": t2 - t1, "steps": t3 - t2}
