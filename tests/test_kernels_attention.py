"""Attention kernels (bw24nb/kernels/attention.py) against ops.attention.

Quantized-cache cases compare with the reference run on the cache's own dequantized contents
(`KVCache.read`), so quantization error is out of the picture and only float32 rounding remains.

Tolerance: inputs ~N(0, 1), D <= 32. A score is a D-term float32 dot (error <~ D * 2^-24 *
sum|q_d k_d| ~ 1e-5 absolute at these sizes, times the scale 1/sqrt(D)); exp turns an absolute
score error e into a relative weight error ~e, and the output is a convex combination of V rows
(|v| <~ 4), so |error| <~ 4e-5 in the worst case and ~1e-6 typically. atol = 5e-5 with
rtol = 1e-4 bounds that with margin while a wrong mask, a wrong KV head, a dropped tile or a
mis-merged split moves outputs by O(0.1).
"""
import math

import numpy as np
import pytest
from numba import cuda

from bw24nb.cache import KVCache
from bw24nb.kernels.attention import (alloc_decode_partials, decode_splits, launch_flash_attn,
                                      launch_flash_attn_cache, launch_flash_decode)
from bw24nb.kernels import decode_attention
from bw24nb.quant import QType
from bw24nb.reference import ops
from bw24nb.switches import switched

ATOL, RTOL = 5e-5, 1e-4


def _poisoned(shape):
    return cuda.to_device(np.full(shape, np.nan, np.float32))


def _qkv(rng, T, S, Hq, Hkv, D):
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    return q, k, v


def _filled_cache(rng, S, Hkv, D, ctx, k_type, v_type):
    """A one-slot cache holding S random positions written by the store kernel."""
    cache = KVCache(1, Hkv, D, ctx, k_type, v_type)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    positions = cuda.to_device(np.arange(S, dtype=np.int32))
    cache.store(0, cuda.to_device(k), cuda.to_device(v), positions)
    return cache


@pytest.mark.parametrize("T,S,Hq,Hkv,D", [
    (11, 11, 4, 2, 16),      # prefill from empty, n_rep 2: 22 rows = 2 row tiles, 2 key tiles
    (6, 20, 6, 2, 32),       # continued prefill at positions 14..19, n_rep 3 (rows straddle tiles)
    (5, 5, 2, 2, 16),        # plain MHA (n_rep 1)
], ids=["gqa2-from-empty", "gqa3-offset", "mha"])
def test_flash_attn_f32(rng, T, S, Hq, Hkv, D):
    q, k, v = _qkv(rng, T, S, Hq, Hkv, D)
    positions = np.arange(S - T, S, dtype=np.int32)
    out = _poisoned((T, Hq, D))
    launch_flash_attn(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                      cuda.to_device(positions), out)
    want = ops.attention(q, k, v, causal_offset=S - T)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)


def test_flash_attn_f32_custom_scale(rng):
    q, k, v = _qkv(rng, 3, 3, 2, 1, 16)
    out = _poisoned((3, 2, 16))
    launch_flash_attn(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                      cuda.to_device(np.arange(3, dtype=np.int32)), out, scale=0.7)
    want = ops.attention(q, k, v, scale=0.7)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("k_type,v_type", [(QType.Q8_0, QType.Q5_1), (QType.F16, QType.F16)],
                         ids=["q8_0-q5_1", "f16-f16"])
def test_flash_attn_over_cache(rng, k_type, v_type):
    T, S, Hq, Hkv, D, ctx = 9, 13, 8, 2, 32, 24      # n_rep 4: 36 rows = 3 row tiles
    cache = _filled_cache(rng, S, Hkv, D, ctx, k_type, v_type)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(S - T, S, dtype=np.int32)
    out = _poisoned((T, Hq, D))
    k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
    launch_flash_attn_cache(cuda.to_device(q), cuda.to_device(positions), k_u8, k_f16, k_type,
                            v_u8, v_f16, v_type, out)
    k_deq, v_deq = cache.read(0, S)
    want = ops.attention(q, k_deq, v_deq, causal_offset=S - T)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)


_Q8, _F16 = (QType.Q8_0, QType.Q5_1), (QType.F16, QType.F16)


# Q8_0/Q5_1 runs attention.py's tile kernel, F16 decode_attention.py's lane-per-key pass (head_dim
# 32 keeps the simulator quick; kernel-check covers the real shapes on the GPU). min_chunk None:
# the default DECODE_MIN_CHUNK (16).
@pytest.mark.parametrize("kv,Hq,Hkv,n_ctx,n_splits,T,min_chunk", [
    (_Q8, 8, 2, 37, 3, 1, None),    # 16 keys a split: 3 used, the last one 5 keys
    (_Q8, 8, 2, 5, 4, 1, None),     # one used split of 5 keys, three blocks that exit at once
    (_Q8, 8, 2, 30, 4, 3, None),    # speculative verify: 3 queries at 27, 28, 29
    (_Q8, 8, 2, 103, 3, 1, None),   # chunks of 35: not a multiple of the split or of the tile
    (_Q8, 8, 2, 70, 8, 2, None),    # 5 of 8 splits used (16 keys, the last 6), a 2-query verify
    (_F16, 8, 2, 37, 3, 1, None),   # 3 splits of 16, 16, 5 keys: partial tiles
    (_F16, 7, 1, 300, 1, 1, None),  # one split of 300 keys: 10 tiles, every warp loops 3 steps
    (_F16, 4, 2, 5, 4, 1, None),    # one used split, three blocks that exit at once
    (_F16, 8, 2, 70, 4, 2, 8),      # a 2-token verify, each token its own split plan
], ids=["q8-ctx37-s3", "q8-ctx5-s4-unused-splits", "q8-ctx30-verify3", "q8-ctx103-s3",
        "q8-ctx70-s8-verify2", "f16-ctx37-s3", "f16-ctx300-one-split-n_rep7", "f16-ctx5-unused",
        "f16-ctx70-verify2"])
def test_flash_decode_split_k(rng, kv, Hq, Hkv, n_ctx, n_splits, T, min_chunk):
    from bw24nb.kernels import decode_attention
    D, ctx = 32, n_ctx + 3
    assert decode_attention.supports(Hq // Hkv, D, *kv) == (kv == _F16)
    # every position holds data, so reading past n_ctx would show
    cache = _filled_cache(rng, ctx, Hkv, D, ctx, *kv)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    part_ml, part_acc = alloc_decode_partials(T, Hq, D, n_splits)
    out = _poisoned((T, Hq, D))
    k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
    launch_flash_decode(cuda.to_device(q), cuda.to_device(positions), k_u8, k_f16, kv[0],
                        v_u8, v_f16, kv[1], out, part_ml, part_acc, min_chunk=min_chunk)
    k_deq, v_deq = cache.read(0, n_ctx)
    want = ops.attention(q, k_deq, v_deq, causal_offset=n_ctx - T)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)


