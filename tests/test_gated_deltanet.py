"""Gated DeltaNet reference (bw24nb/reference/gated_deltanet.py) against itself and transformers.

- the chunked prefill form equals the recurrent decode form (any length, any starting state);
- both equal HF's own `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`;
- the conv equals HF's `causal_conv1d_fn` / `causal_conv1d_update`;
- a whole layer, fed HF weights through our HF->internal conversion (value-head reorder,
  qkvz split, A_log -> -exp), equals HF's `Qwen3_5GatedDeltaNet` / `Qwen3NextGatedDeltaNet`
  module, including when we prefill part of the sequence and decode the rest.

Tolerances: our math is float64, HF's float32. Errors of float32 over a few hundred
multiply-adds are ~1e-6 relative; 1e-5 (the brief's bound for chunked vs recurrent, both ours)
and 2e-5 (against float32 torch) leave headroom without hiding a wrong formula, which moves the
output by O(1) relative.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bw24nb.formats.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig  # noqa: E402
from bw24nb.models.qwen35 import HF_NAME_RULES, convert_hf, reorder_v_heads, value_to_key_head  # noqa: E402
from bw24nb.models.weights import Weights, compile_rules, map_name  # noqa: E402
from bw24nb.reference.gated_deltanet import (  # noqa: E402
    GatedDeltaNet, causal_conv1d, gated_delta_rule_chunked, gated_delta_rule_recurrent, l2norm)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def random_rule_inputs(rng, T, nk, nv, dk, dv):
    """q, k in HF's shape (key heads, un-normalised), v, a realistic decay and beta."""
    q = rng.standard_normal((T, nk, dk))
    k = rng.standard_normal((T, nk, dk))
    v = rng.standard_normal((T, nv, dv))
    g = -rng.uniform(0.0, 1.5, size=(T, nv))                 # log decay <= 0, some near 0
    beta = rng.uniform(0.0, 1.0, size=(T, nv))
    return q, k, v, g, beta


def prepare(q, k, nv):
    """L2-normalise and repeat key heads onto value heads in HF's grouped order."""
    r = nv // q.shape[1]
    return np.repeat(l2norm(q), r, axis=1), np.repeat(l2norm(k), r, axis=1)


@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 131])
def test_chunked_equals_recurrent(rng, T):
    nk, nv, dk, dv = 2, 4, 8, 6
    q, k, v, g, beta = random_rule_inputs(rng, T, nk, nv, dk, dv)
    qe, ke = prepare(q, k, nv)
    s0 = rng.standard_normal((nv, dk, dv)) * 0.5              # continuing, not starting fresh
    o_r, s_r = gated_delta_rule_recurrent(qe, ke, v, g, beta, s0)
    o_c, s_c = gated_delta_rule_chunked(qe, ke, v, g, beta, s0)
    assert rel_err(o_c, o_r) <= 1e-5
    assert rel_err(s_c, s_r) <= 1e-5
    # a different chunk size is the same function too (exercises many partial chunks)
    o_7, s_7 = gated_delta_rule_chunked(qe, ke, v, g, beta, s0, chunk_size=7)
    assert rel_err(o_7, o_r) <= 1e-5 and rel_err(s_7, s_r) <= 1e-5


def test_recurrent_by_hand_one_step():
    """One step from a known state, worked out with the formula in the docstring."""
    q = np.array([[[1.0, 0.0]]])                              # [T=1, H=1, dk=2]
    k = np.array([[[0.6, 0.8]]])
    v = np.array([[[2.0, -1.0, 0.5]]])
    g = np.array([[np.log(0.5)]])
    beta = np.array([[0.25]])
    S0 = np.arange(6, dtype=np.float64).reshape(1, 2, 3)      # [[0,1,2],[3,4,5]]
    S = 0.5 * S0[0]
    pred = k[0, 0] @ S                                        # S^T k
    S = S + np.outer(k[0, 0], 0.25 * (v[0, 0] - pred))
    expect = (q[0, 0] / np.sqrt(2.0)) @ S
    o, S1 = gated_delta_rule_recurrent(q, k, v, g, beta, S0)
    np.testing.assert_allclose(o[0, 0], expect, rtol=1e-12)
    np.testing.assert_allclose(S1[0], S, rtol=1e-12)


