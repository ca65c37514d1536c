"""Small kernels that exercise each PTX snippet — one source for the simulator tests, the GPU
check against the twins, the PTX compile check and the device smoke benchmark.

Each kernel is an ordinary ``@cuda.jit`` kernel calling the ``bw24nb.ptx`` device functions, so
under the simulator it runs the twins and on a GPU the real instructions. ``run_*`` functions
launch them on host numpy inputs and return host numpy outputs (outputs poisoned first, so an
unwritten element shows).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from bw24nb.jit import CLUSTER_MAX
from bw24nb.ptx import (
    bar_sync,
    byte_perm,
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
    fp4_e2m1_to_f32,
    fp4x2_to_f16x2,
    fp4x2_to_f16x2_bits_linked,
    fp4x2_to_f32x2,
    ld_nc_v2_f32,
    f32x2_to_f16x2,
    ld_nc_v4_u32,
    mma_f16_m16n8k16,
    mma_s8_m16n8k32,
    mma_s8_m16n8k32_linked,
    st_cluster_f32,
)

WARPS_PER_BLOCK = 2        # the mma probe runs two warps per block to exercise per-warp state
THREADS = 64


def _elementwise3(fn, name):
    """Probe kernel `name`(out, a, b, c): out[i] = fn(a[i], b[i], c[i]) for a device function
    or intrinsic fn of three integers."""
    def kern(out, a, b, c):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(a[i], b[i], c[i])

    kern.__name__ = kern.__qualname__ = name
    return cuda.jit(kern)


dp4a_kernel = _elementwise3(dp4a, "dp4a_kernel")
dp4a_us_kernel = _elementwise3(dp4a_us, "dp4a_us_kernel")
byte_perm_kernel = _elementwise3(byte_perm, "byte_perm_kernel")
dp4a_linked_kernel = _elementwise3(dp4a_linked, "dp4a_linked_kernel")


def _mma_probe(mma, name: str, doc: str):
    """Probe kernel `name`(d, a32, bt32, c): one 16x8 tile per warp, d[t] = A[t] @ B[t] + c[t]
    through `mma` (the s8 or the f16 form: each takes 8 words of an A row a k-step), chained
    over the k-steps."""
    def kern(d, a32, bt32, c):
        lane = cuda.threadIdx.x % 32
        tile = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // 32
        if tile < d.shape[0]:           # warp-uniform: a warp is all in or all out
            g = lane // 4
            t = lane % 4
            d0 = c[tile, g, 2 * t]
            d1 = c[tile, g, 2 * t + 1]
            d2 = c[tile, g + 8, 2 * t]
            d3 = c[tile, g + 8, 2 * t + 1]
            for ks in range(a32.shape[2] // 8):
                w = ks * 8
                d0, d1, d2, d3 = mma(
                    a32[tile, g, w + t], a32[tile, g + 8, w + t],
                    a32[tile, g, w + 4 + t], a32[tile, g + 8, w + 4 + t],
                    bt32[tile, g, w + t], bt32[tile, g, w + 4 + t],
                    d0, d1, d2, d3)
            d[tile, g, 2 * t] = d0
            d[tile, g, 2 * t + 1] = d1
            d[tile, g + 8, 2 * t] = d2
            d[tile, g + 8, 2 * t + 1] = d3

    kern.__name__ = kern.__qualname__ = name
    kern.__doc__ = doc
    return cuda.jit(kern)


mma_kernel = _mma_probe(mma_s8_m16n8k32, "mma_kernel", """d[t] = A[t] @ B[t] + c[t], int8.

    a32[t]: A (16 x 32*ksteps int8, row-major) as uint32 words (16 x 8*ksteps);
    bt32[t]: B transposed (8 x 32*ksteps int8, n-major) as uint32 words (8 x 8*ksteps).
    Fragment indexing: bw24nb/ptx/mma_layout.py.""")
mma_f16_kernel = _mma_probe(mma_f16_m16n8k16, "mma_f16_kernel", """d[t] = A[t] @ B[t] + c[t],
    f16 A / B, float32 C / D.

    a32[t]: A (16 x 16*ksteps f16, row-major) as uint32 words (16 x 8*ksteps); bt32[t]: B
    transposed (8 x 16*ksteps f16) as words (8 x 8*ksteps): the s8 form's word indices.""")