def test_decode_is_deterministic_and_matches_prefill_kernel(rng):
    # Same inputs twice: bit-identical (no atomics). Against the one-pass cache kernel: equal
    # to float32 rounding (different summation order, see the module docstring).
    Hq, Hkv, D, n_ctx = 4, 1, 32, 21
    cache = _filled_cache(rng, n_ctx, Hkv, D, 32, QType.Q8_0, QType.Q5_1)
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    layer = cache.layer(0)
    outs = []
    for _ in range(2):
        part_ml, part_acc = alloc_decode_partials(1, Hq, D, 3)
        out = _poisoned((1, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], QType.Q8_0, layer[2], layer[3],
                            QType.Q5_1, out, part_ml, part_acc)
        outs.append(out.copy_to_host())
    np.testing.assert_array_equal(outs[0], outs[1])
    one_pass = _poisoned((1, Hq, D))
    launch_flash_attn_cache(q, pos, layer[0], layer[1], QType.Q8_0, layer[2], layer[3],
                            QType.Q5_1, one_pass)
    np.testing.assert_allclose(outs[0], one_pass.copy_to_host(), atol=ATOL, rtol=RTOL)


def test_decode_splits_default():
    assert decode_splits(10, 8) == 2                       # never more splits than key tiles
    assert decode_splits(32768, 8) == 264 // 8
    assert decode_splits(32768, 1) == 256                  # capped


def test_flash_decode_many_splits_combine(rng):
    """min_chunk 4 over 150 keys: 38 used splits of 48, so the combine's (m, l) step spans two
    warps (warp_max / warp_sum + the ordered warp merge) and its per-dimension sum runs in
    several thread groups (D = 32: 8 groups of 32 threads), each over its own run of splits."""
    Hq, Hkv, D, n_ctx, n_splits = 2, 1, 32, 150, 48
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, QType.F16, QType.F16)
    q = rng.standard_normal((1, Hq, D)).astype(np.float32)
    part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
    out = _poisoned((1, Hq, D))
    k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
    launch_flash_decode(cuda.to_device(q), cuda.to_device(np.array([n_ctx - 1], np.int32)),
                        k_u8, k_f16, QType.F16, v_u8, v_f16, QType.F16, out, part_ml, part_acc,
                        min_chunk=4)
    k_deq, v_deq = cache.read(0, n_ctx)
    want = ops.attention(q, k_deq, v_deq, causal_offset=n_ctx - 1)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv,Hq,Hkv,n_splits,positions", [
    ((QType.Q8_0, QType.Q5_1), 4, 2, 4, (14, 15, 16)),    # chunks 4, 4 and 5 (4 splits)
    ((QType.F16, QType.F16), 2, 1, 2, (34, 35, 36)),       # decode_attention.py: 18, 18, 19
], ids=["q8_0-q5_1", "f16"])
def test_flash_decode_rows_match_one_token_launches(rng, kv, Hq, Hkv, n_splits, positions):
    """Speculative verify runs decode attention over K+1 tokens at once; each token's output
    must be bit-identical to decoding it alone (its split plan comes from its own position,
    min_chunk 4), on both split passes."""
    D, T = 32, len(positions)
    cache = _filled_cache(rng, 40, Hkv, D, 40, *kv)
    layer = cache.layer(0)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.array(positions, np.int32)

    def run(qs, pos):
        part_ml, part_acc = alloc_decode_partials(len(pos), Hq, D, n_splits)
        out = _poisoned((len(pos), Hq, D))
        launch_flash_decode(cuda.to_device(qs), cuda.to_device(pos), layer[0], layer[1], kv[0],
                            layer[2], layer[3], kv[1], out, part_ml, part_acc, min_chunk=4)
        return out.copy_to_host()

    together = run(q, positions)
    for t in range(T):
        np.testing.assert_array_equal(together[t], run(q[t:t + 1], positions[t:t + 1])[0])


def test_f16_path_only_where_it_applies():
    from bw24nb.kernels.decode_attention import supports
    assert supports(4, 256, QType.F16, QType.F16) and supports(7, 64, QType.F16, QType.F16)
    assert not supports(4, 256, QType.Q8_0, QType.Q5_1)        # quantized cache: attention.py
    assert not supports(4, 16, QType.F16, QType.F16)           # head_dim 16 (tiny fixtures)
    assert not supports(16, 128, QType.F16, QType.F16)         # more rows than ROWS_MAX


@pytest.mark.parametrize("kv,gated,T", [(_F16, True, 1), (_F16, False, 2), (_Q8, True, 2)],
                         ids=["f16-gated", "f16-verify2", "q8-gated-verify2"])
