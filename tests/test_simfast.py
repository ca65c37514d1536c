"""bw24nb/ptx/simfast.py: the simulator's block scheduler keeps numba's semantics.

Every kernel test runs through it, so these pin down what a kernel can observe: barriers order
shared-memory writes, a barrier waits only for threads still running, syncthreads_count counts,
an exception names its thread and block and leaves the pool usable, blocks of any shape reuse
the same threads.
"""
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
def _count_stale_block_mates(out):
    # what the warp twins read to tell a lane that left the kernel from one not yet arrived
    import threading
    me = threading.current_thread()
    stale = 0
    for t in me._manager.threads:
        if t.finished:
            stale += 1
    cuda.syncthreads()      # no thread of this block leaves before every thread has counted
    out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = stale


def test_no_thread_sees_a_block_mate_finished_before_it_started(monkeypatch):
    # Pool threads carry `finished` over from their last block. A block's threads are all
    # assigned before any starts, so a running thread never sees a block-mate still marked
    # finished (session 10: a verify's warp_sum raised "lane 18 of warp 3 finished" on a loaded
    # CI machine). A slow assignment loop (the sleep) would expose a thread that started early.
    import time
    with simfast._POOL_LOCK:
        simfast._workers(64)                      # the pool's thread class exists
    cls = simfast._worker_cls
    original = cls.assign

    def slow_assign(self, *a, **k):
        original(self, *a, **k)
        time.sleep(0.002)

    monkeypatch.setattr(cls, "assign", slow_assign)
    out = cuda.to_device(np.full(2 * 64, -1, np.int32))
    _count_stale_block_mates[2, 64](out)          # the pool's threads ran a block before
    np.testing.assert_array_equal(out.copy_to_host(), 0)
