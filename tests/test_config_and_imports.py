"""Config validation, presets, the public API, and the core's import boundary."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import nest_integrations
from nest_integrations.config import PRESETS, NestConfig

EXPECTED_ALL = [
    "PRESETS", "Citation", "NestConfig", "NestEngine", "NestResult", "NestStats", "Passage",
    "StreamChunk", "__version__",
]


def test_all_is_pinned():
    assert sorted(nest_integrations.__all__) == sorted(EXPECTED_ALL)
    for name in EXPECTED_ALL:
        assert getattr(nest_integrations, name) is not None


def test_paper_preset_values():
    """The paper preset is the NEST 7B setting (App. A)."""
    cfg = NestConfig.from_preset("paper")
    assert (cfg.n_passages, cfg.n_neighbors, cfg.rrc_offset, cfg.rrc_scale) == (40, 1024, 0.3, 0.1)
    assert (cfg.span_threshold, cfg.max_span, cfg.relaxation) == (0.5, 64, 5e-4)
    assert cfg.lm_temperature == 1.0
    assert cfg.key_source is None  # the backend's: "ffn_input" (the paper's key) on torch
    assert NestConfig.from_preset("paper-70b").relaxation == 5e-2
    assert NestConfig.from_preset("official-code").lm_temperature == 0.7
    assert NestConfig() == cfg


@pytest.mark.parametrize(
    "field,value",
    [
        ("n_passages", 0), ("n_neighbors", -1), ("max_span", 1.5), ("rrc_scale", 0.0),
        ("span_threshold", 1.5), ("relaxation", 0.0), ("relaxation", 2.0),
        ("lm_temperature", 0.0), ("key_source", "attention"), ("fixed_lm_weight", 1.2),
        ("top_p", 0.0), ("temperature", -1.0), ("knn_temperature", -2.0), ("ra_passages", -1),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        NestConfig(**{field: value})


def test_presets_are_valid_and_frozen():
    for name in PRESETS:
        cfg = NestConfig.from_preset(name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.relaxation = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown NEST preset"):
        NestConfig.from_preset("nope")
    with pytest.raises(ValueError, match="unknown NestConfig field"):
        NestConfig().replace(gamma=0.1)


def test_fields_are_passed_by_name_and_documented_in_groups():
    """Fields are declared in documented groups, so a positional argument would land in another
    field than it used to: it is refused. Every field appears once in the docstring."""
    with pytest.raises(TypeError):
        NestConfig(8)  # type: ignore[misc]
    assert NestConfig(n_passages=8).n_passages == 8
    doc = NestConfig.__doc__ or ""
    for f in dataclasses.fields(NestConfig):
        assert doc.count(f"        {f.name}: ") == 1, f.name


def test_core_imports_no_framework():
    """The core and the engine import no framework (dependencies point inward)."""
    code = (
        "import sys\n"
        "for m in ['langchain_core','llama_index','chromadb','faiss','transformers']:\n"
        "    sys.modules[m] = None\n"
        "import nest_integrations.core.mixture, nest_integrations.core.verification\n"
        "import nest_integrations.core.proposers, nest_integrations.core.citations\n"
        "import nest_integrations.decoding.engine\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_import_is_cheap():
    """Importing the package loads neither torch nor a framework."""
    code = "import sys, nest_integrations; print('torch' in sys.modules, 'langchain_core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
