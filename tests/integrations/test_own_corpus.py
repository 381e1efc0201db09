"""Every block of the README's "Bring your own corpus" section and of docs/own_corpus.md runs,
from a fresh ``$NEST_HOME``, on the corpus of ``tests/integrations/own_corpus.py`` (17 short
paragraphs about made-up products in the three JSONL layouts), and gives the right answer with
exact citations on the right document.

The blocks are read and run by ``tests/test_readme.py``'s machinery (``readme_blocks``,
``commands``, ``Workdir``: one shared folder and home, ``nest`` on PATH, one subprocess per
command or python block, ``nest serve`` in the background). The bash blocks run first, in
order, in the module's fixture (the ingests, then the server); ``nest ask`` gets ``--json`` so
its answer can be checked. Each python block runs as written, followed by ``CHECKS``' lines,
which assert on the block's own variables (``own_corpus.check``), and, for the chat blocks, that
the history reached the model (more prompt tokens than the last message alone).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.own_corpus import check, write_corpus
from tests.test_readme import Block, Workdir, commands, readme_blocks

pytestmark = pytest.mark.slow

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "own_corpus.md"
#: The question each answer is checked on -> (the gold value, the gold document).
GOLD = {
    "How much does the Zephyr X2 cost?": ("2,390", "zx2-price"),
    "How many litres does the Orbit Kettle hold?": ("1.7", "ok-1"),
    "How long does the battery of the Lumen desk lamp last?": ("40 hours", "12"),
    "How much does the Nimbus 3 tent weigh?": ("2.4", "nimbus-weight"),
    "How long does the battery of the Quill tablet last?": ("three weeks", "quill-battery"),
    "How many pages does the Quill tablet store?": ("50,000", "quill-battery"),
    "How far can the Zephyr X2 go on a full charge?": ("58 kilometres", "zx2-battery"),
}

_PAYLOAD = "from tests.integrations.own_corpus import check, payload_citations\n"
#: A substring naming one python block -> the lines that check its answer ({gold}, {doc}).
CHECKS = {
    'collection_name="products-lc"': _PAYLOAD + (
        'check(msg.text, payload_citations(msg.response_metadata["citations"]), {gold!r}, '
        '{doc!r})\n'
        'assert {{c["title"] for c in msg.response_metadata["citations"]}} >= {{"Orbit Kettle"}}\n'),
    "InMemoryVectorStore(NestEmbeddings())": _PAYLOAD + (
        'check(msg.text, payload_citations(msg.response_metadata["citations"]), {gold!r}, '
        '{doc!r})\n'),
    "NestQueryEngine.from_args(index": _PAYLOAD + (
        'check(str(response), payload_citations(response.metadata["citations"]), {gold!r}, '
        '{doc!r})\n'
        'assert response.source_nodes\n'),
    'ChatNest(collection="products")': _PAYLOAD + (
        'check(msg.text, payload_citations(msg.response_metadata["citations"]), {gold!r}, '
        '{doc!r})\n'
        'alone = chat.invoke({question!r})\n'
        'assert msg.usage_metadata["input_tokens"] > alone.usage_metadata["input_tokens"]\n'),
    'NestLLM(collection="products")': _PAYLOAD + (
        'check(resp.message.content, payload_citations(resp.message.additional_kwargs['
        '"citations"]), {gold!r}, {doc!r})\n'
        'alone = llm.chat([ChatMessage(role="user", content={question!r})])\n'
        'assert resp.raw["usage"]["prompt_tokens"] > alone.raw["usage"]["prompt_tokens"]\n'),
    "from openai import OpenAI": "from tests.integrations.own_corpus import check\n" + (
        'u = [a.url_citation for a in message.annotations]\n'
        'check(message.content, [{{"start": c.start_index, "end": c.end_index, '
        '"text": c.cited_text, "doc_id": c.doc_id, "kind": c.kind}} for c in u], '
        '{gold!r}, {doc!r})\n'
        'assert "https://example.com/{doc}" in {{c.url for c in u}}\n'
        'alone = client.chat.completions.create(model="nest", max_tokens=64, '
        'extra_body={{"collection": "products"}}, '
        'messages=[{{"role": "user", "content": {question!r}}}])\n'
        'assert resp.usage.prompt_tokens > alone.usage.prompt_tokens\n'),
}


def own_corpus_blocks() -> list[Block]:
    """The README section's blocks, then the guide's, numbered in that order."""
    readme = [b for b in readme_blocks() if b.heading == "Bring your own corpus"]
    return readme + readme_blocks(GUIDE.read_text(encoding="utf-8"), "own_corpus", len(readme))


BLOCKS = own_corpus_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def _question(code: str) -> str:
    """The one question of ``GOLD`` a block asks last (a chat block's history asks another)."""
    found = sorted((code.rfind(q), q) for q in GOLD if q in code)
    assert found, code
    return found[-1][1]


def test_every_block_is_run_and_checked() -> None:
    """The README section has its block, the guide has bash and python blocks, and each
    python block has exactly one entry in ``CHECKS`` (an edit that drops or adds one shows)."""
    assert any(b.page == "README" for b in BLOCKS)
    assert {b.lang for b in BLOCKS} == {"bash", "python"}
    for block in PYTHON:
        assert sum(key in block.code for key in CHECKS) == 1, block.id
    assert all(any(key in b.code for b in PYTHON) for key in CHECKS)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A fresh home with the corpus written, after the bash blocks ran: ``asked`` holds each
    ``nest ask``'s question and JSON answer."""
    w = Workdir(tmp_path_factory.mktemp("own-corpus"))
    write_corpus(w.root)
    asked: list[tuple[str, Any]] = []
    try:
        for block in (b for b in BLOCKS if b.lang == "bash"):
            for cmd in commands(block.code):
                if cmd.startswith("nest serve"):
                    port = w.state["port"]
                    w.start("serve", ["bash", "-c", f"exec {cmd} --port {port}"],
                            f"http://127.0.0.1:{port}/health")
                elif cmd.startswith("nest ask"):
                    out = w.run(cmd + " --json", shell=True).stdout
                    asked.append((_question(cmd), json.loads(out)))
                else:
                    w.run(cmd, shell=True)
        w.asked = asked  # type: ignore[attr-defined]
        yield w
    finally:
        w.close()


@pytest.mark.timeout(1800)
def test_the_command_line_answers(work: Workdir) -> None:
    """``nest ask`` over the three ingested layouts: right answer, exact citations."""
    assert work.asked  # type: ignore[attr-defined]
    for question, result in work.asked:  # type: ignore[attr-defined]
        gold, doc = GOLD[question]
        check(result["text"], result["citations"], gold, doc)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_block_answers(block: Block, work: Workdir) -> None:
    (key,) = [k for k in CHECKS if k in block.code]
    question = _question(block.code)
    gold, doc = GOLD[question]
    code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{work.state['port']}")
    script = work.root / f"block-{block.index:02d}.py"
    script.write_text(code + "\n" + CHECKS[key].format(gold=gold, doc=doc, question=question))
    out = work.run([sys.executable, str(script)])
    assert out.stdout.strip(), block.id  # the snippet printed its answer
