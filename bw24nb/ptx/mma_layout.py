"""Who holds what in ``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`` (PTX ISA, "Matrix
Fragments for mma.m16n8k32", the .s8/.u8 case).

    D[16, 8] (int32) = A[16, 32] (int8, row-major) @ B[32, 8] (int8, "col": stored n-major) + C

A warp computes one tile; lane ``l`` has ``g = l >> 2`` (groupID, 0..7) and ``t = l & 3``
(threadID_in_group, 0..3). Each 32-bit register packs four int8 with the lowest k in the lowest
byte:

    A (4 regs, 16 int8):  a0 = A[g,     4t:4t+4]        a1 = A[g + 8, 4t:4t+4]
                          a2 = A[g, 16+4t:16+4t+4]      a3 = A[g + 8, 16+4t:16+4t+4]
    B (2 regs, 8 int8):   b0 = B[4t:4t+4, g]            b1 = B[16+4t:16+4t+4, g]
    C, D (4 int32):       c0 = C[g, 2t]   c1 = C[g, 2t+1]   c2 = C[g+8, 2t]   c3 = C[g+8, 2t+1]

So with A stored row-major as uint32 words ``A32 = A.view(uint32)`` (shape 16 x 8) and B stored
transposed, n-major (``Bt = B.T``, the natural layout of a weight matrix ``W[out, in]``) as
``Bt32`` (8 x 8): ``a0 = A32[g, t]``, ``a1 = A32[g+8, t]``, ``a2 = A32[g, 4+t]``,
``a3 = A32[g+8, 4+t]``, ``b0 = Bt32[g, t]``, ``b1 = Bt32[g, 4+t]`` — one aligned 4-byte load each.

The functions below are the numpy statement of that table, used by the Python twin of the
instruction and by tests; kernels index with the formulas directly.
"""
from __future__ import annotations

import numpy as np

M, N, K = 16, 8, 32
WARP = 32


