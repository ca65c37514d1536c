"""Qwen2 (and the shared dense-Qwen layout Qwen3 / Qwen3-MoE build on).

Layer recipe (transformers modeling_qwen2.py, `Qwen2DecoderLayer.forward`):
    h = h + o_proj(attention(rope(q_proj(norm(h)) + bq), rope(k_proj(.) + bk), v_proj(.) + bv))
    h = h + down(silu(gate(norm(h))) * up(norm(h)))
Q/K/V carry biases, no q/k norm, full rotary, GQA. Qwen2-0.5B/1.5B tie the LM head to the
embedding (`tie_word_embeddings`). llama.cpp's converter (`Qwen2Model` in convert_hf_to_gguf.py)
only renames: no Q/K permutation (Qwen uses rotate-half RoPE, which llama.cpp runs as NEOX).
"""
from __future__ import annotations

from .weights import QWEN_HF_NAME_RULES

FAMILY = "qwen2"

HF_NAME_RULES = QWEN_HF_NAME_RULES
# Buffers some exporters write; they carry nothing the model needs.
HF_IGNORE = (r".*rotary_emb\.inv_freq",)


def attention_tensor_names(config, layer: int) -> list[str]:
    """Full-attention mixer tensors of `layer` (bias / qk-norm per the config flags)."""
    p = f"blk.{layer}."
    names = [p + "attn_norm.weight", p + "attn_q.weight", p + "attn_k.weight",
             p + "attn_v.weight", p + "attn_output.weight"]
    if config.attention_bias:
        names += [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"]
    if config.qk_norm:
        names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
    return names


def mlp_tensor_names(config, layer: int) -> list[str]:
    """FFN tensors of `layer`: dense SwiGLU, or router + stacked experts (+ shared expert)."""
    p = f"blk.{layer}."
    if not config.is_moe_layer(layer):
        return [p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]
    names = [p + "ffn_gate_inp.weight", p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight",
             p + "ffn_down_exps.weight"]
    if config.shared_expert_intermediate_size:
        names += [p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight",
                  p + "ffn_down_shexp.weight", p + "ffn_gate_inp_shexp.weight"]
    return names


def tensor_names(config) -> list[str]:
    """Every internal tensor a dense/MoE Qwen transformer needs."""
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for i in range(config.num_hidden_layers):
        names += attention_tensor_names(config, i)
        names.append(f"blk.{i}.ffn_norm.weight")
        names += mlp_tensor_names(config, i)
    return names
