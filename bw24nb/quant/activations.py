"""Per-block int8 quantization of activations, the x side of an int8 (dp4a / mma.s8) matvec.

Rounding is llama.cpp's CPU reference for activations (quantize_row_q8_0_ref and
quantize_row_q8_1_ref, which round identically): per 32 values d = amax / 127 in float32,
q = roundf(x * (1.0f / d)), half away from zero; d = 0 gives q = 0. The GPU kernel that
quantizes activations must do the same: multiply by the float32 reciprocal, not divide by d
(llama.cpp's CUDA quantize_q8_1 divides, which can flip a q at a .5 boundary).

d is returned unrounded in float32. Rounding it to f16 and prepending it gives exactly
llama.cpp's block_q8_0 (= quantize(x, QType.Q8_0)); our kernels keep the float32 d.
"""
import numpy as np

from .legacy import QK, q8_0_scales_and_values
from .types import QuantFormatError


def quantize_activations_q8(x):
    """float32 (..., n), n a multiple of 32 -> (q int8 (..., n), d float32 (..., n // 32)),
    with x ~= q * d per 32-value block and |x - q * d| <= d / 2."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK or not np.isfinite(x).all():
        raise QuantFormatError(
            f"activation quantization needs finite rows of a multiple of {QK} values; "
            f"got shape {x.shape}")
    q, d = q8_0_scales_and_values(x.reshape(-1, QK))
    return q.reshape(x.shape), d.reshape(x.shape[:-1] + (x.shape[-1] // QK,))
