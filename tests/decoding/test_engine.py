"""Oracle tests of the NEST engine with real models (NEST spec §16, issue 3 §6).

- an empty datastore gives HF greedy ``generate``, token for token;
- span copying off gives greedy decoding of p_M (checked against a hand-written uncached loop);
- strict acceptance gives that same output for any memory;
- cached decoding is checked at EVERY forward pass against rows recomputed from scratch on the
  prompt plus the committed token ids alone (``CommittedContextOracle``), with gammas that force
  rejections; the oracle catches a crop that is off by one either way;
- a memory holding the model's own continuation is copied and fully cited;
- a verbatim passage is copied with the right citation; an unrelated one is not cited;
- engine-level: sampling (seeded, private RNG), a stop string inside a copied span,
  max_new_tokens mid-span, masking inside the decode loop, continuation past max_span,
  mean_lambda over every row, the prefill's logits_to_keep, string prompts to a chat model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nest_integrations.decoding.loop as loop_module
import nest_integrations.decoding.target as target_module

from nest_integrations.config import NestConfig
from nest_integrations.core.token_memory import TokenMemory
from nest_integrations.core.mixture import nest_distribution
from nest_integrations.drafters import METHODS, Draft, Method
from tests.engines import make_engine
from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.types import Passage
from tests.invariants import (
    hf_greedy,
    cited_text_matches_source,
    citations_cover_copied_tokens,
    citations_ordered,
)
from tests.passages import PASSAGE_TEXT, UNRELATED_TEXT, make_passage

QUESTION = [{"role": "user", "content": "Tell me about the history of the Roman Empire."}]


_hf_greedy = hf_greedy


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
    engine = make_engine(default_lm)
    res = engine.generate(QUESTION, max_new_tokens=40)
    ref = _hf_greedy(default_lm, default_lm.chat_prompt(QUESTION), 40)
    assert res.token_ids == ref
    assert res.citations == [] and res.stats.attributed_tokens == 0


@pytest.mark.slow
def test_no_span_copying_equals_greedy_pm_and_strict_equals_it(default_lm):
    """Copying off gives greedy decoding of p_M; strict acceptance gives the same tokens (the
    engine's default policy has no guards: the oracle is the paper's decoding)."""
    passages = [make_passage(PASSAGE_TEXT), make_passage(UNRELATED_TEXT, "bio")]
    engine = make_engine(default_lm)
    cfg = NestConfig(span_copying=False)
    res = engine.generate(QUESTION, max_new_tokens=32, config=cfg, passages=passages)
    memory = engine.build_memory(passages)
    ref = _greedy_pm(default_lm, default_lm.chat_prompt(QUESTION), memory, cfg, 32)
    assert res.token_ids == ref
    strict = engine.generate(
        QUESTION, max_new_tokens=32, config=NestConfig(strict_acceptance=True), passages=passages
    )
    assert strict.token_ids == ref
    # not vacuous: spans were drafted, and strict verification rejected some of them
    assert strict.stats.verify_steps > 0
    assert strict.stats.drafted_tokens > strict.stats.accepted_tokens


@pytest.mark.slow
def test_own_continuation_is_copied_and_cited(default_lm):
    """A memory holding the model's own greedy continuation is copied in long cited spans."""
    engine = make_engine(default_lm)
    own = engine.generate(QUESTION, max_new_tokens=32)
    passages = [make_passage(own.text, "own"), make_passage(UNRELATED_TEXT, "bio")]
    res = engine.generate(QUESTION, max_new_tokens=32, passages=passages)
    assert res.text.startswith(own.text[:40])
    assert res.stats.attribution_ratio > 0.8
    assert res.stats.forward_passes < res.stats.new_tokens / 2
    assert all(c.doc_id == "own" for c in res.citations)
    cited_text_matches_source(res, {"own": own.text})
    citations_cover_copied_tokens(res, default_lm, exact=True)  # measured: 32 of 32 tokens
    citations_ordered(res.citations)
    # strict acceptance over the same memory gives greedy decoding of p_M
    strict = engine.generate(
        QUESTION, max_new_tokens=32, passages=passages, config=NestConfig(strict_acceptance=True)
    )
    nocopy = engine.generate(
        QUESTION, max_new_tokens=32, passages=passages, config=NestConfig(span_copying=False)
    )
    assert strict.token_ids == nocopy.token_ids
    assert strict.stats.verify_steps > 0 and strict.stats.accepted_tokens > 0


