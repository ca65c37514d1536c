"""Q6_K decode matvec with 16-byte loads and dp4a, on the repacked layout "Q6_K_R".

Same contract as `matvec.launch_matvec_q8` (y = W @ dequant(xq, xd) (+ bias) (+ residual), int8
activations from quantize_act.py), for Q6_K weights -- the LM head of every Q4_K_M file
(Qwen3.5-9B: 248320 x 4096, 834 MB, the largest single read of a decode step) and some
ffn_down / attn_v layers.

Why a repack. A Q6_K block is 210 bytes (ql[128] | qh[64] | scales[16] | d f16, dequant.py),
so in the GGUF layout blocks are only 2-byte aligned and the generic dp4a kernel reads every
4-byte group with ~11 small loads. Dropping each block's trailing d into an array of its own
leaves 208 = 13 x 16 bytes a block, so every field of every block is 16-byte aligned:

    Q6_K_R of a Q6_K matrix [M, K] (nblk = K / 256 blocks a row), defined by `repack_q6_k`:
      body  uint8[M, nblk * 208]   row r, block b at byte (r * nblk + b) * 208:
                                   ql[128] | qh[64] | scales[16], the GGUF block's bytes 0..207
      d     float16[M, nblk]       the GGUF block's bytes 208..209
    Lossless: `unpack_q6_k` gives back the GGUF bytes, so the reference is
    `matvec.matvec_q8_reference` on the original rows.

The kernel reads, per lane and per "chunk" (block b, half n, 16-wide column t: the 64 elements
256b + 128n + 32j + 16t + 0..15 for quarters j = 0..3; 4 chunks a block), with
`ld.global.nc.v4.u32`:

    2 x 16 B  ql bytes 64n + 16t .. +15 (low nibbles: j = 0, high: j = 2) and
              64n + 32 + 16t .. +15 (low: j = 1, high: j = 3)
    1 x 16 B  qh bytes 32n + 16t .. +15 (bits 2j, 2j + 1: the two high bits of quarter j)
    1 x 16 B  the block's 16 scales (the 4 lanes of a block read the same line; quarter j uses
              scale 8n + 2j + t)
    4 x 16 B  the 4 x 16 int8 activations, and 1 x 16 B their 4 scales xd (consecutive: one
              32-value activation block per quarter), and 2 B of d
and does 32 dp4a: sum (q - 32) x = dp4a(q, x) + dp4a(-32, x) per 4 values, exact in int32.
Consecutive lanes take consecutive chunks, so a warp's load instruction covers whole 32-byte
sectors of 8 consecutive blocks (lanes t = 0 and 1 read the two halves of a sector).

Summation order (the exactness contract, cf. matvec.py):
  1. chunk value v_c = ((t_0 + t_1) + t_2) + t_3,  t_j = ((d * sc_j) * xd_j) * isum_j, with
     isum_j the exact int32 sum of (q - 32) * xq over quarter j's 16 values, d * sc_j an exact
     float32 product (11-bit f16 mantissa x 8-bit int), the rest float32 left to right;
  2. lane sum over the lane's chunks, ascending (32w + l, + 32 parts, ...); 3. warp_sum's tree;
  4. the row's warps in order (matvec.combine_parts); 5. + bias, + residual.
With power-of-two scales every step is exact (tests/test_kernels_matvec_q6k.py checks that bit
for bit against the float64 reference). The GPU may fuse a multiply and the next add (FMA):
one rounding fewer, inside the same bound.

rows = T > 1 (speculative decoding's verify, matvec.py's docstring): `KERNELS(T, parts)` runs the
loop above once, loads each chunk's weights once and meets them with each row's activations
(row t's xq at t * K, xd at t * K / 32), one accumulator per row summed in the order above, so
that each row is bit for bit the one-row kernel's result for it -- the LM head's 834 MB read
once for all K + 1 verified tokens. The loop is matvec.py's row loop (`row_kernel`,
`rows_kernel_of`), given this module's `PATH`: a chunk's four 16-byte weight loads
(`_chunk_weights`) and its value (`_chunk_value`), two chunks a step. With matvec.ROWS_PAIRS /
ONE_ROW_PAIRS a warp takes two or four weight rows (decision 0036, `matvec.warp_rows`: for
verify's rows four from three activation rows on and two below by default, none for decode):
`_chunk_value2` / `_chunk_value4r` load each quarter's activations and form -32 sum(x) once
for all of them, each row's value the same expression.

Use (engine): at weight upload `body, d = repack_q6_k(raw, M, K)` and copy both to the device;
at decode `launch_matvec_q8_q6k_r(body_dev, d_dev, M, K, xq, xd, y, ...)` with xq, xd from
`quantize_act.launch_quantize_act` (the same operands `launch_matvec_q8` takes).
"""
import numpy as np
from numba import cuda

