"""The llama.cpp side of ``lm.llama_cpp``: one model, one context and its sequences, through
llama-cpp-python's low-level API (``llama_cpp.llama_decode`` and friends; no C of our own).

``LlamaCppRuntime.load(path, threads=...)`` opens a GGUF file with:

- a unified KV cache (``kv_unified``) shared by up to ``MAX_SEQUENCES`` sequences, so a cache,
  a tree branch or a passage is a sequence id, and copying a prefix to another sequence only
  tags cells (``llama_memory_seq_cp``);
- ``embeddings=True`` with ``pooling_type=NONE``: when on (``llama_set_embeddings``), a decode
  returns every row's final-norm state beside its logits, and llama.cpp then outputs every row;
- with ``key_layer="ffn_norm"`` (the last layer's pre-FFN norm output, ``ffn_norm-<L>``: the
  paper's key), llama.cpp's eval callback (``cb_eval``) copies that tensor's rows out of a
  decode that wants keys instead (``KeyCapture``; every row of such a decode is an output, so
  the tensor holds every row). The callback runs in Python for every graph node of every
  decode of that context (its cost: ``benchmarks/results/key_source.md``);
- flash attention on: with it, row i of a T-token decode (T < 64) equals a one-token step bit
  for bit for the embedded model's Q8_0 and Q4_0 (``docs/llama_cpp.md``; for other weight types
  the model checks it and verifies drafts a row at a time where it does not hold);
- llama.cpp's extra weight buffer types (repacked layouts of Q4_0, IQ4_NL, Q4_K ...) on, as in
  ``Llama``, so steps equal a user's ``Llama`` steps, except with a build that has AMX kernels
  (``repack_by_default``);
- a KV cache of ``kv_type`` (``kv_cache_type``): F16, llama.cpp's default, or BF16. ggml's
  flash attention splits a one-token decode's KV cells across threads once the cache spans 512
  cells, but only for an F16 or F32 cache, and the merged partial softmaxes round differently
  from a verify row. So with F16 at 2+ threads, while ``exact_steps`` is set and a cell past
  the 256th may be in use (``SPLIT_FREE_CELLS``; the runtime keeps an upper bound of the cells
  in use, ``cells_bound``): by default (``steps_as_llama``) steps run on every thread, as
  ``Llama``'s, and the model decodes verify rows one at a time; otherwise one-token decodes run
  on one thread, bit-exact with rows decoded together. Below that (short prompts: the view is
  256 cells, never split) steps run on every thread and rows are decoded together; batches
  always run on ``threads``. With BF16 every one-token step takes the row path on every thread
  (bit-exact with verify rows, measured at 2 threads and 600 cached positions), at the price of
  a slower prompt decode.

Not thread-safe: ``LlamaCppLanguageModel`` locks around every call.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
import weakref
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nest_integrations import _optional

LOG = logging.getLogger(__name__)

#: Sequences of the context's unified KV cache: caches, tree branches, passage batches.
MAX_SEQUENCES = 64
#: Tokens per ``llama_decode`` (and per micro-batch): llama-cpp-python's ``Llama`` default, so
#: a prompt is processed in the same batches as ``Llama.create_completion`` processes it.
BATCH_TOKENS = 512
#: ggml's ids of the KV cache types ``load`` accepts (llama-cpp-python 0.3.36 exports no
#: ``GGML_TYPE_BF16``): ``enum ggml_type``.
KV_TYPES = {"F16": 1, "BF16": 30}
#: KV cache types whose one-token decodes ggml's flash attention splits over threads (its
#: split-KV path, past 512 cells), so that they are exact only on one thread.
SPLIT_KV_TYPES = frozenset({"F16"})
#: KV cells in use up to which a one-token decode never takes that split path: llama.cpp pads
#: the attended view to a multiple of 256 cells (``llama_kv_cache::get_n_kv``) and ggml splits
#: views of 512 or more (``use_split_kv_path`` in ``ggml-cpu/ops.cpp``), so while no cell past
#: the 256th is in use, exact one-token steps run on every thread too.
SPLIT_FREE_CELLS = 256
#: llama.cpp's log levels (``enum ggml_log_level``) as ``logging`` levels, one lower (its
#: errors are warnings here: the calls that fail raise their own errors); 5 continues a line.
_LOG_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO,
               4: logging.WARNING}
_log_callback: Any = None  # kept alive while llama.cpp holds it
_INIT_LOCK = threading.Lock()
_initialised = False


def kv_cache_type(kv_type: str | None) -> str:
    """The KV cache type to run: ``kv_type``, or for None F16 (llama.cpp's default).

    BF16 is the choice for lossless drafting on 2+ threads with short prompts: ggml splits a
    one-token step's attention over threads only for an F16/F32 cache, so with BF16 exact steps
    run on every thread. Measured on the AMD EPYC, Q8_0, 2 threads: a step at 700 cached
    positions takes 10.8 ms against 12.6 ms for an exact F16 step (one thread), but a prompt
    decodes 1.3-1.7x slower (ggml's tiled flash attention takes F16/F32 caches only: 700 tokens
    in 1.62 s against 0.96 s), which outweighs it on retrieval-augmented prompts; on one thread
    BF16 steps cost about 10% more. Perplexity is the same (``docs/llama_cpp.md``)."""
    name = "F16" if kv_type is None else str(kv_type).upper()
    if name not in KV_TYPES:
        raise ValueError(f"kv_type={kv_type!r} is not supported: use "
                         f"{' or '.join(map(repr, KV_TYPES))}")
    return name


def repack_by_default(lib: Any) -> bool:
    """Whether a model loads with llama.cpp's extra weight buffer types (``use_extra_bufts``,
    on in ``Llama``): the repacked layouts of Q4_0, IQ4_NL, Q4_K ... (``REPACK`` in the system
    info), so that steps run as a user's ``Llama`` runs them (on this build Q4_0 and IQ4_NL
    steps took 7.5 ms against 10.7-10.9 ms unpacked: ``docs/llama_cpp.md``). Off where the
    build has AMX kernels (``AMX_INT8`` in the system info: ``GGML_NATIVE=ON`` on a CPU that
    lists AMX), which die of SIGILL where the kernel does not grant AMX tiles (these VMs);
    the package's builds compile none (``scripts/install_llamacpp.sh``)."""
    info = lib.llama_print_system_info().decode("utf-8", "replace")
    return "AMX_INT8 = 1" not in info


