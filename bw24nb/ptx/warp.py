"""Warp-level float32 sum: the reduction every warp-per-row kernel ends with.

    warp_sum(v) -> float32
        The sum of `v` over the 32 lanes of the calling warp, returned to every lane. All 32
        lanes of a converged warp must call it together (it is built on ``shfl.sync`` with the
        full mask); a kernel that retires whole warps early (``if row >= M: return`` with one
        row per warp) is fine, a kernel that lets single lanes leave is not.

Summation order (fixed, deterministic, part of the exactness contract of the callers): a
butterfly over lane offsets 16, 8, 4, 2, 1, each step ``v = v + shfl_xor(v, off)``. At every
step lanes l and l ^ off add the same two float32 values (in opposite operand order, and IEEE
addition is commutative bit for bit), so after the five steps every lane holds the same value,
and that value is the shfl_down tree's:

    s_l += s_{l + off} for l < off,  off = 16, 8, 4, 2, 1;  result s_0.

    warp_pair_sum(v) -> float32
        v + the value of lane l ^ 16: lanes l and l + 16 each get the sum of the pair (the same
        bits on both: IEEE addition is commutative). One shfl.sync.bfly + one add.

    warp_sum16(v), warp_sum8(v) -> float32
        The butterfly's last four (three) steps: the sum over each half-warp (quarter-warp),
        to its lanes -- rows of a matvec that take 16 (8) lanes each (kernels/matvec.py).

The GPU version (`warp_sum`) is five ``shfl.sync.bfly.b32`` + five ``add.f32`` -- no shared
memory, no block barrier. Numba's CUDA simulator has no warp shuffles, so `warp_sum_twin` (what
``bw24nb.ptx`` exports under the simulator) meets its warp at a per-(block, warp) rendezvous --
the one ``twins.py`` built for the mma twin, with the same liveness checks turning a partial or
divergent warp into an error instead of a hang -- and the 32nd lane to arrive computes the tree
above in numpy float32, in that exact order.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from bw24nb.ptx import twins

FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True, inline="always")
def warp_sum4(v):
    """GPU: the sum over each quad (lanes 4q .. 4q + 3), to its lanes: the butterfly's last two
    steps, offsets 2, 1 (an MMA fragment's row lives in one quad: kernels/attention_tc.py)."""
    s = np.float32(v)
    s = s + cuda.shfl_xor_sync(FULL_MASK, s, 2)
    return s + cuda.shfl_xor_sync(FULL_MASK, s, 1)


@cuda.jit(device=True, inline="always")
def warp_max4(v):
    """GPU: the largest v over each quad (lanes 4q .. 4q + 3), to its lanes."""
    s = np.float32(v)
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 2))
    return max(s, cuda.shfl_xor_sync(FULL_MASK, s, 1))


@cuda.jit(device=True, inline="always")
def warp_sum8(v):
    """GPU: the sum over each quarter-warp (lanes 8q .. 8q + 7), to its lanes: the butterfly's
    last three steps, offsets 4, 2, 1 (module docstring)."""
    s = np.float32(v)
    s = s + cuda.shfl_xor_sync(FULL_MASK, s, 4)
    s = s + cuda.shfl_xor_sync(FULL_MASK, s, 2)
    return s + cuda.shfl_xor_sync(FULL_MASK, s, 1)


@cuda.jit(device=True, inline="always")
def warp_sum16(v):
    """GPU: the sum over each half-warp (lanes 0-15, 16-31), to its lanes: offset 8, then
    `warp_sum8`'s steps. A half-warp's sum is bit for bit the full `warp_sum` of a warp whose
    other half holds +0.0 (its first step adds +0.0 to values that are never -0.0 where the
    callers use it: lane sums started at +0.0)."""
    s = np.float32(v)
    return warp_sum8(s + cuda.shfl_xor_sync(FULL_MASK, s, 8))


@cuda.jit(device=True, inline="always")
def warp_sum(v):
    """GPU: butterfly over offsets 16, 8, 4, 2, 1 (see the module docstring for the order):
    offset 16, then `warp_sum16`'s steps."""
    s = np.float32(v)
    return warp_sum16(s + cuda.shfl_xor_sync(FULL_MASK, s, 16))


