"""Decode matvec kernels (float path for every weight type, dp4a path for the integer types)
and the activation quantizer, against the numpy codec, in the CUDA simulator on tiny shapes.

Weights are random bytes with valid f16 scale fields (bw24nb.kernels.dequant.random_weight_bytes):
every quant and sub-scale bit pattern is exercised, not only the ones a quantizer emits.
Outputs are poisoned with NaN before each launch, with guard elements past the end that must
survive untouched.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_matvec, launch_matvec_q8, launch_quantize_act
from bw24nb.kernels.dequant import LAYOUTS, Q4_K_OFF_QS, Q5_K_OFF_QH, random_weight_bytes
from bw24nb.kernels.matvec import MATVEC_Q8, matvec_q8_reference, matvec_reference
from bw24nb.kernels.quantize_act import (dequantize_act_q8, nibble_order,
                                         quantize_act_q8_reference)
from bw24nb.ptx import warp_sum
from bw24nb.ptx.warp import warp_tree_sum_host
from bw24nb.quant import QType, dequantize

ALL_TYPES = list(LAYOUTS)
DP4A_TYPES = list(MATVEC_Q8)
U = 2.0 ** -24          # float32 unit roundoff

# Rounding bound of the float path. Every product w_e * x_e is rounded once and then passes
# through at most 7 additions inside its group, ceil(groups / 32) in its lane's running sum
# (<= 16 at K = 512 for the dense types), 5 in the warp tree and 2 for bias and residual: a
# longest chain h <= 31 roundings. The classic bound for any summation tree is then
# |y - y_exact| <= gamma_h * (sum_e |w_e x_e| + |b| + |r|), gamma_h = h u / (1 - h u) ~ 1.9e-6;
# we allow 1e-5 (5x the worst case, still orders of magnitude below one wrong weight).
FLOAT_PATH_REL = 1e-5


def _guarded(n, guard=4):
    """A device array of n + guard float32: n poisoned with NaN, the guard set to a sentinel."""
    a = np.full(n + guard, np.nan, dtype=np.float32)
    a[n:] = 1234.5
    return cuda.to_device(a)


def _run_float(w, qt, M, K, x, bias=None, residual=None, in_place=False):
    y_full = _guarded(M)
    y = y_full[:M]
    if in_place:
        y.copy_to_device(residual)
    launch_matvec(cuda.to_device(w), qt, M, K, cuda.to_device(x), y,
                  bias=None if bias is None else cuda.to_device(bias),
                  residual=None if residual is None else (y if in_place else cuda.to_device(residual)))
    out = y_full.copy_to_host()
    assert np.all(out[M:] == np.float32(1234.5)), "kernel wrote past the end of y"
    return out[:M]


def _scale(w_raw, qt, M, K, x, bias=None, residual=None):
    """sum_e |w_e x_e| + |b| + |r| per row: what the rounding error is proportional to."""
    w = np.abs(dequantize(w_raw, qt, (M, K)).astype(np.float64))
    s = w @ np.abs(x.astype(np.float64))
    if bias is not None:
        s += np.abs(bias)
    if residual is not None:
        s += np.abs(residual)
    return s


@pytest.mark.parametrize("qt", ALL_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("M,K", [(17, 256), (3, 512)])
def test_matvec_matches_codec(rng, qt, M, K):
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    y = _run_float(w, qt, M, K, x)
    ref = matvec_reference(w, qt, M, K, x)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref), FLOAT_PATH_REL * _scale(w, qt, M, K, x) + 1e-30)


@pytest.mark.parametrize("qt", [QType.F16, QType.BF16, QType.F32], ids=lambda q: q.name)
@pytest.mark.parametrize("K", [100, 102])
def test_matvec_dense_any_k(rng, qt, K):
    # dense rows need not be a multiple of 32 (or of anything); F32 takes the 16-byte path
    # (matvec.F32_V4) at K = 100 and the generic one-value groups at K = 102
    M = 5
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    y = _run_float(w, qt, M, K, x)
    ref = matvec_reference(w, qt, M, K, x)
    np.testing.assert_array_less(np.abs(y - ref), FLOAT_PATH_REL * _scale(w, qt, M, K, x) + 1e-30)


@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q8_0, QType.F16], ids=lambda q: q.name)
@pytest.mark.parametrize("in_place", [False, True], ids=["residual", "in-place"])
def test_matvec_bias_residual(rng, qt, in_place):
    M, K = 17, 256
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    # large enough that a dropped or doubled term is far outside the tolerance
    bias = (100 * rng.standard_normal(M)).astype(np.float32)
    residual = (100 * rng.standard_normal(M)).astype(np.float32)
    y = _run_float(w, qt, M, K, x, bias, residual, in_place=in_place)
    ref = matvec_reference(w, qt, M, K, x, bias, residual)
    tol = FLOAT_PATH_REL * _scale(w, qt, M, K, x, bias, residual)
    np.testing.assert_array_less(np.abs(y - ref), tol)


def test_matvec_rejects_wrong_buffer():
    w = cuda.to_device(np.zeros((3, 144 - 1), np.uint8))
    y = cuda.to_device(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="Q4_K weight of 3 x 256 is 432 bytes"):
        launch_matvec(w, QType.Q4_K, 3, 256, cuda.to_device(np.zeros(256, np.float32)), y)
    with pytest.raises(ValueError, match="no dp4a path for NVFP4"):
        launch_matvec_q8(cuda.to_device(np.zeros(3 * 36 * 4, np.uint8)), QType.NVFP4, 3, 256,
                         cuda.to_device(np.zeros(256, np.int8)),
                         cuda.to_device(np.zeros(8, np.float32)), y)


# ---------------------------------------------------------------- activation quantizer


def test_quantize_act_matches_reference(rng):
    T, K = 3, 256
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[1, 32:64] = 0.0                        # an all-zero block: d = 0, q = 0
    # ties: amax 127 gives d = 1 and 1/d = 1, so x * (1/d) = x and +-2.5 must round away (+-3)
    x[2, :8] = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 3.49999976]
    xq = cuda.to_device(np.full(T * K, 99, np.int8))
    xd = cuda.to_device(np.full(T * K // 32, np.nan, np.float32))
    launch_quantize_act(cuda.to_device(x), xq, xd)
    q_ref, d_ref = quantize_act_q8_reference(x)
    np.testing.assert_array_equal(xq.copy_to_host(), q_ref)
    np.testing.assert_array_equal(xd.copy_to_host(), d_ref)
    assert list(q_ref[2 * K:2 * K + 8]) == [127, 3, -3, 1, -1, 2, -127, 3]


# ---------------------------------------------------------------- dp4a path

# Largest |integer weight| per element (in units of the f16 scales), intermediate pieces
# included: Q4_K/Q5_K form sc*q and m separately, so (15 or 31) * 63 + 63.
_MAX_INT_W = {QType.Q8_0: 128, QType.Q4_0: 8, QType.Q5_0: 16,
              QType.Q4_K: 15 * 63 + 63, QType.Q5_K: 31 * 63 + 63, QType.Q6_K: 128 * 32}


@pytest.mark.parametrize("qt", DP4A_TYPES, ids=lambda q: q.name)
def test_matvec_q8_integer_part_exact(rng, qt):
    """With every f16 scale = 2^-6 and every activation scale = 2^-3, each term of the dot is
    an integer times 2^-9 and the integer sums stay below 2^24 (activations bounded per type
    for that), so every float32 operation of the kernel is exact: the result must equal the
    float64 reference bit for bit. Any error in a nibble, a high bit, a sub-scale, the int8
    sign handling of dp4a or the -8/-16/-32 offsets shows up as an inequality."""
    M, K = 3, 256
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    bound = min(127, (2 ** 24 - 1) // (K * _MAX_INT_W[qt]))
    xq = rng.integers(-bound, bound + 1, size=K).astype(np.int8)
    xq[:2] = [bound, -bound]
    xd = np.full(K // 32, 2.0 ** -3, np.float32)
    y_full = _guarded(M)
    launch_matvec_q8(cuda.to_device(w), qt, M, K, cuda.to_device(xq), cuda.to_device(xd), y_full[:M])
    out = y_full.copy_to_host()
    ref = matvec_q8_reference(w, qt, M, K, xq, xd)
    np.testing.assert_array_equal(out[:M], ref.astype(np.float32))
    assert np.array_equal(ref.astype(np.float32).astype(np.float64), ref)   # ref is exact too
    assert np.all(out[M:] == np.float32(1234.5))


assert Q4_K_OFF_QS == Q5_K_OFF_QH     # _min_offsets zeroes from there on for both


def _min_offsets(w_raw, qt, M, K):
    """|dmin * m| per element for Q4_K/Q5_K (the value a zero quant decodes to), else 0."""
    if qt not in (QType.Q4_K, QType.Q5_K):
        return np.zeros((M, K))
    lay = LAYOUTS[qt]
    blocks = np.array(w_raw).reshape(-1, lay.type_size)
    blocks[:, Q4_K_OFF_QS:] = 0             # qh (Q5_K) and qs: every q = 0
    return np.abs(dequantize(blocks, qt, (M, K)).astype(np.float64))


@pytest.mark.parametrize("qt", DP4A_TYPES, ids=lambda q: q.name)
def test_matvec_q8_end_to_end(rng, qt):
    """quantize_act then matvec_q8 on realistic scales, with bias and residual."""
    M, K = 17, 512
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    residual = rng.standard_normal(M).astype(np.float32)
    xq = cuda.to_device(np.zeros(K, np.int8))
    xd = cuda.to_device(np.zeros(K // 32, np.float32))
    launch_quantize_act(cuda.to_device(x), xq, xd)
    q_ref, d_ref = quantize_act_q8_reference(x)
    np.testing.assert_array_equal(xq.copy_to_host(), q_ref)
    y_full = _guarded(M)
    launch_matvec_q8(cuda.to_device(w), qt, M, K, xq, xd, y_full[:M],
                     bias=cuda.to_device(bias), residual=cuda.to_device(residual))
    y = y_full.copy_to_host()[:M]
    ref = matvec_q8_reference(w, qt, M, K, q_ref, d_ref, bias, residual)
    # Rounding: integer parts are exact; per 4-value run the kernel rounds (scale * int) up to
    # 4 times, then the same lane/tree/epilogue chain as the float path (h <= 31 in all). For
    # K-quants the two pieces (d*sc)*sum(q*qx) and (dmin*m)*sum(qx) are rounded separately, so
    # the error scales with |w| + 2 |dmin m| rather than |w|.
    xa = np.abs(dequantize_act_q8(q_ref, d_ref))
    wmag = np.abs(dequantize(w, qt, (M, K)).astype(np.float64)) + 2 * _min_offsets(w, qt, M, K)
    scale = wmag @ xa + np.abs(bias) + np.abs(residual)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_less(np.abs(y - ref), FLOAT_PATH_REL * scale)


# ---------------------------------------------------------------- warp_sum (bw24nb/ptx/warp.py)


def _butterfly_all_lanes(vals):
    """Independent statement of the GPU code: 32 lanes, v = v + shfl_xor(v, off) for
    off = 16..1, every lane in float32. Returns all 32 lanes' results."""
    v = np.array(vals, dtype=np.float32)
    for off in (16, 8, 4, 2, 1):
        v = (v + v[np.arange(32) ^ off]).astype(np.float32)
    return v


