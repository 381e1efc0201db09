"""The GGUF's vocabulary and chat template: tokenize, token pieces, detokenize, the special
tokens the LM port needs (BOS, EOS, end of turn) and prompts rendered with the GGUF's Jinja2
chat template."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Sequence

import numpy as np

from nest_integrations.lm.hf_text import END_TOKENS, tile
from nest_integrations.lm.llama_cpp.library import Handles


class Vocabulary:
    """One loaded model's vocabulary (``llama_model_get_vocab``) and chat template."""

    def __init__(self, handles: Handles) -> None:
        self.handles, self.lib = handles, handles.lib
        self.ptr = handles.lib.llama_model_get_vocab(handles.model)
        self.n_tokens = int(handles.lib.llama_vocab_n_tokens(self.ptr))
        self._formatters: dict[str, Any] = {}  # chat template text -> compiled formatter
        self._pieces: dict[tuple[int, bool], bytes] = {}  # (token, special) -> its bytes

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Ids of ``text`` without BOS; ``special``: special tokens' text becomes their ids."""
        self.handles.check_open()
        data = text.encode("utf-8")
        size = len(data) + 16
        while True:
            buf = (self.lib.llama_token * size)()
            n = self.lib.llama_tokenize(self.ptr, data, len(data), buf, size, False, special)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (a special token's text only with ``special``; looked up
        once per token: the text stream detokenizes a few tokens around each commit)."""
        self.handles.check_open()
        key = (int(token), bool(special))
        out = self._pieces.get(key)
        if out is not None:
            return out
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.llama_token_to_piece(self.ptr, key[0], buf, size, 0, key[1])
            if n >= 0:
                out = self._pieces[key] = buf.raw[:n]
                return out
            size = -n

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        self.handles.check_open()
        pieces, piece = self._pieces, self.piece
        return b"".join(pieces.get((t, False)) or piece(t) for t in ids).decode("utf-8",
                                                                                 "replace")

    def special_id(self, text: str) -> int | None:
        """The id of the special token spelled ``text`` (None when the vocabulary has none)."""
        ids = self.tokenize(text, special=True)
        return ids[0] if len(ids) == 1 and self.tokenize(text, special=False) != ids else None

    def bos_id(self) -> int | None:
        bos = int(self.lib.llama_vocab_bos(self.ptr))
        return bos if bos >= 0 else None

    def eos_id(self) -> int | None:
        eos = int(self.lib.llama_vocab_eos(self.ptr))
        return eos if eos >= 0 else None

    def eot_id(self) -> int | None:
        eot = int(self.lib.llama_vocab_eot(self.ptr))
        return eot if eot >= 0 else None

    def chat_template(self) -> str | None:
        ptr = self.lib.llama_model_chat_template(self.handles.model, None)
        return ptr.decode("utf-8") if ptr else None

    def render_chat(self, template: str, messages: list[dict[str, str]]) -> str:
        """``messages`` through the GGUF's Jinja2 chat template with the generation prompt (the
        template is compiled once per template text, not per request)."""
        fmt = self._formatters.get(template)
        if fmt is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text(token: int | None) -> str:
                return "" if token is None else self.piece(token, True).decode("utf-8", "replace")

            fmt = self._formatters[template] = Jinja2ChatFormatter(
                template, eos_token=text(self.eos_id()), bos_token=text(self.bos_id()),
                add_generation_prompt=True)
        return fmt(messages=messages).prompt


def tokenize_with_offsets(vocab: Vocabulary, text: str) -> tuple[list[int], np.ndarray]:
    """Token ids of ``text`` and ``(m, 2)`` int32 char ranges that tile it (the port's
    ``tokenize_with_offsets``). Each token's bytes come from ``llama_token_to_piece``; a
    character split over several tokens belongs to the last of them (the others get an empty
    range), as in ``lm.hf_text``."""
    ids = vocab.tokenize(text, special=False)
    pieces = [vocab.piece(t) for t in ids]
    if b"".join(pieces) != text.encode("utf-8"):  # no round trip: decode prefixes
        ends = np.array([len(os.path.commonprefix([vocab.detokenize(ids[: k + 1]), text]))
                         for k in range(len(ids))], dtype=np.int64)
        return ids, tile(ends, len(text))
    byte_ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
    char_ends = np.cumsum([len(c.encode("utf-8")) for c in text], dtype=np.int64)
    ends = np.searchsorted(char_ends, byte_ends, side="right")  # chars complete by then
    return ids, tile(ends.astype(np.int64), len(text))


def chat_prompt(vocab: Vocabulary, messages: Sequence[dict[str, str]]) -> list[int]:
    """Prompt ids: the GGUF's chat template (Jinja2, as transformers renders it) with the
    generation prompt and its special tokens parsed; without a template the contents joined by
    blank lines after BOS."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    template = vocab.chat_template()
    if template:
        return vocab.tokenize(vocab.render_chat(template, msgs), special=True)
    bos = vocab.bos_id()
    return ([bos] if bos is not None else []) + vocab.tokenize(
        "\n\n".join(m["content"] for m in msgs), special=False)


def eos_token_ids(vocab: Vocabulary) -> frozenset[int]:
    """EOS and EOT of the GGUF plus the usual end-of-turn tokens it has (as ``lm.hf``)."""
    ids = {vocab.eos_id(), vocab.eot_id()} | {vocab.special_id(t) for t in END_TOKENS}
    return frozenset(i for i in ids if i is not None)


def passage_prefix(vocab: Vocabulary) -> list[int]:
    """``[BOS, "\\n"]`` (EOS when there is no BOS), as the torch backend's."""
    start = vocab.bos_id() if vocab.bos_id() is not None else vocab.eos_id()
    if start is None:
        raise ValueError("the GGUF has neither a BOS nor an EOS token to start passages with")
    return [start] + vocab.tokenize("\n", special=False)[-1:]


__all__ = ["Vocabulary", "chat_prompt", "eos_token_ids", "passage_prefix",
           "tokenize_with_offsets"]
