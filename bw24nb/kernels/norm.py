"""RMSNorm kernels: plain rows, fused residual add, per-head (Qwen3 q/k norm), gated (GDN).

References (bw24nb/reference/ops.py): `rms_norm(x, w, eps)` for the plain, fused and per-head
forms (the fused form is `h = x + r; y = rms_norm(h, w, eps)`), and
`rms_norm(x, w, eps) * silu(z)` for the gated form (transformers' `Qwen3NextRMSNormGated`:
normalize, multiply by the weight, then by `silu(gate)`). `w` is the effective multiplier: the
`(1 + w)` families arrive with `1 + w` stored at load time.

One block normalizes one row (a hidden vector, or one head's vector). Reduction order, fixed
for a given (row length C, block size B), so a row's result is deterministic:
  1. thread j accumulates x[j]^2 + x[j+B]^2 + x[j+2B]^2 + ... sequentially in float32;
  2. `block_sum`: each warp's 32 partials by warp_sum's tree (offsets 16, 8, 4, 2, 1), then the
     B/32 warp totals, padded with +0.0 to 32, by the same tree.
B is chosen by `_row_threads(C)` alone, so the same C always reduces in the same order.
Then y = (x * rstd) * w with rstd = 1 / sqrt(sum / C + eps), float32 throughout.
Every form may run in place (y aliasing x, h aliasing r or x): each element is read and written
by the same thread, reads before writes.

Decode's norms are one block on one SM, so their time is their chain of dependent steps, not
their bytes (bench/launch_chain.py; decision 0021). Rows of at most 4 elements a thread load
everything (x, w, z) before the reduction: one memory round trip. The q8 norm of decode and
verify rows runs a block per slot: every block sums the whole row in the order above, so all
get the same rstd bit for bit, and each quantizes its own slot.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from ..jit import kernel
from ..ptx import warp_max, warp_sum
from .quantize_act import q8_code

# Largest block. A decode norm is one block on one SM, so its time is its chain of memory round
# trips: 1024 threads hold a 4096-wide row at 4 elements each, all loaded in one step (256
# threads took 4 dependent steps, and the norm + quantize cost 11 us a launch on the H200,
# session 5). `block_sum` has one barrier whatever B is, so a wider block costs no tree levels.
NORM_THREADS_MAX = 1024
# block_sum's scratch: one float per warp
SCRATCH_WARPS = 32
# Elements per thread below which a smaller block is used: a 128-wide head row runs as one
# 32-thread warp (4 elements each) instead of 128 threads doing one load and a 7-level tree.
NORM_MIN_ELEMS_PER_THREAD = 4
# The q8 norms' one-step path (rows of <= 4 elements a thread, their loads all issued before
# the reduction). A switch only so that the simulator tests can run the general loop on small
# rows too and compare the two paths bit for bit; kernels compiled for the GPU freeze it.
ONE_STEP_ROWS = True
# rms_norm_q8 rows spread over one block per slot (`_one_step_q8`) while a launch has at most
# this many rows (decode's one, verify's K + 1); prefill's many rows fill the GPU without it
NORM_SPLIT_MAX_ROWS = 16
# slots (elements a thread) up to which a row is split: every block re-reads the whole row, so
# the split trades L2 reads for the quantization's instructions (5 at the 27B's 5120 / 1024)
NORM_SPLIT_MAX_SLOTS = 8


def pow2_block(want: int, cap: int) -> int:
    """The smallest power of two >= want, clamped to [32, cap]: a block size for block_sum's tree."""
    b = 32
    while b < want and b < cap:
        b *= 2
    return b