@cuda.jit
def f16_pack_kernel(out, lo, hi):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = f32x2_to_f16x2(lo[i], hi[i])


@cuda.jit
def mma_linked_kernel(d, a32, bt32, c):
    """mma_kernel with K = 32 through the linked .func (one tile per warp)."""
    lane = cuda.threadIdx.x % 32
    tile = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // 32
    if tile < d.shape[0]:
        g = lane // 4
        t = lane % 4
        d0, d1, d2, d3 = mma_s8_m16n8k32_linked(
            a32[tile, g, t], a32[tile, g + 8, t], a32[tile, g, 4 + t], a32[tile, g + 8, 4 + t],
            bt32[tile, g, t], bt32[tile, g, 4 + t],
            c[tile, g, 2 * t], c[tile, g, 2 * t + 1], c[tile, g + 8, 2 * t], c[tile, g + 8, 2 * t + 1])
        d[tile, g, 2 * t] = d0
        d[tile, g, 2 * t + 1] = d1
        d[tile, g + 8, 2 * t] = d2
        d[tile, g + 8, 2 * t + 1] = d3


@cuda.jit
def fp4_kernel(f16x2, f32x2, f32, codes):
    """Per byte i: f16x2[i] packed bits; f32x2[2i], f32x2[2i+1] the pair; f32 the same per nibble."""
    i = cuda.grid(1)
    if i < codes.size:
        x = codes[i]
        f16x2[i] = fp4x2_to_f16x2(x)
        lo, hi = fp4x2_to_f32x2(x)
        f32x2[2 * i] = lo
        f32x2[2 * i + 1] = hi
        f32[2 * i] = fp4_e2m1_to_f32(x)           # the low nibble (the function masks)
        f32[2 * i + 1] = fp4_e2m1_to_f32(x >> 4)


@cuda.jit
def fp4_linked_kernel(f16x2, codes):
    i = cuda.grid(1)
    if i < codes.size:
        f16x2[i] = fp4x2_to_f16x2_bits_linked(codes[i])


@cuda.jit
def ld_nc_v4_kernel(out, src):
    """out[4j:4j+4] = src[4j:4j+4] through one 16-byte load per thread."""
    j = cuda.grid(1)
    if 4 * j + 3 < src.size:
        v0, v1, v2, v3 = ld_nc_v4_u32(src, 4 * j)
        out[4 * j] = v0
        out[4 * j + 1] = v1
        out[4 * j + 2] = v2
        out[4 * j + 3] = v3


@cuda.jit
def cp_async_kernel(out, src):
    """out[256 b + i] = src[256 b + i] through shared memory: each of a block's 32 threads
    starts two 16-byte copies (two groups), waits for the first group, then for all, and after
    a barrier writes what another thread copied (thread l stores thread 31 - l's words)."""
    sh = cuda.shared.array(256, np.uint32)
    tid = cuda.threadIdx.x
    base = cuda.blockIdx.x * 256
    cp_async_16(sh, 4 * tid, src, base + 4 * tid)
    cp_async_commit()
    cp_async_16(sh, 128 + 4 * tid, src, base + 128 + 4 * tid)
    cp_async_commit()
    cp_async_wait_1()
    cp_async_wait_0()
    cuda.syncthreads()
    other = 31 - tid
    for k in range(4):
        out[base + 4 * other + k] = sh[4 * other + k]
        out[base + 128 + 4 * other + k] = sh[128 + 4 * other + k]


@cuda.jit
def ld_nc_v2_kernel(out, src):
    """out[2j:2j+2] = src[2j:2j+2] through one 8-byte load per thread."""
    j = cuda.grid(1)
    if 2 * j + 1 < src.size:
        v0, v1 = ld_nc_v2_f32(src, 2 * j)
        out[2 * j] = v0
        out[2 * j + 1] = v1


