"""The K-quants: Q4_K, Q5_K, Q6_K (256-value super-blocks with quantized sub-block scales).

Decoders repeat ggml's float32 operation order (`(d * sc) * q - (dmin * m)`), so results are
bit-for-bit ggml's dequantize_row_q*_K.

Encoders are deliberately simple (not llama.cpp's iterative make_qkx/make_qx search): each
sub-block gets the min/max-derived scale, and every quantized scale is rounded *up* (f16
super-scales to the next f16 at or above, 6/8-bit sub-scales by ceil). Rounding up means the
sub-block's range always fits its levels, so no value is clipped and every element's error is at
most half its effective step (d * sc) / 2. The step is at most one `d` above the ideal
(range + dmin) / levels. tests/test_quant.py checks exactly this bound.
"""
import numpy as np

from .floats import f16_bytes, f16_field
from .types import QuantFormatError

QK_K = 256


# ---------------------------------------------------------------- shared helpers

def _unpack_scales_k4(s: np.ndarray):
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4):
    bytes 0..3: sc[0..3] low 6 bits | top 2 bits = sc[4..7] >> 4
    bytes 4..7: m[0..3]  low 6 bits | top 2 bits = m[4..7] >> 4
    bytes 8..11: low nibble = sc[4..7] & 15, high nibble = m[4..7] & 15"""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, mn


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    a = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    b = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    c = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return np.concatenate([a, b, c], axis=1)


def _f16_at_least(v: np.ndarray, qt_name: str) -> np.ndarray:
    """The smallest f16 value >= v (v >= 0, float64), returned as float64."""
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    h = np.where(h.astype(np.float64) < v, np.nextafter(h, np.float16(np.inf)), h)
    if not np.isfinite(h).all():
        raise QuantFormatError(
            f"{qt_name}: values too large for the f16 super-block scale (|x| up to "
            f"{float(np.max(v)):.3g} x levels); keep this tensor in F16/BF16/F32")
    return h.astype(np.float64)


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ceil(a / b), 0 where b == 0 (a is then 0 too)."""
    return np.where(b > 0, np.ceil(a / np.where(b > 0, b, 1.0)), 0.0)


def _affine_params(xs: np.ndarray, levels: int, qt_name: str):
    """Scales for sub-blocks xs (n, 8, 32) of float64 under value = d*sc*q - dmin*m, q in
    0..levels. Returns d, dmin (n, 1) f16 values; sc, m (n, 8) in 0..63; q (n, 8, 32)."""
    lo = np.minimum(xs.min(axis=2), 0.0)   # the offset is subtracted, so it must be <= 0
    hi = xs.max(axis=2)
    dmin = _f16_at_least((-lo).max(axis=1, keepdims=True) / 63, qt_name)
    m = _ceil_div(-lo, dmin)
    dm = dmin * m                            # >= -lo: every x + dm >= 0
    t = (hi + dm) / levels                   # the step that fits [0, hi + dm] into 0..levels
    d = _f16_at_least(t.max(axis=1, keepdims=True) / 63, qt_name)
    sc = _ceil_div(t, d)                     # d * sc >= t: nothing clips
    ds = d * sc
    q = np.where(ds[..., None] > 0,
                 np.rint((xs + dm[..., None]) / np.where(ds > 0, ds, 1.0)[..., None]), 0.0)
    return d, dmin, sc, m, np.clip(q, 0, levels).astype(np.uint8)


def _low_nibbles_k(q: np.ndarray) -> np.ndarray:
    """Sub-blocks (n, 8, 32) -> 128 bytes: byte 32c + l holds sub-block 2c's value l in its low
    nibble and sub-block 2c + 1's in its high nibble."""
    return ((q[:, 0::2, :] & 15) | ((q[:, 1::2, :] & 15) << 4)).reshape(len(q), 128)


def _low_nibbles_k_split(qs: np.ndarray) -> np.ndarray:
    qs = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=2).reshape(len(qs), 8, 32)


# ---------------------------------------------------------------- Q4_K
# block_q4_K, 144 bytes, 256 values = 8 sub-blocks of 32:
#   d: f16 | dmin: f16 | scales[12]: 8 six-bit scales + 8 six-bit mins (_unpack_scales_k4)
#   | qs[128]: nibbles (_low_nibbles_k)
# value = (d * sc_j) * q - (dmin * m_j), q in 0..15


