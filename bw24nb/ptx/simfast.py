"""numba's CUDA simulator without its three fixed costs (docs/decisions/0015).

numba's simulator runs each thread of a block as a Python thread. Three of its costs have
nothing to do with the kernel (numba_cuda/numba/cuda/simulator/kernel.py, kernelapi.py):
- ``BlockManager.run`` starts a new OS thread for every simulated thread of every block (~0.2 ms
  each; a 128-thread block of a tiny matvec spent most of its ~60 ms there);
- it then loops over the live threads without ever blocking, checking whether all are parked
  in ``syncthreads``; that loop holds the GIL for whole time slices while the simulated threads
  wait for it (a 256-thread block doing a hundred float adds a thread: ~0.2 s);
- every call of a device function swaps the module global ``cuda`` of the function's module for
  the launch's fake module and back (``swapped_cuda_module``), scanning all the module's globals
  each time the module is not already swapped -- for a kernel whose device functions live in
  another module (dequant.py's readers, called per weight group), on nearly every call.
Together they were most of the engine's simulator tests' time.

The swap: here a module is swapped on the first call that needs it within a launch and stays
swapped until the launch ends; later device calls into it go straight to the function. Host code
between launches sees the real ``cuda`` again, as with numba.

The block scheduler:
a pool of worker threads runs the blocks, one block at a time (as numba does), each worker
taking one simulated thread's place per block. The barrier is a counter under a condition
variable: the last live thread to arrive releases the others; a thread that finishes no longer
counts (as in numba, a barrier waits for the threads still running); the launching thread sleeps
until the block is done. What a kernel sees is numba's: ``threading.current_thread()`` is a
``BlockThread`` carrying ``blockIdx``, ``threadIdx``, ``thread_id``; an exception aborts the block
and is re-raised with its thread and block in the message. The difference: a failed block's
other threads are run to their end (or their next barrier, which aborts) before the launch
raises, so the pool is clean for the next launch.

The manager lists the block's threads in ``threads`` and each thread's ``finished`` says whether
it has left the kernel (pool threads never die): the warp twins read both to tell a lane that
never arrives from a slow one (``twins._check_missing_lanes``).
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

_POOL: list = []                    # worker threads, grown to the largest block seen
# One block at a time. (numba's simulator does not run two launches at once anyway: a launch
# swaps the kernel's module global `cuda` for its fake one, and two would swap each other's.)
_POOL_LOCK = threading.Lock()


def _worker_class():
    from numba.cuda.simulator.kernel import BlockThread

    class PoolThread(BlockThread):
        """A reusable simulated thread: `assign` gives it a block's (manager, index, target);
        `run` loops over assignments forever (daemon)."""

        def __init__(self):
            super().__init__(None, _IdleManager, (0, 0, 0), (0, 0, 0), False)
            self._go = threading.Semaphore(0)
            self._job = None
            self.finished = True

        def assign(self, manager, block_point, thread_point, target) -> None:
            """Give the thread its part of a block; it starts on `go`. Every thread of a block
            is assigned before any starts, so no running lane sees a block-mate still marked
            `finished` from its previous block (the warp twins read that flag to tell a lane
            that left the kernel from one that has not arrived yet)."""
            from numba.cuda.simulator.kernelapi import Dim3
            self._manager = manager
            self.blockIdx = Dim3(*block_point)
            self.threadIdx = Dim3(*thread_point)
            bx, by, _ = (tuple(manager._block_dim) + (1, 1))[:3]
            self.thread_id = self.threadIdx.x + bx * (self.threadIdx.y + by * self.threadIdx.z)
            self.exception = None
            self.abort = False
            self.syncthreads_blocked = False
            self.debug = manager._debug
            self.finished = False
            self._job = target

        def go(self) -> None:
            self._go.release()

        def syncthreads(self):
            self._manager.barrier_wait(self)

        def run(self):
            while True:
                self._go.acquire()
                try:
                    with np.errstate(divide="raise") if self.debug else contextlib.nullcontext():
                        self._job()
                except Exception as e:      # numba's message: which thread, which block
                    tid = "tid=%s" % list(self.threadIdx)
                    ctaid = "ctaid=%s" % list(self.blockIdx)
                    msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
                    self.exception = (type(e)(msg), e.__traceback__)
                finally:
                    self._job = None
                    self.finished = True
                    self._manager.thread_done(self)

    return PoolThread


class _IdleManager:
    """What a pool thread's `_manager` is before its first block (BlockThread reads its dims)."""
    _block_dim = (1, 1, 1)
    _debug = False


_worker_cls = None


def _workers(n: int) -> list:
    """The first n pool threads, starting new ones as needed (call under _POOL_LOCK)."""
    global _worker_cls
    if _worker_cls is None:
        _worker_cls = _worker_class()
    while len(_POOL) < n:
        t = _worker_cls()
        t.start()
        _POOL.append(t)
    for i in range(n):
        if not _POOL[i].is_alive():     # left its loop on a BaseException: replace it
            _POOL[i] = _worker_cls()
            _POOL[i].start()
    return _POOL[:n]