from ..ptx import dp4a, f32_from_bits, ld_nc_v4_u32
from ..quant.types import QType, block_size, type_size
from .dequant import Q6_K_OFF_D, Q6_K_OFF_QH, Q6_K_OFF_QL, Q6_K_OFF_SCALES
from .matvec import (THREADS, RowPath, _flat, at_least, check_rows, grid_rows, path_kernels,
                     rows_pair_kernel_of, warp_rows, warps_per_row, x_row_q8)

# ---------------------------------------------------------------- the Q6_K_R layout

Q6_K_BLOCK = block_size(QType.Q6_K)          # 256 values a block
Q6_K_R_BODY_BYTES = Q6_K_OFF_D               # 208: ql | qh | scales, the block without its d
assert Q6_K_R_BODY_BYTES % 16 == 0 and Q6_K_OFF_D + 2 == type_size(QType.Q6_K)
BODY_WORDS = Q6_K_R_BODY_BYTES // 4          # 52 uint32 words a block body
QL_WORD = Q6_K_OFF_QL // 4                   # 0
QH_WORD = Q6_K_OFF_QH // 4                   # 32
SCALES_WORD = Q6_K_OFF_SCALES // 4           # 48
CHUNKS_PER_BLOCK = 4                         # (half n, column t) pairs


def repack_q6_k(raw, M, K):
    """GGUF Q6_K rows (M * K / 256 blocks of 210 bytes, any shape/dtype, C-contiguous) ->
    (body uint8[M, nblk * 208], d float16[M, nblk]): the Q6_K_R layout (module docstring).
    Pure and lossless; `unpack_q6_k` is its inverse."""
    nblk = _blocks_per_row(K)
    ts = type_size(QType.Q6_K)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size != M * nblk * ts:
        raise ValueError(f"repack_q6_k: a Q6_K matrix of {M} x {K} is {M * nblk * ts} bytes, "
                         f"got {raw.size}")
    blocks = raw.reshape(M, nblk, ts)
    body = np.ascontiguousarray(blocks[:, :, :Q6_K_R_BODY_BYTES])
    body = body.reshape(M, nblk * Q6_K_R_BODY_BYTES)
    d = np.ascontiguousarray(blocks[:, :, Q6_K_OFF_D:]).view("<f2").reshape(M, nblk)
    return body, d.astype(np.float16, copy=False)


def unpack_q6_k(body, d, M, K):
    """Inverse of `repack_q6_k`: the GGUF Q6_K rows uint8[M, nblk * 210]."""
    nblk = _blocks_per_row(K)
    body = np.ascontiguousarray(body, dtype=np.uint8).reshape(-1)
    d = np.ascontiguousarray(d).reshape(-1)
    if body.size != M * nblk * Q6_K_R_BODY_BYTES or d.size != M * nblk or d.dtype != np.float16:
        raise ValueError(f"unpack_q6_k: {M} x {K} needs body uint8[{M * nblk * Q6_K_R_BODY_BYTES}] "
                         f"and d float16[{M * nblk}]; got {body.size} bytes, d {d.dtype}[{d.size}]")
    out = np.empty((M, nblk, type_size(QType.Q6_K)), np.uint8)
    out[:, :, :Q6_K_R_BODY_BYTES] = body.reshape(M, nblk, Q6_K_R_BODY_BYTES)
    out[:, :, Q6_K_OFF_D:] = d.astype("<f2").view(np.uint8).reshape(M, nblk, 2)
    return out.reshape(M, -1)


