"""The torch path's own overhead, measured: compile, static KV cache, fewer Python ops (issue 55)

One process, the default model (SmolLM2-135M-Instruct, fp32 as ``dtype="auto"`` loads it on a
CPU whose bf16 verify rows are not bit-exact), 1 thread, a ~300-token KV cache. Variants of the
torch forward, each timed as c(1) (a one-token step) and c(9) (a 9-row verify pass), the
variants interleaved in a rotating order per round, medians over rounds:

- ``eager``: ``HFLanguageModel.forward`` as the engine runs it (row-exact linears, row-wise
  attention, ``DynamicCache``, ``inference_mode``): the baseline;
- ``inexact``: the same forward inside ``lm.inexact_rows()`` (one kernel call per linear and
  per attention, as transformers makes them): what the row-exact machinery costs, not exact;
- ``static``: ``eager`` over transformers' ``StaticCache`` (the loaded model's modules);
- ``packed``: ``eager`` with the linears' weights prepacked for oneDNN in fp32 (``lm.packing``,
  ``pack_weights=True``): another kernel, row-exact by its own probed row plan;
- ``lean``: a second copy of the model whose row-exact linears have their probed row plan
  baked in (no thread-count or context-variable look-up per call) and whose attention slices
  each verify row's keys by shape: the same kernel calls as ``eager``, fewer Python ops; it
  is also the compile-friendly model the compiled variants trace;
- ``lean-nograd``: ``lean`` under ``torch.no_grad`` instead of ``inference_mode``;
- ``lean-static``: ``lean`` over a ``StaticCache``, each verify row attending to the whole
  static cache through its row of the mask (no data-dependent slicing);
- ``compile-dyn``: ``torch.compile`` (inductor, ``dynamic=True``) of ``lean`` over a
  ``DynamicCache``;
- ``compile-static``: ``torch.compile`` (inductor, ``dynamic=False``: one graph per pass size)
  of ``lean-static``, the transformers-documented compile recipe;
- ``compile-plain`` (``--plain``): that recipe on the model as transformers loads it (no
  row-exact kernels): the ceiling of compile, not exact.

Rows ``floor`` and ``floor-packed`` time the linears' kernel calls of a pass alone (plain and
prepacked fp32), by their row plans. Prefills (more than ``SMALL`` rows) run eager in every variant. Per variant: ms per step (c(1))
and per 9-row pass (c(9)) and their ratio to ``eager`` in the same rounds; compile seconds (the
first call of each shape less a timed one); graph breaks and graphs dynamo made; exactness:

- **greedy**: 48 greedy tokens on each of 4 chat prompts, one-token steps: ids identical to
  ``eager``'s (and the max |logit diff| of the steps against ``eager``'s);
- **rows**: a 9-token pass (the greedy continuation, after the ~300-token prompt) against 9
  one-token steps of the same variant: bitwise equal logits (what ``lm.exactness`` requires),
  argmaxes equal, max |logit diff|.

Usage: python -m benchmarks.torch_overhead [--rounds 7] [--reps 3] [--variants a,b] [--plain]
(about 5-10 minutes at 1 thread on a shared 2-core CPU, most of it compiling). The inductor cache
is a fresh temporary folder unless ``--inductor-cache DIR`` (then a second run is a warm start).
Results: ``--out`` (default: ``torch_overhead/`` in the temp folder, since benchmarks/results
holds at most 40 files), raw JSON beside it; the runs docs/decisions.md quotes are appended to
benchmarks/results/verify_cost.md.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

from benchmarks import harness

#: Passes of more rows run eager (prefills): nobody compiles the prompt's shape.
SMALL = 32
#: Prompts of the greedy check (chat template, default system prompt).
PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a cat sleeping in the sun.",
    "List three uses of a paperclip.",
)
#: The timing context: ~300 tokens once the chat template is applied.
CONTEXT = (
    "Nearest-neighbour speculative decoding retrieves passages for a question, encodes every "
    "token of them as a key vector, and at each step looks up the keys nearest to the model's "
    "current hidden state. The tokens that followed those keys in the passages form a draft, "
    "which the model verifies in a single forward pass over several rows. A lossless method "
    "keeps a drafted token only where the model's own greedy choice agrees, so the answer is "
    "exactly greedy decoding, while every accepted token saves a step. On a CPU a forward over "
    "nine rows costs about twice a one-token step, so a draft pays when about half of it is "
    "accepted. The cost of a step has parts: the arithmetic of the weights, the memory traffic "
    "of reading them, and the Python that drives each layer: the modules, the cache update, the "
    "attention mask and the hooks. For a small model the last part can dominate, and that is "
    "what a compiler, a static cache or fewer Python operations per layer may cut. Whether they "
    "keep every verify row bit-identical to a one-token step is the other half of the question: "
    "without it, the lossless methods stop being exactly greedy. Summarise the trade-off in a "
    "few sentences, then say which option you would try first and why."
)
VARIANTS = ("eager", "inexact", "packed", "lean", "lean-nograd", "lean-static", "compile-static")
STATIC_LEN = 512


# ----------------------------------------------------------------------------- lean modules


def _lean_classes() -> tuple[type, Callable[..., Any]]:
    import torch
    import torch.nn.functional as F

    from nest_integrations.lm.row_exact import EXACT_ROWS, RowPlan

    class PlannedLinear(torch.nn.Module):
        """A row-exact linear with its probed plan baked in: the calls ``RowExactLinear`` makes,
        without a thread-count or context-variable look-up per call."""

        def __init__(self, rel: Any) -> None:
            super().__init__()
            self.in_features, self.out_features = rel.in_features, rel.out_features
            self.weight, self.bias = rel.weight, rel.bias
            plan = rel.plan()
            self.pad_to, self.block = int(plan.pad_to), int(plan.block)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, self.in_features)
            w, b = self.weight, self.bias
            if flat.shape[0] > EXACT_ROWS:
                y = F.linear(flat, w, b)
            else:
                y = RowPlan(self.pad_to, self.block).run(lambda t: F.linear(t, w, b), flat)
            return y.reshape(*x.shape[:-1], self.out_features)

    def lean_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[Any, None]:
        """Row-wise attention without reading data: a chain's row i attends to the first
        ``k_len - q_len + i + 1`` keys (dynamic cache, the slice ``nest_rowwise`` takes), or to
        the whole static cache through its row of the mask (``LEAN["static"]``)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        q_len, k_len = query.shape[2], key.shape[2]
        if q_len > SMALL or (q_len >= k_len and not LEAN["static"]):
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
        rows = []
        groups = int(getattr(module, "num_key_value_groups", 1))
        for i in range(q_len):
            if LEAN["static"]:
                if attention_mask is None:
                    raise RuntimeError("a static-cache pass without a mask")
                # one query row over the whole cache, its mask row; the query heads of a KV
                # head packed as rows (no repeat_kv copy of the 512-position cache)
                b, h, _, d = query.shape
                q_i = query[:, :, i : i + 1].reshape(b, h // groups, groups, d)
                out = F.scaled_dot_product_attention(
                    q_i, key, value, attn_mask=attention_mask[:, :, i : i + 1, :],
                    scale=kwargs.get("scaling"))
                rows.append(out.reshape(b, h, 1, d).transpose(1, 2))
                continue
            else:
                n = k_len - q_len + i + 1
                k_i, v_i, m_i = key[:, :, :n], value[:, :, :n], None
            out, _ = sdpa_attention_forward(module, query[:, :, i : i + 1], k_i, v_i, m_i,
                                            is_causal=False, **kwargs)
            rows.append(out)
        return torch.cat(rows, dim=1), None

    return PlannedLinear, lean_attention


LEAN: dict[str, bool] = {"static": False}


def make_lean(lm: Any) -> int:
    """Turn ``lm.model`` (a row-exact load) into the lean model in place; returns the linears
    replaced."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from nest_integrations.lm.row_exact import RowExactLinear

    planned, attention = _lean_classes()
    AttentionInterface.register("nest_lean", attention)
    AttentionMaskInterface.register("nest_lean", sdpa_mask)
    count = 0
    for module in list(lm.model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RowExactLinear):
                setattr(module, name, planned(child))
                count += 1
    lm.model.set_attn_implementation("nest_lean")
    return count


# ----------------------------------------------------------------------------- steppers


class Stepper:
    """One variant: ``forward(ids, cache) -> (T, V) fp32 logits`` (keys captured too),
    ``new_cache()``, ``crop(cache, n)``."""

    def __init__(self, name: str, lm: Any, *, kind: str, static: bool = False,
                 compile_opts: dict[str, Any] | None = None, grad: str = "inference") -> None:
        import torch

        self.name, self.lm, self.kind, self.static = name, lm, kind, static
        self.grad = grad
        self.compiled = compile_opts is not None
        self.first_calls: dict[int, float] = {}
        self._static_cache: Any = None
        self.fn = None
        if kind == "own":  # our loop around the model: a permanent key hook
            model = lm.model
            if not hasattr(model, "_nest_slot"):
                model._nest_slot = []
                slot = model._nest_slot
                lm._keys.module.register_forward_hook(
                    lambda _m, _a, out: slot.append(out[0] if isinstance(out, tuple) else out))
            self.slot = model._nest_slot
            self.fn = (torch.compile(model.forward, **compile_opts) if self.compiled
                       else model.forward)

    def new_cache(self) -> Any:
        from transformers import DynamicCache, StaticCache

        if not self.static:
            return DynamicCache(config=self.lm.model.config)
        if self._static_cache is None:  # one cache, reset: compiled graphs keep its address
            self._static_cache = StaticCache(config=self.lm.model.config,
                                             max_cache_len=STATIC_LEN)
        else:
            self.crop(self._static_cache, 0)
        return self._static_cache

    def crop(self, cache: Any, n: int) -> None:
        remove = int(cache.get_seq_length()) - n
        if remove:
            import torch

            with torch.inference_mode():
                cache.crop(-remove)

    def forward(self, ids: list[int], cache: Any) -> Any:
        import torch

        t0 = time.perf_counter()
        if self.kind == "lm":
            ctx = self.lm.inexact_rows() if self.name == "inexact" else nullcontext()
            with ctx:
                logits = self.lm.forward(ids, cache)[0]
        else:
            LEAN["static"] = self.static
            n = len(ids)
            past = int(cache.get_seq_length())
            input_ids = torch.tensor([ids], dtype=torch.long)
            positions = torch.arange(past, past + n).unsqueeze(0)
            fn = self.fn if n <= SMALL else self.lm.model.forward
            grad = torch.inference_mode() if self.grad == "inference" else torch.no_grad()
            with grad:
                self.slot.clear()
                out = fn(input_ids=input_ids, position_ids=positions, use_cache=True,
                         **{self.lm._cache_kwarg: cache})
                keys = self.slot[-1][0].float()
            logits = out.logits[0].float()
            del keys
        if len(ids) <= SMALL and len(ids) not in self.first_calls:
            self.first_calls[len(ids)] = time.perf_counter() - t0
        return logits


class LinearFloor:
    """The row-exact linears' kernel calls of a pass and nothing else (random rows of the
    right widths, by each linear's row plan): the weights' arithmetic and memory traffic, the
    floor under any cut of Python overhead. Timed only."""

    static = False
    compiled = False

    def __init__(self, lm: Any) -> None:
        import torch

        from nest_integrations.lm.row_exact import RowExactLinear

        self.linears = [m for m in lm.model.modules() if isinstance(m, RowExactLinear)]
        self.inputs = {t: {m.in_features: torch.randn(t, m.in_features) for m in self.linears}
                       for t in (1, 9)}
        self.first_calls: dict[int, float] = {}

    def new_cache(self) -> None:
        return None

    def crop(self, cache: Any, n: int) -> None:
        pass

    def forward(self, ids: list[int], cache: Any) -> None:
        import torch

        xs = self.inputs.get(len(ids))
        if xs is None:
            return
        with torch.inference_mode():
            for m in self.linears:
                m.plan().run(m.kernel, xs[m.in_features])


# ----------------------------------------------------------------------------- measurements


def greedy(st: Stepper, prompt: list[int], n: int) -> tuple[list[int], Any]:
    """``n`` greedy tokens by one-token steps; their ids and the (n, V) step logits."""
    import torch

    cache = st.new_cache()
    last = st.forward(prompt, cache)[-1:]
    ids, rows = [], []
    for _ in range(n):
        tok = int(last[-1].argmax())
        ids.append(tok)
        last = st.forward([tok], cache)
        rows.append(last)
    return ids, torch.cat(rows)


def rows_check(st: Stepper, prompt: list[int], new: list[int]) -> dict[str, Any]:
    """A len(new)-row pass after ``prompt`` against one-token steps of the same variant."""
    import torch

    cache = st.new_cache()
    st.forward(prompt, cache)
    base = len(prompt)
    block = st.forward(new, cache)
    st.crop(cache, base)
    steps = torch.cat([st.forward([t], cache) for t in new])
    return {
        "bitwise": bool(torch.equal(block, steps)),
        "argmax_equal": bool(torch.equal(block.argmax(-1), steps.argmax(-1))),
        "max_abs_diff": float((block - steps).abs().max()),
    }


def dynamo_counts() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "graphs": int(counters["stats"].get("unique_graphs", 0))}


def time_rounds(steppers: dict[str, Stepper], context: list[int], rounds: int, reps: int,
                new9: list[int]) -> dict[str, dict[str, list[float]]]:
    """c(1) and c(9) per variant after ``context`` cached, rotating order per round."""
    caches = {}
    for name, st in steppers.items():
        cache = st.new_cache()
        st.forward(context, cache)
        caches[name] = cache
    out: dict[str, dict[str, list[float]]] = {n: {"c1": [], "c9": []} for n in steppers}
    names = list(steppers)
    base = len(context)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            st, cache = steppers[name], caches[name]
            for _ in range(reps):
                t0 = time.perf_counter()
                st.forward(new9[:1], cache)
                out[name]["c1"].append(time.perf_counter() - t0)
                st.crop(cache, base)
                t0 = time.perf_counter()
                st.forward(new9, cache)
                out[name]["c9"].append(time.perf_counter() - t0)
                st.crop(cache, base)
        LOG.info("round %d/%d done", r + 1, rounds)
    return out


LOG = logging.getLogger("benchmarks.torch_overhead")


class OverBudget(Exception):
    """A compiled variant's checks (its compiles) ran past ``--compile-budget``."""


def _over_budget(_sig: int, _frame: Any) -> None:
    raise OverBudget("compiling and checking ran past --compile-budget")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("benchmarks.torch_overhead", __doc__)
    ap.set_defaults(out=Path(tempfile.gettempdir()) / "torch_overhead")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3, help="timed passes per variant and round")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--plain", action="store_true", help="add compile-plain (not exact)")
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens per prompt")
    ap.add_argument("--inductor-cache", default=None)
    ap.add_argument("--stem", default="torch_overhead")
    ap.add_argument("--compile-budget", type=int, default=480,
                    help="seconds a compiled variant's compiles and checks may take (0: any)")
    ap.add_argument("--no-floor", action="store_true", help="skip the linears-only floor row")
    args, run = harness.start(ap, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cache_dir = args.inductor_cache or tempfile.mkdtemp(prefix="nest-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    os.environ.setdefault("NEST_BACKEND", "torch")

    import torch

    torch.set_num_threads(1)
    import torch._dynamo
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    torch._dynamo.config.cache_size_limit = 64
    from nest_integrations.lm.hf import HFLanguageModel

    wanted = [v for v in args.variants.split(",") if v]
    if args.plain:
        wanted.append("compile-plain")
    lm = HFLanguageModel.from_default(dtype="fp32", pack_weights=False)
    packed = HFLanguageModel.from_default(dtype="fp32", pack_weights=True) \
        if "packed" in wanted else None
    if packed is not None:
        LOG.info("packed model: %d linears prepacked, exact rows: %s", packed.packed_linears,
                 packed.exact_rows)
    lean = None
    if any(v.startswith(("lean", "compile-dyn", "compile-static")) for v in wanted):
        lean = HFLanguageModel.from_default(dtype="fp32", pack_weights=False)
        replaced = make_lean(lean)
        LOG.info("lean model: %d linears with baked plans", replaced)
    plain = HFLanguageModel.from_default(dtype="fp32", exact_rows=False) \
        if "compile-plain" in wanted else None
    copts = {"mode": None if args.mode == "default" else args.mode}
    steppers: dict[str, Stepper] = {}
    for v in wanted:
        if v == "eager":
            steppers[v] = Stepper(v, lm, kind="lm")
        elif v == "inexact":
            steppers[v] = Stepper(v, lm, kind="lm")
        elif v == "packed":
            steppers[v] = Stepper(v, packed, kind="lm")
        elif v == "static":
            steppers[v] = Stepper(v, lm, kind="lm", static=True)
        elif v == "lean":
            steppers[v] = Stepper(v, lean, kind="own")
        elif v == "lean-nograd":
            steppers[v] = Stepper(v, lean, kind="own", grad="no_grad")
        elif v == "lean-static":
            steppers[v] = Stepper(v, lean, kind="own", static=True)
        elif v == "compile-dyn":
            steppers[v] = Stepper(v, lean, kind="own", compile_opts={**copts, "dynamic": True})
        elif v == "compile-static":
            steppers[v] = Stepper(v, lean, kind="own", static=True,
                                  compile_opts={**copts, "dynamic": False})
        elif v == "compile-plain":
            steppers[v] = Stepper(v, plain, kind="own", static=True,
                                  compile_opts={**copts, "dynamic": False})
        else:
            ap.error(f"unknown variant {v!r}")

    tok = lm
    prompts = [tok.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
    context = tok.chat_prompt([{"role": "user", "content": CONTEXT}])
    LOG.info("context: %d tokens", len(context))
    results: dict[str, dict[str, Any]] = {}
    ref_ids: list[list[int]] = []
    ref_logits: list[Any] = []
    new9: list[int] = []
    for name, st in steppers.items():  # exactness first: it also compiles every shape
        rec: dict[str, Any] = results.setdefault(name, {})
        before = dynamo_counts()
        t0 = time.perf_counter()
        if st.compiled and args.compile_budget:
            signal.signal(signal.SIGALRM, _over_budget)
            signal.alarm(args.compile_budget)
        try:
            ids_all, diffs = [], []
            for p_i, prompt in enumerate(prompts):
                ids, logits = greedy(st, prompt, args.tokens)
                ids_all.append(ids)
                if name == "eager":
                    ref_ids.append(ids)
                    ref_logits.append(logits)
                elif ref_logits:
                    n = min(len(logits), len(ref_logits[p_i]))
                    diffs.append(float((logits[:n] - ref_logits[p_i][:n]).abs().max()))
            if name == "eager":
                new9 = greedy(st, context, 9)[0]
            rec["greedy_same"] = (sum(a == b for a, b in zip(ids_all, ref_ids))
                                  if ref_ids else None)
            rec["greedy_first_diff"] = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                             None) for a, b in zip(ids_all, ref_ids)]
            rec["step_logit_diff_vs_eager"] = max(diffs) if diffs else 0.0
            rec["rows9"] = rows_check(st, context, new9)
            rec["rows2"] = rows_check(st, context, new9[:2])
            rec["check_s"] = round(time.perf_counter() - t0, 1)
            after = dynamo_counts()
            rec["dynamo"] = {k: after[k] - before.get(k, 0) for k in after}
            rec["first_calls_s"] = {str(k): round(v, 2) for k, v in sorted(st.first_calls.items())}
            LOG.info("%s: %s", name, json.dumps(rec))
        except Exception as exc:  # a variant that does not run: reported, not fatal
            rec["error"] = f"{type(exc).__name__}: {exc}"
            rec["traceback"] = traceback.format_exc()[-3000:]
            LOG.error("%s failed: %s", name, rec["traceback"])
        finally:
            signal.alarm(0)
    ok: dict[str, Any] = {n: st for n, st in steppers.items() if "error" not in results[n]}
    if not args.no_floor:
        ok["floor"] = LinearFloor(lm)
        results["floor"] = {}
        if packed is not None:
            ok["floor-packed"] = LinearFloor(packed)
            results["floor-packed"] = {}
    times = time_rounds(ok, context, args.rounds, args.reps, new9)
    for name, t in times.items():
        results[name]["c1_ms"] = round(1000 * statistics.median(t["c1"]), 2)
        results[name]["c9_ms"] = round(1000 * statistics.median(t["c9"]), 2)
        results[name]["c1_all_ms"] = [round(1000 * x, 2) for x in t["c1"]]
        results[name]["c9_all_ms"] = [round(1000 * x, 2) for x in t["c9"]]
    # compile seconds: the first call of a shape less the median of that shape
    for name, rec in results.items():
        if "c1_ms" in rec and getattr(ok.get(name), "compiled", False):
            fc = ok[name].first_calls
            rec["compile_s"] = {
                "T=1": round(fc.get(1, 0) - rec["c1_ms"] / 1000, 1),
                "T=2": round(fc.get(2, 0) - rec["c9_ms"] / 1000, 1),
                "T=9": round(fc.get(9, 0) - rec["c9_ms"] / 1000, 1)}
    record = run.finish()
    record["context_tokens"] = len(context)
    record["inductor_cache"] = cache_dir if args.inductor_cache else "fresh temp folder (cold)"
    record["compile_mode"] = args.mode
    md = render(results, record, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.stem}.md").write_text(md, encoding="utf-8")
    raw = out / f"{args.stem}.json"
    raw.write_text(json.dumps({"run": record, "results": results}, indent=1, default=str))
    sys.stdout.write(md + f"\nraw: {raw}\n")
    return 0


def render(results: dict[str, dict[str, Any]], record: dict[str, Any], args: Any) -> str:
    base = results.get("eager", {})
    lines = [
        "# The torch path's own overhead (issue 55, item 4)", "",
        *harness.report.run_lines(record), "",
        f"Default model, fp32 (what `auto` loads on this CPU), 1 thread, "
        f"{record['context_tokens']}-token cache; c(1) a one-token step, c(9) a 9-row verify "
        f"pass; medians of {args.rounds} interleaved rounds x {args.reps}; ratios against "
        f"`eager` in the same rounds. Compile mode: {record['compile_mode']}; inductor cache: "
        f"{record['inductor_cache']}.", "",
        "| variant | c(1) ms | c(1)/eager | c(9) ms | c(9)/eager | compile s (T=1 / T=9) | "
        "greedy ids = eager | step logits vs eager | 9-row pass = steps | 2-row | dynamo |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rec in results.items():
        if "error" in rec:
            lines.append(f"| {name} | failed: {rec['error'][:150]} |||||||||")
            continue
        c1r = rec["c1_ms"] / base["c1_ms"] if base.get("c1_ms") else float("nan")
        c9r = rec["c9_ms"] / base["c9_ms"] if base.get("c9_ms") else float("nan")
        if "rows9" not in rec:  # the floor: timed only
            lines.append(f"| {name} (linears only) | {rec['c1_ms']:.1f} | {c1r:.2f} | "
                         f"{rec['c9_ms']:.1f} | {c9r:.2f} | - | - | - | - | - | - |")
            continue
        comp = rec.get("compile_s")
        comp_s = f"{comp['T=1']} / {comp['T=9']}" if comp else "-"
        r9, r2 = rec["rows9"], rec["rows2"]
        rows9 = ("bitwise" if r9["bitwise"] else
                 f"no (argmax {'=' if r9['argmax_equal'] else '!='}, {r9['max_abs_diff']:.2g})")
        rows2 = "bitwise" if r2["bitwise"] else f"no ({r2['max_abs_diff']:.2g})"
        dyn = rec.get("dynamo") or {}
        dyn_s = (f"{dyn.get('graphs', 0)} graphs, {dyn.get('graph_breaks', 0)} breaks"
                 if comp else "-")
        same = rec["greedy_same"]
        lines.append(
            f"| {name} | {rec['c1_ms']:.1f} | {c1r:.2f} | {rec['c9_ms']:.1f} | {c9r:.2f} | "
            f"{comp_s} | {same}/{len(PROMPTS)} | {rec['step_logit_diff_vs_eager']:.2g} | "
            f"{rows9} | {rows2} | {dyn_s} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
