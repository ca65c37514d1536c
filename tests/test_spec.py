"""Speculative decoding (bw24nb/spec.py): the exactness gate, rollback, sampling, speed levers.

Fixtures: the hybrid Qwen3.5 / Qwen3.5-MoE checkpoints with an MTP head (tests/fixtures/
qwen35, qwen35moe; Gated DeltaNet + attention, HF and GGUF), on the numpy reference.

- The gate: for K = 1..8, greedy speculative output over 64 tokens equals plain greedy decoding
  (prefill + one decode step per token) with the MTP draft (GGUF files every K, HF
  directories K = 1, 8 by default and every K under `-m slow`: they load to the same internal
  tensors), with the target's own continuation as draft (acceptance exactly 100%), an
  always-wrong draft (exactly 0%) and one wrong at a random depth (every partial acceptance
  length). For every K those test drafts are read off the plain greedy run (`ScriptedDrafter`,
  no extra target work); the live ones (the target decodes ahead from a snapshot) run at a
  few K. The reference is slow (~10 ms a forward on these tiny models), hence the split.
- Rollback: after verify + commit(n) the whole state -- every DeltaNet conv window and
  recurrent state, every KV row, the position -- equals a model that only ever saw the n kept
  tokens, bit for bit; a target that truncates the KV caches but forgets the DeltaNet state
  fails the gate (so the gate sees that bug).
- The MTP drafter feeds every true (hidden_t, token_{t+1}) pair exactly once, in order: its
  drafts equal an MTP head fed the whole true sequence independently.
- Sampling: on a tiny Markov target the speculative output's joint distribution passes a
  chi-square test against the target's own (and a draft-distributed sample fails it);
  acceptance at depth 1 matches sum(min(p, q)).
- FR-Spec trim, confidence gating and per-round depths keep the gate exact.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from bw24nb import spec
from bw24nb.formats import open_model
from bw24nb.models import load_weights
from bw24nb.reference.model import ReferenceModel
from bw24nb.sampling import SamplingParams, sample_with_uniform
from bw24nb.spec import (DepthTable, ReferenceSpecTarget, Rows, ScriptedDrafter, SpecStats,
                         accept_greedy, content_class, draft_vocab_from_tokens, first_difference,
                         load_draft_vocab, pick, plain_generate, plain_greedy, sampling_probs,
                         save_draft_vocab, spec_check, speculative_generate)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
N_TOKENS = 64                        # the gate length
KS = range(1, 9)
PROMPT_LEN = 6


def _load(family, fmt):
    path = os.path.join(FIXTURES, family, "hf" if fmt == "hf" else "model.gguf")
    source = open_model(path)
    return ReferenceModel(source.config, load_weights(source))


_CACHE: dict = {}


def fixture_case(family, fmt):
    """(target, prompt, plain greedy reference of N_TOKENS), built once per fixture file."""
    key = (family, fmt)
    if key not in _CACHE:
        model = _load(family, fmt)
        prompt = [int(t) for t in np.load(os.path.join(FIXTURES, family, "expected.npz"))["tokens"][:PROMPT_LEN]]
        target = ReferenceSpecTarget(model)
        _CACHE[key] = (target, prompt, plain_greedy(target, prompt, N_TOKENS))
    return _CACHE[key]


GGUF_FIXTURES = [(f, "gguf") for f in ("qwen35", "qwen35moe")]
ids_of = lambda p: f"{p[0]}-{p[1]}"   # noqa: E731


def _check_stats(st: SpecStats, k: int, n: int):
    assert st.generated == n
    assert st.drafted == sum(st.drafted_at_depth) and st.accepted == sum(st.accepted_at_depth)
    assert 0 <= st.accepted <= st.drafted <= k * st.rounds
    # every round emits its accepted drafts plus one token of the target's own
    assert st.accepted + st.rounds >= n - 1


# ============================================================================ the exactness gate

def _gate_mtp(case, ks):
    target, prompt, ref = fixture_case(*case)
    assert len(ref) == N_TOKENS and len(set(ref)) > 8          # a real continuation, not a loop
    rows = spec_check(target, prompt, N_TOKENS, ks, "mtp", reference=ref)
    for r in rows:
        assert r.match, f"K={r.k}: {r.gate}"
        _check_stats(r.stats, r.k, N_TOKENS)
        assert r.stats.drafted > 0


@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_gate_mtp_draft_every_k(case):
    """`bw24nb spec --check`: K = 1..8 identical to plain greedy over 64 tokens."""
    _gate_mtp(case, KS)


@pytest.mark.parametrize("case", [(f, "hf") for f in ("qwen35", "qwen35moe")], ids=ids_of)
def test_gate_mtp_draft_hf(case):
    """The HF directories load to the same internal tensors as the GGUF files (test_qwen35), so
    by default a few K here; the full K = 1..8 sweep is the slow test below."""
    _gate_mtp(case, (1, 8))


@pytest.mark.slow
@pytest.mark.parametrize("case", [(f, "hf") for f in ("qwen35", "qwen35moe")], ids=ids_of)
def test_gate_mtp_draft_hf_every_k(case):
    _gate_mtp(case, KS)


@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_gate_oracle_draft_accepts_everything(case):
    """Draft = the target's own greedy continuation: every draft accepted, rounds of K+1 tokens."""
    target, prompt, ref = fixture_case(*case)
    for r in spec_check(target, prompt, N_TOKENS, KS, "oracle", reference=ref, live=False):
        assert r.match, f"K={r.k}: {r.gate}"
        _check_stats(r.stats, r.k, N_TOKENS)
        assert r.stats.acceptance_rate == 1.0
        assert r.stats.rounds == math.ceil((N_TOKENS - 1) / (r.k + 1))


