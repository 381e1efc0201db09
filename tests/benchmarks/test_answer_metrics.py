"""The per-answer metrics of ``benchmarks.answers`` on hand-made answers, and its pooled rates:
the Wilson interval against published values, the cluster bootstrap, the clustered sign
test."""

from __future__ import annotations

import pytest

from benchmarks.harness import answer_metrics as M
from benchmarks.harness import answer_summary as S
from benchmarks.harness.lead_examples import EXAMPLES, NEAR_MISSES

GOLD = "An ordering of a certain number of elements of a given set."


def cite(doc: str, text: str, kind: str = "copy") -> dict:
    return {"doc_id": doc, "text": text, "kind": kind, "start": 0, "end": len(text)}


def test_sentences_keep_wrapped_lines_and_abbreviations_together():
    text = ('The "nonlocal" statement causes the listed identifiers to refer\nto previously '
            "bound variables. This is important, e.g. for closures.\n\nSee also PEP 3104.")
    assert M.sentences(text) == [
        'The "nonlocal" statement causes the listed identifiers to refer to previously bound '
        "variables.", "This is important, e.g. for closures.", "See also PEP 3104."]
    assert M.first_sentence("Heading\n*******\n\nBody text.") == "Heading *******"
    assert M.sentences("It is 71.4 years (2024 est.). The chief is X.") == [
        "It is 71.4 years (2024 est.).", "The chief is X."]
    assert M.sentences("Seen in Elizabeth P. Smith's note. ok.") == [
        "Seen in Elizabeth P. Smith's note. ok."]
    assert M.first_sentence("   ") == ""


def test_right_needs_the_value_and_no_distractor():
    assert M.right("Life expectancy in Vorland is 71.4 years.", "71.4", ["68.2"])
    assert not M.right("It is 71.4 or 68.2 years.", "71.4", ["68.2"])
    assert not M.right("It is 71 years.", "71.4")
    assert M.right("The Zeta Pad 3 is priced at $1,867.", "$1,867")


def test_run_on_is_text_past_the_sentence_that_holds_the_value():
    value = "71.4"
    assert not M.run_on("Life expectancy at birth in Cambodia is 71.4 years (2024 est.).", value)
    assert not M.run_on("It is 71.4 years.  \n", value)
    assert M.run_on("Life expectancy at birth in Cambodia is 71.4 years (2024 est.). The chief "
                    "of state of Cambodia is King Norodom SIHAMONI (since 29", value)
    assert M.run_on("It is 71.4 years.\n\nThe capital is Nassau.", value)
    assert not M.run_on("The population is about 12 million.", value)  # value absent
    # the value found through normalisation: the sentence that holds it ends the answer
    assert not M.run_on("Its price: 1 867 dollars.", "1,867")


def test_ends_mid_clause_only_for_answers_that_stopped_on_their_own():
    cut = 'The extended form, "assert expression1, expression2", is equivalent to'
    assert M.ends_mid_clause(cut, "stop")
    assert M.ends_mid_clause("or other iterable object:\n\n", "repeat")  # the guard ended it
    assert not M.ends_mid_clause(cut, "length")
    assert M.ends_mid_clause("The chief of state is King X (since 29", "stop")
    assert M.ends_mid_clause("It is equivalent to:", "stop")
    for done in ("It ends here.", "Really?", 'He said "stop"', "It is (2024 est.)",
                 "Done.\u201d", "Code:\n```\nx = 1\n```",
                 "is equivalent to\n\n   if __debug__:\n       if not x: raise AssertionError",
                 ""):
        assert not M.ends_mid_clause(done, "stop"), done


def test_citations_quotes_gold_and_wrong():
    cites = [cite("a", "The price is $349."), cite("b", "x", "support")]
    assert [c["doc_id"] for c in M.quotes(cites)] == ["a"]
    assert M.cited_on_gold(cites, "a", "$349") and not M.cited_on_gold(cites, "a", "$350")
    assert not M.cited_on_gold(cites, "b")  # a support citation is not a quote
    r = M.score("factoid", "The price is $349.", "stop", cites, "a", "$349", ["$350"])
    assert r["right"] and r["cited_on_gold"] and not r["cited_wrong"] and not r["run_on"]
    assert r["n_quotes"] == 1 and r["n_support"] == 1
    w = M.score("factoid", "The price is $350.", "stop", cites, "a", "$349", ["$350"])
    assert not w["right"] and w["cited_wrong"] and not w["cited_on_gold"]
    uncited = M.score("factoid", "It costs $350.", "stop", [], "a", "$349", ["$350"])
    assert not uncited["cited_wrong"]
    with pytest.raises(ValueError, match="kind"):
        M.score("open", "x", "stop", [], "a")


