"""Hand-written PTX for the instructions Numba does not emit, usable inside ``@cuda.jit`` kernels.

    from bw24nb.ptx import dp4a, mma_s8_m16n8k32, ld_nc_v4_u32, fp4x2_to_f32x2

    dp4a(a, b, c) -> int32
        c + the dot product of a's and b's four signed bytes (``dp4a.s32.s32``), wrapping.
    dp4a_us(a, b, c) -> int32   the same with a's bytes unsigned (``dp4a.u32.s32``)
    byte_perm(a, b, sel) -> uint32   ``prmt.b32``: four bytes picked from {b, a} by sel's nibbles
    mma_s8_m16n8k32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3) int32
        Warp-collective int8 tensor-core tile D[16x8] = A[16x32] @ B[32x8] + C
        (``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32``). All 32 lanes of a converged warp
        call it together; which lane holds which elements: ``bw24nb/ptx/mma_layout.py``.
    mma_f16_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3) float32
        Warp-collective f16 tensor-core tile D[16x8] = A[16x16] @ B[16x8] + C, float32 C / D
        (``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``); a*, b* are f16x2 words.
    f32x2_to_f16x2(lo, hi) -> uint32   two floats rounded to f16 (``cvt.rn.f16x2.f32``), lo in
        bits 15:0: an A / B register of the f16 MMA
    ld_nc_v4_u32(array_u32, index) -> (uint32, uint32, uint32, uint32)
        ``array[index:index+4]`` in one 16-byte read-only load (``ld.global.nc.v4.u32``).
        ``index`` a multiple of 4; the array not written during the kernel.
    ld_nc_v2_f32(array_f32, index) -> (float32, float32)
        ``array[index:index+2]`` in one 8-byte read-only load; ``index`` even.
    ld_v4_f32(array_f32, index) -> (float32, float32, float32, float32)
        ``array[index:index+4]`` in one 16-byte load of any space (shared: LDS.128); ``index``
        a multiple of 4. A plain LLVM vector load, not a snippet.
    f32_from_bits(i) -> float32
        The float32 with the bit pattern of integer ``i``'s low 32 bits (a bit cast, no
        instruction): e.g. the exact int -> float trick f32_from_bits(0x4B400000 + i) - 1.5 * 2^23
        = i for |i| < 2^22, one add instead of a 16-per-clock cvt (kernels/matmul_q8.py).
    f16x2_to_f32x2(word) -> (float32, float32)   the two halves of a 32-bit word (low, high)
    f32_bits(x) -> int32   the bit pattern of float32 x (a bit cast; f32_from_bits' inverse)
    fma_f32(a, b, c) -> float32   a * b + c rounded once (``fma.rn.f32``): a contraction that is
        not the compiler's choice (sums whose order is part of a contract)
    grid_dependency_wait()
        ``griddepcontrol.wait`` (sm_90+; nothing before): every @kernel runs it first
        (bw24nb/jit.py), so graphs may link kernels with programmatic edges (graph.py).
    cp_async_16(dst_shared, i, src, j)   start the 16-byte copy src[j:j+4] -> dst[i:i+4]
        (``cp.async.cg.shared.global``; 4-byte dtypes, indices multiples of 4); then
    cp_async_commit()   close this thread's group of copies, and
    cp_async_wait_1() / cp_async_wait_0()   wait until at most 1 / 0 of its groups are in
        flight (then a barrier for the block to see them)
    bar_sync(barrier, threads)   ``bar.sync``: named barrier 1 .. 15 over `threads` threads
        (a multiple of 32) -- a barrier over part of a block (bar_sync.ptx)
    cluster_rank() -> int32, cluster_size() -> int32   this block's rank in its thread-block
        cluster and the cluster's blocks (``%cluster_ctarank`` / ``%cluster_nctarank``; 0 and 1
        launched without a cluster, jit.launch_cluster launches with one; sm_90+)
    cluster_arrive_relaxed(), cluster_arrive_release(), cluster_wait_acquire()
        the cluster barrier's steps (``barrier.cluster.*.aligned``; every thread of every block)
    st_cluster_f32(shared_f32, index, rank, value)   the store into the same element of the
        cluster's block `rank`'s shared memory (``mapa`` + ``st.shared::cluster``); when it is
        allowed: cluster.ptx
    prefetch_l2(array, index)   ``prefetch.global.L2`` of the line of ``array[index]`` (a hint)
    prefetch_l2_bulk(array, byte_offset, nbytes)
        ``cp.async.bulk.prefetch.L2.global`` of nbytes bytes of the array's data (sm_90+; a
        hint; offset and length multiples of 16): one instruction for a contiguous range.
    fp4x2_to_f16x2(byte) -> uint32      two FP4 E2M1 codes -> packed f16x2 bits (low nibble low)
    fp4x2_to_f32x2(byte) -> (float32, float32)   (low nibble's value, high nibble's value)
    fp4_e2m1_to_f32(nibble) -> float32           value of code ``nibble & 0xF``
    warp_max(v) -> float32   the largest float32 over the warp's lanes, to every lane
    warp_max_rows(v, n), warp_sum_rows(v, n)   warp_max / warp_sum of v[0 .. n - 1] in place,
        the rows' butterflies interleaved (``warp.py``)
    warp_pair_sum(v) -> float32   v + lane (l ^ 16)'s v (one shfl.sync.bfly; ``warp.py``)
    warp_sum16(v), warp_sum8(v), warp_sum4(v) -> float32   sums over half- / quarter-warps /
        quads (``warp.py``)
    warp_max4(v) -> float32                  the maximum over each quad (``warp.py``)
    warp_max16(v) -> float32                 the maximum over each half-warp (``warp.py``)
    warp_sum(v) -> float32
        Sum of a float32 over the 32 lanes of a converged warp, to every lane (``shfl.sync``
        butterfly over offsets 16..1; its order and its simulator twin: ``warp.py``).

    dp4a_linked, mma_s8_m16n8k32_linked, fp4x2_to_f16x2_bits_linked
        The same snippets as linked ``.func`` calls (``cuda.declare_device(link=...)``), kept
        for timing inline asm against a real call; kernels use the inline forms.

This module is the ONE place that knows about the simulator: with ``NUMBA_ENABLE_CUDASIM=1`` it
exports the pure-Python twins (``twins.py``) under the same names, so kernels never branch.
Which FP4 decode runs (integer bit path, or sm_100a/sm_120a's ``cvt.rn.f16x2.e2m1x2``) is
decided by ``bw24nb.device.current_features().native_fp4_cvt``.

The instruction text lives in the ``.ptx`` files beside this module (``snippets.py`` explains
the ``// @inline`` blocks); ``probes.py`` holds small kernels exercising each snippet.
"""
from bw24nb.device import current_features, simulator_enabled

