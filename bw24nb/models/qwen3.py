"""Qwen3 (dense): Qwen2's layout without Q/K/V biases, plus a per-head RMSNorm on q and k
(`q_norm`/`k_norm` -> `attn_q_norm`/`attn_k_norm`) applied before RoPE
(modeling_qwen3.py, `Qwen3Attention.forward`). `head_dim` is explicit in the config and need not
equal `hidden_size / num_attention_heads`. llama.cpp's `Qwen3Model(Qwen2Model)` only renames.
"""
from __future__ import annotations

from .qwen2 import HF_IGNORE, HF_NAME_RULES, tensor_names  # noqa: F401  (same layout)

FAMILY = "qwen3"