def _blocks_per_row(K):
    if K <= 0 or K % Q6_K_BLOCK:
        raise ValueError(f"Q6_K rows hold whole blocks of {Q6_K_BLOCK} values; K = {K} is not")
    return K // Q6_K_BLOCK


# where chunk (n, t)'s fields sit in the block body starting at word `blk` (the kernel reads
# the layout only through these)
@cuda.jit(device=True, inline="always")
def ql_word(blk, n, t, j_odd):
    """16 ql bytes of quarters j = j_odd (low nibbles) and j_odd + 2 (high nibbles)."""
    return blk + QL_WORD + 16 * n + 8 * j_odd + 4 * t


@cuda.jit(device=True, inline="always")
def qh_word(blk, n, t):
    """16 qh bytes: bits 2j, 2j + 1 of each are the high bits of quarter j."""
    return blk + QH_WORD + 8 * n + 4 * t


@cuda.jit(device=True, inline="always")
def scales_word(blk):
    return blk + SCALES_WORD


# ---------------------------------------------------------------- the kernel

# Chunks per lane per step, all loads of a step unconditional (matvec.py's clamping). 2 covers a
# K = 4096 row (64 chunks: the LM head) in exactly one step of one warp with no clamped slot,
# and keeps 2 x 64 B of weights in flight per lane -- as many bytes as matvec_q4k's 4 x 16 B
# quants + 4 x 16 B headers; K = 12288 (ffn_down) takes 3 steps.
UNROLL = 2
_LOW = np.uint32(0x0F0F0F0F)
_HIGH2 = np.uint32(0x30303030)                # bits 4, 5 of each byte: where qh's 2 bits go
_MINUS32 = np.int32(-0x1F1F1F20)              # 0xE0E0E0E0: four int8 -32


@cuda.jit(device=True, inline="always")
def _s8(word, k):
    """Signed byte k (0..3) of a uint32 word, as int32."""
    return (np.int32((word >> np.uint32(8 * k)) & np.uint32(255)) ^ 128) - 128


@cuda.jit(device=True, inline="always")
def _isum(q0, q1, q2, q3, x0, x1, x2, x3):
    """Exact int32 sum over 16 values of (q - 32) * x: 4 dp4a for q.x, 4 for -32 sum(x)."""
    s = dp4a(np.int32(q0), np.int32(x0), np.int32(0))
    s = dp4a(np.int32(q1), np.int32(x1), s)
    s = dp4a(np.int32(q2), np.int32(x2), s)
    s = dp4a(np.int32(q3), np.int32(x3), s)
    s = dp4a(_MINUS32, np.int32(x0), s)
    s = dp4a(_MINUS32, np.int32(x1), s)
    s = dp4a(_MINUS32, np.int32(x2), s)
    return dp4a(_MINUS32, np.int32(x3), s)


@cuda.jit(device=True, inline="always")
def _quarter(ds, xd_bits, xq, xw, q0, q1, q2, q3):
    """t_j = ((d * sc_j) * xd_j) * isum_j for one quarter (step 1 of the docstring), ds = d * sc_j."""
    x0, x1, x2, x3 = ld_nc_v4_u32(xq, xw)
    isum = _isum(q0, q1, q2, q3, x0, x1, x2, x3)
    return _term(ds, xd_bits, isum)


@cuda.jit(device=True, inline="always")
def _term(ds, xd_bits, isum):
    """t_j's float part: the one expression of every kernel here (the same FMA contraction)."""
    return (ds * f32_from_bits(xd_bits)) * np.float32(isum)


@cuda.jit(device=True, inline="always")
def _qdot(q0, q1, q2, q3, x0, x1, x2, x3, s):
    """s + q.x over 16 values (four dp4a): with s = -32 sum(x), `_isum`'s exact integer."""
    s = dp4a(np.int32(q0), np.int32(x0), s)
    s = dp4a(np.int32(q1), np.int32(x1), s)
    s = dp4a(np.int32(q2), np.int32(x2), s)
    return dp4a(np.int32(q3), np.int32(x3), s)


