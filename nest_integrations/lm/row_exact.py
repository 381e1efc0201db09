"""Row-exact CPU linears: every row of a verify pass gets the bits a one-token step gives it, on
any CPU, because the row plan is measured on the CPU it runs on.

Why: a lossless method keeps a draft token only where the verify pass's argmax equals greedy's.
That equals greedy decoding only if row i of a T-row pass equals a one-token step at that
position bit for bit. A BLAS/oneDNN matmul does not promise that: it picks its kernel (and so
its reduction order) by the number of rows M, the thread count and the CPU's caches. What we
measured (``docs/backends.md``): oneDNN bf16 on an Intel Xeon gives M <= 32 the bits of M = 1;
MKL fp32 gives M = 1 (a matrix-vector kernel) other bits than M >= 2, and M >= 2 agree only up to
15 rows on 1 thread and 3 rows on 2; on an AMD EPYC the bf16 blocks that held on the Xeon did not.

How: a *row plan* ``(pad_to, block)`` per kernel, weight shape and thread count, found by a
probe (``probe_plan``) on random data: a pass's rows run in calls of ``block`` rows, and a call
of fewer than ``pad_to`` rows is padded with zero rows. The probe picks the largest ``block``
(up to ``MAX_BLOCK``) such that every call size in ``[pad_to, block]`` gives each row the bits
of a ``pad_to``-row call; ``pad_to = 1`` if one-row calls agree with the rest, else 2; and
``RowPlan(1, 1)`` (one call per row: the one-token step's own call, exact by construction)
where nothing else is. Plans are cached per machine under ``$NEST_HOME/exactness/``. Passes of
more than ``EXACT_ROWS`` rows (prefills) run in one call: nobody compares them with steps.

A model-level check (``check_rows``) then runs verify passes against one-token steps on the
loaded model (``HFLanguageModel.exact_rows``): that verdict, not the plan alone, is what
``dtype="auto"``, ``nest info`` and ``NestStats.exact_rows`` report.

Within ``inexact_rows()`` (NEST's relaxed decoding, which needs no bit-exact rows) a pass takes
one call per linear and one attention call, as transformers makes them.
"""

from __future__ import annotations

import contextvars
import gc
import json
import logging
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from nest_integrations.lm.port import port_of

LOG = logging.getLogger(__name__)

#: Passes of up to this many rows (steps, verify chains, token trees) run row-exact; larger
#: passes (prefills) take one call.
EXACT_ROWS = 128
#: The largest call size the probe tries.
MAX_BLOCK = 32
#: Environment switch: ``0``/``false``/``no``/``off`` leaves a model's linears and attention as
#: transformers loads them (what a plain transformers user gets; benchmarks' HF baselines).
ENV = "NEST_EXACT_ROWS"
_OFF = {"0", "false", "no", "off"}
FORMAT = "nest-row-plans"
VERSION = 1

#: False inside ``inexact_rows()``: one kernel call per linear and per attention.
_EXACT = contextvars.ContextVar("nest_exact_rows", default=True)


@contextmanager
def inexact_rows() -> Iterator[None]:
    """Within the block, forwards may round rows differently from one-token steps (one call
    per linear and per attention: faster). For decoding that needs no bit-exact rows (NEST's
    relaxed acceptance). Wrap single forwards, not generators."""
    token = _EXACT.set(False)
    try:
        yield
    finally:
        _EXACT.reset(token)


def exact_wanted() -> bool:
    """Whether forwards in this context run row-exact (not inside ``inexact_rows()``)."""
    return _EXACT.get()


def env_allows() -> bool:
    """``$NEST_EXACT_ROWS`` is not off."""
    return os.environ.get(ENV, "").strip().lower() not in _OFF


