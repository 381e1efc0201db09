"""The decode loop without an engine: ``decode_ids`` runs a method (and its drafter) on a
prompt's token ids, with no retrieval, memory, stop strings or streaming: what the builders
(DReSD's responses, Self-SD) and the lossless oracles call."""

from __future__ import annotations

import torch

from nest_integrations.config import NestConfig
from nest_integrations.decoding.commits import run_to_end
from nest_integrations.decoding.loop import DecodeLoop
from nest_integrations.drafters.base import Drafter, Method
from nest_integrations.lm.base import LanguageModel
from nest_integrations.types import NestStats

def decode_ids(
    lm: LanguageModel, method: Method, prompt_ids: list[int], max_new_tokens: int, *,
    drafter: Drafter | None = None, config: NestConfig | None = None,
    stats: NestStats | None = None, generator: torch.Generator | None = None,
    eos: frozenset[int] | None = None,
) -> tuple[list[int], NestStats]:  # fmt: skip
    """Decode ``prompt_ids`` with ``method`` (and ``drafter``) and no engine: no retrieval,
    no memory, no stop strings, no streaming. ``eos`` overrides the model's end tokens
    (``frozenset()``: never stop early). Returns the output ids (without the end token) and
    the generation's stats."""
    if method.uses_memory:
        raise ValueError(f"decode_ids runs methods without NEST's memory, not {method.name!r}")
    stats = stats if stats is not None else NestStats()
    if max_new_tokens < 1:
        return [], stats
    loop = DecodeLoop(
        lm, method, drafter, config=config if config is not None else NestConfig(temperature=0.0),
        prompt_ids=list(prompt_ids), memory=None, passages=[], offsets=[],
        max_new_tokens=max_new_tokens, stats=stats, generator=generator, eos=eos,
    )  # fmt: skip
    decoded = run_to_end(loop.run())
    stats.prompt_tokens = len(prompt_ids)
    stats.new_tokens = len(decoded.ids)
    stats.finish_reason = stats.finish_reason or "length"
    return list(decoded.ids), stats