def test_opens_with_lead_on_a_definition_a_side_sentence_and_a_heading():
    assert M.opens_with_lead(GOLD + " For instance, the permutations of (1,2,3) are many.",
                             GOLD)
    assert M.opens_with_lead("A permutation is an ordering of elements of a given set.", GOLD)
    assert not M.opens_with_lead("For instance, the permutations of (1,2,3) are (1,2,3) "
                                 "(2,3,1) (3,1,2).", GOLD)
    assert not M.opens_with_lead('The "nonlocal" statement\n*****\n\nThe "nonlocal" statement '
                                 "causes the listed identifiers to refer to ...",
                                 'The "nonlocal" statement causes the listed identifiers to '
                                 "refer to previously bound variables.")
    r = M.score("lead", GOLD, "stop", [cite("foldoc/permutation", GOLD)], "foldoc/permutation",
                gold_sentence=GOLD)
    assert r["opens_with_lead"] and r["cited_on_gold"] and r["lead_overlap"] == 1.0


def test_the_threshold_agrees_with_the_hand_checked_examples():
    assert len(EXAMPLES) == 10 and {e["lead"] for e in EXAMPLES} == {True, False}
    for e in EXAMPLES + NEAR_MISSES:
        assert M.opens_with_lead(e["answer"], e["gold"]) == e["lead"], e
    # the near misses are why the threshold is not lower: they would pass at 0.35
    assert max(M.lead_overlap(e["answer"], e["gold"]) for e in NEAR_MISSES) > 0.35


@pytest.mark.parametrize("k,n,lo,hi", [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605),
                                       (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_interval_matches_newcombe_1998(k, n, lo, hi):
    # Newcombe, "Two-sided confidence intervals for the single proportion", Stat Med 1998,
    # Table I, method 3 (score interval without continuity correction)
    r = S.rate_ci([(f"q{i}", i < k) for i in range(n)])
    assert r["method"] == "wilson" and (r["k"], r["n"]) == (k, n)
    assert r["lo"] == pytest.approx(lo, abs=6e-5) and r["hi"] == pytest.approx(hi, abs=6e-5)


def test_clustered_rates_count_one_observation_per_question():
    # 10 questions of 4 phrasings each, all right or all wrong: 40 prompts that are 10 draws
    pairs = [(f"q{q}", q < 5) for q in range(10) for _ in range(4)]
    r = S.rate_ci(pairs)
    flat = S.rate_ci([(f"p{i}", s) for i, (_, s) in enumerate(pairs)])
    assert r["method"] == "wilson per question" and r["rate"] == 0.5 == flat["rate"]
    assert (r["k"], r["n"]) == (20, 40)
    assert (r["lo"], r["hi"]) == pytest.approx((0.2366, 0.7634), abs=6e-5)  # Wilson 5 of 10
    assert (r["hi"] - r["lo"]) > (flat["hi"] - flat["lo"]) * 1.4
    # none right: still an interval, not [0, 0]
    zero = S.rate_ci([(f"q{q}", False) for q in range(8) for _ in range(2)])
    assert zero["lo"] == 0.0 and zero["hi"] == pytest.approx(0.3244, abs=6e-5)  # 0 of 8
    assert S.rate_ci([])["n"] == 0


def test_paired_sign_test_counts_questions_not_phrasings():
    # A right on 3 phrasings of q1 where B is wrong: one won question, not three
    a = [("q1", True), ("q1", True), ("q1", True), ("q2", False), ("q3", True), ("q3", False)]
    b = [("q1", False), ("q1", False), ("q1", False), ("q2", True), ("q3", False), ("q3", True)]
    r = S.paired(a, b)
    assert (r["questions"], r["won"], r["lost"], r["tied"]) == (3, 1, 1, 1)
    assert r["p"] == 1.0
    many = S.paired([(f"q{i}", True) for i in range(10)], [(f"q{i}", False) for i in range(10)])
    assert many["won"] == 10 and many["p"] == pytest.approx(2 / 2 ** 10)  # McNemar exact
    with pytest.raises(ValueError, match="paired"):
        S.paired(a, b[:-1])
    with pytest.raises(ValueError, match="not paired"):
        S.paired([("q1", True)], [("q2", True)])


def _rec(system, qid, right, kind="factoid", **kw):
    base = {"family": "factoid", "system": system, "qid": qid, "prompt": qid, "kind": kind,
            "right": right, "cited_on_gold": right, "cited_wrong": False, "run_on": False,
            "mid_clause": False, "finish": "stop", "tokens": 10, "seconds": 1.0}
    return {**base, **kw}


def test_summarize_rows_rates_over_their_denominators():
    recs = [_rec("rag", f"q{i}", i < 2) for i in range(4)]
    recs += [_rec("default", f"q{i}", True, run_on=i == 0) for i in range(4)]
    rows = S.summarize(recs, ["rag", "default"], "rag", held_out=("synonym",))
    d = next(r for r in rows if r["system"] == "default")
    assert d["n"] == 4 and d["right"]["k"] == 4
    assert (d["run_on"]["k"], d["run_on"]["n"]) == (1, 4)  # over right answers
    assert d["cited_wrong"]["n"] == 0
    assert d["vs_reference"]["won"] == 2 and d["vs_reference"]["lost"] == 0
    rag = next(r for r in rows if r["system"] == "rag")
    assert "vs_reference" not in rag and rag["cited_wrong"]["n"] == 2
    text = "\n".join(S.markdown(rows))
    assert "| factoid | default | 4 (4) | 4/4 = 100% [51, 100]" in text
