"""The Q8_0 / Q5_0 / Q4_0 decode matvec on 16-byte loads of the GGUF blocks (kernels/matvec_qx0.py),
in the CUDA simulator: exact against the float64 reference where every float op is exact, its
documented summation order bit for bit where it is not, the rows kernels equal to one-row
launches, rows whose blocks start at every 2-byte offset of a 16-byte window, a buffer whose last
block ends on its last byte, and the generic path for buffers it may not read.

Fresh random weights (`random_weight_bytes`: every quant and high-bit pattern) and activations
each run; outputs poisoned with NaN, with guard values past the end that must survive.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_matvec_q8, matvec, matvec_qx0
from bw24nb.kernels.dequant import random_weight_bytes
from bw24nb.kernels.matvec import matvec_q8_reference
from bw24nb.kernels.quantize_act import dequantize_act_q8, quantize_act_q8_reference
from bw24nb.ptx.warp import warp_tree_sum_host
from bw24nb.quant import QType, dequantize
from bw24nb.quant.types import type_size

TYPES = [QType.Q8_0, QType.Q5_0, QType.Q4_0]
# largest |q - bias| of a type: bounds the integer sums of the exactness test below 2^24
_MAX_INT_W = {QType.Q8_0: 128, QType.Q5_0: 16, QType.Q4_0: 8}
GUARD = np.float32(1234.5)


def _run(w, qt, M, K, xq, xd, rows=1, parts=None, bias=None, residual=None):
    """launch_matvec_q8 on a fresh device copy of w (exactly its bytes), y poisoned and guarded."""
    y_full = cuda.to_device(np.concatenate([np.full(rows * M, np.nan, np.float32),
                                            np.full(4, GUARD, np.float32)]))
    launch_matvec_q8(cuda.to_device(np.ascontiguousarray(w).reshape(-1)), qt, M, K,
                     cuda.to_device(xq[:rows * K]), cuda.to_device(xd[:rows * K // 32]),
                     y_full[:rows * M], rows=rows, parts=parts,
                     bias=None if bias is None else cuda.to_device(bias),
                     residual=None if residual is None else cuda.to_device(residual))
    out = y_full.copy_to_host()
    assert np.all(out[rows * M:] == GUARD), "kernel wrote past the end of y"
    return out[:rows * M].reshape(rows, M)


def _uses_new_path(w, qt):
    return qt in matvec_qx0.PATHS and matvec_qx0.usable(cuda.to_device(w.reshape(-1)))


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("M,K", [(8, 96), (16, 160), (8, 896)])
def test_qx0_integer_part_exact_at_every_alignment(rng, qt, M, K):
    """Row lengths of 3, 5 and 28 blocks start blocks at every even offset of a 16-byte window
    (34 / 22 / 18-byte blocks), so every rotation and byte join of the line-up runs. With f16
    scales 2^-6 and activation scales 2^-3 every float op is exact: bit for bit the reference."""
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    assert _uses_new_path(w, qt)
    starts = {(r * (K // 32) + b) * type_size(qt) % 16 for r in range(M) for b in range(K // 32)}
    assert starts == set(range(0, 16, 2))
    bound = min(127, (2 ** 24 - 1) // (K * _MAX_INT_W[qt]))
    xq = rng.integers(-bound, bound + 1, size=2 * K).astype(np.int8)
    xd = np.full(2 * K // 32, 2.0 ** -3, np.float32)
    out = _run(w, qt, M, K, xq, xd, rows=2)
    for t in range(2):
        ref = matvec_q8_reference(w, qt, M, K, xq[t * K:(t + 1) * K], xd[t * K // 32:(t + 1) * K // 32])
        assert np.array_equal(ref.astype(np.float32).astype(np.float64), ref)
        np.testing.assert_array_equal(out[t], ref.astype(np.float32))


def _row_in_kernel_order(w_row, qt, xq, xd, parts):
    """float32 emulation of matvec_qx0's documented order for one row (no fused multiply-add,
    as the simulator): block values (d xd) S, lane sums, the warp butterfly, the row's warps."""
    f32 = np.float32
    ts = type_size(qt)
    blocks = np.asarray(w_row, np.uint8).reshape(-1, ts)
    d = blocks[:, 0:2].copy().view(np.float16).astype(f32).reshape(-1)
    x = xq.astype(np.int64).reshape(-1, 32)
    if qt == QType.Q8_0:
        q = blocks[:, 2:34].view(np.int8).astype(np.int64)
    else:
        qs = blocks[:, -16:].astype(np.int64)
        q = np.concatenate([qs & 15, qs >> 4], axis=1)
        if qt == QType.Q5_0:
            qh = blocks[:, 2:6].copy().view("<u4").astype(np.int64).reshape(-1, 1)
            q = q | (((qh >> np.arange(32)) & 1) << 4)
            q -= 16
        else:
            q -= 8
    S = (q * x).sum(axis=1)
    v = [f32(f32(d[b] * xd[b]) * f32(S[b])) for b in range(len(blocks))]
    total = f32(0.0)
    for wp in range(parts):
        lanes = np.zeros(32, f32)
        for lane in range(32):
            for b in range(32 * wp + lane, len(blocks), 32 * parts):
                lanes[lane] = f32(lanes[lane] + v[b])
        total = (warp_tree_sum_host(lanes) if wp == 0
                 else f32(total + warp_tree_sum_host(lanes)))
    return total


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("parts", [1, 2])
def test_qx0_is_its_documented_order_bit_for_bit(rng, qt, parts):
    """Realistic scales: every row equals a float32 emulation of the documented order exactly
    (one rounding a block, lane sums over 2-5 blocks, the butterfly, the warps), and the rows
    kernel gives every row the same bits."""
    M, K, T = 8, 4096 + 96, 2               # 131 blocks a row: 2-5 a lane, so order shows
    w = random_weight_bytes(rng, qt, M, K)
    assert _uses_new_path(w, qt)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    rows_w = w.reshape(M, -1)
    for rows in (1, T):
        out = _run(w, qt, M, K, xq, xd, rows=rows, parts=parts)
        for t in range(rows):
            want = [_row_in_kernel_order(rows_w[r], qt, xq[t * K:(t + 1) * K],
                                         xd[t * K // 32:(t + 1) * K // 32], parts)
                    for r in range(M)]
            np.testing.assert_array_equal(out[t].view(np.uint32),
                                          np.array(want, np.float32).view(np.uint32))


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_qx0_rows_equal_one_row_launches_with_bias_and_residual(rng, qt):
    """T = 3 rows in one launch: each row bit for bit its own one-row launch, bias and
    residual included; and within the rounding bound of the float64 reference."""
    M, K, T = 12, 896, 3
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    bias = rng.standard_normal(M).astype(np.float32)
    res = rng.standard_normal(T * M).astype(np.float32)
    out = _run(w, qt, M, K, xq, xd, rows=T, bias=bias, residual=res)
    for t in range(T):
        one = _run(w, qt, M, K, xq[t * K:], xd[t * K // 32:], bias=bias,
                   residual=res[t * M:(t + 1) * M])[0]
        np.testing.assert_array_equal(out[t].view(np.uint32), one.view(np.uint32))
        ref = matvec_q8_reference(w, qt, M, K, xq[t * K:(t + 1) * K],
                                  xd[t * K // 32:(t + 1) * K // 32], bias, res[t * M:(t + 1) * M])
        # the float path's bound (tests/test_kernels_matvec.py: FLOAT_PATH_REL) on the sum of
        # the magnitudes the result is made of
        scale = _magnitudes(w, qt, M, K, xq[t * K:(t + 1) * K],
                            xd[t * K // 32:(t + 1) * K // 32]) + np.abs(bias) \
            + np.abs(res[t * M:(t + 1) * M])
        np.testing.assert_array_less(np.abs(out[t] - ref), 1e-5 * scale)


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_qx0_last_block_ends_the_buffer(rng, qt):
    """One row of 8 blocks is a whole number of 16-byte words (8 x 34 = 272, 8 x 22 = 176,
    8 x 18 = 144) and its last block's quants start on a word: the window's last vector would
    lie past the buffer's end and must be clamped (the simulator faults on an out-of-bounds
    vector load, as the GPU would)."""
    M, K = 1, 256
    w = random_weight_bytes(rng, qt, M, K)
    assert w.size % 16 == 0 and _uses_new_path(w, qt)
    last_quants = 7 * type_size(qt) + {QType.Q8_0: 2, QType.Q5_0: 6, QType.Q4_0: 2}[qt]
    assert last_quants % 16 == 0
    _assert_close_to_reference(rng, w, qt, M, K)


def _assert_close_to_reference(rng, w, qt, M, K):
    """One launch on fresh activations, within the float path's rounding of the reference:
    1e-5 of the sum of the magnitudes each row is made of (a bound relative to the result
    itself fails by chance when the row's terms cancel: BW24_TEST_SEED=3634888822 gave one
    Q5_0 row of 0.0060 from terms ~50x larger)."""
    x = rng.standard_normal(K).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    out = _run(w, qt, M, K, xq, xd)[0]
    ref = matvec_q8_reference(w, qt, M, K, xq, xd)
    np.testing.assert_array_less(np.abs(out - ref), 1e-5 * _magnitudes(w, qt, M, K, xq, xd))


def _magnitudes(w, qt, M, K, xq, xd):
    """|W| @ |x| per row (float64): the sum of the magnitudes a row is made of, the scale of
    the float path's rounding."""
    return np.abs(dequantize(w, qt, (M, K)).astype(np.float64)) @ np.abs(
        dequantize_act_q8(xq, xd))


def test_qx0_unusable_buffers_take_the_generic_path(rng, monkeypatch):
    """A buffer of 3 x 102 bytes (not whole 16-byte words) is not read with vector loads: the
    generic path runs (asserted by making the new path's launcher fail) and is right."""
    qt, M, K = QType.Q8_0, 3, 96
    w = random_weight_bytes(rng, qt, M, K)
    assert w.size % 16 and not _uses_new_path(w, qt)

    def refuse(*a, **k):
        raise AssertionError("matvec_qx0 launched on a buffer it may not read")
    monkeypatch.setattr(matvec_qx0, "launch", refuse)
    _assert_close_to_reference(rng, w, qt, M, K)


def test_qx0_switch_off_gives_the_generic_path(rng, monkeypatch):
    """matvec.QX0_V4 = False (what bench/matvec_bench.py compares against) keeps the group
    path; both agree within rounding."""
    qt, M, K = QType.Q5_0, 8, 896
    w = random_weight_bytes(rng, qt, M, K)
    _assert_close_to_reference(rng, w, qt, M, K)
    monkeypatch.setattr(matvec, "QX0_V4", False)
    monkeypatch.setattr(matvec_qx0, "launch", lambda *a, **k: pytest.fail("new path ran"))
    _assert_close_to_reference(rng, w, qt, M, K)


@pytest.mark.parametrize("qt", [QType.Q5_0, QType.Q4_0], ids=lambda q: q.name)
def test_widened_to_q8_0_gives_the_same_bits(rng, qt):
    """quant.legacy.widen_to_q8_0 (Engine._widen_to_q8_0 stacks a mixed q / k / v with it):
    the Q8_0 copy of a Q5_0 / Q4_0 matrix decodes to the same floats, and the decode matvec --
    one row and rows -- gives it the bits the original gets (the same integer sums, the same d),
    with realistic scales."""
    from bw24nb.quant.legacy import widen_to_q8_0
    M, K = 24, 896
    w = random_weight_bytes(rng, qt, M, K)
    wide = widen_to_q8_0(w.reshape(-1, type_size(qt)), qt.name).reshape(M, -1)
    assert _uses_new_path(wide, QType.Q8_0)
    np.testing.assert_array_equal(dequantize(wide.reshape(-1), QType.Q8_0, (M, K)).view(np.uint32),
                                  dequantize(w.reshape(-1), qt, (M, K)).view(np.uint32))
    x = rng.standard_normal(3 * K).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    for rows in (1, 3):
        np.testing.assert_array_equal(_run(wide, QType.Q8_0, M, K, xq, xd, rows=rows).view(np.uint32),
                                      _run(w, qt, M, K, xq, xd, rows=rows).view(np.uint32))
    with pytest.raises(ValueError, match="Q5_1 is not"):
        widen_to_q8_0(w.reshape(-1, type_size(qt)), "Q5_1")
