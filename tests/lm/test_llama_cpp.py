"""The llama.cpp backend (``lm.llama_cpp``) on the GGUF file the package ships.

Oracles, all against llama-cpp-python's own ``Llama`` on the same file (never the code under
test):

- every lossless method (greedy, prompt-lookup, rag-copy, DReSD and REST, chains and trees)
  equals ``Llama.generate`` greedy decoding token for token (quick: 2 prompts; slow: 6), with
  drafts partly accepted and partly rejected; a loop that accepts one wrong token fails it;
- a prefill's logits equal ``Llama``'s prompt processing bit for bit, and the rows of a T-token
  verify equal T one-token steps (also at 2 threads past 256 cached positions, where ggml splits
  a one-token step's attention over threads over an F16 KV cache unless ``exact_steps`` keeps it
  on one; over a BF16 cache on both threads);
- prompts, tokens, offsets and end tokens equal the Hugging Face tokenizer's;
- token trees equal their paths run as chains; NEST citations are exact slices.

Also: the one switch (``EngineSpec``/CLI/LangChain/LlamaIndex ``backend=``), KNN-SSD and foreign
key stores refused with the reason, the cost curve and cost-planned drafts on llama.cpp.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations import assembly, paths  # noqa: E402
from nest_integrations.config import NestConfig  # noqa: E402
from nest_integrations.decoding.engine import NestEngine  # noqa: E402
from nest_integrations.dresd import build_datastore  # noqa: E402
from nest_integrations.index.in_memory_store import InMemoryKeyStore  # noqa: E402
from nest_integrations.lm.default import gguf_path  # noqa: E402
from nest_integrations.lm.llama_cpp import (  # noqa: E402
    DEFAULT_QUANT,
    KNN_SSD_UNSUPPORTED,
    LlamaCppLanguageModel,
    default_gguf,
    resolve_gguf,
)
from nest_integrations.types import Passage  # noqa: E402
from tests.invariants import citations_cover_copied_tokens, cited_text_matches_source  # noqa: E402
from tests.oracles import (  # noqa: E402
    AlteredAnswers, Case, alter, assert_partial, break_verification, chat_text, run_oracle
)

N = 32


# ------------------------------------------------------------------ fixtures: model and oracle


@pytest.fixture(scope="module")
def lm():
    """The embedded model on llama.cpp as it runs by default (Q8_0, made from the shipped
    Q4_1 file), one thread."""
    model = LlamaCppLanguageModel.from_default(threads=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def llama():
    """llama-cpp-python's own ``Llama`` on the same file, as a user runs it with flash attention
    on and one thread: the reference."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(default_gguf()), n_ctx=4096, n_threads=1,
                          n_threads_batch=1, flash_attn=True, verbose=False, seed=0)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The Hugging Face tokenizer of the embedded model (what the torch backend reads)."""
    from transformers import AutoTokenizer

    from nest_integrations.lm.default import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path()))


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


# ------------------------------------------------------------------ the port


def test_text_side_equals_the_hugging_face_tokenizer(lm, hf_tokenizer, llama):
    """Tokens, chat prompts, end tokens and the passage prefix are the torch backend's, except
    where llama.cpp's pre-tokenizer groups whitespace before a digit differently (there they
    are llama-cpp-python's own)."""
    from nest_integrations.lm.hf_text import eos_token_ids, passage_prefix

    tok = hf_tokenizer
    for text in ("a\n\n1", "Total:  12 apples", "x\n 2"):  # the known difference
        assert lm.tokenize(text) == llama.tokenize(text.encode(), add_bos=False)
        assert lm.tokenize(text) != tok(text, add_special_tokens=False)["input_ids"]
    texts = ["Héllo wörld, ça va? 日本語 <|im_end|> x", "  two  spaces\n\nnew\tline",
             "def f(x):\n    return x**2  # 🙂", "Paris, France (1889): 330 m tall."]
    for text in texts:
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert lm.tokenize(text) == ids
        got, off = lm.tokenize_with_offsets(text)
        assert got == ids and off[0, 0] == 0 and off[-1, 1] == len(text)
        assert (off[1:, 0] == off[:-1, 1]).all()  # a tiling
        assert lm.detokenize(ids) == text
        for i in range(len(ids)):  # a token ends where its prefix's complete characters end
            assert text[: off[i, 1]] == lm.detokenize(ids[: i + 1]).rstrip("\ufffd"), (text, i)
        if text.isascii():  # no split characters: exactly the torch backend's offsets
            assert (off == _hf_offsets(tok, text)).all()
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is NEST?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert lm.chat_prompt(msgs) == tok(text, add_special_tokens=False)["input_ids"]
    from transformers import AutoConfig

    from nest_integrations.lm.default import default_model_path

    config = AutoConfig.from_pretrained(str(default_model_path()))
    assert lm.passage_prefix == passage_prefix(tok, config)
    assert lm.eos_token_ids >= {tok.eos_token_id} and lm.eos_token_ids <= set(
        eos_token_ids(type("M", (), {"config": config})(), tok)) | {tok.eos_token_id}
    assert lm.key_source == "final_norm" and lm.key_dim == config.hidden_size
    assert lm.vocab_size == 49152 and lm.quantization == DEFAULT_QUANT


