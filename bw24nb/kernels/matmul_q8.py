"""Prefill int8 tensor-core matmul: Y[T, M] = dequant(Xq, Xd)[T, K] @ dequant(W)[M, K]^T
(+ bias[M]) (+ R[T, M]), W in GGUF blocks, for the weight types with an integer path:
Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K (the others keep using matmul.py).

The activations come from quantize_act.py: int8 Xq[T, K] with one float32 scale Xd[t, b] per
32 values ("sub-block" b). Every weight row is cut into the same 32-wide sub-blocks, each
decoded to 32 int8 (the quant with its offset applied: Q4_0 q-8, Q5_0 q-16, Q6_K q-32; Q4_K /
Q5_K keep q >= 0 and carry their min separately) plus its float32 scale(s). The integer dot of
a sub-block, isum = sum_k qw_k * qx_k over its 32 k, is one ``mma.sync.m16n8k32.s8`` term,
exact in int32 (|isum| <= 32 * 128 * 127 < 2^19); the scales are applied to it in float32.

Tiles. A 128-thread block (4 warps) owns a 64 x 64 tile of Y; warp w owns the 32 x 32
quarter (weight rows 32 (w & 1) .., activation rows 32 (w >> 1) ..): 2 x 4 mma tiles of 16
(weight rows, the mma's A) x 8 (activation rows, the mma's B). K advances in steps of 8
sub-blocks (256 values, one K-quant super-block): the block decodes the step's
weight sub-blocks to int8 words + scales in shared memory (each weight byte read once per
T-tile; Q4_K / Q5_K blocks are 16-byte aligned and read with 16-byte ``ld.global.nc``, the
2-byte aligned types with 2-byte loads), copies the activations' int8 words (16-byte loads:
a row of K int8 is 16-byte aligned because K % 32 == 0) and scales, then every warp runs its
mma tiles sub-block by sub-block and scales each int32 result into its float32 accumulators.
The shared rows are 68 words (`Tile.pitch`): a fragment load (lanes g = 0..7 on 8 rows,
t = 0..3 on 4 words) hits bank (4 g + t) mod 32, all different. That tile is `DEFAULT_TILE`; `Tile` /
`TILES` describe others (more warps of the same 32 x 32, 4 sub-blocks a step; sm_90 ptxas,
session 9: 92-125 registers for every candidate and type, no spills, 23-47 KB of shared
memory). `KERNEL_CHOICE` / `kernel_for` pick each launch's tile and int-to-float conversion
from the weight type and the grid it would make, after the H200 measurements
(bench/matmul_q8_bench.py --tiles ... --cvt-tiles); every choice gives the same bits.

Summation order (exactness contract): for every output y[t, m], with b running over the 32-wide
sub-blocks of K in ascending order, xd = Xd[t, b], x_sum = sum_k Xq[t, 32 b + k] (int), and
the weight sub-block's int8 dot isum (exact int32), the float32 accumulator is

    acc = +0.0;  for b = 0, 1, ...:  acc += term_b
      Q8_0, Q4_0, Q5_0:  term_b = (d * xd) * f32(isum)                  d the block's f16 scale
      Q4_K, Q5_K:        term_b = xd * ((d*sc_b) * f32(isum) - (dmin*m_b) * f32(x_sum))
      Q6_K:              two terms per b, low 16 k then high 16 k, each (d*sc) * xd * f32(isum_half):
                         acc += (d*sc_lo * xd) * f32(isum_lo);  acc += (d*sc_hi * xd) * f32(isum_hi)
    y = (acc + bias[m]) + R[t, m]

(d*sc and dmin*m are exact float32 products, as in dequant.py; these are the terms of
dequant.py's <type>_group_dot_q8, per 32 values instead of per 4.) The GPU may contract a
multiply and the following add into one FMA; the simulator rounds both. Every output is
computed in this order whatever its position in the tile, so Y does not depend on the tiling.

numpy reference: `matmul_q8_reference` (float64 of the dequantized operands).
"""
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..device import sm_count
from ..jit import kernel
from ..ptx import (
    cp_async_16,
    cp_async_commit,
    cp_async_wait_1,
    dp4a,
    f16x2_to_f32x2,
    f32_from_bits,
    ld_nc_v4_u32,
    mma_s8_m16n8k32,
)
from ..quant.types import QType, block_size, row_bytes
from .dequant import (
    Q4_0_BYTES,
    Q4_0_OFF_D,
    Q4_0_OFF_QS,
    Q4_K_BYTES,
    Q4_K_OFF_QS,
    Q5_0_BYTES,
    Q5_0_OFF_D,
    Q5_0_OFF_QH,
    Q5_0_OFF_QS,
    Q5_K_BYTES,
    Q5_K_OFF_QH,
    Q5_K_OFF_QS,
    Q6_K_BYTES,
    Q6_K_OFF_QH,
    Q6_K_OFF_QL,
    Q8_0_BYTES,
    Q8_0_OFF_D,
    Q8_0_OFF_QS,
    layout,
    q6_k_scale,
    read_f16,
    read_u32,
    weight_views,
)
from .matvec_q4k import pair_scales

SUB = 32                          # values per sub-block: one mma k-step, one activation scale
# copy_ahead tiles: a weight row's raw bytes of one 4-sub-block step in shared memory: the Q4_K
# block's 16-byte header (d, dmin, the packed scales) and its two 32-byte quant runs, 20 words
# (20 g + t4 mod 32 are 32 different banks for a fragment load's 8 rows x 4 words)
RAW_ROW_WORDS = 20


class Tile(NamedTuple):
    """A block's share of Y and of K: warps_m x warps_t warps of 32 x 32 outputs (weight rows x
    activation rows) each, step_subs sub-blocks of K staged in shared memory a step (4 or 8: a
    unit of every type fits). copy_ahead: the next step's raw bytes copied into a second
    buffer with cp.async while this step's mma run (`_make_matmul_q8`; Q4_K, 4 sub-blocks a
    step). Every output is summed in the same order whatever the tile (module docstring), so
    every tile gives the same bits."""
    warps_m: int = 2
    warps_t: int = 2
    step_subs: int = 8
    copy_ahead: bool = False

    @property
    def m(self) -> int:
        return 32 * self.warps_m

    @property
    def t(self) -> int:
        return 32 * self.warps_t

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_t

    @property
    def pitch(self) -> int:
        """Words per shared int8 row: a step's 8 step_subs words + 4, so that a fragment load
        (8 rows x 4 words) hits 32 different banks."""
        return 8 * self.step_subs + 4

    @property
    def spitch(self) -> int:
        """Floats per shared scale row: 8 lanes' rows on 8 banks."""
        return self.step_subs + 1

    @property
    def name(self) -> str:
        return f"m{self.m}t{self.t}s{self.step_subs}" + ("a" if self.copy_ahead else "")

    def shared_bytes(self) -> int:
        if self.copy_ahead:     # two raw buffers (weights, activations, their scales), then
            # the decoded (scale, min) of the weights and the activation sums
            return 4 * (2 * self.m * RAW_ROW_WORDS + 2 * self.t * self.pitch + 2 * self.t * 4
                        + 2 * self.m * self.spitch + self.t * self.spitch)
        return 4 * (self.m + self.t) * (self.pitch + 2 * self.spitch)


# 64 x 64 outputs per 128-thread block, 32 x 32 per warp (2 x 4 mma tiles, 32 float32
# accumulators a lane), 8 sub-blocks (one K-quant super-block) a step: each staged weight
# sub-block is used by 64 activation rows and each staged activation sub-block by 64 weight
# rows, and the ~44 KB of shared memory per block still lets 5 blocks (20 warps) share an SM.
# bench/matmul_q8_bench.py measures it against the other tiles of `TILES`.
DEFAULT_TILE = Tile()
# Candidates for bench/matmul_q8_bench.py --tiles (static shared memory stays under numba's
# 48 KB: the larger tiles stage 4 sub-blocks a step); KERNEL_CHOICE below takes the measured
# winners.
# (Session 43 timed one-warp-wide tiles, m32t64s8 / m32t32s8, for the grids the 64 x 64 tile
# under-fills: they lost on the H100 and were removed, decision 0049.)
TILES = {t.name: t for t in (DEFAULT_TILE, Tile(2, 2, 4), Tile(4, 2, 4), Tile(2, 4, 4),
                             Tile(4, 4, 4), Tile(4, 2, 4, True), Tile(2, 2, 4, True))}

