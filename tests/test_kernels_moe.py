"""MoE kernels (bw24nb/kernels/moe.py) against the numpy reference (bw24nb/reference/moe.py),
in the CUDA simulator on tiny shapes: 4 experts, top-2, hidden 64, expert ffn 32, shared
expert ffn 32; expert weights Q8_0 (bw24nb.quant.quantize), router and shared gate F32 (as
llama.cpp stores ffn_gate_inp). The reference runs on the dequantized weights.

Every output is poisoned with NaN before its launch.

Tolerances (u = 2^-24; the reference accumulates in float64):
- router weights: float32 softmax (exp, a 4-term sum, divide) and renormalisation (a 2-term sum,
  divide) vs float64 rounded once: a few ulps -> rtol 1e-6. The *ids* must be identical: random
  logits are never within rounding of a tie (a tie that is exact is tested separately).
- expert matvec: bit-identical to launch_matvec on the expert's slice (same kernel loop, same
  summation order) -- that kernel is held to the codec in tests/test_kernels_matvec.py.
- down + combine: each dot's rounding is bounded by gamma_h * sum|w a| (h <= 31 roundings, see
  test_kernels_matvec.py), the 2-term weighted combine and the gated shared term add ~4 more:
  1e-5 relative to sum_r w_r sum|W a| + |shared|.
- the whole block: the above through gate/up (K = 64), silu and down, each stage a few
  1e-6 relative of its magnitudes: 1e-4 relative to max|y|. A wrong expert, weight or gate
  moves the output by O(1) relative.
"""
import dataclasses

import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels.matvec import launch_matvec, matvec_reference
from bw24nb.kernels.moe import (ExpertWeights, MoEScratch, launch_expert_matvec,
                                launch_moe_block, launch_moe_down, launch_moe_route)
from bw24nb.quant import QType, dequantize, quantize
from bw24nb.reference import ops
from bw24nb.reference.moe import moe_forward, route

E, K_TOP, H, I, IS = 4, 2, 64, 32, 32
QT = QType.Q8_0
BLOCK_REL = 1e-4


def _poisoned(shape, dtype=np.float32):
    fill = np.nan if dtype == np.float32 else -7
    return cuda.to_device(np.full(shape, fill, dtype))


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _quantized(rng, *shape):
    """Random weights quantized to QT: (raw bytes, the dequantized float32 the reference uses)."""
    raw = quantize(_rand(rng, *shape, scale=shape[-1] ** -0.5), QT)
    return raw, dequantize(raw, QT, shape)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ------------------------------------------------------------------ router


@pytest.mark.parametrize("T,norm_topk", [(1, True), (7, False)])
def test_route_matches_reference(rng, T, norm_topk):
    x = _rand(rng, T, H)
    w_router = _rand(rng, E, H, scale=0.3)
    logits = ops.linear(x, w_router)             # the logits `route` itself computes
    ids, wts = _poisoned((T, K_TOP), np.int32), _poisoned((T, K_TOP))
    launch_moe_route(cuda.to_device(logits), norm_topk, ids, wts)
    ref_ids, ref_wts = route(x, w_router, K_TOP, norm_topk)
    np.testing.assert_array_equal(ids.copy_to_host(), ref_ids)
    np.testing.assert_allclose(wts.copy_to_host(), ref_wts, rtol=1e-6, atol=0)


