"""Do two forms that the simulator tests hold bit-identical also give the same bits on the GPU?

    python3 bench/gpu_same_bits.py [--T 64]
    python3 bench/gpu_same_bits.py --gemm-hash     (run under two trees' PYTHONPATH)

FMA contraction is the compiler's choice on the GPU (the simulator rounds every operation), so
a restructured kernel can differ from its twin there by an ulp. Checked:
  * conv1d_silu's T-token launch against T one-token launches (the 9B's GDN channels);
  * decode attention's one-tile splits stored directly (decode_attention.ONE_TILE_DIRECT)
    against the four-warp merge, as prefill runs them (T = 32 tokens from position 0, 2 splits
    a token) and as decode does (one token at 511), on the 9B's and the 0.5B's heads;
  * the quad and pipe delta rules against the lane kernel (session 22), 9B heads, 512 tokens
    and a 9-token verify with saved steps;
  * decode's fused conv + prep against prefill's conv and prep (9B channels, 1 and 9 rows);
  * the conv in the rule-norm launch (gdn_conv_rule_norm_q8) against gdn_conv_prep then the
    rule-norm launch (9B heads, decode's one row, with steps): its sums of squares are spelled as
    the fma chains the compiler made of gdn_conv_prep's.
Prints one line each: SAME, or DIFF with the count of differing outputs and the largest
relative difference. A twin checked here only shows that two kernels of one tree agree; to
compare two trees, see bench/prefill_hashes.py.
--gemm-hash: only a hash of the prefill GEMM's outputs (Q4_K, Q6_K, Q8_0 at 512 x 4096 x 4096,
fixed inputs), to compare two trees of the library run one after the other.
"""
import argparse
import hashlib
import sys

import numpy as np
from numba import cuda

from bw24nb.kernels import gated_deltanet as gdn


def _report(name, a, b):
    a, b = np.asarray(a), np.asarray(b)
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    if same:
        print(f"{name}: SAME ({a.size} values)")
    else:
        n = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
        rel = float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))
        print(f"{name}: DIFF ({n} of {a.size} values, max rel {rel:.2e})")
    return same


def gemm_hash() -> int:
    from bw24nb.kernels.dequant import random_weight_bytes
    from bw24nb.kernels.matmul_q8 import launch_matmul_q8
    from bw24nb.kernels.quantize_act import launch_quantize_act
    from bw24nb.quant.types import QType
    T, M, K = 512, 4096, 4096
    for qt in (QType.Q4_K, QType.Q6_K, QType.Q8_0):
        rng = np.random.default_rng(7)
        w = cuda.to_device(random_weight_bytes(rng, qt, M, K))
        x = cuda.to_device(rng.standard_normal((T, K)).astype(np.float32))
        xq = cuda.device_array((T, K), np.int8)
        xd = cuda.device_array((T, K // 32), np.float32)
        y = cuda.device_array((T, M), np.float32)
        launch_quantize_act(x, xq, xd)
        launch_matmul_q8(w, qt, M, K, xq, xd, y)
        digest = hashlib.sha256(y.copy_to_host().tobytes()).hexdigest()[:16]
        print(f"gemm {qt.name} {T}x{M}x{K}: {digest}")
    return 0


def attention_twins(rng) -> bool:
    from bw24nb.cache.kv import KVCache
    from bw24nb.kernels.attention import launch_flash_decode
    from bw24nb.quant import QType
    ok = True
    for Hq, Hkv, D, what in ((16, 4, 256, "9B"), (14, 2, 64, "0.5B")):
        for T, n_ctx, n_splits in ((32, 32, 2), (1, 512, 32)):
            cache = KVCache(1, Hkv, D, n_ctx, QType.F16, QType.F16)
            k = (2 * rng.standard_normal((n_ctx, Hkv, D))).astype(np.float32)
            v = rng.standard_normal((n_ctx, Hkv, D)).astype(np.float32)
            cache.store(0, cuda.to_device(k), cuda.to_device(v),
                        cuda.to_device(np.arange(n_ctx, dtype=np.int32)))
            layer = cache.layer(0)
            q = cuda.to_device(rng.standard_normal((T, Hq, D)).astype(np.float32))
            pos = cuda.to_device(np.arange(n_ctx - T, n_ctx, dtype=np.int32))
            got = []
            for direct in (False, True):
                part_ml = cuda.to_device(np.zeros((T, Hq, n_splits, 2), np.float32))
                part_acc = cuda.to_device(np.zeros((T, Hq, n_splits, D), np.float32))
                out = cuda.device_array((T, Hq, D), np.float32)
                launch_flash_decode(q, pos, layer[0], layer[1], QType.F16, layer[2], layer[3],
                                    QType.F16, out, part_ml, part_acc, direct=direct)
                got.append(out.copy_to_host())
            ok &= _report(f"attention one-tile direct vs merge, {what} heads, T {T} at "
                          f"{n_ctx}", got[1], got[0])
    return ok


def rule_twins(rng) -> bool:
    """The quad delta rule (8 lanes a column) and the pipe kernel (quad's passes of two tokens
    in one loop) against the lane kernel (2 lanes a column), 9B heads: a 512-token prefill
    launch, and 9 tokens saving every step (a verify)."""
    from bw24nb.models.qwen35 import value_to_key_head
    nk, nv, dk, dv = 16, 32, 128, 128
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    ok = True
    for T, save in ((512, False), (9, True)):
        q = rng.standard_normal((T, nk, dk)).astype(np.float32)
        k = rng.standard_normal((T, nk, dk)).astype(np.float32)
        q /= np.sqrt((q * q).sum(-1, keepdims=True)) * np.sqrt(dk)
        k /= np.sqrt((k * k).sum(-1, keepdims=True))
        v = rng.standard_normal((T, nv, dv)).astype(np.float32)
        g = (-rng.uniform(0.0, 1.0, (T, nv))).astype(np.float32)
        beta = rng.uniform(0.0, 1.0, (T, nv)).astype(np.float32)
        s0 = (0.5 * rng.standard_normal((nv, dk, dv))).astype(np.float32)
        got = []
        for variant in ("lane", "quad", "pipe"):
            state = cuda.to_device(s0)
            o = cuda.device_array((T, nv, dv), np.float32)
            steps = cuda.device_array((T, nv, dk, dv), np.float32) if save else None
            gdn.launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)),
                                        key_head, state, o, steps=steps, variant=variant)
            got.append([o.copy_to_host(), state.copy_to_host()]
                       + ([steps.copy_to_host()] if save else []))
        for name, other in zip(("quad", "pipe"), got[1:]):
            for what, a, b in zip(("o", "state", "steps"), other, got[0]):
                ok &= _report(f"delta rule {name} vs lane, 9B heads, T {T}: {what}", a, b)
    return ok