def _row_threads(C: int) -> int:
    """Power-of-two block size for rows of C elements (32 .. NORM_THREADS_MAX)."""
    return pow2_block(max(1, C // NORM_MIN_ELEMS_PER_THREAD), NORM_THREADS_MAX)


@cuda.jit(device=True, inline="always")
def block_sum(scratch, value):
    """Sum of `value` over the block (blockDim.x a multiple of 32, at most 32 warps; scratch
    holds >= SCRATCH_WARPS floats), in the order of the module docstring's step 2: a warp tree
    per warp, then one tree over the warp totals, which every warp computes alike, so every
    thread gets the same total after a single barrier. Scratch is free again on return."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    t = warp_sum(value)
    if lane == 0:
        scratch[tid >> 5] = t
    cuda.syncthreads()
    v = scratch[lane] if lane < (cuda.blockDim.x >> 5) else float32(0.0)
    total = warp_sum(v)
    cuda.syncthreads()
    return total


@cuda.jit(device=True, inline="always")
def _sum_squares(x, row, C):
    """This thread's x[row, j]^2 + x[row, j+B]^2 + ... (j = threadIdx, B = blockDim), added in
    that order (step 1 of the module docstring), with four loads in flight per step: the adds
    keep their order, only the loads are issued ahead (a 4096-wide row is 16 loads a thread,
    which one at a time made the norm a chain of 16 memory latencies)."""
    B = cuda.blockDim.x
    last = C - 1
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, C, 4 * B):
        acc = _add_squares(acc, i, B, C, x[row, i], x[row, min(i + B, last)],
                           x[row, min(i + 2 * B, last)], x[row, min(i + 3 * B, last)])
    return acc


@cuda.jit(device=True, inline="always")
def _add_squares(acc, i, B, C, x0, x1, x2, x3):
    """acc plus the squares of elements i, i + B, i + 2B, i + 3B (those inside the row of C),
    in that order, each add its own rounding: one step of `_sum_squares`."""
    if i < C:
        acc += x0 * x0
    if i + B < C:
        acc += x1 * x1
    if i + 2 * B < C:
        acc += x2 * x2
    if i + 3 * B < C:
        acc += x3 * x3
    return acc


@cuda.jit(device=True, inline="always")
def _slots(B, C):
    """This thread's four slots j, j + B, j + 2B, j + 3B of a row of C (j = threadIdx),
    clamped to the row's last element: a clamped slot reads a valid element, and the callers
    drop it (`_squares4`, and their stores test i + kB < C)."""
    i = cuda.threadIdx.x
    last = C - 1
    return min(i, last), min(i + B, last), min(i + 2 * B, last), min(i + 3 * B, last)


@cuda.jit(device=True, inline="always")
def _row4(a, row, s):
    """a[row, k] at the four slots s (`_slots`): four loads issued together."""
    return a[row, s[0]], a[row, s[1]], a[row, s[2]], a[row, s[3]]


@cuda.jit(device=True, inline="always")
def _vec4(w, s):
    """w[k] at the four slots s (`_slots`)."""
    return w[s[0]], w[s[1]], w[s[2]], w[s[3]]


@cuda.jit(device=True, inline="always")
def _squares4(B, C, x0, x1, x2, x3):
    """The thread's sum of squares over its slots inside the row: `_sum_squares` for rows of
    at most 4 elements a thread (its one step, the loads already done)."""
    return _add_squares(float32(0.0), cuda.threadIdx.x, B, C, x0, x1, x2, x3)


@cuda.jit(device=True, inline="always")
def rstd_of(total, C, eps):
    """1 / rms from a row's sum of squares: the one formula of every norm here (and of
    gated_deltanet's rule with the output norm folded in)."""
    return float32(1.0) / math.sqrt(total / float32(C) + eps)


@cuda.jit(device=True, inline="always")
def _row_rstd(scratch, sumsq, C, eps):
    return rstd_of(block_sum(scratch, sumsq), C, eps)


@cuda.jit(device=True, inline="always")
def _silu(z):
    return z / (float32(1.0) + math.exp(-z))


@kernel
def rms_norm_rows(x, w, eps, y):
    """y[r, :] = rms_norm(x[r, :]) * w; x, y [N, C], w [C]; one block per row."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    row = cuda.blockIdx.x
    C = x.shape[1]
    rstd = _row_rstd(scratch, _sum_squares(x, row, C), C, eps)
    for i in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        y[row, i] = x[row, i] * rstd * w[i]


@kernel
def qk_head_norm_rows(qsrc, q, gate, wq, k, wk, eps, split):
    """Qwen3.5 / Qwen3-Next attention's q_norm and k_norm (and, with `split`, the query / gate
    split of the gated q_proj) in one launch: blocks 0 .. Nq-1 take query head row r of
    qsrc [Nq, S] (S = 2D gated -- [query | gate] -- else D), q[r, :] = rms_norm(query) * wq and
    gate[r, :] = qsrc[r, D:2D]; blocks Nq .. Nq+Nk-1 normalize k [Nk, D] rows in place with wk.
    Every row is rms_norm_rows' arithmetic at the same block size, bit for bit; a head of at
    most 4 elements a thread (D = 256 on 64 threads, 128 on 32) loads its values and weights
    before the reduction (`_norm_row_one_step`)."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    b = cuda.blockIdx.x
    Nq = q.shape[0]
    D = q.shape[1]
    B = cuda.blockDim.x
    if b < Nq:
        if split:
            for i in range(cuda.threadIdx.x, D, B):
                gate[b, i] = qsrc[b, D + i]
        if ONE_STEP_ROWS and D <= 4 * B:
            _norm_row_one_step(scratch, qsrc, b, q, b, wq, D, B, eps)
            return
        rstd = _row_rstd(scratch, _sum_squares(qsrc, b, D), D, eps)
        for i in range(cuda.threadIdx.x, D, B):
            q[b, i] = qsrc[b, i] * rstd * wq[i]
    else:
        row = b - Nq
        if ONE_STEP_ROWS and D <= 4 * B:
            _norm_row_one_step(scratch, k, row, k, row, wk, D, B, eps)
            return
        rstd = _row_rstd(scratch, _sum_squares(k, row, D), D, eps)
        for i in range(cuda.threadIdx.x, D, B):
            k[row, i] = k[row, i] * rstd * wk[i]


@cuda.jit(device=True, inline="always")
def _norm_row_one_step(scratch, src, srow, dst, drow, w, C, B, eps):
    """dst[drow, :C] = rms_norm(src[srow, :C]) * w for C <= 4B (dst may be src): thread j's
    elements j, j + B, j + 2B, j + 3B and their weights loaded at once, squares added in
    `_sum_squares`' order, each value x * rstd * w -- rms_norm_rows' bits, one memory round
    trip (the loop form loaded w after the reduction)."""
    i = cuda.threadIdx.x
    sl = _slots(B, C)
    x0, x1, x2, x3 = _row4(src, srow, sl)
    w0, w1, w2, w3 = _vec4(w, sl)
    acc = _squares4(B, C, x0, x1, x2, x3)
    rstd = _row_rstd(scratch, acc, C, eps)
    if i < C:
        dst[drow, i] = x0 * rstd * w0
    if i + B < C:
        dst[drow, i + B] = x1 * rstd * w1
    if i + 2 * B < C:
        dst[drow, i + 2 * B] = x2 * rstd * w2
    if i + 3 * B < C:
        dst[drow, i + 3 * B] = x3 * rstd * w3


@kernel
def add_rms_norm_rows(x, r, w, eps, h, y):
    """h = x + r (the new residual stream), y = rms_norm(h) * w; all [N, C] but w [C]."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    row = cuda.blockIdx.x
    C = x.shape[1]
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        v = x[row, i] + r[row, i]
        h[row, i] = v
        acc += v * v
    rstd = _row_rstd(scratch, acc, C, eps)
    for i in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        y[row, i] = h[row, i] * rstd * w[i]


@cuda.jit(device=True, inline="always")
def _gated_rstd(scratch, x, row, C, eps):
    """1 / rms of x[row, :C] for the gated norm: this thread's squares x[row, j]^2 +
    x[row, j+B]^2 + ... in order, then block_sum (the order both gated kernels share)."""
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        v = x[row, i]
        acc += v * v
    return _row_rstd(scratch, acc, C, eps)


@kernel
def gated_rms_norm_rows(x, z, w, eps, y):
    """y = (rms_norm(x) * w) * silu(z) per row; x, z, y [N, C], w [C]."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    row = cuda.blockIdx.x
    C = x.shape[1]
    rstd = _gated_rstd(scratch, x, row, C, eps)
    for i in range(cuda.threadIdx.x, C, cuda.blockDim.x):
        y[row, i] = x[row, i] * rstd * w[i] * _silu(z[row, i])


@cuda.jit(device=True, inline="always")
def _store_q8(y, xq, xd, row, i, v, amax):
    """y[row, i] = v and its int8 code with the block's amax (quantize_act_q8's arithmetic)."""
    y[row, i] = v
    q, d = q8_code(v, amax)
    xq[row, i] = q
    if (i & 31) == 0:
        xd[row, i >> 5] = d


@kernel
def rms_norm_q8_rows(x, w, eps, y, xq, xd):
    """rms_norm_rows + quantize_act_q8 of its output in one launch (decode: the norm's output is
    the next matvecs' int8 input): y as rms_norm_rows writes it, and xq[r, :], xd[r, :] exactly
    as quantize_act_q8 would from y. C % 32 == 0 and the block a multiple of 32, so at every
    step of the element loop warp w holds one whole 32-value block (elements 32w .. 32w + 31 +
    k * blockDim): its amax is a warp_max, with no extra barrier.
    A row of at most 4 elements a thread (every decode hidden size up to 4096: `_row_threads`)
    takes `_one_step_q8`: x and w loaded together before the reduction, one memory round trip
    where the loop below takes two (w's load waited for the sum); the same arithmetic."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    row = cuda.blockIdx.x
    C = x.shape[1]
    B = cuda.blockDim.x
    if ONE_STEP_ROWS and C <= 4 * B:
        _one_step_q8(scratch, x, w, eps, y, xq, xd, row, C, B)
        return
    last = C - 1
    if cuda.gridDim.y > 1:
        # a wide row split over a block per slot (the 27B's 5120 on 1024 threads: 5 slots):
        # every block sums the whole row in `_sum_squares`' order (the same rstd, bit for
        # bit) and quantizes slot blockIdx.y alone, its weight loaded before the sum
        e = cuda.threadIdx.x + cuda.blockIdx.y * B
        we = w[min(e, last)]
        rstd = _row_rstd(scratch, _sum_squares(x, row, C), C, eps)
        if e < C:                  # warp-uniform
            v = x[row, e] * rstd * we
            _store_q8(y, xq, xd, row, e, v, warp_max(abs(v)))
        return
    rstd = _row_rstd(scratch, _sum_squares(x, row, C), C, eps)
    # four elements a step: their loads issue together and their warp_max chains interleave;
    # i + kB < C is the same for the whole warp, since C and B are multiples of 32
    for i in range(cuda.threadIdx.x, C, 4 * B):
        j1 = min(i + B, last)
        j2 = min(i + 2 * B, last)
        j3 = min(i + 3 * B, last)
        _quantize4(y, xq, xd, row, i, B, C,
                   x[row, i] * rstd * w[i], x[row, j1] * rstd * w[j1],
                   x[row, j2] * rstd * w[j2], x[row, j3] * rstd * w[j3])


@cuda.jit(device=True, inline="always")
def _quantize4(y, xq, xd, row, i, B, C, v0, v1, v2, v3):
    """Store elements i, i + B, i + 2B, i + 3B (those < C) of a row with their int8 codes:
    the four warp_max chains interleave (C and B multiples of 32, so each condition is
    warp-uniform)."""
    m0 = warp_max(abs(v0))
    m1 = warp_max(abs(v1))
    m2 = warp_max(abs(v2))
    m3 = warp_max(abs(v3))
    _store_q8(y, xq, xd, row, i, v0, m0)
    if i + B < C:
        _store_q8(y, xq, xd, row, i + B, v1, m1)
    if i + 2 * B < C:
        _store_q8(y, xq, xd, row, i + 2 * B, v2, m2)
    if i + 3 * B < C:
        _store_q8(y, xq, xd, row, i + 3 * B, v3, m3)


@cuda.jit(device=True, inline="always")
def _one_step_q8(scratch, x, w, eps, y, xq, xd, row, C, B):
    """rms_norm_q8_rows for C <= 4B: thread j's elements j, j + B, j + 2B, j + 3B (its
    "slots" 0..3) and their weights are loaded at once and kept in registers; the squares are
    added in `_sum_squares`' order and each value is x * rstd * w as in the loop, so the bits
    are the loop's. A thread past the row (C < B: never for the q8 row lengths, C >= 32 = the
    smallest block) adds nothing and stores nothing (warp-uniform: C, B multiples of 32).
    Split rows (gridDim.y = S > 1, `launch_rms_norm_q8`): block (row, s) still sums the whole
    row -- the same loads and order, so every block has the same rstd, bit for bit -- but
    loads the weights of, and quantizes, slot s alone: the quantization, most of the norm's
    instructions, is spread over S SMs instead of queueing on one."""
    i = cuda.threadIdx.x
    sl = _slots(B, C)
    x0, x1, x2, x3 = _row4(x, row, sl)
    S = cuda.gridDim.y
    s = cuda.blockIdx.y
    if S > 1:                      # slot s's weight only (the others are never read)
        w0 = w[min(i + s * B, C - 1)]
        w1 = w0
        w2 = w0
        w3 = w0
    else:
        w0, w1, w2, w3 = _vec4(w, sl)
    acc = _squares4(B, C, x0, x1, x2, x3)
    rstd = _row_rstd(scratch, acc, C, eps)
    if S > 1:
        e = i + s * B
        if e < C:                  # warp-uniform
            xs = x0 if s == 0 else (x1 if s == 1 else (x2 if s == 2 else x3))
            v = xs * rstd * w0
            _store_q8(y, xq, xd, row, e, v, warp_max(abs(v)))
    elif i < C:
        _quantize4(y, xq, xd, row, i, B, C,
                   x0 * rstd * w0, x1 * rstd * w1, x2 * rstd * w2, x3 * rstd * w3)


@cuda.jit(device=True, inline="always")
def gated_q8_slots(y, xq, xd, row, i, B, C, rstd, x0, x1, x2, x3, w0, w1, w2, w3, z0, z1, z2,
                   z3):
    """The gated q8 norm's output at this thread's four slots (`_slots`): x * rstd * w *
    silu(z), stored with its int8 codes (`_quantize4`). Shared by gated_rms_norm_q8_rows and
    gated_deltanet's rule with the output norm folded in, so both give these bits."""
    _quantize4(y, xq, xd, row, i, B, C,
               x0 * rstd * w0 * _silu(z0), x1 * rstd * w1 * _silu(z1),
               x2 * rstd * w2 * _silu(z2), x3 * rstd * w3 * _silu(z3))


