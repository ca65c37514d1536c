"""KV cache (bw24nb/cache/kv.py): the store kernel writes the bytes of bw24nb.quant.quantize
(llama.cpp's reference quantizers) at positions read from the device; sizes; layout reads.

Exactness: Q8_0 and F16 stores are bit-exact everywhere (one division, one multiply, roundf).
Q5_1 computes trunc((x - min) * (1/d) + 0.5); in the simulator that is numpy float32, bit-exact;
on a GPU NVVM contracts it into one FMA, so a value within float32 rounding of a .5 boundary may
land one step away. The test therefore demands equal bytes except for quants whose float64
pre-rounding value lies within 1e-4 of a boundary, which may differ by exactly one step.
"""
import numpy as np
import pytest
from numba import cuda

from bw24nb.cache import (KVCache, attention_layers, kv_cache_bytes, kv_row_bytes, launch_kv_store,
                          launch_kv_store_rope)
from bw24nb.device import simulator_enabled
from bw24nb.formats.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from bw24nb.kernels.rope import launch_rope, rope_inv_freq
from bw24nb.quant import QType, dequantize, quantize
from bw24nb.reference import ops


def _config(**kw):
    base = dict(family="qwen35", vocab_size=100, hidden_size=64, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=128,
                rms_norm_eps=1e-6, rope_theta=1e7, max_position_embeddings=4096)
    base.update(kw)
    return ModelConfig(**base)


def _test_rows(rng, T, H, D):
    x = rng.standard_normal((T, H, D)).astype(np.float32) * rng.uniform(0.01, 10, (T, H, 1))
    x = x.astype(np.float32)
    x[0, 0, :32] = 0.0                  # all-zero block: d = 0 must give q = 0, no NaN
    x[0, 0, 32:64] = 1.25               # constant block: Q5_1 d = 0, Q8_0 all q = 127
    x[-1, -1, :8] = [0.5, -0.5, 1.5, -1.5, 2.5, 3.5, -127.0, 127.0]   # roundf tie cases
    return x


