"""Pure-Python twins of the PTX snippets, with the instructions' exact semantics.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) a kernel is plain Python run by one
Python thread per CUDA thread, and inline PTX does not exist; ``bw24nb.ptx`` then exports these
functions under the same names, so a kernel's source runs unchanged. They are also the oracle the
GPU check compares the real snippets against (``tests/test_ptx.py``, ``bench/device_smoke.py``),
so each is written as an independent statement of the instruction (a table, a matrix product),
not a transcription of the PTX.

Return types mirror the device: numpy int32 / uint32 / float32 scalars, tuples for UniTuples.

The warp-collective instructions (``mma.sync`` in its s8 and f16 forms; warp.py's reductions)
need all 32 lanes' operands. numba's simulator has no warp primitives at all (no shfl_sync),
so the twin builds its own rendezvous: each lane deposits its operands in a per-(block, warp)
exchange and parks (the block's threads are greenlets, ``simfast.py``); the 32nd lane to arrive
computes the tile with numpy and wakes the others, who pick up their D fragments. This needs
the 32 lanes of the warp to reach the call together -- which ``mma.sync.aligned`` demands on the
GPU too -- and a violation (a lane that exits or parks in ``syncthreads`` instead, a partial
warp) is an error naming the lanes instead of a hang.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
from numba.core import types
from numba.np import numpy_support

from bw24nb.ptx import mma_layout, simfast

# --- dp4a ----------------------------------------------------------------------------------------


def _u32(x) -> int:
    return int(x) & 0xFFFFFFFF


def _s8_bytes(word: int) -> list[int]:
    return [((word >> (8 * i)) & 0xFF) - (256 if (word >> (8 * i)) & 0x80 else 0) for i in range(4)]


def _to_i32(x: int) -> np.int32:
    x &= 0xFFFFFFFF
    return np.int32(x - (1 << 32) if x & 0x80000000 else x)


def dp4a(a, b, c) -> np.int32:
    """int32 ``c + sum_i int8(a.byte[i]) * int8(b.byte[i])``, modulo 2^32."""
    return _to_i32(int(c) + sum(x * y for x, y in zip(_s8_bytes(_u32(a)), _s8_bytes(_u32(b)))))


dp4a_linked = dp4a


def dp4a_us(a, b, c) -> np.int32:
    """int32 ``c + sum_i uint8(a.byte[i]) * int8(b.byte[i])``, modulo 2^32."""
    ua = [(_u32(a) >> (8 * i)) & 0xFF for i in range(4)]
    return _to_i32(int(c) + sum(x * y for x, y in zip(ua, _s8_bytes(_u32(b)))))


def byte_perm(a, b, sel) -> np.uint32:
    """``prmt.b32`` default mode: byte i of the result is byte (sel >> 4i) & 7 of {b, a}."""
    src = _u32(a) | (_u32(b) << 32)
    out = 0
    for i in range(4):
        k = (_u32(sel) >> (4 * i)) & 7
        out |= ((src >> (8 * k)) & 0xFF) << (8 * i)
    return np.uint32(out)


# --- FP4 E2M1 ------------------------------------------------------------------------------------

# The OCP MX spec's table: sign bit 3, magnitude index bits 2:0.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
_E2M1_F16_BITS = E2M1_VALUES.astype(np.float16).view(np.uint16).astype(np.uint32)


def fp4_e2m1_to_f32(nibble) -> np.float32:
    """The value of E2M1 code ``nibble & 0xF``."""
    return E2M1_VALUES[int(nibble) & 0xF]


def fp4x2_to_f32x2(byte) -> tuple[np.float32, np.float32]:
    """(value of the low nibble, value of the high nibble) of ``byte & 0xFF``."""
    x = int(byte)
    return E2M1_VALUES[x & 0xF], E2M1_VALUES[(x >> 4) & 0xF]


def fp4x2_to_f16x2(byte) -> np.uint32:
    """Packed f16x2 bits: low nibble's value in bits 15:0, high nibble's in bits 31:16."""
    x = int(byte)
    return np.uint32(_E2M1_F16_BITS[x & 0xF] | (_E2M1_F16_BITS[(x >> 4) & 0xF] << 16))


fp4x2_to_f16x2_bits_linked = fp4x2_to_f16x2


def f16x2_to_f32x2(word) -> tuple[np.float32, np.float32]:
    """(value of the f16 in bits 15:0, value of the f16 in bits 31:16) as float32."""
    h = np.array([_u32(word)], np.uint32).view(np.float16)
    return np.float32(h[0]), np.float32(h[1])


# --- bit casts ----------------------------------------------------------------------------------


def f32_from_bits(bits) -> np.float32:
    """The float32 whose bit pattern is the low 32 bits of ``bits``."""
    return np.array([_u32(bits)], np.uint32).view(np.float32)[0]


def f32_bits(value) -> np.int32:
    """The int32 with float32 ``value``'s bit pattern."""
    return np.array([value], np.float32).view(np.int32)[0]


