"""Q4_K decode matvec with 16-byte loads and dp4a: the kernel behind every Q4_K_M model's bulk.

Same contract as `matvec.launch_matvec_q8` (y = W @ dequant(xq, xd) (+ bias) (+ residual), int8
activations from quantize_act.py), specialised for Q4_K because a Q4_K super-block is 144 bytes
= 9 x 16: every block, its 16-byte header (d, dmin, 12 bytes of packed 6-bit scales/mins) and
each 16-byte run of its quants are 16-byte aligned in the GGUF layout itself, so no repack is
needed to read them with `ld.global.nc.v4.u32`. The generic q8 kernel reads a 4-byte group per
lane and decodes both sub-block scales from single bytes for every group (~10 loads per 4
bytes of weights); this one reads, per lane and per "chunk" of 16 quant bytes:

    1 x 16 B  the block header: d, dmin (f16, word 0) and the packed scales (the 8 lanes of a
              block hit the same line; L1 serves them)
    1 x 16 B  quants: bytes 32p + 16h .. +15 of the block's qs -> low nibbles = elements
              64p + 16h + 0..15 (sub-block 2p), high nibbles = 64p + 32 + 16h + 0..15 (2p + 1)
    2 x 16 B  the 16 + 16 int8 activations those elements meet
    1 x 8 B   the two activation block scales xd (consecutive: one 8-byte load)

and does 16 dp4a for the dots q.x and the sums of x (the min term), all in registers. The
high nibbles are never shifted down: masked in place they are 16 q as unsigned bytes, their
dot comes from dp4a.u32.s32 as 16 sb, and their scale is d sc_b / 16 -- both factors exact, so
the product is the real number (d sc_b) sb and rounds as it would (step 1 below).

The work splits in two (session 14): `_chunk_weights` -- the loads and decode of the weights
(scales to float products, nibbles) -- and `_chunk_value` -- the activations, dp4a and float
combination. A rows kernel (below) does the first once per chunk for all its rows; before the
split ptxas redid the decode per row, and the 4-row kernel's loop ran 96 SASS instructions per
(row, chunk) against 54 after (sm_90, ptxas 13.0; the one-row loop 132 a chunk against 90).

Summation order (the exactness contract, cf. matvec.py):
  1. chunk value v_c = xd_a * ((d sc_a) sa - (dmin m_a) sxa) + xd_b * ((d sc_b) sb - (dmin m_b) sxb)
     with sa, sxa, sb, sxb exact int32 dp4a sums over the chunk's 16 + 16 values, d sc and
     dmin m exact float32 products, the rest float32 left to right;
  2. lane sum over the lane's chunks, ascending (32w + l, + 32 parts, ...); 3. warp_sum's tree;
  4. the row's warps in order (matvec.combine_parts); 5. + bias, + residual.
The reference is `matvec.matvec_q8_reference` (float64 of the same operands); with power-of-two
scales every step above is exact (tests/test_kernels_matvec.py checks that bit for bit).

rows = T > 1 (speculative decoding's verify, matvec.py's docstring): `KERNELS(T, parts)` runs the
loop above once, loads and decodes each chunk's weights once (`_chunk_weights`) and
meets them with each row's activations (row t's at t * K), one accumulator per row summed in
the order above, so that each row is bit for bit the one-row kernel's result for it.

The loop itself -- which warp owns which row and chunks, the clamped slots, the combine -- is
matvec.py's row loop (`row_kernel`, `rows_kernel_of`); this module gives it the Q4_K path
(`PATH`): what a chunk is, its weights (`_chunk_weights`) and its value (`_chunk_value`). With
matvec.ROWS_PAIRS / ONE_ROW_PAIRS a warp takes two or four weight rows (decision 0036;
`matvec.warp_rows` picks: verify's rows take four from three activation rows on, two below, by
default; decode's one row none): the chunk's activation side (`_chunk_x`: its words, their
sums, their scales) is loaded once for all of them, and each row's value is
`_chunk_combine`'s, as above.
"""
import numpy as np
from numba import cuda, float32, uint32

from ..device import sm_count
from ..jit import kernel
from ..ptx import (byte_perm, dp4a, dp4a_us, f16x2_to_f32x2, ld_nc_v2_f32, ld_nc_v4_u32,
                   warp_sum)
