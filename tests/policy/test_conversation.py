"""The carry-over rule (``policy.conversation``): a follow-up made standalone from the question
before it, by pronoun coreference, ellipsis and bridging, and a new question left alone; the
LM rewrite's parsing; ``standalone_query`` for each mode; the policy field's validation.

The cases are read the way the rule is written, by the linguistic form of the follow-up, over
several kinds of subject (countries, people, products, terms), not the benchmark's questions."""

from __future__ import annotations

import pytest

from nest_integrations.decoding.prompts import conversation_titles, standalone_query
from nest_integrations.policy import AnswerPolicy
from nest_integrations.policy.conversation import (
    anaphors,
    carry_over,
    condense_messages,
    resolve_turns,
    rewrite,
    subject_of,
)
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.retrieval.titles import TitleIndex
from nest_integrations.types import Passage

TITLES = TitleIndex({"c": "Cambodia", "b": "The Bahamas", "le": "Life expectancy",
                     "ada": "Ada Lovelace", "k": "Kettle (appliance)", "m": "Malawi",
                     "bih": "Bosnia and Herzegovina"})


def standalone(*turns: str, titles: TitleIndex | None = TITLES) -> str:
    return resolve_turns(turns, titles)[-1].standalone


@pytest.mark.parametrize("titles", [TITLES, None], ids=["title-index", "no-index"])
@pytest.mark.parametrize("first, follow_up, expected", [
    # ellipsis of the predicate: a verbless fragment whose only content is a new name
    ("What is the life expectancy at birth in Cambodia?", "And in The Bahamas?",
     "What is the life expectancy at birth in The Bahamas?"),
    ("How many people live in Cambodia?", "What about Bosnia and Herzegovina?",
     "How many people live in Bosnia and Herzegovina?"),
    ("When was Ada Lovelace born?", "And Charles Babbage?", "When was Charles Babbage born?"),
    ("Cambodia: what is the official language?", "Malawi?",
     "Malawi: what is the official language?"),
    # pronoun coreference: the pronoun's antecedent is the previous subject
    ("What is the capital of Cambodia?", "What is its currency?",
     "What is Cambodia's currency?"),
    ("Who was Ada Lovelace?", "What did she write?", "What did Ada Lovelace write?"),
    ("When was Ada Lovelace born?", "Where did her father live?",
     "Where did Ada Lovelace's father live?"),
    ("What is the area of Malawi?", "How many people live there?",
     "How many people live in Malawi?"),
    ("What is the area of Malawi?", "Which lakes are near there?",
     "Which lakes are near Malawi?"),
    ("Is Cambodia a monarchy?", "Is it larger than Malawi?", "Is Cambodia larger than Malawi?"),
    ("Who was Ada Lovelace?", "Did she meet Charles Babbage before he built his engine?",
     "Did Ada Lovelace meet Charles Babbage before he built his engine?"),
    # ellipsis of the subject, and a bare definite (bridging)
    ("What is the capital of Malawi?", "And the currency?", "What is the currency of Malawi?"),
    # an indefinite in a fragment is a new referent in the previous one's place
    ("What is a kettle?", "And a toaster?", "What is a toaster?"),
    ("What is the capital of Malawi?", "What is the national holiday?",
     "What is the national holiday of Malawi?"),
])
def test_a_follow_up_takes_the_previous_subject_or_predicate(titles, first, follow_up, expected):
    assert standalone(first, follow_up, titles=titles) == expected


@pytest.mark.parametrize("titles", [TITLES, None], ids=["title-index", "no-index"])
@pytest.mark.parametrize("first, question", [
    ("What is the capital of Cambodia?", "What is the capital of Malawi?"),  # its own subject
    ("What is the capital of Cambodia?", "Tell me about Ada Lovelace."),  # a verb, a new name
    ("What is the capital of Cambodia?", "What is a generator?"),  # indefinite: a new referent
    ("What is the capital of Cambodia?", "Is it true that kettles boil water?"),  # expletive it
    ("What is the capital of Cambodia?", "Is there a list of kettles?"),  # existential there
    ("What is the capital of Cambodia?", "Why?"),  # a sluice: nothing to carry
    ("What is the capital of Cambodia?", "What is the difference between a list and a tuple?"),
    # a pronoun after a name of its own sentence refers to that name
    ("What is the capital of Cambodia?", "When Ada Lovelace was young, where did she live?"),
])
def test_a_self_contained_question_is_left_alone(titles, first, question):
    assert standalone(first, question, titles=titles) == question


def test_the_first_question_and_a_single_message_are_left_alone():
    q = "What is its capital?"
    assert standalone(q) == q
    assert carry_over([{"role": "user", "content": q}], TITLES) == q
    assert carry_over([], TITLES) == ""


