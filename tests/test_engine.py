"""Oracle tests of the NEST engine with real models (NEST spec §16, issue 3 §6).

- an empty datastore gives HF greedy ``generate``, token for token;
- span copying off gives greedy decoding of p_M (checked against a hand-written uncached loop);
- strict acceptance gives that same output for any memory;
- cached decoding equals uncached decoding, with a gamma that forces rejections;
- a memory holding the model's own continuation is copied and fully cited;
- a verbatim passage is copied with the right citation; an unrelated one is not cited.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from nest_integrations.config import NestConfig
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.core.mixture import nest_distribution
from nest_integrations.engine import NestEngine
from nest_integrations.lm.uncached import UncachedLM
from nest_integrations.types import Passage
from tests.invariants import (
    cited_text_matches_source,
    citations_cover_copied_tokens,
    citations_ordered,
)

QUESTION = [{"role": "user", "content": "Tell me about the history of the Roman Empire."}]

PASSAGE_TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western "
    "Asia, and was ruled by emperors. From the accession of Caesar Augustus as the first Roman "
    "emperor to the military anarchy of the 3rd century, it was a Principate with Italia as "
    "the metropole of its provinces and the city of Rome as its sole capital."
)
UNRELATED_TEXT = (
    "Photosynthesis is a process used by plants and other organisms to convert light energy "
    "into chemical energy that, through cellular respiration, can later be released to fuel "
    "the organism's activities."
)


def _passage(text: str, doc: str = "doc") -> Passage:
    pid = hashlib.sha1(text.encode()).hexdigest()[:16]
    return Passage(pid, text, doc_id=doc, char_start=0, char_end=len(text), metadata={"title": doc})


def _hf_greedy(lm, ids: list[int], n: int) -> list[int]:
    out = lm.model.generate(
        torch.tensor([ids], device=lm.device),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=lm.device),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=sorted(lm.eos_token_ids),
        pad_token_id=sorted(lm.eos_token_ids)[0],
    )
    new = out[0, len(ids) :].tolist()
    for i, t in enumerate(new):
        if t in lm.eos_token_ids:
            return new[:i]
    return new


def _greedy_pm(lm, ids: list[int], memory: TokenMemory, cfg: NestConfig, n: int) -> list[int]:
    """Reference: recompute the whole sequence each step and take argmax p_M (no spans)."""
    out: list[int] = []
    for _ in range(n):
        logits, keys = lm.forward(ids + out, lm.new_cache())
        dist = nest_distribution(
            logits[-1:], keys[-1:], memory, n_neighbors=cfg.n_neighbors, alpha=cfg.rrc_offset,
            tau=cfg.rrc_scale, lm_temperature=cfg.lm_temperature,
        )
        tok = int(dist.p[0].argmax())
        if tok in lm.eos_token_ids:
            break
        out.append(tok)
    return out


@pytest.mark.slow
def test_empty_datastore_equals_hf_greedy(default_lm):
    """No passages: NEST output equals HF greedy generate token for token."""
    engine = NestEngine(default_lm)
    res = engine.generate(QUESTION, max_new_tokens=40)
    ref = _hf_greedy(default_lm, default_lm.chat_prompt(QUESTION), 40)
    assert res.token_ids == ref
    assert res.citations == [] and res.stats.attributed_tokens == 0


@pytest.mark.slow
def test_no_span_copying_equals_greedy_pm_and_strict_equals_it(default_lm):
    """Copying off gives greedy decoding of p_M; strict acceptance gives the same tokens."""
    passages = [_passage(PASSAGE_TEXT), _passage(UNRELATED_TEXT, "bio")]
    engine = NestEngine(default_lm)
    cfg = NestConfig(span_copying=False)
    res = engine.generate(QUESTION, max_new_tokens=32, config=cfg, passages=passages)
    memory = engine.build_memory(passages)
    ref = _greedy_pm(default_lm, default_lm.chat_prompt(QUESTION), memory, cfg, 32)
    assert res.token_ids == ref
    strict = engine.generate(
        QUESTION, max_new_tokens=32, config=NestConfig(strict_acceptance=True), passages=passages
    )
    assert strict.token_ids == ref


@pytest.mark.slow
def test_own_continuation_is_copied_and_cited(default_lm):
    """A memory holding the model's own greedy continuation is copied in long cited spans."""
    engine = NestEngine(default_lm)
    own = engine.generate(QUESTION, max_new_tokens=32)
    passages = [_passage(own.text, "own"), _passage(UNRELATED_TEXT, "bio")]
    res = engine.generate(QUESTION, max_new_tokens=32, passages=passages)
    assert res.text.startswith(own.text[:40])
    assert res.stats.attribution_ratio > 0.8
    assert res.stats.forward_passes < res.stats.new_tokens / 2
    assert all(c.doc_id == "own" for c in res.citations)
    cited_text_matches_source(res, {"own": own.text})
    citations_cover_copied_tokens(res)
    citations_ordered(res.citations)
    # strict acceptance over the same memory gives greedy decoding of p_M
    strict = engine.generate(
        QUESTION, max_new_tokens=32, passages=passages, config=NestConfig(strict_acceptance=True)
    )
    nocopy = engine.generate(
        QUESTION, max_new_tokens=32, passages=passages, config=NestConfig(span_copying=False)
    )
    assert strict.token_ids == nocopy.token_ids


