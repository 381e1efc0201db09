"""The lossless oracle harness: the methods that must equal Hugging Face ``generate``, the
cases (prompt ids, passages, datastores, reference answers), ``run_oracle``, and the
mutations that prove an oracle can fail (``break_verification``, ``break_residual``).

Used by ``tests/decoding/test_lossless_oracles.py``, ``tests/lm/llama_cpp/`` and
``tests/lm/test_backend.py``."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from nest_integrations.builders.dresd_responses import keys_in_context
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.decoding.prompts import RA_CHAT_TEMPLATE, RA_TEXT_TEMPLATE
from nest_integrations.dresd import SourceBatch, build_datastore
from nest_integrations.lm.layer_skip import SkipSet
from nest_integrations.types import Passage
from tests.invariants import hf_greedy


#: Every lossless method of the README and its label here (a method can run in two shapes).
LOSSLESS = ("greedy", "prompt-lookup", "rag-copy", "rest", "rest-tree", "dresd", "dresd-tree",
            "knn-ssd")  # fmt: skip
DRAFTING = tuple(m for m in LOSSLESS if m != "greedy")


# ------------------------------------------------------------------ the one place that knows
# how the loop verifies (patched by the mutation tests; adapt here if the loop is refactored)


def break_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the loop's exact verification accept ONE wrong draft token per rejected draft:
    the strict acceptance count of a chain returns ``m + 1`` when ``m < len(draft)`` (on
    logits, ``strict_accept_count``; on rows' argmaxes, llama.cpp's, ``greedy_accept``), and a
    token-tree verification takes the first child of the last accepted node although it is not
    the target's argmax (feeding it so the KV cache stays consistent)."""
    from nest_integrations.core import verification
    from nest_integrations.decoding import loop as loop_module

    real_count = verification.strict_accept_count

    def one_more(p: torch.Tensor, draft: torch.Tensor) -> int:
        m = real_count(p, draft)
        return m + 1 if m < int(draft.numel()) else m

    real_greedy = verification.greedy_accept

    def greedy_one_more(rows: list[int], draft: list[int]) -> tuple[int, int]:
        m, c = real_greedy(rows, draft)
        return (m + 1, int(rows[m + 1])) if m < len(draft) else (m, c)

    real_tree = loop_module.DecodeLoop._verify_tree

    def tree_one_more(self: Any, pending: int, draft: Any, before: int) -> tuple:
        path, c, hidden = real_tree(self, pending, draft, before)
        last = path[-1] if path else -1
        wrong = next((i for i, par in enumerate(draft.parents) if par == last), None)
        if wrong is None:  # the whole path was accepted: nothing wrong to take
            return path, c, hidden
        logits, keys = self.lm.forward([draft.tokens[wrong]], self.cache)
        return path + [wrong], int(logits[-1].argmax()), keys[-1]

    monkeypatch.setattr(verification, "strict_accept_count", one_more)
    monkeypatch.setattr(loop_module, "greedy_accept", greedy_one_more)
    monkeypatch.setattr(loop_module.DecodeLoop, "_verify_tree", tree_one_more)


def break_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculative sampling with the right acceptance test (``min(1, p/q)``) but a wrong
    residual: after a rejection the next token is drawn from ``p`` instead of
    ``norm(max(0, p - q))``."""
    from nest_integrations.core import verification

    def wrong_residual(p, draft, q, generator):
        n = int(draft.numel())
        idx = torch.arange(n)
        p_x = p[idx, draft].double()
        q_x = q[idx, draft].double() if q is not None else torch.ones_like(p_x)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        ok = u < (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0)
        m = int((~ok).nonzero()[0, 0]) if bool((~ok).any()) else n
        return m, int(torch.multinomial(p[m].float(), 1, generator=generator))  # not residual

    monkeypatch.setattr(verification, "speculative_sampling", wrong_residual)


# ------------------------------------------------------------------ prompts, built independently


def chat_text(tok: Any, question: str, ra: list[Passage] = ()) -> str:
    """One user message (RA passages in the message) as the HF tokenizer's chat template
    renders it, with the assistant's turn opened."""
    content = question
    if ra:
        content = RA_CHAT_TEMPLATE.format(context="\n\n".join(p.text for p in ra),
                                          question=question)
    return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)


def chat_ids(lm: Any, question: str, ra: list[Passage] = ()) -> list[int]:
    """Prompt ids of one user message (RA passages in the message), from the HF tokenizer."""
    text = chat_text(lm.tokenizer, question, ra)
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def text_ids(lm: Any, prompt: str, ra: list[Passage] = ()) -> list[int]:
    """Prompt ids of a string completed as raw text (RA passages before it), from the HF
    tokenizer with its default special tokens (SmolLM2's adds none)."""
    text = prompt
    if ra:
        text = RA_TEXT_TEMPLATE.format(context="\n\n".join(p.text for p in ra), prompt=prompt)
    return list(lm.tokenizer(text)["input_ids"])


def alter(tokens: list[int], vocab: int, phase: int, every: int = 5) -> list[int]:
    """``tokens`` with every ``every``-th token (from ``phase``) replaced by another id."""
    out = list(tokens)
    for i in range(phase, len(out), every):
        out[i] = (out[i] + 1) % vocab
    return out


@dataclass
class Case:
    """One generation of one method and the exact prompt ids the reference decodes from."""

    label: str  # a LOSSLESS label
    prompt: Any  # a string or chat messages, as given to the engine
    ids: list[int]
    passages: list[Passage] = field(default_factory=list)
    options: dict = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.label.removesuffix("-tree")


@dataclass
class Outcome:
    """Per label: prompts whose output differed from HF, and the summed draft stats."""

    mismatches: dict[str, list[str]] = field(default_factory=dict)
    drafted: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)
    steps: Counter = field(default_factory=Counter)