@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_gate_adversarial_draft_accepts_nothing(case):
    """Draft always wrong: every round rolls back all K drafts and emits the target's token."""
    target, prompt, ref = fixture_case(*case)
    for r in spec_check(target, prompt, N_TOKENS, KS, "adversarial", reference=ref, live=False):
        assert r.match, f"K={r.k}: {r.gate}"
        assert r.stats.accepted == 0 and r.stats.rounds == N_TOKENS - 1
        assert r.stats.drafted == sum(min(r.k, N_TOKENS - 2 - i) for i in range(N_TOKENS - 1))


@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_gate_partial_acceptance_every_length(case):
    """Draft wrong at a random depth j: each round accepts exactly j; across K all of 0..K occur."""
    target, prompt, ref = fixture_case(*case)
    for k in KS:
        drafter = ScriptedDrafter(target, SamplingParams(), None, ref, len(prompt), "mixed", seed=k)
        toks, st = speculative_generate(target, prompt, N_TOKENS, k, draft_mode=drafter, trace=True)
        assert toks == ref, f"K={k}: first difference at {first_difference(toks, ref)}"
        assert not drafter.off_script
        got = [r.accepted for r in st.trace if r.drafts]
        assert got == drafter.planned
        if k <= 4:                       # enough rounds to see every length
            assert set(got) == set(range(k + 1)), (k, sorted(set(got)))


def test_gate_live_test_drafts():
    """The live test drafters (the target decodes ahead from a snapshot and restores it) and the
    per-position-state rollback give the same output; the live oracle at temperature 0 is
    accepted entirely, the live adversarial draft never."""
    target, prompt, ref = fixture_case("qwen35moe", "gguf")
    for mode, k, rate in (("oracle", 3, 1.0), ("adversarial", 2, 0.0), ("mixed", 5, None)):
        toks, st = speculative_generate(target, prompt, 32, k, draft_mode=mode, seed=1)
        assert toks == ref[:32], mode
        if rate is not None:
            assert st.acceptance_rate == rate, mode
    states = ReferenceSpecTarget(target.model, rollback="states")
    for mode, k in (("mtp", 3), ("mixed", 4)):
        toks, st = speculative_generate(states, prompt, 32, k, draft_mode=mode, seed=2)
        assert toks == ref[:32], (mode, first_difference(toks, ref))


def test_gate_catches_a_rollback_that_forgets_deltanet_state():
    """A target that truncates the KV caches but leaves the Gated DeltaNet conv/recurrent state
    as verify left it (the classic hybrid-model bug) must fail the gate."""

    class KVOnlyRollback(ReferenceSpecTarget):
        def commit(self, n):
            snap, ids = self._pending
            self._pending = None
            for layer, saved in zip(self.model.layers, snap.mixers):
                if not isinstance(saved, tuple):
                    layer.mixer.cache.truncate(saved + n)
            self.model.position = snap.position + n

    target, prompt, ref = fixture_case("qwen35", "gguf")
    broken = KVOnlyRollback(target.model)
    toks, _ = speculative_generate(broken, prompt, 24, 4, draft_mode=ScriptedDrafter(
        broken, SamplingParams(), None, ref, len(prompt), "adversarial"))
    assert toks != ref[:24]