if simulator_enabled():
    from bw24nb.ptx.twins import (  # noqa: F401
        bar_sync,
        byte_perm,
        clock64,
        cluster_arrive_relaxed,
        cluster_arrive_release,
        cluster_rank,
        cluster_size,
        cluster_wait_acquire,
        cp_async_16,
        cp_async_commit,
        cp_async_wait_0,
        cp_async_wait_1,
        dp4a,
        dp4a_linked,
        dp4a_us,
        f16x2_to_f32x2,
        f32_bits,
        f32_from_bits,
        fma_f32,
        fp4_e2m1_to_f32,
        fp4x2_to_f16x2,
        fp4x2_to_f16x2_bits_linked,
        fp4x2_to_f32x2,
        global_timer,
        grid_dependency_wait,
        ld_nc_v2_f32,
        ld_nc_v4_u32,
        ld_v4_f32,
        f32x2_to_f16x2,
        mma_f16_m16n8k16,
        mma_s8_m16n8k32,
        mma_s8_m16n8k32_linked,
        prefetch_l2,
        prefetch_l2_bulk,
        st_cluster_f32,
    )
    from bw24nb.ptx.twins import install_simulator_fixes
    from bw24nb.ptx.warp import warp_argmax_twin as warp_argmax  # noqa: F401
    from bw24nb.ptx.warp import warp_max_twin as warp_max  # noqa: F401
    from bw24nb.ptx.warp import warp_max16_twin as warp_max16  # noqa: F401
    from bw24nb.ptx.warp import warp_max_rows_twin as warp_max_rows  # noqa: F401
    from bw24nb.ptx.warp import warp_sum_rows_twin as warp_sum_rows  # noqa: F401
    from bw24nb.ptx.warp import warp_pair_sum_twin as warp_pair_sum  # noqa: F401
    from bw24nb.ptx.warp import warp_sum_twin as warp_sum  # noqa: F401
    from bw24nb.ptx.warp import warp_sum16_twin as warp_sum16  # noqa: F401
    from bw24nb.ptx.warp import warp_sum8_twin as warp_sum8  # noqa: F401
    from bw24nb.ptx.warp import warp_sum4_twin as warp_sum4  # noqa: F401
    from bw24nb.ptx.warp import warp_max4_twin as warp_max4  # noqa: F401
    from bw24nb.ptx.warp import warp_sync_twin as warp_sync  # noqa: F401

    install_simulator_fixes()       # numba's shared arrays, allocated without a race