@pytest.mark.slow
def test_verbatim_passage_is_copied_with_right_citation(default_lm):
    """A completion prompt quoting a passage's opening words continues it verbatim, cited."""
    engine = NestEngine(default_lm)
    passages = [_passage(PASSAGE_TEXT, "rome"), _passage(UNRELATED_TEXT, "bio")]
    prompt = PASSAGE_TEXT[:60]
    res = engine.generate(prompt, max_new_tokens=40, passages=passages)
    assert res.citations, res.text
    longest = max(res.citations, key=lambda c: c.n_tokens)
    assert longest.doc_id == "rome" and longest.n_tokens >= 10
    assert longest.text in PASSAGE_TEXT
    assert PASSAGE_TEXT[longest.source_start : longest.source_end] == longest.text
    cited_text_matches_source(res, {"rome": PASSAGE_TEXT, "bio": UNRELATED_TEXT})


@pytest.mark.slow
def test_unrelated_corpus_is_not_copied(default_lm):
    """An unrelated memory leaves the output fluent (equal to plain greedy here) and uncopied."""
    engine = NestEngine(default_lm)
    passages = [_passage(UNRELATED_TEXT, "bio")]
    base = engine.generate(QUESTION, max_new_tokens=32)
    res = engine.generate(QUESTION, max_new_tokens=32, passages=passages)
    assert res.stats.copied_tokens == 0
    assert res.text[:40] == base.text[:40]


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.9, 5e-4])
def test_cached_equals_uncached(default_lm, gamma):
    """The KV cache cropped after partial acceptance gives the uncached output exactly."""
    passages = [_passage(PASSAGE_TEXT, "rome"), _passage(UNRELATED_TEXT, "bio")]
    cfg = NestConfig(relaxation=gamma, rrc_offset=0.6)
    cached = NestEngine(default_lm, config=cfg).generate(
        PASSAGE_TEXT[:40], max_new_tokens=48, passages=passages
    )
    uncached = NestEngine(UncachedLM(default_lm), config=cfg).generate(
        PASSAGE_TEXT[:40], max_new_tokens=48, passages=passages
    )
    assert cached.token_ids == uncached.token_ids
    assert cached.stats.verify_steps > 0
    if gamma == 0.9:  # a strict gamma must have rejected some drafted tokens
        assert cached.stats.accepted_tokens < cached.stats.drafted_tokens


def test_tiny_model_stream_matches_generate(tiny_lm):
    """Streamed deltas concatenate to the generated text; the last chunk carries the result."""
    engine = NestEngine(tiny_lm)
    passages = [_passage(PASSAGE_TEXT, "rome")]
    res = engine.generate(PASSAGE_TEXT[:30], max_new_tokens=16, passages=passages)
    chunks = list(engine.stream(PASSAGE_TEXT[:30], max_new_tokens=16, passages=passages))
    assert "".join(c.text for c in chunks) == res.text
    assert chunks[-1].result is not None and chunks[-1].result.token_ids == res.token_ids


def test_stop_strings_and_max_tokens(tiny_lm):
    """Stop strings cut the text; max_new_tokens bounds the output."""
    engine = NestEngine(tiny_lm)
    res = engine.generate("Hello", max_new_tokens=12)
    assert len(res.token_ids) <= 12
    if len(res.text) > 3:
        stop = res.text[2:4]
        cut = engine.generate("Hello", max_new_tokens=12, stop=[stop])
        assert stop not in cut.text and res.text.startswith(cut.text)
        assert cut.stats.finish_reason == "stop"


def test_bad_input_errors(tiny_lm):
    """Empty prompts, bad limits, overlong prompts and bad config are clear errors."""
    engine = NestEngine(tiny_lm)
    with pytest.raises(ValueError, match="empty"):
        engine.generate("   ")
    with pytest.raises(ValueError, match="empty"):
        engine.generate([])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("hi", max_new_tokens=0)
    with pytest.raises(ValueError, match="context"):
        engine.generate("word " * (tiny_lm.max_context + 10))
    with pytest.raises(ValueError, match="relaxation"):
        NestConfig(relaxation=0.0)
    with pytest.raises(ValueError, match="key_source"):
        NestEngine(tiny_lm, config=NestConfig(key_source="block_input"))


def test_stream_with_stop_string_across_tokens(tiny_lm):
    """A stop string spanning a token boundary is never streamed, and deltas add up."""
    engine = NestEngine(tiny_lm)
    full = engine.generate("Hello", max_new_tokens=12)
    if len(full.token_ids) < 4:
        pytest.skip("the tiny model stopped too early")
    # a stop string made of the end of token 2 and the start of token 3
    ends = [len(tiny_lm.detokenize(full.token_ids[: i + 1])) for i in range(len(full.token_ids))]
    stop = full.text[max(ends[1] - 1, 0) : ends[1] + 1]
    chunks = list(engine.stream("Hello", max_new_tokens=12, stop=[stop]))
    result = chunks[-1].result
    assert "".join(c.text for c in chunks) == result.text
    assert stop not in result.text
