"""numpy reference for a sparse mixture-of-experts MLP block (router + experts + shared expert).

Mirrors, in transformers:
- `Qwen3MoeTopKRouter` + `Qwen3MoeExperts` + `Qwen3MoeSparseMoeBlock` (modeling_qwen3_moe.py):
  softmax over all experts in float32, top-k, optional renormalisation of the k weights
  (`norm_topk_prob`), each chosen expert a SwiGLU MLP, outputs summed with the router weights.
- `Qwen2MoeSparseMoeBlock` / `Qwen3NextSparseMoeBlock` / `Qwen3_5MoeSparseMoeBlock`: the same
  plus a shared expert (a SwiGLU MLP every token runs) scaled by `sigmoid(x @ shared_gate_w.T)`.
  (Qwen3.5-MoE always renormalises: pass `norm_topk_prob=True`.)

Expert weights are stacked the way llama.cpp stores them (`ffn_gate_exps` etc.):
`gate[E, I, H]`, `up[E, I, H]`, `down[E, H, I]`.
"""
from __future__ import annotations

import numpy as np

from .ops import F32, F64, linear, sigmoid, softmax, swiglu


def route(x: np.ndarray, router_w: np.ndarray, top_k: int,
          norm_topk_prob: bool) -> tuple[np.ndarray, np.ndarray]:
    """Router: `(indices[T, k] int64, weights[T, k] float32)`, best expert first.

    `probs = softmax(x @ router_w.T)`; the k largest (ties: lower expert id first, which is
    what `torch.topk` does on CPU in practice); divided by their sum if `norm_topk_prob`.
    """
    logits = linear(np.atleast_2d(x), router_w)              # [T, E]
    probs = softmax(logits, axis=-1).astype(F64)
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, order, axis=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return order.astype(np.int64), weights.astype(F32)


def expert_mlp(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """One SwiGLU expert: `down @ (silu(gate @ x) * (up @ x))` for `x[..., H]`
    (`Qwen3MoeMLP.forward`, one slice of `Qwen3MoeExperts.forward`)."""
    return linear(swiglu(linear(x, gate), linear(x, up)), down)


def moe_forward(x: np.ndarray, router_w: np.ndarray, experts, top_k: int, norm_topk_prob: bool,
                shared=None, shared_gate_w: np.ndarray | None = None) -> np.ndarray:
    """Sparse MoE block for `x[T, H]` (or `x[H]`) -> same shape.

    `experts` = `(gate[E, I, H], up[E, I, H], down[E, H, I])`;
    `shared` = `(gate[Is, H], up[Is, H], down[H, Is])` or None;
    `shared_gate_w[1, H]` (or `[H]`) or None (an ungated shared expert is simply added).
    """
    x = np.asarray(x, dtype=F32)
    squeeze = x.ndim == 1
    x2 = np.atleast_2d(x)
    gate_e, up_e, down_e = experts
    idx, wts = route(x2, router_w, top_k, norm_topk_prob)
    out = np.zeros(x2.shape, dtype=F64)
    for t in range(x2.shape[0]):
        for j in range(top_k):
            e = int(idx[t, j])
            y = expert_mlp(x2[t], gate_e[e], up_e[e], down_e[e])
            out[t] += F64(wts[t, j]) * y.astype(F64)
    if shared is not None:
        s_gate, s_up, s_down = shared
        ys = expert_mlp(x2, s_gate, s_up, s_down).astype(F64)
        if shared_gate_w is not None:
            g = sigmoid(linear(x2, np.asarray(shared_gate_w).reshape(1, -1)))   # [T, 1]
            ys = ys * g.astype(F64)
        out += ys
    out = out.astype(F32)
    return out[0] if squeeze else out
