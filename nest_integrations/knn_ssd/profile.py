"""KNN-SSD profiles: per-domain skip sets and anchors for one model, stored as JSON.

A profile is one JSON file::

    {"format": "nest-knn-ssd-profile", "version": 1,
     "model": "<lm.fingerprint>", "n_layers": 30, "hidden_size": 576,
     "domains": {"python-code": {"skip": {"n_layers": 30, "attn": [...], "mlp": [...]},
                                 "search": {...how it was found...}},
                 "mixed": {...}},                     # Self-SD (Mix): searched on all domains
     "anchors": {"python-code": {"vectors": [[...], ...], "n_prompts": 40}},
     "router": {"min_similarity": 0.6},
     "cost_model": {...}}                               # per-pass timings shared by searches

Default location: ``$NEST_HOME/knn_ssd/<model fingerprint>/<name>.json`` with name
``default`` (``profile_path(lm)``); a ``profile=`` option or ``--profile`` may give a name (looked
up there) or a path. Loading checks the model fingerprint: a profile of another model is a clear
``ProfileError``.

Shipped profiles: when ``$NEST_HOME`` has no ``default`` profile for the model, loading the
default falls back to the one in the package, ``nest_integrations/data/knn_ssd/<model
name>/default.json`` (``shipped_profile_path``; the embedded SmolLM2's is searched and shipped).
It is used only when its fingerprint is the model's: another model of the same name keeps the
"no profile, build one" error. Your own profile in ``$NEST_HOME`` always wins; searches and
anchors write there (starting from an empty profile, never from the shipped one).

Writes are read-modify-write of the whole file under a lock, through a temporary
file and ``os.replace``, after the fingerprint check, so a refused update leaves the file as it was.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from nest_integrations.lm.layer_skip import SkipSet

LOG = logging.getLogger(__name__)

FORMAT = "nest-knn-ssd-profile"
VERSION = 1
#: The Self-SD (Mix) skip set's name: searched on prompts of every domain, used as the
#: router's fallback; it has no anchors.
MIXED = "mixed"
DEFAULT_NAME = "default"


class ProfileError(ValueError):
    """A profile that cannot be used: missing, malformed, or built for another model."""


def profiles_dir(fingerprint: str) -> Path:
    """``$NEST_HOME/knn_ssd/<fingerprint>/`` (``/`` in a fingerprint becomes ``_``)."""
    from nest_integrations.paths import nest_home

    return nest_home() / "knn_ssd" / fingerprint.replace("/", "_").replace(os.sep, "_")


def profile_path(lm: Any, name_or_path: str | os.PathLike[str] | None = None) -> Path:
    """Where a profile lives: a path (anything with a separator or ending in ``.json``) as
    given, else ``profiles_dir(lm.fingerprint) / f"{name}.json"`` (default name ``default``)."""
    value = str(name_or_path) if name_or_path is not None else DEFAULT_NAME
    if os.sep in value or "/" in value or value.endswith(".json"):
        return Path(value)
    return profiles_dir(lm.fingerprint) / f"{value}.json"


@dataclass
class Profile:
    """Skip sets and anchors of one model (see the module docstring for the JSON)."""

    model: str
    n_layers: int
    hidden_size: int
    skips: dict[str, SkipSet] = field(default_factory=dict)
    search: dict[str, dict[str, Any]] = field(default_factory=dict)
    anchors: dict[str, np.ndarray] = field(default_factory=dict)
    anchor_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    router: dict[str, Any] = field(default_factory=dict)
    cost_model: dict[str, Any] | None = None
    #: the file it was read from ("" when built in memory); not stored in the JSON
    source: str = ""

    @classmethod
    def empty(cls, lm: Any) -> "Profile":
        from nest_integrations.lm.layer_skip import decoder_layers

        return cls(model=lm.fingerprint, n_layers=len(decoder_layers(lm.model)),
                   hidden_size=int(lm.key_dim))

    # ------------------------------------------------------------------------- (de)serialise

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "domains": {
                d: {"skip": s.to_dict(), "search": self.search.get(d, {})}
                for d, s in sorted(self.skips.items())
            },
            "anchors": {
                d: {"vectors": a.astype(float).round(6).tolist(), **self.anchor_info.get(d, {})}
                for d, a in sorted(self.anchors.items())
            },
            "router": self.router,
            "cost_model": self.cost_model,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "profile") -> "Profile":
        from nest_integrations.jsonl import check_format

        check_format(data, FORMAT, VERSION, where, "a KNN-SSD profile", ProfileError)
        try:
            n_layers, hidden = int(data["n_layers"]), int(data["hidden_size"])
            skips = {d: SkipSet.from_dict(v["skip"]) for d, v in data.get("domains", {}).items()}
            search = {d: dict(v.get("search", {})) for d, v in data.get("domains", {}).items()}
            anchors, info = {}, {}
            for d, v in data.get("anchors", {}).items():
                a = np.asarray(v["vectors"], dtype=np.float32)
                if a.ndim != 2 or a.shape[1] != hidden or len(a) == 0:
                    raise ProfileError(f"{where}: anchors of {d!r} have shape {a.shape}, "
                                       f"expected (k, {hidden})")
                anchors[d] = a
                info[d] = {k: x for k, x in v.items() if k != "vectors"}
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"{where} is malformed: {exc!r}") from None
        for d, s in skips.items():
            if s.n_layers != n_layers:
                raise ProfileError(f"{where}: skip set {d!r} is for {s.n_layers} layers, the "
                                   f"profile for {n_layers}")
        cost = data.get("cost_model")
        return cls(str(data["model"]), n_layers, hidden, skips, search, anchors, info,
                   dict(data.get("router", {})), dict(cost) if isinstance(cost, dict) else None)

    # ------------------------------------------------------------------------- checks

    def check_model(self, lm: Any, where: str = "profile") -> None:
        """Raise ``ProfileError`` unless the profile was built for ``lm``."""
        if self.model != lm.fingerprint:
            raise ProfileError(
                f"{where} was built for model {self.model!r}, not {lm.fingerprint!r}: skip "
                "sets and anchors do not transfer between models; run `nest knn-ssd search` "
                "and `nest knn-ssd anchors` for this model"
            )


def shipped_profile_path(lm: Any) -> Path:
    """Where the package ships a default profile for a model of ``lm``'s name:
    ``nest_integrations/data/knn_ssd/<model name>/default.json`` (the name is the part of
    the fingerprint before ``@``; the file may not exist)."""
    name = str(lm.fingerprint).split("@", 1)[0].replace("/", "_").replace(os.sep, "_")
    return Path(__file__).resolve().parent.parent / "data" / "knn_ssd" / name / \
        f"{DEFAULT_NAME}.json"


def _read(path: Path) -> Profile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON: {exc}") from None
    profile = Profile.from_json(data, str(path))
    profile.source = str(path)
    return profile


def _shipped(lm: Any) -> tuple[Profile | None, str]:
    """The package's profile for ``lm`` when it has one built for this fingerprint, else
    ``(None, why)`` (an empty reason when the package ships none for the model's name)."""
    path = shipped_profile_path(lm)
    if not path.is_file():
        return None, ""
    profile = _read(path)
    if profile.model != lm.fingerprint:
        return None, (f" (the package ships one for {profile.model}, a different model of "
                      "the same name)")
    LOG.info("KNN-SSD: using the profile shipped in the package, %s", path)
    return profile, ""


def load_profile(lm: Any, name_or_path: str | os.PathLike[str] | None = None) -> Profile:
    """The profile for ``lm`` by name or path (default: ``default`` in the model's folder,
    else the package's shipped one for the model; see the module docstring)."""
    path = profile_path(lm, name_or_path)
    if not path.is_file():
        why = ""
        if name_or_path is None or str(name_or_path) == DEFAULT_NAME:
            shipped, why = _shipped(lm)
            if shipped is not None:
                return shipped
        raise ProfileError(
            f"no KNN-SSD profile at {path}{why}: build one with `nest knn-ssd search --domain "
            "NAME --prompts FILE` and `nest knn-ssd anchors --domain NAME --prompts FILE`, or "
            "pass drafter_options={'profile': PATH}"
        )
    profile = _read(path)
    profile.check_model(lm, str(path))
    return profile


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_profile(
    lm: Any, name_or_path: str | os.PathLike[str] | None, change: Any
) -> Profile:
    """Load (or start) the profile, apply ``change(profile)`` and write it back atomically.

    A profile of another model raises ``ProfileError`` before anything is written.
    """
    path = profile_path(lm, name_or_path)
    with _locked(path):
        profile = load_profile(lm, path) if path.is_file() else Profile.empty(lm)
        change(profile)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    LOG.info("wrote KNN-SSD profile %s", path)
    return profile
