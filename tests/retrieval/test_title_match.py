"""The title index (``retrieval.titles``) and the policy's stage-1 order (``policy.answer``): the
documents a question names are found by the store's titles in the question's text, in any
phrasing and language, not by question templates.

The pure parts run on made-up titles and passages; the index built at ingest and kept with the
store runs on real Chroma; the engine test checks that ``grounded`` uses it and ``paper`` does
not. The slow test re-checks the effect on the shipped sample corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engines import make_engine
from fakes import FakeLM
from nest_integrations.config import NestConfig
from nest_integrations.policy import AnswerPolicy, plan_answer
from nest_integrations.policy.answer import named_first, prompt_passages, with_openings
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.retrieval.titles import (
    TitleIndex,
    first_passages,
    normalize,
    qualifier_base,
)
from nest_integrations.types import Passage

TITLES = {
    "korvanta": "Korvanta Systems",
    "korvanta-note": "Korvanta Systems (disambiguation)",
    "cambodia": "Cambodia",
    "life-exp": "Life expectancy",
    "python": "Python (programming language)",
    "anabasis": "Anabasis (Xenophon)",
    "for": "for",
    "with": "with",
    "frogging": "frogging",
    "bahaullah": "Baháʼu'lláh",
    "nyc": "New York City",
    "york": "York",
    "leon": "León",
}


def _docs(question: str) -> list[tuple[str, ...]]:
    return [m.doc_ids for m in TitleIndex(TITLES).match(question)]


def test_normalize_folds_case_diacritics_possessives_and_punctuation():
    assert normalize("Cambodia's  life-expectancy?") == "cambodia life expectancy"
    assert normalize("LEÓN") == normalize("leon") == "leon"
    assert normalize("Korvanta Systems: what is the founding year?") == \
        "korvanta systems what is the founding year"
    assert qualifier_base("Python (programming language)") == "Python"
    assert qualifier_base("Python") is None


@pytest.mark.parametrize("question, docs", [
    # the same entity in every phrasing family
    ("What is the life expectancy at birth in Cambodia?", [("life-exp",), ("cambodia",)]),
    ("Cambodia: what is the life expectancy at birth?", [("life-exp",), ("cambodia",)]),
    ("Tell me Cambodia's life expectancy.", [("life-exp",), ("cambodia",)]),
    ("life expectancy of cambodia", [("life-exp",), ("cambodia",)]),
    ("What is the founding year of Korvanta Systems?", [("korvanta",)]),  # not the note
    ("korvanta systems founding year", [("korvanta",)]),
    # a qualified title answers to its base where nothing is titled with the base itself
    ("What is Python used for?", [("python",)]),
    ("Who wrote the Anabasis?", [("anabasis",)]),
    # longest first; a run inside a longer match is not matched again
    ("Where is New York City?", [("nyc",)]),
    ("Is York older than New York City?", [("nyc",), ("york",)]),
    # function-word titles only when quoted
    ("Write the dictionary entry for the computing term 'frogging'.", [("frogging",)]),
    ("What is frogging in computing?", [("frogging",)]),
    ('What does the "with" statement do?', [("with",)]),
    ("How does the for loop work with lists?", []),
    # other languages and scripts
    ("¿Quién fue Baháʼu'lláh?", [("bahaullah",)]),
    ("Qu'est-ce que León ?", [("leon",)]),
    ("How does it work?", []),
])
def test_titles_are_found_in_any_phrasing(question, docs):
    assert _docs(question) == docs


def _p(pid: str, doc: str, title: str, chunk: int = 0) -> Passage:
    return Passage(pid, f"text of {pid}", doc_id=doc, char_start=100 * chunk,
                   char_end=100 * chunk + 10, metadata={"title": title, "chunk_index": chunk})


RETRIEVED = [
    _p("n0", "korvanta-note", "Korvanta Systems (disambiguation)"),
    _p("b0", "belmar", "Belmar Works"),
    _p("k1", "korvanta", "Korvanta Systems", chunk=1),
    _p("x0", "other", "Other"),
    _p("k0", "korvanta", "korvanta  systems"),  # case and spacing aside, the same title
]


def test_named_first_moves_the_named_documents_passages_first_in_retrieval_order():
    index = TitleIndex.from_passages(RETRIEVED)
    matches = index.match("What is the founding year of Korvanta Systems?")
    got = named_first(RETRIEVED, matches, index.titles)
    assert [p.id for p in got] == ["k1", "k0", "n0", "b0", "x0"]
    assert [bool(p.metadata.get("title_match")) for p in got] == [True, True, False, False, False]
    assert RETRIEVED[2].metadata.get("title_match") is None  # the input is not changed


def test_a_missing_named_document_is_looked_up_and_the_length_kept():
    stored = [_p("f2", "pydoc/for.txt", "for", 2), _p("f0", "pydoc/for.txt", "for", 0),
              _p("c0", "cambodia", "Cambodia")]
    index = TitleIndex.from_passages(stored + RETRIEVED)
    calls = []

    def lookup(titles, limit):
        calls.append(list(titles))
        return [p for p in stored if p.metadata["title"] in titles][:limit]

    got = named_first(RETRIEVED, index.match('Write the entry for "for".'), index.titles, lookup)
    assert [p.id for p in got] == ["f0"] + [p.id for p in RETRIEVED[:-1]]
    assert got[0].metadata["title_match"] is True and calls == [["for"]]
    both = named_first(RETRIEVED, index.match("Korvanta Systems or Cambodia?"), index.titles,
                       lookup)  # a retrieved named document first, then a looked-up one
    assert [p.id for p in both][:4] == ["k1", "k0", "c0", "n0"] and len(both) == len(RETRIEVED)


def test_first_passages_keeps_each_documents_opening():
    ps = [_p("a2", "a", "A", 2), _p("b1", "b", "B", 1), _p("a0", "a", "A", 0)]
    assert [p.id for p in first_passages(ps)] == ["a0", "b1"]


def test_prompt_passages_by_title_context():
    index = TitleIndex.from_passages(RETRIEVED)
    ordered = named_first(RETRIEVED, index.match("Korvanta Systems?"), index.titles)
    assert [p.id for p in prompt_passages(ordered, 3, "first")] == ["k1", "k0", "n0"]
    assert [p.id for p in prompt_passages(ordered, 3, "only")] == ["k1", "k0"]
    assert [p.id for p in prompt_passages(RETRIEVED, 2, "only")] == ["n0", "b0"]  # none named
    assert prompt_passages(ordered, 0, "only") == []
    plan = plan_answer(AnswerPolicy(title_match=True, title_context="off"), "Korvanta Systems?",
                       RETRIEVED, n_ra=2, decoding=("greedy",))
    # stage 1 reordered; the question asks nothing beyond the title: the opening passage first
    assert [p.id for p in plan.passages][:2] == ["k0", "k1"]
    assert [p.id for p in plan.prompt_passages] == ["n0", "b0"]  # the prompt is RAG's
    plan = plan_answer(AnswerPolicy(title_match=True, title_context="off"),
                       "What is the founding year of Korvanta Systems?", RETRIEVED, n_ra=2,
                       decoding=("greedy",))
    assert [p.id for p in plan.passages][:2] == ["k1", "k0"]  # an attribute: retrieval's order


def test_a_named_documents_opening_passage_goes_before_its_others_when_it_is_what_is_asked():
    """"How does X work?", "What is X for?": the answer is X's lead, in its opening passage.
    Where retrieval ranked it lower it moves up; where it missed it, the title lookup brings it
    (and the list keeps its length); an attribute question keeps retrieval's order."""
    index = TitleIndex.from_passages(RETRIEVED)
    matches = index.match("How does Korvanta Systems work?")
    ordered = named_first(RETRIEVED, matches, index.titles)
    assert [p.id for p in with_openings(ordered, matches, index.titles)] == [
        "k0", "k1", "n0", "b0", "x0"]
    missed = [p for p in RETRIEVED if p.id != "k0"]
    opening = _p("k0", "korvanta", "Korvanta Systems")
    looked = []

    def lookup(titles, limit):
        looked.append(list(titles))
        return [_p("k2", "korvanta", "Korvanta Systems", chunk=2), opening]

    got = with_openings(named_first(missed, matches, index.titles), matches, index.titles, lookup)
    assert [p.id for p in got] == ["k0", "k1", "n0", "b0"] and looked == [["Korvanta Systems"]]
    assert got[0].metadata["title_match"] is True
    assert with_openings(named_first(missed, matches, index.titles), matches, index.titles
                         ) == named_first(missed, matches, index.titles)  # nothing to look up


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


