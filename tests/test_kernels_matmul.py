"""Prefill matmul kernel Y = X @ W^T (+ b) (+ R) for every weight type, against the numpy codec,
in the CUDA simulator on tiny shapes (partial tiles in both T and M, K over several slices)."""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_matmul
from bw24nb.kernels.dequant import LAYOUTS, random_weight_bytes
from bw24nb.kernels.matmul import matmul_reference
from bw24nb.quant import QType, dequantize

U = 2.0 ** -24          # float32 unit roundoff


def _tolerance(w_raw, qt, M, K, x, bias=None, residual=None):
    """Each output is a sequential float32 sum over ascending k (K products, K - 1 additions),
    then + bias + residual: a chain of h = K + 2 roundings, so
    |Y - Y_exact| <= gamma_h (sum_k |x_k w_k| + |b| + |r|), gamma_h = h u / (1 - h u).
    At K = 512 that is ~3.1e-5 relative -- a rigorous bound, not a guess."""
    h = K + 2
    gamma = h * U / (1 - h * U)
    s = np.abs(x.astype(np.float64)) @ np.abs(dequantize(w_raw, qt, (M, K)).astype(np.float64)).T
    if bias is not None:
        s += np.abs(bias)
    if residual is not None:
        s += np.abs(residual)
    return gamma * s


def _run(w, qt, M, K, x, bias=None, residual=None, in_place=False, skinny=True):
    T = x.shape[0]
    y = cuda.to_device(np.full((T, M), np.nan, np.float32))
    if in_place:
        y.copy_to_device(residual)
    launch_matmul(cuda.to_device(w), qt, M, K, cuda.to_device(x), y,
                  bias=None if bias is None else cuda.to_device(bias),
                  residual=None if residual is None else (y if in_place else cuda.to_device(residual)),
                  skinny=skinny)
    return y.copy_to_host()


@pytest.mark.parametrize("qt", list(LAYOUTS), ids=lambda q: q.name)
@pytest.mark.parametrize("T,M,K", [(5, 17, 256), (1, 3, 512)])
def test_matmul_matches_codec(rng, qt, T, M, K):
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = _run(w, qt, M, K, x)
    ref = matmul_reference(w, qt, M, K, x)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref), _tolerance(w, qt, M, K, x) + 1e-30)


@pytest.mark.parametrize("T,M,K,epilogue,skinny", [
    (11, 13, 136, True, True),      # 2 x 4 + 3 tokens, 13 rows over 8 warps, K = 128 + a partial step
    (3, 64, 260, False, True),      # every row a warp can own, K % 128 = 4: one lane's tail
    (1, 1, 4, True, True),          # one token, one row, one 16-byte group
    (11, 13, 136, True, False),     # the tiled kernel on the same F32 shape (skinny=False)
], ids=["11x13x136+b+r", "3x64x260", "1x1x4+b+r", "tiled-11x13x136+b+r"])
def test_matmul_f32_skinny(rng, T, M, K, epilogue, skinny):
    """matmul_f32_skinny (F32 weights of <= 64 rows: GDN's ssm_alpha / ssm_beta in prefill):
    any summation order of K products stays inside the same gamma bound."""
    qt = QType.F32
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = residual = None
    if epilogue:
        bias = (100 * rng.standard_normal(M)).astype(np.float32)
        residual = (100 * rng.standard_normal((T, M))).astype(np.float32)
    y = _run(w, qt, M, K, x, bias, residual, in_place=epilogue, skinny=skinny)
    ref = matmul_reference(w, qt, M, K, x, bias, residual)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref),
                                 _tolerance(w, qt, M, K, x, bias, residual) + 1e-30)


def test_matmul_dense_k_tail(rng):
    # K = 40 is one full 32-wide slice plus a partial one
    qt, T, M, K = QType.F16, 3, 5, 40
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = _run(w, qt, M, K, x)
    np.testing.assert_array_less(np.abs(y - matmul_reference(w, qt, M, K, x)),
                                 _tolerance(w, qt, M, K, x) + 1e-30)


@pytest.mark.parametrize("qt", [QType.Q6_K, QType.Q5_0], ids=lambda q: q.name)
@pytest.mark.parametrize("in_place", [False, True], ids=["residual", "in-place"])
def test_matmul_bias_residual(rng, qt, in_place):
    T, M, K = 5, 17, 256
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    # large enough that a dropped or doubled term is far outside the tolerance
    bias = (100 * rng.standard_normal(M)).astype(np.float32)
    residual = (100 * rng.standard_normal((T, M))).astype(np.float32)
    y = _run(w, qt, M, K, x, bias, residual, in_place)
    ref = matmul_reference(w, qt, M, K, x, bias, residual)
    np.testing.assert_array_less(np.abs(y - ref), _tolerance(w, qt, M, K, x, bias, residual))


def test_matmul_rejects_bad_shapes():
    w = cuda.to_device(np.zeros(3 * 34 * 8, np.uint8))
    with pytest.raises(ValueError, match=r"x must be float32\[T, 256\]"):
        launch_matmul(w, QType.Q8_0, 3, 256, cuda.to_device(np.zeros((2, 128), np.float32)),
                      cuda.to_device(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match=r"y must be float32\[2, 3\]"):
        launch_matmul(w, QType.Q8_0, 3, 256, cuda.to_device(np.zeros((2, 256), np.float32)),
                      cuda.to_device(np.zeros((3, 2), np.float32)))
