"""Cite ANOTHER model's answer: a standard RAG chain (retrieve -> prompt -> any chat model),
then ``NestAttributor`` checks each sentence of the answer against the retrieved documents.

The chat model here is langchain_core's ``GenericFakeChatModel`` standing in for a hosted one
(``ChatOpenAI``, ``ChatAnthropic``, ...: nothing leaves this machine); swap in yours. Its canned
answer copies one sentence, paraphrases another and makes one up. The output lists, per
sentence, the verbatim spans (exact answer and source offsets), the supporting passage sentence
and its score, and the sentences nothing supports.

Run:  python cookbook/langchain_attribute_any_model.py   (about 30 s on CPU; nothing downloaded)
"""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from nest_integrations.langchain import NestAttributor, NestEmbeddings

SOURCE = (
    "The Eddystone Lighthouse stands on the Eddystone Rocks, 14 kilometres south of Rame Head "
    "in Cornwall. The current structure, designed by James Douglass, is the fourth lighthouse "
    "to be built on the site. It was first lit in 1882."
)
CORPUS = [
    Document(id="eddystone", page_content=SOURCE,
             metadata={"title": "Eddystone Lighthouse", "source": "wiki/eddystone.md",
                       "char_start": 0, "char_end": len(SOURCE)}),
    Document(id="green-tea", page_content=(
        "Green tea is made from Camellia sinensis leaves and buds that have not undergone the "
        "withering and oxidation process used to make oolong and black teas."),
        metadata={"title": "Green tea", "source": "wiki/green_tea.md"}),
]
#: What "the hosted model" answers: one copied sentence, one paraphrase, one invention.
ANSWER = (
    "The current structure, designed by James Douglass, is the fourth lighthouse to be built "
    "on the site. The lighthouse sits on rocks about 14 kilometres south of Rame Head, in "
    "Cornwall. Its light can be seen from France on a clear night."
)


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def main() -> None:
    store = InMemoryVectorStore(NestEmbeddings())
    store.add_documents(CORPUS)
    retriever = store.as_retriever(search_kwargs={"k": 2})
    model = GenericFakeChatModel(messages=iter([AIMessage(ANSWER)]))  # your hosted model here
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer from the context.\n\n{context}"), ("human", "{input}")])

    # create_retrieval_chain's shape: {"input", "context", "answer"}, then the attributor
    rag = RunnablePassthrough.assign(context=(lambda x: x["input"]) | retriever).assign(
        answer=(lambda x: {"input": x["input"], "context": format_docs(x["context"])})
        | prompt | model | StrOutputParser()
    )
    chain = rag | NestAttributor()

    msg = chain.invoke({"input": "Where is the Eddystone Lighthouse?"})
    print("Answer:", msg.text)
    notes = msg.content_blocks[0].get("annotations", [])
    print(f"\n{len(notes)} citation(s):")
    for a in notes:
        x = a["extras"]
        where = f"answer[{a['start_index']}:{a['end_index']}]"
        src = f"{x['doc_id']}[{x.get('source_start_char')}:{x.get('source_end_char')}]"
        score = f" score {x['score']:.2f}" if x.get("score") is not None else ""
        print(f"- {x['kind']}{score}: {where} <- {a.get('title')} {src}: {a['cited_text']!r}")
    print("\nUnsupported:")
    for u in msg.response_metadata["unsupported"]:
        print(f"- answer[{u['start_index']}:{u['end_index']}]: {u['text']!r}")


if __name__ == "__main__":
    main()
