"""A BERT encoder in plain torch for the packaged sentence embedder (all-MiniLM-L6-v2).

``MiniLMEmbedder`` runs it in place of transformers' ``BertModel``: the same torch ops in the
same order (linear, ``scaled_dot_product_attention`` with a boolean padding mask, exact GELU,
LayerNorm), so the vectors are the same bits (``tests/retrieval/test_minilm.py``), without importing
transformers, which costs seconds in a process that decodes with llama.cpp and needs
transformers for nothing else. The word pieces come from the checkpoint's ``tokenizer.json``
through ``tokenizers``, as transformers' fast tokenizer reads it.

A checkpoint that is not a plain BERT (another ``model_type``, position type or activation)
is not read here: ``BertEncoder(folder)`` raises ``UnsupportedCheckpoint`` and
``MiniLMEmbedder.load`` falls back to transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F


class UnsupportedCheckpoint(ValueError):
    """The checkpoint is not a BERT this module reads."""


def _config(folder: Path) -> dict[str, Any]:
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    plain = (cfg.get("model_type") == "bert"
             and cfg.get("position_embedding_type", "absolute") == "absolute"
             and cfg.get("hidden_act") == "gelu"
             and not cfg.get("is_decoder", False)
             and (folder / "model.safetensors").is_file()
             and (folder / "tokenizer.json").is_file())
    if not plain:
        raise UnsupportedCheckpoint(f"{folder} is not a plain BERT checkpoint with "
                                    "model.safetensors and tokenizer.json")
    return cfg


class BertEncoder:
    """``encode(texts, max_length)``: the last hidden state ``(B, T, d)`` and the attention mask
    ``(B, T)`` of a padded batch, as ``BertModel(**tokenizer(texts, padding=True,
    truncation=True, max_length=max_length))`` gives them; ``word_pieces``, ``pad`` and
    ``forward`` are its steps, for a caller that groups texts by their length first."""

    def __init__(self, folder: str | Path, device: str = "cpu") -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        folder = Path(folder)
        cfg = _config(folder)
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg["layer_norm_eps"])
        self.pad_id = int(cfg.get("pad_token_id", 0) or 0)
        w = load_file(str(folder / "model.safetensors"), device=device)
        self.w = {k.removeprefix("bert."): v.float() for k, v in w.items()}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.device = device

    def word_pieces(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        """Each text's ids with its special tokens, truncated to ``max_length`` (the text's
        pieces are cut, ``[SEP]`` kept: transformers' ``truncation=True``)."""
        enc = self.tokenizer.encode_batch(list(texts))
        return [e.ids if len(e.ids) <= max_length else e.ids[: max_length - 1] + e.ids[-1:]
                for e in enc]

    def pad(self, ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input ids and attention mask, padded on the right to the longest."""
        width = max(len(x) for x in ids)
        out = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            out[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[i, : len(x)] = 1
        return out.to(self.device), mask.to(self.device)

    def tokenize(self, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``pad(word_pieces(texts, max_length))``: what the tokenizer gives with
        ``padding=True, truncation=True``."""
        return self.pad(self.word_pieces(texts, max_length))

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self.w
        return F.layer_norm(x, (x.shape[-1],), w[f"{name}.weight"], w[f"{name}.bias"], self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def encode(self, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden state ``(B, T, d)`` and attention mask ``(B, T)`` of ``texts``
        padded together."""
        return self.forward(*self.tokenize(texts, max_length))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``BertModel``'s last hidden state for padded ``ids`` and their ``mask``."""
        w, (b, t) = self.w, ids.shape
        pos = torch.arange(t, device=ids.device).unsqueeze(0)
        x = w["embeddings.word_embeddings.weight"][ids]
        x = x + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)]
        x = x + w["embeddings.position_embeddings.weight"][pos]
        x = self._norm(x, "embeddings.LayerNorm")
        # transformers passes no mask where nothing is padded, else a (B, 1, T, T) boolean one
        attend = None if bool(mask.all()) else (
            mask.bool()[:, None, None, :].expand(b, 1, t, t))
        d = x.shape[-1] // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            q, k, v = (self._linear(x, f"{p}.attention.self.{n}").view(b, t, -1, d).transpose(1, 2)
                       for n in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=0.0,
                                               scale=d ** -0.5, is_causal=False)
            a = a.reshape(b, -1, t, d).transpose(1, 2).contiguous().reshape(b, t, -1)
            x = self._norm(self._linear(a, f"{p}.attention.output.dense") + x,
                           f"{p}.attention.output.LayerNorm")
            h = F.gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = self._norm(self._linear(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        return x, mask


__all__ = ["BertEncoder", "UnsupportedCheckpoint"]
