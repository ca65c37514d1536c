"""Gated DeltaNet kernels (bw24nb/kernels/gated_deltanet.py) and the recurrent-state cache
(bw24nb/cache/recurrent.py) against the numpy reference (bw24nb/reference/gated_deltanet.py),
in the CUDA simulator on tiny shapes: 2 key heads, 4 value heads, d_k = d_v = 16, conv width 4.

Every output is poisoned with NaN before its launch; states start from random values (a layer
continuing a sequence), not zeros.

Tolerances (u = 2^-24, float32 unit roundoff; the reference computes in float64):
- conv: 4 products summed in float32 (<= 4 roundings of terms bounded by sum_j |w_j x_j|),
  then silu (exp, add, divide: a few ulps; |silu'| <= 1.1): |err| <= 16 u (sum |w x| + |y|).
- prep: a 16-term sum of squares (<= 16 u relative), a sqrt and 3 multiplies: 1e-5 relative
  with margin. g: float32 a + dt_bias (u relative in the softplus argument, which softplus
  turns into <= u |x| relative, |x| <= 30 here) and log1p/exp: 1e-5 relative.
- delta rule: per step each dot over d_k = 16 rows rounds ~d_k times and the update adds 2
  roundings per entry; the rule is non-expansive in the old state (|k| = 1, beta in [0, 1],
  decay <= 1), so over T steps errors add: |err| <~ T (d_k + 4) u max|S|, about 8e-6 max|S| at
  T = 7 -- we allow 2e-5 relative to the largest state/output magnitude. A wrong formula
  (missing decay, beta or the delta correction, wrong key head) moves outputs by O(1).
- whole layer: the above plus the gated RMSNorm (5e-5 in tests/test_kernels_norm.py) and the
  host output projection: 1e-4 relative to max|y|.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels.gated_deltanet import (CONV_KERNEL, QUAD_MIN_T, alloc_conv_counters,
                                           launch_conv1d_silu, launch_gated_delta_rule,
                                           launch_gated_delta_rule_norm_q8,
                                           launch_gdn_conv_rule_norm_q8,
                                           launch_gdn_conv_prep, launch_gdn_output_norm,
                                           launch_gdn_prep, rule_norm_serves)
from bw24nb.models.qwen35 import value_to_key_head
from bw24nb.reference import ops
from bw24nb.reference.gated_deltanet import (GatedDeltaNet, causal_conv1d,
                                             gated_delta_rule_chunked,
                                             gated_delta_rule_recurrent, gated_rms_norm, l2norm,
                                             softplus)

NK, NV, DK, DV = 2, 4, 16, 16
U = 2.0 ** -24
RULE_REL = 2e-5
LAYER_REL = 1e-4


def _poisoned(*shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ------------------------------------------------------------------ (a) conv


# T = 20, 37: the kernel's 16 runs of tokens hold 2 / 3 tokens each, so a run's window
# reaches into the run before it (or two back) -- in place, inputs another run overwrites
@pytest.mark.parametrize("T", [1, 2, 7, 20, 37])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
def test_conv1d_silu_matches_reference(rng, T, in_place):
    C = 2 * NK * DK + NV * DV
    x = _rand(rng, T, C, scale=2.0)
    w = _rand(rng, C, CONV_KERNEL, scale=0.5)
    state = _rand(rng, CONV_KERNEL - 1, C, scale=2.0)       # continuing a sequence
    d_x, d_state = cuda.to_device(x), cuda.to_device(state)
    d_y = d_x if in_place else _poisoned(T, C)
    launch_conv1d_silu(d_x, cuda.to_device(w), d_state, d_y)
    conv, new_state = causal_conv1d(x, w, state)
    ref = ops.silu(conv).astype(np.float64)
    y = d_y.copy_to_host()
    assert np.isfinite(y).all()
    # |err| bound of the module docstring, per element
    xp = np.concatenate([state, x]).astype(np.float64)
    mag = sum(np.abs(w[:, j].astype(np.float64) * xp[j:j + T]) for j in range(CONV_KERNEL))
    np.testing.assert_array_less(np.abs(y - ref), 16 * U * (mag + np.abs(ref)) + 1e-30)
    # the new window is the last 3 inputs, copied exactly (T = 1 keeps 2 old ones)
    np.testing.assert_array_equal(d_state.copy_to_host(), new_state)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
def test_conv1d_runs_give_the_one_token_bits(rng, in_place):
    """The T-token launch (tokens cut into runs, one warp each) must give, bit for bit, the
    outputs, saved windows and final window of T one-token launches: every output is the
    same four products summed in the same order, whichever run computes it."""
    T, C = 37, 2 * NK * DK + NV * DV + 8            # (C not a multiple of the block's 32)
    x = _rand(rng, T, C, scale=2.0)
    w = cuda.to_device(_rand(rng, C, CONV_KERNEL, scale=0.5))
    state = _rand(rng, CONV_KERNEL - 1, C, scale=2.0)
    d_x, d_state = cuda.to_device(x), cuda.to_device(state)
    d_y = d_x if in_place else _poisoned(T, C)
    steps = cuda.to_device(np.full((T, CONV_KERNEL - 1, C), np.nan, np.float32))
    launch_conv1d_silu(d_x, w, d_state, d_y, steps=steps)
    one = cuda.to_device(state)
    for t in range(T):
        y1 = _poisoned(1, C)
        launch_conv1d_silu(cuda.to_device(x[t:t + 1]), w, one, y1)
        np.testing.assert_array_equal(d_y.copy_to_host()[t].view(np.uint32),
                                      y1.copy_to_host()[0].view(np.uint32))
        np.testing.assert_array_equal(steps.copy_to_host()[t], one.copy_to_host())
    np.testing.assert_array_equal(d_state.copy_to_host(), one.copy_to_host())


def test_conv1d_state_carries_across_calls(rng):
    # Prefill 7 tokens then decode 3 one at a time == one 10-token conv from the same start.
    C = 2 * NK * DK + NV * DV
    x = _rand(rng, 10, C)
    w = _rand(rng, C, CONV_KERNEL, scale=0.5)
    state0 = _rand(rng, CONV_KERNEL - 1, C)
    d_w, d_state = cuda.to_device(w), cuda.to_device(state0)
    outs = []
    for lo, hi in ((0, 7), (7, 8), (8, 9), (9, 10)):
        d_y = _poisoned(hi - lo, C)
        launch_conv1d_silu(cuda.to_device(x[lo:hi]), d_w, d_state, d_y)
        outs.append(d_y.copy_to_host())
    conv, final = causal_conv1d(x, w, state0)
    assert _rel(np.concatenate(outs), ops.silu(conv)) < 1e-5
    np.testing.assert_array_equal(d_state.copy_to_host(), final)


# ------------------------------------------------------------------ (b) prep


@pytest.mark.parametrize("T", [1, 7])
def test_gdn_prep_matches_reference(rng, T):
    C = 2 * NK * DK + NV * DV
    qkv = _rand(rng, T, C, scale=1.5)
    a = rng.uniform(-30, 30, (T, NV)).astype(np.float32)      # both softplus tails
    b = _rand(rng, T, NV, scale=3.0)
    dt_bias = _rand(rng, NV)
    ssm_a = (-np.exp(rng.uniform(-2, 2, NV))).astype(np.float32)     # = -exp(A_log)
    q, k = _poisoned(T, NK, DK), _poisoned(T, NK, DK)
    v = _poisoned(T, NV, DV)
    g, beta = _poisoned(T, NV), _poisoned(T, NV)
    launch_gdn_prep(*(cuda.to_device(arr) for arr in (qkv, a, b, dt_bias, ssm_a)), q, k, v, g, beta)

    kd = NK * DK
    q_ref = l2norm(qkv[:, :kd].reshape(T, NK, DK)) * DK ** -0.5
    k_ref = l2norm(qkv[:, kd:2 * kd].reshape(T, NK, DK))
    g_ref = ssm_a.astype(np.float64) * softplus(a.astype(np.float64) + dt_bias)
    beta_ref = ops.sigmoid(b)
    np.testing.assert_allclose(q.copy_to_host(), q_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(k.copy_to_host(), k_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(v.copy_to_host(), qkv[:, 2 * kd:].reshape(T, NV, DV))
    np.testing.assert_allclose(g.copy_to_host(), g_ref, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(beta.copy_to_host(), beta_ref, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("T,dims,steps", [(1, (NK, NV, DK, DV), False),
                                           (3, (2, 4, 32, 16), True),
                                           (2, (1, 3, 16, 32), True),
                                           (16, (1, 4, 40, 8), True)],
                         ids=["decode", "verify3-steps", "one-key-head-3-values",
                              "sixteen-rows"])
def test_conv_prep_is_conv_then_prep(rng, T, dims, steps):
    """The fused decode launch writes what conv1d_silu then gdn_prep write -- q, k, v, g,
    beta, the conv window and its per-row copies -- bit for bit, and leaves qkv as it was."""
    nk, nv, dk, dv = dims
    C = 2 * nk * dk + nv * dv
    qkv = _rand(rng, T, C, scale=1.5)
    w = _rand(rng, C, CONV_KERNEL, scale=0.5)
    window = _rand(rng, CONV_KERNEL - 1, C)
    a = rng.uniform(-30, 30, (T, nv)).astype(np.float32)
    b = _rand(rng, T, nv, scale=3.0)
    dt_bias = _rand(rng, nv)
    ssm_a = (-np.exp(rng.uniform(-2, 2, nv))).astype(np.float32)
    gates = [cuda.to_device(arr) for arr in (a, b, dt_bias, ssm_a)]

    def outputs():
        return (_poisoned(T, nk, dk), _poisoned(T, nk, dk), _poisoned(T, nv, dv), _poisoned(T, nv),
                _poisoned(T, nv))

    # two launches
    x, st = cuda.to_device(qkv), cuda.to_device(window)
    steps_ref = _poisoned(T, CONV_KERNEL - 1, C) if steps else None
    launch_conv1d_silu(x, cuda.to_device(w), st, x, steps=steps_ref)
    want = outputs()
    launch_gdn_prep(x, *gates, *want)
    # one launch
    x2, st2 = cuda.to_device(qkv), cuda.to_device(window)
    steps_got = _poisoned(T, CONV_KERNEL - 1, C) if steps else None
    got = outputs()
    launch_gdn_conv_prep(x2, cuda.to_device(w), st2, *gates, *got, steps=steps_got)
    for name, g_, w_ in zip(("q", "k", "v", "g", "beta"), got, want):
        np.testing.assert_array_equal(g_.copy_to_host(), w_.copy_to_host(), err_msg=name)
    np.testing.assert_array_equal(st2.copy_to_host(), st.copy_to_host())
    np.testing.assert_array_equal(x2.copy_to_host(), qkv)
    if steps:
        np.testing.assert_array_equal(steps_got.copy_to_host(), steps_ref.copy_to_host())


# ------------------------------------------------------------------ (c, d) delta rule


def _rule_inputs(rng, T, dv=DV):
    """Kernel inputs as launch_gdn_prep makes them (key heads, normalised, q scaled) and the
    reference's (repeated onto value heads through key_head, q unscaled)."""
    qn = l2norm(rng.standard_normal((T, NK, DK)))
    kn = l2norm(rng.standard_normal((T, NK, DK)))
    v = _rand(rng, T, NV, dv)
    g = (-rng.uniform(0.0, 1.5, (T, NV))).astype(np.float32)        # log decay <= 0
    beta = rng.uniform(0.0, 1.0, (T, NV)).astype(np.float32)
    s0 = _rand(rng, NV, DK, dv, scale=0.5)
    q_dev = (qn * DK ** -0.5).astype(np.float32)
    k_dev = kn.astype(np.float32)
    return q_dev, k_dev, v, g, beta, s0


