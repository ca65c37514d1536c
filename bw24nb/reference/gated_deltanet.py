"""numpy reference for the Gated DeltaNet linear-attention mixer (Qwen3-Next, Qwen3.5, Qwen3.5-MoE).

The specification is transformers' `Qwen3_5GatedDeltaNet` / `Qwen3NextGatedDeltaNet`
(modeling_qwen3_5.py, modeling_qwen3_next.py). One token mix, for `x[T, H]`:

    qkv = W_qkv x                                    (attn_qkv; HF in_proj_qkv)
    z   = W_z x                                      (attn_gate; HF in_proj_z)
    b, a = W_beta x, W_alpha x                       (ssm_beta / ssm_alpha; HF in_proj_b / in_proj_a)
    qkv = silu(causal_depthwise_conv1d(qkv))         (ssm_conv1d, kernel 4, rolling state)
    q, k, v = split(qkv);  q, k = l2norm(q), l2norm(k)   (eps 1e-6, as HF's `l2norm`)
    q, k   = repeat key heads onto value heads        (GQA-style; the map depends on the layout)
    beta = sigmoid(b);  g = ssm_a * softplus(a + ssm_dt.bias)     (ssm_a = -exp(A_log), log-decay)
    o = gated delta rule(q / sqrt(d_k), k, v, g, beta)          (per value head, state S[d_k, d_v])
    y = W_out (rms_norm(o) * ssm_norm * silu(z))                (Qwen3_5RMSNormGated: plain w)

The gated delta rule, one step (`torch_recurrent_gated_delta_rule`):

    S <- exp(g_t) S
    S <- S + k_t (beta_t (v_t - S^T k_t))^T          (the delta rule: write only the correction)
    o_t = S^T q_t

Prefill runs the same recurrence 64 tokens at a time (`torch_chunk_gated_delta_rule`): inside a
chunk the rank-one updates are folded into one unit-lower-triangular solve (the "UT transform"),
then the chunk reads the carried state once and writes it once. Both forms are here so tests can
hold them equal; the GPU kernels mirror them (prefill chunked, decode recurrent).

Weights are read under the internal (llama.cpp GGUF) names, so they arrive in GGUF order: for
Qwen3.5 with fewer key heads than value heads, llama.cpp's converter reorders the value heads
from HF's grouped order to a tiled one. Which key head serves which value head is therefore a
property of the family, defined once in `bw24nb.models.qwen35.value_to_key_head`.

Precision: float32 storage (weights, conv and recurrent states between calls), float64 math.
"""
from __future__ import annotations

import numpy as np

from ..errors import MissingTensor
from ..models.qwen35 import value_to_key_head   # the value/key head layout is the converter's fact
from .ops import F32, F64, linear, rms_norm, sigmoid, silu

# HF `l2norm(x, eps=1e-6)`: x * rsqrt(sum(x^2) + eps), a constant independent of rms_norm_eps.
L2NORM_EPS = 1e-6
# HF `torch_chunk_gated_delta_rule(chunk_size=64)`; also the chunk our prefill kernel uses.
CHUNK_SIZE = 64