# ============================================================================ rollback, directly

def _state(model: ReferenceModel):
    """Everything a continuation depends on: per layer KV rows or (conv window, ssm state)."""
    out = [model.position]
    for layer in model.layers:
        m = layer.mixer
        if hasattr(m, "ssm_state"):
            out.append(("gdn", m.conv_state.copy(), m.ssm_state.copy()))
        else:
            out.append(("kv", m.cache.k.copy(), m.cache.v.copy()))
    return out


def _assert_same_state(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1:], b[1:]):
        assert x[0] == y[0]
        for u, v in zip(x[1:], y[1:]):
            assert u.shape == v.shape
            np.testing.assert_array_equal(u, v)      # bit for bit, no tolerance


def _states_differ(a, b) -> bool:
    return any(not np.array_equal(u, v) for x, y in zip(a[1:], b[1:]) for u, v in zip(x[1:], y[1:]))


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe"])
def test_rollback_restores_deltanet_state_bit_exact(family, rng):
    """verify([x, d1..d8]) then commit(n): the state equals a fresh model's after
    prefill(prompt) + prefill(first n) -- for every n, so rejected drafts leave no trace in the
    conv windows (kernel 4 > some n, < others) nor in the recurrent states."""
    target, prompt, _ = fixture_case(family, "gguf")
    V = target.vocab_size
    fresh = ReferenceModel(target.model.config, target.model.weights)
    for n in range(1, 10):
        verify_ids = [int(t) for t in rng.integers(0, V, size=9)]
        target.reset()
        target.prefill(prompt)
        target.verify(verify_ids)
        after_verify = _state(target.model)
        target.commit(n)
        fresh.reset()
        fresh.prefill(prompt)
        fresh.prefill(verify_ids[:n])
        want = _state(fresh)
        _assert_same_state(_state(target.model), want)
        if n < 9:                                 # the verify really did move the state
            assert _states_differ(after_verify[:1] + [s for s in after_verify[1:] if s[0] == "gdn"],
                                  want[:1] + [s for s in want[1:] if s[0] == "gdn"])
        # and the continuation is the same to the last bit
        nxt = int(rng.integers(0, V))
        np.testing.assert_array_equal(target.prefill([nxt]).logits, fresh.prefill([nxt]))


def test_rollback_per_position_states_bit_exact(rng):
    """rollback="states": verify runs decode steps keeping each state; commit(n) equals a model
    that decoded only the n kept tokens."""
    base, prompt, _ = fixture_case("qwen35moe", "gguf")
    target = ReferenceSpecTarget(base.model, rollback="states")
    fresh = ReferenceModel(base.model.config, base.model.weights)
    for n in (1, 3, 6):
        ids = [int(t) for t in rng.integers(0, target.vocab_size, size=6)]
        target.reset()
        target.prefill(prompt)
        target.verify(ids)
        target.commit(n)
        fresh.reset()
        fresh.prefill(prompt)
        for t in ids[:n]:
            fresh.decode(t)
        _assert_same_state(_state(target.model), _state(fresh))


def test_snapshot_restore_and_staleness():
    target, prompt, _ = fixture_case("qwen35", "gguf")
    m = target.model
    m.reset()
    m.prefill(prompt)
    s0 = m.snapshot()
    before = _state(m)
    m.prefill([5, 6, 7])
    s1 = m.snapshot()
    m.restore(s0)
    _assert_same_state(_state(m), before)
    m.prefill([8, 9, 10])              # rows s1 relied on were rewritten with other tokens
    with pytest.raises(ValueError, match="stale"):
        m.restore(s1)
    m.restore(s0)                      # still fine: nothing below its position changed
    m.reset()
    with pytest.raises(ValueError, match="reset"):
        m.restore(s0)


def test_commit_requires_verify_and_a_valid_count():
    target, prompt, _ = fixture_case("qwen35", "gguf")
    target.reset()
    target.prefill(prompt)
    with pytest.raises(RuntimeError):
        target.commit(1)
    target.verify([1, 2, 3])
    with pytest.raises(ValueError):
        target.commit(4)


# ============================================================================ MTP bookkeeping