@cuda.jit(device=True, inline="always")
def _minus32_sum(x0, x1, x2, x3):
    """-32 sum(x) over 16 activations (four dp4a), exact: the weight-independent part of isum."""
    sx = dp4a(_MINUS32, np.int32(x0), np.int32(0))
    sx = dp4a(_MINUS32, np.int32(x1), sx)
    sx = dp4a(_MINUS32, np.int32(x2), sx)
    return dp4a(_MINUS32, np.int32(x3), sx)


@cuda.jit(device=True, inline="always")
def _quarter2(dsa, dsb, xd_bits, xq, xw, qa, qb):
    """`_quarter` for two weight rows (matvec.warp_rows): the 16 activations loaded and their
    -32 sum(x) formed once; each row's isum is the same exact integer as `_isum`'s (int32
    addition is associative), its term `_term`'s. qa, qb: the rows' four words of quarter j."""
    x0, x1, x2, x3 = ld_nc_v4_u32(xq, xw)
    sx = _minus32_sum(x0, x1, x2, x3)
    ia = _qdot(qa[0], qa[1], qa[2], qa[3], x0, x1, x2, x3, sx)
    ib = _qdot(qb[0], qb[1], qb[2], qb[3], x0, x1, x2, x3, sx)
    return _term(dsa, xd_bits, ia), _term(dsb, xd_bits, ib)


@cuda.jit(device=True, inline="always")
def _chunk_weights(body, dh, row_word, row_blk, c):
    """Everything of chunk c that does not depend on the activations, decoded once: a rows
    kernel calls this once per slot for all its rows (LLVM does not merge repeated inline-asm
    loads, and left in `_chunk_value` the decode was redone for every row). The four 16-byte
    weight loads (ql of quarters 0 | 2, of 1 | 3, qh, the block's scales) and the block's d,
    then (d sc_0, .., d sc_3) as exact float32 products and quarter j's 6-bit q, one per
    byte (4 bits from ql, bits 2j, 2j + 1 of qh moved to 4, 5), as four words each."""
    b = c >> 2
    n = (c >> 1) & 1
    t = c & 1
    blk = row_word + b * BODY_WORDS
    a0, a1, a2, a3 = ld_nc_v4_u32(body, ql_word(blk, n, t, 0))      # j = 0 | j = 2
    b0, b1, b2, b3 = ld_nc_v4_u32(body, ql_word(blk, n, t, 1))      # j = 1 | j = 3
    h0, h1, h2, h3 = ld_nc_v4_u32(body, qh_word(blk, n, t))
    s0, s1, s2, s3 = ld_nc_v4_u32(body, scales_word(blk))
    d = np.float32(dh[row_blk + b])
    lo = s0 if n == 0 else s2                   # scales 8n .. 8n + 3
    hi = s1 if n == 0 else s3                   # scales 8n + 4 .. 8n + 7
    return (d * np.float32(_s8(lo, t)), d * np.float32(_s8(lo, 2 + t)),
            d * np.float32(_s8(hi, t)), d * np.float32(_s8(hi, 2 + t)),
            (a0 & _LOW) | ((h0 << np.uint32(4)) & _HIGH2),
            (a1 & _LOW) | ((h1 << np.uint32(4)) & _HIGH2),
            (a2 & _LOW) | ((h2 << np.uint32(4)) & _HIGH2),
            (a3 & _LOW) | ((h3 << np.uint32(4)) & _HIGH2),
            (b0 & _LOW) | ((h0 << np.uint32(2)) & _HIGH2),
            (b1 & _LOW) | ((h1 << np.uint32(2)) & _HIGH2),
            (b2 & _LOW) | ((h2 << np.uint32(2)) & _HIGH2),
            (b3 & _LOW) | ((h3 << np.uint32(2)) & _HIGH2),
            ((a0 >> np.uint32(4)) & _LOW) | (h0 & _HIGH2),
            ((a1 >> np.uint32(4)) & _LOW) | (h1 & _HIGH2),
            ((a2 >> np.uint32(4)) & _LOW) | (h2 & _HIGH2),
            ((a3 >> np.uint32(4)) & _LOW) | (h3 & _HIGH2),
            ((b0 >> np.uint32(4)) & _LOW) | ((h0 >> np.uint32(2)) & _HIGH2),
            ((b1 >> np.uint32(4)) & _LOW) | ((h1 >> np.uint32(2)) & _HIGH2),
            ((b2 >> np.uint32(4)) & _LOW) | ((h2 >> np.uint32(2)) & _HIGH2),
            ((b3 >> np.uint32(4)) & _LOW) | ((h3 >> np.uint32(2)) & _HIGH2))


