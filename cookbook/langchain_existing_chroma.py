"""NEST over an existing LangChain Chroma collection (``langchain_chroma.Chroma``).

Your documents already sit in a Chroma collection built with LangChain. Point ``ChatNest`` at
its retriever: NEST encodes the token keys of each retrieved passage once and keeps them in
``persist_dir/keys`` (next to the Chroma data here), so later runs skip that work. Document ids
and metadata come back in every citation.

Run:  python cookbook/langchain_existing_chroma.py [--persist-dir DIR]    (about 40 s on CPU)
"""

from __future__ import annotations

import argparse
import tempfile

import chromadb
from langchain_chroma import Chroma
from langchain_core.documents import Document

from nest_integrations.langchain import ChatNest, NestEmbeddings

DOCS = [
    Document(
        id="tower-1",
        page_content=(
            "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
            "France. It is named after the engineer Gustave Eiffel, whose company designed and "
            "built the tower from 1887 to 1889."
        ),
        metadata={"source": "wiki/eiffel_tower.md", "title": "Eiffel Tower"},
    ),
    Document(
        id="bridge-1",
        page_content=(
            "The Golden Gate Bridge is a suspension bridge spanning the Golden Gate, the "
            "one-mile-wide strait connecting San Francisco Bay and the Pacific Ocean."
        ),
        metadata={"source": "wiki/golden_gate.md", "title": "Golden Gate Bridge"},
    ),
]


def existing_collection(persist_dir: str) -> Chroma:
    """Stand-in for your collection: a persistent LangChain Chroma store with our embeddings."""
    store = Chroma(
        collection_name="landmarks",
        embedding_function=NestEmbeddings(),
        persist_directory=f"{persist_dir}/chroma",
        client_settings=chromadb.config.Settings(anonymized_telemetry=False),
        collection_configuration={"hnsw": {"space": "cosine"}},
    )
    if not store.get_by_ids([d.id for d in DOCS]):
        store.add_documents(DOCS)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persist-dir", default=None, help="store folder (default: a temp dir)")
    args = parser.parse_args()
    persist_dir = args.persist_dir or tempfile.mkdtemp(prefix="nest-lc-chroma-")

    store = existing_collection(persist_dir)
    chat = ChatNest(
        retriever=store.as_retriever(search_kwargs={"k": 2}),
        persist_dir=persist_dir,  # token keys persist in persist_dir/keys
        max_tokens=40,
    )
    msg = chat.invoke("Continue this text: The Eiffel Tower is a wrought-iron lattice tower on")
    print("Answer:", msg.text.strip())
    nest = msg.response_metadata["nest"]
    print(f"attributed tokens: {nest['attributed_tokens']}/{nest['new_tokens']}")
    for c in msg.content_blocks[0].get("annotations", []):
        x = c["extras"]
        print(f"- [{c['start_index']}:{c['end_index']}] {c.get('title')} "
              f"(Chroma id {x['passage_id']}, {x['source']}): {c['cited_text'].strip()!r}")
    print("store:", persist_dir)


if __name__ == "__main__":
    main()
