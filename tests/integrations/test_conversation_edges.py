"""A follow-up in a chat is answered from the conversation at every edge that takes messages
(issue 60): ``NestEngine.generate`` with a message list, LangChain's ``ChatNest`` with history,
LlamaIndex's ``NestLLM.chat`` and a LlamaIndex chat engine over it, and the server's
``messages``.

The conversation is the issue's: "What is the life expectancy at birth in Cambodia?", an answer,
then "And in The Bahamas?". Read alone, the follow-up names The Bahamas and no attribute, and its
best sentence is The Bahamas' capital (a cited wrong answer). Each edge must retrieve with the
carried-over question and answer with the life-expectancy sentence of The Bahamas, copied and
cited on its document (the ``grounded`` default: evidence first). The fast tests run the tiny
random Llama (the evidence sentence is copied whatever the model); the slow one runs the
embedded model at every edge, with the carry-over and with the model's own rewrite.
"""

from __future__ import annotations

from typing import Any

import pytest

from nest_integrations.config import NestConfig
from nest_integrations.decoding.prompts import REWRITE_CALL
from nest_integrations.policy import POLICIES
from nest_integrations.policy.conversation import condense_messages
from nest_integrations.retrieval.in_memory import InMemoryRetriever
from nest_integrations.types import Passage
from tests.engines import make_engine

CORPUS = {
    "cambodia": ("Cambodia", "Cambodia is a country in Southeast Asia. Its capital is Phnom "
                 "Penh. The life expectancy at birth in Cambodia is 71.4 years."),
    "bahamas": ("The Bahamas", "The Bahamas is an island country in the Atlantic Ocean. The "
                "capital of The Bahamas is Nassau. The life expectancy at birth in The Bahamas "
                "is 74.1 years."),
    "malawi": ("Malawi", "Malawi is a landlocked country in southeastern Africa. The life "
               "expectancy at birth in Malawi is 66.3 years. Its capital is Lilongwe."),
}
FIRST = "What is the life expectancy at birth in Cambodia?"
ANSWER = "The life expectancy at birth in Cambodia is 71.4 years."
FOLLOW_UP = "And in The Bahamas?"
STANDALONE = "What is the life expectancy at birth in The Bahamas?"
GOLD = "The life expectancy at birth in The Bahamas is 74.1 years."
MESSAGES = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": FOLLOW_UP}]
TOKENS = 24


class RecordingRetriever(InMemoryRetriever):
    """The in-memory retriever, recording every query it is asked."""

    def __init__(self, passages: list[Passage]) -> None:
        super().__init__(passages)
        self.queries: list[str] = []

    def retrieve(self, query: str, k: int) -> list[Passage]:
        self.queries.append(query)
        return super().retrieve(query, k)


def passages() -> list[Passage]:
    return [Passage(d, t, doc_id=d, char_start=0, char_end=len(t), metadata={"title": title})
            for d, (title, t) in CORPUS.items()]


def grounded(lm: Any, **policy: Any) -> Any:
    cfg = NestConfig.from_preset("grounded", n_passages=3, ra_passages=2)
    return make_engine(lm, RecordingRetriever(passages()), config=cfg,
                       policy=POLICIES["grounded"].replace(**policy))


def check_answer(text: str, citations: list[tuple[str, str]]) -> None:
    """The answer opens with the gold sentence, cited on its document: ``citations`` are
    ``(doc_id, cited text)`` pairs."""
    assert text.strip().startswith(GOLD), text
    assert any(doc == "bahamas" and "74.1" in cited for doc, cited in citations), citations


@pytest.fixture(scope="module")
def engine(tiny_lm: Any) -> Any:
    return grounded(tiny_lm)


def test_engine_generate_retrieves_with_the_carried_over_question(engine):
    engine.retriever.queries.clear()
    result = engine.generate(MESSAGES, max_new_tokens=TOKENS)
    assert engine.retriever.queries == [STANDALONE]
    check_answer(result.text, [(c.doc_id, c.text) for c in result.citations])
    assert result.stats.decoding == "nest"
    # the prompt the model decodes from still holds the whole conversation
    assert engine.prompt_ids(MESSAGES) == engine.lm.chat_prompt(MESSAGES)


def test_last_reads_the_last_message_and_rewrite_the_models_own_rewrite(tiny_lm):
    last = grounded(tiny_lm, conversation="last")
    last.generate(MESSAGES, max_new_tokens=4)
    assert last.retriever.queries == [FOLLOW_UP]
    rewrite = grounded(tiny_lm, conversation="rewrite")
    expected = rewrite.generate(condense_messages(MESSAGES), **REWRITE_CALL).text
    expected = next((s.strip() for s in expected.splitlines() if s.strip()), "") or FOLLOW_UP
    rewrite.generate(MESSAGES, max_new_tokens=4)
    assert rewrite.retriever.queries == [expected.strip('"')]
    # a caller's query wins, and one question needs no conversation
    rewrite.retriever.queries.clear()
    rewrite.generate(MESSAGES, max_new_tokens=4, query="Bahamas capital")
    rewrite.generate(MESSAGES[:1], max_new_tokens=4)
    assert rewrite.retriever.queries == ["Bahamas capital", FIRST]


