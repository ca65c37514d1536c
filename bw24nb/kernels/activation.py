"""Elementwise kernels of the layer recipe: SwiGLU, sigmoid output gate, residual add.

References (bw24nb/reference/ops.py): `swiglu(gate, up)` = silu(gate) * up, `sigmoid(x)`,
plain `a + b`. float32 throughout: silu(g) = g / (1 + exp(-g)) (for g -> -inf, exp(-g) = inf
and the quotient is -0, no NaN), sigmoid(g) = 1 / (1 + exp(-g)).

All kernels are grid-stride loops over flattened contiguous arrays; the launchers flatten.
Every output may alias an input (each element is read and written by one thread).
"""
from __future__ import annotations

import math

from numba import cuda, float32

from ..jit import kernel
from ..ptx import warp_max
from .quantize_act import q8_code

# 256 threads, at most ELEMWISE_BLOCKS_MAX blocks, grid-stride beyond: enough to fill an H200
# (132 SMs x 8 resident blocks of 256 at 2048 threads/SM) without a launch per element.
ELEMWISE_THREADS = 256
ELEMWISE_BLOCKS_MAX = 1056


@cuda.jit(device=True)
def silu(g):
    return g / (float32(1.0) + math.exp(-g))


@cuda.jit(device=True)
def sigmoid(g):
    return float32(1.0) / (float32(1.0) + math.exp(-g))


@kernel
def swiglu(g, u, y):
    """y = silu(g) * u (1-D, same length)."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.shape[0], step):
        y[i] = silu(g[i]) * u[i]


@kernel
def swiglu_q8(g, u, y, xq, xd):
    """swiglu, and its output quantized as quantize_act_q8 would (decode: ffn_down's int8 input,
    one launch instead of two). n % 32 == 0 and the launch's blocks are whole warps, so every
    warp step covers one 32-value block: its amax is a warp_max."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.shape[0], step):
        v = silu(g[i]) * u[i]
        y[i] = v
        q, d = q8_code(v, warp_max(abs(v)))
        xq[i] = q
        if (i & 31) == 0:
            xd[i >> 5] = d


@kernel
def swiglu_fused(gu, y):
    """gu[N, 2F] holds [gate | up] per row (one matmul with the gate and up weights stacked);
    y[N, F] = silu(gate) * up."""
    N, F = y.shape
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, N * F, step):
        r = i // F
        c = i - r * F
        y[r, c] = silu(gu[r, c]) * gu[r, F + c]


@kernel
def swiglu_fused_q8(gu, y, xq, xd):
    """swiglu_fused and its output quantized as swiglu_q8 does it, value for value (ffn_down's
    int8 input from the stacked [gate | up] matvec, at any row count: decode and verify).
    gu[N, 2F], y[N, F] (F % 32 == 0), xq / xd over y's flat order. A warp step's 32 values lie
    in one row and one 32-value block, so the block's amax is a warp_max."""
    N, F = y.shape
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, N * F, step):
        r = i // F
        c = i - r * F
        v = silu(gu[r, c]) * gu[r, F + c]
        y[r, c] = v
        q, d = q8_code(v, warp_max(abs(v)))
        xq[i] = q
        if (i & 31) == 0:
            xd[i >> 5] = d


@kernel
def sigmoid_mul(x, gate):
    """x *= sigmoid(gate) in place (1-D): the gated-attention output gate."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.shape[0], step):
        x[i] = x[i] * sigmoid(gate[i])


@kernel
def add(a, b, out):
    """out = a + b (1-D): the residual add where it is not fused into a norm."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.shape[0], step):
        out[i] = a[i] + b[i]


# ------------------------------------------------------------------ launchers


