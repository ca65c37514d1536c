"""CudaGraph: captured launches are recorded, not run, and each replay runs all of them once.

The same tests run in the simulator (where CudaGraph records the simulated launches) and on a
GPU (real stream capture); the GPU-only ones check what the simulator cannot model.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.device import gpu_present, simulator_enabled
from bw24nb.graph import CudaGraph, CudaGraphError

requires_gpu = pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU: the simulator has "
                                  "no default-stream semantics to reject")
THREADS = 64
POISON = -(2**31)


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@cuda.jit
def double_into(y, x):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 2 * x[i]


@cuda.jit
def add_scalar(x, s):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += s


def _blocks(n):
    return (n + THREADS - 1) // THREADS


@pytest.fixture
def stream():
    s = cuda.stream()
    # First launches compile and load the modules: never let that happen inside a capture.
    scratch = cuda.to_device(np.zeros(4, np.int32), stream=s)
    add_one[1, THREADS, s](scratch)
    double_into[1, THREADS, s](scratch, scratch)
    add_scalar[1, THREADS, s](scratch, 1)
    s.synchronize()
    return s


def test_replay_runs_the_captured_sequence_each_time(rng, stream):
    n = int(rng.integers(50, 300))
    x0 = rng.integers(-1000, 1000, n).astype(np.int32)
    x = cuda.to_device(x0, stream=stream)
    y = cuda.to_device(np.full(n, POISON, np.int32), stream=stream)
    stream.synchronize()

    with CudaGraph.capture(stream) as graph:
        add_one[_blocks(n), THREADS, stream](x)
        double_into[_blocks(n), THREADS, stream](y, x)
    assert graph.num_nodes == 2

    # recorded, not run
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), x0)
    np.testing.assert_array_equal(y.copy_to_host(stream=stream), np.full(n, POISON, np.int32))

    replays = int(rng.integers(2, 7))
    for _ in range(replays):
        graph.replay()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), x0 + replays)
    np.testing.assert_array_equal(y.copy_to_host(stream=stream), 2 * (x0 + replays))
    graph.close()


def test_scalar_arguments_replay_with_their_captured_value(rng, stream):
    x = cuda.to_device(np.zeros(10, np.int32), stream=stream)
    step = int(rng.integers(1, 100))
    with CudaGraph.capture(stream) as graph:
        add_scalar[1, THREADS, stream](x, step)
    graph.replay()
    graph.replay()
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), np.full(10, 2 * step, np.int32))


def test_replay_on_another_stream(rng, stream):
    x0 = rng.integers(0, 100, 33).astype(np.int32)
    x = cuda.to_device(x0, stream=stream)
    with CudaGraph.capture(stream) as graph:
        add_one[1, THREADS, stream](x)
    other = cuda.stream()
    graph.replay(other)
    other.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(), x0 + 1)


def test_an_exception_inside_capture_ends_it_and_propagates(stream):
    x = cuda.to_device(np.zeros(8, np.int32), stream=stream)
    with pytest.raises(ZeroDivisionError):
        with CudaGraph.capture(stream) as graph:
            add_one[1, THREADS, stream](x)
            1 / 0
    with pytest.raises(CudaGraphError, match="closed"):
        graph.replay()
    # the stream left capture mode: eager launches run again
    add_one[1, THREADS, stream](x)
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), np.ones(8, np.int32))


def test_nested_capture_is_refused_and_the_stream_recovers(stream):
    x = cuda.to_device(np.zeros(8, np.int32), stream=stream)
    with pytest.raises(CudaGraphError, match="cuStreamBeginCapture"):
        with CudaGraph.capture(stream):
            with CudaGraph.capture(stream):
                pass
    add_one[1, THREADS, stream](x)
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), np.ones(8, np.int32))


def test_replay_inside_its_own_capture_is_refused(stream):
    x = cuda.to_device(np.zeros(8, np.int32), stream=stream)
    with pytest.raises(CudaGraphError, match="inside its own capture"):
        with CudaGraph.capture(stream) as graph:
            add_one[1, THREADS, stream](x)
            graph.replay()


def test_unknown_capture_mode_is_refused(stream):
    with pytest.raises(ValueError, match="capture mode"):
        with CudaGraph.capture(stream, mode="sometimes"):
            pass


@requires_gpu
def test_default_stream_cannot_be_captured():
    with pytest.raises(CudaGraphError, match="default stream"):
        with CudaGraph.capture(cuda.default_stream()):
            pass


@requires_gpu
def test_synchronous_work_inside_capture_is_reported(stream):
    from numba.cuda.cudadrv.driver import CudaAPIError

    # A synchronous allocation + copy: refused at the call (numba raises) or invalidating the
    # capture (we raise at its end), depending on the driver; either way it must not pass.
    with pytest.raises((CudaGraphError, CudaAPIError)):
        with CudaGraph.capture(stream):
            cuda.to_device(np.zeros(4, np.int32))
    x = cuda.to_device(np.zeros(8, np.int32), stream=stream)
    add_one[1, THREADS, stream](x)
    stream.synchronize()
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), np.ones(8, np.int32))


def test_simulator_records_only_the_capturing_threads_launches():
    if not simulator_enabled():
        pytest.skip("simulator bookkeeping")
    import threading

    s = cuda.stream()
    x = cuda.to_device(np.zeros(4, np.int32))
    with CudaGraph.capture(s) as graph:
        worker = threading.Thread(target=lambda: add_one[1, THREADS](x))
        worker.start()
        worker.join()                       # another thread's launch runs eagerly
    assert graph.num_nodes == 0
    np.testing.assert_array_equal(x.copy_to_host(), np.ones(4, np.int32))


# --- programmatic edges and the kernels that wait for them ---------------------------------------

def _doubling_kernels():
    """Two kernels made by bw24nb's @kernel (so they begin with grid_dependency_wait)."""
    from bw24nb.jit import kernel

    @kernel
    def add_one_w(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 1

    @kernel
    def double_w(y, x):
        i = cuda.grid(1)
        if i >= x.size:
            return              # an early return in the body leaves the wrapper too
        y[i] = 2 * x[i]

    return add_one_w, double_w


def test_programmatic_chain_gives_the_serial_result(rng, stream):
    """A chain where every kernel reads what the previous one wrote: with programmatic edges
    (sm_90+: the next kernel's blocks launched early, waiting in griddepcontrol.wait) the
    result must be the serial chain's, replay after replay."""
    add_one_w, double_w = _doubling_kernels()
    n = int(rng.integers(3000, 9000))           # several blocks: early blocks really overlap
    x0 = rng.integers(-1000, 1000, n).astype(np.int32)
    x = cuda.to_device(x0, stream=stream)
    y = cuda.to_device(np.full(n, POISON, np.int32), stream=stream)
    add_one_w[_blocks(n), THREADS, stream](x)
    double_w[_blocks(n), THREADS, stream](y, x)
    stream.synchronize()
    x.copy_to_device(x0, stream=stream)
    steps = 6
    with CudaGraph.capture(stream, programmatic=True) as graph:
        for _ in range(steps):
            add_one_w[_blocks(n), THREADS, stream](x)
            double_w[_blocks(n), THREADS, stream](x, x)
            double_w[_blocks(n), THREADS, stream](y, x)
    assert graph.num_nodes == 3 * steps
    from bw24nb.device import current_features
    if not simulator_enabled() and current_features().grid_dependency:
        assert graph.num_programmatic == 3 * steps - 1
    else:
        assert graph.num_programmatic == 0
    want = x0.astype(np.int64)
    for _ in range(2):
        graph.replay()
        for _ in range(steps):
            want = 2 * (want + 1)
    stream.synchronize()
    want = want.astype(np.int32)                # int32 wraps alike on both sides
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), want)
    np.testing.assert_array_equal(y.copy_to_host(stream=stream), 2 * want)
    graph.close()


