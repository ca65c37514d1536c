"""L2 prefetch of a contiguous byte range with one instruction (ptx/prefetch_l2_bulk.ptx).

Decode attention's split pass names its K and V rows this way as soon as it knows its range
(docs/decisions/0022). A prefetch changes no value: results are the same with or without it.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ..ptx import prefetch_l2_bulk

_ALIGN = np.int64(16)


@cuda.jit(device=True, inline="always")
def prefetch_bytes(array, b0, b1):
    """Prefetch bytes [b0, b1) of a 1-D C-contiguous array's data into L2: widened to 16-byte
    boundaries (what the instruction takes), cut to the array's whole 16-byte units (its start
    is 16-byte aligned on the device), nothing when empty."""
    lo = np.int64(b0) // _ALIGN * _ALIGN
    hi = min((np.int64(b1) + _ALIGN - 1) // _ALIGN * _ALIGN,
             np.int64(array.size) * array.itemsize // _ALIGN * _ALIGN)
    if hi > lo:
        prefetch_l2_bulk(array, lo, hi - lo)