from ..quant.types import QType, type_size
from .matvec import (WARPS_PER_BLOCK, RowPath, fit_unroll, grid_rows, group_kernels,
                     path_kernels, rows_pair_kernel_of, store_row, token_kernels, warp_rows)

Q4_K_WORDS = type_size(QType.Q4_K) // 4     # 36 uint32 words a super-block
CHUNKS_PER_BLOCK = 8                         # 128 quant bytes / 16
UNROLL = 4                                   # chunks per lane per step (K = 4096: one step)
_LOW = np.uint32(0x0F0F0F0F)
_HIGH = np.uint32(0xF0F0F0F0)
_SIXTEENTH = np.float32(0.0625)
_ONES = np.int32(0x01010101)
_LOW6 = np.uint32(0x3F3F3F3F)
_TOP2 = np.uint32(0x30303030)


@cuda.jit(device=True, inline="always")
def pair_scales(s0, s1, s2, p):
    """Sub-blocks 2p and 2p + 1's 6-bit (sc, m) as (sc_a, m_a, sc_b, m_b): ggml's
    get_scale_min_k4 done four bytes at a time. Of the 12 packed bytes (words s0, s1, s2),
    sub-blocks 0..3 are the low 6 bits of s0 (sc) and s1 (m); sub-blocks 4..7 take their low 4
    bits from s2's nibbles and their top 2 from the top bits of s0 / s1. Decoding the word of
    four scales and picking two bytes out of it (one prmt each) is ~10 integer ops with no
    data-dependent branch: the byte-by-byte decode it replaces was most of the kernel's time on
    the H200 (bench/q4k_probe.py's `noscale` row, session 5)."""
    hi = p >= 2
    scw = ((s2 & _LOW) | ((s0 >> np.uint32(2)) & _TOP2)) if hi else (s0 & _LOW6)
    mw = (((s2 >> np.uint32(4)) & _LOW) | ((s1 >> np.uint32(2)) & _TOP2)) if hi else (s1 & _LOW6)
    sel = _u32(0x4440 + 2 * (p & 1))      # prmt: byte 2 (p & 1) of the word, zero-extended
    return (byte_perm(scw, 0, sel), byte_perm(mw, 0, sel),
            byte_perm(scw, 0, sel + 1), byte_perm(mw, 0, sel + 1))


@cuda.jit(device=True, inline="always")
def _lane_pos():
    """(p, h) of every chunk this lane takes: chunk c holds quant bytes 32p + 16h of its block
    with p = (c & 7) >> 1, h = c & 1, and the row loop gives lane l the chunks 32 part + l +
    j 32 parts (matvec.py), all = l (mod 8). Taking them from the lane rather than from c lets
    the compiler compute them once per thread (from c it recomputed them for every slot: the
    loop's stride is a run-time value). A clamped slot (c = the row's last chunk) then reads
    another chunk of the same, last block: in bounds, and its value is dropped (`keep`)."""
    k = _u32(cuda.threadIdx.x) & np.uint32(7)
    return _u32(k >> np.uint32(1)), _u32(k & np.uint32(1))


@cuda.jit(device=True, inline="always")
def _dot4(q0, q1, q2, q3, x0, x1, x2, x3):
    """Exact int32 dot of 16 int8 x 16 int8 (four dp4a)."""
    s = dp4a(np.int32(q0), np.int32(x0), np.int32(0))
    s = dp4a(np.int32(q1), np.int32(x1), s)
    s = dp4a(np.int32(q2), np.int32(x2), s)
    return dp4a(np.int32(q3), np.int32(x3), s)


@cuda.jit(device=True, inline="always")
def _dot4_us(q0, q1, q2, q3, x0, x1, x2, x3):
    """Exact int32 dot of 16 uint8 x 16 int8 (four dp4a.u32.s32)."""
    s = dp4a_us(q0, x0, np.int32(0))
    s = dp4a_us(q1, x1, s)
    s = dp4a_us(q2, x2, s)
    return dp4a_us(q3, x3, s)


@cuda.jit(device=True, inline="always")
def _u32(v):
    """v as uint32. Numba types integer arithmetic as 64-bit; truncating each offset lets LLVM
    narrow it to 32-bit ops (a row's offsets are far below 2^32), one instruction where the
    64-bit form took two (sm_90 SASS: IADD3 + IADD3.X, IMAD.WIDE + IMAD)."""
    return np.uint32(v)


