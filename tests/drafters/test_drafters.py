"""The drafter port and the one loop: lossless methods equal greedy decoding, speculative sampling
keeps the sampling distribution, and the port takes a new drafter in one file + one line.

- every lossless mode (``greedy``, ``prompt-lookup``) equals HF ``generate`` greedy output token
  for token, on grounded and open prompts and with ``max_new_tokens`` hit mid-draft;
- speculative sampling (``temperature > 0``): the empirical distribution of the first tokens
  equals the exact sampling distribution (chi-square), and a deliberately wrong residual rule
  fails the same test.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from nest_integrations.core import verification
from nest_integrations.decoding import loop as loop_module
from nest_integrations.decoding.plain import decode_ids
from nest_integrations.config import NestConfig
from nest_integrations.core.sampling import warp
from nest_integrations.drafters import METHODS, Draft, Method, get_method, register
from tests.engines import make_engine
from nest_integrations.types import Passage
from tests.fakes import FakeLM
from tests.invariants import chi2_pvalue, hf_greedy

GROUNDED = (
    "The assert statement is a convenient way to insert debugging assertions into a program. "
    "The simple form, assert expression, is equivalent to: if __debug__: if not expression: "
    "raise AssertionError."
)

PROMPTS = [
    [{"role": "user", "content": f"Background: {GROUNDED}\n\nWhat does assert do? Quote it."}],
    [{"role": "user", "content": "Repeat exactly: one two three four five six seven."}],
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [{"role": "user", "content": "List the days of the week."}],
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    f"{GROUNDED}\n\nIn short, the assert statement",
    "Roses are red, violets are blue,",
    [{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
]


_hf_greedy = hf_greedy


# greedy and prompt-lookup against HF ``generate`` on the real model (some drafts accepted, some
# rejected, no extra forward passes): tests/decoding/test_lossless_oracles.py, with every lossless
# method.


@pytest.mark.slow
def test_prompt_lookup_stops_at_max_new_tokens_mid_draft(default_lm):
    """A draft longer than the budget is cut: the output ends at max_new_tokens exactly."""
    engine = make_engine(default_lm)
    prompt = PROMPTS[1]
    ref = _hf_greedy(default_lm, engine.prompt_ids(prompt), 7)
    res = engine.generate(prompt, max_new_tokens=7, decoding="prompt-lookup")
    assert res.token_ids == ref and len(ref) == 7
    assert res.stats.finish_reason == "length"


def test_lossless_modes_equal_greedy_on_tiny_model(tiny_lm):
    """The same oracle on the tiny random Llama (fast): repetitive output, many drafts."""
    engine = make_engine(tiny_lm)
    for prompt in ["The Roman Empire was", "a b a b a b a b", "def f(x): return x"]:
        ref = engine.generate(prompt, max_new_tokens=40, decoding="greedy")
        res = engine.generate(prompt, max_new_tokens=40, decoding="prompt-lookup")
        assert res.token_ids == ref.token_ids
        hf = _hf_greedy(tiny_lm, engine.prompt_ids(prompt), 40)
        assert ref.token_ids == hf


def test_lossless_modes_keep_passages_and_give_no_citations(tiny_lm):
    """Lossless modes still return the passages they were given, without copy citations."""
    engine = make_engine(tiny_lm)
    p = Passage("p1", GROUNDED, doc_id="d", char_start=0, char_end=len(GROUNDED))
    res = engine.generate("The assert statement", max_new_tokens=8, decoding="prompt-lookup",
                          passages=[p])
    assert res.passages == [p]
    assert res.stats.n_keys == 0  # no token memory is built for lossless methods
    assert all(c.kind == "verbatim" for c in res.citations)


def test_unknown_decoding_is_a_clear_error(tiny_lm):
    with pytest.raises(ValueError, match="unknown decoding 'nope'.*prompt-lookup"):
        make_engine(tiny_lm, decoding="nope")
    with pytest.raises(ValueError, match="unknown decoding"):
        make_engine(tiny_lm).generate("x", decoding="nope")


def test_new_drafter_is_one_class_and_one_registry_line(tiny_lm):
    """A drafter that always proposes the same wrong tokens still gives greedy output, and its
    update() sees every verification (the port's contract, shown with a throwaway method)."""
    seen: list[int] = []

    class Always:
        def propose(self, state):
            return Draft([5, 6, 7], [None, None, None])

        def update(self, state, draft, n_accepted):
            seen.append(n_accepted)

    register(Method("always-567", lambda ctx: Always()))
    try:
        engine = make_engine(tiny_lm)
        ref = engine.generate("The Roman Empire was", max_new_tokens=12, decoding="greedy")
        res = engine.generate("The Roman Empire was", max_new_tokens=12, decoding="always-567")
        assert res.token_ids == ref.token_ids
        assert len(seen) == res.stats.verify_steps > 0
        assert len(seen) < res.stats.drafted_tokens <= 3 * len(seen)  # cut to the budget at the end
    finally:
        METHODS.pop("always-567")
    assert get_method("prompt-lookup").make_drafter is not None


# ------------------------------------------------------------------ speculative sampling

V = 6  # a small vocabulary: the exact distribution of three tokens has V ** 3 cells


def _fake_lm() -> FakeLM:
    lm = FakeLM(key_dim=8, vocab_size=V, seed=3)
    lm.eos_token_ids = frozenset({99})  # no EOS in the vocabulary: always two tokens
    return lm


def _exact_probs(lm: FakeLM, prompt_ids: list[int], cfg: NestConfig, n_tokens: int) -> dict:
    """Exact probability of every sequence of ``n_tokens`` sampled tokens."""

    def step(prefix: list[int]) -> torch.Tensor:
        logits, _ = lm.forward(prompt_ids + prefix, lm.new_cache())
        return warp(torch.softmax(logits[-1], -1), cfg.temperature, cfg.top_p)

    probs = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for seq, pr in probs.items():
            p = step(list(seq))
            for t in range(V):
                if p[t] > 0:
                    nxt[seq + (t,)] = pr * float(p[t])
        probs = nxt
    return probs


_chi2_pvalue = chi2_pvalue


class _Repeat:
    """Always drafts the tokens 2, 3 (a deterministic draft: q is one-hot)."""

    def __init__(self, ctx):
        pass

    def propose(self, state):
        return Draft([2, 3][: state.budget], None)

    def update(self, state, draft, n_accepted):
        pass


def _sample_pairs(method: str, n: int, cfg: NestConfig) -> tuple[Counter, list[int]]:
    engine = make_engine(_fake_lm())
    counts: Counter = Counter()
    acc = [0, 0]
    for i in range(n):
        res = engine.generate(" x", max_new_tokens=3, decoding=method,
                              config=cfg.replace(seed=i), passages=[])
        counts[tuple(res.token_ids)] += 1
        acc[0] += res.stats.accepted_tokens
        acc[1] += res.stats.drafted_tokens
    return counts, acc


@pytest.fixture()
def repeat_method():
    register(Method("test-repeat", lambda ctx: _Repeat(ctx)))
    yield "test-repeat"
    METHODS.pop("test-repeat")


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_speculative_sampling_matches_plain_sampling(repeat_method, top_p):
    """Over 3000 seeded draws, the first three tokens (two of them drafted) follow the exact sampling distribution,
    with drafts that are partly accepted (the rule is exercised, not bypassed)."""
    cfg = NestConfig(temperature=1.3, top_p=top_p)
    n = 3000
    counts, (accepted, drafted) = _sample_pairs(repeat_method, n, cfg)
    lm = _fake_lm()
    probs = _exact_probs(lm, lm.tokenize(" x"), cfg, 3)
    assert 0 < accepted < drafted
    assert _chi2_pvalue(counts, probs, n) > 1e-3


def test_a_wrong_residual_rule_fails_the_same_test(repeat_method, monkeypatch):
    """Resampling from p instead of the residual max(0, p - q) biases the output: the
    chi-square test above rejects it, so it can catch a broken rule."""

    def wrong(p, draft, q, generator):
        n = int(draft.numel())
        idx = torch.arange(n)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        ok = u < p[idx, draft].double()
        m = int((~ok).nonzero()[0, 0]) if (~ok).any() else n
        return m, int(torch.multinomial(p[m].float(), 1, generator=generator))  # not residual

    monkeypatch.setattr(verification, "speculative_sampling", wrong)
    cfg = NestConfig(temperature=1.3)
    n = 3000
    counts, _ = _sample_pairs(repeat_method, n, cfg)
    lm = _fake_lm()
    probs = _exact_probs(lm, lm.tokenize(" x"), cfg, 3)
    assert _chi2_pvalue(counts, probs, n) < 1e-3


# ----------------------------------------------------------------------------- the method API


def test_methods_name_their_verifier_and_bad_ones_are_refused():
    from nest_integrations.drafters import LOSSLESS, RELAXED

    assert get_method("nest").verifier == RELAXED
    assert {m.verifier for n, m in METHODS.items() if n != "nest"} <= {LOSSLESS}
    with pytest.raises(ValueError, match="needs_target"):
        Method("bad-relaxed", None, verifier=RELAXED)  # relaxed checks before feeding
    lm = FakeLM()
    odd = Method("odd-verifier", None, verifier="majority-vote")
    with pytest.raises(ValueError, match="unknown verifier 'majority-vote'"):
        decode_ids(lm, odd, [3, 4, 5], 4)


def test_drafter_options_become_typed_options_with_clear_errors():
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.drafters.prompt_lookup import PromptLookupDrafter, PromptLookupOptions
    from nest_integrations.drafters.rag_copy import RagCopyDrafter

    def ctx(**options):
        return DrafterContext(lm=FakeLM(), config=NestConfig(), prompt_ids=[], passages=[],
                              options=options)

    d = PromptLookupDrafter.from_context(ctx(max_ngram="2", num_tokens=6))
    assert d.options == PromptLookupOptions(max_ngram=2, min_ngram=1, num_tokens=6)
    assert PromptLookupDrafter.from_context(ctx()).options == PromptLookupOptions()
    with pytest.raises(ValueError, match=r"unknown drafter option\(s\) \['num_token'\].*"
                                         r"prompt-lookup.*num_tokens"):
        PromptLookupDrafter.from_context(ctx(num_token=6))
    with pytest.raises(ValueError, match="max_ngram=.*not a valid int"):
        PromptLookupDrafter.from_context(ctx(max_ngram="three"))
    with pytest.raises(ValueError, match="rag-copy min_ngram must be >= 1"):
        RagCopyDrafter(ctx(min_ngram=0))
    assert RagCopyDrafter(ctx()).options.num_tokens == 16  # its own defaults


def test_loop_over_an_uncached_model_gives_the_same_tokens(tiny_lm):
    """The KV-cache oracle: drafts that are two tokens right then one wrong (accepted, rejected,
    cropped every step) through the loop over ``UncachedLM`` (every forward recomputed from the
    committed ids, nothing to crop wrongly) and over the cached model give the same tokens,
    and both equal greedy decoding."""
    from nest_integrations.lm.uncached import UncachedLM

    ids = tiny_lm.tokenize("The quick brown fox jumps over the lazy dog. The quick brown fox")
    greedy, _ = decode_ids(tiny_lm, get_method("greedy"), ids, 16)

    class _TwoRightOneWrong:
        def propose(self, state):
            k = len(state.out_ids)  # the next token's index in the greedy output
            right = greedy[k : k + 2]
            return Draft(right + [(greedy[k] + 1) % tiny_lm.vocab_size]) if right else None

        def update(self, state, draft, n_accepted):
            return None

    method = Method("test-two-right", None)
    runs = [decode_ids(lm, method, ids, 16, drafter=_TwoRightOneWrong())
            for lm in (tiny_lm, UncachedLM(tiny_lm))]
    (cached, stats), (uncached, _) = runs
    assert cached == uncached == greedy
    assert 0 < stats.accepted_tokens < stats.drafted_tokens and stats.time_draft > 0


def test_token_tree_passes_go_through_the_timed_forward(tiny_lm, monkeypatch):
    """A drafter that proposes token trees: the output equals greedy decoding, every target
    pass (chains and trees) is counted in ``forward_passes`` and timed in ``time_lm``, and the
    tree steps land in ``NestStats``."""

    class _Fork:
        def propose(self, state):
            ctx = state.context_ids
            a, b = ctx[-1], ctx[-2] if len(ctx) > 1 else ctx[-1]
            return Draft([a, b, a], None, parents=[-1, -1, 0])

        def update(self, state, draft, n_accepted):
            return None

    calls = {"forward": 0, "forward_tree": 0}
    for name in calls:
        real = getattr(tiny_lm, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(tiny_lm, name, counted)
    method = Method("test-fork", lambda ctx: _Fork())
    ids = tiny_lm.tokenize("one two one two one two one two")
    out, stats = decode_ids(tiny_lm, method, ids, 12, drafter=_Fork())
    monkeypatch.undo()
    greedy, _ = decode_ids(tiny_lm, get_method("greedy"), ids, 12)
    assert out == greedy
    assert calls["forward_tree"] == stats.tree_steps > 0
    assert stats.forward_passes == calls["forward"] + calls["forward_tree"]
    assert stats.tree_nodes == 3 * stats.tree_steps and stats.time_lm > 0


def test_the_evidence_sentence_is_quoted_in_one_pass(tiny_lm, monkeypatch):
    """Evidence first (``core.evidence``): NEST opens the answer with the evidence sentence as
    ONE ``quoted`` draft, committed whole in the prompt's own target pass and cited to its
    passage, where a random tiny model would never write it; then NEST copies on from the
    passage's next row."""
    from nest_integrations.policy import AnswerPolicy
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    sentence = "Its life expectancy at birth is 76.6 years."
    text = f"Tumouland is a small island in the Pacific. {sentence} It exports copra and fish."
    passage = Passage("p1", text, "profile/tumouland", metadata={"title": "Tumouland"})
    policy = AnswerPolicy(decoding="rag-copy", evidence="overlap", evidence_min=0.0)
    engine = make_engine(tiny_lm, InMemoryRetriever([passage]), policy=policy)
    quote = tiny_lm.tokenize(" " + sentence)
    passes: list[int] = []  # tokens per pass, the prompt's first
    real = loop_module.DecodeLoop.forward

    def counted(self, tokens, *a, **kw):
        passes.append(len(tokens))
        return real(self, tokens, *a, **kw)

    monkeypatch.setattr(loop_module.DecodeLoop, "forward", counted)
    res = engine.generate([{"role": "user", "content": "What is the life expectancy at birth?"}],
                          max_new_tokens=len(quote) + 4)
    assert res.text.lstrip().startswith(sentence), res.text
    # the whole quote in the first pass, the prompt's: decided before it, it runs with it
    assert len(quote) - 1 <= passes[0] - res.stats.prompt_tokens <= len(quote) + 1
    first = res.citations[0]
    assert first.kind == "copy" and first.doc_id == "profile/tumouland"
    assert first.text.startswith(sentence)  # and the copy goes on from the next row
    assert first.text == text[first.passage_start:first.passage_end]