def test_the_subject_is_the_proper_noun_or_the_object_of_a_preposition_not_a_common_title():
    """"Life expectancy" is a title too, but in "the life expectancy ... in Cambodia" the
    subject is Cambodia: the proper noun, or (lower-cased) the object of the preposition."""
    assert subject_of("What is the life expectancy at birth in Cambodia?", TITLES) == "Cambodia"
    assert subject_of("what is the life expectancy at birth in cambodia", TITLES) == "cambodia"
    assert standalone("what is the life expectancy in cambodia", "and malawi?") == \
        "what is the life expectancy in malawi"
    # a definitional question's subject is its whole noun phrase, not only its proper noun
    assert subject_of("What is a Zorvane pump?", None) == "Zorvane pump"
    assert standalone("What is a Zorvane pump?", "How does it work?", titles=None) == \
        "How does Zorvane pump work?"
    assert standalone("What is a kettle?", "How does it work?", titles=None) == \
        "How does kettle work?"
    assert subject_of("Explain the assert statement.", None) == "assert statement"
    assert subject_of("What is Cambodia's capital?", None) == "Cambodia"
    assert subject_of("Malawi's capital?", None) == "Malawi"


def test_a_chain_of_follow_ups_keeps_the_subject_the_user_last_named():
    turns = ["What is the capital of Cambodia?", "And its currency?", "What about Malawi?",
             "How many people live there?"]
    out = resolve_turns(turns, TITLES)
    assert [r.standalone for r in out[1:]] == [
        "And Cambodia's currency?", "And Malawi's currency?", "How many people live in Malawi?"]
    assert [r.kind for r in out] == ["new", "pronoun", "ellipsis", "pronoun"]


def test_only_user_messages_are_read():
    """The assistant's answer between the turns names other countries; the antecedent is still
    the subject the user asked about."""
    messages = [
        {"role": "system", "content": "Answer from the documents about Malawi."},
        {"role": "user", "content": "What is the capital of Cambodia?"},
        {"role": "assistant", "content": "The capital of Cambodia is Phnom Penh; Malawi's is "
                                         "Lilongwe."},
        {"role": "user", "content": "What is its population?"},
    ]
    assert carry_over(messages, TITLES) == "What is Cambodia's population?"


def test_determiners_complementisers_and_expletives_are_not_anaphors():
    def words(text: str) -> list[str]:
        return [m.group() for m in anaphors(text)]

    assert words("What does this function return?") == []
    assert words("What does this mean?") == ["this"]
    assert words("Is the claim that it rains true?") == ["it"]
    assert words("Is it possible to swim there?") == ["there"]
    assert words("Are there mountains?") == []


def test_standalone_query_reads_the_policy_mode_and_the_retrievers_titles():
    passages = [Passage(d, f"{t} is a country.", doc_id=d, metadata={"title": t})
                for d, t in (("c", "Cambodia"), ("b", "The Bahamas"))]
    retriever = InMemoryRetriever(passages)
    assert sorted(conversation_titles(retriever, ["x"]).titles.values()) == [
        "Cambodia", "The Bahamas"]
    assert conversation_titles(None, ["x"]) is None
    messages = [{"role": "user", "content": "what is the area of cambodia?"},
                {"role": "assistant", "content": "181,035 sq km."},
                {"role": "user", "content": "and of the bahamas?"}]
    # lower-cased: only the title index knows "the bahamas" is a name
    assert standalone_query(messages, "carry", retriever=retriever) == \
        "what is the area of the bahamas?"
    assert standalone_query(messages, "last", retriever=retriever) == "and of the bahamas?"
    assert standalone_query("and of the bahamas?", "carry") == "and of the bahamas?"
    # "rewrite" without an LM to rewrite with falls back to the rule
    assert standalone_query(messages, "rewrite", retriever=retriever) == \
        "what is the area of the bahamas?"
    with pytest.raises(ValueError, match="conversation='both' is invalid.*carry"):
        standalone_query(messages, "both")


def test_the_rewrite_prompt_holds_the_conversation_and_its_first_line_is_the_query():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of Cambodia?"},
                {"role": "assistant", "content": "Phnom Penh."},
                {"role": "user", "content": "And of Malawi?"}]
    (prompt,) = condense_messages(messages)
    assert prompt["role"] == "user"
    text = prompt["content"]
    assert "User: What is the capital of Cambodia?\nAssistant: Phnom Penh." in text
    assert text.rstrip().endswith("Last question: And of Malawi?\nStandalone question:")
    assert "Be brief." not in text
    seen = []

    def complete(msgs: list[dict[str, str]]) -> str:
        seen.append(msgs)
        return ' Standalone question: "What is the capital of Malawi?"\nIt is Lilongwe.'

    assert rewrite(messages, complete) == "What is the capital of Malawi?"
    assert seen == [[prompt]]
    assert rewrite(messages, lambda m: "  \n") == "And of Malawi?"  # empty: the last message
    assert rewrite(messages[:2], complete) == "What is the capital of Cambodia?"  # one turn


def test_the_policy_validates_its_conversation_mode():
    assert AnswerPolicy().conversation == "carry"
    assert AnswerPolicy.from_preset("grounded", conversation="rewrite").conversation == "rewrite"
    with pytest.raises(ValueError, match="AnswerPolicy.conversation='all' is invalid"):
        AnswerPolicy(conversation="all")
