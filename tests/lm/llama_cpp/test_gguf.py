"""The llama.cpp backend on the GGUF file the package ships: the GGUF's fingerprint: a key store
of one backend serves the other (``lm.llama_cpp.gguf``).

Oracles are llama-cpp-python's own ``Llama`` on the same file (never the code under
test) and the Hugging Face side of the same model (``conftest.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="the llamacpp extra (scripts/install.sh installs it)")



def test_a_key_store_of_one_backend_serves_the_other(tmp_path, lm):
    """A key store encoded by the torch backend opens on llama.cpp in a namespace of its own
    (one store, both backends); another llama.cpp model is then refused, naming the
    namespaces present."""
    from nest_integrations.index.base import KeyStoreMismatchError
    from nest_integrations.index.namespaces import list_namespaces
    from nest_integrations.index.store import DiskKeyStore
    from tests.fakes import FakeLM

    torch_like = FakeLM(key_dim=lm.key_dim, key_source="final_norm",
                        name="SmolLM2-135M-Instruct")
    torch_like.fingerprint = "SmolLM2-135M-Instruct@0123456789abcdef"
    DiskKeyStore.open(tmp_path / "keys", torch_like).close()
    with DiskKeyStore.open(tmp_path / "keys", lm) as store:
        assert store.fingerprint == lm.fingerprint and len(store) == 0
    assert {n["fingerprint"] for n in list_namespaces(tmp_path / "keys")} == {
        torch_like.fingerprint, lm.fingerprint}
    other = FakeLM(key_dim=lm.key_dim, key_source="final_norm", name="other")
    other.fingerprint = "other@llama.cpp-Q4_1-0123456789abcdef"
    with pytest.raises(KeyStoreMismatchError, match=r"torch backend.*llama.cpp backend"):
        DiskKeyStore.open(tmp_path / "keys", other)