_LOW_NIBBLES = np.uint32(0x0F0F0F0F)
_BYTE_SIGN = np.uint32(0x80808080)
_BYTE_ONES = np.uint32(0x01010101)
_TWO_BITS = np.uint32(0x03030303)
_ONES = np.int32(0x01010101)      # dp4a(_ONES, x) = sum of x's 4 signed bytes
_U4 = np.uint32(4)
_ZERO_U = np.uint32(0)

# int32 -> float32 without cvt (16 per clock per SM on sm_80/sm_90, a quarter of the FP32 rate,
# and 32 of them per lane per sub-block): every mma starts from C = MAGIC_I32, the bits of
# 1.5 * 2^23, so it returns the bits of the float32 1.5 * 2^23 + isum (exact: |isum| < 2^22 and
# that binade's ulp is 1), and one subtraction of MAGIC_F32 leaves f32(isum) exactly -- the same
# value as a cvt. bench/matmul_q8_bench.py times it against the plain cvt (magic_cvt=False);
# on the H200 cvt measured faster at the larger tiles and the 9B shapes, slower on the 64 x 64
# tile at the 0.5B's (session 10: KERNEL_CHOICE below).
MAGIC_CVT = True
MAGIC_I32 = np.int32(0x4B400000)
MAGIC_F32 = np.float32(12582912.0)

# how a weight type's sub-blocks are scaled (see the module docstring)
_SCALE = 0       # one scale per sub-block
_SCALE_MIN = 1   # scale and min per sub-block (Q4_K, Q5_K): needs the activation sums
_SCALE_16 = 2    # one scale per 16 values (Q6_K): two half-width mma per sub-block


def _device(fn):
    return cuda.jit(device=True, inline="always")(fn)


# ---------------------------------------------------------------- int8 words from GGUF blocks
# A "unit" is the smallest piece of a weight row that reads each of its bytes once: one block
# of Q8_0 / Q4_0 / Q5_0 (1 sub-block), a 32-byte run of Q4_K / Q5_K quants (2 sub-blocks: low
# and high nibbles), half a Q6_K super-block (4 sub-blocks sharing ql and qh bytes).
# unit(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j) decodes unit u of the row at byte
# row_off into sub-block slots j, j + 1, ... of shared row r: ws[r, 8 j' + i] = int8 values
# 4i .. 4i + 3 of sub-block j' packed lowest first; wsa[r, j'] its scale (Q6_K: of values
# 0..15), wsb[r, j'] its min (Q4_K / Q5_K) or the scale of values 16..31 (Q6_K).
# Field offsets come from dequant.py, the one place that defines the block layouts.


@_device
def _offset_bytes(v, bias):
    """Four unsigned bytes q (each q + 128 - bias < 256) -> the int8 bytes q - bias: adding
    128 - bias cannot carry into the next byte, and flipping bit 7 subtracts 128 mod 256."""
    return (v + np.uint32((128 - bias) * 0x01010101)) ^ _BYTE_SIGN


@_device
def _spread4(h4):
    """4 bits -> bit 4 of each of 4 bytes (the fifth bit of 4 packed 5-bit values), uint32."""
    h = np.uint32(h4)
    return ((h & np.uint32(1)) << _U4) | ((h & np.uint32(2)) << np.uint32(11)) | \
        ((h & np.uint32(4)) << np.uint32(18)) | ((h & np.uint32(8)) << np.uint32(25))