@pytest.mark.parametrize("T", [3, 64, 77])
def test_rules_match_transformers(rng, T):
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)
    nk, nv, dk, dv = 2, 4, 16, 8
    q, k, v, g, beta = random_rule_inputs(rng, T, nk, nv, dk, dv)
    s0 = rng.standard_normal((nv, dk, dv)) * 0.5
    t = lambda a: torch.tensor(a[None], dtype=torch.float32)   # noqa: E731  add batch dim
    args = (t(q), t(k), t(v), t(g), t(beta))
    hf_c, hf_cs = torch_chunk_gated_delta_rule(*args, initial_state=t(s0), output_final_state=True,
                                               use_qk_l2norm_in_kernel=True)
    hf_r, hf_rs = torch_recurrent_gated_delta_rule(*args, initial_state=t(s0), output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
    qe, ke = prepare(q, k, nv)
    o_c, s_c = gated_delta_rule_chunked(qe, ke, v, g, beta, s0)
    o_r, s_r = gated_delta_rule_recurrent(qe, ke, v, g, beta, s0)
    assert rel_err(o_c, hf_c[0].numpy()) <= 2e-5
    assert rel_err(s_c, hf_cs[0].numpy()) <= 2e-5
    assert rel_err(o_r, hf_r[0].numpy()) <= 2e-5
    assert rel_err(s_r, hf_rs[0].numpy()) <= 2e-5


def test_conv_matches_transformers(rng):
    from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn, causal_conv1d_update
    T, C, K = 9, 5, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    hf = causal_conv1d_fn(torch.tensor(x.T[None]), torch.tensor(w), None, activation=None)[0].numpy().T
    y, state = causal_conv1d(x, w)
    assert rel_err(y, hf) <= 1e-6
    np.testing.assert_array_equal(state, x[-(K - 1):])
    # one more token through the rolling state == HF's update kernel (HF keeps K inputs)
    x1 = rng.standard_normal((1, C)).astype(np.float32)
    hf_state = torch.tensor(np.concatenate([np.zeros((1, C), np.float32), x[-(K - 1):]]).T[None].copy())
    hf1 = causal_conv1d_update(torch.tensor(x1.T[None]), hf_state, torch.tensor(w), None, None)[0].numpy().T
    y1, _ = causal_conv1d(x1, w, state)
    assert rel_err(y1, hf1) <= 1e-6


def test_reorder_v_heads_is_the_tiled_order():
    """nk=2 groups of r=3 value heads, head_dim 1: grouped [g0v0 g0v1 g0v2 g1v0 g1v1 g1v2]
    -> tiled [g0v0 g1v0 g0v1 g1v1 g0v2 g1v2]; and value_to_key_head agrees."""
    grouped = np.array([0, 1, 2, 10, 11, 12])                 # 10*g + v
    np.testing.assert_array_equal(reorder_v_heads(grouped, 0, 2, 6, 1), [0, 10, 1, 11, 2, 12])
    np.testing.assert_array_equal(value_to_key_head("qwen35", 2, 6), [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(value_to_key_head("qwen3next", 2, 6), [0, 0, 0, 1, 1, 1])


# ---------------------------------------------------------------------------------------------
# Whole layer against the transformers module

def tiny_config(family, nk=2, nv=4, dk=8, dv=8, hidden=32):
    return ModelConfig(
        family=family, vocab_size=16, hidden_size=hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=16,
        rms_norm_eps=1e-6, rope_theta=1e7, max_position_embeddings=128,
        layer_types=[LINEAR_ATTENTION, FULL_ATTENTION], linear_num_key_heads=nk,
        linear_num_value_heads=nv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=4)


def hf_layer(family, cfg, seed):
    torch.manual_seed(seed)
    common = dict(hidden_size=cfg.hidden_size, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, linear_num_key_heads=cfg.linear_num_key_heads,
                  linear_num_value_heads=cfg.linear_num_value_heads,
                  linear_key_head_dim=cfg.linear_key_head_dim,
                  linear_value_head_dim=cfg.linear_value_head_dim, linear_conv_kernel_dim=4,
                  layer_types=["linear_attention", "full_attention"], rms_norm_eps=1e-6, vocab_size=16)
    if family == "qwen3next":
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as GDN
        hf_cfg = Qwen3NextConfig(**common)
    else:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as GDN
        hf_cfg = Qwen3_5TextConfig(**common)
    layer = GDN(hf_cfg, 0).float().eval()
    with torch.no_grad():   # make every parameter matter: non-trivial norm weight and dt bias
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.dt_bias.uniform_(-1.0, 1.0)
        layer.A_log.copy_(torch.log(torch.empty_like(layer.A_log).uniform_(0.05, 2.0)))
    return layer


def internal_weights(layer, cfg):
    """The HF module's parameters under checkpoint names -> our rename + convert_hf."""
    rules = compile_rules(HF_NAME_RULES)
    w = Weights()
    for name, p in layer.state_dict().items():
        internal = map_name(f"model.layers.0.linear_attn.{name}", rules)
        assert internal is not None, name
        w[internal] = p.detach().numpy().astype(np.float32)
    return convert_hf(w, cfg)


@pytest.mark.parametrize("family,nk,nv", [("qwen35", 2, 4), ("qwen35", 2, 2), ("qwen3next", 2, 6)])
def test_layer_matches_transformers(rng, family, nk, nv):
    cfg = tiny_config(family, nk=nk, nv=nv)
    layer = hf_layer(family, cfg, seed=int(rng.integers(1 << 31)))
    w = internal_weights(layer, cfg)
    T = 70                                                   # crosses a 64-token chunk boundary
    x = rng.standard_normal((T, cfg.hidden_size)).astype(np.float32)
    with torch.no_grad():
        ref = layer(torch.tensor(x[None]))[0].numpy()

    gdn = GatedDeltaNet(cfg, w, 0)
    assert rel_err(gdn.prefill(x), ref) <= 2e-5

    # prefill a prefix, decode the rest one token at a time: same outputs as HF's single pass
    gdn.reset()
    split = 67
    out = [gdn.prefill(x[:split])] + [gdn.decode(x[t])[None] for t in range(split, T)]
    assert rel_err(np.concatenate(out), ref) <= 2e-5

    # pieces in any order: prefill, decode, prefill (the conv window and state carry over)
    gdn.reset()
    out = [gdn.prefill(x[:3]), gdn.decode(x[3])[None], gdn.prefill(x[4:])]
    assert rel_err(np.concatenate(out), ref) <= 2e-5

    # and everything token by token
    gdn.reset()
    out = np.stack([gdn.decode(x[t]) for t in range(T)])
    assert rel_err(out, ref) <= 2e-5


def test_layer_without_reorder_is_wrong(rng):
    """The value-head reorder is load-bearing: skipping it (keeping HF order while pairing
    heads the tiled way) must break the match, or the test above proves nothing about it."""
    cfg = tiny_config("qwen35", nk=2, nv=4)
    layer = hf_layer("qwen35", cfg, seed=int(rng.integers(1 << 31)))
    w = internal_weights(layer, cfg)
    wrong = Weights(w)
    dv = cfg.linear_value_head_dim
    wrong["blk.0.ssm_out.weight"] = reorder_v_heads(w["blk.0.ssm_out.weight"], 1, 2, 4, dv)
    x = rng.standard_normal((9, cfg.hidden_size)).astype(np.float32)
    with torch.no_grad():
        ref = layer(torch.tensor(x[None]))[0].numpy()
    assert rel_err(GatedDeltaNet(cfg, wrong, 0).prefill(x), ref) > 1e-2