def test_flash_decode_fused_gate_and_int8_output(rng, kv, gated, T):
    """The combine with the output gate and the int8 copy folded in writes exactly what
    flash_decode, then sigmoid_mul, then quantize_act write (the engine's decode before the
    fusion), bit for bit, and nothing past its T * Hq * D codes / scales."""
    from bw24nb.kernels.activation import launch_sigmoid_mul
    from bw24nb.kernels.quantize_act import launch_quantize_act
    Hq, Hkv, D, n_ctx, n_splits = 4, 2, 64, 41, 3
    n = T * Hq * D
    cache = _filled_cache(rng, n_ctx + 2, Hkv, D, n_ctx + 2, *kv)
    q = cuda.to_device(rng.standard_normal((T, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.arange(n_ctx - T, n_ctx, dtype=np.int32))
    gate = cuda.to_device((rng.standard_normal(n) * 3).astype(np.float32)) if gated else None
    layer = cache.layer(0)

    def attend(**outs):
        part_ml, part_acc = alloc_decode_partials(T, Hq, D, n_splits)
        out = _poisoned((T, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], kv[0], layer[2], layer[3], kv[1], out,
                            part_ml, part_acc, **outs)
        return out

    ref = attend()
    if gated:
        launch_sigmoid_mul(ref, gate)
    q_ref = cuda.to_device(np.zeros(n, np.int8))
    d_ref = cuda.to_device(np.zeros(n // 32, np.float32))
    launch_quantize_act(ref.reshape(n), q_ref, d_ref)
    xq = cuda.to_device(np.full(n + 8, 99, np.int8))
    xd = cuda.to_device(np.full(n // 32 + 2, np.nan, np.float32))
    got = attend(gate=gate, xq=xq, xd=xd)
    np.testing.assert_array_equal(got.copy_to_host(), ref.copy_to_host())
    qh, dh = xq.copy_to_host(), xd.copy_to_host()
    np.testing.assert_array_equal(qh[:n], q_ref.copy_to_host())
    np.testing.assert_array_equal(dh[:n // 32], d_ref.copy_to_host())
    assert np.all(qh[n:] == 99) and np.all(np.isnan(dh[n // 32:]))
    assert np.any(qh[:n] != 0)


def test_flash_decode_int8_output_needs_whole_blocks(rng):
    Hq, Hkv, D = 2, 1, 16
    cache = _filled_cache(rng, 8, Hkv, D, 8, *_F16)
    part_ml, part_acc = alloc_decode_partials(1, Hq, D, 2)
    layer = cache.layer(0)
    with pytest.raises(ValueError, match="head_dim % 32"):
        launch_flash_decode(cuda.to_device(np.ones((1, Hq, D), np.float32)),
                            cuda.to_device(np.array([7], np.int32)), layer[0], layer[1],
                            QType.F16, layer[2], layer[3], QType.F16, _poisoned((1, Hq, D)),
                            part_ml, part_acc, xq=cuda.to_device(np.zeros(32, np.int8)),
                            xd=cuda.to_device(np.zeros(1, np.float32)))


@pytest.mark.parametrize("align,threads", [(1, 256), (128, 1024), (128, 256), (1, 512)])
def test_flash_decode_split_plans(rng, align, threads):
    """Every split plan (attention.launch_flash_decode's chunk_align / combine_threads) computes
    the attention: 300 keys over 8 splits are 8 chunks of 38 keys plainly, 3 of 128 (the last
    44) aligned; the combine's thread groups split the per-dimension sums 8 / 16 / 32 ways."""
    Hq, Hkv, D, n_ctx, n_splits = 4, 2, 32, 300, 8
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    q = rng.standard_normal((1, Hq, D)).astype(np.float32)
    part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
    part_ml.copy_to_device(np.full(part_ml.shape, np.nan, np.float32))
    out = _poisoned((1, Hq, D))
    k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
    launch_flash_decode(cuda.to_device(q), cuda.to_device(np.array([n_ctx - 1], np.int32)),
                        k_u8, k_f16, QType.F16, v_u8, v_f16, QType.F16, out, part_ml, part_acc,
                        chunk_align=align, combine_threads=threads)
    k_deq, v_deq = cache.read(0, n_ctx)
    want = ops.attention(q, k_deq, v_deq, causal_offset=n_ctx - 1)
    np.testing.assert_allclose(out.copy_to_host(), want, atol=ATOL, rtol=RTOL)
    written = ~np.isnan(part_ml.copy_to_host()[0, 0, :, 0])
    assert written.sum() == (3 if align == 128 else 8)


def test_flash_decode_combine_slices_and_batches(rng):
    """head_dim 128: the combine takes two blocks a head (combine_slices), each 4 groups of 64
    threads; chunk_align 1 and min_chunk 4 over 150 keys give 38 used splits, so a group's
    splits (g, g + 4, ...) are up to 10 partials -- the first COMBINE_BATCH loaded with (m, l),
    the rest in the loop.
    The result is the attention, a 2-token verify gives each token its own launch's bits, and
    the fused gate + int8 output equal sigmoid_mul then quantize_act."""
    from bw24nb.kernels.activation import launch_sigmoid_mul
    from bw24nb.kernels.attention import COMBINE_BATCH, combine_slices
    from bw24nb.kernels.quantize_act import launch_quantize_act
    Hq, Hkv, D, n_ctx, n_splits, T = 2, 1, 128, 150, 48, 2
    assert combine_slices(D) == 2 and (38 + 3) // 4 > COMBINE_BATCH
    cache = _filled_cache(rng, n_ctx + 2, Hkv, D, n_ctx + 2, *_F16)
    layer = cache.layer(0)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
    n = T * Hq * D
    gate = (rng.standard_normal(n) * 3).astype(np.float32)

    def run(qs, pos, **outs):
        part_ml, part_acc = alloc_decode_partials(len(pos), Hq, D, n_splits)
        out = _poisoned((len(pos), Hq, D))
        launch_flash_decode(cuda.to_device(qs), cuda.to_device(pos), layer[0], layer[1],
                            QType.F16, layer[2], layer[3], QType.F16, out, part_ml, part_acc,
                            min_chunk=4, chunk_align=1, **outs)
        return out

    plain = run(q, positions)
    k_deq, v_deq = cache.read(0, n_ctx)
    want = ops.attention(q, k_deq, v_deq, causal_offset=n_ctx - T)
    np.testing.assert_allclose(plain.copy_to_host(), want, atol=ATOL, rtol=RTOL)
    for t in range(T):
        np.testing.assert_array_equal(plain.copy_to_host()[t],
                                      run(q[t:t + 1], positions[t:t + 1]).copy_to_host()[0])
    launch_sigmoid_mul(plain, cuda.to_device(gate))
    q_ref = cuda.to_device(np.zeros(n, np.int8))
    d_ref = cuda.to_device(np.zeros(n // 32, np.float32))
    launch_quantize_act(plain.reshape(n), q_ref, d_ref)
    xq = cuda.to_device(np.full(n, 99, np.int8))
    xd = cuda.to_device(np.full(n // 32, np.nan, np.float32))
    fused = run(q, positions, gate=cuda.to_device(gate), xq=xq, xd=xd)
    np.testing.assert_array_equal(fused.copy_to_host(), plain.copy_to_host())
    np.testing.assert_array_equal(xq.copy_to_host(), q_ref.copy_to_host())
    np.testing.assert_array_equal(xd.copy_to_host(), d_ref.copy_to_host())
    # the batch (prefill's PREFILL_COMBINE_BATCH, or any other) only moves loads: same bits
    for batch in (1, 2, 3):
        other = run(q, positions, gate=cuda.to_device(gate), combine_batch=batch)
        np.testing.assert_array_equal(other.copy_to_host().view(np.uint32),
                                      fused.copy_to_host().view(np.uint32))
    with pytest.raises(ValueError, match="combine batch"):
        run(q, positions, combine_batch=0)


def test_flash_decode_prefill_form_and_bad_slices(rng):
    """The prefill form (slices=1, prefetch=False: Engine's for T > K + 1 tokens) computes the
    same attention as the decode form, in its own summation order; a slice count that does not
    divide head_dim is refused by name."""
    Hq, Hkv, D, n_ctx, T = 2, 1, 128, 40, 3
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    q = cuda.to_device(rng.standard_normal((T, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.arange(n_ctx - T, n_ctx, dtype=np.int32))

    def run(**kw):
        part_ml, part_acc = alloc_decode_partials(T, Hq, D, 4)
        out = _poisoned((T, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, min_chunk=4, chunk_align=1, **kw)
        return out.copy_to_host()

    np.testing.assert_allclose(run(slices=1, prefetch=False), run(), atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match="slices must divide head_dim 128"):
        run(slices=3)


@pytest.mark.parametrize("D,threads,n_ctx,min_chunk", [(64, 256, 150, 4), (128, 512, 300, 8)],
                         ids=["d64-4-groups-38-splits", "d128-2-slices-8-groups"])
def test_flash_decode_combine_order(rng, D, threads, n_ctx, min_chunk):
    """The combine is, bit for bit, its documented order over the partials the split pass left
    (flash_decode_combine's docstring; the simulator rounds every float32 operation as numpy
    does): M = max m_s; w_s = exp(m_s - M); L = each warp's butterfly tree of l_s w_s over its
    32 splits, the warps' sums in warp order; group g of G sums x_s w_s over its splits g, g + G,
    ... ascending, the groups in order; out = that / L."""
    from bw24nb.kernels.attention import combine_slices
    from bw24nb.ptx.warp import warp_tree_sum_host
    Hq, Hkv, n_splits = 2, 1, 48
    cache = _filled_cache(rng, n_ctx + 2, Hkv, D, n_ctx + 2, *_F16)
    layer = cache.layer(0)
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
    out = _poisoned((1, Hq, D))
    for only in ("split", "combine"):
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, min_chunk=min_chunk,
                            chunk_align=1, combine_threads=threads, only=only)
    ml, acc = part_ml.copy_to_host()[0], part_acc.copy_to_host()[0]
    used = -(-n_ctx // max(min_chunk, -(-n_ctx // n_splits)))
    DS = D // combine_slices(D)
    Dp = 1 << max(5, (DS - 1).bit_length())
    G = threads // Dp
    f = np.float32
    want = np.empty((Hq, D), np.float32)
    for h in range(Hq):
        m, l_ = ml[h, :used, 0], ml[h, :used, 1]
        M = m.max()
        w = np.array([f(math.exp(f(x - M))) for x in m], np.float32)
        lw = np.zeros(threads, np.float32)
        lw[:used] = l_ * w
        L = f(0)
        for k in range(threads // 32):
            s_k = warp_tree_sum_host(lw[32 * k:32 * k + 32])
            L = s_k if k == 0 else f(L + s_k)
        total = np.zeros(D, np.float32)
        for g in range(G):
            a = np.zeros(D, np.float32)
            for s_ in range(g, used, G):
                a = (a + acc[h, s_] * w[s_]).astype(np.float32)
            total = a if g == 0 else (total + a).astype(np.float32)
        want[h] = total / L
    np.testing.assert_array_equal(out.copy_to_host()[0].view(np.uint32), want.view(np.uint32))


def test_traced_split_pass_gives_the_same_bits_and_ordered_stamps(rng):
    """decode_attention's instrumented build (trace=): the outputs of the plain build, bit for
    bit; a working block's stamps in order (the simulator's clock is the host's), a block past
    the context stamps entry and plan only."""
    from bw24nb.kernels import decode_attention as da
    Hq, Hkv, D, n_ctx, n_splits = 4, 2, 32, 40, 4          # chunks of 16: 3 used, 1 exits
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    outs = []
    trace = cuda.to_device(np.zeros(da.trace_shape(1, Hkv, n_splits), np.uint64))
    for tr in (None, trace):
        part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
        out = _poisoned((1, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, trace=tr)
        outs.append(out.copy_to_host())
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    stamps = trace.copy_to_host()[0]                        # [Hkv, splits, 2, stamps]
    for kvh in range(Hkv):
        for split in range(n_splits):
            for clock in (0, 1):
                st = stamps[kvh, split, clock].astype(np.int64)
                if split < 3:
                    assert (st > 0).all() and (np.diff(st) >= 0).all()
                else:
                    assert (st[:2] > 0).all() and (st[2:] == 0).all()
    with pytest.raises(ValueError, match="trace must be uint64"):
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, _poisoned((1, Hq, D)), part_ml, part_acc,
                            trace=cuda.to_device(np.zeros(5, np.uint64)))


@pytest.mark.parametrize("store", [False, True])
def test_traced_one_pass_kernel_gives_the_same_bits_and_ordered_stamps(rng, store):
    """The one-pass kernel's instrumented build (trace=, with and without the store): the
    plain build's outputs, bit for bit, and every block's TRACE_STAMPS_1P in order (the
    simulator's clock is the host's); a trace of the wrong shape is refused."""
    from bw24nb.kernels import decode_attention as da
    from bw24nb.kernels.rope import rope_inv_freq
    Hq, Hkv, D, n_ctx, n_splits = 4, 2, 32, 40, 4          # 3 splits of 16
    fill = int(rng.integers(0, 2 ** 31))
    qh = rng.standard_normal((1, Hq, D)).astype(np.float32)
    knew = cuda.to_device(rng.standard_normal((1, Hkv, D)).astype(np.float32))
    vnew = cuda.to_device(rng.standard_normal((1, Hkv, D)).astype(np.float32))
    inv = cuda.to_device(rope_inv_freq(1e6, 16))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    trace = cuda.to_device(np.zeros(da.trace_shape_1p(1, Hq), np.uint64))
    outs = []
    for tr in (None, trace):
        cache = _filled_cache(np.random.default_rng(fill), n_ctx, Hkv, D, n_ctx, *_F16)
        layer = cache.layer(0)
        part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
        out = _poisoned((1, Hq, D))
        launch_flash_decode(cuda.to_device(qh), pos, layer[0], layer[1], QType.F16, layer[2],
                            layer[3], QType.F16, out, part_ml, part_acc, onepass=True,
                            store=(knew, vnew, inv) if store else None, trace=tr)
        outs.append(out.copy_to_host())
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    stamps = trace.copy_to_host()[0].astype(np.int64)      # [Hq, 2, stamps]
    assert (stamps > 0).all() and (np.diff(stamps, axis=-1) >= 0).all()
    with pytest.raises(ValueError, match="trace must be uint64"):
        launch_flash_decode(cuda.to_device(qh), pos, layer[0], layer[1], QType.F16, layer[2],
                            layer[3], QType.F16, _poisoned((1, Hq, D)), part_ml, part_acc,
                            onepass=True, trace=cuda.to_device(np.zeros(5, np.uint64)))


@pytest.mark.parametrize("Hq,Hkv,D,n_ctx,n_splits", [(4, 2, 32, 40, 4), (14, 2, 64, 60, 4),
                                                      (14, 2, 64, 128, 4), (14, 2, 64, 100, 3),
                                                      (8, 1, 128, 90, 8), (16, 4, 256, 40, 4)])
def test_one_tile_splits_stored_without_the_merge_give_the_same_bits(rng, Hq, Hkv, D, n_ctx,
                                                                     n_splits):
    """decode_attention's direct store (direct=: a split of <= TILE keys written by warp 0
    from its registers, the other warps gone) gives the merge's partials and output bit for
    bit -- splits of one tile (16-keys, and shorter last ones), and plans whose splits take
    more than a tile (the merge as before, in the same launch)."""
    from bw24nb.kernels import decode_attention as da
    from bw24nb.kernels.attention import DECODE_CHUNK_ALIGN, DECODE_MIN_CHUNK, _split_plan
    assert da.ONE_TILE_DIRECT is True           # the default since session 21
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    _n, chunk, used = _split_plan(n_ctx - 1, n_ctx, n_splits, DECODE_MIN_CHUNK,
                                  DECODE_CHUNK_ALIGN)
    got = []
    for direct in (False, True):
        part_ml = cuda.to_device(np.full((1, Hq, n_splits, 2), np.nan, np.float32))
        part_acc = cuda.to_device(np.full((1, Hq, n_splits, D), np.nan, np.float32))
        out = _poisoned((1, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, direct=direct)
        got.append([a.copy_to_host() for a in (out, part_ml, part_acc)])
    assert np.isfinite(got[1][0]).all()
    for a, b in zip(got[0], got[1]):        # the partials of the splits the plan uses
        a, b = (a, b) if a.ndim == 3 else (a[:, :, :used], b[:, :, :used])
        assert np.isfinite(b).all()
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def _one_token_forms(rng, Hq, Hkv, D, n_ctx, n_splits, forms, before=lambda i: None):
    """launch_flash_decode of one token at position n_ctx - 1 on an F16 cache, once per form
    (its launch arguments; before(i) sets switches first), on fresh partials each time:
    [[out, part_ml, part_acc] a form], and how many splits the token's plan uses."""
    from bw24nb.kernels.attention import DECODE_CHUNK_ALIGN, DECODE_MIN_CHUNK, _split_plan
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array([n_ctx - 1], np.int32))
    got = []
    for i, form in enumerate(forms):
        before(i)
        part_ml, part_acc = alloc_decode_partials(1, Hq, D, n_splits)
        out = _poisoned((1, Hq, D))
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, **form)
        got.append([a.copy_to_host() for a in (out, part_ml, part_acc)])
    assert np.isfinite(got[0][0]).all()
    used = _split_plan(n_ctx - 1, n_ctx, n_splits, DECODE_MIN_CHUNK, DECODE_CHUNK_ALIGN)[2]
    return got, used


def _assert_same_bits(a_run, b_run, used):
    """Two runs' outputs, and the partials of the `used` splits (None: outputs only)."""
    for a, b in zip(a_run, b_run if used is not None else b_run[:1]):
        a, b = (a, b) if a.ndim == 3 else (a[:, :, :used], b[:, :, :used])
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("Hq,Hkv,D,n_ctx,n_splits", [(4, 2, 32, 40, 4), (14, 2, 64, 300, 2),
                                                      (8, 1, 128, 90, 3)])
def test_interleaved_softmax_rows_give_the_same_bits(rng, Hq, Hkv, D, n_ctx, n_splits):
    """decode_attention's interleaved softmax (interleave=: the rows' warp maxima and sums as
    interleaved butterflies, branch-free) gives the plain build's partials and output bit for
    bit -- with warps that have no key (the -inf rows), and with several tiles a warp (the
    rescale by alpha)."""
    from bw24nb.kernels import decode_attention as da
    assert da.INTERLEAVE_ROWS is False
    got, used = _one_token_forms(rng, Hq, Hkv, D, n_ctx, n_splits,
                                 [dict(interleave=False), dict(interleave=True)])
    _assert_same_bits(got[0], got[1], used)


@pytest.mark.parametrize("Hq,Hkv,D,n_ctx,n_splits,form", [
    (14, 2, 64, 300, 3, {}), (4, 1, 256, 70, 2, {}), (8, 2, 32, 40, 4, dict(onepass=True)),
    (14, 2, 64, 60, 4, dict(onepass=True))])
def test_wide_q_loads_give_the_same_bits(rng, monkeypatch, Hq, Hkv, D, n_ctx, n_splits, form):
    """decode_attention.WIDE_Q (q read as LDS.128 from 16-byte aligned shared memory, whose
    twin faults on a misaligned address) gives the scalar reads' output and partials bit for
    bit, in the split pass and the one pass (which writes no partials)."""
    from bw24nb.kernels import decode_attention as da
    got, used = _one_token_forms(rng, Hq, Hkv, D, n_ctx, n_splits, [form, form],
                                 lambda i: monkeypatch.setattr(da, "WIDE_Q", bool(i)))
    _assert_same_bits(got[0], got[1], None if form else used)


def _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, **form):
    """Run launch_flash_decode on an F16 cache in the block-a-split, one-warp form and with
    `form`'s arguments, poisoned partials each time, and check that the form's output is
    finite and near the reference, and its output and the partials of every split its
    tokens' plans use equal the plain form's bit for bit."""
    from bw24nb.kernels.attention import DECODE_CHUNK_ALIGN, DECODE_MIN_CHUNK, _split_plan
    n_ctx = max(positions) + 1
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    T = len(positions)
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    q_dev = cuda.to_device(q)
    pos = cuda.to_device(np.array(positions, np.int32))
    got = []
    for kw in (dict(spread=False), form):
        part_ml = cuda.to_device(np.full((T, Hq, n_splits, 2), np.nan, np.float32))
        part_acc = cuda.to_device(np.full((T, Hq, n_splits, D), np.nan, np.float32))
        out = _poisoned((T, Hq, D))
        launch_flash_decode(q_dev, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, **kw)
        got.append([a.copy_to_host() for a in (out, part_ml, part_acc)])
    assert np.isfinite(got[1][0]).all()
    kd, vd = cache.read(0, n_ctx)
    for t, p in enumerate(positions):
        want = ops.attention(q[t:t + 1], kd[:p + 1], vd[:p + 1], causal_offset=p)
        np.testing.assert_allclose(got[1][0][t:t + 1], want, rtol=RTOL, atol=ATOL)
        used = _split_plan(p, n_ctx, n_splits, DECODE_MIN_CHUNK, DECODE_CHUNK_ALIGN)[2]
        for a, b in zip(got[0], got[1]):        # the partials of the splits the plan uses
            a, b = (a[t], b[t]) if a.ndim == 3 else (a[t, :, :used], b[t, :, :used])
            assert np.isfinite(b).all()
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits,grid", [
    (4, 2, 32, (3, 20, 39), 4, 1),              # one-tile splits (16 keys), 1 block walks all
    (4, 2, 32, (16, 47, 60), 6, 2),             # several tokens, a last short split
    (8, 1, 128, (130, 200), 2, 1),              # splits of more than a tile: the merge path
    (14, 2, 64, (33, 300), 3, 2)])              # one-tile and merged splits in one launch
def test_walking_split_blocks_give_the_same_bits(rng, Hq, Hkv, D, positions, n_splits, grid):
    """decode_attention's walking split pass (split_grid=: fewer blocks than the partials'
    splits, each running its splits one after another, as the rows prefill takes it) gives
    the block-a-split pass's partials and output bit for bit, for tokens whose plans use
    different numbers of splits, on one-tile splits (warp 0 alone, and spread over the
    warps) and merged ones."""
    for spread in (False, True):
        _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, split_grid=grid,
                                     spread=spread)


@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits,grid", [
    (4, 2, 32, (16, 47, 60), 6, None),          # one-tile splits, a last short split
    (14, 2, 64, (33, 300), 3, None),            # one-tile and merged splits in one launch
    (14, 2, 64, (33, 300), 3, 2)])              # walking blocks: each prefetches its splits
def test_split_pass_with_its_position_before_the_wait_gives_the_same_bits(
        rng, Hq, Hkv, D, positions, n_splits, grid):
    """launch_flash_decode(pre_wait=True): the F16 split pass reads the position, plans and
    names its splits' K / V rows to L2 before its grid-dependency wait (SPLIT_PRE_WAIT, the
    engine's decode step), then loads q -- the block-a-split pass's partials and output bit
    for bit, a block a split or walking. Not with the combine in the split pass."""
    from bw24nb.kernels import decode_attention as da
    _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, pre_wait=True,
                                 split_grid=grid)
    with pytest.raises(ValueError, match="waits first"):
        da.split_kernel(7, 2, direct=True, spread=True, fused=True, pre_wait=True)


@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits", [
    (4, 2, 32, (3, 20, 39), 4),                 # R = 2: warps 2, 3 without a row
    (14, 2, 64, (15, 33, 60), 4),               # R = 7 (the 0.5B): warp 3 takes one row
    (8, 1, 128, (40, 130), 3),                  # R = 8: two rows a warp; a merged split too
    (16, 2, 256, (20,), 2)])                    # the 35B-A3B heads, D = 256 (E = 8: NE = 1)
def test_one_tile_rows_spread_over_the_warps_give_the_same_bits(rng, Hq, Hkv, D, positions,
                                                                n_splits):
    """decode_attention's spread one-tile splits (spread=: warp w takes rows w, w + 4, ...)
    give the one-warp direct store's partials and output bit for bit, and so the merge's
    (test_one_tile_splits_stored_without_the_merge_give_the_same_bits): full and short
    tiles, and plans with longer splits in the launch."""
    from bw24nb.kernels import decode_attention as da
    assert da.ONE_TILE_SPREAD is True and da.ONE_TILE_SPREAD_MAX_D == 64
    _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, spread=True)


def _gated_int8_decode(q, pos, layer, n_splits, gate, **form):
    """launch_flash_decode over an F16 cache layer with the gate and the int8 output, every
    output poisoned first (partials NaN, out NaN, xq 99 and xd NaN, each 8 / 2 values past the
    end too), in `form`; (out, xq, xd, part_ml) on the host."""
    T, Hq, D = q.shape
    n = T * Hq * D
    part_ml = cuda.to_device(np.full((T, Hq, n_splits, 2), np.nan, np.float32))
    part_acc = cuda.to_device(np.full((T, Hq, n_splits, D), np.nan, np.float32))
    out = _poisoned((T, Hq, D))
    xq = cuda.to_device(np.full(n + 8, 99, np.int8))
    xd = cuda.to_device(np.full(n // 32 + 2, np.nan, np.float32))
    launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3], QType.F16,
                        out, part_ml, part_acc, gate=gate, xq=xq, xd=xd, **form)
    return [a.copy_to_host() for a in (out, xq, xd, part_ml)]


# 16-key splits: a token at position p uses ceil((p + 1) / 16) of them (up to n_splits), so
# tokens past 16 G have groups (combine_order: G = 8 at D = 32, else 4) of several splits
@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits,gated", [
    (14, 2, 64, (15, 100, 180), 12, False),     # the 0.5B heads (R = 7): 1, 7, 12 splits
    (4, 2, 32, (3, 150), 12, True),             # R = 2, gated; 1 and 10 splits (G = 8)
    (8, 1, 128, (40, 130), 3, True),            # merged splits (more than a tile each)
    (16, 4, 256, (20, 170), 12, True)])         # the 9B heads: D = 256, the combine's 4
                                                # slices; 2 and 11 splits
def test_combine_in_the_split_pass_gives_the_combine_kernels_bits(rng, Hq, Hkv, D, positions,
                                                                  n_splits, gated):
    """decode_attention.COMBINE_IN_SPLIT: the last split block of each (token, KV head) runs
    the combine, gate and int8 copy included, and writes what the combine kernel writes, bit
    for bit -- twice in a row on the same counters, which the last block puts back to zero."""
    from bw24nb.kernels import decode_attention as da
    n_ctx = max(positions) + 1
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    T = len(positions)
    n = T * Hq * D
    q = cuda.to_device(rng.standard_normal((T, Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array(positions, np.int32))
    gate = cuda.to_device((rng.standard_normal(n) * 3).astype(np.float32)) if gated else None
    counters = da.alloc_combine_counters(T, Hkv)
    got = []
    for fused in (False, True, True):
        got.append(_gated_int8_decode(q, pos, layer, n_splits, gate, counters=counters,
                                      fused=fused)[:3])
        assert np.all(counters.copy_to_host() == 0)
    out0, q0, d0 = got[0]
    assert np.isfinite(out0).all() and np.any(q0[:n] != 0) and np.all(q0[n:] == 99)
    for o, qq, dd in got[1:]:
        np.testing.assert_array_equal(o.view(np.uint32), out0.view(np.uint32))
        np.testing.assert_array_equal(qq, q0)
        np.testing.assert_array_equal(dd[:n // 32].view(np.uint32), d0[:n // 32].view(np.uint32))
        assert np.all(np.isnan(dd[n // 32:]))
    if not gated:
        kd, vd = cache.read(0, n_ctx)
        qh = q.copy_to_host()
        for t, p in enumerate(positions):
            want = ops.attention(qh[t:t + 1], kd[:p + 1], vd[:p + 1], causal_offset=p)
            np.testing.assert_allclose(got[1][0][t:t + 1], want, rtol=RTOL, atol=ATOL)


def test_combine_in_the_split_pass_is_off_without_counters_and_for_walking_grids(rng):
    """The switch alone changes nothing where the split pass cannot count its blocks: no
    counters (the prefill form), or a walking grid; and the counters must be int32."""
    from bw24nb.kernels import decode_attention as da
    assert da.COMBINE_IN_SPLIT is False
    with pytest.raises(ValueError, match="counters must be int32"):
        da.launch_split(cuda.to_device(np.zeros((1, 2, 32), np.float32)),
                        cuda.to_device(np.zeros(1, np.int32)),
                        cuda.to_device(np.zeros((1, 8, 64), np.uint8)),
                        cuda.to_device(np.zeros((1, 8, 64), np.uint8)), 1.0, 16, 128,
                        cuda.to_device(np.zeros((1, 2, 1, 2), np.float32)),
                        cuda.to_device(np.zeros((1, 2, 1, 32), np.float32)),
                        combine=(None, None, None, None, False, False,
                                 cuda.to_device(np.zeros(1, np.float32)), 1))
    Hq, Hkv, D, positions, n_splits = 4, 2, 32, (20, 39), 4
    _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, fused=True)
    _same_bits_as_the_plain_form(rng, Hq, Hkv, D, positions, n_splits, fused=True,
                                 counters=da.alloc_combine_counters(2, Hkv), split_grid=2)


@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits,gated,slots", [
    (14, 2, 64, (15, 100, 400), 12, True, 2),   # the 0.5B heads: 1, 7 splits, merged ones
    (4, 2, 32, (3, 150), 12, False, 3),         # 1 and 10 splits (G = 8): rounds of 3 slots
    (8, 1, 128, (40, 300), 3, True, 1),         # one slot (block barriers), merged splits
    (16, 4, 256, (20, 170), 12, True, 2)])      # the 9B heads: D = 256, 4 slices
def test_cluster_split_pass_gives_the_split_pass_and_combines_bits(rng, Hq, Hkv, D, positions,
                                                                   n_splits, gated, slots):
    """launch_flash_decode(split_cluster=N): the split pass's splits on the slots of a
    cluster's blocks, each slot on its own named barrier, then the combine by the cluster's
    ranks (the simulator: one block a (token, KV head), walking every split on its slots and
    combining every head) -- the output, its int8 copy and the partials of the split pass +
    combine kernel, bit for bit; with the position before the wait too (and 16 blocks, which
    the GPU launches as non-portable clusters). Refused with a trace, a walking grid or more
    than 16 blocks."""
    n_ctx = max(positions) + 1
    layer = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16).layer(0)
    n = len(positions) * Hq * D
    q = cuda.to_device(rng.standard_normal((len(positions), Hq, D)).astype(np.float32))
    pos = cuda.to_device(np.array(positions, np.int32))
    gate = cuda.to_device((rng.standard_normal(n) * 3).astype(np.float32)) if gated else None
    want = _gated_int8_decode(q, pos, layer, n_splits, gate)
    for form in (dict(split_cluster=2, cluster_slots=slots),
                 dict(split_cluster=16, cluster_slots=slots, pre_wait=True)):
        got = _gated_int8_decode(q, pos, layer, n_splits, gate, **form)
        assert np.isfinite(got[0]).all()
        np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2].view(np.uint32), want[2].view(np.uint32))
        ok = np.isfinite(want[3])               # the partials of the splits the plans use
        np.testing.assert_array_equal(got[3][ok].view(np.uint32), want[3][ok].view(np.uint32))
    with pytest.raises(ValueError, match="no `only`, trace or split_grid"):
        _gated_int8_decode(q, pos, layer, n_splits, gate, split_cluster=2, split_grid=1)
    with pytest.raises(ValueError, match="at most 16 blocks"):
        _gated_int8_decode(q, pos, layer, n_splits, gate, split_cluster=17)


# tokens at several lengths: 16-key splits, so 1 .. 12 of them, groups of several splits
# (G = 8 at D = 32, else 4), a short last split, odd counts (a warp's second half-warp idle)
# and more pairs of splits than the one-pass kernel's warps (8 at D = 128: a warp walks two)
@pytest.mark.parametrize("Hq,Hkv,D,positions,n_splits,gated", [
    (14, 2, 64, (15, 100, 180), 12, False),     # the 0.5B heads (R = 7): 1, 7, 12 splits
    (4, 2, 32, (3, 150, 300), 20, True),        # R = 2, gated; 1, 10 and 19 splits (G = 8)
    (2, 2, 128, (0, 47, 300), 20, True),        # R = 1 (MHA), a one-key context; 3, 19
    (16, 4, 256, (20, 170), 12, True)])         # the 9B heads: D = 256, the combine's 4
                                                # slices (G = 4); 2 and 11 splits
def test_one_pass_kernel_gives_the_split_pass_and_combines_bits(rng, Hq, Hkv, D, positions,
                                                                n_splits, gated):
    """decode_attention's one-pass kernel (onepass=: a block a query head, every split's
    partial in shared memory, the combine's steps in its order, gate and int8 copy included)
    writes what the split pass + the combine kernel write, bit for bit, into poisoned
    outputs; and it is near the reference."""
    n_ctx = max(positions) + 1
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    T = len(positions)
    n = T * Hq * D
    qh = rng.standard_normal((T, Hq, D)).astype(np.float32)
    q = cuda.to_device(qh)
    pos = cuda.to_device(np.array(positions, np.int32))
    gate = cuda.to_device((rng.standard_normal(n) * 3).astype(np.float32)) if gated else None
    got = [_gated_int8_decode(q, pos, layer, n_splits, gate, **form)
           for form in ({}, dict(onepass=True, early=False), dict(onepass=True, early=True))]
    with switched([(decode_attention, "ONEPASS_GROUP_BATCH", 3)]):    # the group sums batched
        got.append(_gated_int8_decode(q, pos, layer, n_splits, gate, onepass=True))
    # a block a head, and the cluster builds (ONEPASS_CLUSTER, the default up to D = 64): the
    # simulator launches them a block a head, each block walking every pair of splits (on its
    # share of the warps with ONEPASS_CLUSTER_SHARE), put() storing the partials
    got.append(_gated_int8_decode(q, pos, layer, n_splits, gate, onepass=True, cluster=1))
    with switched([(decode_attention, "ONEPASS_CLUSTER_SHARE", True)]):
        got.append(_gated_int8_decode(q, pos, layer, n_splits, gate, onepass=True, cluster=4))
    with switched([(decode_attention, "ONEPASS_PRE_WAIT",             # the position before
                    not decode_attention.ONEPASS_PRE_WAIT)]):           # the wait, or after
        got.append(_gated_int8_decode(q, pos, layer, n_splits, gate, onepass=True))
    (out0, q0, d0, _) = got[0]
    assert np.isfinite(out0).all() and np.any(q0[:n] != 0) and np.all(q0[n:] == 99)
    for o, qq, dd, ml in got[1:]:               # the loads in order, then issued early
        assert np.isnan(ml).all()               # the one-pass kernel leaves the partials be
        np.testing.assert_array_equal(o.view(np.uint32), out0.view(np.uint32))
        np.testing.assert_array_equal(qq, q0)
        np.testing.assert_array_equal(dd[:n // 32].view(np.uint32), d0[:n // 32].view(np.uint32))
        assert np.all(np.isnan(dd[n // 32:]))
    if not gated:
        kd, vd = cache.read(0, n_ctx)
        for t, p in enumerate(positions):
            want = ops.attention(qh[t:t + 1], kd[:p + 1], vd[:p + 1], causal_offset=p)
            np.testing.assert_allclose(o[t:t + 1], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("Hq,Hkv,D,rotary,positions", [
    (14, 2, 64, 64, (100,)),            # the 0.5B heads, full rotary
    (4, 2, 32, 16, (0,)),               # partial rotary; a token at position 0
    (4, 1, 128, 0, (17,))])             # no RoPE
def test_one_pass_kernel_with_the_store_is_the_store_launch_then_the_kernel(
        rng, Hq, Hkv, D, rotary, positions):
    """launch_flash_decode(onepass=True, store=(k, v, inv_freq)): the token's q rotated in
    place, its K (rotated) and V written into its cache row, then the one pass -- the same
    cache bytes, q and outputs, bit for bit, as cache.kv's store launch before the kernel.
    The token's rows start as NaN (a read before the write would show). One token a launch
    (decode's), refused for more."""
    from bw24nb.kernels.rope import rope_inv_freq
    n_ctx = max(positions) + 1
    T = len(positions)
    inv = cuda.to_device(rope_inv_freq(1e6, rotary) if rotary else np.zeros(0, np.float32))
    knew = cuda.to_device((rng.standard_normal((T, Hkv, D)) * 2).astype(np.float32))
    vnew = cuda.to_device(rng.standard_normal((T, Hkv, D)).astype(np.float32))
    qh = rng.standard_normal((T, Hq, D)).astype(np.float32)
    pos = cuda.to_device(np.array(positions, np.int32))
    fill = rng.integers(0, 2 ** 31)
    results = []
    for fused, early, cl, pw in ((False, None, None, False), (True, False, None, False),
                                 (True, True, None, False), (True, True, 2, False),
                                 (True, True, None, True)):
        cache = _filled_cache(np.random.default_rng(fill), n_ctx, Hkv, D, n_ctx, *_F16)
        k_f16, v_f16 = cache.k_f16[0], cache.v_f16[0]
        for rows in (k_f16, v_f16):
            host = rows.copy_to_host()
            host[:, list(positions)] = np.nan
            rows.copy_to_device(host)
        q = cuda.to_device(qh)
        layer = cache.layer(0)
        out = _poisoned((T, Hq, D))
        part_ml, part_acc = alloc_decode_partials(T, Hq, D, 8)
        if not fused:
            cache.store(0, knew, vnew, pos, inv_freq=inv if rotary else None, q=q)
        with switched([(decode_attention, "ONEPASS_PRE_WAIT", pw)]):
            launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                                QType.F16, out, part_ml, part_acc, onepass=True,
                                store=(knew, vnew, inv) if fused else None, early=early,
                                cluster=cl)
        results.append([a.copy_to_host() for a in (out, q, k_f16, v_f16)])
    for got in results[1:]:                     # the loads in order, then issued early
        for a, b in zip(results[0], got):
            assert np.isfinite(a).all()
            np.testing.assert_array_equal(b.view(np.uint8), a.view(np.uint8))
    if rotary and positions[0] > 0:             # q was rotated, in place
        assert not np.array_equal(results[1][1], qh)
    with pytest.raises(ValueError, match="goes with onepass only"):
        launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                            QType.F16, out, part_ml, part_acc, store=(knew, vnew, inv))
    two = cuda.to_device(np.zeros((2, Hkv, D), np.float32))
    with pytest.raises(ValueError, match="the store takes one token, not 2"):
        launch_flash_decode(cuda.to_device(np.zeros((2, Hq, D), np.float32)),
                            cuda.to_device(np.array([n_ctx - 2, n_ctx - 1], np.int32)),
                            layer[0], layer[1], QType.F16, layer[2], layer[3], QType.F16,
                            _poisoned((2, Hq, D)), *alloc_decode_partials(2, Hq, D, 8),
                            onepass=True, store=(two, two, inv))


def test_one_pass_kernel_marks_plans_it_does_not_serve(rng):
    """A token whose plan has splits longer than a tile, or more splits than the kernel's
    shared accumulators hold, gets NaN (and NaN scales) instead of a wrong number; the others
    in the same launch are unaffected. onepass_max_ctx says where the plans it serves end."""
    from bw24nb.kernels import decode_attention as da
    assert da.onepass_max_ctx(64, 132, 16) == 16 * 128     # 8192 floats / 64 dims = 128 splits
    assert da.onepass_max_ctx(256, 66, 16) == 16 * 32
    assert da.onepass_max_ctx(64, 20, 16) == 16 * 20
    assert da.onepass_max_ctx(64, 20, 17) == 0               # splits longer than a half-warp
    # where the engine takes it: two rounds of pairs a warp at D <= 64, one above
    assert da.onepass_pays_ctx(64, 132, 16) == 16 * 2 * 16 * 2
    assert da.onepass_pays_ctx(256, 66, 16) == 16 * 2 * 8
    assert da.onepass_pays_ctx(64, 20, 16) == 16 * 20
    Hq, Hkv, D, n_splits = 4, 2, 32, 2
    positions = (20, 40)                # 2 splits of 16, then 2 of 128 (the aligned chunk)
    n_ctx = max(positions) + 1
    cache = _filled_cache(rng, n_ctx, Hkv, D, n_ctx, *_F16)
    layer = cache.layer(0)
    T, n = len(positions), len(positions) * Hq * D
    q = cuda.to_device(rng.standard_normal((T, Hq, D)).astype(np.float32))
    part_ml, part_acc = alloc_decode_partials(T, Hq, D, n_splits)
    out = _poisoned((T, Hq, D))
    xq = cuda.to_device(np.full(n, 99, np.int8))
    xd = cuda.to_device(np.zeros(n // 32, np.float32))
    launch_flash_decode(q, cuda.to_device(np.array(positions, np.int32)), layer[0], layer[1],
                        QType.F16, layer[2], layer[3], QType.F16, out, part_ml, part_acc,
                        xq=xq, xd=xd, onepass=True)
    o, d = out.copy_to_host(), xd.copy_to_host()
    assert np.isfinite(o[0]).all() and np.isnan(o[1]).all()
    assert np.isfinite(d[:n // 64]).all() and np.isnan(d[n // 64:]).all()
    with pytest.raises(ValueError, match="one-pass kernel takes an F16 cache"):
        launch_flash_decode(q, cuda.to_device(np.array(positions, np.int32)), layer[0],
                            layer[1], QType.F16, layer[2], layer[3], QType.F16, out, part_ml,
                            part_acc, onepass=True, only="split")
