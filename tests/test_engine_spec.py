"""Speculative decoding on the GPU engine (bw24nb/engine_spec.py), in the simulator on CI boxes.

Fixture: tests/fixtures/qwen35 (dense hybrid: Gated DeltaNet + gated attention, an MTP block).
The simulator runs every CUDA thread as a Python thread: one forward of this 4-layer model
costs ~10 s of CPU, so every test here counts its forwards. The plain greedy reference (prefill
+ one graph decode step per token) is computed once per module; test drafts are scripted from
it (`spec_check(live=False)`: the same drafts as the live drafters at no target cost).

- verify: one batched forward over [x, d_1..d_K] gives, row for row, the argmax the engine's
  token-by-token decode gives.
- the gate: spec_check with oracle / adversarial / mixed / MTP drafts reproduces the engine's
  plain greedy output token for token (`-m slow`: every K = 1..8 over 12 tokens).
- rollback: snapshot -> verify -> commit -> restore gives the Gated DeltaNet conv windows and
  recurrent states back bit for bit, and a rolled-back-and-recomputed commit equals a verify
  that only ever saw the kept tokens.
- the MTP head on the device matches the numpy reference's `mtp_forward` (tolerance below).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from bw24nb.formats import open_model
from bw24nb.quant import QType
from bw24nb.spec import ReferenceSpecTarget, plain_greedy, spec_check

# The simulator spends ~10 s of CPU on one forward of this fixture (docs/decisions/0015), and
# the default set below needs a few dozen: ~9 min in one worker of a 2-core box. The K = 1..8
# sweeps and the adversarial / live-MTP gate cases are `-m slow` (hours in the simulator; they
# run on the GPU: bench/spec_gate.py, `bw24nb spec --check`); the numpy-reference spec loop
# (tests/test_spec.py) runs K = 1..8 on every MTP fixture in the default suite.

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen35", "model.gguf")
PROMPT = [7, 200, 31, 99]
N_GATE = 6                  # greedy tokens the default gate checks (12 under -m slow)
N_SLOW = 12
# MTP logits vs the reference: the same bound as tests/test_engine.py -- K and V in an F16
# cache (head_dim 16 has no q8_0 blocks: ~5e-4 relative) and float32 matvec / matmul sums in
# another order than the reference's float64 -> within 3e-3 of the largest |logit|.
TOL = 3e-3


def _engine_target(n_ctx: int):
    from bw24nb.engine import Engine
    from bw24nb.engine_spec import EngineSpecTarget
    eng = Engine(open_model(FIXTURE), n_ctx=n_ctx, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None)
    return EngineSpecTarget(eng)


@pytest.fixture(scope="module")
def case():
    """(target, plain greedy reference of N_GATE tokens): N_GATE forwards, shared below."""
    target = _engine_target(n_ctx=16)
    return target, plain_greedy(target, PROMPT, N_GATE)


def _states(target):
    rs = target.engine.rs
    return rs.conv_all.copy_to_host(), rs.ssm_all.copy_to_host()


def test_the_engine_has_an_mtp_kv_slot(case):
    target, _ = case
    eng = target.engine
    c = eng.config
    assert target.has_mtp and eng.mtp_blocks == [c.num_hidden_layers]
    main = {i for i in range(c.num_hidden_layers) if c.layer_type(i) == "full_attention"}
    # the MTP block's slot is the last one, distinct from every main layer's
    assert eng.kv.slot(c.num_hidden_layers) == eng.kv.n_slots - 1 == len(main)


def test_spec_target_for_wraps_the_engine(case):
    """`bw24nb spec` / `gen --spec-k` build their target through spec_target_for."""
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.spec import spec_target_for
    target, _ = case
    wrapped = spec_target_for(target.engine, rollback="states")
    assert isinstance(wrapped, EngineSpecTarget) and wrapped.rollback == "states"
    assert wrapped.vocab_size == 256 and wrapped.n_ctx == 16


def test_verify_rows_equal_token_by_token_decode(case):
    """2 forwards: prefill, then verify over [x, ref_1..ref_{N-2}]: row i's argmax is plain
    decoding's token i+1 (the rows are the prefill path at T = N-1, decode was matvec + graph)."""
    target, ref = case
    target.reset()
    rows = target.prefill(PROMPT)
    assert int(rows.argmax[-1]) == ref[0] and rows.hidden.shape == (len(PROMPT), 64)
    ids = ref[:N_GATE - 1]
    v = target.verify(ids, want_logits=True)
    assert v.argmax.tolist() == ref[1:N_GATE]
    assert v.hidden.shape == (len(ids), 64) and v.logits.shape == (len(ids), target.vocab_size)
    np.testing.assert_array_equal(v.logits.argmax(axis=-1), v.argmax)
    target.commit(len(ids))
    assert target.position == len(PROMPT) + len(ids)


