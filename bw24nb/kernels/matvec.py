"""Decode matvec: y[M] = W[M, K] @ x[K] (+ bias[M]) (+ residual[M]) with W in its GGUF blocks.

Batch-1 decode reads every weight byte once, so this kernel is bandwidth-bound: one warp per
output row walks the row's blocks, lane l taking the row's "groups" l, l + 32, l + 64, ...
(a group is 4 bytes of quants plus their high bits -- kernels/dequant.py defines each type's
groups), so a warp's 32 lanes read consecutive bytes of the row at every step.

Why it is fast (docs/decisions/0004-decode-matvec.md has the measurements):
  * no block barrier anywhere: the lane partials meet in `warp_sum` (bw24nb/ptx/warp.py, five
    shfl.sync), and a warp whose row is past M leaves as a whole before it;
  * UNROLL groups per lane per step, with every load of the step unconditional (a group past the
    row's end is clamped to the row's last group and its product dropped by a select), so the
    compiler issues all of a step's loads before the first multiply: UNROLL x (4-8 bytes of
    quants + high bits + scale) in flight per lane instead of one group's worth;
  * the warp's loads stay coalesced: at each of a step's UNROLL slots the 32 lanes read 32
    consecutive groups, i.e. one contiguous span of the row (Q8_0/Q5_0/Q6_K blocks are only
    2-byte aligned, so lanes read 2-byte words: per-lane 16-byte vector loads are impossible
    for them, and per-lane whole blocks would make each warp load instruction touch 9-17
    cache lines instead of 2-5).

Summation order (part of the exactness contract -- the numpy reference is float64, so this is
what the tolerance covers, and what the argmax gate sees):
  1. group partial p_g: the group's 8 products w_e * x_e added left to right in float32, w_e the
     float32 weight the codec produces (dequant.py's docstring: run A, then run B);
  2. lane sum s_l = ((p_l + p_{l+32}) + p_{l+64}) + ...  (ascending group index, float32; a
     clamped slot past the row's end adds +0.0, which changes nothing but the sign of a zero);
  3. warp sum: tree over lanes with offsets 16, 8, 4, 2, 1 -- s_l += s_{l+off} for l < off --
     which is what warp_sum's xor butterfly computes (every lane ends with s_0);
  4. y = (sum + bias) + residual.
This is the same order as the first (shared-memory, 6-barrier) kernel, so results are bit for
bit what it gave. The GPU may fuse a multiply and the following add into one FMA (one rounding
instead of two); the simulator does not. Both stay inside the tolerance the tests justify.

Two paths:
  launch_matvec     float activations; the reference-exact default, every weight type.
  launch_matvec_q8  int8 activations (quantize_act.py: one f32 scale per 32 values) and dp4a
                    for the integer block types (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K); the
                    integer part of each 32-value block dot is exact, the scales multiply in
                    float32 (dequant.py, <type>_group_dot_q8). For the decode performance work.

numpy references: `matvec_reference` (float path) and `matvec_q8_reference` (dp4a path) below.
"""
import numpy as np
from numba import cuda

from ..quant.types import QType, row_bytes
from ..ptx import warp_sum
from .dequant import LAYOUTS, layout, weight_views

# One warp per row, 4 warps (128 threads) a block: the decode shapes have M = 128 .. 151936
# rows, and at M = 128 a 4-warp block still spreads the rows over 32 blocks (8-warp blocks would
# leave 116 of 132 SMs idle); for large M the SM holds 16 such blocks = 64 warps either way.
WARPS_PER_BLOCK = 4
THREADS = 32 * WARPS_PER_BLOCK
# Groups per lane per step (see the module docstring). 4 covers a whole K = 896 row of Q5_0 /
# Q8_0 (112 groups) in one step -- one DRAM round trip per row -- and keeps 16-40 bytes in
# flight per lane for the long rows; the step body is written out 4 times below.
UNROLL = 4


@cuda.jit(device=True, inline="always")
def store_row(y, bias, residual, has_bias, has_residual, row, v):
    """y[row] = (v + bias[row]) + residual[row], each term only when present."""
    if has_bias:
        v += bias[row]
    if has_residual:
        v += residual[row]
    y[row] = v


@cuda.jit(device=True, inline="always")
def keep(p, g, ngroups):
    """p when group g is inside the row, else +0.0 (the slot was clamped; see the docstring)."""
    return p if g < ngroups else np.float32(0.0)


