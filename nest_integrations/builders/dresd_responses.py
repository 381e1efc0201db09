"""The in-domain DReSD datastore (a response cache): the model's own greedy responses to a
prompts file, with the keys it computed while generating them.

Each line of the prompts file is a JSON object with one of:

- ``"prompt"``: a user message, read with the model's chat template (as ``nest ask`` does);
- ``"messages"``: a chat (``[{"role", "content"}, ...]``), with the chat template;
- ``"text"``: a raw text prefix, completed as is;

or a bare JSON string (= ``"prompt"``). Blank lines are skipped.

Keys are *in context*: key j of a response is the LM vector at the position that produced
response token j while the model generated it, i.e. exactly the query ``DecodeState.hidden``
that the same prompt gives at decode time. The tokens are the generated ids themselves (not
re-tokenised text), so a draft is always a sequence the model really produced. With a Hugging
Face model the responses of a batch come from one left-padded ``generate`` call and their keys
from one forward over prompt + response each (same vectors as during generation, up to
floating-point noise); other models generate one token at a time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from nest_integrations.dresd.datastore import SourceBatch
from nest_integrations.jsonl import jsonl_values
from nest_integrations.types import Passage

__all__ = ["read_prompts", "prompt_ids", "PromptSource", "batched_greedy", "greedy_with_keys"]


def read_prompts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse a prompts file; a clear ValueError for a missing, empty or malformed one."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompts file {p} does not exist")
    out: list[dict[str, Any]] = []
    for n, obj in jsonl_values(p, p.read_text(encoding="utf-8").splitlines()):
        if isinstance(obj, str):
            obj = {"prompt": obj}
        if not isinstance(obj, dict) or not any(
            isinstance(obj.get(k), (str, list)) and obj.get(k) for k in ("prompt", "messages", "text")
        ):
            raise ValueError(
                f'{p}:{n}: expected a JSON object with "prompt", "messages" or "text" '
                "(or a JSON string)"
            )
        out.append(obj)
    if not out:
        raise ValueError(
            f"prompts file {p} is empty: give one JSON object per line, e.g. "
            '{"prompt": "How do I reverse a list in Python?"}'
        )
    return out


def prompt_ids(lm: Any, item: dict[str, Any]) -> list[int]:
    """Prompt token ids of one prompts-file entry."""
    if item.get("messages"):
        return lm.chat_prompt(item["messages"])
    if item.get("prompt"):
        return lm.chat_prompt([{"role": "user", "content": item["prompt"]}])
    return list(lm.passage_prefix[:1]) + lm.tokenize(item["text"])


def greedy_with_keys(
    lm: Any, ids: Sequence[int], max_new_tokens: int
) -> tuple[list[int], np.ndarray]:
    """Greedy response ids (EOS excluded; through the one decoding loop, ``decoding="greedy"``)
    and the ``(m, d)`` key that produced each one (``keys_in_context``)."""
    from nest_integrations.drafters import get_method
    from nest_integrations.decoding.plain import decode_ids

    room = min(max_new_tokens, lm.max_context - len(ids))
    out, _ = decode_ids(lm, get_method("greedy"), list(ids), room)
    return out, keys_in_context(lm, list(ids), out)


def _is_hf(lm: Any) -> bool:
    """Whether ``lm`` (or the model a ``SerializedLM`` holds) is an ``HFLanguageModel``."""
    from nest_integrations.lm.hf import HFLanguageModel
    from nest_integrations.lm.serialized import unwrap

    return isinstance(unwrap(lm), HFLanguageModel)


def batched_greedy(lm: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy responses of a Hugging Face model to several prompts in one left-padded
    ``generate`` call (EOS excluded). Padding may flip a near-tie argmax now and then; the
    datastore only needs responses the model produces, not bit-exact ones."""
    width = max(len(p) for p in prompts)
    eos = sorted(lm.eos_token_ids)
    pad = eos[0]
    x = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for r, p in enumerate(prompts):
        x[r, width - len(p) :] = torch.tensor(p)
        mask[r, width - len(p) :] = 1
    with torch.inference_mode():
        out = lm.model.generate(
            x.to(lm.device), attention_mask=mask.to(lm.device), do_sample=False,
            max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
        )  # fmt: skip
    responses = []
    for row in out[:, width:].tolist():
        cut = next((i for i, t in enumerate(row) if t in lm.eos_token_ids), len(row))
        responses.append(row[:cut])
    return responses


def keys_in_context(lm: Any, prompt: list[int], response: list[int]) -> np.ndarray:
    """``(m, d)`` keys that produced each response token: one cache-free forward over
    ``prompt + response[:-1]``, rows ``len(prompt) - 1`` onwards."""
    if not response:
        return np.zeros((0, lm.key_dim), np.float32)
    _, keys = lm.forward(list(prompt) + list(response[:-1]), lm.new_cache())
    return keys[len(prompt) - 1 :].float().cpu().numpy()


def _char_offsets(lm: Any, ids: Sequence[int]) -> tuple[str, np.ndarray]:
    """Text of ``ids`` and ``(m, 2)`` char ranges tiling it (from prefix decodes)."""
    text = lm.detokenize(ids)
    ends = np.array([len(lm.detokenize(ids[: k + 1])) for k in range(len(ids))], np.int64)
    ends = np.maximum.accumulate(np.clip(ends, 0, len(text))) if len(ends) else ends
    off = np.zeros((len(ids), 2), np.int32)
    if len(ids):
        ends[-1] = len(text)
        off[:, 1] = ends
        off[1:, 0] = ends[:-1]
    return text, off


class PromptSource:
    """Batches of the model's greedy responses to ``prompts`` (a ``Source`` for
    ``build_datastore``)."""

    def __init__(
        self,
        prompts: Sequence[dict[str, Any]],
        lm: Any,
        *,
        max_new_tokens: int = 128,
        batch_size: int = 8,
        name: str = "prompts",
    ) -> None:
        if not prompts:
            raise ValueError("no prompts to build a response datastore from")
        self.prompts = list(prompts)
        self.lm = lm
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        digest = hashlib.sha256(json.dumps(self.prompts, sort_keys=True).encode()).hexdigest()
        self.spec = {"kind": name, "n_prompts": len(self.prompts), "hash": digest[:16],
                     "max_new_tokens": max_new_tokens, "batch_size": batch_size}  # fmt: skip
        self.n_batches = math.ceil(len(self.prompts) / batch_size)

    def batch(self, i: int) -> SourceBatch:
        start = i * self.batch_size
        items = self.prompts[start : start + self.batch_size]
        pids = [prompt_ids(self.lm, item) for item in items]
        if _is_hf(self.lm):  # HF: one batched generate
            resp = batched_greedy(self.lm, pids, self.max_new_tokens)
            pairs = [(r, keys_in_context(self.lm, p, r)) for p, r in zip(pids, resp)]
        else:
            pairs = [greedy_with_keys(self.lm, p, self.max_new_tokens) for p in pids]
        b = SourceBatch([], [], [], [])
        for j, (item, (ids, keys)) in enumerate(zip(items, pairs), start):
            text, off = _char_offsets(self.lm, ids)
            pid = hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()[:16]
            b.passages.append(Passage(id=f"response-{pid}", text=text, doc_id=f"prompt-{j}",
                                      metadata={"prompt_index": j}))  # fmt: skip
            b.token_ids.append(np.asarray(ids, np.int32))
            b.offsets.append(off)
            b.keys.append(keys)
        return b
