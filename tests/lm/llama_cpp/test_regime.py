"""The llama.cpp backend on the GGUF file the package ships: the exact/fast thread regime: two
threads past 256 positions, steps on every thread while the cache is short, greedy at two
threads as ``Llama``'s, rows one at a time where a GGUF's rows are not steps, NEST's curve of
its own steps, torch on one thread while llama.cpp decodes (``lm.llama_cpp.regime``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations.config import NestConfig  # noqa: E402
from nest_integrations.decoding.engine import NestEngine  # noqa: E402
from nest_integrations.index.in_memory_store import InMemoryKeyStore  # noqa: E402
from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel, default_gguf  # noqa: E402
from tests.lm.llama_cpp.llama_helpers import (  # noqa: E402
    N,
    PASSAGES,
    QUESTIONS,
    _quant_pair,
    _rows_vs_steps,
    assert_equals_llama,
    llama_generate_n,
    oracle_cases,
)
from tests.oracles import run_oracle  # noqa: E402


@pytest.mark.slow
def test_two_threads_need_exact_steps_past_256_positions():
    """At 2 threads a one-token step past 256 cached positions splits its attention over the
    threads (ggml's split-KV flash attention, F16 and F32 caches only) and rounds differently
    from a verify row decoded with others. Exact decoding (the default) keeps the steps on both
    threads, as ``Llama``'s, and decodes the verify rows one at a time there; without
    ``steps_as_llama`` the steps run on one thread and rows decoded together equal them. With a
    BF16 KV cache the steps run on both threads and rows decoded together equal them."""
    lm2 = LlamaCppLanguageModel.from_default(threads=2)
    bf16 = LlamaCppLanguageModel.from_default(threads=2, kv_type="bf16")
    try:
        ids = lm2.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 30)
        context, new = ids[:300], ids[300:309]
        assert lm2.runtime.kv_type == "F16" and lm2.runtime.regime.exact_steps
        assert lm2.runtime.regime.steps_as_llama and lm2.rows_split_now
        assert _rows_vs_steps(lm2, context, new) == 0.0
        assert lm2.runtime.regime.current_step_threads == 2
        lm2.runtime.regime.steps_as_llama = False
        assert _rows_vs_steps(lm2, context, new) == 0.0
        assert lm2.runtime.regime.current_step_threads == 1
        lm2.runtime.regime.steps_as_llama = True
        with lm2.inexact_rows():  # what relaxed decoding gets: every thread, rows together
            assert _rows_vs_steps(lm2, context, new) > 0.0
        assert _rows_vs_steps(lm2, ids[:40], ids[40:49]) == 0.0
        assert bf16.runtime.kv_type == "BF16"
        assert _rows_vs_steps(bf16, context, new) == 0.0
        assert bf16.runtime.regime.current_step_threads == 2  # the steps ran on both threads
    finally:
        lm2.close()
        bf16.close()


@pytest.mark.slow
def test_exact_steps_run_on_every_thread_while_the_cache_is_short(tmp_path, monkeypatch):
    """ggml splits a one-token step's attention over threads only when the KV view spans 512
    cells, and llama.cpp pads the view to 256: so over an F16 cache at 2 threads an exact step
    runs on both threads while no cell past the 256th is in use, and on one thread past it.
    The runtime keeps an upper bound of the cells in use: exact at the boundary, lowered when
    the one sequence laid out from cell 0 is cropped (and by a scratch decode of keys that
    leaves the layout as it was), only raised when another sequence holds cells. Rows equal
    steps on both sides of the boundary; prompt lookup with drafts accepted on a short prompt
    equals ``Llama.generate`` at 2 threads, steps on both threads; a drafter's planner takes
    the curve of the regime its next step runs in."""
    import llama_cpp

    from nest_integrations.decoding.plain import decode_ids
    from nest_integrations.drafters import get_method
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.lm import cost
    from nest_integrations.types import NestStats

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    lm2 = LlamaCppLanguageModel.from_default(threads=2)
    llm2 = llama_cpp.Llama(model_path=str(default_gguf()), n_ctx=4096, n_threads=2,
                           n_threads_batch=2, flash_attn=True, verbose=False, seed=0)
    rt = lm2.runtime
    try:
        ids = lm2.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 30)
        for n_ctx, t, threads in ((40, 9, 2), (223, 33, 2), (240, 17, 1)):
            rt.regime.steps_as_llama = False  # steps on one thread past the boundary, rows together
            assert _rows_vs_steps(lm2, ids[:n_ctx], ids[n_ctx:n_ctx + t]) == 0.0, (n_ctx, t)
            assert rt.regime.current_step_threads == threads, (n_ctx, t)  # the last step's
            rt.regime.steps_as_llama = True  # the default: steps on both threads, rows 1 by 1
            assert _rows_vs_steps(lm2, ids[:n_ctx], ids[n_ctx:n_ctx + t]) == 0.0, (n_ctx, t)
            assert rt.regime.current_step_threads == 2, (n_ctx, t)
        cache = lm2.new_cache()
        lm2.forward(ids[:300], cache, last=1)
        assert lm2.steps_on_every_thread() is False
        lm2.crop_cache(cache, 100)  # the tail's cells are free again
        assert rt.sequences.cells_bound == 100 and lm2.steps_on_every_thread()
        lm2.forward(ids[100:105], cache, last=2)  # keys of the last 2 rows: a scratch decode
        assert rt.sequences.cells_bound == 105 and lm2.steps_on_every_thread()
        other = lm2.new_cache()  # laid out after the first cache's cells
        lm2.forward_logits(ids[:200], other, last=1)
        assert rt.sequences.cells_bound == 305 and not lm2.steps_on_every_thread()
        lm2.crop_cache(other, 0)
        assert rt.sequences.cells_bound == 305  # not the sole sequence: the bound stays
        del cache, other
        with lm2.inexact_rows():
            assert lm2.steps_on_every_thread()

        # lossless drafting on a short prompt: both threads, equal to Llama.generate's steps
        prompt = [1] + lm2.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. "
                                    "It was named after the engineer Gustave Eiffel. " * 4)
        assert len(prompt) + N <= 256
        method, stats = get_method("prompt-lookup"), NestStats()
        drafter = method.make_drafter(DrafterContext(
            lm2, NestConfig(), prompt, [], stats=stats, options={"cost_model": "off"}))
        out, st = decode_ids(lm2, method, prompt, N, eos=frozenset(), drafter=drafter,
                             stats=stats)
        assert st.accepted_tokens > 0 and rt.regime.current_step_threads == 2
        assert out == llama_generate_n(llm2, prompt, N)

        # the planner's two curves: steps on every thread while the cache is short
        assert lm2.step_regimes and lm2.exact_curve_context > 256
        exact = cost.curve_path(lm2)
        with lm2.inexact_rows():
            fast = cost.curve_path(lm2)
        for path, ratios in ((exact, [1.0, 1.2, 1.4, 1.6]), (fast, [1.0, 3.0, 5.0, 7.0])):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cost.CostCurve.from_ratios(ratios).to_json()),
                            encoding="utf-8")
        planner = cost.planner_for("auto", lm2, 3)
        planner.observe(40, 40)  # acceptance near 1: a draft pays on the flat curve only
        cache = lm2.new_cache()
        lm2.forward(ids[:40], cache, last=1)
        assert planner.length() == 0
        lm2.forward(ids[40:300], cache, last=1)
        assert planner.length() == 3
        del cache
    finally:
        lm2.close()
        llm2.close()


@pytest.mark.slow
def test_greedy_at_two_threads_steps_as_llama_does():
    """Greedy decoding with no drafter has no verify rows to match, so its steps run on every
    thread, as ``Llama.generate``'s: at 2 threads, past 256 cached positions, it equals
    ``Llama.generate`` at 2 threads token for token, and its steps used both threads. Prompt
    lookup does too, drafts accepted, its one-token steps on both threads: over the default F16
    cache its verify rows are decoded one at a time there, over a BF16 cache together."""
    import llama_cpp

    from nest_integrations.decoding.plain import decode_ids
    from nest_integrations.drafters import get_method
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.lm.llama_cpp import KV_TYPES
    from nest_integrations.types import NestStats

    ids = None
    for kv in ("F16", "BF16"):
        lm2 = LlamaCppLanguageModel.from_default(threads=2, kv_type=kv)
        llm2 = llama_cpp.Llama(model_path=str(default_gguf()), n_ctx=4096, n_threads=2,
                               n_threads_batch=2, flash_attn=True, verbose=False, seed=0,
                               type_k=KV_TYPES[kv], type_v=KV_TYPES[kv])
        try:
            ids = ids or [1] + lm2.tokenize("The Eiffel Tower is a wrought-iron lattice tower in "
                                            "Paris. It was named after the engineer Gustave "
                                            "Eiffel. " * 14)
            assert len(ids) > 256
            out, _ = decode_ids(lm2, get_method("greedy"), ids, N, eos=frozenset())
            assert lm2.runtime.regime.current_step_threads == 2  # the last step ran on both threads
            assert out == llama_generate_n(llm2, ids, N), kv
            assert lm2.runtime.regime.exact_steps  # restored for lossless methods
            method, stats = get_method("prompt-lookup"), NestStats()
            drafter = method.make_drafter(DrafterContext(
                lm2, NestConfig(), ids, [], stats=stats, options={"cost_model": "off"}))
            pl, st = decode_ids(lm2, method, ids, N, eos=frozenset(), drafter=drafter,
                                stats=stats)
            assert st.accepted_tokens > 0 and lm2.runtime.regime.current_step_threads == 2
            assert pl == out, kv
            assert lm2.rows_split_now == (kv == "F16")
        finally:
            lm2.close()
            llm2.close()


@pytest.mark.slow
def test_a_gguf_whose_rows_are_not_steps_verifies_them_one_at_a_time(hf_tokenizer):
    """IQ4_NL's multi-row kernels round otherwise than its one-token steps (on this build, as
    Q4_K_M's): the model finds that, decodes exact verify rows one at a time, and its lossless
    methods equal ``Llama.generate`` token for token, drafts accepted and rejected. Decoding the
    rows together instead leaves ``Llama``'s output (the check is what keeps them lossless)."""
    lm, llm = _quant_pair("IQ4_NL")
    try:
        ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 8)
        with lm.inexact_rows():  # rows decoded together (one thread: steps as outside it)
            assert _rows_vs_steps(lm, ids[:40], ids[40:49]) > 0, \
                "IQ4_NL's rows now equal its steps here: test another weight type"
        assert lm.rows_one_at_a_time and lm.exact_rows and lm.rows_split_now
        assert _rows_vs_steps(lm, ids[:40], ids[40:49]) == 0.0
        labels = ("greedy", "prompt-lookup", "rag-copy")
        cases, refs = oracle_cases(lm, llm, hf_tokenizer, QUESTIONS, 48, None, labels)
        engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
        out = run_oracle(engine, cases, 48, refs)
        assert_equals_llama(out.mismatches)
        assert out.accepted["prompt-lookup"] > 0 and out.accepted["rag-copy"] > 0
        assert out.drafted["prompt-lookup"] > out.accepted["prompt-lookup"]  # rejections too
        lm.regime.rows_exact = True  # the rows decoded together, as before the check
        out = run_oracle(engine, [c for c in cases if c.label != "greedy"], 48, refs)
        assert any(out.mismatches.values()), "rows decoded together still matched Llama"
    finally:
        lm.close()
        llm.close()


