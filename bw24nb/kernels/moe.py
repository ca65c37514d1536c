"""Sparse mixture-of-experts on the device: router, expert matvecs, weighted combine.

numpy reference: bw24nb/reference/moe.py (`route`, `expert_mlp`, `moe_forward`). One MoE block
for `x[T, H]` (decode: T = 1), every launch with a fixed grid, so a decode step captures into a
CUDA graph and replays for any routing:

    logits = W_router x                        matvec.launch_matvec (T = 1) / matmul (T > 1)
    ids, wts = route(logits)                   moe_route: softmax, top-k, renormalise
    gate = W_gate[ids] x, up = W_up[ids] x     expert_matvec (twice)
    act = silu(gate) * up                      activation.launch_swiglu
    y = sum_r wts_r W_down[ids_r] act_r        moe_down: down projections + combine, rank order
        (+ sigmoid(w_sg . x) * shared(x))      shared expert: matvec/matmul + swiglu, added
        (+ residual)                            inside moe_down

Router (`moe_route`, one block per token): softmax in float32 (max, exp(l - max), block_sum's
tree for the sum, divide), then top_k rounds of a block arg-max over the probabilities, ties to
the lower expert id, the winner masked out after each round -- the reference's stable sort of
`-probs` (best first, equal probabilities in id order). With `norm_topk_prob` the k weights
are divided by their sum, accumulated in rank order 0..k-1 in float32.

Expert weights stay stacked as GGUF stores them, `ffn_{gate,up}_exps` `[E, I, H]` and
`ffn_down_exps` `[E, H, I]`, each a device buffer of `E * M` GGUF rows: expert e's row m is row
`e * M + m`, at byte `(e * M + m) * row_bytes(qtype, K)`. The kernels read the expert id from
the device array the router wrote, inside the kernel, and compute that offset there; the grid
is (row blocks, k, T) whatever the ids are.

`expert_matvec` is matvec.py's kernel with the row offset moved by the expert id: the same
warp-per-row loop over the same group decoders and the same lane-then-warp-tree summation
order, so its output for expert e is bit-identical to `launch_matvec` on that expert's slice
(a test holds it to that). `moe_down` computes the k down-projection dots of a row in that
order too, then combines them `acc = 0; acc += wts_r * dot_r` for r = 0, 1, ..., k-1 -- a fixed
order, no atomics, so the MoE output is deterministic.

Prefill (T > 1) uses the same kernels with grid z = T: each token's k experts are read for that
token (weights re-read per token -- correct, not fast).

That is the float block, which every weight type can run. The engine runs the int8 block of the
sections below wherever the experts have integer types:
  * `launch_moe_block_q8`: the decode kernels, one token per grid z, so that every token gets
    its decode step's bits;
  * `launch_moe_block_q8_grouped`: expert-major prefill, with one int8 GEMM per expert;
  * `launch_moe_block_q8_expert_rows`: expert-major prefill on the decode kernels
    (matvec.group_kernel), every token's bits those of `launch_moe_block_q8`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, int32, uint8

from ..graph import Branches, Chain
from ..jit import kernel
from ..quant.types import QType, row_bytes
from . import norm
from . import matvec
from .activation import launch_swiglu, launch_swiglu_q8
from .dequant import LAYOUTS, layout, weight_views
from .matmul import launch_matmul
from ..ptx import warp_argmax, warp_max, warp_sum, warp_sync
from .matvec import THREADS, WARPS_PER_BLOCK, launch_matvec

# Router block: up to ROUTER_THREADS_MAX threads (a power of two, block_sum's requirement);
# 128 threads scan 512 experts (Qwen3-Next / Qwen3.5-MoE) in 4 steps per round.
ROUTER_THREADS_MAX = 128
# Probabilities of one token live in shared memory during the k selection rounds.
ROUTER_E_MAX = 1024
# CUDA's limit on grid y / z: the launchers split T and k beyond it.
GRID_YZ_MAX = 65535

# norm.py's block reduction (its fixed tree order); inlined there, so compile_ptx needs no GPU
block_sum = norm.block_sum


def _router_threads(E: int) -> int:
    return norm.pow2_block(E, ROUTER_THREADS_MAX)


# ------------------------------------------------------------------ router


@cuda.jit(device=True, inline="always")
def _block_max(scratch, value):
    """Max of `value` over the block (blockDim.x a power of two), returned to every thread."""
    tid = cuda.threadIdx.x
    scratch[tid] = value
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            scratch[tid] = max(scratch[tid], scratch[tid + s])
        cuda.syncthreads()
        s //= 2
    total = scratch[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True, inline="always")
def _block_argmax(vals, idxs, v, i):
    """(value, index) of the block's largest `v`, ties to the smaller index; every thread gets
    it. A thread with nothing to offer passes v = -1 (probabilities are >= 0)."""
    tid = cuda.threadIdx.x
    vals[tid] = v
    idxs[tid] = i
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            ov, oi = vals[tid + s], idxs[tid + s]
            if ov > vals[tid] or (ov == vals[tid] and oi < idxs[tid]):
                vals[tid] = ov
                idxs[tid] = oi
        cuda.syncthreads()
        s //= 2
    bv, bi = vals[0], idxs[0]
    cuda.syncthreads()
    return bv, bi


@kernel
def moe_route(logits, norm_topk, ids, wts):
    """logits [T, E] -> ids int32[T, k], wts float32[T, k]: softmax, top-k (ties to the lower
    id), optionally renormalised. One block per token; k = ids.shape[1]."""
    probs = cuda.shared.array(ROUTER_E_MAX, float32)
    scratch = cuda.shared.array(ROUTER_THREADS_MAX, float32)
    sidx = cuda.shared.array(ROUTER_THREADS_MAX, int32)
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    E = logits.shape[1]
    top_k = ids.shape[1]

    m = logits[t, 0]                           # (float32, as every value below)
    for e in range(tid, E, nthr):
        m = max(m, logits[t, e])
    m = _block_max(scratch, m)
    part = float32(0.0)
    for e in range(tid, E, nthr):
        p = math.exp(logits[t, e] - m)
        probs[e] = p
        part += p
    total = block_sum(scratch, part)
    for e in range(tid, E, nthr):
        probs[e] = probs[e] / total
    cuda.syncthreads()

    wsum = float32(0.0)
    for r in range(top_k):
        bv = float32(-1.0)
        bi = int32(E)
        for e in range(tid, E, nthr):          # ascending e: strict > keeps the lower id
            if probs[e] > bv:
                bv = probs[e]
                bi = int32(e)
        bv, bi = _block_argmax(scratch, sidx, bv, bi)
        if tid == 0:
            ids[t, r] = bi
            wts[t, r] = bv
            probs[bi] = float32(-1.0)          # taken
        wsum += bv
        cuda.syncthreads()
    if norm_topk and tid == 0:
        for r in range(top_k):
            wts[t, r] = wts[t, r] / wsum


# One warp a token (`moe_route_warp`): moe_route's values with no block barriers. moe_route's
# block of B = _router_threads(E) threads spends ~10 barriers a top-k round (k = 8: ~80 a
# token), and it sits on the MoE block's critical path (router -> route -> gate -> swiglu ->
# down -> combine). Lane l plays moe_route's threads l, l + 32, .. < B: it sums their
# exp(l - max) terms in their order, each virtual warp's partials go through warp_sum (the
# virtual warp's own tree), and their totals through warp_sum again with zeros past the
# B / 32 of them -- block_sum's two stages, so the same total and the same probabilities. The
# maximum and each round's arg-max (largest probability, ties to the lower id) are exact in
# any order. Built in session 47, when no device was lent: off until run_bench --launch
# route-warp shows it pays on the 35B-A3B shape.
ROUTE_WARP = False
ROUTE_WARP_TOKENS = 4           # tokens (warps) a block
_VW_MAX = ROUTER_THREADS_MAX // 32      # moe_route's warps, played by one lane each
_ROUTE_PROBS = ROUTE_WARP_TOKENS * ROUTER_E_MAX     # (a compile-time size for numba)


@kernel
def moe_route_warp(logits, norm_topk, ids, wts):
    """moe_route's ids and weights, bit for bit, one warp a token (ROUTE_WARP above)."""
    probs_all = cuda.shared.array(_ROUTE_PROBS, float32)
    parts = cuda.local.array(_VW_MAX, float32)
    lane = cuda.threadIdx.x & 31
    w = cuda.threadIdx.x >> 5
    t = cuda.blockIdx.x * (cuda.blockDim.x >> 5) + w
    T, E = logits.shape
    if t >= T:                                  # (warp-uniform: the warp leaves whole)
        return
    top_k = ids.shape[1]
    B = 32                                      # moe_route's block (norm.pow2_block)
    while B < E and B < ROUTER_THREADS_MAX:
        B *= 2
    VW = B >> 5
    probs = probs_all[w * ROUTER_E_MAX:(w + 1) * ROUTER_E_MAX]

    m = logits[t, 0]
    for e in range(lane, E, 32):
        m = max(m, logits[t, e])
    m = warp_max(m)
    for v in range(_VW_MAX):
        parts[v] = float32(0.0)
    for v in range(VW):                         # virtual thread lane + 32 v: e = it, + B, ..
        part = float32(0.0)
        for e in range(lane + 32 * v, E, B):
            p = math.exp(logits[t, e] - m)
            probs[e] = p
            part += p
        parts[v] = warp_sum(part)               # virtual warp v's total
    mine = float32(0.0)
    for v in range(VW):
        if lane == v:
            mine = parts[v]
    total = warp_sum(mine)                      # block_sum's second stage
    for e in range(lane, E, 32):                # (a lane's own e: no sync needed)
        probs[e] = probs[e] / total

    wsum = float32(0.0)
    for r in range(top_k):
        bv = float32(-1.0)
        bi = int32(E)
        for e in range(lane, E, 32):            # ascending e: strict > keeps the lower id
            if probs[e] > bv:
                bv = probs[e]
                bi = int32(e)
        bv, bi = warp_argmax(bv, bi)            # (every lane's scan is done after it)
        if lane == 0:
            ids[t, r] = bi
            wts[t, r] = bv
            probs[bi] = float32(-1.0)           # taken
        wsum += bv
        warp_sync()                             # the mask, before the next round's scan
    if norm_topk and lane == 0:
        for r in range(top_k):
            wts[t, r] = wts[t, r] / wsum