def _q5_1_near_boundary(x):
    """bool (T, H, D): Q5_1 quant of x lies within 1e-4 of a rounding boundary (float64)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    lo = blocks.min(axis=1, keepdims=True)
    d = (blocks.max(axis=1, keepdims=True) - lo) / np.float32(31)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d > 0, (blocks - lo).astype(np.float64) / d.astype(np.float64) + 0.5, 0.0)
    frac = v - np.floor(v)
    return (np.minimum(frac, 1 - frac) < 1e-4).reshape(x.shape)


@pytest.mark.parametrize("qt", [QType.Q8_0, QType.Q5_1, QType.F16])
def test_store_matches_host_quantizer(rng, qt):
    T, H, D, ctx = 3, 2, 64, 16
    x = _test_rows(rng, T, H, D)
    positions = rng.choice(ctx, T, replace=False).astype(np.int32)
    rb = kv_row_bytes(qt, D)
    poison = np.full((H, ctx, rb), 0x7F, np.uint8)
    rows = cuda.to_device(poison)
    launch_kv_store(cuda.to_device(x), cuda.to_device(positions), qt, rows, rows.view(np.float16))
    got = rows.copy_to_host()
    want = quantize(x, qt)                                    # (T, H, rb)
    untouched = np.ones(ctx, bool)
    untouched[positions] = False
    np.testing.assert_array_equal(got[:, untouched], poison[:, untouched])
    for t, p in enumerate(positions):
        g, w = got[:, p], want[t]
        if qt == QType.Q5_1 and not simulator_enabled():
            # scales bytes exact; values equal or one step apart at a near-tie (see docstring)
            gb, wb = g.reshape(H, -1, 24), w.reshape(H, -1, 24)
            np.testing.assert_array_equal(gb[..., :4], wb[..., :4])
            gv = dequantize(g, qt, (H, D))
            wv = dequantize(w, qt, (H, D))
            d = wb[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
            d = np.repeat(d, 32, axis=1)
            diff = np.abs(gv - wv)
            ok = (diff == 0) | (_q5_1_near_boundary(x[t]) & np.isclose(diff, d))
            assert ok.all()
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("rotary_dim", [64, 16], ids=["full-rotary", "partial-rotary"])
def test_fused_rope_store_equals_rope_then_store(rng, rotary_dim):
    # kv_store_rope = launch_rope(k) + kv_store(k) + kv_store(v), K left unrotated in memory
    T, H, D, ctx, theta = 2, 2, 64, 8, 1e6
    k = rng.standard_normal((T, H, D)).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    positions = np.array([5, 2], np.int32)
    pos_dev = cuda.to_device(positions)
    inv_freq = cuda.to_device(rope_inv_freq(theta, rotary_dim))
    fused = KVCache(1, H, D, ctx, QType.Q8_0, QType.Q5_1)
    k_dev = cuda.to_device(k)
    fused.store(0, k_dev, cuda.to_device(v), pos_dev, inv_freq=inv_freq)
    np.testing.assert_array_equal(k_dev.copy_to_host(), k)          # k itself not rotated
    k_rot = cuda.to_device(k)
    launch_rope(k_rot, pos_dev, inv_freq)
    split = KVCache(1, H, D, ctx, QType.Q8_0, QType.Q5_1)
    k_u8, k_f16, v_u8, v_f16 = split.layer(0)
    launch_kv_store(k_rot, pos_dev, QType.Q8_0, k_u8, k_f16)
    launch_kv_store(cuda.to_device(v), pos_dev, QType.Q5_1, v_u8, v_f16)
    kf, vf = fused.read(0, ctx)
    ks, vs = split.read(0, ctx)
    np.testing.assert_array_equal(vf, vs)
    if simulator_enabled():
        np.testing.assert_array_equal(kf, ks)
    else:   # two kernels may contract the rotation's multiply-adds differently: one step
        step = np.abs(k).max() / 127 * 2
        np.testing.assert_allclose(kf, ks, rtol=0, atol=step)
    # and against the oracle: rotated K within Q8_0's error of ops.rope. Q8_0 rounds to the
    # grid of d = amax / 127 (half a step) but decodes with f16(d) (|d - f16(d)| <= d * 2^-11,
    # times |q| <= 127): |error| <= d * (0.5 + 127 * 2^-11) < 0.57 d
    want = ops.rope(k, positions, theta, rotary_dim)
    d = np.abs(want).reshape(T, H, -1, 32).max(axis=-1, keepdims=True) / 127
    err = np.abs(kf[positions] - want).reshape(T, H, -1, 32)
    assert (err <= 0.57 * d + 1e-6).all()


def test_store_skips_positions_outside_the_cache(rng):
    T, H, D, ctx = 2, 1, 32, 4
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    rows = cuda.to_device(np.zeros((H, ctx, kv_row_bytes(QType.Q8_0, D)), np.uint8))
    pos = cuda.to_device(np.array([ctx, -1], np.int32))
    launch_kv_store(cuda.to_device(x), pos, QType.Q8_0, rows, rows.view(np.float16))
    assert not rows.copy_to_host().any()
    v_rows = cuda.to_device(np.zeros((H, ctx, kv_row_bytes(QType.Q5_1, D)), np.uint8))
    launch_kv_store_rope(cuda.to_device(x), cuda.to_device(x), pos,
                         cuda.to_device(rope_inv_freq(1e4, D)), QType.Q8_0, rows,
                         rows.view(np.float16), QType.Q5_1, v_rows, v_rows.view(np.float16))
    assert not rows.copy_to_host().any() and not v_rows.copy_to_host().any()


@pytest.mark.parametrize("qtype", [QType.F16, QType.Q8_0])
def test_store_rope_also_rotates_q_like_rope_neox(rng, qtype):
    """launch_kv_store_rope(..., q=q) = launch_rope(q) + launch_kv_store_rope(...): q rotated in
    place with rope_neox's arithmetic, bit for bit (more query heads than KV heads, partial
    rotary), and the cache written exactly as without q."""
    from bw24nb.kernels.rope import launch_rope
    T, Hq, H, D, ctx = 2, 3, 1, 32, 8
    q = rng.standard_normal((T, Hq, D)).astype(np.float32)
    k, v = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(2))
    pos = cuda.to_device(np.array([5, 2], np.int32))
    inv_freq = cuda.to_device(rope_inv_freq(1e4, D // 2))

    def store(with_q):
        rows = [cuda.to_device(np.zeros((H, ctx, kv_row_bytes(qtype, D)), np.uint8))
                for _ in range(2)]
        qd = cuda.to_device(q)
        launch_kv_store_rope(cuda.to_device(k), cuda.to_device(v), pos, inv_freq, qtype, rows[0],
                             rows[0].view(np.float16), qtype, rows[1], rows[1].view(np.float16),
                             q=qd if with_q else None)
        return qd.copy_to_host(), [r.copy_to_host() for r in rows]

    q_fused, rows_fused = store(True)
    q_plain, rows_plain = store(False)
    want = cuda.to_device(q)
    launch_rope(want, pos, inv_freq)
    np.testing.assert_array_equal(q_fused, want.copy_to_host())
    np.testing.assert_array_equal(q_plain, q)
    for a, b in zip(rows_fused, rows_plain):
        np.testing.assert_array_equal(a, b)


def test_cli_kv_cache_names_are_the_cache_kinds():
    """`--kv-cache` lists cache.kv.KV_CACHE_KINDS' names (written out in cli.py so that the CLI
    starts without numba), the first of them the engine's default."""
    import click

    from bw24nb.cache import KV_CACHE_KINDS
    from bw24nb.cache.kv import K_TYPE_DEFAULT, V_TYPE_DEFAULT
    from bw24nb.cli import main
    opt = next(p for p in main.get_command(click.Context(main), "gen").params
               if p.name == "kv_cache")
    assert list(opt.type.choices) == list(KV_CACHE_KINDS)
    assert KV_CACHE_KINDS[opt.default] == (K_TYPE_DEFAULT, V_TYPE_DEFAULT)


