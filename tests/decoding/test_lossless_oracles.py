"""Lossless oracles: every lossless decoding method equals Hugging Face ``generate``.

The reference is ``model.generate(input_ids, do_sample=False, max_new_tokens=N)`` on the same
model, the same dtype and the same prompt ids, built here from the tokenizer and the RA
templates (never by the code under test). For ``greedy``, ``prompt-lookup``, ``rag-copy``,
``rest`` (chain and tree), ``dresd`` (chain and tree) and ``knn-ssd``:

- quick (tiny random Llamas): token-for-token equality with drafts built to be partly wrong
  (some tokens of the draft sources are altered), so that the stats show drafts both accepted
  and rejected for every drafting method;
- mutation: with the loop's verification broken to accept one wrong token, the same oracle
  fails for every drafting method (``greedy`` has no drafts, hence nothing to break);
- slow (SmolLM2-135M-Instruct): 6 prompts x 48 tokens per method.

Also here: a chi-square test of KNN-SSD sampling (its draft distribution q is not one-hot)
against exact enumeration, which a broken residual rule fails, and an engine-level test that
``confidence_guard`` overrules the mixture in ``Verifier.next_token``.

How each method's drafts are made partly wrong on the tiny models:

- ``rest`` / ``dresd``: a datastore of the model's own greedy answers (from HF ``generate``)
  with keys from the same prompts, stored twice with every 5th token altered at two different
  phases (drafts run until an altered token; the two copies fork into token trees);
- ``knn-ssd``: an explicit partial skip set (attention of layer 1) on the tiny Llama;
- ``prompt-lookup`` / ``rag-copy``: a random model's next token depends on its whole context,
  so its answer never appears in a prompt it was not given. They run on a second tiny Llama whose
  attention outputs are zero (``o_proj = 0``): the next token depends on the current token only,
  so the answer to ``Q`` is also the answer to ``altered_answer + Q`` (prompt-lookup) and to
  ``Background: altered_answer ... Q`` (rag-copy). They also run on the ordinary tiny Llama
  (context-dependent, drafts mostly rejected) and on SmolLM2 in the slow set.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from nest_integrations.config import Guards, NestConfig
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.lm.backend import cpu_has_native_bf16
from nest_integrations.policy import AnswerPolicy
from nest_integrations.lm.hf import HFLanguageModel
from nest_integrations.lm.layer_skip import SkipSet
from nest_integrations.types import Passage
from tests.fakes import FakeLM
from tests.invariants import chi2_pvalue
from tests.oracles import (
    DRAFTING, LOSSLESS, Case, Outcome, assert_partial, break_residual, break_verification, chat_ids,
    copy_cases, corpus_cases, run_oracle
)


# ------------------------------------------------------------------ quick: tiny random Llamas

N_TINY = 32
QUESTIONS = ["Name three colours.", "What is a list in Python?", "Describe the sea.",
             "Who was Julius Caesar?"]  # fmt: skip
COMPLETIONS = ["The Roman Empire was", "def add(a, b):", "Photosynthesis converts light",
               "Paris is the capital"]  # fmt: skip


@pytest.fixture(scope="module")
def markov_lm(tmp_path_factory):
    """A tiny random Llama with zero attention outputs: its next token depends only on the
    current token, so its answer can be planted in a context (loaded from disk like any
    checkpoint)."""
    from tests._tiny import smollm2_tokenizer, tiny_llama

    model = tiny_llama(seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    folder = tmp_path_factory.mktemp("markov-llama")
    model.save_pretrained(folder)
    smollm2_tokenizer().save_pretrained(folder)
    return HFLanguageModel.from_pretrained(str(folder), dtype="fp32")


@pytest.fixture(scope="module")
def tiny_cases(tiny_lm, markov_lm, tmp_path_factory):
    """(engine, cases, HF reference cache) per model, every lossless label covered."""
    root = tmp_path_factory.mktemp("oracle-ds") / "ds"
    partial = SkipSet.from_lists(len(tiny_lm.model.model.layers), [1], [])
    on_tiny = corpus_cases(tiny_lm, QUESTIONS, N_TINY, root, partial)
    on_tiny += copy_cases(tiny_lm, QUESTIONS[:2], N_TINY, chat=True)
    on_markov = copy_cases(markov_lm, COMPLETIONS, N_TINY, chat=False)
    return [
        (NestEngine(tiny_lm, None, InMemoryKeyStore(), NestConfig()), on_tiny, {}),
        (NestEngine(markov_lm, None, InMemoryKeyStore(), NestConfig()), on_markov, {}),
    ]


def _run_all(tiny_cases, labels=LOSSLESS) -> Outcome:
    total = Outcome()
    for engine, cases, refs in tiny_cases:
        out = run_oracle(engine, [c for c in cases if c.label in labels], N_TINY, refs)
        for label, bad in out.mismatches.items():
            total.mismatches.setdefault(label, []).extend(bad)
        total.drafted.update(out.drafted)
        total.accepted.update(out.accepted)
        total.steps.update(out.steps)
    return total


def test_every_lossless_method_equals_hf_generate_on_tiny_models(tiny_cases, monkeypatch):
    """Token-for-token equality with HF greedy ``generate`` for every lossless method, with
    drafts partly accepted and partly rejected for every drafting method; tree labels really
    verified token trees and chain labels never did."""
    from nest_integrations.lm.hf import HFLanguageModel as HF

    trees = Counter()
    real_tree = HF.forward_tree

    def counting_tree(self, *a, **kw):
        trees[current[0]] += 1
        return real_tree(self, *a, **kw)

    monkeypatch.setattr(HF, "forward_tree", counting_tree)
    current = [""]
    total = Outcome()
    for label in LOSSLESS:
        current[0] = label
        out = _run_all(tiny_cases, (label,))
        total.mismatches.update(out.mismatches)
        total.drafted.update(out.drafted)
        total.accepted.update(out.accepted)
    assert set(total.mismatches) == set(LOSSLESS)
    assert {k: v for k, v in total.mismatches.items() if v} == {}
    assert total.drafted["greedy"] == 0
    assert_partial(total, DRAFTING)
    assert trees["rest-tree"] > 0 and trees["dresd-tree"] > 0, trees
    assert not any(trees[m] for m in ("prompt-lookup", "rag-copy", "rest", "dresd", "knn-ssd"))


#: A flat (bf16-like) verify-cost curve, c(T)/c(1) for T = 1..13: long drafts pay.
FLAT_COST = [1.0, 1.05, 1.1, 1.12, 1.15, 1.18, 1.2, 1.22, 1.25, 1.3, 1.35, 1.4, 1.45]
PLANNED = ("prompt-lookup", "rag-copy", "dresd", "dresd-tree", "knn-ssd")


def test_cost_planned_draft_lengths_stay_lossless(tiny_cases, monkeypatch):
    """With an explicit cost curve (no timing) choosing the draft lengths of every method
    that adapts them, each still equals HF greedy ``generate`` token for token, with drafts
    partly accepted and partly rejected; the planner really chose the lengths (spy)."""
    from dataclasses import replace

    import nest_integrations.lm.cost as cost

    chosen = Counter()
    real_length = cost.DraftPlanner.length

    def spy(self, max_len=None):
        k = real_length(self, max_len)
        chosen[k] += 1
        return k

    monkeypatch.setattr(cost.DraftPlanner, "length", spy)
    # The tiny Llama's skip set keeps 3 of 4 sublayers: priced honestly its drafts never pay,
    # so price them as a real skip set's (5% of a step) to get drafts verified.
    monkeypatch.setattr("nest_integrations.drafters.knn_ssd.draft_cost_fraction",
                        lambda skip, profile_cost: 0.05)
    planned = [(engine, [replace(c, options={**c.options, "cost_model": FLAT_COST})
                         for c in cases if c.label in PLANNED], refs)
               for engine, cases, refs in tiny_cases]
    total = _run_all(planned, PLANNED)
    assert {k: v for k, v in total.mismatches.items() if v} == {}
    assert set(total.mismatches) == set(PLANNED)
    assert_partial(total, PLANNED)
    assert len(chosen) > 1 and sum(chosen.values()) > 0, chosen


@pytest.mark.parametrize("label", DRAFTING)
def test_the_oracle_fails_when_verification_accepts_one_wrong_token(tiny_cases, monkeypatch,
                                                                    label):
    """Mutation proof: with the loop accepting one wrong token per rejected draft, the output
    of every drafting method differs from HF generate (the oracle above can fail)."""
    break_verification(monkeypatch)
    out = _run_all(tiny_cases, (label,))
    assert out.steps[label] > 0
    assert out.mismatches[label], f"{label}: a broken verification still matched HF generate"


# ------------------------------------------------------------------ slow: SmolLM2-135M-Instruct

N_REAL = 48
#: rest's token tree shares dresd-tree's tree verification (both run on the tiny models); on
#: SmolLM2 it is left out for time (about 25 s of the CI budget).
REAL_LOSSLESS = tuple(label for label in LOSSLESS if label != "rest-tree")
ASSERT_TEXT = (
    "The assert statement is a convenient way to insert debugging assertions into a program. "
    "The simple form, assert expression, is equivalent to: if __debug__: if not expression: "
    "raise AssertionError."
)
PARIS_TEXT = (
    "Paris is the capital and most populous city of France. With an estimated population of "
    "2,102,650 residents in January 2023 in an area of more than 105 km2, Paris is the "
    "fourth-most populous city in the European Union."
)
REAL_QUESTIONS = [
    "What does the assert statement do in Python?",
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List the days of the week.",
    "Explain photosynthesis in one paragraph.",
    "Count from 1 to 20, separated by commas.",
]
RAG_PASSAGES = [
    [Passage("assert", ASSERT_TEXT, doc_id="python-docs")],
    [Passage("paris", PARIS_TEXT, doc_id="wiki-paris")],
    [Passage("reverse", "To reverse a string in Python, use slicing: s[::-1] returns the "
             "string reversed. For example, 'hello'[::-1] is 'olleh'.", doc_id="howto")],
    [Passage("days", "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, "
             "Saturday and Sunday.", doc_id="calendar")],
    [Passage("photo", "Photosynthesis is the process by which green plants use sunlight, "
             "water and carbon dioxide to make glucose and release oxygen.", doc_id="bio")],
    [Passage("count", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20",
             doc_id="numbers")],
]


@pytest.mark.slow
def test_every_lossless_method_equals_hf_generate_on_smollm2(default_lm, tmp_path):
    """The real model: 6 prompts x 48 tokens, every lossless method, token for token."""
    _smollm2_oracle(default_lm, tmp_path)


@pytest.mark.slow
def test_every_lossless_method_equals_hf_generate_on_smollm2_in_auto_dtype(tmp_path):
    """The same in the ``auto`` dtype: bf16 (linears prepacked, verify passes by the row plans
    probed on this CPU, attention row-wise) where the load-time check finds bf16 verify rows
    bit-exact, else fp32, whose rows are; never an inexact model. Before row-wise attention
    and probed plans, lossless outputs left greedy's path in bf16 on both CPU families."""
    lm = HFLanguageModel.from_default(dtype="auto")
    assert lm.rowwise_attention and lm.exact_rows, lm.dtype_choice
    if cpu_has_native_bf16():  # auto tried bf16 first: the decision follows its check
        bf16 = lm if lm.dtype == torch.bfloat16 else HFLanguageModel.from_default(dtype="bf16")
        assert bf16.exact_rows is (lm.dtype == torch.bfloat16)
    _smollm2_oracle(lm, tmp_path)


