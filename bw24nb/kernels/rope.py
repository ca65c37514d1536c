"""Rotary position embedding (NEOX / rotate-half, partial) and the gated-attention q split.

Reference: bw24nb/reference/ops.py `rope(x, positions, theta, rotary_dim)`.

For each token t, head h and pair i < rotary_dim / 2:
    a, b = x[t, h, i], x[t, h, i + rotary_dim/2]
    angle = positions[t] * inv_freq[i]
    x[t, h, i]              = a * cos(angle) - b * sin(angle)
    x[t, h, i + rotary_dim/2] = b * cos(angle) + a * sin(angle)
dims >= rotary_dim pass through (Qwen3-Next/3.5 rotate only the first quarter of a head).

Precision: `inv_freq[i] = theta ** (-2i / rotary_dim)` is computed on the host in float64 and
cast to float32 once (`rope_inv_freq`); on the device the angle is the float32 product
`float32(position) * inv_freq[i]` and cos/sin are float32 libdevice calls — the same float32
angle transformers computes (`inv_freq @ position_ids` in float32). At position p the angle
carries ~p * 2^-24 relative rounding, e.g. ~1e-3 rad absolute at p = 32k on the fastest pair,
identically in HF; the float64 numpy reference differs from both by that much.

Positions come from a device array (int32 [T]) so that one captured CUDA graph serves every
decode step: the step just rewrites `positions[0]`.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from ..jit import kernel
from ..ptx import fma_f32

# Elementwise over (token, head, pair): 128 threads per block, a common choice for
# latency-bound small kernels (a decode step has only (Hq + Hkv) * rotary_dim/2 pairs).
ROPE_THREADS = 128


def rope_inv_freq(theta: float, rotary_dim: int) -> np.ndarray:
    """float32[rotary_dim // 2]: theta^(-2i/rotary_dim), evaluated in float64 then cast."""
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim {rotary_dim} must be even")
    i = np.arange(0, rotary_dim, 2, dtype=np.float64)
    return (1.0 / float(theta) ** (i / rotary_dim)).astype(np.float32)


@cuda.jit(device=True)
def rotate_pair(x, t, h, i, half, angle):
    """x[t, h, i], x[t, h, i + half] rotated by `angle` (NEOX pairing); also cache/kv.py's
    kv_store_rope for q."""
    x[t, h, i], x[t, h, i + half] = rotated(x[t, h, i], x[t, h, i + half], angle)


@cuda.jit(device=True, inline="always")
def rotated(a, b, angle):
    """The pair (a, b) rotated by `angle`: `rotate_pair`'s arithmetic on loaded values (the
    one-pass decode attention rotates q this way, from registers). The fused multiply-adds are
    written out: a c - b s with a c fused, b c + a s with a s fused -- the contraction NVVM
    chose for the expressions until session 44, when moving them into this function made it
    fuse b c instead (other bits in every rotated pair's second element)."""
    c = math.cos(angle)
    s = math.sin(angle)
    return fma_f32(a, c, -(b * s)), fma_f32(a, s, b * c)


@cuda.jit(device=True)
def roped_value(x, t, h, e, half, angle_pos, inv_freq):
    """Element e of x[t, h, :] after NEOX RoPE at position angle_pos (rotary_dim = 2 * half):
    `rotate_pair`'s arithmetic, element by element (cache/kv.py's kv_store_rope and the
    one-pass decode attention rotate K this way on its way into the cache)."""
    if e >= 2 * half:
        return x[t, h, e]
    p, i = rope_partner(e, half)
    return roped_from(x[t, h, e], x[t, h, p], e, half, angle_pos * inv_freq[i])


@cuda.jit(device=True, inline="always")
def rope_partner(e, half):
    """(p, i) for element e < 2 * half of a NEOX-rotated row: the element it pairs with and
    its frequency's index."""
    if e < half:
        return e + half, e
    return e - half, e - half


@cuda.jit(device=True, inline="always")
def roped_from(xe, xp, e, half, ang):
    """`roped_value` from loaded values: xe = element e, xp = its partner (`rope_partner`),
    ang = angle_pos * inv_freq[i] -- the same operations in the same order, so a kernel can
    issue the loads before it knows the position."""
    if e < half:                    # `rotated`'s first element (a = xe, b = xp)
        return rotated(xe, xp, ang)[0]
    if e < 2 * half:                # its second (a = xp, b = xe)
        return rotated(xp, xe, ang)[1]
    return xe


@kernel
def rope_neox(x, positions, inv_freq):
    """In place on x[T, H, D]; rotary_dim = 2 * len(inv_freq). One thread per (t, h, pair)."""
    half = inv_freq.shape[0]
    T, H, _ = x.shape
    n = cuda.grid(1)
    if n >= T * H * half:
        return
    i = n % half
    h = (n // half) % H
    t = n // (half * H)
    rotate_pair(x, t, h, i, half, float32(positions[t]) * inv_freq[i])


@kernel
def rope_neox_qk(q, k, positions, inv_freq):
    """`rope_neox` on q[T, Hq, D] and k[T, Hkv, D] in one launch (threads for q first)."""
    half = inv_freq.shape[0]
    T, Hq, _ = q.shape
    Hk = k.shape[1]
    n = cuda.grid(1)
    nq = T * Hq * half
    if n < nq:
        i = n % half
        h = (n // half) % Hq
        t = n // (half * Hq)
        rotate_pair(q, t, h, i, half, float32(positions[t]) * inv_freq[i])
    elif n < nq + T * Hk * half:
        n -= nq
        i = n % half
        h = (n // half) % Hk
        t = n // (half * Hk)
        rotate_pair(k, t, h, i, half, float32(positions[t]) * inv_freq[i])


@kernel
def split_q_gate(qg, q, gate):
    """Qwen3-Next/3.5 gated attention: q_proj yields per head [query(D) | gate(D)].
    qg[T, H, 2D] -> q[T, H, D], gate[T, H, D]. One thread per (t, h, d)."""
    T, H, D = q.shape
    n = cuda.grid(1)
    if n >= T * H * D:
        return
    d = n % D
    h = (n // D) % H
    t = n // (D * H)
    q[t, h, d] = qg[t, h, d]
    gate[t, h, d] = qg[t, h, D + d]


# ------------------------------------------------------------------ launchers


def _grid(n: int) -> int:
    return max(1, (n + ROPE_THREADS - 1) // ROPE_THREADS)


def launch_rope(x, positions, inv_freq, stream=0):
    """In-place NEOX RoPE on `x[T, H, D]` at `positions[T]` (int32 device array) with the
    device table `inv_freq` from `rope_inv_freq(theta, rotary_dim)`."""
    T, H, D = x.shape
    half = inv_freq.shape[0]
    if 2 * half > D:
        raise ValueError(f"rotary_dim {2 * half} exceeds head_dim {D}")
    rope_neox[_grid(T * H * half), ROPE_THREADS, stream](x, positions, inv_freq)


def launch_rope_qk(q, k, positions, inv_freq, stream=0):
    """In-place NEOX RoPE on q[T, Hq, D] and k[T, Hkv, D] in one launch."""
    T, Hq, D = q.shape
    half = inv_freq.shape[0]
    if 2 * half > D or k.shape[0] != T or k.shape[2] != D:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, rotary_dim {2 * half}")
    n = T * (Hq + k.shape[1]) * half
    rope_neox_qk[_grid(n), ROPE_THREADS, stream](q, k, positions, inv_freq)


def launch_split_q_gate(qg, q, gate, stream=0):
    """Split the gated q_proj output `qg[T, H * 2D]` (or `[T, H, 2D]`) into q[T, H, D] and
    gate[T, H, D]. Reference: reference/attention.py (`view(T, -1, 2D).chunk(2, -1)`)."""
    T, H, D = q.shape
    qg3 = qg.reshape(T, H, 2 * D)
    split_q_gate[_grid(T * H * D), ROPE_THREADS, stream](qg3, q, gate)


_A3 = "float32[:, :, ::1]"
PTX_SIGNATURES = {
    "rope_neox": [f"void({_A3}, int32[::1], float32[::1])"],
    "rope_neox_qk": [f"void({_A3}, {_A3}, int32[::1], float32[::1])"],
    "split_q_gate": [f"void({_A3}, {_A3}, {_A3})"],
}