@cuda.jit(device=True, inline="always")
def _chunk_value(xq, xd32, c, wq):
    """Value v_c of chunk c against one row of activations, its decoded weights `wq` from
    `_chunk_weights`: the quarters' scales xd in one 16-byte load, then per quarter its 16
    activations and 8 dp4a."""
    (ds0, ds1, ds2, ds3, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3,
     u0, u1, u2, u3) = wq
    b = c >> 2
    n = (c >> 1) & 1
    t = c & 1
    f0, f1, f2, f3 = ld_nc_v4_u32(xd32, 8 * b + 4 * n)              # xd of quarters 0..3
    xw = 64 * b + 32 * n + 4 * t                # word of activation 256b + 128n + 16t
    return _chunk_sum(_quarter(ds0, f0, xq, xw, p0, p1, p2, p3),
                      _quarter(ds1, f1, xq, xw + 8, q0, q1, q2, q3),
                      _quarter(ds2, f2, xq, xw + 16, r0, r1, r2, r3),
                      _quarter(ds3, f3, xq, xw + 24, u0, u1, u2, u3))


@cuda.jit(device=True, inline="always")
def _chunk_sum(t0, t1, t2, t3):
    """v_c = ((t_0 + t_1) + t_2) + t_3 (step 1 of the docstring)."""
    v = t0
    v += t1
    v += t2
    v += t3
    return v


@cuda.jit(device=True, inline="always")
def _chunk_value2(xq, xd32, c, wqa, wqb):
    """`_chunk_value` for two weight rows, each activation load made once (matvec.warp_rows);
    each row's v_c is the one-row kernel's ((t_0 + t_1) + t_2) + t_3."""
    b = c >> 2
    n = (c >> 1) & 1
    t = c & 1
    f0, f1, f2, f3 = ld_nc_v4_u32(xd32, 8 * b + 4 * n)
    xw = 64 * b + 32 * n + 4 * t
    a0, b0 = _quarter2(wqa[0], wqb[0], f0, xq, xw, wqa[4:8], wqb[4:8])
    a1, b1 = _quarter2(wqa[1], wqb[1], f1, xq, xw + 8, wqa[8:12], wqb[8:12])
    a2, b2 = _quarter2(wqa[2], wqb[2], f2, xq, xw + 16, wqa[12:16], wqb[12:16])
    a3, b3 = _quarter2(wqa[3], wqb[3], f3, xq, xw + 24, wqa[16:20], wqb[16:20])
    return _chunk_sum(a0, a1, a2, a3), _chunk_sum(b0, b1, b2, b3)


@cuda.jit(device=True, inline="always")
def _quarter4r(ds, xd_bits, xq, xw, qs):
    """`_quarter2` for four weight rows: ds their d sc_j, qs their four words of quarter j."""
    x0, x1, x2, x3 = ld_nc_v4_u32(xq, xw)
    sx = _minus32_sum(x0, x1, x2, x3)
    q0, q1, q2, q3 = qs
    return (_term(ds[0], xd_bits, _qdot(q0[0], q0[1], q0[2], q0[3], x0, x1, x2, x3, sx)),
            _term(ds[1], xd_bits, _qdot(q1[0], q1[1], q1[2], q1[3], x0, x1, x2, x3, sx)),
            _term(ds[2], xd_bits, _qdot(q2[0], q2[1], q2[2], q2[3], x0, x1, x2, x3, sx)),
            _term(ds[3], xd_bits, _qdot(q3[0], q3[1], q3[2], q3[3], x0, x1, x2, x3, sx)))


