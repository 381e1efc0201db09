"""``nest dresd build/info`` on the tiny random Llama (the CLI's model loader is replaced)."""

from __future__ import annotations

import json

import pytest

import faiss  # noqa: E402,F401  (a required dependency: imported, so a broken install fails)


@pytest.fixture
def cli(tiny_lm, monkeypatch):
    from nest_integrations import cli as nest_cli
    from nest_integrations.cli import dresd as dresd_cli

    monkeypatch.setattr(dresd_cli, "_load_lm", lambda: tiny_lm)
    return nest_cli.main


def test_build_from_prompts_then_info(cli, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a colour."}\n"What is rain?"\n')
    out = tmp_path / "ds"
    assert cli(["dresd", "build", "--from-prompts", str(prompts), "--out", str(out),
                "--max-new-tokens", "6", "--json"]) == 0  # fmt: skip
    stats = json.loads(capsys.readouterr().out)
    assert stats["n_passages"] == 2 and 2 <= stats["n_tokens"] <= 12
    assert stats["source"]["kind"] == "prompts"
    assert cli(["dresd", "info", "--datastore", str(out)]) == 0
    assert "bytes/token" in capsys.readouterr().out


def test_build_errors_are_one_clear_line(cli, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli(["dresd", "build", "--from-prompts", str(empty), "--out", str(tmp_path / "x")]) == 1
    assert "is empty" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing written
    assert cli(["dresd", "info", "--datastore", str(tmp_path / "none")]) == 1
    assert "nest dresd build" in capsys.readouterr().err