def _reference_rule(form, q_dev, k_dev, v, g, beta, s0, key_head, **kw):
    q = q_dev.astype(np.float64)[:, key_head] * np.sqrt(DK)            # undo the prep's scale
    k = k_dev.astype(np.float64)[:, key_head]
    return form(q, k, v, g, beta, s0, **kw)


def _bound(o_ref, s_ref):
    return RULE_REL * max(np.max(np.abs(o_ref)), np.max(np.abs(s_ref)))


@pytest.mark.parametrize("variant", ["lane", "quad", "pipe", "tile", "auto"])   # the rule kernels
@pytest.mark.parametrize("family", ["qwen35", "qwen3next"])      # tiled / grouped head maps
def test_delta_rule_decode_steps_match_recurrent(rng, family, variant):
    T = 4
    key_head = value_to_key_head(family, NK, NV)
    q, k, v, g, beta, s0 = _rule_inputs(rng, T)
    d_state = cuda.to_device(s0)
    d_kh = cuda.to_device(key_head.astype(np.int32))
    outs = []
    for t in range(T):                           # one launch per decode step, state in place
        o = _poisoned(1, NV, DV)
        launch_gated_delta_rule(*(cuda.to_device(a[t:t + 1]) for a in (q, k, v, g, beta)),
                                d_kh, d_state, o, variant=variant)
        outs.append(o.copy_to_host())
    o_ref, s_ref = _reference_rule(gated_delta_rule_recurrent, q, k, v, g, beta, s0, key_head)
    out, state = np.concatenate(outs), d_state.copy_to_host()
    assert np.isfinite(out).all() and np.isfinite(state).all()
    tol = _bound(o_ref, s_ref)
    assert np.max(np.abs(out - o_ref)) <= tol
    assert np.max(np.abs(state - s_ref)) <= tol