@pytest.mark.slow
def test_verbatim_passage_is_copied_with_right_citation(default_lm):
    """A completion prompt quoting a passage's opening words continues it verbatim, cited."""
    engine = make_engine(default_lm)
    passages = [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]
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
    engine = make_engine(default_lm)
    passages = [make_passage(UNRELATED_TEXT, "bio")]
    base = engine.generate(QUESTION, max_new_tokens=32)
    res = engine.generate(QUESTION, max_new_tokens=32, passages=passages)
    assert res.stats.copied_tokens == 0
    assert res.text[:40] == base.text[:40]


class CommittedContextOracle:
    """The KV-cache oracle: wraps the real (cached) LM and, at EVERY forward pass, recomputes the
    rows from scratch on the prompt plus the tokens the loop has committed so far -- read from the
    live loop, never from the cache or from the loop's crop calls -- and asserts they are equal.

    The loop's invariant says where the cache must stand: it holds every committed token, or all
    but the last one (the pending token, which must then be the first token fed). A crop that keeps
    a rejected token gives rows computed after the wrong token; one that drops an accepted token
    breaks the position invariant. Both raise AssertionError.
    """

    def __init__(self, lm: Any) -> None:
        self._lm = lm
        self.loop: Any = None
        self.checked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lm, name)

    def forward(self, ids, cache, *, last=None):
        committed = list(self.loop.state.prompt_ids) + list(self.loop.output.ids)
        n = self._lm.cache_length(cache)
        if n == 0:  # the prefill
            assert list(ids) == committed, "the prefill must be exactly the prompt"
        else:
            assert n in (len(committed), len(committed) - 1), (
                f"the cache holds {n} positions but {len(committed)} tokens are committed"
            )
            if n == len(committed) - 1:
                assert ids[0] == committed[-1], "the first token fed must be the pending one"
        context = committed[:n] + list(ids)  # from the committed ids alone
        logits, keys = self._lm.forward(ids, cache, last=last)
        ref_logits, ref_keys = self._lm.forward(context, self._lm.new_cache())
        rows = logits.shape[0]
        assert torch.allclose(logits, ref_logits[-rows:], atol=2e-3, rtol=1e-3), (
            f"cached rows differ from rows recomputed on the committed context "
            f"(max abs diff {float((logits - ref_logits[-rows:]).abs().max()):.3g})"
        )
        assert torch.allclose(keys, ref_keys[-rows:], atol=2e-3, rtol=1e-3)
        self.checked += 1
        return logits, keys


def _oracle_generate(lm, monkeypatch, prompt, cfg, passages, n, decoding="nest"):
    """Generate through ``CommittedContextOracle`` (it learns the live loop from its init)."""
    oracle = CommittedContextOracle(lm)
    init = loop_module.DecodeLoop.__init__

    def spy_init(self, lm_arg, *args, **kwargs):
        init(self, lm_arg, *args, **kwargs)
        if lm_arg is oracle:
            oracle.loop = self

    monkeypatch.setattr(loop_module.DecodeLoop, "__init__", spy_init)
    res = make_engine(oracle, config=cfg).generate(
        prompt, max_new_tokens=n, passages=passages, decoding=decoding
    )
    assert oracle.checked == res.stats.forward_passes
    return res


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.9, 5e-4])
def test_cached_equals_uncached(default_lm, monkeypatch, gamma):
    """The KV cache cropped after partial acceptance gives, at every step, the rows of an
    uncached model run on the prompt plus the committed tokens (SmolLM2-135M)."""
    passages = [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]
    cfg = NestConfig(relaxation=gamma, rrc_offset=0.6)
    res = _oracle_generate(default_lm, monkeypatch, PASSAGE_TEXT[:40], cfg, passages, 48)
    assert res.stats.verify_steps > 0
    if gamma == 0.9:  # a strict gamma must have rejected some drafted tokens (crops happened)
        assert res.stats.accepted_tokens < res.stats.drafted_tokens
    plain = make_engine(default_lm, config=cfg).generate(
        PASSAGE_TEXT[:40], max_new_tokens=48, passages=passages
    )
    assert plain.token_ids == res.token_ids


