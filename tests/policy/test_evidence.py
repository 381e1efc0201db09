"""Evidence first, then copy: the sentence choice (``core.evidence``, ``policy.evidence``), the
plan that decodes from it, and citations a person can check (``core.citations``' word rule)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nest_integrations.core.citations import build_citations, snap_to_words, word_edge
from nest_integrations.core.evidence import (
    content_words,
    evidence_rows,
    overlap_scores,
    sentence_spans,
)
from nest_integrations.policy import AnswerPolicy, plan_answer
from nest_integrations.policy.evidence import candidates, choose, choose_evidence
from nest_integrations.types import Passage

PROFILE = ("Tumouland\n\nPeople and society\nPopulation: 8,915,496 (2020 est.)\n"
           "Life expectancy at birth: 76.6 years\nOfficial language: Pusaic\n\nGovernment\n"
           "Capital: Mapudo\nHead of government: Prime Minister Setrugo Trafa (since 2020)\n")
PROSE = ('The "assert" statement\n**********************\n\nAssert statements are a convenient '
         "way to insert debugging assertions\ninto a program:\n\n   assert_stmt ::= \"assert\" "
         "expression\n\nThe simple form is equivalent to\n\n   if not expression: raise "
         "AssertionError\n")


def _texts(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


def test_sentences_split_field_lines_and_keep_wrapped_prose_whole() -> None:
    assert "Life expectancy at birth: 76.6 years" in _texts(PROFILE)
    assert "Capital: Mapudo" in _texts(PROFILE)
    # a wrapped line that goes on in lower case stays in its sentence
    assert ("Assert statements are a convenient way to insert debugging assertions\n"
            "into a program:") in _texts(PROSE)
    for s, e in sentence_spans(PROFILE + PROSE):  # exact, trimmed spans
        text = (PROFILE + PROSE)[s:e]
        assert text == text.strip() and text


def test_the_attribute_asked_for_outweighs_the_words_every_sentence_shares() -> None:
    sentences = _texts(PROFILE)
    for question, want in [("What is the life expectancy at birth in Tumouland?", "Life expectancy"),
                           ("Tumouland capital?", "Capital: Mapudo"),
                           ("Who heads the government of Tumouland?", "Head of government")]:
        scores = overlap_scores(question, sentences)
        assert sentences[int(np.argmax(scores))].startswith(want), question


def test_a_heading_that_only_restates_the_question_is_no_evidence() -> None:
    sentences = _texts(PROSE)
    scores = overlap_scores("How does the assert statement work?", sentences)
    assert scores[0] == 0.0  # 'The "assert" statement' holds no word beyond the question's
    assert sentences[int(np.argmax(scores))].startswith("Assert statements are")


def test_content_words_fold_case_accents_plurals_and_drop_function_words() -> None:
    assert content_words("What are the Statements of Émile?") == ["statement", "emile"]
    assert overlap_scores("", ["a sentence"]).tolist() == [0.0]


def test_evidence_rows_are_the_tokens_overlapping_the_window() -> None:
    offsets = np.array([[0, 3], [3, 8], [8, 12], [12, 20]])
    assert evidence_rows(offsets, 3, 12) == (1, 3)
    assert evidence_rows(offsets, 4, 9) == (1, 3)  # partly covered tokens count
    assert evidence_rows(offsets, 30, 40) == (0, 0)


def test_the_plan_answers_from_evidence_above_the_threshold_and_falls_back_below() -> None:
    passages = [Passage("p1", PROFILE, "profile/tumouland", metadata={"title": "Tumouland"})]
    policy = AnswerPolicy(decoding="rag-copy", evidence="overlap", evidence_min=0.3)
    plan = plan_answer(policy, "What is the life expectancy at birth?", passages, n_ra=1)
    assert plan.method.name == "nest" and plan.evidence is not None
    ev = plan.evidence
    assert PROFILE[ev.start:ev.sentence_end] == "Life expectancy at birth: 76.6 years"
    assert ev.end >= ev.sentence_end  # the window goes on in the passage
    weak = plan_answer(policy, "Which river crosses Tumouland?", passages, n_ra=1)
    assert weak.method.name == "rag-copy" and weak.evidence is None  # below the threshold
    assert weak.absent is None and [p.id for p in weak.passages] == ["p1"]
    # a subject no passage is about: no evidence, no passage to copy or cite, the prompt keeps
    # the retrieved one to read (policy.evidence.on_subject)
    away = plan_answer(policy, "Which river crosses Zanzibar?", passages, n_ra=1)
    assert away.method.name == "greedy" and away.evidence is None
    assert away.absent == "Zanzibar" and away.passages == []
    assert [p.id for p in away.prompt_passages] == ["p1"]
    named = plan_answer(policy, "What is the life expectancy?", passages, n_ra=1,
                        decoding=("greedy",))
    assert named.method.name == "greedy" and named.evidence is None  # a named method wins
    raw = plan_answer(policy, "Life expectancy at birth:", passages, n_ra=1, raw_text=True)
    assert raw.evidence is None  # raw text is continued, not answered


def test_choose_evidence_rejects_an_unknown_scorer_and_needs_sentences() -> None:
    with pytest.raises(ValueError, match="evidence scorer 'bm25' is unknown"):
        choose_evidence("q", [Passage("p", "Some text.")], scorer="bm25")
    assert choose_evidence("q", [Passage("p", " \n ")]) is None
    with pytest.raises(ValueError, match="AnswerPolicy.evidence='bm25' is invalid"):
        AnswerPolicy(evidence="bm25")
    with pytest.raises(ValueError, match="evidence_min"):
        AnswerPolicy(evidence_min=1.5)


# ----------------------------------------------------------------------------- citations


def test_word_edges_treat_separators_inside_numbers_as_inside() -> None:
    t = "life 77.5 years (2024) and 1,000 people"
    assert not word_edge(t, t.index("77.5") + 2) and not word_edge(t, t.index("77.5") + 3)
    assert not word_edge(t, t.index("1,000") + 1) and not word_edge(t, t.index("1,000") + 2)
    assert word_edge(t, t.index("years")) and word_edge(t, 0) and word_edge(t, len(t))


def test_a_citation_cut_inside_a_word_or_number_is_narrowed_to_whole_words() -> None:
    src = "The chief of state of Aruba is King WILLEM-ALEXANDER; life 77.5 years (2024 est.)"
    out = "ruba is King"
    ps = src.index("ruba")
    assert snap_to_words(out, src, 0, len(out), ps, ps + len(out)) == (5, 12, ps + 5, ps + 12)
    piece = ".5 years (202"
    ps = src.index(piece)
    # both edges cut a number: only "years" is left, too short a citation of its own to keep
    s, e, p0, p1 = snap_to_words(piece, src, 0, len(piece), ps, ps + len(piece))
    assert piece[s:e] == "years" == src[p0:p1]


def _tokens(text: str) -> tuple[list[str], np.ndarray]:
    """A character-pair tokenizer: tokens cut words anywhere (the hardest case for the rule)."""
    toks = [text[i:i + 2] for i in range(0, len(text), 2)]
    offs = np.array([(i, min(i + 2, len(text))) for i in range(0, len(text), 2)])
    return toks, offs


@pytest.mark.parametrize("seed", range(40))
def test_citations_never_start_or_end_inside_a_word_and_stay_exact(seed: int) -> None:
    """Random copies of random runs of a passage, tokenised so runs start and end anywhere:
    every citation is an exact slice of both texts and no edge is inside a word or number."""
    rng = random.Random(seed)
    words = ["state", "Aruba", "77.5", "1,000", "King", "of", "the", "is", "(2024)", "years"]
    src = " ".join(rng.choice(words) for _ in range(40))
    passage = Passage("p", src, "d")
    toks, offs = _tokens(src)
    sources, out, ends = [], "", []
    for _ in range(4):
        a = rng.randrange(len(toks) - 1)
        b = min(len(toks), a + rng.randint(1, 8))
        out += rng.choice(["", " ", "x"])  # text the model wrote itself
        if len(out):
            sources.append(None)
            ends.append(len(out))
        for j in range(a, b):
            out += toks[j]
            sources.append((0, j))
            ends.append(len(out))
    for c in build_citations(sources, ends, [passage], [offs], text=out):
        assert out[c.start:c.end] == c.text == src[c.passage_start:c.passage_end]
        for t, i in ((out, c.start), (out, c.end), (src, c.passage_start), (src, c.passage_end)):
            assert word_edge(t, i), (c.text, out, src)


def test_adjacent_runs_of_one_passage_merge_into_one_citation() -> None:
    src = "The simple form is equivalent to\n\n   if not expression: raise AssertionError"
    toks, offs = _tokens(src)
    # two runs of the same passage, skipping token 10 in the positions but writing its text
    sources = [(0, j) for j in range(0, 10)] + [None] + [(0, j) for j in range(11, len(toks))]
    ends = list(np.cumsum([len(t) for t in toks]))
    cites = build_citations(sources, ends, [Passage("p", src, "d")], [offs], text=src)
    assert len(cites) == 1 and cites[0].text == src


def test_a_definition_is_answered_by_its_document_lead_and_an_attribute_by_its_sentence():
    """``EVIDENCE_LEAD``: a reference entry defines its subject first without repeating its
    name; "What is X?" gets that lead, not a later sentence that repeats X (an example, a second
    sense). A sentence holding the attribute asked for still beats the lead. A heading is never
    the evidence."""
    head = "Permutation\n***********\n\n"
    lead = "An ordering of a certain number of elements of a given set."
    example = "For instance, the permutations of (1,2,3) are 123, 132, 213, 231, 312 and 321."
    count = "The number of permutations of n elements is n factorial."
    text = f"{head}{lead} {example} {count}"
    p = Passage("p", text, "dict/permutation", char_start=0, metadata={"title": "Permutation"})
    ev = choose_evidence("What is a permutation?", [p], scorer="overlap")
    assert p.text[ev.start:ev.sentence_end] == lead
    # the lead's window runs on through its passage (an explanation), ending at a sentence end
    assert p.text[ev.start:ev.end] == f"{lead} {example} {count}"
    ev = choose_evidence("What is the number of permutations of n elements?", [p],
                         scorer="overlap")
    assert p.text[ev.start:ev.end] == count  # an attribute: its sentence alone, then the end
    # the title's words hold no answer: without a title the sentence that repeats the name wins
    untitled = Passage("u", text, "dict/permutation", char_start=0)
    ev = choose_evidence("What is a permutation?", [untitled], scorer="overlap", lead=0.0)
    assert untitled.text[ev.start:ev.sentence_end] == example
    # a passage that does not open its document has no lead
    later = Passage("q", f"{lead} {example}", "dict/permutation", char_start=400)
    assert not any(c.lead for c in candidates("What is a permutation?", [later], "overlap"))
    assert [c.heading for c in candidates("What is a permutation?", [p], "overlap")][0]


@pytest.mark.parametrize("title", ["interlacing", None])
def test_a_line_that_only_names_the_document_is_not_its_lead(title):
    """A dictionary entry, a fact sheet or a plain-text file opens with its name on a line of
    its own ("interlacing", then the definition): that line is a heading, so "What is X?" is
    answered from the definition and the quote does not open with the bare name, titled or
    not. A first line that says something (it ends a sentence, or runs on in its paragraph)
    stays a sentence."""
    lead = 'A video display system which builds an image on the VDU in two phases.'
    more = "The complete image is created by scanning an electron beam twice."
    text = f"interlacing\n\n{lead} {more}"
    p = Passage("p", text, "foldoc/interlacing", char_start=0,
                metadata={"title": title} if title else {})
    cands = candidates("What is interlacing?", [p], "overlap")
    assert [(c.text, c.heading, c.lead) for c in cands] == [
        ("interlacing", True, False), (lead, False, True), (more, False, False)]
    ev = choose_evidence("What is interlacing?", [p], scorer="overlap")
    assert p.text[ev.start:ev.end] == f"{lead} {more}"
    # the title's line anywhere in a passage is a heading, a longer untitled first line is not
    named = Passage("q", f"{more}\n\nInterlacing\n\n{lead}", "d", char_start=0,
                    metadata={"title": "Interlacing"})
    assert [c.heading for c in candidates("What is it?", [named], "overlap")] == [
        False, True, False]
    for first in ("Price: 499 dollars\nThe kettle boils in a minute.",  # runs on: a field line
                  "The kettle boils in a minute.\n\nIt is quiet.",  # a sentence
                  "Setting up the Orbit Kettle before you use it the first time in "
                  "any kitchen\n\nFill it."):  # too long for a name
        q = Passage("k", first, "kettle", char_start=0, metadata={"title": "Kettle"})
        assert not candidates("What is it?", [q], "overlap")[0].heading, first


def test_an_explanation_window_never_ends_on_a_sentence_that_announces_a_block():
    """The window of a lead ends at the last sentence end that does not introduce what follows
    ("... is equivalent to" before its code, "... into a program:" before a grammar): the
    announced block is said with its lead-in, or neither is."""
    text = ("Assert statements insert debugging assertions into a program:\n\n"
            "   assert_stmt ::= \"assert\" expression\n\n"
            "The simple form is equivalent to\n\n"
            "   if __debug__:\n       if not expression: raise AssertionError\n\n"
            "These equivalences assume the built-in names.\n\n"
            "The extended form is equivalent to\n\n   if __debug__: pass\n")
    p = Passage("p", text, "assert", char_start=0)
    ev = choose_evidence("How do assert statements work?", [p], scorer="overlap")
    assert ev.start == 0 and ev.end == len(text.rstrip())  # the passage's end ends it too
    cut = text.index("The extended form") + 10  # the last block does not fit the window
    ev = choose_evidence("How do assert statements work?", [p], scorer="overlap",
                         window_chars=cut)
    assert p.text[:ev.end].endswith("These equivalences assume the built-in names.")
    short = choose_evidence("How do assert statements work?", [p], scorer="overlap",
                            window_chars=120)
    # too short for the next block and the sentence after it: the lead-in with its own block
    assert p.text[short.start:short.end] == (
        "Assert statements insert debugging assertions into a program:\n\n"
        "   assert_stmt ::= \"assert\" expression")
    tiny = choose_evidence("How do assert statements work?", [p], scorer="overlap",
                           window_chars=70)
    # too short for its block too: the lead-in alone
    assert p.text[tiny.start:tiny.end] == "Assert statements insert debugging assertions into a program:"


PRODUCT = ("Zivatrotek Max 2\n\nThe Zivatrotek Max 2 is a tablet sold worldwide. The place of "
           "assembly of the Zivatrotek Max 2 is Gupubreaville. The Zivatrotek Max 2 is priced at "
           "$1,867. The warranty of the Zivatrotek Max 2 is 2 years.")


@pytest.mark.parametrize("question, want", [
    ("Tell me the Zivatrotek Max 2's price.", "The Zivatrotek Max 2 is priced at $1,867."),
    ("The Zivatrotek Max 2: what is the price?", "The Zivatrotek Max 2 is priced at $1,867."),
    ("What is the Zivatrotek Max 2?", "The Zivatrotek Max 2 is a tablet sold worldwide."),
])
def test_an_attribute_a_sentence_states_is_answered_by_it_not_by_the_lead(question, want):
    """A question that asks for an attribute ("price") that a sentence states (inflected:
    "priced") is answered by that sentence; the lead's extra weight is for questions that ask
    what the subject is. The attribute's sentence stands alone; the lead's window runs on."""
    p = Passage("p", PRODUCT, "product/zivatrotek-max-2", char_start=0,
                metadata={"title": "Zivatrotek Max 2"})
    ev = choose_evidence(question, [p], scorer="overlap")
    assert p.text[ev.start:ev.sentence_end] == want
    assert (ev.end > ev.sentence_end) == want.endswith("worldwide.")


TOPIC = ('The "raise" statement\n*********************\n\n   raise_stmt ::= "raise" [expression]\n\n'
         'If no expressions are present, "raise" re-raises the exception that is currently being '
         'handled.\n\nChanged in version 3.11: If the traceback of the active exception is '
         'modified, a subsequent "raise" statement re-raises the exception with the modified '
         'traceback.\n')


@pytest.mark.parametrize("question", ["What is the raise statement for?",
                                      "Explain the raise statement.",
                                      "How does Python handle the raise statement?"])
def test_a_question_that_asks_nothing_beyond_its_documents_heading_gets_its_lead(question):
    """The stored title is the file's stem ("raise"); the document's heading says what it is
    called ('The "raise" statement'), so "statement" is the subject, not an attribute asked.
    Such a question is answered by the document's lead, however well a side sentence repeats
    its words; a capitalised word in it ("Python") is a context, not an attribute."""
    p = Passage("p", TOPIC, "pydoc/raise.txt", char_start=0, metadata={"title": "raise"})
    ev = choose_evidence(question, [p], scorer="overlap")
    assert p.text[ev.start:ev.sentence_end].startswith("If no expressions are present")


def test_a_document_whose_heading_the_question_says_is_about_it_whatever_its_title():
    """"How does Python handle dictionary displays?" over a document stored as "dict" under the
    heading "Dictionary displays": the subject read from the question ("Python") names no
    title, but the question says the document's heading, so the document is about it (no
    absent subject) and its lead answers."""
    text = ("Dictionary displays\n*******************\n\nA dictionary display is a possibly empty "
            "series of dict items enclosed in curly braces.\n\nIf a comma-separated sequence of "
            "dict items is given, they are evaluated from left to right.\n")
    p = Passage("p", text, "pydoc/dict.txt", char_start=0, metadata={"title": "dict"})
    other = Passage("o", "The Python Software Foundation holds the copyright.", "psf",
                    char_start=0, metadata={"title": "Software Foundation"})
    choice = choose("How does Python handle dictionary displays?", [p, other], "overlap")
    assert choice.absent is None
    assert p.text[choice.evidence.start:choice.evidence.sentence_end].startswith(
        "A dictionary display is")


def test_a_lead_in_is_said_with_the_block_it_announces():
    """A sentence that announces a block ("... last one executed:" before its example, "...
    numeric literals:" before a grammar) is said with that block: the quote's first part
    (``sentence_end``) runs through the indented lines, and stops at the prose after them."""
    text = ('Since the "finally" clause always executes, a "return" statement executed in the '
            '"finally" clause will always be the last one executed:\n\n   >>> def foo():\n'
            "   ...     try:\n   ...         return 'try'\n   ...     finally:\n"
            "   ...         return 'finally'\n   >>> foo()\n   'finally'\n\n"
            "Changed in version 3.8: a continue statement was illegal in the finally clause.\n")
    p = Passage("p", text, "pydoc/try.txt", char_start=900, metadata={"title": "try"})
    ev = choose_evidence("What happens when a return statement is executed in a finally clause?",
                         [p], scorer="overlap")
    assert ev.start == 0 and p.text[:ev.sentence_end].endswith("   'finally'")
    assert ev.end == ev.sentence_end  # an attribute's sentence, with its block, then the end
    lead = "Python supports string and bytes literals and various numeric literals:"
    topic = (f"Literals\n********\n\n{lead}\n\n   literal ::= stringliteral | bytesliteral\n\n"
             "Evaluation of a literal yields an object of the given type.\n")
    q = Passage("q", topic, "pydoc/atom-literals.txt", char_start=0, metadata={"title": "Literals"})
    ev = choose_evidence("What are literals?", [q], scorer="overlap")
    assert q.text[ev.start:ev.sentence_end] == f"{lead}\n\n   literal ::= stringliteral | bytesliteral"
    assert q.text[ev.start:ev.end].endswith("of the given type.")  # the lead's window runs on
    short = choose_evidence("What are literals?", [q], scorer="overlap", window_chars=len(lead) + 5)
    assert q.text[short.start:short.sentence_end] == lead  # the block does not fit: the lead-in
