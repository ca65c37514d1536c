"""Hybrid Qwens (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): the numpy reference against transformers.

Fixtures: tests/fixtures/make_fixtures_qwen35.py (4 layers: DeltaNet, attention, DeltaNet,
attention; 2 key heads on 4 value heads; GQA 2; partial rotary 0.25; theta 1e7; 67 tokens).

- Prefill logits equal transformers' from both the HF directory and the GGUF file
  (max|diff| / max|ref| <= 1e-4: transformers runs float32, we float64; a wrong value-head
  order, norm offset, gate or decay gives O(1e-1)).
- Token-by-token decode (recurrent DeltaNet) and prefill-then-decode equal one prefill
  (chunked DeltaNet) to 1e-5: two algorithms for the same function, both float64 inside.
- HF and GGUF give the same internal tensors (rtol 1e-6: `-exp(A_log)` is computed by torch in
  one and numpy in the other, a last-bit difference at most).
- The MTP head equals transformers' modules wired as vLLM's MTP predictor (fixture oracle), its
  one-pair-at-a-time form equals the batched one, its decoder layer *is* the main stack's layer
  recipe, and its wiring (norms, concat order, heads) matches a hand computation.
- Qwen3-Next (fused qkvz / ba projections, per-expert checkpoint, grouped value heads) is built
  in memory with transformers and round-tripped through save_pretrained.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from bw24nb.errors import MissingTensor
from bw24nb.formats import open_model
from bw24nb.formats.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from bw24nb.models import load_weights
from bw24nb.models.qwen35 import mtp_tensor_names, split_qkvz, tensor_names
from bw24nb.models.weights import Weights
from bw24nb.reference.model import Layer, ReferenceModel
from bw24nb.reference.mtp import MTPHead, mtp_draft

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FAMILIES = ["qwen35", "qwen35moe"]
REF_TOL = 1e-4
SELF_TOL = 1e-5


def rel_err(ours, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(ours, np.float64) - ref)) / np.max(np.abs(ref)))


def fixture_path(family, fmt):
    return os.path.join(FIXTURES, family, "hf" if fmt == "hf" else "model.gguf")


@pytest.fixture(scope="module", params=[(f, fmt) for f in FAMILIES for fmt in ("hf", "gguf")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request):
    family, fmt = request.param
    source = open_model(fixture_path(family, fmt))
    assert source.config.family == family
    assert source.config.mtp_num_hidden_layers == 1
    weights = load_weights(source)
    expected = np.load(os.path.join(FIXTURES, family, "expected.npz"))
    return family, fmt, source.config, weights, expected


def test_prefill_matches_transformers(loaded):
    family, fmt, config, weights, expected = loaded
    model = ReferenceModel(config, weights)
    logits = model.prefill(expected["tokens"])
    ref = expected["logits"]
    assert logits.dtype == np.float32 and logits.shape == ref.shape
    assert rel_err(logits, ref) <= REF_TOL
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3
    np.testing.assert_array_equal(logits.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_decode_equals_prefill(loaded):
    family, fmt, config, weights, expected = loaded
    tokens = expected["tokens"]
    model = ReferenceModel(config, weights)
    full = model.prefill(tokens)

    model.reset()
    stepped = np.stack([model.decode(t) for t in tokens])
    assert rel_err(stepped, full) <= SELF_TOL

    model.reset()
    split = 65                                    # chunked prefill past one chunk, then decode
    mixed = [model.prefill(tokens[:split])] + [model.decode(t)[None] for t in tokens[split:]]
    mixed = np.concatenate(mixed)
    assert rel_err(mixed, full) <= SELF_TOL


def test_hf_and_gguf_give_identical_internal_tensors():
    for family in FAMILIES:
        hf = load_weights(open_model(fixture_path(family, "hf")))
        gg = load_weights(open_model(fixture_path(family, "gguf")))
        assert sorted(hf) == sorted(gg), family
        for name in hf:
            assert hf[name].shape == gg[name].shape, name
            np.testing.assert_allclose(hf[name], gg[name], rtol=1e-6, atol=0, err_msg=name)
        # the whole MTP block came through, on block num_hidden_layers
        assert "blk.4.nextn.eh_proj.weight" in hf and "blk.4.attn_q.weight" in hf


# ----------------------------------------------------------------------------- MTP

def test_mtp_matches_transformers_modules(loaded):
    """Slot t pairs the main model's hidden state at t with token t+1 (oracle: see fixture doc)."""
    family, fmt, config, weights, expected = loaded
    model = ReferenceModel(config, weights)
    hidden = model.hidden_states(expected["tokens"])              # before the output norm
    head = MTPHead(config, weights)
    logits = head.forward(hidden, expected["mtp_tokens"])
    assert rel_err(logits, expected["mtp_logits"]) <= REF_TOL
    assert head.position == len(expected["tokens"])


