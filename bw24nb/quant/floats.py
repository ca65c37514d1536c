"""Small float formats: FP8 E4M3, FP4 E2M1, UE4M3 (GGUF's NVFP4 scale), BF16, and f16 fields.

Decoders are 256- or 16-entry tables built once from the bit layout; kernels use the same
tables (copied to the device) so the CPU and the GPU decode every code identically.
Encoders round to nearest, ties to the even code, by comparing the distances to the two
neighbouring codes in float64. A float32 input minus a code value (<= 4 significant bits) is
exact in float64 whenever the input is near the midpoint, so ties are detected exactly and the
result is the IEEE-style RNE conversion.
"""
import numpy as np

from .types import QuantFormatError

# ---------------------------------------------------------------- FP8 E4M3 (OCP "e4m3fn")
# bit 7 sign | bits 6..3 exponent (bias 7) | bits 2..0 mantissa. No infinities; the only
# NaN codes are S.1111.111 (0x7F, 0xFF); max finite 0x7E = 448. Exponent 0 is subnormal
# (m/8 * 2^-6).


def _build_fp8_e4m3_table() -> np.ndarray:
    c = np.arange(256, dtype=np.uint32)
    sign, exp, man = c >> 7, (c >> 3) & 0xF, c & 0x7
    # a normal E4M3 value is a float32 with exponent re-biased (127 - 7) and mantissa left-aligned
    normal = ((sign << 31) | ((exp + 120) << 23) | (man << 20)).view(np.float32)
    sub = np.where(sign == 1, -1.0, 1.0) * np.ldexp(man.astype(np.float64), -9)
    t = np.where(exp == 0, sub.astype(np.float32), normal)
    t[(exp == 15) & (man == 7)] = np.nan
    return t.astype(np.float32)


_FP8_E4M3 = _build_fp8_e4m3_table()
_FP8_E4M3.flags.writeable = False
FP8_E4M3_MAX = 448.0


def fp8_e4m3_table() -> np.ndarray:
    """float32[256]: the value of every FP8 E4M3 code (NaN for 0x7F and 0xFF)."""
    return _FP8_E4M3.copy()


def fp8_e4m3_to_float(u8) -> np.ndarray:
    """FP8 E4M3 codes (uint8 array) -> float32 values, same shape."""
    return _FP8_E4M3[np.asarray(u8, dtype=np.uint8)]


