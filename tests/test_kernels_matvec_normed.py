"""The decode matvec with its input's RMSNorm + int8 quantization in each block's prologue
(kernels/matvec_normed.py), in the CUDA simulator: bit for bit the two launches it replaces
(norm.launch_rms_norm_q8, then launch_matvec_q8 on its codes), for every Q8_0 / Q5_0 / Q4_0
row length class (the norm's block smaller than, equal to and larger than the matvec's 128
threads; rows of several units a lane), one and two warps a row, bias and residual; the
prologue's codes against the norm kernel's; clear refusals.

Fresh random weights, activations and norm weights each run; outputs poisoned with NaN, with
guard values past the end that must survive.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_matvec_q8, matvec_normed, norm
from bw24nb.kernels.dequant import random_weight_bytes
from bw24nb.quant import QType

GUARD = np.float32(-777.25)
EPS = np.float32(1e-6)


def _poisoned(n):
    return cuda.to_device(np.concatenate([np.full(n, np.nan, np.float32),
                                          np.full(4, GUARD, np.float32)]))


def _two_launches(w, qt, M, K, h, wn, bias, residual, parts):
    """norm.launch_rms_norm_q8 then launch_matvec_q8: what the fused kernel must equal."""
    x = cuda.device_array(K, np.float32)
    xq, xd = cuda.device_array(K, np.int8), cuda.device_array(K // 32, np.float32)
    norm.launch_rms_norm_q8(cuda.to_device(h), cuda.to_device(wn), EPS, x, xq, xd)
    y = _poisoned(M)
    launch_matvec_q8(cuda.to_device(w.reshape(-1)), qt, M, K, xq, xd, y[:M], parts=parts,
                     bias=None if bias is None else cuda.to_device(bias),
                     residual=None if residual is None else cuda.to_device(residual))
    return y.copy_to_host()


def _fused(w, qt, M, K, h, wn, bias, residual, parts):
    y = _poisoned(M)
    matvec_normed.launch_matvec_normed(
        cuda.to_device(w.reshape(-1)), qt, M, K, cuda.to_device(h), cuda.to_device(wn), EPS,
        y[:M], parts=parts, bias=None if bias is None else cuda.to_device(bias),
        residual=None if residual is None else cuda.to_device(residual))
    out = y.copy_to_host()
    assert np.all(out[M:] == GUARD), "kernel wrote past the end of y"
    assert not np.isnan(out[:M]).any(), "a row was left unwritten"
    return out


def _inputs(rng, K):
    """A hidden row whose magnitudes span 2^-8 .. 2^8 (the codes' scales differ block to block,
    and the sum of squares rounds differently in any other order) and a norm weight around 1."""
    h = (rng.normal(0, 1, K) * 2.0 ** rng.uniform(-8, 8, K)).astype(np.float32)
    wn = rng.uniform(0.5, 1.5, K).astype(np.float32)
    return h, wn


@pytest.mark.parametrize("qt", [QType.Q8_0, QType.Q5_0, QType.Q4_0], ids=lambda q: q.name)
@pytest.mark.parametrize("M,K,parts,bias,residual", [
    (10, 896, 2, True, True),     # the 0.5B's width: norm block 256 = 2 x 128 threads
    (6, 896, 1, False, True),     # (a block's last rows past M leave after the prologue)
    (8, 128, 1, True, False),     # norm block 32 < 128: threads past it add nothing
    (5, 512, 2, True, True),      # norm block 128 = the matvec's
    (4, 2048, 1, False, False),   # norm block 512; 64 units: two a lane
])
def test_normed_matvec_is_the_two_launches(rng, qt, M, K, parts, bias, residual):
    """(M x row bytes a multiple of 16: the buffers matvec_qx0 may read)"""
    w = random_weight_bytes(rng, qt, M, K)
    h, wn = _inputs(rng, K)
    bias = rng.normal(0, 1, M).astype(np.float32) if bias else None
    residual = rng.normal(0, 1, M).astype(np.float32) if residual else None
    want = _two_launches(w, qt, M, K, h, wn, bias, residual, parts)
    got = _fused(w, qt, M, K, h, wn, bias, residual, parts)
    np.testing.assert_array_equal(got[:M].view(np.uint32), want[:M].view(np.uint32))


def _order_sensitive(slot):
    """Rows whose sum of squares depends on the order of the adds: one 1.0 in the norm
    thread's `slot` (elements 256 slot .. 256 slot + 255 of 896) among values whose squares
    are 2^-24, half an ulp of 1: they vanish when added to 1.0 one by one, and count once
    summed among themselves first. (The sqrt in rstd can still round a changed total back.)"""
    def inputs(rng, K):
        h = (2.0 ** -12 * rng.choice([-1, 1], K)).astype(np.float32)
        h[min(K - 1, 256 * slot + int(rng.integers(0, 256)))] = 1.0
        return h, np.ones(K, np.float32)
    return inputs


@pytest.mark.parametrize("inputs", [_inputs] + [_order_sensitive(s) for s in range(4)])
def test_prologue_codes_are_the_norm_kernels(rng, inputs):
    """The shared copy itself: the prologue's codes and scales, read back in its word-major
    layout, equal rms_norm_q8's; a block of 128 threads playing the norm's 256. The second
    row tells any other order of the sum of squares from the norm kernel's by its scales."""
    K, NT = 896, 128
    NB = K // 32
    prologue = norm.q8_prologue(K, NT)

    @cuda.jit
    def probe(h, wn, eps, xs_out, ds_out):
        xs = cuda.shared.array(K // 4, np.uint32)
        ds = cuda.shared.array(NB, np.float32)
        scratch = cuda.shared.array(norm.SCRATCH_WARPS, np.float32)
        prologue(h, wn, eps, xs, ds, scratch)
        for i in range(cuda.threadIdx.x, K // 4, NT):
            xs_out[i] = xs[i]
        for i in range(cuda.threadIdx.x, NB, NT):
            ds_out[i] = ds[i]

    h, wn = inputs(rng, K)
    xs, ds = cuda.to_device(np.zeros(K // 4, np.uint32)), cuda.to_device(np.full(NB, np.nan,
                                                                                 np.float32))
    probe[1, NT](cuda.to_device(h), cuda.to_device(wn), EPS, xs, ds)
    codes = xs.copy_to_host().reshape(8, NB).T.copy().view(np.int8).reshape(-1)
    x = cuda.device_array(K, np.float32)
    xq, xd = cuda.device_array(K, np.int8), cuda.device_array(NB, np.float32)
    norm.launch_rms_norm_q8(cuda.to_device(h), cuda.to_device(wn), EPS, x, xq, xd)
    np.testing.assert_array_equal(codes, xq.copy_to_host())
    np.testing.assert_array_equal(ds.copy_to_host().view(np.uint32),
                                  xd.copy_to_host().view(np.uint32))


def test_refusals(rng):
    w = cuda.to_device(random_weight_bytes(rng, QType.Q8_0, 4, 128).reshape(-1))
    h, wn, y = (cuda.to_device(np.ones(n, np.float32)) for n in (128, 128, 4))
    with pytest.raises(ValueError, match="no kernel for Q4_K rows of 128"):
        matvec_normed.launch_matvec_normed(w, QType.Q4_K, 4, 128, h, wn, EPS, y)
    with pytest.raises(ValueError, match="is 408 bytes; the device buffer holds 544"):
        matvec_normed.launch_matvec_normed(w, QType.Q8_0, 3, 128, h, wn, EPS, y)
    with pytest.raises(ValueError, match="wn must be float32 with at least 128"):
        matvec_normed.launch_matvec_normed(w, QType.Q8_0, 4, 128, h,
                                           cuda.to_device(np.ones(64, np.float32)), EPS, y)
    with pytest.raises(ValueError, match="rows of 48 on 128"):
        norm.q8_prologue(48, 128)
