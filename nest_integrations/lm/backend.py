"""The backend settings of a process: which runtime runs the LM, its dtype and thread count.

One place decides them for every entry point (``HFLanguageModel.from_pretrained``,
``assembly.shared_model``, the ``nest`` subcommands and the server):

- **backend** (``parse_backend`` / ``requested_backend``; ``lm.auto_backend.resolve_backend``
  resolves ``auto``): ``"torch"`` (transformers),
  ``"llama.cpp"`` (``lm.llama_cpp``: a GGUF file on llama-cpp-python, the ``llamacpp`` extra)
  or ``"auto"`` (the default): the faster exact engine for the embedded model on this machine,
  measured once and cached (``lm.auto_backend``); torch, silently, where the extra is not
  installed. ``None`` is the process default (``set_default_backend``; ``nest ...
  --backend`` sets it, so every model a job loads runs on it), else ``$NEST_BACKEND``, else
  ``"auto"``.

- **dtype** (``parse_dtype`` / ``resolve_dtype``): ``"fp32"``/``"float32"``, ``"bf16"``/
  ``"bfloat16"``, ``"fp16"``/``"float16"``, a ``torch.dtype``, ``"checkpoint"`` (the
  checkpoint's own dtype, what ``transformers`` calls ``dtype="auto"``) or ``"auto"``: bf16 on
  CUDA, and on CPU bf16 only where the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16,
  ``cpu_has_native_bf16``), else fp32. ``None`` is the process default (``set_default_dtype``;
  initially ``"auto"``: ``docs/decisions.md``). The mixture, RRC,
  distances and verification always run in fp32: ``HFLanguageModel`` upcasts logits and keys
  where they leave the model.
- **threads** (``configure_threads``): ``--threads``, else ``$NEST_THREADS``, else
  ``$OMP_NUM_THREADS``, else the number of physical cores (``physical_cores``); applied to
  torch's pool (``torch.set_num_threads``) and to every BLAS and OpenMP pool already loaded
  (numpy's OpenBLAS, FAISS's OpenMP: ``threadpoolctl``). A llama.cpp context made afterwards
  takes the same count (``configured_threads``), so one setting covers the process.

Usage::

    from nest_integrations.lm import backend

    backend.resolve_dtype("auto", torch.device("cpu"))   # torch.bfloat16 on an AVX512-BF16 CPU
    backend.configure_threads()                          # NEST_THREADS or the physical cores
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

from nest_integrations.config import NestConfig

if TYPE_CHECKING:  # torch is imported on use: the CLI parsers need none of it
    import torch

LOG = logging.getLogger(__name__)

#: Accepted spellings -> the torch dtype's name (``"auto"`` and ``"checkpoint"`` apart).
DTYPE_NAMES: dict[str, str] = {
    "fp32": "float32", "float32": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16",
}  # fmt: skip
#: Every value ``--dtype`` and ``dtype=`` accept.
DTYPE_CHOICES: tuple[str, ...] = ("auto", *DTYPE_NAMES, "checkpoint")
#: Short names of the torch dtypes, for manifests, cache keys and logs.
SHORT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: Environment variable with torch's thread count for CLI jobs and the server.
THREADS_ENV = "NEST_THREADS"
#: The runtimes an LM can run on (``EngineSpec(backend=...)``, ``--backend``).
BACKENDS: tuple[str, ...] = ("torch", "llama.cpp")
#: Every value ``--backend`` and ``backend=`` accept: a runtime, or ``"auto"`` (the default:
#: ``lm.auto_backend`` picks one).
BACKEND_CHOICES: tuple[str, ...] = ("auto", *BACKENDS)
#: Environment variable with the backend ``backend=None`` means when no job set one.
BACKEND_ENV = "NEST_BACKEND"
#: Why KNN-SSD cannot run on the llama.cpp backend (``check_backend``, ``lm.llama_cpp``).
KNN_SSD_UNSUPPORTED = (
    "decoding='knn-ssd' is not available on the llama.cpp backend: KNN-SSD drafts with the same "
    "model with layers skipped, and llama.cpp has no API to skip layers (ggml-org/llama.cpp#10820 "
    "was closed, #3565 is unmerged); use backend='torch' for KNN-SSD"
)
#: Other accepted spellings of a backend.
_BACKEND_ALIASES = {"hf": "torch", "transformers": "torch", "llamacpp": "llama.cpp",
                    "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp", "gguf": "llama.cpp"}

_default_dtype: str | None = None
_default_backend: str | None = None


def parse_backend(backend: str | None) -> str | None:
    """``backend``'s canonical name (``BACKEND_CHOICES``), None for None; a ``ValueError``
    names the accepted values."""
    if backend is None:
        return None
    name = str(backend).strip().lower()
    name = _BACKEND_ALIASES.get(name, name)
    if name not in BACKEND_CHOICES:
        raise ValueError(f"backend={backend!r} is not supported: use one of "
                         f"{', '.join(BACKEND_CHOICES)}")
    return name


def requested_backend(backend: str | None = None) -> str:
    """What was asked for, before ``auto`` is resolved: ``backend``, else the process default,
    else ``$NEST_BACKEND``, else ``"auto"``."""
    env = os.environ.get(BACKEND_ENV, "").strip()
    try:
        from_env = parse_backend(env) if env else None
    except ValueError:
        raise ValueError(f"{BACKEND_ENV}={env!r} is not a backend: use one of "
                         f"{', '.join(BACKEND_CHOICES)}") from None
    return parse_backend(backend) or _default_backend or from_env or "auto"


def set_default_backend(backend: str | None) -> None:
    """The backend that ``backend=None`` means in this process (None: back to
    ``$NEST_BACKEND``, else ``"auto"``)."""
    global _default_backend
    _default_backend = parse_backend(backend)


def parse_dtype(dtype: "str | torch.dtype | None") -> "str | torch.dtype | None":
    """Validate ``dtype``: None, ``"auto"``, ``"checkpoint"`` or a torch dtype (a name becomes
    its ``torch.dtype``). Raises ``ValueError`` naming the accepted values."""
    if dtype is None:
        return None
    import torch

    if isinstance(dtype, torch.dtype) and str(dtype).removeprefix("torch.") in SHORT_NAMES:
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name in ("auto", "checkpoint"):
            return name
        if name in DTYPE_NAMES:
            return getattr(torch, DTYPE_NAMES[name])
    raise ValueError(
        f"dtype={dtype!r} is not supported: use one of {', '.join(DTYPE_CHOICES)} "
        "(or torch.float32 / torch.bfloat16 / torch.float16)"
    )


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16), as torch's
    cpuinfo reports it (``torch.cpu.get_capabilities``), else the Linux ``/proc/cpuinfo`` flags.
    Without native bf16 a bf16 matmul is emulated and slower than fp32."""
    caps = _cpu_capabilities()
    if caps is not None:
        return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cpu_capabilities() -> Any:
    import torch

    get = getattr(getattr(torch, "cpu", None), "get_capabilities", None)
    if get is None:
        return None
    try:
        return get()
    except Exception:  # noqa: BLE001 - an old torch or an unknown CPU: fall back
        return None


