"""Argmax and seeded sampling on the device (bw24nb/kernels/sampling.py).

Argmax is exact (no arithmetic). Sampling is checked token for token against
`reference_sample`, the same algorithm in float64 fed the uniform the device drew (which must
itself equal `reference_uniform(seed, n)` bit for bit). The device sums in float32, so the two
can disagree only when u * (cumulative total) falls within rounding distance (~1e-6 relative)
of a boundary between two tokens; `reference_sample` reports that margin and such draws (rare:
probability ~1e-5 each) accept either neighbour.

Small `threads` (32) keep the simulator fast while still splitting the vocabulary over several
blocks; one test runs the default 256-thread configuration.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels.sampling import (TOPK_MAX, SampleWorkspace, launch_argmax, launch_sample,
                                     launch_top_prob, make_rng_state, reference_sample,
                                     reference_uniform, sampling_params)

MARGIN = 1e-5


def _argmax_device(logits, threads):
    work = SampleWorkspace(logits.shape[0], threads)
    out = cuda.to_device(np.full(1, -7, np.int32))
    launch_argmax(cuda.to_device(logits), out, work)
    return int(out.copy_to_host()[0]), work.n_blocks


@pytest.mark.parametrize("V,threads", [(3000, 32), (700, 256)])
def test_argmax_ties_go_to_lowest_id(rng, V, threads):
    logits = rng.standard_normal(V).astype(np.float32)
    top = np.float32(logits.max() + 1.0)
    ids = np.sort(rng.choice(V, 3, replace=False))
    logits[ids] = top                             # a three-way tie, in different blocks or not
    token, n_blocks = _argmax_device(logits, threads)
    assert token == ids[0]
    if V == 3000:
        assert n_blocks > 1


@pytest.mark.parametrize("T,rows", [(1, 1), (3, 4), (4, 4)])
def test_argmax_of_rows_is_each_rows_argmax(rng, T, rows):
    """One launch pair for T rows of a [rows, V] workspace: row r's token is np.nanargmax of
    row r (ties across blocks to the lowest id, NaN never ranks, an all-NaN row gives -1);
    out_token past T keeps its poison."""
    V = 3000
    logits = rng.standard_normal((T, V)).astype(np.float32)
    for r in range(T):
        top = np.float32(logits[r].max() + 1.0)
        logits[r, np.sort(rng.choice(V, 2 + r, replace=False))] = top
        logits[r, rng.integers(0, V)] = np.nan
    if T > 1:
        logits[T - 1] = np.nan
    work = SampleWorkspace(V, 32, rows=rows)
    out = cuda.to_device(np.full(rows + 1, -7, np.int32))
    launch_argmax(cuda.to_device(logits), out, work)
    got = out.copy_to_host()
    want = [int(np.nanargmax(row)) if not np.isnan(row).all() else -1 for row in logits]
    assert got[:T].tolist() == want
    assert (got[T:] == -7).all()


def test_argmax_rejects_more_rows_than_its_workspace():
    work = SampleWorkspace(700, 32, rows=2)
    out = cuda.to_device(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="3 rows"):
        launch_argmax(cuda.to_device(np.zeros((3, 700), np.float32)), out, work)


@pytest.mark.parametrize("scale,first", [(1.0, True), (8.0, False), (0.01, False)])
def test_top_prob_is_the_largest_softmax_probability(rng, scale, first):
    """launch_top_prob after launch_argmax: 1 / sum(exp(l - max)) in float32 against float64
    (flat, peaked and almost uniform distributions), written at slot 0 for the first draft of
    a chain and at counter[0] otherwise; nothing else of out_prob touched."""
    V = 3000
    logits = (scale * rng.standard_normal(V)).astype(np.float32)
    work = SampleWorkspace(V, 32)
    d_logits = cuda.to_device(logits)
    tok = cuda.to_device(np.full(1, -7, np.int32))
    launch_argmax(d_logits, tok, work)
    probs = cuda.to_device(np.full(4, np.nan, np.float32))
    counter = cuda.to_device(np.array([2], np.int32))
    launch_top_prob(d_logits, tok, work, probs, counter, first)
    got = probs.copy_to_host()
    z = logits.astype(np.float64)
    want = 1.0 / np.exp(z - z.max()).sum()
    slot = 0 if first else 2
    np.testing.assert_allclose(got[slot], want, rtol=2e-6 * np.log2(V))
    assert np.isnan(np.delete(got, slot)).all()


def test_argmax_ignores_nan_and_handles_all_nan(rng):
    logits = rng.standard_normal(300).astype(np.float32)
    logits[5] = np.nan
    logits[200] = np.float32(50)
    assert _argmax_device(logits, 32)[0] == 200
    assert _argmax_device(np.full(100, np.nan, np.float32), 32)[0] == -1
    assert _argmax_device(np.full(100, -np.inf, np.float32), 32)[0] == 0


def _sample(logits, params, state, work):
    out = cuda.to_device(np.full(1, -7, np.int32))
    u = cuda.to_device(np.full(1, np.nan, np.float32))
    launch_sample(cuda.to_device(logits), cuda.to_device(params), state, out, u, work)
    return int(out.copy_to_host()[0]), np.float32(u.copy_to_host()[0])


CASES = [  # temperature, top_k, top_p, logit scale
    (1.0, 0, 1.0, 1.0),     # full vocabulary
    (0.7, 0, 1.0, 3.0),     # full vocabulary, peaked
    (1.0, 5, 1.0, 1.0),     # top-k
    (0.8, 12, 0.7, 2.0),    # top-k then top-p over the survivors
    (1.0, 0, 0.6, 4.0),     # nucleus relative to the full vocabulary sum
    (1.3, 500, 1.0, 1.0),   # top_k above TOPK_MAX: capped
]


@pytest.mark.parametrize("temperature,top_k,top_p,scale", CASES,
                         ids=["full", "full-peaked", "topk5", "topk12-topp0.7", "topp0.6",
                              "topk-capped"])
def test_sample_matches_reference(rng, temperature, top_k, top_p, scale):
    V = 700
    work = SampleWorkspace(V, threads=32)
    assert work.n_blocks == 3              # odd: the merge tree has an unpaired list
    seed = int(rng.integers(0, 2**63))
    state = make_rng_state(seed)
    params = sampling_params(temperature, top_p, top_k)
    for n in range(2):                            # two draws: fresh logits, next uniform
        logits = (rng.standard_normal(V) * scale).astype(np.float32)
        token, u = _sample(logits, params, state, work)
        assert u == reference_uniform(seed, n)
        want, margin = reference_sample(logits, temperature, top_k, top_p, float(u))
        if margin > MARGIN:
            assert token == want, (n, token, want, margin)
        else:
            assert abs(token - want) <= V                 # any valid token at a knife edge
        if top_k > 0:
            rank = np.argsort(-logits.astype(np.float64), kind="stable")
            assert token in rank[:min(top_k, TOPK_MAX)]
    assert state.copy_to_host()[1] == 2


def test_sample_short_chunks_ties_and_nan(rng):
    # 4 threads per block: chunks of 25 < k = 64, so every block list is padded with
    # "no candidate" entries the merge must rank last; logits on a coarse grid make value ties
    # across blocks (broken by id); NaN logits must never be chosen.
    V = 100
    work = SampleWorkspace(V, threads=4)
    assert work.n_blocks == 4
    seed = int(rng.integers(0, 2**31))
    state = make_rng_state(seed)
    for n, (top_k, top_p) in enumerate(((0, 0.97), (70, 1.0), (30, 0.9), (0, 1.0))):
        logits = (np.round(rng.standard_normal(V) * 2) / 2).astype(np.float32)
        logits[rng.choice(V, 5, replace=False)] = np.nan
        token, u = _sample(logits, sampling_params(1.0, top_p, top_k), state, work)
        assert u == reference_uniform(seed, n)
        want, margin = reference_sample(logits, 1.0, top_k, top_p, float(u))
        assert not np.isnan(logits[token])
        assert token == want or margin <= MARGIN, (top_k, top_p, token, want, margin)


def test_sample_default_threads_and_greedy(rng):
    V = 2000
    work = SampleWorkspace(V)                     # 256 threads
    logits = rng.standard_normal(V).astype(np.float32)
    state = make_rng_state(123)
    token, u = _sample(logits, sampling_params(0.0), state, work)
    assert token == int(np.argmax(logits)) and u == 0
    assert state.copy_to_host()[1] == 0           # greedy draws nothing
    token, u = _sample(logits, sampling_params(1.0, 0.9, 40), state, work)
    want, margin = reference_sample(logits, 1.0, 40, 0.9, float(u))
    assert token == want or margin <= MARGIN


def test_same_seed_same_tokens(rng):
    V = 500
    work = SampleWorkspace(V, threads=32)
    logits = rng.standard_normal(V).astype(np.float32)
    params = sampling_params(1.0)
    runs = []
    for _ in range(2):
        state = make_rng_state(2024)
        runs.append([_sample(logits, params, state, work)[0] for _ in range(3)])
    assert runs[0] == runs[1]


def test_reference_uniform_stream():
    # statistics of the counter-based stream (numpy only, so cheap to draw many)
    u = np.array([reference_uniform(7, n) for n in range(20000)])
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert counts.min() > 1800 and counts.max() < 2200
    assert reference_uniform(7, 0) != reference_uniform(8, 0)
    assert reference_uniform(2**40 + 7, 0) != reference_uniform(7, 0)   # high seed bits matter


def test_reference_sample_distribution():
    # The reference itself: u sweeping [0, 1) reproduces the softmax probabilities.
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], np.float32)
    us = (np.arange(10000) + 0.5) / 10000
    for top_k, top_p in ((0, 1.0), (3, 1.0)):
        toks = np.array([reference_sample(logits, 1.0, top_k, top_p, u)[0] for u in us])
        p = np.exp(logits.astype(np.float64))
        if top_k:
            p[np.argsort(-p)[top_k:]] = 0
        p /= p.sum()
        np.testing.assert_allclose(np.bincount(toks, minlength=5) / len(us), p, atol=2e-4)
