"""Pure-function tests of the NEST core: mixture, RRC, search, proposal, verification, citations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nest_integrations.core.citations import build_citations, source_runs
from nest_integrations.core.token_memory import Hits, TokenMemory
from nest_integrations.core.mixture import (
    knn_distribution,
    mixture,
    mixture_host,
    nest_distribution,
    rrc_lambda,
)
from nest_integrations.core.proposers import (
    _span_start_device,
    span_draft,
    span_start,
    use_span,
)
from nest_integrations.core.sampling import choose_token
from nest_integrations.core.verification import (
    greedy_accept,
    relaxed_accept_count,
    sampled_accept_count,
    strict_accept_count,
)
from nest_integrations.types import Passage, PassageKeys
from tests.invariants import lambda_in_unit_interval, mixture_is_distribution

V = 50


def _memory(lengths, d=8, seed=0, values=None) -> TokenMemory:
    rng = np.random.default_rng(seed)
    pks = []
    for i, m in enumerate(lengths):
        toks = rng.integers(3, V, size=m) if values is None else np.asarray(values[i])
        offs = np.stack([np.arange(m) * 2, np.arange(m) * 2 + 2], 1).astype(np.int32)
        pks.append(PassageKeys(f"p{i}", rng.normal(size=(m, d)).astype(np.float16), toks, offs))
    return TokenMemory(pks)


def test_search_equals_numpy_brute_force():
    """Exact fp32 search returns the same neighbours and distances as numpy."""
    mem = _memory([30, 50, 20])
    q = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    hits = mem.search(q, 16)
    k = mem.keys.numpy().astype(np.float64)
    d = ((q.numpy()[:, None, :].astype(np.float64) - k[None]) ** 2).sum(-1)
    order = np.argsort(d, axis=1)[:, :16]
    np.testing.assert_array_equal(hits.rows.numpy(), order)
    np.testing.assert_allclose(hits.dist.numpy(), np.take_along_axis(d, order, 1), rtol=1e-4)


def test_search_equals_faiss_flat():
    """Exact search agrees with FAISS IndexFlatL2 (the library's own brute force)."""
    import faiss  # a required dependency: missing, this fails (never skips)

    mem = _memory([40, 40], d=16, seed=3)
    index = faiss.IndexFlatL2(16)
    index.add(mem.keys.numpy())
    q = torch.randn(3, 16, generator=torch.Generator().manual_seed(3))
    _, ids = index.search(q.numpy(), 10)
    np.testing.assert_array_equal(mem.search(q, 10).rows.numpy(), ids)


def test_masked_keys_never_reappear_and_r_eff():
    """Masked keys are excluded and r_eff = min(r, available)."""
    mem = _memory([10])
    mem.mask(range(7))
    g = torch.Generator().manual_seed(2)
    hits = mem.search(torch.randn(2, 8, generator=g), 1024)
    assert hits.rows.shape == (2, 3)
    assert set(hits.rows.flatten().tolist()) <= {7, 8, 9}
    mem.mask([7, 8, 9])
    assert mem.search(torch.randn(1, 8, generator=g), 5).empty


def test_knn_distribution_sums_to_one_and_merges_values():
    """p_kNN sums to 1 and neighbours with the same value add up (Eq. 2)."""
    hits = Hits(torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[0, 1, 2]]))
    values = torch.tensor([5, 5, 7])
    p = knn_distribution(hits, values, V, mu=1.0)
    w = torch.softmax(-torch.tensor([0.0, 1.0, 2.0]), 0)
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    assert math.isclose(float(p[0, 5]), float(w[0] + w[1]), rel_tol=1e-6)
    assert math.isclose(float(p[0, 7]), float(w[2]), rel_tol=1e-6)


