"""The assembly module: every entry point resolves the same defaults (checked through
``nest_integrations.assembly``, never by repeating constants), the model cache loads once, model
calls are serialised, ``decoding=`` and hybrid retrieval reach the engine. FakeLM only: fast."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nest_integrations import assembly, cli
from nest_integrations.cli.ask import ask_spec
from nest_integrations.assembly import NestEngine
from tests.engines import make_engine
from nest_integrations.ingest.pipeline import IngestPipeline
from nest_integrations.integrations.langchain import ChatNest
from nest_integrations.integrations.langchain import NestLLM as LangChainLLM
from nest_integrations.integrations.llama_index import NestLLM as LlamaIndexLLM
from nest_integrations.retrieval.chroma import ChromaPassageStore
from tests.fakes import FakeLM

TEXTS = [
    "The lighthouse stands on the rocks south of the headland and guides ships at night.",
    "Owls hunt at night with silent feathers and sharp ears.",
]


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> FakeLM:
    """``shared_model`` returns one FakeLM (whatever the model name)."""
    lm = FakeLM()
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: lm)
    return lm


@pytest.fixture
def store_dir(tmp_path: Path, fake_model: FakeLM) -> Path:
    """A persist dir whose default collection holds TEXTS, with FakeLM keys."""
    store = ChromaPassageStore.from_persist_dir(tmp_path, assembly.DEFAULT_COLLECTION)
    IngestPipeline(store, fake_model).ingest(texts=TEXTS, ids=["light", "owls"])
    return tmp_path


# ---------------------------------------------------------------------------------- defaults


def test_cli_parser_defaults_are_the_assembly_defaults() -> None:
    """`nest ask`/`ingest` defaults, and `nest ask`'s spec, come from the assembly."""
    parser = cli.build_parser()
    args = parser.parse_args(["ask", "q"])
    assert args.collection == assembly.DEFAULT_COLLECTION
    assert args.max_new_tokens == assembly.DEFAULT_MAX_NEW_TOKENS
    assert args.decoding == assembly.DEFAULT_DECODING
    assert args.preset == assembly.DEFAULT_PRESET
    assert ask_spec(args) == assembly.EngineSpec.for_store()
    assert parser.parse_args(["ingest", "x"]).collection == assembly.DEFAULT_COLLECTION
    assert parser.parse_args(["info"]).collection is None  # info lists every collection
    from nest_integrations.drafters import METHODS

    decoding = [a for a in cli.build_parser()._subparsers._group_actions[0].choices["ask"]._actions
                if a.dest == "decoding"][0]
    assert sorted(decoding.choices) == sorted(METHODS)


def test_from_defaults_and_nest_ask_build_the_same_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NestEngine.from_defaults()`` and a bare `nest ask` ask the assembly for one spec."""
    built: list[assembly.EngineSpec] = []
    monkeypatch.setattr(assembly, "build_engine", lambda spec=None, **kw: built.append(spec))
    NestEngine.from_defaults()
    NestEngine.from_defaults(persist_dir="/tmp/x", decoding="greedy", hybrid=True)
    assert built[0] == assembly.EngineSpec.for_store()
    assert built[0].store_collection == assembly.DEFAULT_COLLECTION and built[0].opens_store
    assert built[1] == ask_spec(cli.build_parser().parse_args(
        ["ask", "q", "--persist-dir", "/tmp/x", "--decoding", "greedy", "--hybrid"]))


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"persist_dir": "/tmp/store"},
        {"collection": "docs", "config": "paper-ra", "decoding": "prompt-lookup"},
        {"chroma_url": "http://localhost:8000", "hybrid": True, "device": "cpu"},
    ],
)
def test_both_adapters_resolve_the_same_spec(params: dict) -> None:
    """LangChain ChatNest/NestLLM and LlamaIndex NestLLM turn the same parameters into the same
    ``EngineSpec`` (a bare one: no corpus), and the same default token budget."""
    specs = [cls(**params).engine_spec() for cls in (ChatNest, LangChainLLM, LlamaIndexLLM)]
    assert specs[0] == specs[1] == specs[2] == assembly.EngineSpec(**params)
    assert specs[0].opens_store == bool(params)
    assert (
        ChatNest(**params)._engine_kwargs(None, {})["max_new_tokens"]
        == LlamaIndexLLM(**params)._options({})["max_new_tokens"]
        == assembly.DEFAULT_MAX_NEW_TOKENS
    )


def test_query_engine_forwards_decoding() -> None:
    """``NestQueryEngine.from_args(..., decoding=)`` reaches its NestLLM's spec (no load)."""
    from nest_integrations.llama_index import NestQueryEngine

    qe = NestQueryEngine.from_args(None, decoding="prompt-lookup", persist_dir="/tmp/s")
    assert qe.llm._engine is None
    assert qe.llm.engine_spec() == ChatNest(decoding="prompt-lookup",
                                             persist_dir="/tmp/s").engine_spec()