# numba signature strings for tests/test_compile_ptx.py, and what each kernel's PTX must contain.
_MMA_SIG = "void(int32[:, :, ::1], uint32[:, :, ::1], uint32[:, :, ::1], int32[:, :, ::1])"
PTX_SIGNATURES = {
    "dp4a_kernel": ["void(int32[::1], int32[::1], int32[::1], int32[::1])"],
    "dp4a_linked_kernel": ["void(int32[::1], int32[::1], int32[::1], int32[::1])"],
    "dp4a_us_kernel": ["void(int32[::1], int32[::1], int32[::1], int32[::1])"],
    "byte_perm_kernel": ["void(uint32[::1], uint32[::1], uint32[::1], uint32[::1])"],
    "mma_kernel": [_MMA_SIG],
    "mma_linked_kernel": [_MMA_SIG],
    "mma_f16_kernel": ["void(float32[:, :, ::1], uint32[:, :, ::1], uint32[:, :, ::1], "
                       "float32[:, :, ::1])"],
    "f16_pack_kernel": ["void(uint32[::1], float32[::1], float32[::1])"],
    "fp4_kernel": ["void(uint32[::1], float32[::1], float32[::1], uint8[::1])"],
    "fp4_linked_kernel": ["void(uint32[::1], uint8[::1])"],
    "ld_nc_v4_kernel": ["void(uint32[::1], uint32[::1])"],
    "ld_nc_v2_kernel": ["void(float32[::1], float32[::1])"],
    "cp_async_kernel": ["void(uint32[::1], uint32[::1])"],
    "cluster_gather_kernel": ["void(float32[::1], int32[::1], float32[::1])"],
    "slot_rotate_kernel": ["void(float32[::1], float32[::1])"],
}
EXPECTED_PTX = {
    "dp4a_kernel": ["dp4a.s32.s32"],
    "dp4a_linked_kernel": ["bw24nb_dp4a_s32"],
    "dp4a_us_kernel": ["dp4a.u32.s32"],
    "byte_perm_kernel": ["prmt.b32"],
    "mma_kernel": ["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"],
    "mma_linked_kernel": ["bw24nb_mma_m16n8k32_s8"],
    "mma_f16_kernel": ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"],
    "f16_pack_kernel": ["cvt.rn.f16x2.f32"],
    "fp4_kernel": ["mul.rn.f16x2", "cvt.f32.f16"],
    "fp4_linked_kernel": ["bw24nb_fp4x2_to_f16x2_bits"],
    "ld_nc_v4_kernel": ["ld.global.nc.v4.u32"],
    "ld_nc_v2_kernel": ["ld.global.nc.v2.f32"],
    "cp_async_kernel": ["cp.async.cg.shared.global", "cp.async.commit_group",
                        "cp.async.wait_group 1", "cp.async.wait_group 0"],
    "cluster_gather_kernel": ["%cluster_ctarank", "%cluster_nctarank",
                              "barrier.cluster.arrive.relaxed.aligned",
                              "barrier.cluster.arrive.release.aligned",
                              "barrier.cluster.wait.acquire.aligned", "mapa.shared::cluster.u32",
                              "st.shared::cluster.f32"],
    "slot_rotate_kernel": ["bar.sync"],
}
# .ptx files a kernel's PTX must be linked with (for assembling it without a GPU).
LINKS = {
    "dp4a_linked_kernel": ["dp4a.ptx"],
    "mma_linked_kernel": ["mma_m16n8k32_s8.ptx"],
    "fp4_linked_kernel": ["fp4_decode.ptx"],
}


# --- host-side runners ----------------------------------------------------------------------------

