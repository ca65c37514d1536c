"""Decode attention in one launch (attention.launch_flash_decode(counters=)): the F16 split pass
whose last block of each (token, KV head) merges the partials (decode_attention's `merge`).

Checked against ops.attention (the tolerance of test_kernels_attention.py), against a numpy
rendering of the merge's documented order from the unfused pass's partials (bit for bit: the
simulator rounds every float32 operation, as numpy does), for verify rows equal to the same
tokens decoded alone, for the output gate and int8 copy equal to the separate launches, and
for counters that every launch leaves at zero (a second launch gives the same bits).
"""
import math

import numpy as np
import pytest
from numba import cuda

from bw24nb.cache import KVCache
from bw24nb.kernels import attention, decode_attention
from bw24nb.kernels.activation import launch_sigmoid_mul
from bw24nb.kernels.attention import (alloc_decode_counters, alloc_decode_partials,
                                      launch_flash_decode)
from bw24nb.kernels.quantize_act import launch_quantize_act
from bw24nb.quant import QType
from bw24nb.reference import ops

ATOL, RTOL = 5e-5, 1e-4
F16 = QType.F16


def _cache(rng, Hkv, D, ctx):
    """A one-slot F16 cache with every position filled (reading past n_ctx would show)."""
    cache = KVCache(1, Hkv, D, ctx, F16, F16)
    k = (2 * rng.standard_normal((ctx, Hkv, D))).astype(np.float32)
    v = rng.standard_normal((ctx, Hkv, D)).astype(np.float32)
    cache.store(0, cuda.to_device(k), cuda.to_device(v),
                cuda.to_device(np.arange(ctx, dtype=np.int32)))
    return cache


def _fused(cache, q, positions, n_splits, splits=None, min_chunk=None, counters=None, **kw):
    """out (host) and counters of a fused launch on partials of n_splits (the grid's splits:
    `splits`, default n_splits)."""
    T, Hq, D = q.shape
    splits = n_splits if splits is None else splits
    Hkv = cache.layer(0)[0].shape[0]
    part_ml, part_acc = alloc_decode_partials(T, Hq, D, n_splits)
    counters = alloc_decode_counters(T, Hkv) if counters is None else counters
    out = cuda.to_device(np.full((T, Hq, D), np.nan, np.float32))
    k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
    launch_flash_decode(cuda.to_device(q), cuda.to_device(positions), k_u8, k_f16, F16, v_u8,
                        v_f16, F16, out, part_ml, part_acc, counters=counters, splits=splits,
                        min_chunk=min_chunk, **kw)
    return out.copy_to_host(), counters


# (Hq, Hkv, D, n_ctx, splits, min_chunk, T): D 32 / 64 keep the simulator quick
CASES = [
    (8, 2, 32, 37, 3, 16, 1),       # 3 splits of 16, 16, 5 keys
    (4, 2, 32, 5, 4, 16, 1),        # one used split (no count): three blocks exit at once
    (7, 1, 64, 300, 4, 16, 1),      # chunk 128 (aligned): 3 splits, every warp busy
    (8, 2, 32, 70, 8, 8, 3),        # a 3-token verify, 9 / 9 / 9 splits planned per token
    (4, 1, 32, 40, 40, 1, 1),       # 40 splits of one key: the merge's second lane round
]
IDS = ["ctx37-s3", "ctx5-one-split", "ctx300-n_rep7-d64", "ctx70-verify3", "ctx40-40-splits"]


@pytest.mark.parametrize("Hq,Hkv,D,n_ctx,splits,min_chunk,T", CASES, ids=IDS)
def test_fused_decode_matches_reference(rng, Hq, Hkv, D, n_ctx, splits, min_chunk, T):
    cache = _cache(rng, Hkv, D, n_ctx + 3)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    got, counters = _fused(cache, q, positions, splits, min_chunk=min_chunk)
    k, v = cache.read(0, n_ctx)
    np.testing.assert_allclose(got, ops.attention(q, k, v, causal_offset=n_ctx - T),
                               atol=ATOL, rtol=RTOL)
    np.testing.assert_array_equal(counters.copy_to_host(), 0)   # ready for the next launch


def _merge_reference(part_ml, part_acc, used):
    """decode_attention's merge in numpy, in its order: w_s = exp(m_s - M); L = butterfly
    warp_sum over lanes of lane-ascending sums (lane l: s = l, l + 32, ...); A = sum over s
    ascending of acc_s w_s; out = A / L. float32 throughout, exp rounded from double as the
    simulator's math.exp is."""
    f = np.float32
    T_, Hq, _, D = part_acc.shape
    out = np.empty((T_, Hq, D), np.float32)
    for t in range(T_):
        for h in range(Hq):
            m, l_ = part_ml[t, h, :used[t], 0], part_ml[t, h, :used[t], 1]
            M = max(m[i] for i in range(used[t]) if l_[i] > 0)
            w = np.array([f(math.exp(float(f(m[i] - M)))) if l_[i] > 0 else f(0)
                          for i in range(used[t])], np.float32)
            lanes = np.zeros(32, np.float32)
            for s in range(used[t]):
                lanes[s % 32] = f(lanes[s % 32] + f(l_[s] * w[s]))
            for off in (16, 8, 4, 2, 1):
                lanes = (lanes + lanes[np.arange(32) ^ off]).astype(np.float32)
            A = np.zeros(D, np.float32)
            for s in range(used[t]):
                A = (A + (part_acc[t, h, s] * w[s]).astype(np.float32)).astype(np.float32)
            out[t, h] = A / lanes[0]
    return out


