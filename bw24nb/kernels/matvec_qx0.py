"""Q8_0 / Q5_0 / Q4_0 decode matvec with 16-byte loads straight from the GGUF blocks.

Same contract as `matvec.launch_matvec_q8` (y = W @ dequant(xq, xd) (+ bias) (+ residual), int8
activations from quantize_act.py), for the 32-value block types -- every matrix of the default
model (Qwen2.5-Coder-0.5B: K = 896 is no multiple of 256, so its Q4_K_M file falls back to Q5_0
and Q8_0, LM head included) and every Q8_0 file. Their blocks are 34 / 22 / 18 bytes, only
2-byte aligned in place, so the generic dp4a path (matvec.py, dequant.py's group codecs) reads a
block as ~32 two-byte loads: it ran the 0.5B LM head (151936 x 896 Q8_0) at 29 % of the read
roofline and ffn_gate / ffn_up (4864 x 896 Q5_0) at 11 % (H200, research/tune-data/matvec.jsonl).
This kernel runs them at 85 % (48.7 us against 135.6) and in 3.50 us against 7.31 (session 17,
docs/decisions/0023).

No repack. A lane takes one whole block (a "unit") and reads the 16-byte-aligned window
holding its quants -- three `ld.global.nc.v4.u32` for Q8_0's 32 bytes (they start anywhere
in the window at an even byte m), two for Q5_0 / Q4_0's 16 -- then lines them up in registers:
a rotation by m / 4 words (two stages of selects: by 2 words when m & 8, by 1 when m & 4) and
one `prmt` a word for the last 2 bytes (m & 2). The block's f16 d (and Q5_0's 4-byte qh, at
byte 2) come from 2-byte loads of the same lines. Requirements, checked by `usable`: the buffer
starts 16-byte aligned and holds a whole number of 16-byte words, so that every window is inside
it (`_window3`, `_window2`).

A unit's value, then the row loop of matvec.py:
  1. v_b = (d_b * xd_b) * S_b, with S_b the exact int32 sum over the block's 32 values of
     (q_i - bias) * xq_i (Q8_0: bias 0, q the int8 quant; Q5_0: q = nibble | fifth bit << 4,
     bias 16; Q4_0: the nibble, bias 8; dp4a, with Q5_0 / Q4_0's bias * sum(xq) from
     dp4a(1, xq)), d_b * xd_b one float32 product;
  2. lane sum over the lane's blocks, ascending (32w + l, + 32 parts, ...); 3. warp_sum's tree;
  4. the row's warps in order (matvec.combine_parts); 5. + bias, + residual.
The generic path summed 8-value groups (four float products a block); this order rounds once
a block. The reference is `matvec.matvec_q8_reference` (float64 of the same operands); with
power-of-two scales every step is exact (tests/test_kernels_matvec_qx0.py checks that bit for
bit, and the order itself with realistic scales).

rows = T > 1 (speculative decoding's verify, matvec.py's docstring): a path's weights function
(`_q8_0_weights`, `_q5_0_weights`, `_q4_0_weights`: `RowPath.weights`) loads and lines up a block
once for all rows; each row's value follows from it, so each row is bit for bit the one-row
kernel's result for it.
"""
import numpy as np
from numba import cuda

from ..ptx import byte_perm, dp4a, ld_nc_v4_u32
from ..quant.types import QType, type_size
from . import matvec
from .matvec import RowPath, path_kernels, token_kernels
# the activations as Q4_K's kernel takes them: whole arrays and a row's word / scale offsets
from .matvec_q4k import _u32, _x_one, _x_row

_LOW = np.uint32(0x0F0F0F0F)
_ONES = np.int32(0x01010101)
_FIFTH_BITS = np.uint32(0x10101010)
_SPREAD = np.uint32(0x02040810)       # bit k of a 4-bit value -> bit 4 of byte k (no carries)
UNROLL = 4                             # blocks per lane per step (K = 4096: one step)


@cuda.jit(device=True, inline="always")
def _sel(m):
    """prmt selector joining two words 0 or 2 bytes on (bit 1 of the even byte offset m)."""
    return _u32(0x3210) + _u32(0x2222) * ((_u32(m) >> _u32(1)) & _u32(1))


@cuda.jit(device=True, inline="always")
def _window3(w32, byte_off):
    """The three 16-byte vectors of the aligned window holding the 32 bytes at byte_off (even),
    as 12 uint32, and byte_off's offset m (even, 0..14) in it. The buffer ends on a whole
    vector (`usable`), so only the third can be past its end, and only when m = 0, when the 32
    bytes are all in the first two: its index is clamped to the buffer's last vector."""
    a = (np.int64(byte_off) >> 4) << 2
    w0, w1, w2, w3 = ld_nc_v4_u32(w32, a)
    w4, w5, w6, w7 = ld_nc_v4_u32(w32, a + 4)
    w8, w9, w10, w11 = ld_nc_v4_u32(w32, min(a + 8, np.int64(w32.size) - 4))
    return _u32(byte_off) & _u32(15), w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11