def _smollm2_oracle(lm: Any, tmp_path: Any) -> None:
    n_layers = len(lm.model.model.layers)
    skip = SkipSet.from_lists(n_layers, range(6, n_layers - 4, 2), range(9, n_layers - 4, 4))
    refs: dict = {}
    cases = corpus_cases(lm, REAL_QUESTIONS, N_REAL, tmp_path / "ds", skip,
                         {"threshold": 0.6}, refs, REAL_LOSSLESS)
    for q, passages in zip(REAL_QUESTIONS, RAG_PASSAGES):
        msgs = [{"role": "user", "content": q}]
        cases += [Case("prompt-lookup", msgs, chat_ids(lm, q)),
                  Case("rag-copy", msgs, chat_ids(lm, q, passages), passages=passages)]
    out = run_oracle(NestEngine(lm, None, InMemoryKeyStore(), NestConfig()), cases, N_REAL, refs)
    assert set(out.mismatches) == set(REAL_LOSSLESS)
    assert {k: v for k, v in out.mismatches.items() if v} == {}
    for label in REAL_LOSSLESS:  # every method drafted and had drafts accepted
        if label != "greedy":
            assert out.accepted[label] > 0, (label, out.drafted[label])
    assert_partial(out, ("rest", "dresd", "knn-ssd", "prompt-lookup"))


