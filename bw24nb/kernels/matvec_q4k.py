"""Q4_K decode matvec with 16-byte loads and dp4a: the kernel behind every Q4_K_M model's bulk.

Same contract as `matvec.launch_matvec_q8` (y = W @ dequant(xq, xd) (+ bias) (+ residual), int8
activations from quantize_act.py), specialised for Q4_K because a Q4_K super-block is 144 bytes
= 9 x 16: every block, its 16-byte header (d, dmin, 12 bytes of packed 6-bit scales/mins) and
each 16-byte run of its quants are 16-byte aligned in the GGUF layout itself, so no repack is
needed to read them with `ld.global.nc.v4.u32`. The generic q8 kernel reads a 4-byte group per
lane and decodes both sub-block scales from single bytes for every group (~10 loads per 4
bytes of weights); this one reads, per lane and per "chunk" of 16 quant bytes:

    1 x 16 B  the block header (the 8 lanes of a block hit the same line; L1 serves them)
    1 x 16 B  quants: bytes 32p + 16h .. +15 of the block's qs -> low nibbles = elements
              64p + 16h + 0..15 (sub-block 2p), high nibbles = 64p + 32 + 16h + 0..15 (2p + 1)
    2 x 16 B  the 16 + 16 int8 activations those elements meet
    2 x 4 B   the two activation block scales xd, and 2 x 2 B d / dmin (same line as the header)

and does 16 dp4a for the dots q.x and the sums of x (the min term), all in registers.

Summation order (the exactness contract, cf. matvec.py):
  1. chunk value v_c = xd_a * ((d sc_a) sa - (dmin m_a) sxa) + xd_b * ((d sc_b) sb - (dmin m_b) sxb)
     with sa, sxa, sb, sxb exact int32 dp4a sums over the chunk's 16 + 16 values, d sc and
     dmin m exact float32 products, the rest float32 left to right;
  2. lane sum over the lane's chunks, ascending (32w + l, + 32 parts, ...); 3. warp_sum's tree;
  4. the row's warps in order (matvec.combine_parts); 5. + bias, + residual.
The reference is `matvec.matvec_q8_reference` (float64 of the same operands); with power-of-two
scales every step above is exact (tests/test_kernels_matvec.py checks that bit for bit).

rows = T > 1 (speculative decoding's verify, matvec.py's docstring): `rows_kernel(T)` runs the
loop above once, decodes each chunk's weights once (its 2 x 16 B of header and quants) and
meets them with each row's activations (row t's at t * K), one accumulator per row summed in
the order above, so that each row is bit for bit the one-row kernel's result for it.
"""
import numpy as np
from numba import cuda

from ..jit import kernel
from ..ptx import dp4a, ld_nc_v4_u32, warp_sum
from ..quant.types import QType, type_size
from .matvec import (PART_SH_ROWS, WARPS_PER_BLOCK, combine_parts, keep, nvvm_inlined,
                     rows_epilogue, rows_kernels, store_row, unrolled)

Q4_K_WORDS = type_size(QType.Q4_K) // 4     # 36 uint32 words a super-block
CHUNKS_PER_BLOCK = 8                         # 128 quant bytes / 16
UNROLL = 4                                   # chunks per lane per step (K = 4096: one step)
_LOW = np.uint32(0x0F0F0F0F)
_ONES = np.int32(0x01010101)


@cuda.jit(device=True, inline="always")
def _scale_byte(s0, s1, s2, k):
    """Byte k (0..11) of the 12 packed scale bytes held in three little-endian words."""
    w = s0 if k < 4 else (s1 if k < 8 else s2)
    return np.int32((w >> np.uint32(8 * (k & 3))) & np.uint32(255))


@cuda.jit(device=True, inline="always")
def _scale_min(s0, s1, s2, j):
    """Sub-block j's 6-bit (sc, m): ggml's get_scale_min_k4 on registers."""
    if j < 4:
        sc = _scale_byte(s0, s1, s2, j) & 63
        m = _scale_byte(s0, s1, s2, j + 4) & 63
    else:
        c = _scale_byte(s0, s1, s2, j + 4)
        sc = (c & 15) | ((_scale_byte(s0, s1, s2, j - 4) >> 6) << 4)
        m = (c >> 4) | ((_scale_byte(s0, s1, s2, j) >> 6) << 4)
    return sc, m


