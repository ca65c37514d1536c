"""Full (softmax) attention mixer with a KV cache — the numpy reference.

One class, `FullAttention(config, weights, layer)`, with the same stateful interface as
`gated_deltanet.GatedDeltaNet`: `prefill(x[T, H]) -> [T, H]`, `decode(x[H]) -> [H]`, `reset()`.
Calls append to the cache, so `prefill(a); prefill(b)` equals `prefill(a + b)` and a decode
step is just a one-token prefill.

Mirrors, in transformers:
- `Qwen2Attention.forward` (modeling_qwen2.py): q/k/v projections with bias, RoPE, GQA.
- `Qwen3Attention.forward` (modeling_qwen3.py): no bias, per-head RMSNorm on q and k (`q_norm`,
  `k_norm`) *before* RoPE.
- `Qwen3_5Attention.forward` / `Qwen3NextAttention.forward`: q_proj yields, per head,
  `[query(head_dim) | gate(head_dim)]` (`.view(T, -1, 2 * head_dim).chunk(2, -1)`); partial
  RoPE on the first `rotary_dim` dims; the attention output (flattened over heads) is
  multiplied by `sigmoid(gate)` before o_proj. Their `(1 + w)` norms arrive already shifted.
"""
from __future__ import annotations

import numpy as np

from .ops import F32, attention, linear, rms_norm, rope, sigmoid


class KVCache:
    """Growable float32 K and V, `[S, n_kv_heads, head_dim]` each (capacity doubles)."""

    def __init__(self, n_kv_heads: int, head_dim: int, capacity: int = 64):
        self._k = np.zeros((capacity, n_kv_heads, head_dim), F32)
        self._v = np.zeros((capacity, n_kv_heads, head_dim), F32)
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        need = self.length + k.shape[0]
        if need > self._k.shape[0]:
            cap = max(need, 2 * self._k.shape[0])
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = np.zeros((cap,) + old.shape[1:], F32)
                new[: self.length] = old[: self.length]
                setattr(self, name, new)
        self._k[self.length:need] = k
        self._v[self.length:need] = v
        self.length = need

    @property
    def k(self) -> np.ndarray:
        return self._k[: self.length]

    @property
    def v(self) -> np.ndarray:
        return self._v[: self.length]

    def truncate(self, length: int) -> None:
        """Forget positions `>= length` (speculative decoding rejects a draft suffix)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length


class FullAttention:
    """Causal GQA self-attention of one layer, with its own KV cache."""

    def __init__(self, config, weights, layer: int):
        self.layer = layer
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.rotary_dim = config.rotary_dim
        self.theta = config.rope_theta
        self.eps = config.rms_norm_eps
        self.output_gate = config.attn_output_gate
        w = weights
        self.wq, self.bq = w.blk(layer, "attn_q.weight"), w.blk_opt(layer, "attn_q.bias")
        self.wk, self.bk = w.blk(layer, "attn_k.weight"), w.blk_opt(layer, "attn_k.bias")
        self.wv, self.bv = w.blk(layer, "attn_v.weight"), w.blk_opt(layer, "attn_v.bias")
        self.wo, self.bo = w.blk(layer, "attn_output.weight"), w.blk_opt(layer, "attn_output.bias")
        self.q_norm = w.blk(layer, "attn_q_norm.weight") if config.qk_norm else None
        self.k_norm = w.blk(layer, "attn_k_norm.weight") if config.qk_norm else None
        q_rows = self.n_heads * self.head_dim * (2 if self.output_gate else 1)
        if self.wq.shape[0] != q_rows:
            raise ValueError(f"blk.{layer}.attn_q.weight has {self.wq.shape[0]} rows, expected "
                             f"{q_rows} (heads={self.n_heads}, head_dim={self.head_dim}, "
                             f"output gate={self.output_gate})")
        self.cache = KVCache(self.n_kv_heads, self.head_dim)

    def reset(self) -> None:
        self.cache = KVCache(self.n_kv_heads, self.head_dim)

    @property
    def position(self) -> int:
        """Absolute position of the next token (= tokens cached so far)."""
        return self.cache.length

    def prefill(self, x: np.ndarray) -> np.ndarray:
        """`x[T, H]` (already attn-normed) -> mixer output `[T, H]`; appends T positions."""
        x = np.asarray(x, F32)
        T = x.shape[0]
        # q/k/v projections (Qwen2: with bias)
        q = linear(x, self.wq, self.bq)
        if self.output_gate:
            # per head [query | gate], each head_dim wide (HF: view(T, -1, 2*D).chunk(2, -1))
            qg = q.reshape(T, self.n_heads, 2 * self.head_dim)
            q, gate = qg[..., : self.head_dim], qg[..., self.head_dim:].reshape(T, -1)
        q = q.reshape(T, self.n_heads, self.head_dim)
        k = linear(x, self.wk, self.bk).reshape(T, self.n_kv_heads, self.head_dim)
        v = linear(x, self.wv, self.bv).reshape(T, self.n_kv_heads, self.head_dim)
        # Qwen3+: RMSNorm over each head's vector, before RoPE
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, self.eps)
            k = rms_norm(k, self.k_norm, self.eps)
        # RoPE at absolute positions (partial: first rotary_dim dims)
        start = self.cache.length
        positions = np.arange(start, start + T)
        q = rope(q, positions, self.theta, self.rotary_dim)
        k = rope(k, positions, self.theta, self.rotary_dim)
        self.cache.append(k, v)
        # causal GQA over everything cached; query t sits at position start + t
        out = attention(q, self.cache.k, self.cache.v, causal_offset=start).reshape(T, -1)
        if self.output_gate:
            out = (out * sigmoid(gate)).astype(F32)
        return linear(out, self.wo, self.bo)

    def decode(self, x: np.ndarray) -> np.ndarray:
        """One token `x[H]` -> `[H]`."""
        return self.prefill(np.asarray(x, F32)[None, :])[0]
