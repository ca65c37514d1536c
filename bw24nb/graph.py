"""Record a sequence of kernel launches once, replay it as one CUDA graph.

An eager Numba launch costs ~21 us of host time; the same kernel replayed from a graph ~0.9 us
(shared/DEVICE.md, H200). A decode step is a few hundred kernels, so the engine captures the step
once and replays it per token::

    stream = cuda.stream()
    ...allocate every buffer, launch each kernel once (compiles + loads its module)...
    with CudaGraph.capture(stream) as graph:
        launch_rmsnorm(..., stream=stream)
        launch_matvec_q4k(..., stream=stream)
    graph.replay()            # on the capture stream; graph.replay(other_stream) also works
    stream.synchronize()

Rules of capture (the driver's, not ours):
- launches inside the ``with`` are recorded, not run; they run at each ``replay``;
- the graph holds raw device pointers and by-value scalars: keep every array alive and
  allocated as long as the graph is (allocate before capture, never inside);
- nothing synchronous inside the capture (host<->device copies without a stream, allocations,
  ``synchronize``): the driver invalidates the capture and ``capture`` raises at the end;
- a kernel's first launch compiles and loads it: launch each once before capturing.

Programmatic edges (``capture(stream, programmatic=True)``, sm_90+): a graph of many small
kernels spends much of its time between them -- each kernel's blocks are launched only after
the previous kernel has drained. With every kernel-to-kernel edge made programmatic (port
"launch order", CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER: the driver documents it as activating
"when all blocks of the kernel have begun execution"), the next kernel's blocks are launched
once every block of the previous one has begun, and wait in ``griddepcontrol.wait`` -- which
every bw24nb ``@kernel`` runs before touching memory (jit.py) -- until it has completed and its
writes are visible. Results are unchanged; only the launch latency overlaps the previous
kernel's run. Only for graphs whose kernels all wait that way. ``griddepcontrol.launch_dependents``
belongs to the other port ("programmatic"), so under this one it changes nothing -- as measured
after each kernel's wait (session 8, docs/decisions/0014) and before it (session 16, with and
without an L2 prefetch of each matvec's weights before the wait: docs/decisions/0022).

Under numba's CUDA simulator there are no graphs. ``CudaGraph`` then records each simulated
kernel launch made by the capturing thread (kernel, grid, block, dynamic shared memory,
arguments) instead of running it, and ``replay`` runs the recorded launches in order — the same
observable behaviour, through the same user code.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from bw24nb.device import simulator_enabled


class CudaGraphError(RuntimeError):
    """A CUDA driver call of the capture/replay sequence failed; the message names the call."""


class CudaGraph:
    """An executable graph made by :meth:`capture`; :meth:`replay` launches it."""

    def __init__(self, stream):
        self._stream = stream
        self._ready = False
        self._closed = False
        self._programmatic = False
        self.num_nodes = 0
        self.num_programmatic = 0
        self._backend = _SimBackend(self) if simulator_enabled() else _DriverBackend(self, stream)

    @classmethod
    @contextlib.contextmanager
    def capture(cls, stream, mode: str = "thread_local", programmatic: bool = False):
        """Record the launches issued on ``stream`` inside the ``with`` into a new graph.

        ``stream`` is a numba stream from ``cuda.stream()`` (the legacy default stream cannot be
        captured). ``mode`` is the driver's capture mode: ``"thread_local"`` (default: other
        threads' CUDA calls are unaffected) or ``"relaxed"`` / ``"global"``. ``programmatic``:
        link consecutive kernels with programmatic edges (module docstring; every kernel must
        begin with ``grid_dependency_wait``, as bw24nb's do); ``num_programmatic`` then counts
        the edges changed. Ignored where the GPU has no such edges (before sm_90) and in the
        simulator.
        """
        graph = cls(stream)
        graph._programmatic = programmatic
        graph._backend.begin(mode)
        try:
            yield graph
        except BaseException:
            graph._backend.abort()
            graph._closed = True
            raise
        graph.num_nodes = graph._backend.end()
        graph._ready = True

    def replay(self, stream=None) -> None:
        """Launch the whole graph on ``stream`` (default: the capture stream); asynchronous."""
        if self._closed:
            raise CudaGraphError("replay of a closed CudaGraph")
        if not self._ready:
            raise CudaGraphError("replay inside its own capture: leave the 'with' block first")
        self._backend.replay(self._stream if stream is None else stream)

    def close(self) -> None:
        """Free the driver's graph objects now (also done when the object is collected)."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Branches:
    """Side streams that let launches which do not depend on each other run side by side --
    eagerly, or as parallel branches of a captured graph instead of one chain of nodes.

    ``side = br.fork(stream, i)`` returns side stream i, ordered after everything launched on
    ``stream`` so far; ``br.join(stream, i)`` orders everything launched on ``stream`` from then
    on after side stream i's work so far. Inside a capture the record / wait pairs become graph
    edges (a side stream joins the capture through them; every side forked must be joined
    back before the capture ends). Results are unchanged as long as a branch reads nothing
    another branch writes before the join: the same kernels run on the same inputs. On the
    H200 a chain of small kernels pays each one's drain before the next may start, so two
    kernels with no edge between them overlap what a chain serializes. One event serves every
    fork and join: each wait is issued right after its record. In the simulator everything
    runs in call order, so call order must itself be a valid order (it is: a fork comes after
    what it waits for, in program order)."""

    def __init__(self, n: int):
        from numba import cuda

        self.sides = [cuda.stream() for _ in range(n)]
        # no timing: a cheaper event (the simulator's takes no arguments)
        self._event = cuda.event() if simulator_enabled() else cuda.event(timing=False)

    def _order(self, before, after) -> None:
        self._event.record(before)
        self._event.wait(after)

    def fork(self, stream, i: int):
        self._order(stream, self.sides[i])
        return self.sides[i]

    def join(self, stream, i: int) -> None:
        self._order(self.sides[i], stream)


class Chain:
    """`Branches`' stand-in that keeps every launch on the caller's one stream (the A/B
    baseline, and callers with no side streams)."""

    def fork(self, stream, i: int):
        return stream

    def join(self, stream, i: int) -> None:
        pass


# --- the real thing: cuda.bindings.driver ---------------------------------------------------------

def _check(result, what: str):
    """Unpack a cuda.bindings call's (CUresult, *values); raise CudaGraphError on failure."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        hint = ""
        if "CAPTURE" in name:
            hint = (" — something non-capturable ran during capture (a synchronous copy, an "
                    "allocation, a synchronize, a first launch that loads a module?): allocate "
                    "and warm up every kernel before capturing")
        raise CudaGraphError(f"{what} failed: {name} ({text}){hint}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _stream_handle(stream):
    """The ``CUstream`` of a numba stream (numba-cuda >= 0.30 keeps a cuda.bindings CUstream in
    ``stream.handle``; older releases a ctypes ``c_void_p``)."""
    from cuda.bindings import driver

    handle = getattr(stream, "handle", None)
    if handle is None:
        raise CudaGraphError(f"{stream!r} is not a numba stream (use cuda.stream())")
    if not isinstance(handle, driver.CUstream):
        value = getattr(handle, "value", handle)
        handle = driver.CUstream(int(value or 0))
    if int(handle) in (0, int(driver.CU_STREAM_LEGACY)):
        raise CudaGraphError("the legacy default stream cannot be captured: create one with "
                             "cuda.stream() and launch the kernels on it")
    return handle


def _make_programmatic(graph) -> int:
    """Turn every kernel -> kernel edge of `graph` into a programmatic one from the launch-order
    port (module docstring); returns how many. Edges touching other nodes (copies, memsets,
    events) keep the full dependency."""
    from cuda.bindings import driver

    res = _check(driver.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")
    n = int(res[-1])
    if n == 0:
        return 0
    src, dst, data, n = _check(driver.cuGraphGetEdges(graph, n), "cuGraphGetEdges")
    kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    kinds: dict = {}

    def is_kernel(node) -> bool:
        key = int(node)
        if key not in kinds:
            kinds[key] = _check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType") == kernel
        return kinds[key]

    pick = [i for i in range(int(n)) if is_kernel(src[i]) and is_kernel(dst[i])
            and int(data[i].type) == int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT)]
    if not pick:
        return 0
    f, t = [src[i] for i in pick], [dst[i] for i in pick]
    _check(driver.cuGraphRemoveDependencies(graph, f, t, [data[i] for i in pick], len(pick)),
           "cuGraphRemoveDependencies")
    edges = []
    for _ in pick:
        e = driver.CUgraphEdgeData()
        e.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        e.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER
        edges.append(e)
    _check(driver.cuGraphAddDependencies(graph, f, t, edges, len(pick)), "cuGraphAddDependencies")
    return len(pick)


def _destroy(exec_handle, graph_handle):
    from cuda.bindings import driver

    # Best effort: at interpreter exit the context may already be gone.
    if exec_handle is not None:
        driver.cuGraphExecDestroy(exec_handle)
    if graph_handle is not None:
        driver.cuGraphDestroy(graph_handle)


class _DriverBackend:
    _MODES = {"thread_local": "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL",
              "relaxed": "CU_STREAM_CAPTURE_MODE_RELAXED",
              "global": "CU_STREAM_CAPTURE_MODE_GLOBAL"}

    def __init__(self, owner: CudaGraph, stream):
        self._handle = _stream_handle(stream)
        self._graph = None
        self._exec = None
        self._finalizer = None
        self._owner = weakref.ref(owner)

    def begin(self, mode: str) -> None:
        from cuda.bindings import driver

        if mode not in self._MODES:
            raise ValueError(f"capture mode {mode!r}: expected one of {sorted(self._MODES)}")
        cmode = getattr(driver.CUstreamCaptureMode, self._MODES[mode])
        _check(driver.cuStreamBeginCapture(self._handle, cmode), "cuStreamBeginCapture")

    def end(self) -> int:
        from cuda.bindings import driver

        self._graph = _check(driver.cuStreamEndCapture(self._handle), "cuStreamEndCapture")
        owner = self._owner()
        try:
            count = _check(driver.cuGraphGetNodes(self._graph, 0), "cuGraphGetNodes")
            num_nodes = int(count[-1]) if isinstance(count, tuple) else int(count)
            if owner._programmatic:
                from bw24nb.device import current_features
                if current_features().grid_dependency:
                    owner.num_programmatic = _make_programmatic(self._graph)
            self._exec = _check(driver.cuGraphInstantiate(self._graph, 0), "cuGraphInstantiate")
        except BaseException:
            _destroy(None, self._graph)
            self._graph = None
            raise
        self._finalizer = weakref.finalize(owner, _destroy, self._exec, self._graph)
        return num_nodes

    def abort(self) -> None:
        """End a capture that the user's code left by an exception, and drop what it recorded."""
        from cuda.bindings import driver

        result = driver.cuStreamEndCapture(self._handle)
        if result[0] == driver.CUresult.CUDA_SUCCESS and result[1] is not None:
            _destroy(None, result[1])

    def replay(self, stream) -> None:
        from cuda.bindings import driver

        handle = self._handle if stream is None else _stream_handle(stream)
        _check(driver.cuGraphLaunch(self._exec, handle), "cuGraphLaunch")

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


# --- simulator: record the launches, re-run them on replay ---------------------------------------

_capturing = threading.local()      # .graph: the CudaGraph recording on this thread, if any
_hook_lock = threading.Lock()
_hook_installed = False


def _install_sim_hook() -> None:
    """Route simulated kernel launches through a recorder (installed once, a no-op when idle)."""
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        from numba.cuda.simulator.kernel import FakeCUDAKernel, _get_kernel_context

        original = FakeCUDAKernel.__call__

        def call(kernel, *args):
            graph = getattr(_capturing, "graph", None)
            if graph is None or kernel._device or _get_kernel_context() is not None:
                return original(kernel, *args)
            config = (kernel.grid_dim, kernel.block_dim, kernel.dynshared_size)

            def launch():
                kernel.grid_dim, kernel.block_dim, kernel.dynshared_size = config
                original(kernel, *args)

            graph._backend.recorded.append(launch)

        FakeCUDAKernel.__call__ = call
        _hook_installed = True


class _SimBackend:
    def __init__(self, owner: CudaGraph):
        self.recorded: list = []
        self._owner = weakref.ref(owner)

    def begin(self, mode: str) -> None:
        if mode not in _DriverBackend._MODES:
            raise ValueError(f"capture mode {mode!r}: expected one of {sorted(_DriverBackend._MODES)}")
        if getattr(_capturing, "graph", None) is not None:
            raise CudaGraphError("cuStreamBeginCapture failed: this thread is already capturing")
        _install_sim_hook()
        _capturing.graph = self._owner()

    def end(self) -> int:
        _capturing.graph = None
        return len(self.recorded)

    def abort(self) -> None:
        _capturing.graph = None
        self.recorded.clear()

    def replay(self, stream) -> None:
        for launch in self.recorded:
            launch()

    def close(self) -> None:
        self.recorded.clear()
