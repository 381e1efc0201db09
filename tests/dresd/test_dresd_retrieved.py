"""Regression (issue 20, item 8): DReSD cites a datastore passage that the engine also retrieved.

``nest ask "..." --decoding dresd`` over an ingested collection crashed with ``TypeError:
'NoneType' object is not subscriptable`` in ``core/citations.py``: DReSD uses no token memory,
so the generation's retrieved passages are registered without token offsets; a draft from the
same passage (same id, the collection's datastore) was mapped onto that entry, and citing the
accepted tokens read its missing offsets. Here, on the tiny random Llama: a retrieved passage
that holds the model's own greedy answer is drafted from, and the accepted tokens must come back
as exact verbatim citations of it, with the same tokens as greedy decoding, under the default
preset and under ``paper``. The real-model, CLI and ``from_defaults`` versions are in
``tests/test_readme.py``.
"""

from __future__ import annotations

import pytest

from nest_integrations.assembly import DEFAULT_PRESET
from nest_integrations.config import NestConfig
from nest_integrations.dresd import PassageSource, build_datastore
from nest_integrations.decoding.engine import NestEngine
from nest_integrations.index.in_memory_store import InMemoryKeyStore
from nest_integrations.types import Passage

TEXTS = [
    "Belly dance is a Middle Eastern dance that originated in Egypt.",
    "The assert statement is a convenient way to insert debugging assertions.",
    "Paris is the capital and most populous city of France.",
]
MESSAGES = [{"role": "user", "content": "What is belly dance?"}]
N = 16


@pytest.mark.parametrize("preset", [DEFAULT_PRESET, "paper"])
def test_dresd_cites_a_retrieved_passage_exactly(tiny_lm, tmp_path, preset):
    cfg = NestConfig.from_preset(preset).replace(temperature=0.0)
    engine = NestEngine(tiny_lm, None, InMemoryKeyStore(), cfg)
    top = [Passage(id=f"p{i}", text=t, doc_id=f"d{i}") for i, t in enumerate(TEXTS)]
    ref = engine.generate(MESSAGES, passages=top, decoding="greedy", max_new_tokens=N)
    assert len(ref.token_ids) >= 8, ref.text
    # A fourth retrieved passage (below the top 3 the RA prompt holds, so the prompt is the
    # same) that contains the greedy answer: the datastore drafts it, and it is also one of the
    # generation's retrieved passages.
    answer = Passage(id="answer", text=ref.text, doc_id="answer-doc")
    passages = top + [answer]
    ds = build_datastore(tiny_lm, PassageSource(passages, tiny_lm), tmp_path / "ds")
    assert ds.passage(ds.n_passages - 1).id == "answer"

    res = engine.generate(MESSAGES, passages=passages, decoding="dresd", max_new_tokens=N,
                          drafter_options={"datastore": str(ds.root), "min_score": -1.0})

    assert res.token_ids == ref.token_ids  # lossless
    assert res.stats.accepted_tokens > 0  # drafts from the retrieved passage were accepted
    cited = [c for c in res.citations if c.passage_id == "answer"]
    assert cited, res.citations
    for c in res.citations:
        assert c.kind == "verbatim"
        src = next(p for p in passages if p.id == c.passage_id)
        assert res.text[c.start : c.end] == c.text == src.text[c.passage_start : c.passage_end]
    # The retrieved passage is reported once, not again as a second copy from the datastore.
    assert [p.id for p in res.passages].count("answer") == 1