@cuda.jit(device=True, inline="always")
def warp_pair_sum(v):
    """GPU: v + shfl_xor(v, 16) (module docstring)."""
    s = np.float32(v)
    return s + cuda.shfl_xor_sync(FULL_MASK, s, 16)


def _tree_sums(values, width) -> np.ndarray:
    """float32[32] -> the sum of each group of `width` consecutive lanes, in the butterfly's
    (= shfl_down tree's) order: s_l += s_(l + off) for l < off, off = width / 2 .. 1."""
    s = np.array(values, dtype=np.float32).reshape(32 // width, width).copy()
    off = width // 2
    while off:
        s[:, :off] = s[:, :off] + s[:, off:2 * off]     # float32 + float32 -> float32, one rounding
        off //= 2
    return s[:, 0]


def _group_sums_host(width):
    """float32[32] -> each lane's sum over its group of `width` lanes (`_tree_sums`)."""
    return lambda vals: np.repeat(_tree_sums(vals, width), width)


def _pair_sums_host(vals) -> np.ndarray:
    """float32[32] -> each lane's v_l + v_(l ^ 16), one float32 rounding each."""
    vals = np.asarray(vals, np.float32)
    return (vals + vals[np.arange(32) ^ 16]).astype(np.float32)


@cuda.jit(device=True, inline="always")
def warp_max(v):
    """GPU: the largest float32 over the warp's 32 lanes, to every lane (max is exact in any
    order, so only the result matters: no order contract). Same calling rules as warp_sum."""
    s = np.float32(v)
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 16))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 8))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 4))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 2))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 1))
    return s


@cuda.jit(device=True, inline="always")
def warp_max16(v):
    """GPU: the largest float32 over each half-warp (lanes 0-15, 16-31), to its lanes:
    warp_max's last four steps (exact in any order, like warp_max)."""
    s = np.float32(v)
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 8))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 4))
    s = max(s, cuda.shfl_xor_sync(FULL_MASK, s, 2))
    return max(s, cuda.shfl_xor_sync(FULL_MASK, s, 1))


@cuda.jit(device=True, inline="always")
def _max_step(v, n, off):
    for r in range(n):
        v[r] = max(v[r], cuda.shfl_xor_sync(FULL_MASK, v[r], off))


@cuda.jit(device=True, inline="always")
def _sum_step(v, n, off):
    for r in range(n):
        v[r] = v[r] + cuda.shfl_xor_sync(FULL_MASK, v[r], off)


@cuda.jit(device=True, inline="always")
def warp_max_rows(v, n):
    """GPU: v[r] = warp_max(v[r]) for r < n (a local array, n a compile-time constant), the
    rows' butterflies interleaved step by step -- offset 16 for every row, then 8, ... -- so
    that n independent shuffle chains overlap instead of running one after another (decode
    attention's softmax over its query rows, decision 0025). Each row's result is warp_max's."""
    _max_step(v, n, 16)
    _max_step(v, n, 8)
    _max_step(v, n, 4)
    _max_step(v, n, 2)
    _max_step(v, n, 1)


@cuda.jit(device=True, inline="always")
def warp_argmax(v, i):
    """GPU: (v, i) of the lane with the largest float32 v, ties to the smaller int32 i, to
    every lane: a butterfly over offsets 16 .. 1 keeping the better pair. "Largest, then
    smallest index" is a total order on the pairs (for v not NaN), so any tree gives the same
    winner: no order contract (the MoE router's top-k rounds: kernels/moe.py)."""
    for off in (16, 8, 4, 2, 1):
        ov = cuda.shfl_xor_sync(FULL_MASK, v, off)
        oi = cuda.shfl_xor_sync(FULL_MASK, i, off)
        if ov > v or (ov == v and oi < i):
            v = ov
            i = oi
    return v, i


@cuda.jit(device=True, inline="always")
def warp_sum_rows(v, n):
    """GPU: v[r] = warp_sum(v[r]) for r < n, interleaved as `warp_max_rows`: each row's steps
    are warp_sum's (offsets 16, 8, 4, 2, 1, each v + shfl_xor(v, off)), so each row gets
    warp_sum's bits."""
    _sum_step(v, n, 16)
    _sum_step(v, n, 8)
    _sum_step(v, n, 4)
    _sum_step(v, n, 2)
    _sum_step(v, n, 1)


