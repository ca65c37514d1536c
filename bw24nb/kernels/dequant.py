"""Device-side decoding of GGUF weight blocks, read straight from the raw bytes.

A weight tensor stays on the device in its GGUF block layout: row `r` starts at byte
`r * row_bytes(qt, K)` and holds `K / block_size(qt)` blocks of `type_size(qt)` bytes
(bw24nb/quant/types.py is the table of both). This module is the one place that knows where
each field sits inside a block; every kernel (matvec, matmul, embedding) decodes through it.

Every kernel receives three views of the same device buffer (made by `weight_views`):

    w8  uint8[::1]    bytes: nibbles, 6-bit scales, UE4M3 scales
    w16 uint16[::1]   2-byte-aligned words: 4-byte fields are read as two of them (every GGUF
                      type size is even, so every block starts 2-byte aligned; Q8_0/Q4_0/Q5_0/
                      Q6_K blocks are not 4-byte aligned, hence no uint32 view)
    wh  float16[::1]  the f16 super-block scales, converted by the hardware (cvt.f32.f16)

Two access patterns, both decoding to the *same float32 value* the numpy codec
(`bw24nb.quant.dequantize`) produces, operation for operation (ggml's order, e.g. Q4_K is
`(d * sc) * q - (dmin * m)`; the products are exact in float32, only the final subtraction
rounds, and it rounds the same way here):

    <type>_element(w8, w16, wh, row_off, i) -> float32
        element i of the row at byte row_off (used by matmul tiles and embedding lookups).
    <type>_group_dot(w8, w16, wh, blk_off, g, x, xb) -> float32
        the 8 weights of "group" g of the block at byte blk_off, multiplied by x[xb + e] and
        summed (used by matvec, one lane per group). A group is what one lane reads in one go:
        for the packed types 4 bytes of quants (+ their high bits); its 8 elements are two runs
        of 4 consecutive elements, run A then run B, each ascending -- the summation order is
        p = w[A0]*x[A0]; p += w[A1]*x[A1]; ... p += w[B3]*x[B3], left to right.
    <type>_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb) -> float32
        the same group against int8 activations (see quantize_act.py): the integer part of
        each 32-element activation block is computed exactly with dp4a, then scaled.

Dense types (F32, F16, BF16) are blocks of one element, so "group" g is element g.
F32 and BF16 are decoded from their bit fields with ldexp (exact) because Numba offers no
bit-cast that works both in the CUDA simulator and in compile_ptx without a GPU.
"""
import math

import numpy as np
from numba import cuda

from ..ptx import dp4a
from ..quant.types import QType, block_size, type_size


# No kernels here: these device functions are compiled (and checked) inside the kernels of
# matvec.py, matmul.py and embedding.py that inline them.
PTX_SIGNATURES = {}


def _device(fn):
    """Device function, always inlined. inline="always" also matters for the compile check:
    numba-cuda 0.30 compiles a non-inlined device function against the *current device*, which
    fails on a machine without a GPU; inlined ones compile with the kernel's cc."""
    return cuda.jit(device=True, inline="always")(fn)


# ---------------------------------------------------------------- raw field readers


@_device
def read_u8(w8, off):
    return np.int32(w8[off])


@_device
def read_u16(w16, off):
    """Little-endian uint16 at even byte offset `off`."""
    return np.int32(w16[off >> 1])


@_device
def read_u32(w16, off):
    """Little-endian 4 bytes at even byte offset `off`, as uint32 (two 2-byte loads)."""
    h = off >> 1
    return np.uint32(w16[h]) | (np.uint32(w16[h + 1]) << np.uint32(16))


@_device
def read_f16(wh, off):
    """The f16 at even byte offset `off`, as float32."""
    return np.float32(wh[off >> 1])


@_device
def as_s32(u):
    """uint32 bit pattern -> int32 (the operand type of dp4a)."""
    return np.int32(u)


@_device
def bits_to_f32(hi, lo):
    """IEEE float32 from its upper and lower 16 bits (ints), exactly."""
    e = (hi >> 7) & 0xFF
    m = ((hi & 0x7F) << 16) | lo
    if e == 0:
        v = np.float32(math.ldexp(np.float32(m), -149))
    elif e == 255:
        v = np.float32(math.inf) if m == 0 else np.float32(math.nan)
    else:
        v = np.float32(math.ldexp(np.float32(m | 0x800000), int(e) - 150))
    if hi & 0x8000:
        v = -v
    return v


