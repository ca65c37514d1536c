"""Prefill attention on the tensor cores: FlashAttention-2 over the F16 KV cache.

Causal GQA attention of a prefill chunk's T query tokens over one cache layer, with Q K^T and
P V on ``mma.sync.m16n8k16`` (f16 inputs, float32 accumulators; bw24nb/ptx). The split-K decode
kernels that prefill ran before take every product on an FMA, one key per lane: at 512
tokens they took ~150 us a layer for the 0.5B's heads (H100, session 40's run_bench
breakdown), 26 % of its prefill.

Layout of the work. A KV head's query rows are its (token, query head) pairs, row
r = t * n_rep + j for query head kvh * n_rep + j, so a block's rows share the K / V tiles
whatever the GQA ratio. A block takes ROWS = 16 * W consecutive rows (W warps, 16 rows a
warp: one MMA tile's M) of one KV head, and walks its keys 0 .. (the largest position among
its rows) in tiles of KT keys:
  1. the K tile to shared memory as f16 pairs (row-major: a B fragment is one 4-byte load),
     the V tile transposed (dims x keys, so P V's B fragment is one load too);
  2. each warp: S = Q K^T (Q's f16 copy in shared memory, loaded once), times `scale`,
     -inf where key > the row's position;
  3. online softmax a row (a row lives in one quad of lanes: `warp_max4` / `warp_sum4`):
     m' = max(m, max S), alpha = exp(m - m'), P = exp(S - m'), l = l alpha + sum P,
     O = O alpha;
  4. O += P V, P rounded to f16 straight from the S registers (an S tile of 8 keys is half
     of the A fragment of 16 keys: mma_layout.py).
Then out = O / l (float32). Shared-memory rows are padded by 4 words so the fragment loads
of a warp hit 32 different banks.

Loads. A phase (q once, each K / V tile) issues all of a thread's 16-byte loads before any
of its stores (constant trip counts), and up to D = 128 the next tile's K / V words are
loaded into registers while this tile's products run. The first build's runtime loops of
4-byte loads waited on one load at a time: 60 against 37.5 us a layer at the 0.5B's heads,
512 tokens (H100, decision 0047). K and V are read with ``ld.global.nc``: the cache is
written by an earlier launch (the RoPE / K, V store), never during this one.

Numbers: q and P are rounded to f16 (K and V are f16 already) and the products summed by
the tensor core in its own order, so the result matches the float64 reference to ~1e-3
relative, not the decode kernels' bits -- the prefill GEMMs already differ from decode's
matvecs the same way (engine.PREFILL_PATHS: prefill "rows" is the path that reproduces
decode's bits, and it keeps the split-K kernels). The order is fixed, so the output is
deterministic.

Head dims 32 .. 256. W = 4 warps and KT = 32 keys up to D = 128; at D = 256, 2 warps and 16
keys (static shared memory <= 48 KB: Q 16.9 KB, K 8.4 KB, V 12.3 KB; the O accumulators,
D / 2 = 128 floats a thread).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint32

from ..jit import kernel
from ..ptx import (f32x2_to_f16x2, ld_nc_v4_u32, ld_v4_f32, mma_f16_m16n8k16, warp_max,
                   warp_max4, warp_sum4)
from ..quant import QType

HEAD_DIMS = (32, 64, 128, 256)
_NEG_INF = np.float32(-np.inf)


def tc_warps(D: int) -> int:
    """Warps (16 query rows each) of a block for head_dim D."""
    return 4 if D <= 128 else 2


def tc_keys(D: int) -> int:
    """Keys of a K / V tile for head_dim D (a multiple of 16: P V's k-step)."""
    return 32 if D <= 128 else 16


def supports(D: int, k_type, v_type) -> bool:
    """Whether this kernel serves a cache layer: F16 keys and values, head_dim in HEAD_DIMS."""
    return (int(k_type) == int(QType.F16) and int(v_type) == int(QType.F16)
            and D in HEAD_DIMS)


def _make(D: int):
    W = tc_warps(D)
    KT = tc_keys(D)
    THREADS = 32 * W
    ROWS = 16 * W
    DW = D // 2                 # f16 pairs (words) of a head row
    D4 = D // 4                 # 16-byte units of a float32 q row
    DW4 = DW // 4               # 16-byte units of an f16 K / V row
    QS = DW + 4                 # shared row strides in words (+4: conflict-free fragments)
    KS = DW + 4
    VS = KT // 2 + 4
    Q_SH = ROWS * QS
    K_SH = KT * KS
    V_SH = D * VS
    NT = KT // 8                # S tiles of 8 keys
    NS = 4 * NT                 # S values a thread
    KSTEPS = D // 16            # Q K^T k-steps
    PSTEPS = KT // 16           # P V k-steps
    DT = D // 8                 # O tiles of 8 dims
    NO = 4 * DT                 # O values a thread
    # 16-byte loads a thread: q (once), K and V (a tile); q's and K's divide evenly, V's not
    # at D = 32 (64 units for 128 threads), where the threads past them idle
    NQU = ROWS * D4 // THREADS
    NKU = KT * DW4 // THREADS
    HALF = KT // 2
    V_UNITS = HALF * DW4                    # a unit: the same 4 words of two keys
    NVU = (V_UNITS + THREADS - 1) // THREADS
    KREG = 4 * NKU
    VREG = 8 * NVU
    # the next tile's K / V loaded into registers while this one's products run (D <= 128:
    # 16 / 32 registers; at D = 256 the 64 it would take sit beside the 128 of O)
    AHEAD = D <= 128
    NEG_INF = _NEG_INF
    ZERO = uint32(0)

    @cuda.jit(device=True, inline="always")
    def load_tile(kw, vw, base, kt0, n_keys, kreg, vreg, tid):
        """This thread's words of tile kt0: K units in row order (consecutive lanes read one
        row), V units by key pair (consecutive lanes: consecutive pairs, so the transposed
        stores of `store_tile` fall on different banks). Keys past n_keys read the last key
        (any finite row: their scores are masked) and V's are zeroed (P = 0 must not meet
        a NaN)."""
        last = n_keys - 1
        for i in range(NKU):
            u = tid + i * THREADS
            kk = u // DW4
            key = min(kt0 + kk, last)
            a, b, c, d = ld_nc_v4_u32(kw, (base + key) * DW + 4 * (u - kk * DW4))
            kreg[4 * i] = a
            kreg[4 * i + 1] = b
            kreg[4 * i + 2] = c
            kreg[4 * i + 3] = d
        for i in range(NVU):
            u = min(tid + i * THREADS, V_UNITS - 1)     # (a thread past the units: stored never)
            w4 = u // HALF
            key = kt0 + 2 * (u - w4 * HALF)
            a, b, c, d = ld_nc_v4_u32(vw, (base + min(key, last)) * DW + 4 * w4)
            e, f, g, h = ld_nc_v4_u32(vw, (base + min(key + 1, last)) * DW + 4 * w4)
            ok0 = key < n_keys
            ok1 = key + 1 < n_keys
            vreg[8 * i] = a if ok0 else ZERO
            vreg[8 * i + 1] = b if ok0 else ZERO
            vreg[8 * i + 2] = c if ok0 else ZERO
            vreg[8 * i + 3] = d if ok0 else ZERO
            vreg[8 * i + 4] = e if ok1 else ZERO
            vreg[8 * i + 5] = f if ok1 else ZERO
            vreg[8 * i + 6] = g if ok1 else ZERO
            vreg[8 * i + 7] = h if ok1 else ZERO

    @cuda.jit(device=True, inline="always")
    def store_tile(k_sh, v_sh, kreg, vreg, tid):
        """`load_tile`'s words into shared memory: K rows as they are, V transposed (dims 2w,
        2w + 1 of keys 2kp, 2kp + 1 make a word of each of two transposed rows)."""
        for i in range(NKU):
            u = tid + i * THREADS
            kk = u // DW4
            at = kk * KS + 4 * (u - kk * DW4)
            for c in range(4):
                k_sh[at + c] = kreg[4 * i + c]
        for i in range(NVU):
            u = tid + i * THREADS
            if u >= V_UNITS:
                break
            w4 = u // HALF
            kp = u - w4 * HALF
            for c in range(4):
                v0 = vreg[8 * i + c]
                v1 = vreg[8 * i + 4 + c]
                w = 4 * w4 + c
                v_sh[2 * w * VS + kp] = (v0 & uint32(0xFFFF)) | (v1 << uint32(16))
                v_sh[(2 * w + 1) * VS + kp] = (v0 >> uint32(16)) | (v1 & uint32(0xFFFF0000))

    def attention_tc(qf, positions, kw, vw, ctx, scale, out):
        q_sh = cuda.shared.array(Q_SH, uint32)
        k_sh = cuda.shared.array(K_SH, uint32)
        v_sh = cuda.shared.array(V_SH, uint32)
        s = cuda.local.array(NS, float32)
        o = cuda.local.array(NO, float32)
        kreg = cuda.local.array(KREG, uint32)
        vreg = cuda.local.array(VREG, uint32)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        t4 = lane & 3
        T = out.shape[0]
        Hq = out.shape[1]
        kvh = cuda.blockIdx.y
        n_rep = Hq // cuda.gridDim.y
        M = T * n_rep
        r0 = cuda.blockIdx.x * ROWS
        # Q rows -> shared memory as f16 pairs, 16-byte loads (rows past M: zeros; a clamped
        # row is read, so every load is unconditional and they all issue together)
        for i in range(NQU):
            u = tid + i * THREADS
            rr = u // D4
            c4 = u - rr * D4
            r = min(r0 + rr, M - 1)
            tok = r // n_rep
            x0, x1, x2, x3 = ld_v4_f32(qf, ((tok * Hq) + kvh * n_rep + r - tok * n_rep) * D
                                       + 4 * c4)
            live = r0 + rr < M
            q_sh[rr * QS + 2 * c4] = f32x2_to_f16x2(x0, x1) if live else ZERO
            q_sh[rr * QS + 2 * c4 + 1] = f32x2_to_f16x2(x2, x3) if live else ZERO
        # this thread's rows (g and g + 8 of its warp's 16) and the keys each sees: 0 .. pos
        ra = r0 + 16 * warp + g
        rb = ra + 8
        pa = min(positions[ra // n_rep], ctx - 1) if ra < M else -1
        pb = min(positions[rb // n_rep], ctx - 1) if rb < M else -1
        # the keys the block walks: up to the largest position among its tokens
        t_end = min(r0 + ROWS, M)
        kmax = -1
        for tok in range(r0 // n_rep, (t_end + n_rep - 1) // n_rep):
            kmax = max(kmax, min(positions[tok], ctx - 1))
        n_keys = kmax + 1
        # the warp's last key: a warp whose rows all end before a tile skips its products
        wlim = int(warp_max(float32(max(pa, pb))))
        m_a = NEG_INF
        m_b = NEG_INF
        l_a = float32(0.0)
        l_b = float32(0.0)
        for i in range(NO):
            o[i] = float32(0.0)
        base = kvh * ctx
        if AHEAD:
            load_tile(kw, vw, base, 0, n_keys, kreg, vreg, tid)
        for kt0 in range(0, n_keys, KT):
            cuda.syncthreads()              # the last tile's readers are done (Q's writers too)
            if not AHEAD:
                load_tile(kw, vw, base, kt0, n_keys, kreg, vreg, tid)
            store_tile(k_sh, v_sh, kreg, vreg, tid)
            cuda.syncthreads()
            if AHEAD and kt0 + KT < n_keys:
                load_tile(kw, vw, base, kt0 + KT, n_keys, kreg, vreg, tid)
            if kt0 <= wlim:                 # warp-uniform
                for i in range(NS):
                    s[i] = float32(0.0)
                for ks in range(KSTEPS):
                    qa = (16 * warp + g) * QS + ks * 8 + t4
                    a0 = q_sh[qa]
                    a1 = q_sh[qa + 8 * QS]
                    a2 = q_sh[qa + 4]
                    a3 = q_sh[qa + 8 * QS + 4]
                    for j in range(NT):
                        kb = (8 * j + g) * KS + ks * 8 + t4
                        s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3] = mma_f16_m16n8k16(
                            a0, a1, a2, a3, k_sh[kb], k_sh[kb + 4],
                            s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3])
                mx_a = NEG_INF
                mx_b = NEG_INF
                for j in range(NT):
                    for e in range(2):
                        key = kt0 + 8 * j + 2 * t4 + e
                        va = s[4 * j + e] * scale if key <= pa else NEG_INF
                        vb = s[4 * j + 2 + e] * scale if key <= pb else NEG_INF
                        s[4 * j + e] = va
                        s[4 * j + 2 + e] = vb
                        mx_a = max(mx_a, va)
                        mx_b = max(mx_b, vb)
                mn_a = max(m_a, warp_max4(mx_a))
                mn_b = max(m_b, warp_max4(mx_b))
                # a row that has seen no key yet (m' = -inf) keeps O = 0, l = 0
                al_a = math.exp(m_a - mn_a) if mn_a != NEG_INF else float32(1.0)
                al_b = math.exp(m_b - mn_b) if mn_b != NEG_INF else float32(1.0)
                m_a = mn_a
                m_b = mn_b
                sum_a = float32(0.0)
                sum_b = float32(0.0)
                for j in range(NT):
                    for e in range(2):
                        p_a = math.exp(s[4 * j + e] - mn_a) if mn_a != NEG_INF else float32(0.0)
                        p_b = (math.exp(s[4 * j + 2 + e] - mn_b) if mn_b != NEG_INF
                               else float32(0.0))
                        s[4 * j + e] = p_a
                        s[4 * j + 2 + e] = p_b
                        sum_a += p_a
                        sum_b += p_b
                l_a = l_a * al_a + sum_a
                l_b = l_b * al_b + sum_b
                for i in range(DT):
                    o[4 * i] *= al_a
                    o[4 * i + 1] *= al_a
                    o[4 * i + 2] *= al_b
                    o[4 * i + 3] *= al_b
                for kc in range(PSTEPS):
                    j0 = 8 * kc             # S values of key tiles 2kc, 2kc + 1
                    a0 = f32x2_to_f16x2(s[j0], s[j0 + 1])
                    a1 = f32x2_to_f16x2(s[j0 + 2], s[j0 + 3])
                    a2 = f32x2_to_f16x2(s[j0 + 4], s[j0 + 5])
                    a3 = f32x2_to_f16x2(s[j0 + 6], s[j0 + 7])
                    for dj in range(DT):
                        vb_ = (8 * dj + g) * VS + kc * 8 + t4
                        o[4 * dj], o[4 * dj + 1], o[4 * dj + 2], o[4 * dj + 3] = mma_f16_m16n8k16(
                            a0, a1, a2, a3, v_sh[vb_], v_sh[vb_ + 4],
                            o[4 * dj], o[4 * dj + 1], o[4 * dj + 2], o[4 * dj + 3])
        l_a = warp_sum4(l_a)
        l_b = warp_sum4(l_b)
        if ra < M:
            tok = ra // n_rep
            h = kvh * n_rep + ra - tok * n_rep
            inv = float32(1.0) / l_a
            for dj in range(DT):
                out[tok, h, 8 * dj + 2 * t4] = o[4 * dj] * inv
                out[tok, h, 8 * dj + 2 * t4 + 1] = o[4 * dj + 1] * inv
        if rb < M:
            tok = rb // n_rep
            h = kvh * n_rep + rb - tok * n_rep
            inv = float32(1.0) / l_b
            for dj in range(DT):
                out[tok, h, 8 * dj + 2 * t4] = o[4 * dj + 2] * inv
                out[tok, h, 8 * dj + 2 * t4 + 1] = o[4 * dj + 3] * inv

    attention_tc.__name__ = attention_tc.__qualname__ = f"attention_tc_d{D}"
    return kernel(attention_tc)


attention_tc_d32 = _make(32)
attention_tc_d64 = _make(64)
attention_tc_d128 = _make(128)
attention_tc_d256 = _make(256)
_KERNELS = {32: attention_tc_d32, 64: attention_tc_d64, 128: attention_tc_d128,
            256: attention_tc_d256}


def launch_attention_tc(q, positions, k_u8, v_u8, out, scale=None, stream=0):
    """Causal GQA attention of q[T, Hq, D] (float32, already rotated) at device positions[T]
    over one F16 cache layer (`KVCache.layer(slot)`'s byte views k_u8 / v_u8, [Hkv, ctx, 2D]),
    which must already hold positions 0 .. max(positions): out[T, Hq, D] float32.
    Reference: ops.attention over the cache's keys 0 .. position of each token."""
    T, Hq, D = q.shape
    Hkv, ctx, row_bytes = k_u8.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"attention_tc: head_dim {D} not in {HEAD_DIMS}")
    if row_bytes != 2 * D or tuple(v_u8.shape) != (Hkv, ctx, 2 * D):
        raise ValueError(f"attention_tc: an F16 cache of head_dim {D} has rows of {2 * D} bytes, "
                         f"not K {tuple(k_u8.shape)} / V {tuple(v_u8.shape)}")
    if Hq % Hkv:
        raise ValueError(f"attention_tc: query heads {Hq} not a multiple of kv heads {Hkv}")
    if tuple(out.shape) != (T, Hq, D):
        raise ValueError(f"attention_tc: out {tuple(out.shape)} is not q's {(T, Hq, D)}")
    kern, threads, rows = _KERNELS[D], 32 * tc_warps(D), 16 * tc_warps(D)
    scale = np.float32(1.0 / math.sqrt(D) if scale is None else scale)
    kw = k_u8.reshape(k_u8.size).view(np.uint32)
    vw = v_u8.reshape(v_u8.size).view(np.uint32)
    grid = ((T * (Hq // Hkv) + rows - 1) // rows, Hkv)
    kern[grid, threads, stream](q.reshape(q.size), positions, kw, vw, np.int32(ctx), scale, out)


_SIG = "void(float32[::1], int32[::1], uint32[::1], uint32[::1], int32, float32, float32[:, :, ::1])"
PTX_SIGNATURES = {f"attention_tc_d{D}": [_SIG] for D in HEAD_DIMS}
EXPECTED_PTX = {name: ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "cvt.rn.f16x2.f32"]
                for name in PTX_SIGNATURES}