def warp_tree_sum_host(values) -> np.float32:
    """The reference order on the host: float32[32] -> the butterfly's (= shfl_down tree's)
    result. Also what the simulator twin computes for each warp."""
    return np.float32(_tree_sums(values, 32)[0])


def warp_sum_twin(v) -> np.float32:
    """Simulator twin of `warp_sum`: one lane's call; bit-identical to the GPU butterfly."""
    return _meet_warp("sum", warp_tree_sum_host, v)


def warp_pair_sum_twin(v) -> np.float32:
    """Simulator twin of `warp_pair_sum`."""
    return _meet_warp("pair", _pair_sums_host, v)


def warp_sum16_twin(v) -> np.float32:
    """Simulator twin of `warp_sum16`."""
    return _meet_warp("sum16", _group_sums_host(16), v)


def warp_sum4_twin(v) -> np.float32:
    """Simulator twin of `warp_sum4`."""
    return _meet_warp("sum4", _group_sums_host(4), v)


def warp_max4_twin(v) -> np.float32:
    """Simulator twin of `warp_max4`."""
    return _meet_warp("max4", lambda vals: np.repeat(
        np.max(np.asarray(vals, np.float32).reshape(8, 4), axis=1), 4), v)


def warp_sum8_twin(v) -> np.float32:
    """Simulator twin of `warp_sum8`."""
    return _meet_warp("sum8", _group_sums_host(8), v)


@cuda.jit(device=True, inline="always")
def warp_sync():
    """GPU: ``bar.warp.sync`` over the full warp (``cuda.syncwarp``): what the warp's lanes
    wrote to shared memory before it, every lane reads after it. A barrier of 32 lanes, not of
    the block: a kernel whose warps share nothing in a loop needs no block-wide wait there."""
    cuda.syncwarp()


def warp_sync_twin() -> None:
    """Simulator twin of `warp_sync` (numba's simulator has no syncwarp): the warp's 32 lanes
    meet at the rendezvous the sums use, so none passes before all have arrived."""
    _meet_warp("sync", lambda vals: np.float32(0.0), 0.0)


def warp_max_twin(v) -> np.float32:
    """Simulator twin of `warp_max`."""
    return _meet_warp("max", lambda vals: np.float32(np.max(vals)), v)


def warp_argmax_twin(v, i):
    """Simulator twin of `warp_argmax`: the best (v, i) pair of the warp's 32 lanes."""
    thread, ex, lane = twins._current_lane("warp_argmax", host="warp_argmax")

    def best(pairs):
        top = max(float(p[0]) for p in pairs)
        return np.float32(top), np.int32(min(int(p[1]) for p in pairs if float(p[0]) == top))
    return ex.meet(lane, thread, (np.float32(v), np.int32(i)), best, "warp_argmax")


def warp_max16_twin(v) -> np.float32:
    """Simulator twin of `warp_max16`."""
    return _meet_warp("max16", lambda vals: np.repeat(
        np.max(np.asarray(vals, np.float32).reshape(2, 16), axis=1), 16), v)


def warp_max_rows_twin(v, n) -> None:
    """Simulator twin of `warp_max_rows`: warp_max's twin row by row (the same values)."""
    for r in range(n):
        v[r] = warp_max_twin(v[r])


def warp_sum_rows_twin(v, n) -> None:
    """Simulator twin of `warp_sum_rows`: warp_sum's twin row by row (the same bits)."""
    for r in range(n):
        v[r] = warp_sum_twin(v[r])


def _meet_warp(op: str, reduce, v) -> np.float32:
    """This lane's value into its warp's rendezvous (`twins._WarpExchange`); `reduce` maps the
    32 lanes' float32 values to the warp's result (one value, or one a lane)."""
    thread, ex, lane = twins._current_lane(f"warp_{op}", host="warp_tree_sum_host")
    r = ex.meet(lane, thread, np.float32(v),
                lambda vals: reduce(np.array(vals, np.float32)), f"warp_{op}")
    return r[lane] if np.ndim(r) else r