def conv_prep_twins(rng, dims=(16, 32, 128, 128)) -> bool:
    """Decode's fused conv + prep (gdn_conv_prep) against prefill's two launches (conv1d_silu,
    gdn_prep), 9B channels, 1, 4, 9 and 16 rows: the same q, k, v, g, beta and window. Before session 22 the compiler
    contracted the two convs' sums differently (decision 0028)."""
    nk, nv, dk, dv = dims
    C = 2 * nk * dk + nv * dv
    ok = True
    for T in (1, 4, 9, 16):
        qkv = (1.5 * rng.standard_normal((T, C))).astype(np.float32)
        w = cuda.to_device((0.5 * rng.standard_normal((C, gdn.CONV_KERNEL))).astype(np.float32))
        window = rng.standard_normal((gdn.CONV_KERNEL - 1, C)).astype(np.float32)
        gates = [cuda.to_device(a) for a in (
            rng.uniform(-30, 30, (T, nv)).astype(np.float32),
            (3 * rng.standard_normal((T, nv))).astype(np.float32),
            rng.standard_normal(nv).astype(np.float32),
            (-np.exp(rng.uniform(-2, 2, nv))).astype(np.float32))]

        def outputs():
            return [cuda.device_array(shape, np.float32) for shape in
                    ((T, nk, dk), (T, nk, dk), (T, nv, dv), (T, nv), (T, nv))]
        x, st = cuda.to_device(qkv), cuda.to_device(window)
        gdn.launch_conv1d_silu(x, w, st, x)
        want = outputs()
        gdn.launch_gdn_prep(x, *gates, *want)
        st2 = cuda.to_device(window)
        got = outputs()
        gdn.launch_gdn_conv_prep(cuda.to_device(qkv), w, st2, *gates, *got)
        for name, a, b in zip(("q", "k", "v", "g", "beta"), got, want):
            ok &= _report(f"conv_prep vs conv + prep, 9B channels, T {T}: {name}",
                          a.copy_to_host(), b.copy_to_host())
        ok &= _report(f"conv_prep vs conv + prep, 9B channels, T {T}: window",
                      st2.copy_to_host(), st.copy_to_host())
    return ok


