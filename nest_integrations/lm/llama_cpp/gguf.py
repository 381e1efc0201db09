"""GGUF files: which file a ``model`` names (``resolve_gguf``), the embedded model requantised
(``requantize``, ``default_gguf``), a file's weight type (``quantization_name``) and a fast
digest of its bytes (``file_digest``) for the LM's fingerprint."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from nest_integrations.lm.llama_cpp.library import init, llama_cpp_module

LOG = logging.getLogger(__name__)

#: The embedded model's quantisation on llama.cpp: the shipped Q4_1 requantised to Q8_0 once (in
#: ``$NEST_HOME/models/gguf``) prefills and steps faster (llama.cpp's tiled matmul has Q8_0 and
#: Q4_0 kernels, no Q4_1 one) at nearly Q4_1's held-out perplexity; Q4_0 is as fast but worse
#: (``docs/decisions.md``, 'llama.cpp (issue 35)'). ``model="Q4_1"`` runs the shipped file as it is.
DEFAULT_QUANT = "Q8_0"
#: Quantisations ``resolve_gguf`` makes from the shipped model (``requantize``).
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "IQ4_NL")


def quant_type(name: str) -> str:
    """A quantisation's canonical name: ``"q8-0"`` -> ``"Q8_0"``."""
    return name.upper().replace("-", "_")


def quantization_name(lib: Any, model: Any) -> str:
    """The GGUF's file type as llama.cpp names it, shortened: ``"Q4_1"``, ``"Q8_0"``, ``"F16"``."""
    ftype = int(lib.llama_model_ftype(model))
    name = lib.llama_ftype_name(ftype)
    text = name.decode() if isinstance(name, bytes) else str(name or "")
    return text.removeprefix("MOSTLY_").split(" ")[0].replace("-", "_") or f"ftype{ftype}"


def file_digest(path: Path) -> str:
    """sha256 of the file's size and 256 strided 4 KiB samples (fast on large files)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(256):
            f.seek(size * i // 256)
            h.update(f.read(4096))
    return h.hexdigest()


def fingerprint(name: str, backend: str, quantization: str, description: str, path: Path,
                passage_prefix: list[int]) -> str:
    """``"<name>@<backend>-<quantisation>-<16 hex>"``: a hash of the GGUF (metadata and strided
    samples of its bytes) and the passage prefix. It names the backend and the quantisation, so
    keys of the torch backend or of another GGUF are refused."""
    h = hashlib.sha256(f"{backend}|{quantization}|{description}".encode())
    h.update(file_digest(path).encode())
    h.update(repr(list(passage_prefix)).encode())
    short = Path(name).name or name
    return f"{short}@{backend}-{quantization}-{h.hexdigest()[:16]}"


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    """``llama_model_quantize`` of ``src`` to ``qtype`` (``"Q4_0"``, ``"Q8_0"``, ...) into
    ``dst``; requantising a quantised file is allowed."""
    lib = llama_cpp_module()
    init(lib)
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{qtype}", None)
    if ftype is None:
        raise ValueError(f"unknown llama.cpp quantisation {qtype!r}: use e.g. Q4_0, Q4_1, Q8_0, "
                         "F16")
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = int(threads)
    rc = lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {qtype} failed ({rc})")


def requantize(src: str | os.PathLike[str], qtype: str,
               dest: str | os.PathLike[str] | None = None) -> Path:  # fmt: skip
    """``src`` requantised to ``qtype`` (``"Q4_0"``, ``"Q8_0"``, ...) with
    ``llama_model_quantize``: written once to ``dest`` (default
    ``$NEST_HOME/models/gguf/<stem>.<QTYPE>.gguf``) and reused after. Requantising a quantised
    file (Q4_1 -> Q4_0) compounds the rounding: measure its quality before relying on it."""
    from nest_integrations import paths

    src, qtype = Path(src), quant_type(qtype)
    stem = src.name.removesuffix(".gguf").split(".")[0]
    out = Path(dest) if dest is not None else paths.models_dir() / "gguf" / f"{stem}.{qtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        quantize(src, tmp, qtype, torch.get_num_threads())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    LOG.info("requantised %s to %s: %s", src.name, qtype, out)
    return out


def default_gguf() -> Path:
    """The embedded model's GGUF on llama.cpp: the shipped file requantised to
    ``DEFAULT_QUANT`` (made on first use, then reused)."""
    from nest_integrations.lm.default import gguf_path

    return requantize(gguf_path(), DEFAULT_QUANT)


def resolve_gguf(model: str | None) -> tuple[Path, str | None]:
    """``(GGUF path, name)`` for the llama.cpp backend's ``model``: None (the embedded model as
    ``DEFAULT_QUANT``), a quantisation in ``QUANT_TYPES`` (``"Q4_1"``: the shipped file as it
    is; another: the shipped model requantised once, cached) or the path of a ``.gguf`` file;
    anything else is a ``ValueError``."""
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME, gguf_path

    if model is None or model == DEFAULT_MODEL_NAME:
        return default_gguf(), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if path.is_file():
        return path, None
    qtype = quant_type(model)
    if qtype == DEFAULT_QUANT:
        return default_gguf(), DEFAULT_MODEL_NAME
    if qtype in QUANT_TYPES:
        shipped = gguf_path()
        made = shipped if qtype == shipped.name.removesuffix(".gguf").rsplit(".", 1)[-1] \
            else requantize(shipped, qtype)
        return made, f"{DEFAULT_MODEL_NAME}-{qtype}"
    raise ValueError(
        f"model={model!r} is not a GGUF file: the llama.cpp backend runs a .gguf path, None (the "
        f"embedded {DEFAULT_MODEL_NAME}) or one of {', '.join(QUANT_TYPES)} (the embedded model "
        "requantised); Hugging Face ids and folders need backend='torch'"
    )


__all__ = ["DEFAULT_QUANT", "QUANT_TYPES", "default_gguf", "file_digest", "fingerprint",
           "quant_type",
           "quantization_name", "quantize", "requantize", "resolve_gguf"]