def _hf_offsets(tok: Any, text: str) -> Any:
    """``HFLanguageModel.tokenize_with_offsets`` with this tokenizer (no model needed)."""
    from nest_integrations.lm.hf_text import offsets_from_tokenizer

    return offsets_from_tokenizer(tok, text)[1]


def test_prefill_logits_equal_llama_prompt_processing(lm, llama):
    """``forward(prompt, last=1)`` returns the logits ``Llama.eval`` computes for the prompt's
    last token, bit for bit (long and short prompts: one batch, as Llama processes it)."""
    import llama_cpp
    import numpy as np

    for text in ("The capital of France is", "Paris is the capital of France. " * 40):
        ids = [1] + lm.tokenize(text)
        llama.reset()
        llama.eval(ids)  # the prompt in batches of n_batch, logits of its last token
        ptr = llama_cpp.llama_get_logits_ith(llama.ctx, -1)
        ref = np.ctypeslib.as_array(ptr, shape=(llama.n_vocab(),)).copy()
        cache = lm.new_cache()
        logits, keys = lm.forward(ids, cache, last=1)
        assert logits.shape == (1, lm.vocab_size) and keys.shape == (1, lm.key_dim)
        assert np.array_equal(logits[0].numpy(), ref)
        assert lm.cache_length(cache) == len(ids)
        del cache  # the next prompt is laid out in the KV cache from cell 0, as Llama's


def test_a_prefill_without_keys_equals_one_with_keys(lm):
    """``forward_logits(prompt, last=1)`` (the loop's prefill when nothing reads the keys)
    returns ``forward``'s logits bit for bit and no key rows, and leaves the cache as
    ``forward`` does: the next step's logits and keys are the same bits."""
    ids = [1] + lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 3)
    a, b = lm.new_cache(), lm.new_cache()
    la, ka = lm.forward(ids, a, last=1)
    lb, kb = lm.forward_logits(ids, b, last=1)
    assert kb.shape == (0, lm.key_dim) and ka.shape == (1, lm.key_dim)
    assert torch.equal(la, lb) and lm.cache_length(a) == lm.cache_length(b) == len(ids)
    nxt = int(la[-1].argmax())
    sa, sb = lm.forward([nxt], a), lm.forward([nxt], b)
    assert torch.equal(sa[0], sb[0]) and torch.equal(sa[1], sb[1])
    step = lm.forward_logits([nxt], b)  # a step without keys: the same logits, one position
    assert torch.equal(step[0], lm.forward([nxt], a)[0]) and step[1].shape == (0, lm.key_dim)
    assert lm.cache_length(a) == lm.cache_length(b)


def test_argmax_passes_equal_the_argmax_of_the_logits(lm):
    """``forward_argmax`` (what lossless greedy decoding reads on llama.cpp: no logits copied
    out) returns each row's argmax of the logits ``forward``/``forward_logits`` return for the
    same tokens, the same key rows, and leaves the cache as they do."""
    ids = [1] + lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 3)
    a, b = lm.new_cache(), lm.new_cache()
    la, _ = lm.forward_logits(ids, a, last=1)
    tb, kb = lm.forward_argmax(ids, b, last=1)
    assert tb == [int(la[-1].numpy().argmax())] and kb.shape == (0, lm.key_dim)
    draft = lm.tokenize(" It was built in 1889 for the fair")
    la, ka = lm.forward(draft, a)  # a verify pass with keys: every row
    tb, kb = lm.forward_argmax(draft, b, keys=True)
    assert tb == [int(r) for r in la.numpy().argmax(axis=1)] and len(tb) == len(draft)
    assert torch.equal(ka, kb) and lm.cache_length(a) == lm.cache_length(b)
    none, keys = lm.forward_argmax([], b)
    assert none == [] and keys.shape == (0, lm.key_dim)


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


def test_verify_rows_equal_one_token_steps(lm):
    """The rows of a T-token decode (T up to 33) equal T one-token steps bit for bit, before
    and after 256 cached positions."""
    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris. " * 30)
    for n_ctx in (40, 300):
        for t in (2, 9, 33):
            assert _rows_vs_steps(lm, ids[:n_ctx], ids[n_ctx:n_ctx + t]) == 0.0, (n_ctx, t)


def _steps(lm, prompt: list[int], new: list[int]) -> torch.Tensor:
    """The logits of ``prompt``'s last row and of ``new`` fed one token a step, in a new cache."""
    cache = lm.new_cache()
    out = [lm.forward(prompt, cache, last=1)[0][-1]]
    out += [lm.forward([t], cache)[0][-1] for t in new]
    return torch.stack(out)


def test_a_dead_cache_in_a_cycle_does_not_shift_the_next_sequence(lm):
    """A new cache is laid out from cell 0 as in a fresh context even when a dead cache is
    only collectable by the garbage collector: a sequence laid out after another cache's cells
    gives other logits (measured: up to 1.1 apart over 20 steps, AMD EPYC)."""
    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. " * 6)
    prompt, new = ids[:70], ids[70:90]


    fresh = _steps(lm, prompt, new)
    dead = lm.new_cache()
    lm.forward(ids[:37], dead, last=1)
    dead.cycle = dead  # only the garbage collector frees it
    del dead
    assert torch.equal(_steps(lm, prompt, new), fresh)