@cuda.jit(device=True, inline="always")
def _f32(v):
    """float32 of a small integer (a 6-bit scale, a dp4a sum) through int32: exact,
    and one 32-bit convert. Numba types shifts and masks of uint32 words as uint64, whose
    float conversion is a 64-bit I2F (sm_90's SASS showed one per scale and row)."""
    return np.float32(np.int32(v))


@cuda.jit(device=True, inline="always")
def _chunk_weights(w32, row_word, c):
    """Everything of chunk c that does not depend on the activations, decoded once: a rows
    kernel calls this once per slot for all its rows (LLVM does not merge repeated inline-asm
    loads, and ptxas recomputed the decode per row when it was left inside `_chunk_value`).
    Two 16-byte loads -- the block header (d and dmin as f16 in word 0, the packed scales in
    words 1..3) and the chunk's 16 quant bytes -- then
      (d sc_a, dmin m_a, d sc_b / 16, dmin m_b)   exact float32 products (step 1 of the
                                             docstring; the 16 is a power of two: see below)
      lo0..lo3, hi0..hi3                     the quant words' low nibbles, and their high
                                             nibbles masked in place (16 x the nibble a byte)."""
    hdr, s0, s1, s2, q0, q1, q2, q3 = _chunk_words(w32, row_word, c)
    return _chunk_decode(hdr, s0, s1, s2, q0, q1, q2, q3)


@cuda.jit(device=True, inline="always")
def _chunk_words(w32, row_word, c):
    """Chunk c's two 16-byte loads as they come: (hdr, s0, s1, s2, q0, q1, q2, q3)."""
    p, h = _lane_pos()
    row = w32[row_word:]                    # the row's words: offsets in it are 32-bit
    blk = _u32(_u32(c) >> np.uint32(3)) * np.uint32(Q4_K_WORDS)
    hdr, s0, s1, s2 = ld_nc_v4_u32(row, blk)
    q0, q1, q2, q3 = ld_nc_v4_u32(row, _u32(blk + _u32(4 + 8 * p + 4 * h)))
    return hdr, s0, s1, s2, q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _chunk_decode(hdr, s0, s1, s2, q0, q1, q2, q3):
    """`_chunk_weights`'s decode of the words `_chunk_words` loaded."""
    p, _h = _lane_pos()
    d, dmin = f16x2_to_f32x2(hdr)
    sc_a, m_a, sc_b, m_b = pair_scales(s0, s1, s2, p)
    return (d * _f32(sc_a), dmin * _f32(m_a), (d * _SIXTEENTH) * _f32(sc_b), dmin * _f32(m_b),
            q0 & _LOW, q1 & _LOW, q2 & _LOW, q3 & _LOW,
            q0 & _HIGH, q1 & _HIGH, q2 & _HIGH, q3 & _HIGH)


@cuda.jit(device=True, inline="always")
def _chunk_value(xq, xd, ow, os, c, wq):
    """Value of chunk c against one row of activations in natural order (step 1 of the
    docstring), its decoded weights `wq` from `_chunk_weights`: two 16-byte activation loads,
    16 dp4a, the float combination. The row starts at word `ow` of xq and entry `os` of xd
    (`_x_row`)."""
    p, h = _lane_pos()
    # word of the first element of sub-block 2p the chunk holds; sub-block 2p + 1's is 8 words
    # (32 bytes) on, and their scales are entries s and s + 1: constant offsets from one address
    b = _u32(_u32(c) >> np.uint32(3))
    xw = np.int64(_u32(b * np.uint32(64) + _u32(16 * p + 4 * h))) + ow
    return _chunk_dot(xq, xd, xw, xw + 8, _x_scale(b, p, os), wq)


@cuda.jit(device=True, inline="always")
def _chunk_value2(xq, xd, ow, os, c, wqa, wqb):
    """`_chunk_value` for two weight rows, one load of the activations (matvec.warp_rows)."""
    p, h = _lane_pos()
    b = _u32(_u32(c) >> np.uint32(3))
    xw = np.int64(_u32(b * np.uint32(64) + _u32(16 * p + 4 * h))) + ow
    return _chunk_dot2(xq, xd, xw, xw + 8, _x_scale(b, p, os), wqa, wqb)


