"""Every ``bash`` and ``python`` block of README.md and of the pages in docs/ runs, in order
(README first, then ``DOCS``), on the sample corpus.

The blocks are read from the files themselves (so the test follows the docs), one test per
block, sharing one ``$NEST_HOME`` in a temporary folder (the converted model is linked in, the
sample corpus comes from the session's ``sample_store``, made by the same ``nest ingest --sample``,
which the README's block then re-runs for real and finds unchanged). Commands run as
the user runs them (``nest`` on PATH, one subprocess per command, one torch thread); python
blocks run in a subprocess each, in the same working folder.

What is changed to run here (``ADAPT``), each a textual substitution on the block:

- placeholders become real files: ``docs/`` and ``notes.jsonl`` (written by the fixture),
  ``prompts.jsonl``, ``"..."`` questions, ``--prompts ...``, ``path/to/profile.json``,
  ``my_vectorstore`` (a LangChain Chroma store of three sample passages) and ``index`` (a
  LlamaIndex ``VectorStoreIndex`` of three pydoc pages), ``engine`` / ``messages`` / ``prompt``
  in the snippets that continue an earlier one;
- servers run locally: ``--chroma-url`` points at a ``chroma run`` on loopback, ``nest serve`` is
  started in the background on a free port (its curl and openai blocks use that port);
- the skip-set searches run 2 trials of 2 prompts x 16 tokens (``--trials 32`` and the default
  40 become ``--trials 2 --n-prompts 2 --max-new-tokens 16``), and ``nest ask`` /
  ``engine.generate`` answers are capped at 48 tokens: the same code paths, minutes less.

Excluded (``EXCLUDED``), with the reason: ``bash scripts/quickstart.sh`` (it runs
``scripts/install.sh``, which reinstalls the package from the network; its ingest/info/ask steps
are the "Command line" block's) and ``bash scripts/test.sh`` (this test suite).

The DReSD recipe crashed before (issue 20, item 8); besides the README's own blocks, the
regression tests at the end check its answer through the CLI and ``from_defaults``, with the
default preset and with ``paper``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._stores import copy_sample_store

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: The documentation pages whose blocks run after the README's, in this order (a page's blocks
#: may use what an earlier block made: the DReSD datastore, the KNN-SSD profile, the server).
DOCS = ["configuration", "ingest", "methods", "backends", "llama_cpp", "citations", "server",
        "scaling", "evaluation", "benchmarks", "decisions", "parameters"]
#: Pages whose blocks run in another test, with gold answers on that test's corpus.
RUN_ELSEWHERE = {"own_corpus": "tests/integrations/test_own_corpus.py"}
DOC_FILES = [README] + [REPO / "docs" / f"{name}.md" for name in DOCS]
pytestmark = pytest.mark.slow

QUESTION = "What is belly dance?"
#: Answers are capped at 48 tokens and the skip-set searches at 2 trials of 2 prompts x 16
#: tokens: the same code paths as the README's, minutes less (see ADAPT).
N_CAP = 48
ASK_CAP = f"--max-new-tokens {N_CAP}"
SEARCH_CAP = "--trials 2 --n-prompts 2 --max-new-tokens 16"


@dataclass
class Block:
    lang: str
    code: str
    heading: str
    index: int
    page: str = "README"

    @property
    def id(self) -> str:
        words = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{self.index:02d}-{self.page}-{self.lang}-{words[:40]}"


def readme_blocks(text: str | None = None, page: str = "README", start: int = 0) -> list[Block]:
    """The ``bash`` and ``python`` fenced blocks of one page (README.md by default), with their
    section heading, numbered from ``start``."""
    text = README.read_text(encoding="utf-8") if text is None else text
    out, heading = [], ""
    for m in re.finditer(r"^(#{1,4} [^\n]*)$|^```(\w+)\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1).lstrip("# ").strip()
        elif m.group(2) in ("bash", "python"):
            out.append(Block(m.group(2), m.group(3), heading, start + len(out), page))
    return out


def doc_blocks() -> list[Block]:
    """The blocks of README.md, then of every page of ``DOCS``, numbered in that order."""
    out: list[Block] = []
    for path in DOC_FILES:
        page = "README" if path == README else path.stem
        out += readme_blocks(path.read_text(encoding="utf-8"), page, len(out))
    return out


#: A substring that identifies the block -> why it does not run here.
EXCLUDED = {
    "bash scripts/quickstart.sh": "runs scripts/install.sh (reinstalls the package from the "
    "network); its ingest, info and ask steps are the 'Command line' block's",
    "bash scripts/test.sh": "runs this test suite",
    "nest ingest products.jsonl --collection products": "the 'Bring your own corpus' block: "
    "tests/integrations/test_own_corpus.py runs it on its own corpus and checks the answer",
    "bash scripts/install.sh llamacpp": "reinstalls the package (scripts/install.sh test already "
    "installed the llamacpp extra this suite runs on)",
}

#: A substring that identifies the block -> [(old, new)] substitutions ({name} from the state).
ADAPT: dict[str, list[tuple[str, str]]] = {
    "nest ingest docs/ notes.jsonl": [
        ('--collection mydocs   # answer', f'--collection mydocs {ASK_CAP}  # answer'),
        ('nest ask "..." --json', f'nest ask "{QUESTION}" --json {ASK_CAP}'),
        ("http://localhost:8000", "{chroma_url}"),
    ],
    "ChatNest(retriever=my_vectorstore": [("", "{langchain_prelude}")],
    "NestQueryEngine.from_args(index)": [("", "{llama_index_prelude}")],
    "nest ingest --sample && nest serve": [("nest serve", "nest serve --port {port}")],
    "curl -s http://127.0.0.1:8000": [("127.0.0.1:8000", "127.0.0.1:{port}")],
    "from openai import OpenAI": [("127.0.0.1:8000", "127.0.0.1:{port}")],
    "/v1/attributions": [("127.0.0.1:8000", "127.0.0.1:{port}")],
    "nest dresd build --collection nest": [("--decoding dresd", f"--decoding dresd {ASK_CAP}")],
    'default_datastore_path("prompts-prompts")': [
        ("", "{engine_prelude}"),
        ('decoding="dresd"', f'decoding="dresd", max_new_tokens={N_CAP}'),
    ],
    "nest knn-ssd prompts --out prompts/": [
        ("--trials 32", f"{SEARCH_CAP}"),
        ("--prompts ...", f"--prompts prompts/wiki-en.train.jsonl {SEARCH_CAP}"),
        ('nest ask "..."', f'nest ask "{QUESTION}" {ASK_CAP}'),
    ],
    'EngineSpec(backend="llama.cpp", model="model.gguf"': [
        ('model="model.gguf"', 'model=str(__import__("nest_integrations.lm.default", '
         'fromlist=["gguf_path"]).gguf_path())'),
    ],
    'engine.generate(prompt, decoding="knn-ssd")': [
        ("", "{engine_prelude}"),
        ("engine.generate(prompt, ", f"engine.generate(prompt, max_new_tokens={N_CAP}, "),
        ("path/to/profile.json", "{knn_profile}"),
    ],
}

LANGCHAIN_PRELUDE = '''
import chromadb
from langchain_chroma import Chroma
from langchain_core.documents import Document
from nest_integrations.langchain import NestEmbeddings
from nest_integrations.ingest import sample_corpus_path
import json as _json
_leads = [_json.loads(l) for l in (sample_corpus_path() / "wikipedia.jsonl").open()][:40]
my_vectorstore = Chroma(
    collection_name="readme", embedding_function=NestEmbeddings(),
    persist_directory="lc-chroma",
    client_settings=chromadb.config.Settings(anonymized_telemetry=False),
)
my_vectorstore.add_documents(
    [Document(id=r["id"], page_content=r["text"], metadata={"title": r.get("title", "")})
     for r in _leads if "Roman" in r["text"] or r is _leads[0]])
'''
LLAMA_INDEX_PRELUDE = '''
from llama_index.core import Settings, SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.llms import MockLLM
from nest_integrations.ingest import sample_corpus_path
from nest_integrations.llama_index import NestEmbedding
import json as _json
Settings.embed_model, Settings.llm = NestEmbedding(), MockLLM()
_leads = [_json.loads(l) for l in (sample_corpus_path() / "wikipedia.jsonl").open()]
from llama_index.core import Document as _Doc
index = VectorStoreIndex.from_documents(
    [_Doc(text=r["text"], id_=r["id"]) for r in _leads if "Roman" in r["text"]][:4])
'''
ENGINE_PRELUDE = '''
from nest_integrations import NestEngine
engine = NestEngine.from_defaults(collection="nest")
messages = [{"role": "user", "content": "%s"}]
prompt = "The assert statement"
''' % QUESTION


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{what} did not start"
        time.sleep(0.5)


class Workdir:
    """The shared folder, ``$NEST_HOME``, environment and background servers of the blocks."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "nest-home"  # not ./.nest: a README path must not depend on cwd
        self.home.mkdir()
        from nest_integrations.paths import ensure_dir, models_dir

        # the session's converted model (tests/conftest.py's home), made before it is linked
        (self.home / "models").symlink_to(ensure_dir(models_dir()).resolve())
        bin_dir = Path(sys.executable).parent
        self.env = {
            **os.environ, "NEST_HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        }  # fmt: skip
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[str, Path] = {}
        self.state: dict[str, str] = {
            "langchain_prelude": LANGCHAIN_PRELUDE, "llama_index_prelude": LLAMA_INDEX_PRELUDE,
            "engine_prelude": ENGINE_PRELUDE, "port": str(_free_port()),
        }  # fmt: skip
        self._placeholders()

    def _placeholders(self) -> None:
        from nest_integrations.ingest import sample_corpus_path

        sample = sample_corpus_path()
        docs = self.root / "docs"
        docs.mkdir()
        for name in ("assert.txt", "while.txt"):
            (docs / name).write_text((sample / "pydoc" / name).read_text())
        (docs / "generators.md").write_text(
            "# Generators\n\nA generator is a function that returns an iterator. It yields "
            "values one at a time with the yield statement, and keeps its state between "
            "calls.\n")
        leads = (sample / "wikipedia.jsonl").read_text().splitlines()[:3]
        (self.root / "notes.jsonl").write_text("\n".join(leads) + "\n")
        (self.root / "prompts.jsonl").write_text(
            json.dumps({"prompt": QUESTION}) + "\n" + json.dumps({"prompt": "What is a tuple?"})
            + "\n")

    def start(self, name: str, argv: list[str], health: str) -> None:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        proc = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        try:
            _wait_http(health, proc, name)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {log.read_text()[-3000:]}") from None

    def chroma_url(self) -> str:
        if "chroma_url" not in self.state:
            port = _free_port()
            binary = Path(sys.executable).with_name("chroma")
            self.start("chroma", [str(binary), "run", "--path", str(self.root / "chroma-db"),
                                  "--host", "127.0.0.1", "--port", str(port)],
                       f"http://127.0.0.1:{port}/api/v2/heartbeat")
            self.state["chroma_url"] = f"http://127.0.0.1:{port}"
        return self.state["chroma_url"]

    def close(self) -> None:
        for proc in self.procs:  # each server's own process group, by its pid
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    def run(self, argv: list[str] | str, timeout: float = 1200, shell: bool = False,
            ) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, cwd=self.root, env=self.env, shell=shell, text=True,
                              capture_output=True, timeout=timeout,
                              executable="/bin/bash" if shell else None)
        assert proc.returncode == 0, (
            f"{argv!r} exited {proc.returncode}\nstdout: {proc.stdout[-3000:]}\n"
            f"stderr: {proc.stderr[-5000:]}")
        return proc