def test_a_cache_dropped_after_a_token_tree_gives_back_its_branches(lm):
    """A cache collected right after ``forward_tree`` (no ``select_cache``), as the exactness
    check (``row_exact.check_rows``, run by the first lossless generation in a process whose
    ``$NEST_HOME`` lacks the verdict) leaves its tree cache, gives its branch sequences back
    with its own: the next cache is laid out from cell 0 again. Before, the branch stayed taken
    with 43 cells, every later sequence sat after them and the oracles left ``Llama.generate``'s
    path (issue 35: only in a process that ran the check, e.g. CI's fresh home)."""
    from nest_integrations.lm.row_exact import check_rows

    ids = lm.tokenize("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. " * 6)
    prompt, new = ids[:70], ids[70:90]


    fresh = _steps(lm, prompt, new)
    tree = lm.new_cache()
    lm.forward(ids[:37], tree, last=1)
    lm.forward_tree(ids[37:43], [-1, 0, 1, -1, 3, 4], tree)
    del tree  # collected with its tree: no select_cache
    assert lm.runtime.sequences.live() == 0
    assert torch.equal(_steps(lm, prompt, new), fresh)
    assert check_rows(lm)  # what the verdict measures
    assert lm.runtime.sequences.live() == 0
    assert torch.equal(_steps(lm, prompt, new), fresh)


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

    from nest_integrations.decoding.loop import decode_ids
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


def test_an_unknown_kv_cache_type_is_a_clear_error():
    from nest_integrations.lm.llama_cpp import kv_cache_type

    assert kv_cache_type(None) == "F16" and kv_cache_type("bf16") == "BF16"
    with pytest.raises(ValueError, match="kv_type='Q8_0' is not supported"):
        LlamaCppLanguageModel.from_default(threads=1, kv_type="Q8_0")


@pytest.mark.slow
def test_greedy_at_two_threads_steps_as_llama_does():
    """Greedy decoding with no drafter has no verify rows to match, so its steps run on every
    thread, as ``Llama.generate``'s: at 2 threads, past 256 cached positions, it equals
    ``Llama.generate`` at 2 threads token for token, and its steps used both threads. Prompt
    lookup does too, drafts accepted, its one-token steps on both threads: over the default F16
    cache its verify rows are decoded one at a time there, over a BF16 cache together."""
    import llama_cpp

    from nest_integrations.decoding.loop import decode_ids
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


def llama_generate_n(llm: Any, ids: list[int], n: int) -> list[int]:
    """``Llama.generate`` greedy for exactly ``n`` tokens (no end token stops it)."""
    from benchmarks.harness.systems import llama_generate

    return llama_generate(llm, ids, n, frozenset())[0]


def test_token_tree_rows_and_selected_path_equal_chains(lm):
    """Each root-to-leaf path of a tree decodes as that path alone; after ``select_cache`` the
    cache holds exactly the kept path (the next step equals the chain's)."""
    ctx = lm.tokenize("A wrought-iron lattice tower on the Champ de Mars in Paris, France")
    a, b, c, x, y = lm.tokenize(" It is named after the")[:5]

    def chain(tokens: list[int]) -> tuple[Any, Any, Any]:
        cache = lm.new_cache()
        lm.forward(ctx, cache, last=1)
        logits, keys = lm.forward(tokens, cache)
        return logits, keys, cache

    ids, parents = [a, b, c, x, y], [-1, 0, 1, 0, 3]
    cache = lm.new_cache()
    lm.forward(ctx, cache, last=1)
    logits, keys = lm.forward_tree(ids, parents, cache)
    for path in ([0, 1, 2], [0, 3, 4]):
        ref, ref_keys, ref_cache = chain([ids[i] for i in path])
        assert torch.equal(logits[path], ref) and torch.equal(keys[path], ref_keys)
    with pytest.raises(ValueError, match="token tree"):
        lm.forward([a], cache)
    with pytest.raises(ValueError, match="not a root-to-node path"):
        lm.select_cache(cache, len(ctx), [0, 2])
    lm.select_cache(cache, len(ctx), [0, 3])
    assert lm.cache_length(cache) == len(ctx) + 2
    _, _, ref_cache = chain([a, x])
    assert torch.equal(lm.forward([y], cache)[0], lm.forward([y], ref_cache)[0])


def test_caches_are_sequences_reused_after_collection(lm):
    """Interleaved caches keep their own positions; caches given up return their sequence to
    the pool (more caches over time than the context has sequences)."""
    from nest_integrations.lm.llama_cpp import MAX_SEQUENCES

    p, q = lm.tokenize("One two three four"), lm.tokenize("Alpha beta gamma")
    c1, c2 = lm.new_cache(), lm.new_cache()
    l1, _ = lm.forward(p, c1)
    l2, _ = lm.forward(q, c2)
    assert torch.equal(lm.forward(p, lm.new_cache())[0], l1)
    lm.crop_cache(c1, 2)
    assert torch.equal(lm.forward(p[2:], c1)[0], l1[2:])
    for _ in range(MAX_SEQUENCES + 10):  # each cache is freed when the call returns
        lm.forward(p, lm.new_cache())
    with pytest.raises(ValueError, match="cannot crop"):
        lm.crop_cache(c2, 99)