def run_oracle(engine: NestEngine, cases: list[Case], n: int, refs: dict) -> Outcome:
    """Generate every case and compare it token for token with its HF reference (``refs``
    caches the reference per prompt ids: HF ``generate`` never runs the code under test)."""
    out = Outcome()
    for case in cases:
        key = tuple(case.ids)
        if key not in refs:
            refs[key] = hf_greedy(engine.lm, case.ids, n)
        res = engine.generate(case.prompt, max_new_tokens=n, decoding=case.method,
                              passages=case.passages, drafter_options=case.options)
        assert res.stats.prompt_tokens == len(case.ids), (case.label, case.prompt)
        # every verify pass commits at least one token: drafting never costs extra passes
        assert res.stats.forward_passes <= len(res.token_ids) + 1, (case.label, res.stats)
        bad = out.mismatches.setdefault(case.label, [])
        if res.token_ids != refs[key]:
            bad.append(str(case.prompt)[:60])
        out.drafted[case.label] += res.stats.drafted_tokens
        out.accepted[case.label] += res.stats.accepted_tokens
        out.steps[case.label] += res.stats.verify_steps
    return out


class AlteredAnswers:
    """A DReSD/REST datastore source: the model's greedy answers to ``prompts`` (ids) with the
    keys that produced them, each answer stored once per phase with ``alter`` applied."""

    def __init__(self, lm: Any, prompts: list[list[int]], answers: list[list[int]],
                 phases: tuple[int, ...] = (2, 4), every: int = 5) -> None:
        self.lm, self.prompts, self.answers = lm, prompts, answers
        self.phases, self.every = phases, every
        self.n_batches = 1
        self.spec = {"kind": "altered-answers", "answers": [len(a) for a in answers],
                     "phases": list(phases), "every": every,
                     "hash": hashlib.sha256(repr(answers).encode()).hexdigest()[:16]}

    def batch(self, i: int) -> SourceBatch:
        lm, b = self.lm, SourceBatch([], [], [], [])
        for j, (ids, answer) in enumerate(zip(self.prompts, self.answers)):
            keys = keys_in_context(lm, ids, answer)
            for ph in self.phases:
                tokens = alter(answer, lm.vocab_size, ph, self.every)
                text = lm.detokenize(tokens)
                ends = [min(len(text), len(lm.detokenize(tokens[: k + 1])))
                        for k in range(len(tokens))]
                ends = np.maximum.accumulate(ends)
                ends[-1] = len(text)
                offsets = np.stack([np.concatenate([[0], ends[:-1]]), ends], 1).astype(np.int32)
                b.passages.append(Passage(f"answer-{j}-{ph}", text, doc_id=f"prompt-{j}"))
                b.token_ids.append(np.asarray(tokens, np.int32))
                b.offsets.append(offsets)
                b.keys.append(keys)
        return b


def corpus_cases(lm: Any, questions: list[str], n: int, root: Any, knn_skip: SkipSet,
                 knn_options: dict | None = None, refs: dict | None = None,
                 labels: tuple[str, ...] = LOSSLESS) -> list[Case]:
    """greedy, rest (chain, tree), dresd (chain, tree) and knn-ssd cases (those in ``labels``)
    on chat ``questions``; the datastore holds the model's altered HF answers (each also
    cached in ``refs``, the HF reference of ``run_oracle``)."""
    ids = [chat_ids(lm, q) for q in questions]
    answers = [hf_greedy(lm, i, n) for i in ids]
    if refs is not None:
        refs.update({tuple(i): a for i, a in zip(ids, answers)})
    ds = build_datastore(lm, AlteredAnswers(lm, ids, answers), root)
    store = {"datastore": str(ds.root)}
    dresd = {**store, "min_score": -1.0}  # always draft: every step is verified
    knn = {"skip": knn_skip.to_dict(), "threshold": 0.0, "max_draft": 6, **(knn_options or {})}
    cases = []
    for q, i in zip(questions, ids):
        msgs = [{"role": "user", "content": q}]
        cases += [
            Case("greedy", msgs, i),
            Case("rest", msgs, i, options={**store, "shape": "chain"}),
            Case("rest-tree", msgs, i, options={**store, "shape": "tree"}),
            Case("dresd", msgs, i, options={**dresd, "shape": "chain"}),
            Case("dresd-tree", msgs, i, options={**dresd, "shape": "tree"}),
            Case("knn-ssd", msgs, i, options=knn),
        ]
    return [c for c in cases if c.label in labels]


def copy_cases(lm: Any, prompts: list[str], n: int, chat: bool) -> list[Case]:
    """prompt-lookup and rag-copy cases whose context holds the model's altered answer."""
    cases = []
    for k, q in enumerate(prompts):
        ids_of = chat_ids if chat else text_ids
        answer = hf_greedy(lm, ids_of(lm, q), n)
        seen = lm.detokenize(alter(answer, lm.vocab_size, 2))
        q2 = f"{seen}\n{q}"  # the altered answer, then the same prompt
        passage = Passage(f"answer-{k}", seen, doc_id=f"d{k}")
        prompt = [{"role": "user", "content": q}] if chat else q
        prompt2 = [{"role": "user", "content": q2}] if chat else q2
        cases += [
            Case("prompt-lookup", prompt2, ids_of(lm, q2)),
            Case("rag-copy", prompt, ids_of(lm, q, [passage]), passages=[passage]),
        ]
    return cases


def assert_partial(outcome: Outcome, labels: tuple[str, ...]) -> None:
    """Every label's drafts were verified for real: some accepted, some rejected."""
    for label in labels:
        drafted, accepted = outcome.drafted[label], outcome.accepted[label]
        assert 0 < accepted < drafted, (label, accepted, drafted)