def test_rollback_restores_deltanet_state_bit_exact(case):
    """4 forwards. snapshot -> verify -> commit(2) (the default "states" rollback) -> restore
    gives the prefill's states back exactly; a verify of just the 2 kept tokens then gives the
    states the rolled-back commit had, exactly."""
    target, ref = case
    target.reset()
    target.prefill(PROMPT)
    conv0, ssm0 = _states(target)
    snap = target.snapshot()
    ids = [ref[0], (ref[1] + 1) % target.vocab_size, 5, 9]      # x, a wrong draft, two more
    target.verify(ids)
    assert target.position == len(PROMPT) + 4
    target.commit(2)
    assert target.position == len(PROMPT) + 2
    conv1, ssm1 = _states(target)
    assert not np.array_equal(ssm1, ssm0)
    target.restore(snap)
    assert target.position == len(PROMPT)
    conv, ssm = _states(target)
    np.testing.assert_array_equal(conv, conv0)
    np.testing.assert_array_equal(ssm, ssm0)
    target.verify(ids[:2])
    target.commit(2)
    conv, ssm = _states(target)
    np.testing.assert_array_equal(conv, conv1)
    np.testing.assert_array_equal(ssm, ssm1)


def test_commit_requires_verify_and_a_valid_count(case):
    target, _ = case
    target.reset()
    with pytest.raises(RuntimeError, match="without a verify"):
        target.commit(1)


