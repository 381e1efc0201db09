"""Helpers of the llama.cpp backend's tests (``tests/lm/llama_cpp/``, imported after their
``importorskip``): ``Llama``'s own greedy decoding (the reference), prompts, the lossless
oracle's cases, quantised pairs."""

from __future__ import annotations

from typing import Any

import torch

from nest_integrations.dresd import build_datastore
from nest_integrations.lm.default import gguf_path
from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel
from nest_integrations.types import Passage
from tests.oracles import AlteredAnswers, Case, alter, chat_text


N = 32


def llama_end_tokens(llm: Any) -> set[int]:
    ends = {llm.token_eos()}
    for text in ("<|im_end|>", "<|endoftext|>"):
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        if len(ids) == 1:
            ends.add(ids[0])
    return ends


def llama_greedy(llm: Any, ids: list[int], n: int) -> list[int]:
    """``Llama.generate`` at temperature 0 (greedy), a fresh context, cut before an end token
    (the speed benchmark's peer row: llama-cpp-python's own loop, none of the code under test)."""
    from benchmarks.harness.systems import llama_generate

    return llama_generate(llm, ids, n, frozenset(llama_end_tokens(llm)))[0]


def chat_ids(llm: Any, tok: Any, question: str, ra: list[Passage] = ()) -> list[int]:
    """Prompt ids of one user message, not from the code under test: the chat template as the
    Hugging Face tokenizer renders it, tokenised by ``Llama`` (llama.cpp's tokenizer, which
    differs from Hugging Face's on whitespace before a digit: see the text-side test)."""
    return list(llm.tokenize(chat_text(tok, question, ra).encode(), add_bos=False, special=True))


def _rows_vs_steps(lm: LlamaCppLanguageModel, context: list[int], new: list[int]) -> float:
    """Max |difference| between the rows of one decode of ``new`` and one-token steps."""
    cache = lm.new_cache()
    lm.forward(context, cache, last=1)
    rows, keys = lm.forward(new, cache)
    lm.crop_cache(cache, len(context))
    steps = [lm.forward([t], cache) for t in new]
    step_rows = torch.cat([s[0] for s in steps])
    step_keys = torch.cat([s[1] for s in steps])
    return max(float((rows - step_rows).abs().max()), float((keys - step_keys).abs().max()))


def _steps(lm, prompt: list[int], new: list[int]) -> torch.Tensor:
    """The logits of ``prompt``'s last row and of ``new`` fed one token a step, in a new cache."""
    cache = lm.new_cache()
    out = [lm.forward(prompt, cache, last=1)[0][-1]]
    out += [lm.forward([t], cache)[0][-1] for t in new]
    return torch.stack(out)


def llama_generate_n(llm: Any, ids: list[int], n: int) -> list[int]:
    """``Llama.generate`` greedy for exactly ``n`` tokens (no end token stops it)."""
    from benchmarks.harness.systems import llama_generate

    return llama_generate(llm, ids, n, frozenset())[0]


QUESTIONS = ["What does the assert statement do in Python?", "What is the capital of France?",
             "Write a Python function that reverses a string.", "List the days of the week.",
             "Explain photosynthesis in one paragraph.", "Count from 1 to 20, separated by commas."]


PASSAGES = [
    Passage("assert", "The assert statement is a convenient way to insert debugging assertions "
            "into a program. The simple form, assert expression, is equivalent to: if "
            "__debug__: if not expression: raise AssertionError.", doc_id="python-docs"),
    Passage("paris", "Paris is the capital and most populous city of France. With an estimated "
            "population of 2,102,650 residents in January 2023, Paris is the fourth-most "
            "populous city in the European Union.", doc_id="wiki-paris"),
    Passage("reverse", "To reverse a string in Python, use slicing: s[::-1] returns the string "
            "reversed. For example, 'hello'[::-1] is 'olleh'.", doc_id="howto"),
    Passage("days", "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, "
            "Saturday and Sunday.", doc_id="calendar"),
    Passage("photo", "Photosynthesis is the process by which green plants use sunlight, water "
            "and carbon dioxide to make glucose and release oxygen.", doc_id="bio"),
    Passage("count", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20",
            doc_id="numbers"),
]


