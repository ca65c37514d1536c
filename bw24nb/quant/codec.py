"""dequantize / quantize for every QType: shape and byte-count checks, then the per-type codec.

Large tensors are processed in chunks of blocks so that a codec's temporaries (an NVFP4
encoder holds 16 candidates per value) stay a few tens of MB whatever the tensor size.
"""
import numpy as np

from . import kquants, legacy, nvfp4
from .floats import bf16_to_float, float_to_bf16, float_to_fp8_e4m3, fp8_e4m3_to_float
from .types import QType, QuantFormatError, as_qtype, block_size, row_bytes, type_size

# per block type: (decode (n_blocks, type_size) uint8 -> (n_blocks, block) float32,
#                  encode (n_blocks, block) float32 -> (n_blocks, type_size) uint8)
_BLOCK_CODECS = {
    QType.Q4_0: (legacy.dequantize_q4_0, legacy.quantize_q4_0),
    QType.Q5_0: (legacy.dequantize_q5_0, legacy.quantize_q5_0),
    QType.Q5_1: (legacy.dequantize_q5_1, legacy.quantize_q5_1),
    QType.Q8_0: (legacy.dequantize_q8_0, legacy.quantize_q8_0),
    QType.Q4_K: (kquants.dequantize_q4_k, kquants.quantize_q4_k),
    QType.Q5_K: (kquants.dequantize_q5_k, kquants.quantize_q5_k),
    QType.Q6_K: (kquants.dequantize_q6_k, kquants.quantize_q6_k),
    QType.NVFP4: (nvfp4.dequantize_nvfp4, nvfp4.quantize_nvfp4),
}

_CHUNK_VALUES = 1 << 20      # values per codec call


def _as_bytes(raw) -> np.ndarray:
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raise QuantFormatError(f"quantized data must be uint8 bytes, got a {raw.dtype} array")
        return np.ascontiguousarray(raw).reshape(-1)
    return np.frombuffer(raw, dtype=np.uint8)       # bytes, bytearray, memoryview, mmap


def dequantize(raw_u8, qt, shape) -> np.ndarray:
    """Decode `raw_u8` (uint8 array or buffer, exactly the tensor's bytes) holding a tensor of
    `shape` in type `qt` (blocks along the last axis) -> float32 array of `shape`."""
    qt = as_qtype(qt)
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise QuantFormatError("dequantize needs a shape with at least one axis")
    n_rows = int(np.prod(shape[:-1], dtype=np.int64))
    want = n_rows * row_bytes(qt, shape[-1])
    data = _as_bytes(raw_u8)
    if data.size != want:
        raise QuantFormatError(
            f"a {qt.name} tensor of shape {shape} is {want} bytes, got {data.size}; "
            f"the file is truncated or its shape/type fields are wrong")
    if qt == QType.F32:
        return data.view("<f4").astype(np.float32).reshape(shape)
    if qt == QType.F16:
        return data.view("<f2").astype(np.float32).reshape(shape)
    if qt == QType.BF16:
        return bf16_to_float(data.view("<u2")).reshape(shape)
    if qt == QType.FP8_E4M3:
        return fp8_e4m3_to_float(data).reshape(shape)
    decode = _BLOCK_CODECS[qt][0]
    blocks = data.reshape(-1, type_size(qt))
    out = np.empty((len(blocks), block_size(qt)), dtype=np.float32)
    step = max(1, _CHUNK_VALUES // block_size(qt))
    for i in range(0, len(blocks), step):
        out[i:i + step] = decode(blocks[i:i + step])
    return out.reshape(shape)


def quantize(x_f32, qt) -> np.ndarray:
    """Encode float values `x_f32` (..., n) in type `qt` -> uint8 (..., row_bytes(qt, n)).

    Q4_0/Q5_0/Q5_1/Q8_0 and NVFP4 are byte-identical to llama.cpp's reference quantizers;
    BF16 is ggml's round-to-nearest-even; F16 numpy's (RNE); FP8_E4M3 RNE saturating at 448;
    the K-quants use the simple bounded encoder in kquants.py. Block types need finite input."""
    qt = as_qtype(qt)
    x = np.asarray(x_f32, dtype=np.float32)
    if x.ndim == 0:
        raise QuantFormatError("quantize needs an array with at least one axis")
    out_shape = x.shape[:-1] + (row_bytes(qt, x.shape[-1]),)
    if qt == QType.F32:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(out_shape)
    if qt == QType.F16:
        return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(out_shape)
    if qt == QType.BF16:
        return float_to_bf16(x).astype("<u2").view(np.uint8).reshape(out_shape)
    if qt == QType.FP8_E4M3:
        return float_to_fp8_e4m3(x).reshape(out_shape)
    if not np.isfinite(x).all():
        raise QuantFormatError(f"{qt.name} cannot encode NaN or infinity; found some in the input")
    encode = _BLOCK_CODECS[qt][1]
    blocks = x.reshape(-1, block_size(qt))
    out = np.empty((len(blocks), type_size(qt)), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // 16 // block_size(qt))
    for i in range(0, len(blocks), step):
        out[i:i + step] = encode(blocks[i:i + step])
    return out.reshape(out_shape)
