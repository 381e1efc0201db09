"""One model, its context and its decodes, through llama-cpp-python's low-level API
(``llama_cpp.llama_decode`` and friends; no C of our own).

``LlamaCppRuntime.load(path, threads=...)`` opens a GGUF file with:

- a unified KV cache (``kv_unified``) shared by up to ``MAX_SEQUENCES`` sequences
  (``sequences.SequencePool``);
- ``embeddings=True`` with ``pooling_type=NONE``: when on (``llama_set_embeddings``), a decode
  returns every row's final-norm state beside its logits, and llama.cpp then outputs every row;
- with ``key_layer="ffn_norm"`` (the last layer's pre-FFN norm output, ``ffn_norm-<L>``: the
  paper's key), llama.cpp's eval callback (``cb_eval``) copies that tensor's rows out of a
  decode that wants keys instead (``outputs.KeyCapture``; every row of such a decode is an
  output, so the tensor holds every row). The callback runs in Python for every graph node of
  every decode of that context (its cost: ``benchmarks/results/key_source.md``);
- flash attention on: with it, row i of a T-token decode (T < 64) equals a one-token step bit
  for bit for the embedded model's Q8_0 and Q4_0 (``docs/decisions.md``, 'llama.cpp (issue
  35)'); for other weight types the model checks it and verifies drafts a row at a time where
  it does not hold;
- llama.cpp's extra weight buffer types (repacked layouts of Q4_0, IQ4_NL, Q4_K ...) on, as in
  ``Llama``, so steps equal a user's ``Llama`` steps, except with a build that has AMX kernels
  (``repack_by_default``);
- a KV cache of ``kv_type`` (``kv_cache_type``): F16, llama.cpp's default, or BF16; which
  threads a one-token step runs on follows from it (``regime.ThreadRegime``).

Not thread-safe: ``LlamaCppLanguageModel`` locks around every call.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nest_integrations.lm.llama_cpp.gguf import quantization_name
from nest_integrations.lm.llama_cpp.library import (
    Handles,
    cpu_level,
    init,
    llama_cpp_module,
    system_info,
)
from nest_integrations.lm.llama_cpp.outputs import KeyCapture, floats, row_argmax, stack
from nest_integrations.lm.llama_cpp.regime import ThreadRegime
from nest_integrations.lm.llama_cpp.sequences import MAX_SEQUENCES, SequencePool
from nest_integrations.lm.llama_cpp.vocab import Vocabulary

LOG = logging.getLogger(__name__)

#: Tokens per ``llama_decode`` (and per micro-batch): llama-cpp-python's ``Llama`` default, so
#: a prompt is processed in the same batches as ``Llama.create_completion`` processes it.
BATCH_TOKENS = 512
#: ggml's ids of the KV cache types ``load`` accepts (llama-cpp-python 0.3.36 exports no
#: ``GGML_TYPE_BF16``): ``enum ggml_type``.
KV_TYPES = {"F16": 1, "BF16": 30}


def kv_cache_type(kv_type: str | None) -> str:
    """The KV cache type to run: ``kv_type``, or for None F16 (llama.cpp's default).

    BF16 is the choice for lossless drafting on 2+ threads with short prompts: ggml splits a
    one-token step's attention over threads only for an F16/F32 cache, so with BF16 exact steps
    run on every thread, faster than exact F16 steps on one thread. But a prompt decodes slower
    (ggml's tiled flash attention takes F16/F32 caches only), which outweighs that on
    retrieval-augmented prompts, and on one thread BF16 steps cost a little more; perplexity is
    the same (``docs/decisions.md``, 'llama.cpp (issue 35)')."""
    name = "F16" if kv_type is None else str(kv_type).upper()
    if name not in KV_TYPES:
        raise ValueError(f"kv_type={kv_type!r} is not supported: use "
                         f"{' or '.join(map(repr, KV_TYPES))}")
    return name


def repack_by_default(lib: Any) -> bool:
    """Whether a model loads with llama.cpp's extra weight buffer types (``use_extra_bufts``,
    on in ``Llama``): the repacked layouts of Q4_0, IQ4_NL, Q4_K ... (``REPACK`` in the system
    info), so that steps run as a user's ``Llama`` runs them, and the types with such a layout
    step faster (``docs/decisions.md``, 'llama.cpp (issue 35)'). Off where the build has AMX
    kernels (``AMX_INT8`` in the system info: ``GGML_NATIVE=ON`` on a CPU that lists AMX),
    which die of SIGILL where the kernel does not grant AMX tiles (as on some VMs); the
    package's builds compile none (``scripts/install_llamacpp.sh``)."""
    return "+amx" not in cpu_level(system_info(lib))


class LlamaCppRuntime:
    """A loaded GGUF model and its context (``load`` does the I/O; see the module docstring):
    its ``vocab``, its ``sequences`` and their cells, its thread ``regime``, and ``decode``."""

    def __init__(self, lib: Any, model: Any, ctx: Any, *, path: Path, threads: int,
                 capture: KeyCapture | None = None, kv_type: str = "F16",
                 repack: bool = False) -> None:
        self.lib, self.model, self.ctx, self.path, self.threads = lib, model, ctx, path, threads
        self.kv_type = kv_type  # the context's KV cache type (``KV_TYPES``)
        self.repack = repack  # loaded with the extra weight buffer types (``repack_by_default``)
        #: copies the key tensor out of a decode (None: keys are the embeddings output)
        self.capture = capture
        self.n_batch = int(lib.llama_n_batch(ctx))
        self.handles = Handles(lib, model, ctx, path=path, batch_tokens=self.n_batch,
                               max_sequences=MAX_SEQUENCES)
        self.batch = self.handles.batch
        self.vocab = Vocabulary(self.handles)
        self.sequences = SequencePool(self.handles)
        self.regime = ThreadRegime(threads, kv_type, self.sequences)
        self.n_embd = int(lib.llama_model_n_embd(model))
        self.n_vocab = self.vocab.n_tokens
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(model))
        self.quantization = quantization_name(lib, model)
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(model, buf, len(buf))
        self.description = buf.value.decode("utf-8", "replace")
        self._embeddings: bool | None = None

    @classmethod
    def load(cls, path: Path, *, threads: int, n_ctx: int | None = None,
             flash_attn: bool = True, key_layer: str | None = None,
             kv_type: str | None = None, repack: bool | None = None) -> "LlamaCppRuntime":
        """Open ``path``. ``key_layer``: None (keys are the final norm's output) or
        ``"ffn_norm"`` (keys are the last layer's ``ffn_norm`` tensor, through ``KeyCapture``).
        ``kv_type``: the KV cache type (``kv_cache_type``; None: F16). ``repack``: load with
        llama.cpp's extra weight buffer types (None: ``repack_by_default``). Whether verify
        rows then equal one-token steps is checked per model (``LlamaCppLanguageModel``)."""
        kv = kv_cache_type(kv_type)
        lib = llama_cpp_module()
        init(lib)
        repack = repack_by_default(lib) if repack is None else bool(repack)
        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = repack
        model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise ValueError(f"llama.cpp could not load {path} (not a GGUF model it supports)")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = int(n_ctx or lib.llama_model_n_ctx_train(model))
        cparams.n_batch = cparams.n_ubatch = BATCH_TOKENS
        cparams.n_seq_max = MAX_SEQUENCES
        cparams.kv_unified = True
        cparams.embeddings = True
        cparams.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        cparams.n_threads = cparams.n_threads_batch = int(threads)
        cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                   else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.type_k = cparams.type_v = KV_TYPES[kv]
        cparams.no_perf = True
        capture = None
        if key_layer is not None:
            last = int(lib.llama_model_n_layer(model)) - 1
            capture = KeyCapture(lib, key_layer, last, int(lib.llama_model_n_embd(model)))
            cparams.cb_eval = capture.fn
        ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            lib.llama_model_free(model)
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        runtime = cls(lib, model, ctx, path=path, threads=int(threads), capture=capture,
                      kv_type=kv, repack=repack)
        LOG.info("llama.cpp: loaded %s (%s, %d threads, flash attention %s, %s KV cache, "
                 "repacked weights %s)", path.name, runtime.quantization, threads,
                 "on" if flash_attn else "off", kv, "on" if repack else "off")
        return runtime

    def close(self) -> None:
        self.handles.close()

    # ----------------------------------------------------------------------------- decoding

    def _set_embeddings(self, on: bool) -> None:
        if self._embeddings is not on:
            self.lib.llama_set_embeddings(self.ctx, on)
            self._embeddings = on

    def decode(
        self, tokens: Sequence[int], seqs: Sequence[Sequence[int]], pos: Sequence[int], *,
        keys: bool, logits_last: int = 0, want_logits: bool = True, argmax: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decode ``tokens`` (token i at position ``pos[i]`` in sequences ``seqs[i]``), one
        ``llama_decode`` per ``n_batch`` tokens.

        With ``keys``: embeddings on, every row is an output; returns ``(T, V)`` logits (empty
        unless ``want_logits``) and ``(T, d)`` final-norm states. Without: embeddings off, only
        the last ``logits_last`` rows are outputs; returns their logits and no states (as
        llama-cpp-python's ``Llama`` processes a prompt). With ``argmax``: each output row's
        argmax (an int64 array, the first maximum, as ``np.argmax``) in place of its logits,
        read from llama.cpp's buffer without copying it (``outputs.row_argmax``).
        """
        self.handles.check_open()
        lib, batch, n = self.lib, self.batch, len(tokens)
        capture = self.capture if keys else None
        self._set_embeddings(keys and capture is None)
        self.sequences.place(seqs, pos)
        self.regime.apply(lib, self.ctx)
        first_out = 0 if keys else n - logits_last
        logits, states = [], []
        for a in range(0, n, self.n_batch):
            b = min(n, a + self.n_batch)
            n_out = 0
            for i in range(a, b):
                j = i - a
                batch.token[j] = int(tokens[i])
                batch.pos[j] = int(pos[i])
                batch.n_seq_id[j] = len(seqs[i])
                for m, s in enumerate(seqs[i]):
                    batch.seq_id[j][m] = s
                batch.logits[j] = i >= first_out
                n_out += i >= first_out
            batch.n_tokens = b - a
            if capture is not None:
                capture.rows, capture.on = [], True
            try:
                rc = lib.llama_decode(self.ctx, batch)
            finally:
                if capture is not None:
                    capture.on = False
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc}"
                                   f"{': no free KV cells' if rc == 1 else ''}) for {b - a} "
                                   f"tokens (n_ctx {lib.llama_n_ctx(self.ctx)})")
            if n_out and argmax:
                logits.append(row_argmax(lib.llama_get_logits(self.ctx), n_out, self.n_vocab))
            elif n_out and want_logits:
                logits.append(floats(lib.llama_get_logits(self.ctx), n_out, self.n_vocab))
            if capture is not None:
                states.append(capture.take(n_out))
            elif n_out and keys:
                states.append(floats(lib.llama_get_embeddings(self.ctx), n_out, self.n_embd))
        if argmax:
            return (np.concatenate(logits) if logits else np.zeros(0, np.int64),
                    stack(states, self.n_embd))
        return stack(logits, self.n_vocab), stack(states, self.n_embd)

    def scratch_states(self, seq: int, tokens: Sequence[int], pos: Sequence[int]) -> np.ndarray:
        """Final-norm states of ``tokens`` at ``pos`` after ``seq``'s earlier positions, from a
        decode in a scratch sequence dropped afterwards (``SequencePool.scratch``)."""
        with self.sequences.scratch(seq, pos[0]) as scratch:
            return self.decode(tokens, [(scratch,)] * len(tokens), pos, keys=True,
                               want_logits=False)[1]

    def states_from_start(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Final-norm states of every position of each token sequence, each read from position
        0 in a sequence of its own, in one decode (split into llama.cpp batches when longer)."""
        pool = self.sequences
        ids = [pool.take() for _ in seqs]
        try:
            tokens = [t for s in seqs for t in s]
            seq_ids = [(ids[j],) for j, s in enumerate(seqs) for _ in s]
            pos = [p for s in seqs for p in range(len(s))]
            _, states = self.decode(tokens, seq_ids, pos, keys=True, want_logits=False)
            bounds = np.cumsum([0] + [len(s) for s in seqs])
            return [states[bounds[j]: bounds[j + 1]] for j in range(len(seqs))]
        finally:
            for s in ids:
                pool.remove(s, 0)
                pool.give_back(s)


__all__ = ["BATCH_TOKENS", "KV_TYPES", "LlamaCppRuntime", "kv_cache_type", "repack_by_default"]
