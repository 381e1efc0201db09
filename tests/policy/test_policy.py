"""The answer policy (``policy.answer``): presets name a policy and a config; ``grounded`` answers
a chat question from its evidence (the prompt passages' sentence that says the answer, quoted and
cited, then NEST's copying) and, where no sentence holds enough of the question, losslessly
against its RA prompt (greedy decoding of that prompt, whatever the phrasing); ``paper`` is the
paper's algorithm with no guards, and the guards are prefix-exact: they only end an answer
early, and a stream never shows text the answer drops."""

from __future__ import annotations

import numpy as np
import pytest

from engines import make_engine
from nest_integrations.config import PRESETS, Guards, NestConfig
from nest_integrations.decoding.prompts import prompt_ids
from nest_integrations.policy import POLICIES, AnswerPolicy
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Passage


def test_every_preset_names_a_policy_and_a_config():
    assert set(POLICIES) == set(PRESETS)
    paper = POLICIES["paper"]
    assert paper == AnswerPolicy() and paper.guards == Guards() and not paper.title_match
    assert paper.method().name == "nest"
    grounded = POLICIES["grounded"]
    assert grounded.title_match and grounded.method().name == "rag-copy"  # without evidence
    assert grounded.evidence == "combined" and grounded.evidence_decoding == "nest"
    assert grounded.method(completion=True).name == "nest"  # raw text to continue: copying
    assert grounded.guards.stop_on_repeat and grounded.guards.min_citation_words == 3
    assert POLICIES["copy"].method().name == "nest"
    assert POLICIES["copy"].guards == grounded.guards
    assert PRESETS["copy"] == PRESETS["grounded"]  # the same algorithm, another decoding


def test_policy_fields_are_validated_and_replaced():
    for bad in ({"title_context": "always"}, {"decoding": "nope"}, {"title_match": "yes"},
                {"guards": {"stop_on_repeat": True}}, {"completion_relevance": "high"},
                {"completion_relevance": -0.1}, {"completion_relevance": True}):
        with pytest.raises(ValueError):
            AnswerPolicy(**bad)
    with pytest.raises(ValueError, match="unknown preset"):
        AnswerPolicy.from_preset("nope")
    p = AnswerPolicy.from_preset("grounded", guards={"min_citation_words": 1})
    assert p.guards.min_citation_words == 1 and p.guards.stop_on_repeat
    with pytest.raises(ValueError, match="unknown AnswerPolicy field"):
        p.replace(fact_decoding="rag-copy")


def test_the_method_is_the_calls_then_the_engines_then_the_policys():
    p = POLICIES["grounded"]
    assert p.method("greedy", "nest").name == "greedy"
    assert p.method(None, "nest").name == "nest"
    assert p.method(None, None).name == "rag-copy"
    assert p.method("greedy", completion=True).name == "greedy"
    assert AnswerPolicy().method(None, None).name == "nest"
    assert AnswerPolicy(decoding="greedy").method(completion=True).name == "greedy"


def test_grounded_continues_raw_text_by_copying_and_answers_chat_losslessly(grounded):
    """The call's form decides (not its wording): a string to continue gets NEST's relaxed
    copying of the text that follows, the same text as a chat message an answer from its
    evidence (or, without evidence, the lossless RA answer)."""
    text = "Cambodia is a country in Southeast Asia. Its capital is"
    raw = grounded.generate(text, max_new_tokens=8)
    chat = grounded.generate([{"role": "user", "content": text}], max_new_tokens=8)
    assert raw.stats.decoding == "nest" and chat.stats.decoding == "nest"
    assert grounded.plan(text, grounded.retrieve(text), raw_text=True).evidence is None
    plain = grounded.generate([{"role": "user", "content": text}], max_new_tokens=8,
                              policy=POLICIES["grounded"].replace(evidence=None))
    assert plain.stats.decoding == "rag-copy"


VIKINGS = ("The Vikings were seafaring people from Scandinavia who raided, traded and settled "
           "across Europe from the late eighth to the late eleventh century")