def test_kv_cache_bytes_counts_only_attention_layers():
    types = [LINEAR_ATTENTION, LINEAR_ATTENTION, LINEAR_ATTENTION, FULL_ATTENTION] * 2
    cfg = _config(layer_types=types, num_key_value_heads=2, head_dim=256)
    assert attention_layers(cfg) == [3, 7]
    # per position and head: Q8_0 256 values = 8 blocks * 34 B; Q5_1 = 8 * 24 B
    q8 = dict(k_type=QType.Q8_0, v_type=QType.Q5_1)
    per_pos = 8 * 34 + 8 * 24
    assert kv_cache_bytes(cfg, 1000, **q8) == 2 * 2 * 1000 * per_pos
    assert kv_cache_bytes(cfg, 1000, QType.F16, QType.F16) == 2 * 2 * 1000 * 2 * 256 * 2
    assert kv_cache_bytes(cfg, 1000) == 2 * 2 * 1000 * 2 * 256 * 2    # the default: F16
    assert kv_cache_bytes(cfg, 10, extra_layers=1, **q8) == 3 * 2 * 10 * per_pos
    dense = _config(num_hidden_layers=3, head_dim=64)
    assert kv_cache_bytes(dense, 7, **q8) == 3 * 2 * 7 * (2 * 34 + 2 * 24)


def test_kv_row_bytes_rejects_unsupported():
    with pytest.raises(ValueError):
        kv_row_bytes(QType.Q4_K, 128)
    with pytest.raises(ValueError):
        kv_row_bytes(QType.Q8_0, 48)


def test_cache_object_store_and_read(rng):
    types = [LINEAR_ATTENTION, FULL_ATTENTION, LINEAR_ATTENTION, FULL_ATTENTION]
    cfg = _config(num_hidden_layers=4, layer_types=types, num_key_value_heads=2, head_dim=32)
    cache = KVCache.for_model(cfg, ctx=8, k_type=QType.Q8_0, v_type=QType.Q5_1)
    assert cache.nbytes == kv_cache_bytes(cfg, 8, QType.Q8_0, QType.Q5_1)
    assert (cache.slot(1), cache.slot(3)) == (0, 1)
    with pytest.raises(KeyError):
        cache.slot(0)
    k = rng.standard_normal((3, 2, 32)).astype(np.float32)
    v = rng.standard_normal((3, 2, 32)).astype(np.float32)
    pos = np.array([0, 1, 2], np.int32)
    cache.store(cache.slot(3), cuda.to_device(k), cuda.to_device(v), cuda.to_device(pos))
    kr, vr = cache.read(1, 3)
    # read() = dequantize(quantize(x)) in the [S, Hkv, D] layout of ops.attention
    np.testing.assert_array_equal(kr, dequantize(quantize(k, QType.Q8_0), QType.Q8_0, k.shape))
    q5 = dequantize(quantize(v, QType.Q5_1), QType.Q5_1, v.shape)
    # bit-exact in the simulator; on a GPU a near-tie quant may move one step d = range / 31
    step = 0 if simulator_enabled() else float(np.ptp(v.reshape(-1, 32), axis=1).max() / 31) * 1.01
    np.testing.assert_allclose(vr, q5, rtol=0, atol=step)
    k0, v0 = cache.read(0, 3)                  # the other slot is untouched (zeros)
    assert not k0.any() and not v0.any()
