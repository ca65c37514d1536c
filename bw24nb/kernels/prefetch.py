"""L2 prefetch of a kernel's weights before its grid-dependency wait (docs/decisions/0022).

Every @kernel issues griddepcontrol.launch_dependents first (bw24nb/jit.py), so in a decode
graph with programmatic edges the next kernel's blocks are placed on the SMs while this one
still runs, and sit in griddepcontrol.wait until it has completed. A matvec's weights do not
depend on any kernel of the graph, so its `prologue` names the block's weight bytes with one
bulk prefetch before the wait: the DRAM transfer overlaps the kernel before it, and the block's
loads after the wait hit in L2. A prefetch changes no value, so the bits are the same with or
without it ($BW24_PDL=trigger builds without).
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