@cuda.jit(device=True, inline="always")
def _window2(w32, byte_off):
    """`_window3` for 16 bytes: two vectors. The second is clamped to the buffer's last: past
    the end only when m = 0, and then the 16 bytes are all in the first."""
    a = (np.int64(byte_off) >> 4) << 2
    w0, w1, w2, w3 = ld_nc_v4_u32(w32, a)
    w4, w5, w6, w7 = ld_nc_v4_u32(w32, min(a + 4, np.int64(w32.size) - 4))
    return _u32(byte_off) & _u32(15), w0, w1, w2, w3, w4, w5, w6, w7


@cuda.jit(device=True, inline="always")
def _lined_up(m, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11):
    """The 8 words starting at the even byte m of the window w0 .. w11: rotated by m / 4 words
    (a select stage by 2 words when m & 8, one by 1 when m & 4), then joined 2 bytes on (one
    prmt a word) when m & 2. A caller that keeps fewer words leaves the rest to dead-code
    elimination (the function is inlined)."""
    two = (m & _u32(8)) != 0
    r0 = w2 if two else w0
    r1 = w3 if two else w1
    r2 = w4 if two else w2
    r3 = w5 if two else w3
    r4 = w6 if two else w4
    r5 = w7 if two else w5
    r6 = w8 if two else w6
    r7 = w9 if two else w7
    r8 = w10 if two else w8
    r9 = w11 if two else w9
    one = (m & _u32(4)) != 0
    s0 = r1 if one else r0
    s1 = r2 if one else r1
    s2 = r3 if one else r2
    s3 = r4 if one else r3
    s4 = r5 if one else r4
    s5 = r6 if one else r5
    s6 = r7 if one else r6
    s7 = r8 if one else r7
    s8 = r9 if one else r8
    sel = _sel(m)
    return (byte_perm(s0, s1, sel), byte_perm(s1, s2, sel), byte_perm(s2, s3, sel),
            byte_perm(s3, s4, sel), byte_perm(s4, s5, sel), byte_perm(s5, s6, sel),
            byte_perm(s6, s7, sel), byte_perm(s7, s8, sel))


@cuda.jit(device=True, inline="always")
def _line_up8(w32, byte_off):
    """The 32 bytes at byte_off (even) as 8 words (`_window3`, `_lined_up`)."""
    m, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11 = _window3(w32, byte_off)
    return _lined_up(m, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11)


@cuda.jit(device=True, inline="always")
def _line_up4(w32, byte_off):
    """The 16 bytes at byte_off (even) as 4 words (`_window2`, `_lined_up`: its first 4 words
    read only the 8 the window holds)."""
    m, w0, w1, w2, w3, w4, w5, w6, w7 = _window2(w32, byte_off)
    z = _u32(0)
    q0, q1, q2, q3, q4, q5, q6, q7 = _lined_up(m, w0, w1, w2, w3, w4, w5, w6, w7, z, z, z, z)
    return q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _fifth_bits(h4):
    """4 bits (h4's low 4) -> bit 4 of each of 4 bytes: the fifth bits of 4 Q5_0 values."""
    return ((h4 & _u32(15)) * _SPREAD) & _FIFTH_BITS


@cuda.jit(device=True, inline="always")
def _dot8(q0, q1, q2, q3, q4, q5, q6, q7, x0, x1, x2, x3, x4, x5, x6, x7):
    """Exact int32 dot of 32 int8 x 32 int8 (eight dp4a, in order)."""
    s = dp4a(np.int32(q0), np.int32(x0), np.int32(0))
    s = dp4a(np.int32(q1), np.int32(x1), s)
    s = dp4a(np.int32(q2), np.int32(x2), s)
    s = dp4a(np.int32(q3), np.int32(x3), s)
    s = dp4a(np.int32(q4), np.int32(x4), s)
    s = dp4a(np.int32(q5), np.int32(x5), s)
    s = dp4a(np.int32(q6), np.int32(x6), s)
    return dp4a(np.int32(q7), np.int32(x7), s)


@cuda.jit(device=True, inline="always")
def _x_block(x, u):
    """Block u's 32 int8 activations (8 words, two 16-byte loads) and its scale xd, of the row
    x = (xq words, xd, word offset of the row, scale offset of the row) (`_x_row`)."""
    xq, xd, ow, os = x
    xw = np.int64(ow) + 8 * np.int64(u)
    a0, a1, a2, a3 = ld_nc_v4_u32(xq, xw)
    a4, a5, a6, a7 = ld_nc_v4_u32(xq, xw + 4)
    return a0, a1, a2, a3, a4, a5, a6, a7, xd[np.int64(os) + u]


