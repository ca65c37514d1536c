"""L2 prefetch of a contiguous byte range with one instruction (ptx/prefetch_l2_bulk.ptx).

Decode attention's split pass names its K and V rows this way as soon as it knows its range
(docs/decisions/0022). `launch_prefetch_l2` is a kernel of its own that names the first bytes
of a weight to L2: the engine runs it on a side branch of the decode graph right after one
matvec, so that the next matvec's first rows stream in while the small launches between the
two leave DRAM idle (engine.PREFETCH_AHEAD_MB, docs/decisions/0042). A prefetch changes no
value: results are the same with or without it.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ..jit import kernel
from ..ptx import prefetch_l2_bulk

_ALIGN = np.int64(16)
# bytes one thread of `prefetch_l2_range` names with one instruction, and its block's threads:
# a 16-MiB range is 1024 instructions on 32 blocks, spread over as many SMs' copy engines
CHUNK = 16384
THREADS = 32


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


@kernel
def prefetch_l2_range(buf, nbytes):
    """Bytes [0, nbytes) of `buf` (1-D, C-contiguous) named to L2, CHUNK bytes a thread."""
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    b0 = np.int64(i) * CHUNK
    if b0 < nbytes:
        prefetch_bytes(buf, b0, min(b0 + CHUNK, np.int64(nbytes)))


def launch_prefetch_l2(buf, nbytes: int, stream=0) -> None:
    """Name the first `nbytes` bytes of device array `buf` (any shape, C-contiguous) to L2;
    nothing when nbytes <= 0. Returns at once: the GPU fetches on its own time."""
    flat = buf.reshape(buf.size)
    nbytes = min(int(nbytes), flat.size * flat.dtype.itemsize)
    if nbytes <= 0:
        return
    per_block = CHUNK * THREADS
    prefetch_l2_range[(nbytes + per_block - 1) // per_block, THREADS, stream](flat, np.int64(nbytes))


PTX_SIGNATURES = {"prefetch_l2_range": ["void(uint8[::1], int64)"]}
EXPECTED_PTX = {"prefetch_l2_range": ["cp.async.bulk.prefetch.L2"]}