def test_a_finished_generation_gives_its_cache_back_at_once(lm, monkeypatch):
    """The decode loop releases its cache when decoding ends, even while the loop itself is
    still referenced (a cycle keeps it until collected): no sequence stays live, so the next
    ``new_cache`` has no reason to run ``gc.collect()``; a released cache refuses further use."""
    import gc

    from nest_integrations.config import NestConfig
    from nest_integrations.decoding.loop import DecodeLoop
    from nest_integrations.drafters import get_method
    from nest_integrations.types import NestStats

    ids = lm.tokenize("The Eiffel Tower is in")
    loop = DecodeLoop(lm, get_method("greedy"), None, config=NestConfig(temperature=0.0),
                      prompt_ids=ids, memory=None, passages=[], offsets=[], max_new_tokens=4,
                      stats=NestStats(), generator=None)  # fmt: skip
    loop.itself = loop  # a reference cycle, as an engine's request can make
    assert lm.runtime.sequences.live() == 1
    list(loop.run())
    assert lm.runtime.sequences.live() == 0 and len(loop.output.ids) == 4
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    lm.release_cache(lm.new_cache())
    assert not collected
    with pytest.raises(ValueError, match="released"):
        lm.forward(ids, loop.cache)


def test_a_closed_model_raises_instead_of_crashing():
    """After ``close()`` the llama.cpp context is gone: calls raise, they never reach freed
    memory."""
    closed = LlamaCppLanguageModel.from_default(threads=1)
    cache = closed.new_cache()
    closed.close()
    for call in (lambda: closed.forward([1, 2], cache), lambda: closed.tokenize("x"),
                 closed.new_cache, lambda: closed.detokenize([5])):
        with pytest.raises(RuntimeError, match="was closed"):
            call()


def test_threads_default_to_nest_threads_not_torchs(monkeypatch):
    """Without ``threads=``, llama.cpp runs on ``$NEST_THREADS`` (then on the CLI's
    ``--threads`` once ``configure_threads`` ran), not on torch's thread count, which a script
    that never configured threads leaves at torch's own default."""
    from nest_integrations.lm import backend

    before = torch.get_num_threads()
    monkeypatch.setenv(backend.THREADS_ENV, "1")
    torch.set_num_threads(2)
    try:
        model = LlamaCppLanguageModel.from_default()
        assert model.runtime.threads == 1
        model.close()
        backend.configure_threads(2)  # as `--threads 2` does (tests/conftest.py unsets it)
        model = LlamaCppLanguageModel.from_default()
        assert model.runtime.threads == 2
        model.close()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("source", ["ffn_input", "final_norm"])
def test_keys_are_the_torch_backends_keys_of_the_same_layer(source):
    """Each llama.cpp key source is the torch backend's key of that layer on the same text
    (Q8_0 against fp32 weights: cosine > 0.995 per token, and nearer to its own layer than
    to the other); ``ffn_input`` comes through llama.cpp's eval callback, on every path that
    returns keys (a forward, a prefill's last rows, passages packed in one decode)."""
    from nest_integrations.lm.hf import HFLanguageModel

    text = ("Paris is the capital and most populous city of France, with an estimated "
            "population of two million residents.")
    ours = LlamaCppLanguageModel.from_default(threads=1, key_source=source)
    try:
        assert ours.key_source == source
        ids = ours.tokenize(text)
        _, keys = ours.forward(ids, ours.new_cache())
        _, last = ours.forward(ids, ours.new_cache(), last=3)
        packed = ours.encode_passages([ids[:5], ids])[1]
        _, after_prefix = ours.forward(ours.passage_prefix + ids[:-1], ours.new_cache())
    finally:
        ours.close()
    torch_keys = {}
    for s in ("ffn_input", "final_norm"):
        hf = HFLanguageModel.from_default(dtype="fp32", key_source=s)
        torch_keys[s] = hf.forward(ids, hf.new_cache())[1].float()

    def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)

    other = "final_norm" if source == "ffn_input" else "ffn_input"
    assert keys.shape == (len(ids), ours.key_dim)
    assert cos(keys, torch_keys[source]).min() > 0.995
    assert (cos(keys, torch_keys[source]) > cos(keys, torch_keys[other])).all()
    assert torch.allclose(last, keys[-3:], atol=1e-3)
    n = len(ours.passage_prefix)
    assert torch.allclose(torch.as_tensor(packed), after_prefix[n - 1:], atol=1e-3)


def test_an_unknown_key_source_on_llama_cpp_is_a_clear_error():
    with pytest.raises(ValueError, match="key_source='block_input' is not available"):
        LlamaCppLanguageModel.from_default(threads=1, key_source="block_input")


def test_encode_passages_equals_forward_after_the_prefix(lm):
    """Passage keys (several passages packed in one decode) equal the keys of a forward over
    the passage prefix and the passage, within float noise."""
    texts = ["Paris is the capital of France.", "Belly dance comes from Egypt.", "x"]
    tokens = [lm.tokenize(t) for t in texts] + [[]]
    keys = lm.encode_passages(tokens)
    assert [k.shape for k in keys] == [(len(t), lm.key_dim) for t in tokens]
    for t, k in zip(tokens[:3], keys):
        _, ref = lm.forward(lm.passage_prefix + t[:-1], lm.new_cache())
        start = len(lm.passage_prefix) - 1
        assert torch.allclose(torch.from_numpy(k), ref[start:], atol=1e-3)


# ------------------------------------------------------------------ lossless oracles


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


