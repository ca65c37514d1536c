"""Hybrid Gated-DeltaNet Qwens: Qwen3-Next (`qwen3next`), Qwen3.5 (`qwen35`), Qwen3.5-MoE
(`qwen35moe`). One module, three GGUF architectures, because they share the layer recipe:

    h = h + mixer(rms_norm(h) * attn_norm)            mixer per `layer_types[i]`:
        full_attention:   gated attention  (attn_q holds [query | gate] per head, q/k RMSNorm,
                          partial NEOX RoPE, output * sigmoid(gate), attn_output)
        linear_attention: Gated DeltaNet   (bw24nb/reference/gated_deltanet.py)
    h = h + ffn(rms_norm(h) * post_attention_norm)    dense SwiGLU (qwen35) or MoE with a
                                                      sigmoid-gated shared expert (the others)

plus, for Qwen3.5/3.6, an optional multi-token-prediction block (bw24nb/reference/mtp.py).

Internal names are llama.cpp's. What its converter (convert_hf_to_gguf.py, `Qwen3NextModel`,
`_LinearAttentionVReorderBase`, `_Qwen35MtpMixin`, `Qwen3_5TextModel`, `Qwen3_5MoeTextModel`)
does to an HF checkpoint, and `convert_hf` below repeats so both formats give identical tensors:

- every `*norm.weight` except the GDN's gated norm gets `+ 1` (HF's RMSNorms compute
  `x * (1 + w)`; `Qwen3_5RMSNormGated` computes `x * w` and stays as is);
- `A_log` -> `ssm_a = -exp(A_log)`; `dt_bias` -> `ssm_dt.bias`; conv1d `[C, 1, K]` -> `[C, K]`;
- Qwen3-Next's fused `in_proj_qkvz` (interleaved per key head: [q, k, v-group, z-group]) is
  split into `attn_qkv` = [all q | all k | all v] and `attn_gate` = z; `in_proj_ba` stays fused
  as `ssm_ba` (per key head [b-group | a-group]);
- Qwen3.5 with fewer key than value heads: the value heads, stored by HF grouped by key head
  (`[g0v0, g0v1, g1v0, g1v1]`), are reordered to tiled order (`[g0v0, g1v0, g0v1, g1v1]`) in
  every tensor indexed by value head (qkv's V rows, z, beta, alpha, A, dt, conv V channels,
  out_proj columns) so that ggml can broadcast key heads with a plain repeat. Value head `j` is
  then served by key head `j % n_k` (Qwen3-Next: `j // (n_v / n_k)`): `value_to_key_head`.
- MTP (`mtp.*`, which transformers ignores): `mtp.layers.{i}.*` -> block `num_hidden_layers + i`
  (same suffixes as a full-attention layer); `mtp.fc` -> `nextn.eh_proj`,
  `mtp.pre_fc_norm_embedding` -> `nextn.enorm`, `mtp.pre_fc_norm_hidden` -> `nextn.hnorm`,
  `mtp.norm` -> `nextn.shared_head_norm`, all on that block, norms `+ 1`.

Post-attention RMSNorm is `post_attention_norm` here (gguf-py maps
`post_attention_layernorm` to ATTN_POST_NORM for these architectures, not FFN_NORM).
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError, UnsupportedArchitecture
from ..formats.config import FULL_ATTENTION, LINEAR_ATTENTION
from .weights import Weights, split_fused_experts

FAMILIES = ("qwen35", "qwen35moe", "qwen3next")

# How llama.cpp lays out value heads relative to key heads (see module docstring).
V_HEAD_ORDER = {"qwen35": "tiled", "qwen35moe": "tiled", "qwen3next": "grouped"}


def value_to_key_head(family: str, num_k_heads: int, num_v_heads: int) -> np.ndarray:
    """`[num_v_heads]` int array: the key head each value head (in internal order) reads."""
    if family not in V_HEAD_ORDER:
        raise UnsupportedArchitecture(f"family {family!r} has no Gated DeltaNet layers")
    if num_k_heads <= 0 or num_v_heads % num_k_heads:
        raise UnsupportedArchitecture(
            f"linear_num_value_heads={num_v_heads} is not a multiple of linear_num_key_heads="
            f"{num_k_heads}; Gated DeltaNet needs whole groups")
    j = np.arange(num_v_heads)
    if V_HEAD_ORDER[family] == "tiled":
        return j % num_k_heads
    return j // (num_v_heads // num_k_heads)


def reorder_v_heads(x: np.ndarray, axis: int, num_k_heads: int, num_v_heads: int,
                    head_dim: int) -> np.ndarray:
    """Grouped -> tiled value-head order along `axis` (length `num_v_heads * head_dim`):
    entry `(g, r, d)` (key group g, r-th value head of it) moves to `(r, g, d)`."""
    x = np.moveaxis(np.asarray(x), axis, 0)
    r = num_v_heads // num_k_heads
    rest = x.shape[1:]
    y = x.reshape(num_k_heads, r, head_dim, *rest).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def split_qkvz(w: np.ndarray, num_k_heads: int, num_v_heads: int, head_k_dim: int,
               head_v_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-Next `in_proj_qkvz [n_k * (2 dk + 2 r dv), H]` (per key head: q, k, v-group,
    z-group) -> `(attn_qkv [2 n_k dk + n_v dv, H], attn_gate [n_v dv, H])`."""
    r = num_v_heads // num_k_heads
    sizes = [head_k_dim, head_k_dim, r * head_v_dim, r * head_v_dim]
    g = np.asarray(w).reshape(num_k_heads, sum(sizes), -1)
    q, k, v, z = np.split(g, np.cumsum(sizes)[:-1], axis=1)
    H = g.shape[-1]
    qkv = np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)], axis=0)
    return np.ascontiguousarray(qkv), np.ascontiguousarray(z.reshape(-1, H))