@pytest.mark.parametrize("variant", ["lane", "quad", "pipe", "tile", "auto"])   # the rule kernels
@pytest.mark.parametrize("T", [1, 7])
def test_delta_rule_prefill_matches_chunked(rng, T, variant):
    key_head = value_to_key_head("qwen35", NK, NV)
    q, k, v, g, beta, s0 = _rule_inputs(rng, T)
    d_state = cuda.to_device(s0)
    o = _poisoned(T, NV, DV)
    launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)),
                            cuda.to_device(key_head.astype(np.int32)), d_state, o, variant=variant)
    out, state = o.copy_to_host(), d_state.copy_to_host()
    assert np.isfinite(out).all()
    # the reference's prefill form: chunk 64 (one partial chunk) and chunk 3 (several chunks)
    for chunk in (64, 3):
        o_ref, s_ref = _reference_rule(gated_delta_rule_chunked, q, k, v, g, beta, s0, key_head,
                                       chunk_size=chunk)
        tol = _bound(o_ref, s_ref)
        assert np.max(np.abs(out - o_ref)) <= tol, f"chunk {chunk}"
        assert np.max(np.abs(state - s_ref)) <= tol, f"chunk {chunk}"


@pytest.mark.parametrize("variant", ["lane", "quad", "pipe", "tile", "auto"])   # the rule kernels
def test_delta_rule_wide_value_heads(rng, variant):
    # d_v = 40: two column blocks per head, the second only partly filled.
    T, dv = 2, 40
    key_head = value_to_key_head("qwen35", NK, NV)
    q, k, v, g, beta, s0 = _rule_inputs(rng, T, dv)
    d_state = cuda.to_device(s0)
    o = _poisoned(T, NV, dv)
    launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)),
                            cuda.to_device(key_head.astype(np.int32)), d_state, o, variant=variant)
    o_ref, s_ref = _reference_rule(gated_delta_rule_recurrent, q, k, v, g, beta, s0, key_head)
    tol = _bound(o_ref, s_ref)
    assert np.max(np.abs(o.copy_to_host() - o_ref)) <= tol
    assert np.max(np.abs(d_state.copy_to_host() - s_ref)) <= tol