def test_route_many_experts_and_exact_ties(rng):
    # 200 experts (several per router thread) with duplicated logits: equal probabilities go
    # lower id first, as the reference's stable sort orders them.
    n, k, T = 200, 8, 2
    base = rng.standard_normal((T, n // 4)).astype(np.float32)
    logits = np.concatenate([base, base, base, base], axis=1)          # every value 4 times
    rng.permuted(logits, axis=1, out=logits)
    ids, wts = _poisoned((T, k), np.int32), _poisoned((T, k))
    launch_moe_route(cuda.to_device(logits), True, ids, wts)
    # route() takes x and a router weight: an identity router makes its logits ours exactly
    ref_ids, ref_wts = route(logits, np.eye(n, dtype=np.float32), k, True)
    np.testing.assert_array_equal(ids.copy_to_host(), ref_ids)
    np.testing.assert_allclose(wts.copy_to_host(), ref_wts, rtol=1e-6, atol=0)
    got = ids.copy_to_host()
    assert all(len(set(row)) == k for row in got)                       # no expert twice


@pytest.mark.parametrize("E,k,T", [(256, 8, 5), (64, 4, 1), (40, 2, 3), (512, 10, 2)])
def test_route_warp_gives_the_block_routers_bits(rng, monkeypatch, E, k, T):
    """moe_route_warp (one warp a token, the default) plays moe_route's block: the same ids
    and the same weight bits, with 1..4 virtual warps (E = 40 -> 64 threads, 512 -> 128),
    ties among equal logits and both norm_topk settings."""
    from bw24nb.kernels import moe
    logits = rng.standard_normal((T, E)).astype(np.float32) * np.float32(3.0)
    logits[:, :1] = logits.max(axis=1, keepdims=True) + np.float32(1.0)
    logits[:, E // 2:E // 2 + 3] = logits[:, :1]                      # 4 tied at the top
    for norm_topk in (True, False):
        got = {}
        for warp in (True, False):
            monkeypatch.setattr(moe, "ROUTE_WARP", warp)
            ids, wts = _poisoned((T, k), np.int32), _poisoned((T, k))
            launch_moe_route(cuda.to_device(logits), norm_topk, ids, wts)
            got[warp] = ids.copy_to_host(), wts.copy_to_host()
        np.testing.assert_array_equal(got[True][0], got[False][0])
        np.testing.assert_array_equal(got[True][1].view(np.uint32), got[False][1].view(np.uint32))


# ------------------------------------------------------------------ expert projections


def test_expert_matvec_equals_matvec_on_the_expert_slice(rng):
    T = 1
    raw, deq = _quantized(rng, E, I, H)
    x = _rand(rng, T, H)
    ids = np.stack([rng.permutation(E)[:K_TOP] for _ in range(T)]).astype(np.int32)
    y = _poisoned((T, K_TOP, I))
    d_raw = cuda.to_device(raw)
    launch_expert_matvec(d_raw, QT, E, I, H, cuda.to_device(ids), cuda.to_device(x), y)
    got = y.copy_to_host()
    for t in range(T):
        for r in range(K_TOP):
            e = int(ids[t, r])
            one = _poisoned((I,))
            launch_matvec(cuda.to_device(raw[e]), QT, I, H, cuda.to_device(x[t]), one)
            np.testing.assert_array_equal(got[t, r], one.copy_to_host())       # bit for bit
            ref = matvec_reference(raw[e], QT, I, H, x[t])
            scale = np.abs(deq[e]).astype(np.float64) @ np.abs(x[t]).astype(np.float64)
            assert np.all(np.abs(got[t, r] - ref) <= 1e-5 * scale)


@pytest.mark.parametrize("shared,T,with_residual", [("gated", 2, True), ("plain", 1, False),
                                                    ("none", 1, True)])
def test_moe_down_combines_in_rank_order(rng, shared, T, with_residual):
    raw, deq = _quantized(rng, E, H, I)
    act = _rand(rng, T, K_TOP, I)
    ids = np.stack([rng.permutation(E)[:K_TOP] for _ in range(T)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (T, K_TOP)).astype(np.float32)
    sy = _rand(rng, T, H) if shared != "none" else None
    sg = _rand(rng, T, scale=2.0) if shared == "gated" else None
    residual = _rand(rng, T, H) if with_residual else np.zeros((T, H), np.float32)
    y = _poisoned((T, H))
    launch_moe_down(cuda.to_device(raw), QT, E, H, I, cuda.to_device(ids), cuda.to_device(wts),
                    cuda.to_device(act), y,
                    shared_y=None if sy is None else cuda.to_device(sy),
                    shared_gate=None if sg is None else cuda.to_device(sg),
                    residual=cuda.to_device(residual) if with_residual else None)
    ref = residual.astype(np.float64).copy()
    scale = np.abs(residual).astype(np.float64)
    for t in range(T):
        for r in range(K_TOP):
            W = deq[ids[t, r]].astype(np.float64)
            ref[t] += wts[t, r] * (W @ act[t, r])
            scale[t] += wts[t, r] * (np.abs(W) @ np.abs(act[t, r]))
    if sy is not None:
        gate = ops.sigmoid(sg).astype(np.float64)[:, None] if sg is not None else 1.0
        ref += gate * sy
        scale += np.abs(sy)
    got = y.copy_to_host()
    assert np.isfinite(got).all()
    assert np.all(np.abs(got - ref) <= 1e-5 * scale)


# ------------------------------------------------------------------ the whole block


def _random_block(rng, shared: bool):
    host = {"router": _rand(rng, E, H, scale=0.3)}
    raw = {}
    for name, shape in (("gate", (E, I, H)), ("up", (E, I, H)), ("down", (E, H, I))):
        raw[name], host[name] = _quantized(rng, *shape)
    if shared:
        for name, shape in (("sh_gate", (IS, H)), ("sh_up", (IS, H)), ("sh_down", (H, IS))):
            raw[name], host[name] = _quantized(rng, *shape)
        host["sh_gate_inp"] = _rand(rng, 1, H, scale=0.3)
    dev = {n: cuda.to_device(v) for n, v in raw.items()}
    f32 = lambda a: cuda.to_device(quantize(a, QType.F32))            # noqa: E731
    w = ExpertWeights(
        n_experts=E, top_k=K_TOP, hidden=H, ffn=I, norm_topk_prob=True,
        router=f32(host["router"]), router_type=QType.F32,
        gate=dev["gate"], gate_type=QT, up=dev["up"], up_type=QT, down=dev["down"], down_type=QT)
    if shared:
        w.shared_ffn = IS
        w.sh_gate, w.sh_gate_type = dev["sh_gate"], QT
        w.sh_up, w.sh_up_type = dev["sh_up"], QT
        w.sh_down, w.sh_down_type = dev["sh_down"], QT
        w.sh_gate_inp, w.sh_gate_inp_type = f32(host["sh_gate_inp"]), QType.F32
    return w, host


def _reference_block(x, host, shared: bool):
    return moe_forward(x, host["router"], (host["gate"], host["up"], host["down"]), K_TOP, True,
                       shared=(host["sh_gate"], host["sh_up"], host["sh_down"]) if shared else None,
                       shared_gate_w=host["sh_gate_inp"] if shared else None)


def test_moe_block_prefill_matches_moe_forward(rng):
    T = 2                                        # grid z > 1, router and shared expert by matmul
    w, host = _random_block(rng, True)
    x = _rand(rng, T, H)
    scratch = MoEScratch(T, w)
    y = _poisoned((T, H))
    launch_moe_block(cuda.to_device(x), w, scratch, y)
    ref = _reference_block(x, host, True)
    got = y.copy_to_host()
    assert np.isfinite(got).all()
    assert _rel(got, ref) <= BLOCK_REL
    ref_ids, _ = route(x, host["router"], K_TOP, True)             # the same experts, in order
    np.testing.assert_array_equal(scratch.ids.copy_to_host(), ref_ids)


def _steered(rng, host, favourite):
    """A token whose router logits favour expert `favourite` (x along its router row)."""
    return (_rand(rng, 1, H, scale=0.5) + 5.0 * host["router"][favourite]).astype(np.float32)


def test_moe_block_decode_eager_then_graph_with_other_routing(rng):
    # Decode (T = 1) with the gated shared expert and the residual added in place (y += moe(x)):
    # first eagerly, then captured once and replayed for a token routed to other experts -- the
    # expert ids are read on the device, the launches are fixed.
    from bw24nb.graph import CudaGraph
    w, host = _random_block(rng, True)
    scratch = MoEScratch(1, w)
    x_dev = cuda.device_array((1, H), np.float32)
    y = cuda.device_array((1, H), np.float32)
    stream = cuda.stream()
    seen = []
    for step, favourite in enumerate((0, 3)):
        x, r0 = _steered(rng, host, favourite), _rand(rng, 1, H)
        x_dev.copy_to_device(x)
        y.copy_to_device(r0)
        scratch.ids.copy_to_device(np.full((1, K_TOP), -7, np.int32))        # poison
        if step == 0:
            launch_moe_block(x_dev, w, scratch, y, residual=y, stream=stream)   # eager (warm-up)
            with CudaGraph.capture(stream) as graph:
                launch_moe_block(x_dev, w, scratch, y, residual=y, stream=stream)
        else:
            graph.replay()
        stream.synchronize()
        ref = r0.astype(np.float64) + _reference_block(x, host, True)
        got = y.copy_to_host()
        assert np.isfinite(got).all()
        assert _rel(got, ref) <= BLOCK_REL, f"step {step}"
        ids = scratch.ids.copy_to_host()
        np.testing.assert_array_equal(ids, route(x, host["router"], K_TOP, True)[0])
        seen.append(tuple(ids[0]))
    assert seen[0] != seen[1], "the replay did not change the routing; the test proved nothing"


# ------------------------------------------------------------------ the int8 block (dp4a)


def _int8(x):
    """quantize_act's int8 + scales of float32 rows x (flat), on the device."""
    from bw24nb.kernels.quantize_act import launch_quantize_act
    xq = cuda.device_array(x.size, np.int8)
    xd = cuda.device_array(x.size // 32, np.float32)
    launch_quantize_act(cuda.to_device(x.reshape(-1)), xq, xd)
    return xq, xd


@pytest.mark.parametrize("qt,per_expert", [(QType.Q4_K, False), (QType.Q8_0, True),
                                           (QType.Q6_K, False)])
def test_token_matvec_equals_matvec_q8_on_the_expert_slice(rng, qt, per_expert):
    # every (token, rank) row of the token kernel is the one-row dp4a kernel's result on that
    # expert's slice and that row of activations, bit for bit (matvec.token_kernel)
    from bw24nb.kernels.matvec import launch_matvec_q8
    from bw24nb.kernels.moe import launch_token_matvec, token_matrix
    T, k, Ex, M, K = 2, 2, 3, 5, 256
    raw = quantize(_rand(rng, Ex, M, K, scale=K ** -0.5), qt)
    x = _rand(rng, T * (k if per_expert else 1), K)
    xq, xd = _int8(x)
    ids = np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32)
    tm = token_matrix(cuda.to_device(raw), qt, M, K, k=k)
    y = _poisoned((T, k, M))
    launch_token_matvec(tm, cuda.to_device(ids), True, k, tm.x_args(xq, xd), per_expert, y, T)
    got = y.copy_to_host()
    xq_h, xd_h = xq.copy_to_host(), xd.copy_to_host()
    for t in range(T):
        for r in range(k):
            row = t * k + r if per_expert else t
            one = _poisoned((M,))
            launch_matvec_q8(cuda.to_device(raw[ids[t, r]]), qt, M, K,
                             cuda.to_device(xq_h[row * K:(row + 1) * K]),
                             cuda.to_device(xd_h[row * K // 32:(row + 1) * K // 32]), one,
                             parts=tm.parts)
            np.testing.assert_array_equal(got[t, r], one.copy_to_host(), f"t={t} r={r}")


def _q8_block(rng, T, grouped_ok=False):
    """A random int8-ready block with its TokenMatrices, T tokens of x, a residual r0 and x's
    int8 copy (device)."""
    from bw24nb.kernels.moe import expert_matrices_q8, grouped_experts, int8_experts
    w, host = _random_block(rng, True)
    assert int8_experts(w)
    if grouped_ok:
        assert grouped_experts(w)
    x, r0 = _rand(rng, T, H), _rand(rng, T, H)
    xq, xd = _int8(x)
    return w, host, expert_matrices_q8(w), x, r0, xq, xd


def _run_q8_block(w, q, x, xq, xd, r0, grouped=False, expert_rows=False):
    """y = r0 + the int8 block (per token, expert-major on the GEMM, or expert-major on the
    decode kernels) on x; (y on the host, the scratch)."""
    from bw24nb.kernels import moe
    T = x.shape[0]
    scratch, block = ((moe.MoEScratchGrouped, moe.launch_moe_block_q8_grouped) if grouped else
                      (moe.MoEScratchExpertRows, moe.launch_moe_block_q8_expert_rows)
                      if expert_rows else (moe.MoEScratchQ8, moe.launch_moe_block_q8))
    s = scratch(T, w)
    y = cuda.to_device(r0)
    block(cuda.to_device(x), xq, xd, w, q, s, y, residual=y)
    return y.copy_to_host(), s


def test_moe_block_q8_matches_moe_forward_and_each_token_alone(rng):
    # T = 3 tokens at once against the float64 reference (to int8 activations' error), and
    # each token's row bit for bit what a T = 1 launch (decode) gives it
    T = 3
    w, host, q, x, r0, xq, xd = _q8_block(rng, T)
    got, s = _run_q8_block(w, q, x, xq, xd, r0)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(s.ids.copy_to_host(), route(x, host["router"], K_TOP, True)[0])
    ref = r0.astype(np.float64) + _reference_block(x, host, True)
    # int8 activations (x and the expert activations): ~1 % of each value's block max
    assert _rel(got - r0, ref - r0) <= 3e-2
    xq_h, xd_h = xq.copy_to_host(), xd.copy_to_host()
    for t in range(T):
        one, _ = _run_q8_block(w, q, x[t:t + 1], cuda.to_device(xq_h[t * H:(t + 1) * H]),
                               cuda.to_device(xd_h[t * H // 32:(t + 1) * H // 32]), r0[t:t + 1])
        np.testing.assert_array_equal(got[t], one[0], f"token {t}")


def test_moe_combine_rank_order_and_shared_gate(rng):
    from bw24nb.kernels.moe import launch_moe_combine
    T = 2
    yd = _rand(rng, T, K_TOP, H)
    wts = rng.uniform(0.1, 1.0, (T, K_TOP)).astype(np.float32)
    sy, sg, res = _rand(rng, T, H), _rand(rng, T, 1), _rand(rng, T, H)
    y = _poisoned((T, H))
    launch_moe_combine(cuda.to_device(yd), cuda.to_device(wts), y, cuda.to_device(sy),
                       cuda.to_device(sg), cuda.to_device(res))
    ref = np.zeros((T, H), np.float32)
    for r in range(K_TOP):                       # the kernel's order, in float32
        ref += wts[:, r:r + 1] * yd[:, r]
    gate = (np.float32(1) / (np.float32(1) + np.exp(-sg))).astype(np.float32)
    ref = (ref + gate * sy) + res
    np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ expert-major prefill


@pytest.mark.parametrize("T,k,Ex,threads", [(7, 3, 5, None), (7, 3, 5, 32), (30, 3, 40, None),
                                             (25, 4, 40, 64)])
def test_moe_sort_lists_each_experts_pairs_in_order(rng, T, k, Ex, threads):
    # (7, 3, 5, 32): 21 pairs in one round of one warp; (30, 3, 40): 90 pairs on 128 threads,
    # 40 experts in two scan segments; (25, 4, 40, 64): 100 pairs in two rounds of two warps
    from bw24nb.kernels.moe import launch_moe_sort
    ids = np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32)
    ids[T // 2] = ids[0]                 # (at least one expert with pairs in several warps)
    off = cuda.to_device(np.full(Ex + 1, 99, np.uint32))
    pos, src = _poisoned(T * k, np.int32), _poisoned(T * k, np.int32)
    launch_moe_sort(cuda.to_device(ids), Ex, off, pos, src, threads=threads)
    pairs = [p for e in range(Ex) for p in range(T * k) if ids[p // k, p % k] == e]
    want_off = np.concatenate([[0], np.cumsum(np.bincount(ids.reshape(-1), minlength=Ex))])
    np.testing.assert_array_equal(off.copy_to_host(), want_off)
    np.testing.assert_array_equal(src.copy_to_host(), [p // k for p in pairs])
    want_pos = np.empty(T * k, np.int32)
    want_pos[pairs] = np.arange(T * k)
    np.testing.assert_array_equal(pos.copy_to_host(), want_pos)


def test_moe_block_grouped_matches_the_token_block(rng):
    # the expert-major prefill against the per-token int8 block: the same routing and int8
    # activations, sums in the GEMM's order instead of the matvec's -> float32 rounding only
    w, _, q, x, r0, xq, xd = _q8_block(rng, 5, grouped_ok=True)
    tok, s_t = _run_q8_block(w, q, x, xq, xd, r0)
    grp, s_g = _run_q8_block(w, q, x, xq, xd, r0, grouped=True)
    np.testing.assert_array_equal(s_g.ids.copy_to_host(), s_t.ids.copy_to_host())
    assert np.isfinite(grp).all()
    assert _rel(grp - r0, tok - r0) <= 1e-5


def _sorted(ids_d, Ex, T, k):
    """moe_sort's (group_off, pos, src) of the device ids int32[T, k] over Ex experts."""
    from bw24nb.kernels.moe import launch_moe_sort
    off, pos, src = (cuda.device_array(Ex + 1, np.uint32), cuda.device_array(T * k, np.int32),
                     cuda.device_array(T * k, np.int32))
    launch_moe_sort(ids_d, Ex, off, pos, src)
    return off, pos, src


@pytest.mark.parametrize("qt,per_expert,K", [(QType.Q4_K, False, 256), (QType.Q8_0, True, 256),
                                             (QType.Q4_K, False, 1024)])
def test_group_matvec_gives_the_token_kernels_bits(rng, qt, per_expert, K):
    # every (token, rank) pair's row of the expert-major group kernel, at its sorted row, is
    # the token kernel's row bit for bit; K = 1024 splits each row over 4 warps (the block
    # barrier between a warp's rows; set here: moe.token_parts gives a 32-unit row one warp)
    from bw24nb.kernels.moe import launch_group_matvec, launch_token_matvec, token_matrix
    T, k, Ex, M = 5, 2, 3, 5
    raw = quantize(_rand(rng, Ex, M, K, scale=K ** -0.5), qt)
    ids = np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32)
    x = _rand(rng, T * (k if per_expert else 1), K)
    xq, xd = _int8(x)
    tm = token_matrix(cuda.to_device(raw), qt, M, K, k=k)
    assert tm.parts == 1
    if K == 1024:
        tm = dataclasses.replace(tm, parts=4)
    y = _poisoned((T, k, M))
    ids_d = cuda.to_device(ids)
    launch_token_matvec(tm, ids_d, True, k, tm.x_args(xq, xd), per_expert, y, T)
    off, pos, src = _sorted(ids_d, Ex, T, k)
    pos_h = pos.copy_to_host()
    if per_expert:              # the down projections' input: already in sorted row order
        xs = np.empty_like(x)
        xs[pos_h] = x
        xq, xd = _int8(xs)
    yg = _poisoned((T * k, M))
    launch_group_matvec(tm, off, None if per_expert else src, tm.x_args(xq, xd), yg, Ex, T * k)
    np.testing.assert_array_equal(yg.copy_to_host()[pos_h].reshape(T, k, M), y.copy_to_host())


def test_moe_block_expert_rows_gives_the_token_blocks_bits(rng):
    # the expert-major block on the decode kernels: the same routing, every row summed as
    # the token block sums it -> the same output, bit for bit (shared expert included)
    w, _, q, x, r0, xq, xd = _q8_block(rng, 6)
    tok, s_t = _run_q8_block(w, q, x, xq, xd, r0)
    exp, s_e = _run_q8_block(w, q, x, xq, xd, r0, expert_rows=True)
    np.testing.assert_array_equal(s_e.ids.copy_to_host(), s_t.ids.copy_to_host())
    assert np.isfinite(exp).all()
    np.testing.assert_array_equal(exp.view(np.uint32), tok.view(np.uint32))


@pytest.mark.parametrize("qt,K,lanes", [(QType.Q4_K, 512, 16), (QType.Q4_K, 256, 8),
                                        (QType.Q8_0, 256, 8), (QType.Q8_0, 1024, 32)])
def test_short_rows_on_part_of_a_warp_keep_the_whole_warps_bits(rng, monkeypatch, qt, K, lanes):
    # a row of <= 16 (8) units takes 16 (8) lanes (matvec.lanes_per_row): the token and group
    # kernels then give, bit for bit, what they give with a whole warp a row (SUB_WARP_ROWS
    # off); M = 5 leaves part of the last warp without a row
    from bw24nb.kernels import matvec
    from bw24nb.kernels.moe import launch_group_matvec, launch_token_matvec, token_matrix
    T, k, Ex, M = 3, 2, 3, 5
    raw = quantize(_rand(rng, Ex, M, K, scale=K ** -0.5), qt)
    ids = cuda.to_device(np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32))
    xq, xd = _int8(_rand(rng, T, K))
    # one warp a row, as at the real shape's 8 x 2048 rows (this few rows would be split)
    tm = dataclasses.replace(token_matrix(cuda.to_device(raw), qt, M, K, k=k), parts=1)
    assert matvec.lanes_per_row(tm.path, K, 1) == lanes
    off, pos, src = _sorted(ids, Ex, T, k)
    outs = {}
    for sub in (True, False):
        monkeypatch.setattr(matvec, "SUB_WARP_ROWS", sub)
        y, yg = _poisoned((T, k, M)), _poisoned((T * k, M))
        launch_token_matvec(tm, ids, True, k, tm.x_args(xq, xd), False, y, T)
        launch_group_matvec(tm, off, src, tm.x_args(xq, xd), yg, Ex, T * k)
        outs[sub] = (y.copy_to_host(), yg.copy_to_host())
    for got, want, what in zip(outs[True], outs[False], ("token", "group")):
        assert np.isfinite(got).all(), what
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), what)


def test_moe_blocks_on_branches_give_the_chains_bits(rng, monkeypatch):
    # moe.BRANCHES: the shared expert and each up projection on side streams (graph.Branches),
    # captured into a graph and replayed, give what one chain of the same launches gives --
    # for the token block (decode, verify) and the expert-major one (the rows prefill); in the
    # simulator this holds the launches' call order to one valid for the chain (the GPU side,
    # a race between branches, is bench/moe_bench.py --branches on,off)
    from bw24nb.graph import CudaGraph
    from bw24nb.kernels import moe
    w, _, q, x, r0, xq, xd = _q8_block(rng, 4)
    for kind, block in ((moe.MoEScratchQ8, moe.launch_moe_block_q8),
                        (moe.MoEScratchExpertRows, moe.launch_moe_block_q8_expert_rows)):
        out = {}
        for on in (False, True):
            monkeypatch.setattr(moe, "BRANCHES", on)
            s, stream = kind(4, w), cuda.stream()
            y = cuda.to_device(np.full_like(r0, np.nan))
            xdev = cuda.to_device(x)
            block(xdev, xq, xd, w, q, s, y, stream=stream)        # compile / load first
            y.copy_to_device(np.full_like(r0, np.nan))
            with CudaGraph.capture(stream) as g:
                block(xdev, xq, xd, w, q, s, y, stream=stream)
            g.replay()
            stream.synchronize()
            out[on] = y.copy_to_host()
        assert np.isfinite(out[True]).all()
        np.testing.assert_array_equal(out[True].view(np.uint32), out[False].view(np.uint32))


@pytest.mark.parametrize("batch,rows_per_slice", [(4, 64), (4, 2), (2, 64)])
def test_group_matvec_batches_give_the_token_kernels_bits(rng, monkeypatch, batch,
                                                          rows_per_slice):
    # matvec.GROUP_BATCH: a warp sums its group's rows `batch` at a time (then 2, then one),
    # each chunk's weights decoded once for the batch -- every row still the token kernel's,
    # bit for bit. 9 rows an expert: at one grid slice 4 + 4 + 1 (or 2 + 2 + 2 + 2 + 1); at
    # GROUP_ROWS_PER_SLICE = 2 five slices of one or two rows (a batch of 2, or one row).
    from bw24nb.kernels import matvec, moe
    from bw24nb.kernels.moe import launch_group_matvec, launch_token_matvec, token_matrix
    monkeypatch.setattr(matvec, "GROUP_BATCH", batch)
    monkeypatch.setattr(moe, "GROUP_ROWS_PER_SLICE", rows_per_slice)
    T, k, Ex, M, K = 9, 2, 2, 3, 2048      # (the 35B-A3B's gate / up: 64 chunks, 2 a lane)
    raw = quantize(_rand(rng, Ex, M, K, scale=K ** -0.5), QType.Q4_K)
    ids = np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32)
    xq, xd = _int8(_rand(rng, T, K))
    tm = dataclasses.replace(token_matrix(cuda.to_device(raw), QType.Q4_K, M, K, k=k), parts=1)
    y = _poisoned((T, k, M))
    ids_d = cuda.to_device(ids)
    launch_token_matvec(tm, ids_d, True, k, tm.x_args(xq, xd), False, y, T)
    off, pos, src = _sorted(ids_d, Ex, T, k)
    assert list(off.copy_to_host()) == [0, T, 2 * T]
    yg = _poisoned((T * k, M))
    launch_group_matvec(tm, off, src, tm.x_args(xq, xd), yg, Ex, T * k)
    pos_h = pos.copy_to_host()
    np.testing.assert_array_equal(yg.copy_to_host()[pos_h].reshape(T, k, M), y.copy_to_host())


def test_token_parts_keep_units_on_every_lane(monkeypatch):
    # moe.token_parts: a split token-matrix row keeps TOKEN_MIN_UNITS units a lane. The
    # 35B-A3B's shared expert (512 x 2048 Q4_K: 64 units) went to 4 warps a row, two of them
    # empty; its down (2048 x 512: 16 units) to 2, one empty. The router (256 x 2048 F32: 512
    # units) keeps its 4.
    from bw24nb.kernels import matvec, matvec_q4k, moe
    monkeypatch.setattr(matvec, "SPLIT_MIN_K", 512)     # the matvec split of session 25
    assert matvec.warps_per_row(512, 2048) == 4 and matvec.warps_per_row(2048, 512) == 2
    monkeypatch.setattr(moe, "TOKEN_MIN_UNITS", 2)
    assert moe.token_parts(matvec_q4k.PATH, 512, 2048) == 1
    assert moe.token_parts(matvec_q4k.PATH, 2048, 512) == 1
    assert moe.token_parts(matvec.F32_V4, 256, 2048) == 4
    assert moe.token_parts(matvec_q4k.PATH, 32, 16384) == 4      # 512 units: 4 a lane at 4
    monkeypatch.setattr(moe, "TOKEN_MIN_UNITS", 1)
    assert moe.token_parts(matvec_q4k.PATH, 512, 2048) == 2
    assert moe.token_parts(matvec_q4k.PATH, 2048, 512) == 1


@pytest.mark.parametrize("M,K", [(5, 2048), (6, 512)])
def test_token_parts_at_one_unit_a_lane_keep_the_bits(rng, monkeypatch, M, K):
    # TOKEN_MIN_UNITS = 1 only drops warps that held no unit: the token kernel gives, bit for
    # bit, what it gives on matvec.warps_per_row's split (the form before session 25).
    # (5, 2048): 4 warps -> 2; (6, 512): 2 warps -> 1 on 16 lanes.
    from bw24nb.kernels import matvec, moe
    from bw24nb.kernels.moe import launch_token_matvec, token_matrix
    monkeypatch.setattr(moe, "TOKEN_MIN_UNITS", 1)
    monkeypatch.setattr(matvec, "SPLIT_MIN_K", 512)     # the matvec split of session 25
    T = 2
    raw = quantize(_rand(rng, M, K, scale=K ** -0.5), QType.Q4_K)
    xq, xd = _int8(_rand(rng, T, K))
    tm = token_matrix(cuda.to_device(raw), QType.Q4_K, M, K)
    old = matvec.warps_per_row(M, K)
    assert tm.parts < old
    ids = cuda.to_device(np.zeros((T, 1), np.int32))
    out = []
    for parts in (tm.parts, old):
        y = _poisoned((T, M))
        launch_token_matvec(dataclasses.replace(tm, parts=parts), ids, False, 1,
                            tm.x_args(xq, xd), False, y, T)
        out.append(y.copy_to_host())
    assert np.isfinite(out[0]).all()
    np.testing.assert_array_equal(out[0].view(np.uint32), out[1].view(np.uint32))


@pytest.mark.parametrize("qt,M,K,parts,nr,rows", [(QType.F32, 7, 256, 4, 3, 4),
                                                  (QType.Q4_K, 5, 512, 2, 4, 3),
                                                  (QType.Q8_0, 6, 256, 1, 2, 5)])
def test_token_tiles_give_the_token_kernels_bits(rng, qt, M, K, parts, nr, rows):
    # matvec.tile_kernel (the router of a prefill chunk, moe.launch_token_tiles): nr tokens x
    # `rows` rows a block, T = 7 leaving a part tile and M a part row block -- every (token,
    # row) the token kernel's value, bit for bit, on 4, 2 and 1 warps a row
    from bw24nb.kernels.moe import launch_token_matvec, launch_token_tiles, token_matrix
    T = 7
    raw = quantize(_rand(rng, M, K, scale=K ** -0.5), qt)
    x = _rand(rng, T, K)
    tm = dataclasses.replace(token_matrix(cuda.to_device(raw), qt, M, K), parts=parts)
    if qt == QType.F32:
        xa = tm.x_args(x=cuda.to_device(x))
    else:
        xq, xd = _int8(x)
        xa = tm.x_args(xq, xd)
    ids = cuda.to_device(np.zeros((T, 1), np.int32))
    y, yt = _poisoned((T, M)), _poisoned((T, M))
    launch_token_matvec(tm, ids, False, 1, xa, False, y, T)
    launch_token_tiles(tm, xa, yt, T, nr=nr, rows=rows)
    want = y.copy_to_host()
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(yt.copy_to_host().view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("batch,rows_per_slice", [(4, 64), (4, 2), (1, 64)])
def test_group_matvec_pair_gives_two_launches_bits(rng, monkeypatch, batch, rows_per_slice):
    # moe.launch_group_matvec_pair (the expert-major block's gate and up in one launch, a warp
    # summing both rows): ya / yb are two launch_group_matvec launches' outputs, bit for bit --
    # 9 rows an expert (batches of 4 + 4, then one row), at one or five grid slices
    from bw24nb.kernels import matvec, moe
    from bw24nb.kernels.moe import launch_group_matvec, launch_group_matvec_pair, token_matrix
    monkeypatch.setattr(matvec, "GROUP_BATCH", batch)
    monkeypatch.setattr(moe, "GROUP_ROWS_PER_SLICE", rows_per_slice)
    T, k, Ex, M, K = 9, 2, 2, 5, 2048
    ta, tb = (dataclasses.replace(token_matrix(cuda.to_device(quantize(
        _rand(rng, Ex, M, K, scale=K ** -0.5), QType.Q4_K)), QType.Q4_K, M, K, k=k), parts=1)
        for _ in range(2))
    assert moe._pairs_serve(ta, tb)
    ids = cuda.to_device(np.stack([rng.permutation(Ex)[:k] for _ in range(T)]).astype(np.int32))
    xq, xd = _int8(_rand(rng, T, K))
    off, pos, src = _sorted(ids, Ex, T, k)
    want = []
    for tm in (ta, tb):
        y = _poisoned((T * k, M))
        launch_group_matvec(tm, off, src, tm.x_args(xq, xd), y, Ex, T * k)
        want.append(y.copy_to_host())
    ya, yb = _poisoned((T * k, M)), _poisoned((T * k, M))
    launch_group_matvec_pair(ta, tb, off, src, ta.x_args(xq, xd), ya, yb, Ex, T * k)
    for got, w in zip((ya.copy_to_host(), yb.copy_to_host()), want):
        assert np.isfinite(w).all()
        np.testing.assert_array_equal(got.view(np.uint32), w.view(np.uint32))
