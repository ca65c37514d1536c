"""The numpy reference ops against transformers' own modules (the specification).

Each test builds the HF module or calls the HF function in float64 torch on the same random
inputs and compares with our float32-out reference. Tolerance: our outputs are rounded to
float32 once at the end (relative error <= 6e-8) but some inputs pass through float32 on the
way (e.g. the float32 cos/sin HF computes), so 2e-6 relative to the output's scale is ample
and still fails on any real mistake (a wrong half of rotate-half, a missing renormalisation).
"""
import numpy as np
import pytest
import torch

from bw24nb.reference import ops
from bw24nb.reference.moe import moe_forward, route

REL = 2e-6


def close(ours, ref, rel=REL):
    ref = np.asarray(ref, dtype=np.float64)
    err = np.max(np.abs(np.asarray(ours, np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30)
    assert err <= rel, f"max|diff|/max|ref| = {err:.3g} > {rel:g}"


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def test_rms_norm_matches_qwen3_rmsnorm(rng):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    x = rng.standard_normal((5, 3, 24)).astype(np.float32) * 3
    w = (1 + 0.3 * rng.standard_normal(24)).astype(np.float32)
    norm = Qwen3RMSNorm(24, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(t64(w))
        ref = norm(t64(x)).numpy()
    out = ops.rms_norm(x, w, 1e-6)
    assert out.dtype == np.float32
    close(out, ref)


def test_rms_norm_one_plus_w_convention(rng):
    """Qwen3.5's zero-centred norm `x * (1 + w)` equals ours with `1 + w` stored."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = (0.2 * rng.standard_normal(32)).astype(np.float32)
    norm = Qwen3_5RMSNorm(32, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(t64(w))
        ref = norm(t64(x)).numpy()
    close(ops.rms_norm(x, 1.0 + w, 1e-6), ref)


@pytest.mark.parametrize("head_dim,factor", [(16, 1.0), (32, 0.25), (24, 0.5)])
def test_rope_matches_hf_partial_rotary(rng, head_dim, factor):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextRotaryEmbedding, apply_rotary_pos_emb)
    T, H, theta = 7, 3, 10000.0
    cfg = Qwen3NextConfig(hidden_size=64, num_attention_heads=4, head_dim=head_dim,
                          rope_parameters={"rope_type": "default", "rope_theta": theta,
                                           "partial_rotary_factor": factor})
    emb = Qwen3NextRotaryEmbedding(cfg)
    positions = np.array([0, 1, 2, 5, 9, 100, 2047])
    x = rng.standard_normal((T, H, head_dim)).astype(np.float32)
    with torch.no_grad():
        cos, sin = emb(torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions)[None])
        xt = t64(x).transpose(0, 1)[None]                          # [1, H, T, D]
        ref, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
        ref = ref[0].transpose(0, 1).numpy()
    rotary_dim = int(head_dim * factor)
    out = ops.rope(x, positions, theta, rotary_dim)
    # HF builds inv_freq, pos*inv_freq and cos/sin in float32: at position 2047 the angle is
    # off by up to ~2 ulp(2047) = 2.4e-4 rad, so an element of a rotated pair can move by
    # 2.4e-4 * sqrt(2) * max|x| (3.4e-4 relative; one CI seed hit 5.2e-5 against an earlier,
    # too-tight 5e-5). Our tables are float64. 5e-4 still catches any layout error (those are O(1)).
    close(out, ref, rel=5e-4)
    np.testing.assert_array_equal(out[..., rotary_dim:], x[..., rotary_dim:])


def test_rope_position_zero_is_identity(rng):
    x = rng.standard_normal((1, 2, 8)).astype(np.float32)
    np.testing.assert_allclose(ops.rope(x, np.array([0]), 1e6, 8), x, rtol=0, atol=0)


def test_activations_and_softmax(rng):
    g = rng.standard_normal(50).astype(np.float32) * 4
    u = rng.standard_normal(50).astype(np.float32)
    close(ops.silu(g), torch.nn.functional.silu(t64(g)).numpy())
    close(ops.sigmoid(g), torch.sigmoid(t64(g)).numpy())
    close(ops.swiglu(g, u), (torch.nn.functional.silu(t64(g)) * t64(u)).numpy())
    s = rng.standard_normal((3, 9)).astype(np.float32) * 10
    close(ops.softmax(s), torch.softmax(t64(s), -1).numpy())
    s[0, :4] = -np.inf
    p = ops.softmax(s)
    assert np.all(p[0, :4] == 0) and np.allclose(p.sum(-1), 1, rtol=1e-6)


def test_linear_and_matvec(rng):
    x = rng.standard_normal((4, 12)).astype(np.float32)
    W = rng.standard_normal((7, 12)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    ref = torch.nn.functional.linear(t64(x), t64(W), t64(b)).numpy()
    close(ops.linear(x, W, b), ref)
    close(ops.matvec(W, x[2], b), ref[2])
    close(ops.linear(x, W), ref - b)


@pytest.mark.parametrize("T,S,offset", [(6, 6, 0), (1, 9, 8), (3, 10, 7)])
def test_attention_matches_hf_eager_gqa(rng, T, S, offset):
    """Query row t at position offset + t sees keys 0..offset + t (HF: causal mask over the
    cache), GQA by repeat_kv."""
    from types import SimpleNamespace

    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward
    Hq, Hkv, D = 6, 2, 8
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    allowed = np.arange(S)[None, :] <= (offset + np.arange(T))[:, None]
    mask = torch.from_numpy(np.where(allowed, 0.0, -np.inf))[None, None]
    module = SimpleNamespace(num_key_value_groups=Hq // Hkv, training=False)
    with torch.no_grad():
        ref, _ = eager_attention_forward(module, t64(q).transpose(0, 1)[None],
                                         t64(k).transpose(0, 1)[None], t64(v).transpose(0, 1)[None],
                                         mask, scaling=D ** -0.5)
    close(ops.attention(q, k, v, causal_offset=offset), ref[0].numpy())


def test_attention_rejects_bad_offset(rng):
    q = np.zeros((3, 2, 4), np.float32)
    k = np.zeros((4, 1, 4), np.float32)
    with pytest.raises(ValueError):
        ops.attention(q, k, k, causal_offset=2)


def _hf_moe_block(kind, H, E, I, top_k, norm, Is=0):
    """A transformers MoE block in float64 with random weights, plus our stacked copies."""
    g = torch.Generator().manual_seed(1234)
    if kind == "qwen3moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        cfg = Qwen3MoeConfig(hidden_size=H, num_experts=E, moe_intermediate_size=I,
                             num_experts_per_tok=top_k, norm_topk_prob=norm)
        block = Qwen3MoeSparseMoeBlock(cfg)
    else:
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        cfg = Qwen2MoeConfig(hidden_size=H, num_experts=E, moe_intermediate_size=I,
                             num_experts_per_tok=top_k, norm_topk_prob=norm,
                             shared_expert_intermediate_size=Is)
        block = Qwen2MoeSparseMoeBlock(cfg)
    block = block.double()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    ex = block.experts
    gate_up = ex.gate_up_proj.detach().numpy().astype(np.float32)
    experts = (gate_up[:, :I], gate_up[:, I:], ex.down_proj.detach().numpy().astype(np.float32))
    router = block.gate.weight.detach().numpy().astype(np.float32)
    shared = shared_gate = None
    if kind == "qwen2moe":
        se = block.shared_expert
        shared = tuple(m.weight.detach().numpy().astype(np.float32)
                       for m in (se.gate_proj, se.up_proj, se.down_proj))
        shared_gate = block.shared_expert_gate.weight.detach().numpy().astype(np.float32)
    # Round HF's weights to the float32 values we use, so only the arithmetic differs.
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(p.float().double())
    return block, router, experts, shared, shared_gate


@pytest.mark.parametrize("norm", [True, False])
def test_moe_matches_qwen3moe_block(rng, norm):
    H, E, I, k = 16, 6, 8, 2
    block, router, experts, _, _ = _hf_moe_block("qwen3moe", H, E, I, k, norm)
    x = rng.standard_normal((9, H)).astype(np.float32)
    with torch.no_grad():
        ref = block(t64(x)[None])[0].numpy()
    close(moe_forward(x, router, experts, k, norm), ref)
    close(moe_forward(x[3], router, experts, k, norm), ref[3])   # one token, [H] in and out


def test_moe_matches_qwen2moe_block_with_gated_shared_expert(rng):
    H, E, I, Is, k = 16, 4, 8, 12, 2
    block, router, experts, shared, shared_gate = _hf_moe_block("qwen2moe", H, E, I, k, True, Is)
    x = rng.standard_normal((7, H)).astype(np.float32)
    with torch.no_grad():
        ref = block(t64(x)[None])[0].numpy()
    close(moe_forward(x, router, experts, k, True, shared=shared, shared_gate_w=shared_gate), ref)


def test_route_picks_top_k_and_renormalises(rng):
    x = rng.standard_normal((5, 8)).astype(np.float32)
    W = rng.standard_normal((6, 8)).astype(np.float32)
    idx, w = route(x, W, 3, True)
    probs = torch.softmax(t64(x) @ t64(W).T, -1)
    top_v, top_i = torch.topk(probs, 3, dim=-1)
    np.testing.assert_array_equal(idx, top_i.numpy())
    close(w, (top_v / top_v.sum(-1, keepdim=True)).numpy())
    _, w_raw = route(x, W, 3, False)
    close(w_raw, top_v.numpy())


# ----------------------------------------------------------------------------- attention mixer

def _hf_attention_layer(kind):
    """A transformers attention module (float64, random weights, eager) and its rotary
    embedding, plus our internal-name weights for it."""
    g = torch.Generator().manual_seed(99)
    common = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rms_norm_eps=1e-6, attn_implementation="eager")
    if kind == "qwen2":
        from transformers import Qwen2Config
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention as A
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding as R
        common.pop("head_dim")
        cfg = Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    elif kind == "qwen3":
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention as A
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding as R
        cfg = Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    else:
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention as A
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding as R
        cfg = Qwen3NextConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                         "partial_rotary_factor": 0.25})
    attn = A(cfg, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).float().double() * 0.3)
    rot = R(cfg)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in attn.state_dict().items()}
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    from bw24nb.models.weights import Weights
    w = Weights()
    for k, v in sd.items():
        mod, kind_ = k.split(".")
        if kind == "qwen3next" and mod.endswith("norm"):
            v = (1.0 + v).astype(np.float32)     # zero-centred (1 + w) norm, shifted at load
        w[f"blk.0.{names[mod]}.{kind_}"] = v
    from bw24nb.formats.config import ModelConfig
    mc = ModelConfig(family=kind, vocab_size=8, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=attn.head_dim,
                     intermediate_size=8, rms_norm_eps=1e-6, rope_theta=1e4,
                     max_position_embeddings=64,
                     partial_rotary_factor=0.25 if kind == "qwen3next" else 1.0,
                     attention_bias=kind == "qwen2", qk_norm=kind != "qwen2",
                     attn_output_gate=kind == "qwen3next")
    return attn, rot, w, mc


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "qwen3next"])
def test_full_attention_mixer_matches_hf(rng, kind):
    """Bias (qwen2), qk-norm before RoPE (qwen3), [query | gate] per head + partial RoPE +
    sigmoid output gate (qwen3next): prefill of 7 tokens, then 2 decode steps."""
    from bw24nb.reference.attention import FullAttention
    attn, rot, w, mc = _hf_attention_layer(kind)
    T = 9
    x = rng.standard_normal((T, 32)).astype(np.float32)
    pos = torch.arange(T)[None]
    mask = torch.triu(torch.full((T, T), -torch.inf, dtype=torch.float64), 1)[None, None]
    with torch.no_grad():
        cos, sin = rot(torch.zeros(1, dtype=torch.float64), pos)
        ref, _ = attn(t64(x)[None], (cos, sin), mask)
    ref = ref[0].numpy()
    mixer = FullAttention(mc, w, 0)
    out = np.concatenate([mixer.prefill(x[:7]), mixer.decode(x[7])[None], mixer.decode(x[8])[None]])
    assert mixer.position == T
    close(out, ref, rel=1e-5)     # HF's float32 cos/sin: ~1e-7 relative per element