def _nearest_even_code(a: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """Index of the nearest of `magnitudes` (ascending, non-negative, code i = index i) to each
    |value| in `a` (float64, >= 0), ties to the even index, saturating at the largest."""
    top = len(magnitudes) - 1
    hi = np.minimum(np.searchsorted(magnitudes, a, side="left"), top)  # magnitudes[hi] >= a
    lo = np.maximum(hi - 1, 0)
    d_lo = a - magnitudes[lo]
    d_hi = magnitudes[hi] - a           # negative above the largest magnitude: saturates to hi
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(take_hi, hi, lo).astype(np.uint8)


def _reject_nan(x, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if np.isnan(x).any():
        raise QuantFormatError(f"NaN cannot be encoded as {what}")
    return x


def float_to_fp8_e4m3(x) -> np.ndarray:
    """float -> FP8 E4M3 codes (uint8): round to nearest even, |x| > 448 (and inf) saturate
    to +-448 (0x7E / 0xFE). -0.0 keeps its sign (0x80). NaN raises QuantFormatError."""
    x = _reject_nan(x, "FP8 E4M3")
    mag = _nearest_even_code(np.abs(x).astype(np.float64), _FP8_E4M3[:127].astype(np.float64))
    return mag | (np.signbit(x).astype(np.uint8) << np.uint8(7))


# ---------------------------------------------------------------- FP4 E2M1
# bit 3 sign | bits 2..1 exponent (bias 1) | bit 0 mantissa: 0, .5, 1, 1.5, 2, 3, 4, 6.
# Twice these are the integers {0,1,2,3,4,6,8,12}: llama.cpp's `kvalues_mxfp4`, which lets a
# kernel multiply FP4 codes with int8 activations (dp4a) and fold the 1/2 into the scale.
_FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                      -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
_FP4_E2M1.flags.writeable = False


def fp4_e2m1_table() -> np.ndarray:
    """float32[16]: the value of every FP4 E2M1 code (code 8 is -0.0)."""
    return _FP4_E2M1.copy()


def float_to_fp4_e2m1(x) -> np.ndarray:
    """float -> FP4 E2M1 codes (uint8, 0..15): round to nearest even, saturating at +-6.
    The sign bit is `x < 0`, so small negatives that round to zero give code 8 (-0), as
    modelopt's packer does, and -0.0 gives code 0. NaN raises QuantFormatError."""
    x = _reject_nan(x, "FP4 E2M1")
    mag = _nearest_even_code(np.abs(x).astype(np.float64), _FP4_E2M1[:8].astype(np.float64))
    return mag | ((x < 0).astype(np.uint8) << np.uint8(3))


# ---------------------------------------------------------------- UE4M3 (GGUF NVFP4 scale)
# GGUF's NVFP4 sub-block scale: an E4M3 byte read as unsigned (ggml_ue4m3_to_fp32): bit 7 is
# ignored, exponent 0 is subnormal, and 0x00 and 0x7F (the E4M3 NaN code) both decode to 0.
# Exponent 15 decodes like any other, so 0xFF is 480 and 0xF8..0xFE mirror 0x78..0x7E.
# ggml returns half this value because its FP4 table is doubled; ours is the true value, so
# e2m1 * ue4m3 here equals ggml's kvalue * half-scale exactly (both products are exact).


def _build_ue4m3_table() -> np.ndarray:
    b = np.arange(256)
    exp, man = (b >> 3) & 0xF, (b & 0x7).astype(np.float64)
    # exponent 15 is an ordinary exponent here: 0xFF decodes to 480 (only 0x7F is special)
    t = np.where(exp == 0, np.ldexp(man, -9), np.ldexp(1.0 + man / 8.0, exp - 7))
    t[[0x00, 0x7F]] = 0.0
    return t.astype(np.float32)


_UE4M3 = _build_ue4m3_table()
_UE4M3.flags.writeable = False


def ue4m3_to_float(u8) -> np.ndarray:
    """GGUF NVFP4 scale bytes -> float32 (unsigned E4M3, bit 7 ignored, 0x00/0x7F -> 0,
    0xFF -> 480: ggml_ue4m3_to_fp32 without its factor 1/2)."""
    return _UE4M3[np.asarray(u8, dtype=np.uint8)]


def float_to_ue4m3_ggml(x) -> np.ndarray:
    """float32 -> UE4M3 byte exactly as llama.cpp's ggml_fp32_to_ue4m3 (the NVFP4 reference
    quantizer's scale encoder). Not RNE: it rounds half up on the 4th mantissa bit, x <= 0 or
    NaN -> 0, values with exponent >= 2^8 (x >= 256) saturate to 0x7E (448), and subnormals
    round half up but clamp at code 7 (never carrying into 2^-6)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        pos = x > 0                               # False for NaN too
    x = np.where(pos, np.minimum(x, np.float32(448.0)), np.float32(0.0)).astype(np.float32)
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    man = ((bits >> 20) & 0x7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    exp = np.where(man > 7, exp + 1, exp)
    man = np.where(man > 7, 0, man)
    normal = np.where(exp >= 15, 0x7E, (np.maximum(exp, 0) << 3) | man)
    sub = np.clip(np.trunc(x * np.float32(512.0) + np.float32(0.5)), 0, 7).astype(np.int32)
    orig_exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    out = np.where(orig_exp <= 0, sub, normal)
    return np.where(pos, out, 0).astype(np.uint8)


# ---------------------------------------------------------------- BF16 / F16


def bf16_to_float(u16) -> np.ndarray:
    """BF16 bit patterns (uint16) -> float32: the upper half of the float32 word."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float_to_bf16(x) -> np.ndarray:
    """float32 -> BF16 bit patterns (uint16), as ggml_compute_fp32_to_bf16: round to nearest
    even; NaN stays NaN (quieted: payload truncated, bit 6 of the BF16 mantissa set)."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (n & 0x7FFFFFFF) > 0x7F800000
    rounded = (n + 0x7FFF + ((n >> 16) & 1)) >> 16
    quiet = ((n & 0xFFFF0000) | (64 << 16)) >> 16
    return np.where(is_nan, quiet, rounded).astype(np.uint16)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte `offset` of every block row, as float32 (n_blocks, 1)."""
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view("<f2").astype(np.float32)


def f16_bytes(v) -> np.ndarray:
    """float values -> their f16 (round to nearest even) as 2 little-endian bytes, (n, 2)."""
    return np.asarray(v, dtype=np.float32).astype("<f2").reshape(-1, 1).view(np.uint8)
