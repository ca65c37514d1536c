"""RoPE and the gated-attention q split (bw24nb/kernels/rope.py) against ops.rope.

Two comparisons per case:
* against the float64 reference `ops.rope`: the kernel's float32 angle pos * inv_freq[i]
  carries up to ~1 ulp of the product plus inv_freq's own float32 rounding (2^-24 relative),
  so the angle error is <= pos * inv_freq * 2^-22 (with margin), which moves each output by at
  most that times |a| + |b|; add ~4 ulps for the float32 multiply-adds.
* against the same algorithm with the float32 angle reproduced in numpy (cos/sin then in
  float64): only the float32 cos/sin/mul-add rounding remains, rtol ~ 1e-6 relative to |a|+|b|.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels.rope import launch_rope, launch_rope_qk, launch_split_q_gate, rope_inv_freq
from bw24nb.reference import ops


def _float32_angle_rope(x, positions, inv_freq):
    """The kernel's recipe with float32 angles, cos/sin in float64."""
    half = inv_freq.shape[0]
    ang = (positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float32)
    c = np.cos(ang.astype(np.float64))[:, None, :]
    s = np.sin(ang.astype(np.float64))[:, None, :]
    a = x[..., :half].astype(np.float64)
    b = x[..., half:2 * half].astype(np.float64)
    out = x.astype(np.float64).copy()
    out[..., :half] = a * c - b * s
    out[..., half:2 * half] = b * c + a * s
    return out


def _check(got, x, positions, theta, rotary_dim, inv_freq):
    half = rotary_dim // 2
    mag = np.zeros_like(x, dtype=np.float64)
    pair = np.abs(x[..., :half]).astype(np.float64) + np.abs(x[..., half:rotary_dim])
    mag[..., :half] = pair
    mag[..., half:rotary_dim] = pair
    # pass-through dims are copied untouched
    np.testing.assert_array_equal(got[..., rotary_dim:], x[..., rotary_dim:])
    # vs the float32-angle recipe: only cos/sin/fma rounding
    err = np.abs(got - _float32_angle_rope(x, positions, inv_freq))
    assert (err <= 1e-6 * mag + 1e-7).all(), err.max()
    # vs the float64 oracle: + the float32 angle error (see module docstring)
    ang_err = positions.astype(np.float64)[:, None, None] * np.concatenate(
        [inv_freq, inv_freq]).astype(np.float64)[None, None, :] * 2.0**-22
    bound = np.zeros_like(mag)
    bound[..., :rotary_dim] = ang_err * mag[..., :rotary_dim]
    err = np.abs(got - ops.rope(x, positions, theta, rotary_dim).astype(np.float64))
    assert (err <= bound + 1e-6 * mag + 1e-7).all(), err.max()


@pytest.mark.parametrize("rotary_dim,theta", [(32, 1e6), (8, 1e7)],
                         ids=["full-rotary", "partial-rotary-quarter"])
def test_rope_matches_reference(rng, rotary_dim, theta):
    T, H, D = 5, 3, 32
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    positions = rng.integers(0, 4000, T).astype(np.int32)    # arbitrary, not consecutive
    inv_freq = rope_inv_freq(theta, rotary_dim)
    d = cuda.to_device(x)
    launch_rope(d, cuda.to_device(positions), cuda.to_device(inv_freq))
    _check(d.copy_to_host(), x, positions, theta, rotary_dim, inv_freq)


def test_rope_qk_one_launch(rng):
    T, Hq, Hkv, D, rd, theta = 4, 4, 2, 16, 16, 1e4
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    positions = (np.arange(T) + rng.integers(0, 100)).astype(np.int32)
    inv_freq = rope_inv_freq(theta, rd)
    qd, kd = cuda.to_device(q), cuda.to_device(k)
    launch_rope_qk(qd, kd, cuda.to_device(positions), cuda.to_device(inv_freq))
    _check(qd.copy_to_host(), q, positions, theta, rd, inv_freq)
    _check(kd.copy_to_host(), k, positions, theta, rd, inv_freq)


def test_rope_position_zero_is_identity(rng):
    x = rng.standard_normal((1, 2, 16)).astype(np.float32)
    d = cuda.to_device(x)
    launch_rope(d, cuda.to_device(np.zeros(1, np.int32)), cuda.to_device(rope_inv_freq(1e4, 16)))
    np.testing.assert_array_equal(d.copy_to_host(), x)


def test_inv_freq_table():
    inv = rope_inv_freq(1e6, 64)
    want = 1.0 / 1e6 ** (np.arange(0, 64, 2) / 64.0)
    assert inv.dtype == np.float32 and inv.shape == (32,)
    np.testing.assert_array_equal(inv, want.astype(np.float32))


def test_split_q_gate(rng):
    T, H, D = 3, 2, 16
    qg = rng.standard_normal((T, H * 2 * D)).astype(np.float32)
    q = cuda.to_device(np.full((T, H, D), np.nan, np.float32))
    gate = cuda.to_device(np.full((T, H, D), np.nan, np.float32))
    launch_split_q_gate(cuda.to_device(qg), q, gate)
    per_head = qg.reshape(T, H, 2 * D)       # HF: view(T, -1, 2D).chunk(2, -1)
    np.testing.assert_array_equal(q.copy_to_host(), per_head[..., :D])
    np.testing.assert_array_equal(gate.copy_to_host(), per_head[..., D:])
