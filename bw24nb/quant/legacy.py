"""The 32-value block quants: Q4_0, Q5_0, Q5_1, Q8_0 (llama.cpp's "legacy" quants).

Every function takes `blocks`, a uint8 array (n_blocks, type_size) for decoders or a float32
array (n_blocks, 32) for encoders, and works on all blocks at once.

Decoders repeat ggml's float32 operation order (`d * q`, `d * q + m`) so results are bit-for-bit
ggml's. Encoders are llama.cpp's reference quantizers (quantize_row_*_ref) step by step in
float32, so the bytes are identical to what llama-quantize writes; that is what lets a GGUF
written by us and one written by llama.cpp be compared byte for byte.
"""
import numpy as np

from .floats import f16_bytes, f16_field

QK = 32


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: byte j's low nibble is value j, its high nibble value j + 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _nibbles_join(q: np.ndarray) -> np.ndarray:
    """Inverse of _nibbles_split (q: (n, 32) of 0..15)."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """qh[4] as a little-endian uint32 whose bit j is the 5th bit (value 16) of value j."""
    return np.unpackbits(qh, axis=1, bitorder="little") << 4


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _max_by_abs(x: np.ndarray) -> np.ndarray:
    """The signed value of largest magnitude per row, first one on ties; +0.0 for an all-zero
    row (the C loop starts from max = 0.0f and only replaces it on a strictly larger |v|)."""
    m = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    return np.where(m == 0, np.float32(0), m)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


# ---------------------------------------------------------------- Q4_0
# block_q4_0, 18 bytes, 32 values:  d: f16 | qs[16]: nibbles (split halves, see _nibbles_split)
# value = d * (q - 8), q in 0..15


def dequantize_q4_0(blocks):
    d = f16_field(blocks, 0)
    q = _nibbles_split(blocks[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def quantize_q4_0(x):
    # d = (value of largest magnitude) / -8, so that value maps to q = 0 exactly
    d = (_max_by_abs(x) / np.float32(-8)).astype(np.float32)
    q = np.minimum(15, np.trunc(x * _inverse(d) + np.float32(8.5)))
    return np.concatenate([f16_bytes(d), _nibbles_join(q)], axis=1)


# ---------------------------------------------------------------- Q5_0
# block_q5_0, 22 bytes, 32 values:  d: f16 | qh[4]: bit j = 5th bit of q_j | qs[16]: low nibbles
# value = d * (q - 16), q in 0..31


def dequantize_q5_0(blocks):
    d = f16_field(blocks, 0)
    q = _nibbles_split(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6])
    return d * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def quantize_q5_0(x):
    d = (_max_by_abs(x) / np.float32(-16)).astype(np.float32)
    q = np.minimum(31, np.trunc(x * _inverse(d) + np.float32(16.5))).astype(np.uint8)
    return np.concatenate([f16_bytes(d), _pack_fifth_bits(q), _nibbles_join(q & 0x0F)], axis=1)


# ---------------------------------------------------------------- Q5_1
# block_q5_1, 24 bytes, 32 values:  d: f16 | m: f16 | qh[4] | qs[16]   (qh, qs as Q5_0)
# value = d * q + m, q in 0..31 (m is the block minimum)


def dequantize_q5_1(blocks):
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = _nibbles_split(blocks[:, 8:24]) | _fifth_bits(blocks[:, 4:8])
    return d * q.astype(np.float32) + m


def quantize_q5_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = ((hi - lo) / np.float32(31)).astype(np.float32)
    q = np.minimum(31, np.trunc((x - lo) * _inverse(d) + np.float32(0.5))).astype(np.uint8)
    return np.concatenate([f16_bytes(d), f16_bytes(lo), _pack_fifth_bits(q),
                           _nibbles_join(q & 0x0F)], axis=1)


# ---------------------------------------------------------------- Q8_0
# block_q8_0, 34 bytes, 32 values:  d: f16 | qs: int8[32]
# value = q * d


def dequantize_q8_0(blocks):
    return blocks[:, 2:34].view(np.int8).astype(np.float32) * f16_field(blocks, 0)


def q8_0_scales_and_values(x):
    """llama.cpp's Q8_0/Q8_1 reference rounding: d = amax / 127 (float32), q = roundf(x * (1/d))
    (half away from zero). Returns (q int8 (n, 32), d float32 (n, 1), unrounded to f16)."""
    d = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    v = (x * _inverse(d)).astype(np.float32)
    # roundf: half away from zero; float64 makes |v| + 0.5 exact, so floor cannot be fooled
    q = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)
    return q.astype(np.int8), d


def quantize_q8_0(x):
    q, d = q8_0_scales_and_values(x)
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1)


# ---------------------------------------------------------------- widening to Q8_0


def widen_to_q8_0(blocks, qtype: str) -> np.ndarray:
    """Q4_0 / Q5_0 / Q8_0 blocks (uint8 (n, type size)) as Q8_0 blocks holding the same values:
    the same f16 d, and each value's q - bias (Q4_0 q - 8 in -8..7, Q5_0 q - 16 in -16..15) as
    Q8_0's int8 quant. Lossless: d * (q - bias) is the very float32 product either way; and
    the decode kernels' per-block sums are the same integers (kernels/matvec_qx0.py)."""
    if qtype == "Q8_0":
        return np.ascontiguousarray(blocks)
    if qtype == "Q5_0":
        q = (_nibbles_split(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6])).astype(np.int16) - 16
    elif qtype == "Q4_0":
        q = _nibbles_split(blocks[:, 2:18]).astype(np.int16) - 8
    else:
        raise ValueError(f"widen_to_q8_0: {qtype} is not a 32-value block type with a bias")
    return np.concatenate([blocks[:, 0:2], q.astype(np.int8).view(np.uint8)], axis=1)
