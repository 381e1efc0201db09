"""The llama.cpp backend on the GGUF file the package ships: the LM port end to end: every
lossless method equals ``Llama.generate``'s greedy decoding (quick: 2 prompts; slow: 6) and a
loop that accepts one wrong token fails that; NEST citations are exact slices; the cost curve
and cost-planned drafts; the one switch (``EngineSpec``, CLI, server, LangChain, LlamaIndex
``backend=``) and what it refuses (``lm.llama_cpp.model``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")

from nest_integrations import assembly, paths  # noqa: E402
from nest_integrations.config import NestConfig  # noqa: E402
from nest_integrations.decoding.engine import NestEngine  # noqa: E402
from nest_integrations.index.in_memory_store import InMemoryKeyStore  # noqa: E402
from nest_integrations.lm.default import gguf_path  # noqa: E402
from nest_integrations.lm.llama_cpp import (  # noqa: E402
    DEFAULT_QUANT,
    LlamaCppLanguageModel,
    default_gguf,
    resolve_gguf,
)
from tests.invariants import citations_cover_copied_tokens, cited_text_matches_source  # noqa: E402
from tests.lm.llama_cpp.llama_helpers import (  # noqa: E402
    LABELS,
    N,
    PASSAGES,
    QUESTIONS,
    assert_equals_llama,
    oracle_cases,
)
from tests.oracles import Case, assert_partial, break_verification, run_oracle  # noqa: E402


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
