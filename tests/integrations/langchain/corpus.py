"""A tiny corpus for the LangChain tests: source documents cut into passages with offsets.

``documents()`` are LangChain ``Document``s (id = passage id; metadata with ``source``,
``title``, ``url``, ``doc_id``, ``char_start``/``char_end`` into ``SOURCES``), the shape NEST's
own ingest produces, so citations can be checked against the source text.
"""

from __future__ import annotations

import functools
from typing import Any

from langchain_core.documents import Document

SOURCES = {
    "eddystone": (
        "Eddystone Lighthouse. The Eddystone Lighthouse stands on the Eddystone Rocks, 14 "
        "kilometres south of Rame Head in Cornwall. The current structure, designed by James "
        "Douglass, is the fourth lighthouse to be built on the site."
    ),
    "green-tea": (
        "Green tea. Green tea is made from Camellia sinensis leaves and buds that have not "
        "undergone the withering and oxidation process used to make oolong and black teas."
    ),
    "assert": (
        "The assert statement. Assert statements are a convenient way to insert debugging "
        "assertions into a program. The simple form raises AssertionError when the expression "
        "is false."
    ),
}
TITLES = {"eddystone": "Eddystone Lighthouse", "green-tea": "Green tea", "assert": "assert"}
URLS = {"assert": "https://docs.python.org/3/reference/simple_stmts.html#assert"}

#: A user message whose continuation is in the corpus (the 135M model copies it).
GROUNDED = "Continue this text: The Eddystone Lighthouse stands on the Eddystone Rocks,"


def _cut(text: str) -> list[tuple[int, int]]:
    """Passages = the title line, then the rest (offsets into the source)."""
    head = text.index(". ") + 2
    return [(0, head - 1), (head, len(text))]


def documents() -> list[Document]:
    """Every passage as a Document with NEST's metadata (offsets index ``SOURCES``)."""
    docs = []
    for doc_id, text in SOURCES.items():
        for i, (start, end) in enumerate(_cut(text)):
            meta: dict[str, Any] = {
                "source": f"{doc_id}.md",
                "title": TITLES[doc_id],
                "doc_id": doc_id,
                "chunk_index": i,
                "char_start": start,
                "char_end": end,
                "lang": "en",  # user metadata: must flow through untouched
            }
            if doc_id in URLS:
                meta["url"] = URLS[doc_id]
            docs.append(Document(id=f"{doc_id}-{i}", page_content=text[start:end], metadata=meta))
    return docs


def passages() -> list[Any]:
    """The same passages as NEST ``Passage``s."""
    from nest_integrations.integrations.langchain.retrievers import as_passages

    return as_passages(documents())


def fake_engine(**config: Any) -> Any:
    """A ``NestEngine`` over ``FakeLM`` (whitespace tokens, instant) and the corpus."""
    from nest_integrations.config import NestConfig
    from tests.engines import make_engine
    from nest_integrations.retrieval.in_memory import InMemoryRetriever
    from tests.fakes import FakeLM

    return make_engine(FakeLM(), InMemoryRetriever(passages()), config=NestConfig(**config))


@functools.cache
def memory_store() -> Any:
    """An ``InMemoryVectorStore`` of the corpus with the real MiniLM embeddings (built once)."""
    from langchain_core.vectorstores import InMemoryVectorStore

    from nest_integrations.langchain import NestEmbeddings

    store = InMemoryVectorStore(NestEmbeddings())
    store.add_documents(documents())
    return store


def check_annotations(text: str, annotations: list[dict[str, Any]]) -> None:
    """Each annotation is the exact answer slice (a support citation's, on by default: a
    sentence of the answer, backed by the passage sentence it cites) and, with offsets, the
    exact source slice."""
    from nest_integrations.attribution import split_units

    for a in annotations:
        assert a["type"] == "citation"
        extras = a["extras"]
        if extras["kind"] == "support":
            assert (a["start_index"], a["end_index"]) in split_units(text), a
        else:
            assert text[a["start_index"] : a["end_index"]] == a["cited_text"], a
        source = SOURCES[extras["doc_id"]]
        if extras.get("source_start_char") is not None:
            span = source[extras["source_start_char"] : extras["source_end_char"]]
            assert span == a["cited_text"]
        assert a["cited_text"] in source
        assert extras["passage_id"].startswith(extras["doc_id"])
