"""The question families of ``python -m benchmarks.answers``: deterministic, split by document,
the fact sheets' uniqueness invariant, FOLDOC's parser (on a dictd database written here) and
the pydoc leads."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.sets import answer_sets as A
from benchmarks.sets import glossary
from benchmarks.sets.factsheets import KINDS, generate_factsheets
from nest_integrations.evaluation.metrics import normalize_answer

FOLDOC_DEB = sorted((Path(__file__).resolve().parents[2] / ".nest" / "bench" / "answers")
                    .glob("dict-foldoc_*.deb"))  # where `benchmarks.answers` looks for it


@pytest.fixture(scope="module")
def facts():
    return generate_factsheets(0)


def test_fact_sheets_are_deterministic_and_seeded(facts):
    again = generate_factsheets(0)
    assert again.documents == facts.documents and again.questions == facts.questions
    other = generate_factsheets(1)
    assert other.documents != facts.documents
    assert len(facts.documents) == 80 and len(facts.questions) == 160
    assert Counter(q.kind for q in facts.questions) == {"country": 80, "product": 80}


def test_every_gold_value_is_in_exactly_one_sentence_of_the_corpus(facts):
    text = " ".join(d["text"] for d in facts.documents)
    sents = [normalize_answer(s) for s in text.replace("\n\n", " ").split(". ")]
    by_id = {d["id"]: d["text"] for d in facts.documents}
    for q in facts.questions:
        g = normalize_answer(q.answer)
        hits = [s for s in sents if f" {g} " in f" {s} "]
        assert len(hits) == 1, (q.id, q.answer, hits)
        assert q.sentence in by_id[q.gold_doc_id]
        assert q.answer not in q.distractors and len(q.distractors) == 39


def test_synonym_questions_avoid_the_attributes_own_words():
    stop = {"of", "the", "in", "at", "rate", "point"}  # words too common to count
    for attrs in KINDS.values():
        for a in attrs:
            words = {w for w in normalize_answer(a.name).split() if w not in stop}
            for t in a.synonyms:
                asked = set(normalize_answer(t.format(x="X")).split())
                assert not words & asked, (a.name, t)


def test_items_are_split_by_document_and_deterministic(facts):
    src = A.Sources(facts=facts, topics=A.load_topics())
    fams = ["factoid", "synonym", "explanation"]
    dev, test = (A.build_items(src, fams, s) for s in A.SPLITS)
    assert dev == A.build_items(src, fams, "dev")
    dev_docs, test_docs = {i.gold_doc_id for i in dev}, {i.gold_doc_id for i in test}
    assert dev_docs and test_docs and not dev_docs & test_docs
    assert all(A.split_of(i.gold_doc_id) == "dev" for i in dev)
    # every question is asked once per fact-sheet family, the explanation family twice
    per = Counter((i.family, i.qid) for i in dev + test)
    assert {n for (f, _), n in per.items() if f != "explanation"} == {1}
    assert {n for (f, _), n in per.items() if f == "explanation"} == {2}
    for fam in ("factoid", "synonym"):
        assert sum(i.family == fam for i in dev) >= 40 <= sum(i.family == fam for i in test)
    assert sum(i.family == "explanation" for i in dev + test) >= 40
    assert {i.qid for i in dev if i.family == "factoid"} == \
        {i.qid for i in dev if i.family == "synonym"}


def test_limit_keeps_whole_questions_and_a_fixed_order(facts):
    src = A.Sources(facts=facts, topics=A.load_topics())
    small = A.build_items(src, ["factoid", "explanation"], "dev", limit=3)
    assert Counter(i.family for i in small) == {"factoid": 3, "explanation": 6}
    full = A.build_items(src, ["factoid", "explanation"], "dev")
    assert [i for i in full if i.family == "factoid"][:3] == small[:3]
    with pytest.raises(ValueError, match="split"):
        A.fact_items(facts, "factoid", "train")


def test_pydoc_leads_skip_the_heading_and_the_grammar():
    topics = {t.doc_id: t for t in A.load_topics()}
    assert len(topics) == 40
    nonlocal_ = topics["pydoc/nonlocal.txt"]
    assert nonlocal_.keyword == "nonlocal"
    assert nonlocal_.lead.startswith('The "nonlocal" statement causes the listed identifiers')
    assert "::=" not in nonlocal_.lead and "*" not in nonlocal_.lead
    for t in topics.values():
        assert t.lead and not t.lead.startswith(t.heading + " *")
    items = A.explanation_items(list(topics.values()), "dev") + \
        A.explanation_items(list(topics.values()), "test")
    assert {i.gold_sentence for i in items if i.qid == "pydoc/nonlocal.txt"} == {
        'The "nonlocal" statement causes the listed identifiers to refer to previously bound '
        "variables in the nearest enclosing scope excluding globals."}


DICTD_BODY = """permutation

   <mathematics> 1. An ordering of a certain number of elements
   of a given set.

   For instance, the permutations of (1,2,3) are (1,2,3) (2,3,1)
   (3,1,2).  Permutations form one of the canonical examples of a "{group}".

   (1996-01-01)