# ---------------------------------------------------------------- Q8_0: d | qs[32]

Q8_0_BYTES = type_size(QType.Q8_0)       # 34
Q5_0_BYTES = type_size(QType.Q5_0)       # 22: d | qh (4 bytes) | qs[16]
Q4_0_BYTES = type_size(QType.Q4_0)       # 18: d | qs[16]


@cuda.jit(device=True, inline="always")
def _q8_0_weights(w, base, u):
    w32, w16, wh = w
    o = base + np.int64(u) * Q8_0_BYTES
    q0, q1, q2, q3, q4, q5, q6, q7 = _line_up8(w32, o + 2)
    return np.float32(wh[o >> 1]), q0, q1, q2, q3, q4, q5, q6, q7


@cuda.jit(device=True, inline="always")
def _q8_0_value(w, x, base, u, q):
    d, q0, q1, q2, q3, q4, q5, q6, q7 = q
    a0, a1, a2, a3, a4, a5, a6, a7, xd = _x_block(x, u)
    s = _dot8(q0, q1, q2, q3, q4, q5, q6, q7, a0, a1, a2, a3, a4, a5, a6, a7)
    return (d * xd) * np.float32(s)


# ---------------------------------------------------------------- Q5_0 / Q4_0
# qs byte i holds value i in its low nibble and value 16 + i in its high one; Q5_0's qh bit i is
# value i's fifth bit. Qs word j: values 4j .. 4j + 3 (low) and 16 + 4j .. (high).


@cuda.jit(device=True, inline="always")
def _q5_0_weights(w, base, u):
    w32, w16, wh = w
    o = base + np.int64(u) * Q5_0_BYTES
    q0, q1, q2, q3 = _line_up4(w32, o + 6)
    h = o >> 1
    qh = _u32(w16[h + 1]) | (_u32(w16[h + 2]) << _u32(16))
    return np.float32(wh[h]), qh, q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _q4_0_weights(w, base, u):
    w32, w16, wh = w
    o = base + np.int64(u) * Q4_0_BYTES
    q0, q1, q2, q3 = _line_up4(w32, o + 2)
    return np.float32(wh[o >> 1]), _u32(0), q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _qx_0_sum(qh, q0, q1, q2, q3, a0, a1, a2, a3, a4, a5, a6, a7, bias):
    """sum_i (q_i - bias) xq_i over the block, exact: dp4a of the 5-bit (4-bit: qh = 0) values
    minus bias times dp4a(1, xq)."""
    s = dp4a(np.int32((q0 & _LOW) | _fifth_bits(qh)), np.int32(a0), np.int32(0))
    s = dp4a(np.int32((q1 & _LOW) | _fifth_bits(qh >> _u32(4))), np.int32(a1), s)
    s = dp4a(np.int32((q2 & _LOW) | _fifth_bits(qh >> _u32(8))), np.int32(a2), s)
    s = dp4a(np.int32((q3 & _LOW) | _fifth_bits(qh >> _u32(12))), np.int32(a3), s)
    s = dp4a(np.int32(((q0 >> _u32(4)) & _LOW) | _fifth_bits(qh >> _u32(16))), np.int32(a4), s)
    s = dp4a(np.int32(((q1 >> _u32(4)) & _LOW) | _fifth_bits(qh >> _u32(20))), np.int32(a5), s)
    s = dp4a(np.int32(((q2 >> _u32(4)) & _LOW) | _fifth_bits(qh >> _u32(24))), np.int32(a6), s)
    s = dp4a(np.int32(((q3 >> _u32(4)) & _LOW) | _fifth_bits(qh >> _u32(28))), np.int32(a7), s)
    sx = _dot8(_ONES, _ONES, _ONES, _ONES, _ONES, _ONES, _ONES, _ONES,
               a0, a1, a2, a3, a4, a5, a6, a7)
    return s - np.int32(bias) * sx


def _qx_0_value(bias):
    """The unit value of Q5_0 (bias 16) or Q4_0 (bias 8) from `_q5_0_weights` /
    `_q4_0_weights`' (d, qh, 4 quant words)."""
    @cuda.jit(device=True, inline="always")
    def value(w, x, base, u, q):
        d, qh, q0, q1, q2, q3 = q
        a0, a1, a2, a3, a4, a5, a6, a7, xd = _x_block(x, u)
        return (d * xd) * np.float32(_qx_0_sum(qh, q0, q1, q2, q3, a0, a1, a2, a3, a4, a5, a6,
                                               a7, bias))
    return value