def resolve_dtype(dtype: "str | torch.dtype | None", device: "torch.device | str") -> Any:
    """The dtype to load with on ``device``: a ``torch.dtype``, or the string ``"auto"`` for
    the checkpoint's own dtype (what ``transformers`` expects for that)."""
    import torch

    device = torch.device(device)
    value = parse_dtype(dtype if dtype is not None else _default_dtype)
    if value is None:  # the process default: auto
        value = "auto"
    if value == "checkpoint":
        return "auto"
    if value == "auto":
        if device.type != "cpu":
            return torch.bfloat16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return value


def requests_auto(dtype: "str | torch.dtype | None") -> bool:
    """Whether ``dtype`` (None: the process default) asks for ``"auto"``: then the loader may
    trade bf16 for fp32 where only fp32's verify rows are bit-exact (``lm.exactness``)."""
    value = parse_dtype(dtype if dtype is not None else _default_dtype)
    return value is None or value == "auto"


def dtype_label(dtype: "str | torch.dtype | None", device: "torch.device | str") -> str:
    """A short name of what ``resolve_dtype`` gives (``"fp32"``, ``"bf16"``, ``"fp16"`` or
    ``"checkpoint"``): the model cache's key and the logs' word."""
    value = resolve_dtype(dtype, device)
    return "checkpoint" if value == "auto" else SHORT_NAMES[str(value).removeprefix("torch.")]


def set_default_dtype(dtype: "str | torch.dtype | None") -> None:
    """The dtype that ``dtype=None`` means in this process (None: back to ``"auto"``). ``nest ... --dtype`` sets it, so every model the job loads uses it."""
    global _default_dtype
    parse_dtype(dtype)
    _default_dtype = None if dtype is None else str(dtype).removeprefix("torch.")