@_device
def ue4m3_to_f32(x):
    """GGUF NVFP4 sub-block scale byte -> float32, the codec's `ue4m3_to_float`
    (ggml_ue4m3_to_fp32 without its 1/2): unsigned E4M3, exponent bits 6..3 (bias 7, 0 is
    subnormal), bit 7 ignored by the decode, and only the bytes 0x00 and 0x7F mean 0 (so 0xFF
    is 480)."""
    if x == 0x7F:
        return np.float32(0.0)
    e = (x >> 3) & 15
    m = x & 7
    if e == 0:
        return np.float32(m) * np.float32(1.0 / 512.0)        # m * 2^-9
    return np.float32(8 + m) * np.float32(1 << e) * np.float32(1.0 / 1024.0)   # (8+m) 2^(e-10)


@_device
def e2m1_to_f32(c):
    """FP4 E2M1 code (0..15) -> float32: sign bit 3, exponent bits 2..1 (bias 1), mantissa
    bit 0; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6. Code 8 gives +0.0, as ggml's integer table
    (and the codec) do."""
    e = (c >> 1) & 3
    m = c & 1
    twice = m if e == 0 else (2 + m) << (e - 1)              # 2 * |value|: 0,1,2,3,4,6,8,12
    v = np.float32(twice) * np.float32(0.5)
    return -v if (c & 8) and twice != 0 else v


# ---------------------------------------------------------------- dense: F32, F16, BF16
# One element per "block"; element i of the row is at byte row_off + i * itemsize.


@_device
def f32_element(w8, w16, wh, row_off, i):
    off = row_off + 4 * i
    return bits_to_f32(read_u16(w16, off + 2), read_u16(w16, off))


@_device
def f16_element(w8, w16, wh, row_off, i):
    return read_f16(wh, row_off + 2 * i)


@_device
def bf16_element(w8, w16, wh, row_off, i):
    return bits_to_f32(read_u16(w16, row_off + 2 * i), 0)


@_device
def f32_group_dot(w8, w16, wh, blk_off, g, x, xb):
    return f32_element(w8, w16, wh, blk_off, 0) * x[xb]


@_device
def f16_group_dot(w8, w16, wh, blk_off, g, x, xb):
    return read_f16(wh, blk_off) * x[xb]


@_device
def bf16_group_dot(w8, w16, wh, blk_off, g, x, xb):
    return bits_to_f32(read_u16(w16, blk_off), 0) * x[xb]


# ---------------------------------------------------------------- Q8_0
# 34 bytes / 32 values: d (f16) | qs[32] (int8). value = d * qs[i].
Q8_0_BYTES = type_size(QType.Q8_0)
Q8_0_OFF_D = 0
Q8_0_OFF_QS = 2
Q8_0_GROUPS = 4          # group g: elements 8g..8g+3 (run A), 8g+4..8g+7 (run B)


@_device
def q8_0_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 5) * Q8_0_BYTES
    q = read_u8(w8, blk_off + Q8_0_OFF_QS + (i & 31))
    if q >= 128:
        q -= 256
    return read_f16(wh, blk_off + Q8_0_OFF_D) * np.float32(q)


@_device
def _s8(word, k):
    """Signed byte k (0..3) of a uint32 word, as float32."""
    b = np.int32((word >> np.uint32(8 * k)) & np.uint32(0xFF))
    return np.float32(b - 256 if b >= 128 else b)


@_device
def q8_0_group_dot(w8, w16, wh, blk_off, g, x, xb):
    d = read_f16(wh, blk_off + Q8_0_OFF_D)
    qa = read_u32(w16, blk_off + Q8_0_OFF_QS + 8 * g)
    qb = read_u32(w16, blk_off + Q8_0_OFF_QS + 8 * g + 4)
    e = xb + 8 * g
    p = (d * _s8(qa, 0)) * x[e]
    p += (d * _s8(qa, 1)) * x[e + 1]
    p += (d * _s8(qa, 2)) * x[e + 2]
    p += (d * _s8(qa, 3)) * x[e + 3]
    p += (d * _s8(qb, 0)) * x[e + 4]
    p += (d * _s8(qb, 1)) * x[e + 5]
    p += (d * _s8(qb, 2)) * x[e + 6]
    p += (d * _s8(qb, 3)) * x[e + 7]
    return p


@_device
def q8_0_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    # integer part: sum_i qw_i * qx_i over the 8 elements (exact in int32)
    qa = as_s32(read_u32(w16, blk_off + Q8_0_OFF_QS + 8 * g))
    qb = as_s32(read_u32(w16, blk_off + Q8_0_OFF_QS + 8 * g + 4))
    w0 = (xb >> 2) + 2 * g
    s = dp4a(qb, xq32[w0 + 1], dp4a(qa, xq32[w0], np.int32(0)))
    return (read_f16(wh, blk_off + Q8_0_OFF_D) * xd[xb >> 5]) * np.float32(s)