# ------------------------------------------------------------------ KNN-SSD sampling (q not one-hot)

V_SMALL = 6  # three tokens of a 6-token vocabulary: 216 cells, enumerated exactly
TEMPERATURE = 1.3
SKIP_SMALL = SkipSet.from_lists(2, [0], [])  # skip layer 0 attention: ~60% of drafts accepted


class _IdsLM(HFLanguageModel):
    """A tiny Llama with a 6-token vocabulary; a prompt string is its token ids ("3 1 4")."""

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]


@pytest.fixture(scope="module")
def small_vocab_lm():
    from tests._tiny import smollm2_tokenizer, tiny_llama

    lm = _IdsLM(tiny_llama(seed=0, vocab_size=V_SMALL), smollm2_tokenizer(), name="tiny-v6")
    lm.eos_token_ids = frozenset({99})  # no end token in the vocabulary: always 3 tokens
    return lm


def _exact_three_tokens(lm: Any, prompt: list[int]) -> dict:
    """Exact probability of every 3-token output under temperature sampling of the full model
    (straight from the HF model's logits)."""
    probs = {(): 1.0}
    for _ in range(3):
        nxt = {}
        for seq, pr in probs.items():
            with torch.no_grad():
                logits = lm.model(torch.tensor([prompt + list(seq)])).logits[0, -1].double()
            p = torch.softmax(logits / TEMPERATURE, -1)
            for t in range(V_SMALL):
                nxt[seq + (t,)] = pr * float(p[t])
        probs = nxt
    return probs


