"""Whether a loaded model's lossless methods are lossless here: the loader's row-exact kernels,
and the verdict that ``dtype="auto"``, ``nest info`` and ``NestStats.exact_rows`` report.

- ``prepare`` (called by ``HFLanguageModel.from_pretrained``): on CPU, bf16 linears are
  prepacked for oneDNN (``lm.packing``) and other linears wrapped (``lm.row_exact``), both
  running verify passes by the row plan probed on this CPU; attention becomes row-wise
  (``lm.rowwise_attention``). ``exact_rows=False`` or ``NEST_EXACT_ROWS=0``: the model as
  transformers loads it (bf16 linears are still prepacked unless ``pack_weights=False``).
- ``verdict(lm)``: ``row_exact.check_rows`` on the loaded model (verify passes against one-token
  steps), cached per model fingerprint, dtype, threads, torch version and CPU model in
  ``$NEST_HOME/exactness/``. False without the row-exact kernels (on a GPU too): nothing there
  guarantees a verify row the bits of a step.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import torch

from nest_integrations.lm import rowwise_attention
from nest_integrations.lm.cache_key import key_of
from nest_integrations.lm.port import port_of
from nest_integrations.lm.packing import pack_linear_weights, packing_wanted
from nest_integrations.lm.row_exact import (
    MachineCache,
    RowExactLinear,
    check_rows,
    env_allows,
    make_row_exact,
    row_plans,
)

LOG = logging.getLogger(__name__)

VERDICTS = MachineCache("verdicts")


@runtime_checkable
class RowsOneAtATime(Protocol):
    """An LM that says whether its exact verify rows are decoded one at a time (llama.cpp)."""

    @property
    def rows_one_at_a_time(self) -> bool: ...


@runtime_checkable
class HasTorchModel(Protocol):
    """An LM over a torch module (``HFLanguageModel``)."""

    model: torch.nn.Module

#: Keys are reproducible across batchings (batch sizes, Ray actors, the lazy cache, thread
#: counts) to this relative error per key vector, ``||a - b|| / ||b||``, by the dtype that
#: encoded them: measured up to 1e-5 in fp32 (the store's fp16 adds up to 5e-4) and 0.044 in
#: bf16 (cosine >= 0.999; bf16 against fp32: 0.047), on 32 passages of the sample corpus at
#: batch sizes 1, 4 and 16. Rows of a padded batch are not row-exact (their matmuls and
#: attention take the batch's shapes): bit-identical keys would mean one call per passage,
#: half the bf16 ingest throughput.
KEY_RTOL = {"float32": 2e-3, "bfloat16": 0.1, "float16": 0.1}


def wanted(exact_rows: bool | None, device: torch.device) -> bool:
    """The loader's choice: ``exact_rows`` if given, else ``$NEST_EXACT_ROWS`` (on unless
    ``0``/``false``); only on CPU."""
    return (env_allows() if exact_rows is None else bool(exact_rows)) and device.type == "cpu"


def prepare(model: Any, *, pack_weights: bool | None, exact_rows: bool | None,
            user_chose_attention: bool) -> dict[str, Any]:
    """Switch a loaded model to the row-exact kernels (module docstring). Returns
    ``{"packed": n, "row_exact": n, "rowwise": bool}``: prepacked linears, linears running by
    row plans (packed ones included), and whether attention is row-wise."""
    weights = next(model.parameters())
    exact = wanted(exact_rows, weights.device)
    packed = pack_linear_weights(model) if packing_wanted(pack_weights, weights.device,
                                                          weights.dtype) else 0
    if exact and not packed:
        make_row_exact(model)
    linears = [m for m in model.modules() if isinstance(m, RowExactLinear)]
    for m in linears:
        m.exact = exact
    rowwise = bool(exact and linears and rowwise_attention.wanted(model, user_chose_attention)
                   and rowwise_attention.use_rowwise(model))
    return {"packed": packed, "row_exact": len(linears) if exact else 0, "rowwise": rowwise}


def verdict(lm: Any) -> bool:
    """Whether ``lm``'s verify passes equal one-token steps bit for bit at the current thread
    count (cached per ``lm.cache_key`` and row plans; module docstring)."""
    if not port_of(lm).build().row_exact:
        return False
    plans = ",".join(f"{k}:{p[0]}/{p[1]}" for k, p in sorted(row_plans(lm.model).items()))
    return bool(VERDICTS.get(f"{key_of(lm).text()}|{plans}", lambda: check_rows(lm)))


def checked(lm: Any) -> bool:
    """``row_exact.check_rows`` on any LM port implementation (the llama.cpp backend's rows
    come from its own kernels), cached per ``lm.cache_key`` (its build names the KV cache type
    and repacked weights: other kernels; its threads are the LM's own)."""
    return bool(VERDICTS.get(key_of(lm).text(), lambda: check_rows(lm)))


def describe(lm: Any) -> dict[str, Any]:
    """What ``nest info`` and benchmark reports print: device, dtype (and how ``auto`` chose
    it), threads, whether lossless methods are exact here, and the row plans."""
    port = port_of(lm)
    build = port.build()
    info: dict[str, Any] = {
        "device": str(lm.device),
        "dtype": build.weights.removeprefix("gguf-"),
        "threads": torch.get_num_threads(),
        "exact_rows": port.exact_rows(),
        "dtype_choice": build.dtype_choice,
    }
    if port.rows_split is not None and isinstance(lm, RowsOneAtATime) and lm.rows_one_at_a_time:
        info["rows_one_at_a_time"] = True  # llama.cpp, a type whose rows are not steps
    if build.row_exact_linears and isinstance(lm, HasTorchModel):
        info["row_plans"] = {k: {"pad_to": p[0], "block": p[1]}
                             for k, p in row_plans(lm.model).items()}
    return info


__all__ = ["KEY_RTOL", "VERDICTS", "checked", "describe", "prepare", "verdict", "wanted"]