class WaitingBlockManager:
    """Drop-in for numba's ``BlockManager`` (same constructor and ``run``)."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self._grid_dim = grid_dim
        self._block_dim = block_dim
        self._f = f
        self._debug = debug
        self.block_state = np.zeros(block_dim, dtype=np.bool_)   # syncthreads_count/and/or
        self.threads: list = []
        self._cond = threading.Condition()
        self._alive = 0          # threads of this block still in the kernel
        self._arrived = 0        # live threads parked in the current barrier
        self._generation = 0     # barriers released so far
        self._failed = None      # the first thread that raised

    # --- called by the simulated threads -----------------------------------------------------

    def barrier_wait(self, thread) -> None:
        with self._cond:
            if thread.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            gen = self._generation
            thread.syncthreads_blocked = True
            self._arrived += 1
            if self._arrived == self._alive:
                self._release()
            else:
                while self._generation == gen and not thread.abort:
                    self._cond.wait()
            if thread.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    def thread_done(self, thread) -> None:
        with self._cond:
            self._alive -= 1
            if thread.exception is not None and self._failed is None:
                self._failed = thread
                for t in self.threads:
                    t.abort = True
            elif self._alive and self._arrived == self._alive:
                self._release()      # the others wait in a barrier this thread never reaches
            self._cond.notify_all()

    def _release(self) -> None:
        for t in self.threads:
            t.syncthreads_blocked = False
        self._arrived = 0
        self._generation += 1
        self._cond.notify_all()

    # --- called by the kernel launch ---------------------------------------------------------

    def run(self, grid_point, *args):
        def target():
            self._f(*args)

        points = list(np.ndindex(*self._block_dim))
        with _POOL_LOCK:
            self.threads = _workers(len(points))
            with self._cond:
                self._alive = len(points)
                for t, p in zip(self.threads, points):
                    t.assign(self, grid_point, p, target)
                for t in self.threads:
                    t.go()
                while self._alive:
                    self._cond.wait()
            failed = self._failed
        if failed is not None:
            raise failed.exception[0].with_traceback(failed.exception[1])


# --- the module swap --------------------------------------------------------------------------

_SWAP_LOCK = threading.Lock()
_launch_fake = None      # the fake cuda module of the launch in progress
_swapped: dict = {}      # id(module globals) -> (globals, {name: the real cuda}) swapped for it


def _swap_in(globs, fake) -> None:
    """Point `globs`' names of the real cuda module at `fake`, once per launch (under the lock)."""
    if id(globs) in _swapped:
        return
    from numba import cuda
    orig = {k: v for k, v in globs.items() if v is cuda}
    for k in orig:
        globs[k] = fake
    _swapped[id(globs)] = (globs, orig)


@contextlib.contextmanager
def launch_swapped_cuda_module(fn, fake):
    """Drop-in for numba's ``swapped_cuda_module``. The first entry with a launch's fake module
    (the launch itself, kernel.py) owns the swaps: on its exit every module swapped during the
    launch gets the real module back. Later entries (device calls) only swap in their module."""
    global _launch_fake
    if fake is None:                     # a device function called outside any launch
        with _NUMBA_SWAP(fn, fake):
            yield
        return
    with _SWAP_LOCK:
        owner = _launch_fake is not fake
        if owner:
            _launch_fake = fake
        _swap_in(fn.__globals__, fake)
    if not owner:
        yield
        return
    try:
        yield
    finally:
        with _SWAP_LOCK:
            for globs, orig in _swapped.values():
                globs.update(orig)
            _swapped.clear()
            _launch_fake = None


def _device_call(self, *args):
    """``FakeCUDAKernel.__call__`` with a direct path for a device function whose module is
    already swapped for the launch in progress (the rest is numba's)."""
    if self._device and _launch_fake is not None and id(self.fn.__globals__) in _swapped:
        return self.fn(*args)
    return _NUMBA_CALL(self, *args)


_NUMBA_BLOCK_MANAGER = None
_NUMBA_SWAP = None
_NUMBA_CALL = None


def install() -> None:
    """Make numba's simulator launch blocks through `WaitingBlockManager` and swap modules once
    per launch; idempotent."""
    global _NUMBA_BLOCK_MANAGER, _NUMBA_SWAP, _NUMBA_CALL
    from numba.cuda.simulator import kernel
    if _NUMBA_BLOCK_MANAGER is None:
        _NUMBA_BLOCK_MANAGER = kernel.BlockManager
        kernel.BlockManager = WaitingBlockManager
    if _NUMBA_SWAP is None:
        _NUMBA_SWAP = kernel.swapped_cuda_module
        kernel.swapped_cuda_module = launch_swapped_cuda_module
        _NUMBA_CALL = kernel.FakeCUDAKernel.__call__
        kernel.FakeCUDAKernel.__call__ = _device_call
