"""Embedding lookup from a quantized table: out[T, H] = dequantize(table)[ids[t], :].

The table is a GGUF `token_embd`-style weight, V rows of H values in their blocks (row v at
byte v * row_bytes(qtype, H)). One thread per output value decodes it with dequant.py's
<type>_element, so every type decodes exactly as the codec does (bit-equal to
`dequantize(table)[ids]`). Lookups are a few rows per step; no tiling is needed.

An id outside [0, V) is a caller bug (the tokenizer's ids are always in range); rather than
read out of bounds, the kernel writes NaN for that row so the bug cannot pass silently.

numpy reference: `embedding_reference`.
"""
import math

import numpy as np
from numba import cuda

from ..jit import kernel
from ..quant.types import QType, row_bytes
from .dequant import LAYOUTS, layout, weight_views

THREADS = 128     # values of one row per block; grid.y walks the tokens


def _make_embedding(lay):
    element, qk, ts = lay.element, lay.block, lay.type_size

    def embedding(w8, w16, wh, V, H, ids, out):
        h = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        t = cuda.blockIdx.y
        if h < H:
            v = ids[t]
            if v >= 0 and v < V:
                out[t, h] = element(w8, w16, wh, np.int64(v) * (np.int64(H // qk) * ts), h)
            else:
                out[t, h] = np.float32(math.nan)

    embedding.__name__ = embedding.__qualname__ = f"embedding_{lay.name}"
    return kernel(embedding)


EMBEDDING = {qt: _make_embedding(lay) for qt, lay in LAYOUTS.items()}
for _qt, _k in EMBEDDING.items():
    globals()[f"embedding_{LAYOUTS[_qt].name}"] = _k

_SIG = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, int32[::1], float32[:, ::1])"
PTX_SIGNATURES = {f"embedding_{LAYOUTS[qt].name}": [_SIG] for qt in EMBEDDING}


def launch_embedding(table_dev, qtype, V, H, ids_dev, out_dev, stream=0):
    """out[t, :] = row ids[t] of the V x H table (GGUF blocks, any dtype/shape, C-contiguous).
    ids_dev int32[T]; out_dev float32[T, H]. Reference: `embedding_reference`."""
    lay = layout(qtype)
    need = V * row_bytes(lay.qtype, H)
    if table_dev.size * table_dev.dtype.itemsize != need:
        raise ValueError(f"embedding: a {lay.qtype.name} table of {V} x {H} is {need} bytes; "
                         f"the device buffer holds {table_dev.size * table_dev.dtype.itemsize}")
    if ids_dev.dtype != np.int32 or ids_dev.ndim != 1:
        raise ValueError("embedding: ids must be int32[T]")
    T = ids_dev.shape[0]
    if tuple(out_dev.shape) != (T, H) or out_dev.dtype != np.float32:
        raise ValueError(f"embedding: out must be float32[{T}, {H}]")
    if T == 0:
        return
    w8, w16, wh = weight_views(table_dev)
    grid = ((H + THREADS - 1) // THREADS, T)
    EMBEDDING[lay.qtype][grid, THREADS, stream](w8, w16, wh, np.int32(V), np.int32(H), ids_dev, out_dev)


def embedding_reference(table_raw, qtype, V, H, ids):
    """float32 dequantize(table)[ids] (the kernel is bit-exact to it)."""
    from ..quant import dequantize
    table = dequantize(np.asarray(table_raw).reshape(-1), QType(qtype), (V, H))
    return table[np.asarray(ids)]
