"""bw24nb/ptx/simfast.py: the simulator's block scheduler keeps numba's semantics.

Every kernel test runs through it, so these pin down what a kernel can observe: barriers order
shared-memory writes, a barrier waits only for threads still running, syncthreads_count counts,
an exception names its thread and block and leaves the scheduler usable, blocks of any shape
see their indices, each thread sees itself, and a block that can never finish is an error.
"""
import threading

import numpy as np
import pytest
from numba import cuda

from bw24nb.device import simulator_enabled
from bw24nb.ptx import simfast

pytestmark = pytest.mark.skipif(not simulator_enabled(), reason="numba CUDA simulator only")


def test_it_is_the_simulator_block_manager():
    from numba.cuda.simulator import kernel
    assert kernel.BlockManager is simfast.WaitingBlockManager


@cuda.jit
def _reverse_through_shared(x, y):
    buf = cuda.shared.array(256, np.float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * cuda.blockDim.x
    buf[t] = x[base + t]
    cuda.syncthreads()                   # every write lands before any read
    y[base + t] = buf[cuda.blockDim.x - 1 - t]
    cuda.syncthreads()                   # ... and every read before the next round's write
    buf[t] = 2 * x[base + t]
    cuda.syncthreads()
    y[base + t] += buf[cuda.blockDim.x - 1 - t]


@pytest.mark.parametrize("threads", [32, 96, 256])
def test_barriers_order_shared_memory(rng, threads):
    blocks = 3
    x = rng.standard_normal(blocks * threads).astype(np.float32)
    y = np.full_like(x, np.nan)          # poisoned
    _reverse_through_shared[blocks, threads](x, y)
    want = 3 * x.reshape(blocks, threads)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(y, want)


@cuda.jit
def _early_exit_then_barrier(n_live, mark, out):
    t = cuda.threadIdx.x
    if t >= n_live[0]:
        return                           # these never reach the barrier
    mark[t] = 1
    cuda.syncthreads()                   # waits for the threads still running only
    s = 0
    for i in range(n_live[0]):
        s += mark[i]
    out[t] = 100 + s


def test_a_barrier_waits_only_for_running_threads():
    mark = np.zeros(64, np.int32)
    out = np.zeros(64, np.int32)
    _early_exit_then_barrier[1, 64](np.array([40], np.int32), mark, out)
    assert (out[:40] == 140).all() and (out[40:] == 0).all()


@cuda.jit
def _count(flags, out):
    t = cuda.threadIdx.x
    c = cuda.syncthreads_count(flags[t])
    out[t] = c


def test_syncthreads_count(rng):
    flags = (rng.random(128) < 0.3).astype(np.int32)
    out = np.full(128, -1, np.int32)
    _count[1, 128](flags, out)
    assert (out == flags.sum()).all()


@cuda.jit
def _fail_in_one_thread(bad, out):
    t = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    cuda.syncthreads()
    if t == bad[0]:
        out[10 ** 6] = 1                 # out of bounds: the simulator raises IndexError
    cuda.syncthreads()
    out[t] = t


def test_an_exception_names_its_thread_and_block_and_the_pool_recovers():
    out = np.zeros(128, np.int32)
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[2, 0, 0\]"):
        _fail_in_one_thread[4, 32](np.array([2 * 32 + 5], np.int32), out)
    out[:] = -1
    _fail_in_one_thread[4, 32](np.array([-1], np.int32), out)      # the next launch runs whole
    np.testing.assert_array_equal(out, np.arange(128))


@cuda.jit
def _whoami(out):
    tx, ty, tz = cuda.threadIdx.x, cuda.threadIdx.y, cuda.threadIdx.z
    bx, by = cuda.blockIdx.x, cuda.blockIdx.y
    flat = tx + cuda.blockDim.x * (ty + cuda.blockDim.y * tz)
    out[by, bx, flat, 0] = tx
    out[by, bx, flat, 1] = ty
    out[by, bx, flat, 2] = tz
    out[by, bx, flat, 3] = bx + 10 * by


def test_thread_and_block_indices_of_3d_blocks_on_reused_threads():
    for block in [(4, 3, 2), (8, 1, 1), (2, 2, 2)]:
        n = int(np.prod(block))
        out = np.full((2, 3, n, 4), -1, np.int32)
        _whoami[(3, 2), block](out)
        idx = np.array(list(np.ndindex(*block[::-1])))[:, ::-1]      # x fastest
        for by in range(2):
            for bx in range(3):
                np.testing.assert_array_equal(out[by, bx, :, :3], idx)
                assert (out[by, bx, :, 3] == bx + 10 * by).all()


@cuda.jit
def _whose_thread(out):
    # the simulated thread a kernel's code sees: what the warp twins read (simfast.current_thread)
    me = simfast.current_thread()
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    out[i, 0] = me.thread_id
    cuda.syncthreads()                     # threads switch here: each still sees itself
    out[i, 1] = simfast.current_thread().thread_id
    out[i, 2] = me._manager.threads[me.thread_id].thread_id


def test_each_thread_sees_itself_across_a_barrier():
    out = np.full((2 * 64, 3), -1, np.int32)
    _whose_thread[2, 64](out)
    want = np.tile(np.arange(64), 2)
    for c in range(3):
        np.testing.assert_array_equal(out[:, c], want)
    assert simfast.current_thread() is threading.current_thread()     # host code: the OS thread


@cuda.jit
def _barrier_in_half_the_block(out):
    t = cuda.threadIdx.x
    if t < 32:
        cuda.syncthreads()               # the other warp waits at a different barrier
        out[t] = 1
    else:
        out[t] = 2
        cuda.syncthreads()


def test_threads_at_two_barriers_meet_as_on_the_gpu():
    # bar.sync counts arrivals, not source lines: the two warps release each other
    out = np.zeros(64, np.int32)
    _barrier_in_half_the_block[1, 64](out)
    np.testing.assert_array_equal(out, [1] * 32 + [2] * 32)


def test_a_block_that_cannot_finish_is_reported_not_hung():
    """A warp rendezvous missing a lane that waits in syncthreads: no thread can go on (a GPU
    hangs); the launch raises, naming the lane and where it is, and the next launch runs."""
    from bw24nb.ptx import twins, warp_sum

    @cuda.jit
    def stuck(out):
        t = cuda.threadIdx.x
        if t == 7:
            cuda.syncthreads()
        else:
            out[t] = warp_sum(np.float32(1.0))
            cuda.syncthreads()

    with pytest.raises(twins.WarpCollectiveError, match="lane 7 of warp 0 waits in syncthreads"):
        stuck[1, 32](np.zeros(32, np.float32))
    out = np.zeros(128, np.int32)
    _fail_in_one_thread[4, 32](np.array([-1], np.int32), out)
    np.testing.assert_array_equal(out, np.arange(128))