# ------------------------------------------------------------------ the whole mixer


class _Cfg:
    family = "qwen35"
    rms_norm_eps = 1e-6
    linear_num_key_heads, linear_num_value_heads = NK, NV
    linear_key_head_dim, linear_value_head_dim = DK, DV
    linear_conv_kernel_dim = CONV_KERNEL


def _random_layer(rng, H):
    kd, vd = NK * DK, NV * DV
    p = "blk.0."
    w = {p + "attn_qkv.weight": _rand(rng, 2 * kd + vd, H, scale=H ** -0.5),
         p + "attn_gate.weight": _rand(rng, vd, H, scale=H ** -0.5),
         p + "ssm_beta.weight": _rand(rng, NV, H, scale=H ** -0.5),
         p + "ssm_alpha.weight": _rand(rng, NV, H, scale=H ** -0.5),
         p + "ssm_conv1d.weight": _rand(rng, 2 * kd + vd, CONV_KERNEL, scale=0.5),
         p + "ssm_dt.bias": _rand(rng, NV),
         p + "ssm_a": (-np.exp(rng.uniform(-2, 1, NV))).astype(np.float32),
         p + "ssm_norm.weight": (1 + 0.1 * rng.standard_normal(DV)).astype(np.float32),
         p + "ssm_out.weight": _rand(rng, H, vd, scale=vd ** -0.5)}
    return GatedDeltaNet(_Cfg(), w, 0)


class _DeviceMixer:
    """The kernel chain of one layer; projections on the host (they are the matvec kernels'
    business, tested elsewhere), everything between them on the device."""

    def __init__(self, ref: GatedDeltaNet, conv_state, ssm_state):
        self.ref = ref
        self.conv_w = cuda.to_device(ref.conv_w)
        self.dt_bias, self.ssm_a = cuda.to_device(ref.dt_bias), cuda.to_device(ref.ssm_a)
        self.norm_w = cuda.to_device(ref.norm_w)
        self.key_head = cuda.to_device(ref.key_head.astype(np.int32))
        self.conv_state, self.ssm_state = cuda.to_device(conv_state), cuda.to_device(ssm_state)

    def __call__(self, x):
        r, T = self.ref, x.shape[0]
        qkv = cuda.to_device(ops.linear(x, r.w_qkv))
        z = ops.linear(x, r.w_z).reshape(T, NV, DV)
        a, b = ops.linear(x, r.w_alpha), ops.linear(x, r.w_beta)
        conv = _poisoned(*qkv.shape)
        launch_conv1d_silu(qkv, self.conv_w, self.conv_state, conv)
        q, k, v = _poisoned(T, NK, DK), _poisoned(T, NK, DK), _poisoned(T, NV, DV)
        g, beta = _poisoned(T, NV), _poisoned(T, NV)
        launch_gdn_prep(conv, cuda.to_device(a), cuda.to_device(b), self.dt_bias, self.ssm_a,
                        q, k, v, g, beta)
        o = _poisoned(T, NV, DV)
        launch_gated_delta_rule(q, k, v, g, beta, self.key_head, self.ssm_state, o)
        y = _poisoned(T, NV, DV)
        launch_gdn_output_norm(o, cuda.to_device(z), self.norm_w, r.eps, y)
        return ops.linear(y.copy_to_host().reshape(T, NV * DV), r.w_out)


def test_mixer_prefill_then_decode_matches_reference_layer(rng):
    H = 32
    ref = _random_layer(rng, H)
    ref.conv_state = _rand(rng, *ref.conv_state.shape)          # mid-sequence states
    ref.ssm_state = _rand(rng, *ref.ssm_state.shape, scale=0.5)
    dev = _DeviceMixer(ref, ref.conv_state, ref.ssm_state)
    x = _rand(rng, 9, H)
    got = [dev(x[:7])] + [dev(x[t:t + 1]) for t in (7, 8)]
    want = [ref.prefill(x[:7])] + [ref.decode(x[t])[None] for t in (7, 8)]
    for step, (a, b) in enumerate(zip(got, want)):
        assert np.isfinite(a).all()
        assert _rel(a, b) <= LAYER_REL, f"call {step}"
    assert _rel(dev.ssm_state.copy_to_host(), ref.ssm_state) <= RULE_REL
    np.testing.assert_array_equal(dev.conv_state.copy_to_host(), ref.conv_state)


def test_output_norm_is_gated_rms_norm(rng):
    T = 3
    o, z = _rand(rng, T, NV, DV), _rand(rng, T, NV, DV, scale=2.0)
    w = (1 + 0.1 * rng.standard_normal(DV)).astype(np.float32)
    y = _poisoned(T, NV, DV)
    launch_gdn_output_norm(cuda.to_device(o), cuda.to_device(z), cuda.to_device(w), 1e-6, y)
    np.testing.assert_allclose(y.copy_to_host(), gated_rms_norm(o, z, w, 1e-6), rtol=5e-5, atol=1e-7)