def default_dtype() -> str | None:
    """The process default set by ``set_default_dtype`` (None when unset)."""
    return _default_dtype


def check_backend(backend: str, dtype: Any = None, device: Any = None,
                  decoding: str | None = None) -> None:  # fmt: skip
    """A ``ValueError`` when ``dtype``, ``device`` or ``decoding`` cannot run on ``backend``
    (llama.cpp: the GGUF's own weights, on the CPU, no KNN-SSD)."""
    if backend != "llama.cpp":
        return
    if parse_dtype(dtype) not in (None, "auto"):
        raise ValueError(
            f"dtype={dtype!r} applies to the torch backend: llama.cpp runs the GGUF file's own "
            "quantisation (pick another with model='Q8_0' etc., see docs/backends.md)"
        )
    if device not in (None, "cpu", "auto"):
        raise ValueError(f"device={device!r}: the llama.cpp backend of this package runs on the "
                         "CPU only; use backend='torch' for CUDA")
    if decoding == "knn-ssd":
        raise ValueError(KNN_SSD_UNSUPPORTED)


#: NEST's span length on llama.cpp when the config keeps the preset's (``backend_config``).
LLAMA_CPP_MAX_SPAN = 8
#: Each backend's key source where the config leaves it unset (``NestConfig.key_source=None``).
DEFAULT_KEY_SOURCES = {"torch": "ffn_input", "llama.cpp": "final_norm"}


def backend_config(cfg: NestConfig, backend: str) -> NestConfig:
    """``cfg`` for ``backend``: an unset key source becomes the backend's
    (``DEFAULT_KEY_SOURCES``). On llama.cpp also:

    - an explicit key source stays: ``"final_norm"`` (its embeddings output) or ``"ffn_input"``
      (the paper's, through llama.cpp's eval callback: ``lm.llama_cpp.KEY_LAYERS``); any other
      is a ``ValueError``;
    - look-ahead is off: a guess rides on a multi-token pass, which on llama.cpp costs about as
      many one-token steps as it has tokens, so wrong guesses cost more than right ones save
      (``docs/decisions.md``, 'llama.cpp (issue 35)'). A guess never changes the output;
    - NEST's spans are at most ``LLAMA_CPP_MAX_SPAN`` tokens when ``max_span`` is the preset's
      (64; another value is kept): on that curve a rejected tail costs about a step per row, and
      a fully accepted span goes on copying from its next row anyway (the same output,
      ``docs/decisions.md``, 'llama.cpp (issue 35)').
    """
    changes: dict[str, object] = {}
    if cfg.key_source is None:
        changes["key_source"] = DEFAULT_KEY_SOURCES.get(backend, DEFAULT_KEY_SOURCES["torch"])
    if backend != "llama.cpp":
        return cfg.replace(**changes) if changes else cfg
    from nest_integrations.lm.llama_cpp.outputs import KEY_LAYERS

    if cfg.key_source is not None and cfg.key_source not in KEY_LAYERS:
        raise ValueError(
            f"key_source={cfg.key_source!r} is not available on the llama.cpp backend: use "
            f"one of {', '.join(map(repr, KEY_LAYERS))}, or backend='torch' for other layers")
    if cfg.lookahead:
        changes["lookahead"] = 0
    if cfg.max_span == NestConfig().max_span and cfg.max_span > LLAMA_CPP_MAX_SPAN:
        changes["max_span"] = LLAMA_CPP_MAX_SPAN
    if not changes:
        return cfg
    LOG.debug("llama.cpp backend: %s", changes)
    return cfg.replace(**changes)


def machine_name() -> str:
    """The accelerator or CPU model ("Intel(R) Xeon(R) ..."), for cache keys and reports."""
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# --------------------------------------------------------------------------------- threads


def physical_cores() -> int:
    """Physical CPU cores (torch's cpuinfo; else ``os.cpu_count()``), at least 1."""
    caps = _cpu_capabilities()
    n = caps.get("num_physical_cores") if caps is not None else None
    if not isinstance(n, int) or n < 1:
        n = os.cpu_count() or 1
    return max(1, int(n))