@cuda.jit(device=True, inline="always")
def _chunk_value4r(xq, xd, ow, os, c, wqs):
    """`_chunk_value` for four weight rows, one load of the activations."""
    p, h = _lane_pos()
    b = _u32(_u32(c) >> np.uint32(3))
    xw = np.int64(_u32(b * np.uint32(64) + _u32(16 * p + 4 * h))) + ow
    return _chunk_dot4r(xq, xd, xw, xw + 8, _x_scale(b, p, os), wqs)


@cuda.jit(device=True, inline="always")
def _chunk_value_nib(xq, xd, ow, os, c, wq):
    """`_chunk_value` for a row in nibble order (quantize_act.nibble_order): sub-block 2p sits
    at slot p of its 256 values, 2p + 1 at slot 4 + p, so the block's 8 lanes read words
    8p + 4h (one 128-byte line) and 32 on (the next). The same operands, the same bits."""
    p, h = _lane_pos()
    b = _u32(_u32(c) >> np.uint32(3))
    xw = np.int64(_u32(b * np.uint32(64) + _u32(8 * p + 4 * h))) + ow
    return _chunk_dot(xq, xd, xw, xw + 32, _x_scale(b, p, os), wq)


@cuda.jit(device=True, inline="always")
def _x_scale(b, p, os):
    """Entry of xd holding sub-block 2p's scale of super-block b (2p + 1's is the next)."""
    return np.int64(_u32(b * np.uint32(8) + _u32(2 * p))) + os


@cuda.jit(device=True, inline="always")
def _chunk_dot(xq, xd, xa, xb, s, wq):
    """The chunk's value from its activation words xq[xa .. xa + 3] (sub-block 2p's 16) and
    xq[xb .. xb + 3] (2p + 1's), the scales xd[s], xd[s + 1] and its decoded weights."""
    return _chunk_combine(wq, _chunk_x(xq, xd, xa, xb, s))


@cuda.jit(device=True, inline="always")
def _chunk_dot2(xq, xd, xa, xb, s, wqa, wqb):
    """`_chunk_dot` for two weight rows (matvec.warp_rows): the activation words, their sums
    and scales loaded and formed once, each row's value `_chunk_combine`'s, as in the one-row
    kernel."""
    ax = _chunk_x(xq, xd, xa, xb, s)
    return _chunk_combine(wqa, ax), _chunk_combine(wqb, ax)


@cuda.jit(device=True, inline="always")
def _chunk_dot4r(xq, xd, xa, xb, s, wqs):
    """`_chunk_dot2` for four weight rows (matvec.PAIR_ROWS_PER_WARP = 4), wqs their decoded
    weights."""
    ax = _chunk_x(xq, xd, xa, xb, s)
    w0, w1, w2, w3 = wqs
    return (_chunk_combine(w0, ax), _chunk_combine(w1, ax), _chunk_combine(w2, ax),
            _chunk_combine(w3, ax))


@cuda.jit(device=True, inline="always")
def _chunk_x(xq, xd, xa, xb, s):
    """A chunk's activation side, whatever the weights: words xq[xa .. xa + 3] (sub-block 2p's
    16) and xq[xb .. xb + 3] (2p + 1's), their exact sums, their scales xd[s], xd[s + 1]."""
    a0, a1, a2, a3 = ld_nc_v4_u32(xq, xa)
    b0, b1, b2, b3 = ld_nc_v4_u32(xq, xb)
    sxa = _dot4(_ONES, _ONES, _ONES, _ONES, a0, a1, a2, a3)
    sxb = _dot4(_ONES, _ONES, _ONES, _ONES, b0, b1, b2, b3)
    xda, xdb = ld_nc_v2_f32(xd, s)
    return a0, a1, a2, a3, b0, b1, b2, b3, sxa, sxb, xda, xdb


@cuda.jit(device=True, inline="always")
def _chunk_combine(wq, ax):
    """The chunk's value (step 1 of the docstring) from its decoded weights and its activation
    side (`_chunk_x`): the one expression every kernel of this module uses, so its FMA
    contraction is the same everywhere."""
    dsa, dma, dsb, dmb, l0, l1, l2, l3, h0, h1, h2, h3 = wq
    a0, a1, a2, a3, b0, b1, b2, b3, sxa, sxb, xda, xdb = ax
    sa = _dot4(l0, l1, l2, l3, a0, a1, a2, a3)
    # 16 sb: the high nibbles in place are unsigned bytes 16 q (dp4a.u32.s32), and
    # (d sc_b / 16) (16 sb) is the real number (d sc_b) sb, both factors exact: the same
    # float32 product and the same fused multiply-add, bit for bit
    sb16 = _dot4_us(h0, h1, h2, h3, b0, b1, b2, b3)
    va = xda * (dsa * _f32(sa) - dma * _f32(sxa))
    vb = xdb * (dsb * _f32(sb16) - dmb * _f32(sxb))
    return va + vb