def test_spec_resolution() -> None:
    """Presets, hybrid and decoding are resolved once; bad values fail clearly."""
    spec = assembly.EngineSpec()
    assert spec.config == assembly.backend_config(  # the preset, its key source the backend's
        assembly.resolve_config(assembly.DEFAULT_PRESET), spec.backend)
    assert spec.decoding == assembly.DEFAULT_DECODING and not spec.opens_store
    assert assembly.EngineSpec(hybrid=True).config.hybrid_retrieval
    assert assembly.EngineSpec(config=spec.config.replace(hybrid_retrieval=True)).hybrid
    assert assembly.resolve_max_new_tokens(None, 7) == 7
    assert assembly.resolve_max_new_tokens() == assembly.DEFAULT_MAX_NEW_TOKENS
    with pytest.raises(ValueError, match=">= 1"):
        assembly.resolve_max_new_tokens(0)
    with pytest.raises(ValueError, match="preset"):
        assembly.EngineSpec(config="no-such-preset")
    with pytest.raises(ValueError, match="retriever="):
        LlamaIndexLLM(retriever=object(), collection="x")


# ---------------------------------------------------------------------------------- building


def test_bare_adapters_have_no_corpus_store_params_open_the_default(
    store_dir: Path, fake_model: FakeLM
) -> None:
    """No source: no retriever, keys in memory. A persist dir alone: the default collection,
    keys on disk. The same for both frameworks."""
    from nest_integrations.index.store import DiskKeyStore

    for engine in (ChatNest().get_engine(), LlamaIndexLLM().engine):
        assert engine.retriever is None
        assert assembly.unwrap(engine.lm) is fake_model
    for engine in (ChatNest(persist_dir=str(store_dir)).get_engine(),
                   LlamaIndexLLM(persist_dir=str(store_dir)).engine):
        assert engine.retriever.collection_name == assembly.DEFAULT_COLLECTION
        assert isinstance(engine.key_store, DiskKeyStore)
        assert engine.key_store.path == store_dir / "keys"


def test_missing_collection_fails_when_built(tmp_path: Path, fake_model: FakeLM) -> None:
    from nest_integrations.retrieval.chroma import CollectionNotFoundError

    with pytest.raises(CollectionNotFoundError, match="'absent'"):
        ChatNest(collection="absent", persist_dir=str(tmp_path)).get_engine()


def test_decoding_reaches_the_engine(store_dir: Path, fake_model: FakeLM) -> None:
    """``decoding=`` set on an adapter or per call reaches the engine; lossless methods equal
    greedy decoding and make no copy citations; unknown names fail in the engine."""
    common = {"persist_dir": str(store_dir), "max_tokens": 12}
    prompt = "The lighthouse stands on the rocks"
    assert ChatNest(decoding="greedy", **common).get_engine().decoding == "greedy"
    assert LlamaIndexLLM(decoding="prompt-lookup", persist_dir=str(store_dir)).engine.decoding == (
        "prompt-lookup")
    greedy = LangChainLLM(decoding="greedy", **common).invoke(prompt)
    lookup = LangChainLLM(decoding="prompt-lookup", **common)
    assert lookup.invoke(prompt) == greedy
    result = lookup.generate([prompt]).generations[0][0].generation_info
    assert all(c["extras"]["kind"] != "copy" for c in result["citations"])
    nest = LangChainLLM(**common)
    assert nest.invoke(prompt, decoding="greedy") == greedy  # per call
    with pytest.raises(ValueError, match="decoding"):
        ChatNest(decoding="no-such-method", **common).get_engine()