@pytest.mark.parametrize("ratio,expected", [(0.1, 0.12), (0.3, 0.5), (0.5, 0.88)])
def test_rrc_worked_values(ratio, expected):
    """The spec's worked values of Eq. 4 with alpha=0.3, tau=0.1."""
    hits = Hits(torch.tensor([[ratio, 0.7, 1.0]]), torch.zeros(1, 3, dtype=torch.long))
    assert float(rrc_lambda(hits, 0.3, 0.1)) == pytest.approx(expected, abs=0.005)


def test_rrc_guards():
    """No hits gives lambda 1; d_max = 0 gives ratio 1."""
    empty = Hits(torch.zeros(1, 0), torch.zeros(1, 0, dtype=torch.long))
    assert float(rrc_lambda(empty, 0.3, 0.1)) == 1.0
    zero = Hits(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.long))
    assert float(rrc_lambda(zero, 0.3, 0.1)) == pytest.approx(1 / (1 + math.exp(-7)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), r=st.integers(1, 80))
def test_mixture_is_distribution_property(seed, n, r):
    """For any memory and logits, p_M sums to 1 and lambda lies in (0, 1)."""
    g = torch.Generator().manual_seed(seed)  # local: the global RNG stays untouched
    mem = _memory([n], seed=seed)
    logits = torch.randn(3, V, generator=g) * 3
    q = torch.randn(3, 8, generator=g)
    dist = nest_distribution(logits, q, mem, n_neighbors=r, alpha=0.3, tau=0.1)
    mixture_is_distribution(dist.p)
    lambda_in_unit_interval(dist.lam)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), r=st.integers(1, 40),
       vocab=st.sampled_from([4, 12, V]), fixed=st.booleans(), temp=st.sampled_from([1.0, 0.7]))
def test_p_m_equals_the_dense_formula(seed, n, r, vocab, fixed, temp):
    """nest_distribution's p_M (on a CPU: numpy, never writing p_kNN out) equals Eq. 3 on the
    dense p_kNN of Eq. 2 with Eq. 4's lambda, computed in float64 from the same hits, to fp32
    rounding; also where several neighbours share a token (a small token range forces that),
    with a fixed lambda or an LM temperature. p_LM is the softmax itself, bit for bit."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    mem = _memory([n], seed=seed, values=[rng.integers(3, vocab, size=n)])
    logits = torch.randn(3, V, generator=g) * 3
    q = torch.randn(3, 8, generator=g)
    kw = {"fixed_lm_weight": 0.6} if fixed else {}
    dist = nest_distribution(logits, q, mem, n_neighbors=r, alpha=0.3, tau=0.1,
                             lm_temperature=temp, **kw)
    p_lm = torch.softmax(logits / temp, dim=-1)
    assert torch.equal(dist.p_lm, p_lm)
    hits = mem.search(q, r)
    assert torch.equal(dist.hits.rows, hits.rows) and torch.equal(dist.hits.dist, hits.dist)
    d = hits.dist.double()
    lam = torch.full((3,), 0.6, dtype=torch.float64) if fixed else torch.sigmoid(
        (d[:, 0] / d[:, -1] - 0.3) / 0.1)
    w = torch.softmax(-d / math.sqrt(8), -1)
    p_knn = torch.zeros(3, V, dtype=torch.float64).scatter_add_(1, mem.values[hits.rows], w)
    dense = lam[:, None] * p_lm.double() + (1 - lam[:, None]) * p_knn
    torch.testing.assert_close(dist.lam.double(), lam, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dist.p.double(), dense, rtol=1e-5, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), r=st.integers(1, 80),
       used=st.integers(0, 20))
def test_the_host_and_device_paths_agree(seed, n, r, used):
    """The CPU's numpy search and mixture (``_search_host``, ``mixture_host``) and the torch ops
    a GPU runs (``_search_device``, ``rrc_lambda``, ``knn_distribution``, ``mixture``) give the
    same neighbours, lambdas and p_M up to fp32 rounding, with masked keys too."""
    g = torch.Generator().manual_seed(seed)
    mem = _memory([n], seed=seed)
    mem.mask(range(min(used, n - 1)))
    q = torch.randn(2, 8, generator=g)
    r_eff = min(r, mem.n_available)
    host, device = mem._search_host(q, r_eff), mem._search_device(q, r_eff)
    assert torch.equal(host.rows, device.rows)
    torch.testing.assert_close(host.dist, device.dist, rtol=1e-5, atol=1e-5)
    p_lm = torch.softmax(torch.randn(2, V, generator=g) * 3, -1)
    p, lam = mixture_host(p_lm, host, mem.values_host, mu=0.25, alpha=0.3, tau=0.1)
    lam_d = rrc_lambda(device, 0.3, 0.1)
    p_d = mixture(p_lm, knn_distribution(device, mem.values, V, 0.25), lam_d)
    torch.testing.assert_close(lam, lam_d, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p, p_d, rtol=1e-4, atol=1e-6)


def test_host_lambda_saturates_like_torch_sigmoid(recwarn):
    """A tiny tau drives Eq. 4's exponent past fp32's range: lambda is 0 (and 1 on the other
    side) as ``torch.sigmoid`` gives, with no overflow warning from numpy."""
    hits = Hits(torch.tensor([[0.0, 1e6], [1e6, 1e6]]), torch.tensor([[0, 1], [0, 1]]))
    p_lm = torch.softmax(torch.zeros(2, 5), -1)
    p, lam = mixture_host(p_lm, hits, np.array([1, 2]), mu=1.0, alpha=0.9, tau=1e-3)
    assert torch.equal(lam, rrc_lambda(hits, 0.9, 1e-3)) and lam.tolist() == [0.0, 1.0]
    assert torch.allclose(p.sum(-1), torch.ones(2))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_empty_memory_gives_p_lm():
    """With no keys, p_M equals p_LM exactly."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, V, generator=g)
    mem = _memory([0])
    q = torch.randn(2, 8, generator=g)
    dist = nest_distribution(logits, q, mem, n_neighbors=8, alpha=0.3, tau=0.1)
    assert torch.equal(dist.p, torch.softmax(logits, -1))
    assert torch.equal(dist.lam, torch.ones(2))