@cuda.jit(device=True, inline="always")
def _units(K):
    return (K >> 8) * CHUNKS_PER_BLOCK


@cuda.jit(device=True, inline="always")
def _base(row, K):
    return np.int64(row) * ((K >> 8) * Q4_K_WORDS)


@cuda.jit(device=True, inline="always")
def _weights(w, row_word, c):
    return _chunk_weights(w[0], row_word, c)


@cuda.jit(device=True, inline="always")
def _value(w, x, row_word, c, wq):
    return _chunk_value(x[0], x[1], x[2], x[3], c, wq)


@cuda.jit(device=True, inline="always")
def _values2(w, x, word_a, word_b, c, wqa, wqb):
    return _chunk_value2(x[0], x[1], x[2], x[3], c, wqa, wqb)


@cuda.jit(device=True, inline="always")
def _values4(w, x, words, c, wqs):
    return _chunk_value4r(x[0], x[1], x[2], x[3], c, wqs)


@cuda.jit(device=True, inline="always")
def _value_nib(w, x, row_word, c, wq):
    return _chunk_value_nib(x[0], x[1], x[2], x[3], c, wq)


@cuda.jit(device=True, inline="always")
def _x_row(x, t, K):
    """Activation row t of x = (xq words, xd) as the whole arrays and the row's start (word
    t K / 4 of xq, entry t K / 32 of xd). Not slices (matvec.x_row_q8): a slice per row gave
    every row's loads their own 64-bit address arithmetic, ~8 instructions per (row, chunk) in
    the rows kernels; offsets from one base cost ~4 (sm_90 SASS, decision 0020)."""
    return x[0], x[1], np.uint32(t * (K >> 2)), np.uint32(t * (K >> 5))


@cuda.jit(device=True, inline="always")
def _x_one(x, K):
    """The one-row kernel's activations: `_x_row`'s form at row 0."""
    return _x_row(x, 0, K)


# w = (w32,): the GGUF rows as uint32 words; x = (xq as uint32 words, xd)
PATH = RowPath("matvec_q8_q4_k_v4", __name__, UNROLL, _units, _base, _weights, _value,
               _x_row, lambda K: (K >> 8) * CHUNKS_PER_BLOCK, _x_one, _values2, _values4)
KERNELS = path_kernels(PATH, "matvec_q4k")      # KERNELS(rows, parts)
# the same kernels on activations in nibble order (quantize_act.nibble_order, decision 0027)
PATH_NIB = PATH._replace(name="matvec_q8_q4_k_v4n", value=_value_nib, values2=None,
                         values4=None)
KERNELS_NIB = path_kernels(PATH_NIB, "matvec_q4k")


# module attributes so that tests/test_compile_ptx.py compiles them (PTX_SIGNATURES); the other
# row counts are the same code with another constant
matvec_q8_q4_k_v4 = KERNELS(1, 2)
matvec_q8_q4_k_v4_p1 = KERNELS(1, 1)
matvec_q8_q4_k_v4_r4 = KERNELS(4, 2)
matvec_q8_q4_k_v4n_p1 = KERNELS_NIB(1, 1)
matvec_q8_q4_k_v4n_p1_r4 = KERNELS_NIB(4, 1)
# builds with the unroll fitted to short rows (matvec.fit_unroll): K = 2048 one warp a row (2
# slots a step), K = 512 four rows (1 slot)
matvec_q8_q4_k_v4_u2_p1 = KERNELS(1, 1, 2048)
matvec_q8_q4_k_v4_u1_r4 = KERNELS(4, 2, 512)
# verify's rows on two / four weight rows a warp (matvec.warp_rows: four from three activation
# rows on by default): 4 rows at K = 4096 (2 slots a step) and 12288 (the same build: K is a
# run-time value)
matvec_q8_q4_k_v4_w2_p1_r4 = rows_pair_kernel_of(PATH, 4)
matvec_q8_q4_k_v4_w4_p1_r4 = rows_pair_kernel_of(PATH, 4, 4)
# the MoE block's per-token / per-expert build of the same loop (matvec.token_kernel)
matvec_q8_q4_k_v4_tok = token_kernels(PATH)(2)
# and its expert-major build (matvec.group_kernel: the MoE prefill on the decode kernels)
matvec_q8_q4_k_v4_grp = group_kernels(PATH)(1)
# both on half a warp a row (K = 512, the 35B-A3B shape's expert down projections: one chunk
# a lane, matvec.lanes_per_row)
matvec_q8_q4_k_v4_u1_tok_l16 = token_kernels(fit_unroll(PATH, 512, 1), 16)(1)
matvec_q8_q4_k_v4_u1_grp_l16 = group_kernels(fit_unroll(PATH, 512, 1), 16)(1)


