"""What the copy drafters share: typed options, EOS cutting, n-gram search, draft-length
adaptation, and corpus drafts (DReSD, REST) with their datastore and token trees.

- ``parse_options``: a ``drafter_options`` dict -> the method's option dataclass (a clear
  ValueError on an unknown key or a bad value);
- ``find_ngram`` / ``adapt_length``: used by prompt lookup, RAG-copy, DReSD and REST
  (``cut_at_eos`` is in ``core.tokens``);
- ``CorpusOptions`` / ``open_datastore`` / ``default_datastore_for`` / ``corpus_draft``: the
  datastore-backed drafters (``dresd``, ``rest``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence, TypeVar

from nest_integrations.drafters.base import DecodeState, Draft, DrafterContext, Source

T = TypeVar("T")

_COERCE = {"int": int, "float": float, "str": str}


def parse_options(cls: type[T], options: Mapping[str, Any] | T | None, method: str) -> T:
    """``options`` (a ``drafter_options`` dict, a ready ``cls`` or None) as a ``cls``.

    Numbers and strings are converted to the field's type (``"8"`` -> 8); an unknown key is a
    ValueError naming the method and its known options."""
    if isinstance(options, cls):
        return options
    opts = dict(options or {})
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(opts) - set(names))
    if unknown:
        raise ValueError(f"unknown drafter option(s) {unknown} for decoding={method!r}: "
                         f"its options are {names}")  # fmt: skip
    types = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key, value in opts.items():
        conv = _COERCE.get(str(types[key]))
        if conv is not None and value is not None and not isinstance(value, bool):
            try:
                opts[key] = conv(value)
            except (TypeError, ValueError):
                raise ValueError(f"decoding={method!r}: drafter option {key}={value!r} is not "
                                 f"a valid {types[key]}") from None  # fmt: skip
    return cls(**opts)


def check_at_least(method: str, options: Any, names: Sequence[str], minimum: int = 1) -> None:
    """Raise ValueError when an integer option of ``options`` is below ``minimum``."""
    for name in names:
        if getattr(options, name) < minimum:
            got = getattr(options, name)
            raise ValueError(f"{method} {name} must be >= {minimum}, got {got!r}")


def find_ngram(seq: Sequence[int], pattern: Sequence[int], *, last: bool = False,
               end: int | None = None) -> int | None:
    """Start of an occurrence of ``pattern`` in ``seq[:end]``: the first one, or with
    ``last=True`` the most recent one; None when absent."""
    n = len(pattern)
    if n == 0:
        return None
    limit = (len(seq) if end is None else end) - n
    first, pat = pattern[0], list(pattern)
    order = range(limit, -1, -1) if last else range(limit + 1)
    for i in order:
        if seq[i] == first and list(seq[i : i + n]) == pat:
            return i
    return None


def adapt_length(current: int, drafted: int, accepted: int, maximum: int) -> int:
    """Draft length for the next step: grow by 2 after a full acceptance, else shrink to one
    more than what was accepted (a rejected token costs a verify row; on CPU a long rejected
    draft costs up to twice a one-token step). Bounded to ``[2, maximum]``."""
    if accepted >= drafted:
        return min(maximum, current + 2)
    return max(2, min(current, accepted + 1))


@dataclass
class NgramOptions:
    """Options of the n-gram lookup drafters (prompt lookup, RAG-copy): the defaults are prompt
    lookup's; each subclass sets ``method`` (and RAG-copy its own defaults).

    Attributes:
        max_ngram: longest context suffix looked up.
        min_ngram: shortest one.
        num_tokens: longest draft; the length adapts to acceptance below it (``adapt_length``).
        cost_model: None (default): ``adapt_length``'s fixed rule (on llama.cpp: ``"auto"``,
            ``lm.cost.BACKEND_COST_MODEL``); ``"off"``: the fixed rule. ``"auto"``, a
            ``lm.cost.CostCurve``, its JSON dict or a list of c(T)/c(1) ratios: each draft's
            length is the one the measured verify cost pays for at the acceptance measured
            so far in the generation (``lm.cost.DraftPlanner``; 0 = a plain step).
    """

    method: ClassVar[str] = ""
    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 10
    cost_model: Any = None

    def __post_init__(self) -> None:
        check_at_least(self.method, self, ("max_ngram", "min_ngram", "num_tokens"))


class AdaptiveLength:
    """``propose``, ``cite`` and ``update`` of the n-gram drafters (each defines
    ``continuation``): ``num_tokens`` follows ``adapt_length`` up to ``options.num_tokens``, or
    the cost model's choice when ``options.cost_model`` is set (``use_cost_model``)."""

    options: NgramOptions
    num_tokens: int
    planner: Any = None
    #: ``(len(out_ids), draft or None)`` of ``propose``'s last lookup, reused by ``cite``
    _looked: tuple[int, Draft | None] | None = None

    def use_cost_model(self, lm: Any, backend_default: bool = False) -> None:
        """Plan draft lengths with ``options.cost_model`` (no-op when it is None; with
        ``backend_default``, None is the backend's default, ``lm.cost.BACKEND_COST_MODEL``)."""
        from nest_integrations.lm import cost

        option = self.options.cost_model
        if backend_default:
            option = cost.backend_default(option, lm)
        self.planner = cost.planner_for(option, lm, self.options.num_tokens)
        if self.planner is not None:
            self.num_tokens = self.planner.length()

    def continuation(self, state: DecodeState, n_draft: int) -> Draft | None:
        """The method's draft of at most ``n_draft`` tokens at ``state`` (the n-gram lookup),
        or None when nothing matches."""
        raise NotImplementedError

    def propose(self, state: DecodeState) -> Draft | None:
        n_draft = min(self.num_tokens, state.budget)
        if n_draft < 1:
            return None
        draft = self.continuation(state, n_draft)
        self._looked = (len(state.out_ids), draft)
        if draft is not None and self.planner is not None and not self.planner.pays(len(draft)):
            return None  # a match shorter than planned does not pay: a plain step, cite() reads it
        return draft

    def cite(self, state: DecodeState, token: int) -> Source:
        """A plain step's token (the loop verified no draft): its source when it is the token
        this drafter would have drafted here, else None. A copy is then cited without paying
        for a verify pass (on llama.cpp the cost model often skips drafts, ``lm.cost``), and
        with a cost model the match counts toward the acceptance estimate, so drafting
        resumes where the copying would pay."""
        looked, self._looked = self._looked, None
        if looked is not None and looked[0] == len(state.out_ids):
            guess = looked[1]  # propose() looked up this position and found nothing
        else:
            guess = self.continuation(state, 1)
        if guess is None or not guess.tokens:
            return None
        hit = guess.tokens[0] == token
        if self.planner is not None:
            self.planner.observe(1, int(hit))
            self.num_tokens = self.planner.length()
        return guess.sources[0] if hit and guess.sources else None

    def update(self, state: DecodeState, draft: Draft, n_accepted: int) -> None:
        if self.planner is not None:
            self.planner.observe(len(draft), n_accepted)
            self.num_tokens = self.planner.length()
            return
        self.num_tokens = adapt_length(self.num_tokens, len(draft), n_accepted,
                                       self.options.num_tokens)  # fmt: skip