def test_mixture_weights():
    """lambda weights p_LM (NEST's convention), not p_kNN."""
    p_lm = torch.tensor([[1.0, 0.0]])
    p_knn = torch.tensor([[0.0, 1.0]])
    assert torch.allclose(mixture(p_lm, p_knn, torch.tensor([0.7])), torch.tensor([[0.7, 0.3]]))


def test_relaxed_acceptance_threshold():
    """Accept iff p(w) > (gamma/2) max p; stop at the first failure."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], [0.4, 0.4, 0.2]])
    assert relaxed_accept_count(p, torch.tensor([1, 1, 0]), gamma=1.0) == 1
    assert relaxed_accept_count(p, torch.tensor([1, 1, 0]), gamma=0.05) == 3
    assert relaxed_accept_count(p, torch.tensor([2, 0, 0]), gamma=1.0) == 0


def test_strict_acceptance_is_argmax_match():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]])
    assert strict_accept_count(p, torch.tensor([0, 1])) == 2
    assert strict_accept_count(p, torch.tensor([0, 0])) == 1


def test_greedy_acceptance_on_argmaxes_equals_it_on_logits():
    """``greedy_accept`` (rows given as their argmax, llama.cpp's fast path) accepts what
    ``strict_accept_count`` accepts on the logits and returns the next row's argmax, ties
    included (both take the first maximum)."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = trial % 6
        logits = torch.randint(0, 3, (n + 1, 4), generator=g).float()  # many ties
        best = logits.argmax(dim=-1)
        draft = torch.where(torch.rand(n, generator=g) < 0.7, best[:n],
                            torch.randint(0, 4, (n,), generator=g))
        m = strict_accept_count(logits[:n], draft)
        rows = [int(r) for r in logits.numpy().argmax(axis=1)]
        assert greedy_accept(rows, draft.tolist()) == (m, int(logits[m].argmax()))
    assert greedy_accept([3, 1, 2], [3, 1]) == (2, 2)
    assert greedy_accept([3, 1, 2], [4, 1]) == (0, 3)


def test_sampled_acceptance_bounds():
    """Sampling-mode acceptance always accepts the argmax and never a zero-probability token."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    assert sampled_accept_count(p, torch.tensor([0, 0]), 0.5, g) == 0
    assert sampled_accept_count(p, torch.tensor([1, 0]), 0.5, g) == 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       r=st.integers(1, 40), token=st.integers(3, 8), max_passage=st.sampled_from([None, 1, 2]),
       lock=st.booleans())
def test_span_start_is_the_first_hit_that_carries_the_token(seed, lengths, r, token,
                                                             max_passage, lock):
    """Eq. 5 on the host path and on the torch path a GPU runs: the nearest hit whose value is
    the token, within the first ``max_passage`` passages and the ``allowed`` ones (a brute-force
    scan of the hits is the reference)."""
    rng = np.random.default_rng(seed)
    mem = _memory(lengths, seed=seed, values=[rng.integers(3, 9, size=m) for m in lengths])
    hits = mem.search(torch.from_numpy(rng.normal(size=(1, 8)).astype(np.float32)), r)
    allowed = torch.from_numpy(rng.random(len(lengths)) < 0.5) if lock else None
    want = next((row for row in hits.rows[0].tolist()
                 if mem.value(row) == token
                 and (max_passage is None or mem.source(row)[0] < max_passage)
                 and (allowed is None or bool(allowed[mem.source(row)[0]]))), None)
    assert span_start(hits, mem, token, max_passage=max_passage, allowed=allowed) == want
    assert _span_start_device(hits, mem, token, 0, max_passage, allowed) == want


def test_span_start_is_nearest_carrier_and_span_stays_in_passage():
    """Eq. 5 picks the nearest hit with the chosen value; spans stop at passage end and EOS."""
    mem = _memory([5, 5], values=[[10, 11, 12, 13, 14], [20, 2, 22, 23, 24]])
    hits = Hits(torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[7, 2, 6]]))
    assert span_start(hits, mem, 12) == 2
    assert span_start(hits, mem, 99) is None
    assert span_draft(mem, 2, 64, frozenset()) == [2, 3, 4]  # cut at the passage end
    assert span_draft(mem, 5, 64, frozenset({2})) == [5]  # cut before EOS
    mem.mask([3])
    assert span_draft(mem, 2, 64, frozenset()) == [2]  # never re-propose used keys
    assert use_span(0.5, 0.5) and not use_span(0.51, 0.5)


def test_choose_token_greedy_and_top_p():
    p = torch.tensor([0.1, 0.6, 0.3])
    assert choose_token(p) == 1
    g = torch.Generator().manual_seed(0)
    picks = {choose_token(p, 1.0, 0.5, g) for _ in range(50)}
    assert picks == {1}


def test_citations_merge_runs_and_slice_exactly():
    """Consecutive positions of one passage merge; cited text is the passage slice."""
    text = "alpha beta gamma delta"
    offs = np.array([[0, 5], [5, 10], [10, 16], [16, 22]], dtype=np.int32)
    passage = Passage("p0", text, doc_id="d", char_start=100)
    sources = [None, (0, 1), (0, 2), (0, 3), (0, 0), None]
    assert source_runs(sources) == [(1, 4), (4, 5)]
    out = "X beta gamma deltaalphaY"
    ends = [1, 6, 12, 18, 23, 24]
    cites = build_citations(sources, ends, [passage], [offs])
    assert [c.text for c in cites] == [" beta gamma delta", "alpha"]
    assert [out[c.start : c.end] for c in cites] == [" beta gamma delta", "alpha"]
    assert cites[0].source_start == 105 and cites[0].source_end == 122
    assert cites[0].n_tokens == 3
