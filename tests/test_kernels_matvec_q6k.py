"""The Q6_K_R repack (bw24nb/kernels/matvec_q6k.py) and its 16-byte-load dp4a matvec, against
the generic references on the ORIGINAL GGUF bytes, in the CUDA simulator on tiny shapes.

Weights are random bytes with valid f16 scales (dequant.random_weight_bytes): every quant, high
bit and signed sub-scale pattern occurs. Outputs are poisoned with NaN, with guard elements past
the end that must survive.
"""
import math

import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_quantize_act
from bw24nb.kernels.dequant import Q6_K_OFF_D, random_weight_bytes
from bw24nb.kernels.matvec import launch_matvec_q8, matvec_q8_reference
from bw24nb.kernels.matvec_q6k import (
    Q6_K_R_BODY_BYTES,
    launch_matvec_q8_q6k_r,
    matvec_q8_q6k_r_reference,
    repack_q6_k,
    unpack_q6_k,
)
from bw24nb.kernels.quantize_act import dequantize_act_q8, quantize_act_q8_reference
from bw24nb.quant import QType, dequantize

Q6 = QType.Q6_K
M, K = 5, 512           # 5 rows: with 4 warps a block, some warps of the last block have none
U = 2.0 ** -24
GUARD = 1234.5


def _guarded(n, guard=4):
    a = np.full(n + guard, np.nan, dtype=np.float32)
    a[n:] = GUARD
    return cuda.to_device(a)


def _run(w_raw, xq, xd, bias=None, residual=None, parts=None, in_place=False, rows=M, k=K):
    """Repack on the host, launch on the device; returns y (the guard checked)."""
    body, d = repack_q6_k(w_raw, rows, k)
    y_full = _guarded(rows)
    y = y_full[:rows]
    if in_place:
        y.copy_to_device(residual)
    launch_matvec_q8_q6k_r(cuda.to_device(body), cuda.to_device(d), rows, k,
                           cuda.to_device(xq), cuda.to_device(xd), y,
                           bias=None if bias is None else cuda.to_device(bias),
                           residual=None if residual is None else
                           (y if in_place else cuda.to_device(residual)),
                           parts=parts)
    out = y_full.copy_to_host()
    assert np.all(out[rows:] == np.float32(GUARD)), "kernel wrote past the end of y"
    return out[:rows]


# ---------------------------------------------------------------- the layout


def test_repack_layout_and_round_trip(rng):
    w = random_weight_bytes(rng, Q6, M, K)
    body, d = repack_q6_k(w, M, K)
    nblk = K // 256
    assert body.dtype == np.uint8 and body.shape == (M, nblk * 208)
    assert d.dtype == np.float16 and d.shape == (M, nblk)
    assert Q6_K_R_BODY_BYTES == 208 and 208 % 16 == 0       # every block body 16-byte aligned
    blocks = w.reshape(M, nblk, 210)
    # body = each block's ql | qh | scales back to back; d = each block's trailing f16
    np.testing.assert_array_equal(body.reshape(M, nblk, 208), blocks[:, :, :208])
    np.testing.assert_array_equal(d.view(np.uint16),
                                  blocks[:, :, Q6_K_OFF_D:].copy().view("<u2").reshape(M, nblk))
    back = unpack_q6_k(body, d, M, K)
    assert back.dtype == np.uint8 and back.shape == w.shape
    assert back.tobytes() == w.tobytes()                    # bit-exact, NaN-free or not


def test_repack_round_trip_any_bits(rng):
    # all 2^16 f16 patterns (NaNs, infinities, -0.0) survive the round trip bit for bit
    Mr, Kr = 256, 256 * 256                         # 65536 blocks, one per f16 pattern
    w = rng.integers(0, 256, size=(Mr * 256, 210), dtype=np.uint8)
    w[:, Q6_K_OFF_D:] = np.arange(2 ** 16, dtype="<u2").view(np.uint8).reshape(-1, 2)
    w = w.reshape(Mr, -1)
    body, d = repack_q6_k(w, Mr, Kr)
    np.testing.assert_array_equal(d.reshape(-1).view(np.uint16), np.arange(2 ** 16))
    assert unpack_q6_k(body, d, Mr, Kr).tobytes() == w.tobytes()


def test_repack_rejects_wrong_sizes():
    with pytest.raises(ValueError, match="whole blocks of 256"):
        repack_q6_k(np.zeros(210, np.uint8), 1, 200)
    with pytest.raises(ValueError, match="is 420 bytes"):
        repack_q6_k(np.zeros(210, np.uint8), 1, 512)
    with pytest.raises(ValueError, match="body uint8"):
        unpack_q6_k(np.zeros(208, np.uint8), np.zeros(2, np.float16), 1, 256)