def test_in_memory_lookup_and_index():
    r = InMemoryRetriever(_corpus())
    assert [p.doc_id for p in r.passages_titled(["korvanta systems"])] == ["korvanta"]
    assert r.passages_titled(["Korvanta"]) == [] and r.passages_titled(["Rivers"], limit=0) == []
    assert len(r.title_index()) == 4 and r.title_index() is r.title_index()


def test_grounded_puts_the_named_document_first_and_paper_does_not():
    q = "Korvanta Systems: when was it founded?"  # no template of ours reads this form
    retriever = InMemoryRetriever(_corpus())  # BM25: the note ranks first
    assert retriever.retrieve(q, 4)[0].doc_id == "korvanta-note"
    lm = FakeLM(key_dim=8, vocab_size=512, seed=3)
    cfg = NestConfig(n_passages=4, ra_passages=2)
    paper = make_engine(lm, retriever, config=cfg)
    grounded = make_engine(lm, retriever, config=cfg, policy=AnswerPolicy.from_preset("grounded"))
    assert paper.plan(q, paper.retrieve(q)).passages[0].doc_id == "korvanta-note"
    plan = grounded.plan(q, grounded.retrieve(q))
    assert plan.passages[0].doc_id == "korvanta"
    # the named document states the answer: its sentence is the evidence, copied by NEST
    assert plan.evidence is not None and plan.method.name == "nest"
    assert plan.evidence.passage_id == "p-korvanta" and plan.evidence.score > 0.5
    korvanta = next(p for p in plan.prompt_passages if p.id == plan.evidence.passage_id)
    assert korvanta.text[plan.evidence.start : plan.evidence.end] == \
        "The founding year of Korvanta Systems is 1987."
    assert plan.prompt_passages[0].doc_id == "korvanta"
    # the per-call policy decides, and generation uses the same plan
    assert paper.plan(q, paper.retrieve(q), policy=grounded.policy).passages[0].doc_id == \
        "korvanta"
    result = grounded.generate([{"role": "user", "content": q}], max_new_tokens=3)
    assert result.passages[0].doc_id == "korvanta" and result.stats.decoding == plan.method.name
    assert paper.generate(q, max_new_tokens=3).passages[0].doc_id == "korvanta-note"


