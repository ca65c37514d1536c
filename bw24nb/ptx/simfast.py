"""numba's CUDA simulator without its fixed costs (docs/decisions/0015, 0048).

numba's simulator runs each thread of a block as a Python thread. Its costs that have nothing
to do with the kernel (numba_cuda/numba/cuda/simulator/kernel.py, kernelapi.py):
- ``BlockManager.run`` starts a new OS thread for every simulated thread of every block (~0.2 ms
  each) and then polls the live threads, holding the GIL, until all are parked in
  ``syncthreads``;
- every barrier and every warp rendezvous of the twins (``twins._WarpExchange``) hands the GIL
  from OS thread to OS thread: a decode step of the 4-layer test fixture (601 blocks, 73k
  simulated threads) took ~24 s, nearly all of it threads waking each other (decision 0048);
- every call of a device function swaps the module global ``cuda`` of the function's module for
  the launch's fake module and back (``swapped_cuda_module``), scanning all the module's globals
  each time the module is not already swapped -- for a kernel whose device functions live in
  another module (dequant.py's readers, called per weight group), on nearly every call.

The block scheduler: a block's simulated threads are greenlets (coroutines with their own
stacks) in the launching OS thread. Each runs until it waits -- in ``syncthreads`` or in a warp
rendezvous (`park`) -- and the scheduler then runs the next ready one, in thread order. A barrier
is a list: the last live thread to arrive makes the others ready; a thread that finishes no
longer counts (as in numba, a barrier waits for the threads still running). No OS thread waits
on another, so a switch costs a few microseconds. What a kernel sees is numba's:
``current_thread()`` (numba's ``threading.current_thread()`` inside the simulator, see
`install`) is a `SimThread` carrying ``blockIdx``, ``threadIdx``, ``thread_id``; an exception
aborts the block and is re-raised with its thread and block in the message, after the block's
other threads have run to their end or their next wait (which aborts). When no thread is ready
and some still wait, the block can never finish -- on a GPU, a hang: the launch raises
`twins.WarpCollectiveError` naming the lanes a warp waits for and where they are
(finished, in ``syncthreads``, or in another collective).

Scheduling is cooperative and deterministic (a thread runs until it waits), so two runs of a
kernel interleave its threads the same way.

The module swap: a module is swapped on the first call that needs it within a launch and stays
swapped until the launch ends; later device calls into it go straight to the function. Host code
between launches sees the real ``cuda`` again, as with numba.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import threading

import numpy as np

# One block at a time, whichever OS thread launches it (numba's simulator does not run two
# launches at once anyway: a launch swaps the kernel's module global `cuda` for its fake one,
# and two would swap each other's).
_BLOCK_LOCK = threading.Lock()
_getcurrent = None           # greenlet.getcurrent, once `install` has run


def current_thread():
    """The simulated CUDA thread running this code (a `SimThread`), else the OS thread."""
    if _getcurrent is not None:
        sim = getattr(_getcurrent(), "sim", None)
        if sim is not None:
            return sim
    return threading.current_thread()


class _ThreadingInKernelapi:
    """What numba's kernelapi.py sees as its module ``threading``: the real one, except that
    ``current_thread()`` is the simulated thread (kernelapi reads threadIdx, blockIdx and
    syncthreads from it)."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


class SimThread:
    """One simulated CUDA thread: what numba's ``BlockThread`` carries, run as a greenlet."""

    def __init__(self, manager, block_point, thread_point):
        from numba.cuda.simulator.kernelapi import Dim3
        self._manager = manager
        self.blockIdx = Dim3(*block_point)
        self.threadIdx = Dim3(*thread_point)
        bx, by, _ = (tuple(manager._block_dim) + (1, 1))[:3]
        self.thread_id = self.threadIdx.x + bx * (self.threadIdx.y + by * self.threadIdx.z)
        self.exception = None        # (exception with thread and block named, traceback)
        self.abort = False           # another thread of the block raised
        self.finished = False        # left the kernel
        self.waiting_in = None       # parked, until woken, in "syncthreads" or a warp exchange
        self.warp_result = None      # what its warp's rendezvous handed it (twins._WarpExchange)
        self.greenlet = None

    def syncthreads(self):
        self._manager.barrier_wait(self)

    def _block_vote(self, value, vote):
        """numba's syncthreads_count / _and / _or: every thread's value, then a barrier each
        side of the vote."""
        idx = self.threadIdx.x, self.threadIdx.y, self.threadIdx.z
        self._manager.block_state[idx] = value
        self.syncthreads()
        r = vote(self._manager.block_state)
        self.syncthreads()
        return r

    def syncthreads_count(self, value):
        return self._block_vote(value, np.count_nonzero)

    def syncthreads_and(self, value):
        return self._block_vote(value, lambda s: 1 if np.all(s) else 0)

    def syncthreads_or(self, value):
        return self._block_vote(value, lambda s: 1 if np.any(s) else 0)

    def __str__(self):
        return f"Thread <<<{self.blockIdx}, {self.threadIdx}>>>"