# ---------------------------------------------------------------- persistent warps, x in registers

# The one-row kernel above runs one warp a row in waves of resident warps: every warp loads its
# weights and its activations, waits, computes, and leaves, so a wave's loads and its
# arithmetic take turns. At one warp a row a lane's chunks sit at the same activations in
# every row (c = lane + 32 j), so `matvec_q8_q4_k_xreg<J>` keeps them: a grid of persistent
# warps (XREG_BLOCKS_PER_SM blocks an SM) takes rows warp, warp + nwarps, ...; each lane loads
# its J = K / 1024 chunks' activation words, their two scales and their sums (the min term's
# dp4a) once, and a row costs it only the weights' two 16-byte loads a chunk and half the
# dp4a. The sums are the row loop's, in its order (one warp a row: the chunk values, lane sums
# ascending, the warp tree), so a row gets the bits of `KERNELS(1, 1)` (tests check it).
# The double-buffered form on one wave (SMs x 4 blocks) is the default since session 20
# (decision 0026's follow-up): the 9B decoded at 380.0 / 371.1 tok/s against 356.2 / 349.9 on
# the row loop, same call, same tokens (ffn_gate_up 16.93 against 20.79 us a layer). The
# plain form on SMs x 8 had lost in the engine (351.2 / 342.9 against 356.8 / 351.0, session
# 19). run_bench --launch q4k-rowloop turns it off (MODULE_MODES).
XREG = True                 # True: one-row K <= 4096 launches on this kernel (the A/B switch)
XREG_MAX_J = 4              # K <= 4096: 8 J activation words + 4 J floats stay in registers
XREG_BLOCKS_PER_SM = 4      # one wave: 16 warps an SM at the double buffer's 128 registers
XREG_DB = True              # the next row's weight words loaded a row ahead


# Rows longer than 4096 (the 9B's ffn_down, K = 12288) stay on the row loop. A streaming
# persistent kernel for them (the weights double-buffered a 4-chunk step ahead, across rows;
# session 20, XSTREAM) gave the same bits but lost on the H200 (session 21): 12.80 against
# 11.01 us alone at 4096 x 12288, and 378.2 / 366.8 against 380.0 / 368.2 tok/s in the 9B
# engine (ffn_down 11.58 against 11.36 us a layer). It was removed; decision 0026.


def xreg_serves(M, K, parts, rows) -> bool:
    """Whether a launch runs the persistent kernel: one row of activations, one warp a row
    (its order is the row loop's only then) and K a multiple of 1024 up to 4096. (Verify's
    rows on persistent double-buffered warps were slower: decision 0026's follow-up.)"""
    return XREG and rows == 1 and parts == 1 \
        and K % 1024 == 0 and K // 1024 <= XREG_MAX_J


@cuda.jit(device=True, inline="always")
def _persistent_warp():
    """(lane, warp, nwarps) of a persistent kernel: this thread's lane, its warp's index in
    the grid (its first row) and the grid's warps (its row stride)."""
    return (cuda.threadIdx.x & 31, cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5),
            cuda.gridDim.x * WARPS_PER_BLOCK)