def test_chroma_keeps_a_title_index_built_at_ingest(tmp_path: Path) -> None:
    import json

    from nest_integrations.ingest.pipeline import IngestPipeline
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": p.doc_id, "text": p.text,
                                       "metadata": {"title": p.metadata["title"]}}) + "\n"
                           for p in _corpus()), encoding="utf-8")
    store = ChromaPassageStore.from_persist_dir(tmp_path / "store", "titles")
    pipeline = IngestPipeline(store, FakeLM(), with_keys=False)
    pipeline.ingest([src])
    path = store.titles_path()
    assert path == tmp_path / "store" / "titles" / "titles.json" and path.is_file()
    saved = TitleIndex.load(path)
    assert saved is not None and saved.titles == store.title_index().titles
    assert saved.titles["korvanta"] == "Korvanta Systems" and saved.count == store.count()
    again = ChromaPassageStore.from_persist_dir(tmp_path / "store", "titles")
    assert [m.doc_ids for m in again.title_index().match("korvanta systems?")] == [("korvanta",)]
    got = store.passages_titled(["Korvanta Systems"])
    assert [p.doc_id for p in got] == ["korvanta"] and got[0].text.startswith("The founding")
    pipeline.delete_documents(["korvanta"])  # the index follows the store
    assert "korvanta" not in TitleIndex.load(path).titles
    path.write_text("{damaged")  # a damaged index is rebuilt from the stored metadata
    fresh = ChromaPassageStore.from_persist_dir(tmp_path / "store", "titles")
    assert fresh.title_index().titles["belmar"] == "Belmar Works"
    pipeline.delete_collection()
    assert not path.exists()