# ------------------------------------------------------------------ expert matvecs


def _make_expert_matvec(lay):
    qk, ts, gpb, group_dot = lay.block, lay.type_size, lay.groups, lay.group_dot

    def expert_matvec(w8, w16, wh, M, K, ids, x, y):
        """y[t, r, m] = W[ids[t, r], m, :] . x[t, :]; grid (ceil(M / 4), k, T)."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + (tid >> 5)
        r = cuda.blockIdx.y
        t = cuda.blockIdx.z
        acc = np.float32(0.0)
        if row < M:
            e = ids[t, r]
            nblk = K // qk
            row_off = (np.int64(e) * M + row) * (nblk * ts)
            xt = x[t]
            for g in range(lane, nblk * gpb, 32):
                b = g // gpb
                acc += group_dot(w8, w16, wh, row_off + b * ts, g - b * gpb, xt, b * qk)
        total = warp_sum(acc)       # the whole warp shares `row`, so all 32 lanes take part
        if row < M and lane == 0:
            y[t, r, row] = total

    expert_matvec.__name__ = expert_matvec.__qualname__ = f"expert_matvec_{lay.name}"
    return kernel(expert_matvec)


@cuda.jit(device=True, inline="always")
def _finish_row(out, t, m, shared_y, shared_gate, shared_mode, residual, has_residual, y):
    """y[t, m] = (out + gate * shared_y[t, m]) + residual[t, m]: the combine's last steps
    (shared_mode 0: no shared expert, 1: gate 1, 2: sigmoid(shared_gate[t]))."""
    if shared_mode == 1:
        out += shared_y[t, m]
    elif shared_mode == 2:
        gate = np.float32(1.0) / (np.float32(1.0) + math.exp(-shared_gate[t]))
        out += gate * shared_y[t, m]
    if has_residual:
        out += residual[t, m]
    y[t, m] = out


def _make_moe_down(lay):
    qk, ts, gpb, group_dot = lay.block, lay.type_size, lay.groups, lay.group_dot

    def moe_down(w8, w16, wh, M, K, ids, wts, act, shared_y, shared_gate, shared_mode,
                 residual, has_residual, y):
        """y[t, m] = sum_r wts[t, r] * (W[ids[t, r], m, :] . act[t, r, :]), r = 0..k-1 in order,
        then + gate * shared_y[t, m] (shared_mode 1: gate 1, 2: sigmoid(shared_gate[t])), then
        + residual[t, m]. Grid (ceil(M / 4), 1, T)."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        row = cuda.blockIdx.x * WARPS_PER_BLOCK + (tid >> 5)
        t = cuda.blockIdx.z
        nblk = K // qk
        out = np.float32(0.0)
        for r in range(ids.shape[1]):
            acc = np.float32(0.0)
            if row < M:
                row_off = (np.int64(ids[t, r]) * M + row) * (nblk * ts)
                xr = act[t, r]
                for g in range(lane, nblk * gpb, 32):
                    b = g // gpb
                    acc += group_dot(w8, w16, wh, row_off + b * ts, g - b * gpb, xr, b * qk)
            total = warp_sum(acc)
            out += wts[t, r] * total
        if row < M and lane == 0:
            _finish_row(out, t, row, shared_y, shared_gate, shared_mode, residual, has_residual, y)

    moe_down.__name__ = moe_down.__qualname__ = f"moe_down_{lay.name}"
    return kernel(moe_down)


# kernel objects by weight type; also module attributes expert_matvec_<type> / moe_down_<type>
EXPERT_MATVEC = {qt: _make_expert_matvec(lay) for qt, lay in LAYOUTS.items()}
MOE_DOWN = {qt: _make_moe_down(lay) for qt, lay in LAYOUTS.items()}
for _qt, _k in EXPERT_MATVEC.items():
    globals()[f"expert_matvec_{LAYOUTS[_qt].name}"] = _k
for _qt, _k in MOE_DOWN.items():
    globals()[f"moe_down_{LAYOUTS[_qt].name}"] = _k
del _qt, _k

_W = "uint8[::1], uint16[::1], float16[::1]"
_A2 = "float32[:, ::1]"
_A3 = "float32[:, :, ::1]"
_I2 = "int32[:, ::1]"
PTX_SIGNATURES = {
    "moe_route": [f"void({_A2}, int32, {_I2}, {_A2})"],
    "moe_route_warp": [f"void({_A2}, int32, {_I2}, {_A2})"],
    **{f"expert_matvec_{LAYOUTS[qt].name}": [f"void({_W}, int32, int32, {_I2}, {_A2}, {_A3})"]
       for qt in EXPERT_MATVEC},
    **{f"moe_down_{LAYOUTS[qt].name}": [
        f"void({_W}, int32, int32, {_I2}, {_A2}, {_A3}, {_A2}, float32[::1], int32, {_A2}, "
        f"int32, {_A2})"] for qt in MOE_DOWN},
}


# ------------------------------------------------------------------ launchers


def _check_stack(w_dev, qtype, n_experts, M, K, ids, what):
    if ids.dtype != np.int32 or len(ids.shape) != 2:
        raise ValueError(f"{what}: expert ids must be int32[T, k], got {ids.dtype}{tuple(ids.shape)}")
    lay = layout(qtype)
    need = n_experts * M * row_bytes(lay.qtype, K)
    have = w_dev.size * w_dev.dtype.itemsize
    if have != need:
        raise ValueError(f"{what}: {n_experts} experts of {M} x {K} {lay.qtype.name} rows are "
                         f"{need} bytes; the device buffer holds {have}")
    return lay


def _token_chunks(T):
    for t0 in range(0, T, GRID_YZ_MAX):
        yield t0, min(T, t0 + GRID_YZ_MAX)