@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_mtp_forward_normed_equals_mtp_head(case):
    """ReferenceModel.mtp_forward on normed hidden states is MTPHead.forward, bit for bit, and
    the trimmed head gives the same rows."""
    from bw24nb.reference.mtp import MTPHead
    target, prompt, ref = fixture_case(*case)
    m = target.model
    seq = prompt + ref[:10]
    m.reset()
    h = m.hidden_states(seq[:-1])
    want = MTPHead(m.config, m.weights).forward(h, seq[1:])
    got, out = m.mtp_forward(m.normed_hidden(h), seq[1:])
    np.testing.assert_array_equal(got, want)
    assert out.shape == h.shape
    vocab = np.array([7, 3, 200, 0, 55])
    m.reset()
    h = m.hidden_states(seq[:-1])
    trimmed, out2 = m.mtp_forward(m.normed_hidden(h), seq[1:], vocab)
    np.testing.assert_allclose(trimmed, want[:, vocab], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("case", GGUF_FIXTURES, ids=ids_of)
def test_mtp_drafts_follow_the_true_sequence(case):
    """Round by round, d_1 and d_2 equal an independent MTP head that holds exactly the true pairs
    (h_t, token_{t+1}) for t < P (fed in one batch) and then chains on its own output: the
    drafter fed each true pair once and truncated every rejected chained draft."""
    target, prompt, ref = fixture_case(*case)
    toks, st = speculative_generate(target, prompt, 40, 3, draft_mode="mtp", trace=True)
    assert toks == ref[:40]
    seq = prompt + toks
    ind = ReferenceModel(target.model.config, target.model.weights)
    normed = ind.normed_hidden(ind.hidden_states(seq))
    head = ind.mtp
    checked = 0
    for r in st.trace:
        if not r.drafts:
            continue
        P = r.position
        head.truncate(0)
        logits, out = ind.mtp_forward(normed[:P], seq[1:P + 1])          # pairs 0..P-1
        chain = [logits[-1]]
        if len(r.drafts) > 1:
            chain.append(ind.mtp_forward(out[-1:], [r.drafts[0]])[0][0])
        for row, d in zip(chain, r.drafts):
            top2 = np.sort(row)[-2:]
            if top2[1] - top2[0] > 1e-4:         # skip float ties between batchings
                assert int(np.argmax(row)) == d
                checked += 1
    assert checked >= len(st.trace)


# ============================================================================ sampling

class MarkovTarget:
    """A SpecTarget whose next-token logits depend on the last token only: `table[last]`; its
    "MTP head" drafts from another table. Tiny vocabulary, exact distributions."""

    name = "markov"
    has_mtp = True

    def __init__(self, table, draft_table, n_ctx=1 << 20):
        self.table, self.draft_table = np.asarray(table, float), np.asarray(draft_table, float)
        self.vocab_size, self.n_ctx = self.table.shape[0], n_ctx
        self.tokens: list[int] = []
        self.mtp_len = 0
        self._pending = None

    @property
    def position(self):
        return len(self.tokens)

    def reset(self):
        self.tokens, self.mtp_len, self._pending = [], 0, None

    def prefill(self, ids, want_logits=False):
        ids = [int(t) for t in ids]
        self.tokens += ids
        return Rows.from_logits(self.table[ids], np.zeros((len(ids), 1)))

    def decode(self, token, want_logits=False):
        return self.prefill([token])

    def verify(self, ids, want_logits=False):
        self._pending = len(self.tokens)
        return self.prefill(ids)

    def commit(self, n):
        del self.tokens[self._pending + n:]

    def snapshot(self):
        return len(self.tokens)

    def restore(self, n):
        del self.tokens[n:]

    @property
    def mtp_position(self):
        return self.mtp_len

    def mtp_truncate(self, n):
        self.mtp_len = n

    def mtp_feed(self, hidden, tokens, vocab=None, want_logits=False):
        self.mtp_len += len(tokens)
        logits = self.draft_table[[int(t) for t in tokens]]
        return Rows.from_logits(logits if vocab is None else logits[:, vocab],
                                np.zeros((len(tokens), 1)), vocab)


def _chi2_critical(df: int, z: float = 4.265) -> float:
    """Wilson-Hilferty chi-square quantile; z = 4.265 is the 1 - 1e-5 normal quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts, probs, min_expected=5.0):
    """Pearson's statistic and degrees of freedom; outcomes expected fewer than 5 times are
    pooled into one cell (the usual validity condition of the chi-square approximation)."""
    counts, probs = np.asarray(counts, float).ravel(), np.asarray(probs, float).ravel()
    n = counts.sum()
    assert np.all(counts[probs == 0] == 0), "a zero-probability outcome occurred"
    exp = n * probs
    big = exp >= min_expected
    obs_cells = np.append(counts[big], counts[~big & (probs > 0)].sum())
    exp_cells = np.append(exp[big], exp[~big & (probs > 0)].sum())
    keep = exp_cells > 0
    obs_cells, exp_cells = obs_cells[keep], exp_cells[keep]
    return float(((obs_cells - exp_cells) ** 2 / exp_cells).sum()), int(obs_cells.size - 1)


MARKOV_P = np.log(np.array([[0.50, 0.20, 0.15, 0.10, 0.05],
                            [0.10, 0.10, 0.40, 0.30, 0.10],
                            [0.30, 0.05, 0.05, 0.30, 0.30],
                            [0.25, 0.25, 0.20, 0.15, 0.15],
                            [0.05, 0.45, 0.10, 0.20, 0.20]]))
MARKOV_Q = np.log(np.array([[0.10, 0.40, 0.10, 0.30, 0.10],      # deliberately different
                            [0.60, 0.10, 0.10, 0.10, 0.10],
                            [0.20, 0.20, 0.20, 0.20, 0.20],
                            [0.05, 0.05, 0.10, 0.40, 0.40],
                            [0.30, 0.10, 0.30, 0.10, 0.20]]))


def _joint(table, params, first):
    """P(x, y, z | prompt token `first`) under the Markov chain with `table` logits."""
    p = [sampling_probs(row, params) for row in table]
    return np.einsum("x,xy,yz->xyz", p[first], np.stack(p), np.stack(p))


def _run_many(params_for, n, k=2, max_tokens=4):
    target = MarkovTarget(MARKOV_P, MARKOV_Q)
    counts = np.zeros((5, 5, 5))
    acc1 = 0
    for i in range(n):
        toks, st = speculative_generate(target, [0], max_tokens, k, params_for(i), draft_mode="mtp",
                                        trace=True)
        counts[tuple(toks[:3])] += 1
        acc1 += st.trace[0].accepted >= 1                # the first round's d_1
    return counts, acc1


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 0.9)])
def test_speculative_sampling_keeps_the_target_distribution(top_k, top_p):
    """(x, y, z): x from prefill's logits, then a round with K = 2 drafts from q: y and z are
    accepted drafts, residual draws at depth 1 or 2, or the bonus / next round's token.
    Their joint frequency over 4000 runs passes chi-square (alpha 1e-5) against p(x)p(y|x)p(z|y);
    depth-1 acceptance matches E[sum min(p, q)]. Fixed seeds: deterministic."""
    params = lambda i: SamplingParams(0.9, top_k, top_p, seed=i)   # noqa: E731
    n = 4000
    counts, acc1 = _run_many(params, n)
    want = _joint(MARKOV_P, params(0), 0)
    stat, df = _chi2(counts, want)
    assert stat < _chi2_critical(df), (stat, df)
    # acceptance of d_1 (drafted after y's predecessor x): sum_x p(x) sum_y min(p(y|x), q(y|x))
    pp = [sampling_probs(r, params(0)) for r in MARKOV_P]
    qq = [sampling_probs(r, params(0)) for r in MARKOV_Q]
    expect = sum(pp[0][x] * np.minimum(pp[x], qq[x]).sum() for x in range(5))
    assert abs(acc1 / n - expect) < 5 * math.sqrt(expect * (1 - expect) / n)


def test_chi_square_has_power_against_a_wrong_rule(monkeypatch):
    """Control: the classic bug -- after a rejection, draw from p instead of norm(max(0, p - q))
    -- over-weights the draft's favourites and fails the same test, so the test can fail."""
    def resample_from_p(logits, drafts, qs, params, rng):
        for i, d in enumerate(drafts):
            p = sampling_probs(logits[i], params)
            if rng.random() * qs[i][d] < p[d]:
                continue
            return i, pick(p, rng.random())
        return len(drafts), sample_with_uniform(logits[len(drafts)], params, rng.random())

    monkeypatch.setattr(spec, "accept_sampled", resample_from_p)
    params = lambda i: SamplingParams(0.9, seed=i)   # noqa: E731
    counts, _ = _run_many(params, 2000)
    stat, df = _chi2(counts, _joint(MARKOV_P, params(0), 0))
    assert stat > _chi2_critical(df)


def test_sampling_probs_is_the_sampler_distribution():
    """sampling_probs(logits) is what sample_with_uniform draws from: a fine grid of u
    reproduces its masses (to the grid step), with top-k / top-p cut-offs."""
    logits = np.array([1.0, 3.0, 2.5, -1.0, 3.0, 0.2])
    for params in (SamplingParams(0.7), SamplingParams(1.3, top_k=3), SamplingParams(1.0, top_p=0.6),
                   SamplingParams(0.0)):
        p = sampling_probs(logits, params)
        assert abs(p.sum() - 1) < 1e-12
        us = (np.arange(4000) + 0.5) / 4000
        freq = np.bincount([sample_with_uniform(logits, params, u) for u in us], minlength=6) / us.size
        np.testing.assert_allclose(freq, p, atol=1 / 2000)        # two grid steps
        freq2 = np.bincount([pick(p, u) for u in us], minlength=6) / us.size
        np.testing.assert_allclose(freq2, p, atol=1 / 2000)


def test_k0_sampling_is_plain_sampling():
    """With no drafts every round draws one uniform as the plain Sampler does: the same tokens
    for the same seed (speculation changes nothing but speed)."""
    target, prompt, _ = fixture_case("qwen35", "gguf")
    params = SamplingParams(0.8, top_k=20, seed=1234)
    want = plain_generate(target, prompt, 20, params)
    got, st = speculative_generate(target, prompt, 20, 0, params)
    assert got == want and st.drafted == 0
    # and with drafts it is a different (equally distributed) stream, still from the target
    got3, st3 = speculative_generate(target, prompt, 20, 3, params)
    assert len(got3) == 20 and st3.drafted > 0


def test_oracle_draft_under_sampling_is_always_accepted():
    """q = p (the target drafting for itself) => min(1, p/q) = 1 up to float rounding."""
    target = MarkovTarget(MARKOV_P, MARKOV_Q)
    toks, st = speculative_generate(target, [1], 60, 4, SamplingParams(1.0, seed=3), "oracle")
    assert len(toks) == 60 and st.acceptance_rate == 1.0


# ============================================================================ loop edges (Markov)

def test_greedy_loop_edges_eos_max_tokens_context():
    """EOS inside accepted drafts stops there; max_tokens is never exceeded; a short context
    stops both loops at the same place."""
    greedy_cycle = np.full((5, 5), -5.0)
    for a, b in ((0, 1), (1, 2), (2, 3), (3, 4), (4, 1)):
        greedy_cycle[a, b] = 5.0
    t = MarkovTarget(greedy_cycle, greedy_cycle)            # the draft agrees: long acceptances
    for k in KS:
        for n in (1, 2, 7, 30):
            toks, st = speculative_generate(t, [0], n, k)
            assert toks == plain_greedy(t, [0], n) and len(toks) == n
        toks, st = speculative_generate(t, [0], 50, k, eos_ids=(4,))
        assert toks == [1, 2, 3] == plain_greedy(t, [0], 50, eos_ids=(4,)) and st.finish_reason == "stop"
        short = MarkovTarget(greedy_cycle, greedy_cycle, n_ctx=9)
        toks, st = speculative_generate(short, [0, 1], 50, k)
        assert toks == plain_greedy(short, [0, 1], 50) and short.position <= 9
    with pytest.raises(ValueError):
        speculative_generate(t, [], 5, 2)


def test_accept_greedy():
    argmax = [1, 2, 0, 3]                      # target says 1, then 2, then 0, then 3
    assert accept_greedy(argmax, [1, 2, 0]) == (3, 3)
    assert accept_greedy(argmax, [1, 3, 0]) == (1, 2)
    assert accept_greedy(argmax, [0, 2, 0]) == (0, 1)
    assert accept_greedy(argmax[:1], []) == (0, 1)


# ============================================================================ speed levers

def test_fr_spec_trim_keeps_the_gate():
    """Draft head over the most frequent tokens of a corpus: drafts stay inside the subset and
    the output is unchanged."""
    target, prompt, ref = fixture_case("qwen35", "gguf")
    vocab = draft_vocab_from_tokens(ref + prompt, 24, target.vocab_size)
    for r in spec_check(target, prompt, N_TOKENS, (2, 8), "mtp", reference=ref, trim=vocab, trace=True):
        assert r.match, f"K={r.k}: {r.gate}"
        drafted = {d for rt in r.stats.trace for d in rt.drafts}
        assert drafted and drafted <= set(vocab.tolist())


@pytest.mark.parametrize("mode", ["round", "step"])
def test_confidence_gating_keeps_the_gate(mode):
    """A threshold at the median draft confidence gates some rounds and not others; the output
    is unchanged. ("round": a round drafts all K or none.)"""
    target, prompt, ref = fixture_case("qwen35", "gguf")
    m = target.model
    m.reset()
    seq = prompt + ref
    logits, _ = m.mtp_forward(m.normed_hidden(m.hidden_states(seq[:-1])), seq[1:])
    conf = [spec.top_probability(r) for r in logits[len(prompt) - 1:]]
    thr = float(np.median(conf))
    rows = spec_check(target, prompt, N_TOKENS, (2, 6), "mtp", reference=ref,
                      confidence=thr, confidence_mode=mode, trace=True)
    for r in rows:
        assert r.match, f"K={r.k}: {r.gate}"
        assert 0 < r.stats.gated_rounds < r.stats.rounds
        if mode == "round":                  # all of this round's K (as clamped at the end) or none
            emitted = 1
            for t in r.stats.trace:
                assert len(t.drafts) in (0, min(r.k, N_TOKENS - emitted - 1))
                emitted += t.accepted + 1


def test_per_round_depth_keeps_the_gate():
    """A depth that changes every round (0..8, as a depth table switching classes would)."""
    target, prompt, ref = fixture_case("qwen35moe", "gguf")
    depths = [3, 0, 8, 1, 5, 2, 7, 4, 6]
    k = lambda out: depths[len(out) % len(depths)]       # noqa: E731
    toks, st = speculative_generate(target, prompt, N_TOKENS, k, draft_mode="mtp")
    assert toks == ref and st.k == 8
    drafter = ScriptedDrafter(target, SamplingParams(), None, ref, len(prompt), "mixed", seed=5)
    toks, st = speculative_generate(target, prompt, N_TOKENS, k, draft_mode=drafter)
    assert toks == ref and 0 < st.accepted < st.drafted


def test_depth_table_and_content_class():
    assert content_class("def f(x):\n    return x[::-1]\n") == "code"
    assert content_class("int main() { return 0; }") == "code"
    assert content_class("Compute 3 + 4 = 7 and 12 * 3 = 36, then 2^5 = 32.") == "math"
    assert content_class("The quick brown fox jumps over the lazy dog.") == "prose"
    table = DepthTable.parse("code=6, math=4, prose=2, default=3")
    assert table.depths == {"code": 6, "math": 4, "prose": 2} and table.default == 3
    assert table.depth("for (;;) { x++; }") == 6
    fn = table.depth_fn(lambda ids: "".join(chr(97 + i % 26) + " " for i in ids), "Once upon a time")
    assert fn([1, 2, 3]) == 2
    for bad in ("code", "poetry=3", "code=9"):
        with pytest.raises(ValueError):
            DepthTable.parse(bad)


def test_draft_vocab_files(tmp_path):
    ids = draft_vocab_from_tokens([5, 5, 5, 2, 2, 9, 1, 9, 9, 9], 4, 16)
    assert ids.tolist() == [9, 5, 2, 1]
    assert draft_vocab_from_tokens([3], 3, 8).tolist() == [3, 0, 1]
    save_draft_vocab(tmp_path / "v.txt", ids)
    assert load_draft_vocab(tmp_path / "v.txt").tolist() == [9, 5, 2, 1]
    assert load_draft_vocab(tmp_path / "v.txt", size=2, vocab_size=16).tolist() == [9, 5]
    np.save(tmp_path / "v.npy", np.array([3, 1]))
    assert load_draft_vocab(str(tmp_path / "v.npy")).tolist() == [3, 1]
    (tmp_path / "bad.txt").write_text("1, 2, 2")
    with pytest.raises(ValueError, match="repeats"):
        load_draft_vocab(tmp_path / "bad.txt")
    with pytest.raises(ValueError, match="lie in"):
        load_draft_vocab(tmp_path / "v.txt", vocab_size=8)


def test_no_mtp_head_is_a_typed_error():
    from bw24nb.errors import UnsupportedArchitecture
    source = open_model(os.path.join(FIXTURES, "qwen3", "model.gguf"))
    target = ReferenceSpecTarget(ReferenceModel(source.config, load_weights(source)))
    assert not target.has_mtp
    with pytest.raises(UnsupportedArchitecture, match="no MTP head"):
        speculative_generate(target, [1, 2, 3], 4, 2, draft_mode="mtp")
    # the test drafts need no MTP head: the gate runs on any model
    ref = plain_greedy(target, [1, 2, 3], 12)
    assert all(r.match for r in spec_check(target, [1, 2, 3], 12, (1, 3), "oracle", reference=ref))


# ============================================================================ CLI

def _cli():
    import click
    from click.testing import CliRunner

    @click.group(context_settings={"auto_envvar_prefix": "BW24"})
    def main():
        pass
    spec.register_cli(main)
    return main, CliRunner()


def test_cli_spec_check_prints_the_gate_per_k():
    main, runner = _cli()
    path = os.path.join(FIXTURES, "qwen35moe", "model.gguf")
    res = runner.invoke(main, ["spec", path, "--prompt-ids", "3,17,200,5", "--check",
                               "--max-tokens", "12", "--backend", "cpu"])
    assert res.exit_code == 0, res.output
    for k in KS:
        assert f"K={k}: gate: MATCH; acceptance" in res.output
    assert "spec check over 12 tokens, K=1..8: MATCH" in res.output


def test_cli_spec_run_and_mismatch_exit(monkeypatch):
    main, runner = _cli()
    path = os.path.join(FIXTURES, "qwen35", "model.gguf")
    res = runner.invoke(main, ["spec", path, "--prompt-ids", "3 17 200 5", "--spec-k", "4",
                               "--max-tokens", "10", "--draft-mode", "mixed", "--backend", "cpu"])
    assert res.exit_code == 0, res.output
    assert "gate: MATCH" in res.output and "K=4: acceptance" in res.output
    assert any(len(line.split()) == 10 and all(w.isdigit() for w in line.split())
               for line in res.output.splitlines())       # the 10 generated ids
    # a broken acceptance rule (accept every draft) is caught and fails the command
    monkeypatch.setattr(spec, "accept_greedy", lambda argmax, drafts: (len(drafts), 0))
    res = runner.invoke(main, ["spec", path, "--prompt-ids", "3,17,200,5", "--check",
                               "--max-tokens", "8", "--draft-mode", "adversarial", "--backend", "cpu"])
    assert res.exit_code == 1 and "MISMATCH" in res.output


def test_cli_spec_levers_and_errors(tmp_path):
    """FR-Spec file, confidence gate, depth table and per-position-state rollback through the
    CLI: still MATCH; a text prompt on a checkpoint without a tokenizer is a usage error."""
    main, runner = _cli()
    path = os.path.join(FIXTURES, "qwen35", "model.gguf")
    save_draft_vocab(tmp_path / "vocab.txt", range(255, -1, -1))
    res = runner.invoke(main, ["spec", path, "--prompt-ids", "3,17,200,5", "--max-tokens", "10",
                               "--draft-vocab", "16", "--draft-vocab-file", str(tmp_path / "vocab.txt"),
                               "--confidence", "0.01", "--confidence-mode", "step",
                               "--depth-table", "code=2,prose=5", "--rollback", "states",
                               "--backend", "cpu"])
    assert res.exit_code == 0, res.output
    assert "FR-Spec: draft head over 16 of 256 tokens" in res.output
    assert "rollback: states" in res.output and "gate: MATCH" in res.output
    assert "K=5: acceptance" in res.output                  # no tokenizer: "" reads as prose
    res = runner.invoke(main, ["spec", path, "--prompt", "hello", "--backend", "cpu"])
    assert res.exit_code == 2 and "--prompt-ids" in res.output


def test_gen_speculative_streams_text_after_the_gate():
    """`bw24nb gen --spec-k K` (the lead's cli.py calls spec.gen_speculative): the streamed text
    is plain greedy's, the spec gate and the statistics are printed."""
    from bw24nb.backends import LoadedModel, ReferenceBackend

    class Tok:                                   # one character per token id
        eos_ids = {2}

        def stream_decoder(self):
            class D:
                def push(self, t):
                    return chr(0x100 + t)

                def flush(self):
                    return ""
            return D()

    target, prompt, ref = fixture_case("qwen35", "gguf")
    lm = LoadedModel(None, Tok(), ReferenceBackend(target.model, 512), 0.0)
    out, err = [], []
    stats = spec.gen_speculative(lm, prompt, 24, SamplingParams(), 3, echo=out.append, err=err.append)
    want = plain_greedy(target, prompt, 24, eos_ids=(2,))
    assert "".join(out) == "".join(chr(0x100 + t) for t in want)
    assert err[0] == "spec gate (K=3): MATCH" and "acceptance" in err[-1]
    assert stats.generated == len(want)
