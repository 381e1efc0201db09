"""``builders.dresd_responses``: a prompts file becomes batches of the model's own greedy
responses, their char offsets and the keys that produced each token. A Hugging Face model (also
behind the assembly's ``SerializedLM``) answers a batch with one ``generate`` call; any other LM
answers through the one decoding loop. The prompts file's errors name the line and the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nest_integrations.builders import dresd_responses
from nest_integrations.builders.dresd_responses import (
    PromptSource,
    greedy_with_keys,
    prompt_ids,
    read_prompts,
)
from nest_integrations.lm.serialized import serialized
from tests.fakes import FakeLM

PROMPTS = [{"prompt": "How do I reverse a list in Python?"}, {"text": "The capital of France is"},
           {"messages": [{"role": "user", "content": "Name three colours."}]}]


def _check_batch(lm, batch, prompts, max_new_tokens: int) -> None:
    """Each passage is the model's greedy response to its prompt: its ids, text, offsets that
    tile the text and one key per token, as ``greedy_with_keys`` computes them."""
    assert len(batch.passages) == len(prompts)
    for item, passage, ids, off, keys in zip(prompts, batch.passages, batch.token_ids,
                                             batch.offsets, batch.keys):
        want_ids, want_keys = greedy_with_keys(lm, prompt_ids(lm, item), max_new_tokens)
        assert ids.tolist() == want_ids and len(want_ids) > 0
        assert passage.text == lm.detokenize(want_ids)
        assert off.shape == (len(ids), 2) and off[0, 0] == 0 and off[-1, 1] == len(passage.text)
        assert (off[1:, 0] == off[:-1, 1]).all()  # the ranges tile the text
        assert keys.shape == (len(ids), lm.key_dim)
        np.testing.assert_allclose(keys, want_keys, atol=1e-4)


def test_a_plain_lm_answers_through_the_decoding_loop(monkeypatch) -> None:
    """A model that is not a Hugging Face one never takes the batched ``generate`` path."""
    called = []
    monkeypatch.setattr(dresd_responses, "batched_greedy", lambda *a: called.append(a))
    lm = FakeLM()
    source = PromptSource(PROMPTS, lm, max_new_tokens=6, batch_size=2)
    assert source.n_batches == 2
    _check_batch(lm, source.batch(0), PROMPTS[:2], 6)
    _check_batch(lm, source.batch(1), PROMPTS[2:], 6)
    assert called == []
    assert source.spec["n_prompts"] == 3 and source.spec["batch_size"] == 2


def test_a_hugging_face_model_behind_the_assembly_answers_in_one_generate(tiny_lm,
                                                                          monkeypatch) -> None:
    """The assembly's serialised wrapper of an ``HFLanguageModel`` still takes one batched
    ``generate`` per batch, and its responses are the loop's greedy ones."""
    calls = []
    real = dresd_responses.batched_greedy

    def spy(lm, prompts, n):
        calls.append(len(prompts))
        return real(lm, prompts, n)

    monkeypatch.setattr(dresd_responses, "batched_greedy", spy)
    lm = serialized(tiny_lm)
    batch = PromptSource(PROMPTS, lm, max_new_tokens=8, batch_size=3).batch(0)
    assert calls == [3]
    _check_batch(tiny_lm, batch, PROMPTS, 8)


def test_prompts_files_are_read_and_their_errors_name_the_fix(tmp_path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join([json.dumps("a bare string"), "", json.dumps(PROMPTS[1])]) + "\n",
                    encoding="utf-8")
    assert read_prompts(path) == [{"prompt": "a bare string"}, PROMPTS[1]]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="is empty: give one JSON object per line"):
        read_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r'bad.jsonl:1: expected a JSON object with "prompt"'):
        read_prompts(bad)
    with pytest.raises(ValueError, match="no prompts"):
        PromptSource([], FakeLM())
