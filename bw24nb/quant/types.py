"""Quantization type ids and their block geometry: the one table every codec and kernel reads.

A quantized row of `n` values is `n / block_size(qt)` blocks of `type_size(qt)` bytes each,
blocks running along the last (contiguous) axis. Ids are GGUF's `GGMLQuantizationType` values
so a GGUF tensor's type field is a `QType` as is; types GGUF lacks get ids >= 1000.
"""
from enum import IntEnum

from ..errors import Bw24Error, UnsupportedTensorType


class QType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30
    NVFP4 = 40          # GGUF's block_nvfp4: 64 values, 4 UE4M3 sub-block scales + 32 nibble bytes
    FP8_E4M3 = 1000     # not a GGUF type: HF safetensors F8_E4M3 tensors, one byte per value


class QuantFormatError(Bw24Error, ValueError):
    """Bytes, shape or values do not fit a quant format (wrong byte count, row length not a
    multiple of the block size, a value the format cannot represent)."""


# (values per block, bytes per block)
_GEOMETRY = {
    QType.F32: (1, 4),
    QType.F16: (1, 2),
    QType.BF16: (1, 2),
    QType.FP8_E4M3: (1, 1),
    QType.Q4_0: (32, 2 + 16),
    QType.Q5_0: (32, 2 + 4 + 16),
    QType.Q5_1: (32, 2 + 2 + 4 + 16),
    QType.Q8_0: (32, 2 + 32),
    QType.Q4_K: (256, 2 + 2 + 12 + 128),
    QType.Q5_K: (256, 2 + 2 + 12 + 32 + 128),
    QType.Q6_K: (256, 128 + 64 + 16 + 2),
    QType.NVFP4: (64, 4 + 32),
}


def as_qtype(qt) -> QType:
    """`qt` (a QType, an int id, or a GGUF GGMLQuantizationType) as a QType, or
    UnsupportedTensorType naming the id."""
    try:
        return QType(int(qt))
    except (ValueError, TypeError):
        name = getattr(qt, "name", None)
        label = f"{name} (id {int(qt)})" if name else repr(qt)
        raise UnsupportedTensorType(
            f"quant type {label} has no codec in bw24nb; supported: "
            + ", ".join(t.name for t in QType)
            + ". Re-quantize the model to one of these (e.g. llama-quantize ... Q4_K_M).") from None


def block_size(qt) -> int:
    """Values per block."""
    return _GEOMETRY[as_qtype(qt)][0]


def type_size(qt) -> int:
    """Bytes per block."""
    return _GEOMETRY[as_qtype(qt)][1]


def row_bytes(qt, n: int) -> int:
    """Bytes of a row of `n` values; `n` must be a whole number of blocks."""
    bs, ts = _GEOMETRY[as_qtype(qt)]
    if n < 0 or n % bs:
        raise QuantFormatError(
            f"a {QType(as_qtype(qt)).name} row holds whole blocks of {bs} values; "
            f"row length {n} is not a multiple of {bs}")
    return n // bs * ts