# ------------------------------------------------------------------ recurrent state cache


def _hybrid_config():
    from bw24nb.formats.config import ModelConfig, layer_types_from_interval
    return ModelConfig(family="qwen35", vocab_size=16, hidden_size=32, num_hidden_layers=6,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       intermediate_size=64, rms_norm_eps=1e-6, rope_theta=1e4,
                       max_position_embeddings=64, layer_types=layer_types_from_interval(6, 3),
                       linear_num_key_heads=NK, linear_num_value_heads=NV,
                       linear_key_head_dim=DK, linear_value_head_dim=DV,
                       linear_conv_kernel_dim=CONV_KERNEL)


def _fill_random(rs, rng):
    vals = {}
    for layer in rs.layers:
        c, s = _rand(rng, *rs.conv_shape), _rand(rng, *rs.ssm_shape)
        rs.conv[layer].copy_to_device(c)
        rs.ssm[layer].copy_to_device(s)
        vals[layer] = (c, s)
    return vals


def test_recurrent_state_layout_and_bytes():
    from bw24nb.cache.recurrent import RecurrentState, recurrent_state_bytes
    cfg = _hybrid_config()                       # layers 2 and 5 are full attention
    rs = RecurrentState(cfg)
    assert rs.layers == [0, 1, 3, 4]
    conv_dim = 2 * NK * DK + NV * DV
    assert rs.conv_shape == (CONV_KERNEL - 1, conv_dim) and rs.ssm_shape == (NV, DK, DV)
    per_layer = 4 * ((CONV_KERNEL - 1) * conv_dim + NV * DK * DV)
    assert recurrent_state_bytes(cfg) == rs.nbytes == 4 * per_layer
    assert recurrent_state_bytes(cfg, snapshots=1) == 8 * per_layer
    with pytest.raises(KeyError):
        rs.slot(2)
    for layer in rs.layers:                      # allocated zeroed, as the reference's reset()
        conv, ssm = rs.read(layer)
        assert not conv.any() and not ssm.any()


def test_recurrent_state_reset_snapshot_restore(rng):
    from bw24nb.cache.recurrent import RecurrentState
    rs = RecurrentState(_hybrid_config())
    before = _fill_random(rs, rng)
    snap = rs.snapshot()
    after = _fill_random(rs, rng)                # the step we will roll back
    for layer in rs.layers:
        np.testing.assert_array_equal(rs.read(layer)[1], after[layer][1])
    rs.restore(snap)
    for layer in rs.layers:
        conv, ssm = rs.read(layer)
        np.testing.assert_array_equal(conv, before[layer][0])
        np.testing.assert_array_equal(ssm, before[layer][1])
    # one layer only: the others keep their newer values
    buf = rs.new_snapshot()
    rs.snapshot(into=buf, layers=[3])
    newer = _fill_random(rs, rng)
    rs.restore(buf)
    for layer in rs.layers:
        want = before[layer] if layer == 3 else newer[layer]
        np.testing.assert_array_equal(rs.read(layer)[0], want[0])
        np.testing.assert_array_equal(rs.read(layer)[1], want[1])
    with pytest.raises(ValueError):
        rs.restore(buf, layers=[0])              # the buffer holds no copy of layer 0
    rs.reset()
    for layer in rs.layers:
        conv, ssm = rs.read(layer)
        assert not conv.any() and not ssm.any()


def test_recurrent_rollback_replays_from_a_graph(rng):
    # snapshot + delta-rule step + restore, captured once and replayed: the state ends where it
    # started, and the step's output is the same at every replay.
    from bw24nb.cache.recurrent import RecurrentState
    from bw24nb.graph import CudaGraph
    rs = RecurrentState(_hybrid_config(), layers=[0])
    start = _fill_random(rs, rng)
    q, k, v, g, beta, _ = _rule_inputs(rng, 1)
    ins = [cuda.to_device(a) for a in (q, k, v, g, beta)]
    kh = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    o = _poisoned(1, NV, DV)
    buf = rs.new_snapshot()
    stream = cuda.stream()

    def step():
        rs.snapshot(into=buf, stream=stream)
        launch_gated_delta_rule(*ins, kh, rs.ssm[0], o, stream=stream)
        rs.restore(buf, stream=stream)

    step()                                       # warm-up (compiles, loads) before capture
    stream.synchronize()
    o_first = o.copy_to_host()
    with CudaGraph.capture(stream) as graph:
        step()
    for _ in range(2):
        o.copy_to_device(np.full((1, NV, DV), np.nan, np.float32))
        graph.replay()
        stream.synchronize()
        np.testing.assert_array_equal(o.copy_to_host(), o_first)
        np.testing.assert_array_equal(rs.read(0)[1], start[0][1])
    o_ref, _ = _reference_rule(gated_delta_rule_recurrent, q, k, v, g, beta, start[0][1],
                               value_to_key_head("qwen35", NK, NV))
    assert np.max(np.abs(o_first - o_ref)) <= RULE_REL * np.max(np.abs(o_ref))


