"""Gated DeltaNet (linear attention) kernels: conv, per-head prep, the gated delta rule.

numpy reference: bw24nb/reference/gated_deltanet.py. One token mix of a Gated DeltaNet layer
on the device, for `x[T, H]` (the projections are ordinary matvecs / matmuls):

    qkv, z, b, a = W_qkv x, W_z x, W_beta x, W_alpha x        kernels/matvec.py, matmul.py
    qkv = silu(conv1d(qkv)), conv window updated              launch_conv1d_silu     (a)
    q, k, v, g, beta = prep(qkv, a, b)                        launch_gdn_prep        (b)
    o = gated delta rule(q, k, v, g, beta), state updated     launch_gated_delta_rule (c, d)
    y = rms_norm(o) * ssm_norm * silu(z) per value head       norm.launch_gated_rms_norm (e)
    out = W_out y                                             kernels/matvec.py

(a) `conv1d_silu` — reference `causal_conv1d` + `silu`. A thread walks a run of one channel's
    tokens (runs of T / CONV_SPLIT: the kernel's docstring) with the K-1 previous inputs in
    registers (K = CONV_KERNEL = 4, the only width Qwen3-Next / Qwen3.5 use); the run holding
    the last token writes the last K-1 inputs back as the new window.
    `y[t, c] = silu(w[c,0] x[t-3] + w[c,1] x[t-2] + w[c,2] x[t-1] + w[c,3] x[t])`, the products
    summed left to right in float32 (the reference's j order, in float64), each after the
    first fused into the sum (`_conv_sum`: the contraction fixed, not the compiler's).

(b) `gdn_prep` — the reference's `GatedDeltaNet._inputs` after the conv. One block per
    (token, key head) L2-normalises that head's q and k (`x / sqrt(sum x^2 + 1e-6)`, HF's
    `l2norm`; the sum is norm.block_sum's fixed tree), folds the `1/sqrt(d_k)` query scale of
    `gated_delta_rule_recurrent` into q, copies v out of the conv buffer, and computes per value
    head `g = ssm_a * softplus(a + dt_bias)` (ssm_a = -exp(A_log), as stored) and
    `beta = sigmoid(b)`. softplus is evaluated as `max(x, 0) + log1p(exp(-|x|))`: exact
    (no threshold switch), never overflows.

(c, d) `gated_delta_rule` — the reference's `gated_delta_rule_recurrent`, one token at a time:

        S <- exp(g_t) S;   delta = beta_t (v_t - S^T k_t);   S <- S + k_t delta^T;   o_t = S^T q_t

    Two kernels compute it (`rule_kernel(dk, variant)`; each serves decode (T = 1), verify and
    prefill (T tokens in one launch, a loop over t inside the block)). Column j of S only ever
    meets column j (every product above is S times a vector on the left), so the state splits
    by columns with no communication. The default, "lane" (`_lane_rule_kernel`, session 8),
    gives each column to two lanes holding half of it in registers: no shared memory, no
    barrier, its order in its docstring. The "tile" kernel, described here, gives a block
    (value head, 32 columns of d_v). Its 4 warps split the d_k rows (warp w owns rows w, w+4,
    w+8, ...; lane l owns column l), so every thread holds d_k/4 entries of S. The block's S
    tile lives in shared memory for the whole launch — read from device memory once, written
    back once, however long T is (shared rather than registers because numba offers no
    register array with a runtime length; each entry is private to one thread, lanes are
    consecutive words, so there are no bank conflicts). Per step the two dot products
    (`S^T k` and `S^T q`) are reduced in a fixed order: each thread sums its rows in ascending
    order in float32, then the 4 warps' partials are added warp 0, 1, 2, 3. The GQA map
    (`value_to_key_head`, which differs between families) arrives as a device array.

    Why sequential-over-time for prefill rather than the chunked form: it is the recurrence
    itself (same formula as decode, so prefill and decode can only disagree by rounding), it
    needs no triangular solve, and it reads/writes the state once per launch. Its cost is T
    sequential steps per block (5 barriers each; token t + 1's q, k, v, g, beta are loaded while
    step t computes -- session 8: 1.1 ms a 512-token chunk and layer on the H200 before that);
    the chunked (UT-transform, tensor-core) prefill is the known next step once prefill time
    matters. Summation order vs the
    reference's chunked form: the reference folds each chunk's rank-one updates into a
    triangular solve in float64 and reads the carried state once per chunk; we apply them one
    by one in float32. The two are equal in exact arithmetic (tests/test_gated_deltanet.py
    holds the reference forms equal to 1e-5); the kernel differs from either by float32
    rounding, which the delta rule does not amplify (with |k| = 1 and 0 <= beta <= 1 the update
    `S <- (I - beta k k^T) exp(g) S + beta k v^T` is a contraction on the old state), so the
    error grows at most linearly in T: tests/test_kernels_gdn.py bounds it.

Nothing here depends on the decode step number: T comes from the array shapes, which are
fixed for a captured decode graph; the state and conv window are updated in place.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from ..jit import kernel
from ..reference.gated_deltanet import L2NORM_EPS
from . import norm
from ..ptx import fma_f32, warp_pair_sum, warp_sum, warp_sum8
from .norm import SCRATCH_WARPS, launch_gated_rms_norm, launch_gated_rms_norm_q8

# Depthwise conv width: Qwen3-Next and Qwen3.5 (linear_conv_kernel_dim) all use 4; the kernel
# keeps the K-1 = 3 previous inputs in named registers, so another width needs another kernel.
CONV_KERNEL = 4
# The conv's block: CONV_CH channels (one a lane) x CONV_SPLIT runs of tokens (one a warp):
# 256 blocks of 512 threads for the 9B's 8192 channels. T = 1..3 leaves most runs empty;
# decode and verify use gdn_conv_prep instead.
CONV_CH = 32
CONV_SPLIT = 16
CONV_THREADS = CONV_CH * CONV_SPLIT

# One warp per prep block: a key head has d_k = 128 values, 4 per lane, and block_sum's tree
# over 32 threads is the shortest that covers it.
PREP_THREADS = 32

# Delta-rule tiling (see the module docstring): 32 columns of S per block (one per lane, so a
# warp's row access is one 128-byte line), 4 warps splitting the d_k rows.
GDN_COLS = 32
GDN_WARPS = 4
GDN_THREADS = GDN_COLS * GDN_WARPS
# Rows of the shared S tile: d_k is 128 in every Qwen3-Next / Qwen3.5 model; the tile is
# GDN_DK_MAX * GDN_COLS * 4 bytes = 16 KiB of shared memory per block.
GDN_DK_MAX = 128


# ------------------------------------------------------------------ device helpers

# norm.py's block reduction (its fixed tree order); inlined there, so compile_ptx needs no GPU
block_sum = norm.block_sum


@cuda.jit(device=True, inline="always")
def _silu(x):
    return x / (float32(1.0) + math.exp(-x))


@cuda.jit(device=True, inline="always")
def _sigmoid(x):
    return float32(1.0) / (float32(1.0) + math.exp(-x))


@cuda.jit(device=True, inline="always")
def _softplus(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), in float32."""
    return max(x, float32(0.0)) + math.log1p(math.exp(-abs(x)))


@cuda.jit(device=True, inline="always")
def _gates(a, b, dt_bias, ssm_a):
    """A value head's gates for one token: (g, beta) = (ssm_a softplus(a + dt_bias),
    sigmoid(b)), the one expression gdn_prep and both conv_prep launches use."""
    return ssm_a * _softplus(a + dt_bias), _sigmoid(b)


# ------------------------------------------------------------------ (a) conv


@cuda.jit(device=True, inline="always")
def _conv_sum(w0, w1, w2, w3, s0, s1, s2, xt):
    """w0 s0 + w1 s1 + w2 s2 + w3 xt, left to right, each later product fused into the sum
    (fma_f32): fma(w3, xt, fma(w2, s2, fma(w1, s1, w0 * s0))). Spelled out because the
    compiler's own contraction of the plain expression is its choice per kernel: before
    session 22 the prefill conv got fma(w0, s0, w1 * s1) ... and decode's gdn_conv_prep the
    form above, so prefill and decode convs differed by an ulp (decision 0028's follow-up)."""
    acc = w0 * s0
    acc = fma_f32(w1, s1, acc)
    acc = fma_f32(w2, s2, acc)
    return fma_f32(w3, xt, acc)


@cuda.jit(device=True, inline="always")
def _conv_advance(w0, w1, w2, w3, s0, s1, s2, xt):
    """One token of a channel's conv: (silu(_conv_sum(...)), the window moved on by xt)."""
    return _silu(_conv_sum(w0, w1, w2, w3, s0, s1, s2, xt)), s1, s2, xt


@cuda.jit(device=True, inline="always")
def _save_window(steps, t, c, s0, s1, s2):
    """steps[t, :, c] <- channel c's window after token t (the states rollback's copy)."""
    steps[t, 0, c] = s0
    steps[t, 1, c] = s1
    steps[t, 2, c] = s2