def conv_rule_norm_twins(rng, dims=(16, 32, 128, 128)) -> bool:
    """gdn_conv_rule_norm_q8 against gdn_conv_prep + gated_delta_rule_norm_q8, 9B heads."""
    from bw24nb.models.qwen35 import value_to_key_head
    nk, nv, dk, dv = dims
    C = 2 * nk * dk + nv * dv
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    counters = gdn.alloc_conv_counters(nk)
    ok = True
    for T in (1,):                  # (decode's launch: one token)
        f32 = (lambda *shape, s=1.0: (s * rng.standard_normal(shape)).astype(np.float32))
        qkv, w_conv, window = f32(T, C, s=1.5), f32(C, gdn.CONV_KERNEL, s=0.5), \
            f32(gdn.CONV_KERNEL - 1, C)
        ab = np.concatenate([f32(T, nv, s=3.0), rng.uniform(-30, 30, (T, nv)).astype(np.float32)], 1)
        consts = [cuda.to_device(a) for a in (w_conv, f32(nv), (-np.exp(rng.uniform(-2, 2, nv)))
                                              .astype(np.float32), 1 + 0.1 * f32(dv), f32(T, nv, dv, s=2.0))]
        s0 = f32(nv, dk, dv, s=0.5)
        outs = []
        for fused in (False, True):
            x, win, state, d_ab = (cuda.to_device(a) for a in (qkv, window, s0, ab))
            b, a = d_ab[:, :nv], d_ab[:, nv:]
            o = cuda.device_array((T, nv, dv), np.float32)
            xq = cuda.device_array(T * nv * dv, np.int8)
            xd = cuda.device_array(T * nv * dv // 32, np.float32)
            steps = cuda.device_array((T, nv, dk, dv), np.float32)
            conv_steps = cuda.device_array((T, gdn.CONV_KERNEL - 1, C), np.float32)
            if fused:
                gdn.launch_gdn_conv_rule_norm_q8(x, consts[0], win, a, b, consts[1], consts[2],
                                                 key_head, state, o, consts[4], consts[3], 1e-6,
                                                 xq, xd, counters, conv_steps=conv_steps,
                                                 steps=steps)
            else:
                q, k, v = (cuda.device_array(sh, np.float32) for sh in
                           ((T, nk, dk), (T, nk, dk), (T, nv, dv)))
                g, beta = cuda.device_array((T, nv), np.float32), cuda.device_array((T, nv), np.float32)
                gdn.launch_gdn_conv_prep(x, consts[0], win, a, b, consts[1], consts[2], q, k, v,
                                         g, beta, steps=conv_steps)
                gdn.launch_gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o,
                                                    consts[4], consts[3], 1e-6, xq, xd,
                                                    steps=steps)
            outs.append([arr.copy_to_host() for arr in (o, xd, state, win, steps, conv_steps)]
                        + [xq.copy_to_host().astype(np.float32)])
        for name, f, a in zip(("o", "xd", "state", "window", "steps", "conv steps", "xq"), *outs[::-1]):
            ok &= _report(f"conv in rule-norm vs conv_prep + rule-norm, 9B heads, T {T}: {name}",
                          f, a)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--gemm-hash", action="store_true")
    ap.add_argument("--only-conv-rule", action="store_true",
                    help="only the conv-in-rule-norm twin")
    args = ap.parse_args()
    if args.gemm_hash:
        return gemm_hash()
    rng = np.random.default_rng(21)
    if args.only_conv_rule:
        return 0 if conv_rule_norm_twins(rng) else 1
    nk, nv, dk, dv = 16, 32, 128, 128
    C = 2 * nk * dk + nv * dv
    Tc = args.T
    x = (2 * rng.standard_normal((Tc, C))).astype(np.float32)
    w = cuda.to_device((0.5 * rng.standard_normal((C, gdn.CONV_KERNEL))).astype(np.float32))
    state = (2 * rng.standard_normal((gdn.CONV_KERNEL - 1, C))).astype(np.float32)
    d_x, d_state = cuda.to_device(x), cuda.to_device(state)
    gdn.launch_conv1d_silu(d_x, w, d_state, d_x)                # in place, as prefill runs it
    one, ys = cuda.to_device(state), []
    for t in range(Tc):
        y1 = cuda.device_array((1, C), np.float32)
        gdn.launch_conv1d_silu(cuda.to_device(x[t:t + 1]), w, one, y1)
        ys.append(y1.copy_to_host())
    ok = _report("conv runs vs one-token launches: y", d_x.copy_to_host(), np.concatenate(ys))
    ok &= _report("conv runs vs one-token launches: state", d_state.copy_to_host(),
                  one.copy_to_host())
    ok &= attention_twins(rng)
    ok &= rule_twins(rng)
    ok &= conv_prep_twins(rng)
    ok &= conv_rule_norm_twins(rng)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