def l2norm(x: np.ndarray, eps: float = L2NORM_EPS) -> np.ndarray:
    """`x / sqrt(sum(x^2, -1) + eps)` over the last axis (HF `l2norm`), float64 out."""
    x = np.asarray(x, dtype=F64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def softplus(x: np.ndarray) -> np.ndarray:
    """`log(1 + exp(x))`, overflow-safe (torch's threshold=20 shortcut differs by < 1e-8)."""
    return np.logaddexp(0.0, np.asarray(x, dtype=F64))


def causal_conv1d(x: np.ndarray, weight: np.ndarray,
                  state: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Causal depthwise conv over time: `x[T, C]`, `weight[C, K]`, `state[K-1, C]` (the previous
    K-1 inputs, zeros at the start) -> `(y[T, C] float64, new_state[K-1, C] float32)`.

    `y[t, c] = sum_j weight[c, j] * x[t - (K-1) + j, c]`, i.e. torch's `F.conv1d(...,
    padding=K-1, groups=C)[..., :T]` (`causal_conv1d_fn`) when the state is zero, and
    `causal_conv1d_update` when it holds earlier tokens. No bias (Qwen's conv1d has none).
    """
    x = np.asarray(x, dtype=F64)
    w = np.asarray(weight, dtype=F64)
    T, C = x.shape
    K = w.shape[1]
    if state is None:
        state = np.zeros((K - 1, C), dtype=F32)
    xp = np.concatenate([np.asarray(state, dtype=F64), x], axis=0)       # [K-1+T, C]
    y = np.zeros((T, C), dtype=F64)
    for j in range(K):
        y += w[:, j] * xp[j:j + T]
    return y, xp[T:].astype(F32)


def gated_delta_rule_recurrent(q, k, v, g, beta, state=None) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token gated delta rule (HF `torch_recurrent_gated_delta_rule`).

    `q, k[T, Hv, dk]` already L2-normalised and repeated onto the value heads, `v[T, Hv, dv]`,
    `g, beta[T, Hv]`, `state[Hv, dk, dv]` (None = zeros). q is scaled by `1/sqrt(dk)` here, as HF
    does inside the function. Returns `(o[T, Hv, dv] float64, final state float64)`.
    """
    q = np.asarray(q, dtype=F64) * (q.shape[-1] ** -0.5)
    k, v = np.asarray(k, dtype=F64), np.asarray(v, dtype=F64)
    g, beta = np.asarray(g, dtype=F64), np.asarray(beta, dtype=F64)
    T, Hv, dk = k.shape
    dv = v.shape[-1]
    S = np.zeros((Hv, dk, dv), dtype=F64) if state is None else np.array(state, dtype=F64)
    o = np.empty((T, Hv, dv), dtype=F64)
    for t in range(T):
        S *= np.exp(g[t])[:, None, None]                                  # decay
        kv_mem = np.einsum("hk,hkv->hv", k[t], S)                         # what S predicts for k_t
        delta = (v[t] - kv_mem) * beta[t][:, None]                        # the correction
        S += k[t][:, :, None] * delta[:, None, :]                         # rank-one write
        o[t] = np.einsum("hk,hkv->hv", q[t], S)                           # read
    return o, S


def gated_delta_rule_chunked(q, k, v, g, beta, state=None,
                             chunk_size: int = CHUNK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """The same recurrence, `chunk_size` tokens at a time (HF `torch_chunk_gated_delta_rule`).

    Same arguments and results as `gated_delta_rule_recurrent`. Within a chunk of length L with
    cumulative log-decay `c_i = g_0 + ... + g_i` and `D[i, j] = exp(c_i - c_j)` for j <= i:

        M = I + strict_lower((beta k) k^T * D)                (the UT system, unit lower triangular)
        u = M^-1 (beta v),   w = M^-1 (beta k exp(c))          (new values; keys reading old S)
        v' = u - w S
        o  = (q exp(c)) S + ((q k^T) * D) v'                   (inter-chunk read + intra-chunk)
        S  = exp(c_last) S + (k exp(c_last - c))^T v'

    HF pads the last chunk with zeros; a zero-padded position has beta = 0 and g = 0 so it changes
    nothing, and we simply run a shorter last chunk instead.
    """
    q = np.asarray(q, dtype=F64) * (q.shape[-1] ** -0.5)
    k, v = np.asarray(k, dtype=F64), np.asarray(v, dtype=F64)
    g, beta = np.asarray(g, dtype=F64), np.asarray(beta, dtype=F64)
    T, Hv, dk = k.shape
    dv = v.shape[-1]
    S = np.zeros((Hv, dk, dv), dtype=F64) if state is None else np.array(state, dtype=F64)
    o = np.empty((T, Hv, dv), dtype=F64)
    for c0 in range(0, T, chunk_size):
        sl = slice(c0, min(c0 + chunk_size, T))
        qc, kc, vc = (a[sl].transpose(1, 0, 2) for a in (q, k, v))        # [Hv, L, d]
        gc, bc = g[sl].T, beta[sl].T                                      # [Hv, L]
        L = gc.shape[1]
        cum = np.cumsum(gc, axis=1)                                       # log decay from chunk start
        lower = np.tril(np.ones((L, L), dtype=bool))
        # exp only where j <= i (the masked entries could overflow), as HF masks with -inf
        decay = np.where(lower, np.exp(np.where(lower, cum[:, :, None] - cum[:, None, :], 0.0)), 0.0)
        kb = kc * bc[:, :, None]
        vb = vc * bc[:, :, None]
        M = np.eye(L) + np.tril(np.einsum("hik,hjk->hij", kb, kc) * decay, -1)
        u = np.linalg.solve(M, vb)                                        # [Hv, L, dv]
        w = np.linalg.solve(M, kb * np.exp(cum)[:, :, None])              # [Hv, L, dk]
        v_new = u - w @ S
        intra = np.einsum("hik,hjk->hij", qc, kc) * decay
        o[sl] = ((qc * np.exp(cum)[:, :, None]) @ S + intra @ v_new).transpose(1, 0, 2)
        last = cum[:, -1:]                                                # [Hv, 1]
        S = S * np.exp(last)[:, :, None] + (kc * np.exp(last - cum)[:, :, None]).transpose(0, 2, 1) @ v_new
    return o, S


def gated_rms_norm(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """`rms_norm(x) * weight * silu(gate)` over the last axis (HF `Qwen3_5RMSNormGated`: the
    weight is used as is, initialised to ones, *not* the `1 + w` form; llama.cpp's `ssm_norm`
    is stored unshifted accordingly)."""
    return (rms_norm(x, weight, eps).astype(F64) * silu(gate).astype(F64)).astype(F32)


def _tensor(weights, name: str) -> np.ndarray:
    try:
        return np.asarray(weights[name], dtype=F32)
    except KeyError:
        raise MissingTensor(getattr(weights, "source", "") or "<weights>",
                            f"tensor {name!r} is missing; a Gated DeltaNet layer needs it") from None


class GatedDeltaNet:
    """One linear-attention layer's mixer with its caches (conv window + recurrent state).

    `GatedDeltaNet(config, weights, layer_index)` reads `blk.{i}.attn_qkv / attn_gate /
    ssm_beta / ssm_alpha (or qwen3next's fused ssm_ba) / ssm_conv1d / ssm_dt.bias / ssm_a /
    ssm_norm / ssm_out`. `prefill(x[T, H])` runs the chunked form, `decode(x[H])` the recurrent
    one; both continue from (and update) the current state. `reset()` empties it.
    """

    def __init__(self, config, weights, layer_index: int):
        p = f"blk.{layer_index}."
        self.layer_index = layer_index
        self.eps = float(config.rms_norm_eps)
        self.nk, self.nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.key_head = value_to_key_head(config.family, self.nk, self.nv)     # [nv] -> key head

        self.w_qkv = _tensor(weights, p + "attn_qkv.weight")          # [2*key_dim + value_dim, H]
        self.w_z = _tensor(weights, p + "attn_gate.weight")           # [value_dim, H]
        if (p + "ssm_ba.weight") in weights:
            # qwen3next keeps in_proj_ba fused, per key head: [b (nv/nk rows), a (nv/nk rows)]
            ba = _tensor(weights, p + "ssm_ba.weight")
            r = self.nv // self.nk
            ba = ba.reshape(self.nk, 2 * r, -1)
            self.w_beta = np.ascontiguousarray(ba[:, :r].reshape(self.nv, -1))
            self.w_alpha = np.ascontiguousarray(ba[:, r:].reshape(self.nv, -1))
        else:
            self.w_beta = _tensor(weights, p + "ssm_beta.weight")      # [nv, H]
            self.w_alpha = _tensor(weights, p + "ssm_alpha.weight")    # [nv, H]
        self.conv_w = _tensor(weights, p + "ssm_conv1d.weight")       # [conv_dim, K]
        self.dt_bias = _tensor(weights, p + "ssm_dt.bias")            # [nv]
        self.ssm_a = _tensor(weights, p + "ssm_a")                    # [nv] = -exp(A_log)
        self.norm_w = _tensor(weights, p + "ssm_norm.weight")         # [dv]
        self.w_out = _tensor(weights, p + "ssm_out.weight")           # [H, value_dim]

        conv_dim = 2 * self.key_dim + self.value_dim
        if self.w_qkv.shape[0] != conv_dim or self.conv_w.shape[0] != conv_dim:
            raise MissingTensor(getattr(weights, "source", "") or "<weights>",
                                f"layer {layer_index}: attn_qkv rows {self.w_qkv.shape[0]} / "
                                f"ssm_conv1d channels {self.conv_w.shape[0]} != 2*{self.key_dim}"
                                f"+{self.value_dim}; the config's linear_* head counts do not "
                                f"match the checkpoint")
        self.kernel = self.conv_w.shape[1]
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: zero conv window and recurrent state."""
        self.conv_state = np.zeros((self.kernel - 1, 2 * self.key_dim + self.value_dim), dtype=F32)
        self.ssm_state = np.zeros((self.nv, self.dk, self.dv), dtype=F32)

    def _inputs(self, x: np.ndarray):
        """Projections, conv (updating its window), activations: q, k, v, g, beta, z."""
        T = x.shape[0]
        qkv = linear(x, self.w_qkv)
        z = linear(x, self.w_z).reshape(T, self.nv, self.dv)
        b = linear(x, self.w_beta)
        a = linear(x, self.w_alpha)
        conv, self.conv_state = causal_conv1d(qkv, self.conv_w, self.conv_state)
        qkv = silu(conv)
        q = qkv[:, :self.key_dim].reshape(T, self.nk, self.dk)
        k = qkv[:, self.key_dim:2 * self.key_dim].reshape(T, self.nk, self.dk)
        v = qkv[:, 2 * self.key_dim:].reshape(T, self.nv, self.dv)
        q = l2norm(q)[:, self.key_head]                                  # [T, nv, dk]
        k = l2norm(k)[:, self.key_head]
        beta = sigmoid(b).astype(F64)
        g = self.ssm_a.astype(F64) * softplus(a.astype(F64) + self.dt_bias)
        return q, k, v, g, beta, z

    def _output(self, o: np.ndarray, z: np.ndarray) -> np.ndarray:
        y = gated_rms_norm(o, z, self.norm_w, self.eps)                  # [T, nv, dv]
        return linear(y.reshape(y.shape[0], self.value_dim), self.w_out)

    def prefill(self, x: np.ndarray) -> np.ndarray:
        """`x[T, H]` (the normed residual stream) -> `y[T, H]`, chunked form."""
        x = np.atleast_2d(np.asarray(x, dtype=F32))
        q, k, v, g, beta, z = self._inputs(x)
        o, S = gated_delta_rule_chunked(q, k, v, g, beta, self.ssm_state)
        self.ssm_state = S.astype(F32)
        return self._output(o, z)

    def decode(self, x: np.ndarray) -> np.ndarray:
        """`x[H]` -> `y[H]`, one recurrent step."""
        x = np.asarray(x, dtype=F32).reshape(1, -1)
        q, k, v, g, beta, z = self._inputs(x)
        o, S = gated_delta_rule_recurrent(q, k, v, g, beta, self.ssm_state)
        self.ssm_state = S.astype(F32)
        return self._output(o, z)[0]


__all__ = ["CHUNK_SIZE", "L2NORM_EPS", "GatedDeltaNet", "causal_conv1d", "gated_delta_rule_chunked",
           "gated_delta_rule_recurrent", "gated_rms_norm", "l2norm", "softplus"]