def launch_moe_route(logits, norm_topk_prob: bool, ids, weights, stream=0):
    """Router: logits float32[T, E] -> ids int32[T, k] (best first), weights float32[T, k]
    (softmax probabilities of the chosen experts, divided by their sum if `norm_topk_prob`).
    Reference: `route(x, router_w, k, norm_topk_prob)` given `logits = linear(x, router_w)`."""
    T, E = logits.shape
    k = ids.shape[1]
    if ids.dtype != np.int32 or weights.dtype != np.float32 or logits.dtype != np.float32:
        raise ValueError("moe_route: logits and weights are float32, ids int32")
    if E > ROUTER_E_MAX:
        raise ValueError(f"moe_route: {E} experts exceed ROUTER_E_MAX = {ROUTER_E_MAX}")
    if not 0 < k <= E or tuple(ids.shape) != (T, k) or tuple(weights.shape) != (T, k):
        raise ValueError(f"moe_route: ids and weights must be [{T}, k] with 0 < k <= {E}")
    if T and ROUTE_WARP:
        nw = min(T, ROUTE_WARP_TOKENS)
        moe_route_warp[(T + nw - 1) // nw, 32 * nw, stream](
            logits, np.int32(bool(norm_topk_prob)), ids, weights)
    elif T:
        moe_route[T, _router_threads(E), stream](logits, np.int32(bool(norm_topk_prob)), ids, weights)