# ---------------------------------------------------------------- Q4_0 / Q5_0
# Q4_0: 18 bytes / 32 values: d (f16) | qs[16]; value i = d * (q_i - 8) with q_i the low nibble
#       of qs[i] for i < 16 and the high nibble of qs[i - 16] otherwise.
# Q5_0: 22 bytes: d (f16) | qh (u32, bit i = bit 4 of q_i) | qs[16]; value = d * (q_i - 16).
# group g (0..3): qs bytes 4g..4g+3 -> run A = elements 4g..4g+3 (low nibbles),
#                                      run B = elements 16+4g..16+4g+3 (high nibbles).
Q4_0_BYTES = type_size(QType.Q4_0)
Q4_0_OFF_D = 0
Q4_0_OFF_QS = 2
Q5_0_BYTES = type_size(QType.Q5_0)
Q5_0_OFF_D = 0
Q5_0_OFF_QH = 2
Q5_0_OFF_QS = 6
QX_0_GROUPS = 4
_LOW_NIBBLES = np.uint32(0x0F0F0F0F)
_ONES = np.int32(0x01010101)


@_device
def q4_0_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 5) * Q4_0_BYTES
    j = i & 31
    b = read_u8(w8, blk_off + Q4_0_OFF_QS + (j & 15))
    q = (b >> 4) if j >= 16 else (b & 15)
    return read_f16(wh, blk_off + Q4_0_OFF_D) * np.float32(q - 8)


@_device
def q5_0_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 5) * Q5_0_BYTES
    j = i & 31
    b = read_u8(w8, blk_off + Q5_0_OFF_QS + (j & 15))
    q = (b >> 4) if j >= 16 else (b & 15)
    hb = read_u8(w8, blk_off + Q5_0_OFF_QH + (j >> 3))
    q |= ((hb >> (j & 7)) & 1) << 4
    return read_f16(wh, blk_off + Q5_0_OFF_D) * np.float32(q - 16)


@_device
def _nib(word, k):
    """Nibble k (0..7; 0..3 are the low nibbles of bytes 0..3, 4..7 the high ones) as int."""
    if k < 4:
        return np.int32((word >> np.uint32(8 * k)) & np.uint32(15))
    return np.int32((word >> np.uint32(8 * (k - 4) + 4)) & np.uint32(15))


@_device
def _qx0_dot(d, qs, hbits, bias, x, e_a, e_b):
    """Shared body of Q4_0/Q5_0: value k = d * ((nibble_k | high_k << 4) - bias)."""
    p = (d * np.float32((_nib(qs, 0) | (((hbits >> 0) & 1) << 4)) - bias)) * x[e_a]
    p += (d * np.float32((_nib(qs, 1) | (((hbits >> 1) & 1) << 4)) - bias)) * x[e_a + 1]
    p += (d * np.float32((_nib(qs, 2) | (((hbits >> 2) & 1) << 4)) - bias)) * x[e_a + 2]
    p += (d * np.float32((_nib(qs, 3) | (((hbits >> 3) & 1) << 4)) - bias)) * x[e_a + 3]
    p += (d * np.float32((_nib(qs, 4) | (((hbits >> 4) & 1) << 4)) - bias)) * x[e_b]
    p += (d * np.float32((_nib(qs, 5) | (((hbits >> 5) & 1) << 4)) - bias)) * x[e_b + 1]
    p += (d * np.float32((_nib(qs, 6) | (((hbits >> 6) & 1) << 4)) - bias)) * x[e_b + 2]
    p += (d * np.float32((_nib(qs, 7) | (((hbits >> 7) & 1) << 4)) - bias)) * x[e_b + 3]
    return p


@_device
def _q5_0_high_bits(w16, blk_off, g):
    """The 8 fifth bits of group g packed as bits 0..3 (run A) and 4..7 (run B)."""
    qh = read_u32(w16, blk_off + Q5_0_OFF_QH)
    a = np.int32((qh >> np.uint32(4 * g)) & np.uint32(15))
    b = np.int32((qh >> np.uint32(16 + 4 * g)) & np.uint32(15))
    return a | (b << 4)


@_device
def q4_0_group_dot(w8, w16, wh, blk_off, g, x, xb):
    qs = read_u32(w16, blk_off + Q4_0_OFF_QS + 4 * g)
    return _qx0_dot(read_f16(wh, blk_off + Q4_0_OFF_D), qs, 0, 8, x, xb + 4 * g, xb + 16 + 4 * g)