def fma_f32(a, b, c) -> np.float32:
    """a * b + c rounded to float32: the product is exact in float64 (24 + 24 bits), the sum
    rounds to float64 and then to float32 -- the GPU's single rounding except in rare double
    rounding ties (the simulator's arithmetic is not bit-exact to the GPU's anyway: FMA
    contraction elsewhere is the compiler's choice there)."""
    return np.float32(np.float64(np.float32(a)) * np.float64(np.float32(b))
                      + np.float64(np.float32(c)))


# --- griddepcontrol.wait ---------------------------------------------------------------------


def grid_dependency_wait() -> None:
    """The simulator runs launches one after another: there is never a predecessor to wait
    for."""
    return None


def clock64() -> np.uint64:
    """The simulator has no SM clock: the host's nanosecond counter stands in (increasing, as
    the cycle counter is)."""
    return np.uint64(time.perf_counter_ns())


def global_timer() -> np.uint64:
    """The host's nanosecond counter."""
    return np.uint64(time.perf_counter_ns())


def prefetch_l2_bulk(array, byte_offset, nbytes) -> None:
    """A hint with no effect on results; the twin checks what the instruction demands: a
    16-byte aligned start and length (the array's own start is 16-byte aligned on the device),
    a positive length, and the range inside the array."""
    o, n = int(byte_offset), int(nbytes)
    if o < 0 or o % 16 or n <= 0 or n % 16 or o + n > array.nbytes:
        raise IndexError(f"prefetch_l2_bulk: bytes [{o}, {o + n}) of a {array.nbytes}-byte "
                         f"array: start and length must be positive multiples of 16 inside it")


def prefetch_l2(array, index) -> None:
    """A hint with no effect on results; the twin only checks the index is inside the array."""
    i = int(index)
    if not 0 <= i < len(array):
        raise IndexError(f"prefetch_l2: index {i} out of bounds for length {len(array)}")


# --- thread-block clusters ---------------------------------------------------------------------
# The simulator launches no clusters: every block is a cluster of one (rank 0 of 1), as a block
# launched without a cluster is on the GPU. The barrier's wait then waits for the block's own
# threads: a block barrier (the arrive is the thread's half of it).


def cluster_rank() -> np.int32:
    return np.int32(0)


def cluster_size() -> np.int32:
    return np.int32(1)


def cluster_arrive_relaxed() -> None:
    return None


def cluster_arrive_release() -> None:
    return None


def cluster_wait_acquire() -> None:
    thread = simfast.current_thread()
    if not hasattr(thread, "syncthreads"):
        raise RuntimeError("cluster_wait_acquire's twin runs inside a simulated kernel")
    thread.syncthreads()


def st_cluster_f32(array, index, rank, value) -> None:
    """The store into this block's own shared memory: the only block of its cluster."""
    if int(rank) != 0:
        raise IndexError(f"st_cluster_f32: rank {int(rank)} in a cluster of one block")
    array[index] = np.float32(value)


# --- named barrier ----------------------------------------------------------------------------


class _NamedBarrier:
    """The threads of one simulated block parked in named barrier `barrier` until `threads`
    of them have arrived (``bar.sync barrier, threads``)."""

    def __init__(self, barrier: int, threads: int):
        self.name = f"bar.sync {barrier}, {threads}"
        self.threads = threads
        self.waiting: list = []
        self.arrived = 0        # (simfast's hang report looks for warp rendezvous only)


