"""The packaged embedder without transformers (``nest_integrations.embedders.bert``): the same word
pieces and the same bits as transformers' ``BertModel``, and transformers is not imported to
embed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nest_integrations.embedders.minilm import MAX_SEQ_LENGTH, MiniLMEmbedder, default_embedder_path
from nest_integrations.embedders.bert import BertEncoder, UnsupportedCheckpoint

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "nest_integrations" / "data" / "sample"


def _texts() -> list[str]:
    """Passages of the shipped sample corpus, cut at several lengths, and edge cases: empty,
    one letter, non-Latin scripts and accents, a text past the 256 word pieces."""
    out = []
    for path in sorted(SAMPLE.rglob("*.jsonl"))[:2]:
        for line in path.read_text(encoding="utf-8").splitlines()[:30]:
            text = json.loads(line).get("text") or ""
            out += [text, text[: len(text) // 3]]
    assert len(out) >= 20, "the sample corpus should give passages to embed"
    return out + ["", "a", "Ünïcödé naïve café: 中文 テスト", "word " * 400]


@pytest.mark.parametrize("batch", [1, 5, 32])
def test_the_same_word_pieces_and_bits_as_transformers(batch: int) -> None:
    from transformers import AutoModel, AutoTokenizer

    path = str(default_embedder_path())
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    ours = BertEncoder(path)
    texts = _texts()
    for lo in range(0, len(texts), batch):
        chunk = texts[lo: lo + batch]
        ref = tokenizer(chunk, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH,
                        return_tensors="pt")
        with torch.inference_mode():
            want = model(**ref).last_hidden_state
        got, mask = ours.encode(chunk, MAX_SEQ_LENGTH)
        assert torch.equal(ours.tokenize(chunk, MAX_SEQ_LENGTH)[0], ref["input_ids"])
        assert torch.equal(mask, ref["attention_mask"])
        assert torch.equal(got, want), f"hidden states differ for texts {lo}..{lo + batch}"


def test_embedding_does_not_import_transformers() -> None:
    code = ("import sys; from nest_integrations.embedders.minilm import MiniLMEmbedder; "
            "v = MiniLMEmbedder().embed(['How does assert work?', 'x']); "
            "print(v.shape, round(float((v * v).sum()), 4), 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["(2,", "384)", "2.0", "False"]


def test_another_architecture_falls_back_to_transformers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(UnsupportedCheckpoint, match="not a plain BERT"):
        BertEncoder(tmp_path)
    # the packaged checkpoint under transformers gives the vectors of the plain-torch one
    # (one text per batch: the two paths group texts into batches differently)
    path = default_embedder_path()
    plain = MiniLMEmbedder(path, batch_size=1)
    texts = _texts()[:12]
    want = plain.embed(texts)
    via_hf = MiniLMEmbedder(path, batch_size=1)
    from nest_integrations.embedders.minilm import _transformers_model

    via_hf._tokenizer, via_hf._model = _transformers_model(str(path), "cpu")
    np.testing.assert_array_equal(via_hf.embed(texts), want)


def test_batches_by_length_give_each_text_its_own_vector() -> None:
    """Texts grouped by word pieces (``BATCH_TOKENS``) embed as they do one at a time, in the
    caller's order, up to float rounding of the padded batch."""
    texts = _texts()
    grouped = MiniLMEmbedder().embed(texts)
    alone = MiniLMEmbedder(batch_size=1).embed(texts)
    assert grouped.shape == (len(texts), 384)
    np.testing.assert_allclose(grouped, alone, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(grouped, axis=1), 1.0, atol=1e-5)