@_device
def q5_0_group_dot(w8, w16, wh, blk_off, g, x, xb):
    qs = read_u32(w16, blk_off + Q5_0_OFF_QS + 4 * g)
    hb = _q5_0_high_bits(w16, blk_off, g)
    return _qx0_dot(read_f16(wh, blk_off + Q5_0_OFF_D), qs, hb, 16, x, xb + 4 * g, xb + 16 + 4 * g)


@_device
def _spread_bits(h4):
    """4 bits -> bit 4 of each of 4 bytes (the fifth bit of 4 packed 5-bit values)."""
    return np.int32(((h4 & 1) << 4) | ((h4 & 2) << 11) | ((h4 & 4) << 18) | ((h4 & 8) << 25))


@_device
def _qx0_dot_q8(d, qs, hbits, bias, xq32, xd, xb, g):
    # integer part: sum_k (q_k - bias) * qx_k = dp4a(q, qx) - bias * dp4a(1, qx), exact in int32
    qa = as_s32(qs & _LOW_NIBBLES) | _spread_bits(hbits & 15)
    qb = as_s32((qs >> np.uint32(4)) & _LOW_NIBBLES) | _spread_bits((hbits >> 4) & 15)
    xa = xq32[(xb >> 2) + g]
    xbw = xq32[(xb >> 2) + 4 + g]
    s = dp4a(qb, xbw, dp4a(qa, xa, np.int32(0)))
    sx = dp4a(_ONES, xbw, dp4a(_ONES, xa, np.int32(0)))
    return (d * xd[xb >> 5]) * np.float32(s - bias * sx)


@_device
def q4_0_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    qs = read_u32(w16, blk_off + Q4_0_OFF_QS + 4 * g)
    return _qx0_dot_q8(read_f16(wh, blk_off + Q4_0_OFF_D), qs, 0, 8, xq32, xd, xb, g)


@_device
def q5_0_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    qs = read_u32(w16, blk_off + Q5_0_OFF_QS + 4 * g)
    hb = _q5_0_high_bits(w16, blk_off, g)
    return _qx0_dot_q8(read_f16(wh, blk_off + Q5_0_OFF_D), qs, hb, 16, xq32, xd, xb, g)


# ---------------------------------------------------------------- Q4_K / Q5_K
# 256 values in 8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m.
# Q4_K, 144 bytes: d (f16) | dmin (f16) | scales[12] | qs[128]
# Q5_K, 176 bytes: d (f16) | dmin (f16) | scales[12] | qh[32] | qs[128]
# value = (d * sc_j) * q - (dmin * m_j), j = i // 32 the sub-block; q is 4 bits (Q4_K) or
# 5 bits (Q5_K: plus bit j of qh[i % 32]). qs byte 32p + l holds element 64p + l in its low
# nibble and 64p + 32 + l in its high nibble.
# group g (0..31): p = g // 8, l = 4 (g % 8); qs bytes 32p + l .. +3 ->
#     run A = elements 64p + l .. +3 (sub-block 2p), run B = 64p + 32 + l .. +3 (sub-block 2p+1)
Q4_K_BYTES = type_size(QType.Q4_K)
Q5_K_BYTES = type_size(QType.Q5_K)
QK_OFF_D = 0
QK_OFF_DMIN = 2
QK_OFF_SCALES = 4
Q4_K_OFF_QS = 16
Q5_K_OFF_QH = 16
Q5_K_OFF_QS = 48
QK_GROUPS = 32


@_device
def k4_scale_min(w8, blk_off, j):
    """Sub-block j's (sc, m) from the 12 packed scale bytes (ggml's get_scale_min_k4)."""
    s = blk_off + QK_OFF_SCALES
    if j < 4:
        sc = read_u8(w8, s + j) & 63
        m = read_u8(w8, s + j + 4) & 63
    else:
        c = read_u8(w8, s + j + 4)
        sc = (c & 15) | ((read_u8(w8, s + j - 4) >> 6) << 4)
        m = (c >> 4) | ((read_u8(w8, s + j) >> 6) << 4)
    return sc, m


@_device
def _k_sub_scales(w8, wh, blk_off, j):
    """(d * sc_j, dmin * m_j) as float32, both exact products."""
    sc, m = k4_scale_min(w8, blk_off, j)
    return (read_f16(wh, blk_off + QK_OFF_D) * np.float32(sc),
            read_f16(wh, blk_off + QK_OFF_DMIN) * np.float32(m))


@_device
def q4_k_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 8) * Q4_K_BYTES
    e = i & 255
    b = read_u8(w8, blk_off + Q4_K_OFF_QS + 32 * (e >> 6) + (e & 31))
    q = (b >> 4) if (e & 32) else (b & 15)
    ds, dm = _k_sub_scales(w8, wh, blk_off, e >> 5)
    return ds * np.float32(q) - dm


