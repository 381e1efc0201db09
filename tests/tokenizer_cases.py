"""Tiny random Llamas under each tokenizer family (byte-level BPE, SentencePiece,
WordPiece: the ``any_lm`` fixture) and a passage with text every family splits
differently. Used by ``tests/decoding/test_tokenizers.py`` and
``tests/attribution/test_attribution.py`` (import ``any_lm`` to use the fixture)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from nest_integrations.lm.hf import HFLanguageModel
from tests._tiny import tiny_llama


SAMPLE = Path(__file__).resolve().parents[1] / "nest_integrations" / "data" / "sample"
EXTRA = "東京は日本の首都です。北京是中国的首都。🙂🎉 Café naïve — «quotes» didn't stop."
PASSAGE_TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea. " + EXTRA + " From the accession of "
    "Caesar Augustus as the first Roman emperor, it was a Principate with Italia as the "
    "metropole of its provinces (東京 🙂 Zürich)."
)


def corpus_texts() -> list[str]:
    lines = (SAMPLE / "wikipedia.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()] + [EXTRA]


def sentencepiece_tokenizer(folder: Path):
    spm = pytest.importorskip("sentencepiece")
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_texts()), model_writer=model, vocab_size=1000,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995, num_threads=1,
        minloglevel=2,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
        "legacy": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
    }))
    return AutoTokenizer.from_pretrained(str(folder))


def wordpiece_tokenizer():
    from tokenizers import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    wp = BertWordPieceTokenizer(lowercase=False, strip_accents=False, handle_chinese_chars=True)
    wp.train_from_iterator(
        corpus_texts(), vocab_size=1500, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=wp._tokenizer, bos_token="[CLS]", eos_token="[SEP]",
        unk_token="[UNK]", pad_token="[PAD]",
    )


@pytest.fixture(scope="module", params=["byte-bpe", "sentencepiece", "wordpiece"])
def any_lm(request, tmp_path_factory):
    """``(family, lm)``: a tiny random Llama with each tokenizer family."""
    if request.param == "byte-bpe":
        return request.param, request.getfixturevalue("tiny_lm")
    if request.param == "sentencepiece":
        tok = sentencepiece_tokenizer(tmp_path_factory.mktemp("sp"))
    else:
        tok = wordpiece_tokenizer()
    model = tiny_llama(seed=1, vocab_size=len(tok))
    return request.param, HFLanguageModel(model, tok, name=f"tiny-{request.param}")
