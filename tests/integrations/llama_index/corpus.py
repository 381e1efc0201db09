"""The LlamaIndex tests' corpus and builders (shared by fixtures, tests and cookbook checks)."""

from __future__ import annotations

# Each document opens with another paragraph, so passages and cited spans have non-zero
# offsets in their source.
ROME_PASSAGE = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large "
    "territorial holdings around the Mediterranean Sea in Europe, North Africa, and Western "
    "Asia, and was ruled by emperors."
)
DOCS = {
    "rome": (
        "Rome is the capital city of Italy and of the Lazio region. It is known for its "
        "ancient ruins, its churches and its long history as a centre of power.\n\n"
        + ROME_PASSAGE
    ),
    "bio": (
        "Plants are living organisms that grow in soil and water. Most of them are green "
        "because their cells contain chlorophyll.\n\nPhotosynthesis is a process used by "
        "plants and other organisms to convert light energy into chemical energy that can "
        "later fuel their activities."
    ),
    "py": (
        "Python is a popular programming language with a large standard library. It offers "
        "several built-in sequence types, such as strings, tuples and lists.\n\nA Python "
        "list is a mutable sequence type. Lists are written as comma-separated values between "
        "square brackets, and they can hold items of different types."
    ),
}
#: Quotes the opening sentence of a corpus passage: the model continues it from the corpus.
GROUNDED = "The Roman Empire was the post-Republican state of ancient Rome."


def documents():
    """``DOCS`` as LlamaIndex Documents (id = doc id, with title and source metadata)."""
    from llama_index.core import Document

    keys = ["title", "source"]  # kept out of chunk-size budgets and embeddings
    return [
        Document(
            text=text,
            id_=doc,
            metadata={"title": doc.title(), "source": f"{doc}.txt"},
            excluded_llm_metadata_keys=keys,
            excluded_embed_metadata_keys=keys,
        )
        for doc, text in DOCS.items()
    ]


def splitter():
    """One node per paragraph (two per document), with char offsets into the document."""
    from llama_index.core.node_parser import SentenceSplitter

    return SentenceSplitter(chunk_size=50, chunk_overlap=0, paragraph_separator="\n\n")


def make_llm(lm, index, **kwargs):
    """A ``NestLLM`` over ``index`` (3 passages) on a ready language model."""
    from nest_integrations.config import NestConfig
    from tests.engines import make_engine
    from nest_integrations.llama_index import LlamaIndexPassageRetriever, NestLLM

    engine = make_engine(lm, LlamaIndexPassageRetriever(index), None, NestConfig(n_passages=3))
    return NestLLM(engine=engine, **{"max_new_tokens": 12, **kwargs})