def commands(code: str) -> list[str]:
    """The commands of a bash block: ``\\``-continued lines joined, comments dropped."""
    out, cur = [], ""
    for line in code.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line).rstrip()  # a trailing "  # comment"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return out


BLOCKS = doc_blocks()


def _key(block: Block, table: dict[str, Any]) -> str | None:
    keys = [k for k in table if k in block.code]
    assert len(keys) <= 1, (block.id, keys)
    return keys[0] if keys else None


def test_the_tables_match_the_readme() -> None:
    """Each exclusion and adaptation names exactly one block of README.md and docs/ (an edit
    that moves or drops one shows up here), there are blocks of both kinds, and every page of
    docs/ is in ``DOCS`` (so none of its blocks is left out)."""
    assert sorted([*DOCS, *RUN_ELSEWHERE]) == sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    for table in (EXCLUDED, ADAPT):
        for key in table:
            hits = [b.id for b in BLOCKS if key in b.code]
            assert len(hits) == 1, (key, hits)
    assert {b.lang for b in BLOCKS} == {"bash", "python"} and len(BLOCKS) >= 12
    assert len(RUN_BLOCKS) == len(BLOCKS) - len(EXCLUDED)
    for block in BLOCKS:  # no placeholder is left in a block that runs
        if _key(block, EXCLUDED) is None:
            code = block.code
            for old, _ in ADAPT.get(_key(block, ADAPT) or "", []):
                code = code.replace(old, "ADAPTED") if old else code
            for placeholder in ('"..."', "path/to/", "--prompts ...", "localhost:8000"):
                assert placeholder not in code, (block.id, placeholder)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, sample_store: Path) -> Any:
    w = Workdir(tmp_path_factory.mktemp("readme"))
    # The session's `nest ingest --sample` store (tests/conftest.py) seeds $NEST_HOME/store, so
    # the README's own `nest ingest --sample` runs for real but finds every passage unchanged
    # (seconds instead of minutes).
    copy_sample_store(sample_store, w.home / "store")
    try:
        yield w
    finally:
        w.close()