def test_mtp_draft_step_by_step_equals_batched(loaded):
    """Through ReferenceModel.mtp_draft: decode the main model one token at a time and feed
    each (last_hidden, next token) pair; the drafts equal the batched MTP forward."""
    family, fmt, config, weights, expected = loaded
    tokens, nxt = expected["tokens"][:20], expected["mtp_tokens"][:20]
    model = ReferenceModel(config, weights)
    drafts = []
    for t, n in zip(tokens, nxt):
        model.decode(t)
        drafts.append(mtp_draft(model, model.last_hidden, n))
    batched = MTPHead(config, weights)
    ref = batched.forward(ReferenceModel(config, weights).hidden_states(tokens), nxt)
    assert rel_err(np.stack(drafts), ref) <= SELF_TOL
    # reset() clears the head's cache with the model's
    model.reset()
    model.decode(tokens[0])
    again = mtp_draft(model, model.last_hidden, nxt[0])
    assert rel_err(again, drafts[0]) <= SELF_TOL
    # truncate() rewinds to a shorter history (rejected drafts): redoing pair 5 gives draft 5
    batched.truncate(5)
    h5 = ReferenceModel(config, weights).hidden_states(tokens[:6])[5]
    assert rel_err(batched.draft(h5, nxt[5]), ref[5]) <= SELF_TOL


def test_mtp_layer_is_the_main_layer_recipe():
    """Copy a main full-attention layer's tensors onto the MTP block: the MTP's decoder layer
    then computes exactly what the main stack's layer computes (it is the same `Layer`)."""
    source = open_model(fixture_path("qwen35moe", "gguf"))
    config, w = source.config, load_weights(source)
    n = config.num_hidden_layers
    full = config.layer_types.index(FULL_ATTENTION)
    w2 = Weights(w)
    for name in list(w):
        if name.startswith(f"blk.{full}."):
            w2[f"blk.{n}." + name[len(f"blk.{full}."):]] = w[name]
    head = MTPHead(config, w2)
    main = ReferenceModel(config, w2).layers[full]
    assert type(head.layer) is Layer and type(head.layer.mixer) is type(main.mixer)
    x = np.random.default_rng(0).standard_normal((9, config.hidden_size)).astype(np.float32)
    np.testing.assert_array_equal(head.layer.forward(x), main.forward(x))


