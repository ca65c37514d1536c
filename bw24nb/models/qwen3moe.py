"""Qwen3-MoE: Qwen3 attention (qk-norm, no bias) with a sparse MoE FFN in every layer
(except `mlp_only_layers`, and per `decoder_sparse_step`): softmax router over `num_experts`,
top-`num_experts_per_tok`, renormalised when `norm_topk_prob` (modeling_qwen3_moe.py,
`Qwen3MoeSparseMoeBlock`). No shared expert.

HF checkpoints store each expert separately (`mlp.experts.{e}.gate_proj.weight`); llama.cpp's
`Qwen2MoeModel.modify_tensors` stacks them into `ffn_{gate,up,down}_exps [E, out, in]`, which
`weights.stack_experts` reproduces. The router `mlp.gate` becomes `ffn_gate_inp [E, H]`.
"""
from __future__ import annotations

from .qwen2 import HF_IGNORE, HF_NAME_RULES, tensor_names  # noqa: F401  (same layout)

FAMILY = "qwen3moe"