def test_copy_methods_equal_llama_greedy(lm, llama, hf_tokenizer):
    """greedy, prompt-lookup and rag-copy on llama.cpp equal ``Llama.generate`` token for token
    (2 prompts, 32 tokens), with drafts accepted and rejected."""
    labels = ("greedy", "prompt-lookup", "rag-copy")
    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS[:2], N, None, labels)
    out = run_oracle(NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm")),
                     cases, N, refs)
    assert_equals_llama(out.mismatches)
    assert set(out.mismatches) == set(labels)
    assert out.drafted["greedy"] == 0
    assert out.accepted["prompt-lookup"] > 0 and out.accepted["rag-copy"] > 0


@pytest.mark.slow
def test_every_lossless_method_equals_llama_greedy(lm, llama, hf_tokenizer, tmp_path):
    """6 prompts x 32 tokens: greedy, prompt-lookup, rag-copy, REST and DReSD (chains and token
    trees) on llama.cpp equal ``Llama.generate`` token for token; corpus drafts are partly
    accepted and partly rejected, and trees were verified as trees."""
    from collections import Counter

    trees: Counter = Counter()
    real = LlamaCppLanguageModel.forward_tree

    def counting(self, *a, **kw):
        trees[current[0]] += 1
        return real(self, *a, **kw)

    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS, N, tmp_path / "ds")
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
    current = [""]
    mp = pytest.MonkeyPatch()
    mp.setattr(LlamaCppLanguageModel, "forward_tree", counting)
    try:
        mismatches: dict = {}
        for label in LABELS:
            current[0] = label
            out = run_oracle(engine, [c for c in cases if c.label == label], N, refs)
            mismatches.update({k: v for k, v in out.mismatches.items() if v})
            if label in ("rest", "dresd"):
                assert_partial(out, (label,))
    finally:
        mp.undo()
    assert_equals_llama(mismatches)
    assert trees["rest-tree"] > 0 and trees["dresd-tree"] > 0
    assert trees["rest"] == trees["dresd"] == 0


@pytest.mark.parametrize("label", ("prompt-lookup", "rag-copy", "dresd-tree"))
def test_the_llama_oracle_fails_when_verification_accepts_a_wrong_token(
        lm, llama, hf_tokenizer, tmp_path, monkeypatch, label):
    """Mutation proof: a loop that accepts one wrong draft token per rejected draft leaves
    ``Llama.generate``'s output on llama.cpp too."""
    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS[:2], N, tmp_path / "ds",
                               (label,))
    break_verification(monkeypatch)
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
    out = run_oracle(engine, cases, N, refs)
    assert out.steps[label] > 0
    assert out.mismatches[label], f"{label}: a broken verification still matched Llama"


# ------------------------------------------------------------------ other weight types


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


def test_weights_are_repacked_as_llama_loads_them():
    """Q4_0 has repacked layouts on this build: loaded as ``Llama`` loads it (repacked), a
    prompt's logits equal ``Llama``'s bit for bit; unpacked (as this backend loaded every file
    before) they do not, so its greedy answers could leave a user's llama.cpp's."""
    import numpy as np
    import llama_cpp

    from nest_integrations.lm.llama_cpp import repack_by_default

    assert repack_by_default(llama_cpp)  # the package's builds have no AMX kernels
    lm, llm = _quant_pair("Q4_0")
    plain = LlamaCppLanguageModel.from_gguf(lm.runtime.path, threads=1, repack=False)
    try:
        assert lm.repack and not plain.repack
        ids = [1] + lm.tokenize("Paris is the capital of France. " * 12)
        ours, ref = _prompt_logits(lm, llm, ids)
        assert np.array_equal(ours, ref)
        ours, ref = _prompt_logits(plain, llm, ids)
        assert not np.array_equal(ours, ref)
    finally:
        for m in (lm, plain, llm):
            m.close()


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


# ------------------------------------------------------------------ NEST and the cost model


def test_nest_citations_are_exact_slices_on_llama_cpp(lm):
    """NEST on llama.cpp copies from the passages, and every citation is the exact slice of the
    answer, the passage and the source, covering every attributed token (the paper's config,
    and the default preset as a per-call config)."""
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    passages = PASSAGES[:2]
    engine = NestEngine(lm, InMemoryRetriever(passages), InMemoryKeyStore(),
                        NestConfig(key_source="final_norm", min_citation_tokens=1))
    question = [{"role": "user", "content": "What does the assert statement do?"}]
    res = engine.generate(PASSAGES[0].text[:40], max_new_tokens=24, passages=passages)
    assert res.citations and res.stats.attribution_ratio > 0.5, res.text
    cited_text_matches_source(res, {p.doc_id: p.text for p in passages})
    citations_cover_copied_tokens(res)
    grounded = assembly.engine_config(engine, "grounded")
    assert grounded.key_source == "final_norm"
    res = engine.generate(question, max_new_tokens=48, config=grounded)
    assert res.citations, res.text
    cited_text_matches_source(res, {p.doc_id: p.text for p in passages})


