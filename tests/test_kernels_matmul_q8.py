"""Int8 tensor-core prefill matmul (kernels/matmul_q8.py) against the float64 numpy reference, in
the CUDA simulator (the mma twin computes each warp's tile exactly as the instruction does).

Weights are random bytes with valid f16 scale fields (dequant.random_weight_bytes): every quant,
high bit and sub-scale pattern occurs. Outputs are poisoned with NaN, with guard elements past
the end that must survive. Shapes are tiny -- one simulated 64 x 64 block costs seconds -- but
cover partial tiles in T and M, a partial K step (K = 288: 9 sub-blocks, steps of 8), two K
steps for a K-quant, and more than one block in both grid directions.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernel_check import _min_offsets, gamma
from bw24nb.kernels.dequant import random_weight_bytes
from bw24nb.kernels.matmul_q8 import (
    MATMUL_Q8,
    TILES,
    Tile,
    launch_matmul_q8,
    matmul_q8_reference,
)
from bw24nb.kernels.quantize_act import (
    dequantize_act_q8,
    launch_quantize_act,
    quantize_act_q8_reference,
)
from bw24nb.quant import QType, dequantize

INT8_TYPES = list(MATMUL_Q8)
GUARD = 4
SENTINEL = np.float32(1234.5)

# Largest |integer weight| per element in units of the f16 scale, intermediate pieces
# included: Q4_K / Q5_K form sc*q and m separately, so (15 or 31) * 63 + 63; Q6_K sc * (q-32).
_MAX_INT_W = {QType.Q8_0: 128, QType.Q4_0: 8, QType.Q5_0: 16,
              QType.Q4_K: 15 * 63 + 63, QType.Q5_K: 31 * 63 + 63, QType.Q6_K: 128 * 32}


def _run(w, qt, M, K, xq, xd, bias=None, residual=None, in_place=False):
    """Launch on poisoned y[T, M] followed by GUARD sentinels; return y (host)."""
    T = xq.size // K
    full = np.full(T * M + GUARD, np.nan, np.float32)
    full[T * M:] = SENTINEL
    y_full = cuda.to_device(full)
    y = y_full[:T * M].reshape(T, M)
    if in_place:
        y.copy_to_device(residual)
    launch_matmul_q8(cuda.to_device(w), qt, M, K,
                     xq if not isinstance(xq, np.ndarray) else cuda.to_device(xq),
                     xd if not isinstance(xd, np.ndarray) else cuda.to_device(xd), y,
                     bias=None if bias is None else cuda.to_device(bias),
                     residual=None if residual is None else
                     (y if in_place else cuda.to_device(residual)))
    out = y_full.copy_to_host()
    assert np.all(out[T * M:] == SENTINEL), "kernel wrote past the end of y"
    return out[:T * M].reshape(T, M)


def _bound(w, qt, M, K, xq, xd, bias=None, residual=None):
    """Rounding bound of the module docstring's order. Integer dots are exact; each sub-block
    term rounds at most 3 times before it is added (Q8_0: d*xd, *isum; K-quants: the two
    products, their difference, *xd), the accumulator adds one term per sub-block (two for
    Q6_K: 2 K / 32), then + bias + residual: a chain of h <= terms + 5 roundings, so
    |y - y_exact| <= gamma_h * sum_k (|w_k| + 2 |dmin m|) |x_k| (+ |b| + |r|) -- the K-quants
    round (d*sc)*isum and (dmin*m)*xsum separately, whence the min term -- doubled (MARGIN,
    as kernel_check) for second-order terms."""
    terms = (2 if qt == QType.Q6_K else 1) * (K // 32)
    h = terms + 5
    T = xq.size // K
    xa = np.abs(dequantize_act_q8(xq.reshape(-1), xd).reshape(T, K))
    wmag = np.abs(dequantize(w, qt, (M, K)).astype(np.float64)) + 2 * _min_offsets(w, qt, M, K)
    mag = xa @ wmag.T
    if bias is not None:
        mag += np.abs(bias)
    if residual is not None:
        mag += np.abs(residual)
    return 2 * gamma(h) * mag + 2.0 ** -126


@pytest.mark.parametrize("qt", INT8_TYPES, ids=lambda q: q.name)
def test_matmul_q8_exact_with_power_of_two_scales(rng, qt):
    """Every f16 scale 2^-6 and every activation scale 2^-3: each term is an integer times 2^-9;
    activations are bounded so that every partial sum stays below 2^23 units, and bias and
    residual are small multiples of 2^-9. Then every float32 operation of the kernel is exact
    and y must equal the float64 reference bit for bit: a wrong nibble, high bit, sub-scale,
    min, offset (-8/-16/-32), half (Q6_K) or fragment position shows up as an inequality."""
    T, M, K = 5, 17, 256
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    bound = min(127, 2 ** 23 // (K * _MAX_INT_W[qt]))
    xq = rng.integers(-bound, bound + 1, size=(T, K)).astype(np.int8)
    xq[0, :2] = [bound, -bound]
    xd = np.full((T, K // 32), 2.0 ** -3, np.float32)
    bias = (rng.integers(-1000, 1001, M) * 2.0 ** -9).astype(np.float32)
    residual = (rng.integers(-1000, 1001, (T, M)) * 2.0 ** -9).astype(np.float32)
    y = _run(w, qt, M, K, xq, xd, bias, residual)
    ref = matmul_q8_reference(w, qt, M, K, xq, xd, bias, residual)
    assert np.array_equal(ref.astype(np.float32).astype(np.float64), ref)   # ref is exact too
    np.testing.assert_array_equal(y, ref.astype(np.float32))


# (T, M, K) per type: odd T (1 .. 33), M no multiple of the 64-row tile; the 32-value block
# types take K = 288 (a full K step of 8 sub-blocks and a partial one of 1), Q4_K two steps
_END_TO_END = {QType.Q8_0: (1, 17, 288), QType.Q4_0: (17, 5, 288), QType.Q5_0: (33, 3, 288),
               QType.Q4_K: (5, 17, 512), QType.Q5_K: (17, 3, 256), QType.Q6_K: (33, 5, 256)}


@pytest.mark.parametrize("qt", INT8_TYPES, ids=lambda q: q.name)
def test_matmul_q8_end_to_end(rng, qt):
    """quantize_act on X[T, K] (the kernel, checked against its reference), then the int8
    matmul with realistic random scales, bias and residual."""
    T, M, K = _END_TO_END[qt]
    w = random_weight_bytes(rng, qt, M, K)
    x = (rng.standard_normal((T, K)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    residual = rng.standard_normal((T, M)).astype(np.float32)
    xq = cuda.to_device(np.full((T, K), 99, np.int8))
    xd = cuda.to_device(np.full((T, K // 32), np.nan, np.float32))
    launch_quantize_act(cuda.to_device(x), xq, xd)
    q_ref, d_ref = quantize_act_q8_reference(x)
    np.testing.assert_array_equal(xq.copy_to_host().reshape(-1), q_ref)
    np.testing.assert_array_equal(xd.copy_to_host().reshape(-1), d_ref)
    y = _run(w, qt, M, K, xq, xd, bias, residual)
    ref = matmul_q8_reference(w, qt, M, K, q_ref, d_ref, bias, residual)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref), _bound(w, qt, M, K, q_ref, d_ref, bias, residual))


@pytest.mark.parametrize("in_place", [False, True], ids=["residual", "in-place"])
def test_matmul_q8_several_blocks_and_epilogue(rng, in_place):
    """2 x 2 blocks of the grid (T = 65, M = 66: both last tiles hold 1-2 rows), bias and a
    residual large enough that a dropped or doubled term is far outside the bound, and the
    residual read from y itself (y += X W^T + b)."""
    qt, T, M, K = QType.Q4_0, 65, 66, 64
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    xq, xd = xq.reshape(T, K), xd.reshape(T, K // 32)
    bias = (100 * rng.standard_normal(M)).astype(np.float32)
    residual = (100 * rng.standard_normal((T, M))).astype(np.float32)
    y = _run(w, qt, M, K, xq, xd, bias, residual, in_place=in_place)
    ref = matmul_q8_reference(w, qt, M, K, xq, xd, bias, residual)
    np.testing.assert_array_less(np.abs(y - ref), _bound(w, qt, M, K, xq, xd, bias, residual))


def test_matmul_q8_rejects_what_it_cannot_do():
    T, M, K = 2, 3, 256
    xq = cuda.to_device(np.zeros((T, K), np.int8))
    xd = cuda.to_device(np.zeros((T, K // 32), np.float32))
    y = cuda.to_device(np.zeros((T, M), np.float32))
    with pytest.raises(ValueError, match="no int8 path for NVFP4"):
        launch_matmul_q8(cuda.to_device(np.zeros(M * 36 * 4, np.uint8)), QType.NVFP4, M, K, xq, xd, y)
    with pytest.raises(ValueError, match="Q4_K weight of 3 x 256 is 432 bytes"):
        launch_matmul_q8(cuda.to_device(np.zeros(431, np.uint8)), QType.Q4_K, M, K, xq, xd, y)
    with pytest.raises(ValueError, match="not a multiple of Q4_K's block"):
        launch_matmul_q8(cuda.to_device(np.zeros(M * 144, np.uint8)), QType.Q4_K, M, 288,
                         cuda.to_device(np.zeros((T, 288), np.int8)),
                         cuda.to_device(np.zeros((T, 9), np.float32)), y)
    with pytest.raises(ValueError, match=r"xq must be int8\[2, 256\]"):
        launch_matmul_q8(cuda.to_device(np.zeros(M * 34 * 8, np.uint8)), QType.Q8_0, M, K,
                         cuda.to_device(np.zeros((T + 1, K), np.int8)), xd, y)


def test_magic_int_to_float_is_exact():
    """The kernel's cvt-free conversion: the mma starts from MAGIC_I32 (bits of 1.5 * 2^23), so
    it returns the bits of 1.5 * 2^23 + isum; minus MAGIC_F32 that is isum exactly for
    |isum| < 2^22 -- and an int8 dot of 32 values is at most 32 * 128 * 128 = 2^19."""
    from bw24nb.kernels.matmul_q8 import MAGIC_F32, MAGIC_I32
    from bw24nb.ptx import f32_from_bits
    assert f32_from_bits(MAGIC_I32) == MAGIC_F32
    for i in [0, 1, -1, 12345, -54321, 32 * 128 * 128, -32 * 128 * 128, 2 ** 22 - 1, -2 ** 22]:
        got = f32_from_bits(int(MAGIC_I32) + i) - MAGIC_F32
        assert got.dtype == np.float32 and got == i, i


@pytest.mark.parametrize("name", list(TILES))
def test_every_tile_gives_the_default_tiles_bits(rng, name):
    """bench/matmul_q8_bench.py's tile candidates (and the session-2 default tile, which some
    types left for KERNEL_CHOICE's): every output is summed in the module docstring's order
    whatever the tile, so each must give the chosen kernel's bits -- here on
    shapes with partial tiles in T and M, a partial last K step for both step sizes (K = 352:
    11 sub-blocks) and several steps of the K-quants (K = 512), for scale-only, scale-and-min
    and split-scale types. A copy_ahead tile (cp.async into two buffers) serves Q4_K only,
    here with 2 and 3 super-blocks (an even and an odd number of 4-sub-block steps), and
    refuses the others."""
    from bw24nb.kernels import matmul_q8 as mq
    tile = TILES[name]
    T, M = 37, 70
    types = ((QType.Q8_0, 352), (QType.Q5_0, 352), (QType.Q4_K, 512), (QType.Q6_K, 512))
    if tile.copy_ahead:
        with pytest.raises(ValueError, match="copy_ahead"):
            mq._make_matmul_q8(QType.Q8_0, tile=tile)
        types = ((QType.Q4_K, 512), (QType.Q4_K, 768))
    for qt, K in types:
        w = random_weight_bytes(rng, qt, M, K)
        xq, xd = quantize_act_q8_reference(rng.standard_normal((T, K)).astype(np.float32))
        want = _run(w, qt, M, K, xq, xd)
        y = cuda.to_device(np.full((T, M), np.nan, np.float32))
        kern = mq._make_matmul_q8(qt, tile=tile)
        mq._launch(kern, cuda.to_device(w), M, K, T, cuda.to_device(xq.reshape(T, K)),
                   cuda.to_device(xd), y, None, None, 0)
        np.testing.assert_array_equal(y.copy_to_host().view(np.uint32), want.view(np.uint32))


def test_tiles_over_the_shared_memory_limit_are_refused():
    from bw24nb.kernels import matmul_q8 as mq
    with pytest.raises(ValueError, match="48 KB"):
        mq._make_matmul_q8(QType.Q8_0, tile=Tile(4, 4, 8))


def test_kernel_for_takes_a_large_tile_only_when_its_grid_fills_the_gpu(monkeypatch):
    """KERNEL_CHOICE's rule: the first candidate whose grid has >= MIN_GRID_FILL blocks per SM
    (at 132 SMs: >= 119 blocks), else the session-2 kernel."""
    from bw24nb.kernels import matmul_q8 as mq
    monkeypatch.setattr(mq, "sm_count", lambda: 132)
    T = 512
    assert mq.kernel_for(QType.Q6_K, 12288, T).tile.name == "m128t128s4"   # 96 x 4 blocks
    assert mq.kernel_for(QType.Q6_K, 4096, T).tile.name == "m128t128s4"    # 32 x 4 = 128
    assert mq.kernel_for(QType.Q6_K, 896, T) is mq.MATMUL_Q8[QType.Q6_K]   # 28, 56 blocks
    assert mq.kernel_for(QType.Q4_K, 4096, T).tile.name == "m128t64s4a"    # 32 x 8
    assert mq.kernel_for(QType.Q4_K, 4096, 64) is mq.MATMUL_Q8[QType.Q4_K]  # 32 x 1, 64 x 1
    assert mq.kernel_for(QType.Q5_0, 4864, T) is mq.MATMUL_Q8[QType.Q5_0]  # no candidate
    # read at every launch: a bench mode can swap the choice
    monkeypatch.setitem(mq.KERNEL_CHOICE, QType.Q4_K, (("m64t128s4", True),))
    kern = mq.kernel_for(QType.Q4_K, 4096, T)
    assert kern.tile.name == "m64t128s4" and "_cvt" not in kern.__name__


@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q6_K, QType.Q8_0])
def test_every_candidate_kernel_gives_the_session2_kernels_bits(rng, qt):
    """KERNEL_CHOICE's candidates (larger tiles, cvt conversion) against MATMUL_Q8's kernel on
    a shape with partial tiles and several K steps."""
    from bw24nb.kernels import matmul_q8 as mq
    T, M, K = 37, 70, 512
    w = random_weight_bytes(rng, qt, M, K)
    xq, xd = quantize_act_q8_reference(rng.standard_normal((T, K)).astype(np.float32))
    outs = []
    for kern in [mq.MATMUL_Q8[qt], *mq.candidates(qt)]:
        y = cuda.to_device(np.full((T, M), np.nan, np.float32))
        mq._launch(kern, cuda.to_device(w), M, K, T, cuda.to_device(xq.reshape(T, K)),
                   cuda.to_device(xd), y, None, None, 0)
        outs.append(y.copy_to_host().view(np.uint32))
    assert len(outs) > 1
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q6_K, QType.Q8_0])
def test_grouped_gemm_gives_each_expert_slice_the_plain_kernels_bits(rng, qt):
    """launch_matmul_q8_grouped (the MoE prefill's expert-major GEMM): rows group_off[e] ..
    group_off[e + 1] of Y are the session-2 kernel's output for expert e's weights and those
    rows of X, bit for bit; an expert with no rows writes nothing (poison stays)."""
    from bw24nb.kernels import matmul_q8 as mq
    E, M, K = 3, 70, 512
    counts = [37, 0, 5]
    R = sum(counts)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    w = np.concatenate([random_weight_bytes(rng, qt, M, K).reshape(-1) for _ in range(E)])
    xq, xd = quantize_act_q8_reference(rng.standard_normal((R, K)).astype(np.float32))
    y = cuda.to_device(np.full((R, M), np.nan, np.float32))
    mq.launch_matmul_q8_grouped(cuda.to_device(w), qt, E, M, K, cuda.to_device(xq.reshape(R, K)),
                                cuda.to_device(xd), cuda.to_device(off), y, max(counts))
    got = y.copy_to_host()
    per = w.size // E
    for e in range(E):
        a, b = int(off[e]), int(off[e + 1])
        if a == b:
            continue
        want = cuda.to_device(np.full((b - a, M), np.nan, np.float32))
        mq._launch(mq.MATMUL_Q8[qt], cuda.to_device(w[e * per:(e + 1) * per]), M, K, b - a,
                   cuda.to_device(xq.reshape(R, K)[a:b].copy()),
                   cuda.to_device(xd.reshape(R, -1)[a:b].copy()), want, None, None, 0)
        np.testing.assert_array_equal(got[a:b].view(np.uint32),
                                      want.copy_to_host().view(np.uint32), f"expert {e}")


@pytest.mark.parametrize("tile", ["m64t64s8", "m128t128s4"])
def test_q6k_units_on_eight_threads_give_the_one_thread_decodes_bits(rng, tile):
    """matmul_q8's Q6_K staging with each unit decoded by 8 threads (Q6_K_LANES, the default)
    writes the same int8 words and scales as one thread a unit: the same bits, with rows past
    M (zeroed) and several K steps."""
    from bw24nb.kernels import matmul_q8 as mq
    qt, T, M, K = QType.Q6_K, 5, 37, 768
    w = cuda.to_device(random_weight_bytes(rng, qt, M, K))
    xq, xd = quantize_act_q8_reference(rng.standard_normal((T, K)).astype(np.float32))
    xq, xd = cuda.to_device(xq.reshape(T, K)), cuda.to_device(xd.reshape(T, K // 32))
    outs = []
    for lanes in (True, False):
        kern = mq._make_matmul_q8(qt, tile=mq.TILES[tile], lanes=lanes)
        y = cuda.to_device(np.full((T, M), np.nan, np.float32))
        mq._launch(kern, w, M, K, T, xq, xd, y, None, None, 0)
        outs.append(y.copy_to_host())
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