def test_step_states_equal_one_token_launches_and_restore(rng):
    """A speculative verify runs T tokens in one launch of each GDN kernel with `steps`: the
    state after token t must be bit-identical to t + 1 one-token launches (the decode steps),
    and RecurrentState.restore_step must put exactly that back."""
    from bw24nb.cache.recurrent import RecurrentState
    T = 3
    cfg = _hybrid_config()
    rs = RecurrentState(cfg)
    layer = rs.layers[1]
    key_head = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    q, k, v, g, beta, s0 = _rule_inputs(rng, T)
    C = rs.conv_shape[1]
    x = _rand(rng, T, C)
    w = _rand(rng, C, CONV_KERNEL)
    c0 = _rand(rng, *rs.conv_shape)
    # one-token launches: the decode steps' states
    conv1, ssm1 = cuda.to_device(c0), cuda.to_device(s0)
    want = []
    for t in range(T):
        launch_conv1d_silu(cuda.to_device(x[t:t + 1]), cuda.to_device(w), conv1, _poisoned(1, C))
        launch_gated_delta_rule(*(cuda.to_device(a[t:t + 1]) for a in (q, k, v, g, beta)),
                                key_head, ssm1, _poisoned(1, NV, DV))
        want.append((conv1.copy_to_host(), ssm1.copy_to_host()))
    # one launch over T tokens, keeping every step, into the layer's slot of the whole state
    steps = rs.new_step_states(T + 1)                  # more rows than used is fine
    rs.conv[layer].copy_to_device(c0)
    rs.ssm[layer].copy_to_device(s0)
    conv_steps, ssm_steps = steps.layer(layer)
    launch_conv1d_silu(cuda.to_device(x), cuda.to_device(w), rs.conv[layer], _poisoned(T, C),
                       steps=conv_steps)
    launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)), key_head,
                            rs.ssm[layer], _poisoned(T, NV, DV), steps=ssm_steps)
    for t in range(T):
        np.testing.assert_array_equal(steps.conv[t, rs.slot(layer)].copy_to_host(), want[t][0])
        np.testing.assert_array_equal(steps.ssm[t, rs.slot(layer)].copy_to_host(), want[t][1])
    rs.restore_step(steps, 0)
    conv, ssm = rs.read(layer)
    np.testing.assert_array_equal(conv, want[0][0])
    np.testing.assert_array_equal(ssm, want[0][1])
    with pytest.raises(ValueError, match="steps"):
        launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)), key_head,
                                rs.ssm[layer], _poisoned(T, NV, DV), steps=ssm_steps[:2])


@pytest.mark.parametrize("variant", ["lane", "quad", "pipe", "tile", "auto"])
def test_delta_rule_saved_steps_are_the_one_token_states(rng, variant):
    """steps[t] (a speculative verify's rollback points) must be, bit for bit, the state that
    t + 1 one-token launches leave -- each kernel runs the same arithmetic per token whatever
    T is -- and the T-token launch's outputs those launches' outputs."""
    T = 5
    key_head = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    q, k, v, g, beta, s0 = _rule_inputs(rng, T)
    d_state = cuda.to_device(s0)
    o = _poisoned(T, NV, DV)
    steps = cuda.to_device(np.full((T, NV, DK, DV), np.nan, np.float32))
    launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)), key_head,
                            d_state, o, steps=steps, variant=variant)
    one = cuda.to_device(s0)
    for t in range(T):
        o1 = _poisoned(1, NV, DV)
        launch_gated_delta_rule(*(cuda.to_device(a[t:t + 1]) for a in (q, k, v, g, beta)),
                                key_head, one, o1, variant=variant)
        np.testing.assert_array_equal(steps.copy_to_host()[t].view(np.uint32),
                                      one.copy_to_host().view(np.uint32))
        np.testing.assert_array_equal(o.copy_to_host()[t].view(np.uint32),
                                      o1.copy_to_host()[0].view(np.uint32))
    np.testing.assert_array_equal(d_state.copy_to_host().view(np.uint32),
                                  one.copy_to_host().view(np.uint32))


@pytest.mark.parametrize("dv, T", [(DV, 1), (DV, 2), (DV, 5), (40, 5), (DV, QUAD_MIN_T + 1)])
def test_delta_rule_quad_gives_the_lane_kernels_bits(rng, dv, T):
    """The quad kernel (8 lanes a column, warp_sum8, the next token's inputs loaded a step
    ahead) sums each dot in the lane kernel's order, so outputs, saved steps and the final
    state are the lane kernel's, bit for bit (d_v = 40: a partly filled column block); so are
    the pipe kernel's (quad's passes of two tokens in one loop; T = 1, 2, odd and even) and
    "auto"'s, which takes PREFILL_RULE's kernel from QUAD_MIN_T tokens on."""
    key_head = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    q, k, v, g, beta, s0 = _rule_inputs(rng, T, dv)
    got = []
    for variant in ("lane", "quad", "pipe", "auto"):
        d_state = cuda.to_device(s0)
        o = _poisoned(T, NV, dv)
        steps = cuda.to_device(np.full((T, NV, DK, dv), np.nan, np.float32))
        launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)), key_head,
                                d_state, o, steps=steps, variant=variant)
        got.append([a.copy_to_host().view(np.uint32) for a in (o, steps, d_state)])
    for lane, *others in zip(*got):
        for other in others:
            np.testing.assert_array_equal(other, lane)