# ---------------------------------------------------------------------------------------------
# HF names -> internal names. `{L}` is the first regex group (layer), `{1}` the second.
# Main-stack layers may sit under `model.language_model.` (Qwen3.5 *ForConditionalGeneration
# checkpoints, as published); MTP layers get the placeholder block `mtp{i}`, renumbered to
# `num_hidden_layers + i` by `convert_hf` (a regex template cannot add).
_LAYER_SUFFIXES: list[tuple[str, str]] = [
    (r"input_layernorm\.weight", "attn_norm.weight"),
    (r"post_attention_layernorm\.weight", "post_attention_norm.weight"),
    (r"self_attn\.q_proj\.weight", "attn_q.weight"),
    (r"self_attn\.k_proj\.weight", "attn_k.weight"),
    (r"self_attn\.v_proj\.weight", "attn_v.weight"),
    (r"self_attn\.o_proj\.weight", "attn_output.weight"),
    (r"self_attn\.q_norm\.weight", "attn_q_norm.weight"),
    (r"self_attn\.k_norm\.weight", "attn_k_norm.weight"),
    (r"linear_attn\.in_proj_qkv\.weight", "attn_qkv.weight"),
    (r"linear_attn\.in_proj_z\.weight", "attn_gate.weight"),
    (r"linear_attn\.in_proj_b\.weight", "ssm_beta.weight"),
    (r"linear_attn\.in_proj_a\.weight", "ssm_alpha.weight"),
    (r"linear_attn\.in_proj_qkvz\.weight", "ssm_in.weight"),       # split by convert_hf
    (r"linear_attn\.in_proj_ba\.weight", "ssm_ba.weight"),
    (r"linear_attn\.conv1d\.weight", "ssm_conv1d.weight"),
    (r"linear_attn\.dt_bias", "ssm_dt.bias"),
    (r"linear_attn\.A_log", "ssm_a"),
    (r"linear_attn\.norm\.weight", "ssm_norm.weight"),
    (r"linear_attn\.out_proj\.weight", "ssm_out.weight"),
    (r"mlp\.gate_proj\.weight", "ffn_gate.weight"),
    (r"mlp\.up_proj\.weight", "ffn_up.weight"),
    (r"mlp\.down_proj\.weight", "ffn_down.weight"),
    (r"mlp\.gate\.weight", "ffn_gate_inp.weight"),
    (r"mlp\.shared_expert\.gate_proj\.weight", "ffn_gate_shexp.weight"),
    (r"mlp\.shared_expert\.up_proj\.weight", "ffn_up_shexp.weight"),
    (r"mlp\.shared_expert\.down_proj\.weight", "ffn_down_shexp.weight"),
    (r"mlp\.shared_expert_gate\.weight", "ffn_gate_inp_shexp.weight"),
    # experts, one tensor each (Qwen3-Next checkpoints): stacked by weights.stack_experts
    (r"mlp\.experts\.(\d+)\.gate_proj\.weight", "ffn_gate_exps.weight#{1}"),
    (r"mlp\.experts\.(\d+)\.up_proj\.weight", "ffn_up_exps.weight#{1}"),
    (r"mlp\.experts\.(\d+)\.down_proj\.weight", "ffn_down_exps.weight#{1}"),
    # experts, fused 3-D (Qwen3.5-MoE checkpoints): split by weights.split_fused_experts
    (r"mlp\.experts\.gate_up_proj", "ffn_gate_up_exps.weight"),
    (r"mlp\.experts\.down_proj", "ffn_down_exps.weight"),
]