def _adapted(block: Block, work: Workdir) -> str:
    code = block.code
    key = _key(block, ADAPT)
    for old, new in ADAPT.get(key or "", []):
        if "{chroma_url}" in new:
            new = new.replace("{chroma_url}", work.chroma_url())
        if "{knn_profile}" in new:
            found = sorted((work.home / "knn_ssd").glob("*/default.json"))
            assert found, "no KNN-SSD profile: the README's knn-ssd block did not make one"
            new = new.replace("{knn_profile}", str(found[0]))
        new = new.format(**work.state)
        code = new + code if old == "" else code.replace(old, new)
    return code


#: The blocks that run (the excluded ones are listed, with their reason, in ``EXCLUDED``; not
#: skipped, since CI fails on skips outside tests/allowed_skips.txt).
RUN_BLOCKS = [b for b in BLOCKS if _key(b, EXCLUDED) is None]


@pytest.mark.timeout(1800)  # the 'Command line' block ingests the sample corpus (~6 min loaded)
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.id)
def test_readme_block_runs(block: Block, work: Workdir) -> None:
    code = _adapted(block, work)
    if block.lang == "python":
        script = work.root / f"block-{block.index:02d}.py"
        script.write_text(code)
        out = work.run([sys.executable, str(script)])
        assert out.stdout.strip() or "=" in code, block.id  # the snippet printed or assigned
        return
    for cmd in commands(code):
        if "nest serve" in cmd:  # a server: in the background, until the module ends
            before, _, serve = cmd.rpartition("nest serve")
            if before.strip():
                work.run(before.rstrip(" &"), shell=True)
            port = work.state["port"]
            work.start("serve", ["bash", "-c", f"exec nest serve{serve}"],
                       f"http://127.0.0.1:{port}/health")
            continue
        out = work.run(cmd, shell=True)
        if cmd.startswith("curl"):
            body = json.loads(out.stdout)
            assert body["choices"][0]["message"]["content"], body