def test_nest_spans_follow_the_cost_curve_on_llama_cpp(lm, monkeypatch):
    """NEST's span length on llama.cpp comes from the cost curve: with a steep curve no pass
    verifies more than one token, yet the copy goes on row by row and is cited exactly; with a
    flat curve spans are verified in multi-token passes."""
    from nest_integrations.decoding.loop import DecodeLoop
    from nest_integrations.retrieval.in_memory import InMemoryRetriever

    widths: list[int] = []
    real = DecodeLoop.forward

    def counting(self, ids, *a, **kw):
        widths.append(len(ids))
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(DecodeLoop, "forward", counting)
    passages = PASSAGES[:2]
    engine = NestEngine(lm, InMemoryRetriever(passages), InMemoryKeyStore(),
                        NestConfig(key_source="final_norm", min_citation_tokens=1))
    widest = {}
    for name, ratios in (("steep", [1.0, 3.0, 5.0, 7.0]), ("flat", [1.0, 1.05, 1.1, 1.15])):
        widths.clear()
        res = engine.generate(PASSAGES[0].text[:40], max_new_tokens=24, passages=passages,
                              drafter_options={"cost_model": ratios})
        assert res.citations and res.stats.attribution_ratio > 0.5, (name, res.text)
        cited_text_matches_source(res, {p.doc_id: p.text for p in passages})
        citations_cover_copied_tokens(res)
        widest[name] = max(widths[1:], default=0)  # widths[0]: the prompt's prefill
    assert widest["steep"] == 1 < widest["flat"], widest


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
    from nest_integrations.lm.backend import torch_on_one_thread
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
        with torch_on_one_thread():  # a second session inside the first
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the stream's session is still open
        stream.close()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_cost_curve_and_planned_drafts_on_llama_cpp(lm, llama, hf_tokenizer, tmp_path,
                                                    monkeypatch):
    """The cost curve of a llama.cpp verify pass is measured and cached per quantisation and
    thread count; with a steep curve (verifying is expensive) the cost planner skips drafts
    that do not pay, with a flat one it drafts, and either way prompt lookup equals greedy."""
    from nest_integrations.lm import cost

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    curve = cost.load_or_measure(lm, tokens=(1, 2, 5), repeats=1, context=40)
    assert curve.meta["dtype"] == f"gguf-{DEFAULT_QUANT}+repack" and curve.meta["threads"] == 1
    assert cost.curve_path(lm).is_file() and f"llama.cpp-{DEFAULT_QUANT}" in str(cost.curve_path(lm))
    assert cost.load_or_measure(lm).to_json() == curve.to_json()  # cached: not measured again
    labels = ("prompt-lookup",)
    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS[:1], N, None, labels)
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
    drafted = {}
    for name, ratios in (("steep", [1.0, 3.0, 5.0, 7.0]), ("flat", [1.0, 1.05, 1.1, 1.15])):
        planned = [Case(c.label, c.prompt, c.ids, c.passages, {"cost_model": ratios})
                   for c in cases]
        out = run_oracle(engine, planned, N, refs)
        assert_equals_llama(out.mismatches)
        drafted[name] = out.drafted["prompt-lookup"]
    assert drafted["steep"] == 0 < drafted["flat"]


@pytest.mark.parametrize("label", ("dresd", "prompt-lookup", "rag-copy"))
def test_drafters_plan_with_the_cached_curve_on_llama_cpp(
        lm, llama, hf_tokenizer, tmp_path, monkeypatch, label):
    """DReSD's, prompt lookup's and rag-copy's ``cost_model`` defaults to the measured curve on
    llama.cpp:
    with a steep cached curve they draft nothing, with a flat one they draft, ``"off"``
    restores fixed-length drafts; the output equals ``Llama``'s greedy decoding every time."""
    from nest_integrations.lm import cost

    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS[:1], N, tmp_path / "ds",
                               (label,))
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
    path = cost.curve_path(lm)
    path.parent.mkdir(parents=True, exist_ok=True)
    drafted, keyed = {}, {}
    decode = lm.runtime.decode
    calls: list[bool] = []

    def spy(*args, **kwargs):  # which decodes returned key rows
        calls.append(bool(kwargs.get("keys")))
        return decode(*args, **kwargs)

    monkeypatch.setattr(lm.runtime, "decode", spy)
    # flat first: the first lossless generation in a fresh home runs the exactness check
    for name, ratios in (("flat", [1.0, 1.05, 1.1, 1.15]), ("steep", [1.0, 3.0, 5.0, 7.0]),
                         ("off", None)):
        calls.clear()
        curve = cost.CostCurve.from_ratios(ratios or [1.0, 3.0, 5.0, 7.0])
        path.write_text(json.dumps(curve.to_json()), encoding="utf-8")
        options = {k: v for k, v in cases[0].options.items() if k != "cost_model"}
        if ratios is None:
            options["cost_model"] = "off"
        case = Case(cases[0].label, cases[0].prompt, cases[0].ids, cases[0].passages, options)
        out = run_oracle(engine, [case], N, refs)
        assert_equals_llama(out.mismatches)
        drafted[name], keyed[name] = out.drafted[label], sum(calls)
    assert drafted["steep"] == 0 < drafted["flat"] and drafted["off"] > 0
    if label == "dresd":  # a drafter that will not draft asks for no keys (llama.cpp: cheaper)
        assert keyed["steep"] == 0 < keyed["flat"]