# ---------------------------------------------------------------- the kernel, exact

# Largest |integer weight| per element in units of d: |sc| <= 128 times |q - 32| <= 32.
MAX_INT_W = 128 * 32


def _exact_inputs(rng, k=K):
    """Every f16 d = 2^-6 and every activation scale 2^-3: each term of the dot is an integer
    times 2^-9, and with |xq| <= bound every partial sum (integer or float, in any order) stays
    below 2^24 such units, so every float32 operation of the kernel is exact: the result must
    equal the float64 reference bit for bit. Any slip in a nibble, a high bit, a signed scale,
    the -32 offset, an activation word or scale shows up as an inequality."""
    w = random_weight_bytes(rng, Q6, M, k, f16_value=2.0 ** -6)
    bound = min(127, (2 ** 24 - 1) // (k * MAX_INT_W))
    xq = rng.integers(-bound, bound + 1, size=k).astype(np.int8)
    xq[:2] = [bound, -bound]
    xd = np.full(k // 32, 2.0 ** -3, np.float32)
    return w, xq, xd


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_integer_part_exact(rng, parts):
    w, xq, xd = _exact_inputs(rng)
    ref = matvec_q8_reference(w, Q6, M, K, xq, xd)           # the GGUF bytes, not the repack
    assert np.array_equal(ref.astype(np.float32).astype(np.float64), ref)   # ref exact too
    y = _run(w, xq, xd, parts=parts)
    np.testing.assert_array_equal(y, ref.astype(np.float32), err_msg=f"parts={parts}")


def test_exact_bias_residual_and_generic_kernel_agree(rng):
    """Same exact inputs with a power-of-two-grid bias and residual: the sum stays exact, so the
    new kernel, the generic dp4a kernel and the reference agree bit for bit."""
    w, xq, xd = _exact_inputs(rng)
    bias = rng.integers(-1000, 1000, M).astype(np.float32) * np.float32(2.0 ** -9)
    residual = rng.integers(-1000, 1000, M).astype(np.float32) * np.float32(2.0 ** -9)
    ref = matvec_q8_reference(w, Q6, M, K, xq, xd, bias, residual)
    assert np.array_equal(ref.astype(np.float32).astype(np.float64), ref)
    y = _run(w, xq, xd, bias=bias, residual=residual)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    y_generic = _guarded(M)
    launch_matvec_q8(cuda.to_device(w), Q6, M, K, cuda.to_device(xq), cuda.to_device(xd),
                     y_generic[:M], bias=cuda.to_device(bias), residual=cuda.to_device(residual))
    np.testing.assert_array_equal(y_generic.copy_to_host()[:M], y)


# ---------------------------------------------------------------- the kernel, realistic scales


def _bound(w, xq, xd, bias, residual, rows=M, k=K):
    """Rounding bound, from the module's summation order: each quarter term rounds twice
    ((d*sc)*xd, then * isum; d*sc and isum are exact), 3 additions inside a chunk, then the
    lane's running sum over ceil(chunks / 32) chunks, 5 in warp_sum's tree, <= 2 in the parts
    combine, 2 for bias and residual: a chain of h roundings, so |y - y_exact| <=
    gamma_h * (sum |w x| + |b| + |r|), gamma_h = h u / (1 - h u). Doubled for second-order
    terms; at K = 512 this is ~2e-6 relative to sum |w x|, orders of magnitude below one wrong
    quant (>= |d sc xd| ~ 1e-5 of it here)."""
    h = 2 + 3 + math.ceil(k // 256 * 4 / 32) + 5 + 2 + 2
    gamma = h * U / (1 - h * U)
    wabs = np.abs(dequantize(w, Q6, (rows, k)).astype(np.float64))
    mag = wabs @ np.abs(dequantize_act_q8(xq, xd))
    if bias is not None:
        mag += np.abs(bias)
    if residual is not None:
        mag += np.abs(residual)
    return 2 * gamma * mag + 2.0 ** -126


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_end_to_end_bias_residual(rng, parts):
    """quantize_act on the device, then the kernel on realistic scales, + bias + residual."""
    w = random_weight_bytes(rng, Q6, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    residual = rng.standard_normal(M).astype(np.float32)
    xq_dev = cuda.to_device(np.zeros(K, np.int8))
    xd_dev = cuda.to_device(np.zeros(K // 32, np.float32))
    launch_quantize_act(cuda.to_device(x), xq_dev, xd_dev)
    xq, xd = xq_dev.copy_to_host(), xd_dev.copy_to_host()
    q_ref, d_ref = quantize_act_q8_reference(x)
    np.testing.assert_array_equal(xq, q_ref)
    np.testing.assert_array_equal(xd, d_ref)
    y = _run(w, xq, xd, bias=bias, residual=residual, parts=parts)
    ref = matvec_q8_reference(w, Q6, M, K, xq, xd, bias, residual)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref), _bound(w, xq, xd, bias, residual))
    body, d = repack_q6_k(w, M, K)
    np.testing.assert_array_equal(matvec_q8_q6k_r_reference(body, d, M, K, xq, xd, bias, residual),
                                  ref)


def test_in_place_residual_odd_blocks(rng):
    """y += W x in place (residual is y), K = 768 (3 blocks = 12 chunks: a warp with idle lanes)
    and the default parts."""
    k = 768
    w = random_weight_bytes(rng, Q6, M, k)
    xq, xd = quantize_act_q8_reference(rng.standard_normal(k).astype(np.float32))
    residual = (100 * rng.standard_normal(M)).astype(np.float32)
    y = _run(w, xq, xd, residual=residual, in_place=True, k=k)
    ref = matvec_q8_reference(w, Q6, M, k, xq, xd, residual=residual)
    np.testing.assert_array_less(np.abs(y - ref), _bound(w, xq, xd, None, residual, k=k))


def test_launcher_rejects_bad_inputs():
    nblk = K // 256
    body = cuda.to_device(np.zeros(M * nblk * 208, np.uint8))
    d = cuda.to_device(np.zeros(M * nblk, np.float16))
    xq = cuda.to_device(np.zeros(K, np.int8))
    xd = cuda.to_device(np.zeros(K // 32, np.float32))
    y = cuda.to_device(np.zeros(M, np.float32))
    with pytest.raises(ValueError, match="body must be uint8"):
        launch_matvec_q8_q6k_r(cuda.to_device(np.zeros(M * nblk * 210, np.uint8)), d, M, K, xq, xd, y)
    with pytest.raises(ValueError, match="d must be float16"):
        launch_matvec_q8_q6k_r(body, cuda.to_device(np.zeros(M * nblk, np.float32)), M, K, xq, xd, y)
    with pytest.raises(ValueError, match="xq must be int8"):
        launch_matvec_q8_q6k_r(body, d, M, K, cuda.to_device(np.zeros(K, np.float32)), xd, y)
    with pytest.raises(ValueError, match="y must be float32"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, cuda.to_device(np.zeros(M - 1, np.float32)))
    with pytest.raises(ValueError, match="parts"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, y, parts=3)
    with pytest.raises(ValueError, match="whole blocks"):
        launch_matvec_q8_q6k_r(body, d, M, 300, xq, xd, y)


# ---------------------------------------------------------------- several rows (rows = T)


def _run_rows(w_raw, xq, xd, T, bias=None, residual=None, in_place=False, parts=None):
    """One rows=T launch (xq int8[T*K], xd float32[T*K/32], residual float32[T, M]); returns
    y[T, M] (the guard checked)."""
    body, d = repack_q6_k(w_raw, M, K)
    y_full = _guarded(T * M)
    y = y_full[:T * M]
    if in_place:
        y.copy_to_device(residual.reshape(-1))
    launch_matvec_q8_q6k_r(cuda.to_device(body), cuda.to_device(d), M, K, cuda.to_device(xq),
                           cuda.to_device(xd), y,
                           bias=None if bias is None else cuda.to_device(bias),
                           residual=None if residual is None else
                           (y if in_place else cuda.to_device(residual)),
                           parts=parts, rows=T)
    out = y_full.copy_to_host()
    assert np.all(out[T * M:] == np.float32(GUARD)), "kernel wrote past the end of y"
    return out[:T * M].reshape(T, M)


@pytest.mark.parametrize("T,in_place,parts", [(4, False, None), (3, True, 4)])
def test_rows_equal_one_row_launches(rng, T, in_place, parts):
    """rows = T: row t is bit for bit the rows = 1 launch on row t's inputs (speculative
    decoding's verify must reproduce plain decode exactly), and inside the one-row bound of the
    reference; with the default split (2 warps a row at K = 512) and with 4 warps a row."""
    w = random_weight_bytes(rng, Q6, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    bias = rng.standard_normal(M).astype(np.float32)
    residual = (10 * rng.standard_normal((T, M))).astype(np.float32)
    y = _run_rows(w, xq, xd, T, bias, residual, in_place, parts)
    for t in range(T):
        xq_t, xd_t = xq[t * K:(t + 1) * K], xd[t * K // 32:(t + 1) * K // 32]
        one = _run(w, xq_t, xd_t, bias=bias, residual=residual[t], parts=parts, in_place=in_place)
        np.testing.assert_array_equal(y[t].view(np.uint32), one.view(np.uint32), err_msg=f"row {t}")
        ref = matvec_q8_reference(w, Q6, M, K, xq_t, xd_t, bias, residual[t])
        np.testing.assert_array_less(np.abs(y[t] - ref), _bound(w, xq_t, xd_t, bias, residual[t]),
                                     err_msg=f"row {t}")


def test_rows_launcher_rejects_bad_rows_and_short_buffers():
    nblk = K // 256
    body = cuda.to_device(np.zeros(M * nblk * 208, np.uint8))
    d = cuda.to_device(np.zeros(M * nblk, np.float16))
    xq = cuda.to_device(np.zeros(2 * K, np.int8))
    xd = cuda.to_device(np.zeros(2 * K // 32, np.float32))
    y = cuda.to_device(np.zeros(2 * M, np.float32))
    with pytest.raises(ValueError, match="rows"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, y, rows=0)
    with pytest.raises(ValueError, match="rows"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, y, rows=10)
    with pytest.raises(ValueError, match=r"xq must be int8\[1536\] and xd float32\[48\]"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, cuda.to_device(np.zeros(3 * M, np.float32)),
                               rows=3)
    with pytest.raises(ValueError, match=r"y must be float32 with at least rows x M = 3 x 5 = 15"):
        launch_matvec_q8_q6k_r(body, d, M, K, cuda.to_device(np.zeros(3 * K, np.int8)),
                               cuda.to_device(np.zeros(3 * K // 32, np.float32)), y, rows=3)
    with pytest.raises(ValueError, match=r"residual must be float32 with at least rows x M"):
        launch_matvec_q8_q6k_r(body, d, M, K, xq, xd, y,
                               residual=cuda.to_device(np.zeros(M, np.float32)), rows=2)


@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize("T,in_place", [(2, False), (3, True), (1, True)])
def test_rows_on_weight_row_pairs_give_the_rows_kernels_bits(rng, monkeypatch, T, in_place, R):
    """matvec.ROWS_PAIRS / ONE_ROW_PAIRS (run_bench --launch rows-pairs, decode-pairs): a
    launch at one warp a row takes two weight rows a warp (`rows_pair_kernel_of`, its own build
    and a grid of half the warps); every output is the row loop's, bit for bit, M odd (the
    last warp's second row is past the end), bias and residual (in place too); R = 2 or 4
    weight rows a warp (matvec.PAIR_ROWS_PER_WARP; at 4, M = 5 leaves 3 rows of the second
    warp past the end)."""
    from bw24nb.kernels import matvec, matvec_q6k
    w = random_weight_bytes(rng, Q6, M, K)
    xq, xd = quantize_act_q8_reference(rng.standard_normal((T, K)).astype(np.float32))
    bias = rng.standard_normal(M).astype(np.float32)
    residual = (10 * rng.standard_normal((T, M))).astype(np.float32)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", False)         # (on by default since session 31)
    monkeypatch.setattr(matvec, "ONE_ROW_PAIRS", False)
    assert "_w" not in matvec_q6k.KERNELS(T, 1, K).py_func.__name__
    plain = _run_rows(w, xq, xd, T, bias, residual, in_place, parts=1)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", T > 1)
    monkeypatch.setattr(matvec, "ONE_ROW_PAIRS", T == 1)
    monkeypatch.setattr(matvec, "PAIR_ROWS_PER_WARP", R)
    monkeypatch.setattr(matvec, "QUADS_FROM_ROWS", 1)         # R at every T (T = 2 too)
    monkeypatch.setattr(matvec, "PAIRS_UP_TO_M", 0)           # and every M
    assert f"_w{R}_p1" in matvec_q6k.KERNELS(T, 1, K).py_func.__name__
    assert "_w" not in matvec_q6k.KERNELS(T, 2, K).py_func.__name__      # split rows: no pairs
    assert "_w" not in matvec_q6k.KERNELS(3 - min(T, 2), 1, K).py_func.__name__
    pairs = _run_rows(w, xq, xd, T, bias, residual, in_place, parts=1)
    assert np.all(np.isfinite(plain))
    np.testing.assert_array_equal(pairs.view(np.uint32), plain.view(np.uint32))