def test_hybrid_retrieval_is_wired(store_dir: Path, fake_model: FakeLM) -> None:
    """``hybrid`` (or ``config.hybrid_retrieval``) fuses BM25 over the collection with dense."""
    from nest_integrations.retrieval.hybrid import HybridRetriever

    engine = assembly.build_engine(assembly.EngineSpec.for_store(persist_dir=str(store_dir),
                                                                 hybrid=True))
    assert isinstance(engine.retriever, HybridRetriever) and engine.config.hybrid_retrieval
    hits = engine.retrieve("owls silent feathers", 1)
    assert hits[0].doc_id == "owls" and "sparse_score" in hits[0].metadata
    with pytest.raises(ValueError, match="cannot list its passages"):
        assembly.build_engine(assembly.EngineSpec(hybrid=True), retriever=_NoListing())


class _NoListing:
    def retrieve(self, query: str, k: int) -> list:
        return []


# ---------------------------------------------------------------------------------- models


def test_shared_model_loads_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads asking at once get one model per key; another key loads another."""
    loads: list[tuple] = []

    def slow_load(model, device, key_source, backend=None):  # noqa: ANN001
        loads.append((model, device, key_source))
        time.sleep(0.05)
        return FakeLM(name=str(model))

    monkeypatch.setattr(assembly, "load_model", slow_load)
    assembly.clear_model_cache()
    try:
        got: list[object] = []
        threads = [threading.Thread(target=lambda: got.append(assembly.shared_model("m")))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(loads) == 1 and all(m is got[0] for m in got)
        assert assembly.shared_model("m", key_source="block_input") is not got[0]
        assert len(loads) == 2
    finally:
        assembly.clear_model_cache()


class _Counting:
    """A model whose ``forward`` records how many calls overlap."""

    def __init__(self) -> None:
        self.active = self.peak = 0
        self.key_source = "ffn_input"

    def forward(self, x: int) -> int:
        self.active += 1
        self.peak = max(self.peak, self.active)
        time.sleep(0.01)
        self.active -= 1
        return x


def _peak(lms: list) -> int:
    threads = [threading.Thread(target=lambda lm=lm: [lm.forward(i) for i in range(5)])
               for lm in lms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lms[0].peak if not isinstance(lms[0], assembly.SerializedLM) else lms[0].wrapped.peak


def test_model_calls_are_serialised_per_model() -> None:
    """Wrappers of one model share a lock: calls never overlap (unwrapped they do)."""
    raw = _Counting()
    assert _peak([raw, raw, raw, raw]) > 1  # the check can fail
    model = _Counting()
    wrappers = [assembly.serialized(model) for _ in range(4)]
    assert _peak(wrappers) == 1
    assert assembly.serialized(wrappers[0]) is wrappers[0]  # idempotent
    assert wrappers[0].key_source == "ffn_input" and assembly.unwrap(wrappers[0]) is model


def test_adapters_serialise_given_engines_too() -> None:
    """``engine=`` is shared with its model wrapped; the user's engine is left as it is."""
    engine = make_engine(FakeLM())
    for adapter_engine in (ChatNest(engine=engine).get_engine(),
                           LlamaIndexLLM(engine=engine).engine,
                           assembly.share_engine(engine)):
        assert isinstance(adapter_engine.lm, assembly.SerializedLM)
        assert adapter_engine is not engine and not isinstance(engine.lm, assembly.SerializedLM)