def _blocks(n: int, threads: int = 128) -> int:
    return max(1, (n + threads - 1) // threads)


def run_dp4a(a, b, c, linked: bool = False) -> np.ndarray:
    return _run_elementwise(dp4a_linked_kernel if linked else dp4a_kernel, np.int32, a, b, c)


def _run_elementwise(kern, dtype, *ins) -> np.ndarray:
    """out[i] = f(ins[0][i], ins[1][i], ...) for one of the elementwise probe kernels, out
    poisoned first."""
    out = cuda.to_device(np.full(ins[0].shape, 0x7F7F7F7F, dtype))
    kern[_blocks(ins[0].size), 128](out, *(cuda.to_device(x) for x in ins))
    return out.copy_to_host()


def run_dp4a_us(a, b, c) -> np.ndarray:
    return _run_elementwise(dp4a_us_kernel, np.int32, a, b, c)


def run_byte_perm(a, b, sel) -> np.ndarray:
    return _run_elementwise(byte_perm_kernel, np.uint32, a, b, sel)


def run_mma(a, b, c, linked: bool = False) -> np.ndarray:
    """a int8[T, 16, K], b int8[T, K, 8], c int32[T, 16, 8] -> d int32[T, 16, 8] (K % 32 == 0)."""
    tiles, _, k = a.shape
    a32 = np.ascontiguousarray(a).view(np.uint32)                             # (T, 16, K/4)
    bt32 = np.ascontiguousarray(b.transpose(0, 2, 1)).view(np.uint32)         # (T, 8, K/4)
    d = cuda.to_device(np.full((tiles, 16, 8), 0x7F7F7F7F, np.int32))
    blocks = (tiles + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK
    if linked:
        assert k == 32, "the linked probe runs a single k-step"
        kern = mma_linked_kernel
    else:
        kern = mma_kernel
    kern[blocks, THREADS](d, cuda.to_device(a32), cuda.to_device(bt32),
                          cuda.to_device(np.ascontiguousarray(c, dtype=np.int32)))
    return d.copy_to_host()


def run_mma_f16(a, b, c) -> np.ndarray:
    """a float16[T, 16, K], b float16[T, K, 8], c float32[T, 16, 8] -> d float32[T, 16, 8]
    (K % 16 == 0)."""
    tiles = a.shape[0]
    a32 = np.ascontiguousarray(a, dtype=np.float16).view(np.uint32)                  # (T, 16, K/2)
    bt32 = np.ascontiguousarray(b.transpose(0, 2, 1), dtype=np.float16).view(np.uint32)
    d = cuda.to_device(np.full((tiles, 16, 8), np.nan, np.float32))
    blocks = (tiles + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK
    mma_f16_kernel[blocks, THREADS](d, cuda.to_device(a32), cuda.to_device(bt32),
                                    cuda.to_device(np.ascontiguousarray(c, dtype=np.float32)))
    return d.copy_to_host()


def run_f16_pack(lo, hi) -> np.ndarray:
    out = cuda.to_device(np.full(lo.size, 0x7F7F7F7F, np.uint32))
    f16_pack_kernel[_blocks(lo.size), 128](out, cuda.to_device(np.asarray(lo, np.float32)),
                                           cuda.to_device(np.asarray(hi, np.float32)))
    return out.copy_to_host()


def run_fp4(codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = codes.size
    f16x2 = cuda.to_device(np.full(n, 0x7F7F7F7F, np.uint32))
    f32x2 = cuda.to_device(np.full(2 * n, np.nan, np.float32))
    f32 = cuda.to_device(np.full(2 * n, np.nan, np.float32))
    fp4_kernel[_blocks(n), 128](f16x2, f32x2, f32, cuda.to_device(codes))
    return f16x2.copy_to_host(), f32x2.copy_to_host(), f32.copy_to_host()


def run_fp4_linked(codes) -> np.ndarray:
    f16x2 = cuda.to_device(np.full(codes.size, 0x7F7F7F7F, np.uint32))
    fp4_linked_kernel[_blocks(codes.size), 128](f16x2, cuda.to_device(codes))
    return f16x2.copy_to_host()


def run_ld_nc_v2(src) -> np.ndarray:
    out = cuda.to_device(np.full(src.size, np.nan, np.float32))
    ld_nc_v2_kernel[_blocks(src.size // 2), 128](out, cuda.to_device(src))
    return out.copy_to_host()


def run_cp_async(src) -> np.ndarray:
    """src (uint32, a multiple of 256 long) copied by `cp_async_kernel`."""
    out = cuda.to_device(np.full(src.size, 0x7F7F7F7F, np.uint32))
    cp_async_kernel[src.size // 256, 32](out, cuda.to_device(src))
    return out.copy_to_host()


def run_ld_nc_v4(src) -> np.ndarray:
    out = cuda.to_device(np.full(src.size, 0x7F7F7F7F, np.uint32))
    ld_nc_v4_kernel[_blocks(src.size // 4), 128](out, cuda.to_device(src))
    return out.copy_to_host()


_GATHER_SLOTS = CLUSTER_MAX * THREADS       # the largest cluster's values


@cuda.jit
def cluster_gather_kernel(out, ranks, vals):
    """Clusters of n blocks of THREADS threads: every block stores its THREADS values into
    rank 0's shared memory (slot rank * THREADS + thread), rank 0 copies the cluster's n *
    THREADS values out after the barrier; every block writes its rank and n. What the one-pass
    attention's cluster build does with its partials (cluster.ptx)."""
    sh = cuda.shared.array(_GATHER_SLOTS, float32)
    t = cuda.threadIdx.x
    r = cluster_rank()
    n = cluster_size()
    cluster_arrive_relaxed()
    b = cuda.blockIdx.x
    v = vals[b * THREADS + t]
    cluster_wait_acquire()                  # every block started
    st_cluster_f32(sh, r * THREADS + t, 0, v)
    cluster_arrive_release()
    cluster_wait_acquire()
    if t == 0:
        ranks[2 * b] = r
        ranks[2 * b + 1] = n
    if r == 0:
        for i in range(t, n * THREADS, THREADS):
            out[b * THREADS + i] = sh[i]


def run_cluster_gather(vals, cluster: int) -> tuple[np.ndarray, np.ndarray]:
    """(out, ranks) of `cluster_gather_kernel` over float32 vals (a multiple of cluster *
    THREADS values, a block per THREADS) in clusters of `cluster` blocks (jit.launch_cluster;
    1: a plain launch, every block its own cluster); out poisoned with NaN, ranks with -1."""
    from bw24nb.jit import launch_cluster
    vals = np.ascontiguousarray(vals, np.float32)
    blocks = vals.size // THREADS
    if vals.size % (cluster * THREADS) or not 1 <= cluster <= CLUSTER_MAX:
        raise ValueError(f"run_cluster_gather: {vals.size} values in clusters of {cluster} "
                         f"blocks of {THREADS}")
    out = cuda.to_device(np.full(vals.size, np.nan, np.float32))
    ranks = cuda.to_device(np.full(2 * blocks, -1, np.int32))
    dv = cuda.to_device(vals)
    if cluster == 1:
        cluster_gather_kernel[blocks, THREADS](out, ranks, dv)
    else:
        launch_cluster(cluster_gather_kernel, (blocks,), THREADS, cluster, 0, out, ranks, dv)
    cuda.synchronize()
    return out.copy_to_host(), ranks.copy_to_host()


SLOTS = 2       # slot_rotate_kernel: slots of THREADS threads a block
_SLOT_VALUES = SLOTS * THREADS


@cuda.jit
def slot_rotate_kernel(out, vals):
    """Blocks of SLOTS slots of THREADS threads, each slot on its own named barrier (slot + 1,
    bar_sync): slot s rotates its THREADS values by one place s + 1 times through shared
    memory, a barrier after each store and after each read -- so the slots pass different
    numbers of barriers, which a block-wide barrier could not pair (bar_sync.ptx)."""
    sh = cuda.shared.array(_SLOT_VALUES, float32)
    tid = cuda.threadIdx.x
    slot = tid // THREADS
    t = tid - slot * THREADS
    base = slot * THREADS
    v = vals[cuda.blockIdx.x * SLOTS * THREADS + tid]
    for _ in range(slot + 1):
        sh[base + t] = v
        bar_sync(slot + 1, THREADS)
        v = sh[base + (t + 1) % THREADS]
        bar_sync(slot + 1, THREADS)
    out[cuda.blockIdx.x * SLOTS * THREADS + tid] = v


def run_slot_rotate(vals) -> np.ndarray:
    """`slot_rotate_kernel` over float32 vals (a multiple of SLOTS * THREADS values, a block
    per SLOTS * THREADS), out poisoned with NaN."""
    vals = np.ascontiguousarray(vals, np.float32)
    n = SLOTS * THREADS
    if vals.size % n:
        raise ValueError(f"run_slot_rotate: {vals.size} values are not whole blocks of {n}")
    out = cuda.to_device(np.full(vals.size, np.nan, np.float32))
    slot_rotate_kernel[vals.size // n, n](out, cuda.to_device(vals))
    cuda.synchronize()
    return out.copy_to_host()


def slot_rotate_reference(vals) -> np.ndarray:
    """What `slot_rotate_kernel` computes: slot s's values rotated left by s + 1 places."""
    v = np.asarray(vals, np.float32).reshape(-1, SLOTS, THREADS)
    return np.stack([np.roll(v[:, s], -(s + 1), axis=1) for s in range(SLOTS)], 1).reshape(-1)