def _make_xreg(J, db):
    XW = 4 * J              # (local array sizes must be constants, not expressions)
    RW = 8 * J              # one row's weight words a lane (the double buffer's half)

    def matvec(w32, M, K, xq, xd, y, bias, residual, has_bias, has_residual):
        lane, warp, nwarps = _persistent_warp()
        if warp >= M:
            return
        p, h = _lane_pos()
        xa = cuda.local.array(XW, uint32)       # chunk j's activation words (sub-block 2p)
        xb = cuda.local.array(XW, uint32)       # (sub-block 2p + 1)
        sxa = cuda.local.array(J, float32)      # their sums, as the min term's float32
        sxb = cuda.local.array(J, float32)
        xda = cuda.local.array(J, float32)      # their block scales
        xdb = cuda.local.array(J, float32)
        for j in range(J):
            b = _u32(_u32(lane + 32 * j) >> np.uint32(3))
            xw = _u32(b * np.uint32(64) + _u32(16 * p + 4 * h))
            a0, a1, a2, a3 = ld_nc_v4_u32(xq, xw)
            b0, b1, b2, b3 = ld_nc_v4_u32(xq, xw + np.uint32(8))
            xa[4 * j] = a0
            xa[4 * j + 1] = a1
            xa[4 * j + 2] = a2
            xa[4 * j + 3] = a3
            xb[4 * j] = b0
            xb[4 * j + 1] = b1
            xb[4 * j + 2] = b2
            xb[4 * j + 3] = b3
            sxa[j] = _f32(_dot4(_ONES, _ONES, _ONES, _ONES, a0, a1, a2, a3))
            sxb[j] = _f32(_dot4(_ONES, _ONES, _ONES, _ONES, b0, b1, b2, b3))
            xda[j], xdb[j] = ld_nc_v2_f32(xd, _u32(b * np.uint32(8) + _u32(2 * p)))
        row_words = np.int64((K >> 8) * Q4_K_WORDS)
        cur = cuda.local.array(RW, uint32)          # db: this row's words, loaded a row ahead
        nxt = cuda.local.array(RW, uint32)          # db: the next row's, in flight
        if db:
            for j in range(J):
                _put8(nxt, 8 * j, _chunk_words(w32, warp * row_words, lane + 32 * j))
        for row in range(warp, M, nwarps):
            if db:
                for i in range(RW):
                    cur[i] = nxt[i]
                # the next row's loads before this row's arithmetic (past the end: the last
                # row again, in bounds and unused), so DRAM never waits for the dp4a
                ahead = min(row + nwarps, M - 1) * row_words
                for j in range(J):
                    _put8(nxt, 8 * j, _chunk_words(w32, ahead, lane + 32 * j))
            acc = np.float32(0.0)
            for j in range(J):
                if db:
                    wq = _chunk_decode(cur[8 * j], cur[8 * j + 1], cur[8 * j + 2],
                                       cur[8 * j + 3], cur[8 * j + 4], cur[8 * j + 5],
                                       cur[8 * j + 6], cur[8 * j + 7])
                else:
                    wq = _chunk_weights(w32, row * row_words, lane + 32 * j)
                dsa, dma, dsb, dmb, l0, l1, l2, l3, h0, h1, h2, h3 = wq
                sa = _dot4(l0, l1, l2, l3, xa[4 * j], xa[4 * j + 1], xa[4 * j + 2],
                           xa[4 * j + 3])
                sb16 = _dot4_us(h0, h1, h2, h3, xb[4 * j], xb[4 * j + 1], xb[4 * j + 2],
                                xb[4 * j + 3])
                va = xda[j] * (dsa * _f32(sa) - dma * sxa[j])
                vb = xdb[j] * (dsb * _f32(sb16) - dmb * sxb[j])
                acc += va + vb
            total = warp_sum(acc)
            if lane == 0:
                store_row(y, bias, residual, has_bias, has_residual, row, total)

    matvec.__name__ = matvec.__qualname__ = f"matvec_q8_q4_k_xreg{J}" + ("_db" if db else "")
    return kernel(matvec)


@cuda.jit(device=True, inline="always")
def _put8(a, i, w):
    """a[i .. i + 7] = the 8 words w (constant indices once unrolled: registers)."""
    a[i] = w[0]
    a[i + 1] = w[1]
    a[i + 2] = w[2]
    a[i + 3] = w[3]
    a[i + 4] = w[4]
    a[i + 5] = w[5]
    a[i + 6] = w[6]
    a[i + 7] = w[7]


_XREG: dict = {}


