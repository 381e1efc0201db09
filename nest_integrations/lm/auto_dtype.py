"""``dtype="auto"`` remembered per machine: where the loader found a model's bf16 verify rows not
bit-exact and loaded it again in fp32 (``lm.hf``, ``lm.exactness``), a later process loads fp32
at once, one load instead of a bf16 load, its packing, its check and a second load (issue 63:
seconds of ``nest ask``'s start-up on an AVX512-BF16 CPU whose bf16 rows are not exact).

The outcome sits beside the row-exactness verdicts in ``$NEST_HOME/exactness/<machine>.json``
(section ``auto_dtype``), keyed by the model folder's weight files (name, size, modification
time), the kernels asked for (prepacking, row-exact rows, attention), the thread count and the
torch version: the inputs of the verdict it stands for. Only local folders are remembered;
deleting the file checks again.

Usage (``HFLanguageModel.from_pretrained``)::

    key = auto_dtype.key(path, dtype, device, load_dtype, pack_weights, exact_rows, hf_kwargs)
    if key and auto_dtype.recall(key) == "fp32":
        load_dtype = torch.float32
    ...
    auto_dtype.remember(key, "fp32")   # after the check chose fp32
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from nest_integrations.lm import exactness
from nest_integrations.lm.packing import packing_wanted
from nest_integrations.lm.row_exact import MachineCache

SECTION = "auto_dtype"
CHOICES = MachineCache(SECTION)
#: ``lm.dtype_choice`` of a model loaded in fp32 by a remembered outcome.
REMEMBERED = "fp32 (auto: bf16 verify rows not bit-exact on this CPU; remembered)"


def key(model: str, dtype: Any, device: torch.device, load_dtype: Any, pack_weights: bool | None,
        exact_rows: bool | None, hf_kwargs: dict[str, Any]) -> str | None:
    """The key of an ``auto`` load that would try bf16 on this CPU first, else None (another
    dtype or device, or a Hub id rather than a local folder)."""
    from nest_integrations.lm.backend import requests_auto

    folder = Path(model)
    if not (requests_auto(dtype) and device.type == "cpu" and load_dtype == torch.bfloat16
            and folder.is_dir()):
        return None
    files = sorted(f for f in folder.iterdir() if f.suffix in (".safetensors", ".bin"))
    stamp = ",".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    kernels = (f"pack{int(packing_wanted(pack_weights, device, torch.bfloat16))}"
               f"-exact{int(exactness.wanted(exact_rows, device))}"
               f"-attn{hf_kwargs.get('attn_implementation')}")
    return (f"{folder.resolve()}|{stamp}|{kernels}|t{torch.get_num_threads()}"
            f"|torch{torch.__version__}")


def recall(key: str) -> str | None:
    """The remembered dtype (``"fp32"``) for ``key``, None when this machine has none."""
    try:
        data = json.loads(CHOICES.path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = (data.get(SECTION) or {}).get(key) if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


def remember(key: str | None, choice: str) -> None:
    """Store ``choice`` for ``key`` (nothing for None)."""
    if key is not None:
        CHOICES.get(key, lambda: choice)


__all__ = ["CHOICES", "REMEMBERED", "SECTION", "key", "recall", "remember"]