_MAIN = r"model\.(?:language_model\.)?"
_MTP = r"(?:model\.)?mtp\."
MTP_PLACEHOLDER = "blk.mtp{L}."

HF_NAME_RULES: list[tuple[str, str]] = (
    [(_MAIN + r"embed_tokens\.weight", "token_embd.weight"),
     (_MAIN + r"norm\.weight", "output_norm.weight"),
     (r"lm_head\.weight", "output.weight"),
     (_MTP + r"fc\.weight", "blk.mtp0.nextn.eh_proj.weight"),
     (_MTP + r"pre_fc_norm_embedding\.weight", "blk.mtp0.nextn.enorm.weight"),
     (_MTP + r"pre_fc_norm_hidden\.weight", "blk.mtp0.nextn.hnorm.weight"),
     (_MTP + r"norm\.weight", "blk.mtp0.nextn.shared_head_norm.weight")]
    + [(_MAIN + r"layers\.(\d+)\." + pat, "blk.{L}." + tmpl) for pat, tmpl in _LAYER_SUFFIXES]
    + [(_MTP + r"layers\.(\d+)\." + pat, MTP_PLACEHOLDER + tmpl) for pat, tmpl in _LAYER_SUFFIXES]
)
# Buffers some exporters write, and the vision tower of the multimodal checkpoints.
HF_IGNORE = (r".*rotary_emb\.inv_freq", r"model\.visual\.", r"visual\.")

_MTP_BLOCK = re.compile(r"blk\.mtp(\d+)\.")


def _is_shifted_norm(name: str) -> bool:
    """The RMSNorms HF runs as `x * (1 + w)` (llama.cpp: `name.endswith("norm.weight") and
    not linear_attn.norm`)."""
    return name.endswith("norm.weight") and not name.endswith("ssm_norm.weight")


def convert_hf(w: Weights, config, source=None) -> Weights:
    """Apply llama.cpp's converter transforms to renamed HF tensors (see module docstring)."""
    n_layers = config.num_hidden_layers
    out = Weights(source=w.source)
    for name, t in w.items():
        m = _MTP_BLOCK.match(name)
        if m:
            name = f"blk.{n_layers + int(m.group(1))}." + name[m.end():]
        out[name] = t
    w = out

    for name in list(w):
        t = w[name]
        if _is_shifted_norm(name):
            w[name] = (t + np.float32(1.0)).astype(np.float32)
        elif name.endswith(".ssm_a"):
            w[name] = (-np.exp(t.astype(np.float64))).astype(np.float32)
        elif name.endswith("ssm_conv1d.weight") and t.ndim == 3:
            w[name] = np.ascontiguousarray(t.reshape(t.shape[0], t.shape[-1]))
        elif name.endswith("ffn_gate_inp_shexp.weight"):
            w[name] = np.ascontiguousarray(t.reshape(-1))

    _split_fused_qkvz(w, config)
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    if nk and nv != nk and V_HEAD_ORDER[config.family] == "tiled":
        for layer in range(n_layers):
            if config.layer_type(layer) == LINEAR_ATTENTION:
                _reorder_layer_v_heads(w, layer, nk, nv, dk, dv)
    return w


def _split_fused_qkvz(w: Weights, config) -> None:
    """Every `blk.N.ssm_in.weight` (Qwen3-Next's fused in_proj_qkvz) -> attn_qkv + attn_gate."""
    dims = (config.linear_num_key_heads, config.linear_num_value_heads,
            config.linear_key_head_dim, config.linear_value_head_dim)
    for name in [n for n in w if n.endswith("ssm_in.weight")]:
        prefix = name[:-len("ssm_in.weight")]
        w[prefix + "attn_qkv.weight"], w[prefix + "attn_gate.weight"] = split_qkvz(w.pop(name), *dims)


def _reorder_layer_v_heads(w: Weights, layer: int, nk: int, nv: int, dk: int, dv: int) -> None:
    p = f"blk.{layer}."
    key_rows = 2 * nk * dk
    for name in ("attn_qkv.weight", "ssm_conv1d.weight"):           # V rows / V channels only
        t = w[p + name]
        w[p + name] = np.concatenate([t[:key_rows], reorder_v_heads(t[key_rows:], 0, nk, nv, dv)], 0)
    w[p + "attn_gate.weight"] = reorder_v_heads(w[p + "attn_gate.weight"], 0, nk, nv, dv)
    for name in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
        w[p + name] = reorder_v_heads(w[p + name], 0, nk, nv, 1)
    w[p + "ssm_out.weight"] = reorder_v_heads(w[p + "ssm_out.weight"], 1, nk, nv, dv)