def _grid(n: int) -> int:
    return max(1, min(ELEMWISE_BLOCKS_MAX, (n + ELEMWISE_THREADS - 1) // ELEMWISE_THREADS))


def _flat(a):
    return a.reshape(a.size)


def launch_swiglu(g, u, y, stream=0):
    """y = silu(g) * u for same-shape contiguous arrays. Reference: ops.swiglu."""
    swiglu[_grid(y.size), ELEMWISE_THREADS, stream](_flat(g), _flat(u), _flat(y))


def launch_swiglu_q8(g, u, y, xq, xd, stream=0):
    """launch_swiglu + quantize_act.launch_quantize_act(y, xq, xd) in one launch (1-D, length a
    multiple of 32). Reference: ops.swiglu, then quantize_act_q8_reference."""
    n = y.size
    if n % 32 or xq.size < n or xd.size < n // 32:
        raise ValueError(f"swiglu_q8: {n} values must be whole 32-blocks with xq >= {n}, xd >= {n // 32}")
    swiglu_q8[_grid(n), ELEMWISE_THREADS, stream](_flat(g), _flat(u), _flat(y), _flat(xq)[:n],
                                                 _flat(xd)[:n // 32])


def launch_swiglu_fused(gu, y, stream=0):
    """y[..., F] = silu(gu[..., :F]) * gu[..., F:] for gu[..., 2F]."""
    F = y.shape[len(y.shape) - 1]        # (device shapes take no negative index)
    if gu.shape[len(gu.shape) - 1] != 2 * F:
        raise ValueError(f"gate|up buffer {tuple(gu.shape)} does not match output {tuple(y.shape)}")
    y2 = y.reshape(y.size // F, F)
    gu2 = gu.reshape(y2.shape[0], 2 * F)
    swiglu_fused[_grid(y.size), ELEMWISE_THREADS, stream](gu2, y2)


def launch_swiglu_fused_q8(gu, y, xq, xd, stream=0):
    """launch_swiglu_fused + quantize_act.launch_quantize_act(y, xq, xd) in one launch, the bits
    of launch_swiglu_q8 on gu's two halves. Reference: ops.swiglu on gu[..., :F] and
    gu[..., F:], then quantize_act_q8_reference."""
    F = y.shape[len(y.shape) - 1]
    n = y.size
    if gu.shape[len(gu.shape) - 1] != 2 * F or gu.size != 2 * n:
        raise ValueError(f"swiglu_fused_q8: gate|up buffer {tuple(gu.shape)} does not match "
                         f"output {tuple(y.shape)}")
    if F % 32 or xq.size < n or xd.size < n // 32:
        raise ValueError(f"swiglu_fused_q8: rows of {F} values must be whole 32-blocks with "
                         f"xq >= {n}, xd >= {n // 32}")
    y2 = y.reshape(n // F, F)
    swiglu_fused_q8[_grid(n), ELEMWISE_THREADS, stream](gu.reshape(n // F, 2 * F), y2,
                                                       _flat(xq)[:n], _flat(xd)[:n // 32])


def launch_sigmoid_mul(x, gate, stream=0):
    """x *= sigmoid(gate) in place (same number of elements, e.g. attention output [T, Hq*D]
    and the gate from `launch_split_q_gate`). Reference: x * ops.sigmoid(gate)."""
    sigmoid_mul[_grid(x.size), ELEMWISE_THREADS, stream](_flat(x), _flat(gate))


def launch_add(a, b, out, stream=0):
    """out = a + b elementwise (out may be a or b)."""
    add[_grid(out.size), ELEMWISE_THREADS, stream](_flat(a), _flat(b), _flat(out))


_A1 = "float32[::1]"
_A2 = "float32[:, ::1]"
PTX_SIGNATURES = {
    "swiglu": [f"void({_A1}, {_A1}, {_A1})"],
    "swiglu_fused": [f"void({_A2}, {_A2})"],
    "swiglu_q8": [f"void({_A1}, {_A1}, {_A1}, int8[::1], {_A1})"],
    "swiglu_fused_q8": [f"void({_A2}, {_A2}, int8[::1], {_A1})"],
    "sigmoid_mul": [f"void({_A1}, {_A1})"],
    "add": [f"void({_A1}, {_A1}, {_A1})"],
}
