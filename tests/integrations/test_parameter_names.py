"""Each edge accepts every name docs/parameters.md lists for it, with the same effect.

The table is read from the page itself. The Python edges run a tiny random Llama (real
tokenizer) through one ``NestEngine``: a token limit under any of its names gives exactly that
many tokens and the engine's own text for that limit; a temperature gives the engine's seeded
sample at that temperature (which differs from greedy); stop strings cut where the engine cuts.
The server's names go through its request parser, the CLI's through its argument parser. Two
names of one setting with different values fail, naming both.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from nest_integrations.config import NestConfig
from nest_integrations.integrations._common import UngroundedWarning
from nest_integrations.types import Passage

PAGE = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"
SETTINGS = ("token limit", "temperature", "stop strings", "context window")
N = 4  # the token limit the tests set
SEED_CONFIG = NestConfig(seed=3)
QUESTION = "Tell me about the Zephyr lamp."


def parameter_table(text: str | None = None) -> dict[str, dict[str, list[str]]]:
    """``{edge: {setting: [names, the edge's own first]}}`` from the page's table."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    body = text.split("<!-- parameter-table: begin")[1].split("<!-- parameter-table: end")[0]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header == ["edge", *SETTINGS], header
    table = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        table[cells[0]] = {s: re.findall(r"`([^`]+)`", c) for s, c in zip(SETTINGS, cells[1:])}
    return table


TABLE = parameter_table()
CASES = [(edge, setting, name) for edge, row in TABLE.items() for setting, names in row.items()
         for name in names]


@pytest.fixture(scope="module")
def engine(tiny_lm: Any) -> Any:
    from nest_integrations.retrieval.in_memory import InMemoryRetriever
    from tests.engines import make_engine

    passages = [Passage(id="lamp", doc_id="lamp", text="The Zephyr lamp runs for 40 hours.")]
    return make_engine(tiny_lm, InMemoryRetriever(passages), config=SEED_CONFIG)


@pytest.fixture(scope="module")
def reference(engine: Any) -> dict[str, dict[str, Any]]:
    """What the engine itself gives, for a chat message and for a text prompt (LangChain's
    ``NestLLM`` completes text): the limit, a sample at 1.5, a stop string's cut."""
    return {"chat": _reference(engine, [{"role": "user", "content": QUESTION}]),
            "text": _reference(engine, QUESTION)}


def _reference(engine: Any, messages: Any) -> dict[str, Any]:
    limited = engine.generate(messages, max_new_tokens=N)
    assert limited.stats.finish_reason == "length" and limited.stats.new_tokens == N
    longer = engine.generate(messages, max_new_tokens=12)
    hot = engine.generate(messages, max_new_tokens=12, config=SEED_CONFIG.replace(temperature=1.5))
    assert hot.text != longer.text  # the temperature shows in the output
    stop = longer.text[len(longer.text) // 2 :].strip()[:3]
    assert stop and stop in longer.text
    cut = engine.generate(messages, max_new_tokens=12, stop=[stop])
    assert cut.text != longer.text
    return {"limited": limited.text, "hot": hot.text, "stop": stop, "cut": cut.text}


# ---------------------------------------------------------------- one caller per edge


def _langchain(cls_name: str) -> Callable[..., str]:
    def call(engine: Any, init: dict[str, Any], call: dict[str, Any]) -> str:
        from nest_integrations import langchain

        model = getattr(langchain, cls_name)(engine=engine, **init)
        out = model.invoke(QUESTION, **call)
        return out.text if cls_name == "ChatNest" else out
    return call


def _llama_llm(engine: Any, init: dict[str, Any], call: dict[str, Any]) -> str:
    from llama_index.core.llms import ChatMessage

    from nest_integrations.llama_index import NestLLM

    llm = NestLLM(engine=engine, **init)
    return llm.chat([ChatMessage(role="user", content=QUESTION)], **call).message.content


def _query_engine(engine: Any, init: dict[str, Any], call: dict[str, Any]) -> str:
    from nest_integrations.llama_index import NestQueryEngine

    assert not call  # a query engine's settings are its LLM's, given to from_args
    return str(NestQueryEngine.from_args(engine=engine, **init).query(QUESTION))


def _engine(engine: Any, init: dict[str, Any], call: dict[str, Any]) -> str:
    kwargs = {"max_new_tokens": 12, **init, **call}
    if "NestConfig.temperature" in kwargs:
        kwargs["config"] = engine.config.replace(temperature=kwargs.pop("NestConfig.temperature"))
    return engine.generate([{"role": "user", "content": QUESTION}], **kwargs).text


CALLERS = {
    "LangChain `ChatNest`": _langchain("ChatNest"),
    "LangChain `NestLLM`": _langchain("NestLLM"),
    "LlamaIndex `NestLLM`": _llama_llm,
    "LlamaIndex `NestQueryEngine.from_args`": _query_engine,
    "Python `NestEngine.generate`": _engine,
}
#: Names per call as well as in the constructor (a query engine's are from_args' only).
PER_CALL = {"LangChain `ChatNest`", "LangChain `NestLLM`", "LlamaIndex `NestLLM`"}
#: Constructor-only names (LangChain passes ``stop=`` per call).
INIT_ONLY = {"stop_sequences", "context_window"}
#: The token limit's own name, used beside the setting under test (the default is 256 tokens).
OWN_LIMIT = {edge: TABLE[edge]["token limit"][0] for edge in CALLERS}


def test_the_table_covers_every_edge() -> None:
    """Every edge has a row; every Python edge has a caller here; each name is listed once."""
    assert set(CALLERS) | {"CLI `nest ask`", "server `/v1/chat/completions`",
                           "server `/v1/completions`"} == set(TABLE)
    for edge, row in TABLE.items():
        assert row["token limit"], edge
        for names in row.values():
            assert len(names) == len(set(names)), (edge, names)


@pytest.mark.parametrize(("edge", "setting", "name"),
                         [c for c in CASES if c[0] in CALLERS], ids=str)
def test_each_python_edge_accepts_each_name(edge: str, setting: str, name: str, engine: Any,
                                            reference: dict[str, Any]) -> None:
    """Under each listed name, in the constructor and per call, the setting has the engine's
    own effect."""
    caller = CALLERS[edge]
    if setting == "context window":
        from nest_integrations.llama_index import NestLLM, NestQueryEngine

        llm = NestLLM(engine=engine, **{name: 321})
        qe = NestQueryEngine.from_args(engine=engine, **{name: 321})
        assert llm.metadata.context_window == qe.llm.metadata.context_window == 321
        return
    value, limit, want = {
        "token limit": (N, {}, "limited"),
        "temperature": (1.5, {OWN_LIMIT[edge]: 12}, "hot"),
        "stop strings": (None, {OWN_LIMIT[edge]: 12}, "cut"),
    }[setting]
    ref = reference["text" if edge == "LangChain `NestLLM`" else "chat"]  # NestLLM: text
    want = ref[want]
    if setting == "stop strings":
        value = [ref["stop"]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UngroundedWarning)  # the engine retrieves
        if edge == "Python `NestEngine.generate`":
            assert caller(engine, {}, {**limit, name: value}) == want
            return
        assert caller(engine, {**limit, name: value}, {}) == want
        if edge in PER_CALL and name not in INIT_ONLY:
            assert caller(engine, limit, {name: value}) == want


def test_the_server_and_cli_accept_their_names() -> None:
    """The server's request parser and ``nest ask``'s argument parser read each listed name."""
    from nest_integrations.cli import build_parser
    from nest_integrations.server.protocol import Limits, parse_chat, parse_completion

    messages = [{"role": "user", "content": QUESTION}]
    for edge, parse, body in (
        ("server `/v1/chat/completions`", parse_chat, {"messages": messages}),
        ("server `/v1/completions`", parse_completion, {"prompt": QUESTION}),
    ):
        row = TABLE[edge]
        for name in row["token limit"]:
            assert parse({**body, name: N}, Limits()).max_tokens == N, (edge, name)
        for name in row["temperature"]:
            assert parse({**body, name: 1.5}, Limits()).temperature == 1.5, (edge, name)
        for name in row["stop strings"]:
            assert parse({**body, name: ["lamp"]}, Limits()).stop == ["lamp"], (edge, name)
    for flag in TABLE["CLI `nest ask`"]["token limit"]:
        args = build_parser().parse_args(["ask", QUESTION, flag, str(N)])
        assert args.max_new_tokens == N


def _aliases() -> list[tuple[str, str, str]]:
    return [(edge, names[0], alias) for edge in CALLERS
            for setting, names in TABLE[edge].items() if setting == "token limit"
            for alias in names[1:]]


@pytest.mark.parametrize(("edge", "own", "alias"), _aliases(), ids=str)
def test_two_names_with_different_values_fail_naming_both(edge: str, own: str, alias: str,
                                                          engine: Any) -> None:
    """The edge's own name and an alias, with different values: a ValueError naming both (in
    the constructor and per call); with the same value it answers."""
    caller = CALLERS[edge]
    with pytest.raises(ValueError, match=rf"{own}=4 and {alias}=5|{alias}=5 and {own}=4"):
        caller(engine, {own: 4, alias: 5}, {})
    if edge in PER_CALL:
        with pytest.raises(ValueError, match=rf"{own}=4 and {alias}=5"):
            caller(engine, {}, {own: 4, alias: 5})
    assert caller(engine, {own: N, alias: N}, {})


def test_the_table_reader_fails_on_a_bad_table() -> None:
    """A table with another header is refused (a moved column cannot pass silently)."""
    bad = ("<!-- parameter-table: begin -->\n| edge | temperature | token limit |\n|---|---|---|\n"
           "<!-- parameter-table: end -->")
    with pytest.raises(AssertionError):
        parameter_table(bad)