def _knn_ssd_samples(lm: Any, n: int, skip: SkipSet = SKIP_SMALL) -> tuple[Counter, int, int]:
    """``n`` seeded 3-token KNN-SSD samples: the first token from the prefill, the next two
    drafted by the layer-skip model (sampled, with their q) and verified."""
    cfg = NestConfig(temperature=TEMPERATURE)
    engine = NestEngine(lm, None, InMemoryKeyStore(), cfg, decoding="knn-ssd",
                        drafter_options={"skip": skip.to_dict(), "threshold": 0.0,
                                         "max_draft": 2})
    counts: Counter = Counter()
    accepted = drafted = 0
    for i in range(n):
        res = engine.generate("3 1 4", max_new_tokens=3, config=cfg.replace(seed=i))
        counts[tuple(res.token_ids)] += 1
        accepted += res.stats.accepted_tokens
        drafted += res.stats.drafted_tokens
    return counts, accepted, drafted


N_DRAWS = 1200


def test_knn_ssd_sampling_matches_exact_enumeration(small_vocab_lm, monkeypatch):
    """KNN-SSD sampling: the first three tokens (two drafted with a non-one-hot q) follow the
    exact temperature-sampling distribution of the full model (chi-square), and the drafts
    are partly accepted."""
    from nest_integrations.core import verification

    real = verification.speculative_sampling
    with_q = []

    def spy(p, draft, q, generator):
        with_q.append(q is not None and int(draft.numel()) > 0 and float(q.max()) < 1.0)
        return real(p, draft, q, generator)

    monkeypatch.setattr(verification, "speculative_sampling", spy)
    counts, accepted, drafted = _knn_ssd_samples(small_vocab_lm, N_DRAWS)
    probs = _exact_three_tokens(small_vocab_lm, [3, 1, 4])
    assert sum(with_q) >= N_DRAWS  # every draft came with its non-one-hot q
    assert 0 < accepted < drafted
    assert chi2_pvalue(counts, probs, N_DRAWS) > 1e-3


def test_a_broken_residual_fails_the_knn_ssd_chi_square(small_vocab_lm, monkeypatch):
    """Drawing from p instead of norm(max(0, p - q)) after a rejection biases the output: the
    same chi-square test rejects it."""
    break_residual(monkeypatch)
    counts, _, _ = _knn_ssd_samples(small_vocab_lm, N_DRAWS)
    probs = _exact_three_tokens(small_vocab_lm, [3, 1, 4])
    assert chi2_pvalue(counts, probs, N_DRAWS) < 1e-3


# ------------------------------------------------------------------ confidence_guard in pick


class _ConfidentLM(FakeLM):
    """FakeLM whose own top token is always ``token`` with almost all the mass."""

    token = 0

    def forward(self, ids, cache, *, last=None):
        logits, keys = super().forward(ids, cache, last=last)
        logits[:, self.token] = logits.max() + 20.0
        return logits, keys


def test_confidence_guard_lets_a_confident_lm_overrule_the_mixture():
    """NEST with p_M ~ p_kNN (lambda ~ 0) copies the passage; with ``confidence_guard`` the
    LM's confident token wins every pick (``Verifier.next_token``) and nothing is copied."""
    lm = _ConfidentLM(key_dim=8, vocab_size=64, seed=1)
    sure = lm.tokenize(" omega")[0]
    lm.token = sure
    text = "alpha beta gamma delta epsilon zeta eta theta"
    passages = [Passage("a", text, doc_id="a", char_start=0, char_end=len(text))]
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())
    base = NestConfig(rrc_offset=10.0)  # lambda ~ 0: the mixture follows the passage
    paper = engine.generate(" alpha", max_new_tokens=6, passages=passages, config=base)
    guarded = engine.generate(" alpha", max_new_tokens=6, passages=passages, config=base,
                              policy=AnswerPolicy(guards=Guards(confidence_guard=0.9)))
    assert paper.stats.attributed_tokens > 0 and sure not in paper.token_ids
    assert guarded.token_ids == [sure] * 6
    assert guarded.stats.attributed_tokens == 0
    assert guarded.stats.verify_steps == 0  # decided by pick, not by the acceptance veto