def thread_count(threads: int | None = None) -> int:
    """``threads`` if given, else ``$NEST_THREADS``, else ``$OMP_NUM_THREADS`` (a user who set
    OpenMP's own variable has chosen), else ``physical_cores()``."""
    source = "--threads"
    for env in (THREADS_ENV, "OMP_NUM_THREADS"):
        if threads is None and os.environ.get(env, "").strip():
            raw, source = os.environ[env].strip(), env
            try:
                threads = int(raw)
            except ValueError:
                raise ValueError(f"{env}={raw!r} is not a whole number of threads") from None
    if threads is None:
        return physical_cores()
    if int(threads) < 1:
        raise ValueError(f"{source} must be at least 1, got {threads}")
    return int(threads)


#: The count ``configure_threads`` last set (None: never called in this process).
_CONFIGURED: int | None = None


def configure_threads(threads: int | None = None) -> int:
    """Set the process's compute threads to ``thread_count(threads)`` and return the count;
    the llama.cpp backend's default thereafter (``configured_threads``).

    Torch's intra-op pool and every BLAS and OpenMP pool loaded so far (numpy's OpenBLAS, the
    OpenMP runtime FAISS ships) get that count, so ``--threads 1`` means one core: numpy's
    OpenBLAS otherwise keeps a thread per core, and in a 1-thread speed run its product used
    both (``docs/llama_cpp.md``). A library first loaded later keeps its own default."""
    import numpy  # noqa: F401  (its OpenBLAS is loaded, so threadpoolctl sees it)
    import threadpoolctl
    import torch

    global _CONFIGURED
    n = _CONFIGURED = thread_count(threads)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    threadpoolctl.threadpool_limits(limits=n)  # kept: not used as a context manager
    LOG.info("compute threads (torch, BLAS, OpenMP): %d", n)
    return n


def configured_threads() -> int:
    """Threads for a backend that keeps its own pool (llama.cpp): the count
    ``configure_threads`` set (the CLI's ``--threads``), else ``thread_count()``
    (``$NEST_THREADS``, ``$OMP_NUM_THREADS``, the physical cores), never torch's own default."""
    return _CONFIGURED if _CONFIGURED is not None else thread_count()


# --------------------------------------------------------------------------------- CLI


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--dtype`` and ``--threads`` of the CLI jobs."""
    p.add_argument(
        "--backend", default=None, type=str.lower,
        choices=BACKEND_CHOICES + tuple(_BACKEND_ALIASES), metavar="BACKEND",
        help="what runs the LM: auto (default: the faster exact engine for the embedded model "
        "on this machine, measured once, see `nest info`; torch where llama.cpp is not "
        "installed), torch (transformers) or llama.cpp (the GGUF file on llama-cpp-python: "
        "pip install 'nest-integrations[llamacpp]'); one store serves both (each backend's "
        f"keys are encoded on first use); default ${BACKEND_ENV}, else auto",
    )
    p.add_argument(
        "--dtype", default=None, type=str.lower, choices=DTYPE_CHOICES, metavar="DTYPE",
        help="model weights: auto (bf16 where the CPU multiplies bf16 natively, e.g. "
        "AVX512-BF16/AMX, else fp32; bf16 on CUDA), fp32, bf16, fp16 or checkpoint (the "
        "checkpoint's own); default auto",
    )
    p.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help=f"torch and llama.cpp threads (default: ${THREADS_ENV}, else $OMP_NUM_THREADS, "
        "else the number of physical cores)",
    )


def apply_backend_args(args: argparse.Namespace) -> None:
    """Apply ``--backend`` (the process's default backend), ``--threads`` (torch's, which
    llama.cpp contexts also take) and ``--dtype`` (the process's default dtype) of a CLI job."""
    configure_threads(getattr(args, "threads", None))
    backend = getattr(args, "backend", None)
    if backend is not None:
        set_default_backend(backend)
    dtype = getattr(args, "dtype", None)
    if dtype is not None:
        set_default_dtype(dtype)


__all__ = [
    "BACKENDS",
    "BACKEND_CHOICES",
    "BACKEND_ENV",
    "DTYPE_CHOICES",
    "DTYPE_NAMES",
    "THREADS_ENV",
    "add_backend_args",
    "apply_backend_args",
    "configure_threads",
    "cpu_has_native_bf16",
    "default_dtype",
    "dtype_label",
    "machine_name",
    "parse_backend",
    "parse_dtype",
    "physical_cores",
    "requested_backend",
    "requests_auto",
    "resolve_dtype",
    "set_default_backend",
    "set_default_dtype",
    "thread_count",
]