@cuda.jit(device=True, inline="always")
def _chunk_value4r(xq, xd32, c, wqs):
    """`_chunk_value2` for four weight rows (matvec.PAIR_ROWS_PER_WARP = 4)."""
    b = c >> 2
    n = (c >> 1) & 1
    t = c & 1
    f0, f1, f2, f3 = ld_nc_v4_u32(xd32, 8 * b + 4 * n)
    xw = 64 * b + 32 * n + 4 * t
    w0, w1, w2, w3 = wqs
    t0 = _quarter4r((w0[0], w1[0], w2[0], w3[0]), f0, xq, xw,
                    (w0[4:8], w1[4:8], w2[4:8], w3[4:8]))
    t1 = _quarter4r((w0[1], w1[1], w2[1], w3[1]), f1, xq, xw + 8,
                    (w0[8:12], w1[8:12], w2[8:12], w3[8:12]))
    t2 = _quarter4r((w0[2], w1[2], w2[2], w3[2]), f2, xq, xw + 16,
                    (w0[12:16], w1[12:16], w2[12:16], w3[12:16]))
    t3 = _quarter4r((w0[3], w1[3], w2[3], w3[3]), f3, xq, xw + 24,
                    (w0[16:20], w1[16:20], w2[16:20], w3[16:20]))
    return (_chunk_sum(t0[0], t1[0], t2[0], t3[0]), _chunk_sum(t0[1], t1[1], t2[1], t3[1]),
            _chunk_sum(t0[2], t1[2], t2[2], t3[2]), _chunk_sum(t0[3], t1[3], t2[3], t3[3]))


@cuda.jit(device=True, inline="always")
def _units(K):
    return (K >> 8) * CHUNKS_PER_BLOCK


@cuda.jit(device=True, inline="always")
def _base(row, K):
    """(first body word, first block) of the row."""
    row_blk = np.int64(row) * (K >> 8)
    return row_blk * BODY_WORDS, row_blk


@cuda.jit(device=True, inline="always")
def _weights(w, base, c):
    return _chunk_weights(w[0], w[1], base[0], base[1], c)


@cuda.jit(device=True, inline="always")
def _value(w, x, base, c, wq):
    return _chunk_value(x[0], x[1], c, wq)


@cuda.jit(device=True, inline="always")
def _values2(w, x, base_a, base_b, c, wqa, wqb):
    return _chunk_value2(x[0], x[1], c, wqa, wqb)


@cuda.jit(device=True, inline="always")
def _values4(w, x, bases, c, wqs):
    return _chunk_value4r(x[0], x[1], c, wqs)


# w = (body as uint32 words, d float16); x = (xq, xd as uint32 words): matvec.py's row loop
PATH = RowPath("matvec_q8_q6_k_r", __name__, UNROLL, _units, _base, _weights, _value,
               x_row_q8, lambda K: (K >> 8) * CHUNKS_PER_BLOCK, values2=_values2,
               values4=_values4)
KERNELS = path_kernels(PATH, "matvec_q6k_r")    # KERNELS(rows, parts)


# module attributes so that tests/test_compile_ptx.py compiles them (PTX_SIGNATURES); the other
# row counts are the same code with another constant
matvec_q8_q6_k_r = KERNELS(1, 2)
matvec_q8_q6_k_r_p1 = KERNELS(1, 1)
matvec_q8_q6_k_r_r4 = KERNELS(4, 2)
# verify's rows on two / four weight rows a warp (matvec.warp_rows)
matvec_q8_q6_k_r_w2_p1_r4 = rows_pair_kernel_of(PATH, 4)
matvec_q8_q6_k_r_w4_p1_r4 = rows_pair_kernel_of(PATH, 4, 4)

_SIG = ("void(Tuple((uint32[::1], float16[::1])), int32, int32, "
        "Tuple((uint32[::1], uint32[::1])), float32[::1], float32[::1], float32[::1], int32, "
        "int32, int32)")
PTX_SIGNATURES = {"matvec_q8_q6_k_r": [_SIG], "matvec_q8_q6_k_r_p1": [_SIG],
                  "matvec_q8_q6_k_r_r4": [_SIG], "matvec_q8_q6_k_r_w2_p1_r4": [_SIG],
                  "matvec_q8_q6_k_r_w4_p1_r4": [_SIG]}
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "dp4a.s32.s32", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}


# ---------------------------------------------------------------- launcher and reference