@_device
def q5_k_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 8) * Q5_K_BYTES
    e = i & 255
    j = e >> 5
    b = read_u8(w8, blk_off + Q5_K_OFF_QS + 32 * (e >> 6) + (e & 31))
    q = (b >> 4) if (e & 32) else (b & 15)
    q |= ((read_u8(w8, blk_off + Q5_K_OFF_QH + (e & 31)) >> j) & 1) << 4
    ds, dm = _k_sub_scales(w8, wh, blk_off, j)
    return ds * np.float32(q) - dm


@_device
def _k_run_dot(ds, dm, qs, hw, shift, hi, x, e):
    """4 values of one sub-block: nibbles from `qs` (low if hi == 0 else high) plus, for Q5_K,
    bit `shift` of each byte of `hw` as the fifth bit."""
    p = (ds * np.float32(_nib(qs, 4 * hi) | ((np.int32(hw >> np.uint32(shift)) & 1) << 4)) - dm) * x[e]
    p += (ds * np.float32(_nib(qs, 4 * hi + 1) | ((np.int32(hw >> np.uint32(shift + 8)) & 1) << 4)) - dm) * x[e + 1]
    p += (ds * np.float32(_nib(qs, 4 * hi + 2) | ((np.int32(hw >> np.uint32(shift + 16)) & 1) << 4)) - dm) * x[e + 2]
    p += (ds * np.float32(_nib(qs, 4 * hi + 3) | ((np.int32(hw >> np.uint32(shift + 24)) & 1) << 4)) - dm) * x[e + 3]
    return p


@_device
def q4_k_group_dot(w8, w16, wh, blk_off, g, x, xb):
    p2 = g >> 3
    l = 4 * (g & 7)
    qs = read_u32(w16, blk_off + Q4_K_OFF_QS + 32 * p2 + l)
    ds_a, dm_a = _k_sub_scales(w8, wh, blk_off, 2 * p2)
    ds_b, dm_b = _k_sub_scales(w8, wh, blk_off, 2 * p2 + 1)
    e = xb + 64 * p2 + l
    p = _k_run_dot(ds_a, dm_a, qs, np.uint32(0), 0, 0, x, e)
    return p + _k_run_dot(ds_b, dm_b, qs, np.uint32(0), 0, 1, x, e + 32)


@_device
def q5_k_group_dot(w8, w16, wh, blk_off, g, x, xb):
    p2 = g >> 3
    l = 4 * (g & 7)
    qs = read_u32(w16, blk_off + Q5_K_OFF_QS + 32 * p2 + l)
    qh = read_u32(w16, blk_off + Q5_K_OFF_QH + l)
    ds_a, dm_a = _k_sub_scales(w8, wh, blk_off, 2 * p2)
    ds_b, dm_b = _k_sub_scales(w8, wh, blk_off, 2 * p2 + 1)
    e = xb + 64 * p2 + l
    p = _k_run_dot(ds_a, dm_a, qs, qh, 2 * p2, 0, x, e)
    return p + _k_run_dot(ds_b, dm_b, qs, qh, 2 * p2 + 1, 1, x, e + 32)


@_device
def _k_sub_q8(w8, wh, blk_off, j, q, xq, xd_j):
    """One run of 4 values of sub-block j against 4 int8 activations: the integer parts
    sum q*qx and sum qx are exact (dp4a); value = xd_j * ((d*sc) * sumi - (dmin*m) * sumx)."""
    ds, dm = _k_sub_scales(w8, wh, blk_off, j)
    s = dp4a(q, xq, np.int32(0))
    sx = dp4a(_ONES, xq, np.int32(0))
    return xd_j * (ds * np.float32(s) - dm * np.float32(sx))


@_device
def _q5_k_high(qh, shift):
    """Bit `shift` of each byte of qh, moved to bit 4 of that byte."""
    return as_s32(((qh >> np.uint32(shift)) & np.uint32(0x01010101)) << np.uint32(4))


@_device
def q4_k_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    p2 = g >> 3
    l = 4 * (g & 7)
    qs = read_u32(w16, blk_off + Q4_K_OFF_QS + 32 * p2 + l)
    e = xb + 64 * p2 + l
    qa = as_s32(qs & _LOW_NIBBLES)
    qb = as_s32((qs >> np.uint32(4)) & _LOW_NIBBLES)
    p = _k_sub_q8(w8, wh, blk_off, 2 * p2, qa, xq32[e >> 2], xd[e >> 5])
    return p + _k_sub_q8(w8, wh, blk_off, 2 * p2 + 1, qb, xq32[(e + 32) >> 2], xd[(e + 32) >> 5])