def convert_gguf(w: Weights, config, source=None) -> Weights:
    """Normalise GGUF files from older/newer llama.cpp onto one internal layout: legacy
    Qwen3-Next files keep the fused `ssm_in` (split here exactly as the converter now does),
    newer ones may fuse `ffn_gate_up_exps` (split); the shared-expert gate is a vector."""
    _split_fused_qkvz(w, config)
    for name in [n for n in w if n.endswith("ffn_gate_inp_shexp.weight")]:
        w[name] = np.ascontiguousarray(w[name].reshape(-1))
    return split_fused_experts(w)


# ---------------------------------------------------------------------------------------------
def ffn_tensor_names(config, layer: int) -> list[str]:
    """Dense SwiGLU or router + stacked experts (+ gated shared expert) of block `layer`; an
    MTP block (`layer >= num_hidden_layers`) is MoE exactly when the model has experts."""
    p = f"blk.{layer}."
    moe = config.num_experts > 0 and (layer >= config.num_hidden_layers or config.is_moe_layer(layer))
    if moe:
        names = [p + "ffn_gate_inp.weight", p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight",
                 p + "ffn_down_exps.weight"]
        if config.shared_expert_intermediate_size:
            names += [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight",
                      p + "ffn_down_shexp.weight", p + "ffn_gate_inp_shexp.weight"]
        return names
    return [p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]


def attention_tensor_names(layer: int) -> list[str]:
    p = f"blk.{layer}."
    return [p + n for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                            "attn_q_norm.weight", "attn_k_norm.weight")]


def gdn_tensor_names(config, layer: int) -> list[str]:
    p = f"blk.{layer}."
    names = ["attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a",
             "ssm_norm.weight", "ssm_out.weight"]
    names += ["ssm_ba.weight"] if config.family == "qwen3next" else ["ssm_beta.weight", "ssm_alpha.weight"]
    return [p + n for n in names]


def mtp_tensor_names(config, index: int = 0) -> list[str]:
    """The MTP block `index` (block `num_hidden_layers + index`): a full-attention decoder layer
    plus the nextn tensors. `nextn.shared_head_head` / `nextn.embed_tokens` are optional in
    llama.cpp (the main LM head / embedding serve) and not listed."""
    b = config.num_hidden_layers + index
    p = f"blk.{b}."
    return ([p + "attn_norm.weight", p + "post_attention_norm.weight"] + attention_tensor_names(b)
            + ffn_tensor_names(config, b)
            + [p + "nextn.eh_proj.weight", p + "nextn.enorm.weight", p + "nextn.hnorm.weight",
               p + "nextn.shared_head_norm.weight"])


def tensor_names(config) -> list[str]:
    """Every internal tensor the main stack needs (the MTP block is optional: see
    `mtp_tensor_names`; a checkpoint without it still runs, without drafting)."""
    if config.family not in FAMILIES:
        raise UnsupportedArchitecture(f"bw24nb.models.qwen35 does not describe family {config.family!r}")
    if not config.layer_types or len(config.layer_types) < config.num_hidden_layers:
        raise ModelFormatError(config.source or "<config>",
                               "hybrid Qwen config has no per-layer layer_types (or "
                               "full_attention_interval); cannot tell DeltaNet layers from attention")
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for i in range(config.num_hidden_layers):
        names += [f"blk.{i}.attn_norm.weight", f"blk.{i}.post_attention_norm.weight"]
        if config.layer_type(i) == FULL_ATTENTION:
            names += attention_tensor_names(i)
        else:
            names += gdn_tensor_names(config, i)
        names += ffn_tensor_names(config, i)
    return names


def load_weights(source) -> Weights:
    """`TensorSource` -> internal float32 tensors (HF or GGUF alike), via the shared loader."""
    from .weights import load_weights as _load
    return _load(source)


def hf_to_internal(source) -> Weights:
    """An HF safetensors source -> internal tensors, with every llama.cpp converter transform."""
    if source.format == "gguf":
        raise ModelFormatError(source.path, "hf_to_internal wants an HF checkpoint; this is GGUF")
    return load_weights(source)


__all__ = ["FAMILIES", "HF_IGNORE", "HF_NAME_RULES", "V_HEAD_ORDER", "convert_gguf", "convert_hf",
           "hf_to_internal", "load_weights", "mtp_tensor_names", "reorder_v_heads", "split_qkvz",
           "tensor_names", "value_to_key_head"]