def launch_expert_matvec(w_dev, qtype, n_experts, M, K, ids, x, y, stream=0):
    """y[t, r] = W[ids[t, r]] @ x[t] for the stacked expert weight `W[E, M, K]` (GGUF rows,
    `E * M * row_bytes(qtype, K)` bytes); ids int32[T, k] on the device; x float32[T, K];
    y float32[T, k, M]. Reference: `matvec_reference` on each expert's slice."""
    lay = _check_stack(w_dev, qtype, n_experts, M, K, ids, "expert_matvec")
    T, k = ids.shape
    if tuple(x.shape) != (T, K) or tuple(y.shape) != (T, k, M):
        raise ValueError(f"expert_matvec: x must be [{T}, {K}] and y [{T}, {k}, {M}]")
    w8, w16, wh = weight_views(w_dev)
    for t0, t1 in _token_chunks(T):
        EXPERT_MATVEC[lay.qtype][((M + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK, k, t1 - t0),
                                 THREADS, stream](
            w8, w16, wh, np.int32(M), np.int32(K), ids[t0:t1], x[t0:t1], y[t0:t1])


def launch_moe_down(w_dev, qtype, n_experts, M, K, ids, weights, act, y, shared_y=None,
                    shared_gate=None, residual=None, stream=0):
    """y[t] = sum_r weights[t, r] * W[ids[t, r]] @ act[t, r]  (r = 0..k-1 in order)
              + sigmoid(shared_gate[t]) * shared_y[t]   (shared_gate None: + shared_y[t])
              + residual[t]
    for the stacked down weight `W[E, M, K]` (M = hidden, K = expert ffn); act float32[T, k, K];
    y, shared_y, residual float32[T, M] (residual may be y); shared_gate float32[T] (the
    shared-expert gate logit). Reference: the combine loop of `moe_forward`."""
    lay = _check_stack(w_dev, qtype, n_experts, M, K, ids, "moe_down")
    T, k = ids.shape
    if tuple(act.shape) != (T, k, K) or tuple(y.shape) != (T, M) or tuple(weights.shape) != (T, k):
        raise ValueError(f"moe_down: act must be [{T}, {k}], weights [{T}, {k}], y [{T}, {M}]")
    for name, a in (("shared_y", shared_y), ("residual", residual)):
        if a is not None and tuple(a.shape) != (T, M):
            raise ValueError(f"moe_down: {name} must be [{T}, {M}]")
    if shared_gate is not None and (shared_y is None or shared_gate.size != T):
        raise ValueError(f"moe_down: shared_gate needs shared_y and T = {T} values")
    mode = 0 if shared_y is None else (1 if shared_gate is None else 2)
    w8, w16, wh = weight_views(w_dev)
    sy = y if shared_y is None else shared_y
    sg = weights.reshape(weights.size) if shared_gate is None else shared_gate.reshape(T)
    res = y if residual is None else residual
    for t0, t1 in _token_chunks(T):
        MOE_DOWN[lay.qtype][((M + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK, 1, t1 - t0),
                            THREADS, stream](
            w8, w16, wh, np.int32(M), np.int32(K), ids[t0:t1], weights[t0:t1], act[t0:t1],
            sy[t0:t1], sg[t0:t1] if mode == 2 else sg, np.int32(mode), res[t0:t1],
            np.int32(residual is not None), y[t0:t1])


# ------------------------------------------------------------------ the whole block


@dataclass
class ExpertWeights:
    """Device buffers of one MoE layer (GGUF rows, each with its type). `router` is
    ffn_gate_inp [E, H]; `gate`, `up` ffn_{gate,up}_exps [E, I, H]; `down` ffn_down_exps
    [E, H, I]; the shared expert's `sh_gate`, `sh_up` [Is, H], `sh_down` [H, Is] and
    `sh_gate_inp` ffn_gate_inp_shexp [1, H] are None where the family has none."""
    n_experts: int
    top_k: int
    hidden: int
    ffn: int
    norm_topk_prob: bool
    router: object
    router_type: object
    gate: object
    gate_type: object
    up: object
    up_type: object
    down: object
    down_type: object
    shared_ffn: int = 0
    sh_gate: object = None
    sh_gate_type: object = None
    sh_up: object = None
    sh_up_type: object = None
    sh_down: object = None
    sh_down_type: object = None
    sh_gate_inp: object = None
    sh_gate_inp_type: object = None


class MoEScratch:
    """Every intermediate buffer of `launch_moe_block` for T tokens, allocated once (before
    any graph capture): router logits, expert ids and weights, the k experts' gate / up /
    activation rows, and the shared expert's. `branches` is the int8 blocks' side-stream
    switch (MoEScratchQ8); the float block has none and ignores it, so every kind of scratch
    is built alike (Engine._scratch)."""

    def __init__(self, T: int, w: ExpertWeights, branches: bool | None = None):
        f32 = np.float32
        self.T = T
        self.logits = cuda.device_array((T, w.n_experts), f32)
        self.ids = cuda.device_array((T, w.top_k), np.int32)
        self.weights = cuda.device_array((T, w.top_k), f32)
        self.gate = cuda.device_array((T, w.top_k, w.ffn), f32)
        self.up = cuda.device_array((T, w.top_k, w.ffn), f32)
        self.act = cuda.device_array((T, w.top_k, w.ffn), f32)
        has_shared = w.sh_down is not None
        self.sh_gate = cuda.device_array((T, w.shared_ffn), f32) if has_shared else None
        self.sh_up = cuda.device_array((T, w.shared_ffn), f32) if has_shared else None
        self.sh_act = cuda.device_array((T, w.shared_ffn), f32) if has_shared else None
        self.sh_y = cuda.device_array((T, w.hidden), f32) if has_shared else None
        self.sh_logit = cuda.device_array((T, 1), f32) if w.sh_gate_inp is not None else None


def _linear(w_dev, qtype, M, K, x, y, stream):
    """y[T, M] = x[T, K] @ W^T: the decode matvec for T = 1, the prefill matmul otherwise."""
    if x.shape[0] == 1:
        launch_matvec(w_dev, qtype, M, K, x.reshape(K), y.reshape(M), stream=stream)
    else:
        launch_matmul(w_dev, qtype, M, K, x, y, stream=stream)


def launch_moe_block(x, w: ExpertWeights, s: MoEScratch, y, residual=None, stream=0):
    """One sparse MoE block for x float32[T, H] -> y float32[T, H] (+ residual, may be y):
    route, k experts, rank-ordered combine, gated shared expert. A fixed sequence of fixed-grid
    launches for a given T (graph-capturable). Reference: `moe_forward(x, router_w, experts,
    top_k, norm_topk_prob, shared, shared_gate_w)` with dequantized weights."""
    T, H = x.shape
    if T != s.T or H != w.hidden:
        raise ValueError(f"moe_block: x is [{T}, {H}], scratch was made for T = {s.T} and the "
                         f"weights for H = {w.hidden}")
    _linear(w.router, w.router_type, w.n_experts, H, x, s.logits, stream)
    launch_moe_route(s.logits, w.norm_topk_prob, s.ids, s.weights, stream)
    launch_expert_matvec(w.gate, w.gate_type, w.n_experts, w.ffn, H, s.ids, x, s.gate, stream)
    launch_expert_matvec(w.up, w.up_type, w.n_experts, w.ffn, H, s.ids, x, s.up, stream)
    launch_swiglu(s.gate, s.up, s.act, stream)
    shared_y = shared_gate = None
    if w.sh_down is not None:
        Is = w.shared_ffn
        _linear(w.sh_gate, w.sh_gate_type, Is, H, x, s.sh_gate, stream)
        _linear(w.sh_up, w.sh_up_type, Is, H, x, s.sh_up, stream)
        launch_swiglu(s.sh_gate, s.sh_up, s.sh_act, stream)
        _linear(w.sh_down, w.sh_down_type, H, Is, s.sh_act, s.sh_y, stream)
        shared_y = s.sh_y
        if w.sh_gate_inp is not None:
            _linear(w.sh_gate_inp, w.sh_gate_inp_type, 1, H, x, s.sh_logit, stream)
            shared_gate = s.sh_logit
    launch_moe_down(w.down, w.down_type, w.n_experts, H, w.ffn, s.ids, s.weights, s.act, y,
                    shared_y=shared_y, shared_gate=shared_gate, residual=residual, stream=stream)


# ------------------------------------------------------------------ the int8 block (dp4a)
#
# The block above reads float activations with the float matvec (decode) or matmul (prefill):
# correct, and the reference-exact path for every weight type, but its expert kernels are the
# first-generation warp-per-row loop (~140 GB/s on the H200 at the 35B-A3B shape, session 10),
# and a prefill row does not get the bits its decode step would (the matmul sums in another
# order than the matvec, and a router logit that moves by one ulp can swap an expert).
#
# `launch_moe_block_q8` is the engine's path when every expert matrix has a dp4a type: the
# normed input arrives as int8 + scales (quantize_act.py, written by the norm itself), and
# every matvec of the block -- router, k gate / up / down projections, the shared expert --
# runs on matvec.py's `token_kernel` of the decode path of its type (Q4_K: the 16-byte-load
# kernel, Q6_K: Q6_K_R when the engine made that copy, the other integer types: the generic
# dp4a path; a float router: the float path), one token per grid z. A token's every value is
# then what its decode step computes, bit for bit, whatever T is: prefill, speculative
# verify and decode agree by construction. The down projections write y_e[t, r, :] and
# `moe_combine` adds them in rank order (acc = 0; acc += wts_r y_e[t, r, m], r = 0..k-1),
# then the gated shared expert and the residual, as moe_down does.
# Prefill still reads each token's experts for that token (as the float block does);
# expert-major batching is the planned prefill path.


@kernel
def moe_combine(yd, wts, shared_y, shared_gate, shared_mode, residual, has_residual, y):
    """y[t, m] = sum_r wts[t, r] * yd[t, r, m] (r = 0..k-1 in order), then + gate *
    shared_y[t, m] (shared_mode 1: gate 1, 2: sigmoid(shared_gate[t])), then + residual[t, m].
    Grid (ceil(H / THREADS), T)."""
    m = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.y
    if m >= y.shape[1]:
        return
    out = np.float32(0.0)
    for r in range(wts.shape[1]):
        out += wts[t, r] * yd[t, r, m]
    _finish_row(out, t, m, shared_y, shared_gate, shared_mode, residual, has_residual, y)


PTX_SIGNATURES["moe_combine"] = [f"void({_A3}, {_A2}, {_A2}, float32[::1], int32, {_A2}, int32, "
                                 f"{_A2})"]


@dataclass
class TokenMatrix:
    """One matrix (or stack of E expert matrices, `rows` rows each) as `matvec.token_kernel`
    reads it: the decode path's kernels (parts -> kernel), its weight tuple, and which form of
    the activations it takes (`x_args`)."""
    path: object         # the matvec.RowPath of its type
    w: tuple
    x_kind: str          # "q8" (xq as int32 words, xd), "q8u" (uint32 words, xd), "q8uu"
                         # (both as uint32 words), "f32v4" (x as uint32 words), "f" (float x)
    rows: int
    cols: int
    parts: int

    def _fitted(self, parts):
        """(the path with its unroll fitted to a row, the lanes a row takes)."""
        return (matvec.fit_unroll(self.path, self.cols, parts),
                matvec.lanes_per_row(self.path, self.cols, parts))

    def kernels(self, parts):
        """`matvec.token_kernel` of the path (one token per grid z), on part of a warp a row
        where the row is short (`matvec.lanes_per_row`)."""
        p, lanes = self._fitted(parts)
        return matvec.token_kernels(p, lanes)(parts)

    def group_kernels(self, parts):
        """`matvec.group_kernel` of the path (expert-major groups of rows), likewise."""
        p, lanes = self._fitted(parts)
        return matvec.group_kernels(p, lanes)(parts)

    def tile_kernels(self, parts, nr):
        """`matvec.tile_kernel` of the path for tiles of nr tokens (whole-warp rows: a short
        row's sub-warp tree gives the same bits, `matvec.lanes_per_row`)."""
        return matvec.tile_kernels(self._fitted(parts)[0], nr)(parts)

    def blocks(self, nrows):
        """Grid x of a token / group kernel over nrows matrix rows."""
        return matvec.blocks_for(nrows, self._fitted(self.parts)[1], self.parts)

    def x_args(self, xq=None, xd=None, x=None):
        """The kernel's activation tuple from int8 xq + scales xd (flat) or float x."""
        if self.x_kind == "f32v4":
            return (_flat1(x).view(np.uint32),)
        if self.x_kind == "f":
            return (_flat1(x),)
        words = _flat1(xq).view(np.int32 if self.x_kind == "q8" else np.uint32)
        return words, (_flat1(xd).view(np.uint32) if self.x_kind == "q8uu" else _flat1(xd))


def _flat1(a):
    return a if a.ndim == 1 else a.reshape(a.size)


def token_matrix(buf, qtype, rows: int, cols: int, q6k_r=None, k: int = 1) -> TokenMatrix:
    """The TokenMatrix of a weight: GGUF rows in `buf` (a matrix, or a stack of experts of
    `rows` rows each, read k at a time), or for Q6_K the Q6_K_R copy `q6k_r` = (body, d) when
    given. Float types take float activations (the router, the shared-expert gate); integer
    types int8 ones. The warps per row are matvec.warps_per_row's for the k * rows rows a
    token's launch computes: fixed here, so that a token's sums never depend on T."""
    from . import matvec_q4k, matvec_q6k, matvec_qx0
    lay = layout(qtype)
    qt = lay.qtype
    if q6k_r is not None:
        body, d = q6k_r
        path, w, kind = matvec_q6k.PATH, (_flat1(body).view(np.uint32), _flat1(d)), "q8uu"
    else:
        w8, w16, wh = weight_views(buf)
        if qt == QType.Q4_K:
            path, w, kind = matvec_q4k.PATH, (w8.view(np.uint32),), "q8u"
        elif cols % 32 == 0 and matvec_qx0.serves(qt, w8):
            path, w, kind = matvec_qx0.PATHS[qt], matvec_qx0.weight_args(w8, w16, wh), "q8u"
        elif qt in matvec.PATHS_Q8 and cols % 32 == 0:
            path, w, kind = matvec.PATHS_Q8[qt], (w8, w16, wh), "q8"
        elif qt == QType.F32 and cols % 4 == 0:
            path, w, kind = matvec.F32_V4, (w8.view(np.uint32),), "f32v4"
        else:
            path, w, kind = matvec.PATHS[qt], (w8, w16, wh), "f"
    return TokenMatrix(path, w, kind, rows, cols, token_parts(path, k * rows, cols))


# A token matrix's row is split over more warps (matvec.warps_per_row) only while each lane of
# each warp keeps at least TOKEN_MIN_UNITS units of it. warps_per_row counts 4-value groups; a
# Q4_K unit is 32 values, so the 35B-A3B's shared expert (512 x 2048 Q4_K: 64 units) took 4
# warps a row of which two held no unit, and the prefill's group kernel walked its 128 tokens
# a row at a time on them (its batches need one warp a row). Read when a matrix is built.
# 1 keeps every token matrix's bits (a split past the last unit only adds warps of +0.0);
# 2 puts the shared expert's gate and up on one warp a row, a new summation order for them
# (decode, verify and prefill all read it from here, so they still agree).
TOKEN_MIN_UNITS = 2


def token_parts(path, M: int, K: int) -> int:
    """Warps a row of a token matrix with M rows of K values takes under `path`:
    matvec.warps_per_row(M, K), halved while a lane would keep fewer than TOKEN_MIN_UNITS of
    the row's units."""
    parts = matvec.warps_per_row(M, K)
    if path.units_host is not None:
        n = path.units_host(K)
        while parts > 1 and n < 32 * parts * TOKEN_MIN_UNITS:
            parts //= 2
    return parts


def launch_token_matvec(tm: TokenMatrix, ids, use_ids: bool, k: int, x_args, x_per_expert: bool,
                        y, T: int, stream=0):
    """y[t, r, :] = W[e] @ x_t(r) for T tokens and r < k (matvec.token_kernel): e = ids[t, r]
    (use_ids) or r; x_t(r) = activation row t k + r (x_per_expert) or t of x_args."""
    if T > GRID_YZ_MAX:
        raise ValueError(f"token_matvec: {T} tokens exceed the grid's {GRID_YZ_MAX}; "
                         "split the prefill into smaller chunks")
    if y.size < T * k * tm.rows:
        raise ValueError(f"token_matvec: y holds {y.size} values, not T x k x M = "
                         f"{T} x {k} x {tm.rows}")
    grid = (tm.blocks(k * tm.rows), 1, T)
    tm.kernels(tm.parts)[grid, THREADS, stream](
        tm.w, ids, np.int32(bool(use_ids)), np.int32(k), np.int32(tm.rows), np.int32(tm.cols),
        x_args, np.int32(bool(x_per_expert)), _flat1(y), np.int32(tm.parts))


@dataclass
class ExpertMatricesQ8:
    """The TokenMatrix of every matrix of one MoE layer (`expert_matrices_q8`)."""
    router: TokenMatrix
    gate: TokenMatrix
    up: TokenMatrix
    down: TokenMatrix
    sh_gate: TokenMatrix | None = None
    sh_up: TokenMatrix | None = None
    sh_down: TokenMatrix | None = None
    sh_gate_inp: TokenMatrix | None = None


def int8_experts(w: ExpertWeights) -> bool:
    """Whether `launch_moe_block_q8` can run this layer: every expert and shared-expert matrix
    of a dp4a type, with K and the expert FFN whole 32-blocks."""
    types = [w.gate_type, w.up_type, w.down_type] + (
        [w.sh_gate_type, w.sh_up_type, w.sh_down_type] if w.sh_down is not None else [])
    return (all(layout(t).qtype in matvec.PATHS_Q8 for t in types)
            and w.hidden % 32 == 0 and w.ffn % 32 == 0 and w.shared_ffn % 32 == 0)


def expert_matrices_q8(w: ExpertWeights, q6k_r=None) -> ExpertMatricesQ8:
    """TokenMatrices of a layer (`int8_experts(w)` must hold); q6k_r: name -> (body, d) Q6_K_R
    copies of its Q6_K matrices ("gate", "up", "down", "sh_gate", "sh_up", "sh_down")."""
    q6 = q6k_r or {}
    E, H, F = w.n_experts, w.hidden, w.ffn
    m = ExpertMatricesQ8(
        router=token_matrix(w.router, w.router_type, E, H),
        gate=token_matrix(w.gate, w.gate_type, F, H, q6.get("gate"), w.top_k),
        up=token_matrix(w.up, w.up_type, F, H, q6.get("up"), w.top_k),
        down=token_matrix(w.down, w.down_type, H, F, q6.get("down"), w.top_k))
    if w.sh_down is not None:
        Is = w.shared_ffn
        m.sh_gate = token_matrix(w.sh_gate, w.sh_gate_type, Is, H, q6.get("sh_gate"))
        m.sh_up = token_matrix(w.sh_up, w.sh_up_type, Is, H, q6.get("sh_up"))
        m.sh_down = token_matrix(w.sh_down, w.sh_down_type, H, Is, q6.get("sh_down"))
        if w.sh_gate_inp is not None:
            m.sh_gate_inp = token_matrix(w.sh_gate_inp, w.sh_gate_inp_type, 1, H)
    return m


class MoEScratchQ8(MoEScratch):
    """MoEScratch plus the int8 block's buffers: the experts' int8 activations and scales,
    their down projections before the combine, the shared expert's int8 activations, and the
    block's side streams (`branches`: None = the module's BRANCHES)."""

    def __init__(self, T: int, w: ExpertWeights, branches: bool | None = None):
        super().__init__(T, w)
        k, F, Is = w.top_k, w.ffn, w.shared_ffn
        self.act_q = cuda.device_array(T * k * F, np.int8)
        self.act_d = cuda.device_array(T * k * F // 32, np.float32)
        self.yd = cuda.device_array((T, k, w.hidden), np.float32)
        has_shared = w.sh_down is not None
        self.sh_q = cuda.device_array(T * Is, np.int8) if has_shared else None
        self.sh_d = cuda.device_array(T * Is // 32, np.float32) if has_shared else None
        # side streams of the int8 blocks (BRANCHES): 0 the shared expert, 1 the routed up
        # projection, 2 the shared up projection and gate logit
        on = BRANCHES if branches is None else branches
        self.branches = Branches(3) if on else Chain()


# The int8 blocks' independent launches on side streams (graph.Branches), the default: the
# shared expert reads only x, so it runs beside the routing and the routed experts, and each
# up projection beside its gate. At T = 1 the block is a chain of about 12 small kernels, each
# paying its drain before the next may start; with branches the longest chain is router,
# route, gate, swiglu, down, combine. Every kernel reads what it read in the chain, so the bits
# are the chain's. False: one chain on the caller's stream (Engine(moe_branches=False),
# bench/moe_bench.py --branches on,off).
BRANCHES = True


def launch_moe_combine(yd, weights, y, shared_y=None, shared_gate=None, residual=None, stream=0,
                       pos=None):
    """y = sum_r weights[:, r] * yd[:, r] (rank order) [+ sigmoid(shared_gate) * shared_y]
    [+ residual]; yd float32[T, k, H], y / shared_y / residual float32[T, H]. With `pos`
    (int32[T k], the expert-major prefill's sorted rows) token t's rank-r row is
    yd[pos[t k + r]] of yd float32[T k, H] instead (`moe_combine_sorted`)."""
    T, H = y.shape
    k = weights.shape[1]
    if tuple(weights.shape) != (T, k) or yd.size != T * k * H:
        raise ValueError(f"moe_combine: y [{T}, {H}] needs weights [{T}, k] and yd "
                         f"[{T}, k, {H}], got {tuple(weights.shape)} and {tuple(yd.shape)}")
    mode = 0 if shared_y is None else (1 if shared_gate is None else 2)
    sg = weights.reshape(weights.size) if shared_gate is None else shared_gate.reshape(T)
    rest = (weights, y if shared_y is None else shared_y, sg, np.int32(mode),
            y if residual is None else residual, np.int32(residual is not None), y)
    grid = ((H + THREADS - 1) // THREADS, T)
    if pos is None:
        moe_combine[grid, THREADS, stream](yd.reshape(T, k, H), *rest)
    else:
        moe_combine_sorted[grid, THREADS, stream](yd.reshape(T * k, H), pos, *rest)


# The router's logits for T >= ROUTER_TILE_MIN_T tokens (a prefill chunk) on
# `launch_token_tiles`: tiles of ROUTER_TILE_TOKENS tokens x ROUTER_TILE_ROWS experts a block,
# the token kernel's bits. Fewer tokens (decode, verify) keep the token kernel, whose many
# small blocks suit them. On the token kernel the 35B-A3B's router took 68.2 us of a T = 128
# chunk (session 25, call 1): every (expert, token) block read the token's 8 KB of x again.
# Tiles of 8 x 8 took 45.4 us, 8 x 4 44.4, 8 x 16 62.5, 9 x 32 128.0, 4 x 8 35.5 (call 2).
ROUTER_TILES = True
ROUTER_TILE_MIN_T = 16
ROUTER_TILE_TOKENS = 4
ROUTER_TILE_ROWS = 8


def launch_token_tiles(tm: TokenMatrix, x_args, y, T: int, stream=0, nr=None, rows=None,
                       bias=None, residual=None):
    """y[t, :] = W @ x_t (+ bias) (+ residual[t, :]) for T tokens of one ordinary matrix
    (`launch_token_matvec` with use_ids off and k = 1, bit for bit; with bias / residual the
    decode matvec's `store_row`) on `matvec.tile_kernel`: nr tokens (default
    ROUTER_TILE_TOKENS) x `rows` matrix rows (ROUTER_TILE_ROWS) a block."""
    nr = nr or ROUTER_TILE_TOKENS
    rows = rows or ROUTER_TILE_ROWS
    y = _flat1(y)
    for name, a, n in (("y", y, T * tm.rows), ("bias", bias, tm.rows),
                       ("residual", residual, T * tm.rows)):
        if a is not None and a.size < n:
            raise ValueError(f"token_tiles: {name} holds {a.size} values, not {n} "
                             f"(T = {T}, M = {tm.rows})")
    grid = ((tm.rows + rows - 1) // rows, (T + nr - 1) // nr)
    tm.tile_kernels(tm.parts, nr)[grid, THREADS, stream](
        tm.w, np.int32(tm.rows), np.int32(tm.cols), x_args, y,
        y if bias is None else bias, y if residual is None else _flat1(residual),
        np.int32(bias is not None), np.int32(residual is not None), np.int32(T),
        np.int32(tm.parts), np.int32(rows))


def router_logits(q, s, xi, T, stream):
    """The router's logits of T tokens into s.logits (float or int8 input by the router's
    type: xi = dict(xq, xd, x)): the token kernel, or its tiles from ROUTER_TILE_MIN_T tokens."""
    xa = q.router.x_args(**xi)
    if ROUTER_TILES and T >= ROUTER_TILE_MIN_T:
        launch_token_tiles(q.router, xa, s.logits, T, stream)
    else:
        launch_token_matvec(q.router, s.ids, False, 1, xa, False, s.logits, T, stream)


def _route_tokens(w, q, s, xi, T, stream):
    """Router logits (`router_logits`), then the top-k ids and weights into s.ids /
    s.weights."""
    router_logits(q, s, xi, T, stream)
    launch_moe_route(s.logits, w.norm_topk_prob, s.ids, s.weights, stream)


def _shared_gate_logit(q, s, xi, T, stream):
    """The shared expert's gate logit a token (s.sh_logit), or None when it has no gate."""
    if q.sh_gate_inp is None:
        return None
    launch_token_matvec(q.sh_gate_inp, s.ids, False, 1, q.sh_gate_inp.x_args(**xi), False,
                        s.sh_logit, T, stream)
    return s.sh_logit


def launch_moe_block_q8(x, xq, xd, w: ExpertWeights, q: ExpertMatricesQ8, s: MoEScratchQ8, y,
                        residual=None, stream=0):
    """`launch_moe_block` on int8 activations (the section comment above): x float32[T, H] the
    normed input (for a float router), xq / xd its int8 copy (quantize_act's flat [T * H] and
    [T * H / 32]). Every token's output is bit for bit what the block computes for it alone
    (T = 1). Reference: `moe_forward` with dequantized weights on the dequantized activations."""
    T, H = x.shape
    if T != s.T or H != w.hidden:
        raise ValueError(f"moe_block_q8: x is [{T}, {H}], scratch was made for T = {s.T} and "
                         f"the weights for H = {w.hidden}")
    k = w.top_k
    xi = dict(xq=xq, xd=xd, x=x)
    br = s.branches
    shared_y = shared_gate = None
    if q.sh_down is not None:

        def sh_matvec(tm, xa, out, on):
            launch_token_matvec(tm, s.ids, False, 1, xa, False, out, T, on)
        shared_y, shared_gate = _shared_expert(q, s, xi, T, br, br.fork(stream, 0), sh_matvec)
    _route_tokens(w, q, s, xi, T, stream)
    launch_token_matvec(q.up, s.ids, True, k, q.up.x_args(**xi), False, s.up, T,
                        br.fork(stream, 1))
    launch_token_matvec(q.gate, s.ids, True, k, q.gate.x_args(**xi), False, s.gate, T, stream)
    br.join(stream, 1)
    launch_swiglu_q8(s.gate, s.up, s.act, s.act_q, s.act_d, stream)
    launch_token_matvec(q.down, s.ids, True, k, q.down.x_args(s.act_q, s.act_d), True, s.yd, T,
                        stream)
    if q.sh_down is not None:
        br.join(stream, 0)
    launch_moe_combine(s.yd, s.weights, y, shared_y, shared_gate, residual, stream)


def _shared_expert(q, s: MoEScratchQ8, xi, T, br, side, matvec_on):
    """The shared expert's launches on stream `side` (its up projection and gate logit on
    side stream 2, joined back before its swiglu): s.sh_y and the gate logit (or None), both
    ready on `side`. matvec_on(tm, x_args, out, stream) runs one of its matrices over the T
    tokens (the token or the group kernel)."""
    up_side = br.fork(side, 2)
    matvec_on(q.sh_up, q.sh_up.x_args(**xi), s.sh_up, up_side)
    gate_logit = _shared_gate_logit(q, s, xi, T, up_side)
    matvec_on(q.sh_gate, q.sh_gate.x_args(**xi), s.sh_gate, side)
    br.join(side, 2)
    launch_swiglu_q8(s.sh_gate, s.sh_up, s.sh_act, s.sh_q, s.sh_d, side)
    matvec_on(q.sh_down, q.sh_down.x_args(s.sh_q, s.sh_d), s.sh_y, side)
    return s.sh_y, gate_logit


# ------------------------------------------------------------------ expert-major prefill
#
# `launch_moe_block_q8` reads each token's k experts for that token: a 512-token chunk of the
# 35B-A3B shape reads ~4 GB of expert weights a layer (617 ms for the 40 layers, session 10).
# `launch_moe_block_q8_grouped` is the expert-major alternative (the seed's CSR batching):
#   1. `moe_sort` (one block) lists the (token, rank) pairs of each expert
#      in ascending pair order -- group_off[e] .. group_off[e + 1] of the sorted rows -- and
#      writes each pair's sorted row (`pos`) and each sorted row's token (`src`);
#   2. `moe_gather` copies the tokens' int8 activations into that order;
#   3. matmul_q8.launch_matmul_q8_grouped runs gate and up, then (after swiglu_q8 on the sorted
#      rows) down as one int8 tensor-core GEMM per expert, each expert's weights read once for
#      all its rows;
#   4. `moe_combine_sorted` adds each token's k rows in rank order (pos), then the shared
#      expert (a dense GEMM over the chunk) and the residual, as moe_combine does.
# The sort is deterministic (no atomics), so the output is. The GEMM sums in matmul_q8's order,
# not the decode matvec's: like the rest of the GEMM prefill it agrees with decode up to
# rounding, not bit for bit (decision 0016); prefill_path="rows" keeps the token kernels.


_SORT_SLOTS = ROUTER_E_MAX + 1      # compile-time sizes of the shared arrays
# moe_sort's block: up to SORT_THREADS_MAX threads, a pair each in a round. Its form before
# session 25 gave each expert a thread that scanned every pair twice (once to count, once to
# place): 88.7 us of a T = 128 chunk's 172-us route + sort on the H200 (session 25, call 1).
SORT_THREADS_MAX = 1024
_SORT_WARPS = SORT_THREADS_MAX // 32
_SORT_HIST = _SORT_WARPS * ROUTER_E_MAX      # a round's pairs of each (warp, expert)


@kernel(max_registers=64)          # (1024 threads a block: 64 registers a thread at most)
def moe_sort(ids, top_k, n_experts, group_off, pos, src):
    """ids int32[T k] (pair p = t k + r: token t's rank-r expert) -> group_off uint32[E + 1]
    (E = n_experts), pos int32[T k] (pair p -> its sorted row), src int32[T k] (sorted row ->
    token). Expert e's rows are its pairs in ascending pair order, so the result is a function
    of ids alone. One block of NT >= E threads (a power of two, `launch_moe_sort`):
      1. count each expert's pairs (shared atomics: a count has no order);
      2. exclusive scan of the counts: group_off, and each expert's next free row;
      3. the pairs in rounds of NT, a thread each: a pair's row is its expert's next free row,
         plus the pairs of that expert in the round's earlier warps (a count per warp and
         expert), plus those in its own warp's earlier lanes (its warp's ids, staged in shared
         memory); then each expert's next free row moves past the round's pairs."""
    tid = cuda.threadIdx.x
    NT = cuda.blockDim.x
    lane = tid & 31
    wp = tid >> 5
    W = NT >> 5
    E = n_experts
    n_pairs = ids.shape[0]
    nxt = cuda.shared.array(_SORT_SLOTS, int32)
    seg = cuda.shared.array(32, int32)
    tile = cuda.shared.array(SORT_THREADS_MAX, int32)
    hist = cuda.shared.array(_SORT_HIST, uint8)
    for e in range(tid, E, NT):
        nxt[e] = 0
    cuda.syncthreads()
    for p in range(tid, n_pairs, NT):
        cuda.atomic.add(nxt, ids[p], 1)
    cuda.syncthreads()
    # exclusive scan over E <= 1024 counts: 32-expert segments in serial, then the segments
    if tid * 32 < E:
        acc = 0
        for e in range(tid * 32, min(tid * 32 + 32, E)):
            c = nxt[e]
            nxt[e] = acc
            acc += c
        seg[tid] = acc
    cuda.syncthreads()
    if tid == 0:
        acc = 0
        for j in range((E + 31) // 32):
            c = seg[j]
            seg[j] = acc
            acc += c
        group_off[E] = n_pairs
    cuda.syncthreads()
    for e in range(tid, E, NT):
        nxt[e] += seg[e >> 5]
        group_off[e] = nxt[e]
    cuda.syncthreads()
    for base in range(0, n_pairs, NT):
        p = base + tid
        e = ids[p] if p < n_pairs else E          # E: no expert's (a thread past the pairs)
        tile[tid] = e
        for j in range(tid, W * E, NT):
            hist[j] = 0
        cuda.syncthreads()
        r = 0                                     # this expert's pairs in earlier lanes
        c = 0                                     # ... in the whole warp
        for j in range(32):
            if tile[wp * 32 + j] == e:
                c += 1
                if j < lane:
                    r += 1
        if p < n_pairs and r == 0:                # the warp's first lane of expert e
            hist[wp * E + e] = c
        cuda.syncthreads()
        if p < n_pairs:
            for v in range(wp):
                r += int32(hist[v * E + e])
            row = nxt[e] + r
            pos[p] = row
            src[row] = p // top_k
        cuda.syncthreads()
        for e2 in range(tid, E, NT):
            c = 0
            for v in range(W):
                c += int32(hist[v * E + e2])
            nxt[e2] += c
        cuda.syncthreads()


def launch_moe_sort(ids, n_experts: int, group_off, pos, src, stream=0, threads=None):
    """`moe_sort` of ids int32[T, k] over n_experts (<= ROUTER_E_MAX) experts: one block of
    the fewest power-of-two threads (>= 32) that hold every expert and, up to
    SORT_THREADS_MAX, every pair (`threads` overrides it, e.g. for tests of several rounds)."""
    T, k = ids.shape
    n = T * k
    if n_experts > ROUTER_E_MAX:
        raise ValueError(f"moe_sort: {n_experts} experts exceed its {ROUTER_E_MAX}")
    nt = threads or norm.pow2_block(max(n_experts, min(n, SORT_THREADS_MAX)), SORT_THREADS_MAX)
    if nt < n_experts or nt % 32:
        raise ValueError(f"moe_sort: {nt} threads for {n_experts} experts")
    moe_sort[1, nt, stream](ids.reshape(n), np.int32(k), np.int32(n_experts), group_off, pos,
                            src)


@kernel
def moe_gather(xq32, xd, src, words, subs, xs32, xsd):
    """Row i of (xs32, xsd) = row src[i] of (xq32, xd): int8 activations as `words` uint32
    words a row, their `subs` scales. Grid (rows), any block size."""
    i = cuda.blockIdx.x
    t = src[i]
    for j in range(cuda.threadIdx.x, words, cuda.blockDim.x):
        xs32[i * words + j] = xq32[t * words + j]
    for j in range(cuda.threadIdx.x, subs, cuda.blockDim.x):
        xsd[i * subs + j] = xd[t * subs + j]


@kernel
def moe_combine_sorted(yd, pos, wts, shared_y, shared_gate, shared_mode, residual, has_residual,
                       y):
    """moe_combine with the k rows of token t at yd[pos[t k + r]] (the sorted order)."""
    m = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.y
    if m >= y.shape[1]:
        return
    k = wts.shape[1]
    out = np.float32(0.0)
    for r in range(k):
        out += wts[t, r] * yd[pos[t * k + r], m]
    _finish_row(out, t, m, shared_y, shared_gate, shared_mode, residual, has_residual, y)


PTX_SIGNATURES["moe_sort"] = ["void(int32[::1], int32, int32, uint32[::1], int32[::1], "
                               "int32[::1])"]
PTX_SIGNATURES["moe_gather"] = ["void(uint32[::1], float32[::1], int32[::1], int32, int32, "
                                "uint32[::1], float32[::1])"]
PTX_SIGNATURES["moe_combine_sorted"] = [f"void({_A2}, int32[::1], {_A2}, {_A2}, float32[::1], "
                                        f"int32, {_A2}, int32, {_A2})"]


def grouped_experts(w: ExpertWeights) -> bool:
    """Whether `launch_moe_block_q8_grouped` can run this layer: `int8_experts`, every expert
    and shared-expert matrix of a type with an int8 GEMM, and at most ROUTER_E_MAX experts."""
    from .matmul_q8 import MATMUL_Q8
    types = [w.gate_type, w.up_type, w.down_type] + (
        [w.sh_gate_type, w.sh_up_type, w.sh_down_type] if w.sh_down is not None else [])
    return int8_experts(w) and w.n_experts <= ROUTER_E_MAX and \
        all(layout(t).qtype in MATMUL_Q8 for t in types)


class MoEScratchSorted(MoEScratchQ8):
    """MoEScratchQ8 plus `moe_sort`'s output: the expert-major blocks' common part."""

    def __init__(self, T: int, w: ExpertWeights, branches: bool | None = None):
        super().__init__(T, w, branches)
        R = T * w.top_k
        self.group_off = cuda.device_array(w.n_experts + 1, np.uint32)
        self.pos = cuda.device_array(R, np.int32)
        self.src = cuda.device_array(R, np.int32)


def _check_sorted(who, x, xq, xd, w, s: MoEScratchSorted):
    """Check the shapes of an expert-major block; the activation dict (`TokenMatrix.x_args`'s
    keywords) and T."""
    T, H = x.shape
    if T != s.T or H != w.hidden:
        raise ValueError(f"{who}: x is [{T}, {H}], scratch was made for T = {s.T} and the "
                         f"weights for H = {w.hidden}")
    if w.n_experts > ROUTER_E_MAX:
        raise ValueError(f"{who}: {w.n_experts} experts exceed moe_sort's {ROUTER_E_MAX}")
    return dict(xq=xq, xd=xd, x=x), T


def _route_sort(w, q, s: MoEScratchSorted, xi, T, stream):
    """Route the T tokens and sort their (token, rank) pairs by expert (`moe_sort`)."""
    _route_tokens(w, q, s, xi, T, stream)
    launch_moe_sort(s.ids, w.n_experts, s.group_off, s.pos, s.src, stream)


class MoEScratchGrouped(MoEScratchSorted):
    """MoEScratchSorted plus the gathered activations of the GEMM's expert-major block."""

    def __init__(self, T: int, w: ExpertWeights, branches: bool | None = None):
        super().__init__(T, w, branches)
        R = T * w.top_k
        self.xs_q = cuda.device_array(R * w.hidden, np.int8)
        self.xs_d = cuda.device_array(R * w.hidden // 32, np.float32)


def launch_moe_block_q8_grouped(x, xq, xd, w: ExpertWeights, q: ExpertMatricesQ8,
                                s: MoEScratchGrouped, y, residual=None, stream=0):
    """`launch_moe_block_q8` for a prefill chunk, expert-major (the section comment above):
    the same router and routing, each expert's weights read once for the chunk."""
    from .matmul_q8 import launch_matmul_q8, launch_matmul_q8_grouped
    xi, T = _check_sorted("moe_block_grouped", x, xq, xd, w, s)
    _route_sort(w, q, s, xi, T, stream)
    H, k, E, F = w.hidden, w.top_k, w.n_experts, w.ffn
    R = T * k
    moe_gather[R, 128, stream](_flat1(xq).view(np.uint32), _flat1(xd), s.src, np.int32(H // 4),
                               np.int32(H // 32), s.xs_q.view(np.uint32), s.xs_d)
    xs_q, xs_d = s.xs_q.reshape(R, H), s.xs_d.reshape(R, H // 32)
    gate, up, act = (a.reshape(R, F) for a in (s.gate, s.up, s.act))
    launch_matmul_q8_grouped(w.gate, w.gate_type, E, F, H, xs_q, xs_d, s.group_off, gate, T, stream)
    launch_matmul_q8_grouped(w.up, w.up_type, E, F, H, xs_q, xs_d, s.group_off, up, T, stream)
    launch_swiglu_q8(gate, up, act, s.act_q, s.act_d, stream)
    yd = s.yd.reshape(R, H)
    launch_matmul_q8_grouped(w.down, w.down_type, E, H, F, s.act_q.reshape(R, F),
                             s.act_d.reshape(R, F // 32), s.group_off, yd, T, stream)
    shared_y = shared_gate = None
    if w.sh_down is not None:
        Is = w.shared_ffn
        xq2, xd2 = _flat1(xq).reshape(T, H), _flat1(xd).reshape(T, H // 32)
        launch_matmul_q8(w.sh_gate, w.sh_gate_type, Is, H, xq2, xd2, s.sh_gate, stream=stream)
        launch_matmul_q8(w.sh_up, w.sh_up_type, Is, H, xq2, xd2, s.sh_up, stream=stream)
        launch_swiglu_q8(s.sh_gate, s.sh_up, s.sh_act, s.sh_q, s.sh_d, stream)
        launch_matmul_q8(w.sh_down, w.sh_down_type, H, Is, s.sh_q.reshape(T, Is),
                         s.sh_d.reshape(T, Is // 32), s.sh_y, stream=stream)
        shared_y, shared_gate = s.sh_y, _shared_gate_logit(q, s, xi, T, stream)
    launch_moe_combine(yd, s.weights, y, shared_y, shared_gate, residual, stream, pos=s.pos)


# ------------------------------------------------------------------ expert-major, decode kernels
#
# `launch_moe_block_q8_expert_rows` is the expert-major prefill with the decode path's sums:
# the same routing and sort as the grouped block above (`moe_sort`), then every projection on
# matvec.group_kernel of the matrix's TokenMatrix -- the row loop `token_kernel` runs, with the
# same warps a row -- over each expert's sorted rows. A row's value is therefore its decode
# step's, bit for bit (as `launch_moe_block_q8`'s), while an expert's weights come from DRAM
# once per block and z slice for all its rows rather than once per (token, rank). The shared
# expert is one group of all T tokens. No gather: the kernel reads a pair's token row through
# `src`.

# Rows a (block, z slice) of group_kernel walks, on average: fewer slices leave long serial
# chains of row dots in a block, more re-read the matrix from L2 for fewer rows each.
GROUP_ROWS_PER_SLICE = 4


def _group_slices(rows: int, groups: int) -> int:
    """Grid z of a group launch: GROUP_ROWS_PER_SLICE rows a slice of the average group."""
    per_group = max(1, -(-rows // groups))
    return min(GRID_YZ_MAX, max(1, -(-per_group // GROUP_ROWS_PER_SLICE)))


def launch_group_matvec(tm: TokenMatrix, group_off, src, x_args, y, groups: int, rows: int,
                        stream=0):
    """y[i, :] = W[g] @ x(i) for the sorted rows i of every group g (matvec.group_kernel):
    group_off uint32[groups + 1]; x(i) = row src[i] of x_args (src an int32 array) or row i
    (src None); rows = group_off[groups], the rows y holds (set on the device: this is the
    launch's planning figure, the average group then being rows / groups)."""
    if y.size < rows * tm.rows:
        raise ValueError(f"group_matvec: y holds {y.size} values, not rows x M = "
                         f"{rows} x {tm.rows}")
    z = _group_slices(rows, groups)
    grid = (tm.blocks(tm.rows), groups, z)
    tm.group_kernels(tm.parts)[grid, THREADS, stream](
        tm.w, group_off, group_off.view(np.int32) if src is None else src,
        np.int32(src is not None), np.int32(tm.rows), np.int32(tm.cols), x_args, _flat1(y),
        np.int32(tm.parts))


# The expert-major block's gate and up projections as one launch of `matvec.group_pair_kernel`
# (a warp sums the gate row and the up row together) where both take whole-warp rows of one
# warp and the same path; False: two group kernel launches side by side (before session 25).
GATE_UP_PAIRS = True


def _pairs_serve(a: TokenMatrix, b: TokenMatrix) -> bool:
    """Whether `launch_group_matvec_pair` can run a and b (GATE_UP_PAIRS on)."""
    return (GATE_UP_PAIRS and a.path == b.path and a.x_kind == b.x_kind and a.parts == 1
            and b.parts == 1 and (a.rows, a.cols) == (b.rows, b.cols)
            and a._fitted(1)[1] == 32)


def launch_group_matvec_pair(ta: TokenMatrix, tb: TokenMatrix, group_off, src, x_args, ya, yb,
                             groups: int, rows: int, stream=0):
    """`launch_group_matvec` of two stacks of one shape on the same rows in one launch
    (`matvec.group_pair_kernel`; `_pairs_serve(ta, tb)` must hold): the two launches' bits."""
    for name, y in (("ya", ya), ("yb", yb)):
        if y.size < rows * ta.rows:
            raise ValueError(f"group_matvec_pair: {name} holds {y.size} values, not rows x M "
                             f"= {rows} x {ta.rows}")
    z = _group_slices(rows, groups)
    grid = (ta.blocks(ta.rows), groups, z)
    matvec.group_pair_kernels(ta._fitted(1)[0])[grid, THREADS, stream](
        ta.w, tb.w, group_off, group_off.view(np.int32) if src is None else src,
        np.int32(src is not None), np.int32(ta.rows), np.int32(ta.cols), x_args, _flat1(ya),
        _flat1(yb))


class MoEScratchExpertRows(MoEScratchSorted):
    """MoEScratchSorted plus the shared expert's one group (rows 0 .. T - 1) of
    `launch_moe_block_q8_expert_rows`."""

    def __init__(self, T: int, w: ExpertWeights, branches: bool | None = None):
        super().__init__(T, w, branches)
        self.all_rows = cuda.to_device(np.array([0, T], np.uint32))


def launch_moe_block_q8_expert_rows(x, xq, xd, w: ExpertWeights, q: ExpertMatricesQ8,
                                    s: MoEScratchExpertRows, y, residual=None, stream=0):
    """`launch_moe_block_q8` expert-major (the section comment above): the same bits for
    every token, each expert's weights read once per block for all its tokens."""
    xi, T = _check_sorted("moe_block_expert_rows", x, xq, xd, w, s)
    br = s.branches
    shared_y = shared_gate = None
    if q.sh_down is not None:

        def sh_matvec(tm, xa, out, on):
            launch_group_matvec(tm, s.all_rows, None, xa, out, 1, T, on)
        shared_y, shared_gate = _shared_expert(q, s, xi, T, br, br.fork(stream, 0), sh_matvec)
    _route_sort(w, q, s, xi, T, stream)
    E, F = w.n_experts, w.ffn
    R = T * w.top_k
    gate, up = s.gate.reshape(R, F), s.up.reshape(R, F)
    if _pairs_serve(q.gate, q.up):
        launch_group_matvec_pair(q.gate, q.up, s.group_off, s.src, q.gate.x_args(**xi), gate,
                                 up, E, R, stream)
    else:
        launch_group_matvec(q.up, s.group_off, s.src, q.up.x_args(**xi), up, E, R,
                            br.fork(stream, 1))
        launch_group_matvec(q.gate, s.group_off, s.src, q.gate.x_args(**xi), gate, E, R, stream)
        br.join(stream, 1)
    launch_swiglu_q8(gate, up, s.act.reshape(R, F), s.act_q, s.act_d, stream)
    launch_group_matvec(q.down, s.group_off, None, q.down.x_args(s.act_q, s.act_d), s.yd, E, R,
                        stream)
    if q.sh_down is not None:
        br.join(stream, 0)
    launch_moe_combine(s.yd, s.weights, y, shared_y, shared_gate, residual, stream, pos=s.pos)


__all__ = ["EXPERT_MATVEC", "ExpertMatricesQ8", "ExpertWeights", "MOE_DOWN", "MoEScratch",
           "MoEScratchExpertRows", "MoEScratchGrouped", "MoEScratchQ8", "MoEScratchSorted",
           "TokenMatrix", "expert_matrices_q8", "grouped_experts", "int8_experts",
           "launch_expert_matvec", "launch_group_matvec", "launch_moe_block",
           "launch_moe_block_q8", "launch_moe_block_q8_expert_rows",
           "launch_moe_block_q8_grouped", "launch_moe_combine", "launch_moe_down",
           "launch_moe_route", "launch_token_matvec", "token_matrix"]