def test_rag_copy_cites_the_copies_it_did_not_draft(lm, llama, hf_tokenizer, tmp_path,
                                                   monkeypatch):
    """With a curve on which no draft pays, rag-copy on llama.cpp decodes in plain steps, equals
    ``Llama``'s greedy decoding, and still cites what it copied from its passage: every token
    a fixed-length draft would have had accepted (and so cited) is cited, exactly."""
    monkeypatch.setenv("NEST_HOME", str(tmp_path))
    cases, refs = oracle_cases(lm, llama, hf_tokenizer, QUESTIONS[:3], N, None, ("rag-copy",))
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig(key_source="final_norm"))
    cited = accepted = 0
    for case in cases:
        runs = {}
        for name, option in (("plain", [1.0, 2.5, 3.5, 4.5, 5.5]), ("drafts", "off")):
            runs[name] = engine.generate(case.prompt, max_new_tokens=N, decoding="rag-copy",
                                         passages=case.passages,
                                         drafter_options={"cost_model": option})
            assert runs[name].token_ids == refs[tuple(case.ids)], name
            cited_text_matches_source(runs[name])
            citations_cover_copied_tokens(runs[name])
        plain, drafts = runs["plain"], runs["drafts"]
        assert plain.stats.verify_steps == 0
        accepted += drafts.stats.accepted_tokens
        by_draft = {i for i, s in enumerate(drafts.token_sources) if s is not None}
        by_step = {i for i, s in enumerate(plain.token_sources) if s is not None}
        assert by_draft <= by_step, (plain.text, sorted(by_draft - by_step))
        cited += len(plain.citations)
    assert cited > 0 and accepted > 0


# ------------------------------------------------------------------ one switch everywhere


def test_engine_spec_backend_switch_and_refusals():
    """``EngineSpec(backend="llama.cpp")`` takes the preset's key source to final_norm, its
    look-ahead off and its spans to 8 tokens (a multi-token pass costs about a step per token
    there), and refuses what llama.cpp cannot run, naming why."""
    spec = assembly.EngineSpec(backend="llama.cpp")
    assert spec.backend == "llama.cpp" and spec.config.key_source == "final_norm"
    assert spec.config.lookahead == 0 < NestConfig.from_preset("grounded").lookahead
    assert spec.config.max_span == 8 < NestConfig.from_preset("grounded").max_span
    kept = assembly.EngineSpec(backend="llama.cpp", config=NestConfig(max_span=16))
    assert kept.config.max_span == 16  # an explicit span length is the user's
    assert assembly.EngineSpec(backend="llamacpp").backend == "llama.cpp"
    assert assembly.EngineSpec().backend == "torch"
    assert assembly.EngineSpec().config.key_source == "ffn_input"
    assert assembly.EngineSpec().config.lookahead == NestConfig.from_preset("grounded").lookahead
    with pytest.raises(ValueError, match="no API to skip layers"):
        assembly.EngineSpec(backend="llama.cpp", decoding="knn-ssd")
    with pytest.raises(ValueError, match="'block_input' is not available on the llama.cpp"):
        assembly.EngineSpec(backend="llama.cpp", config=NestConfig(key_source="block_input"))
    with pytest.raises(ValueError, match="quantisation"):
        assembly.EngineSpec(backend="llama.cpp", dtype="bf16")
    with pytest.raises(ValueError, match="backend='vllm' is not supported"):
        assembly.EngineSpec(backend="vllm")
    with pytest.raises(ValueError, match="not a GGUF file"):
        assembly.load_model("HuggingFaceTB/SmolLM2-135M-Instruct", backend="llama.cpp")


def test_an_explicit_ffn_input_key_source_is_kept_on_llama_cpp():
    """``key_source="ffn_input"`` asked for on llama.cpp is what the engine's model computes
    (the paper's key, through llama.cpp's eval callback), never silently the backend's
    ``final_norm``; an unset key source (None) is ``final_norm`` there, one model for both."""
    asked = assembly.EngineSpec(backend="llama.cpp", config=NestConfig(key_source="ffn_input"))
    unset = assembly.EngineSpec(backend="llama.cpp")
    named = assembly.EngineSpec(backend="llama.cpp", config=NestConfig(key_source="final_norm"))
    assert NestConfig().key_source is None
    assert (asked.config.key_source, unset.config.key_source) == ("ffn_input", "final_norm")
    lm = assembly.spec_model(asked)
    assert lm.key_source == "ffn_input" and lm.runtime.capture is not None
    assert assembly.spec_model(unset).key_source == "final_norm"
    assert assembly.spec_model(named) is assembly.spec_model(unset)
    engine = assembly.build_engine(asked, lm=lm)
    assert engine.config.key_source == "ffn_input"
    assert engine.check_config(NestConfig()).key_source == "ffn_input"  # unset: the model's


def test_shared_model_and_engine_on_llama_cpp(lm):
    """The assembly loads the embedded model once per process for llama.cpp (as Q8_0, made
    from the shipped Q4_1 file; ``model="Q4_1"`` is that file as it is), and an engine on it
    refuses KNN-SSD per call with the reason."""
    model = assembly.shared_model(backend="llama.cpp")
    assert isinstance(model, LlamaCppLanguageModel) and model.quantization == DEFAULT_QUANT
    assert assembly.shared_model(backend="llama.cpp", key_source="final_norm") is model
    assert assembly.shared_model("q8-0", backend="llama.cpp") is model
    assert resolve_gguf("Q4_1") == (gguf_path(), "SmolLM2-135M-Instruct-Q4_1")
    assert resolve_gguf(None) == (default_gguf(), "SmolLM2-135M-Instruct")
    assert default_gguf().parent == paths.models_dir() / "gguf"
    assert model.fingerprint == lm.fingerprint
    assert f"@llama.cpp-{DEFAULT_QUANT}-" in model.fingerprint
    engine = assembly.build_engine(assembly.EngineSpec(backend="llama.cpp"))
    assert assembly.unwrap(engine.lm) is model
    with pytest.raises(ValueError, match="no API to skip layers"):
        engine.generate("Hello", max_new_tokens=4, decoding="knn-ssd")
    res = engine.generate("The capital of France is", max_new_tokens=6, decoding="greedy")
    assert res.stats.new_tokens == len(res.token_ids) > 0