def _misaligned(a):
    """True when a device array's base is not 16-byte aligned (unknown in the simulator)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    return cai is not None and cai["data"][0] % 16 != 0


def launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, y, bias=None, residual=None, stream=0,
                           parts=None, rows=1, beside=False):
    """y = W @ dequant(xq, xd) (+ bias) (+ residual) for a Q6_K matrix W in the Q6_K_R layout.

    body: device uint8, M * K / 256 * 208 bytes (any shape, C-contiguous, 16-byte aligned: a
    fresh allocation is), d: device float16, M * K / 256 values -- `repack_q6_k`'s two arrays.
    xq int8[K] and xd float32[K / 32] from `quantize_act.launch_quantize_act` (16-byte aligned);
    y float32[M]; bias, residual float32[M] or None (residual may be y: y += W @ x).
    parts: warps per row, 1, 2 or 4 (default `matvec.warps_per_row(M, K)`).
    rows: T = 1 .. MAX_ROWS rows of activations, the weights read once (module docstring): xq
    int8[T * K], xd float32[T * K / 32], y and residual float32[T * M] (row t at t * K,
    t * K / 32, t * M; any C-contiguous shape), bias float32[M]; row t of y is bit for bit a
    rows = 1 launch on row t's inputs.
    beside: the launch runs beside others on the GPU (graph branches; `matvec.warp_rows`).
    Reference: `matvec_q8_q6k_r_reference` (= `matvec.matvec_q8_reference` on the GGUF rows)."""
    nblk = _blocks_per_row(K)
    rows = check_rows(rows, "matvec_q6k_r")
    if body.dtype != np.uint8 or body.size != M * nblk * Q6_K_R_BODY_BYTES:
        raise ValueError(f"matvec_q6k_r: body must be uint8[{M * nblk * Q6_K_R_BODY_BYTES}] "
                         f"(repack_q6_k of a {M} x {K} Q6_K matrix); got {body.dtype}[{body.size}]")
    if d.dtype != np.float16 or d.size != M * nblk:
        raise ValueError(f"matvec_q6k_r: d must be float16[{M * nblk}]; got {d.dtype}[{d.size}]")
    if xq.dtype != np.int8 or xq.size < rows * K or xd.dtype != np.float32 \
            or xd.size < rows * K // 32:
        raise ValueError(f"matvec_q6k_r: xq must be int8[{rows * K}] and xd "
                         f"float32[{rows * K // 32}]" + ("" if rows == 1 else
                                                         f" (rows={rows} x K={K})"))
    for name, a, n in (("y", y, rows), ("bias", bias, 1), ("residual", residual, rows)):
        if a is not None and (a.dtype != np.float32 or a.size < n * M):
            raise ValueError(f"matvec_q6k_r: {name} must be float32 with at least "
                             f"{at_least(n, M, 'M')} elements")
    for name, a in (("body", body), ("xq", xq), ("xd", xd)):
        if _misaligned(a):
            raise ValueError(f"matvec_q6k_r: {name} is read with 16-byte loads and must start "
                             "16-byte aligned (pass a whole allocation, not an offset slice)")
    parts = warps_per_row(M, K) if parts is None else int(parts)
    if parts not in (1, 2, 4):
        raise ValueError(f"matvec_q6k_r: parts (warps per row) must be 1, 2 or 4, not {parts}")
    R = warp_rows(PATH, rows, parts, M, beside)
    grid = grid_rows(M, parts, R)
    y = _flat(y)
    kern = KERNELS(rows, parts, K, R=R)
    kern[grid, THREADS, stream](
        (_flat(body).view(np.uint32), _flat(d)), np.int32(M), np.int32(K),
        (_flat(xq)[:rows * K].view(np.uint32), _flat(xd)[:rows * K // 32].view(np.uint32)), y,
        y if bias is None else bias, y if residual is None else _flat(residual),
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))


def matvec_q8_q6k_r_reference(body, d, M, K, xq, xd, bias=None, residual=None):
    """float64 reference of the kernel: `matvec.matvec_q8_reference` on the GGUF rows that
    `unpack_q6_k(body, d)` restores (the repack is lossless)."""
    from .matvec import matvec_q8_reference
    return matvec_q8_reference(unpack_q6_k(body, d, M, K), QType.Q6_K, M, K, xq, xd, bias, residual)