# ----------------------------------------------------------------------------- corpus drafts

SHAPES = ("tree", "chain")


@dataclass
class CorpusOptions:
    """Options every datastore drafter shares.

    Attributes:
        datastore: the DReSD datastore path; None = ``<persist dir>/dresd/<collection>`` of
            the engine's Chroma retriever (``default_datastore_for``).
        num_drafts: candidate continuations merged into one token tree.
        draft_len: tokens per candidate.
        shape: ``"chain"`` (only the best candidate) or ``"tree"`` (all, merged on prefixes).
        max_nodes: token-tree size cap.
    """

    datastore: str | None = None
    num_drafts: int = 4
    draft_len: int = 8
    shape: str = "chain"
    max_nodes: int = 32

    def check(self, method: str) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"{method} shape={self.shape!r} is invalid: allowed one of {SHAPES}")
        check_at_least(method, self, ("num_drafts", "draft_len", "max_nodes"))


_CACHE: "OrderedDict[tuple[str, str, str], Any]" = OrderedDict()
_CACHE_LOCK = threading.Lock()


def open_datastore(path: str | Path, lm: Any) -> Any:
    """The datastore at ``path`` for ``lm`` (cached: the 2 most recently used stay open)."""
    from nest_integrations.dresd.datastore import DresdDatastore

    root = Path(path)
    current = root / "CURRENT"
    version = current.read_text().strip() if current.exists() else ""
    key = (str(root.resolve()), version, lm.fingerprint)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    ds = DresdDatastore.open(root, lm)
    with _CACHE_LOCK:
        _CACHE[key] = ds
        while len(_CACHE) > 2:
            _CACHE.popitem(last=False)
    return ds