def test_stored_calibration_is_used_by_default_for_completion_configs(
    store_dir: Path, fake_model: FakeLM
) -> None:
    """`nest calibrate`'s result reaches the engine by default (paper preset), not for RA
    configs unless asked, and never with calibrated=False."""
    from nest_integrations.calibrate import save_calibration

    overrides = {"knn_temperature": 2.5, "rrc_offset": 0.2, "rrc_scale": 0.05}
    save_calibration(str(store_dir), assembly.DEFAULT_COLLECTION, fake_model,
                     {"overrides": overrides})
    spec = assembly.EngineSpec.for_store(persist_dir=str(store_dir), config="paper")
    cfg = assembly.build_engine(spec).config
    assert (cfg.knn_temperature, cfg.rrc_offset, cfg.rrc_scale) == (2.5, 0.2, 0.05)
    off = assembly.build_engine(assembly.EngineSpec.for_store(
        persist_dir=str(store_dir), config="paper", calibrated=False)).config
    assert off.knn_temperature is None and off.rrc_offset == 0.3
    ra = assembly.build_engine(assembly.EngineSpec.for_store(persist_dir=str(store_dir),
                                                             config="grounded")).config
    assert ra.knn_temperature == 0.25  # the preset's own mu, not the calibration's
    ra_on = assembly.build_engine(assembly.EngineSpec.for_store(
        persist_dir=str(store_dir), config="grounded", calibrated=True)).config
    assert ra_on.knn_temperature == 2.5 and ra_on.span_passages == 1


# ---------------------------------------------------------------------------------- one spec


class _Built(BaseException):
    """Stops an entry point at the assembly boundary (a BaseException: the CLI's error
    handler lets it through)."""