def _copying_cfg(**kw) -> NestConfig:
    """Spans at every step (a random tiny model rarely has lambda <= 0.5), all citations kept."""
    return NestConfig(span_threshold=1.0, min_citation_tokens=1, **kw)


class _TwoRightOneWrong:
    """A draft-first test drafter: the target's next two greedy tokens (computed without the
    engine's cache) and a wrong third one, so every verify step accepts 2 and rejects 1."""

    def __init__(self, ctx) -> None:
        self.lm = getattr(ctx.lm, "_lm", ctx.lm)  # the model under the oracle wrapper

    def propose(self, state):
        toks: list[int] = []
        for _ in range(2):
            logits, _ = self.lm.forward(state.context_ids + toks, self.lm.new_cache(), last=1)
            toks.append(int(logits[-1].argmax()))
        if set(toks) & state.eos or state.budget < 3:
            return None
        return Draft(toks + [(toks[-1] + 1) % self.lm.vocab_size], [None] * 3)

    def update(self, state, draft, n_accepted) -> None:
        return None


@pytest.fixture
def draft_first_method(monkeypatch):
    monkeypatch.setitem(METHODS, "two-right-one-wrong", Method("two-right-one-wrong",
                                                               _TwoRightOneWrong))
    return "two-right-one-wrong"


@pytest.mark.parametrize("decoding", ["nest", "two-right-one-wrong"])
def test_cache_oracle_on_tiny_model(tiny_lm, monkeypatch, draft_first_method, decoding):
    """Both schedules (target-first NEST, draft-first lossless) pass the oracle with rejections."""
    passages = [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]
    prompt = PASSAGE_TEXT[:40]
    res = _oracle_generate(tiny_lm, monkeypatch, prompt, _copying_cfg(relaxation=0.9),
                           passages, 40, decoding)
    assert res.stats.verify_steps > 0
    assert res.stats.drafted_tokens > res.stats.accepted_tokens  # crops happened


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize("decoding", ["nest", "two-right-one-wrong"])
def test_cache_oracle_catches_an_off_by_one_crop(
    tiny_lm, monkeypatch, draft_first_method, shift, decoding
):
    """A test of the test: the oracle fails when the crop keeps a rejected token (+1, the
    official code's bug) or drops an accepted one (-1)."""
    crop = HFLanguageModel.crop_cache
    monkeypatch.setattr(
        HFLanguageModel, "crop_cache", lambda self, cache, n: crop(self, cache, n + shift)
    )
    passages = [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]
    prompt = PASSAGE_TEXT[:40]
    with pytest.raises(AssertionError, match="cache holds|cached rows|pending"):
        _oracle_generate(tiny_lm, monkeypatch, prompt, _copying_cfg(relaxation=0.9),
                         passages, 40, decoding)


def test_tiny_model_stream_matches_generate(tiny_lm):
    """Streamed deltas concatenate to the generated text; the last chunk carries the result."""
    engine = make_engine(tiny_lm)
    passages = [make_passage(PASSAGE_TEXT, "rome")]
    res = engine.generate(PASSAGE_TEXT[:30], max_new_tokens=16, passages=passages)
    chunks = list(engine.stream(PASSAGE_TEXT[:30], max_new_tokens=16, passages=passages))
    assert "".join(c.text for c in chunks) == res.text
    assert chunks[-1].result is not None and chunks[-1].result.token_ids == res.token_ids


