"""``NestConfig.title_match`` (issue 22): the document titled with the question's entity goes
first in stage 1, so ``span_passages=1``, the RA prompt and RAG-copy's drafts start from it.

The pure parts (``core.question.question_entity``, ``retrieval.titles.title_first``) run on
made-up passages; the lookup runs on real Chroma (``passages_titled``) and the in-memory
retriever; the engine test checks that ``grounded`` uses it and ``paper`` does not. The slow
test re-checks the measured effect on the shipped sample corpus: every open-ended pydoc
question of the quality set gets its gold document first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engines import make_engine
from fakes import FakeLM
from nest_integrations.config import PRESETS, NestConfig
from nest_integrations.core.question import question_entity
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.retrieval.titles import first_passages, norm_title, title_first
from nest_integrations.types import Passage


@pytest.mark.parametrize("text, entity", [
    ("What is the founding year of Korvanta Systems?", "Korvanta Systems"),
    ("what was the maiden flight date of Orion-7 Probe?", "Orion-7 Probe"),
    ('Write the Python reference entry for "for".', "for"),
    ("Write the dictionary entry for the computing term 'frogging'.", "frogging"),
    ("What is Stephen Jay Gould?", "Stephen Jay Gould"),
    ("What is a dishwasher?", "dishwasher"),
    ("What is The Garden of Earthly Delights?", "The Garden of Earthly Delights"),
    ("Who was Charles Dickens?", "Charles Dickens"),
    ("Tell me about the Golden Gate Bridge", "Golden Gate Bridge"),
    ('What does the "with" statement do?', "with"),
    ("Context: ...\n\nWhat is Futurism?", "Futurism"),  # the last line decides
    ("What is O'Brien's law?", "O'Brien's law"),  # an apostrophe is no quote
    ("How does it work?", None),
    ("La traviata\n\nIt was first performed on", None),  # a completion names no entity
    ("What is the thing that everyone in the office keeps talking about over lunch on most days this month?", None),
    ("", None),
])
def test_question_entity(text, entity):
    assert question_entity(text) == entity


def test_question_entities_tries_each_name_after_of_longest_first():
    from nest_integrations.core.question import question_entities

    assert question_entities("What is the number of employees of Biquaza Labs?") == [
        "employees of Biquaza Labs", "Biquaza Labs"]
    assert question_entities("What is the capital of the Republic of Korea?") == [
        "Republic of Korea", "Korea"]
    assert question_entities("What is Bank of America?") == ["Bank of America"]  # no "the <attr>"
    assert question_entities("How does it work?") == []
    got = title_first(RETRIEVED, ["employees of Korvanta Systems", "Korvanta Systems"])
    assert got[0].id == "k1"
    assert title_first(RETRIEVED, ["nope", "still nope"]) == RETRIEVED


def _p(pid: str, doc: str, title: str, chunk: int = 0) -> Passage:
    return Passage(pid, f"text of {pid}", doc_id=doc, char_start=100 * chunk,
                   char_end=100 * chunk + 10, metadata={"title": title, "chunk_index": chunk})


RETRIEVED = [
    _p("n0", "notes/korvanta", "Korvanta Systems (disambiguation)"),
    _p("b0", "belmar", "Belmar Works"),
    _p("k1", "korvanta", "Korvanta Systems", chunk=1),
    _p("x0", "other", "Other"),
    _p("k0", "korvanta", "korvanta  systems"),  # case and spacing aside, the same title
]


def test_title_first_moves_the_titled_documents_passages_first_in_retrieval_order():
    got = title_first(RETRIEVED, "Korvanta Systems")
    assert [p.id for p in got] == ["k1", "k0", "n0", "b0", "x0"]
    assert [bool(p.metadata.get("title_match")) for p in got] == [True, True, False, False, False]
    assert RETRIEVED[2].metadata.get("title_match") is None  # the input is not changed


def test_title_first_leaves_the_ranking_alone_without_an_exact_title():
    for entity in (None, "", "Korvanta", "Systems"):  # no prefix or word match: titles only
        assert title_first(RETRIEVED, entity) == RETRIEVED
    assert title_first([], "Korvanta Systems") == []


def test_the_lookup_adds_the_titled_documents_first_passage_and_keeps_the_length():
    stored = [_p("f2", "pydoc/for.txt", "for", 2), _p("f0", "pydoc/for.txt", "for", 0),
              _p("w0", "pydoc/while.txt", "while")]
    calls = []

    def lookup(titles, limit):
        calls.append(list(titles))
        want = {norm_title(t) for t in titles}
        return [p for p in stored if norm_title(p.metadata["title"]) in want][:limit]

    got = title_first(RETRIEVED, '"For"', lookup)
    assert [p.id for p in got] == ["f0"] + [p.id for p in RETRIEVED[:-1]]
    assert got[0].metadata["title_match"] is True
    assert calls and "For" in calls[0]
    # a retrieved match needs no lookup; a title the store lacks changes nothing
    calls.clear()
    assert [p.id for p in title_first(RETRIEVED, "Belmar Works", lookup)][0] == "b0"
    assert calls == []
    assert title_first(RETRIEVED, "nonexistent", lookup) == RETRIEVED


def test_first_passages_keeps_each_documents_opening():
    ps = [_p("a2", "a", "A", 2), _p("b1", "b", "B", 1), _p("a0", "a", "A", 0)]
    assert [p.id for p in first_passages(ps)] == ["a0", "b1"]


def _corpus() -> list[Passage]:
    texts = {  # the note mentions the entity more often than its own entry does
        "korvanta-note": ("Korvanta Systems (disambiguation)",
                          "Korvanta Systems is often confused with Belmar Works. Korvanta "
                          "Systems, Korvanta Systems."),
        "korvanta": ("Korvanta Systems", "The founding year of Korvanta Systems is 1987."),
        "belmar": ("Belmar Works", "The founding year of Belmar Works is 1990."),
        "rivers": ("Rivers", "The Nile is a river."),
    }
    return [Passage(f"p-{d}", t, doc_id=d, char_start=0, char_end=len(t),
                    metadata={"title": title, "chunk_index": 0})
            for d, (title, t) in texts.items()]


def test_in_memory_lookup_is_case_folded():
    r = InMemoryRetriever(_corpus())
    assert [p.doc_id for p in r.passages_titled(["korvanta systems"])] == ["korvanta"]
    assert r.passages_titled(["Korvanta"]) == [] and r.passages_titled(["Rivers"], limit=0) == []


def test_grounded_retrieval_puts_the_titled_document_first_and_paper_does_not():
    assert PRESETS["grounded"]["title_match"] is True and NestConfig().title_match is False
    with pytest.raises(ValueError, match="title_match"):
        NestConfig(title_match="yes")
    q = "What is Korvanta Systems?"
    retriever = InMemoryRetriever(_corpus())  # BM25: the note ranks first
    assert retriever.retrieve(q, 4)[0].doc_id == "korvanta-note"
    lm = FakeLM(key_dim=8, vocab_size=512, seed=3)
    paper = make_engine(lm, retriever, config=NestConfig(n_passages=4))
    grounded = make_engine(lm, retriever, config=NestConfig.from_preset("grounded", n_passages=4))
    assert paper.retrieve(q)[0].doc_id == "korvanta-note"
    assert grounded.retrieve(q)[0].doc_id == "korvanta"
    # the per-call config decides, and generation uses the same ranking
    assert paper.retrieve(q, config=grounded.config)[0].doc_id == "korvanta"
    result = grounded.generate(q, max_new_tokens=3)
    assert result.passages[0].doc_id == "korvanta"
    assert paper.generate(q, max_new_tokens=3).passages[0].doc_id == "korvanta-note"


def test_chroma_passages_titled_reads_exact_titles(tmp_path: Path) -> None:
    import json

    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": d, "text": p.text, "metadata": {"title": title}})
                           + "\n" for d, (p, title) in
                           {p.doc_id: (p, p.metadata["title"]) for p in _corpus()}.items()),
                   encoding="utf-8")
    store = ChromaPassageStore.from_persist_dir(tmp_path / "store", "titles")
    IngestPipeline(store, FakeLM(), with_keys=False).ingest([src])
    got = store.passages_titled(["Korvanta Systems"])
    assert [p.doc_id for p in got] == ["korvanta"] and got[0].text.startswith("The founding")
    assert {p.doc_id for p in store.passages_titled(["Belmar Works", "Rivers"])} == {
        "belmar", "rivers"}
    assert store.passages_titled(["korvanta systems"]) == []  # exact: variants are the caller's
    assert store.passages_titled([]) == []
    from nest_integrations.retrieval.titles import lookup_of

    hits = store.retrieve("Korvanta Systems Korvanta Systems confused", 2)
    ordered = title_first(hits, "korvanta systems", lookup_of(store))
    assert ordered[0].doc_id == "korvanta" and len(ordered) == len(hits)


@pytest.mark.slow
def test_every_open_pydoc_question_gets_its_gold_document_first(sample_store: Path) -> None:
    """The measured effect (issue 22 closing note): on the shipped sample corpus, dense
    retrieval ranks the gold document first for 26 of 40 pydoc "Write the entry" prompts of
    the quality set; with title match, for all 40."""
    from nest_integrations.evaluation.quality_set import build_question_set
    from nest_integrations.retrieval.chroma import ChromaPassageStore
    from nest_integrations.retrieval.titles import lookup_of

    store = ChromaPassageStore.from_persist_dir(sample_store, "nest")
    qs = build_question_set(0)
    questions = [q for s in ("dev", "test") for q in qs.open(s) if q.source == "open-pydoc"]
    assert len(questions) == 40
    dense_first = matched_first = 0
    for q in questions:
        hits = store.retrieve(q.question, 8)
        dense_first += hits[0].doc_id == q.gold_doc_id
        ordered = title_first(hits, question_entity(q.question), lookup_of(store))
        matched_first += ordered[0].doc_id == q.gold_doc_id
        assert len(ordered) == len(hits)
    assert matched_first == 40
    assert dense_first < 40


def test_prompt_passages_holds_the_titled_document_only_with_title_context():
    from nest_integrations.retrieval.titles import prompt_passages

    ordered = title_first(RETRIEVED, "Korvanta Systems")
    assert [p.id for p in prompt_passages(ordered, 3)] == ["k1", "k0", "n0"]
    assert [p.id for p in prompt_passages(ordered, 3, titled_only=True)] == ["k1", "k0"]
    assert [p.id for p in prompt_passages(ordered, 1, titled_only=True)] == ["k1"]
    assert [p.id for p in prompt_passages(RETRIEVED, 2, titled_only=True)] == ["n0", "b0"]
    assert prompt_passages(ordered, 0, titled_only=True) == []


def test_title_context_keeps_the_note_out_of_the_prompt_and_rag_copys_drafts():
    """The RA prompt and RAG-copy's draft passages are the same list: with ``title_context``
    the mentioning note is in neither, so the routed fact answer equals greedy decoding of
    the prompt built from the titled document alone."""
    from nest_integrations.decoding.prompts import prompt_ids

    q = "What is the founding year of Korvanta Systems?"
    lm = FakeLM(key_dim=8, vocab_size=512, seed=3)
    cfg = NestConfig.from_preset("grounded", n_passages=4, title_context=True)
    engine = make_engine(lm, InMemoryRetriever(_corpus()), config=cfg)
    passages = engine.retrieve(q)
    assert passages[0].doc_id == "korvanta" and len(passages) == 4
    messages = [{"role": "user", "content": q}]
    routed = engine.generate(messages, max_new_tokens=6)
    assert routed.stats.decoding == "rag-copy"
    titled = [p for p in passages if p.metadata.get("title_match")]
    assert routed.stats.prompt_tokens == len(prompt_ids(lm, messages, titled))
    assert routed.stats.prompt_tokens < len(prompt_ids(lm, messages, passages[:3]))
    greedy = engine.generate(messages, max_new_tokens=6, decoding="greedy",
                             passages=titled, config=cfg.replace(title_context=False))
    assert routed.text == greedy.text
    assert {c.doc_id for c in routed.citations} <= {"korvanta"}


def test_title_context_applies_to_fact_questions_only():
    """Measured on dev: a titled-only prompt raised fact-question accuracy and lowered the
    ROUGE-L of descriptive answers, so "What is X?" keeps the top passages."""
    from nest_integrations.decoding.prompts import prompt_ids

    lm = FakeLM(key_dim=8, vocab_size=512, seed=3)
    engine = make_engine(lm, InMemoryRetriever(_corpus()),
                         config=NestConfig.from_preset("grounded", n_passages=4))
    assert engine.config.title_context is True  # the default
    messages = [{"role": "user", "content": "What is Korvanta Systems?"}]
    passages = engine.retrieve(messages[0]["content"])
    assert passages[0].doc_id == "korvanta"
    result = engine.generate(messages, max_new_tokens=3)
    assert result.stats.decoding == "nest"
    assert result.stats.prompt_tokens == len(prompt_ids(lm, messages, passages[:3]))


def test_the_lookup_runs_once_for_every_candidate_name():
    calls = []

    def lookup(titles, limit):
        calls.append(list(titles))
        return [_p("z0", "zeta", "Zeta Labs")]

    got = title_first(RETRIEVED, ["employees of Zeta Labs", "Zeta Labs"], lookup)
    assert got[0].id == "z0" and len(calls) == 1
    assert "Zeta Labs" in calls[0] and "employees of Zeta Labs" in calls[0]