def test_relevance_is_one_for_a_passages_own_opening_and_low_for_another_subject():
    """The gate's measure (``retrieval.relevance``, the packaged MiniLM): a passage's own opening
    is exactly as close as the reference; a text about another subject is far below the
    grounded threshold, and the same holds for any length of the opening."""
    from nest_integrations.embedders.minilm import shared_embedder
    from nest_integrations.policy.answer import GROUNDED_COMPLETION_RELEVANCE
    from nest_integrations.retrieval.relevance import (
        embedder_of,
        opening,
        relevance,
        retriever_relevance,
        stored_vector,
    )

    embed = shared_embedder().embed
    text = CORPUS[0][2]
    for n in (4, 9, 100):
        assert relevance(embed, opening(text, n), text) == pytest.approx(1.0, abs=1e-6)
    assert relevance(embed, VIKINGS, text) < GROUNDED_COMPLETION_RELEVANCE / 2
    assert relevance(embed, "", text) == 0.0 and relevance(embed, VIKINGS, " ") == 0.0
    assert opening("a b  c", 2) == "a b" and opening("a b", 0) == "a"
    assert embedder_of(InMemoryRetriever([], embedder=shared_embedder())) is shared_embedder()
    assert embedder_of(object()) is None and embedder_of(InMemoryRetriever([])) is None
    # a retriever's stored vector gives the same measure as embedding the passage again
    retr = InMemoryRetriever([Passage(d, t, doc_id=d) for d, _, t in CORPUS],
                             embedder=shared_embedder())
    assert stored_vector(retr, "cambodia") is None  # no dense query yet: nothing stored
    top = retr.retrieve(VIKINGS, 1)[0]
    vec = stored_vector(retr, top.id)
    assert vec is not None and stored_vector(retr, "nope") is None
    plain = relevance(embed, VIKINGS, top.text)
    assert relevance(embed, VIKINGS, top.text, vec) == pytest.approx(plain, abs=1e-5)
    assert retriever_relevance(retr, VIKINGS, top) == pytest.approx(plain, abs=1e-5)
    # a vector of another embedder (another width) is not mixed in: the passage is embedded
    assert relevance(embed, VIKINGS, top.text, [1.0, 0.0, 0.0]) == pytest.approx(plain, abs=1e-5)

    class OtherSpace:  # a retriever whose stored vectors come from an embedder we cannot call
        def stored_embeddings(self, ids):
            return [np.ones(384) for _ in ids]

    assert retriever_relevance(OtherSpace(), VIKINGS, top) == pytest.approx(plain, abs=1e-5)


def test_grounded_decodes_raw_text_the_corpus_is_not_about_as_rag(grounded):
    """The relevance gate: raw text stage 1 is not about gets the chat method (``rag-copy``,
    the RA answer, no copied span of another document); text the corpus holds keeps copying; a
    method the call names, a chat message and a policy without the gate skip it."""
    from nest_integrations.policy.answer import GROUNDED_COMPLETION_RELEVANCE

    off = grounded.generate(VIKINGS, max_new_tokens=8)
    assert off.stats.decoding == "rag-copy" and not off.citations
    assert off.stats.relevance < GROUNDED_COMPLETION_RELEVANCE
    assert off.text == grounded.generate(VIKINGS, max_new_tokens=8, decoding="rag-copy").text
    on = grounded.generate(CORPUS[1][2][:60], max_new_tokens=8)
    assert on.stats.decoding == "nest" and on.stats.relevance >= GROUNDED_COMPLETION_RELEVANCE
    assert grounded.generate(VIKINGS, max_new_tokens=8, decoding="nest").stats.decoding == "nest"
    ungated = grounded.generate(VIKINGS, max_new_tokens=8,
                                policy=POLICIES["grounded"].replace(completion_relevance=None))
    assert ungated.stats.decoding == "nest" and ungated.stats.relevance is None
    chat = grounded.generate([{"role": "user", "content": VIKINGS}], max_new_tokens=8)
    assert chat.stats.relevance is None and chat.stats.to_dict()["relevance"] is None


CORPUS = [
    ("cambodia", "Cambodia", "Cambodia is a country in Southeast Asia. Its capital is Phnom "
     "Penh. The life expectancy at birth in Cambodia is 71.4 years."),
    ("malawi", "Malawi", "Malawi is a landlocked country in southeastern Africa. The life "
     "expectancy at birth in Malawi is 66.3 years. Its capital is Lilongwe."),
    ("life", "Life expectancy", "Life expectancy is a statistical measure of the average time "
     "an organism is expected to live."),
]
PHRASINGS = [
    "What is the life expectancy at birth in Cambodia?",
    "What is the life expectancy at birth of Cambodia?",
    "Cambodia: what is the life expectancy at birth?",
    "Tell me Cambodia's life expectancy at birth.",
    "life expectancy at birth cambodia",
    "Which city is the capital of Malawi?",
]


