"""The engine's cost model: c(T), the seconds of one verify forward over T new tokens, and the
draft-length rule built on it.

Every speculative method trades draft length against verify cost: a draft of k tokens is
verified by one forward over k + 1 rows (the pending token plus the draft), which on a CPU costs
more than a one-token step (fp32 SmolLM2: c(2)/c(1) about 1.7-2.0, c(9)/c(1) about 1.9-2.6; bf16
is flatter, ``benchmarks/results/verify_cost.md``). So the best draft length depends on the
machine, the dtype and the thread count as much as on the method.

- ``measure_curve(lm)`` times c(T) for a few T after a 120-token cache (the minimum of a few
  interleaved repeats: on a shared machine the least disturbed estimate).
- ``load_or_measure(lm)`` caches the curve as JSON under
  ``$NEST_HOME/cost/<model fingerprint>/<dtype>-t<threads>-<machine>.json`` and reloads it next
  time: one measurement per (model, dtype, threads, machine). ``refresh=True`` (or deleting the
  file, or ``nest_integrations.lm.cost`` run as a script with ``--refresh``) measures again.
- An LM whose one-token steps change thread count with the cache's length (llama.cpp over an
  F16 cache at 2+ threads: exact steps run on every thread while no cell past the 256th is in
  use, on one thread past it) has two curves: ``planner_for`` gives its planner the curve of
  steps on every thread (measured inside ``inexact_rows``) for the steps that run so
  (``steps_on_every_thread``), and the exact curve (measured past those cells) for the others.
- ``DraftPlanner`` picks the draft length: with the acceptance rate ``a`` measured so far in the
  generation (accepted draft tokens over accepted tokens plus rejections, after a small prior),
  a draft of k tokens is expected to commit ``E(k) = 1 + a + ... + a^k`` tokens for
  ``c(k + 1) + k * draft_cost`` seconds; the planner drafts the k in ``0..max_len`` with the
  best ``E(k) / cost(k)`` (k = 0 is a plain step: 1 token for c(1); ties go to the shorter
  draft). Given a curve, the choice is a deterministic function of the generation's history,
  and it only changes how many tokens are drafted, never what is accepted: lossless methods
  stay lossless.

Drafters take it through ``drafter_options={"cost_model": ...}`` (``planner_for``): ``None``
(default: off, the method's fixed rule), ``"auto"`` (the cached curve of the loaded LM,
measured on first use), a ``CostCurve``, its JSON dict, or a list of ratios
``[c(1)/c(1), c(2)/c(1), ...]`` (tests use explicit curves: no timing).

Usage::

    curve = load_or_measure(lm)                     # cached per model/dtype/threads/machine
    planner = DraftPlanner(curve, max_len=10)
    k = planner.length()                            # before drafting
    planner.observe(drafted=k, accepted=n)          # after verification
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


from nest_integrations.lm.cache_key import key_of
from nest_integrations.lm.port import port_of

LOG = logging.getLogger(__name__)

FORMAT = "nest-cost-curve"
VERSION = 1
#: T values timed by default (c(T) between them is interpolated linearly).
DEFAULT_TOKENS = (1, 2, 3, 5, 9, 13, 17)
#: Prior of the acceptance estimate: pseudo-counts of accepted and rejected draft tokens.
PRIOR_ACCEPTED = 1.5
PRIOR_REJECTED = 1.0


@dataclass(frozen=True)
class CostCurve:
    """Measured c(T) (seconds) at ``tokens`` (sorted, starting at 1) and what it was measured on.

    ``cost(t)`` interpolates linearly between measured points and extends the last segment's
    slope past the last one.
    """

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.seconds) or not self.tokens:
            raise ValueError("a cost curve needs as many costs as token counts, at least one")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] != 1:
            raise ValueError(f"cost curve token counts must be increasing from 1, got "
                             f"{list(self.tokens)}")
        if any(not s > 0 for s in self.seconds):
            raise ValueError(f"cost curve costs must be positive, got {list(self.seconds)}")

    @classmethod
    def from_ratios(cls, ratios: Sequence[float], meta: dict[str, Any] | None = None
                    ) -> "CostCurve":  # fmt: skip
        """A curve from ``[c(1)/c(1), c(2)/c(1), ...]`` (c(1) = 1 s)."""
        ratios = [float(r) for r in ratios]
        if not ratios or ratios[0] != 1.0:
            raise ValueError(f"cost ratios start with c(1)/c(1) = 1.0, got {ratios[:1]}")
        return cls(tuple(range(1, len(ratios) + 1)), tuple(ratios), dict(meta or {}))

    def cost(self, t: int) -> float:
        ts, cs = self.tokens, self.seconds
        if t <= ts[0]:
            return cs[0]
        for i in range(1, len(ts)):
            if t <= ts[i]:
                w = (t - ts[i - 1]) / (ts[i] - ts[i - 1])
                return cs[i - 1] + w * (cs[i] - cs[i - 1])
        if len(ts) == 1:
            return cs[0]
        slope = max((cs[-1] - cs[-2]) / (ts[-1] - ts[-2]), 0.0)
        return cs[-1] + slope * (t - ts[-1])

    def ratio(self, t: int) -> float:
        """c(t) / c(1)."""
        return self.cost(t) / self.seconds[0]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "tokens": list(self.tokens),
                "seconds": [round(s, 7) for s in self.seconds], "meta": self.meta}

    @classmethod
    def from_json(cls, data: Any, where: str = "cost curve") -> "CostCurve":
        from nest_integrations.jsonl import check_format

        check_format(data, FORMAT, VERSION, where, "a cost curve")
        try:
            return cls(tuple(int(t) for t in data["tokens"]),
                       tuple(float(s) for s in data["seconds"]), dict(data.get("meta", {})))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{where} is malformed: {exc!r}") from None


# ----------------------------------------------------------------------------- measuring


def curve_key(lm: Any) -> dict[str, Any]:
    """What a cached curve is valid for (``lm.cache_key``, with how rows run now): model
    fingerprint, dtype (the build's label: ``float32+packed+rowwise``, ``gguf-Q8_0+kvBF16``,
    ``+inexact`` inside ``inexact_rows`` where that moves one-token steps to every thread,
    ``+rows1`` where exact verify rows are decoded one at a time), device, threads, machine."""
    key = key_of(lm, now=True)
    return {"model": key.model, "dtype": key.build, "device": key.device,
            "threads": key.threads, "machine": key.machine}


def curve_path(lm: Any) -> Path:
    """``$NEST_HOME/cost/<fingerprint>/<dtype>-<device>-t<threads>-<machine slug>.json``."""
    from nest_integrations.paths import nest_home

    key = curve_key(lm)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", key["machine"]).strip("-")[:60] or "machine"
    device = re.sub(r"[^A-Za-z0-9]+", "", key["device"])
    name = f"{key['dtype'].replace('+', '-')}-{device}-t{key['threads']}-{slug}.json"
    return nest_home() / "cost" / key["model"].replace("/", "_").replace(os.sep, "_") / name


def measure_curve(lm: Any, tokens: Sequence[int] = DEFAULT_TOKENS, repeats: int = 3,
                  context: int = 120) -> CostCurve:  # fmt: skip
    """Time c(T) for ``tokens`` after a ``context``-token cache (fixed ids): each T is timed
    ``repeats`` times, interleaved with the others, and keeps its minimum."""
    tokens = sorted(set(int(t) for t in tokens) | {1})
    if tokens[0] < 1 or repeats < 1:
        raise ValueError("token counts and repeats must be >= 1")
    # an LM whose exact steps change with the cache's length (llama.cpp, F16, 2+ threads) says
    # where the curve of its exact steps is measured: past the cells where they go on one thread
    context = max(int(context), int(port_of(lm).regime.exact_curve_context))
    vocab = int(lm.vocab_size)
    prompt = [(1000 + i) % vocab for i in range(context)]
    cache = lm.new_cache()
    lm.forward(prompt, cache, last=1)
    best = dict.fromkeys(tokens, float("inf"))
    for r in range(repeats + 1):  # round 0 warms up
        for t in tokens:
            ids = [(2000 + j) % vocab for j in range(t)]
            start = time.perf_counter()
            lm.forward(ids, cache)
            elapsed = time.perf_counter() - start
            lm.crop_cache(cache, context)
            if r:
                best[t] = min(best[t], elapsed)
    meta = {**curve_key(lm), "context": context, "repeats": repeats,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return CostCurve(tuple(tokens), tuple(best[t] for t in tokens), meta)


def load_or_measure(lm: Any, *, refresh: bool = False, **measure: Any) -> CostCurve:
    """The cached curve of ``lm`` on this machine (``curve_path``), measured and written on
    first use or with ``refresh=True``. A cache file that does not parse is measured again."""
    path = curve_path(lm)
    if path.is_file() and not refresh:
        try:
            curve = CostCurve.from_json(json.loads(path.read_text(encoding="utf-8")), str(path))
            LOG.debug("cost curve from %s", path)
            return curve
        except (ValueError, json.JSONDecodeError) as exc:
            LOG.warning("re-measuring the cost curve: %s", exc)
    curve = measure_curve(lm, **measure)
    from nest_integrations.paths import ensure_dir

    ensure_dir(path.parent)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(curve.to_json(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    LOG.info("measured the cost curve (c(9)/c(1) = %.2f) -> %s", curve.ratio(9), path)
    return curve


# ----------------------------------------------------------------------------- draft lengths


def expected_tokens(alpha: float, k: int) -> float:
    """Committed tokens of a k-token draft when each draft token is accepted with probability
    ``alpha`` given the previous ones: ``1 + alpha + ... + alpha^k`` (the 1 is the loop's own
    token)."""
    return sum(alpha**j for j in range(k + 1))


def draft_rate(curve: CostCurve, alpha: float, k: int, draft_cost: float = 0.0) -> float:
    """Expected tokens per second of a k-token draft, ``E(k) / (c(k + 1) + k * draft_cost)``
    (k = 0: a plain step, ``1 / c(1)``). ``draft_cost`` is the seconds of drafting one token
    (0 for copy drafters)."""
    return expected_tokens(alpha, k) / (curve.cost(k + 1) + k * draft_cost)


def best_length(curve: CostCurve, alpha: float, max_len: int, draft_cost: float = 0.0) -> int:
    """The k in ``0..max_len`` with the most expected tokens per second (``draft_rate``); ties
    go to the shorter draft."""
    best_k, best_rate = 0, draft_rate(curve, alpha, 0)
    for k in range(1, max_len + 1):
        rate = draft_rate(curve, alpha, k, draft_cost)
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


def pays(curve: CostCurve, alpha: float, k: int, draft_cost: float = 0.0) -> bool:
    """Whether a draft of exactly ``k`` tokens beats a plain step at acceptance ``alpha`` (the
    test ``best_length`` applies to each k). A drafter that planned a longer draft but found
    fewer tokens (a copy that reaches its passage's end, an n-gram match near the context's
    end) asks this before it spends a verify pass on them."""
    if k < 1:
        return False
    return draft_rate(curve, alpha, k, draft_cost) > draft_rate(curve, alpha, 0) * (1 + 1e-9)


class DraftPlanner:
    """Draft lengths for one generation from a cost curve and the acceptance measured so far
    (see the module docstring). ``draft_cost`` is per drafted token, in the curve's units."""

    def __init__(
        self, curve: CostCurve, *, max_len: int, draft_cost: float = 0.0,
        prior: tuple[float, float] = (PRIOR_ACCEPTED, PRIOR_REJECTED),
        fast: CostCurve | None = None, fast_now: Any = None,
    ) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.curve = curve
        #: the curve of steps on every thread, used while ``fast_now()`` says the next step
        #: runs so (None: ``curve`` always)
        self.fast, self.fast_now = fast, fast_now
        self.max_len = int(max_len)
        self.draft_cost = float(draft_cost)
        self.accepted, self.rejected = float(prior[0]), float(prior[1])

    @property
    def alpha(self) -> float:
        """Accepted draft tokens over accepted plus rejected ones (with the prior)."""
        return self.accepted / (self.accepted + self.rejected)

    def length(self, max_len: int | None = None) -> int:
        """The draft length to use now (0 = a plain step)."""
        cap = self.max_len if max_len is None else min(self.max_len, max_len)
        if cap < 1:
            return 0
        return best_length(self._curve(), self.alpha, cap, self.draft_cost)

    def pays(self, k: int) -> bool:
        """Whether a draft of exactly ``k`` tokens pays now (``pays``): a draft shorter than
        ``length()`` planned may not."""
        return pays(self._curve(), self.alpha, k, self.draft_cost)

    def _curve(self) -> CostCurve:
        """The curve of the step that runs next (``fast`` while ``fast_now()`` says so)."""
        return self.fast if self.fast is not None and self.fast_now() else self.curve

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified draft: ``accepted`` of its ``drafted`` tokens were taken; a draft cut
        short by a mismatch counts one rejection."""
        if drafted < 1:
            return
        self.accepted += accepted
        self.rejected += 1 if accepted < drafted else 0


def curve_from(option: Any, lm: Any) -> CostCurve | None:
    """The curve an option names (see the module docstring), or None when off."""
    if option is None or option is False or option in ("off", "none", ""):
        return None
    if isinstance(option, CostCurve):
        return option
    if option is True or option == "auto":
        return load_or_measure(lm)
    if isinstance(option, dict):
        return CostCurve.from_json(option, "drafter option cost_model")
    if isinstance(option, (list, tuple)):
        return CostCurve.from_ratios(option)
    raise ValueError(f"cost_model={option!r} is invalid: use None/'off', 'auto', a CostCurve, "
                     "its JSON dict or a list of ratios c(T)/c(1) for T = 1, 2, ...")


#: ``cost_model`` where a drafter (prompt lookup, rag-copy, DReSD, NEST's span length) leaves it
#: None, by backend.
#: On llama.cpp a verify pass of T tokens costs about T one-token steps (c(9)/c(1) 5-6, Q8_0,
#: AMD EPYC, 1 thread; torch bf16: about 1.2-2), so fixed-length drafts lost to plain greedy
#: there (speed benchmark, the same prompts: prompt lookup 0.75-0.90x, DReSD 0.65x llama.cpp
#: greedy, ``docs/llama_cpp.md``): they draft only where the measured curve and the acceptance
#: so far pay. rag-copy too: a copy it does not draft is still cited, token by token, from the
#: plain steps (``AdaptiveLength.cite``), whose matches also feed the acceptance estimate; and
#: NEST's spans, whose copy goes on row by row when a span is cut to one token.
BACKEND_COST_MODEL: dict[str, Any] = {"llama.cpp": "auto"}


def backend_default(option: Any, lm: Any) -> Any:
    """A speed-only drafter's ``cost_model`` option: ``option``, or when it is None the
    backend's default (``BACKEND_COST_MODEL``; None = off); ``"off"`` stays off."""
    if option is not None:
        return option
    return BACKEND_COST_MODEL.get(port_of(lm).build().backend)