def test_branches_fork_and_join_inside_a_capture(rng, stream):
    """graph.Branches: a side stream forked from the capturing stream joins the capture, its
    launches become a parallel branch, and the replayed result is the serial one. On a GPU the
    graph has two kernel edges out of each fork point and two into each join: 6 a step where
    a chain of the same 5 kernels has 5, plus one a step after the first from the side
    stream's own order (its kernel of step i to that of step i + 1, implied by the join but
    recorded by the capture; the H200 counted 19 for 3 steps, session 13)."""
    from bw24nb.graph import Branches
    add_one_w, double_w = _doubling_kernels()
    n = int(rng.integers(3000, 9000))
    x0 = rng.integers(-1000, 1000, n).astype(np.int32)
    x, y, z = (cuda.to_device(a, stream=stream) for a in (x0, np.full(n, POISON, np.int32),
                                                          np.full(n, POISON, np.int32)))
    add_one_w[_blocks(n), THREADS, stream](x)
    double_w[_blocks(n), THREADS, stream](y, x)
    stream.synchronize()
    x.copy_to_device(x0, stream=stream)
    br = Branches(1)
    steps = 3
    with CudaGraph.capture(stream, programmatic=True) as graph:
        for _ in range(steps):
            add_one_w[_blocks(n), THREADS, stream](x)
            double_w[_blocks(n), THREADS, br.fork(stream, 0)](y, x)     # the branch
            double_w[_blocks(n), THREADS, stream](z, x)                 # beside it
            br.join(stream, 0)
            add_one_w[_blocks(n), THREADS, stream](y)                   # after both
            add_one_w[_blocks(n), THREADS, stream](z)
    assert graph.num_nodes == 5 * steps
    from bw24nb.device import current_features
    if not simulator_enabled() and current_features().grid_dependency:
        assert graph.num_programmatic == (6 * steps - 1) + (steps - 1)
    graph.replay()
    stream.synchronize()
    want = 2 * (x0.astype(np.int64) + steps) + 1
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), x0 + steps)
    np.testing.assert_array_equal(y.copy_to_host(stream=stream), want.astype(np.int32))
    np.testing.assert_array_equal(z.copy_to_host(stream=stream), want.astype(np.int32))
    graph.close()


def test_waiting_kernel_keeps_the_kernels_name_and_parameters():
    from bw24nb.jit import waiting_kernel

    def scale_into(y, x, s):
        """doc"""
        i = cuda.grid(1)
        if i < x.size:
            y[i] = s * x[i]

    w = waiting_kernel(scale_into)
    assert (w.__name__, w.__qualname__, w.__module__, w.__doc__) == (
        "scale_into", scale_into.__qualname__, scale_into.__module__, "doc")
    assert w.__code__.co_varnames[:3] == ("y", "x", "s")
    if simulator_enabled():     # (on a GPU, every @kernel of the suite runs it)
        x = np.arange(40, dtype=np.float32)
        y = np.zeros_like(x)
        cuda.jit(w)[2, 32](y, x, np.float32(3))
        np.testing.assert_array_equal(y, 3 * x)

    def with_default(x, n=3):
        pass

    with pytest.raises(TypeError, match="positional"):
        waiting_kernel(with_default)
