"""RMSNorm kernels (bw24nb/kernels/norm.py) and the elementwise kernels of
bw24nb/kernels/activation.py against the numpy references in bw24nb/reference/ops.py.

Tolerances: the kernels accumulate x^2 in float32 (C terms, per-thread sequential then a tree),
the reference in float64. The float32 sum of C positive terms is within ~C * 2^-24 relative of
the exact one (C <= 300 here: <= 2e-5, in practice far less because the tree splits the sum);
rstd inherits half of that, and each output element adds ~3 roundings (x * rstd * w). So
rtol = 5e-5 bounds the plain forms; the gated form adds a float32 exp/divide in silu
(a few ulps relative), still well inside 5e-5. The elementwise kernels are a handful of
float32 operations per element: rtol = 1e-6 (about 8 ulps) with atol for results near 0.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels.activation import (launch_add, launch_sigmoid_mul, launch_swiglu,
                                       launch_swiglu_fused, launch_swiglu_fused_q8,
                                       launch_swiglu_q8)
from bw24nb.kernels.quantize_act import quantize_act_q8_reference
from bw24nb.kernels.norm import (NORM_THREADS_MAX, SCRATCH_WARPS, _row_threads, block_sum,
                                 launch_add_rms_norm, launch_gated_rms_norm,
                                 launch_head_rms_norm, launch_rms_norm)
from bw24nb.ptx.warp import warp_tree_sum_host
from bw24nb.reference import ops

RTOL_NORM = 5e-5


def _poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("N,C", [(3, 96), (2, 300)])
def test_rms_norm_rows(rng, N, C):
    x = _rand(rng, N, C, scale=3.0)
    w = _rand(rng, C)
    eps = 1e-6
    y = _poisoned((N, C))
    launch_rms_norm(cuda.to_device(x), cuda.to_device(w), eps, y)
    out = y.copy_to_host()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ops.rms_norm(x, w, eps), rtol=RTOL_NORM, atol=1e-7)


def test_rms_norm_in_place_and_eps_matters(rng):
    # A row of tiny values: eps dominates mean(x^2), so a kernel that drops eps fails here.
    x = _rand(rng, 2, 64, scale=1e-3)
    w = _rand(rng, 64)
    eps = 1e-5
    d = cuda.to_device(x)
    launch_rms_norm(d, cuda.to_device(w), eps, d)
    np.testing.assert_allclose(d.copy_to_host(), ops.rms_norm(x, w, eps), rtol=RTOL_NORM, atol=1e-9)


def test_row_threads_is_power_of_two_and_bounded():
    for C in (1, 16, 128, 129, 1000, 4096, 100000):
        b = _row_threads(C)
        assert b & (b - 1) == 0 and 32 <= b <= NORM_THREADS_MAX <= 1024
    assert _row_threads(4096) == 1024       # a decode hidden row: 4 values a thread, one step


@cuda.jit
def _block_sum_kernel(vals, out):
    scratch = cuda.shared.array(SCRATCH_WARPS, np.float32)
    t = block_sum(scratch, vals[cuda.threadIdx.x])
    out[cuda.threadIdx.x] = t


@pytest.mark.parametrize("B", [32, 96, 256])
def test_block_sum_is_the_documented_order(rng, B):
    """block_sum = warp trees, then one tree over the warp totals padded with +0.0 to 32 (the
    module docstring's step 2), bit for bit, and every thread gets the same total. Values of
    mixed magnitude, so that the roundings depend on the order."""
    vals = (rng.standard_normal(B) * np.exp2(rng.integers(-20, 20, B))).astype(np.float32)
    out = cuda.to_device(np.full(B, np.nan, np.float32))
    _block_sum_kernel[1, B](cuda.to_device(vals), out)
    warps = [warp_tree_sum_host(vals[32 * w:32 * w + 32]) for w in range(B // 32)]
    want = warp_tree_sum_host(np.concatenate([warps, np.zeros(32 - len(warps), np.float32)]))
    got = out.copy_to_host()
    assert np.all(got.view(np.uint32) == np.float32(want).view(np.uint32))


def test_add_rms_norm_updates_residual_in_place(rng):
    N, C = 3, 160
    x, r, w = _rand(rng, N, C), _rand(rng, N, C, scale=4.0), _rand(rng, C)
    eps = 1e-6
    r_dev = cuda.to_device(r)
    y = _poisoned((N, C))
    launch_add_rms_norm(cuda.to_device(x), r_dev, cuda.to_device(w), eps, r_dev, y)
    h = x + r                                   # float32 add: exactly what the kernel does
    np.testing.assert_array_equal(r_dev.copy_to_host(), h)
    np.testing.assert_allclose(y.copy_to_host(), ops.rms_norm(h, w, eps), rtol=RTOL_NORM, atol=1e-7)


def test_head_rms_norm(rng):
    # Qwen3 q_norm: one weight vector [D] shared by every head, normalized per (token, head)
    T, H, D = 3, 4, 16
    x = _rand(rng, T, H, D, scale=2.0)
    w = _rand(rng, D)
    eps = 1e-6
    y = _poisoned((T, H, D))
    launch_head_rms_norm(cuda.to_device(x), cuda.to_device(w), eps, y)
    np.testing.assert_allclose(y.copy_to_host(), ops.rms_norm(x, w, eps), rtol=RTOL_NORM, atol=1e-7)


def test_gated_rms_norm(rng):
    # Gated DeltaNet output: per head rms_norm(o) * w * silu(z)
    T, H, D = 2, 3, 32
    x, z, w = _rand(rng, T, H, D), _rand(rng, T, H, D, scale=3.0), _rand(rng, D)
    eps = 1e-6
    y = _poisoned((T, H, D))
    launch_gated_rms_norm(cuda.to_device(x), cuda.to_device(z), cuda.to_device(w), eps, y)
    want = ops.rms_norm(x, w, eps).astype(np.float64) * ops.silu(z)
    np.testing.assert_allclose(y.copy_to_host(), want, rtol=RTOL_NORM, atol=1e-6)


# ---------------------------------------------------------------- activation.py


# exp(100) overflows float32 to inf (as on a GPU); the simulator's numpy says so out loud
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_swiglu(rng):
    g = _rand(rng, 5, 37, scale=4.0)
    g[0, :4] = [-100.0, 100.0, 0.0, -1e-3]      # exp overflow side, saturation, zero
    u = _rand(rng, 5, 37)
    y = _poisoned((5, 37))
    launch_swiglu(cuda.to_device(g), cuda.to_device(u), y)
    np.testing.assert_allclose(y.copy_to_host(), ops.swiglu(g, u), rtol=1e-6, atol=1e-7)


def test_swiglu_fused(rng):
    N, F = 3, 40
    gu = _rand(rng, N, 2 * F, scale=3.0)
    y = _poisoned((N, F))
    launch_swiglu_fused(cuda.to_device(gu), y)
    np.testing.assert_allclose(y.copy_to_host(), ops.swiglu(gu[:, :F], gu[:, F:]),
                               rtol=1e-6, atol=1e-7)


def test_swiglu_fused_q8_gives_swiglu_q8s_bits_on_the_two_halves(rng):
    """The stacked [gate | up] rows (decode and verify): y, int8 codes and scales bit for bit
    swiglu_q8's on the halves, y near ops.swiglu, codes / scales quantize_act's of that y."""
    N, F = 3, 96
    gu = _rand(rng, N, 2 * F, scale=3.0)
    gu[1, :32] = 0.0                            # an all-zero block: scale 0, codes 0
    y, xq, xd = _poisoned((N, F)), cuda.to_device(np.full(N * F, -128, np.int8)), \
        _poisoned(N * F // 32)
    launch_swiglu_fused_q8(cuda.to_device(gu), y, xq, xd)
    ry, rq, rd = _poisoned(N * F), cuda.to_device(np.zeros(N * F, np.int8)), _poisoned(N * F // 32)
    launch_swiglu_q8(cuda.to_device(np.ascontiguousarray(gu[:, :F])),
                     cuda.to_device(np.ascontiguousarray(gu[:, F:])), ry, rq, rd)
    got_y, got_q, got_d = y.copy_to_host(), xq.copy_to_host(), xd.copy_to_host()
    assert got_y.reshape(-1).view(np.uint32).tolist() == ry.copy_to_host().view(np.uint32).tolist()
    assert np.array_equal(got_q, rq.copy_to_host())
    assert got_d.view(np.uint32).tolist() == rd.copy_to_host().view(np.uint32).tolist()
    np.testing.assert_allclose(got_y, ops.swiglu(gu[:, :F], gu[:, F:]), rtol=1e-6, atol=1e-7)
    q_ref, d_ref = quantize_act_q8_reference(got_y.reshape(-1))
    assert np.array_equal(got_q, q_ref.reshape(-1)) and np.array_equal(got_d, d_ref.reshape(-1))
    with pytest.raises(ValueError, match="32-blocks"):
        launch_swiglu_fused_q8(cuda.to_device(np.ascontiguousarray(gu[:, :80])),
                               _poisoned((N, 40)), xq, xd)


def test_sigmoid_mul_in_place(rng):
    x = _rand(rng, 4, 48)
    gate = _rand(rng, 4, 48, scale=5.0)
    d = cuda.to_device(x)
    launch_sigmoid_mul(d, cuda.to_device(gate))
    want = x.astype(np.float64) * ops.sigmoid(gate)
    np.testing.assert_allclose(d.copy_to_host(), want, rtol=1e-6, atol=1e-7)


def test_add(rng):
    a, b = _rand(rng, 3, 70), _rand(rng, 3, 70)
    out = _poisoned((3, 70))
    launch_add(cuda.to_device(a), cuda.to_device(b), out)
    np.testing.assert_array_equal(out.copy_to_host(), a + b)


@pytest.mark.parametrize("one_step,split,max_threads", [
    (True, True, None), (True, False, None), (False, False, None), (False, True, None),
    (True, True, 64), (True, False, 64)],
    ids=["split", "one-step", "loop", "loop-split", "wide-split", "wide-loop"])
@pytest.mark.parametrize("N,C", [(1, 96), (2, 320), (1, 1024)])
def test_rms_norm_q8_is_norm_then_quantize(rng, monkeypatch, N, C, one_step, split,
                                           max_threads):
    """The fused norm + int8 quantizer writes exactly what rms_norm followed by quantize_act
    writes (same float32 y, same amax, d and rounding), bit for bit; C = 320 with a 128-thread
    block leaves the last step to some warps only; C = 1024 is 8 warps meeting in block_sum.
    (A 4096-wide row runs 1024 threads, more than the simulator's warp exchanges keep up with:
    the kernel-check on the GPU covers it.) The one-step path (x and w loaded before the
    reduction), on one block a row and split over a block per slot (C = 96 on 32 threads: 3
    blocks; C = 320 on 128: 3, the last one half idle), and the general loop, which rows of
    > 4 elements a thread take, on one block and split over a block per slot. "wide" caps the
    block at 64 threads, so that C = 320 and 1024 are rows of 5 and 16 elements a thread, as
    the 27B's 5120 is at the real cap of 1024: split (5 slots) and not (16 slots, over
    NORM_SPLIT_MAX_SLOTS)."""
    from bw24nb.kernels import norm
    from bw24nb.kernels.norm import launch_rms_norm_q8
    monkeypatch.setattr(norm, "ONE_STEP_ROWS", one_step)
    if max_threads is not None:
        monkeypatch.setattr(norm, "NORM_THREADS_MAX", max_threads)
    x = _rand(rng, N, C, scale=3.0)
    w = _rand(rng, C)
    eps = 1e-6
    xd_, wd = cuda.to_device(x), cuda.to_device(w)
    _assert_fused_q8_is_norm_then_quantize(
        N, C, lambda y: launch_rms_norm(xd_, wd, eps, y),
        lambda y, q, d: launch_rms_norm_q8(xd_, wd, eps, y, q, d, split=split))


def _assert_fused_q8_is_norm_then_quantize(N, C, norm, fused):
    """fused(y, q, d) writes y, xq, xd bit for bit as norm(y) then quantize_act(y) do, and
    nothing past the N * C codes / N * C / 32 scales."""
    from bw24nb.kernels.quantize_act import launch_quantize_act
    y_ref = _poisoned((N, C))
    norm(y_ref)
    q_ref = cuda.to_device(np.zeros(N * C, np.int8))
    d_ref = cuda.to_device(np.zeros(N * C // 32, np.float32))
    launch_quantize_act(y_ref, q_ref, d_ref)
    y = _poisoned((N, C))
    q = cuda.to_device(np.full(N * C + 8, 99, np.int8))
    d = cuda.to_device(np.full(N * C // 32 + 2, np.nan, np.float32))
    fused(y, q, d)
    np.testing.assert_array_equal(y.copy_to_host(), y_ref.copy_to_host())
    qh, dh = q.copy_to_host(), d.copy_to_host()
    np.testing.assert_array_equal(qh[:N * C], q_ref.copy_to_host())
    np.testing.assert_array_equal(dh[:N * C // 32], d_ref.copy_to_host())
    assert np.all(qh[N * C:] == 99) and np.all(np.isnan(dh[N * C // 32:]))


@pytest.mark.parametrize("one_step", [True, False], ids=["one-step", "loop"])
@pytest.mark.parametrize("N,C", [(3, 32), (4, 128), (2, 96)])
def test_gated_rms_norm_q8_is_gated_norm_then_quantize(rng, monkeypatch, N, C, one_step):
    """The Gated DeltaNet output norm with the int8 quantizer fused in writes exactly what
    gated_rms_norm followed by quantize_act writes, bit for bit (rows = value heads; the
    128-wide row of the real models runs 32 threads, 4 steps of one block per warp), on the
    one-step path and on the general loop."""
    from bw24nb.kernels import norm
    from bw24nb.kernels.norm import launch_gated_rms_norm_q8
    monkeypatch.setattr(norm, "ONE_STEP_ROWS", one_step)
    x = _rand(rng, N, C, scale=3.0)
    z = _rand(rng, N, C, scale=2.0)
    w = _rand(rng, C)
    eps = 1e-6
    xd_, zd, wd = cuda.to_device(x), cuda.to_device(z), cuda.to_device(w)
    _assert_fused_q8_is_norm_then_quantize(
        N, C, lambda y: launch_gated_rms_norm(xd_, zd, wd, eps, y),
        lambda y, q, d: launch_gated_rms_norm_q8(xd_, zd, wd, eps, y, q, d))


def test_gated_rms_norm_q8_refuses_rows_that_are_not_whole_blocks():
    from bw24nb.kernels.norm import launch_gated_rms_norm_q8
    x = cuda.to_device(np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        launch_gated_rms_norm_q8(x, x, cuda.to_device(np.ones(48, np.float32)), 1e-6, x,
                                 cuda.to_device(np.zeros(96, np.int8)),
                                 cuda.to_device(np.zeros(3, np.float32)))


@pytest.mark.parametrize("one_step", [True, False], ids=["one-step", "loop"])
@pytest.mark.parametrize("gated", [True, False])
def test_qk_head_norm_is_split_then_two_head_norms(rng, monkeypatch, gated, one_step):
    """One launch for q_norm, k_norm and (gated attention) the query / gate split: the same
    bits as launch_split_q_gate then launch_head_rms_norm of q and of k, on the one-step path
    (values and weights loaded before the reduction) and on the loop."""
    from bw24nb.kernels import norm
    from bw24nb.kernels.norm import launch_head_rms_norm, launch_qk_head_norm
    monkeypatch.setattr(norm, "ONE_STEP_ROWS", one_step)
    from bw24nb.kernels.rope import launch_split_q_gate
    T, Hq, Hk, D = 2, 3, 2, 64
    qg = _rand(rng, T, Hq * (2 if gated else 1) * D, scale=2.0)
    k = _rand(rng, T, Hk * D).reshape(T, Hk, D)
    wq, wk = _rand(rng, D), _rand(rng, D)
    eps = 1e-6
    # reference: the three launches
    q_ref = _poisoned((T, Hq, D))
    g_ref = _poisoned((T, Hq, D))
    if gated:
        launch_split_q_gate(cuda.to_device(qg), q_ref, g_ref)
    else:
        q_ref = cuda.to_device(qg.reshape(T, Hq, D))
    k_ref = cuda.to_device(k)
    launch_head_rms_norm(q_ref, cuda.to_device(wq), eps, q_ref)
    launch_head_rms_norm(k_ref, cuda.to_device(wk), eps, k_ref)
    # fused
    k_dev = cuda.to_device(k)
    if gated:
        q, gate, src = _poisoned((T, Hq, D)), _poisoned((T, Hq, D)), cuda.to_device(qg)
    else:
        q = cuda.to_device(qg.reshape(T, Hq, D))
        gate, src = None, q
    launch_qk_head_norm(src, q, cuda.to_device(wq), k_dev, cuda.to_device(wk), eps, gate=gate)
    np.testing.assert_array_equal(q.copy_to_host(), q_ref.copy_to_host())
    np.testing.assert_array_equal(k_dev.copy_to_host(), k_ref.copy_to_host())
    if gated:
        np.testing.assert_array_equal(gate.copy_to_host(), g_ref.copy_to_host())
