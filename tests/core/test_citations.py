"""The clause rule of citations (``core.citations``): provenance on a document other than the
answer's is shown only for a whole clause (issue 53). Pure functions, no model: fast."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nest_integrations.core.citations import (
    adjacent_groups,
    answer_document,
    build_citations,
    clause_end,
    clause_rule,
    clause_start,
    make_citation,
    merge_adjacent,
    run_pieces,
    whole_clause,
)
from nest_integrations.types import Passage
from tests.core.toy_tokens import toy_tokens

ARUBA = Passage("p-aw", "The chief of state of Aruba is King WILLEM-ALEXANDER.", doc_id="aruba")
NIUE = Passage("p-nu", "The chief of state of Niue is King CHARLES III, since 2022.",
               doc_id="niue")


def _cite(passage: Passage, answer: str, cited: str, at: int = 0, kind: str = "copy"):
    """The citation of ``cited`` (its first occurrence in ``answer`` from ``at``) to its first
    occurrence in ``passage``."""
    s, ps = answer.index(cited, at), passage.text.index(cited)
    return make_citation(passage, s, s + len(cited), ps, ps + len(cited), len(cited.split()),
                         kind)


def test_clause_edges_hand_cases():
    text = "Aruba (a country) is King X, born 1967; capital\n  Oranjestad. (Dutch)"
    assert clause_start(text, 0) and clause_start(text, text.index("a country"))
    assert clause_start(text, text.index("(a country"))  # the bracket opens a clause
    assert clause_start(text, text.index("born")) and clause_start(text, text.index("capital"))
    assert clause_start(text, text.index("Oranjestad"))  # past whitespace, after a line break
    assert not clause_start(text, text.index("is King")) and not clause_start(text, 1)
    assert clause_end(text, text.index(", born")) and clause_end(text, text.index(") is"))
    assert clause_end(text, text.index(";") + 1)  # the citation holds its own mark
    assert clause_end(text, text.index("\n  Oran"))  # before a line break
    assert clause_end(text, len(text)) and clause_end("Aruba is  ", 8)
    assert not clause_end(text, text.index(" King")) and not clause_end(text, 3)
    # an open end (a stream): whitespace up to the end says nothing yet
    assert clause_end("Aruba is", 8, open_end=True) is None
    assert clause_end("Aruba is ", 8, open_end=True) is None
    assert clause_end("Aruba is,", 8, open_end=True) is True
    assert clause_end("Aruba is K", 8, open_end=True) is False
    assert whole_clause(text, text.index("born"), text.index(";"))
    assert not whole_clause(text, text.index("King"), text.index(";"))
    assert whole_clause("X, born", 3, 7, open_end=True) is None
    assert whole_clause("X is born", 5, 9, open_end=True) is False  # its start says no already


def test_answer_document_is_the_evidences_else_the_most_cited():
    answer = "The chief of state of Aruba is King WILLEM-ALEXANDER."
    scrap = _cite(NIUE, answer, "of state of")
    king = _cite(ARUBA, answer, "King WILLEM-ALEXANDER")
    assert answer_document([scrap, king]) == "aruba"  # 20 characters against 9
    assert answer_document([scrap, king], evidence_doc="niue") == "niue"
    assert answer_document([]) is None and answer_document([], "niue") == "niue"
    short = _cite(ARUBA, answer, "The chief")  # 8 characters against "of state of"'s 9
    assert answer_document([short, scrap]) == "niue"
    same = _cite(ARUBA, answer, "of state")
    assert answer_document([same, _cite(NIUE, answer, "of state", at=1)]) == "aruba"  # first
    support = make_citation(NIUE, 0, len(answer), 0, len(NIUE.text), 9, "support")
    assert answer_document([king, support]) == "aruba"  # support citations do not count


def test_a_scrap_of_another_document_is_dropped_a_whole_clause_is_kept():
    """The issue's case: "of state of" cited from Niue's profile in an answer about Aruba."""
    answer = "The chief of state of Aruba is King WILLEM-ALEXANDER. Since 2022, it is."
    scrap = _cite(NIUE, answer, "of state of")
    king = _cite(ARUBA, answer, "King WILLEM-ALEXANDER")
    clause = make_citation(NIUE, answer.index("Since 2022") + 6, answer.index("Since 2022") + 10,
                           NIUE.text.index("2022"), NIUE.text.index("2022") + 4, 1, "verbatim")
    assert clause.text == "2022"
    assert clause_rule([scrap, king, clause], answer, "aruba") == [False, True, False]
    whole = _cite(NIUE, "x. King CHARLES III, y", "King CHARLES III")
    assert clause_rule([whole], "x. King CHARLES III, y", "aruba") == [True]
    # with Niue as the evidence, Niue's scrap stays and Aruba's "King ..." must be a clause
    assert clause_rule([scrap, king], answer, "niue") == [True, False]
    support = make_citation(NIUE, 4, 9, 0, 5, 1, "support")
    assert clause_rule([support], answer, "aruba") == [True]  # only copy and verbatim


def test_clause_rule_in_a_stream_says_none_until_it_knows():
    answer = "The chief of state of"
    scrap = _cite(NIUE, answer, "of state of")
    # without evidence the answer's document can still change; the end of the text too
    assert clause_rule([scrap], answer, None, open_end=True) == [None]
    assert clause_rule([scrap], answer + " Aruba", None, open_end=True) == [None]
    assert clause_rule([scrap], answer + " Aruba", "aruba", open_end=True) == [False]
    assert clause_rule([scrap], answer, "aruba", open_end=True) == [False]  # its start
    lead = _cite(NIUE, answer, "The chief of state of")
    assert clause_rule([lead], answer, "aruba", open_end=True) == [None]
    assert clause_rule([lead], answer + ",", "aruba", open_end=True) == [True]
    assert clause_rule([lead], answer, "niue", open_end=True) == [True]


def test_build_citations_with_the_clause_rule_drops_the_scrap_only():
    """End to end over token sources: the scrap's tokens lose their citation (they stay in the
    text); without ``clauses`` every run is cited as before."""
    passages = [ARUBA, NIUE]
    (ta, oa), (tn, on) = toy_tokens(ARUBA.text), toy_tokens(NIUE.text)
    # "The chief" (LM) + " of state of" (Niue 2..4) + " Aruba is King WILLEM-ALEXANDER." (Aruba)
    out, sources, ends = "", [], []
    for tok, src in ([("The", None), (" chief", None)]
                     + [(tn[k], (1, k)) for k in range(2, 5)]
                     + [(ta[k], (0, k)) for k in range(5, len(ta))]):
        out += tok
        sources.append(src)
        ends.append(len(out))
    assert out == ARUBA.text
    plain = build_citations(sources, ends, passages, [oa, on], text=out)
    assert [c.text for c in plain] == ["of state of", "Aruba is King WILLEM-ALEXANDER."]
    ruled = build_citations(sources, ends, passages, [oa, on], text=out, clauses=True)
    assert [c.text for c in ruled] == ["Aruba is King WILLEM-ALEXANDER."]
    with_evidence = build_citations(sources, ends, passages, [oa, on], text=out, clauses=True,
                                    evidence_doc="niue")
    assert [c.text for c in with_evidence] == ["of state of"]


def _random_answer(rng: random.Random, passages, toks):
    """An answer of random copies of the passages' token runs and the model's own tokens."""
    out, sources, ends = "", [], []
    for _ in range(rng.randint(1, 7)):
        if rng.random() < 0.4:
            for tok in rng.choices([" is", ",", ".", " the", "\n", " (", ")", " X"],
                                   k=rng.randint(1, 3)):
                out += tok
                sources.append(None)
                ends.append(len(out))
            continue
        p = rng.randrange(len(passages))
        a = rng.randrange(len(toks[p]))
        for k in range(a, min(len(toks[p]), a + rng.randint(1, 9))):
            out += toks[p][k]
            sources.append((p, k))
            ends.append(len(out))
    return out, sources, ends


@pytest.mark.parametrize("seed", range(4))
def test_clause_rule_property(seed):
    """On random answers over two documents: a kept citation is on the answer's document or a
    whole clause, a dropped piece is neither, the rule only removes citations (the kept
    ones are exactly those ``build_citations(clauses=True)`` gives), and it has teeth."""
    rng = random.Random(seed)
    passages = [ARUBA, NIUE, Passage("p-nu2", "Niue (an island), in the Pacific; small.",
                                     doc_id="niue")]
    toks, offs = zip(*(toy_tokens(p.text) for p in passages))
    dropped = kept_off = 0
    for _ in range(300):
        out, sources, ends = _random_answer(rng, passages, toks)
        pieces = run_pieces(sources, ends, passages, offs, text=out)
        ev = rng.choice([None, "aruba", "niue"])
        doc = answer_document(pieces, ev)
        verdicts = clause_rule(pieces, out, doc)
        for c, v in zip(pieces, verdicts):
            on_doc = c.doc_id == doc
            assert v == (on_doc or bool(whole_clause(out, c.start, c.end))), (out, c.text)
            dropped += not v
            kept_off += v and not on_doc
        kept = merge_adjacent([c for c, v in zip(pieces, verdicts) if v], passages, out)
        built = build_citations(sources, ends, passages, offs, text=out, clauses=True,
                                evidence_doc=ev)
        assert built == kept
        for c in built:
            assert out[c.start:c.end] == c.text
        plain = build_citations(sources, ends, passages, offs, text=out)
        covered = {i for c in plain for i in range(c.start, c.end)}
        assert all(i in covered for c in built for i in range(c.start, c.end))
    assert dropped > 50 and kept_off > 10, (dropped, kept_off)


def test_adjacent_groups_are_what_merge_adjacent_joins():
    src = "The simple form is equivalent to\n\n   if not expression: raise AssertionError"
    passage = Passage("p", src, "d")
    toks, offs = toy_tokens(src)
    sources = [(0, j) for j in range(0, 6)] + [None] + [(0, j) for j in range(7, len(toks))]
    ends = list(np.cumsum([len(t) for t in toks]))
    pieces = run_pieces(sources, ends, [passage], [offs], text=src)
    assert adjacent_groups(pieces, [passage], src) == [[0, 1]]
    assert [c.text for c in merge_adjacent(pieces, [passage], src)] == [src]
    cache: dict = {}
    assert run_pieces(sources, ends, [passage], [offs], text=src, cache=cache) == pieces
    assert len(cache) == 2
    assert run_pieces(sources, ends, [passage], [offs], text=src, cache=cache) == pieces


def test_a_hyphen_or_an_apostrophe_between_letters_is_inside_a_word():
    """"just-in-time" is one word: the edges helper saw '-in-time compiler then runs them.'
    cited from "or a just-in-time compiler" (issue 53: no citation cuts a word)."""
    from nest_integrations.core.citations import snap_to_words, word_edge

    t = "or a just-in-time compiler, Cambodia's rock 'n' roll - the end"
    for k in ("-in", "in-", "-time", "'s"):
        assert not word_edge(t, t.index(k) + (1 if k.endswith("-") else 0)), k
    assert word_edge(t, t.index(" compiler")) and word_edge(t, t.index("'n'"))
    assert word_edge(t, t.index("- the")) and word_edge(t, t.index(" the end"))
    out = "an interpreter or just-in-time compiler then runs them."
    src = "an interpreter or a just-in-time compiler then runs them."
    s, ps = out.index("-in-time"), src.index("-in-time")
    e, pe = len(out), len(src)
    assert snap_to_words(out, src, s, e, ps, pe) == (
        out.index("compiler"), e, src.index("compiler"), pe)
    s, e = out.index("just"), out.index("-time") + 1  # "just-in-" ends on a joiner: cut back
    assert snap_to_words(out, src, s, e, src.index("just"), src.index("-time") + 1) is None
