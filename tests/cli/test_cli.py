"""The ``nest`` CLI: ingest and info, in-process and as a subprocess; errors without tracebacks."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nest_integrations import assembly, cli
from tests.fakes import FakeLM

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.txt").write_text("Owls hunt at night.\n\nThey have silent feathers.\n")
    (root / "b.jsonl").write_text(json.dumps({"id": "moss", "text": "Moss grows on rocks."}) + "\n")
    return root


@pytest.fixture
def fake_lm(monkeypatch: pytest.MonkeyPatch) -> FakeLM:
    lm = FakeLM()
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: lm)
    return lm


def store_args(tmp_path: Path, collection: str = "cli-col") -> list[str]:
    return ["--persist-dir", str(tmp_path / "store"), "--collection", collection]


def test_ingest_then_info(tmp_path: Path, corpus: Path, fake_lm: FakeLM, capsys) -> None:
    assert cli.main(["ingest", str(corpus), *store_args(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "documents   2" in out and "2 added" in out and "2 passages newly encoded" in out

    assert cli.main(["ingest", str(corpus), *store_args(tmp_path)]) == 0
    assert "0 added, 2 unchanged, 0 removed" in capsys.readouterr().out

    assert cli.main(["info", *store_args(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cli-col (2 passages)" in out and "2 documents" in out
    assert fake_lm.fingerprint in out and "bytes/token" in out

    assert cli.main(["info", "--json", *store_args(tmp_path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["collection"]["passages"] == 2
    ns = info["key_store"]["namespaces"][0]
    assert ns["n_passages"] == 2 and ns["bytes_per_token"] > 0


def test_ingest_json_and_no_keys(tmp_path: Path, corpus: Path, capsys, monkeypatch) -> None:
    never = lambda *a, **k: pytest.fail("--no-keys must not load the LM")  # noqa: E731
    monkeypatch.setattr(assembly, "shared_model", never)
    code = cli.main(["ingest", str(corpus), "--no-keys", "--json", *store_args(tmp_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["added"] == 2 and report["keys_added"] == 0
    assert not (tmp_path / "store" / "keys").exists()


def test_sample_flag_uses_shipped_corpus(tmp_path: Path, fake_lm, capsys, monkeypatch) -> None:
    from nest_integrations import ingest

    one = ingest.sample_corpus_path() / "pydoc" / "assert.txt"
    monkeypatch.setattr(ingest, "sample_corpus_inputs", lambda: [one])  # keep the test fast
    assert cli.main(["ingest", "--sample", *store_args(tmp_path)]) == 0
    assert "documents   1" in capsys.readouterr().out


def test_info_without_collection_lists_every_collection(
    tmp_path: Path, corpus: Path, fake_lm: FakeLM, capsys
) -> None:
    """No --collection: every collection is listed, though the default one does not exist."""
    for name in ("alpha-col", "beta-col"):
        assert cli.main(["ingest", str(corpus), *store_args(tmp_path, name)]) == 0
    capsys.readouterr()
    where = ["--persist-dir", str(tmp_path / "store")]
    assert cli.main(["info", *where]) == 0
    out = capsys.readouterr().out
    assert "alpha-col (2 passages), beta-col (2 passages)" in out
    assert assembly.DEFAULT_COLLECTION not in out.split("Collections:")[1].splitlines()[0]
    assert cli.main(["info", "--json", *where]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["collections"] == {"alpha-col": 2, "beta-col": 2} and "collection" not in info


def test_bad_inputs_are_listed(tmp_path: Path, corpus: Path, fake_lm, capsys) -> None:
    (corpus / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    missing = tmp_path / "missing.md"
    assert cli.main(["ingest", str(corpus), str(missing), *store_args(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "skipped 2 input(s)" in err
    assert "notes/bad.jsonl:2: invalid JSON" in err and f"{missing}: no such file" in err


def test_errors_exit_nonzero_without_traceback(
    tmp_path: Path, corpus: Path, fake_lm, capsys
) -> None:
    assert cli.main(["info", *store_args(tmp_path, "absent-col")]) == 1
    err = capsys.readouterr().err
    assert "no store at" in err and "nest ingest" in err
    assert not (tmp_path / "store" / "chroma").exists()  # looking created nothing

    (corpus / "empty.txt").write_text("")
    assert cli.main(["ingest", str(corpus), "--strict", *store_args(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "notes/empty.txt: empty file" in err and "Traceback" not in err
    assert not (tmp_path / "store" / "keys").exists()

    assert cli.main(["ingest", str(tmp_path / "nothing-here"), *store_args(tmp_path)]) == 1
    assert "no documents could be ingested" in capsys.readouterr().err

    assert cli.main(["ingest", *store_args(tmp_path)]) == 2
    assert "give one or more PATHs, or --sample" in capsys.readouterr().err

    (corpus / "empty.txt").unlink()
    assert cli.main(["ingest", str(corpus / "a.txt"), *store_args(tmp_path)]) == 0
    capsys.readouterr()
    assert cli.main(["info", *store_args(tmp_path, "absent-col")]) == 1
    err = capsys.readouterr().err
    assert "no collection 'absent-col' (existing: 'cli-col')" in err and "nest ingest" in err

    assert cli.main(["ingest", str(corpus), "--chroma-url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "http://127.0.0.1:9" in err and "chroma run" in err and "Traceback" not in err

    assert cli.main([]) == 2


def test_every_option_has_help() -> None:
    parser = cli.build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
    assert {"ingest", "info"} <= set(subparsers.choices)
    for name, sub in [("nest", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            assert action.help, f"{name}: option {action.dest} has no help"


def test_subprocess_ingest_and_info(tmp_path: Path, corpus: Path) -> None:
    """`python -m nest_integrations.cli` as a user runs it (real tokenizer, --no-keys)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "nest_integrations.cli", *a],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    out = run("ingest", str(corpus), "--no-keys", *store_args(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "2 added" in out.stdout and "embedding" in out.stderr  # a tqdm bar on stderr
    out = run("info", "--json", *store_args(tmp_path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["collection"]["documents"] == 2
    out = run("info", *store_args(tmp_path, "nope-col"))
    assert out.returncode == 1 and "Traceback" not in out.stderr


@pytest.mark.slow
def test_end_to_end_with_default_lm(
    tmp_path: Path, corpus: Path, default_lm, monkeypatch, capsys
) -> None:
    """Real SmolLM2 keys: stored keys decode back to each passage's tokens."""
    monkeypatch.setattr(assembly, "shared_model", lambda *a, **k: default_lm)
    assert cli.main(["ingest", str(corpus), *store_args(tmp_path)]) == 0
    assert cli.main(["info", *store_args(tmp_path)]) == 0
    assert default_lm.fingerprint in capsys.readouterr().out
    from nest_integrations.index.store import DiskKeyStore
    from nest_integrations.retrieval.chroma import ChromaPassageStore

    store = ChromaPassageStore.from_persist_dir(tmp_path / "store", "cli-col")
    passages = list(store.iter_passages())
    with DiskKeyStore.open(store.keys_dir, default_lm) as ks:
        for p, k in zip(passages, ks.get_keys(passages), strict=True):
            assert k is not None and list(k.token_ids) == default_lm.tokenize(p.text)
            assert p.metadata["n_tokens"] == len(k) <= 200
    hit = store.retrieve("birds that hunt in the dark", 1)[0]
    assert hit.doc_id == "notes/a.txt"