@kernel
def gated_rms_norm_q8_rows(x, z, w, eps, y, xq, xd):
    """gated_rms_norm_rows + quantize_act_q8 of its output in one launch (decode: the Gated
    DeltaNet output norm feeds ssm_out's int8 matvec): y exactly as gated_rms_norm_rows writes
    it (same sum order, same product order), xq / xd exactly as quantize_act_q8 would from y.
    C % 32 == 0: at every step of the element loop a warp holds one whole 32-value block.
    A row of at most 4 elements a thread (the real models' 128-wide heads on 32 threads) loads
    its x, z and w at once, before the reduction: one memory round trip, the same arithmetic."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    row = cuda.blockIdx.x
    C = x.shape[1]
    B = cuda.blockDim.x
    if ONE_STEP_ROWS and C <= 4 * B:
        i = cuda.threadIdx.x
        sl = _slots(B, C)
        x0, x1, x2, x3 = _row4(x, row, sl)
        z0, z1, z2, z3 = _row4(z, row, sl)
        w0, w1, w2, w3 = _vec4(w, sl)
        acc = _squares4(B, C, x0, x1, x2, x3)         # `_gated_rstd`'s order
        rstd = _row_rstd(scratch, acc, C, eps)
        if i < C:
            gated_q8_slots(y, xq, xd, row, i, B, C, rstd, x0, x1, x2, x3, w0, w1, w2, w3,
                           z0, z1, z2, z3)
        return
    rstd = _gated_rstd(scratch, x, row, C, eps)
    for i in range(cuda.threadIdx.x, C, B):
        v = x[row, i] * rstd * w[i] * _silu(z[row, i])
        _store_q8(y, xq, xd, row, i, v, warp_max(abs(v)))


# ------------------------------------------------------------------ launchers


def launch_rms_norm_q8(x, w, eps: float, y, xq, xd, stream=0, split=True):
    """`launch_rms_norm` + `quantize_act.launch_quantize_act(y, xq, xd)` in one launch: rows of
    C = len(w) (a multiple of 32); xq int8 and xd float32 hold >= rows * C and rows * C / 32
    values (flat or shaped). Reference: ops.rms_norm, then quantize_act_q8_reference.
    split (False: one block a row, the form before session 15): with few rows (<= NORM_SPLIT_MAX_ROWS: decode, verify),
    each row runs on one block per slot (element j + sB of thread j is its slot s; at most
    NORM_SPLIT_MAX_SLOTS), every block summing the whole row and quantizing its slot
    (`_one_step_q8`, or the wide-row branch of the kernel); the same bits either way."""
    C = w.shape[0]
    if C % 32:
        raise ValueError(f"rms_norm_q8: row length {C} is not a multiple of 32")
    xr, yr = _rows(x, C), _rows(y, C)
    N = xr.shape[0]
    flat = (lambda a: a if a.ndim == 1 else a.reshape(a.size))
    q = flat(xq)[:N * C].reshape(N, C)
    d = flat(xd)[:N * C // 32].reshape(N, C // 32)
    B = _row_threads(C)
    S = (C + B - 1) // B
    if not split or N > NORM_SPLIT_MAX_ROWS or S > NORM_SPLIT_MAX_SLOTS:
        S = 1
    rms_norm_q8_rows[(N, S), B, stream](xr, w, np.float32(eps), yr, q, d)


def _rows(a, C: int):
    """View a contiguous device array as [N, C] rows."""
    return a.reshape(a.size // C, C)


def launch_rms_norm(x, w, eps: float, y, stream=0):
    """RMSNorm of each row of `x[..., C]` (any leading shape, contiguous) into `y` (same
    shape; may be `x`). Reference: ops.rms_norm(x, w, eps)."""
    C = w.shape[0]
    xr, yr = _rows(x, C), _rows(y, C)
    rms_norm_rows[xr.shape[0], _row_threads(C), stream](xr, w, np.float32(eps), yr)


def launch_head_rms_norm(x, w, eps: float, y, stream=0):
    """Qwen3 q_norm/k_norm: RMSNorm of every head vector of `x[T, H, D]` with `w[D]`.
    Same kernel as `launch_rms_norm`, one block per (token, head)."""
    launch_rms_norm(x, w, eps, y, stream)


def launch_qk_head_norm(qsrc, q, wq, k, wk, eps: float, gate=None, stream=0):
    """`launch_head_rms_norm` of q with wq and of k with wk in one launch (q[T, Hq, D], k
    [T, Hkv, D], k in place). q's rows come from qsrc: q itself (in place), or with `gate`
    the gated q_proj output qsrc[T, Hq * 2D] (per head [query | gate]), which is also split:
    gate[T, Hq, D] <- its gate halves (rope.launch_split_q_gate + two head norms, one launch)."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    if k.shape[0] != T or k.shape[2] != D or wq.shape[0] != D or wk.shape[0] != D:
        raise ValueError(f"qk_head_norm: q {tuple(q.shape)}, k {tuple(k.shape)}, weights "
                         f"{wq.shape[0]} / {wk.shape[0]} do not match")
    S = D if gate is None else 2 * D
    if qsrc.size != T * Hq * S:
        raise ValueError(f"qk_head_norm: q source of {qsrc.size} values is not [{T}, {Hq}, {S}]")
    q2, k2 = q.reshape(T * Hq, D), k.reshape(T * Hk, D)
    g2 = q2 if gate is None else gate.reshape(T * Hq, D)
    qk_head_norm_rows[T * (Hq + Hk), _row_threads(D), stream](
        qsrc.reshape(T * Hq, S), q2, g2, wq, k2, wk, np.float32(eps), np.int32(gate is not None))