def _rms(x, w, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def test_mtp_wiring_by_hand():
    """A 4-wide model whose MTP decoder layer is the identity (attn_output = ffn_down = 0), so
    the draft is `head @ rms(eh_proj @ [rms(e)*enorm ; rms(rms(h)*out_norm)*hnorm]) *
    shared_head_norm`, written out here; the swapped concat order gives another answer."""
    H, V = 4, 5
    cfg = ModelConfig(family="qwen35", vocab_size=V, hidden_size=H, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=4, intermediate_size=2,
                      rms_norm_eps=1e-6, rope_theta=1e7, max_position_embeddings=16,
                      partial_rotary_factor=0.5, qk_norm=True, attn_output_gate=True,
                      layer_types=[LINEAR_ATTENTION], mtp_num_hidden_layers=1)
    r = np.random.default_rng(7)
    f = lambda *s: r.standard_normal(s).astype(np.float32)   # noqa: E731
    w = {
        "token_embd.weight": f(V, H), "output.weight": f(V, H), "output_norm.weight": 1 + f(H) * 0.3,
        "blk.1.attn_norm.weight": 1 + f(H), "blk.1.post_attention_norm.weight": 1 + f(H),
        "blk.1.attn_q.weight": f(8, H), "blk.1.attn_k.weight": f(4, H), "blk.1.attn_v.weight": f(4, H),
        "blk.1.attn_output.weight": np.zeros((H, 4), np.float32),
        "blk.1.attn_q_norm.weight": 1 + f(4), "blk.1.attn_k_norm.weight": 1 + f(4),
        "blk.1.ffn_gate.weight": f(2, H), "blk.1.ffn_up.weight": f(2, H),
        "blk.1.ffn_down.weight": np.zeros((H, 2), np.float32),
        "blk.1.nextn.eh_proj.weight": f(H, 2 * H),
        "blk.1.nextn.enorm.weight": np.array([1.0, 2.0, 3.0, 4.0], np.float32),
        "blk.1.nextn.hnorm.weight": np.array([-1.0, 0.5, 0.25, 2.0], np.float32),
        "blk.1.nextn.shared_head_norm.weight": np.array([0.5, 1.5, 1.0, -1.0], np.float32),
    }
    hidden, tok = f(H), 3
    e_part = _rms(w["token_embd.weight"][tok], w["blk.1.nextn.enorm.weight"])
    h_part = _rms(_rms(hidden, w["output_norm.weight"]), w["blk.1.nextn.hnorm.weight"])
    x = w["blk.1.nextn.eh_proj.weight"].astype(np.float64) @ np.concatenate([e_part, h_part])
    expect = w["output.weight"] @ _rms(x, w["blk.1.nextn.shared_head_norm.weight"])
    swapped = w["blk.1.nextn.eh_proj.weight"] @ np.concatenate([h_part, e_part])
    swapped = w["output.weight"] @ _rms(swapped, w["blk.1.nextn.shared_head_norm.weight"])
    assert rel_err(swapped, expect) > 0.1                          # order is observable

    got = MTPHead(cfg, w).draft(hidden, tok)
    assert rel_err(got, expect) <= 1e-6
    # no shared_head_norm in the file: llama.cpp falls back to the output norm
    w2 = dict(w)
    del w2["blk.1.nextn.shared_head_norm.weight"]
    expect2 = w["output.weight"] @ _rms(x, w["output_norm.weight"])
    assert rel_err(MTPHead(cfg, w2).draft(hidden, tok), expect2) <= 1e-6


def test_mtp_missing_is_a_typed_error():
    source = open_model(fixture_path("qwen35", "gguf"))
    w = Weights({k: v for k, v in load_weights(source).items() if ".nextn." not in k}, source="x.gguf")
    with pytest.raises(MissingTensor, match="nextn.eh_proj"):
        MTPHead(source.config, w)


# ----------------------------------------------------------------------------- converter pieces

def test_split_qkvz_deinterleaves_per_key_head():
    """in_proj_qkvz rows, per key head g: [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)]; label
    each row with (part, g, j) and check llama.cpp's order [q all | k all | v all] + z."""
    nk, nv, dk, dv = 2, 4, 2, 3
    r = nv // nk
    labels, want = [], {"q": [], "k": [], "v": [], "z": []}
    for g in range(nk):
        for part, size in (("q", dk), ("k", dk), ("v", r * dv), ("z", r * dv)):
            for j in range(size):
                lab = 1000 * "qkvz".index(part) + 100 * g + j
                labels.append(lab)
                want[part].append(lab)
    w = np.array(labels, np.float32)[:, None] * np.ones((1, 3), np.float32)
    qkv, z = split_qkvz(w, nk, nv, dk, dv)
    np.testing.assert_array_equal(qkv[:, 0], want["q"] + want["k"] + want["v"])
    np.testing.assert_array_equal(z[:, 0], want["z"])


def test_tensor_names_cover_the_fixture():
    source = open_model(fixture_path("qwen35moe", "gguf"))
    w = load_weights(source)
    names = tensor_names(source.config)
    assert set(names) <= set(w)
    assert "blk.0.ssm_beta.weight" in names and "blk.1.attn_q_norm.weight" in names
    assert not any(n.startswith("blk.4.") for n in names)          # MTP block is optional
    mtp = mtp_tensor_names(source.config)
    assert set(mtp) <= set(w) and "blk.4.ffn_gate_exps.weight" in mtp and "blk.4.nextn.hnorm.weight" in mtp


# ----------------------------------------------------------------------------- Qwen3-Next

def test_qwen3next_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=48, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[1], rms_norm_eps=1e-6, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(3)
    model = Qwen3NextForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("norm.weight"):
                p.copy_(0.1 * noise)
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.05 + 1.95 * torch.rand(p.shape, generator=g)))
            elif p.ndim >= 2:
                p.copy_(noise / np.sqrt(p.shape[-1]) * (0.5 if "embed" in name else 1.2))
            else:
                p.copy_(0.3 * noise)
    model.save_pretrained(tmp_path)
    tokens = np.array([3, 90, 17, 17, 64, 5, 127, 0, 44, 12, 9, 100, 31], np.int64)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens)[None]).logits[0].numpy()

    source = open_model(str(tmp_path))
    assert source.config.family == "qwen3next" and source.config.mlp_only_layers == [1]
    weights = load_weights(source)
    assert "blk.0.ssm_ba.weight" in weights and "blk.0.ssm_in.weight" not in weights
    model_ref = ReferenceModel(source.config, weights)
    assert rel_err(model_ref.prefill(tokens), ref) <= REF_TOL
    model_ref.reset()
    assert rel_err(np.stack([model_ref.decode(t) for t in tokens]), ref) <= REF_TOL