@kernel
def conv1d_silu(x, w, state, y, steps, save_steps):
    """y[t, c] = silu(sum_j w[c, j] * window_c[t + j]), window_c = (state[:, c], x[:, c]);
    state[:, c] <- the last K-1 inputs. x, y [T, C] (y may be x); w [C, 4]; state [3, C].
    save_steps: also steps[t, :, c] <- the window after token t (steps [>= T, 3, C]).

    A block owns CONV_CH channels (lane = channel: a warp's loads are one 128-byte line) and
    cuts the T tokens into CONV_SPLIT runs, warp s walking run s. Every thread first reads the
    3 inputs before its run (from x, or the state before token 0) and only after the barrier
    writes y, so in place (y = x) no run overwrites an input another still has to read. Each
    output is the same four products summed in the same order as one thread walking all T
    tokens would sum them (tested, and on the H200: bench/gpu_same_bits.py). The kernel before
    session 21 gave a thread a channel and walked all T tokens, ~0.3 us a token of memory
    latency: 3.95 ms of a 512-token 9B prefill (24 launches) against 0.50 ms now."""
    lane = cuda.threadIdx.x & 31
    run = cuda.threadIdx.x >> 5
    c = cuda.blockIdx.x * CONV_CH + lane
    T = x.shape[0]
    ok = c < x.shape[1]
    cc = min(c, x.shape[1] - 1)          # (a channel past C reads the last one, writes nothing)
    L = (T + CONV_SPLIT - 1) // CONV_SPLIT
    t0 = min(run * L, T)
    t1 = min(t0 + L, T)
    # inputs t0-3, t0-2, t0-1: from x inside the chunk, from the state before token 0
    s0 = x[t0 - 3, cc] if t0 >= 3 else state[t0, cc]
    s1 = x[t0 - 2, cc] if t0 >= 2 else state[t0 + 1, cc]
    s2 = x[t0 - 1, cc] if t0 >= 1 else state[2, cc]
    w0, w1, w2, w3 = w[cc, 0], w[cc, 1], w[cc, 2], w[cc, 3]
    cuda.syncthreads()                   # every run's window is read before any y is written
    for t in range(t0, t1):
        yt, s0, s1, s2 = _conv_advance(w0, w1, w2, w3, s0, s1, s2, x[t, cc])
        if ok:
            y[t, c] = yt
            if save_steps:
                _save_window(steps, t, c, s0, s1, s2)
    if ok and t0 < T and t1 == T:        # the run holding token T - 1 keeps the last inputs
        state[0, c] = s0
        state[1, c] = s1
        state[2, c] = s2


# ------------------------------------------------------------------ (b) prep


@cuda.jit(device=True, inline="always")
def _l2norm_head(scratch, src, t, off, dk, scale, eps, dst, h):
    """dst[t, h, :] = src[t, off:off+dk] / sqrt(sum^2 + eps) * scale."""
    acc = float32(0.0)
    for i in range(cuda.threadIdx.x, dk, cuda.blockDim.x):
        val = src[t, off + i]
        acc += val * val
    r = float32(1.0) / math.sqrt(block_sum(scratch, acc) + eps)
    for i in range(cuda.threadIdx.x, dk, cuda.blockDim.x):
        dst[t, h, i] = src[t, off + i] * r * scale


@kernel
def gdn_prep(qkv, a, b, dt_bias, ssm_a, q_scale, eps, q, k, v, g, beta):
    """Split the conv output qkv[T, 2*nk*dk + nv*dv] into q, k [T, nk, dk] (L2-normalised, q
    times q_scale) and v [T, nv, dv]; g, beta [T, nv] from a, b [T, nv]. Grid (T, nk)."""
    scratch = cuda.shared.array(SCRATCH_WARPS, float32)
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    nk, dk = q.shape[1], q.shape[2]
    nv, dv = v.shape[1], v.shape[2]
    key_dim = nk * dk
    _l2norm_head(scratch, qkv, t, h * dk, dk, q_scale, eps, q, h)
    _l2norm_head(scratch, qkv, t, key_dim + h * dk, dk, float32(1.0), eps, k, h)
    # value heads h, h + nk, h + 2nk, ...: an even split of the copy and the gates over blocks
    # (not the GQA map: any partition will do, each head is written once)
    for j in range(h, nv, nk):
        src = 2 * key_dim + j * dv
        for i in range(cuda.threadIdx.x, dv, cuda.blockDim.x):
            v[t, j, i] = qkv[t, src + i]
        if cuda.threadIdx.x == 0:
            g[t, j], beta[t, j] = _gates(a[t, j], b[t, j], dt_bias[j], ssm_a[j])


# ------------------------------------------------------------------ (a + b) fused, decode

_CONV_PREP_QK = 2 * GDN_DK_MAX      # a key head's q and k after the conv (shared memory)