class WaitingBlockManager:
    """Drop-in for numba's ``BlockManager`` (same constructor and ``run``)."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self._grid_dim = grid_dim
        self._block_dim = block_dim
        self._f = f
        self._debug = debug
        self.block_state = np.zeros(block_dim, dtype=np.bool_)   # syncthreads_count/and/or
        self.threads: list[SimThread] = []
        self.exchanges: dict = {}    # the warp twins' rendezvous of this block, by warp
        self._ready: collections.deque = collections.deque()
        self._barrier: list[SimThread] = []     # live threads parked in syncthreads
        self._alive = 0
        self._hub = None             # the launching greenlet: runs the ready threads
        self._failed = None          # the first thread that raised

    # --- called by the simulated threads -----------------------------------------------------

    def park(self, thread: SimThread, where) -> None:
        """Suspend `thread` until `wake`; `where` says what it waits in (for a hang's report).
        Raises when the block was aborted meanwhile."""
        thread.waiting_in = where
        self._hub.switch()
        if thread.abort:
            raise RuntimeError(f"simulated block aborted while waiting in {_what(where)}")

    def wake(self, threads) -> None:
        for t in threads:
            t.waiting_in = None
        self._ready.extend(threads)

    def _wake_parked(self) -> None:
        """Wake every parked thread (the block aborts: each raises where it waits)."""
        self.wake([t for t in self.threads if t.waiting_in is not None])

    def barrier_wait(self, thread: SimThread) -> None:
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        self._barrier.append(thread)
        if len(self._barrier) < self._alive:
            self.park(thread, "syncthreads")
        else:
            self._release_barrier(thread)

    def _release_barrier(self, me=None) -> None:
        others = [t for t in self._barrier if t is not me]
        self._barrier = []
        self.wake(others)

    def _thread_done(self, thread: SimThread) -> None:
        thread.finished = True
        self._alive -= 1
        if thread.exception is not None and self._failed is None:
            self._failed = thread
            for t in self.threads:
                t.abort = True
            self._wake_parked()
            self._barrier = []
        elif self._alive and len(self._barrier) == self._alive:
            self._release_barrier()   # the others wait in a barrier this thread never reaches

    # --- called by the kernel launch ---------------------------------------------------------

    def run(self, grid_point, *args):
        import greenlet

        f, debug = self._f, self._debug

        def body(sim):
            try:
                with np.errstate(divide="raise") if debug else contextlib.nullcontext():
                    f(*args)
            except Exception as e:      # numba's message: which thread, which block
                tid = "tid=%s" % list(sim.threadIdx)
                ctaid = "ctaid=%s" % list(sim.blockIdx)
                msg = f"{tid} {ctaid}" if str(e) == "" else f"{tid} {ctaid}: {e}"
                sim.exception = (type(e)(msg), e.__traceback__)
            finally:
                self._thread_done(sim)

        with _BLOCK_LOCK:
            self._hub = greenlet.getcurrent()
            self.threads = [SimThread(self, grid_point, p) for p in np.ndindex(*self._block_dim)]
            self._alive = len(self.threads)
            for t in self.threads:
                t.greenlet = greenlet.greenlet(run=functools.partial(body, t), parent=self._hub)
                t.greenlet.sim = t
            self._ready.extend(self.threads)
            hang = None
            while True:
                while self._ready:
                    self._ready.popleft().greenlet.switch()
                if not self._alive or hang is not None:
                    break
                hang = self._hang_error()        # nothing ready, threads still waiting
                for t in self.threads:
                    t.abort = True
                self._wake_parked()              # let them unwind, then report the hang
            self.exchanges = {}
            self._hub = None
        if hang is not None:
            raise hang
        if self._failed is not None:
            failed = self._failed
            raise failed.exception[0].with_traceback(failed.exception[1])

    def _hang_error(self):
        """What a block that can never finish waits for: the first warp rendezvous with
        missing lanes, and where each missing lane is."""
        from bw24nb.ptx.twins import WarpCollectiveError
        for ex in self.exchanges.values():
            if not ex.arrived:
                continue
            lines = []
            for t in self.threads:
                lane = t.thread_id % 32
                if t.thread_id // 32 != ex.warp or ex.present[lane]:
                    continue
                if t.finished:
                    lines.append(f"lane {lane} of warp {ex.warp} finished without executing "
                                 f"{ex.name}")
                elif t.waiting_in == "syncthreads":
                    lines.append(f"lane {lane} of warp {ex.warp} waits in syncthreads while "
                                 f"its warp waits in {ex.name}")
                else:
                    lines.append(f"lane {lane} of warp {ex.warp} waits in "
                                 f"{_what(t.waiting_in)} while its warp waits in {ex.name}")
            return WarpCollectiveError(
                "; ".join(lines) + f": {ex.name} needs all 32 lanes of the warp converged "
                "(on a GPU this block would hang)")
        return RuntimeError("simulated block hung: threads wait with none ready")


def _what(where) -> str:
    return where if isinstance(where, str) else getattr(where, "name", str(where))


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
    global _NUMBA_BLOCK_MANAGER, _NUMBA_SWAP, _NUMBA_CALL, _getcurrent
    import greenlet
    from numba.cuda.simulator import kernel, kernelapi
    _getcurrent = greenlet.getcurrent
    if not isinstance(kernelapi.threading, _ThreadingInKernelapi):
        kernelapi.threading = _ThreadingInKernelapi()
    if _NUMBA_BLOCK_MANAGER is None:
        _NUMBA_BLOCK_MANAGER = kernel.BlockManager
        kernel.BlockManager = WaitingBlockManager
    if _NUMBA_SWAP is None:
        _NUMBA_SWAP = kernel.swapped_cuda_module
        kernel.swapped_cuda_module = launch_swapped_cuda_module
        _NUMBA_CALL = kernel.FakeCUDAKernel.__call__
        kernel.FakeCUDAKernel.__call__ = _device_call
