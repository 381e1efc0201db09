"""Token-key encoding on Ray (``nest ingest --ray``, ``ingest/ray_keys.py``).

The slow tests share one real local cluster (``ray start --head --block`` on loopback, 2 CPUs, so
2 encoding actors), started in its own process group and torn down by killing exactly that group.
The oracle is the single-process store built by ``ensure_keys`` from the same passages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from nest_integrations.index.keys import content_hash, ensure_keys
from nest_integrations.index.store import DiskKeyStore
from nest_integrations.ingest import (
    default_token_counter,
    load_documents,
    sample_corpus_path,
    split_documents,
)
from nest_integrations.lm.exactness import KEY_RTOL
from nest_integrations.types import Passage
from tests.invariants import keys_agree

from nest_integrations.ingest import ray_keys
from nest_integrations.ingest.ray_keys import (
    ModelSpec,
    RayConnectionError,
    RayKeysError,
    encode_keys_on_ray,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole block: bound here (so nothing
    else can take it) and never listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def ray():
    """Ray itself (in the test extra): only the tests that need a real Ray ask for it; the
    rest of this file runs without Ray."""
    pytest.importorskip("ray.data", reason="ray[data] is not installed (it is in the test extra)")
    import ray

    return ray


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for_head(proc: subprocess.Popen, port: int, log: Path, last: bool) -> bool:
    """True once the head accepts connections on ``port``; False when ``ray start`` exited
    (e.g. the port was taken) and another attempt may follow; raises on the last attempt."""
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            if last:
                raise RuntimeError(f"ray start exited: {log.read_text()}")
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(scope="module")
def ray_cluster(ray):
    """Address of a 2-CPU Ray head on 127.0.0.1, killed (its whole process group) at teardown.

    The head's port is picked free and released before ``ray start`` binds it: when another
    process takes it in between, ``ray start`` exits and is retried on another port."""
    tmp = tempfile.mkdtemp(prefix="nray")  # short: Ray's unix socket paths have a length limit
    # Token auth off on both sides (loopback only): a ~/.ray/auth_token left by any earlier
    # local `ray.init()` would otherwise turn it on for `ray start` but not for this driver.
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = Path(sys.executable).with_name("ray")
    log = open(Path(tmp) / "ray-start.log", "wb")
    try:
        for attempt in range(3):
            port = _free_port()
            cmd = [str(ray_bin), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                   "--port", str(port), "--num-cpus", "2", "--num-gpus", "0",
                   "--include-dashboard=false", "--disable-usage-stats",
                   "--object-store-memory", str(300 * 1024 * 1024), "--temp-dir", tmp]  # fmt: skip
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            if _wait_for_head(proc, port, Path(tmp) / "ray-start.log", last=attempt == 2):
                break
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)  # exactly the processes of this cluster
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if saved_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_auth


@pytest.fixture(scope="module")
def passages():
    """A dozen real passages of the shipped sample corpus (two per Wikipedia lead)."""
    docs, issues = load_documents([sample_corpus_path() / "wikipedia.jsonl"])
    assert not issues
    out = split_documents(docs[:40], default_token_counter(), max_tokens=60)
    assert len(out) >= 12
    return out[:12] + [Passage(id="dup", text=out[0].text)]  # a duplicate text: stored once


@pytest.fixture(scope="module")
def reference(tmp_path_factory, default_lm, passages):
    """The single-process store of the same passages (the oracle)."""
    store = DiskKeyStore.open(tmp_path_factory.mktemp("ref-keys"), default_lm)
    ensure_keys(store, default_lm, passages, batch_size=4)
    return store


def assert_same_store(built: DiskKeyStore, ref: DiskKeyStore, passages) -> None:
    assert built.fingerprint == ref.fingerprint and built.key_source == ref.key_source
    a, b = built.stats(), ref.stats()
    assert (a["n_passages"], a["n_tokens"]) == (b["n_passages"], b["n_tokens"])
    assert a["n_passages"] == len({content_hash(p.text) for p in passages})
    for p, x, y in zip(passages, built.get_keys(passages), ref.get_keys(passages)):
        assert x is not None and y is not None, p.id
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.offsets, y.offsets)
        assert x.keys.dtype == y.keys.dtype == np.float16
        # both encoded in fp32 (the oracle is default_lm): keys reproducible across batchings
        keys_agree(x.keys, y.keys, KEY_RTOL["float32"])


# ------------------------------------------------------------------------------ fast tests


def test_missing_ray_is_a_clear_import_error(monkeypatch, tmp_path, tiny_lm):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.data", None)
    store = DiskKeyStore.open(tmp_path, tiny_lm)
    with pytest.raises(ImportError, match=r"nest-integrations\[ray\]"):
        encode_keys_on_ray(store, tiny_lm, [Passage("a", "Some text.")])


def test_unreachable_address_fails_fast_with_the_address(tmp_path, tiny_lm, ray):
    store = DiskKeyStore.open(tmp_path, tiny_lm)
    start = time.monotonic()
    with _refusing_port() as port:  # nothing listens there
        address = f"127.0.0.1:{port}"
        with pytest.raises(RayConnectionError, match=f"no Ray cluster at {address}.*ray start"):
            encode_keys_on_ray(store, tiny_lm, [Passage("a", "Some text.")], address=address)
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match="Ray address 'nohost' is invalid"):
        encode_keys_on_ray(store, tiny_lm, [Passage("a", "Some text.")], address="nohost")
    assert len(store) == 0 and not ray.is_initialized()


def test_cli_unreachable_ray_fails_before_writing(tmp_path, tiny_lm, monkeypatch, capsys, ray):
    from nest_integrations import cli
    from nest_integrations.cli import ingest as ingest_cli  # imported when the command runs

    monkeypatch.setattr(ingest_cli, "_load_lm", lambda: tiny_lm)
    src = tmp_path / "a.txt"
    src.write_text("A short document about nothing in particular.")
    with _refusing_port() as port:
        address = f"127.0.0.1:{port}"
        argv = ["ingest", str(src), "--persist-dir", str(tmp_path / "s"), "--ray", address]
        assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"nest: error: no Ray cluster at {address}" in err and "Traceback" not in err
    import chromadb

    client = chromadb.PersistentClient(str(tmp_path / "s" / "chroma"))
    assert [c.name for c in client.list_collections()] == []  # nothing written


def test_model_spec_reloads_the_same_model(tiny_lm):
    import pickle

    spec = pickle.loads(pickle.dumps(ModelSpec.of(tiny_lm)))
    assert spec.fingerprint == tiny_lm.fingerprint and spec.dtype == "float32"
    assert spec.load().fingerprint == tiny_lm.fingerprint
    with pytest.raises(RayKeysError, match="HFLanguageModel"):
        ModelSpec.of(object())


def test_cli_ray_flag():
    from nest_integrations.cli import build_parser
    from nest_integrations.cli.ingest import _ray_address

    parse = build_parser().parse_args
    assert _ray_address(parse(["ingest", "docs/"])) is None
    assert _ray_address(parse(["ingest", "docs/", "--ray"])) == "local"
    assert _ray_address(parse(["ingest", "docs/", "--ray", "127.0.0.1:6379"])) == "127.0.0.1:6379"
    args = parse(["ingest", "--ray", "docs/"])  # a path after a bare --ray stays a path
    assert _ray_address(args) == "local" and args.paths == ["docs/"]


# ------------------------------------------------------------------------------ on a cluster


@pytest.mark.slow
def test_cli_ingest_on_ray_equals_single_process_store(ray_cluster, tmp_path, default_lm):
    """``nest ingest --ray`` in a child process (a Ray driver that crashes takes its process
    down; once, a segfault in Ray's own driver thread took a pytest worker with it), against the
    same passages encoded here."""
    import os
    import subprocess
    import sys

    from nest_integrations.ingest import token_counter_for
    from nest_integrations.paths import keys_dir

    docs, _ = load_documents([sample_corpus_path() / "wikipedia.jsonl"])
    src = tmp_path / "leads.jsonl"
    src.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n" for d in docs[:3]))
    persist = tmp_path / "store"
    argv = [sys.executable, "-m", "nest_integrations.cli", "ingest", str(src), "--persist-dir",
            str(persist), "--collection", "rayc", "--json", "--ray", ray_cluster,
            "--dtype", "fp32"]  # as default_lm, the oracle, encodes  # fmt: skip
    env = {**os.environ, "NEST_THREADS": "1"}

    def ingest() -> dict:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    report = ingest()
    assert report["keys_encoder"] == "ray" and report["key_workers"] == 2
    assert report["keys_added"] == report["passages"] > 0

    # the oracle: the same passages encoded in this process
    lm = default_lm
    ingested, _ = load_documents([src])
    ps = split_documents(ingested, token_counter_for(lm))
    ref = DiskKeyStore.open(tmp_path / "ref", lm)
    ensure_keys(ref, lm, ps, batch_size=4)
    with DiskKeyStore.open(keys_dir(persist), lm) as built:
        assert_same_store(built, ref, ps)

    again = ingest()  # re-ingest: nothing to encode, Ray not even needed
    assert again["keys_added"] == 0 and again["key_workers"] == 0


def _holding_encoder(hold: Path) -> type:
    """A ``KeyEncoder`` whose actors, before each batch, write ``<hold>/<pid>.pid`` and wait for
    ``<hold>/go``, so the test can kill an actor while it holds a batch. Defined in a function,
    so Ray pickles the class by value (the actors need not import this test module)."""

    class HoldingEncoder(ray_keys.KeyEncoder):
        def __call__(self, batch):
            hold.mkdir(parents=True, exist_ok=True)
            (hold / f"{os.getpid()}.pid").write_text(str(os.getpid()))
            while not (hold / "go").exists():
                time.sleep(0.05)
            return super().__call__(batch)

    return HoldingEncoder


@pytest.mark.slow
def test_killed_worker_loses_nothing(
    ray_cluster, tmp_path, default_lm, passages, reference, monkeypatch
):
    hold = tmp_path / "hold"
    hold.mkdir()
    killed: list[int] = []
    monkeypatch.setattr(ray_keys, "KeyEncoder", _holding_encoder(hold))

    def kill_one_holding_worker() -> None:
        start = time.monotonic()
        while time.monotonic() < start + 90:
            pids = sorted(int(f.stem) for f in hold.glob("*.pid"))
            # both actors mid-batch; or one, when the other got no batch within 15 s
            if len(pids) >= 2 or (pids and time.monotonic() > start + 15):
                os.kill(pids[0], signal.SIGKILL)  # a real kill of a real worker process
                killed.append(pids[0])
                print("holders at kill:", len(pids), "after", round(time.monotonic() - start, 1), "s")
                break
            time.sleep(0.1)
        time.sleep(1.0)
        (hold / "go").touch()

    killer = threading.Thread(target=kill_one_holding_worker, daemon=True)
    killer.start()
    store = DiskKeyStore.open(tmp_path / "keys", default_lm)
    result = encode_keys_on_ray(store, default_lm, passages, address=ray_cluster, batch_size=3)
    killer.join(timeout=5)
    assert killed, "no two encoding actors held a batch"
    assert not _alive(killed[0])  # (the pid is not reused by the restarted actor's process)
    assert killed[0] not in result.worker_pids  # its batch was redone by another process
    assert result.workers == 2 and result.passages == 12
    others = {int(f.stem) for f in hold.glob("*.pid")} - {killed[0]}
    assert others and result.worker_pids <= others  # the killed batch was redone elsewhere
    assert_same_store(store, reference, passages)
    assert result.encoded == len(store) == 12


def test_incomplete_run_is_reported(monkeypatch, tmp_path, tiny_lm):
    """The completeness check names how many passages lack keys (Ray run stubbed out)."""
    store = DiskKeyStore.open(tmp_path, tiny_lm)
    ps = [Passage(str(i), f"Passage number {i}.") for i in range(3)]
    ensure_keys(store, tiny_lm, ps[:1])

    class FakeRay:
        def cluster_resources(self):
            return {"CPU": 1}

    monkeypatch.setattr(ray_keys, "_require_ray", lambda: None)  # runs without Ray installed
    monkeypatch.setattr(ray_keys, "_ray_session", lambda a: contextlib.nullcontext(FakeRay()))
    monkeypatch.setattr(ray_keys, "_run", lambda *a, **k: 0)  # a run that wrote nothing
    with pytest.raises(ray_keys.RayKeysIncompleteError, match="2 of 3 passages"):
        encode_keys_on_ray(store, tiny_lm, ps)


class _LossyStore:
    """The real key store, except that the driver's merge loses one passage's keys on the way
    in (as a dropped row would): the run itself is real."""

    def __init__(self, store: DiskKeyStore, lose: str):
        self.store, self.lose, self.lost = store, lose, 0

    def put_keys(self, passages, keys):
        kept = [(p, k) for p, k in zip(passages, keys) if p.text != self.lose]
        self.lost += len(passages) - len(kept)
        if kept:
            self.store.put_keys([p for p, _ in kept], [k for _, k in kept])

    def __len__(self) -> int:
        return len(self.store)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.slow
def test_completeness_check_on_the_cluster_names_a_lost_passage(ray_cluster, tmp_path, tiny_lm):
    """On the real cluster, a passage whose keys never reach the store fails the run with its
    name; the re-run encodes exactly that passage and the store equals a single-process one."""
    ps = [Passage(f"p{i}", f"Passage number {i} of the completeness check, on Ray.")
          for i in range(6)]
    store = DiskKeyStore.open(tmp_path / "keys", tiny_lm)
    lossy = _LossyStore(store, ps[3].text)
    with pytest.raises(ray_keys.RayKeysIncompleteError, match=r"1 of 6 passages .*'p3'"):
        encode_keys_on_ray(lossy, tiny_lm, ps, address=ray_cluster, batch_size=2)
    assert lossy.lost == 1
    assert [k is None for k in store.get_keys(ps)] == [i == 3 for i in range(6)]
    result = encode_keys_on_ray(store, tiny_lm, ps, address=ray_cluster, batch_size=2)
    assert result.passages == 1 and result.encoded == 1  # only the lost one
    ref = DiskKeyStore.open(tmp_path / "ref", tiny_lm)
    ensure_keys(ref, tiny_lm, ps, batch_size=2)
    assert_same_store(store, ref, ps)