@_device
def _unit_q8_0(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    off = row_off + u * Q8_0_BYTES
    wsa[r, j] = read_f16(wh, off + Q8_0_OFF_D)
    c = 8 * j
    for i in range(8):
        ws[r, c + i] = read_u32(w16, off + Q8_0_OFF_QS + 4 * i)


@_device
def _unit_q4_0(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    # qs byte i: low nibble = value i, high nibble = value 16 + i
    off = row_off + u * Q4_0_BYTES
    wsa[r, j] = read_f16(wh, off + Q4_0_OFF_D)
    c = 8 * j
    for i in range(4):
        qs = read_u32(w16, off + Q4_0_OFF_QS + 4 * i)
        ws[r, c + i] = _offset_bytes(qs & _LOW_NIBBLES, 8)
        ws[r, c + 4 + i] = _offset_bytes((qs >> _U4) & _LOW_NIBBLES, 8)


@_device
def _unit_q5_0(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    # as Q4_0, plus bit v of qh = bit 4 of value v
    off = row_off + u * Q5_0_BYTES
    wsa[r, j] = read_f16(wh, off + Q5_0_OFF_D)
    qh = read_u32(w16, off + Q5_0_OFF_QH)
    c = 8 * j
    for i in range(4):
        qs = read_u32(w16, off + Q5_0_OFF_QS + 4 * i)
        lo = (qs & _LOW_NIBBLES) | _spread4((qh >> np.uint32(4 * i)) & np.uint32(15))
        hi = ((qs >> _U4) & _LOW_NIBBLES) | _spread4((qh >> np.uint32(16 + 4 * i)) & np.uint32(15))
        ws[r, c + i] = _offset_bytes(lo, 16)
        ws[r, c + 4 + i] = _offset_bytes(hi, 16)


@_device
def _k_scales(w32, blk, p, wsa, wsb, r, j):
    """(d*sc, dmin*m) of sub-blocks 2p and 2p + 1 into slots j, j + 1, from the block's
    16-byte header (d, dmin, the 12 packed scale bytes; Q4_K and Q5_K blocks are 16-byte
    aligned and share it) in one load, decoded four scales at a time (matvec_q4k.pair_scales).
    The byte-by-byte decode before (dequant._k_sub_scales: ~10 dependent byte and f16 loads a
    unit) gave the same exact products: float32(d) * float32(sc) either way."""
    hdr, s0, s1, s2 = ld_nc_v4_u32(w32, blk >> 2)
    _k_scale_products(hdr, s0, s1, s2, p, wsa, wsb, r, j)


@_device
def _k_scale_products(hdr, s0, s1, s2, p, wsa, wsb, r, j):
    """`_k_scales` from the header's four words (however they were read: the copy_ahead
    kernels read them from shared memory), so every kernel makes the same products."""
    d, dmin = f16x2_to_f32x2(hdr)
    sc_a, m_a, sc_b, m_b = pair_scales(s0, s1, s2, p)
    wsa[r, j] = d * np.float32(np.int32(sc_a))
    wsb[r, j] = dmin * np.float32(np.int32(m_a))
    wsa[r, j + 1] = d * np.float32(np.int32(sc_b))
    wsb[r, j + 1] = dmin * np.float32(np.int32(m_b))


@_device
def _act_sum(v0, v1, v2, v3, v4, v5, v6, v7):
    """The sum of a sub-block's 32 int8 activations (8 words) as float32, by dp4a in this
    order (the x_sum of Q4_K / Q5_K terms: module docstring)."""
    sx = dp4a(_ONES, v0, dp4a(_ONES, v1, dp4a(_ONES, v2, dp4a(_ONES, v3, 0))))
    sx = dp4a(_ONES, v4, dp4a(_ONES, v5, dp4a(_ONES, v6, dp4a(_ONES, v7, sx))))
    return np.float32(sx)


@_device
def _unit_q4_k(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    # unit u = super-block u // 4, quant run p = u % 4: qs bytes 32p .. 32p + 31 hold values
    # 64p + l (low nibble, sub-block 2p) and 64p + 32 + l (high nibble, sub-block 2p + 1)
    blk = row_off + (u >> 2) * Q4_K_BYTES
    p = u & 3
    _k_scales(w32, blk, p, wsa, wsb, r, j)
    q = (blk + Q4_K_OFF_QS + 32 * p) >> 2       # Q4_K blocks are 16-byte aligned (144 B)
    c = 8 * j
    for h in range(2):
        v0, v1, v2, v3 = ld_nc_v4_u32(w32, q + 4 * h)
        ws[r, c + 4 * h] = v0 & _LOW_NIBBLES
        ws[r, c + 4 * h + 1] = v1 & _LOW_NIBBLES
        ws[r, c + 4 * h + 2] = v2 & _LOW_NIBBLES
        ws[r, c + 4 * h + 3] = v3 & _LOW_NIBBLES
        ws[r, c + 8 + 4 * h] = (v0 >> _U4) & _LOW_NIBBLES
        ws[r, c + 8 + 4 * h + 1] = (v1 >> _U4) & _LOW_NIBBLES
        ws[r, c + 8 + 4 * h + 2] = (v2 >> _U4) & _LOW_NIBBLES
        ws[r, c + 8 + 4 * h + 3] = (v3 >> _U4) & _LOW_NIBBLES


@_device
def _k5_high(h, s):
    """Bit s of each byte of h moved to bit 4 (the fifth bit of Q5_K sub-block s)."""
    return ((h >> np.uint32(s)) & _BYTE_ONES) << _U4


@_device
def _k5_words(ws, r, c, h, v0, v1, v2, v3, g0, g1, g2, g3, s):
    """4 words of sub-block 2p (c) and 2p + 1 (c + 8) from 4 qs words and their qh words."""
    ws[r, c + h] = (v0 & _LOW_NIBBLES) | _k5_high(g0, s)
    ws[r, c + h + 1] = (v1 & _LOW_NIBBLES) | _k5_high(g1, s)
    ws[r, c + h + 2] = (v2 & _LOW_NIBBLES) | _k5_high(g2, s)
    ws[r, c + h + 3] = (v3 & _LOW_NIBBLES) | _k5_high(g3, s)
    ws[r, c + 8 + h] = ((v0 >> _U4) & _LOW_NIBBLES) | _k5_high(g0, s + 1)
    ws[r, c + 8 + h + 1] = ((v1 >> _U4) & _LOW_NIBBLES) | _k5_high(g1, s + 1)
    ws[r, c + 8 + h + 2] = ((v2 >> _U4) & _LOW_NIBBLES) | _k5_high(g2, s + 1)
    ws[r, c + 8 + h + 3] = ((v3 >> _U4) & _LOW_NIBBLES) | _k5_high(g3, s + 1)


@_device
def _unit_q5_k(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    # as Q4_K, plus qh byte l: bit s = bit 4 of value l of sub-block s (176-byte blocks,
    # 16-byte aligned; qh at 16, qs at 48)
    blk = row_off + (u >> 2) * Q5_K_BYTES
    p = u & 3
    _k_scales(w32, blk, p, wsa, wsb, r, j)
    q = (blk + Q5_K_OFF_QS + 32 * p) >> 2
    qh = (blk + Q5_K_OFF_QH) >> 2
    c = 8 * j
    for h in range(2):
        v0, v1, v2, v3 = ld_nc_v4_u32(w32, q + 4 * h)
        g0, g1, g2, g3 = ld_nc_v4_u32(w32, qh + 4 * h)
        _k5_words(ws, r, c, 4 * h, v0, v1, v2, v3, g0, g1, g2, g3, 2 * p)


@_device
def _q6_word(nib, h, s):
    """Low 4 bits `nib` | 2 high bits (bits s, s + 1 of each byte of h) << 4, minus 32."""
    return _offset_bytes(nib | (((h >> np.uint32(s)) & _TWO_BITS) << _U4), 32)


@_device
def _unit_q6_k(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j):
    # unit u = half n = u % 2 of super-block u // 2: value 128n + 32c + l (c = 0..3) has its
    # low 4 bits in ql byte 64n + 32 (c & 1) + l (low nibble for c < 2, else high), its high 2
    # bits in qh byte 32n + l (bits 2c, 2c + 1), its scale at 8n + 2c + (l >= 16)
    blk = row_off + (u >> 1) * Q6_K_BYTES
    n = u & 1
    for cc in range(4):
        wsa[r, j + cc] = q6_k_scale(w8, wh, blk, 8 * n + 2 * cc)
        wsb[r, j + cc] = q6_k_scale(w8, wh, blk, 8 * n + 2 * cc + 1)
    ql = blk + Q6_K_OFF_QL + 64 * n
    qh = blk + Q6_K_OFF_QH + 32 * n
    c = 8 * j
    for i in range(8):
        la = read_u32(w16, ql + 4 * i)           # c = 0 (low nibbles), c = 2 (high)
        lb = read_u32(w16, ql + 32 + 4 * i)      # c = 1, c = 3
        h = read_u32(w16, qh + 4 * i)
        ws[r, c + i] = _q6_word(la & _LOW_NIBBLES, h, 0)
        ws[r, c + 8 + i] = _q6_word(lb & _LOW_NIBBLES, h, 2)
        ws[r, c + 16 + i] = _q6_word((la >> _U4) & _LOW_NIBBLES, h, 4)
        ws[r, c + 24 + i] = _q6_word((lb >> _U4) & _LOW_NIBBLES, h, 6)


@_device
def _unit_q6_k_lane(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j, i):
    """Part i (0..7) of `_unit_q6_k`: word i of each of the unit's four sub-blocks (step i of
    its loop) and scale i of its eight (scale 8n + i: sub-block j + i // 2's, wsa for even i,
    wsb for odd). Eight threads share a unit, so that a warp's loads read a unit's ql / qh
    bytes as 32 contiguous bytes each instead of one row per thread (every 2-byte load of a
    warp touched ~16 rows' cache lines). The same values, word for word."""
    blk = row_off + (u >> 1) * Q6_K_BYTES
    n = u & 1
    sc = q6_k_scale(w8, wh, blk, 8 * n + i)
    if i & 1:
        wsb[r, j + (i >> 1)] = sc
    else:
        wsa[r, j + (i >> 1)] = sc
    ql = blk + Q6_K_OFF_QL + 64 * n
    qh = blk + Q6_K_OFF_QH + 32 * n
    c = 8 * j
    la = read_u32(w16, ql + 4 * i)
    lb = read_u32(w16, ql + 32 + 4 * i)
    h = read_u32(w16, qh + 4 * i)
    ws[r, c + i] = _q6_word(la & _LOW_NIBBLES, h, 0)
    ws[r, c + 8 + i] = _q6_word(lb & _LOW_NIBBLES, h, 2)
    ws[r, c + 16 + i] = _q6_word((la >> _U4) & _LOW_NIBBLES, h, 4)
    ws[r, c + 24 + i] = _q6_word((lb >> _U4) & _LOW_NIBBLES, h, 6)


# weight type -> (unit decoder, sub-blocks per unit, how its sub-blocks are scaled)
_UNITS = {
    QType.Q8_0: (_unit_q8_0, 1, _SCALE),
    QType.Q4_0: (_unit_q4_0, 1, _SCALE),
    QType.Q5_0: (_unit_q5_0, 1, _SCALE),
    QType.Q4_K: (_unit_q4_k, 2, _SCALE_MIN),
    QType.Q5_K: (_unit_q5_k, 2, _SCALE_MIN),
    QType.Q6_K: (_unit_q6_k, 4, _SCALE_16),
}
@_device
def _no_lane_unit(w8, w16, w32, wh, row_off, u, ws, wsa, wsb, r, j, i):
    """Stands in for `_LANE_UNITS`' decoder in the kernels of types that have none (a branch
    their build never takes)."""


# types whose units are decoded by 8 threads each (`_unit_q6_k_lane`); False: one thread a
# unit (`_unit_q6_k`), the form before session 20 (the same bits). Read when a kernel is built
# (this module builds MATMUL_Q8 on import): `_make_matmul_q8(..., lanes=False)` builds the
# other form beside it (tests/test_kernels_matmul_q8.py compares the two).
Q6_K_LANES = True
_LANE_UNITS = {QType.Q6_K: _unit_q6_k_lane}


# ---------------------------------------------------------------- the kernel


@_device
def _store(y, bias, residual, has_bias, has_residual, T, M, t, m, v):
    if t < T and m < M:
        if has_bias:
            v += bias[m]
        if has_residual:
            v += residual[t, m]
        y[t, m] = v


def _make_matmul_q8(qt, magic_cvt=MAGIC_CVT, tile: Tile = DEFAULT_TILE, grouped=False,
                    lanes=None, max_regs=None):
    """The GEMM kernel for weight type qt on `tile`; lanes: decode each weight unit on 8
    threads (`_LANE_UNITS`; default Q6_K_LANES for the types that have the form); max_regs:
    ptxas's register cap (None: its own choice), which sets how many blocks share an SM
    (bench/matmul_q8_bench.py --tiles NAME_rNN; session 21: caps of 80 and 96 lost)."""
    lay = layout(qt)
    unit, subs_per_unit, scaling = _UNITS[lay.qtype]
    has_lanes = lay.qtype in _LANE_UNITS
    lane_unit = _LANE_UNITS.get(lay.qtype, _no_lane_unit)
    lanes = (Q6_K_LANES if lanes is None else bool(lanes)) and has_lanes
    P_SHIFT = 3 if lanes else 0
    P = 1 << P_SHIFT            # threads a weight unit is decoded by
    SCALES_PER_PART = 2 * subs_per_unit // P      # (P divides both: 8 only for Q6_K's units)
    WORDS_PER_PART = 8 * subs_per_unit // P
    if tile.copy_ahead and (lay.qtype != QType.Q4_K or tile.step_subs != 4):
        raise ValueError(f"matmul_q8: tile {tile.name} (copy_ahead) serves Q4_K with 4 "
                         f"sub-blocks a step only, not {lay.name}")
    if tile.step_subs not in (4, 8) or tile.shared_bytes() > 48 * 1024:
        raise ValueError(f"matmul_q8: tile {tile.name} needs step_subs 4 or 8 and at most "
                         f"48 KB of shared memory ({tile.shared_bytes()} B)")
    TM, TT, NTHREADS, WARPS_M = tile.m, tile.t, tile.threads, tile.warps_m
    SSUBS, PITCH_W, SPITCH_W = tile.step_subs, tile.pitch, tile.spitch
    units_per_step = SSUBS // subs_per_unit
    qk, ts = lay.block, lay.type_size
    mins = scaling == _SCALE_MIN
    split16 = scaling == _SCALE_16

    c_init = MAGIC_I32 if magic_cvt else np.int32(0)

    @cuda.jit(device=True, inline="always")
    def _mma(a0, a1, a2, a3, b0, b1):
        return mma_s8_m16n8k32(a0, a1, a2, a3, b0, b1, c_init, c_init, c_init, c_init)

    @cuda.jit(device=True, inline="always")
    def to_f32(d):
        """f32(isum) of an mma result that started from c_init (exact either way)."""
        if magic_cvt:
            return f32_from_bits(d) - MAGIC_F32
        return np.float32(d)

    @cuda.jit(device=True, inline="always")
    def scaled(acc, i, sa, sb, xd, xsum, d, e):
        """acc[i] += this sub-block's term (module docstring); d, e: the full / low-half and
        (Q6_K) high-half dots as the mma returned them."""
        if mins:
            acc[i] += xd * (sa * to_f32(d) - sb * xsum)
        elif split16:
            acc[i] += (sa * xd) * to_f32(d)
            acc[i] += (sb * xd) * to_f32(e)
        else:
            acc[i] += (sa * xd) * to_f32(d)

    @cuda.jit(device=True, inline="always")
    def tile_terms(acc, i, a0, a1, a2, a3, b0, b1, s0a, s0b, s1a, s1b, xd0, xd1, xs0, xs1):
        """One 16 x 8 mma tile of one sub-block into acc[i .. i + 3]: rows (weights) g, g + 8
        with scales s0*, s1*; columns (activations) 2t, 2t + 1 with xd0, xd1 (sums xs0, xs1)."""
        if split16:
            lo = _mma(a0, a1, a2, a3, b0, _ZERO_U)      # k 0..15: the B words 4..7 zeroed
            hi = _mma(a0, a1, a2, a3, _ZERO_U, b1)      # k 16..31
        else:
            lo = _mma(a0, a1, a2, a3, b0, b1)
            hi = lo
        scaled(acc, i, s0a, s0b, xd0, xs0, lo[0], hi[0])
        scaled(acc, i + 1, s0a, s0b, xd1, xs1, lo[1], hi[1])
        scaled(acc, i + 2, s1a, s1b, xd0, xs0, lo[2], hi[2])
        scaled(acc, i + 3, s1a, s1b, xd1, xs1, lo[3], hi[3])

    @cuda.jit(device=True, inline="always")
    def row_scales(wsa, wsb, rm, j):
        """Sub-block j's scales (wsa) and mins / high-half scales (wsb) of the lane's weight
        rows rm, rm + 8, rm + 16, rm + 24."""
        return (wsa[rm, j], wsa[rm + 8, j], wsa[rm + 16, j], wsa[rm + 24, j],
                wsb[rm, j], wsb[rm + 8, j], wsb[rm + 16, j], wsb[rm + 24, j])

    @cuda.jit(device=True, inline="always")
    def sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, j):
        """Staged sub-block j into the warp's 2 x 4 mma tiles (this lane's 32 accumulators)."""
        c = 8 * j + t4
        # A fragments of the two 16-row tiles: rows rm, rm + 8 and rm + 16, rm + 24
        a00 = ws[rm, c]
        a01 = ws[rm + 8, c]
        a02 = ws[rm, c + 4]
        a03 = ws[rm + 8, c + 4]
        a10 = ws[rm + 16, c]
        a11 = ws[rm + 24, c]
        a12 = ws[rm + 16, c + 4]
        a13 = ws[rm + 24, c + 4]
        s0a, s1a, s2a, s3a, s0b, s1b, s2b, s3b = row_scales(wsa, wsb, rm, j)
        for ni in range(4):
            rx = rt + 8 * ni
            b0 = xs[rx + g, c]
            b1 = xs[rx + g, c + 4]
            xd0 = xds[rx + 2 * t4, j]
            xd1 = xds[rx + 2 * t4 + 1, j]
            xs0 = xss[rx + 2 * t4, j]
            xs1 = xss[rx + 2 * t4 + 1, j]
            tile_terms(acc, 8 * ni, a00, a01, a02, a03, b0, b1,
                       s0a, s0b, s1a, s1b, xd0, xd1, xs0, xs1)
            tile_terms(acc, 8 * ni + 4, a10, a11, a12, a13, b0, b1,
                       s2a, s2b, s3a, s3b, xd0, xd1, xs0, xs1)

    @cuda.jit(device=True, inline="always")
    def stage(w8, w16, w32, wh, M, xq32, xd, ws, xs, wsa, wsb, xds, xss, tid, m0, t0, s0, nsb,
              wrow0, g0, T, rb, xrow, nsub):
        """Step s0's weight sub-blocks (decoded) and activation sub-blocks into shared memory."""
        # --- weights: a unit an item, or (lanes) part i of a unit an item; rows past M
        # zero: part i of P clears the unit's words and scale slots k = i, i + P, ...
        # (scale slot 2s is wsa[s], 2s + 1 wsb[s])
        for item in range(tid, TM * units_per_step * P, NTHREADS):
            ru = item >> P_SHIFT
            i = item & (P - 1)
            r = ru // units_per_step
            uj = (ru - r * units_per_step) * subs_per_unit
            if uj < nsb:
                m = m0 + r
                if m < M:
                    if lanes:
                        lane_unit(w8, w16, w32, wh, (wrow0 + m) * rb,
                                  (s0 + uj) // subs_per_unit, ws, wsa, wsb, r, uj, i)
                    else:
                        unit(w8, w16, w32, wh, (wrow0 + m) * rb,
                             (s0 + uj) // subs_per_unit, ws, wsa, wsb, r, uj)
                else:
                    for k in range(SCALES_PER_PART):
                        sk = i + P * k
                        if sk & 1:
                            wsb[r, uj + (sk >> 1)] = np.float32(0.0)
                        else:
                            wsa[r, uj + (sk >> 1)] = np.float32(0.0)
                    for k in range(WORDS_PER_PART):
                        ws[r, 8 * uj + i + P * k] = _ZERO_U
        # --- activations: one sub-block (two 16-byte loads) per item, rows past T zero
        for item in range(tid, TT * SSUBS, NTHREADS):
            r = item // SSUBS
            j = item - r * SSUBS
            if j < nsb:
                t = t0 + r
                c = 8 * j
                if t < T:
                    base = (g0 + t) * xrow + 8 * (s0 + j)
                    v0, v1, v2, v3 = ld_nc_v4_u32(xq32, base)
                    v4, v5, v6, v7 = ld_nc_v4_u32(xq32, base + 4)
                    xs[r, c] = v0
                    xs[r, c + 1] = v1
                    xs[r, c + 2] = v2
                    xs[r, c + 3] = v3
                    xs[r, c + 4] = v4
                    xs[r, c + 5] = v5
                    xs[r, c + 6] = v6
                    xs[r, c + 7] = v7
                    xds[r, j] = xd[(g0 + t) * nsub + s0 + j]
                    if mins:
                        xss[r, j] = _act_sum(v0, v1, v2, v3, v4, v5, v6, v7)
                else:
                    for i in range(8):
                        xs[r, c + i] = _ZERO_U
                    xds[r, j] = np.float32(0.0)
                    if mins:
                        xss[r, j] = np.float32(0.0)

    @cuda.jit(device=True, inline="always")
    def epilogue(acc, y, bias, residual, has_bias, has_residual, g0, T, M, m0, t0, rm, rt, t4):
        """acc[8 ni + 4 mi + e] is row rm + 16 mi + 8 (e >> 1), column rt + 8 ni + 2 t4 +
        (e & 1)."""
        yg = y[g0:]
        rg = residual[g0:]
        for ni in range(4):
            t = t0 + rt + 8 * ni + 2 * t4
            for mi in range(2):
                m = m0 + rm + 16 * mi
                i = 8 * ni + 4 * mi
                _store(yg, bias, rg, has_bias, has_residual, T, M, t, m, acc[i])
                _store(yg, bias, rg, has_bias, has_residual, T, M, t + 1, m, acc[i + 1])
                _store(yg, bias, rg, has_bias, has_residual, T, M, t, m + 8, acc[i + 2])
                _store(yg, bias, rg, has_bias, has_residual, T, M, t + 1, m + 8, acc[i + 3])

    @cuda.jit(device=True, inline="always")
    def place(M, y, group_off):
        """Where this thread works: (tid, g, t4, rm, rt, m0, g0, T, wrow0, t0, busy): its
        thread, mma group and lane in it, its first weight row in the tile, its warp's first
        activation row; the block's first weight row, first activation row, rows, first
        weight row of the matrix, first output row; whether the block has work."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        t4 = lane & 3
        rm = 32 * (warp % WARPS_M) + g              # this lane's first weight row in the tile
        rt = 32 * (warp // WARPS_M)                 # the warp's first activation row
        m0 = cuda.blockIdx.x * TM
        t0 = cuda.blockIdx.y * TT
        if grouped:
            # expert e = blockIdx.z owns rows group_off[e] .. group_off[e + 1] of X and Y and
            # weight rows e M .. e M + M - 1; T-tiles past its rows have nothing to do
            e = cuda.blockIdx.z
            g0 = np.int64(group_off[e])
            T = np.int64(group_off[e + 1]) - g0
            return tid, g, t4, rm, rt, m0, g0, T, np.int64(e) * M, t0, t0 < T
        return tid, g, t4, rm, rt, m0, np.int64(0), np.int64(y.shape[0]), np.int64(0), t0, True

    def matmul_q8(w8, w16, w32, wh, M, K, xq32, xd, y, bias, residual, has_bias, has_residual,
                  group_off):
        ws = cuda.shared.array((TM, PITCH_W), np.uint32)     # weight int8 words
        xs = cuda.shared.array((TT, PITCH_W), np.uint32)     # activation int8 words
        wsa = cuda.shared.array((TM, SPITCH_W), np.float32)  # weight scales
        wsb = cuda.shared.array((TM, SPITCH_W), np.float32)  # mins / Q6_K high-half scales
        xds = cuda.shared.array((TT, SPITCH_W), np.float32)  # activation scales
        xss = cuda.shared.array((TT, SPITCH_W), np.float32)  # activation sums (Q4_K/Q5_K)
        acc = cuda.local.array(32, np.float32)                 # [ni][mi][c0..c3], registers
        for i in range(32):
            acc[i] = np.float32(0.0)
        tid, g, t4, rm, rt, m0, g0, T, wrow0, t0, busy = place(M, y, group_off)
        if not busy:
            return
        nsub = K // SUB
        rb = np.int64(K // qk) * ts                 # bytes per weight row
        xrow = np.int64(K // 4)                     # words per activation row
        for s0 in range(0, nsub, SSUBS):
            nsb = min(SSUBS, nsub - s0)
            cuda.syncthreads()                      # every warp is done with the last step
            stage(w8, w16, w32, wh, M, xq32, xd, ws, xs, wsa, wsb, xds, xss, tid, m0, t0, s0,
                  nsb, wrow0, g0, T, rb, xrow, nsub)
            cuda.syncthreads()
            # --- tensor cores, sub-block by sub-block (ascending: the summation order); a
            # full step (every real shape's) spelled out with constant j, so every shared
            # address is this thread's base plus an immediate (session 21: the runtime loop
            # spent ~100 of its 271 sm_90 instructions a sub-block recomputing addresses; on
            # the H200 at T = 512, Q4_K 12288 x 4096 379.2 against 449.2 us, Q6_K 560.4
            # against 644.9, Q8_0 453.9 against 536.5; the same bits)
            if nsb == SSUBS:
                sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 0)
                sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 1)
                sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 2)
                sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 3)
                if SSUBS == 8:
                    sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 4)
                    sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 5)
                    sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 6)
                    sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, 7)
            else:
                for j in range(nsb):
                    sub_block(acc, ws, xs, wsa, wsb, xds, xss, rm, rt, g, t4, j)
        epilogue(acc, y, bias, residual, has_bias, has_residual, g0, T, M, m0, t0, rm, rt, t4)

    # copy_ahead (Q4_K, 4 sub-blocks = 2 quant runs a step): flat shared sizes
    RAW_W, RAW_X, RAW_XD = TM * RAW_ROW_WORDS, TT * PITCH_W, TT * 4
    RAW_W2, RAW_X2, RAW_XD2 = 2 * RAW_W, 2 * RAW_X, 2 * RAW_XD
    # work items a thread takes per step (the copy_ahead tiles divide them evenly)
    COPIES_W, COPIES_X = TM * 4 // NTHREADS, TT * 8 // NTHREADS
    DECODES_W, DECODES_X = TM * 2 // NTHREADS, TT * 4 // NTHREADS

    @cuda.jit(device=True, inline="always")
    def copy_step(rawW, rawX, rawXd, w32, xq32, xd, tid, m0, t0, s, b, wrow0, g0, T, M, rb,
                  xrow, nsub):
        """Start the copies of step s's raw bytes into buffer b (a constant; also s & 1, the
        half of its super-block the step is: its runs are 2 b and 2 b + 1): each weight row's
        two quant runs (4 x 16 bytes, two a thread) and block header (16, threads 0..TM - 1),
        each token's 4 sub-blocks of int8 (8 x 16, two a thread at the 64-token tile) and
        their 4 scales (16). Rows past M and tokens past T are not copied (zeros since the
        start). Shared indices are unsigned: numba then emits no negative-index wraparound."""
        s0 = 4 * s
        blk = (s0 >> 3) * Q4_K_BYTES + Q4_K_OFF_QS + 64 * b    # the step's runs, bytes
        for k in range(COPIES_W):                  # (constant trip counts: unrolled, no remainder)
            item = tid + k * NTHREADS
            r = item >> 2
            c = item & 3
            if m0 + r < M:
                cp_async_16(rawW, np.uint32(b * RAW_W + 4 + r * RAW_ROW_WORDS + 4 * c), w32,
                            ((wrow0 + m0 + r) * rb + blk + 16 * c) >> 2)
        if tid < TM:
            if m0 + tid < M:
                cp_async_16(rawW, np.uint32(b * RAW_W + tid * RAW_ROW_WORDS), w32,
                            ((wrow0 + m0 + tid) * rb + (s0 >> 3) * Q4_K_BYTES) >> 2)
        for k in range(COPIES_X):
            item = tid + k * NTHREADS
            r = item >> 3
            c = item & 7
            if t0 + r < T:
                cp_async_16(rawX, np.uint32(b * RAW_X + r * PITCH_W + 4 * c), xq32,
                            (g0 + t0 + r) * xrow + 8 * s0 + 4 * c)
        r = tid - (NTHREADS - TT)                  # the last TT threads: the token scales
        if r >= 0 and t0 + r < T:
            cp_async_16(rawXd, np.uint32(b * RAW_XD + 4 * r), xd, (g0 + t0 + r) * nsub + s0)

    @cuda.jit(device=True, inline="always")
    def decode_step(rawW, rawX, wsa, wsb, xss, tid, s, b):
        """Step s's (d*sc, dmin*m) pairs from the landed headers and its activation sums, with
        `stage`'s own helpers (`_k_scale_products`, `_act_sum`)."""
        for k in range(DECODES_W):
            item = tid + k * NTHREADS
            r = item >> 1
            pl = item & 1
            base = np.uint32(b * RAW_W + r * RAW_ROW_WORDS)
            _k_scale_products(rawW[base], rawW[base + np.uint32(1)], rawW[base + np.uint32(2)],
                              rawW[base + np.uint32(3)], 2 * b + pl, wsa, wsb, r, 2 * pl)
        for k in range(DECODES_X):
            item = tid + k * NTHREADS
            r = item >> 2
            j = item & 3
            base = np.uint32(b * RAW_X + r * PITCH_W + 8 * j)
            xss[r, j] = _act_sum(rawX[base], rawX[base + np.uint32(1)],
                                 rawX[base + np.uint32(2)], rawX[base + np.uint32(3)],
                                 rawX[base + np.uint32(4)], rawX[base + np.uint32(5)],
                                 rawX[base + np.uint32(6)], rawX[base + np.uint32(7)])

    @cuda.jit(device=True, inline="always")
    def half_pair(acc, rawX, rawXd, wsa, wsb, xss, ax, ad, rm, rt, t4, b, pl, h,
                  r00, r01, r02, r03, r10, r11, r12, r13):
        """Sub-block 2 pl + h (h a constant: 0 the raw words' low nibbles, 1 the high)."""
        j = 2 * pl + h
        sh = np.uint32(4 * h)
        a00 = (r00 >> sh) & _LOW_NIBBLES
        a01 = (r01 >> sh) & _LOW_NIBBLES
        a02 = (r02 >> sh) & _LOW_NIBBLES
        a03 = (r03 >> sh) & _LOW_NIBBLES
        a10 = (r10 >> sh) & _LOW_NIBBLES
        a11 = (r11 >> sh) & _LOW_NIBBLES
        a12 = (r12 >> sh) & _LOW_NIBBLES
        a13 = (r13 >> sh) & _LOW_NIBBLES
        s0a, s1a, s2a, s3a, s0b, s1b, s2b, s3b = row_scales(wsa, wsb, rm, j)
        for ni in range(4):
            xb = ax + np.uint32(b * RAW_X + 8 * j + 8 * ni * PITCH_W)
            b0 = rawX[xb]
            b1 = rawX[xb + np.uint32(4)]
            db = ad + np.uint32(b * RAW_XD + 32 * ni + j)
            xd0 = rawXd[db]
            xd1 = rawXd[db + np.uint32(4)]
            rx = rt + 8 * ni + 2 * t4
            xs0 = xss[rx, j]
            xs1 = xss[rx + 1, j]
            tile_terms(acc, 8 * ni, a00, a01, a02, a03, b0, b1,
                       s0a, s0b, s1a, s1b, xd0, xd1, xs0, xs1)
            tile_terms(acc, 8 * ni + 4, a10, a11, a12, a13, b0, b1,
                       s2a, s2b, s3a, s3b, xd0, xd1, xs0, xs1)

    @cuda.jit(device=True, inline="always")
    def run_pair(acc, rawW, rawX, rawXd, wsa, wsb, xss, aw, ax, ad, rm, rt, t4, b, pl):
        """Sub-blocks 2 pl (low nibbles) and 2 pl + 1 (high) of buffer b into the warp's tiles:
        the A words straight from the raw quant run (one load for both sub-blocks), otherwise
        `sub_block`'s loads and arithmetic. aw, ax, ad: this lane's unsigned base indices into
        rawW (row rm, word t4 of the runs), rawX (token rt + g, word t4) and rawXd (token
        rt + 2 t4); every other index is one of them plus a constant."""
        wb = aw + np.uint32(b * RAW_W + 8 * pl)
        r00 = rawW[wb]
        r01 = rawW[wb + np.uint32(8 * RAW_ROW_WORDS)]
        r02 = rawW[wb + np.uint32(4)]
        r03 = rawW[wb + np.uint32(8 * RAW_ROW_WORDS + 4)]
        r10 = rawW[wb + np.uint32(16 * RAW_ROW_WORDS)]
        r11 = rawW[wb + np.uint32(24 * RAW_ROW_WORDS)]
        r12 = rawW[wb + np.uint32(16 * RAW_ROW_WORDS + 4)]
        r13 = rawW[wb + np.uint32(24 * RAW_ROW_WORDS + 4)]
        half_pair(acc, rawX, rawXd, wsa, wsb, xss, ax, ad, rm, rt, t4, b, pl, 0,
                  r00, r01, r02, r03, r10, r11, r12, r13)
        half_pair(acc, rawX, rawXd, wsa, wsb, xss, ax, ad, rm, rt, t4, b, pl, 1,
                  r00, r01, r02, r03, r10, r11, r12, r13)

    @cuda.jit(device=True, inline="always")
    def step_ahead(acc, rawW, rawX, rawXd, wsa, wsb, xss, w32, xq32, xd, tid, m0, t0, s, b,
                   nsteps, wrow0, g0, T, M, rb, xrow, nsub, rm, rt, aw, ax, ad, t4):
        """Step s, whose bytes are (being) copied into buffer b."""
        cuda.syncthreads()                      # every warp is done with step s - 1
        if s + 1 < nsteps:
            copy_step(rawW, rawX, rawXd, w32, xq32, xd, tid, m0, t0, s + 1, 1 - b, wrow0, g0,
                      T, M, rb, xrow, nsub)
        cp_async_commit()                       # (an empty group at the last step)
        cp_async_wait_1()                       # this thread's copies of step s landed
        cuda.syncthreads()                      # and every thread's
        decode_step(rawW, rawX, wsa, wsb, xss, tid, s, b)
        cuda.syncthreads()
        run_pair(acc, rawW, rawX, rawXd, wsa, wsb, xss, aw, ax, ad, rm, rt, t4, b, 0)
        run_pair(acc, rawW, rawX, rawXd, wsa, wsb, xss, aw, ax, ad, rm, rt, t4, b, 1)

    def matmul_q8_ahead(w8, w16, w32, wh, M, K, xq32, xd, y, bias, residual, has_bias,
                        has_residual, group_off):
        """`matmul_q8` with step s + 1's raw bytes copied (cp.async) into the other buffer while
        step s runs: per step a barrier (every warp done with step s - 1), the next copies, a
        wait for this step's and a barrier, the scale / sum decode, a barrier, the mma. The
        same values in the same order as `matmul_q8`: the same bits."""
        rawW = cuda.shared.array(RAW_W2, np.uint32)      # [buffer][row][header, 2 runs]
        rawX = cuda.shared.array(RAW_X2, np.uint32)      # [buffer][token][4 sub-blocks]
        rawXd = cuda.shared.array(RAW_XD2, np.float32)   # [buffer][token][4 scales]
        wsa = cuda.shared.array((TM, SPITCH_W), np.float32)
        wsb = cuda.shared.array((TM, SPITCH_W), np.float32)
        xss = cuda.shared.array((TT, SPITCH_W), np.float32)
        acc = cuda.local.array(32, np.float32)
        for i in range(32):
            acc[i] = np.float32(0.0)
        tid, g, t4, rm, rt, m0, g0, T, wrow0, t0, busy = place(M, y, group_off)
        if not busy:
            return
        nsub = K // SUB
        nsteps = nsub // 4
        rb = np.int64(K // qk) * ts
        xrow = np.int64(K // 4)
        # rows past M and tokens past T: zeros in both buffers, never copied over
        for item in range(tid, 2 * TM, NTHREADS):
            r = item % TM
            if m0 + r >= M:
                for k in range(RAW_ROW_WORDS):
                    rawW[(item // TM) * RAW_W + r * RAW_ROW_WORDS + k] = _ZERO_U
        for item in range(tid, 2 * TT, NTHREADS):
            r = item % TT
            if t0 + r >= T:
                for k in range(32):
                    rawX[(item // TT) * RAW_X + r * PITCH_W + k] = _ZERO_U
                for k in range(4):
                    rawXd[(item // TT) * RAW_XD + 4 * r + k] = np.float32(0.0)
        copy_step(rawW, rawX, rawXd, w32, xq32, xd, tid, m0, t0, 0, 0, wrow0, g0, T, M, rb,
                  xrow, nsub)
        cp_async_commit()
        # two steps an iteration, so that the buffer of each is a constant (every shared
        # address a base plus an immediate); Q4_K rows hold a whole number of super-blocks,
        # so nsteps is even
        aw = np.uint32(rm * RAW_ROW_WORDS + 4 + t4)
        ax = np.uint32((rt + g) * PITCH_W + t4)
        ad = np.uint32(4 * (rt + 2 * t4))
        for s in range(0, nsteps, 2):
            step_ahead(acc, rawW, rawX, rawXd, wsa, wsb, xss, w32, xq32, xd, tid, m0, t0, s, 0,
                       nsteps, wrow0, g0, T, M, rb, xrow, nsub, rm, rt, aw, ax, ad, t4)
            step_ahead(acc, rawW, rawX, rawXd, wsa, wsb, xss, w32, xq32, xd, tid, m0, t0, s + 1,
                       1, nsteps, wrow0, g0, T, M, rb, xrow, nsub, rm, rt, aw, ax, ad, t4)
        epilogue(acc, y, bias, residual, has_bias, has_residual, g0, T, M, m0, t0, rm, rt, t4)

    if tile.copy_ahead:
        matmul_q8 = matmul_q8_ahead

    matmul_q8.__name__ = matmul_q8.__qualname__ = \
        f"matmul_q8_{lay.name}" + ("" if magic_cvt else "_cvt") \
        + ("" if tile == DEFAULT_TILE else f"_{tile.name}") + ("_grouped" if grouped else "") \
        + ("_units" if has_lanes and not lanes else "") \
        + ("" if max_regs is None else f"_r{max_regs}")
    k = kernel(matmul_q8, **({} if max_regs is None else {"max_registers": int(max_regs)}))
    k.tile = tile                 # read by _launch for the grid and block
    return k


# The kernels each weight type runs, best first: (tile name, magic_cvt; False = cvt). Measured
# side by side on the H200 (bench/matmul_q8_bench.py --tiles all --cvt-tiles, T = 512, us per
# launch; research/tune-data/matmul_q8.jsonl). Session 10, at the 9B shapes:
#   Q4_K 12288x4096  session-2 kernel 511.1  cvt 499.4  m64t128s4 500.8  m64t128s4_cvt 491.3
#   Q6_K 12288x4096  session-2 kernel 924.8  cvt 851.1  m128t128s4 848.6  m128t128s4_cvt 827.3
#   Q8_0 12288x4096  session-2 kernel 570.7  cvt 561.3  m64t128s4 552.8  m64t128s4_cvt 532.7
# Session 22, after session 21's unrolled K step, at 4096x4096 / 12288x4096 / 4096x12288:
#   Q4_K  m64t128s4_cvt (the choice before) 125.2 / 376.6 / 367.7
#         m128t64s4_cvt (the choice then)   120.2 / 355.9 / 349.5
#         m64t64s8_cvt                      120.0 / 359.2 / 359.7
#   Q6_K  m128t128s4_cvt 174.5 / 554.0 / 541.3, m64t128s4_cvt 187.8 / 562.7 / 559.7: kept
#   Q8_0  m64t128s4_cvt 146.6 / 448.0 / 434.6, m128t128s4_cvt 143.6 / 447.3 / 438.4: kept
# A large tile only pays while its grid fills the GPU: at the 0.5B's ffn_down (M = 896)
# m128t128s4 makes 28 blocks for 132 SMs and the prefill's ffn_down took 5.6 ms against 3.2
# (session 10). So `kernel_for` takes the first candidate whose grid has at least
# MIN_GRID_FILL blocks per SM, else the session-2 kernel (64 x 64, magic-number conversion),
# which is also every other type's. At the 0.5B shapes cvt on the 64 x 64 tile measured slower
# than the magic add (Q5_0 ffn_down 122.6 vs 93.5 us), so the fallback keeps it. Every
# candidate gives the same bits. Read at every launch (bench/run_bench.py's gemm-* modes swap
# it); `candidates` builds each kernel once.
# Session 24 (the copy_ahead tile: cp.async double buffers, decision 0031), at 4096x4096 /
# 12288x4096 / 4096x12288:
#   Q4_K  m128t64s4_cvt (the choice before)        121.4 / 358.7 / 352.0
#         m128t64s4a_cvt (192 registers, 1 block)  122.9 / 363.5 / 356.6
#         m128t64s4a_cvt capped at 128 (the choice) 117.2 / 339.5 / 337.7
#   9B pp512 7117 against 7031 tok/s in one run, the same tokens.
KERNEL_CHOICE = {
    QType.Q4_K: (("m128t64s4a", False, 128), ("m64t128s4", False)),   # both cvt
    QType.Q6_K: (("m128t128s4", False), ("m64t128s4", False)),
    QType.Q8_0: (("m64t128s4", False),),
}
MIN_GRID_FILL = 0.9
_BUILT: dict = {}


def built(qt, name: str, magic: bool, max_regs=None):
    """The kernel of weight type qt on tile TILES[name] (magic: the magic-number conversion,
    else cvt; max_regs: ptxas's register cap, None its own choice), built once per process."""
    key = (QType(qt), name, bool(magic), max_regs)
    if key not in _BUILT:
        _BUILT[key] = _make_matmul_q8(QType(qt), magic_cvt=bool(magic), tile=TILES[name],
                                      max_regs=max_regs)
    return _BUILT[key]


def candidates(qt) -> list:
    """KERNEL_CHOICE's kernels for weight type qt, best first (each built once); an entry is
    (tile name, magic) or (tile name, magic, register cap)."""
    return [built(qt, *entry) for entry in KERNEL_CHOICE.get(QType(qt), ())]


# the session-2 kernel of every type (the fallback); also module attributes matmul_q8_<type>
MATMUL_Q8 = {qt: _make_matmul_q8(qt) for qt in _UNITS}
for _qt, _k in MATMUL_Q8.items():
    globals()[f"matmul_q8_{_qt.name.lower()}"] = _k


def grid_of(tile: Tile, M: int, T: int) -> tuple[int, int]:
    return (M + tile.m - 1) // tile.m, (T + tile.t - 1) // tile.t


def kernel_for(qt, M: int, T: int):
    """The kernel a T x M output of weight type qt runs (KERNEL_CHOICE's rule)."""
    need = MIN_GRID_FILL * sm_count()
    for kern in candidates(qt):
        gm, gt = grid_of(kern.tile, M, T)
        if gm * gt >= need:
            return kern
    return MATMUL_Q8[QType(qt)]


_SIG = "void(uint8[::1], uint16[::1], uint32[::1], float16[::1], int32, int32, uint32[::1], " \
       "float32[::1], float32[:, ::1], float32[::1], float32[:, ::1], int32, int32, uint32[::1])"
PTX_SIGNATURES = {f"matmul_q8_{qt.name.lower()}": [_SIG] for qt in MATMUL_Q8}
PTX_SIGNATURES["matmul_q8_q4_k_grouped"] = [_SIG]
for _qt in _UNITS:                        # KERNEL_CHOICE's kernels (sm_120 is only compiled)
    for _k in candidates(_qt):
        globals()[_k.__name__] = _k
        PTX_SIGNATURES[_k.__name__] = [_SIG]
# the tensor-core instruction must be there (tests/test_compile_ptx.py checks the text), and
# the copy_ahead tiles' asynchronous copies
EXPECTED_PTX = {name: ["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"] for name in PTX_SIGNATURES}
for _qt in _UNITS:
    for _k in candidates(_qt):
        if _k.tile.copy_ahead:
            EXPECTED_PTX[_k.__name__].append("cp.async.cg.shared.global")


# ---------------------------------------------------------------- launcher


def _check_operands(who, qtype, n_mats, M, K, w_dev, xq, xd, y):
    """The weight type (with an int8 path), after checking K, the weight buffer (n_mats
    matrices of M x K GGUF rows) and the operands of T = y.shape[0] rows; returns (qt, T)."""
    qt = layout(qtype).qtype
    if qt not in MATMUL_Q8:
        raise ValueError(f"{who}: no int8 path for {qt.name}; use matmul.launch_matmul "
                         f"(int8 types: {[q.name for q in MATMUL_Q8]})")
    if K % block_size(qt) or K % SUB:
        raise ValueError(f"{who}: K = {K} is not a multiple of {qt.name}'s block "
                         f"({block_size(qt)}) and of {SUB}")
    need = n_mats * M * row_bytes(qt, K)
    if w_dev.size * w_dev.dtype.itemsize != need:
        what = f"a {qt.name} weight of {M} x {K} is" if n_mats == 1 else \
            f"{n_mats} experts of {M} x {K} {qt.name} rows are"
        raise ValueError(f"{who}: {what} {need} bytes; the device buffer holds "
                         f"{w_dev.size * w_dev.dtype.itemsize}")
    if y.ndim != 2 or y.shape[1] != M or y.dtype != np.float32:
        raise ValueError(f"{who}: y must be float32[T, {M}], got {y.dtype}{tuple(y.shape)}")
    T = y.shape[0]
    if xq.dtype != np.int8 or xq.size != T * K:
        raise ValueError(f"{who}: xq must be int8[{T}, {K}], got {xq.dtype}{tuple(xq.shape)}")
    if xd.dtype != np.float32 or xd.size != T * (K // SUB):
        raise ValueError(f"{who}: xd must be float32[{T}, {K // SUB}], "
                         f"got {xd.dtype}{tuple(xd.shape)}")
    return qt, T


def launch_matmul_q8(w_dev, qtype, M, K, xq, xd, y, bias=None, residual=None, stream=0):
    """Y = dequant(xq, xd) @ W^T (+ bias) (+ residual) on int8 tensor cores, for Q8_0, Q4_0,
    Q5_0, Q4_K, Q5_K, Q6_K weights.

    w_dev: device buffer of the GGUF rows (M * row_bytes(qtype, K) bytes); xq int8[T, K] and
    xd float32[T, K / 32] (or flat, T * K and T * K / 32) from `quantize_act.launch_quantize_act`
    on X[T, K]; y float32[T, M]; bias float32[M] or None; residual float32[T, M] or None (may
    be y). Reference: `matmul_q8_reference`."""
    qt, T = _check_operands("matmul_q8", qtype, 1, M, K, w_dev, xq, xd, y)
    if residual is not None and (tuple(residual.shape) != (T, M) or residual.dtype != np.float32):
        raise ValueError(f"matmul_q8: residual must be float32[{T}, {M}]")
    if bias is not None and (bias.size < M or bias.dtype != np.float32):
        raise ValueError(f"matmul_q8: bias must be float32[{M}]")
    if T == 0 or M == 0:
        return
    _launch(kernel_for(qt, M, T), w_dev, M, K, T, xq, xd, y, bias, residual, stream)


def _launch(kern, w_dev, M, K, T, xq, xd, y, bias, residual, stream, groups=None):
    """The grid and the argument views (inputs already checked by the launchers). groups:
    (group_off, rows_max, n_experts) for a grouped kernel (grid z = expert, rows_max rows of
    T-tiles an expert), else None."""
    w8, w16, wh = weight_views(w_dev)
    # 16-byte loads read Q4_K / Q5_K blocks (sizes 144, 176: every block 16-byte aligned);
    # the other types leave this view unused (their buffer need not be a multiple of 4 bytes)
    w32 = w8[:w8.size - w8.size % 4].view(np.uint32)
    xq32 = xq.reshape(T * K).view(np.uint32)                  # 4 int8 per mma register
    tile = kern.tile
    if groups is None:
        grid, group_off = grid_of(tile, M, T), xq32          # (group_off unread)
    else:
        group_off, rows_max, n_experts = groups
        grid = (*grid_of(tile, M, rows_max), n_experts)
    kern[grid, tile.threads, stream](
        w8, w16, w32, wh, np.int32(M), np.int32(K), xq32, xd.reshape(xd.size), y,
        y[0] if bias is None else bias.reshape(bias.size), y if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), group_off)


# grouped kernels by weight type (the session-2 tile: an expert's share of a prefill chunk is
# T k / E rows on average, 16 at the 35B-A3B shape, so a taller tile would mostly idle)
MATMUL_Q8_GROUPED = {qt: _make_matmul_q8(qt, grouped=True) for qt in _UNITS}
# the compile check's representative (the other types' grouped kernels are the same code with
# another unit decoder, which their ungrouped kernels' checks compile)
matmul_q8_q4_k_grouped = MATMUL_Q8_GROUPED[QType.Q4_K]


def launch_matmul_q8_grouped(w_dev, qtype, n_experts, M, K, xq, xd, group_off, y, rows_max,
                             stream=0):
    """The MoE prefill's expert-major GEMM: Y[i] = dequant(Xq[i], Xd[i]) @ W[e]^T for every row
    i in group_off[e] .. group_off[e + 1] - 1 and every expert e, with `W[E, M, K]` a stack of
    experts (GGUF rows, expert e's row m at row e M + m), each expert's weights read once for
    all its rows. xq int8[R, K] and xd float32[R, K / 32] hold the rows sorted by expert (R = the
    sum of the groups), y float32[R, M]; group_off uint32[E + 1] lives on the device (the
    router's choice, so the grid covers rows_max rows per expert -- at most T in a prefill chunk
    -- and tiles past an expert's rows return at once). Each row is summed in the module
    docstring's order, as `launch_matmul_q8` would sum it."""
    qt, R = _check_operands("matmul_q8_grouped", qtype, n_experts, M, K, w_dev, xq, xd, y)
    if group_off.dtype != np.uint32 or group_off.size != n_experts + 1:
        raise ValueError(f"matmul_q8_grouped: group_off must be uint32[{n_experts + 1}]")
    if R == 0 or rows_max == 0:
        return
    _launch(MATMUL_Q8_GROUPED[qt], w_dev, M, K, R, xq, xd, y, None, None, stream,
            groups=(group_off, rows_max, n_experts))


# ---------------------------------------------------------------- numpy reference


def matmul_q8_reference(w_raw, qtype, M, K, xq, xd, bias=None, residual=None):
    """The int8 path's value: float64 (xq * xd per 32-block) @ dequantize(W)^T (+ bias)
    (+ residual), as float64[T, M]. Exact when all scales are powers of two and the sums stay
    below 2^24 units (see tests/test_kernels_matmul_q8.py)."""
    from .matmul import matmul_reference
    from .quantize_act import dequantize_act_q8
    xq = np.asarray(xq, dtype=np.int8)
    T = xq.size // K
    x = dequantize_act_q8(xq.reshape(-1), xd).reshape(T, K)
    return matmul_reference(w_raw, qtype, M, K, x, bias, residual)
