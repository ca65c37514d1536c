"""NVFP4: 16-value blocks of FP4 E2M1 with an E4M3 block scale, in its two on-disk layouts.

GGUF (llama.cpp's block_nvfp4, type id 40), 36 bytes per 64 values = 4 sub-blocks of 16:
    d[4]:   one UE4M3 scale byte per sub-block (E4M3 bits read unsigned; floats.ue4m3_to_float)
    qs[32]: sub-block s owns qs[8s : 8s + 8]; byte j holds the sub-block's value j in its low
            nibble and value j + 8 in its high nibble
    value = e2m1(code) * ue4m3(d[s])
    There is no per-tensor scale inside the block (see modelopt_nvfp4_to_gguf).

NVIDIA modelopt (HF safetensors, `quant_algo: NVFP4`), for a weight (out, in):
    weight         uint8 (out, in/2): byte j holds value 2j in its low nibble, 2j + 1 in its
                   high nibble (modelopt's NVFP4QTensor packs `q[1::2] << 4 | q[0::2]`; vLLM's
                   and TensorRT-LLM's reference unpackers read it the same way)
    weight_scale   float8_e4m3fn (out, in/16), one per 16 consecutive values
    weight_scale_2 float32 scalar, per tensor
    value = e2m1(code) * weight_scale * weight_scale_2
The FP4 codes are the same E2M1 codes in both, and for every byte a modelopt checkpoint can
hold (positive, non-NaN E4M3) the UE4M3 reading equals the E4M3 reading, so a repack only
moves nibbles and copies scale bytes: lossless.
"""
import numpy as np

from .floats import (fp4_e2m1_table, float_to_fp4_e2m1, float_to_fp8_e4m3, float_to_ue4m3_ggml,
                     fp8_e4m3_to_float, ue4m3_to_float)
from .types import QuantFormatError

QK_NVFP4 = 64
SUB = 16

# ggml's kvalues table has a plain integer 0 for code 8, so code 8 decodes to +0.0 (not the
# -0.0 that the E2M1 bits mean). Both decoders here use it, to be bit-for-bit ggml's.
_E2M1 = fp4_e2m1_table()
_E2M1[8] = 0.0