def planner_for(option: Any, lm: Any, max_len: int, draft_cost: float = 0.0
                ) -> DraftPlanner | None:  # fmt: skip
    """A ``DraftPlanner`` for a drafter's ``cost_model`` option, or None when it is off.
    ``draft_cost`` is a fraction of c(1) per drafted token."""
    curve = curve_from(option, lm)
    if curve is None:
        return None
    fast = None
    port = port_of(lm)
    regime = port.regime
    if (option is True or option == "auto") and regime.step_regimes:
        with port.inexact_context():  # steps on every thread: what short caches' exact steps
            fast = load_or_measure(lm)  # run as
    return DraftPlanner(curve, max_len=max_len, draft_cost=draft_cost * curve.cost(1),
                        fast=fast, fast_now=None if fast is None else regime.steps_on_every_thread)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nest_integrations.lm.cost [--backend B] [--model M] [--dtype D]
    [--threads N] [--refresh] [--repeats R] [--context C]``: print (measuring if needed) the
    cached cost curve of the embedded model (on llama.cpp ``--model`` may name a GGUF file or a
    quantisation of the embedded model, e.g. ``Q8_0``, requantised once)."""
    import argparse
    import sys

    from nest_integrations.lm.auto_backend import resolve_backend
    from nest_integrations.lm.backend import add_backend_args, apply_backend_args

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--refresh", action="store_true", help="measure again and overwrite")
    ap.add_argument("--model", default=None, help="llama.cpp: a GGUF file or Q4_0, Q8_0, ...")
    ap.add_argument("--repeats", type=int, default=3, help="timings per T (the minimum is kept)")
    ap.add_argument("--context", type=int, default=120, help="cached tokens before the pass")
    add_backend_args(ap)
    args = ap.parse_args(argv)
    apply_backend_args(args)
    if resolve_backend(args.backend) == "llama.cpp":
        from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel, resolve_gguf

        path, name = resolve_gguf(args.model)
        lm: Any = LlamaCppLanguageModel.from_gguf(path, name=name)
    else:
        from nest_integrations.lm.hf import HFLanguageModel

        if args.model is not None:
            raise SystemExit("--model applies to --backend llama.cpp")
        lm = HFLanguageModel.from_default(dtype=args.dtype) if args.dtype else \
            HFLanguageModel.from_default()
    curve = load_or_measure(lm, refresh=args.refresh, repeats=args.repeats, context=args.context)
    sys.stdout.write(f"{curve_path(lm)}\n")
    for t in curve.tokens:
        sys.stdout.write(f"c({t}) = {1000 * curve.cost(t):.1f} ms ({curve.ratio(t):.2f}x)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