# ------------------------------------------------------------------------------ DReSD (item 8)


def _nest(work: Workdir, *args: str) -> str:
    return work.run([str(Path(sys.executable).with_name("nest")), *args]).stdout


def _dresd_store(work: Workdir) -> None:
    """The sample store and its DReSD datastore (made by the README blocks when they ran)."""
    if not (work.home / "store" / "chroma").exists():
        _nest(work, "ingest", "--sample")
    if not (work.home / "store" / "dresd" / "nest" / "CURRENT").exists():
        _nest(work, "dresd", "build", "--collection", "nest")


@pytest.mark.timeout(1800)  # run alone, it ingests the sample corpus first
@pytest.mark.parametrize("preset", ["grounded", "paper"])
def test_dresd_ask_through_the_cli(work: Workdir, preset: str) -> None:
    """``nest ask --decoding dresd`` after ``nest dresd build --collection nest`` answers with
    exact verbatim citations (it ended in a TypeError), as greedy decoding does."""
    _dresd_store(work)
    got = json.loads(_nest(work, "ask", QUESTION, "--decoding", "dresd", "--preset", preset,
                           "--json", "--max-new-tokens", "48"))
    ref = json.loads(_nest(work, "ask", QUESTION, "--decoding", "greedy", "--preset", preset,
                           "--json", "--max-new-tokens", "48"))
    assert got["token_ids"] == ref["token_ids"]  # lossless
    verbatim = [c for c in got["citations"] if c["kind"] == "verbatim"]
    # grounded (3 passages in the prompt) copies the lead's wording; paper's chat answer (no
    # passages in the prompt) need not, so there the completion test below forces a copy
    assert verbatim or preset == "paper", got["citations"]
    # besides them only support citations (on by default in grounded: issue 53), none of them
    # a copy: the method is lossless
    assert {c["kind"] for c in got["citations"]} <= {"verbatim", "support"}, got["citations"]
    passages = {p["id"]: p for p in got["passages"]}
    for c in verbatim:
        assert got["text"][c["start"] : c["end"]] == c["text"]
        p = passages[c["passage_id"]]["text"]
        assert p[c["passage_start"] : c["passage_end"]] == c["text"]