@_device
def q5_k_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    p2 = g >> 3
    l = 4 * (g & 7)
    qs = read_u32(w16, blk_off + Q5_K_OFF_QS + 32 * p2 + l)
    qh = read_u32(w16, blk_off + Q5_K_OFF_QH + l)
    e = xb + 64 * p2 + l
    qa = as_s32(qs & _LOW_NIBBLES) | _q5_k_high(qh, 2 * p2)
    qb = as_s32((qs >> np.uint32(4)) & _LOW_NIBBLES) | _q5_k_high(qh, 2 * p2 + 1)
    p = _k_sub_q8(w8, wh, blk_off, 2 * p2, qa, xq32[e >> 2], xd[e >> 5])
    return p + _k_sub_q8(w8, wh, blk_off, 2 * p2 + 1, qb, xq32[(e + 32) >> 2], xd[(e + 32) >> 5])


# ---------------------------------------------------------------- Q6_K
# 210 bytes / 256 values: ql[128] | qh[64] | scales[16] (int8) | d (f16).
# value i = (d * sc[i // 16]) * (q - 32), q = 4 low bits from ql, 2 high bits from qh:
# for half n = i // 128, r = i % 128, l = r % 32, c = r // 32 (0..3):
#     ql byte 64n + 32 (c & 1) + l, its low nibble if c < 2 else its high nibble;
#     qh byte 32n + l, bits 2c..2c+1.
# group g (0..31): n = g // 16, h = (g // 8) & 1, l = 4 (g % 8); ql bytes 64n + 32h + l .. +3 ->
#     run A = elements 128n + 32h + l .. +3 (low nibbles, qh bits 2h),
#     run B = elements 128n + 64 + 32h + l .. +3 (high nibbles, qh bits 4 + 2h).
Q6_K_BYTES = type_size(QType.Q6_K)
Q6_K_OFF_QL = 0
Q6_K_OFF_QH = 128
Q6_K_OFF_SCALES = 192
Q6_K_OFF_D = 208
Q6_K_GROUPS = 32


@_device
def q6_k_scale(w8, wh, blk_off, s):
    """d * sc_s for 16-element scale group s (exact product)."""
    sc = read_u8(w8, blk_off + Q6_K_OFF_SCALES + s)
    if sc >= 128:
        sc -= 256
    return read_f16(wh, blk_off + Q6_K_OFF_D) * np.float32(sc)


@_device
def q6_k_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 8) * Q6_K_BYTES
    e = i & 255
    n = e >> 7
    r = e & 127
    l = r & 31
    c = r >> 5
    b = read_u8(w8, blk_off + Q6_K_OFF_QL + 64 * n + 32 * (c & 1) + l)
    q = (b >> 4) if c >= 2 else (b & 15)
    q |= ((read_u8(w8, blk_off + Q6_K_OFF_QH + 32 * n + l) >> (2 * c)) & 3) << 4
    return q6_k_scale(w8, wh, blk_off, e >> 4) * np.float32(q - 32)


@_device
def _q6_k_run_dot(ds, ql, hi, qh, shift, x, e):
    p = (ds * np.float32((_nib(ql, 4 * hi) | ((np.int32(qh >> np.uint32(shift)) & 3) << 4)) - 32)) * x[e]
    p += (ds * np.float32((_nib(ql, 4 * hi + 1) | ((np.int32(qh >> np.uint32(shift + 8)) & 3) << 4)) - 32)) * x[e + 1]
    p += (ds * np.float32((_nib(ql, 4 * hi + 2) | ((np.int32(qh >> np.uint32(shift + 16)) & 3) << 4)) - 32)) * x[e + 2]
    p += (ds * np.float32((_nib(ql, 4 * hi + 3) | ((np.int32(qh >> np.uint32(shift + 24)) & 3) << 4)) - 32)) * x[e + 3]
    return p


@_device
def q6_k_group_dot(w8, w16, wh, blk_off, g, x, xb):
    n = g >> 4
    h = (g >> 3) & 1
    l = 4 * (g & 7)
    ql = read_u32(w16, blk_off + Q6_K_OFF_QL + 64 * n + 32 * h + l)
    qh = read_u32(w16, blk_off + Q6_K_OFF_QH + 32 * n + l)
    ea = 128 * n + 32 * h + l
    p = _q6_k_run_dot(q6_k_scale(w8, wh, blk_off, ea >> 4), ql, 0, qh, 2 * h, x, xb + ea)
    return p + _q6_k_run_dot(q6_k_scale(w8, wh, blk_off, (ea + 64) >> 4), ql, 1, qh, 4 + 2 * h,
                             x, xb + ea + 64)