@cuda.jit
def _warp_sum_kernel(vals, out):
    t = cuda.grid(1)
    out[t] = warp_sum(vals[t])


def test_warp_sum_is_the_butterfly_bit_for_bit(rng):
    # values spread over 40 binades, so the order of the additions decides the low bits
    n = 64                                              # two warps in one block
    vals = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    vals[:4] = [1e8, 1.0, -1e8, 3.0]                    # cancellation: order-sensitive
    out = cuda.to_device(np.full(n, np.nan, np.float32))
    _warp_sum_kernel[1, n](cuda.to_device(vals), out)
    got = out.copy_to_host()
    for w in range(2):
        lanes = _butterfly_all_lanes(vals[32 * w:32 * w + 32])
        assert np.all(lanes == lanes[0]), "the butterfly must give every lane the same value"
        want = warp_tree_sum_host(vals[32 * w:32 * w + 32])
        assert lanes[0] == want
        np.testing.assert_array_equal(got[32 * w:32 * w + 32], np.full(32, want, np.float32))
    # the test can tell orders apart: a left-to-right float32 sum of warp 0 differs here
    seq = np.float32(0.0)
    for v in vals[:32]:
        seq = np.float32(seq + v)
    assert seq != warp_tree_sum_host(vals[:32])


def test_warp_sum_rejects_a_partial_warp():
    with pytest.raises(Exception, match="partial warp"):
        _warp_sum_kernel[1, 48](cuda.to_device(np.ones(48, np.float32)),
                                cuda.to_device(np.zeros(48, np.float32)))