def llama_cpp_module() -> Any:
    """``llama_cpp`` (llama-cpp-python), or an ImportError naming the ``llamacpp`` extra."""
    return _optional.require("llama_cpp", extra="llamacpp")


def _init(lib: Any) -> None:
    """Once per process: llama.cpp's messages to this module's logger, ``llama_backend_init``."""
    global _initialised, _log_callback
    with _INIT_LOCK:
        if _initialised:
            return
        last = [logging.DEBUG]

        def forward(level: int, text: bytes, _user: Any) -> None:
            lvl = last[0] if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
            last[0] = lvl
            if LOG.isEnabledFor(lvl):
                LOG.log(lvl, "llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

        _log_callback = lib.llama_log_callback(forward)
        lib.llama_log_set(_log_callback, ctypes.c_void_p(0))
        lib.llama_backend_init()
        _initialised = True


# ``struct ggml_tensor`` (ggml.h) offsets on 64-bit platforms: type, ne[4], nb[4], data, name.
_T_TYPE, _T_NE, _T_NB, _T_DATA, _T_NAME = 0, 16, 48, 248, 256
_GGML_TYPE_F32 = 0


class KeyCapture:
    """llama.cpp's eval callback (``cb_eval``): while ``on``, asks the scheduler for the tensor
    named ``name`` and copies its rows (``(rows, n_embd)`` fp32) into ``rows`` after each graph
    computes it; off, it asks for nothing (the scheduler then computes the graph in one piece)."""

    def __init__(self, lib: Any, layer: str, index: int, width: int) -> None:
        self.layer = layer  #: the tensor's name in every layer (``"ffn_norm"``)
        self.name, self.width = f"{layer}-{index}".encode(), width
        self.on = False
        self.rows: list[np.ndarray] = []
        self.error: str | None = None
        self.fn = lib.ggml_backend_sched_eval_callback(self._call)

    def _call(self, t: int, ask: bool, _user: Any) -> bool:
        if not self.on:
            return False  # an ask: nothing needed (no after-call follows a False)
        if ctypes.string_at(t + _T_NAME) != self.name:
            return not ask  # an ask: not this one; after a compute: go on
        if ask:
            return True
        ne = (ctypes.c_int64 * 4).from_address(t + _T_NE)
        nb1 = ctypes.c_size_t.from_address(t + _T_NB + 8).value
        kind = ctypes.c_int32.from_address(t + _T_TYPE).value
        if kind != _GGML_TYPE_F32 or ne[0] != self.width or nb1 != 4 * self.width:
            # raising here would only be printed by ctypes (and a False stops the graph): keep
            # the reason for ``take``, and let the decode finish
            self.error = (f"llama.cpp tensor {self.name.decode()} is not a contiguous fp32 "
                          f"(rows, {self.width}) matrix (type {kind}, ne {list(ne)})")
            return True
        data = ctypes.c_void_p.from_address(t + _T_DATA).value
        self.rows.append(_floats(data, ne[1], ne[0]))
        return True

    def take(self, n: int) -> np.ndarray:
        """The rows captured since the last ``take`` (``n`` expected)."""
        rows, self.rows = _stack(self.rows, self.width), []
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(error)
        if len(rows) != n:
            raise RuntimeError(f"llama.cpp's graph gave {len(rows)} rows of "
                               f"{self.name.decode()} for {n} outputs: this model's graph does "
                               "not name its key tensor so; use key_source='final_norm'")
        return rows


class LlamaCppRuntime:
    """A loaded GGUF model and its context (``load`` does the I/O; see the module docstring)."""

    def __init__(self, lib: Any, model: Any, ctx: Any, *, path: Path, threads: int,
                 capture: KeyCapture | None = None, kv_type: str = "F16",
                 repack: bool = False) -> None:
        self.lib, self.model, self.ctx, self.path, self.threads = lib, model, ctx, path, threads
        self.kv_type = kv_type  # the context's KV cache type (``KV_TYPES``)
        self.repack = repack  # loaded with the extra weight buffer types (``repack_by_default``)
        #: copies the key tensor out of a decode (None: keys are the embeddings output)
        self.capture = capture
        self.vocab = lib.llama_model_get_vocab(model)
        self.mem = lib.llama_get_memory(ctx)
        self.n_embd = int(lib.llama_model_n_embd(model))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(model))
        self.n_batch = int(lib.llama_n_batch(ctx))
        self.batch = lib.llama_batch_init(self.n_batch, 0, MAX_SEQUENCES)
        self.quantization = quantization_name(lib, model)
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(model, buf, len(buf))
        self.description = buf.value.decode("utf-8", "replace")
        self._free = list(range(MAX_SEQUENCES - 1, -1, -1))
        self._released: list[int] = []  # sequences of collected caches, cleared on next use
        self._embeddings: bool | None = None
        self._step_threads = 0
        #: an upper bound of the KV cells in use (one past the highest: llama.cpp's
        #: ``used_max_p1``), and the one sequence that holds them at cells equal to its
        #: positions from cell 0, when one does (None: laid out otherwise, the bound only grows)
        self.cells_bound = 0
        self._sole: int | None = None
        self._formatters: dict[str, Any] = {}  # chat template text -> compiled formatter
        self._pieces: dict[tuple[int, bool], bytes] = {}  # (token, special) -> its bytes
        #: exact decoding: verify rows must equal one-token steps (lifted by ``inexact_rows``)
        self.exact_steps = True
        #: with ``exact_steps`` where a step's attention may split (``steps_can_split``, past
        #: ``SPLIT_FREE_CELLS``): True (default), steps run on every thread as ``Llama``'s do
        #: and the model decodes verify rows one at a time there (``LlamaCppLanguageModel``);
        #: False, steps run on one thread, bit-exact with rows decoded together
        self.steps_as_llama = True
        self._closed = False
        self._finalizer = weakref.finalize(self, _free, lib, model, ctx, self.batch)

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
        _init(lib)
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
        self._closed = True
        self._finalizer()

    # ----------------------------------------------------------------------------- sequences

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the llama.cpp model {self.path.name} was closed")

    def take_sequence(self) -> int:
        """A free, empty sequence id."""
        self._check_open()
        self._collect()
        if not self._free:
            raise RuntimeError(f"all {MAX_SEQUENCES} llama.cpp sequences are in use (live "
                               "caches, tree branches): drop unused caches")
        if self.live_sequences() == 0:  # every cell free and the head at cell 0, as when fresh
            self.lib.llama_memory_clear(self.mem, False)
            self.cells_bound, self._sole = 0, None
        seq = self._free.pop()
        self.remove(seq, 0)
        return seq

    def live_sequences(self) -> int:
        """Sequences in use (taken and not yet released)."""
        return MAX_SEQUENCES - len(self._free) - len(self._released)

    def give_back(self, seq: int) -> None:
        """Return an emptied sequence to the pool."""
        self._free.append(seq)

    def release_sequence(self, seq: int) -> None:
        """A collected cache's sequence: emptied and reused at the next ``take_sequence`` (a
        finalizer may run on any thread, so it only records it)."""
        self._released.append(seq)

    def _collect(self) -> None:
        while self._released:
            seq = self._released.pop()
            if not self._closed:
                self.remove(seq, 0)
            self._free.append(seq)

    def remove(self, seq: int, start: int) -> None:
        """Drop positions ``>= start`` of ``seq``."""
        self._check_open()
        if not self.lib.llama_memory_seq_rm(self.mem, seq, int(start), -1):
            raise RuntimeError(f"llama.cpp could not remove positions {start}.. of sequence {seq}")
        if seq == self._sole:  # its cells from ``start`` on are free, and llama.cpp's head there
            self.cells_bound = min(self.cells_bound, max(0, int(start)))

    def copy(self, src: int, dst: int, start: int, end: int) -> None:
        """Add ``dst`` to the cells of ``src`` at positions ``[start, end)`` (no data copied:
        the cache is unified)."""
        if end > start:
            self.lib.llama_memory_seq_cp(self.mem, src, dst, int(start), int(end))
            self._sole = None  # cells held by two sequences: removing one's tail frees none

    def scratch_states(self, seq: int, tokens: Sequence[int], pos: Sequence[int]) -> np.ndarray:
        """Final-norm states of ``tokens`` at ``pos`` after ``seq``'s earlier positions, from a
        decode in a scratch sequence dropped afterwards: ``seq`` and the cells' layout are left
        as they were (the scratch's cells were the free ones after them: ``cells_bound``)."""
        sole, bound = self._sole, self.cells_bound
        scratch = self.take_sequence()
        try:
            self.copy(seq, scratch, 0, pos[0])
            return self.decode(tokens, [(scratch,)] * len(tokens), pos, keys=True,
                               want_logits=False)[1]
        finally:
            self.remove(scratch, 0)
            self.give_back(scratch)
            if sole == seq:
                self._sole, self.cells_bound = sole, bound

    # ----------------------------------------------------------------------------- decoding

    def _set_embeddings(self, on: bool) -> None:
        if self._embeddings is not on:
            self.lib.llama_set_embeddings(self.ctx, on)
            self._embeddings = on

    def _place(self, seqs: Sequence[Sequence[int]], pos: Sequence[int]) -> None:
        """Update ``cells_bound`` for a decode of these tokens. llama.cpp places each new token
        in the first free cell at or after its head (or from cell 0), and its head never passes
        the highest cell in use + 1, so a decode of n tokens raises that cell by at most n;
        the one sequence laid out from cell 0 with no other cell in use (``_sole``) takes the
        cells equal to its positions, and removing its tail frees them (``remove``)."""
        n = len(pos)
        sole = seqs[0][0] if n and len(seqs[0]) == 1 else None
        contiguous = (sole is not None and self._sole in (None, sole)
                      and (self._sole is not None or self.cells_bound == 0)
                      and all(len(s) == 1 and s[0] == sole for s in seqs)
                      and list(pos) == list(range(self.cells_bound, self.cells_bound + n)))
        self._sole = sole if contiguous else None
        self.cells_bound += n

    @property
    def steps_can_split(self) -> bool:
        """Whether ggml may split a one-token step's attention over threads here (2+ threads,
        an F16 cache: ``SPLIT_KV_TYPES``), so that exact steps past ``SPLIT_FREE_CELLS`` run on
        one thread."""
        return self.threads > 1 and self.kv_type in SPLIT_KV_TYPES

    def past_split_free(self, n: int = 1) -> bool:
        """Whether, after ``n`` more tokens are placed, an exact one-token step would take
        ggml's split path (2+ threads, an F16 cache, a cell past ``SPLIT_FREE_CELLS`` possibly
        in use): it then rounds otherwise than a row of a multi-token decode."""
        return self.exact_steps and self.steps_can_split and self.cells_bound + n > SPLIT_FREE_CELLS

    def step_threads(self, n: int = 1) -> int:
        """The threads a one-token decode runs on after ``n`` more tokens are placed: one for an
        exact step that would split (``past_split_free``) unless ``steps_as_llama``, else
        ``threads``."""
        if not self.steps_as_llama and self.past_split_free(n):
            return 1
        return self.threads

    def _set_step_threads(self) -> None:
        step = self.step_threads(0)
        if step != self._step_threads:
            self.lib.llama_set_n_threads(self.ctx, step, self.threads)
            self._step_threads = step

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
        read from llama.cpp's buffer without copying it (``_row_argmax``).
        """
        self._check_open()
        lib, batch, n = self.lib, self.batch, len(tokens)
        capture = self.capture if keys else None
        self._set_embeddings(keys and capture is None)
        self._place(seqs, pos)
        self._set_step_threads()
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
                logits.append(_row_argmax(lib.llama_get_logits(self.ctx), n_out, self.n_vocab))
            elif n_out and want_logits:
                logits.append(_floats(lib.llama_get_logits(self.ctx), n_out, self.n_vocab))
            if capture is not None:
                states.append(capture.take(n_out))
            elif n_out and keys:
                states.append(_floats(lib.llama_get_embeddings(self.ctx), n_out, self.n_embd))
        if argmax:
            return (np.concatenate(logits) if logits else np.zeros(0, np.int64),
                    _stack(states, self.n_embd))
        return _stack(logits, self.n_vocab), _stack(states, self.n_embd)

    # ----------------------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Ids of ``text`` without BOS; ``special``: special tokens' text becomes their ids."""
        self._check_open()
        data = text.encode("utf-8")
        size = len(data) + 16
        while True:
            buf = (self.lib.llama_token * size)()
            n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, size, False, special)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (a special token's text only with ``special``; looked up
        once per token: the text stream detokenizes a few tokens around each commit)."""
        self._check_open()
        key = (int(token), bool(special))
        out = self._pieces.get(key)
        if out is not None:
            return out
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.llama_token_to_piece(self.vocab, key[0], buf, size, 0, key[1])
            if n >= 0:
                out = self._pieces[key] = buf.raw[:n]
                return out
            size = -n

    def detokenize(self, ids: Sequence[int]) -> str:
        self._check_open()
        pieces, piece = self._pieces, self.piece
        return b"".join(pieces.get((t, False)) or piece(t) for t in ids).decode("utf-8",
                                                                                 "replace")

    def special_id(self, text: str) -> int | None:
        """The id of the special token spelled ``text`` (None when the vocabulary has none)."""
        ids = self.tokenize(text, special=True)
        return ids[0] if len(ids) == 1 and self.tokenize(text, special=False) != ids else None

    def bos_id(self) -> int | None:
        bos = int(self.lib.llama_vocab_bos(self.vocab))
        return bos if bos >= 0 else None

    def eos_id(self) -> int | None:
        eos = int(self.lib.llama_vocab_eos(self.vocab))
        return eos if eos >= 0 else None

    def eot_id(self) -> int | None:
        eot = int(self.lib.llama_vocab_eot(self.vocab))
        return eot if eot >= 0 else None

    def chat_template(self) -> str | None:
        ptr = self.lib.llama_model_chat_template(self.model, None)
        return ptr.decode("utf-8") if ptr else None

    def render_chat(self, template: str, messages: list[dict[str, str]]) -> str:
        """``messages`` through the GGUF's Jinja2 chat template with the generation prompt (the
        template is compiled once per template text: 5 ms a request otherwise)."""
        fmt = self._formatters.get(template)
        if fmt is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text(token: int | None) -> str:
                return "" if token is None else self.piece(token, True).decode("utf-8", "replace")

            fmt = self._formatters[template] = Jinja2ChatFormatter(
                template, eos_token=text(self.eos_id()), bos_token=text(self.bos_id()),
                add_generation_prompt=True)
        return fmt(messages=messages).prompt

    def file_digest(self) -> str:
        """sha256 of the file's size and 256 strided 4 KiB samples (fast on large files)."""
        size = self.path.stat().st_size
        h = hashlib.sha256(str(size).encode())
        with open(self.path, "rb") as f:
            for i in range(256):
                f.seek(size * i // 256)
                h.update(f.read(4096))
        return h.hexdigest()


def _stack(parts: list[np.ndarray], width: int) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]  # already a copy of its own (``_floats``)
    return np.concatenate(parts) if parts else np.zeros((0, width), np.float32)