@_device
def _q6_k_run_q8(w8, wh, blk_off, s, q, xq, xd_b):
    """integer part sum (q - 32) * qx = dp4a(q, qx) - 32 dp4a(1, qx), exact in int32."""
    isum = dp4a(q, xq, np.int32(0)) - 32 * dp4a(_ONES, xq, np.int32(0))
    return (q6_k_scale(w8, wh, blk_off, s) * xd_b) * np.float32(isum)


@_device
def q6_k_group_dot_q8(w8, w16, wh, blk_off, g, xq32, xd, xb):
    n = g >> 4
    h = (g >> 3) & 1
    l = 4 * (g & 7)
    ql = read_u32(w16, blk_off + Q6_K_OFF_QL + 64 * n + 32 * h + l)
    qh = read_u32(w16, blk_off + Q6_K_OFF_QH + 32 * n + l)
    ea = 128 * n + 32 * h + l
    three = np.uint32(0x03030303)
    qa = as_s32(ql & _LOW_NIBBLES) | as_s32(((qh >> np.uint32(2 * h)) & three) << np.uint32(4))
    qb = as_s32((ql >> np.uint32(4)) & _LOW_NIBBLES) | \
        as_s32(((qh >> np.uint32(4 + 2 * h)) & three) << np.uint32(4))
    ga = xb + ea
    gb = xb + ea + 64
    p = _q6_k_run_q8(w8, wh, blk_off, ea >> 4, qa, xq32[ga >> 2], xd[ga >> 5])
    return p + _q6_k_run_q8(w8, wh, blk_off, (ea + 64) >> 4, qb, xq32[gb >> 2], xd[gb >> 5])


# ---------------------------------------------------------------- NVFP4 (GGUF block_nvfp4)
# 36 bytes / 64 values: d[4] (UE4M3, one per 16-value sub-block) | qs[32] (FP4 E2M1 nibbles).
# value i = e2m1(code) * ue4m3(d[s]), s = i // 16, t = i % 16: code = low nibble of
# qs[8s + t] for t < 8, high nibble of qs[8s + t - 8] otherwise. (GGUF has no tensor scale in
# the block; a per-tensor fp32 scale, where a model has one, is applied by the caller.)
# group g (0..7): s = g // 2, k = 4 (g % 2); qs bytes 8s + k .. +3 ->
#     run A = elements 16s + k .. +3 (low nibbles), run B = 16s + 8 + k .. +3 (high nibbles)
NVFP4_BYTES = type_size(QType.NVFP4)
NVFP4_OFF_D = 0
NVFP4_OFF_QS = 4
NVFP4_GROUPS = 8


@_device
def nvfp4_element(w8, w16, wh, row_off, i):
    blk_off = row_off + (i >> 6) * NVFP4_BYTES
    e = i & 63
    s = e >> 4
    t = e & 15
    b = read_u8(w8, blk_off + NVFP4_OFF_QS + 8 * s + (t & 7))
    c = (b >> 4) if t >= 8 else (b & 15)
    return e2m1_to_f32(c) * ue4m3_to_f32(read_u8(w8, blk_off + NVFP4_OFF_D + s))


@_device
def nvfp4_group_dot(w8, w16, wh, blk_off, g, x, xb):
    s = g >> 1
    k = 4 * (g & 1)
    qs = read_u32(w16, blk_off + NVFP4_OFF_QS + 8 * s + k)
    d = ue4m3_to_f32(read_u8(w8, blk_off + NVFP4_OFF_D + s))
    ea = xb + 16 * s + k
    p = (e2m1_to_f32(_nib(qs, 0)) * d) * x[ea]
    p += (e2m1_to_f32(_nib(qs, 1)) * d) * x[ea + 1]
    p += (e2m1_to_f32(_nib(qs, 2)) * d) * x[ea + 2]
    p += (e2m1_to_f32(_nib(qs, 3)) * d) * x[ea + 3]
    p += (e2m1_to_f32(_nib(qs, 4)) * d) * x[ea + 8]
    p += (e2m1_to_f32(_nib(qs, 5)) * d) * x[ea + 9]
    p += (e2m1_to_f32(_nib(qs, 6)) * d) * x[ea + 10]
    p += (e2m1_to_f32(_nib(qs, 7)) * d) * x[ea + 11]
    return p


# ---------------------------------------------------------------- the per-type table


class Layout:
    """What the kernels need to know about one weight type: elements per block, bytes per
    block, lanes' groups per block, and its device decoders (None where a path is absent)."""

    def __init__(self, qt, groups, element, group_dot, group_dot_q8=None):
        self.qtype = QType(qt)
        self.block = block_size(qt)
        self.type_size = type_size(qt)
        self.groups = groups
        self.element = element
        self.group_dot = group_dot
        self.group_dot_q8 = group_dot_q8

    @property
    def name(self) -> str:
        return self.qtype.name.lower()