def xreg_kernel(J, db=None):
    """The persistent kernel for J = K / 1024 chunks a lane (db: with the next row's words
    loaded a row ahead; default XREG_DB), built on first request."""
    key = (J, XREG_DB if db is None else bool(db))
    if key not in _XREG:
        _XREG[key] = _make_xreg(*key)
    return _XREG[key]


def persistent_grid(M, per_sm) -> int:
    """Blocks of a persistent kernel: per_sm an SM (XREG_BLOCKS_PER_SM), never more than M
    rows need."""
    return min((M + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK, sm_count() * per_sm)


matvec_q8_q4_k_xreg4 = xreg_kernel(4, False)
matvec_q8_q4_k_xreg4_db = xreg_kernel(4, True)

_SIG = ("void(UniTuple(uint32[::1], 1), int32, int32, "
        "Tuple((uint32[::1], float32[::1])), float32[::1], float32[::1], float32[::1], int32, "
        "int32, int32)")
PTX_SIGNATURES = {"matvec_q8_q4_k_v4": [_SIG], "matvec_q8_q4_k_v4_p1": [_SIG],
                  "matvec_q8_q4_k_v4_r4": [_SIG], "matvec_q8_q4_k_v4_u2_p1": [_SIG],
                  "matvec_q8_q4_k_v4n_p1": [_SIG], "matvec_q8_q4_k_v4n_p1_r4": [_SIG],
                  "matvec_q8_q4_k_v4_u1_r4": [_SIG], "matvec_q8_q4_k_v4_w2_p1_r4": [_SIG],
                  "matvec_q8_q4_k_v4_w4_p1_r4": [_SIG],
                  "matvec_q8_q4_k_v4_tok": [
                      "void(UniTuple(uint32[::1], 1), int32[:, ::1], int32, int32, "
                      "int32, int32, Tuple((uint32[::1], float32[::1])), int32, float32[::1], "
                      "int32)"],
                  "matvec_q8_q4_k_v4_grp": [
                      "void(UniTuple(uint32[::1], 1), uint32[::1], int32[::1], int32, "
                      "int32, int32, Tuple((uint32[::1], float32[::1])), float32[::1], int32)"],
                  "matvec_q8_q4_k_xreg4": [
                      "void(uint32[::1], int32, int32, uint32[::1], float32[::1], float32[::1], "
                      "float32[::1], float32[::1], int32, int32)"]}
PTX_SIGNATURES["matvec_q8_q4_k_xreg4_db"] = PTX_SIGNATURES["matvec_q8_q4_k_xreg4"]
PTX_SIGNATURES["matvec_q8_q4_k_v4_u1_tok_l16"] = PTX_SIGNATURES["matvec_q8_q4_k_v4_tok"]
PTX_SIGNATURES["matvec_q8_q4_k_v4_u1_grp_l16"] = PTX_SIGNATURES["matvec_q8_q4_k_v4_grp"]
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "dp4a.s32.s32", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}


def launch(w8, M, K, xq_dev, xd_dev, y_dev, bias, residual, parts, grid, threads, stream,
           rows=1, nibble=False, beside=False):
    """Called by matvec.launch_matvec_q8 for Q4_K (its checks already done, y and residual
    flat); nibble: the activations are in nibble order (quantize_act.nibble_order); beside:
    the launch runs beside others (`matvec.warp_rows`)."""
    w32 = w8.view(np.uint32)
    xq = xq_dev.reshape(xq_dev.size)[:rows * K].view(np.uint32)
    xd = xd_dev if xd_dev.ndim == 1 else xd_dev.reshape(xd_dev.size)
    if not nibble and xreg_serves(M, K, parts, rows):
        xreg_kernel(K // 1024)[persistent_grid(M, XREG_BLOCKS_PER_SM), threads, stream](
            w32, np.int32(M), np.int32(K), xq, xd, y_dev,
            y_dev if bias is None else bias, y_dev if residual is None else residual,
            np.int32(bias is not None), np.int32(residual is not None))
        return
    path, kernels = (PATH_NIB, KERNELS_NIB) if nibble else (PATH, KERNELS)
    R = warp_rows(path, rows, parts, M, beside)   # (nibble order: no pair path, R = 1)
    kern = kernels(rows, parts, K, R=R)
    if R > 1:
        grid = grid_rows(M, parts, R)
    kern[grid, threads, stream](
        (w32,), np.int32(M), np.int32(K), (xq, xd), y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))