def _split_sub_blocks(qs: np.ndarray) -> np.ndarray:
    """(..., 8) GGUF sub-block bytes -> (..., 16) codes: low nibbles first, then high."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


# ---------------------------------------------------------------- GGUF block_nvfp4


def dequantize_nvfp4(blocks):
    n = len(blocks)
    d = ue4m3_to_float(blocks[:, 0:4])
    codes = _split_sub_blocks(blocks[:, 4:36].reshape(n, 4, 8))
    return (_E2M1[codes] * d[:, :, None]).reshape(n, QK_NVFP4)


# ggml's doubled E2M1 values (kvalues_mxfp4), searched in this order by best_index_mxfp4
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def quantize_nvfp4(x):
    """llama.cpp's quantize_row_nvfp4_ref: per sub-block, scale byte = ggml_fp32_to_ue4m3(amax/6),
    then each value takes the first code minimising |kvalue * d/2 - x| in float32. No tensor
    scale: large tensors with tiny values lose precision to the UE4M3 subnormal range; for those
    quantize_modelopt_nvfp4 + modelopt_nvfp4_to_gguf (with a separate tensor scale) is better."""
    n = len(x)
    xs = x.reshape(n, 4, SUB).astype(np.float32)
    ue = float_to_ue4m3_ggml(np.abs(xs).max(axis=2) / np.float32(6))
    d_half = (ue4m3_to_float(ue) * np.float32(0.5))[:, :, None, None]
    err = np.abs(_KVALUES * d_half - xs[..., None])          # (n, 4, 16 values, 16 codes)
    codes = err.argmin(axis=-1).astype(np.uint8)
    qs = codes[:, :, :8] | (codes[:, :, 8:] << 4)
    return np.concatenate([ue, qs.reshape(n, 32)], axis=1)


# ---------------------------------------------------------------- modelopt layout


def _check_modelopt_shapes(packed, block_scale):
    packed = np.asarray(packed)
    block_scale = np.asarray(block_scale)
    if packed.dtype != np.uint8 or block_scale.dtype.itemsize != 1:
        raise QuantFormatError(
            f"modelopt NVFP4 wants uint8 packed weights and 1-byte E4M3 scales, got "
            f"{packed.dtype} and {block_scale.dtype}")
    block_scale = block_scale.view(np.uint8)
    k = packed.shape[-1] * 2
    want = packed.shape[:-1] + (k // SUB,)
    if k % SUB or block_scale.shape != want:
        raise QuantFormatError(
            f"modelopt NVFP4: packed weight {packed.shape} holds rows of {k} values, which need "
            f"weight_scale of shape {want} (one per {SUB}); got {block_scale.shape}")
    return packed, block_scale


def _modelopt_codes(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))


def decode_modelopt_nvfp4(packed, block_scale_fp8, tensor_scale) -> np.ndarray:
    """modelopt NVFP4 (weight, weight_scale, weight_scale_2) -> float32 (..., in).

    Computes (e2m1 * block_scale) exactly (a 2-bit by 4-bit significand product), then one
    float32 multiply by the tensor scale. That equals dequantize(modelopt_nvfp4_to_gguf(...),
    NVFP4) * tensor_scale bit for bit. (modelopt's own torch dequantize multiplies
    block_scale * tensor_scale first, which can differ from this in the last bit.)"""
    packed, scale = _check_modelopt_shapes(packed, block_scale_fp8)
    ts = _tensor_scale(tensor_scale)
    codes = _modelopt_codes(packed)
    k = codes.shape[-1]
    values = _E2M1[codes].reshape(codes.shape[:-1] + (k // SUB, SUB))
    v = values * fp8_e4m3_to_float(scale)[..., None]
    return (v * ts).reshape(codes.shape)


def _tensor_scale(tensor_scale) -> np.float32:
    ts = np.asarray(tensor_scale, dtype=np.float32)
    if ts.size != 1 or not np.isfinite(ts).all():
        raise QuantFormatError(
            f"modelopt NVFP4 weight_scale_2 must be one finite float32, got shape {ts.shape}")
    return ts.reshape(())[()]


def quantize_modelopt_nvfp4(x):
    """float32 (..., in) -> (packed uint8 (..., in/2), weight_scale uint8 E4M3 (..., in/16),
    weight_scale_2 float32), following modelopt's NVFP4QTensor recipe (dynamic path):
    tensor scale = amax / (6 * 448); block scale = E4M3(block amax / (6 * tensor scale)), 0 -> 1,
    clamped below at 2^-9; codes = E2M1 round-to-nearest-even of x / (block scale * tensor
    scale). An all-zero tensor gets tensor scale 1 (modelopt would divide by zero)."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % SUB or not np.isfinite(x).all():
        raise QuantFormatError(
            f"modelopt NVFP4 needs finite values in rows of a multiple of {SUB}; "
            f"got shape {x.shape}")
    amax = np.abs(x).max() if x.size else np.float32(0)
    ts = np.float32(amax / np.float32(6.0 * 448.0)) if amax > 0 else np.float32(1.0)
    blocks = x.reshape(x.shape[:-1] + (-1, SUB))
    s = np.abs(blocks).max(axis=-1) / (np.float32(6.0) * ts)
    s = np.maximum(np.where(s == 0, np.float32(1), s), np.float32(2.0 ** -9))
    scale = float_to_fp8_e4m3(s)
    codes = float_to_fp4_e2m1(blocks / (fp8_e4m3_to_float(scale) * ts)[..., None]).reshape(x.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scale, ts


def modelopt_nvfp4_to_gguf(packed, block_scale_fp8) -> np.ndarray:
    """Repack modelopt's (weight, weight_scale) into GGUF NVFP4 rows, uint8 (..., in/64 * 36).

    Lossless: scale bytes are copied verbatim and FP4 codes only move (value 2j, 2j+1 pairs
    become the sub-block's j, j+8 pairs), so dequantize(result, NVFP4) equals
    e2m1 * weight_scale exactly.

    The tensor scale (weight_scale_2) is NOT folded in. GGUF's NVFP4 block has no per-tensor
    scale, and folding it into the E4M3 block scales would re-round every one of them (lossy,
    and it can leave the E4M3 range: scales near 448 times a factor > 1 overflow, tiny ones fall
    into subnormals). It stays a separate float32 that multiplies the matmul output:
    y = (W_gguf @ x) * weight_scale_2. This is what llama.cpp's converter does too (it writes
    weight_scale_2 as an F32 `<name>.scale` tensor and applies it with ggml_mul).

    Needs `in` to be a multiple of 64 (the GGUF block). Scale bytes with the sign bit set or the
    NaN code 0x7F have no equal in GGUF's unsigned reading and raise QuantFormatError (modelopt
    never writes them: its block scales are positive and clamped to [2^-9, 448])."""
    packed, scale = _check_modelopt_shapes(packed, block_scale_fp8)
    k = packed.shape[-1] * 2
    if k % QK_NVFP4:
        raise QuantFormatError(
            f"GGUF NVFP4 blocks hold {QK_NVFP4} values; rows of {k} values cannot be repacked "
            f"(keep this tensor in modelopt layout or pad in_features to a multiple of 64)")
    bad = (scale & 0x80).astype(bool) | (scale == 0x7F)
    if bad.any():
        raise QuantFormatError(
            f"modelopt NVFP4 weight_scale has {int(bad.sum())} negative or NaN E4M3 bytes "
            f"(first 0x{int(scale[bad][0]):02x}); GGUF's unsigned scale cannot hold them")
    lead = packed.shape[:-1]
    codes = _modelopt_codes(packed).reshape(lead + (k // SUB, SUB))
    qs = codes[..., :8] | (codes[..., 8:] << 4)                       # (..., in/16, 8)
    raw = np.concatenate([scale.reshape(lead + (k // QK_NVFP4, 4)),
                          qs.reshape(lead + (k // QK_NVFP4, 32))], axis=-1)
    return raw.reshape(lead + (k // QK_NVFP4 * 36,))


def gguf_nvfp4_to_modelopt(raw, n: int):
    """Inverse of modelopt_nvfp4_to_gguf for rows of `n` values: (packed, weight_scale)."""
    raw = np.asarray(raw, dtype=np.uint8)
    if n % QK_NVFP4 or raw.shape[-1] != n // QK_NVFP4 * 36:
        raise QuantFormatError(
            f"GGUF NVFP4 rows of {n} values are {n // QK_NVFP4 * 36} bytes (n a multiple of "
            f"{QK_NVFP4}); got rows of {raw.shape[-1]} bytes")
    lead = raw.shape[:-1]
    blocks = raw.reshape(lead + (n // QK_NVFP4, 36))
    scale = blocks[..., 0:4].reshape(lead + (n // SUB,))
    if ((scale & 0x80).astype(bool) | (scale == 0x7F)).any():
        raise QuantFormatError("GGUF NVFP4 scale bytes >= 0x7F have no E4M3 equal")
    codes = _split_sub_blocks(blocks[..., 4:36].reshape(lead + (n // SUB, 8))).reshape(lead + (n,))
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, scale.copy()
