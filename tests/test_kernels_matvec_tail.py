"""The norm tail (bw24nb/kernels/matvec.py `row_tail_kernel`, norm.q8_tail): a decode matvec
whose last block runs rms_norm_q8 on the row the grid has just written. Against the two
launches it replaces -- the matvec, then norm.launch_rms_norm_q8 -- bit for bit: the matvec's
output and the norm's float row, int8 codes and scales. In the CUDA simulator on small shapes;
outputs poisoned, fresh random inputs.

M = 640 rows: the norm's block for a 640-wide row is 256 threads, so each of the tail's 128
threads plays two of them and the last virtual threads hold fewer elements (the 0.5B's 896 is
the same case); M = 512 is the one-to-one case; M = 96 a norm block of 32 threads, the tail's
other 96 adding nothing to the sum (the test models' rows).
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_quantize_act
from bw24nb.kernels.dequant import random_weight_bytes
from bw24nb.kernels.matvec import NormTail, launch_matvec_q8, tail_serves
from bw24nb.kernels.matvec_q6k import launch_matvec_q8_q6k_r, repack_q6_k
from bw24nb.kernels.norm import launch_rms_norm_q8
from bw24nb.quant import QType

EPS = 1e-6


def _inputs(rng, M, K):
    x = rng.standard_normal(K).astype(np.float32)
    xq = cuda.to_device(np.zeros(K, np.int8))
    xd = cuda.to_device(np.zeros(K // 32, np.float32))
    launch_quantize_act(cuda.to_device(x), xq, xd)
    residual = (rng.standard_normal(M) * 4).astype(np.float32)
    wn = (1.0 + 0.5 * rng.standard_normal(M)).astype(np.float32)
    return xq, xd, residual, cuda.to_device(wn)


def _outputs(M):
    """y (the norm's float row), its codes and scales: poisoned, with guards past the end."""
    return (cuda.to_device(np.full(M + 4, np.nan, np.float32)),
            cuda.to_device(np.full(M + 8, 99, np.int8)),
            cuda.to_device(np.full(M // 32 + 2, np.nan, np.float32)))


def _host(M, h, y, q, d):
    hh, yh, qh, dh = (a.copy_to_host() for a in (h, y, q, d))
    assert np.all(np.isnan(yh[M:])) and np.all(qh[M:] == 99) and np.all(np.isnan(dh[M // 32:]))
    return hh, yh[:M], qh[:M], dh[:M // 32]


def _launcher(qt, w, M, K):
    """launch(xq, xd, h, tail) -> carried: h += W x on the engine's decode path for qt."""
    if qt == QType.Q6_K:
        body, d = (cuda.to_device(a) for a in repack_q6_k(w, M, K))
        return lambda xq, xd, h, tail, parts=None: launch_matvec_q8_q6k_r(
            body, d, M, K, xq, xd, h, residual=h, parts=parts, tail=tail)
    wd = cuda.to_device(w)
    return lambda xq, xd, h, tail, parts=None: launch_matvec_q8(
        wd, qt, M, K, xq, xd, h, residual=h, parts=parts, tail=tail)


@pytest.mark.parametrize("qt,M,K,parts", [
    (QType.Q8_0, 640, 64, None), (QType.Q5_0, 640, 96, None), (QType.Q4_K, 512, 256, None),
    (QType.Q6_K, 640, 256, None), (QType.Q8_0, 512, 64, 2), (QType.Q8_0, 96, 64, None)],
    ids=["q8_0", "q5_0", "q4_k", "q6_k_r", "q8_0-parts2", "q8_0-short"])
def test_norm_tail_gives_the_matvec_then_norm_bits(rng, qt, M, K, parts):
    """h += W x, then rms_norm_q8(h): the one launch with the tail against the two launches,
    bit for bit, twice over (the counter is back at zero after each launch; a second launch on
    the first one's output normalizes a new row)."""
    w = random_weight_bytes(rng, qt, M, K)
    xq, xd, residual, wn = _inputs(rng, M, K)
    launch = _launcher(qt, w, M, K)
    h_ref, h = cuda.to_device(residual), cuda.to_device(residual)
    counter = cuda.to_device(np.zeros(1, np.int32))
    for _ in range(2):
        y_ref, q_ref, d_ref = _outputs(M)
        assert not launch(xq, xd, h_ref, None, parts)
        launch_rms_norm_q8(h_ref.reshape(1, M), wn, EPS, y_ref[:M].reshape(1, M), q_ref, d_ref)
        y, q, d = _outputs(M)
        assert launch(xq, xd, h, NormTail(wn, EPS, y, q, d, counter), parts)
        ref = _host(M, h_ref, y_ref, q_ref, d_ref)
        got = _host(M, h, y, q, d)
        for name, a, b in zip(("h", "y", "codes", "scales"), got, ref):
            np.testing.assert_array_equal(a, b, err_msg=name)
        assert np.all(np.isfinite(got[1])) and counter.copy_to_host()[0] == 0


def test_norm_tail_is_declined_where_the_row_loop_does_not_run():
    """A launch whose kernel cannot carry the tail says so (the engine then launches the
    norm): several activation rows, weight rows in pairs, a norm over other than the M
    outputs, a row too short for a 128-thread tail."""
    tail = NormTail(np.zeros(640, np.float32), EPS, None, None, None, None)
    assert tail_serves(1, 1, 640, tail)
    assert not tail_serves(2, 1, 640, tail)
    assert not tail_serves(1, 2, 640, tail)
    assert not tail_serves(1, 1, 512, tail)
    assert not tail_serves(1, 1, 640, None)
    odd = NormTail(np.zeros(80, np.float32), EPS, None, None, None, None)
    assert not tail_serves(1, 1, 80, odd)        # not whole 32-blocks


def test_norm_tail_not_carried_leaves_its_outputs_alone(rng):
    """rows = 2: the rows kernel runs, without the tail, and the norm's outputs stay poisoned."""
    M, K = 512, 64
    w = random_weight_bytes(rng, QType.Q8_0, M, K)
    x = rng.standard_normal(2 * K).astype(np.float32)
    xq = cuda.to_device(np.zeros(2 * K, np.int8))
    xd = cuda.to_device(np.zeros(2 * K // 32, np.float32))
    launch_quantize_act(cuda.to_device(x), xq, xd)
    h = cuda.to_device(np.zeros(2 * M, np.float32))
    y, q, d = _outputs(M)
    counter = cuda.to_device(np.zeros(1, np.int32))
    tail = NormTail(cuda.to_device(np.ones(M, np.float32)), EPS, y, q, d, counter)
    assert not launch_matvec_q8(cuda.to_device(w), QType.Q8_0, M, K, xq, xd, h, rows=2, tail=tail)
    assert np.all(np.isnan(y.copy_to_host())) and np.all(q.copy_to_host() == 99)
    assert np.all(np.isfinite(h.copy_to_host()))