"""
DICTD_SECOND = """daemon

   /day'mn/ (From the mythological meaning) A {program (prog.html)} that is not
   invoked explicitly, but lies dormant waiting for some condition(s) to occur.

   The idea is that the perpetrator of the condition need not be aware of it.
   For example, e.g. a print spooler is one.

"""


def _b64(n: int) -> str:
    digits = ""
    while True:
        digits = glossary._B64[n % 64] + digits
        n //= 64
        if not n:
            return digits


def test_dictd_parser_reads_entries_and_cleans_their_markup(tmp_path):
    data = (DICTD_BODY + DICTD_SECOND).encode()
    index = (f"daemon\t{_b64(len(DICTD_BODY))}\t{_b64(len(DICTD_SECOND))}\n"
             f"permutation\t{_b64(0)}\t{_b64(len(DICTD_BODY))}\n")
    (tmp_path / "foldoc.index").write_text(index)
    (tmp_path / "foldoc.dict.dz").write_bytes(gzip.compress(data))
    entries = {e.headword: e for e in glossary.load_foldoc(tmp_path)}
    perm, dae = entries["permutation"], entries["daemon"]
    assert perm.definition == "An ordering of a certain number of elements of a given set."
    assert perm.paragraphs[1].endswith('examples of a "group".')
    assert len(perm.paragraphs) == 2  # the date paragraph is dropped
    assert dae.definition.startswith("A program that is not invoked explicitly")
    assert dae.sentences[-1] == "For example, e.g. a print spooler is one."
    assert perm.doc_id == "foldoc/permutation" and perm.text.startswith("permutation\n\n")
    assert glossary.b64_number("BA") == 64


def test_choose_is_seeded_and_order_free():
    entries = [glossary.Entry(f"term{chr(97 + i)}{chr(97 + j)}",
                              (f"A thing number {i} {j} of some kind here.",
                               "It is used a lot. Another note follows here."))
               for i in range(10) for j in range(10)]
    gold, dis = glossary.choose(entries, 20, 30, seed=0)
    gold2, dis2 = glossary.choose(list(reversed(entries)), 20, 30, seed=0)
    assert gold == gold2 and dis == dis2 and not set(gold) & set(dis)
    assert glossary.choose(entries, 20, 30, seed=1)[0] != gold
    with pytest.raises(ValueError, match="qualifying"):
        glossary.choose(entries, 80, 30)


@pytest.mark.skipif(not FOLDOC_DEB, reason="no dict-foldoc .deb in .nest/bench/answers "
                    "(apt-get download dict-foldoc there)")
def test_real_foldoc_gives_at_least_40_definitions_per_split():
    src = A.load_sources(["definition"], FOLDOC_DEB[0])
    dev, test = (A.build_items(src, ["definition"], s) for s in A.SPLITS)
    assert len(dev) >= 40 and len(test) >= 40
    assert not {i.gold_doc_id for i in dev} & {i.gold_doc_id for i in test}
    assert all(i.prompt == f"What is {i.qid.split('/', 1)[1].replace('_', ' ')}?" for i in dev)