@pytest.mark.parametrize("Hq,Hkv,D,n_ctx,splits,min_chunk,T", [CASES[0], CASES[3], CASES[4]],
                         ids=[IDS[0], IDS[3], IDS[4]])
def test_fused_merge_order(rng, Hq, Hkv, D, n_ctx, splits, min_chunk, T):
    """The fused output is, bit for bit, the documented merge of the unfused pass's partials
    (the same split kernel without its merge, on the same plan)."""
    cache = _cache(rng, Hkv, D, n_ctx + 3)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    got, _ = _fused(cache, q, positions, splits, min_chunk=min_chunk)
    part_ml, part_acc = alloc_decode_partials(T, Hq, D, splits)
    k_u8, _, v_u8, _ = cache.layer(0)
    decode_attention.launch_split(cuda.to_device(q), cuda.to_device(positions), k_u8, v_u8,
                                  np.float32(D ** -0.5), min_chunk,
                                  attention.DECODE_CHUNK_ALIGN, part_ml, part_acc)
    used = []
    for p in positions:
        n = p + 1
        chunk = max(min_chunk, -(-n // splits))
        if chunk > min_chunk:
            chunk = -(-chunk // attention.DECODE_CHUNK_ALIGN) * attention.DECODE_CHUNK_ALIGN
        used.append(-(-n // chunk))
    want = _merge_reference(part_ml.copy_to_host(), part_acc.copy_to_host(), used)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fused_verify_rows_equal_single_tokens(rng):
    """A T-token launch gives each token the bits of its own one-token launch (speculative
    verify relies on it), and launching twice on the same counters repeats the bits."""
    Hq, Hkv, D, n_ctx, splits, mc, T = 8, 2, 32, 70, 8, 8, 3
    cache = _cache(rng, Hkv, D, n_ctx + 3)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    counters = alloc_decode_counters(T, Hkv)
    rows, _ = _fused(cache, q, positions, splits, min_chunk=mc, counters=counters)
    again, _ = _fused(cache, q, positions, splits, min_chunk=mc, counters=counters)
    np.testing.assert_array_equal(rows.view(np.uint32), again.view(np.uint32))
    for t in range(T):
        one, _ = _fused(cache, q[t:t + 1], positions[t:t + 1], splits, min_chunk=mc)
        np.testing.assert_array_equal(rows[t].view(np.uint32), one[0].view(np.uint32))


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
def test_fused_gate_and_int8_equal_separate_launches(rng, gated):
    """gate= / xq= / xd= in the merge write what sigmoid_mul, then quantize_act, write after the
    fused launch without them: the same operations in the same order."""
    Hq, Hkv, D, n_ctx, splits, T = 4, 2, 64, 45, 4, 2
    n = T * Hq * D
    cache = _cache(rng, Hkv, D, n_ctx + 3)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    gate = cuda.to_device((3 * rng.standard_normal(n)).astype(np.float32)) if gated else None
    plain, _ = _fused(cache, q, positions, splits, min_chunk=16)
    ref = cuda.to_device(plain.reshape(n))
    if gated:
        launch_sigmoid_mul(ref, gate)
    q_ref = cuda.to_device(np.full(n, -128, np.int8))
    d_ref = cuda.to_device(np.full(n // 32, np.nan, np.float32))
    launch_quantize_act(ref, q_ref, d_ref)
    xq = cuda.to_device(np.full(n, -128, np.int8))
    xd = cuda.to_device(np.full(n // 32, np.nan, np.float32))
    got, _ = _fused(cache, q, positions, splits, min_chunk=16, gate=gate, xq=xq, xd=xd)
    np.testing.assert_array_equal(got.reshape(n).view(np.uint32),
                                  ref.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(xq.copy_to_host(), q_ref.copy_to_host())
    np.testing.assert_array_equal(xd.copy_to_host().view(np.uint32),
                                  d_ref.copy_to_host().view(np.uint32))


def test_fused_rejects_bad_counters(rng):
    cache = _cache(rng, 2, 32, 8)
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="counters must be int32 with >= 4"):
        _fused(cache, q, np.array([3, 4], np.int32), 2,
               counters=cuda.to_device(np.zeros(3, np.int32)))
    with pytest.raises(ValueError, match="n_splits must be 1 .. 2"):
        _fused(cache, q, np.array([3, 4], np.int32), 2, splits=3)
