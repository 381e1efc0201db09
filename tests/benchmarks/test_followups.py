"""The follow-up family (``benchmarks.sets.followups``) and its runner's report
(``benchmarks.followups``): the set is the same on every build, split by document, sized, with
gold that its documents hold; the runner's shares and intervals add up."""

from __future__ import annotations

from benchmarks.followups import markdown, summarize
from benchmarks.sets.followups import (
    FAMILIES,
    PROFILE_SEED,
    SPLITS,
    build_followups,
    generate_devices,
)
from nest_integrations.policy.conversation import carry_over
from nest_integrations.retrieval.titles import TitleIndex


def test_the_set_is_deterministic_and_its_seeds_matter():
    a, b = build_followups(), build_followups()
    assert a.items == b.items
    assert a.profiles.documents == b.profiles.documents
    assert a.devices.documents == b.devices.documents
    other = build_followups(profile_seed=PROFILE_SEED + 1, device_seed=1)
    assert {c.messages for c in other.items}.isdisjoint({c.messages for c in a.items})
    assert PROFILE_SEED != 0  # not the profiles the default's rules were written on


def test_each_family_has_forty_conversations_or_more_and_splits_share_no_document():
    fs = build_followups()
    for family in FAMILIES:
        assert sum(len(fs.conversations(s, family)) for s in SPLITS) >= 40
        assert all(len(fs.conversations(s, family)) >= 20 for s in SPLITS)
    docs = {s: set() for s in SPLITS}
    for c in fs.items:
        docs[c.split].add(c.gold_doc_id)
    assert docs["dev"].isdisjoint(docs["test"])
    # the first turn's document is in the follow-up's split too (the ellipsis family's X)
    titles = {d["metadata"]["title"]: d["id"] for d in fs.profiles.documents}
    for c in fs.items:
        if c.family == "ellipsis":
            x = next(t for t in titles if t in c.messages[0][1])
            assert titles[x] in docs[c.split]
    assert len({c.id for c in fs.items}) == len(fs.items)


def test_the_gold_is_in_the_gold_document_and_nowhere_else_and_the_follow_up_needs_turn_one():
    fs = build_followups()
    text = {d["id"]: d["text"] for d in fs.profiles.documents + fs.devices.documents}
    title = {d["id"]: d["metadata"]["title"] for d in fs.profiles.documents + fs.devices.documents}
    for c in fs.items:
        assert [r for r, _ in c.messages] == ["user", "assistant", "user"]
        assert any(a in text[c.gold_doc_id] for a in c.answers), c
        assert not set(c.answers) & set(c.distractors)
        follow_up = c.messages[-1][1]
        if c.family == "ellipsis":  # names the document but not the attribute
            assert title[c.gold_doc_id] in follow_up
            assert c.standalone.split(" of ")[0].removeprefix("What is the ") not in follow_up
        else:  # names no document
            assert not any(t in follow_up for t in title.values())
    for d in generate_devices().devices:  # the operation's terms are in its paragraph only
        doc = text[d["doc_id"]]
        operation = doc.split("Operation\n")[1].split("\n\n")[0]
        for k in d["keys"]:
            assert k in operation and doc.count(k) == operation.count(k)


def test_the_carry_over_names_the_gold_document_of_every_dev_follow_up():
    """The rule (written from the linguistic forms, before this set) resolves every dev
    follow-up into a question that names its gold document, with the collection's titles."""
    fs = build_followups()
    index = TitleIndex({d["id"]: d["metadata"]["title"]
                        for d in fs.profiles.documents + fs.devices.documents})
    for c in fs.conversations("dev"):
        q = carry_over(c.chat(), index)
        assert index.titles[c.gold_doc_id].casefold() in q.casefold(), (c.messages, q)


def test_the_report_counts_right_cited_and_wrong_with_intervals():
    def rec(system: str, right: bool, on_gold: bool, wrong_cited: bool) -> dict:
        return {"system": system, "family": "pronoun", "right": right, "cited_on_gold": on_gold,
                "wrong_cited": wrong_cited, "query_names_gold": right, "seconds": 2.0}

    records = [rec("carry", True, True, False)] * 3 + [rec("carry", False, False, True),
                                                       rec("last", False, False, True)]
    rows = {(r["family"], r["system"]): r for r in summarize(records, ["last", "carry"])}
    carry = rows[("pronoun", "carry")]
    assert (carry["n"], carry["right"], carry["cited_on_gold"], carry["wrong"],
            carry["wrong_cited"]) == (4, 3, 3, 1, 1)
    lo, hi = carry["right_ci"]
    assert 0.0 < lo < 0.75 < hi <= 1.0
    assert rows[("all", "last")]["right_ci"][0] == 0.0
    assert ("ellipsis", "carry") not in rows
    text = markdown(list(rows.values()), "dev")
    assert "| pronoun | carry | 4 | 3/4 = 75% [" in text