@pytest.mark.slow
def test_every_open_pydoc_question_gets_its_gold_document_first(sample_store: Path) -> None:
    """On the shipped sample corpus dense retrieval ranks the gold document first for only
    some of the 40 pydoc "Write the entry" prompts of the quality set; the title index puts
    it first for all 40 (the prompts quote the topic's name)."""
    from benchmarks.sets.quality_set import build_question_set
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(sample_store, "nest")
    qs = build_question_set(0)
    questions = [q for s in ("dev", "test") for q in qs.open(s) if q.source == "open-pydoc"]
    assert len(questions) == 40
    policy = AnswerPolicy(title_match=True)
    dense_first = matched_first = 0
    for q in questions:
        hits = store.retrieve(q.question, 8)
        dense_first += hits[0].doc_id == q.gold_doc_id
        plan = plan_answer(policy, q.question, hits, store)
        matched_first += plan.passages[0].doc_id == q.gold_doc_id
        assert len(plan.passages) == len(hits)
    assert matched_first == 40
    assert dense_first < 40


def _lc_docs():
    from langchain_core.documents import Document

    return [Document(page_content=p.text, metadata={**p.metadata, "doc_id": p.doc_id},
                     id=p.id) for p in _corpus()]


def test_framework_retrievers_look_named_documents_up_by_metadata(tmp_path: Path) -> None:
    """LangChain (InMemoryVectorStore, langchain-chroma) and LlamaIndex (a VectorStoreIndex)
    stores answer the policy's title lookup through their metadata filters; the plan then
    brings a named document that retrieval missed into the prompt."""
    import chromadb
    from chromadb.config import Settings
    from langchain_chroma import Chroma
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import Document as LIDocument
    from llama_index.core import VectorStoreIndex

    from nest_integrations.langchain import LangChainPassageRetriever, NestEmbeddings
    from nest_integrations.llama_index import LlamaIndexPassageRetriever, NestEmbedding

    emb = NestEmbeddings()
    in_memory = InMemoryVectorStore.from_documents(_lc_docs(), emb)
    chroma = Chroma(collection_name="titled", embedding_function=emb,
                    client=chromadb.EphemeralClient(Settings(anonymized_telemetry=False)))
    chroma.add_documents(_lc_docs())
    index = VectorStoreIndex.from_documents(
        [LIDocument(text=p.text, metadata=p.metadata, id_=p.id) for p in _corpus()],
        embed_model=NestEmbedding())
    retrievers = [LangChainPassageRetriever(in_memory),
                  LangChainPassageRetriever(in_memory.as_retriever()),
                  LangChainPassageRetriever(chroma), LlamaIndexPassageRetriever(index)]
    q = "Tell me Belmar Works' founding year."
    for r in retrievers:
        got = r.passages_titled(["Belmar Works"])
        assert [p.metadata["title"] for p in got] == ["Belmar Works"], r
        retrieved = [p for p in r.retrieve(q, 4) if p.metadata["title"] != "Belmar Works"][:2]
        plan = plan_answer(AnswerPolicy(title_match=True, title_context="first"), q,
                           retrieved, r, n_ra=2)
        assert plan.prompt_passages[0].metadata["title"] == "Belmar Works", r


def test_candidate_titles_are_runs_of_the_questions_words_in_stored_spellings():
    from nest_integrations.retrieval.titles import candidate_titles

    got = candidate_titles("Tell me Belmar Works' founding year.")
    assert "Belmar Works" in got and "belmar works" in got and "Founding year" in got
    assert got.index("Belmar Works") > got.index("Tell me Belmar Works founding year")  # long first
    assert "me" not in got and "the" not in candidate_titles("What is the year?")  # function words
    assert candidate_titles("") == []
