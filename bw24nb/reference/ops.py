"""numpy reference ops: the oracle every kernel is checked against.

Conventions (see docs/ARCHITECTURE.md):
- float32 in, float32 out; reductions accumulate in float64 where that is cheap, so the
  reference is the most exact thing in the repository, not a bit-copy of any one kernel.
- Shapes in numpy order; a linear weight is (out_features, in_features) and `y = W @ x`.
- RMSNorm weights are the *effective* multiplier (llama.cpp's storage): a family whose HF
  RMSNorm computes `x * (1 + w)` has `1 + w` stored at load time (bw24nb.models.weights), so
  `rms_norm` here is always plain `x * w`.

Each function's docstring names the transformers code it mirrors (the specification).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * w`.

    Mirrors `Qwen2RMSNorm` / `Qwen3RMSNorm.forward` (modeling_qwen2.py, modeling_qwen3.py);
    for the `(1 + w)` form of `Qwen3_5RMSNorm` / `Qwen3NextRMSNorm` pass `w` already shifted.
    Used for whole hidden rows (`x[..., H]`) and per head (q_norm/k_norm: `x[..., head_dim]`).
    """
    x64 = np.asarray(x, dtype=F64)
    var = np.mean(x64 * x64, axis=-1, keepdims=True)
    y = x64 / np.sqrt(var + eps)
    return (y * np.asarray(w, dtype=F64)).astype(F32)


def rope_cos_sin(positions: np.ndarray, theta: float, rotary_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables `[T, rotary_dim // 2]` for the NEOX (rotate-half) layout.

    Mirrors `compute_default_rope_parameters` (inv_freq = theta^(-2i/rotary_dim)) and
    `Qwen3RotaryEmbedding.forward` (freqs = position * inv_freq). HF evaluates these in float32;
    we use float64 (differences are ~1e-7 relative, far below the test tolerances).
    """
    half = rotary_dim // 2
    inv_freq = 1.0 / (float(theta) ** (np.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim))
    freqs = np.asarray(positions, dtype=F64)[:, None] * inv_freq[None, :half]
    return np.cos(freqs), np.sin(freqs)


def rope(x: np.ndarray, positions: np.ndarray, theta: float, rotary_dim: int | None = None) -> np.ndarray:
    """Rotary position embedding, NEOX / rotate-half style, on the first `rotary_dim` dims.

    `x[T, n_heads, head_dim]`, `positions[T]` (absolute token positions). Dims
    `[rotary_dim:]` pass through unchanged (partial rotary, Qwen3-Next/3.5).
    Mirrors `rotate_half` + `apply_rotary_pos_emb` (modeling_qwen3.py; the partial form in
    modeling_qwen3_5.py: `q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]`):
    `x_rot * cos + rotate_half(x_rot) * sin` with `rotate_half([a, b]) = [-b, a]`.
    """
    x = np.asarray(x, dtype=F32)
    head_dim = x.shape[-1]
    rd = head_dim if rotary_dim is None else int(rotary_dim)
    if rd % 2 or rd > head_dim:
        raise ValueError(f"rotary_dim={rd} must be even and <= head_dim={head_dim}")
    cos, sin = rope_cos_sin(positions, theta, rd)        # [T, rd/2]
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    half = rd // 2
    a = x[..., :half].astype(F64)
    b = x[..., half:rd].astype(F64)
    out = x.copy()
    out[..., :half] = (a * cos - b * sin).astype(F32)
    out[..., half:rd] = (b * cos + a * sin).astype(F32)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU / swish: `x * sigmoid(x)` (transformers `ACT2FN["silu"]`)."""
    x64 = np.asarray(x, dtype=F64)
    return (x64 / (1.0 + np.exp(-x64))).astype(F32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid (`torch.sigmoid`), used by output gates and the shared-expert gate."""
    x64 = np.asarray(x, dtype=F64)
    return (1.0 / (1.0 + np.exp(-x64))).astype(F32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """`silu(gate) * up`: the inner product of `Qwen2MLP.forward` /`Qwen3MLP.forward`
    (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`)."""
    g = np.asarray(gate, dtype=F64)
    return (g / (1.0 + np.exp(-g)) * np.asarray(up, dtype=F64)).astype(F32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax (`torch.nn.functional.softmax(..., dtype=float32)`);
    `-inf` entries get probability 0."""
    x64 = np.asarray(x, dtype=F64)
    m = np.max(x64, axis=axis, keepdims=True)
    e = np.exp(x64 - m)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(F32)


# Weights up to this many elements are multiplied in float64 (cheap); larger ones in float32.
# Upcasting a real model's weights on every call allocated and read a float64 copy per token
# (1.1 GB for the 0.5B model's LM head alone) and made CPU decode ~10x slower.
F64_LINEAR_MAX_ELEMENTS = 1 << 17


def linear(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """`y = x @ W.T + b` for `x[..., in]`, `W[out, in]` (`torch.nn.functional.linear`).

    float64 accumulation for small weights (the test fixtures: prefill and decode then agree to
    ~1e-7), float32 BLAS for big ones: float32 accumulation over K terms errs by ~K * 2^-24
    relative at worst (3e-4 at K = 4864), ~1e-6 typically.
    """
    dt = F64 if np.size(W) <= F64_LINEAR_MAX_ELEMENTS else F32
    y = np.asarray(x, dtype=dt) @ np.asarray(W, dtype=dt).T
    if b is not None:
        y = y + np.asarray(b, dtype=dt)
    return y.astype(F32, copy=False)


def matvec(W: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """`y = W @ x (+ b)` for one vector `x[in]`, `W[out, in]`: the decode-time linear."""
    return linear(np.asarray(x)[None, :], W, b)[0]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal_offset: int = 0,
              scale: float | None = None) -> np.ndarray:
    """Causal grouped-query attention.

    `q[T, Hq, D]`, `k[S, Hkv, D]`, `v[S, Hkv, D]` -> `out[T, Hq, D]`. Query row `t` sits at
    absolute position `causal_offset + t` and sees keys `0 .. causal_offset + t` (the cache
    holds positions `0 .. S-1`; for a prefill from empty `causal_offset = 0, S = T`, for one
    decode step `T = 1, causal_offset = S - 1`). Query head `h` reads KV head
    `h // (Hq // Hkv)` (`repeat_kv`). Scale defaults to `1/sqrt(D)`.
    Mirrors `eager_attention_forward` in modeling_qwen3.py with the causal mask.
    """
    q = np.asarray(q, dtype=F64)
    k = np.asarray(k, dtype=F64)
    v = np.asarray(v, dtype=F64)
    T, Hq, D = q.shape
    S, Hkv, _ = k.shape
    if Hq % Hkv:
        raise ValueError(f"query heads {Hq} not a multiple of kv heads {Hkv}")
    if causal_offset + T > S:
        raise ValueError(f"causal_offset {causal_offset} + T {T} exceeds key length {S}")
    n_rep = Hq // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    allowed = np.arange(S)[None, :] <= (causal_offset + np.arange(T))[:, None]   # [T, S]
    out = np.empty((T, Hq, D), F32)
    # One KV head (and its n_rep query heads) at a time: scores stay [n_rep, T, S], so a
    # long real-model prefill does not need Hq * T * S float64s at once.
    for g in range(Hkv):
        qs = q[:, g * n_rep:(g + 1) * n_rep]                             # [T, n_rep, D]
        scores = np.einsum("thd,sd->hts", qs, k[:, g]) * scale           # [n_rep, T, S]
        scores = np.where(allowed[None], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[:, g * n_rep:(g + 1) * n_rep] = np.einsum("hts,sd->thd", p, v[:, g])
    return out