@cuda.jit
def _warp_sum_divergent(vals, out):
    t = cuda.grid(1)
    if t == 5:                                          # lane 5 leaves: undefined on the GPU
        return
    out[t] = warp_sum(vals[t])


def test_warp_sum_rejects_a_lane_that_left():
    with pytest.raises(Exception, match="finished without"):
        _warp_sum_divergent[1, 32](cuda.to_device(np.ones(32, np.float32)),
                                   cuda.to_device(np.zeros(32, np.float32)))


def test_matvec_ptx_sums_with_shuffles():
    """The decode matvec's PTX (sm_90) sums a warp with shuffles; its one bar.sync is the
    split-row combine's (taken only when parts > 1), and the parts = 1 build (`_p1`) has none:
    its split is a constant. Compiled in a subprocess without the simulator (compile_ptx does
    not exist under it)."""
    import os
    import subprocess
    import sys
    # every @kernel calls its body as a device function (jit.waiting_kernel), whose compile asks
    # numba for the current device: bw24nb.ptx.offline's stand-in device answers without a GPU
    code = ("import sys\n"
            "from bw24nb.ptx.offline import allow_compiling_without_gpu\n"
            "allow_compiling_without_gpu()\n"
            "from numba import cuda\n"
            "from bw24nb.kernels import matvec as m\n"
            "from bw24nb.kernels import matvec_q4k as m4\n"
            "for n in ('matvec_q5_0', 'matvec_q8_0', 'matvec_q8_q6_k', 'matvec_q8_q4_k_v4',\n"
            "          'matvec_q8_q4_k_v4_p1'):\n"
            "    mod = m4 if '_v4' in n else m\n"
            "    ptx, _ = cuda.compile_ptx(getattr(mod, n).py_func, mod.PTX_SIGNATURES[n][0], cc=(9, 0))\n"
            "    print(n, ptx.count('shfl.sync.bfly.b32'), ptx.count('bar.sync') + ptx.count('barrier.sync'))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0 and "NVVM" in proc.stderr:
        pytest.skip("no NVVM to compile with (pip install 'numba-cuda[cu13]')")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")[:5]
    for line in lines:
        name, shfl, bars = line.split()
        assert int(shfl) == 5 and int(bars) == (0 if name.endswith("_p1") else 1), line


@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q6_K, QType.Q8_0], ids=lambda q: q.name)
def test_matvec_q8_split_rows_exact(rng, qt):
    """Rows split over 1, 2 or 4 warps (with M not a multiple of the block's rows, so some
    warps of the last block have no row and must still meet the combine barrier): on the
    exact-arithmetic inputs of test_matvec_q8_integer_part_exact every split gives the
    float64 reference bit for bit."""
    M, K = 5, 1024
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    bound = min(127, (2 ** 24 - 1) // (K * _MAX_INT_W[qt]))
    xq = rng.integers(-bound, bound + 1, size=K).astype(np.int8)
    xd = np.full(K // 32, 2.0 ** -3, np.float32)
    ref = matvec_q8_reference(w, qt, M, K, xq, xd).astype(np.float32)
    for parts in (1, 2, 4):
        y_full = _guarded(M)
        launch_matvec_q8(cuda.to_device(w), qt, M, K, cuda.to_device(xq), cuda.to_device(xd),
                         y_full[:M], parts=parts)
        out = y_full.copy_to_host()
        np.testing.assert_array_equal(out[:M], ref, err_msg=f"parts={parts}")
        assert np.all(out[M:] == np.float32(1234.5))


@pytest.mark.parametrize("parts", [2, 4])
def test_matvec_float_split_rows(rng, parts):
    """The float path with a row split over warps stays inside the float-path bound."""
    qt, M, K = QType.F32, 7, 1024
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal(K).astype(np.float32)
    residual = rng.standard_normal(M).astype(np.float32)
    y_full = _guarded(M)
    launch_matvec(cuda.to_device(w), qt, M, K, cuda.to_device(x), y_full[:M],
                  residual=cuda.to_device(residual), parts=parts)
    y = y_full.copy_to_host()[:M]
    ref = matvec_reference(w, qt, M, K, x, residual=residual)
    np.testing.assert_array_less(np.abs(y - ref), FLOAT_PATH_REL * _scale(w, qt, M, K, x, residual=residual))


def test_warps_per_row_policy():
    from bw24nb.kernels.matvec import warps_per_row
    assert warps_per_row(151936, 896) == 1          # lm_head: plenty of rows
    assert warps_per_row(32, 4096) == 4             # GDN alpha/beta: 32 rows, long K
    assert warps_per_row(896, 4864) == 4            # 0.5B ffn_down
    assert warps_per_row(4096, 512) == 1            # short rows are never split


# ---------------------------------------------------------------- several rows (rows = T)


def _launch_rows(w, qt, M, K, x, q8, T, bias=None, residual=None, in_place=False, parts=None,
                 **q8_kw):
    """One launch with `rows=T` (x: float32[T, K]; residual: float32[T, M]) on the float path, or
    with x quantized as the engine does on the dp4a path (with q8_kw: `beside`); returns y[T, M]
    (guard checked)."""
    y_full = _guarded(T * M)
    y = y_full[:T * M]
    if in_place:
        y.copy_to_device(residual.reshape(-1))
    kw = dict(bias=None if bias is None else cuda.to_device(bias),
              residual=None if residual is None else (y if in_place else cuda.to_device(residual)),
              parts=parts, rows=T)
    if q8:
        xq, xd = quantize_act_q8_reference(x)
        launch_matvec_q8(cuda.to_device(w), qt, M, K, cuda.to_device(xq), cuda.to_device(xd), y,
                         **kw, **q8_kw)
    else:
        launch_matvec(cuda.to_device(w), qt, M, K, cuda.to_device(x), y, **kw)
    out = y_full.copy_to_host()
    assert np.all(out[T * M:] == np.float32(1234.5)), "kernel wrote past the end of y"
    return out[:T * M].reshape(T, M)


@pytest.mark.parametrize("qt,q8,T,K,in_place", [
    (QType.Q4_K, True, 4, 512, False),       # matvec_q4k.py's kernel; K = 512: 2 warps a row
    (QType.Q6_K, True, 3, 256, True),        # generic dp4a kernel, y += W x in place
    (QType.Q8_0, True, 2, 256, False),
    (QType.F32, False, 3, 512, True),        # float path, F32's 16-byte units (F32_V4)
    (QType.F32, False, 2, 66, False),        # K % 4 != 0: F32's generic one-value groups
    (QType.F16, False, 4, 256, False),
], ids=lambda v: v.name if isinstance(v, QType) else str(v))
def test_matvec_rows_equal_one_row_launches(rng, qt, q8, T, K, in_place):
    """rows = T: row t of the output is bit for bit what a rows = 1 launch on row t's inputs
    gives (speculative decoding's verify must reproduce plain decode exactly, so exact
    equality is the specification here, not a tolerance), and it is inside the one-row
    bound of the reference. M = 5 rows: the last block has warps without a row."""
    M = 5
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = (10 * rng.standard_normal(M)).astype(np.float32)
    residual = (10 * rng.standard_normal((T, M))).astype(np.float32)
    y = _launch_rows(w, qt, M, K, x, q8, T, bias, residual, in_place)
    for t in range(T):
        one = _launch_rows(w, qt, M, K, x[t], q8, 1, bias, residual[t:t + 1], in_place)[0]
        np.testing.assert_array_equal(y[t].view(np.uint32), one.view(np.uint32), err_msg=f"row {t}")
        if q8:
            xq, xd = quantize_act_q8_reference(x[t])
            ref = matvec_q8_reference(w, qt, M, K, xq, xd, bias, residual[t])
            # the bound of test_matvec_q8_end_to_end
            wmag = np.abs(dequantize(w, qt, (M, K)).astype(np.float64)) \
                + 2 * _min_offsets(w, qt, M, K)
            scale = wmag @ np.abs(dequantize_act_q8(xq, xd)) + np.abs(bias) + np.abs(residual[t])
        else:
            ref = matvec_reference(w, qt, M, K, x[t], bias, residual[t])
            scale = _scale(w, qt, M, K, x[t], bias, residual[t])
        np.testing.assert_array_less(np.abs(y[t] - ref), FLOAT_PATH_REL * scale, err_msg=f"row {t}")


def test_matvec_rows_split_over_four_warps_exact(rng):
    """rows = 3 with every row split over 4 warps (the shared combine holds one total per row
    and warp): on exact-arithmetic inputs (test_matvec_q8_integer_part_exact) every row equals
    the float64 reference bit for bit."""
    qt, M, K, T = QType.Q8_0, 5, 512, 3
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    bound = min(127, (2 ** 24 - 1) // (K * _MAX_INT_W[qt]))
    xq = rng.integers(-bound, bound + 1, size=T * K).astype(np.int8)
    xd = np.full(T * K // 32, 2.0 ** -3, np.float32)
    y_full = _guarded(T * M)
    launch_matvec_q8(cuda.to_device(w), qt, M, K, cuda.to_device(xq), cuda.to_device(xd),
                     y_full[:T * M], parts=4, rows=T)
    out = y_full.copy_to_host()
    for t in range(T):
        ref = matvec_q8_reference(w, qt, M, K, xq[t * K:(t + 1) * K],
                                  xd[t * K // 32:(t + 1) * K // 32])
        np.testing.assert_array_equal(out[t * M:(t + 1) * M], ref.astype(np.float32),
                                      err_msg=f"row {t}")
    assert np.all(out[T * M:] == np.float32(1234.5))


def test_matvec_rows_rejects_bad_rows_and_short_buffers():
    from bw24nb.kernels.matvec import MAX_ROWS
    M, K = 3, 256
    w = cuda.to_device(np.zeros(M * 144, np.uint8))                 # Q4_K, 3 x 256
    x = cuda.to_device(np.zeros(2 * K, np.float32))
    xq = cuda.to_device(np.zeros(2 * K, np.int8))
    xd = cuda.to_device(np.zeros(2 * K // 32, np.float32))
    y = cuda.to_device(np.zeros(2 * M, np.float32))
    for rows in (0, MAX_ROWS + 1):
        with pytest.raises(ValueError, match="rows"):
            launch_matvec(w, QType.Q4_K, M, K, x, y, rows=rows)
        with pytest.raises(ValueError, match="rows"):
            launch_matvec_q8(w, QType.Q4_K, M, K, xq, xd, y, rows=rows)
    with pytest.raises(ValueError, match=r"x must be float32 with at least rows x K = 3 x 256"):
        launch_matvec(w, QType.Q4_K, M, K, x, cuda.to_device(np.zeros(3 * M, np.float32)), rows=3)
    with pytest.raises(ValueError, match=r"y must be float32 with at least rows x M = 3 x 3 = 9"):
        launch_matvec(w, QType.Q4_K, M, K, cuda.to_device(np.zeros(3 * K, np.float32)), y, rows=3)
    with pytest.raises(ValueError, match=r"residual must be float32 with at least rows x M"):
        launch_matvec_q8(w, QType.Q4_K, M, K, xq, xd, y,
                         residual=cuda.to_device(np.zeros(M, np.float32)), rows=2)
    with pytest.raises(ValueError, match=r"xq must be int8\[768\] and xd float32\[24\]"):
        launch_matvec_q8(w, QType.Q4_K, M, K, xq, xd, cuda.to_device(np.zeros(3 * M, np.float32)),
                         rows=3)


@pytest.mark.parametrize("rows", [1, 3])
def test_parts1_build_equals_run_time_parts_build(rng, rows):
    """parts = 1 launches run a build with the split folded in (matvec.path_kernels); the
    run-time-parts build given parts = 1 must produce the same bits (Q4_K's path, one row and
    three)."""
    from bw24nb.kernels import matvec_q4k as q4
    M, K = 6, 512
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    outs = []
    for kern in (q4.KERNELS(rows, 1), q4.KERNELS(rows, 2)):
        assert (kern is q4.KERNELS(rows, 1)) == (len(outs) == 0)
        outs.append(_run_q4k_rows(kern, w, M, K, xq, xd, rows))
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_array_equal(outs[0], outs[1])


def _run_q4k_rows(kern, w, M, K, xq, xd, rows):
    """y (rows x M, NaN-poisoned first) from Q4_K rows kernel `kern` at parts = 1 on int8
    activations (xq, xd), no bias or residual."""
    w8 = cuda.to_device(np.ascontiguousarray(w).reshape(-1))
    y = cuda.to_device(np.full(rows * M, np.nan, np.float32))
    kern[(M + 3) // 4, 128]((w8.view(np.uint32),), np.int32(M), np.int32(K),
                            (cuda.to_device(xq.reshape(-1)).view(np.uint32),
                             cuda.to_device(xd.reshape(-1))),
                            y, y, y, np.int32(0), np.int32(0), np.int32(1))
    return y.copy_to_host()


def test_rows_register_cap_builds_its_own_kernels_with_the_same_bits(rng, monkeypatch):
    """matvec.ROWS_MAX_REGISTERS (run_bench --launch rows-cap<N>): rows launches (T >= 2) get
    their own builds, named _c<N>, and one-row launches keep theirs; the cap changes where
    ptxas keeps values, never a sum, so the capped kernel's outputs are the uncapped one's
    (the simulator drops the option: this checks the dispatch and the bits of the code)."""
    from bw24nb.kernels import matvec, matvec_q4k as q4
    M, K, rows = 6, 512, 3
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    xq, xd = quantize_act_q8_reference(rng.standard_normal((rows, K)).astype(np.float32))
    plain, one = q4.KERNELS(rows, 1), q4.KERNELS(1, 1)
    monkeypatch.setattr(matvec, "ROWS_MAX_REGISTERS", 64)
    capped = q4.KERNELS(rows, 1)
    assert capped is not plain and q4.KERNELS(1, 1) is one
    assert capped.py_func.__name__.endswith("_r3_c64")
    outs = [_run_q4k_rows(kern, w, M, K, xq, xd, rows) for kern in (plain, capped)]
    assert np.all(np.isfinite(outs[0]))
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("R", [2, 4])
@pytest.mark.parametrize("M,K,T", [(5, 512, 2), (7, 2048, 3), (3, 4096, 4), (5, 512, 1),
                                   (3, 5120, 1)])
def test_rows_on_weight_row_pairs_give_the_rows_kernels_bits(rng, monkeypatch, M, K, T, R):
    """matvec.ROWS_PAIRS / ONE_ROW_PAIRS (run_bench --launch rows-pairs, decode-pairs): Q4_K
    launches at one warp a row take two weight rows a warp (`rows_pair_kernel_of`: its own
    build, half the warps) and give the row loop's bits -- M odd (the last warp's second row
    past the end), bias and residual; K = 512 / 2048 / 4096: the pair step at 1, 1 and 2 slots
    (half the fitted unroll of 1, 2 and 4); T = 1 at K = 512 and 5120 (rows the persistent
    kernel does not take: 5120 is 5 chunks a lane, 2 pair steps of 2 slots and one clamped).
    R = 4 (matvec.PAIR_ROWS_PER_WARP): four weight rows a warp, one slot a step; M = 3 leaves
    a warp's fourth row past the end, M = 5 and 7 a second warp with one and three rows."""
    from bw24nb.kernels import matvec, matvec_q4k as q4
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = (10 * rng.standard_normal(M)).astype(np.float32)
    residual = (10 * rng.standard_normal((T, M))).astype(np.float32)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", False)         # (on by default since session 31)
    monkeypatch.setattr(matvec, "ONE_ROW_PAIRS", False)
    assert "_w" not in q4.KERNELS(T, 1, K).py_func.__name__
    plain = _launch_rows(w, QType.Q4_K, M, K, x, True, T, bias, residual, parts=1)
    assert not q4.xreg_serves(M, K, 1, T)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", T > 1)
    monkeypatch.setattr(matvec, "ONE_ROW_PAIRS", T == 1)
    monkeypatch.setattr(matvec, "PAIR_ROWS_PER_WARP", R)
    monkeypatch.setattr(matvec, "QUADS_FROM_ROWS", 1)         # R at every T (T = 2 too)
    monkeypatch.setattr(matvec, "PAIRS_UP_TO_M", 0)           # and every M
    assert f"_w{R}_p1" in q4.KERNELS(T, 1, K).py_func.__name__
    assert "_w" not in q4.KERNELS(T, 2, K).py_func.__name__        # split rows: no pairs
    assert "_w" not in q4.KERNELS(3 - min(T, 2), 1, K).py_func.__name__  # the other switch
    pairs = _launch_rows(w, QType.Q4_K, M, K, x, True, T, bias, residual, parts=1)
    assert np.all(np.isfinite(plain))
    np.testing.assert_array_equal(pairs.view(np.uint32), plain.view(np.uint32))


def test_warp_rows_take_pairs_below_quads_from_rows(rng, monkeypatch):
    """matvec.warp_rows (session 32): with quads on, launches of fewer than QUADS_FROM_ROWS
    activation rows take two weight rows a warp, the others four; split rows (parts > 1), one
    row (ONE_ROW_PAIRS off) and nibble order keep the row loop; the launcher's grid and kernel
    follow the same choice, so the default launch at T = 2 (pairs) and T = 3 (quads) gives
    the row loop's bits with M = 5 (the last warp part past the end)."""
    from bw24nb.kernels import matvec, matvec_q4k as q4, matvec_q6k as q6
    monkeypatch.setattr(matvec, "ROWS_PAIRS", True)
    monkeypatch.setattr(matvec, "ONE_ROW_PAIRS", False)
    monkeypatch.setattr(matvec, "PAIR_ROWS_PER_WARP", 4)
    monkeypatch.setattr(matvec, "QUADS_FROM_ROWS", 3)
    monkeypatch.setattr(matvec, "PAIRS_UP_TO_M", 0)           # the T rule alone
    for p in (q4.PATH, q6.PATH):
        assert [matvec.warp_rows(p, T, 1) for T in (1, 2, 3, 9)] == [1, 2, 4, 4]
        assert matvec.warp_rows(p, 3, 2) == 1
    assert matvec.warp_rows(q4.PATH_NIB, 3, 1) == 1
    assert matvec.grid_rows(9, 1, 4) == matvec.grid_rows(3, 1) < matvec.grid_rows(9, 1, 2)
    M, K = 5, 512
    assert "_w2_p1" in q4.KERNELS(2, 1, K).py_func.__name__
    assert "_w4_p1" in q4.KERNELS(3, 1, K).py_func.__name__
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    for T in (2, 3):
        x = rng.standard_normal((T, K)).astype(np.float32)
        residual = (10 * rng.standard_normal((T, M))).astype(np.float32)
        got = _launch_rows(w, QType.Q4_K, M, K, x, True, T, residual=residual, parts=1)
        with monkeypatch.context() as m:
            m.setattr(matvec, "ROWS_PAIRS", False)
            plain = _launch_rows(w, QType.Q4_K, M, K, x, True, T, residual=residual, parts=1)
        assert np.all(np.isfinite(plain))
        np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))
    monkeypatch.setattr(matvec, "QUADS_FROM_ROWS", 4)
    assert [matvec.warp_rows(q4.PATH, T, 1) for T in (2, 3, 4)] == [2, 2, 4]
    monkeypatch.setattr(matvec, "PAIR_ROWS_PER_WARP", 2)
    assert [matvec.warp_rows(q4.PATH, T, 1) for T in (2, 3, 4)] == [2, 2, 2]


def test_pairs_up_to_m_take_pairs_for_short_outputs(rng, monkeypatch):
    """matvec.PAIRS_UP_TO_M (4096 since session 33; run_bench --launch pairs-m0 turns it off):
    launches of at most PAIRS_UP_TO_ROWS activation rows and M <= PAIRS_UP_TO_M output rows
    take pairs where the T rule gives quads; longer outputs, more rows, an unknown M and
    launches beside others (unless PAIRS_BESIDE) keep quads; the launcher's kernel and grid
    agree, the row loop's bits (M = 5, T = 3), alone and beside."""
    from bw24nb.kernels import matvec, matvec_q4k as q4, matvec_q6k as q6
    assert (matvec.PAIRS_UP_TO_M, matvec.PAIRS_UP_TO_ROWS, matvec.PAIRS_BESIDE) == (4096, 4, False)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", True)
    monkeypatch.setattr(matvec, "PAIR_ROWS_PER_WARP", 4)
    monkeypatch.setattr(matvec, "QUADS_FROM_ROWS", 3)
    for p in (q4.PATH, q6.PATH):
        assert [matvec.warp_rows(p, T, 1, 4096) for T in (2, 3, 4, 5, 9)] == [2, 2, 2, 4, 4]
        assert [matvec.warp_rows(p, 3, 1, M) for M in (4097, None)] == [4, 4]
        assert [matvec.warp_rows(p, T, 1, 4096, beside=True) for T in (2, 3, 4)] == [2, 4, 4]
        with monkeypatch.context() as m:
            m.setattr(matvec, "PAIRS_BESIDE", True)
            assert matvec.warp_rows(p, 3, 1, 4096, beside=True) == 2
    M, K, T = 5, 512, 3
    monkeypatch.setattr(matvec, "PAIRS_UP_TO_M", M)
    assert "_w2_p1" in q4.KERNELS(T, 1, K, M).py_func.__name__
    assert "_w4_p1" in q4.KERNELS(T, 1, K, M, beside=True).py_func.__name__
    assert "_w4_p1" in q4.KERNELS(T, 1, K, M + 1).py_func.__name__
    assert "_w4_p1" in q6.KERNELS(T, 1, K, M, True).py_func.__name__
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    got = _launch_rows(w, QType.Q4_K, M, K, x, True, T, parts=1)
    beside = _launch_rows(w, QType.Q4_K, M, K, x, True, T, parts=1, beside=True)
    monkeypatch.setattr(matvec, "ROWS_PAIRS", False)
    plain = _launch_rows(w, QType.Q4_K, M, K, x, True, T, parts=1)
    assert np.all(np.isfinite(plain))
    np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))
    np.testing.assert_array_equal(beside.view(np.uint32), plain.view(np.uint32))


def test_fit_unroll_cuts_slots_to_the_units_a_lane_has():
    """matvec.fit_unroll: a lane of a one-warp row of K = 2048 Q4_K values has 2 chunks (2
    slots a step), of K = 512 one (split over 2 warps: still one), of K = 4096 four (the path
    itself); FIT_UNROLL = False keeps the path."""
    from bw24nb.kernels import matvec, matvec_q4k as q4
    p = q4.PATH
    assert matvec.fit_unroll(p, 2048, 1).unroll == 2
    assert matvec.fit_unroll(p, 512, 1).unroll == 1
    assert matvec.fit_unroll(p, 512, 2).unroll == 1
    assert matvec.fit_unroll(p, 4096, 1) is p
    assert matvec.fit_unroll(p, 2048, 1) is matvec.fit_unroll(p, 2048, 1)     # built once
    assert matvec.fit_unroll(p, 2048, 1).name != p.name      # its own kernel names
    was = matvec.FIT_UNROLL
    try:
        matvec.FIT_UNROLL = False
        assert matvec.fit_unroll(p, 2048, 1) is p
    finally:
        matvec.FIT_UNROLL = was


@pytest.mark.parametrize("K,parts", [(2048, 1), (512, 1)])
def test_fitted_unroll_gives_the_full_unrolls_bits(rng, monkeypatch, K, parts):
    """At K = 2048 / 512 with one warp a row the launchers run 2 / 1 slots a step
    (fit_unroll); the full 4 slots' extra ones only add +0.0, so one row and three rows of the
    fitted kernels give the unfitted one-row kernel's bits."""
    from bw24nb.kernels import matvec
    qt, M, T = QType.Q4_K, 3, 3
    w = random_weight_bytes(rng, qt, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = _launch_rows(w, qt, M, K, x, True, T, parts=parts)
    y1 = [_launch_rows(w, qt, M, K, x[t], True, 1, parts=parts)[0] for t in range(T)]
    monkeypatch.setattr(matvec, "FIT_UNROLL", False)
    for t in range(T):
        full = _launch_rows(w, qt, M, K, x[t], True, 1, parts=parts)[0].view(np.uint32)
        np.testing.assert_array_equal(y[t].view(np.uint32), full, err_msg=f"rows, row {t}")
        np.testing.assert_array_equal(y1[t].view(np.uint32), full, err_msg=f"one row, row {t}")


def _q4k_row_in_kernel_order(blocks, xq, xd, parts):
    """float32 emulation of matvec_q4k's documented order for one row (no fused multiply-add,
    as the simulator): chunk values, lane sums, the warp butterfly, then the row's warps."""
    from bw24nb.quant.kquants import _unpack_scales_k4
    f32 = np.float32
    d = blocks[:, 0:2].copy().view(np.float16).astype(f32).reshape(-1)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(f32).reshape(-1)
    sc, mn = _unpack_scales_k4(blocks[:, 4:16])
    qs = blocks[:, 16:144].astype(np.int64)
    x = xq.astype(np.int64)

    def chunk(c):
        b, p, h = c >> 3, (c & 7) >> 1, c & 1
        e = 256 * b + 64 * p + 16 * h
        q = qs[b, 32 * p + 16 * h:32 * p + 16 * h + 16]
        sa, sxa = int((q & 15) @ x[e:e + 16]), int(x[e:e + 16].sum())
        sb, sxb = int((q >> 4) @ x[e + 32:e + 48]), int(x[e + 32:e + 48].sum())
        va = xd[e >> 5] * (f32(d[b] * f32(sc[b, 2 * p])) * f32(sa)
                           - f32(dmin[b] * f32(mn[b, 2 * p])) * f32(sxa))
        vb = xd[(e + 32) >> 5] * (f32(d[b] * f32(sc[b, 2 * p + 1])) * f32(sb)
                                  - f32(dmin[b] * f32(mn[b, 2 * p + 1])) * f32(sxb))
        return f32(va + vb)

    n = len(blocks) * 8
    total = f32(0.0)
    for w in range(parts):
        lanes = np.zeros(32, f32)
        for lane in range(32):
            for c in range(32 * w + lane, n, 32 * parts):
                lanes[lane] = f32(lanes[lane] + chunk(c))
        total = warp_tree_sum_host(lanes) if w == 0 else f32(total + warp_tree_sum_host(lanes))
    return total


@pytest.mark.parametrize("parts,nibble", [(1, False), (2, False), (1, True), (2, True)])
def test_q4k_matvec_is_its_documented_order_bit_for_bit(rng, parts, nibble):
    """With realistic (not power-of-two) scales the Q4_K kernel's rounding is its summation
    order's: every row must equal a float32 emulation of that order exactly. This pins the
    order itself -- chunk formula, the high nibbles' d sc_b / 16 against 16 sb (decision 0020:
    the same product), lane sums, butterfly, warps -- and the rows kernel must give each row
    the same bits. nibble: the activations handed over in nibble order (PATH_NIB), which
    moves only where the kernel reads them: the same bits again."""
    M, K, T = 3, 4096, 2                    # 128 chunks a row: 2-4 a lane, so order shows
    w = random_weight_bytes(rng, QType.Q4_K, M, K)
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    blocks = w.reshape(M, K // 256, -1)
    xq_in = nibble_order(xq) if nibble else xq
    for rows in (1, T):
        y = cuda.to_device(np.full(rows * M, np.nan, np.float32))
        launch_matvec_q8(cuda.to_device(w), QType.Q4_K, M, K, cuda.to_device(xq_in[:rows * K]),
                         cuda.to_device(xd[:rows * K // 32]), y, parts=parts, rows=rows,
                         nibble=nibble)
        out = y.copy_to_host().reshape(rows, M)
        for t in range(rows):
            want = [_q4k_row_in_kernel_order(blocks[r], xq[t * K:(t + 1) * K],
                                             xd[t * K // 32:(t + 1) * K // 32], parts)
                    for r in range(M)]
            np.testing.assert_array_equal(out[t].view(np.uint32),
                                          np.array(want, np.float32).view(np.uint32))


@pytest.mark.parametrize("K,db", [(1024, False), (2048, True), (3072, False), (4096, False),
                                  (4096, True)])
def test_q4k_persistent_kernel_gives_the_row_loops_bits(rng, monkeypatch, K, db):
    """matvec_q4k's persistent kernel (activations in registers, warps looping over rows;
    db: the next row's weights loaded a row ahead) sums each row in the row loop's order at
    one warp a row: launch_matvec_q8 with it (XREG on) and without it must agree bit for bit,
    bias and residual included -- on a grid of one block, so that each warp takes several
    rows, and with M not a multiple of the warps."""
    from bw24nb.kernels import matvec_q4k as q4
    M = 11
    w = cuda.to_device(random_weight_bytes(rng, QType.Q4_K, M, K))
    x = rng.standard_normal(K).astype(np.float32)
    xq, xd = quantize_act_q8_reference(x)
    xq, xd = cuda.to_device(xq), cuda.to_device(xd)
    bias = cuda.to_device(rng.standard_normal(M).astype(np.float32))
    res = cuda.to_device(rng.standard_normal(M).astype(np.float32))
    monkeypatch.setattr(q4, "XREG_BLOCKS_PER_SM", 1)
    monkeypatch.setattr(q4, "sm_count", lambda: 1)
    monkeypatch.setattr(q4, "XREG", True)
    monkeypatch.setattr(q4, "XREG_DB", db)
    assert q4.xreg_serves(M, K, 1, 1) and q4.persistent_grid(M, q4.XREG_BLOCKS_PER_SM) == 1
    assert not q4.xreg_serves(M, K, 2, 1) and not q4.xreg_serves(M, K, 1, 2)
    assert not q4.xreg_serves(M, 5120, 1, 1) and not q4.xreg_serves(M, 1536, 1, 1)
    _same_bits_on_and_off(monkeypatch, q4, "XREG", w, M, K, xq, xd, bias, res)


def _same_bits_on_and_off(monkeypatch, q4, switch, w, M, K, xq, xd, bias, res):
    """One-row Q4_K launches with matvec_q4k.<switch> on and off, without and with bias and
    residual: the same bits, every output written."""
    outs = []
    for on in (True, False):
        monkeypatch.setattr(q4, switch, on)
        for b, r in ((None, None), (bias, res)):
            y = cuda.to_device(np.full(M, np.nan, np.float32))
            launch_matvec_q8(w, QType.Q4_K, M, K, xq, xd, y, bias=b, residual=r, parts=1)
            outs.append(y.copy_to_host())
    assert np.all(np.isfinite(outs[0])) and np.all(np.isfinite(outs[1]))
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[2].view(np.uint32))
    np.testing.assert_array_equal(outs[1].view(np.uint32), outs[3].view(np.uint32))

