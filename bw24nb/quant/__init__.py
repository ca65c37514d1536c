"""CPU reference codecs for every weight format bw24nb reads (see docs/ARCHITECTURE.md).

    QType, block_size(qt), type_size(qt), row_bytes(qt, n)      types.py
    dequantize(raw_u8, qt, shape), quantize(x, qt)              codec.py
    Q4_0 Q5_0 Q5_1 Q8_0                                         legacy.py
    Q4_K Q5_K Q6_K                                              kquants.py
    NVFP4 (GGUF block_nvfp4 and NVIDIA modelopt's layout)       nvfp4.py
    FP8 E4M3, FP4 E2M1, UE4M3, BF16 scalars                     floats.py
    int8 activation blocks for dp4a / mma.s8                    activations.py

Each codec module opens with the byte layout of its blocks; GPU kernels follow those layouts
and are checked against these functions.
"""
from .activations import quantize_activations_q8
from .codec import dequantize, quantize
from .floats import (FP8_E4M3_MAX, float_to_fp4_e2m1, float_to_fp8_e4m3, float_to_ue4m3_ggml,
                     fp4_e2m1_table, fp8_e4m3_table, fp8_e4m3_to_float, ue4m3_to_float)
from .nvfp4 import (decode_modelopt_nvfp4, gguf_nvfp4_to_modelopt, modelopt_nvfp4_to_gguf,
                    quantize_modelopt_nvfp4)
from .types import QType, QuantFormatError, as_qtype, block_size, row_bytes, type_size

__all__ = [
    "QType", "QuantFormatError", "as_qtype", "block_size", "type_size", "row_bytes",
    "dequantize", "quantize", "quantize_activations_q8",
    "fp4_e2m1_table", "fp8_e4m3_table", "fp8_e4m3_to_float", "float_to_fp8_e4m3",
    "float_to_fp4_e2m1", "ue4m3_to_float", "float_to_ue4m3_ggml", "FP8_E4M3_MAX",
    "decode_modelopt_nvfp4", "quantize_modelopt_nvfp4", "modelopt_nvfp4_to_gguf",
    "gguf_nvfp4_to_modelopt",
]