LAYOUTS = {
    QType.F32: Layout(QType.F32, 1, f32_element, f32_group_dot),
    QType.F16: Layout(QType.F16, 1, f16_element, f16_group_dot),
    QType.BF16: Layout(QType.BF16, 1, bf16_element, bf16_group_dot),
    QType.Q8_0: Layout(QType.Q8_0, Q8_0_GROUPS, q8_0_element, q8_0_group_dot, q8_0_group_dot_q8),
    QType.Q4_0: Layout(QType.Q4_0, QX_0_GROUPS, q4_0_element, q4_0_group_dot, q4_0_group_dot_q8),
    QType.Q5_0: Layout(QType.Q5_0, QX_0_GROUPS, q5_0_element, q5_0_group_dot, q5_0_group_dot_q8),
    QType.Q4_K: Layout(QType.Q4_K, QK_GROUPS, q4_k_element, q4_k_group_dot, q4_k_group_dot_q8),
    QType.Q5_K: Layout(QType.Q5_K, QK_GROUPS, q5_k_element, q5_k_group_dot, q5_k_group_dot_q8),
    QType.Q6_K: Layout(QType.Q6_K, Q6_K_GROUPS, q6_k_element, q6_k_group_dot, q6_k_group_dot_q8),
    QType.NVFP4: Layout(QType.NVFP4, NVFP4_GROUPS, nvfp4_element, nvfp4_group_dot),
}


def layout(qt) -> Layout:
    """The Layout of weight type `qt`, or UnsupportedTensorType naming the types we have."""
    from ..errors import UnsupportedTensorType
    from ..quant.types import as_qtype
    q = as_qtype(qt)
    if q not in LAYOUTS:
        raise UnsupportedTensorType(
            f"no GPU kernels for {q.name} weights; kernel types: "
            + ", ".join(t.name for t in LAYOUTS) + ". Convert the tensor to one of these at load.")
    return LAYOUTS[q]


def weight_views(w_dev):
    """(w8, w16, wh): flat uint8, uint16 and float16 views of one device weight buffer (any
    shape, C-contiguous, an even number of bytes). No copy: all three alias the same bytes."""
    w8 = w_dev if w_dev.dtype == np.uint8 else w_dev.view(np.uint8)
    if w8.ndim != 1:
        w8 = w8.reshape(w8.size)
    return w8, w8.view(np.uint16), w8.view(np.float16)


# ---------------------------------------------------------------- host side: test/bench data

# byte offsets of the f16 scale fields in a block, per type (the fields random data must keep
# finite; everything else in a block is valid whatever its bits)
F16_FIELDS = {
    QType.Q8_0: (Q8_0_OFF_D,),
    QType.Q4_0: (Q4_0_OFF_D,),
    QType.Q5_0: (Q5_0_OFF_D,),
    QType.Q4_K: (QK_OFF_D, QK_OFF_DMIN),
    QType.Q5_K: (QK_OFF_D, QK_OFF_DMIN),
    QType.Q6_K: (Q6_K_OFF_D,),
    QType.NVFP4: (),
}


def random_weight_bytes(rng, qt, M, K, f16_value=None):
    """Random valid GGUF rows (uint8[M, row_bytes]) of type qt for kernel tests and benches:
    every quant, sub-scale and UE4M3 byte uniformly random (all codes, specials included), the
    f16 scale fields log-uniform in +-[2^-12, 2^-4] -- or all equal to `f16_value` (e.g. a power
    of two, to make a test's float arithmetic exact). Dense types: normal(0, 1) values."""
    lay = layout(qt)
    q = lay.qtype
    if q in (QType.F32, QType.F16, QType.BF16):
        v = rng.standard_normal((M, K)).astype(np.float32)
        if q == QType.F32:
            return v.view(np.uint8)
        if q == QType.F16:
            return v.astype(np.float16).view(np.uint8)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nblk = M * (K // lay.block)
    raw = rng.integers(0, 256, size=(nblk, lay.type_size), dtype=np.uint8)
    for off in F16_FIELDS[q]:
        if f16_value is None:
            mag = np.exp2(rng.uniform(-12, -4, nblk))
            val = np.where(rng.random(nblk) < 0.5, -mag, mag)
        else:
            val = np.full(nblk, f16_value)
        raw[:, off:off + 2] = val.astype("<f2").reshape(-1, 1).view(np.uint8)
    return raw.reshape(M, -1)