def bar_sync(barrier, threads) -> None:
    """``bar.sync``: park until `threads` threads of the block have reached barrier `barrier`
    (1 .. 15; the same count from each), then all go on. Other threads -- in syncthreads, in
    other named barriers -- are not counted, as on the GPU."""
    thread = simfast.current_thread()
    manager = getattr(thread, "_manager", None)
    if manager is None:
        raise RuntimeError("bar_sync's twin runs inside a simulated kernel")
    b, n = int(barrier), int(threads)
    nthreads = int(np.prod(manager._block_dim))
    if not 1 <= b <= 15 or n <= 0 or n % 32 or n > nthreads:
        raise ValueError(f"bar_sync({b}, {n}): barrier 1 .. 15 over a multiple of 32 threads "
                         f"<= the block's {nthreads}")
    key = ("bar", b)
    bar = manager.exchanges.get(key)
    if bar is None:
        bar = manager.exchanges[key] = _NamedBarrier(b, n)
    if bar.threads != n:
        raise ValueError(f"bar_sync({b}, {n}) while {len(bar.waiting)} threads wait in "
                         f"{bar.name}: one count a barrier")
    if len(bar.waiting) + 1 < n:
        bar.waiting.append(thread)
        manager.park(thread, bar)
        return None
    waiting, bar.waiting = bar.waiting, []
    manager.wake(waiting)
    return None


# --- cp.async ----------------------------------------------------------------------------------


def cp_async_16(dst, dst_index, src, src_index) -> None:
    """The copy done at once (the simulator's threads see it after their barrier anyway);
    faults like the GPU on a misaligned index or a copy past either array."""
    d = _vector_index("cp_async_16", dst, dst_index, 4)
    s = _vector_index("cp_async_16", src, src_index, 4)
    if dst.dtype.itemsize != 4 or src.dtype.itemsize != 4:
        raise TypeError("cp_async_16: dst and src must hold 4-byte elements")
    dst[d:d + 4] = np.asarray(src[s:s + 4]).view(dst.dtype)


def cp_async_commit() -> None:
    """Copies are done at once in the simulator: nothing to group."""


def cp_async_wait_1() -> None:
    """Nothing is in flight in the simulator."""


def cp_async_wait_0() -> None:
    """Nothing is in flight in the simulator."""


# --- ld.global.nc.v4.u32 -------------------------------------------------------------------------


def _vector_index(name, array, index, n) -> int:
    """index as an int, checked as the GPU would fault: a multiple of n (an n-element vector
    load needs its own alignment) and n elements inside the array."""
    i = int(index)
    if i < 0 or i % n:
        raise ValueError(f"{name}: index {i} is not a non-negative multiple of {n} "
                         f"(a {4 * n}-byte load needs a {4 * n}-byte aligned address)")
    if i + n > len(array):
        raise IndexError(f"{name}: elements {i}..{i + n - 1} out of bounds for length {len(array)}")
    if isinstance(array, np.ndarray) and (array.ctypes.data + i * array.itemsize) % (4 * n):
        raise ValueError(f"{name}: element {i}'s address is not {4 * n}-byte aligned (the "
                         f"array's base is not: a shared array needs alignment={4 * n})")
    return i


def ld_nc_v4_u32(array, index) -> tuple[np.uint32, np.uint32, np.uint32, np.uint32]:
    """``array[index:index + 4]`` as a tuple; faults like the GPU on a misaligned index."""
    i = _vector_index("ld_nc_v4_u32", array, index, 4)
    return (np.uint32(array[i]), np.uint32(array[i + 1]),
            np.uint32(array[i + 2]), np.uint32(array[i + 3]))


def ld_nc_v2_f32(array, index) -> tuple[np.float32, np.float32]:
    """``(array[index], array[index + 1])``; faults like the GPU on an odd index."""
    i = _vector_index("ld_nc_v2_f32", array, index, 2)
    return np.float32(array[i]), np.float32(array[i + 1])



def ld_v4_f32(array, index) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    """``array[index:index + 4]`` as a tuple; faults like the GPU on a misaligned index."""
    i = _vector_index("ld_v4_f32", array, index, 4)
    return (np.float32(array[i]), np.float32(array[i + 1]),
            np.float32(array[i + 2]), np.float32(array[i + 3]))

# --- mma.sync m16n8k32 s8 ------------------------------------------------------------------------