@cuda.jit(device=True, inline="always")
def _dot4(q0, q1, q2, q3, x0, x1, x2, x3):
    """Exact int32 dot of 16 int8 x 16 int8 (four dp4a)."""
    s = dp4a(np.int32(q0), np.int32(x0), np.int32(0))
    s = dp4a(np.int32(q1), np.int32(x1), s)
    s = dp4a(np.int32(q2), np.int32(x2), s)
    return dp4a(np.int32(q3), np.int32(x3), s)


@cuda.jit(device=True, inline="always")
def _chunk_weights(w32, row_word, c):
    """The two 16-byte weight loads of chunk c: (s0, s1, s2) the packed scales of its block's
    header, (q0, q1, q2, q3) its 16 quant bytes. Apart from `_chunk_value` so that a rows
    kernel issues them once for all its rows: LLVM does not merge repeated inline-asm loads."""
    b = c >> 3
    p = (c & 7) >> 1
    h = c & 1
    blk = row_word + b * Q4_K_WORDS
    _hdr, s0, s1, s2 = ld_nc_v4_u32(w32, blk)
    q0, q1, q2, q3 = ld_nc_v4_u32(w32, blk + 4 + 8 * p + 4 * h)
    return s0, s1, s2, q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _chunk_value(wh, xq, xd, row_word, c, wq):
    """Value of chunk c of the row starting at word row_word (step 1 of the docstring), its
    weight words `wq` from `_chunk_weights`."""
    s0, s1, s2, q0, q1, q2, q3 = wq
    b = c >> 3
    p = (c & 7) >> 1
    h = c & 1
    blk = row_word + b * Q4_K_WORDS
    e = b * 256 + 64 * p + 16 * h           # first element of sub-block 2p this chunk holds
    a0, a1, a2, a3 = ld_nc_v4_u32(xq, e >> 2)
    b0, b1, b2, b3 = ld_nc_v4_u32(xq, (e + 32) >> 2)
    d = np.float32(wh[2 * blk])
    dmin = np.float32(wh[2 * blk + 1])
    sc_a, m_a = _scale_min(s0, s1, s2, 2 * p)
    sc_b, m_b = _scale_min(s0, s1, s2, 2 * p + 1)
    sa = _dot4(q0 & _LOW, q1 & _LOW, q2 & _LOW, q3 & _LOW, a0, a1, a2, a3)
    sb = _dot4((q0 >> np.uint32(4)) & _LOW, (q1 >> np.uint32(4)) & _LOW,
               (q2 >> np.uint32(4)) & _LOW, (q3 >> np.uint32(4)) & _LOW, b0, b1, b2, b3)
    sxa = _dot4(_ONES, _ONES, _ONES, _ONES, a0, a1, a2, a3)
    sxb = _dot4(_ONES, _ONES, _ONES, _ONES, b0, b1, b2, b3)
    va = xd[e >> 5] * ((d * np.float32(sc_a)) * np.float32(sa) - (dmin * np.float32(m_a)) * np.float32(sxa))
    vb = xd[(e + 32) >> 5] * ((d * np.float32(sc_b)) * np.float32(sb) - (dmin * np.float32(m_b)) * np.float32(sxb))
    return va + vb


@cuda.jit(device=True, inline="always")
def _chunk(w32, wh, xq, xd, row_word, c):
    """Value of chunk c of the row starting at word row_word (step 1 of the docstring)."""
    return _chunk_value(wh, xq, xd, row_word, c, _chunk_weights(w32, row_word, c))


@kernel
def matvec_q8_q4_k_v4(w32, wh, M, K, xq, xd, y, bias, residual, has_bias, has_residual, parts):
    """One row per `parts` warps (see matvec.py); lane l of warp w takes chunks 32w + l, ..."""
    part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
    lane = cuda.threadIdx.x & 31
    warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
    row = warp // parts
    part = warp - row * parts
    if parts == 1 and row >= M:
        return
    nblk = K >> 8
    nchunk = nblk * CHUNKS_PER_BLOCK
    last = nchunk - 1
    if row >= M:
        nchunk = 0
    row_word = np.int64(row) * (nblk * Q4_K_WORDS)
    stride = 32 * parts
    acc = np.float32(0.0)
    for c in range(32 * part + lane, nchunk, stride * UNROLL):
        v0 = _chunk(w32, wh, xq, xd, row_word, c)
        v1 = _chunk(w32, wh, xq, xd, row_word, min(c + stride, last))
        v2 = _chunk(w32, wh, xq, xd, row_word, min(c + 2 * stride, last))
        v3 = _chunk(w32, wh, xq, xd, row_word, min(c + 3 * stride, last))
        acc += v0
        acc += keep(v1, c + stride, nchunk)
        acc += keep(v2, c + 2 * stride, nchunk)
        acc += keep(v3, c + 3 * stride, nchunk)
    total = combine_parts(part_sh, parts, part, lane, warp_sum(acc))
    if lane == 0 and part == 0 and row < M:
        store_row(y, bias, residual, has_bias, has_residual, row, total)