def launch_add_rms_norm(x, r, w, eps: float, h, y, stream=0):
    """Fused residual add + RMSNorm: `h = x + r`, `y = rms_norm(h) * w` (rows of `[..., C]`).
    `h` may alias `r` (update the residual stream in place)."""
    C = w.shape[0]
    xr, rr, hr, yr = _rows(x, C), _rows(r, C), _rows(h, C), _rows(y, C)
    add_rms_norm_rows[xr.shape[0], _row_threads(C), stream](xr, rr, w, np.float32(eps), hr, yr)


def launch_gated_rms_norm(x, z, w, eps: float, y, stream=0):
    """Gated DeltaNet output norm: `y = rms_norm(x) * w * silu(z)` per head, with `x, z`
    shaped `[..., Dv]` (e.g. [T, Hv, Dv]) and `w[Dv]`."""
    C = w.shape[0]
    xr, zr, yr = _rows(x, C), _rows(z, C), _rows(y, C)
    gated_rms_norm_rows[xr.shape[0], _row_threads(C), stream](xr, zr, w, np.float32(eps), yr)


def launch_gated_rms_norm_q8(x, z, w, eps: float, y, xq, xd, stream=0):
    """`launch_gated_rms_norm` + `quantize_act.launch_quantize_act(y, xq, xd)` in one launch:
    heads of C = len(w) (a multiple of 32); xq int8 / xd float32 hold >= rows * C and
    rows * C / 32 values (flat or shaped). Reference: gated_rms_norm, then
    quantize_act_q8_reference."""
    C = w.shape[0]
    if C % 32:
        raise ValueError(f"gated_rms_norm_q8: head length {C} is not a multiple of 32")
    xr, zr, yr = _rows(x, C), _rows(z, C), _rows(y, C)
    N = xr.shape[0]
    flat = (lambda a: a if a.ndim == 1 else a.reshape(a.size))
    q = flat(xq)[:N * C].reshape(N, C)
    d = flat(xd)[:N * C // 32].reshape(N, C // 32)
    gated_rms_norm_q8_rows[N, _row_threads(C), stream](xr, zr, w, np.float32(eps), yr, q, d)


_A2 = "float32[:, ::1]"
PTX_SIGNATURES = {
    "rms_norm_rows": [f"void({_A2}, float32[::1], float32, {_A2})"],
    "add_rms_norm_rows": [f"void({_A2}, {_A2}, float32[::1], float32, {_A2}, {_A2})"],
    "gated_rms_norm_rows": [f"void({_A2}, {_A2}, float32[::1], float32, {_A2})"],
    "qk_head_norm_rows": [f"void({_A2}, {_A2}, {_A2}, float32[::1], {_A2}, float32[::1], float32, "
                          f"int32)"],
    "rms_norm_q8_rows": [f"void({_A2}, float32[::1], float32, {_A2}, int8[:, ::1], {_A2})"],
    "gated_rms_norm_q8_rows": [f"void({_A2}, {_A2}, float32[::1], float32, {_A2}, int8[:, ::1], "
                               f"{_A2})"],
}