def a_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of A element ``a_i`` (i in 0..15: register i // 4, byte i % 4) of ``lane``."""
    g, t = lane >> 2, lane & 3
    row = g if (i < 4 or 8 <= i < 12) else g + 8
    col = 4 * t + (i & 3) + (16 if i >= 8 else 0)
    return row, col


def b_coords(lane: int, i: int) -> tuple[int, int]:
    """(k, n) of B element ``b_i`` (i in 0..7: register i // 4, byte i % 4) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return 4 * t + (i & 3) + (16 if i >= 4 else 0), g


def c_coords(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of C/D element ``c_i`` (i in 0..3) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return (g if i < 2 else g + 8), 2 * t + (i & 1)


def _index_tables():
    a = np.array([[a_coords(l, i) for i in range(16)] for l in range(WARP)])   # (32, 16, 2)
    b = np.array([[b_coords(l, i) for i in range(8)] for l in range(WARP)])    # (32, 8, 2)
    c = np.array([[c_coords(l, i) for i in range(4)] for l in range(WARP)])    # (32, 4, 2)
    return a, b, c


_A_IDX, _B_IDX, _C_IDX = _index_tables()


def _pack_bytes(vals_i8: np.ndarray) -> np.ndarray:
    """(..., 4n) int8 -> (..., n) uint32, lowest index in the lowest byte."""
    return np.ascontiguousarray(vals_i8.astype(np.int8)).view("<u4")


def _unpack_bytes(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(words).astype(np.uint32)).view(np.int8)


def pack_a(a: np.ndarray) -> np.ndarray:
    """int8[16, 32] -> uint32[32 lanes, 4 registers]."""
    assert a.shape == (M, K)
    return _pack_bytes(a[_A_IDX[..., 0], _A_IDX[..., 1]])


def pack_b(b: np.ndarray) -> np.ndarray:
    """int8[32, 8] (k, n) -> uint32[32 lanes, 2 registers]."""
    assert b.shape == (K, N)
    return _pack_bytes(b[_B_IDX[..., 0], _B_IDX[..., 1]])


def pack_c(c: np.ndarray) -> np.ndarray:
    """int32[16, 8] -> int32[32 lanes, 4 registers]."""
    assert c.shape == (M, N)
    return c.astype(np.int32)[_C_IDX[..., 0], _C_IDX[..., 1]]


def unpack_a(frags: np.ndarray) -> np.ndarray:
    out = np.empty((M, K), np.int8)
    out[_A_IDX[..., 0], _A_IDX[..., 1]] = _unpack_bytes(frags).reshape(WARP, 16)
    return out


def unpack_b(frags: np.ndarray) -> np.ndarray:
    out = np.empty((K, N), np.int8)
    out[_B_IDX[..., 0], _B_IDX[..., 1]] = _unpack_bytes(frags).reshape(WARP, 8)
    return out


def unpack_c(frags: np.ndarray) -> np.ndarray:
    out = np.empty((M, N), np.int32)
    out[_C_IDX[..., 0], _C_IDX[..., 1]] = wrap_int32(np.asarray(frags, dtype=np.int64))
    return out


def mma_tile(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The tile's arithmetic: int32 ``a @ b + c``, exact then wrapped modulo 2^32 (no .satfinite)."""
    return wrap_int32(a.astype(np.int64) @ b.astype(np.int64) + c.astype(np.int64))


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """int64 values -> int32 modulo 2^32 (two's complement), as the hardware's adders do."""
    return (np.asarray(x, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


# --- mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 ----------------------------------------------
#
#     D[16, 8] (f32) = A[16, 16] (f16, row-major) @ B[16, 8] (f16, "col") + C (f32)
#
# Each 32-bit register packs two f16, the lower k index in bits 15:0:
#
#     A (4 regs, 8 f16):  a0 = A[g, 2t:2t+2]      a1 = A[g + 8, 2t:2t+2]
#                         a2 = A[g, 8+2t:8+2t+2]  a3 = A[g + 8, 8+2t:8+2t+2]
#     B (2 regs, 4 f16):  b0 = B[2t:2t+2, g]      b1 = B[8+2t:8+2t+2, g]
#     C, D (4 f32):       as the s8 form (c_coords)
#
# So A stored row-major as f16 pairs (``A.view(uint32)``, 16 x 8 words) gives a0 = A32[g, t],
# a1 = A32[g+8, t], a2 = A32[g, 4+t], a3 = A32[g+8, 4+t]; B stored n-major (``B.T``) likewise
# b0 = Bt32[g, t], b1 = Bt32[g, 4+t]: the s8 form's word indices. And a C / D tile of keys
# 8j..8j+7 is, pair by pair, the A fragment of the next product over those keys (kernels/
# attention_tc.py: P = softmax(S) feeds P V from the registers S was computed in).

K16 = 16


def a_coords_f16(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of A element i (0..7: register i // 2, half i % 2) of ``lane``."""
    g, t = lane >> 2, lane & 3
    reg = i >> 1
    return (g if reg in (0, 2) else g + 8), 2 * t + (i & 1) + (8 if reg >= 2 else 0)


def b_coords_f16(lane: int, i: int) -> tuple[int, int]:
    """(k, n) of B element i (0..3: register i // 2, half i % 2) of ``lane``."""
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


_A16_IDX = np.array([[a_coords_f16(l, i) for i in range(8)] for l in range(WARP)])   # (32, 8, 2)
_B16_IDX = np.array([[b_coords_f16(l, i) for i in range(4)] for l in range(WARP)])   # (32, 4, 2)


def _pack_halves(vals_f16: np.ndarray) -> np.ndarray:
    """(..., 2n) float16 -> (..., n) uint32, the lower index in bits 15:0."""
    return np.ascontiguousarray(vals_f16.astype(np.float16)).view("<u4")


def _unpack_halves(words: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(words).astype(np.uint32)).view(np.float16)


def pack_a_f16(a: np.ndarray) -> np.ndarray:
    """float16[16, 16] -> uint32[32 lanes, 4 registers]."""
    assert a.shape == (M, K16)
    return _pack_halves(a[_A16_IDX[..., 0], _A16_IDX[..., 1]])


def pack_b_f16(b: np.ndarray) -> np.ndarray:
    """float16[16, 8] (k, n) -> uint32[32 lanes, 2 registers]."""
    assert b.shape == (K16, N)
    return _pack_halves(b[_B16_IDX[..., 0], _B16_IDX[..., 1]])


def pack_c_f32(c: np.ndarray) -> np.ndarray:
    """float32[16, 8] -> float32[32 lanes, 4 registers]."""
    assert c.shape == (M, N)
    return c.astype(np.float32)[_C_IDX[..., 0], _C_IDX[..., 1]]


def unpack_a_f16(frags: np.ndarray) -> np.ndarray:
    out = np.empty((M, K16), np.float16)
    out[_A16_IDX[..., 0], _A16_IDX[..., 1]] = _unpack_halves(frags).reshape(WARP, 8)
    return out


def unpack_b_f16(frags: np.ndarray) -> np.ndarray:
    out = np.empty((K16, N), np.float16)
    out[_B16_IDX[..., 0], _B16_IDX[..., 1]] = _unpack_halves(frags).reshape(WARP, 4)
    return out


def unpack_c_f32(frags: np.ndarray) -> np.ndarray:
    out = np.empty((M, N), np.float32)
    out[_C_IDX[..., 0], _C_IDX[..., 1]] = np.asarray(frags, dtype=np.float32)
    return out


def mma_tile_f16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The tile's arithmetic: the f16 products are exact in float64, summed there with C and
    rounded once to float32. The tensor core's own adder order and width are not specified
    (PTX ISA): its result may differ from this in the last bits, so checks against it take a
    tolerance, never bits."""
    return (a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