def test_stop_strings_and_max_tokens(tiny_lm):
    """Stop strings cut the text; max_new_tokens bounds the output."""
    engine = make_engine(tiny_lm)
    res = engine.generate("Hello", max_new_tokens=12)
    assert len(res.token_ids) <= 12
    assert len(res.text) > 3  # the tiny model is deterministic: no condition around the check
    stop = res.text[2:4]
    cut = engine.generate("Hello", max_new_tokens=12, stop=[stop])
    assert stop not in cut.text and res.text.startswith(cut.text)
    assert cut.stats.finish_reason == "stop"


def test_bad_input_errors(tiny_lm):
    """Empty prompts, bad limits, overlong prompts and bad config are clear errors."""
    engine = make_engine(tiny_lm)
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
        make_engine(tiny_lm, config=NestConfig(key_source="block_input"))


def test_a_preset_name_is_taken_wherever_a_config_or_policy_is(tiny_lm):
    """``config="paper"`` per call is that preset's config and policy (as ``from_defaults``
    reads it), ``policy="grounded"`` that preset's policy; another type is a TypeError that
    names the accepted ones (it was an AttributeError on ``'str'.key_source``)."""
    from nest_integrations.policy import AnswerPolicy

    engine = make_engine(tiny_lm, config=NestConfig.from_preset("paper-13b"),
                         policy=AnswerPolicy.from_preset("grounded"))
    passages = [make_passage(PASSAGE_TEXT, "rome")]
    named = engine.generate(PASSAGE_TEXT[:30], max_new_tokens=8, passages=passages,
                            config="paper")
    built = engine.generate(PASSAGE_TEXT[:30], max_new_tokens=8, passages=passages,
                            config=NestConfig.from_preset("paper"),
                            policy=AnswerPolicy.from_preset("paper"))
    assert named.token_ids == built.token_ids and named.stats.decoding == built.stats.decoding
    for name in ("paper", "grounded"):  # the preset's config with the model's key source
        assert engine.settings(name) == (engine.check_config(NestConfig.from_preset(name)),
                                         AnswerPolicy.from_preset(name))
    assert engine.settings(None, "paper") == (engine.config, AnswerPolicy.from_preset("paper"))
    assert engine.settings() == (engine.config, engine.policy)
    assert len(list(engine.stream("Hello", max_new_tokens=2, policy="paper"))) >= 1
    with pytest.raises(TypeError, match="NestConfig, a preset name .*'paper'"):
        engine.generate("Hello", config={"relaxation": 0.1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="AnswerPolicy, a preset name"):
        engine.generate("Hello", policy=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown NEST preset"):
        engine.generate("Hello", config="nope")
    # the public engine adapts a preset to its model's backend, as from_defaults does
    from nest_integrations import assembly

    built = assembly.build_engine(assembly.EngineSpec(backend="torch"), lm=tiny_lm)
    assert built.settings("paper")[0] == assembly.engine_config(built, "paper")
    assert built.generate("Hello", config="paper", max_new_tokens=2).token_ids


def test_stream_with_stop_string_across_tokens(tiny_lm):
    """A stop string spanning a token boundary is never streamed, and deltas add up."""
    engine = make_engine(tiny_lm)
    full = engine.generate("Hello", max_new_tokens=12)
    assert len(full.token_ids) >= 4  # deterministic: the tiny model does not stop early
    # a stop string made of the end of token 2 and the start of token 3
    ends = [len(tiny_lm.detokenize(full.token_ids[: i + 1])) for i in range(len(full.token_ids))]
    stop = full.text[max(ends[1] - 1, 0) : ends[1] + 1]
    chunks = list(engine.stream("Hello", max_new_tokens=12, stop=[stop]))
    result = chunks[-1].result
    assert "".join(c.text for c in chunks) == result.text
    assert stop not in result.text


# ----------------------------------------------------------------------------- engine level
def _rome() -> list[Passage]:
    return [make_passage(PASSAGE_TEXT, "rome"), make_passage(UNRELATED_TEXT, "bio")]


def _run_lengths(sources) -> list[int]:
    from nest_integrations.core.citations import source_runs

    return [j - i for i, j in source_runs(sources)]


def test_sampling_is_seeded_private_and_reproducible(tiny_lm):
    """temperature > 0: the same seed gives the same tokens, other seeds differ, and the global
    torch RNG is never touched (with or without a seed, with and without a memory)."""
    engine = make_engine(tiny_lm)

    def run(seed, passages=None, **kw):
        cfg = NestConfig(temperature=1.0, seed=seed, **kw)
        return engine.generate("The history of", max_new_tokens=16, config=cfg, passages=passages)

    state = torch.get_rng_state()
    a, b, c, d = run(3), run(3), run(4), run(5)
    assert a.token_ids == b.token_ids
    assert len({tuple(a.token_ids), tuple(c.token_ids), tuple(d.token_ids)}) == 3
    run(None)  # an unseeded generation draws its seed privately
    x, y = run(7, _rome(), relaxation=0.5), run(7, _rome(), relaxation=0.5)  # sampled acceptance
    assert x.token_ids == y.token_ids and x.stats.verify_steps > 0
    assert torch.equal(state, torch.get_rng_state())


def test_stop_string_inside_a_copied_span(tiny_lm):
    """A stop string in the middle of a copied span cuts the text at a token boundary before
    it; copied counts, sources and citations follow the kept tokens only."""
    engine = make_engine(tiny_lm, config=_copying_cfg())
    full = engine.generate(PASSAGE_TEXT[:40], max_new_tokens=40, passages=_rome())
    span = max(full.citations, key=lambda c: c.n_tokens)
    assert span.n_tokens >= 10  # the tiny model copies (deterministic)
    mid = span.start + len(span.text) // 2
    stop = full.text[mid : mid + 4]
    res = engine.generate(PASSAGE_TEXT[:40], max_new_tokens=40, passages=_rome(), stop=[stop])
    assert res.stats.finish_reason == "stop"
    assert stop not in res.text and full.text.startswith(res.text)
    assert len(res.text) <= full.text.index(stop)
    assert res.token_ids == full.token_ids[: len(res.token_ids)]
    assert tiny_lm.detokenize(res.token_ids) == res.text  # nothing absent from token_ids
    assert len(res.token_sources) == len(res.token_ids) == res.stats.new_tokens
    attributed = sum(s is not None for s in res.token_sources)
    assert 0 < res.stats.copied_tokens <= attributed == res.stats.attributed_tokens
    assert res.stats.copied_tokens < full.stats.copied_tokens
    cited_text_matches_source(res, {"rome": PASSAGE_TEXT, "bio": UNRELATED_TEXT})
    assert all(c.end <= len(res.text) for c in res.citations)


def test_max_new_tokens_reached_mid_span(tiny_lm):
    """The budget ends inside a copied span: exactly max_new_tokens tokens, the last of them
    copied, and the citation ends at the output's end."""
    engine = make_engine(tiny_lm, config=_copying_cfg())
    full = engine.generate(PASSAGE_TEXT[:40], max_new_tokens=40, passages=_rome())
    assert _run_lengths(full.token_sources)[0] >= 20
    res = engine.generate(PASSAGE_TEXT[:40], max_new_tokens=13, passages=_rome())
    assert len(res.token_ids) == 13 and res.stats.finish_reason == "length"
    assert res.token_ids == full.token_ids[:13]
    assert res.token_sources[-1] is not None and res.stats.copied_tokens == 13
    assert res.citations[-1].end == len(res.text.rstrip())
    cited_text_matches_source(res, {"rome": PASSAGE_TEXT, "bio": UNRELATED_TEXT})


def _spy_drafts(monkeypatch):
    """Record the memory rows of every NEST draft and the rows committed from it."""
    from nest_integrations.drafters.nest import NestDrafter

    log: list[tuple[list[int], list[int]]] = []
    update = NestDrafter.update

    def spy(self, state, draft, n_accepted):
        if self._rows is not None:
            log.append((list(self._rows), list(self._rows[:n_accepted])))
        return update(self, state, draft, n_accepted)

    monkeypatch.setattr(NestDrafter, "update", spy)
    return log


def _masking_run(tiny_lm):
    short = make_passage("The Roman Empire was the post-Republican state.", "short")
    res = make_engine(tiny_lm, config=_copying_cfg()).generate(
        "The Roman Empire", max_new_tokens=48, passages=[short]
    )
    return res


def test_copied_keys_are_never_proposed_again(tiny_lm, monkeypatch):
    """Masking inside the decode loop: once a key's token is committed from a draft, no later
    draft contains that key (a short passage and a long budget invite re-copying)."""
    log = _spy_drafts(monkeypatch)
    _masking_run(tiny_lm)
    committed: set[int] = set()
    assert sum(len(acc) for _, acc in log) >= 5
    for rows, accepted in log:
        assert not committed & set(rows), "a masked key was proposed again"
        committed |= set(accepted)


def test_masking_test_fails_without_masking(tiny_lm, monkeypatch):
    """A test of the test above: with masking off the same run re-proposes copied keys."""
    from nest_integrations.core.token_memory import TokenMemory

    monkeypatch.setattr(TokenMemory, "mask", lambda self, rows: None)
    log = _spy_drafts(monkeypatch)
    _masking_run(tiny_lm)
    seen: set[int] = set()
    repeated = False
    for rows, accepted in log:
        repeated |= bool(seen & set(rows))
        seen |= set(accepted)
    assert repeated


def test_continuation_past_max_span(tiny_lm):
    """After a fully accepted span the drafter continues from the next row of the same passage:
    one uninterrupted copy run is longer than max_span."""
    engine = make_engine(tiny_lm, config=_copying_cfg(max_span=4))
    res = engine.generate(PASSAGE_TEXT[:40], max_new_tokens=30, passages=_rome())
    assert max(_run_lengths(res.token_sources)) > 4 * 3
    assert res.stats.verify_steps >= 3  # several spans of <= 4 drafted tokens
    assert res.stats.drafted_tokens <= 4 * res.stats.verify_steps
    assert max(c.n_tokens for c in res.citations) > 4


def test_mean_lambda_averages_every_row(tiny_lm, monkeypatch):
    """stats.mean_lambda is the mean of lambda over every row of every mixture computed."""
    lams: list[float] = []
    mixture = target_module.nest_distribution

    def spy(*args, **kwargs):
        dist = mixture(*args, **kwargs)
        lams.extend(float(x) for x in dist.lam.reshape(-1))
        return dist

    monkeypatch.setattr(target_module, "nest_distribution", spy)
    res = make_engine(tiny_lm, config=_copying_cfg(relaxation=0.9)).generate(
        PASSAGE_TEXT[:40], max_new_tokens=24, passages=_rome()
    )
    assert len(lams) > res.stats.forward_passes  # multi-row verify passes happened
    assert res.stats.mean_lambda == pytest.approx(sum(lams) / len(lams), rel=1e-6)


def test_prefill_computes_logits_for_the_last_position_only(tiny_lm, monkeypatch):
    """The prefill asks the model for one row of logits (``logits_to_keep=1``)."""
    calls: list[dict] = []
    forward = tiny_lm.model.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append({"keep": kwargs.get("logits_to_keep"), "rows": out.logits.shape[1],
                      "n": kwargs["input_ids"].shape[1]})
        return out

    monkeypatch.setattr(tiny_lm.model, "forward", spy)
    make_engine(tiny_lm).generate(PASSAGE_TEXT[:80], max_new_tokens=3, passages=_rome())
    first = calls[0]
    assert first["n"] > 10 and first["keep"] == 1 and first["rows"] == 1


def test_string_prompt_modes(tiny_lm, monkeypatch):
    """"completion" completes raw text; "chat" sends a user message; "auto" completes raw text
    and retries as a user message only when the completion ended at once with an end token."""
    from nest_integrations.decoding.prompts import prompt_ids

    seen: list[list[int]] = []
    forward = tiny_lm.forward

    def spy(ids, cache, **kw):
        if tiny_lm.cache_length(cache) == 0:
            seen.append(list(ids))
        return forward(ids, cache, **kw)

    monkeypatch.setattr(tiny_lm, "forward", spy)
    raw = prompt_ids(tiny_lm, "What is X?")
    chat = prompt_ids(tiny_lm, "What is X?", as_chat=True)
    assert chat == tiny_lm.chat_prompt([{"role": "user", "content": "What is X?"}])
    make_engine(tiny_lm, string_prompts="chat").generate("What is X?", max_new_tokens=2)
    make_engine(tiny_lm, string_prompts="completion").generate("What is X?", max_new_tokens=2)
    make_engine(tiny_lm).generate("What is X?", max_new_tokens=2)  # auto, no EOS first: raw
    assert seen == [chat, raw, raw]
    # auto with an end token first: one raw prefill, then the chat prompt
    seen.clear()
    eos = min(tiny_lm.eos_token_ids)

    def eos_first(ids, cache, **kw):
        logits, keys = spy(ids, cache, **kw)
        if list(ids) == raw:
            logits = logits.clone()
            logits[-1, eos] = logits[-1].max() + 50
        return logits, keys

    monkeypatch.setattr(tiny_lm, "forward", eos_first)
    res = make_engine(tiny_lm).generate("What is X?", max_new_tokens=4)
    assert seen == [raw, chat] and len(res.token_ids) == 4
    assert res.stats.prompt_tokens == len(chat)
    with pytest.raises(ValueError, match="string_prompts"):
        make_engine(tiny_lm, string_prompts="question")


@pytest.mark.slow
def test_bare_question_to_the_instruct_model_is_answered(default_lm):
    """The embedded instruct model ends a raw "What is X?" at once; "auto" answers it."""
    raw = make_engine(default_lm, string_prompts="completion").generate(
        "What is a Python list?", max_new_tokens=16
    )
    assert raw.text == "" and raw.stats.forward_passes == 1  # the problem "auto" solves
    res = make_engine(default_lm).generate("What is a Python list?", max_new_tokens=16)
    assert len(res.token_ids) == 16 and "list" in res.text.lower()


def test_sampling_accepts_on_the_warped_distribution(tiny_lm, monkeypatch):
    """Sampling mode verifies drafts on the distribution tokens are drawn from (temperature and
    top-p applied): a drafted token outside the top-p nucleus of p_M is never accepted, though
    drafts do contain such tokens (so the unwarped rule would have accepted some)."""
    from nest_integrations.core.sampling import warp

    calls: list[tuple[torch.Tensor, list[int], int]] = []
    from nest_integrations.decoding.verifiers import RelaxedVerifier

    accept = RelaxedVerifier.accept_count

    def spy(self, dist, draft):
        n = accept(self, dist, draft)
        p = getattr(dist, "p", dist)  # a StepDistribution (or its p rows)
        calls.append((p.detach().clone(), draft.tolist(), n))
        return n

    monkeypatch.setattr(RelaxedVerifier, "accept_count", spy)
    cfg = _copying_cfg(temperature=1.0, top_p=0.3, seed=0)
    make_engine(tiny_lm, config=cfg).generate("The history of the Roman Empire",
                                             max_new_tokens=40, passages=_rome())
    outside = accepted = 0
    for p, draft, n in calls:
        q = warp(p, cfg.temperature, cfg.top_p)
        for i, tok in enumerate(draft):
            if q[i, tok] == 0:
                outside += 1
                assert i >= n, "a token outside the warped nucleus was accepted"
            accepted += i < n
    assert outside > 0 and accepted > 0