@cuda.jit(device=True, inline="always")
def _conv_prep_channel(h, tid, nk, dk, nv, dv):
    """(c, j, i): thread tid's conv channel in block h of gdn_conv_prep -- [0, dk) q, [dk, 2dk)
    k, then the block's value heads' channels, value head j's element i (c = -1: none)."""
    key_dim = nk * dk
    nvh = nv // nk
    c = -1
    j = 0
    i = 0
    if tid < dk:
        c = h * dk + tid
    elif tid < 2 * dk:
        c = key_dim + h * dk + tid - dk
    elif tid < 2 * dk + nvh * dv:
        r = tid - 2 * dk
        j = h + (r // dv) * nk
        i = r - (r // dv) * dv
        c = 2 * key_dim + j * dv + i
    return c, j, i


@kernel
def gdn_conv_prep(x, w, state, steps, save_steps, a, b, dt_bias, ssm_a, q_scale, eps,
                  q, k, v, g, beta):
    """conv1d_silu and gdn_prep in one launch, for the few rows of decode / verify: block h
    (key head) owns the conv channels of its q and k head and of the value heads j = h,
    h + nk, ... (gdn_prep's split of the v copy and the gates), one thread a channel. The
    block walks the T rows one after another: each row's conv exactly as conv1d_silu (window
    in registers, `steps` saved alike), its q and k through shared memory, a barrier, the two
    norms (warp 0: q, warp 1: k, in gdn_prep's order) and the row's gates (thread 64), a
    barrier, the scaling, a barrier. So every output is the two kernels' value.
    Session 34 tried three phases instead (every row's conv, then every norm, then the
    scaling: two barriers whatever T, the rows' q and k in 16 KiB of shared memory). Alone it
    was faster (launch_chain at T = 4 on the H100: 5.0 against 9.0 us), but in the engine's
    graph it lost at both row counts (session 35, H100, decision 0041): 9B decode 327.2 /
    327.5 against 339.9 / 339.7 tok/s, verify at K = 3 4.807 / 4.777 against 4.719 / 4.726 ms.
    It was removed."""
    ybuf = cuda.shared.array(_CONV_PREP_QK, float32)
    rs = cuda.shared.array(2, float32)
    h = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    lane = tid & 31
    nk, dk = q.shape[1], q.shape[2]
    nv, dv = v.shape[1], v.shape[2]
    c, j, i = _conv_prep_channel(h, tid, nk, dk, nv, dv)
    w0 = float32(0.0)
    w1 = float32(0.0)
    w2 = float32(0.0)
    w3 = float32(0.0)
    s0 = float32(0.0)
    s1 = float32(0.0)
    s2 = float32(0.0)
    if c >= 0:
        w0, w1, w2, w3 = w[c, 0], w[c, 1], w[c, 2], w[c, 3]
        s0, s1, s2 = state[0, c], state[1, c], state[2, c]
    for t in range(x.shape[0]):
        if c >= 0:
            y, s0, s1, s2 = _conv_advance(w0, w1, w2, w3, s0, s1, s2, x[t, c])
            if save_steps:
                _save_window(steps, t, c, s0, s1, s2)
            if tid < 2 * dk:
                ybuf[tid] = y
            else:
                v[t, j, i] = y
        cuda.syncthreads()                  # this row's q and k are in ybuf
        wp = tid >> 5
        if wp < 2:                          # warp 0: q's norm, warp 1: k's
            sq = float32(0.0)
            for e in range(lane, dk, 32):
                val = ybuf[wp * dk + e]
                sq += val * val
            tot = warp_sum(sq)
            if lane == 0:
                rs[wp] = float32(1.0) / math.sqrt(tot + eps)
        if tid == 64:                       # the gates of this block's value heads
            for jj in range(h, nv, nk):
                g[t, jj], beta[t, jj] = _gates(a[t, jj], b[t, jj], dt_bias[jj], ssm_a[jj])
        cuda.syncthreads()                  # the two norms are in rs
        if tid < dk:
            q[t, h, tid] = ybuf[tid] * rs[0] * q_scale
        elif tid < 2 * dk:
            k[t, h, tid - dk] = ybuf[tid] * rs[1] * float32(1.0)
        cuda.syncthreads()                  # ybuf and rs are rewritten by the next row
    if c >= 0:
        state[0, c] = s0
        state[1, c] = s1
        state[2, c] = s2


# ------------------------------------------------------------------ (c, d) delta rule


def _rule_kernel(DK):
    """The delta-rule kernel for d_k = DK, a compile-time constant: every loop over this
    thread's DK / GDN_WARPS rows then has a constant trip count, so the compiler unrolls it and
    issues the state tile's DK / 4 loads back to back. With d_k read at run time (sessions
    1-5) each row's load waited for the previous row's store: 32 DRAM latencies in a row,
    12 us of a 9B decode step's GDN layer on the H200 (run_bench's gdn_rule)."""

    ROWS = (DK + GDN_WARPS - 1) // GDN_WARPS      # rows r * GDN_WARPS + warp of this thread
    EXACT = DK % GDN_WARPS == 0                    # every such row exists: no bounds test

    def gated_delta_rule(q, k, v, g, beta, key_head, state, o, steps, save_steps):
        """T recurrent steps of the gated delta rule, state [nv, DK, dv] updated in place.
        q, k [T, nk, DK] (q already scaled); v, o [T, nv, dv]; g, beta [T, nv];
        key_head int32[nv]. Grid (nv, ceil(dv / GDN_COLS)), GDN_THREADS threads.
        save_steps: also steps[t] <- the state after token t (steps [>= T, nv, DK, dv]): a
        speculative verify's rollback to any accepted length is then one copy."""
        tile = cuda.shared.array((GDN_DK_MAX, GDN_COLS), float32)     # S[:, j0:j0+32] of head h
        qs = cuda.shared.array(GDN_DK_MAX, float32)
        ks = cuda.shared.array(GDN_DK_MAX, float32)
        red = cuda.shared.array((GDN_WARPS, GDN_COLS), float32)       # per-warp partial dots
        h = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        lane = tid & 31
        wp = tid >> 5
        dv = v.shape[2]
        j = cuda.blockIdx.y * GDN_COLS + lane
        col = j < dv
        jc = min(j, dv - 1)          # a column past dv loads column dv - 1 and keeps nothing
        kh = key_head[h]

        for r in range(ROWS):
            i = r * GDN_WARPS + wp
            if EXACT or i < DK:
                tile[i, lane] = state[h, i, jc]

        # token t's inputs are loaded during step t - 1 (registers; thread i < DK stages q[i]
        # and k[i]): their latency overlaps a step's arithmetic instead of adding to it.
        # Token 0's come first (T >= 1: the launcher returns for T = 0)
        nT = q.shape[0]
        staged = tid < DK                           # (DK <= GDN_DK_MAX = GDN_THREADS)
        ti = min(tid, DK - 1)
        qn = q[0, kh, ti]
        kn = k[0, kh, ti]
        gn = g[0, h]
        bn = beta[0, h]
        vn = v[0, h, jc]
        for t in range(nT):
            if staged:
                qs[tid] = qn
                ks[tid] = kn
            decay = math.exp(gn)
            bt = bn
            vt = vn
            if t + 1 < nT:
                qn = q[t + 1, kh, ti]
                kn = k[t + 1, kh, ti]
                gn = g[t + 1, h]
                bn = beta[t + 1, h]
                vn = v[t + 1, h, jc]
            cuda.syncthreads()                      # q, k staged (and last step's reads done)

            # S <- exp(g) S, and this thread's share of (S^T k)[j]
            part = float32(0.0)
            for r in range(ROWS):
                i = r * GDN_WARPS + wp
                if EXACT or i < DK:
                    s = tile[i, lane] * decay
                    tile[i, lane] = s
                    part += ks[i] * s
            red[wp, lane] = part
            cuda.syncthreads()
            kv_mem = float32(0.0)
            for w in range(GDN_WARPS):
                kv_mem += red[w, lane]
            delta = (vt - kv_mem) * bt
            cuda.syncthreads()                      # everyone has read red

            # S <- S + k delta^T, and this thread's share of (S^T q)[j]
            part = float32(0.0)
            for r in range(ROWS):
                i = r * GDN_WARPS + wp
                if EXACT or i < DK:
                    s = tile[i, lane] + ks[i] * delta
                    tile[i, lane] = s
                    part += qs[i] * s
            red[wp, lane] = part
            cuda.syncthreads()
            if wp == 0 and col:
                acc = float32(0.0)
                for w in range(GDN_WARPS):
                    acc += red[w, lane]
                o[t, h, j] = acc
            if save_steps and col:
                for r in range(ROWS):
                    i = r * GDN_WARPS + wp
                    if EXACT or i < DK:
                        steps[t, h, i, j] = tile[i, lane]
            cuda.syncthreads()                      # red, qs, ks are rewritten next step

        if col:
            for r in range(ROWS):
                i = r * GDN_WARPS + wp
                if EXACT or i < DK:
                    state[h, i, j] = tile[i, lane]

    gated_delta_rule.__name__ = gated_delta_rule.__qualname__ = f"gated_delta_rule_dk{DK}"
    return kernel(gated_delta_rule)


def _lane_step(HALF):
    """The lane kernel's token step for half columns of HALF rows (built per HALF: its loops
    unroll over constant indices, so S stays in registers): S <- exp(g) S, the column's
    (S^T k), delta, S <- S + k delta^T and the column's (S^T q), in the order of
    `_lane_rule_kernel`'s docstring; returns (S^T q)[j], held by both lanes of the column."""

    @cuda.jit(device=True, inline="always")
    def lane_step(S, q, k, t, kh, r0, decay, bt, vt):
        # S <- exp(g) S, and (S^T k)[j]
        p0 = float32(0.0)
        p1 = float32(0.0)
        p2 = float32(0.0)
        p3 = float32(0.0)
        for i0 in range(0, HALF, LANE_ACCS):
            s = S[i0] * decay
            S[i0] = s
            p0 += k[t, kh, r0 + i0] * s
            s = S[i0 + 1] * decay
            S[i0 + 1] = s
            p1 += k[t, kh, r0 + i0 + 1] * s
            s = S[i0 + 2] * decay
            S[i0 + 2] = s
            p2 += k[t, kh, r0 + i0 + 2] * s
            s = S[i0 + 3] * decay
            S[i0 + 3] = s
            p3 += k[t, kh, r0 + i0 + 3] * s
        part = (p0 + p1) + (p2 + p3)
        kv_mem = warp_pair_sum(part)
        delta = (vt - kv_mem) * bt
        # S <- S + k delta^T, and (S^T q)[j]
        p0 = float32(0.0)
        p1 = float32(0.0)
        p2 = float32(0.0)
        p3 = float32(0.0)
        for i0 in range(0, HALF, LANE_ACCS):
            s = S[i0] + k[t, kh, r0 + i0] * delta
            S[i0] = s
            p0 += q[t, kh, r0 + i0] * s
            s = S[i0 + 1] + k[t, kh, r0 + i0 + 1] * delta
            S[i0 + 1] = s
            p1 += q[t, kh, r0 + i0 + 1] * s
            s = S[i0 + 2] + k[t, kh, r0 + i0 + 2] * delta
            S[i0 + 2] = s
            p2 += q[t, kh, r0 + i0 + 2] * s
            s = S[i0 + 3] + k[t, kh, r0 + i0 + 3] * delta
            S[i0 + 3] = s
            p3 += q[t, kh, r0 + i0 + 3] * s
        part = (p0 + p1) + (p2 + p3)
        return warp_pair_sum(part)

    return lane_step


def _lane_rule_kernel(DK):
    """The delta-rule kernel with half a column of S per lane ("lane", the default): lanes l
    and l + 16 of block (h, y) own column j = 16 y + (l & 15) of head h's state, lane l < 16
    rows 0 .. DK/2 - 1 and lane l + 16 the rest, in registers (a local array with constant
    indices; a whole column a lane needed 255 registers and spilled), so a step needs no
    shared memory and no barrier -- the "tile" kernel above spends 5 barriers and two 4-warp
    reductions a step, ~1.8 us a token on the H200 (session 8). Each dot of a step, (S^T k)[j]
    and (S^T q)[j], is summed in a fixed order: each lane over its rows in LANE_ACCS
    interleaved partial sums (row i into partial i mod LANE_ACCS, rows ascending; then
    ((p0 + p1) + (p2 + p3))), then the two halves added (`warp_pair_sum`: one shfl.xor 16;
    a + b = b + a, so both lanes hold the same bits). q and k are read by the 16 lanes of a
    half at one address (a broadcast load)."""
    HALF = DK // 2
    lane_step = _lane_step(HALF)

    def gated_delta_rule_lane(q, k, v, g, beta, key_head, state, o, steps, save_steps):
        """As `gated_delta_rule` (the tile kernel): grid (nv, ceil(dv / 16)), 32 threads."""
        S = cuda.local.array(HALF, float32)
        h = cuda.blockIdx.x
        lane = cuda.threadIdx.x
        r0 = (lane >> 4) * HALF                 # this lane's first row
        dv = v.shape[2]
        j = cuda.blockIdx.y * LANE_COLS + (lane & 15)
        col = j < dv
        jc = min(j, dv - 1)          # a column past dv reads column dv - 1 and keeps nothing
        kh = key_head[h]
        for i in range(HALF):
            S[i] = state[h, r0 + i, jc]
        for t in range(q.shape[0]):
            out = lane_step(S, q, k, t, kh, r0, math.exp(g[t, h]), beta[t, h], v[t, h, jc])
            if col:
                if lane < 16:
                    o[t, h, j] = out
                if save_steps:
                    for i in range(HALF):
                        steps[t, h, r0 + i, j] = S[i]
        if col:
            for i in range(HALF):
                state[h, r0 + i, j] = S[i]

    gated_delta_rule_lane.__name__ = gated_delta_rule_lane.__qualname__ = \
        f"gated_delta_rule_lane_dk{DK}"
    return kernel(gated_delta_rule_lane)


# The lane kernel with the output norm folded in (decode, verify): one block a value head,
# its warp y the lane kernel's block (h, y), so the head's dv outputs of a token meet in shared
# memory and warp 0 runs the gated norm + int8 copy on them (norm.gated_rms_norm_q8_rows' one
# step on 32 threads, the launch it replaces). At most RULE_NORM_DV_MAX values a head: four a
# lane of that one warp.
RULE_NORM_DV_MAX = 128
# Warp 0 of the rule-norm block only norms (the rule's columns on warps 1..): token t's norm
# then runs beside everyone's step t + 1 instead of ahead of warp 0's, so a verify of T rows
# waits for one norm, not T (decision 0037). The same bits (the same code on the same values).
# False: warp 0 takes the first columns and the norms, as in session 27. Read at every launch.
RULE_NORM_OWN_WARP = True
# Verify's tokens (2 .. RULE_NORM_PRELOAD_T) have their q, k, v, exp(g) and beta loaded into
# shared memory by the whole block before the first step, so a token's step waits on no global
# load (launch_chain, H100: 5.5 / 7.7 / 12.0 us for T = 1 / 2 / 4 before, ~2.1 us a token).
# The same values, so the same bits. H200, a K = 3 verify's 24 launches: 0.382 against 0.415
# ms; ~1.95 us a token remains (decision 0039). False: every token's inputs loaded from global
# memory in its step (session 32). Read at every launch.
RULE_NORM_PRELOAD = True
RULE_NORM_PRELOAD_T = 16


def _lane_rule_norm_kernel(DK, OWN_WARP, PRELOAD_T=0, CONV=False):
    """`gated_delta_rule_lane` then `norm.gated_rms_norm_q8_rows` in one launch
    ("gated_delta_rule_norm_q8"): grid nv, 32 ceil(dv / 16) threads (+ 32 with OWN_WARP, whose
    warp 0 only norms and whose column warps are 1..). Column warp y computes the
    columns 16 y .. 16 y + 15 exactly as the lane kernel's block (h, y) (`_lane_step`), and
    puts token t's outputs in shared memory instead of o; after a barrier warp 0 loads them
    with z[t, h] and the norm weight in the gated q8 norm's slots (element lane + 32 s), sums
    the squares in `_squares4`' order, takes the root as `norm._row_rstd` does (its block_sum
    on one warp is warp_sum: the second stage adds +0.0 to a non-negative total), and stores
    y = o * rstd * w * silu(z) into o with its int8 codes and scales (`norm.gated_q8_slots`):
    the bits of the two launches. The outputs alternate between two shared rows by token, so
    one barrier a token keeps warp 0's reads of token t apart from the writes of t + 1.
    PRELOAD_T > 0 (launches of 2 .. PRELOAD_T tokens): the block first copies every token's q
    and k rows of its key head (the two halves one word apart, so a warp's two broadcast reads
    fall in two banks), v row, exp(g) and beta into shared memory; the steps read them there.
    CONV (`gdn_conv_rule_norm_q8`, decode): gdn_conv_prep's work too, in that preload --
    the block runs the conv of its key head's q and k channels and of its own value head's
    channels into the shared rows (the conv windows and `steps` stored by one block a key
    head for q and k), the two l2 norms and its head's gates, with gdn_conv_prep's arithmetic
    (its sums of squares are fma chains on the GPU, spelled out here): its bits, one launch
    fewer."""
    HALF = DK // 2
    lane_step = _lane_step(HALF)
    PRELOAD = PRELOAD_T > 0
    PT = max(PRELOAD_T, 1)
    DP = DK + 1                             # a preloaded row: half 1 one word after half 0
    QK = 2 * DK                             # CONV: a key head's q and k channels

    @cuda.jit(device=True, inline="always")
    def qk_channel(kh, e, key_dim):
        """Key head kh's e-th q / k conv channel (e < DK: q's, else k's)."""
        return kh * DK + e if e < DK else key_dim + kh * DK + e - DK

    @cuda.jit(device=True, inline="always")
    def conv_rows(conv, h, kh, key_head, T, nv, dv, q_sh, k_sh, v_sh, gb_sh, win_sh, flag_sh,
                  tid, nt):
        """CONV's preload: rows 0 .. T - 1 of q_sh / k_sh (l2-normed, q scaled), v_sh and
        gb_sh (exp(g), beta) from the projections, as gdn_conv_prep computes them; the conv
        windows moved on. The value heads of key head kh all read its q / k windows, so the
        last of them to have read them (a counter a key head, put back to zero) stores them;
        the lowest one stores their `steps` (nobody reads those here)."""
        (x, conv_w, conv_state, conv_steps, save_conv, a, b, dt_bias, ssm_a, q_scale, l2_eps,
         counters) = conv
        key_dim = (x.shape[1] - nv * dv) // 2
        lowest = True
        siblings = 0                        # the other value heads of key head kh
        for jj in range(nv):
            if key_head[jj] == kh and jj != h:
                siblings += 1
                if jj < h:
                    lowest = False
        for e in range(tid, 2 * DK + dv, nt):   # e: q channels, k channels, then v's
            c = qk_channel(kh, e, key_dim) if e < 2 * DK else 2 * key_dim + h * dv + e - 2 * DK
            w0, w1, w2, w3 = conv_w[c, 0], conv_w[c, 1], conv_w[c, 2], conv_w[c, 3]
            s0, s1, s2 = conv_state[0, c], conv_state[1, c], conv_state[2, c]
            # bounded by the build's constant PT: a loop to the run-time T was unrolled into 224
            # registers (ptxas, sm_90), where the rule needs 168, and at 9 warps a block the H100
            # refused the launch (out of resources, session 38; a max_registers cap of 192 did
            # not take there)
            for t in range(PT):
                if t >= T:
                    break
                y, s0, s1, s2 = _conv_advance(w0, w1, w2, w3, s0, s1, s2, x[t, c])
                if save_conv and (e >= 2 * DK or lowest):
                    _save_window(conv_steps, t, c, s0, s1, s2)
                if e < DK:
                    q_sh[t, 0, e + (1 if e >= HALF else 0)] = y
                elif e < 2 * DK:
                    r = e - DK
                    k_sh[t, 0, r + (1 if r >= HALF else 0)] = y
                else:
                    v_sh[t, e - 2 * DK] = y
            if e >= 2 * DK:                 # this head's own channels
                conv_state[0, c] = s0
                conv_state[1, c] = s1
                conv_state[2, c] = s2
            else:                           # kh's: stored below by the last reader
                win_sh[0, e] = s0
                win_sh[1, e] = s1
                win_sh[2, e] = s2
        if tid < T:
            gt, bt = _gates(a[tid, h], b[tid, h], dt_bias[h], ssm_a[h])
            gb_sh[tid, 0] = math.exp(gt)
            gb_sh[tid, 1] = bt
        cuda.syncthreads()                  # every row's conv in shared memory; the windows
        if tid == nt - 32:                  # read (their values used) before the count (on
            done = 0                        # the last warp: the first ones run the norms)
            if siblings > 0:
                done = cuda.atomic.add(counters, kh, 1)
                if done == siblings:
                    counters[kh] = 0        # the next launch counts from zero
            flag_sh[0] = 1 if done == siblings else 0
        lane = tid & 31
        for i in range(tid >> 5, 2 * T, nt >> 5):  # a warp a (row, q or k): its l2 norm
            t = i >> 1
            sq = float32(0.0)
            for e in range(lane, DK, 32):
                ep = e + (1 if e >= HALF else 0)
                val = q_sh[t, 0, ep] if (i & 1) == 0 else k_sh[t, 0, ep]
                sq = fma_f32(val, val, sq)
            rs = float32(1.0) / math.sqrt(warp_sum(sq) + l2_eps)
            for e in range(lane, DK, 32):
                ep = e + (1 if e >= HALF else 0)
                if (i & 1) == 0:
                    q_sh[t, 0, ep] = q_sh[t, 0, ep] * rs * q_scale
                else:
                    k_sh[t, 0, ep] = k_sh[t, 0, ep] * rs * float32(1.0)
        cuda.syncthreads()                  # the norms done, flag_sh set
        if flag_sh[0] != 0:
            for e in range(tid, 2 * DK, nt):
                c = qk_channel(kh, e, key_dim)
                conv_state[0, c] = win_sh[0, e]
                conv_state[1, c] = win_sh[1, e]
                conv_state[2, c] = win_sh[2, e]

    def body(q, k, v, g, beta, key_head, state, o, steps, save_steps, z, norm_w, eps, xq, xd,
             T, nv, dv, conv):
        out_sh = cuda.shared.array((2, RULE_NORM_DV_MAX), float32)
        q_sh = cuda.shared.array((PT, 1, DP), float32)
        k_sh = cuda.shared.array((PT, 1, DP), float32)
        v_sh = cuda.shared.array((PT, RULE_NORM_DV_MAX), float32)
        gb_sh = cuda.shared.array((PT, 2), float32)
        S = cuda.local.array(HALF, float32)
        h = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        r0 = (lane >> 4) * HALF
        cw = warp - 1 if OWN_WARP else warp     # this warp's columns (-1: the norm warp's none)
        steps_here = cw >= 0
        j = cw * LANE_COLS + (lane & 15)
        col = steps_here and j < dv
        jc = max(min(j, dv - 1), 0)
        kh = key_head[h]
        if steps_here and not CONV:
            for i in range(HALF):
                S[i] = state[h, r0 + i, jc]
        if CONV:
            win_sh = cuda.shared.array((3, QK), float32)
            flag_sh = cuda.shared.array(1, np.int32)
            conv_rows(conv, h, kh, key_head, T, nv, dv, q_sh, k_sh, v_sh, gb_sh, win_sh,
                      flag_sh, tid, cuda.blockDim.x)
            if steps_here:                  # (the state after the conv: the form measured)
                for i in range(HALF):
                    S[i] = state[h, r0 + i, jc]
        elif PRELOAD:
            nt = cuda.blockDim.x
            for e in range(tid, T * DK, nt):
                t = e // DK
                r = e - t * DK
                rp = r + (1 if r >= HALF else 0)
                q_sh[t, 0, rp] = q[t, kh, r]
                k_sh[t, 0, rp] = k[t, kh, r]
            for e in range(tid, T * dv, nt):
                t = e // dv
                v_sh[t, e - t * dv] = v[t, h, e - t * dv]
            if tid < T:
                gb_sh[tid, 0] = math.exp(g[tid, h])
                gb_sh[tid, 1] = beta[tid, h]
            cuda.syncthreads()
        rp0 = r0 + (lane >> 4)                  # this lane's first row in a preloaded row
        sl = norm._slots(32, dv)            # warp 0's norm slots (tid = lane there)
        w0, w1, w2, w3 = norm._vec4(norm_w, sl)
        z0 = z1 = z2 = z3 = float32(0.0)
        for t in range(T):
            row = t * nv + h
            if warp == 0:                   # z's loads in flight during the step
                z0, z1, z2, z3 = norm._row4(z, row, sl)
            if steps_here:
                if PRELOAD or CONV:
                    out = lane_step(S, q_sh, k_sh, t, 0, rp0, gb_sh[t, 0], gb_sh[t, 1],
                                    v_sh[t, jc])
                else:
                    out = lane_step(S, q, k, t, kh, r0, math.exp(g[t, h]), beta[t, h],
                                    v[t, h, jc])
                if col:
                    if lane < 16:
                        out_sh[t & 1, j] = out
                    if save_steps:
                        for i in range(HALF):
                            steps[t, h, r0 + i, j] = S[i]
            cuda.syncthreads()
            if warp == 0:
                x0 = out_sh[t & 1, sl[0]]
                x1 = out_sh[t & 1, sl[1]]
                x2 = out_sh[t & 1, sl[2]]
                x3 = out_sh[t & 1, sl[3]]
                acc = norm._squares4(32, dv, x0, x1, x2, x3)
                rstd = norm.rstd_of(warp_sum(acc), dv, eps)
                if lane < dv:
                    norm.gated_q8_slots(o, xq, xd, row, lane, 32, dv, rstd, x0, x1, x2, x3,
                                        w0, w1, w2, w3, z0, z1, z2, z3)
        if col:
            for i in range(HALF):
                state[h, r0 + i, j] = S[i]

    body = cuda.jit(device=True, inline="always")(body)

    def gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o, steps, save_steps,
                                 z, norm_w, eps, xq, xd):
        """o, z as [T * nv, dv] rows (o receives the normed output); xq [T * nv, dv] int8,
        xd [T * nv, dv / 32]; the rest as `gated_delta_rule_lane`'s."""
        # (conv: stand-ins of conv_rows' types, never read without CONV)
        body(q, k, v, g, beta, key_head, state, o, steps, save_steps, z, norm_w, eps, xq, xd,
             q.shape[0], v.shape[1], v.shape[2],
             (z, z, z, q, save_steps, z, z, norm_w, norm_w, eps, eps, key_head))

    def gdn_conv_rule_norm_q8(x, conv_w, conv_state, conv_steps, save_conv, a, b, dt_bias,
                              ssm_a, q_scale, l2_eps, counters, key_head, state, o, steps,
                              save_steps, z, norm_w, eps, xq, xd):
        """x [T, C] the projections before the conv, its weight, window and `steps` as
        gdn_conv_prep takes them, a / b / dt_bias / ssm_a the gates' inputs, counters int32
        [nk] zeros (alloc_conv_counters); the rest as `gated_delta_rule_norm_q8`'s."""
        # (q, k, v, g, beta: stand-ins of the preload-less path's types, never read)
        body(state, state, state, o, o, key_head, state, o, steps, save_steps, z, norm_w, eps,
             xq, xd, x.shape[0], cuda.gridDim.x, o.shape[1],
             (x, conv_w, conv_state, conv_steps, save_conv, a, b, dt_bias, ssm_a, q_scale,
              l2_eps, counters))

    fn = gdn_conv_rule_norm_q8 if CONV else gated_delta_rule_norm_q8
    fn.__name__ = fn.__qualname__ = \
        ("gdn_conv_rule_norm_q8" if CONV else "gated_delta_rule_norm_q8") + f"_dk{DK}" \
        + ("_w0" if OWN_WARP else "") + ("_pre" if PRELOAD else "")
    return kernel(fn)


@cuda.jit(device=True, inline="always")
def _eighth_column_place(half, dv):
    """This thread's place in the quad and pipe kernels: (lane, r0, j, col, jc). Rows r0, r0 + 4,
    ... of column j: lane bit 0 the half, bits 1 and 2 the partial (p = 2 bit1 + bit2), the
    thread's eighth of the block the column; col = j < dv, jc = j clamped (a column past dv
    reads column dv - 1 and keeps nothing)."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    r0 = (lane & 1) * half + ((lane >> 2) & 1) + (lane & 2)
    j = cuda.blockIdx.y * LANE_COLS + (tid >> 3)
    return lane, r0, j, j < dv, min(j, dv - 1)


@cuda.jit(device=True, inline="always")
def _store_eighth_column(o, steps, save_steps, out, S, t, h, j, r0, col, lane):
    """Token t's output of column j (the first of its 8 lanes) and, when saving steps, this
    lane's rows r0, r0 + 4, ... of the state after token t (the quad and pipe kernels)."""
    if col:
        if (lane & 7) == 0:
            o[t, h, j] = out
        if save_steps:
            for m in range(S.shape[0]):
                steps[t, h, r0 + LANE_ACCS * m, j] = S[m]


def _quad_rule_kernel(DK):
    """The lane kernel's arithmetic on 8 lanes a column ("quad", session 22): each of the lane
    kernel's LANE_ACCS partial sums of a half column gets its own lane, holding rows r0 + p,
    r0 + p + 4, ... (DK / 8 of them, in registers). Lane bits: 0 = the half (h), 1 and 2 =
    the partial (p = 2 bit1 + bit2), 3 and 4 = the column of the warp's 4. `warp_sum8`'s
    butterfly (lane offsets 4, 2, 1) then adds p0 + p1 and p2 + p3, those two, and the halves:
    ((p0 + p1) + (p2 + p3)) of each half, then lo + hi -- the lane kernel's order, so the same
    bits (tested; bench/gpu_same_bits.py on the H200). Token t + 1's k, q, v, g and beta are
    loaded into registers while token t computes, so a step waits for no memory.
    What it buys in prefill: a token step's serial chain is 16 rows a pass instead of 64, a
    launch has 4x the warps (the lane kernel gives a 9B layer 256 one-warp blocks: ~2 warps an
    SM), and the next token's loads are in flight. In decode (one token) the lane kernel is
    faster (session 22: 3.50 against 4.87 us a 9B layer), so "auto" takes PREFILL_RULE (this
    kernel or the pipe kernel built on it) from QUAD_MIN_T tokens on."""
    HALF = DK // 2
    NR = HALF // LANE_ACCS                  # rows a lane holds

    def gated_delta_rule_quad(q, k, v, g, beta, key_head, state, o, steps, save_steps):
        """As `gated_delta_rule` (the tile kernel): grid (nv, ceil(dv / 16)), 128 threads."""
        S = cuda.local.array(NR, float32)
        kc = cuda.local.array(NR, float32)      # this token's k, q rows
        qc = cuda.local.array(NR, float32)
        kn = cuda.local.array(NR, float32)      # the next token's, loading
        qn = cuda.local.array(NR, float32)
        h = cuda.blockIdx.x
        lane, r0, j, col, jc = _eighth_column_place(HALF, v.shape[2])
        T = q.shape[0]
        kh = key_head[h]
        for m in range(NR):
            S[m] = state[h, r0 + LANE_ACCS * m, jc]
            kn[m] = k[0, kh, r0 + LANE_ACCS * m]
            qn[m] = q[0, kh, r0 + LANE_ACCS * m]
        gn = g[0, h]
        bn = beta[0, h]
        vn = v[0, h, jc]
        for t in range(T):
            for m in range(NR):
                kc[m] = kn[m]
                qc[m] = qn[m]
            gt = gn
            bt = bn
            vt = vn
            tn = min(t + 1, T - 1)              # (the last token loads itself again, unused)
            for m in range(NR):
                kn[m] = k[tn, kh, r0 + LANE_ACCS * m]
                qn[m] = q[tn, kh, r0 + LANE_ACCS * m]
            gn = g[tn, h]
            bn = beta[tn, h]
            vn = v[tn, h, jc]
            decay = math.exp(gt)
            # S <- exp(g) S, and (S^T k)[j]
            acc = float32(0.0)
            for m in range(NR):
                s = S[m] * decay
                S[m] = s
                acc += kc[m] * s
            kv_mem = warp_sum8(acc)
            delta = (vt - kv_mem) * bt
            # S <- S + k delta^T, and (S^T q)[j]
            acc = float32(0.0)
            for m in range(NR):
                s = S[m] + kc[m] * delta
                S[m] = s
                acc += qc[m] * s
            _store_eighth_column(o, steps, save_steps, warp_sum8(acc), S, t, h, j, r0, col,
                                 lane)
        if col:
            for m in range(NR):
                state[h, r0 + LANE_ACCS * m, j] = S[m]

    gated_delta_rule_quad.__name__ = gated_delta_rule_quad.__qualname__ = \
        f"gated_delta_rule_quad_dk{DK}"
    return kernel(gated_delta_rule_quad)


def _pipe_rule_kernel(DK):
    """The quad kernel's arithmetic with token t's second pass and token t + 1's first pass in
    one loop over the rows ("pipe", session 22): row m's update with token t, S_m + k_t,m delta_t,
    is the value token t + 1's first pass decays and dots with k_(t+1),m, so a step's two
    serial chains (the q-dot of t, the k-dot of t + 1) and their two warp_sum8 run side by side
    instead of one after the other. Every value and every sum is the quad kernel's, in its
    order (the same bits: tested). The k, q rows of two tokens live in two register sets used
    in turn (the loop over tokens written out twice); a set is refilled with token t + 2's rows
    as the loop over m finishes with token t's."""
    HALF = DK // 2
    NR = HALF // LANE_ACCS                  # rows a lane holds

    @cuda.jit(device=True, inline="always")
    def step(S, U, kc, qc, kn, acc1, vc, bc, gn, t, T, k, q, v, g, beta, kh, r0, h, j, jc,
             col, lane, o, steps, save_steps):
        """Token t's update and q-dot with (kc, qc), token t + 1's decay and k-dot with kn
        (after the last token too, unused: the loop over m has no branch); kc, qc refilled
        with token t + 2's rows; U <- the state after token t (`steps`, and the final state).
        Returns token t + 1's k-dot partial, v and beta, and token t + 2's g."""
        tn = min(t + 1, T - 1)
        t2 = min(t + 2, T - 1)
        vn = v[tn, h, jc]
        bn = beta[tn, h]
        gnn = g[t2, h]
        kv_mem = warp_sum8(acc1)
        delta = (vc - kv_mem) * bc
        decay = math.exp(gn)
        acc2 = float32(0.0)
        acc1 = float32(0.0)
        for m in range(NR):
            s = S[m] + kc[m] * delta
            U[m] = s
            acc2 += qc[m] * s
            kc[m] = k[t2, kh, r0 + LANE_ACCS * m]
            qc[m] = q[t2, kh, r0 + LANE_ACCS * m]
            sd = s * decay
            acc1 += kn[m] * sd
            S[m] = sd
        _store_eighth_column(o, steps, save_steps, warp_sum8(acc2), U, t, h, j, r0, col, lane)
        return acc1, vn, bn, gnn

    def gated_delta_rule_pipe(q, k, v, g, beta, key_head, state, o, steps, save_steps):
        """As `gated_delta_rule` (the tile kernel): grid (nv, ceil(dv / 16)), 128 threads."""
        S = cuda.local.array(NR, float32)
        U = cuda.local.array(NR, float32)       # the state after a token, for `steps`
        ka = cuda.local.array(NR, float32)      # the two tokens' k, q rows, used in turn
        qa = cuda.local.array(NR, float32)
        kb = cuda.local.array(NR, float32)
        qb = cuda.local.array(NR, float32)
        h = cuda.blockIdx.x
        lane, r0, j, col, jc = _eighth_column_place(HALF, v.shape[2])
        T = q.shape[0]
        kh = key_head[h]
        t1 = min(1, T - 1)
        for m in range(NR):
            S[m] = state[h, r0 + LANE_ACCS * m, jc]
            ka[m] = k[0, kh, r0 + LANE_ACCS * m]
            qa[m] = q[0, kh, r0 + LANE_ACCS * m]
            kb[m] = k[t1, kh, r0 + LANE_ACCS * m]
            qb[m] = q[t1, kh, r0 + LANE_ACCS * m]
        # token 0's first pass: S <- exp(g) S, and its k-dot
        decay = math.exp(g[0, h])
        acc1 = float32(0.0)
        for m in range(NR):
            s = S[m] * decay
            S[m] = s
            acc1 += ka[m] * s
        vt = v[0, h, jc]
        bt = beta[0, h]
        gn = g[t1, h]
        t = 0
        while t < T:                # two tokens a trip: set a current, then set b
            acc1, vt, bt, gn = step(S, U, ka, qa, kb, acc1, vt, bt, gn, t, T, k, q, v, g, beta,
                                    kh, r0, h, j, jc, col, lane, o, steps, save_steps)
            t += 1
            if t >= T:
                break
            acc1, vt, bt, gn = step(S, U, kb, qb, ka, acc1, vt, bt, gn, t, T, k, q, v, g, beta,
                                    kh, r0, h, j, jc, col, lane, o, steps, save_steps)
            t += 1
        if col:                              # the state after the last token (not decayed)
            for m in range(NR):
                state[h, r0 + LANE_ACCS * m, j] = U[m]

    gated_delta_rule_pipe.__name__ = gated_delta_rule_pipe.__qualname__ = \
        f"gated_delta_rule_pipe_dk{DK}"
    return kernel(gated_delta_rule_pipe)


# the lane kernel: 16 columns (one warp, two lanes a column) a block, DK a multiple of
# 2 LANE_ACCS; the quad and pipe kernels: the same 16 columns on 4 warps (8 lanes a column)
LANE_COLS = 16
LANE_ACCS = 4
QUAD_THREADS = 8 * LANE_COLS
# The rule's kernels: variant -> (builder, columns a block, threads a block). A launch may also
# ask for "auto" = PREFILL_RULE for QUAD_MIN_T tokens or more (prefill), else "lane" (decode,
# verify) -- the same bits either way. Session 22 on the H200, 9B heads: quad 12.71 against
# lane 15.27 ms a 512-token prefill (24 layers, before the next-token loads; 7.48 with them),
# lane 3.50 against quad 4.87 us a decode step's layer; session 23: pipe 6.53 against quad
# 7.41 ms a 9B prefill (pp512 6992 against 6851 tok/s, one process, the same tokens).
_RULE_FORMS = {"lane": (_lane_rule_kernel, LANE_COLS, 32),
               "quad": (_quad_rule_kernel, LANE_COLS, QUAD_THREADS),
               "pipe": (_pipe_rule_kernel, LANE_COLS, QUAD_THREADS),
               "tile": (_rule_kernel, GDN_COLS, GDN_THREADS)}
RULE_KERNELS = tuple(_RULE_FORMS)
RULE_VARIANTS = ("auto",) + RULE_KERNELS
QUAD_MIN_T = 16
# The kernel "auto" takes from QUAD_MIN_T tokens on: "pipe" (quad's two passes of consecutive
# tokens in one loop, built in session 22; the default since session 23's H200 run), or "quad"
# (run_bench --launch quad-rule).
PREFILL_RULE = "pipe"
_RULE_KERNELS: dict = {}


def rule_kernel(dk: int, variant: str = "lane"):
    """The delta-rule kernel for d_k = dk (built on first use; 128 in every real model):
    "lane" (half a column of S per lane, registers), "quad" (an eighth of a column per lane,
    the lane kernel's bits), "pipe" (quad's, two tokens' passes in one loop) or "tile" (the
    shared-memory tile kernel)."""
    if variant not in RULE_KERNELS:
        raise ValueError(f"gated_delta_rule: kernel must be one of {RULE_KERNELS}, "
                         f"not {variant!r}")
    if variant != "tile" and dk % (2 * LANE_ACCS):
        variant = "tile"             # (no real model: d_k is 128 everywhere)
    key = (dk, variant)
    if key not in _RULE_KERNELS:
        _RULE_KERNELS[key] = _RULE_FORMS[variant][0](dk)
    return _RULE_KERNELS[key]


gated_delta_rule = rule_kernel(GDN_DK_MAX, "tile")    # module attributes: tests/test_compile_ptx.py
gated_delta_rule_lane = rule_kernel(GDN_DK_MAX, "lane")
gated_delta_rule_quad = rule_kernel(GDN_DK_MAX, "quad")
gated_delta_rule_pipe = rule_kernel(GDN_DK_MAX, "pipe")
_RULE_NORM_KERNELS: dict = {}


def rule_norm_kernel(dk: int, own_warp: bool | None = None, preload_t: int = 0,
                     conv: bool = False):
    """The lane kernel with the output norm folded in, for d_k = dk, its norm on a warp of its
    own or not (default RULE_NORM_OWN_WARP), up to preload_t tokens' inputs preloaded into
    shared memory (0: none; conv: gdn_conv_prep's work too, for preload_t = 1 token, decode's);
    built on first use."""
    key = (dk, RULE_NORM_OWN_WARP if own_warp is None else bool(own_warp), int(preload_t),
           bool(conv))
    if key not in _RULE_NORM_KERNELS:
        _RULE_NORM_KERNELS[key] = _lane_rule_norm_kernel(*key)
    return _RULE_NORM_KERNELS[key]


gated_delta_rule_norm_q8 = rule_norm_kernel(GDN_DK_MAX, True)
gated_delta_rule_norm_q8_shared_warp = rule_norm_kernel(GDN_DK_MAX, False)
gated_delta_rule_norm_q8_preload = rule_norm_kernel(GDN_DK_MAX, True, RULE_NORM_PRELOAD_T)
gdn_conv_rule_norm_q8 = rule_norm_kernel(GDN_DK_MAX, True, 1, True)           # decode's


# ------------------------------------------------------------------ launchers


def launch_conv1d_silu(x, conv_w, conv_state, y, stream=0, steps=None):
    """`y = silu(causal_conv1d(x, conv_w, conv_state))` and the window updated in place.

    x, y float32[T, C] (y may be x); conv_w float32[C, 4] (ssm_conv1d.weight); conv_state
    float32[3, C] (the previous 3 inputs, oldest first; zeros at the start); steps: None or
    float32[>= T, 3, C] (rows may be strided) receiving the window after each token.
    Reference: `silu(causal_conv1d(x, weight, state)[0])`, new state `[1]`."""
    T, C = x.shape
    if tuple(conv_w.shape) != (C, CONV_KERNEL):
        raise ValueError(f"conv1d: weight must be [{C}, {CONV_KERNEL}], got {tuple(conv_w.shape)}"
                         f" (only kernel width {CONV_KERNEL} has a kernel)")
    if tuple(conv_state.shape) != (CONV_KERNEL - 1, C) or tuple(y.shape) != (T, C):
        raise ValueError(f"conv1d: state must be [{CONV_KERNEL - 1}, {C}] and y [{T}, {C}]")
    if steps is not None and (steps.shape[0] < T or tuple(steps.shape[1:]) != (CONV_KERNEL - 1, C)):
        raise ValueError(f"conv1d: steps must be [>= {T}, {CONV_KERNEL - 1}, {C}], got "
                         f"{tuple(steps.shape)}")
    if C == 0:
        return
    conv1d_silu[(C + CONV_CH - 1) // CONV_CH, CONV_THREADS, stream](
        x, conv_w, conv_state, y, conv_state.reshape(1, *conv_state.shape) if steps is None else steps,
        np.int32(steps is not None))


def launch_gdn_prep(qkv, a, b, dt_bias, ssm_a, q, k, v, g, beta, eps: float = L2NORM_EPS,
                    stream=0):
    """Per-head prep after the conv (reference `GatedDeltaNet._inputs`, minus the GQA repeat,
    which the delta-rule kernel does through `key_head`):

    qkv float32[T, 2*nk*dk + nv*dv] (silu(conv) output, [q | k | v] heads);
    a, b float32[T, nv] (ssm_alpha / ssm_beta projections); dt_bias, ssm_a float32[nv];
    outputs q, k float32[T, nk, dk] (`l2norm(q) / sqrt(dk)`, `l2norm(k)`), v float32[T, nv, dv],
    g float32[T, nv] (`ssm_a * softplus(a + dt_bias)`), beta float32[T, nv] (`sigmoid(b)`)."""
    T, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    if tuple(qkv.shape) != (T, 2 * nk * dk + nv * dv) or tuple(k.shape) != (T, nk, dk):
        raise ValueError(f"gdn_prep: qkv {tuple(qkv.shape)} does not split into q, k "
                         f"[{T}, {nk}, {dk}] and v [{T}, {nv}, {dv}]")
    for name, arr in (("a", a), ("b", b), ("g", g), ("beta", beta)):
        if tuple(arr.shape) != (T, nv):
            raise ValueError(f"gdn_prep: {name} must be [{T}, {nv}], got {tuple(arr.shape)}")
    if T == 0:
        return
    gdn_prep[(T, nk), PREP_THREADS, stream](qkv, a, b, dt_bias, ssm_a, np.float32(dk ** -0.5),
                                            np.float32(eps), q, k, v, g, beta)


def conv_prep_threads(nk: int, nv: int, dk: int, dv: int) -> int | None:
    """Threads of a gdn_conv_prep block (one per channel of a key head, at least 3 warps: two
    norms and the gates), or None when a key head's channels exceed a block."""
    if dk > GDN_DK_MAX or nk <= 0 or nv % nk:
        return None
    threads = max(96, 32 * ((2 * dk + (nv // nk) * dv + 31) // 32))
    return threads if threads <= 1024 else None


def _check_conv_shapes(name, qkv, conv_w, conv_state, steps, nk, dk, nv, dv, steps_name="steps"):
    """The fused conv launchers' checks: qkv [T, C] with C = 2 nk dk + nv dv, the conv weight
    [C, CONV_KERNEL], its window [CONV_KERNEL - 1, C] and the window's per-row copies."""
    T, C = qkv.shape
    if C != 2 * nk * dk + nv * dv or tuple(conv_w.shape) != (C, CONV_KERNEL) \
            or tuple(conv_state.shape) != (CONV_KERNEL - 1, C):
        raise ValueError(f"{name}: qkv {tuple(qkv.shape)}, conv weight {tuple(conv_w.shape)}, "
                         f"window {tuple(conv_state.shape)} do not fit q/k [{nk}, {dk}], v "
                         f"[{nv}, {dv}]")
    if steps is not None and (steps.shape[0] < T or tuple(steps.shape[1:]) != (CONV_KERNEL - 1, C)):
        raise ValueError(f"{name}: {steps_name} must be [>= {T}, {CONV_KERNEL - 1}, {C}]")


def launch_gdn_conv_prep(qkv, conv_w, conv_state, a, b, dt_bias, ssm_a, q, k, v, g, beta,
                         eps: float = L2NORM_EPS, stream=0, steps=None):
    """`launch_conv1d_silu` then `launch_gdn_prep` in one launch (see gdn_conv_prep), for a
    few rows (decode, verify): qkv [T, C] is the projection before the conv and is not
    modified; the conv window (and `steps`) are updated as launch_conv1d_silu does; q, k, v,
    g, beta as launch_gdn_prep writes them."""
    T, C = qkv.shape
    nk, dk = q.shape[1], q.shape[2]
    nv, dv = v.shape[1], v.shape[2]
    _check_conv_shapes("gdn_conv_prep", qkv, conv_w, conv_state, steps, nk, dk, nv, dv)
    threads = conv_prep_threads(nk, nv, dk, dv)
    if threads is None:
        raise ValueError(f"gdn_conv_prep: a key head's {2 * dk + (nv // nk) * dv} channels do "
                         f"not fit one block: use launch_conv1d_silu + launch_gdn_prep")
    if T == 0:
        return
    gdn_conv_prep[nk, threads, stream](
        qkv, conv_w, conv_state,
        conv_state.reshape(1, *conv_state.shape) if steps is None else steps,
        np.int32(steps is not None), a, b, dt_bias, ssm_a, np.float32(dk ** -0.5),
        np.float32(eps), q, k, v, g, beta)


def _check_rule_shapes(name, q, v, g, beta, key_head, state, o, steps):
    """The rule launchers' shape checks (q [T, nk, dk] and v [T, nv, dv] set the sizes)."""
    T, _, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    if tuple(state.shape) != (nv, dk, dv) or tuple(o.shape) != (T, nv, dv):
        raise ValueError(f"{name}: state must be [{nv}, {dk}, {dv}] and o [{T}, {nv}, {dv}], "
                         f"got {tuple(state.shape)} and {tuple(o.shape)}")
    if tuple(g.shape) != (T, nv) or tuple(beta.shape) != (T, nv) or key_head.shape[0] != nv \
            or key_head.dtype != np.int32:
        raise ValueError(f"{name}: g, beta must be [{T}, {nv}], key_head int32[{nv}]")
    if steps is not None and (steps.shape[0] < T or tuple(steps.shape[1:]) != (nv, dk, dv)):
        raise ValueError(f"{name}: steps must be [>= {T}, {nv}, {dk}, {dv}], got "
                         f"{tuple(steps.shape)}")


def launch_gated_delta_rule(q, k, v, g, beta, key_head, state, o, stream=0, steps=None,
                            variant="auto"):
    """T steps of the gated delta rule (decode: T = 1; prefill: T tokens, one launch).

    q, k float32[T, nk, dk] — L2-normalised, q already scaled by 1/sqrt(dk) (launch_gdn_prep);
    v float32[T, nv, dv]; g, beta float32[T, nv]; key_head int32[nv] (the key head each value
    head reads: `bw24nb.models.qwen35.value_to_key_head`); state float32[nv, dk, dv], updated in
    place; o float32[T, nv, dv]; steps: None or float32[>= T, nv, dk, dv] (the first axis may
    be strided) receiving the state after each token. Reference: `gated_delta_rule_recurrent(
    q_rep * sqrt(dk), k_rep, v, g, beta, state)` with `q_rep = q[:, key_head]` (and equal to
    the chunked form). variant: "lane", "quad" (lane's order and bits on 8 lanes a column),
    "pipe" (quad's, two tokens' passes in one loop), "auto" (the default: PREFILL_RULE from
    QUAD_MIN_T tokens on, else lane) or "tile" (`rule_kernel`): the same recurrence, "tile" in
    its own fixed order."""
    T, nk, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    if dk > GDN_DK_MAX:
        raise ValueError(f"gated_delta_rule: d_k = {dk} exceeds the shared tile's {GDN_DK_MAX} "
                         f"rows; raise GDN_DK_MAX (16 KiB of shared memory per 128 rows)")
    _check_rule_shapes("gated_delta_rule", q, v, g, beta, key_head, state, o, steps)
    if T == 0:
        return                  # (the kernel reads token 0's inputs before its loop)
    if variant not in RULE_VARIANTS:
        raise ValueError(f"gated_delta_rule: variant must be one of {RULE_VARIANTS}, "
                         f"not {variant!r}")
    if variant == "auto":
        variant = PREFILL_RULE if T >= QUAD_MIN_T else "lane"
    if dk % (2 * LANE_ACCS):
        variant = "tile"                                    # (rule_kernel's fallback)
    _, cols, threads = _RULE_FORMS[variant]
    rule_kernel(dk, variant)[(nv, (dv + cols - 1) // cols), threads, stream](
        q, k, v, g, beta, key_head, state, o,
        state.reshape(1, *state.shape) if steps is None else steps, np.int32(steps is not None))


def rule_norm_serves(dk: int, dv: int) -> bool:
    """Whether `launch_gated_delta_rule_norm_q8` takes heads of these sizes: the lane kernel's
    d_k (a multiple of 2 LANE_ACCS), and d_v a multiple of 32 (int8 blocks) that one warp
    normalises in one step (<= RULE_NORM_DV_MAX). Every Qwen3.5 / 3.6 model: 128 and 128."""
    return 0 < dk <= GDN_DK_MAX and dk % (2 * LANE_ACCS) == 0 \
        and 0 < dv <= RULE_NORM_DV_MAX and dv % 32 == 0


def _check_norm_outputs(name, T, nv, dv, z, norm_w, xq, xd):
    """The rule-norm launchers' checks of the gate z, the norm weight and the int8 copy."""
    if tuple(z.shape[-1:]) != (dv,) or z.size != T * nv * dv or tuple(norm_w.shape) != (dv,):
        raise ValueError(f"{name}: z must be [{T}, {nv}, {dv}] and the norm weight [{dv}]; got "
                         f"{tuple(z.shape)}, {tuple(norm_w.shape)}")
    n = T * nv * dv
    if xq.dtype != np.int8 or xq.size < n or xd.dtype != np.float32 or xd.size < n // 32:
        raise ValueError(f"{name}: xq must be int8[>= {n}] and xd float32[>= {n // 32}], not "
                         f"{xq.dtype}[{xq.size}], {xd.dtype}[{xd.size}]")


def launch_gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o, z, norm_w,
                                    eps: float, xq, xd, stream=0, steps=None):
    """`launch_gated_delta_rule(variant="lane")` then `launch_gdn_output_norm(o, z, norm_w,
    eps, o, xq=xq, xd=xd)` in one launch, with the same bits (`_lane_rule_norm_kernel`): o
    [T, nv, dv] receives the normed output, xq / xd (flat or shaped, >= T nv dv and T nv dv /
    32 values) its int8 copy; the state and `steps` as the rule leaves them. For decode and
    verify (the lane kernel's few tokens; its block is a value head, so a launch has nv
    blocks); heads must pass `rule_norm_serves`."""
    T, _, dk = q.shape
    nv, dv = v.shape[1], v.shape[2]
    if not rule_norm_serves(dk, dv):
        raise ValueError(f"gated_delta_rule_norm_q8: heads of d_k {dk} / d_v {dv} need d_k a "
                         f"multiple of {2 * LANE_ACCS} up to {GDN_DK_MAX} and d_v a multiple "
                         f"of 32 up to {RULE_NORM_DV_MAX}: use the rule and the norm apart")
    _check_rule_shapes("gated_delta_rule_norm_q8", q, v, g, beta, key_head, state, o, steps)
    _check_norm_outputs("gated_delta_rule_norm_q8", T, nv, dv, z, norm_w, xq, xd)
    n = T * nv * dv
    if T == 0:
        return
    flat = (lambda a: a if a.ndim == 1 else a.reshape(a.size))
    own = RULE_NORM_OWN_WARP
    pre = RULE_NORM_PRELOAD_T if RULE_NORM_PRELOAD and 1 < T <= RULE_NORM_PRELOAD_T else 0
    rule_norm_kernel(dk, own, pre)[nv, 32 * ((dv + LANE_COLS - 1) // LANE_COLS + own), stream](
        q, k, v, g, beta, key_head, state, o.reshape(T * nv, dv),
        state.reshape(1, *state.shape) if steps is None else steps, np.int32(steps is not None),
        z.reshape(T * nv, dv), norm_w, np.float32(eps), flat(xq)[:n].reshape(T * nv, dv),
        flat(xd)[:n // 32].reshape(T * nv, dv // 32))


def alloc_conv_counters(nk: int):
    """`launch_gdn_conv_rule_norm_q8`'s counters: one int32 a key head, zero (each launch puts
    them back to zero, so one array serves every layer)."""
    return cuda.to_device(np.zeros(max(nk, 1), np.int32))


def launch_gdn_conv_rule_norm_q8(qkv, conv_w, conv_state, a, b, dt_bias, ssm_a, key_head,
                                 state, o, z, norm_w, eps: float, xq, xd, counters,
                                 l2_eps: float = L2NORM_EPS, stream=0, conv_steps=None,
                                 steps=None):
    """`launch_gdn_conv_prep` then `launch_gated_delta_rule_norm_q8` in one launch, with their
    bits (`_lane_rule_norm_kernel`'s CONV): qkv [T, C] the projections before the conv (not
    modified), conv_state / conv_steps the conv window and its per-token copies as
    launch_gdn_conv_prep updates them, a / b [T, nv] the gate projections; state, o, z,
    norm_w, eps, xq, xd, steps as launch_gated_delta_rule_norm_q8 takes them; counters from
    `alloc_conv_counters` (zero before, zero after). One token (decode: the build's conv loop
    is bounded by a constant; over a run-time T ptxas unrolled it into 224 registers, which
    the H100 would not launch at 9 warps). No block waits for another: the last of a key
    head's value heads to read its window stores it."""
    T, C = qkv.shape
    nv, dk, dv = state.shape
    nk = (C - nv * dv) // (2 * dk) if dk > 0 else 0
    if not rule_norm_serves(dk, dv) or T != 1:
        raise ValueError(f"gdn_conv_rule_norm_q8: {T} tokens of heads d_k {dk} / d_v {dv}: "
                         f"needs d_k a multiple of {2 * LANE_ACCS} up to {GDN_DK_MAX}, d_v a "
                         f"multiple of 32 up to {RULE_NORM_DV_MAX} and one token (decode); use "
                         f"gdn_conv_prep and the rule apart")
    if nk <= 0 or nv % nk:
        raise ValueError(f"gdn_conv_rule_norm_q8: qkv {tuple(qkv.shape)}, window "
                         f"{tuple(conv_state.shape)}: its {C} channels hold no key heads of "
                         f"{dk} for {nv} value heads of {dv}")
    _check_conv_shapes("gdn_conv_rule_norm_q8", qkv, conv_w, conv_state, conv_steps, nk, dk,
                       nv, dv, "conv_steps")
    if tuple(a.shape) != (T, nv) or tuple(b.shape) != (T, nv):
        raise ValueError(f"gdn_conv_rule_norm_q8: a / b must be [{T}, {nv}], not "
                         f"{tuple(a.shape)} / {tuple(b.shape)}")
    if counters.dtype != np.int32 or counters.size < nk:
        raise ValueError(f"gdn_conv_rule_norm_q8: counters must be int32[>= {nk}] "
                         f"(alloc_conv_counters), not {counters.dtype}[{counters.size}]")
    if tuple(o.shape) != (T, nv, dv) or key_head.shape[0] != nv or key_head.dtype != np.int32:
        raise ValueError(f"gdn_conv_rule_norm_q8: o must be [{T}, {nv}, {dv}] and key_head "
                         f"int32[{nv}], not {tuple(o.shape)}, {key_head.dtype}"
                         f"[{key_head.shape[0]}]")
    if steps is not None and (steps.shape[0] < T or tuple(steps.shape[1:]) != (nv, dk, dv)):
        raise ValueError(f"gdn_conv_rule_norm_q8: steps must be [>= {T}, {nv}, {dk}, {dv}], "
                         f"got {tuple(steps.shape)}")
    _check_norm_outputs("gdn_conv_rule_norm_q8", T, nv, dv, z, norm_w, xq, xd)
    flat = (lambda x: x if x.ndim == 1 else x.reshape(x.size))
    n = T * nv * dv
    own = RULE_NORM_OWN_WARP
    rule_norm_kernel(dk, own, 1, True)[nv, 32 * ((dv + LANE_COLS - 1) // LANE_COLS + own),
                                         stream](
        qkv, conv_w, conv_state,
        conv_state.reshape(1, *conv_state.shape) if conv_steps is None else conv_steps,
        np.int32(conv_steps is not None), a, b, dt_bias, ssm_a, np.float32(dk ** -0.5),
        np.float32(l2_eps), counters, key_head, state, o.reshape(T * nv, dv),
        state.reshape(1, *state.shape) if steps is None else steps, np.int32(steps is not None),
        z.reshape(T * nv, dv), norm_w, np.float32(eps), flat(xq)[:n].reshape(T * nv, dv),
        flat(xd)[:n // 32].reshape(T * nv, dv // 32))


def launch_gdn_output_norm(o, z, norm_w, eps: float, y, stream=0, xq=None, xd=None):
    """(e) `y = rms_norm(o) * ssm_norm * silu(z)` per value head: norm.py's gated RMSNorm
    (reference `gated_rms_norm`); o, z, y `[T, nv, dv]` (or any `[..., dv]`), norm_w `[dv]`.
    With xq / xd (decode: ssm_out takes int8 activations) it also writes y's int8 codes and
    block scales, exactly as quantize_act would (norm.launch_gated_rms_norm_q8): one launch
    fewer per layer."""
    if xq is not None:
        launch_gated_rms_norm_q8(o, z, norm_w, eps, y, xq, xd, stream)
    else:
        launch_gated_rms_norm(o, z, norm_w, eps, y, stream)


_A2 = "float32[:, ::1]"
_A3 = "float32[:, :, ::1]"
PTX_SIGNATURES = {
    "conv1d_silu": [f"void({_A2}, {_A2}, {_A2}, {_A2}, float32[:, :, ::1], int32)"],
    "gdn_prep": [f"void({_A2}, {_A2}, {_A2}, float32[::1], float32[::1], float32, float32, "
                 f"{_A3}, {_A3}, {_A3}, {_A2}, {_A2})"],
    "gdn_conv_prep": [f"void({_A2}, {_A2}, {_A2}, float32[:, :, ::1], int32, {_A2}, {_A2}, "
                      f"float32[::1], float32[::1], float32, float32, {_A3}, {_A3}, {_A3}, "
                      f"{_A2}, {_A2})"],
    "gated_delta_rule": [f"void({_A3}, {_A3}, {_A3}, {_A2}, {_A2}, int32[::1], {_A3}, {_A3}, "
                         f"float32[:, :, :, ::1], int32)"],
    "gated_delta_rule_lane": [f"void({_A3}, {_A3}, {_A3}, {_A2}, {_A2}, int32[::1], {_A3}, "
                              f"{_A3}, float32[:, :, :, ::1], int32)"],
}
PTX_SIGNATURES["gated_delta_rule_norm_q8"] = [
    f"void({_A3}, {_A3}, {_A3}, {_A2}, {_A2}, int32[::1], {_A3}, {_A2}, float32[:, :, :, ::1], "
    f"int32, {_A2}, float32[::1], float32, int8[:, ::1], {_A2})"]
PTX_SIGNATURES["gated_delta_rule_norm_q8_shared_warp"] = PTX_SIGNATURES["gated_delta_rule_norm_q8"]
PTX_SIGNATURES["gated_delta_rule_norm_q8_preload"] = PTX_SIGNATURES["gated_delta_rule_norm_q8"]
PTX_SIGNATURES["gdn_conv_rule_norm_q8"] = [
    f"void({_A2}, {_A2}, {_A2}, float32[:, :, ::1], int32, {_A2}, {_A2}, "
    f"float32[::1], float32[::1], float32, float32, int32[::1], int32[::1], {_A3}, {_A2}, "
    f"float32[:, :, :, ::1], int32, {_A2}, float32[::1], float32, int8[:, ::1], {_A2})"]
PTX_SIGNATURES["gated_delta_rule_quad"] = PTX_SIGNATURES["gated_delta_rule_lane"]
PTX_SIGNATURES["gated_delta_rule_pipe"] = PTX_SIGNATURES["gated_delta_rule_lane"]
