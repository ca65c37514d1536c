"""Causal grouped-query attention: FlashAttention-style prefill and split-K decode.

Reference: bw24nb/reference/ops.py `attention(q, k, v, causal_offset, scale)`; for the
quantized cache, the reference runs on the cache's dequantized contents
(`KVCache.read` / `bw24nb.quant.dequantize`), so only float32 rounding separates the two.

Shapes: q[T, Hq, D] float32 (after RoPE), out[T, Hq, D] float32. Query token t sits at the
absolute position positions[t] (int32 device array, the one RoPE and the KV store read) and
sees keys 0 .. positions[t]. K/V come either as float32 [S, Hkv, D] arrays or from one layer of
the quantized cache (bw24nb/cache/kv.py: `rows_u8[Hkv, ctx, row_bytes]` + its f16 view + the
QType id, dequantized in registers by `kv_load`). Query head h reads KV head h // n_rep.

Blocking. A block owns one KV head and up to ATTN_ROWS query *rows*, a row being a
(token, head-in-group) pair, flattened as row = t * n_rep + j for query head kvh * n_rep + j.
So all n_rep heads sharing a KV head are served by one K/V tile load (the GQA saving), and a
decode step (T = 1) is just a block with n_rep rows. Keys stream through shared memory in
tiles of ATTN_KEYS:
    1. K tile -> shared (dequantized, rows padded to D + 1 floats: the score loop reads one
       column across 8 keys, and the pad puts those 8 reads in 8 different banks);
    2. scores s[r, p] = (sum_d q[r, d] * k[p, d]) * scale, d ascending, float32, -inf where
       key position > positions[t_r] (causal) or past the tile;
    3. online softmax, one thread per row: m' = max(m, max_p s), alpha = exp(m - m'),
       p = exp(s - m'), l = l * alpha + sum_p p (p ascending);
    4. V tile -> shared (reusing the K buffer);
    5. acc[r, d] = acc[r, d] * alpha + sum_p p[r, p] * v[p, d] (p ascending).
Everything is float32; every sum above has a fixed order, so results are deterministic.
Prefill writes out = acc / l. Shared memory: ~41 KB at HEAD_DIM_MAX = 256 (under the 48 KB
static limit); head_dim is a runtime value <= HEAD_DIM_MAX.

Decode (split-K). A query token's context 0 .. n_ctx-1 (n_ctx = its position + 1, read on the
device so a captured graph replays at every length) is cut into contiguous chunks of
max(DECODE_MIN_CHUNK, ceil(n_ctx / n_splits)) keys, `used` <= n_splits of them; block
(split, kvh, row tile of one token) runs steps 1-5 over its chunk and writes the unnormalized partial
(m, l, acc[D]); blocks past `used` exit at once. `flash_decode_combine` merges the partials of
each (t, head) in split order 0, 1, ..., with M = max m_s, w_s = exp(m_s - M),
out = (sum_s w_s acc_s) / (sum_s w_s l_s); splits with no visible key (l = 0) are skipped. No
atomics: a row's result depends only on n_splits and its own position, so a speculative
verify over K+1 tokens (T = K+1) reproduces each token's decode step bit for bit.
Note the decode and prefill paths sum in different orders (chunked vs. one pass), so their
outputs agree to float32 rounding, not bit for bit.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from ..jit import kernel
from ..cache.kv import kv_load
from ..ptx import warp_max, warp_sum
from .activation import sigmoid
from .quantize_act import q8_code

# 128 threads: scores are ATTN_ROWS x ATTN_KEYS = 128 dot products, one per thread.
ATTN_THREADS = 128
# 16 query rows x 8 keys per tile: with head_dim up to 256 the q tile (16 x 257 floats), the
# accumulator (16 x 256) and one K-or-V tile (8 x 257) fill ~41 KB of the 48 KB static shared
# memory; 16 rows also covers the largest GQA group of the Qwen family (Hq / Hkv = 16) in one
# decode block.
ATTN_ROWS = 16
ATTN_KEYS = 8
HEAD_DIM_MAX = 256
# Decode grid target: ~2 blocks per SM of a 132-SM H200 so the split-K pass fills the chip at
# batch 1; more splits only lengthen the combine.
DECODE_TARGET_BLOCKS = 264
DECODE_SPLITS_MAX = 256
# Fewest keys a split takes. Measured on the H200 (bench/attention_bench.py,
# research/tune-data/attention.jsonl, commit a9e71dd): at 512 tokens of context min_chunk 16
# took 20.6 us (0.5B heads) / 42.9 us (9B heads) a launch pair, 32 took 25.1 / 65.9 us; at 6144
# both are the same (ceil(ctx / n_splits) > 32 there). Before the min chunk existed, 132 splits
# of 4 keys each cost 67 us a layer, mostly in the combine.
DECODE_MIN_CHUNK = 16
# A split longer than min_chunk is rounded up to a multiple of this many keys: 128 = a 32-key
# tile for each of decode_attention.py's 4 warps, so no warp of a long split idles (at 6144
# tokens the plain ceil(n_ctx / n_splits) gave 0.5B splits of 47 keys: 2 busy warps of 4). 1 =
# no rounding (the plan before session 7). Measured on the H200 (session 7, attention.jsonl,
# split + combine a layer): 0.5B heads at 6144 tokens 22.4 -> 20.2 us, 9B heads at 2048
# 31.1 -> 29.0 and at 6144 35.2 -> 33.8; unchanged at 512 (chunks stay at min_chunk there).
DECODE_CHUNK_ALIGN = 128
# Decode split kernel tiles: 32 keys (one per lane in the softmax), 16 when head_dim > 128
# so the K/V tile (keys x (D + 1) floats) fits beside the q rows in 48 KB of shared memory.
DECODE_KT = 32
DECODE_KT_WIDE_D = 128
_DEC_KV_SH = DECODE_KT * (DECODE_KT_WIDE_D + 1)     # >= 16 * (256 + 1) too
_DEC_S_SH = ATTN_ROWS * DECODE_KT                   # p of every row for one tile
DECODE_THREADS = 256                                # 8 warps: rows and PV groups spread wider
# The combine: one split per thread for (m, l) (so DECODE_SPLITS_MAX <= its threads), and
# threads / D groups sharing the per-dimension sums over the splits, each walking its run of
# splits one L2 round trip per 4. The block size is a launch parameter (the plan's order follows
# it); COMBINE_THREADS_MAX sizes shared memory. 1024 threads (4x the groups, a quarter of the
# round trips) measured slower on the H200 at every shape: 0.5B heads 15.5 -> 22.7 us a layer
# at 512 tokens, 9B heads 35.2 -> 37.1 at 6144 (session 7, research/tune-data/attention.jsonl):
# the wider block's barriers and its 32-warp max / sum cost more than the loads it overlaps.
COMBINE_THREADS = 256
COMBINE_THREADS_MAX = 1024
# A head's combine is one block per COMBINE_SLICE_DIMS of its dims (`combine_slices`), and a
# thread loads COMBINE_BATCH of its partials a round trip (the first batch before the (m, l)
# reduction). Session 16: with one block a head and four loads a round trip after the
# reduction, the combine was half of decode attention (launch_chain, research/tune-data).
COMBINE_SLICE_DIMS = 64
COMBINE_BATCH = 8
COMBINE_BATCH_MAX = 16
# Prefill's combine (T x Hq blocks, at most PREFILL_SPLITS splits a token): 2 partials a round
# trip cover a group's run there, in fewer registers than COMBINE_BATCH (`combine_kernel`).
# Session 17: with the batch of 8, the 0.5B prefill's attention took 4.34 ms against 3.60.
PREFILL_COMBINE_BATCH = 2
_COMBINE_WARPS = COMBINE_THREADS_MAX // 32

_NEG_INF = np.float32(-np.inf)
# shared-array sizes (numba wants each size as one constant)
_Q_SH = ATTN_ROWS * (HEAD_DIM_MAX + 1)
_ACC_SH = ATTN_ROWS * HEAD_DIM_MAX
_KV_SH = ATTN_KEYS * (HEAD_DIM_MAX + 1)
_S_SH = ATTN_ROWS * ATTN_KEYS


# ------------------------------------------------------------------ tile loaders


@cuda.jit(device=True)
def _load_tile_f32(kv_sh, src, unused_half, unused_type, kvh, key0, nk, D):
    """kv_sh[p * (D + 1) + d] = src[key0 + p, kvh, d] for p < nk (src float32 [S, Hkv, D])."""
    DP = D + 1
    for i in range(cuda.threadIdx.x, nk * D, cuda.blockDim.x):
        p = i // D
        d = i - p * D
        kv_sh[p * DP + d] = src[key0 + p, kvh, d]


@cuda.jit(device=True, inline="always")
def _tile_value(rows_u8, rows_f16, qtype, kvh, key0, i, n, D):
    """Element i of the tile (key i // D, dim i % D), 0 past n (a clamped, in-bounds read)."""
    j = min(i, n - 1)
    p = j // D
    v = kv_load(rows_u8, rows_f16, qtype, kvh, key0 + p, j - p * D)
    return v if i < n else float32(0.0)


@cuda.jit(device=True, inline="always")
def _store_tile(kv_sh, i, n, D, v):
    if i < n:
        p = i // D
        kv_sh[p * (D + 1) + i - p * D] = v


@cuda.jit(device=True)
def _load_tile_cache(kv_sh, rows_u8, rows_f16, qtype, kvh, key0, nk, D):
    """As _load_tile_f32, from a quantized cache layer (consecutive threads read consecutive
    bytes of one contiguous (head, position) range). Four elements a thread per step, all four
    loads issued before the first store: a step costs one memory latency, not four."""
    n = nk * D
    nt = cuda.blockDim.x
    for i in range(cuda.threadIdx.x, n, 4 * nt):
        v0 = _tile_value(rows_u8, rows_f16, qtype, kvh, key0, i, n, D)
        v1 = _tile_value(rows_u8, rows_f16, qtype, kvh, key0, i + nt, n, D)
        v2 = _tile_value(rows_u8, rows_f16, qtype, kvh, key0, i + 2 * nt, n, D)
        v3 = _tile_value(rows_u8, rows_f16, qtype, kvh, key0, i + 3 * nt, n, D)
        _store_tile(kv_sh, i, n, D, v0)
        _store_tile(kv_sh, i + nt, n, D, v1)
        _store_tile(kv_sh, i + 2 * nt, n, D, v2)
        _store_tile(kv_sh, i + 3 * nt, n, D, v3)


# ------------------------------------------------------------------ the shared core


@cuda.jit(device=True)
def _load_rows(q, positions, kvh, n_rep, row0, row_end, q_sh, lim_sh):
    """Stage query rows row0 .. row0 + n_rows - 1 (< row_end) of KV head kvh into q_sh
    (stride D + 1) and their causal limits into lim_sh; returns n_rows. Caller syncs."""
    T, _, D = q.shape
    DP = D + 1
    n_rows = min(ATTN_ROWS, row_end - row0)
    for i in range(cuda.threadIdx.x, n_rows * D, cuda.blockDim.x):
        r = i // D
        d = i - r * D
        g = row0 + r
        t = g // n_rep
        q_sh[r * DP + d] = q[t, kvh * n_rep + (g - t * n_rep), d]
    tid = cuda.threadIdx.x
    if tid < n_rows:
        lim_sh[tid] = positions[(row0 + tid) // n_rep]
    return n_rows


def _make_attend(load_tile):
    """The tile loop (steps 1-5 of the module docstring) over keys [key_begin, key_end), for a
    given K/V tile loader. Leaves acc (unnormalized), m and l of each row in shared memory."""

    @cuda.jit(device=True)
    def attend(ka, kb, kt, va, vb, vt, kvh, n_rows, key_begin, key_end, D, scale,
               q_sh, acc_sh, kv_sh, s_sh, m_sh, l_sh, alpha_sh, lim_sh):
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        DP = D + 1
        for i in range(tid, n_rows * D, nt):
            acc_sh[i] = float32(0.0)
        if tid < n_rows:
            m_sh[tid] = _NEG_INF
            l_sh[tid] = float32(0.0)
        cuda.syncthreads()
        for key0 in range(key_begin, key_end, ATTN_KEYS):
            nk = min(ATTN_KEYS, key_end - key0)
            load_tile(kv_sh, ka, kb, kt, kvh, key0, nk, D)
            cuda.syncthreads()
            # 2. scores
            for i in range(tid, n_rows * ATTN_KEYS, nt):
                r = i // ATTN_KEYS
                p = i - r * ATTN_KEYS
                s = _NEG_INF
                if p < nk and key0 + p <= lim_sh[r]:
                    dot = float32(0.0)
                    for d in range(D):
                        dot += q_sh[r * DP + d] * kv_sh[p * DP + d]
                    s = dot * scale
                s_sh[i] = s
            cuda.syncthreads()
            # 3. online softmax, one thread per row
            if tid < n_rows:
                base = tid * ATTN_KEYS
                m_old = m_sh[tid]
                mx = m_old
                for p in range(nk):
                    mx = max(mx, s_sh[base + p])
                alpha = float32(1.0)
                tile_sum = float32(0.0)
                if mx != _NEG_INF:
                    alpha = math.exp(m_old - mx)
                    for p in range(nk):
                        e = math.exp(s_sh[base + p] - mx)
                        s_sh[base + p] = e
                        tile_sum += e
                else:                       # nothing visible yet (a row past its limit)
                    for p in range(nk):
                        s_sh[base + p] = float32(0.0)
                m_sh[tid] = mx
                l_sh[tid] = l_sh[tid] * alpha + tile_sum
                alpha_sh[tid] = alpha
            cuda.syncthreads()              # K tile no longer read: V may overwrite it
            # 4. V tile
            load_tile(kv_sh, va, vb, vt, kvh, key0, nk, D)
            cuda.syncthreads()
            # 5. accumulate
            for i in range(tid, n_rows * D, nt):
                r = i // D
                d = i - r * D
                a = acc_sh[i] * alpha_sh[r]
                base = r * ATTN_KEYS
                for p in range(nk):
                    a += s_sh[base + p] * kv_sh[p * DP + d]
                acc_sh[i] = a
            cuda.syncthreads()

    return attend


_attend_f32 = _make_attend(_load_tile_f32)
_attend_cache = _make_attend(_load_tile_cache)


@cuda.jit(device=True)
def _max_limit(lim_sh, n_rows):
    top = int32(-1)
    for r in range(n_rows):
        top = max(top, lim_sh[r])
    return top


@cuda.jit(device=True)
def _write_out(out, acc_sh, l_sh, kvh, n_rep, row0, n_rows, D):
    for i in range(cuda.threadIdx.x, n_rows * D, cuda.blockDim.x):
        r = i // D
        d = i - r * D
        g = row0 + r
        t = g // n_rep
        out[t, kvh * n_rep + (g - t * n_rep), d] = acc_sh[i] / l_sh[r]


# ------------------------------------------------------------------ kernels


@kernel
def flash_attn_f32(q, k, v, positions, scale, out):
    """Causal GQA attention with float32 K/V [S, Hkv, D]. Grid (row tiles, Hkv)."""
    q_sh = cuda.shared.array(_Q_SH, float32)
    acc_sh = cuda.shared.array(_ACC_SH, float32)
    kv_sh = cuda.shared.array(_KV_SH, float32)
    s_sh = cuda.shared.array(_S_SH, float32)
    m_sh = cuda.shared.array(ATTN_ROWS, float32)
    l_sh = cuda.shared.array(ATTN_ROWS, float32)
    alpha_sh = cuda.shared.array(ATTN_ROWS, float32)
    lim_sh = cuda.shared.array(ATTN_ROWS, int32)
    kvh = cuda.blockIdx.y
    n_rep = q.shape[1] // k.shape[1]
    D = q.shape[2]
    row0 = cuda.blockIdx.x * ATTN_ROWS
    n_rows = _load_rows(q, positions, kvh, n_rep, row0, q.shape[0] * n_rep, q_sh, lim_sh)
    cuda.syncthreads()
    key_end = min(_max_limit(lim_sh, n_rows) + 1, k.shape[0])
    _attend_f32(k, k, 0, v, v, 0, kvh, n_rows, 0, key_end, D, scale,
                q_sh, acc_sh, kv_sh, s_sh, m_sh, l_sh, alpha_sh, lim_sh)
    _write_out(out, acc_sh, l_sh, kvh, n_rep, row0, n_rows, D)


@kernel
def flash_attn_cache(q, positions, k_u8, k_f16, k_type, v_u8, v_f16, v_type, scale, out):
    """Causal GQA attention over one layer of the quantized KV cache. Grid (row tiles, Hkv)."""
    q_sh = cuda.shared.array(_Q_SH, float32)
    acc_sh = cuda.shared.array(_ACC_SH, float32)
    kv_sh = cuda.shared.array(_KV_SH, float32)
    s_sh = cuda.shared.array(_S_SH, float32)
    m_sh = cuda.shared.array(ATTN_ROWS, float32)
    l_sh = cuda.shared.array(ATTN_ROWS, float32)
    alpha_sh = cuda.shared.array(ATTN_ROWS, float32)
    lim_sh = cuda.shared.array(ATTN_ROWS, int32)
    kvh = cuda.blockIdx.y
    n_rep = q.shape[1] // k_u8.shape[0]
    D = q.shape[2]
    row0 = cuda.blockIdx.x * ATTN_ROWS
    n_rows = _load_rows(q, positions, kvh, n_rep, row0, q.shape[0] * n_rep, q_sh, lim_sh)
    cuda.syncthreads()
    key_end = min(_max_limit(lim_sh, n_rows) + 1, k_u8.shape[1])
    _attend_cache(k_u8, k_f16, k_type, v_u8, v_f16, v_type, kvh, n_rows, 0, key_end, D, scale,
                  q_sh, acc_sh, kv_sh, s_sh, m_sh, l_sh, alpha_sh, lim_sh)
    _write_out(out, acc_sh, l_sh, kvh, n_rep, row0, n_rows, D)


@cuda.jit(device=True, inline="always")
def _split_plan(position, ctx, n_splits, min_chunk, align):
    """(n_ctx, chunk, used) for a query token at `position`: the keys it sees
    (min(position + 1, ctx)), keys per split -- ceil(n_ctx / n_splits), but at least
    min_chunk, so a short context runs on a few well-filled blocks instead of n_splits nearly
    empty ones, and above min_chunk rounded up to a multiple of `align` (DECODE_CHUNK_ALIGN) --
    and how many splits that takes (never more than n_splits: chunks only grow). A function of
    the token's own position only: the split pass and the combine derive it from the same
    device-side value (one captured graph serves every length), and a token verified among K+1
    gets the plan, hence the summation order, it has when decoded alone."""
    n_ctx = min(position + 1, ctx)
    chunk = max(min_chunk, (n_ctx + n_splits - 1) // n_splits)
    if chunk > min_chunk:
        chunk = (chunk + align - 1) // align * align
    return n_ctx, chunk, (n_ctx + chunk - 1) // chunk


@cuda.jit(device=True, inline="always")
def block_max(v, red_sh, lane, warp, n_warps):
    """The largest of v over the block's n_warps warps, to every thread (max is exact in any
    order): warp_max, then the warps' maxima through red_sh. Every thread calls it; it holds
    one block barrier, and red_sh may be rewritten only after another."""
    wm = warp_max(v)
    if lane == 0:
        red_sh[warp] = wm
    cuda.syncthreads()
    M = red_sh[0]
    for j in range(1, n_warps):
        M = max(M, red_sh[j])
    return M


@cuda.jit(device=True, inline="always")
def online_softmax_step(s, m_old):
    """One row's online-softmax step over a tile, this lane's score s (-inf: no key):
    (m', p, alpha) with m' = max(m_old, warp_max(s)), p = exp(s - m') and alpha = exp(m_old -
    m'), or p = 0, alpha = 1 while the row has no key (m' = -inf). The caller adds warp_sum(p)
    to l alpha. Every split pass takes this step (decode_attention.py too)."""
    m_new = max(m_old, warp_max(s))
    p, alpha = softmax_weights(s, m_old, m_new)
    return m_new, p, alpha


@cuda.jit(device=True, inline="always")
def softmax_weights(s, m_old, m_new):
    """(p, alpha) of an online-softmax step whose new maximum m_new is known (however it was
    reduced): exp(s - m_new) and exp(m_old - m_new), or 0 and 1 while there is no key."""
    p = float32(0.0)
    alpha = float32(1.0)
    if m_new != _NEG_INF:
        p = math.exp(s - m_new)
        alpha = math.exp(m_old - m_new)
    return p, alpha


@kernel
def flash_decode_split(q, positions, k_u8, k_f16, k_type, v_u8, v_f16, v_type, scale,
                       min_chunk, chunk_align, part_ml, part_acc):
    """Split-K pass over the quantized cache. Grid (n_splits, Hkv, T * row tiles per token),
    DECODE_THREADS. part_ml[T, Hq, n_splits, 2] gets (m, l), part_acc[T, Hq, n_splits, D] the
    unnormalized accumulator of this block's chunk. A block serves the rows (heads of the
    GQA group) of one token only, chunked by that token's own position (`_split_plan`): row
    (t, h) of a T-token launch is bit-identical to the same row decoded alone (T = 1), which
    speculative verify relies on.

    Decode has few rows (T * n_rep <= 16) and a short chunk, and a split runs as one block on
    an otherwise idle SM: the time is latency, so every inner loop keeps four independent
    chains in flight. Per tile of KT keys (32, or 16 when D > 128, so the tile fits beside q
    in shared memory):
      1. the K tile -> shared, four loads in flight per thread (`_load_tile_cache`);
      2. warp w takes rows w, w + 8, ...; lane j is key j of the tile: its score q . k as four
         interleaved partial sums over d (d = 4i + c into sum c, then (s0 + s1) + (s2 + s3)),
         times scale, -inf past the chunk or the row's causal limit; then the online softmax
         m' = max(m, warp_max(s)), p = exp(s - m'), l = l exp(m - m') + warp_sum(p);
      3. the V tile -> shared (over K);
      4. thread (d, group g) of G = DECODE_THREADS // D groups updates rows g, g + G, ...:
         acc[r, d] = acc[r, d] alpha_r + sum_j p[r, j] v[j, d], the sum again as four
         interleaved partial sums over the tile's keys (j = 4i + c into sum c).
    The first version (8-key tiles, one thread per row doing the softmax serially, one
    dependent shared load per step of every dot) spent ~13 us per 32-key tile on the H200."""
    q_sh = cuda.shared.array(_Q_SH, float32)
    kv_sh = cuda.shared.array(_DEC_KV_SH, float32)
    s_sh = cuda.shared.array(_DEC_S_SH, float32)
    m_sh = cuda.shared.array(ATTN_ROWS, float32)
    l_sh = cuda.shared.array(ATTN_ROWS, float32)
    alpha_sh = cuda.shared.array(ATTN_ROWS, float32)
    lim_sh = cuda.shared.array(ATTN_ROWS, int32)
    acc = cuda.local.array(ATTN_ROWS, float32)
    split = cuda.blockIdx.x
    n_splits = cuda.gridDim.x
    kvh = cuda.blockIdx.y
    n_rep = q.shape[1] // k_u8.shape[0]
    tiles = (n_rep + ATTN_ROWS - 1) // ATTN_ROWS       # row tiles per token
    tok = cuda.blockIdx.z // tiles
    row0 = tok * n_rep + (cuda.blockIdx.z - tok * tiles) * ATTN_ROWS
    D = q.shape[2]
    DP = D + 1
    n_ctx, chunk, used = _split_plan(positions[tok], k_u8.shape[1], n_splits, min_chunk,
                                     chunk_align)
    if split >= used:
        return                      # past the context: the combine never reads this split
    key_begin = split * chunk
    key_end = min(key_begin + chunk, n_ctx)
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    n_warps = cuda.blockDim.x >> 5
    G = cuda.blockDim.x // D        # PV thread groups; thread (d, g) with g < G works
    g = tid // D
    d = tid - g * D
    n_rows = _load_rows(q, positions, kvh, n_rep, row0, (tok + 1) * n_rep, q_sh, lim_sh)
    if tid < n_rows:
        m_sh[tid] = _NEG_INF
        l_sh[tid] = float32(0.0)
    for j in range(ATTN_ROWS):
        acc[j] = float32(0.0)
    KT = DECODE_KT if D <= DECODE_KT_WIDE_D else DECODE_KT // 2
    D4 = D - (D & 3)
    cuda.syncthreads()
    for key0 in range(key_begin, key_end, KT):
        nk = min(KT, key_end - key0)
        _load_tile_cache(kv_sh, k_u8, k_f16, k_type, kvh, key0, nk, D)
        cuda.syncthreads()
        for r in range(warp, n_rows, n_warps):
            s = _NEG_INF
            if lane < nk and key0 + lane <= lim_sh[r]:
                qb = r * DP
                kb = lane * DP
                s0 = float32(0.0)
                s1 = float32(0.0)
                s2 = float32(0.0)
                s3 = float32(0.0)
                for e in range(0, D4, 4):
                    s0 += q_sh[qb + e] * kv_sh[kb + e]
                    s1 += q_sh[qb + e + 1] * kv_sh[kb + e + 1]
                    s2 += q_sh[qb + e + 2] * kv_sh[kb + e + 2]
                    s3 += q_sh[qb + e + 3] * kv_sh[kb + e + 3]
                for e in range(D4, D):
                    s0 += q_sh[qb + e] * kv_sh[kb + e]
                s = ((s0 + s1) + (s2 + s3)) * scale
            m_old = m_sh[r]
            m_new, p, alpha = online_softmax_step(s, m_old)
            tile_sum = warp_sum(p)
            if lane < KT:
                s_sh[r * DECODE_KT + lane] = p
            if lane == 0:
                m_sh[r] = m_new
                l_sh[r] = l_sh[r] * alpha + tile_sum
                alpha_sh[r] = alpha
        cuda.syncthreads()          # K no longer read: V may overwrite it
        _load_tile_cache(kv_sh, v_u8, v_f16, v_type, kvh, key0, nk, D)
        cuda.syncthreads()
        if g < G:
            nk4 = nk - (nk & 3)
            ri = 0
            for r in range(g, n_rows, G):
                pb = r * DECODE_KT
                a0 = float32(0.0)
                a1 = float32(0.0)
                a2 = float32(0.0)
                a3 = float32(0.0)
                for kk in range(0, nk4, 4):
                    a0 += s_sh[pb + kk] * kv_sh[kk * DP + d]
                    a1 += s_sh[pb + kk + 1] * kv_sh[(kk + 1) * DP + d]
                    a2 += s_sh[pb + kk + 2] * kv_sh[(kk + 2) * DP + d]
                    a3 += s_sh[pb + kk + 3] * kv_sh[(kk + 3) * DP + d]
                for kk in range(nk4, nk):
                    a0 += s_sh[pb + kk] * kv_sh[kk * DP + d]
                acc[ri] = acc[ri] * alpha_sh[r] + ((a0 + a1) + (a2 + a3))
                ri += 1
        cuda.syncthreads()          # the next tile overwrites kv_sh and s_sh
    if g < G:
        ri = 0
        for r in range(g, n_rows, G):
            gr = row0 + r
            t = gr // n_rep
            part_acc[t, kvh * n_rep + (gr - t * n_rep), split, d] = acc[ri]
            ri += 1
    if tid < n_rows:
        gr = row0 + tid
        t = gr // n_rep
        h = kvh * n_rep + (gr - t * n_rep)
        part_ml[t, h, split, 0] = m_sh[tid]
        part_ml[t, h, split, 1] = l_sh[tid]


def _make_combine(BATCH: int):
    """The combine kernel loading BATCH partials a round trip (`combine_kernel`)."""

    def flash_decode_combine(positions, ctx, min_chunk, chunk_align, part_ml, part_acc, out,
                             gate, xq, xd, has_gate, has_q8):
        """Merge the split-K partials of one (t, head, slice of the head's dims). Grid
        T * Hq * slices (`combine_slices`: the head's D dims in slices of DS = D / slices), a power
        of two >= 256 threads (COMBINE_THREADS; <= COMBINE_THREADS_MAX).

        Every step is parallel, with a fixed order (so the result is deterministic):
          1. thread s < used reads (m_s, l_s); M = max over the visible splits (l_s > 0) by
             warp_max, then the warp maxima (max is exact in any order);
          2. w_s = exp(m_s - M) (0 for an empty split) into shared; L = sum_s l_s w_s by warp_sum's
             tree within each warp of 32 splits, then the warps' sums in warp order;
          3. the slice's DS outputs: G = blockDim / Dp groups of Dp threads (Dp = DS rounded up to
             a power of two); group g sums splits g, g + G, g + 2G, ... (< used) ascending; the
             groups' sums are added in group order; out = that / L.
        The first BATCH partials of a thread's splits, the (m, l) of step 1 and the gate of
        step 4 are loaded together, while the token's position is in flight (a group's splits
        do not depend on the plan; those past `used` are loaded and never added), so one L2
        round trip serves them all; the rest follow BATCH loads a round trip. (Session 16,
        launch_chain: the combine with one block a head, its loads after step 2 and four at a
        time, cost 7.5 us of the 0.5B heads' 16.4 us a layer at 512 tokens and 16 us of the 9B
        heads' 31. Session 18: the strided groups, whose loads no longer wait for the
        position; before, group g summed the run [g * per, (g + 1) * per).)
        Then, in the same threads (decode's next two launches folded in, each with its own
        arithmetic, so the bits are those of the separate launches):
          4. has_gate: out *= sigmoid(gate) (activation.sigmoid_mul; gate flat [T * Hq * D]);
          5. has_q8: xq, xd = quantize_act_q8(out) over the flat [T * Hq * D] output (D % 32 == 0,
             and DS % 32 == 0, so a 32-value block is one warp of group 0 and its amax a
             warp_max), the int8 input of the attn_output matvec."""
        w_sh = cuda.shared.array(DECODE_SPLITS_MAX, float32)
        red_sh = cuda.shared.array(_COMBINE_WARPS, float32)
        acc_sh = cuda.shared.array(COMBINE_THREADS_MAX, float32)
        xs = cuda.local.array(BATCH, float32)
        T, Hq, S, D = part_acc.shape
        slices = cuda.gridDim.x // (T * Hq)
        DS = D // slices
        th = cuda.blockIdx.x // slices
        d0 = (cuda.blockIdx.x - th * slices) * DS
        t = th // Hq
        h = th - t * Hq
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        n_warps = cuda.blockDim.x >> 5
        position = positions[t]                 # issued first; nothing below waits for it
        # this thread's place in step 3, and its first batch of partials, loaded with step 1's
        Dp = 32
        while Dp < DS:
            Dp *= 2
        G = cuda.blockDim.x // Dp
        g = tid // Dp
        d = tid - g * Dp
        mine = d < DS
        for j in range(BATCH):
            xs[j] = float32(0.0)
            if mine and g + G * j < S:
                xs[j] = part_acc[t, h, g + G * j, d0 + d]
        i = (t * Hq + h) * D + d0 + d
        gv = float32(0.0)
        if has_gate and g == 0 and d < DS:
            gv = gate[i]
        m_s = _NEG_INF
        l_s = float32(0.0)
        if tid < S:
            m_s = part_ml[t, h, tid, 0]
            l_s = part_ml[t, h, tid, 1]
        _, _, used = _split_plan(position, ctx, S, min_chunk, chunk_align)
        m = _NEG_INF
        if tid >= used:
            l_s = float32(0.0)
        elif l_s > float32(0.0):
            m = m_s
        M = block_max(m, red_sh, lane, warp, n_warps)
        w = float32(0.0)
        if m != _NEG_INF:
            w = float32(math.exp(m - M))     # (float32 in the simulator too)
        if tid < S:
            w_sh[tid] = w
        ls = warp_sum(l_s * w)
        cuda.syncthreads()                      # every thread has read red_sh (the maxima)
        if lane == 0:
            red_sh[warp] = ls
        cuda.syncthreads()
        L = red_sh[0]
        for j in range(1, n_warps):
            L += red_sh[j]
        # 3. groups of Dp threads over their splits g + G j, ascending: the loaded batch, then
        # the rest
        a = float32(0.0)
        if mine:
            n_mine = (used - g + G - 1) // G if g < used else 0
            for b in range(0, n_mine, BATCH):
                if b > 0:                       # (the first batch is loaded above)
                    for j in range(BATCH):
                        if b + j < n_mine:
                            xs[j] = part_acc[t, h, g + G * (b + j), d0 + d]
                for j in range(BATCH):
                    if b + j < n_mine:
                        a += xs[j] * w_sh[g + G * (b + j)]
        acc_sh[tid] = a
        cuda.syncthreads()
        if g == 0 and d < DS:
            total = acc_sh[d]
            for j in range(1, G):
                total += acc_sh[j * Dp + d]
            v = total / L
            if has_gate:
                v = v * sigmoid(gv)
            out[t, h, d0 + d] = v
            if has_q8:
                code, scale = q8_code(v, warp_max(abs(v)))
                xq[i] = code
                if (d & 31) == 0:
                    xd[i >> 5] = scale

    if BATCH != COMBINE_BATCH:
        flash_decode_combine.__name__ = flash_decode_combine.__qualname__ = \
            f"flash_decode_combine_b{BATCH}"
    # a small batch fits in 48 registers: 5 blocks of 256 threads an SM (sm_90); 50 would be
    # allocated as 56, 4 blocks (prefill's many blocks are what this batch is for)
    return kernel(flash_decode_combine, **({} if BATCH > 2 else dict(max_registers=48)))


_COMBINE_KERNELS: dict = {}


def combine_kernel(batch: int = COMBINE_BATCH):
    """The combine with `batch` partials a round trip (1 <= batch <= COMBINE_BATCH_MAX), built
    on first request. The batch changes when a thread's loads are issued, never what it adds or
    in which order: every batch gives the same bits. A larger batch holds more registers (sm_90,
    bench/sass_count.py: 80 at 8 against 48 before session 16's batching), which costs
    occupancy where the grid is large: prefill's T x Hq blocks (PREFILL_COMBINE_BATCH)."""
    batch = int(batch)
    if not 1 <= batch <= COMBINE_BATCH_MAX:
        raise ValueError(f"combine batch must be 1 .. {COMBINE_BATCH_MAX}, not {batch}")
    if batch not in _COMBINE_KERNELS:
        _COMBINE_KERNELS[batch] = _make_combine(batch)
    return _COMBINE_KERNELS[batch]


flash_decode_combine = combine_kernel(COMBINE_BATCH)
flash_decode_combine_b2 = combine_kernel(2)


def combine_slices(D: int) -> int:
    """Blocks a head's combine takes (`flash_decode_combine`): D / COMBINE_SLICE_DIMS when that
    divides evenly and is more than one, else 1. Slices multiply the combine's blocks (16 heads
    are 16 blocks on a 132-SM GPU) and divide each block's splits among more groups."""
    if D > COMBINE_SLICE_DIMS and D % COMBINE_SLICE_DIMS == 0:
        return D // COMBINE_SLICE_DIMS
    return 1


# ------------------------------------------------------------------ launchers


def _check_shapes(q, n_kv_heads: int, D_kv: int | None = None):
    T, Hq, D = q.shape
    if D > HEAD_DIM_MAX:
        raise ValueError(f"head_dim {D} > HEAD_DIM_MAX {HEAD_DIM_MAX}")
    if Hq % n_kv_heads:
        raise ValueError(f"query heads {Hq} not a multiple of kv heads {n_kv_heads}")
    if D_kv is not None and D_kv != D:
        raise ValueError(f"q head_dim {D} != kv head_dim {D_kv}")
    return T, Hq, D


def _scale(scale, D):
    return np.float32(1.0 / math.sqrt(D) if scale is None else scale)


def _row_tiles(T: int, n_rep: int) -> int:
    return (T * n_rep + ATTN_ROWS - 1) // ATTN_ROWS


def launch_flash_attn(q, k, v, positions, out, scale=None, stream=0):
    """Causal GQA attention, float32 K/V `[S, Hkv, D]` (key j at position j), queries at
    `positions[T]` (device int32). Reference: ops.attention(q, k, v, causal_offset=positions[0])
    for consecutive positions."""
    T, Hq, D = _check_shapes(q, k.shape[1], k.shape[2])
    Hkv = k.shape[1]
    grid = (_row_tiles(T, Hq // Hkv), Hkv)
    flash_attn_f32[grid, ATTN_THREADS, stream](q, k, v, positions, _scale(scale, D), out)


def launch_flash_attn_cache(q, positions, k_u8, k_f16, k_type, v_u8, v_f16, v_type, out,
                            scale=None, stream=0):
    """Causal GQA attention (prefill, or a multi-token verify step) over one cache layer
    (`KVCache.layer(slot)`), which must already hold positions 0 .. max(positions)."""
    T, Hq, D = _check_shapes(q, k_u8.shape[0])
    Hkv = k_u8.shape[0]
    grid = (_row_tiles(T, Hq // Hkv), Hkv)
    flash_attn_cache[grid, ATTN_THREADS, stream](q, positions, k_u8, k_f16, np.int32(k_type),
                                                 v_u8, v_f16, np.int32(v_type),
                                                 _scale(scale, D), out)


def decode_splits(ctx: int, n_kv_heads: int, row_tiles: int = 1) -> int:
    """Default split count for a cache of `ctx` positions: ~DECODE_TARGET_BLOCKS blocks."""
    want = max(1, DECODE_TARGET_BLOCKS // (n_kv_heads * row_tiles))
    return max(1, min(want, DECODE_SPLITS_MAX, (ctx + ATTN_KEYS - 1) // ATTN_KEYS))


def alloc_decode_partials(T: int, n_heads: int, head_dim: int, n_splits: int):
    """Device workspace for `launch_flash_decode`: (part_ml[T, Hq, S, 2], part_acc[T, Hq, S, D])
    (allocate once, before graph capture)."""
    return (cuda.device_array((T, n_heads, n_splits, 2), np.float32),
            cuda.device_array((T, n_heads, n_splits, head_dim), np.float32))


def launch_flash_decode(q, positions, k_u8, k_f16, k_type, v_u8, v_f16, v_type, out,
                        part_ml, part_acc, scale=None, stream=0, min_chunk=None, gate=None,
                        xq=None, xd=None, chunk_align=None, combine_threads=None, only=None,
                        slices=None, prefetch=None, combine_batch=None, trace=None,
                        interleave=None, direct=None, split_grid=None, spread=None,
                        counters=None, fused=None, onepass=False, store=None, early=None,
                        cluster=None, pre_wait=False, split_cluster=None, cluster_slots=None):
    """Split-K decode attention over one cache layer + the deterministic combine. The split
    pass is decode_attention.py's for an F16 cache (head_dim 32 .. 256, <= 8 query heads per
    KV head), `flash_decode_split` otherwise. The split
    count is `part_ml.shape[2]` (see `decode_splits`, `alloc_decode_partials`); q[T, Hq, D]
    with small T (1 for plain decode, K+1 for a speculative verify). min_chunk: fewest keys a
    split takes (default DECODE_MIN_CHUNK; a runtime argument, so bench/ can sweep it);
    chunk_align, combine_threads: the rest of the plan (defaults DECODE_CHUNK_ALIGN and
    COMBINE_THREADS; runtime too, for the side-by-side benchmark). The same arguments give
    every token the same summation order however many tokens a launch carries.
    The combine also applies what decode does next, saving those launches: gate (T * Hq * D
    floats) multiplies the output by sigmoid(gate) (= activation.launch_sigmoid_mul), and xq
    (int8) / xd (float32), given together, receive quantize_act's int8 copy of the output
    (= quantize_act.launch_quantize_act on out, flat; needs D % 32 == 0).
    only: "split" or "combine" launches that pass alone (bench/launch_chain.py times each).
    slices: blocks a head's combine takes (default `combine_slices(D)`; the summation order
    depends on it, so a verify must use decode's); prefetch: the F16 split pass's K / V
    prefetch (default decode_attention.PREFETCH_KV; no effect on results). A prefill over many
    tokens passes 1 and False: its tokens' blocks share the cache rows, and a head's combine
    has few splits (Engine._attention_launches). combine_batch: partials a combine thread
    loads a round trip (`combine_kernel`; default COMBINE_BATCH; no effect on results);
    trace: the F16 split pass's stamps (decode_attention.launch_split; bench/attention_phases.py);
    interleave: its softmax's rows interleaved (decode_attention.INTERLEAVE_ROWS; no effect on
    results); direct: its one-tile splits stored without the four-warp merge
    (decode_attention.ONE_TILE_DIRECT; no effect on results); split_grid: the F16 split pass
    on this many blocks a (token, KV head), each walking its splits (decode_attention.walks;
    no effect on results: the plan is the partials' split count either way); spread: its
    direct one-tile splits on all four warps (default: decode_attention.ONE_TILE_SPREAD up to
    its ONE_TILE_SPREAD_MAX_D; no effect on results); fused: the combine in the F16 split
    pass's last block of each (token, KV head) (default decode_attention.COMBINE_IN_SPLIT where
    `counters` -- decode_attention.alloc_combine_counters -- are given, the split pass is the F16
    one, and it does not walk; the combine's bits: decode_attention.combine_tail); onepass: the
    whole of it in decode_attention's one-pass kernel (F16 cache; the same bits for tokens whose
    plan it serves, `decode_attention.onepass_max_ctx`, NaN for the others); store: with
    onepass, (k, v, inv_freq) -- the tokens' RoPE and K / V store in the same launch
    (`decode_attention.launch_onepass`), instead of cache.kv's launch before it; early: the
    one-pass kernel's loads issued early (decode_attention.ONEPASS_EARLY; no effect on results);
    trace goes to the one-pass kernel's instrumented build with onepass
    (decode_attention.trace_shape_1p); cluster: with onepass, its blocks a query head, as one
    thread-block cluster (decode_attention.ONEPASS_CLUSTER; no effect on results); pre_wait:
    the F16 split pass's position, plan and K / V prefetch before its grid-dependency wait
    (decode_attention.launch_split(pre_wait=); no effect on results) -- only for a graph with
    no kernel writing `positions` before this launch (the engine's decode step);
    split_cluster: N >= 1 runs the F16 split pass and the combine as one launch on
    thread-block clusters of N blocks a (token, KV head) (decode_attention.launch_split_cluster,
    cluster_slots four-warp split slots a block; the same bits; the simulator and GPUs without
    clusters run one block a pair); None or 0: off."""
    if only not in (None, "split", "combine"):
        raise ValueError(f"only must be None, 'split' or 'combine', not {only!r}")
    min_chunk = DECODE_MIN_CHUNK if min_chunk is None else int(min_chunk)
    if min_chunk < 1:
        raise ValueError(f"min_chunk must be >= 1, not {min_chunk}")
    chunk_align = DECODE_CHUNK_ALIGN if chunk_align is None else int(chunk_align)
    if chunk_align < 1:
        raise ValueError(f"chunk_align must be >= 1, not {chunk_align}")
    combine_threads = COMBINE_THREADS if combine_threads is None else int(combine_threads)
    if combine_threads not in (256, 512, 1024):
        raise ValueError(f"combine_threads must be 256, 512 or 1024, not {combine_threads}")
    T, Hq, D = _check_shapes(q, k_u8.shape[0])
    n = T * Hq * D
    if gate is not None and (gate.dtype != np.float32 or gate.size < n):
        raise ValueError(f"flash_decode: gate must be float32 with >= {n} values, "
                         f"not {gate.dtype}[{gate.size}]")
    if (xq is None) != (xd is None):
        raise ValueError("flash_decode: xq and xd go together (the int8 output and its scales)")
    if xq is not None and (D % 32 or xq.dtype != np.int8 or xq.size < n
                           or xd.dtype != np.float32 or xd.size < n // 32):
        raise ValueError(f"flash_decode: the int8 output needs head_dim % 32 == 0 (it is {D}), "
                         f"xq int8[>= {n}] and xd float32[>= {n // 32}]")
    Hkv = k_u8.shape[0]
    n_splits = part_ml.shape[2]
    if (tuple(part_ml.shape) != (T, Hq, n_splits, 2)
            or tuple(part_acc.shape) != (T, Hq, n_splits, D)):
        raise ValueError(f"partials {tuple(part_ml.shape)}, {tuple(part_acc.shape)} do not fit "
                         f"q {tuple(q.shape)}")
    combine = combine_kernel(COMBINE_BATCH if combine_batch is None else combine_batch)
    slices = combine_slices(D) if slices is None else int(slices)
    if slices < 1 or D % slices or (xq is not None and (D // slices) % 32):
        raise ValueError(f"slices must divide head_dim {D} (into multiples of 32 with the int8 "
                         f"output), not {slices}")
    from . import decode_attention
    f16 = decode_attention.supports(Hq // Hkv, D, k_type, v_type)
    walk = decode_attention.walks(split_grid) and split_grid < n_splits
    fused = (decode_attention.COMBINE_IN_SPLIT if fused is None else bool(fused)) \
        and counters is not None and f16 and not walk and trace is None and only is None
    flat_ml = part_ml.reshape(part_ml.size)
    if store is not None and not onepass:
        raise ValueError("flash_decode: store (the RoPE and K / V store) goes with onepass only")
    if onepass:
        if not f16 or only is not None:
            raise ValueError("flash_decode: the one-pass kernel takes an F16 cache (head_dim 32 .. "
                             "256, <= 8 query heads a KV head) and no `only`")
        decode_attention.launch_onepass(
            q, positions, k_u8, v_u8, _scale(scale, D), min_chunk, chunk_align, n_splits, out,
            gate, xq, xd, decode_attention.combine_order(D, combine_threads, slices), stream,
            prefetch, store=None if store is None else (*store, k_f16, v_f16), early=early,
            trace=trace, cluster=cluster)
        return
    if split_cluster and int(split_cluster) >= 1:
        if not f16 or only is not None or trace is not None or walk:
            raise ValueError("flash_decode: the cluster split pass takes an F16 cache (head_dim "
                             "32 .. 256, <= 8 query heads a KV head), no `only`, trace or "
                             "split_grid")
        decode_attention.launch_split_cluster(
            q, positions, k_u8, v_u8, _scale(scale, D), min_chunk, chunk_align, part_ml,
            part_acc, out, gate, xq, xd, decode_attention.combine_order(D, combine_threads, slices),
            stream, prefetch, int(split_cluster), cluster_slots, pre_wait)
        return
    if fused:
        # absent outputs get stand-ins of the right type that the kernel never touches
        decode_attention.launch_split(
            q, positions, k_u8, v_u8, _scale(scale, D), min_chunk, chunk_align, part_ml,
            part_acc, stream, prefetch, trace, interleave, direct, split_grid, spread,
            combine=(out, flat_ml if gate is None else gate.reshape(gate.size),
                     flat_ml.view(np.int8) if xq is None else xq.reshape(xq.size),
                     flat_ml if xd is None else xd.reshape(xd.size),
                     gate is not None, xq is not None, counters,
                     decode_attention.combine_order(D, combine_threads, slices)))
        return
    if only == "combine":
        pass                        # the partials the last split pass left
    elif f16:                       # F16 cache: 16-byte loads
        decode_attention.launch_split(q, positions, k_u8, v_u8, _scale(scale, D), min_chunk,
                                      chunk_align, part_ml, part_acc, stream, prefetch, trace,
                                      interleave, direct, split_grid, spread,
                                      pre_wait=pre_wait)
    else:
        grid = (n_splits, Hkv, T * _row_tiles(1, Hq // Hkv))     # tiles of one token each
        flash_decode_split[grid, DECODE_THREADS, stream](
            q, positions, k_u8, k_f16, np.int32(k_type), v_u8, v_f16, np.int32(v_type),
            _scale(scale, D), np.int32(min_chunk), np.int32(chunk_align), part_ml, part_acc)
    if only == "split":
        return
    # absent outputs get stand-ins of the right type that the kernel never touches
    combine[T * Hq * slices, combine_threads, stream](
        positions, np.int32(k_u8.shape[1]), np.int32(min_chunk), np.int32(chunk_align), part_ml,
        part_acc, out,
        flat_ml if gate is None else gate.reshape(gate.size),
        flat_ml.view(np.int8) if xq is None else xq.reshape(xq.size),
        flat_ml if xd is None else xd.reshape(xd.size),
        np.int32(gate is not None), np.int32(xq is not None))


_A3 = "float32[:, :, ::1]"
_A4 = "float32[:, :, :, ::1]"
_C = "uint8[:, :, ::1], float16[:, :, ::1], int32"
PTX_SIGNATURES = {
    "flash_attn_f32": [f"void({_A3}, {_A3}, {_A3}, int32[::1], float32, {_A3})"],
    "flash_attn_cache": [f"void({_A3}, int32[::1], {_C}, {_C}, float32, {_A3})"],
    "flash_decode_split": [f"void({_A3}, int32[::1], {_C}, {_C}, float32, int32, int32, {_A4}, "
                           f"{_A4})"],
    "flash_decode_combine": [f"void(int32[::1], int32, int32, int32, {_A4}, {_A4}, {_A3}, float32[::1], "
                             "int8[::1], float32[::1], int32, int32)"],
}
PTX_SIGNATURES["flash_decode_combine_b2"] = PTX_SIGNATURES["flash_decode_combine"]