def _make_matvec(lay):
    qk, ts, gpb, group_dot = lay.block, lay.type_size, lay.groups, lay.group_dot

    @cuda.jit(device=True, inline="always")
    def term(w8, w16, wh, row_off, g, x):
        b = g // gpb
        return group_dot(w8, w16, wh, row_off + b * ts, g - b * gpb, x, b * qk)

    def matvec(w8, w16, wh, M, K, x, y, bias, residual, has_bias, has_residual):
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        if row >= M:                  # the whole warp leaves: warp_sum stays full-warp
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        row_off = np.int64(row) * (nblk * ts)
        acc = np.float32(0.0)
        for g in range(lane, ngroups, 32 * UNROLL):
            # UNROLL = 4 slots; all loads unconditional (clamped), products kept in order
            p0 = term(w8, w16, wh, row_off, g, x)
            p1 = term(w8, w16, wh, row_off, min(g + 32, last), x)
            p2 = term(w8, w16, wh, row_off, min(g + 64, last), x)
            p3 = term(w8, w16, wh, row_off, min(g + 96, last), x)
            acc += p0
            acc += keep(p1, g + 32, ngroups)
            acc += keep(p2, g + 64, ngroups)
            acc += keep(p3, g + 96, ngroups)
        total = warp_sum(acc)
        if lane == 0:
            store_row(y, bias, residual, has_bias, has_residual, row, total)

    matvec.__name__ = matvec.__qualname__ = f"matvec_{lay.name}"
    return cuda.jit(matvec)


def _make_matvec_q8(lay):
    qk, ts, gpb, group_dot_q8 = lay.block, lay.type_size, lay.groups, lay.group_dot_q8

    @cuda.jit(device=True, inline="always")
    def term(w8, w16, wh, row_off, g, xq32, xd):
        b = g // gpb
        return group_dot_q8(w8, w16, wh, row_off + b * ts, g - b * gpb, xq32, xd, b * qk)

    def matvec_q8(w8, w16, wh, M, K, xq32, xd, y, bias, residual, has_bias, has_residual):
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        if row >= M:
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        row_off = np.int64(row) * (nblk * ts)
        acc = np.float32(0.0)
        for g in range(lane, ngroups, 32 * UNROLL):
            p0 = term(w8, w16, wh, row_off, g, xq32, xd)
            p1 = term(w8, w16, wh, row_off, min(g + 32, last), xq32, xd)
            p2 = term(w8, w16, wh, row_off, min(g + 64, last), xq32, xd)
            p3 = term(w8, w16, wh, row_off, min(g + 96, last), xq32, xd)
            acc += p0
            acc += keep(p1, g + 32, ngroups)
            acc += keep(p2, g + 64, ngroups)
            acc += keep(p3, g + 96, ngroups)
        total = warp_sum(acc)
        if lane == 0:
            store_row(y, bias, residual, has_bias, has_residual, row, total)

    matvec_q8.__name__ = matvec_q8.__qualname__ = f"matvec_q8_{lay.name}"
    return cuda.jit(matvec_q8)


# kernel objects by weight type; also module attributes matvec_<type> / matvec_q8_<type>
MATVEC = {qt: _make_matvec(lay) for qt, lay in LAYOUTS.items()}
MATVEC_Q8 = {qt: _make_matvec_q8(lay) for qt, lay in LAYOUTS.items() if lay.group_dot_q8 is not None}
for _qt, _k in MATVEC.items():
    globals()[f"matvec_{LAYOUTS[_qt].name}"] = _k
for _qt, _k in MATVEC_Q8.items():
    globals()[f"matvec_q8_{LAYOUTS[_qt].name}"] = _k

_SIG = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, float32[::1], float32[::1], " \
       "float32[::1], float32[::1], int32, int32)"
_SIG_Q8 = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, int32[::1], float32[::1], " \
          "float32[::1], float32[::1], float32[::1], int32, int32)"
PTX_SIGNATURES = {
    **{f"matvec_{LAYOUTS[qt].name}": [_SIG] for qt in MATVEC},
    **{f"matvec_q8_{LAYOUTS[qt].name}": [_SIG_Q8] for qt in MATVEC_Q8},
}
# the warp sum must be the shuffle butterfly (tests/test_compile_ptx.py checks the text; the
# absence of bar.sync is checked by tests/test_kernels_matvec.py)
EXPECTED_PTX = {name: ["shfl.sync.bfly.b32"] for name in PTX_SIGNATURES}