@pytest.mark.parametrize("own_warp, preload", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("dv, T, save", [(32, 1, False), (64, 3, True), (128, 2, False),
                                         (96, 5, True)])
def test_rule_with_the_output_norm_is_the_two_launches(rng, dv, T, save, own_warp, preload,
                                                       monkeypatch):
    """launch_gated_delta_rule_norm_q8 (decode / verify: the lane kernel's columns on one block
    a value head, warp 0 norming each token's head -- on its own, or beside the first columns;
    verify's tokens' inputs preloaded into shared memory or read in each step) leaves, bit for
    bit, what the lane rule and then the gated q8 output norm leave: the normed o, its int8
    codes and scales, the saved steps and the final state (d_v = 96: a head of 6 column warps,
    slots past the row clamped; T > 1: the two shared rows used in turn)."""
    from bw24nb.kernels import gated_deltanet
    monkeypatch.setattr(gated_deltanet, "RULE_NORM_OWN_WARP", own_warp)
    monkeypatch.setattr(gated_deltanet, "RULE_NORM_PRELOAD", preload)
    monkeypatch.setattr(gated_deltanet, "RULE_NORM_PRELOAD_T", 3)   # T = 5: read in the steps
    assert rule_norm_serves(DK, dv) and not rule_norm_serves(DK, 16)
    key_head = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    q, k, v, g, beta, s0 = _rule_inputs(rng, T, dv)
    z = _rand(rng, T, NV, dv, scale=2.0)
    w = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    eps, n = 1e-6, T * NV * dv
    ins = [cuda.to_device(a) for a in (q, k, v, g, beta)]
    got = []
    for fused in (False, True):
        d_state = cuda.to_device(s0)
        o = _poisoned(T, NV, dv)
        xq = cuda.to_device(np.full(n, -128, np.int8))
        xd = cuda.to_device(np.full(n // 32, np.nan, np.float32))
        steps = cuda.to_device(np.full((T, NV, DK, dv), np.nan, np.float32)) if save else None
        if fused:
            launch_gated_delta_rule_norm_q8(*ins, key_head, d_state, o, cuda.to_device(z),
                                            cuda.to_device(w), eps, xq, xd, steps=steps)
        else:
            launch_gated_delta_rule(*ins, key_head, d_state, o, steps=steps, variant="lane")
            launch_gdn_output_norm(o, cuda.to_device(z), cuda.to_device(w), eps, o, xq=xq,
                                   xd=xd)
        got.append([a.copy_to_host().view(np.uint8 if a.dtype == np.int8 else np.uint32)
                    for a in (o, xq, xd, d_state) + ((steps,) if save else ())])
    assert not np.isnan(got[0][0].view(np.float32)).any()
    for apart, fused in zip(*got):
        np.testing.assert_array_equal(fused, apart)
    # and the normed output is the reference's layer output (gated norm of the recurrence)
    o_ref, _ = _reference_rule(gated_delta_rule_recurrent, q, k, v, g, beta, s0,
                               value_to_key_head("qwen35", NK, NV))
    y_ref = gated_rms_norm(o_ref.astype(np.float32), z, w, eps)
    assert _rel(got[1][0].view(np.float32), y_ref) < 1e-4


def test_rule_with_the_output_norm_rejects_what_it_cannot_take(rng):
    q, k, v, g, beta, s0 = _rule_inputs(rng, 1, 40)
    key_head = cuda.to_device(value_to_key_head("qwen35", NK, NV).astype(np.int32))
    with pytest.raises(ValueError, match="d_v 40"):
        launch_gated_delta_rule_norm_q8(
            *(cuda.to_device(a) for a in (q, k, v, g, beta)), key_head, cuda.to_device(s0),
            _poisoned(1, NV, 40), _poisoned(1, NV, 40), _poisoned(40), 1e-6,
            cuda.to_device(np.zeros(NV * 40, np.int8)), _poisoned(NV * 40 // 32))


@pytest.mark.parametrize("T,dims,save", [(1, (2, 4, 16, 32), False),
                                         (1, (2, 4, 32, 64), True),
                                         (1, (1, 3, 16, 32), True),
                                         (1, (2, 2, 8, 96), True)],
                         ids=["decode", "decode-steps", "three-heads-one-key-head",
                              "one-head-a-key-head"])
def test_conv_in_the_rule_norm_is_conv_prep_then_rule_norm(rng, T, dims, save):
    """launch_gdn_conv_rule_norm_q8 (decode, one token: gdn_conv_prep's conv, norms and gates run by each
    value head's block in the rule-norm launch's preload) leaves, bit for bit, what
    launch_gdn_conv_prep then launch_gated_delta_rule_norm_q8 leave: the normed o, its int8
    codes and scales, the recurrent state and its steps, the conv window and its steps, qkv
    unchanged; the key heads' counters back at zero, so a second launch does the same. With
    three value heads on one key head, three blocks read its window and the last stores it;
    with one a key head, no block waits for a count."""
    nk, nv, dk, dv = dims
    C = 2 * nk * dk + nv * dv
    qkv = _rand(rng, T, C, scale=1.5)
    w_conv = _rand(rng, C, CONV_KERNEL, scale=0.5)
    window = _rand(rng, CONV_KERNEL - 1, C)
    ab = np.concatenate([_rand(rng, T, nv, scale=3.0),
                         rng.uniform(-30, 30, (T, nv)).astype(np.float32)], axis=1)
    dt_bias = _rand(rng, nv)
    ssm_a = (-np.exp(rng.uniform(-2, 2, nv))).astype(np.float32)
    s0 = _rand(rng, nv, dk, dv, scale=0.5)
    z = _rand(rng, T, nv, dv, scale=2.0)
    w_norm = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    eps, n = 1e-6, T * nv * dv
    consts = [cuda.to_device(a) for a in (w_conv, dt_bias, ssm_a, w_norm)]
    counters = alloc_conv_counters(nk)

    def run(fused, rounds=1):
        x, win, state = (cuda.to_device(a) for a in (qkv, window, s0))
        d_ab = cuda.to_device(ab)
        b, a = d_ab[:, :nv], d_ab[:, nv:]            # row-strided views, as the engine's
        o = _poisoned(T, nv, dv)
        xq = cuda.to_device(np.full(n, -128, np.int8))
        xd = _poisoned(n // 32)
        steps = _poisoned(T, nv, dk, dv) if save else None
        conv_steps = _poisoned(T, CONV_KERNEL - 1, C) if save else None
        for _ in range(rounds):
            if fused:
                launch_gdn_conv_rule_norm_q8(x, consts[0], win, a, b, consts[1], consts[2],
                                             key_head, state, o, cuda.to_device(z), consts[3],
                                             eps, xq, xd, counters, conv_steps=conv_steps,
                                             steps=steps)
            else:
                q, k, v = _poisoned(T, nk, dk), _poisoned(T, nk, dk), _poisoned(T, nv, dv)
                g, beta = _poisoned(T, nv), _poisoned(T, nv)
                launch_gdn_conv_prep(x, consts[0], win, a, b, consts[1], consts[2], q, k, v, g,
                                     beta, steps=conv_steps)
                launch_gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o,
                                                cuda.to_device(z), consts[3], eps, xq, xd,
                                                steps=steps)
        outs = (o, xq, xd, state, win, x) + ((steps, conv_steps) if save else ())
        return [arr.copy_to_host().view(np.uint8 if arr.dtype == np.int8 else np.uint32)
                for arr in outs]

    apart, fused = run(False), run(True)
    assert not np.isnan(apart[0].view(np.float32)).any()
    names = ("o", "xq", "xd", "state", "conv window", "qkv", "steps", "conv steps")
    for name, f, a in zip(names, fused, apart):
        np.testing.assert_array_equal(f, a, err_msg=name)
    np.testing.assert_array_equal(fused[5].view(np.float32), qkv)
    np.testing.assert_array_equal(counters.copy_to_host(), 0)
    # two steps in a row (the window and state carried; the counters reused)
    for name, f, a in zip(names, run(True, 2), run(False, 2)):
        np.testing.assert_array_equal(f, a, err_msg=f"second step: {name}")
    np.testing.assert_array_equal(counters.copy_to_host(), 0)


def test_conv_in_the_rule_norm_rejects_what_it_cannot_take(rng):
    nk, nv, dk, dv = 2, 4, 16, 32
    C = 2 * nk * dk + nv * dv
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    args = dict(qkv=_poisoned(1, C), conv_w=_poisoned(C, CONV_KERNEL),
                conv_state=_poisoned(CONV_KERNEL - 1, C), a=_poisoned(1, nv), b=_poisoned(1, nv),
                dt_bias=_poisoned(nv), ssm_a=_poisoned(nv), key_head=key_head,
                state=_poisoned(nv, dk, dv), o=_poisoned(1, nv, dv), z=_poisoned(1, nv, dv),
                norm_w=_poisoned(dv), eps=1e-6, xq=cuda.to_device(np.zeros(nv * dv, np.int8)),
                xd=_poisoned(nv * dv // 32), counters=alloc_conv_counters(nk))
    for change, match in [(dict(conv_state=_poisoned(CONV_KERNEL - 1, C + 1)), "window"),
                          (dict(a=_poisoned(2, nv)), "a / b"),
                          (dict(counters=cuda.to_device(np.zeros(1, np.int32))), "counters"),
                          (dict(state=_poisoned(nv, dk, 40), o=_poisoned(1, nv, 40)), "d_v 40"),
                          (dict(xd=_poisoned(1)), "xq must be"),
                          (dict(qkv=_poisoned(2, C), a=_poisoned(2, nv), b=_poisoned(2, nv),
                                o=_poisoned(2, nv, dv), z=_poisoned(2, nv, dv)), "one token")]:
        with pytest.raises(ValueError, match=match):
            launch_gdn_conv_rule_norm_q8(**{**args, **change})