#: ctypes float array types by length, for the outputs of steps and verify passes (up to
#: ``_CACHED_ROWS`` rows); a prompt's rarer, larger outputs make their type each time.
_FLOAT_ARRAYS: dict[int, Any] = {}
_CACHED_ROWS = 64


def _view(ptr: Any, rows: int, width: int) -> np.ndarray:
    """A view of the ``(rows, width)`` float32 block at ``ptr`` (a ctypes float pointer or an
    address), valid until llama.cpp's next decode. ``np.ctypeslib.as_array`` builds the same
    view through ctypes' buffer protocol, about 70 us a call right after a decode (its format
    parsing is cold then): with a cached array type and ``np.frombuffer`` the view costs a
    few, which counts on a 10 ms step."""
    n = rows * width
    kind = _FLOAT_ARRAYS.get(n)
    if kind is None:
        kind = ctypes.c_float * n
        if rows <= _CACHED_ROWS:
            _FLOAT_ARRAYS[n] = kind
    address = ptr if isinstance(ptr, int) else ctypes.cast(ptr, ctypes.c_void_p).value
    if not address:
        raise RuntimeError("llama.cpp returned no output buffer")
    return np.frombuffer(kind.from_address(address), dtype=np.float32).reshape(rows, width)


def _floats(ptr: Any, rows: int, width: int) -> np.ndarray:
    """A copy of the ``(rows, width)`` float32 block at ``ptr`` (see ``_view``)."""
    return _view(ptr, rows, width).copy()