@pytest.mark.slow
def test_nest_plans_with_the_curve_of_its_own_steps_at_two_threads(tmp_path, monkeypatch):
    """At 2 threads over an F16 cache, exact one-token steps run on one thread and NEST's
    (relaxed, inside ``inexact_rows``) on both, so their cost curves are cached apart, and
    NEST's drafter plans with the one of its own steps; strict acceptance keeps the exact one."""
    from nest_integrations.drafters.base import DrafterContext
    from nest_integrations.drafters.nest import NestDrafter
    from nest_integrations.lm import cost

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    lm2 = LlamaCppLanguageModel.from_default(threads=2)
    try:
        exact = cost.curve_path(lm2)
        with lm2.inexact_rows():
            inexact = cost.curve_path(lm2)
        assert exact != inexact and "inexact" in inexact.name
        for path, ratios in ((exact, [1.0, 1.05, 1.1, 1.15]), (inexact, [1.0, 3.0, 5.0, 7.0])):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cost.CostCurve.from_ratios(ratios).to_json()),
                            encoding="utf-8")
        relaxed = NestDrafter(DrafterContext(lm2, NestConfig(key_source="final_norm"), [], []))
        assert relaxed.planner.curve.ratio(2) == pytest.approx(3.0)
        strict = NestDrafter(DrafterContext(
            lm2, NestConfig(key_source="final_norm", strict_acceptance=True), [], []))
        assert strict.planner.curve.ratio(2) == pytest.approx(1.05)
        assert lm2.runtime.regime.exact_steps  # the drafter's measurement context was left
    finally:
        lm2.close()


def test_torch_runs_on_one_thread_while_llama_cpp_decodes(lm, monkeypatch):
    """A generation on llama.cpp runs torch's ops on one thread (its idle workers spun on the
    cores llama.cpp's threads use: the default engine at 2 threads ran 42-45 tok/s with torch
    on 2 threads, 51-57 on one), and gives torch its thread count back after, also when a
    stream is closed early; nested sessions share it."""
    from nest_integrations.decoding.loop import DecodeLoop
    from nest_integrations.lm.threads import TORCH_THREADS
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    seen: list[int] = []
    real = DecodeLoop.forward

    def recording(self, ids, *a, **kw):
        seen.append(torch.get_num_threads())
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(DecodeLoop, "forward", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = NestEngine(lm, InMemoryRetriever(PASSAGES[:2]), InMemoryKeyStore(),
                            NestConfig(key_source="final_norm"))
        engine.generate(PASSAGES[0].text[:40], max_new_tokens=6, passages=PASSAGES[:2])
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
        stream = engine.stream(PASSAGES[1].text[:40], max_new_tokens=6, passages=PASSAGES[:2])
        next(stream)
        with TORCH_THREADS.on_one_thread():  # a second session inside the first
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the stream's session is still open
        stream.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