def dequantize_q4_k(blocks):
    n = len(blocks)
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = _unpack_scales_k4(blocks[:, 4:16])
    q = _low_nibbles_k_split(blocks[:, 16:144]).astype(np.float32)
    ds = (d * sc.astype(np.float32))[:, :, None]
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    return (ds * q - dm).reshape(n, QK_K)


def quantize_q4_k(x):
    xs = x.astype(np.float64).reshape(len(x), 8, 32)
    d, dmin, sc, m, q = _affine_params(xs, 15, "Q4_K")
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), _pack_scales_k4(sc, m),
                           _low_nibbles_k(q)], axis=1)


# ---------------------------------------------------------------- Q5_K
# block_q5_K, 176 bytes, 256 values = 8 sub-blocks of 32:
#   d: f16 | dmin: f16 | scales[12] (as Q4_K) | qh[32]: bit j of byte l = 5th bit of
#   sub-block j's value l | qs[128]: low nibbles (as Q4_K)
# value = (d * sc_j) * q - (dmin * m_j), q in 0..31


def dequantize_q5_k(blocks):
    n = len(blocks)
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = _unpack_scales_k4(blocks[:, 4:16])
    qh = blocks[:, 16:48]
    high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
    q = (_low_nibbles_k_split(blocks[:, 48:176]) | high).astype(np.float32)
    ds = (d * sc.astype(np.float32))[:, :, None]
    dm = (dmin * mn.astype(np.float32))[:, :, None]
    return (ds * q - dm).reshape(n, QK_K)


def quantize_q5_k(x):
    xs = x.astype(np.float64).reshape(len(x), 8, 32)
    d, dmin, sc, m, q = _affine_params(xs, 31, "Q5_K")
    qh = (((q >> 4) & 1) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), _pack_scales_k4(sc, m),
                           qh.astype(np.uint8), _low_nibbles_k(q)], axis=1)


# ---------------------------------------------------------------- Q6_K
# block_q6_K, 210 bytes, 256 values = 2 halves of 128 = 16 sub-blocks of 16:
#   ql[128]: half h uses ql[64h : 64h + 64]; value e of the half (0..127) has its low 4 bits in
#            the low nibble of byte e (e < 64) or the high nibble of byte e - 64
#   qh[64]:  half h uses qh[32h : 32h + 32]; value e = 32s + l has its top 2 bits at bits
#            2s..2s+1 of byte l
#   scales: int8[16], one per 16 values | d: f16
# value = (d * sc_j) * (q - 32), q in 0..63


_SHIFTS_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)


def dequantize_q6_k(blocks):
    n = len(blocks)
    ql = blocks[:, 0:128].reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = f16_field(blocks, 208)
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(n, 2, 128)
    high = ((qh >> _SHIFTS_2BIT[None, None, :, None]) & 3).reshape(n, 2, 128)
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    ds = (d * sc)[:, :, None]
    return (ds * q.reshape(n, 16, 16)).reshape(n, QK_K)


def quantize_q6_k(x):
    n = len(x)
    xs = x.astype(np.float64).reshape(n, 16, 16)
    t = np.abs(xs).max(axis=2) / 31                # q - 32 in -32..31: 31 steps cover +-amax
    d = _f16_at_least(t.max(axis=1, keepdims=True) / 127, "Q6_K")
    sc = _ceil_div(t, d)                             # 0..127 fits int8
    ds = d * sc
    q = np.where(ds[..., None] > 0, np.rint(xs / np.where(ds > 0, ds, 1.0)[..., None]), 0.0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)
    ql = (q[:, :, :64] & 15) | ((q[:, :, 64:] & 15) << 4)
    qh = ((q >> 4).reshape(n, 2, 4, 32) << _SHIFTS_2BIT[None, None, :, None]).sum(axis=2)
    return np.concatenate([ql.reshape(n, 128), qh.astype(np.uint8).reshape(n, 64),
                           sc.astype(np.int8).view(np.uint8), f16_bytes(d)], axis=1)