@dataclass(frozen=True)
class RowPlan:
    """Run a pass's rows in calls of ``block`` rows; pad a call of fewer than ``pad_to`` rows
    with zero rows. ``RowPlan(1, 1)``: one call per row."""

    pad_to: int
    block: int

    def run(self, kernel: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``kernel`` over the rows of ``x`` (M, K) by this plan: (M, N)."""
        rows = x.shape[0]
        if rows <= self.block and rows >= self.pad_to:
            return kernel(x)
        outs = []
        for i in range(0, rows, self.block):
            part = x[i : i + self.block]
            n = part.shape[0]
            if n < self.pad_to:
                part = torch.cat([part, part.new_zeros(self.pad_to - n, part.shape[1])])
                outs.append(kernel(part)[:n])
            else:
                outs.append(kernel(part))
        return torch.cat(outs)


# ----------------------------------------------------------------------------- the probe


def probe_plan(kernel: Callable[[torch.Tensor], torch.Tensor], in_features: int,
               dtype: torch.dtype, max_block: int = MAX_BLOCK, seeds: int = 2) -> RowPlan:
    """The row plan of ``kernel`` (a (M, in) -> (M, out) matmul) on this CPU and thread count.

    For ``pad_to`` in (1, 2): the reference of row r is the row r of a ``pad_to``-row call
    (padded with zeros); the block is the largest M <= ``max_block`` such that every call of
    ``pad_to..M`` rows reproduces the references of all its rows, for ``seeds`` random inputs.
    The first ``pad_to`` whose block is at least 2 wins; else ``RowPlan(1, 1)``."""
    gens = [torch.Generator().manual_seed(1234 + s) for s in range(seeds)]
    xs = [torch.randn(max_block, in_features, generator=g).to(dtype) for g in gens]
    with torch.inference_mode():
        for pad_to in (1, 2):
            plan = RowPlan(pad_to, 1)
            refs = [torch.cat([plan.run(kernel, x[r : r + 1]) for r in range(max_block)])
                    for x in xs]
            block = 1
            for m in range(2, max_block + 1):
                if not all(torch.equal(kernel(x[:m]), ref[:m]) for x, ref in zip(xs, refs)):
                    break
                block = m
            if block >= 2:
                return RowPlan(pad_to, block)
    return RowPlan(1, 1)


class MachineCache:
    """One section (``"plans"`` or ``"verdicts"``) of this machine's JSON file under
    ``$NEST_HOME/exactness/``, memoised in the process; thread-safe. A value is measured once
    per key and machine; deleting the file measures again."""

    def __init__(self, section: str) -> None:
        self.section = section
        self._lock = threading.Lock()
        self._memo: dict[str, Any] = {}

    @staticmethod
    def path() -> Path:
        from nest_integrations import paths
        from nest_integrations.lm.backend import machine_name

        slug = re.sub(r"[^A-Za-z0-9]+", "-", machine_name()).strip("-")[:80] or "unknown"
        return paths.nest_home() / "exactness" / f"{slug}.json"

    def get(self, key: str, measure: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._memo:
                return self._memo[key]
            path = self.path()
            data = _read(path)
            if key in data.get(self.section, {}):
                self._memo[key] = data[self.section][key]
                return self._memo[key]
            value = self._memo[key] = measure()
            LOG.info("%s %s: %s (measured)", self.section, key, value)
            data = _read(path)  # another process may have written meanwhile
            data.setdefault(self.section, {})[key] = value
            _write(path, data)
            return value

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _write(path: Path, data: dict[str, Any]) -> None:
    from nest_integrations import paths

    try:
        paths.ensure_dir(path.parent)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, **data}, indent=1,
                                  sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # a read-only home: the value still serves this process
        LOG.warning("could not cache row-exactness results in %s: %s", path, exc)


PLANS = MachineCache("plans")


def plan_key(kind: str, in_features: int, out_features: int, bias: bool, threads: int) -> str:
    return (f"{kind}|{in_features}x{out_features}|{'bias' if bias else 'nobias'}|t{threads}"
            f"|torch{torch.__version__}")


# ----------------------------------------------------------------------------- linears


class RowExactLinear(torch.nn.Module):
    """An ``nn.Linear`` whose passes of up to ``EXACT_ROWS`` rows run by the probed row plan
    of its kernel (``kind``), so each row gets the bits of a one-token step.

    ``weight`` and ``bias`` are the original parameters (shared, not copied): state dicts, tied
    embeddings and fingerprints see the same tensors. Subclasses change the kernel
    (``lm.packing.PackedLinear``: oneDNN-prepacked bf16)."""

    kind = "torch-linear"

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            self.kernel = self.make_kernel(linear.weight, linear.bias)
        self._plans: dict[int, RowPlan] = {}
        #: False: every pass in one kernel call (the loader's ``exact_rows=False``).
        self.exact = True

    @staticmethod
    def make_kernel(weight: torch.Tensor, bias: torch.Tensor | None
                    ) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
        """The matmul of (M, in) rows with ``weight``: (M, out)."""
        return lambda x: F.linear(x, weight, bias)

    def plan(self) -> RowPlan:
        """The row plan for the current thread count (probed once per machine, cached)."""
        threads = torch.get_num_threads()
        plan = self._plans.get(threads)
        if plan is None:
            dtype = self.weight.dtype
            key = plan_key(f"{self.kind}-{str(dtype).removeprefix('torch.')}", self.in_features,
                           self.out_features, self.bias is not None, threads)
            found = PLANS.get(key, lambda: list(astuple(probe_plan(
                self._random_kernel(), self.in_features, dtype))))
            plan = self._plans[threads] = RowPlan(*found)
        return plan

    def _random_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """A kernel of this kind and shape on random weights: the plan depends on shapes, dtype,
        threads and CPU, not on the weights' values."""
        g = torch.Generator().manual_seed(99)
        dtype = self.weight.dtype
        w = (torch.randn(self.out_features, self.in_features, generator=g) * 0.05).to(dtype)
        b = None if self.bias is None else torch.randn(self.out_features, generator=g).to(dtype)
        return self.make_kernel(w, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or x.device.type != "cpu" or x.numel() == 0:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > EXACT_ROWS or not self.exact or not _EXACT.get():
            y = self.kernel(flat)
        else:
            y = self.plan().run(self.kernel, flat)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, kernel={self.kind}")


def make_row_exact(model: torch.nn.Module, linear_cls: type[RowExactLinear] = RowExactLinear) -> int:
    """Replace every plain ``nn.Linear`` of ``model`` (in place) by ``linear_cls``; returns how
    many. Subclasses of ``nn.Linear`` (quantised, LoRA) are left alone."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, linear_cls(child))
                count += 1
    return count


def row_plans(model: torch.nn.Module) -> dict[str, list[int]]:
    """``{"<in>x<out>": [pad_to, block]}`` of the model's row-exact linears at the current
    thread count (for reports and ``nest info``)."""
    out: dict[str, list[int]] = {}
    for m in model.modules():
        if isinstance(m, RowExactLinear):
            p = m.plan()
            out.setdefault(f"{m.in_features}x{m.out_features}", [p.pad_to, p.block])
    return out


# ----------------------------------------------------------------------------- model check


def check_rows(lm: Any, sizes: tuple[int, ...] = (2, 3, 5, 9, 17), tree: bool = True) -> bool:
    """Whether ``lm``'s verify passes equal one-token steps bit for bit: for each T in
    ``sizes``, the logits of one T-token pass after a 40-token cache against T one-token
    steps; with ``tree``, a 6-node token tree's rows against steps along each branch. One cache
    is alive at a time, as in a generation (a backend may lay a second one out differently)."""
    vocab = int(lm.vocab_size)
    trees = port_of(lm).trees
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (40 + max(sizes),), generator=g).tolist()
    prompt = ids[:40]

    def run(new: list[int], parents: list[int] | None = None) -> torch.Tensor:
        cache = lm.new_cache()
        try:
            lm.forward(prompt, cache, last=1)
            if parents is not None and trees is not None:
                return trees.forward_tree(new, parents, cache)[0]
            return lm.forward(new, cache)[0]
        finally:
            del cache
            gc.collect()  # the cache's resources go back before the next one is made

    def steps(new: list[int]) -> torch.Tensor:
        cache = lm.new_cache()
        try:
            lm.forward(prompt, cache, last=1)
            return torch.cat([lm.forward([t], cache)[0] for t in new])
        finally:
            del cache
            gc.collect()

    step_logits = steps(ids[40:])
    for size in sizes:
        if not torch.equal(run(ids[40 : 40 + size]), step_logits[:size]):
            LOG.info("rows of a %d-token pass differ from one-token steps", size)
            return False
    if tree and trees is not None:
        a, b = ids[40:43], ids[43:46]
        rows = run(a + b, [-1, 0, 1, -1, 3, 4])
        if not (torch.equal(rows[:3], step_logits[:3]) and torch.equal(rows[3:], steps(b))):
            LOG.info("rows of a token tree differ from one-token steps")
            return False
    return True


__all__ = ["ENV", "EXACT_ROWS", "MAX_BLOCK", "PLANS", "MachineCache", "RowExactLinear", "RowPlan", "check_rows",
           "env_allows", "exact_wanted", "inexact_rows", "make_row_exact", "probe_plan",
           "row_plans"]