else:
    from bw24nb.ptx.asm import (  # noqa: F401
        FP4_BITS,
        FP4_CVT,
        bar_sync,
        byte_perm,
        clock64,
        cluster_arrive_relaxed,
        cluster_arrive_release,
        cluster_rank,
        cluster_size,
        cluster_wait_acquire,
        cp_async_16,
        cp_async_commit,
        cp_async_wait_0,
        cp_async_wait_1,
        dp4a,
        dp4a_us,
        f16x2_to_f32x2,
        f32_bits,
        f32_from_bits,
        fma_f32,
        global_timer,
        grid_dependency_wait,
        ld_nc_v2_f32,
        ld_nc_v4_u32,
        ld_v4_f32,
        f32x2_to_f16x2,
        mma_f16_m16n8k16,
        mma_s8_m16n8k32,
        prefetch_l2,
        prefetch_l2_bulk,
        st_cluster_f32,
    )
    from bw24nb.ptx.linked import (  # noqa: F401
        dp4a_linked,
        fp4x2_to_f16x2_bits_linked,
        mma_s8_m16n8k32_linked,
    )
    from bw24nb.ptx.warp import (  # noqa: F401
        warp_argmax, warp_max, warp_max4, warp_max16, warp_max_rows, warp_pair_sum, warp_sum, warp_sum4,
        warp_sum8, warp_sum16, warp_sum_rows, warp_sync)

    fp4x2_to_f16x2, fp4x2_to_f32x2, fp4_e2m1_to_f32 = (
        FP4_CVT if current_features().native_fp4_cvt else FP4_BITS)

__all__ = [
    "dp4a", "dp4a_us", "byte_perm", "mma_s8_m16n8k32", "mma_f16_m16n8k16", "f32x2_to_f16x2",
    "ld_nc_v4_u32", "ld_nc_v2_f32", "ld_v4_f32",
    "warp_sum",
    "warp_max", "warp_argmax", "f32_from_bits", "f32_bits", "fma_f32",
    "f16x2_to_f32x2", "grid_dependency_wait", "prefetch_l2", "prefetch_l2_bulk", "warp_pair_sum",
    "warp_sync", "clock64", "global_timer",
    "cp_async_16", "cp_async_commit", "cp_async_wait_1", "cp_async_wait_0",
    "cluster_rank", "cluster_size", "cluster_arrive_relaxed", "cluster_arrive_release",
    "cluster_wait_acquire", "st_cluster_f32", "bar_sync",
    "warp_sum16", "warp_sum8", "warp_sum4", "warp_max16", "warp_max4", "warp_max_rows", "warp_sum_rows",
    "fp4x2_to_f16x2", "fp4x2_to_f32x2", "fp4_e2m1_to_f32",
    "dp4a_linked", "mma_s8_m16n8k32_linked", "fp4x2_to_f16x2_bits_linked",
]