def test_langchain_chat_nest_with_history(engine):
    from langchain_core.messages import AIMessage, HumanMessage

    from nest_integrations.langchain import ChatNest

    engine.retriever.queries.clear()
    chat = ChatNest(engine=engine, max_tokens=TOKENS)
    msg = chat.invoke([HumanMessage(FIRST), AIMessage(ANSWER), HumanMessage(FOLLOW_UP)])
    assert engine.retriever.queries == [STANDALONE]
    notes = msg.content_blocks[0].get("annotations", [])
    check_answer(msg.text, [(n["extras"]["doc_id"], n["cited_text"]) for n in notes])


def test_llama_index_nest_llm_chat_and_a_chat_engine_over_it(engine):
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import Memory

    from nest_integrations.llama_index import NestLLM

    llm = NestLLM(engine=engine, max_new_tokens=TOKENS)
    engine.retriever.queries.clear()
    history = [ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES]
    response = llm.chat(history)
    assert engine.retriever.queries == [STANDALONE]
    result = response.raw["nest_result"]
    check_answer(response.message.content, [(c.doc_id, c.text) for c in result.citations])

    engine.retriever.queries.clear()  # the chat engine keeps the history itself
    # its memory's default is half the model's window, 256 tokens for the tiny model's 512,
    # and LlamaIndex counts an answer's citation payloads (about 560 tokens): room for two
    memory = Memory.from_defaults(token_limit=4096)
    chat = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    chat.chat(FIRST)
    second = chat.chat(FOLLOW_UP)
    assert engine.retriever.queries == [FIRST, STANDALONE]
    assert second.response.strip().startswith(GOLD)


def test_server_messages(engine):
    from starlette.testclient import TestClient

    from nest_integrations.server import create_app

    engine.retriever.queries.clear()
    with TestClient(create_app(engine)) as client:
        r = client.post("/v1/chat/completions", json={
            "model": "nest", "messages": MESSAGES, "max_tokens": TOKENS})
    assert r.status_code == 200, r.text
    assert engine.retriever.queries == [STANDALONE]
    message = r.json()["choices"][0]["message"]
    check_answer(message["content"], [(a["url_citation"]["doc_id"], a["url_citation"]["cited_text"])
                                      for a in message.get("annotations", [])])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["carry", "rewrite"])
def test_every_edge_answers_the_follow_up_on_the_embedded_model(default_lm, mode):
    """The embedded model behind each edge: with the carry-over, each retrieves with the
    carried-over question and answers with the gold sentence; with the model's rewrite, each
    retrieves with the model's own rewrite (whatever it wrote: a 135M model often repeats the
    first question), the same at every edge. The server serves its preset's policy (``nest
    serve --preset``), not the engine's, so it reads the conversation with the default's
    carry-over in both cases."""
    from langchain_core.messages import AIMessage, HumanMessage
    from llama_index.core.base.llms.types import ChatMessage
    from starlette.testclient import TestClient

    from nest_integrations.langchain import ChatNest
    from nest_integrations.llama_index import NestLLM
    from nest_integrations.policy.conversation import rewrite
    from nest_integrations.server import create_app

    engine = grounded(default_lm, conversation=mode)
    answers = [engine.generate(MESSAGES, max_new_tokens=TOKENS).text]
    lc = ChatNest(engine=engine, max_tokens=TOKENS).invoke(
        [HumanMessage(FIRST), AIMessage(ANSWER), HumanMessage(FOLLOW_UP)])
    answers.append(lc.text)
    li = NestLLM(engine=engine, max_new_tokens=TOKENS).chat(
        [ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES])
    answers.append(li.message.content)
    queries = list(engine.retriever.queries)
    assert len(queries) == 3 and len(set(queries)) == 1, queries
    assert len(set(answers)) == 1, answers  # the same answer at every edge
    engine.retriever.queries.clear()
    with TestClient(create_app(engine)) as client:
        r = client.post("/v1/chat/completions", json={
            "model": "nest", "messages": MESSAGES, "max_tokens": TOKENS})
    served = r.json()["choices"][0]["message"]["content"]
    assert engine.retriever.queries == [STANDALONE]
    assert served.strip().startswith(GOLD)
    if mode == "carry":
        assert queries[0] == STANDALONE and answers[0] == served
    else:
        engine.retriever.queries.clear()
        own = rewrite(MESSAGES, lambda m: engine.generate(m, **REWRITE_CALL).text)
        assert queries[0] == own and engine.retriever.queries == []