@pytest.mark.timeout(1800)
def test_dresd_from_defaults_default_preset_and_paper(work: Workdir) -> None:
    """The same through ``NestEngine.from_defaults(collection=...)`` (default preset, then
    ``paper``), in a subprocess on the README's store."""
    _dresd_store(work)
    script = work.root / "dresd_from_defaults.py"
    script.write_text(f'''
from nest_integrations import NestEngine
messages = [{{"role": "user", "content": "{QUESTION}"}}]
# paper puts no passage in the prompt: a completion that repeats the lead's first words goes on
# with the lead verbatim, so drafts come from a retrieved passage (the case that crashed)
lead = ("Belly dance is a Middle Eastern dance It features movements of the hips and torso. "
        "A Western-coined exonym, it is also referred to as Middle Eastern dance or Arabic "
        "dance.\\n\\nBelly dance is a Middle Eastern dance It features")
for config, prompt in ((None, messages), ("paper", lead)):
    engine = NestEngine.from_defaults(collection="nest", config=config)
    res = engine.generate(prompt, decoding="dresd", max_new_tokens=32)
    ref = engine.generate(prompt, decoding="greedy", max_new_tokens=32)
    assert res.token_ids == ref.token_ids, (config, res.text, ref.text)
    cites = [c for c in res.citations if c.kind == "verbatim"]
    assert cites, (config, res.text)
    by_id = {{p.id: p for p in res.passages}}
    for c in cites:
        assert res.text[c.start : c.end] == c.text
        assert by_id[c.passage_id].text[c.passage_start : c.passage_end] == c.text
    print(config, len(cites), "verbatim citations")
''')
    out = work.run([sys.executable, str(script)]).stdout
    assert "None" in out and "paper" in out