def _make_rows(nr):
    """matvec_q8_q4_k_v4 for nr rows of activations (module docstring)."""
    zero, finish = rows_epilogue(nr)

    @nvvm_inlined
    def slots(t, acc, args):
        # the one-row step for row t, on the weight words the kernel loaded for all rows
        wh, xq, xd, row_word, c, c1, c2, c3, w0, w1, w2, w3, stride, nchunk, K = args
        xqt = xq[t * (K >> 2):]
        xdt = xd[t * (K >> 5):]
        v0 = _chunk_value(wh, xqt, xdt, row_word, c, w0)
        v1 = _chunk_value(wh, xqt, xdt, row_word, c1, w1)
        v2 = _chunk_value(wh, xqt, xdt, row_word, c2, w2)
        v3 = _chunk_value(wh, xqt, xdt, row_word, c3, w3)
        a = acc[t]
        a += v0
        a += keep(v1, c + stride, nchunk)
        a += keep(v2, c + 2 * stride, nchunk)
        a += keep(v3, c + 3 * stride, nchunk)
        acc[t] = a

    step = unrolled(nr, slots)

    def matvec_q8_q4_k_v4_rows(w32, wh, M, K, xq, xd, y, bias, residual, has_bias, has_residual,
                               parts):
        part_sh = cuda.shared.array(PART_SH_ROWS, np.float32)
        acc = cuda.local.array(nr, np.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        row = warp // parts
        part = warp - row * parts
        if parts == 1 and row >= M:
            return
        nblk = K >> 8
        nchunk = nblk * CHUNKS_PER_BLOCK
        last = nchunk - 1
        if row >= M:
            nchunk = 0
        row_word = np.int64(row) * (nblk * Q4_K_WORDS)
        stride = 32 * parts
        zero(acc, ())
        for c in range(32 * part + lane, nchunk, stride * UNROLL):
            c1 = min(c + stride, last)
            c2 = min(c + 2 * stride, last)
            c3 = min(c + 3 * stride, last)
            step(acc, (wh, xq, xd, row_word, c, c1, c2, c3, _chunk_weights(w32, row_word, c),
                       _chunk_weights(w32, row_word, c1), _chunk_weights(w32, row_word, c2),
                       _chunk_weights(w32, row_word, c3), stride, nchunk, K))
        finish(acc, part_sh, lane, part, row, M, parts, y, bias, residual, has_bias, has_residual)

    matvec_q8_q4_k_v4_rows.__name__ = matvec_q8_q4_k_v4_rows.__qualname__ = \
        f"matvec_q8_q4_k_v4_r{nr}"
    return kernel(matvec_q8_q4_k_v4_rows)


rows_kernel = rows_kernels(_make_rows, "matvec_q4k")     # rows kernels, built on first use


# a module attribute so that tests/test_compile_ptx.py compiles it (PTX_SIGNATURES); the other
# row counts are the same code with another constant
matvec_q8_q4_k_v4_r4 = rows_kernel(4)

_SIG = ("void(uint32[::1], float16[::1], int32, int32, uint32[::1], float32[::1], "
        "float32[::1], float32[::1], float32[::1], int32, int32, int32)")
PTX_SIGNATURES = {"matvec_q8_q4_k_v4": [_SIG], "matvec_q8_q4_k_v4_r4": [_SIG]}
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "dp4a.s32.s32", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}


def launch(w8, M, K, xq_dev, xd_dev, y_dev, bias, residual, parts, grid, threads, stream,
           rows=1):
    """Called by matvec.launch_matvec_q8 for Q4_K (its checks already done, y and residual
    flat)."""
    w32 = w8.view(np.uint32)
    xq = xq_dev.reshape(xq_dev.size)[:rows * K].view(np.uint32)
    kern = matvec_q8_q4_k_v4 if rows == 1 else rows_kernel(rows)
    xd = xd_dev if xd_dev.ndim == 1 else xd_dev.reshape(xd_dev.size)
    kern[grid, threads, stream](
        w32, w8.view(np.float16), np.int32(M), np.int32(K), xq, xd, y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))
