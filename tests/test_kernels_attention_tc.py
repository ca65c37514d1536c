"""The tensor-core prefill attention (bw24nb/kernels/attention_tc.py) against ops.attention.

The kernel rounds q and the softmax weights to f16 (K and V are f16 in the cache already), so
it matches the float64-exact reference to f16 rounding, not float32's: a weight's relative
error <= 2^-11, a score's <= ~2^-11 * sum|q_d k_d| * scale. With q, k ~ N(0, 1) (k * 2) and
D <= 256 the outputs (convex combinations of V rows ~N(0, 1)) moved by <= 1.1e-3 in the
simulator (seed 5); atol 5e-3 bounds that while a wrong mask, KV head, row or tile moves
outputs by O(0.1+).
The reference runs on the cache's own contents (`KVCache.read`).
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.cache import KVCache
from bw24nb.kernels.attention_tc import launch_attention_tc, supports, tc_keys, tc_warps
from bw24nb.quant import QType
from bw24nb.reference import ops

ATOL, RTOL = 5e-3, 5e-3


def _filled_cache(rng, S, Hkv, D, ctx):
    cache = KVCache(1, Hkv, D, ctx, QType.F16, QType.F16)
    k = (rng.standard_normal((S, Hkv, D)) * 2).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    cache.store(0, cuda.to_device(k), cuda.to_device(v), cuda.to_device(np.arange(S, dtype=np.int32)))
    return cache


def _run(rng, T, S, Hq, Hkv, D, ctx, positions=None):
    cache = _filled_cache(rng, ctx, Hkv, D, ctx)      # every position holds data: overreads show
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    positions = np.arange(S - T, S, dtype=np.int32) if positions is None else positions
    out = cuda.to_device(np.full((T, Hq, D), np.nan, np.float32))
    k_u8, _, v_u8, _ = cache.layer(0)
    launch_attention_tc(cuda.to_device(q), cuda.to_device(positions), k_u8, v_u8, out)
    k, v = cache.read(0, ctx)
    return out.copy_to_host(), q, k, v


def _reference(q, k, v, positions):
    """ops.attention token by token: token t sees keys 0 .. positions[t]."""
    return np.stack([ops.attention(q[t:t + 1], k[:p + 1], v[:p + 1], causal_offset=p)[0]
                     for t, p in enumerate(positions)])


@pytest.mark.parametrize("T,S,Hq,Hkv,D,ctx", [
    (9, 9, 4, 2, 32, 12),      # prefill from empty, n_rep 2: 18 rows of a 64-row block
    (5, 40, 6, 2, 32, 44),     # continued prefill at 35..39: two key tiles, the second partial
    (11, 11, 7, 1, 64, 16),    # n_rep 7 (the 0.5B's): 77 rows = 2 blocks, rows straddle them
    (3, 20, 8, 2, 128, 22),    # D = 128 (Qwen3 dense)
    (3, 20, 4, 1, 256, 22),    # D = 256 (Qwen3.5): 2 warps, key tiles of 16
])
def test_attention_tc_matches_reference(rng, T, S, Hq, Hkv, D, ctx):
    out, q, k, v = _run(rng, T, S, Hq, Hkv, D, ctx)
    positions = np.arange(S - T, S)
    np.testing.assert_allclose(out, _reference(q, k, v, positions), atol=ATOL, rtol=RTOL)
    # the check sees a mask that is one key off
    off = np.stack([ops.attention(q[t:t + 1], k[:p + 2], v[:p + 2], causal_offset=p + 1)[0]
                    for t, p in enumerate(positions)])
    assert not np.allclose(out, off, atol=ATOL, rtol=RTOL)


def test_attention_tc_positions_out_of_order(rng):
    """Tokens need not be consecutive or sorted: each row sees keys 0 .. its own position."""
    positions = np.array([3, 17, 0, 9], np.int32)
    out, q, k, v = _run(rng, 4, 18, 4, 2, 32, 20, positions)
    np.testing.assert_allclose(out, _reference(q, k, v, positions), atol=ATOL, rtol=RTOL)


def test_attention_tc_shapes_and_errors():
    assert (tc_warps(64), tc_keys(64), tc_warps(256), tc_keys(256)) == (4, 32, 2, 16)
    assert supports(128, QType.F16, QType.F16) and not supports(128, QType.Q8_0, QType.F16)
    assert not supports(96, QType.F16, QType.F16)
    cache = KVCache(1, 2, 32, 8, QType.Q8_0, QType.F16)
    k_u8, _, v_u8, _ = cache.layer(0)
    q = cuda.to_device(np.zeros((1, 4, 32), np.float32))
    with pytest.raises(ValueError, match="F16 cache"):
        launch_attention_tc(q, cuda.to_device(np.zeros(1, np.int32)), k_u8, v_u8,
                            cuda.to_device(np.zeros((1, 4, 32), np.float32)))