_q5_0_value = _qx_0_value(16)
_q4_0_value = _qx_0_value(8)


# ---------------------------------------------------------------- the paths


@cuda.jit(device=True, inline="always")
def _units(K):
    return K >> 5


def _base_of(ts):
    @cuda.jit(device=True, inline="always")
    def base(row, K):
        return np.int64(row) * ((K >> 5) * ts)
    return base


def _path(name, ts, weights, value):
    return RowPath(name, __name__, UNROLL, _units, _base_of(ts), weights, value, _x_row,
                   lambda K: K >> 5, _x_one)


# w = (w32, w16, wh): the GGUF rows as uint32 words, 2-byte words and f16; x = (xq words, xd)
PATHS = {QType.Q8_0: _path("matvec_q8_q8_0_v4", Q8_0_BYTES, _q8_0_weights, _q8_0_value),
         QType.Q5_0: _path("matvec_q8_q5_0_v4", Q5_0_BYTES, _q5_0_weights, _q5_0_value),
         QType.Q4_0: _path("matvec_q8_q4_0_v4", Q4_0_BYTES, _q4_0_weights, _q4_0_value)}
KERNELS = {qt: path_kernels(p, p.name) for qt, p in PATHS.items()}    # KERNELS[qt](rows, parts)

# module attributes for tests/test_compile_ptx.py (PTX_SIGNATURES): the other builds are the
# same code with other constants
matvec_q8_q8_0_v4 = KERNELS[QType.Q8_0](1, 2)
matvec_q8_q8_0_v4_u1_p1 = KERNELS[QType.Q8_0](1, 1, 896)      # the 0.5B LM head's build
matvec_q8_q5_0_v4_u1_p1 = KERNELS[QType.Q5_0](1, 1, 896)      # its ffn_gate / ffn_up
matvec_q8_q5_0_v4_r4 = KERNELS[QType.Q5_0](4, 2)
matvec_q8_q4_0_v4 = KERNELS[QType.Q4_0](1, 2)
matvec_q8_q8_0_v4_tok = token_kernels(PATHS[QType.Q8_0])(2)

_W = "Tuple((uint32[::1], uint16[::1], float16[::1]))"
_SIG = (f"void({_W}, int32, int32, Tuple((uint32[::1], float32[::1])), float32[::1], "
        "float32[::1], float32[::1], int32, int32, int32)")
PTX_SIGNATURES = {name: [_SIG] for name in (
    "matvec_q8_q8_0_v4", "matvec_q8_q8_0_v4_u1_p1", "matvec_q8_q5_0_v4_u1_p1",
    "matvec_q8_q5_0_v4_r4", "matvec_q8_q4_0_v4")}
PTX_SIGNATURES["matvec_q8_q8_0_v4_tok"] = [
    f"void({_W}, int32[:, ::1], int32, int32, int32, int32, "
    "Tuple((uint32[::1], float32[::1])), int32, float32[::1], int32)"]
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "dp4a.s32.s32", "prmt.b32", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}


def usable(w8) -> bool:
    """Whether these kernels may read the buffer w8 (flat uint8, a device array): it must start
    16-byte aligned and hold whole 16-byte words (`_window3` reads whole aligned vectors). A
    buffer that does not (a view at an odd offset, a short matrix) takes the generic path."""
    if w8.size % 16:
        return False
    ptr = getattr(w8, "device_ctypes_pointer", None)      # (the simulator's arrays have none)
    return ptr is None or ptr.value is None or ptr.value % 16 == 0


def serves(qtype, w8) -> bool:
    """Whether a Q8_0 / Q5_0 / Q4_0 matrix in w8 runs on these kernels: the path is on
    (matvec.QX0_V4), the type is one of `PATHS` and the buffer is `usable`. The one test for
    matvec.launch_matvec_q8 and the MoE token matrices (moe.token_matrix)."""
    return matvec.QX0_V4 and qtype in PATHS and usable(w8)


def weight_args(w8, w16, wh):
    """The kernels' weight tuple from dequant.weight_views' three views."""
    return (w8.view(np.uint32), w16, wh)


def launch(qt, w8, w16, wh, M, K, xq_dev, xd_dev, y_dev, bias, residual, parts, grid, threads,
           stream, rows=1):
    """Called by matvec.launch_matvec_q8 when `serves(qt, w8)` (its checks already done, y and
    residual flat)."""
    xq = xq_dev.reshape(xq_dev.size)[:rows * K].view(np.uint32)
    xd = xd_dev if xd_dev.ndim == 1 else xd_dev.reshape(xd_dev.size)
    kern = KERNELS[qt](rows, parts, K)
    kern[grid, threads, stream](
        weight_args(w8, w16, wh), np.int32(M), np.int32(K), (xq, xd), y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))