def test_every_entry_point_resolves_the_same_spec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``from_defaults`` (both names), ``ChatNest``/LlamaIndex ``NestLLM`` over the default
    collection, `nest ask`, `nest serve` and the DReSD and KNN-SSD CLIs ask the assembly for one
    spec: the same model, config (preset), decoding and persist dir; the same token budget."""
    import inspect

    import nest_integrations
    from nest_integrations.cli import serve as serve_cli
    from nest_integrations.server import protocol
    from nest_integrations.server.app import ServerSettings

    specs: dict[str, assembly.EngineSpec] = {}
    models: dict[str, assembly.EngineSpec] = {}
    where = ["?"]

    def build(spec: assembly.EngineSpec | None = None, **kw: object) -> None:
        specs[where[0]] = spec
        raise _Built

    def model(spec: assembly.EngineSpec) -> None:
        models[where[0]] = spec
        raise _Built

    monkeypatch.setattr(assembly, "build_engine", build)
    monkeypatch.setattr(assembly, "spec_model", model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    entry_points = {
        "nest_integrations.from_defaults": lambda: nest_integrations.from_defaults(),
        "NestEngine.from_defaults": lambda: nest_integrations.NestEngine.from_defaults(),
        "ChatNest": lambda: ChatNest(collection=assembly.DEFAULT_COLLECTION).get_engine(),
        "langchain NestLLM": lambda: LangChainLLM(
            collection=assembly.DEFAULT_COLLECTION).get_engine(),
        "llama_index NestLLM": lambda: LlamaIndexLLM(collection=assembly.DEFAULT_COLLECTION).engine,
        "nest ask": lambda: cli.main(["ask", "q"]),
        "nest serve": lambda: cli.main(["serve"]),
        "nest dresd": lambda: cli.main(["dresd", "build", "--from-prompts", str(prompts),
                                        "--out", str(tmp_path / "ds")]),
        "nest knn-ssd": lambda: cli.main(["knn-ssd", "show"]),
    }
    pytest.importorskip("uvicorn")  # `nest serve` needs it before it builds the engine
    for name, call in entry_points.items():
        where[0] = name
        with pytest.raises(_Built):
            call()
    want = assembly.EngineSpec.for_store()
    assert specs == {name: want for name in list(entry_points)[:7]}
    # the CLIs that build datastores and profiles load the model of that spec
    assert set(models) == {"nest dresd", "nest knn-ssd"}
    for spec in models.values():
        assert (spec.model, spec.device, spec.config, spec.decoding) == (
            want.model, want.device, want.config, want.decoding)
        assert assembly.persist_root(spec.persist_dir) == assembly.persist_root(want.persist_dir)
    assert want.config == assembly.backend_config(
        assembly.resolve_config(assembly.DEFAULT_PRESET), want.backend)
    assert want.decoding == assembly.DEFAULT_DECODING

    # one token budget: the engine's default, both adapters, `nest ask`, the server
    serve_args = cli.build_parser().parse_args(["serve"])
    budgets = {
        "NestEngine.generate": inspect.signature(
            nest_integrations.NestEngine.generate).parameters["max_new_tokens"].default,
        "NestEngine.stream": inspect.signature(
            nest_integrations.NestEngine.stream).parameters["max_new_tokens"].default,
        "ChatNest": ChatNest()._engine_kwargs(None, {})["max_new_tokens"],
        "llama_index NestLLM": LlamaIndexLLM()._options({})["max_new_tokens"],
        "nest ask": cli.build_parser().parse_args(["ask", "q"]).max_new_tokens,
        "nest serve": serve_cli.settings_from_args(serve_args).default_max_tokens,
        "ServerSettings": ServerSettings().default_max_tokens,
        "protocol.Limits": protocol.Limits().default_max_tokens,
    }
    assert budgets == {name: assembly.DEFAULT_MAX_NEW_TOKENS for name in budgets}
    assert serve_cli.settings_from_args(serve_args).preset == assembly.DEFAULT_PRESET
    assert serve_cli.serve_spec(serve_args) == want


def test_the_engine_defaults_nothing_the_assembly_supplies_the_parts() -> None:
    """``NestEngine`` needs its config and key store; ``build_engine`` supplies them (the
    default preset, keys in memory without a persist dir)."""
    from nest_integrations.config import NestConfig
    from nest_integrations.index.in_memory_store import InMemoryKeyStore

    lm = FakeLM()
    with pytest.raises(TypeError, match="config"):
        NestEngine(lm, None, InMemoryKeyStore())  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="NestConfig.from_preset"):
        NestEngine(lm, None, InMemoryKeyStore(), "paper")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="InMemoryKeyStore"):
        NestEngine(lm, None, None, NestConfig())
    engine = NestEngine(lm, None, InMemoryKeyStore(), NestConfig())  # the four parts
    assert engine.decoding == assembly.DEFAULT_DECODING
    built = assembly.build_engine(assembly.EngineSpec(), lm=lm)
    assert isinstance(built.key_store, InMemoryKeyStore)
    assert built.config == assembly.backend_config(
        assembly.resolve_config(assembly.DEFAULT_PRESET), assembly.EngineSpec().backend)


class _Loads:
    """An embedder that records its ``load``."""

    def __init__(self) -> None:
        self.loaded = 0

    def load(self) -> None:
        self.loaded += 1

    def embed(self, texts):  # noqa: ANN001, ANN201
        raise AssertionError("load_embedders must not embed")


def test_the_first_answers_embedders_load_with_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_engine`` loads the embedders a first answer uses (the retriever's own, or the
    packaged one for the evidence scorer and the support citations), and nothing without a
    retriever."""
    from types import SimpleNamespace

    from nest_integrations import assembly_stores
    from nest_integrations.embedders import minilm as embeddings
    from nest_integrations.config import NestConfig
    from nest_integrations.policy import AnswerPolicy

    packaged = _Loads()
    monkeypatch.setattr(embeddings, "shared_embedder", lambda model_path=None: packaged)
    own = _Loads()
    with_own = SimpleNamespace(embedder=own, retrieve=lambda q, k: [])
    bare = SimpleNamespace(retrieve=lambda q, k: [])
    grounded = AnswerPolicy.from_preset("grounded")
    assembly_stores.load_embedders(with_own, grounded, NestConfig(attribute=False))
    assert (own.loaded, packaged.loaded) == (1, 0)
    assembly_stores.load_embedders(bare, grounded, NestConfig(attribute=False))
    assert packaged.loaded == (1 if grounded.evidence in ("embedding", "combined") else 0)
    before = packaged.loaded
    assembly_stores.load_embedders(bare, AnswerPolicy(), NestConfig(attribute=True))
    assert packaged.loaded == before + 1
    assembly_stores.load_embedders(bare, AnswerPolicy(), NestConfig(attribute=False))
    assembly_stores.load_embedders(None, grounded, NestConfig(attribute=True))
    assert packaged.loaded == before + 1
    # through build_engine, over a retriever that has its own embedder
    own2 = _Loads()
    engine = assembly.build_engine(assembly.EngineSpec(), lm=FakeLM(),
                                   retriever=SimpleNamespace(embedder=own2,
                                                             retrieve=lambda q, k: []))
    assert own2.loaded == 1 and engine.retriever.embedder is own2