LABELS = ("greedy", "prompt-lookup", "rag-copy", "rest", "rest-tree", "dresd", "dresd-tree")


def oracle_cases(lm: Any, llm: Any, tok: Any, questions: list[str], n: int, root: Any,
                 labels: tuple[str, ...] = LABELS) -> tuple[list[Case], dict]:
    """Cases of every lossless label, and ``Llama.generate``'s answer per prompt. The DReSD/REST
    datastore holds those answers with every 5th token altered (drafts run until an altered
    token; two copies at different phases make trees); prompt lookup sees an altered answer in
    its prompt."""
    refs: dict = {}
    cases: list[Case] = []
    ids = [chat_ids(llm, tok, q) for q in questions]
    answers = [llama_greedy(llm, i, n) for i in ids]
    refs.update({tuple(i): a for i, a in zip(ids, answers)})
    corpus = {"rest", "rest-tree", "dresd", "dresd-tree"} & set(labels)
    store = {}
    if corpus:
        store = {"datastore": str(build_datastore(lm, AlteredAnswers(lm, ids, answers),
                                                  root).root)}
    for q, i, answer in zip(questions, ids, answers):
        msgs = [{"role": "user", "content": q}]
        seen = lm.detokenize(alter(answer, lm.vocab_size, 2))
        q2 = f"{seen}\n{q}"
        passages = [PASSAGES[QUESTIONS.index(q)]]
        extra = {
            "greedy": [Case("greedy", msgs, i)],
            # fixed-length drafts (llama.cpp's default plans them with the cost model, which
            # may skip them all): the oracle needs drafts to accept and reject
            "prompt-lookup": [Case("prompt-lookup", [{"role": "user", "content": q2}],
                                   chat_ids(llm, tok, q2), options={"cost_model": "off"})],
            "rag-copy": [Case("rag-copy", msgs, chat_ids(llm, tok, q, passages),
                              passages=passages, options={"cost_model": "off"})],
            "rest": [Case("rest", msgs, i, options={**store, "shape": "chain"})],
            "rest-tree": [Case("rest-tree", msgs, i, options={**store, "shape": "tree"})],
            # every draft verified (no cost model, no score floor): the oracle sees rejections
            "dresd": [Case("dresd", msgs, i, options={**store, "min_score": -1.0,
                                                       "shape": "chain", "cost_model": "off"})],
            "dresd-tree": [Case("dresd-tree", msgs, i, options={
                **store, "min_score": -1.0, "shape": "tree", "cost_model": "off"})],
        }
        cases += [c for label in labels for c in extra[label]]
    for c in cases:
        if tuple(c.ids) not in refs:
            refs[tuple(c.ids)] = llama_greedy(llm, c.ids, n)
    return cases, refs


def assert_equals_llama(mismatches: dict[str, list[str]]) -> None:
    """No case differs from ``Llama.generate``. (Two cases once differed only in fresh-home
    runs: the exactness check's token tree leaked a branch sequence, and every later sequence
    was laid out after its cells; ``test_a_cache_dropped_after_a_token_tree_gives_back_its_
    branches``.)"""
    bad = {k: v for k, v in mismatches.items() if v}
    assert not bad, bad


def _quant_pair(qtype: str, **kw: Any) -> tuple[LlamaCppLanguageModel, Any]:
    """The embedded model requantised to ``qtype`` on our backend (one thread) and in
    llama-cpp-python's ``Llama`` as a user loads it (its default model parameters: repacked
    weight layouts on)."""
    import llama_cpp

    from nest_integrations.lm.llama_cpp import requantize

    path = requantize(gguf_path(), qtype)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=4096, n_threads=1, n_threads_batch=1,
                          flash_attn=True, verbose=False, seed=0)
    return LlamaCppLanguageModel.from_gguf(path, threads=1, **kw), llm


def _prompt_logits(lm: LlamaCppLanguageModel, llm: Any, ids: list[int]) -> tuple[Any, Any]:
    import llama_cpp
    import numpy as np

    llm.reset()
    llm.eval(ids)
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    ref = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
    cache = lm.new_cache()
    try:
        return lm.forward_logits(ids, cache, last=1)[0][0].numpy(), ref
    finally:
        lm.release_cache(cache)