def test_server_serves_presets_on_llama_cpp(lm):
    """``nest serve --backend llama.cpp``'s server takes the default and a requested preset
    (their key source becomes final_norm) and answers a chat completion."""
    from nest_integrations.server import protocol as P
    from nest_integrations.server.app import Server, ServerSettings, engine_call

    engine = assembly.build_engine(assembly.EngineSpec(backend="llama.cpp"))
    server = Server.start(engine, ServerSettings(decoding="greedy"))
    try:
        assert server.base_config.key_source == "final_norm"
        req = P.GenerationRequest(prompt=[{"role": "user", "content": "Hi"}], preset="paper",
                                  max_tokens=4)
        kwargs, preset, decoding = engine_call(server, req)
        assert preset == "paper" and kwargs["config"].key_source == "final_norm"
        assert engine.generate("Hi", max_new_tokens=4, config=kwargs["config"],
                               decoding=decoding).token_ids
    finally:
        server.gate.close()


def test_a_key_store_of_one_backend_serves_the_other(tmp_path, lm):
    """A key store encoded by the torch backend opens on llama.cpp in a namespace of its own
    (one store, both backends); another llama.cpp model is then refused, naming the
    namespaces present."""
    from nest_integrations.index.base import KeyStoreMismatchError
    from nest_integrations.index.namespaces import list_namespaces
    from nest_integrations.index.store import DiskKeyStore
    from tests.fakes import FakeLM

    torch_like = FakeLM(key_dim=lm.key_dim, key_source="final_norm",
                        name="SmolLM2-135M-Instruct")
    torch_like.fingerprint = "SmolLM2-135M-Instruct@0123456789abcdef"
    DiskKeyStore.open(tmp_path / "keys", torch_like).close()
    with DiskKeyStore.open(tmp_path / "keys", lm) as store:
        assert store.fingerprint == lm.fingerprint and len(store) == 0
    assert {n["fingerprint"] for n in list_namespaces(tmp_path / "keys")} == {
        torch_like.fingerprint, lm.fingerprint}
    other = FakeLM(key_dim=lm.key_dim, key_source="final_norm", name="other")
    other.fingerprint = "other@llama.cpp-Q4_1-0123456789abcdef"
    with pytest.raises(KeyStoreMismatchError, match=r"torch backend.*llama.cpp backend"):
        DiskKeyStore.open(tmp_path / "keys", other)


def test_framework_adapters_take_the_backend(lm):
    """LangChain ``ChatNest(backend=...)`` and LlamaIndex ``NestLLM(backend=...)`` decode on
    llama.cpp (a preset given per call works there too); bad values fail at construction."""
    from nest_integrations.integrations.langchain import ChatNest
    from nest_integrations.integrations.llama_index import NestLLM

    chat = ChatNest(backend="llama.cpp", decoding="greedy", max_tokens=5)
    msg = chat.invoke("The capital of France is")
    assert msg.content and chat.nest_config.key_source == "final_norm"
    assert isinstance(assembly.unwrap(chat.get_engine().lm), LlamaCppLanguageModel)
    llm = NestLLM(backend="llama.cpp", decoding="greedy", max_new_tokens=5)
    assert llm.complete("The capital of France is", config="grounded").text
    assert isinstance(assembly.unwrap(llm.engine.lm), LlamaCppLanguageModel)
    with pytest.raises(ValueError, match="backend="):
        ChatNest(backend="onnx")
    with pytest.raises(ValueError, match="no API to skip layers"):
        NestLLM(backend="llama.cpp", decoding="knn-ssd")


def test_cli_ingest_and_ask_on_llama_cpp(tmp_path, capsys):
    """``nest ingest --backend llama.cpp`` encodes keys with the GGUF model and ``nest ask
    --backend llama.cpp`` answers from them; asked on torch, the same store answers too (its
    keys get a namespace of their own: ``tests/index/test_one_store.py``)."""
    from nest_integrations.cli import main
    from nest_integrations.lm import backend

    doc = tmp_path / "docs" / "assert.txt"
    doc.parent.mkdir()
    doc.write_text(PASSAGES[0].text + "\n\n" + PASSAGES[1].text, encoding="utf-8")
    store = str(tmp_path / "store")
    try:
        assert main(["ingest", str(doc.parent), "--persist-dir", store,
                     "--backend", "llama.cpp"]) == 0
        capsys.readouterr()
        assert main(["ask", "What does the assert statement do?", "--persist-dir", store,
                     "--backend", "llama.cpp", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["text"] and result["stats"]["new_tokens"] > 0
        backend.set_default_backend(None)
        assert main(["ask", "What does the assert statement do?", "--persist-dir", store,
                     "--dtype", "fp32", "--max-new-tokens", "8"]) == 0
    finally:
        backend.set_default_backend(None)
