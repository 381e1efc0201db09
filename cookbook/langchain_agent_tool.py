"""An agent-callable tool that answers with its sources: ``(prompt | ChatNest | ...).as_tool()``.

Give the tool to any tool-calling agent; it answers from your corpus with NEST and lists the
spans it copied. No tool-calling model ships offline, so this script calls the tool the way an
agent executor does: with a ``ToolCall`` dict, getting a ``ToolMessage`` back.

Run:  python cookbook/langchain_agent_tool.py      (about 30 s on CPU; nothing downloaded)
"""

from __future__ import annotations

import json
import warnings

from langchain_core._api import LangChainBetaWarning
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from nest_integrations.langchain import ChatNest, NestEmbeddings

TEXTS = [
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 "
    "individual reefs and 900 islands stretching for over 2,300 kilometres.",
    "Mount Kilimanjaro is a dormant volcano in Tanzania. It is the highest mountain in Africa, "
    "about 5,895 metres above sea level.",
]
METADATA = [
    {"source": "wiki/great_barrier_reef.md", "title": "Great Barrier Reef"},
    {"source": "wiki/kilimanjaro.md", "title": "Mount Kilimanjaro"},
]


def with_sources(msg: AIMessage) -> str:
    """The answer, then one line per cited span: what an agent reads back."""
    notes = msg.content_blocks[0].get("annotations", [])
    lines = [msg.text.strip(), "", "Sources:" if notes else "Sources: none copied"]
    for i, c in enumerate(notes, 1):
        source = f"{c.get('title')} ({c['extras']['source']})"
        lines.append(f"[{i}] {source}: {c['cited_text'].strip()!r}")
    return "\n".join(lines)


def build_tool():  # noqa: ANN201 - a StructuredTool
    warnings.filterwarnings("ignore", category=LangChainBetaWarning)  # as_tool is beta
    store = InMemoryVectorStore.from_texts(TEXTS, NestEmbeddings(), metadatas=METADATA)
    chat = ChatNest(retriever=store.as_retriever(search_kwargs={"k": 2}), max_tokens=40)
    prompt = ChatPromptTemplate.from_messages([("human", "{question}")])
    chain = prompt | chat | RunnableLambda(with_sources)
    return chain.as_tool(
        name="ask_corpus",
        description="Answer a question from the document corpus; the answer lists its sources.",
    )


def main() -> None:
    tool = build_tool()
    print("Tool schema:", json.dumps(tool.tool_call_schema.model_json_schema()["properties"]))
    call = {
        "type": "tool_call",
        "id": "call_1",
        "name": "ask_corpus",
        "args": {"question": "Continue this text: The Great Barrier Reef is the world's"},
    }
    result = tool.invoke(call)  # a ToolMessage, as an agent executor would receive
    print(f"ToolMessage (tool_call_id={result.tool_call_id}):\n{result.content}")


if __name__ == "__main__":
    main()