# (draft mode, K, tokens): scripted test drafts are cheap (a verify and at most one recompute a
# round); adversarial rounds emit one token each, so it runs fewer tokens; the MTP draft runs
# its head (a quarter of a forward per draft) live.
# CI runs the oracle and mixed cases (full and partial acceptance, rollback by recompute); the
# adversarial and live-MTP cases cost several more forwards each (minutes in the simulator) and
# run with -m slow and on the GPU (bench/spec_bench.py, `bw24nb spec --check`).
GATE_CASES = [("oracle", 3, N_GATE), ("mixed", 3, 4),
              pytest.param("adversarial", 1, 3, marks=pytest.mark.slow),
              pytest.param("mtp", 2, 4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode,k,n", GATE_CASES, ids=["oracle-K3", "mixed-K3", "adversarial-K1", "mtp-K2"])
def test_gate_matches_plain_greedy(case, mode, k, n):
    target, ref = case
    [row] = spec_check(target, PROMPT, n, ks=[k], draft_mode=mode, reference=ref[:n], live=False)
    assert row.match, f"{mode} K={k}: {row.gate}"
    st = row.stats
    assert st.generated == n
    if mode == "oracle":
        assert st.accepted == st.drafted > 0          # the target's own continuation
    if mode == "adversarial":
        assert st.accepted == 0 and st.drafted > 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["oracle", "adversarial", "mixed", "mtp"])
def test_gate_every_k_slow(mode):
    """K = 1..8 over N_SLOW tokens; oracle / adversarial / mixed live (decoding ahead from a
    snapshot, so snapshot / restore around graph decode steps is exercised too). Minutes on a
    GPU; hours in the simulator (a few hundred forwards per mode)."""
    target = _engine_target(n_ctx=32)
    ref = plain_greedy(target, PROMPT, N_SLOW)
    rows = spec_check(target, PROMPT, N_SLOW, ks=range(1, 9), draft_mode=mode, reference=ref,
                      live=True)
    assert [r.k for r in rows if not r.match] == [], [r.gate for r in rows]


def test_mtp_head_matches_the_reference():
    """The device MTP head against `ReferenceModel.mtp_forward` on the same inputs: the
    reference's normed hidden rows of the prompt (a multi-row feed: the prefill workspace),
    then one chained pair from the reference head's own output (the one-row workspace)."""
    from bw24nb.reference import load_reference
    model, _ = load_reference(FIXTURE)
    ref = ReferenceSpecTarget(model)
    rows = ref.prefill(PROMPT)
    x = int(rows.argmax[-1])
    pairs = PROMPT[1:] + [x]

    target = _engine_target(n_ctx=16)
    target.reset()
    r_ref = ref.mtp_feed(rows.hidden, pairs)
    r_gpu = target.mtp_feed(rows.hidden, pairs, want_logits=True)
    assert target.mtp_position == ref.mtp_position == len(pairs)
    assert r_gpu.logits.shape == (1, target.vocab_size)          # the last pair's row only
    scale = np.abs(r_ref.logits[-1]).max()
    assert np.abs(r_gpu.logits[0] - r_ref.logits[-1]).max() <= TOL * scale
    assert int(r_gpu.argmax[0]) == int(r_ref.argmax[-1])
    assert np.abs(r_gpu.hidden[0] - r_ref.hidden[-1]).max() <= TOL * np.abs(r_ref.hidden[-1]).max()

    d = int(r_ref.argmax[-1])
    c_ref = ref.mtp_feed(r_ref.hidden[-1:], [d])
    c_gpu = target.mtp_feed(r_ref.hidden[-1:], [d], want_logits=True)
    scale = np.abs(c_ref.logits[-1]).max()
    assert np.abs(c_gpu.logits[0] - c_ref.logits[-1]).max() <= TOL * scale
    assert c_gpu.top_prob is not None and abs(c_gpu.top_prob[0] - c_ref.top_prob[-1]) < 1e-3

    # FR-Spec trim: the same rows of the head, argmax mapped back to vocabulary ids
    target.mtp_truncate(len(pairs))
    vocab = np.argsort(-c_ref.logits[-1])[:16][::-1].copy()      # contains the argmax, reversed
    t_gpu = target.mtp_feed(r_ref.hidden[-1:], [d], vocab=vocab, want_logits=True)
    assert t_gpu.logits.shape == (1, 16) and int(t_gpu.argmax[0]) == int(c_ref.argmax[-1])
    # the same dot products, but a matvec may split a row's sum by the row count M: float32
    # reassociation only (~1e-6 of the largest |logit|)
    np.testing.assert_allclose(t_gpu.logits[0], c_gpu.logits[0][vocab], rtol=0, atol=1e-5 * scale)


def test_verify_rows_are_the_decode_steps_bit_for_bit(case):
    """The verify runs the decode kernels over K+1 rows: each row's normed hidden state and
    logits equal decoding that token alone, bit for bit (not just its argmax)."""
    target, ref = case
    target.reset()
    target.prefill(PROMPT)
    dec = [target.decode(t, want_logits=True) for t in ref[:3]]
    target.reset()
    target.prefill(PROMPT)
    v = target.verify(ref[:3], want_logits=True)
    hidden = v.hidden.copy_to_host()                  # a verify's rows stay on the device
    for i, d in enumerate(dec):
        np.testing.assert_array_equal(hidden[i], d.hidden.reshape(-1))
        np.testing.assert_array_equal(v.logits[i], d.logits[0])
    target.commit(3)


def test_states_rollback_equals_recompute(case):
    """commit(2) after a 4-row verify: the "states" rollback (the kernels' per-row copies)
    leaves the same recurrent state, bit for bit, as "recompute" (restore + 2-row forward)."""
    target, ref = case
    ids = [ref[0], (ref[1] + 1) % target.vocab_size, 5, 9]
    out = {}
    for rollback in ("recompute", "states"):
        from bw24nb.engine_spec import EngineSpecTarget
        t = EngineSpecTarget(target.engine, rollback=rollback)
        t.reset()
        t.prefill(PROMPT)
        t.verify(ids)
        t.commit(2)
        assert t.position == len(PROMPT) + 2
        out[rollback] = _states(t)
    for a, b in zip(out["recompute"], out["states"]):
        np.testing.assert_array_equal(a, b)


def test_mtp_draft_equals_chained_feeds(case):
    """mtp_draft (the feed graph + chain-graph replays, drafts read back once) proposes what
    chained eager mtp_feed calls propose."""
    target, ref = case
    target.reset()
    rows = target.prefill(PROMPT)
    pairs = [(rows.hidden[-1:], [ref[0]])]      # one pair: one-row kernels both ways
    eager = []
    r = target.mtp_feed(*pairs[0])
    for _ in range(3):
        eager.append(int(r.argmax[-1]))
        r = target.mtp_feed(r.hidden[-1:], [eager[-1]])
    target.mtp_truncate(0)
    assert target.mtp_draft(pairs, 3) == eager
    assert target.mtp_position == 3                 # the pair + 2 chained drafts
    # with the drafts' top probabilities computed on the device (confidence gating)
    target.mtp_truncate(0)
    r = target.mtp_feed(*pairs[0], want_logits=True)
    host = [float(r.top_prob[-1])]
    for d in eager[:2]:
        r = target.mtp_feed(r.hidden[-1:], [d], want_logits=True)
        host.append(float(r.top_prob[-1]))
    target.mtp_truncate(0)
    drafts, probs = target.mtp_draft(pairs, 3, probs=True)
    assert drafts == eager
    np.testing.assert_allclose(probs, host, rtol=1e-4)
