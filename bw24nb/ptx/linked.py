"""The same PTX snippets bound as *linked* device functions (``cuda.declare_device(link=...)``).

Inline asm (``asm.py``) is pasted into the caller; a linked ``.func`` is a real PTX ``call``
(arguments through the .param space, no inlining across the link unless LTO is on). These
bindings exist so the two can be timed against each other (``bench/device_smoke.py``) — the
kernels use the inline forms until a measurement says otherwise. Import through ``bw24nb.ptx``.
"""
from __future__ import annotations

from numba import cuda

from bw24nb.ptx.snippets import ptx_path

dp4a_linked = cuda.declare_device(
    "bw24nb_dp4a_s32", "int32(int32, int32, int32)", link=[ptx_path("dp4a.ptx")])

mma_s8_m16n8k32_linked = cuda.declare_device(
    "bw24nb_mma_m16n8k32_s8", "UniTuple(int32, 4)(" + ", ".join(["int32"] * 10) + ")",
    link=[ptx_path("mma_m16n8k32_s8.ptx")])

fp4x2_to_f16x2_bits_linked = cuda.declare_device(
    "bw24nb_fp4x2_to_f16x2_bits", "uint32(uint32)", link=[ptx_path("fp4_decode.ptx")])
