"""An LCEL chain ``prompt | ChatNest | ...`` that prints the answer and the spans it copied.

NEST copies spans of retrieved text while it decodes and cites each one. Here the corpus is a
LangChain ``InMemoryVectorStore`` embedded with NEST's offline MiniLM; the chain returns the
answer text plus one ``Document`` per cited span.

Run:  python cookbook/langchain_lcel_citations.py      (about 30 s on CPU; nothing downloaded)
"""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnableParallel
from langchain_core.vectorstores import InMemoryVectorStore

from nest_integrations.langchain import ChatNest, NestEmbeddings, citations_to_documents

CORPUS = [
    Document(
        id="python-with",
        page_content=(
            "The with statement is used to wrap the execution of a block with methods defined "
            "by a context manager. This allows common try, except and finally usage patterns "
            "to be encapsulated for convenient reuse."
        ),
        metadata={"source": "python/compound_stmts.md", "title": "The with statement",
                  "url": "https://docs.python.org/3/reference/compound_stmts.html#with"},
    ),
    Document(
        id="eddystone",
        page_content=(
            "The Eddystone Lighthouse stands on the Eddystone Rocks, 14 kilometres south of "
            "Rame Head in Cornwall. The current structure, designed by James Douglass, is the "
            "fourth lighthouse to be built on the site."
        ),
        metadata={"source": "wiki/eddystone.md", "title": "Eddystone Lighthouse"},
    ),
    Document(
        id="green-tea",
        page_content=(
            "Green tea is made from Camellia sinensis leaves and buds that have not undergone "
            "the withering and oxidation process used to make oolong and black teas."
        ),
        metadata={"source": "wiki/green_tea.md", "title": "Green tea"},
    ),
]


def main() -> None:
    store = InMemoryVectorStore(NestEmbeddings())
    store.add_documents(CORPUS)

    chat = ChatNest(retriever=store.as_retriever(search_kwargs={"k": 2}), max_tokens=40)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Complete the user's text."), ("human", "Continue this text: {opening}")]
    )
    chain = (prompt | chat) | RunnableParallel(
        answer=StrOutputParser(), sources=RunnableLambda(citations_to_documents)
    )

    out = chain.invoke({"opening": "The with statement is used to wrap the execution of"})
    print("Answer:", out["answer"].strip())
    print(f"\n{len(out['sources'])} cited span(s):")
    for doc in out["sources"]:
        m = doc.metadata
        where = f"answer[{m['answer_start_index']}:{m['answer_end_index']}]"
        print(f"- {where} <- {m['title']} ({m['source']}): {doc.page_content.strip()!r}")


if __name__ == "__main__":
    main()