def default_datastore_for(ctx: DrafterContext) -> Path:
    """``<persist dir>/dresd/<collection>`` of the engine's Chroma retriever (``nest`` in the
    default persist dir otherwise)."""
    from nest_integrations.dresd.datastore import default_datastore_path

    retriever = ctx.retriever
    collection = getattr(retriever, "collection_name", None) or "nest"
    persist = getattr(retriever, "persist_dir", None)
    return default_datastore_path(collection, persist)


def datastore_of(ctx: DrafterContext, options: CorpusOptions) -> Any:
    """The open datastore ``options`` name (or the engine's default one)."""
    return open_datastore(options.datastore or default_datastore_for(ctx), ctx.lm)


def trie(
    cands: list[tuple[int, list[int]]], max_nodes: int
) -> tuple[list[int], list[int], list[int]]:
    """Merge drafts on shared prefixes: node tokens, parents (topological) and the corpus row
    of each node (from the first, i.e. best, draft that supplies it)."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for g, seq in cands:
        parent = -1
        for i, t in enumerate(seq):
            node = child.get((parent, t))
            if node is None:
                if len(tokens) >= max_nodes:
                    break
                node = len(tokens)
                child[(parent, t)] = node
                tokens.append(t)
                parents.append(parent)
                rows.append(g + 1 + i)
            parent = node
    return tokens, parents, rows


def corpus_draft(
    state: DecodeState, cands: list, datastore: Any, registered: dict, options: CorpusOptions
) -> Draft | None:
    """The draft of corpus candidates ``(row before the draft, tokens)``, best first: only the
    best one as a chain (``shape="chain"``, or when sampling), else all merged into a token
    tree. Each token is sourced to its corpus position; passages are registered with the
    generation once (``registered`` maps datastore passage -> generation passage index; the
    draft's ``new_passages`` carry the new ones to the loop)."""
    if options.shape == "chain" or state.generator is not None:  # sampling: one chain
        cands = cands[:1]
    if not cands:
        return None
    tokens, parents, rows = trie(cands, options.max_nodes)
    sources: list[Source] = []
    new: list = []  # passages this draft registers (the loop adds them as it receives it)
    for r in rows:
        p = datastore.passage_of(r)
        if p not in registered:  # the drafter lives for one generation
            registered[p] = state.passage_index(datastore.passage(p),
                                                datastore.passage_offsets(p), new)
        sources.append((registered[p], r - int(datastore.bounds[p])))
    tree = any(p != i - 1 for i, p in enumerate(parents))
    return Draft(tokens, sources, parents=parents if tree else None, new_passages=tuple(new),
                 candidates=len(cands))


__all__ = [
    "AdaptiveLength",
    "CorpusOptions",
    "NgramOptions",
    "SHAPES",
    "adapt_length",
    "corpus_draft",
    "datastore_of",
    "default_datastore_for",
    "find_ngram",
    "open_datastore",
    "parse_options",
    "trie",
]