# ---------------------------------------------------------------- launchers


def _grid(M):
    return (M + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK


def _check_common(w_dev, qt, M, K, y_dev, bias, residual):
    lay = layout(qt)
    need = M * row_bytes(lay.qtype, K)
    have = w_dev.size * w_dev.dtype.itemsize
    if have != need:
        raise ValueError(f"matvec: a {lay.qtype.name} weight of {M} x {K} is {need} bytes; "
                         f"the device buffer holds {have}")
    for name, a in (("y", y_dev), ("bias", bias), ("residual", residual)):
        if a is not None and (a.dtype != np.float32 or a.size < M):
            raise ValueError(f"matvec: {name} must be float32 with at least M={M} elements")
    return lay


def launch_matvec(w_dev, qtype, M, K, x_dev, y_dev, bias=None, residual=None, stream=0):
    """y = W @ x (+ bias) (+ residual), float32 activations, every weight type.

    w_dev: device buffer of the GGUF rows (M * row_bytes(qtype, K) bytes, any dtype/shape,
    C-contiguous); x_dev float32[K]; y_dev float32[M]; bias, residual float32[M] or None.
    residual may be y_dev itself (in-place y += W @ x); x_dev must not alias y_dev.
    Reference: `matvec_reference`."""
    lay = _check_common(w_dev, qtype, M, K, y_dev, bias, residual)
    if x_dev.dtype != np.float32 or x_dev.size < K:
        raise ValueError(f"matvec: x must be float32 with at least K={K} elements")
    w8, w16, wh = weight_views(w_dev)
    MATVEC[lay.qtype][_grid(M), THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), x_dev, y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None))


def launch_matvec_q8(w_dev, qtype, M, K, xq_dev, xd_dev, y_dev, bias=None, residual=None,
                     stream=0):
    """y = W @ dequant(xq, xd) (+ bias) (+ residual) with dp4a, for Q8_0, Q4_0, Q5_0, Q4_K,
    Q5_K, Q6_K weights. xq_dev int8[K] and xd_dev float32[K / 32] come from
    `quantize_act.launch_quantize_act`. Reference: `matvec_q8_reference`."""
    lay = _check_common(w_dev, qtype, M, K, y_dev, bias, residual)
    if lay.qtype not in MATVEC_Q8:
        raise ValueError(f"matvec_q8: no dp4a path for {lay.qtype.name}; "
                         f"use launch_matvec (dp4a types: {[q.name for q in MATVEC_Q8]})")
    if xq_dev.dtype != np.int8 or xq_dev.size < K or xd_dev.dtype != np.float32 or xd_dev.size < K // 32:
        raise ValueError(f"matvec_q8: xq must be int8[{K}] and xd float32[{K // 32}]")
    w8, w16, wh = weight_views(w_dev)
    xq32 = xq_dev.reshape(xq_dev.size)[:K].view(np.int32)      # 4 int8 per dp4a operand
    MATVEC_Q8[lay.qtype][_grid(M), THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), xq32, xd_dev, y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None))


# ---------------------------------------------------------------- numpy references


def matvec_reference(w_raw, qtype, M, K, x, bias=None, residual=None):
    """float64 ((dequantize(W) @ x) + bias) + residual, returned as float64[M]."""
    from ..quant import dequantize
    w = dequantize(np.asarray(w_raw).reshape(-1), QType(qtype), (M, K)).astype(np.float64)
    y = w @ np.asarray(x, dtype=np.float64)[:K]
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[:M]
    if residual is not None:
        y = y + np.asarray(residual, dtype=np.float64)[:M]
    return y


def matvec_q8_reference(w_raw, qtype, M, K, xq, xd, bias=None, residual=None):
    """The dp4a path's value: float64 dequantize(W) @ (xq * xd per 32-block) (+ bias)
    (+ residual). Exact when all scales are powers of two and the sums fit 2^24 (see tests)."""
    from .quantize_act import dequantize_act_q8
    return matvec_reference(w_raw, qtype, M, K, dequantize_act_q8(xq, xd), bias, residual)