def mma_s8_m16n8k32_warp(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The whole warp at once: fragments a[32, 4], b[32, 2], c[32, 4] -> d int32[32, 4]."""
    a = np.asarray(a, dtype=np.int64) & 0xFFFFFFFF
    b = np.asarray(b, dtype=np.int64) & 0xFFFFFFFF
    tile = mma_layout.mma_tile(mma_layout.unpack_a(a), mma_layout.unpack_b(b),
                               mma_layout.unpack_c(c))
    return mma_layout.pack_c(tile)


class WarpCollectiveError(RuntimeError):
    """A warp-collective twin was reached by a partial or divergent warp (undefined on the GPU)."""


class _WarpExchange:
    """The rendezvous of one warp of one simulated block, for every warp-collective twin (the
    MMAs, warp.py's reductions): each lane deposits its payload and parks
    (``simfast.WaitingBlockManager.park``); the 32nd runs the instruction on all 32 payloads and
    wakes the others. A warp whose lanes never all arrive leaves its block unable to finish,
    which the block scheduler reports (``simfast``: ``_hang_error``) with the missing lanes."""

    def __init__(self, manager, warp: int):
        self.manager = manager
        self.warp = warp
        self.name = ""                         # the instruction the warp is in
        self.payloads: list = [None] * 32      # each lane's operands, until the 32nd arrives
        self.present = np.zeros(32, bool)
        self.arrived = 0                       # lanes present (a counter: cheaper than .all())
        self.waiting: list = []                # the parked lanes' threads

    def meet(self, lane: int, thread, payload, compute, name: str):
        """Deposit this lane's `payload`; the 32nd lane runs compute(payloads of lanes
        0..31), whose result every lane gets back."""
        if self.arrived and name != self.name:
            raise WarpCollectiveError(
                f"warp {self.warp}: lane {lane} entered {name} while others wait in "
                f"{self.name}: the warp diverged")
        if self.present[lane]:
            raise WarpCollectiveError(f"lane {lane} of warp {self.warp} entered {name} twice")
        self.name = name
        self.present[lane] = True
        self.arrived += 1
        self.payloads[lane] = payload
        if self.arrived < 32:
            self.waiting.append(thread)
            self.manager.park(thread, self)
            result, thread.warp_result = thread.warp_result, None
            return result
        result = compute(self.payloads)
        waiting, self.waiting = self.waiting, []
        self.present[:] = False
        self.arrived = 0
        for t in waiting:
            t.warp_result = result
        self.manager.wake(waiting)
        return result

    def mma(self, lane: int, thread, payload, compute, name: str) -> np.ndarray:
        """`meet` for an MMA: compute(payloads) -> D fragments [32, 4]; this lane's row."""
        return self.meet(lane, thread, payload, compute, name)[lane]


def _current_lane(name: str, host: str | None = None):
    """(thread, warp exchange, lane) of the calling simulated CUDA thread, in instruction
    `name`; `host` names what host code calls instead (default ``{name}_warp``)."""
    thread = simfast.current_thread()
    manager = getattr(thread, "_manager", None)
    tid = getattr(thread, "thread_id", None)
    if manager is None or tid is None:
        raise WarpCollectiveError(
            f"{name}'s twin runs inside a simulated kernel (NUMBA_ENABLE_CUDASIM=1); "
            f"from host code use {host or name + '_warp'} on all 32 lanes' values")
    warp = tid // 32
    ex = manager.exchanges.get(warp)
    if ex is None:
        nthreads = int(np.prod(manager._block_dim))
        lanes = min(32, nthreads - 32 * warp)
        if lanes < 32:
            raise WarpCollectiveError(
                f"{name} in a partial warp ({lanes} threads): the block size "
                f"({nthreads}) must be a multiple of 32")
        ex = manager.exchanges[warp] = _WarpExchange(manager, warp)
    return thread, ex, tid % 32


def _s8_tile(payloads) -> np.ndarray:
    a, b, c = (np.array([p[i] for p in payloads], np.int64) for i in range(3))
    return mma_s8_m16n8k32_warp(a, b, c)


def mma_s8_m16n8k32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One lane's view of the warp-collective MMA: its fragments in, its 4 D values out."""
    thread, ex, lane = _current_lane("mma_s8_m16n8k32")
    d = ex.mma(lane, thread, ([_u32(a0), _u32(a1), _u32(a2), _u32(a3)], [_u32(b0), _u32(b1)],
                             [int(c0), int(c1), int(c2), int(c3)]), _s8_tile, "mma_s8_m16n8k32")
    return (np.int32(d[0]), np.int32(d[1]), np.int32(d[2]), np.int32(d[3]))


def mma_f16_m16n8k16_warp(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The whole warp at once: f16x2 fragments a[32, 4], b[32, 2], float32 c[32, 4] -> d
    float32[32, 4] (``mma_layout.mma_tile_f16``'s arithmetic)."""
    tile = mma_layout.mma_tile_f16(mma_layout.unpack_a_f16(a), mma_layout.unpack_b_f16(b),
                                   mma_layout.unpack_c_f32(c))
    return mma_layout.pack_c_f32(tile)


def _f16_tile(payloads) -> np.ndarray:
    a, b = (np.array([p[i] for p in payloads], np.int64) for i in range(2))
    c = np.array([p[2] for p in payloads], np.float32)
    return mma_f16_m16n8k16_warp(a, b, c)


def mma_f16_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One lane's view of the warp-collective f16 MMA: f16x2 words and float32 C in, its 4
    float32 D values out."""
    thread, ex, lane = _current_lane("mma_f16_m16n8k16")
    d = ex.mma(lane, thread, ([_u32(a0), _u32(a1), _u32(a2), _u32(a3)], [_u32(b0), _u32(b1)],
                             [np.float32(c0), np.float32(c1), np.float32(c2), np.float32(c3)]),
               _f16_tile, "mma_f16_m16n8k16")
    return (np.float32(d[0]), np.float32(d[1]), np.float32(d[2]), np.float32(d[3]))


def f32x2_to_f16x2(lo, hi) -> np.uint32:
    """uint32 with float16(lo) (round to nearest even) in bits 15:0, float16(hi) in 31:16."""
    h = np.array([np.float32(lo), np.float32(hi)], np.float32).astype(np.float16)
    return np.uint32(h.view(np.uint32)[0])


mma_s8_m16n8k32_linked = mma_s8_m16n8k32


# --- numba's simulated shared memory, made race-free -----------------------------------------------

_SHARED_LOCK = threading.Lock()


def _shared_array(self, shape, dtype, alignment=None):
    """numba's `FakeCUDAShared.array` with its lookup and insert under one lock.

    numba identifies a block's shared array by the source line that asks for it and creates it
    on the first thread's call: `get`, then `np.empty`, then store. Two threads of a block that
    both pass the `get` before either stores get two different arrays, and their writes never
    meet (a reduction then sums garbage, without an error). With 128-1024 Python threads reaching
    the line at once on a loaded machine this happens; here the lookup and the insert are one
    step. Same keying as numba's (the caller's file and line).

    `alignment` (which numba's simulator refuses) is honoured as the GPU honours it: the array's
    first byte on a multiple of it, so `ld_v4_f32`'s twin faults where the GPU would."""
    if shape == 0:                                     # numba's own path (dynamic)
        return _NUMBA_SHARED_ARRAY(self, shape, dtype, None)
    if alignment is not None and (not isinstance(alignment, int) or alignment <= 0
                                  or alignment & (alignment - 1) or alignment % 8):
        raise ValueError(f"shared array alignment {alignment!r}: needs a power of two, a "
                         f"multiple of 8 (numba's rule on the GPU)")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    f = sys._getframe(1)        # (not traceback.extract_stack: it stats the file every call)
    caller = (f.f_code.co_filename, f.f_lineno)
    with _SHARED_LOCK:
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = _aligned_empty(shape, dtype, alignment or 1)
    return res


def _aligned_empty(shape, dtype, alignment: int) -> np.ndarray:
    """np.empty(shape, dtype) whose data starts on a multiple of `alignment` bytes."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + n].view(dtype).reshape(shape)


_NUMBA_SHARED_ARRAY = None


def install_simulator_fixes() -> None:
    """Patch numba's simulator where it races (`_shared_array`) and where it spins (its block
    scheduler: `simfast.py`); idempotent."""
    global _NUMBA_SHARED_ARRAY
    from numba.cuda.simulator import kernelapi

    from bw24nb.ptx import simfast
    simfast.install()
    if _NUMBA_SHARED_ARRAY is None:
        _NUMBA_SHARED_ARRAY = kernelapi.FakeCUDAShared.array
        kernelapi.FakeCUDAShared.array = _shared_array