def _row_argmax(ptr: Any, rows: int, width: int) -> np.ndarray:
    """The argmax of each row of the ``(rows, width)`` float32 block at ``ptr`` (int64, the
    first maximum), read in place: a greedy step reads llama.cpp's logits once, instead of
    copying them, wrapping the copy in a tensor and reading that (``docs/llama_cpp.md``)."""
    return _view(ptr, rows, width).argmax(axis=1).astype(np.int64, copy=False)


def _free(lib: Any, model: Any, ctx: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)


def quantization_name(lib: Any, model: Any) -> str:
    """The GGUF's file type as llama.cpp names it, shortened: ``"Q4_1"``, ``"Q8_0"``, ``"F16"``."""
    ftype = int(lib.llama_model_ftype(model))
    name = lib.llama_ftype_name(ftype)
    text = name.decode() if isinstance(name, bytes) else str(name or "")
    return text.removeprefix("MOSTLY_").split(" ")[0].replace("-", "_") or f"ftype{ftype}"


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    """``llama_model_quantize`` of ``src`` to ``qtype`` (``"Q4_0"``, ``"Q8_0"``, ...) into
    ``dst``; requantising a quantised file is allowed."""
    lib = llama_cpp_module()
    _init(lib)
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{qtype}", None)
    if ftype is None:
        raise ValueError(f"unknown llama.cpp quantisation {qtype!r}: use e.g. Q4_0, Q4_1, Q8_0, "
                         "F16")
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = int(threads)
    rc = lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {qtype} failed ({rc})")


__all__ = [
    "BATCH_TOKENS",
    "KV_TYPES",
    "MAX_SEQUENCES",
    "SPLIT_FREE_CELLS",
    "SPLIT_KV_TYPES",
    "LlamaCppRuntime",
    "kv_cache_type",
    "llama_cpp_module",
    "quantization_name",
    "quantize",
]
