"""Tiny random checkpoints for fast tests (built from a config, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch


def smollm2_tokenizer():
    """The real SmolLM2 tokenizer from the converted default model (converts it on first use)."""
    from transformers import AutoTokenizer

    from nest_integrations.lm.default import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))


def tiny_llama(seed: int = 0, vocab_size: int = 49152, **overrides):
    """A random ``LlamaForCausalLM``: 2 layers, hidden 64, 4 heads (2 KV heads), fp32, eval."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
        **overrides,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # The default init (std 0.02) gives near-uniform logits; sharper weights make greedy and
    # cache tests meaningful.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model


def save_tiny_llama(folder: Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random Llama plus the SmolLM2 tokenizer to ``folder``; return it."""
    model = tiny_llama(seed=seed, **overrides)
    model.save_pretrained(folder)
    smollm2_tokenizer().save_pretrained(folder)
    return folder