@pytest.fixture(scope="module")
def grounded(tiny_lm):
    passages = [Passage(d, t, doc_id=d, char_start=0, char_end=len(t),
                        metadata={"title": title}) for d, title, t in CORPUS]
    cfg = NestConfig.from_preset("grounded", n_passages=3, ra_passages=2)
    return make_engine(tiny_lm, InMemoryRetriever(passages), config=cfg,
                       policy=POLICIES["grounded"])


GOLD = {"Cambodia": ("cambodia", "71.4"), "Malawi": ("malawi", "Lilongwe")}


@pytest.mark.parametrize("question", PHRASINGS)
def test_grounded_answers_open_with_the_sentence_that_says_it(grounded, question):
    """Whatever the phrasing, the default chooses the named document's sentence that holds the
    value (evidence first), and the answer opens with that sentence, copied and cited exactly to
    it: the citation holds the value, on the gold document."""
    doc, value = next(v for k, v in GOLD.items() if k.lower() in question.lower())
    messages = [{"role": "user", "content": question}]
    plan = grounded.plan(question, grounded.retrieve(question))
    ev = plan.evidence
    assert ev is not None and plan.method.name == "nest"
    passage = next(p for p in plan.passages if p.id == ev.passage_id)
    sentence = passage.text[ev.start:ev.sentence_end]
    assert passage.doc_id == doc and value in sentence
    result = grounded.generate(messages, max_new_tokens=24)
    assert result.stats.decoding == "nest"
    assert result.text.strip().startswith(sentence), (result.text, sentence)
    first = result.citations[0]
    assert first.kind == "copy" and first.doc_id == doc and value in first.text
    assert result.text[first.start:first.end] == first.text
    assert passage.text[first.passage_start:first.passage_end] == first.text


@pytest.mark.parametrize("question", PHRASINGS)
def test_without_evidence_grounded_answers_are_greedy_decoding_of_their_ra_prompt(grounded,
                                                                                  question):
    """Where the default answers without evidence (no sentence holds enough of the question),
    its answer is the RA-LM's own greedy answer to its prompt (the guards may only end it
    earlier), with the named document in the prompt."""
    messages = [{"role": "user", "content": question}]
    no_evidence = POLICIES["grounded"].replace(evidence=None)
    result = grounded.generate(messages, max_new_tokens=24, policy=no_evidence)
    plan = grounded.plan(question, grounded.retrieve(question), policy=no_evidence)
    assert result.stats.decoding == "rag-copy" and result.stats.exact_rows is not False
    ids = prompt_ids(grounded.lm, messages, plan.prompt_passages)
    assert result.stats.prompt_tokens == len(ids)
    greedy = grounded.generate(messages, max_new_tokens=24, decoding="greedy",
                               passages=plan.prompt_passages, policy=AnswerPolicy(),
                               config=grounded.config.replace(
                                   ra_passages=len(plan.prompt_passages)))
    assert greedy.text.startswith(result.text)
    assert result.stats.finish_reason == "repeat" or result.text == greedy.text
    named = {p.doc_id for p in plan.prompt_passages if p.metadata.get("title_match")}
    assert named & {"cambodia", "malawi"}
    assert all(len(c.text.split()) >= 3 for c in result.citations)  # every kind, 3+ words


@pytest.mark.slow
def test_lossless_guards_stop_at_a_repeat_and_leave_a_prefix_of_greedy(default_lm):
    """The embedded model loops on lists: with the repeat stop on (``grounded``'s guards),
    each lossless answer ends at its first repeated sentence or line
    (``finish_reason == "repeat"``) and is a prefix of greedy's; the stream shows exactly the
    answer's text."""
    plain = make_engine(default_lm)
    guarded = make_engine(default_lm, policy=AnswerPolicy(guards=POLICIES["grounded"].guards))
    repeats = 0
    for question in ("Count from 1 to 20, one number per line.", "List the days of the week.",
                     "Write a short poem about the sea.", "What does the assert statement do?"):
        messages = [{"role": "user", "content": question}]
        for method in ("greedy", "prompt-lookup"):
            free = plain.generate(messages, max_new_tokens=96, decoding=method)
            chunks = list(guarded.stream(messages, max_new_tokens=96, decoding=method))
            cut = chunks[-1].result
            assert "".join(c.text for c in chunks) == cut.text
            assert free.text.startswith(cut.text), (question, method)
            repeats += cut.stats.finish_reason == "repeat"
    assert repeats > 0  # the guard fired somewhere: the test has teeth
