"""Next-token selection on the device: deterministic argmax and seeded temperature / top-k /
top-p sampling, so the decode graph ends in 4 bytes (the token id) read back by the host.

Order of tokens. Candidates are ranked by (logit descending, token id ascending): a strict
total order (`_precedes`), so ties always resolve to the lowest id and every sort and merge
below has one right answer. NaN logits never rank; if every logit is NaN the token is -1.

Argmax (two launches, no atomics): `argmax_partial` gives block b the contiguous chunk
[b * chunk, (b+1) * chunk) of the vocabulary, each thread scans it with stride blockDim and a
shared-memory tree keeps the better pair; `argmax_final` reduces the per-block pairs the same
way. The winner is the same whatever the split: the order is total.

Sampling (`sample_partial` over the chunks, then `sample_pick` in one block). Parameters are
read from a device array `params = [temperature, top_p, top_k]` (see `sampling_params`), so one
captured graph serves every request:
  * temperature <= 0: greedy, the argmax above.
  * top_k = 0 and top_p >= 1 ("full"): inverse-CDF sampling over the whole vocabulary in token
    order with weights w_i = exp((l_i - M) / T), M the max logit. Block b sums
    S_b = sum exp((l_i - m_b) / T) over its chunk (m_b the block max; thread j sums its own
    contiguous sub-chunk in token order, then thread 0 adds the thread sums in thread order);
    the pick kernel draws u, finds the block whose cumulative share
    c_b = S_b * exp((m_b - M) / T) crosses u * sum_b c_b, recomputes that block's thread sums
    (same operations, same values), finds the thread, then walks its sub-chunk token by token.
  * otherwise ("top-k"): k = top_k, or TOPK_MAX when top_k = 0, capped at TOPK_MAX. Each block
    sorts its chunk in shared memory (bitonic network, rank order, NaN dropped) and keeps the
    first k; the pick kernel merges the blocks' sorted lists pairwise in a tree (log2(blocks)
    levels; each element finds its place in the partner list by binary search) into the top k.
    Then, one thread, in rank order: w_i = exp((v_i - v_0) / T), cumulative C_i; the top-p
    nucleus is the shortest prefix with C_{n-1} >= top_p * Z, where Z = C_{k-1} when top_k > 0
    (HF's order: top-k filter, then top-p over the survivors) and Z = the full-vocabulary sum
    when top_k = 0 (plain nucleus sampling; if the nucleus needs more than TOPK_MAX tokens it is
    truncated to TOPK_MAX: documented approximation); the token is the first i < n with
    C_i > u * C_{n-1}. top_k > TOPK_MAX behaves as TOPK_MAX.
`reference_sample` is the same algorithm in float64 numpy given the same u; the float32 device
sums can differ from it only when u lands within rounding distance of a cumulative boundary,
which `reference_sample` reports as its margin.

RNG: counter-based, so a seed fully determines the sequence and numpy reproduces it bit for bit
(`reference_uniform`). The state is uint64[2] = [seed, draws so far]; draw n gives
x = h(n_lo ^ h(seed_lo ^ h(seed_hi))) with h = "lowbias32" (a 32-bit integer hash with 2
multiply-xorshift rounds, bias ~0.17 on the avalanche test), and u = (x >> 8) * 2^-24 in [0, 1)
(exact in float32). The pick kernel stores u in `out_u` for inspection.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint64

from ..jit import kernel

# One block = 256 threads covering up to 8 logits per thread (SAMPLE_ELEMS_PER_THREAD): a
# chunk of <= 2048 logits, which is what one block can sort in 16 KB of shared memory. Qwen's
# 152k-248k vocabularies give 75-122 blocks, roughly one wave on 132 SMs.
SAMPLE_THREADS = 256
SAMPLE_ELEMS_PER_THREAD = 8
SORT_MAX = SAMPLE_THREADS * SAMPLE_ELEMS_PER_THREAD
# Candidates kept for top-k / top-p. 64 covers the usual top_k (20-50).
TOPK_MAX = 64

P_TEMPERATURE, P_TOP_P, P_TOP_K = 0, 1, 2
_NO_TOKEN = np.int32(2**31 - 1)      # sentinel id: "no candidate"; ranks after every real one
_NEG_INF = np.float32(-np.inf)
_M32 = np.uint64(0xFFFFFFFF)
_TWO_M24 = np.float32(2.0**-24)


# ------------------------------------------------------------------ RNG


@cuda.jit(device=True)
def _hash32(x):
    """lowbias32 on the low 32 bits of a uint64 (products stay below 2^64)."""
    x = x & _M32
    x ^= x >> uint64(16)
    x = (x * uint64(0x7FEB352D)) & _M32
    x ^= x >> uint64(15)
    x = (x * uint64(0x846CA68B)) & _M32
    x ^= x >> uint64(16)
    return x


@cuda.jit(device=True)
def _draw_uniform(state):
    seed = state[0]
    n = state[1]
    state[1] = n + uint64(1)
    x = _hash32((n & _M32) ^ _hash32((seed & _M32) ^ _hash32(seed >> uint64(32))))
    return float32(x >> uint64(8)) * _TWO_M24


def _hash32_np(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint64) & _M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & _M32
    x ^= x >> np.uint64(16)
    return x


def reference_uniform(seed: int, n: int) -> np.float32:
    """The n-th (0-based) uniform the device draws for `seed` (bit-exact)."""
    seed = np.array([seed], np.uint64)
    n = np.array([n], np.uint64)
    x = _hash32_np((n & _M32) ^ _hash32_np((seed & _M32) ^ _hash32_np(seed >> np.uint64(32))))
    return np.float32(x[0] >> np.uint64(8)) * _TWO_M24


def make_rng_state(seed: int):
    """Device uint64[2] RNG state for `seed`, no draws yet (re-create to re-seed)."""
    return cuda.to_device(np.array([seed & 0xFFFFFFFFFFFFFFFF, 0], np.uint64))


def sampling_params(temperature: float, top_p: float = 1.0, top_k: int = 0) -> np.ndarray:
    """Host array for the device `params` buffer (copy it in before replaying the graph)."""
    return np.array([temperature, top_p, top_k], np.float32)


# ------------------------------------------------------------------ block primitives


@cuda.jit(device=True)
def _precedes(v, i, bv, bi):
    """(v, i) ranks before (bv, bi): larger logit, or equal logit and lower id."""
    return v > bv or (v == bv and i < bi)


@cuda.jit(device=True)
def _block_best(sv, si, v, i):
    """Block-wide best (value, id) pair (tree over a power-of-two blockDim); all threads get it."""
    tid = cuda.threadIdx.x
    sv[tid] = v
    si[tid] = i
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            if _precedes(sv[tid + s], si[tid + s], sv[tid], si[tid]):
                sv[tid] = sv[tid + s]
                si[tid] = si[tid + s]
        cuda.syncthreads()
        s //= 2
    bv = sv[0]
    bi = si[0]
    cuda.syncthreads()
    return bv, bi


@cuda.jit(device=True)
def _chunk(V, n_blocks, b):
    chunk = (V + n_blocks - 1) // n_blocks
    lo = min(V, b * chunk)
    return lo, min(V, lo + chunk)


@cuda.jit(device=True)
def _sub_chunk(lo, hi):
    """This thread's contiguous slice of [lo, hi) (token order = thread order)."""
    sub = (hi - lo + cuda.blockDim.x - 1) // cuda.blockDim.x
    a = min(hi, lo + cuda.threadIdx.x * sub)
    return a, min(hi, a + sub)


@cuda.jit(device=True)
def _thread0_sum(sv, v):
    """The block's values v added by thread 0 in thread order (returned there; other threads
    get 0): one fixed order."""
    sv[cuda.threadIdx.x] = v
    cuda.syncthreads()
    s = float32(0.0)
    if cuda.threadIdx.x == 0:
        for j in range(cuda.blockDim.x):
            s += sv[j]
    cuda.syncthreads()
    return s


@cuda.jit(device=True)
def _chunk_exp_sum(sv, logits, lo, hi, m, inv_t):
    """sum of exp((l - m) / T) over logits[lo:hi] (NaN weighs nothing): each thread its
    contiguous slice (`_thread_exp_sum`), then `_thread0_sum`; thread 0 gets it."""
    a, e = _sub_chunk(lo, hi)
    return _thread0_sum(sv, _thread_exp_sum(logits, a, e, m, inv_t))


@cuda.jit(device=True)
def _thread_exp_sum(logits, a, b, m, inv_t):
    s = float32(0.0)
    if m == _NEG_INF:            # an all -inf (or all NaN) chunk weighs nothing
        return s
    for i in range(a, b):
        x = logits[i]
        if x == x:                   # NaN weighs nothing
            s += math.exp((x - m) * inv_t)
    return s


@cuda.jit(device=True)
def _block_weight(part_sum, part_val, b, M, inv_t):
    """Block b's share c_b = S_b * exp((m_b - M) / T) of the full-vocabulary sum."""
    if part_sum[b] > float32(0.0):
        return part_sum[b] * math.exp((part_val[b] - M) * inv_t)
    return float32(0.0)


@cuda.jit(device=True)
def _candidates(params):
    """0 for full-vocabulary sampling, else the number of top candidates to extract."""
    top_k = int32(params[P_TOP_K])
    if top_k <= 0:
        if params[P_TOP_P] >= float32(1.0):
            return 0
        return TOPK_MAX
    return min(top_k, TOPK_MAX)


@cuda.jit(device=True)
def _best_in_chunk(logits, lo, hi):
    """This thread's best (value, id) among its strided ids in [lo, hi)."""
    bv = _NEG_INF
    bi = _NO_TOKEN
    for i in range(lo + cuda.threadIdx.x, hi, cuda.blockDim.x):
        v = logits[i]
        if _precedes(v, i, bv, bi):
            bv = v
            bi = int32(i)
    return bv, bi


@cuda.jit(device=True)
def _bitonic_sort(sort_v, sort_i, n):
    """Sort the first n (a power of two) pairs of the shared arrays into rank order (best
    first). Stage (size, stride) compares pairs (lo, lo + stride), lo having bit `stride`
    clear; pairs inside a `size` run with bit `size` clear put the better element first, the
    others the worse (bitonic runs), and the last stage (size = n) orders everything best first.
    One sync per stage: log2(n) * (log2(n) + 1) / 2 stages."""
    size = 2
    while size <= n:
        stride = size // 2
        while stride > 0:
            for j in range(cuda.threadIdx.x, n // 2, cuda.blockDim.x):
                a = (j // stride) * 2 * stride + (j % stride)
                c = a + stride
                better_first = (a & size) == 0
                if _precedes(sort_v[c], sort_i[c], sort_v[a], sort_i[a]) == better_first:
                    tv = sort_v[a]
                    ti = sort_i[a]
                    sort_v[a] = sort_v[c]
                    sort_i[a] = sort_i[c]
                    sort_v[c] = tv
                    sort_i[c] = ti
            cuda.syncthreads()
            stride //= 2
        size *= 2


@cuda.jit(device=True)
def _rank_in(list_v, list_i, row, k, v, i, ties_before):
    """How many of the k sorted pairs list[row, :k] rank before (v, i) (binary search); with
    ties_before, equal pairs count too (the stable tie-break of a merge: left list first)."""
    lo = 0
    hi = k
    while lo < hi:
        mid = (lo + hi) // 2
        mv = list_v[row, mid]
        mi = list_i[row, mid]
        if _precedes(mv, mi, v, i) or (ties_before and mv == v and mi == i):
            lo = mid + 1
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------ kernels


@kernel
def argmax_partial(logits, part_val, part_idx):
    """Block (b, r): best (logit, id) of row r's vocabulary chunk b -> part_val[r, b],
    part_idx[r, b]. Every row of a verify in one grid: T launches became one (session 34)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    si = cuda.shared.array(SAMPLE_THREADS, int32)
    b = cuda.blockIdx.x
    r = cuda.blockIdx.y
    lo, hi = _chunk(logits.shape[1], cuda.gridDim.x, b)
    v, i = _best_in_chunk(logits[r], lo, hi)
    bv, bi = _block_best(sv, si, v, i)
    if cuda.threadIdx.x == 0:
        part_val[r, b] = bv
        part_idx[r, b] = bi


@cuda.jit(device=True)
def _reduce_partials(sv, si, part_val, part_idx):
    bv = _NEG_INF
    bi = _NO_TOKEN
    for j in range(cuda.threadIdx.x, part_val.shape[0], cuda.blockDim.x):
        if _precedes(part_val[j], part_idx[j], bv, bi):
            bv = part_val[j]
            bi = part_idx[j]
    return _block_best(sv, si, bv, bi)


@kernel
def argmax_final(part_val, part_idx, out_token):
    """Block r: the best of row r's per-block pairs -> out_token[r] (-1 if all its logits are
    NaN)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    si = cuda.shared.array(SAMPLE_THREADS, int32)
    r = cuda.blockIdx.x
    bv, bi = _reduce_partials(sv, si, part_val[r], part_idx[r])
    if cuda.threadIdx.x == 0:
        out_token[r] = -1 if bi == _NO_TOKEN else bi


@kernel
def sample_partial(logits, params, part_val, part_idx, part_sum, cand_val, cand_idx):
    """Per vocabulary chunk: max pair (part_val/idx), S_b (part_sum) and, in top-k mode, the
    chunk's k best pairs in rank order (cand_val/idx[b, :k]; _NO_TOKEN pads short chunks).
    The chunk must fit SORT_MAX (see `sample_blocks`)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    si = cuda.shared.array(SAMPLE_THREADS, int32)
    sort_v = cuda.shared.array(SORT_MAX, float32)
    sort_i = cuda.shared.array(SORT_MAX, int32)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    lo, hi = _chunk(logits.shape[0], cuda.gridDim.x, b)
    v, i = _best_in_chunk(logits, lo, hi)
    m, mi = _block_best(sv, si, v, i)
    if tid == 0:
        part_val[b] = m
        part_idx[b] = mi
    temperature = params[P_TEMPERATURE]
    if temperature <= float32(0.0):
        return
    inv_t = float32(1.0) / temperature
    s = _chunk_exp_sum(sv, logits, lo, hi, m, inv_t)
    if tid == 0:
        part_sum[b] = s
    k = _candidates(params)
    if k == 0:
        return
    # sort the chunk (padded to a power of two with "no candidate") in rank order
    n = 1
    while n < hi - lo:
        n *= 2
    for j in range(tid, n, cuda.blockDim.x):
        v = _NEG_INF
        i = _NO_TOKEN
        if lo + j < hi:
            x = logits[lo + j]
            if x == x:                      # NaN never ranks (and would break the network)
                v = x
                i = int32(lo + j)
        sort_v[j] = v
        sort_i[j] = i
    cuda.syncthreads()
    _bitonic_sort(sort_v, sort_i, n)
    for r in range(tid, k, cuda.blockDim.x):
        if r < n:
            cand_val[b, r] = sort_v[r]
            cand_idx[b, r] = sort_i[r]
        else:
            cand_val[b, r] = _NEG_INF
            cand_idx[b, r] = _NO_TOKEN


@kernel
def sample_pick(logits, params, part_val, part_idx, part_sum, cand_val, cand_idx, cand2_val,
                cand2_idx, rng_state, out_token, out_u):
    """One block (same blockDim as sample_partial): draw u and pick the token (see module doc).
    cand2_val/idx: scratch of cand_val/idx's shape for the merge (cand_* are overwritten)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    si = cuda.shared.array(SAMPLE_THREADS, int32)
    ck_val = cuda.shared.array(TOPK_MAX, float32)
    ck_idx = cuda.shared.array(TOPK_MAX, int32)
    pick_f = cuda.shared.array(2, float32)       # u, residual target within the chosen block
    pick_i = cuda.shared.array(1, int32)         # chosen block
    tid = cuda.threadIdx.x
    n_blocks = part_val.shape[0]
    M, best = _reduce_partials(sv, si, part_val, part_idx)
    temperature = params[P_TEMPERATURE]
    if temperature <= float32(0.0):
        if tid == 0:
            out_token[0] = -1 if best == _NO_TOKEN else best
            out_u[0] = float32(0.0)
        return
    inv_t = float32(1.0) / temperature
    k = _candidates(params)
    if tid == 0:
        u = _draw_uniform(rng_state)
        pick_f[0] = u
        out_u[0] = u
    cuda.syncthreads()
    u = pick_f[0]
    if k == 0:
        # ---- full vocabulary: choose the block, then the thread, then the token
        if tid == 0:
            total = float32(0.0)
            for b in range(n_blocks):
                total += _block_weight(part_sum, part_val, b, M, inv_t)
            target = u * total
            before = float32(0.0)
            chosen = -1
            last = 0                                # rounding fallback: last block with weight
            last_before = float32(0.0)
            for b in range(n_blocks):
                c = _block_weight(part_sum, part_val, b, M, inv_t)
                if c > float32(0.0):
                    last = b
                    last_before = before
                if before + c > target:
                    chosen = b
                    break
                before += c
            if chosen < 0:
                chosen = last
                before = last_before
            c = math.exp((part_val[chosen] - M) * inv_t)
            pick_i[0] = chosen
            pick_f[1] = (target - before) / c       # in units of the block's own sums
        cuda.syncthreads()
        chosen = pick_i[0]
        lo, hi = _chunk(logits.shape[0], n_blocks, chosen)
        m = part_val[chosen]
        a, e = _sub_chunk(lo, hi)
        sv[tid] = _thread_exp_sum(logits, a, e, m, inv_t)
        cuda.syncthreads()
        if tid == 0:
            r = pick_f[1]
            before = float32(0.0)
            owner = cuda.blockDim.x - 1
            for j in range(cuda.blockDim.x):
                if before + sv[j] > r:
                    owner = j
                    break
                before += sv[j]
            r -= before
            sub = (hi - lo + cuda.blockDim.x - 1) // cuda.blockDim.x
            a = min(hi, lo + owner * sub)
            e = min(hi, a + sub)
            token = int32(-1)
            acc = float32(0.0)
            for i in range(a, e):
                x = logits[i]
                w = float32(0.0)
                if x == x:
                    w = math.exp((x - m) * inv_t)
                if w > float32(0.0):
                    token = int32(i)         # rounding fallback: last positive weight
                acc += w
                if acc > r:
                    break
            if token < 0:
                token = part_idx[chosen]
            out_token[0] = token
        return
    # ---- top-k / top-p: merge the blocks' sorted lists pairwise, in place of a k-way merge.
    # Level `width`: the list at row r (a multiple of width) merges with row r + width when
    # r / width is even; each element lands at (its index) + (its rank in the partner list).
    src_v = cand_val
    src_i = cand_idx
    dst_v = cand2_val
    dst_i = cand2_idx
    width = 1
    while width < n_blocks:
        for j in range(tid, n_blocks * k, cuda.blockDim.x):
            r = j // k
            pos = j - r * k
            if r % width == 0:
                v = src_v[r, pos]
                i = src_i[r, pos]
                left = (r // width) % 2 == 0
                partner = r + width if left else r - width
                if partner >= n_blocks:
                    dst_v[r, pos] = v
                    dst_i[r, pos] = i
                else:
                    out = pos + _rank_in(src_v, src_i, partner, k, v, i, not left)
                    if out < k:
                        dest = min(r, partner)
                        dst_v[dest, out] = v
                        dst_i[dest, out] = i
        cuda.syncthreads()
        src_v, dst_v = dst_v, src_v
        src_i, dst_i = dst_i, src_i
        width *= 2
    for r in range(tid, k, cuda.blockDim.x):
        ck_val[r] = src_v[0, r]
        ck_idx[r] = src_i[0, r]
    cuda.syncthreads()
    if tid == 0:
        n_valid = 0
        for r in range(k):
            if ck_idx[r] != _NO_TOKEN:
                n_valid = r + 1
        v0 = ck_val[0]
        top_p = params[P_TOP_P]
        if int32(params[P_TOP_K]) > 0:
            z = float32(0.0)
            for r in range(n_valid):
                z += math.exp((ck_val[r] - v0) * inv_t)
        else:
            z = float32(0.0)
            for b in range(n_blocks):
                z += _block_weight(part_sum, part_val, b, M, inv_t)
        threshold = top_p * z
        cum = float32(0.0)
        n = n_valid
        for r in range(n_valid):
            cum += math.exp((ck_val[r] - v0) * inv_t)
            if cum >= threshold:
                n = r + 1
                break
        total = float32(0.0)
        for r in range(n):
            total += math.exp((ck_val[r] - v0) * inv_t)
        target = u * total
        token = ck_idx[n - 1]
        cum = float32(0.0)
        for r in range(n):
            cum += math.exp((ck_val[r] - v0) * inv_t)
            if cum > target:
                token = ck_idx[r]
                break
        out_token[0] = token


# ------------------------------------------------------------------ launchers


def sample_blocks(vocab_size: int, threads: int = SAMPLE_THREADS) -> int:
    """Blocks for a vocabulary: chunks of <= threads * SAMPLE_ELEMS_PER_THREAD (<= SORT_MAX)."""
    per_block = threads * SAMPLE_ELEMS_PER_THREAD
    return max(1, (vocab_size + per_block - 1) // per_block)


class SampleWorkspace:
    """Device scratch for `launch_argmax` / `launch_sample` at one vocabulary size (allocate
    before graph capture). `threads` (a power of two <= SAMPLE_THREADS) fixes the per-block
    split, hence the summation order: keep it fixed for reproducible sampling. `rows`: the
    most logit rows one `launch_argmax` takes (a verify's T)."""

    def __init__(self, vocab_size: int, threads: int = SAMPLE_THREADS, rows: int = 1):
        if threads & (threads - 1) or not 1 <= threads <= SAMPLE_THREADS:
            raise ValueError(f"threads must be a power of two <= {SAMPLE_THREADS}, got {threads}")
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self.vocab_size = vocab_size
        self.threads = threads
        self.rows = rows
        self.n_blocks = nb = sample_blocks(vocab_size, threads)
        self.part_val = cuda.device_array(nb, np.float32)
        self.part_idx = cuda.device_array(nb, np.int32)
        self.part_sum = cuda.device_array(nb, np.float32)
        self.row_val = cuda.device_array((rows, nb), np.float32)       # argmax, per row
        self.row_idx = cuda.device_array((rows, nb), np.int32)
        self.cand_val = cuda.device_array((nb, TOPK_MAX), np.float32)
        self.cand_idx = cuda.device_array((nb, TOPK_MAX), np.int32)
        self.cand2_val = cuda.device_array((nb, TOPK_MAX), np.float32)
        self.cand2_idx = cuda.device_array((nb, TOPK_MAX), np.int32)


def launch_argmax(logits, out_token, work: SampleWorkspace, stream=0):
    """out_token[r] = argmax(logits[r]) (lowest id among equal maxima) for each row of logits
    [T, V] (T <= work.rows; a 1-D [V] is one row). Two launches whatever T. Reference:
    np.argmax per row."""
    if logits.ndim == 1:
        logits = logits.reshape(1, logits.shape[0])
    T, V = logits.shape
    if V != work.vocab_size:
        raise ValueError(f"logits {V} != workspace vocab {work.vocab_size}")
    if not 1 <= T <= work.rows or out_token.shape[0] < T:
        raise ValueError(f"argmax of {T} rows: the workspace takes 1..{work.rows}, "
                         f"out_token holds {out_token.shape[0]}")
    argmax_partial[(work.n_blocks, T), work.threads, stream](logits, work.row_val, work.row_idx)
    argmax_final[T, work.threads, stream](work.row_val, work.row_idx, out_token)


def launch_sample(logits, params, rng_state, out_token, out_u, work: SampleWorkspace, stream=0):
    """Sample out_token[0] from logits[V] with device `params` (see `sampling_params`) and
    `rng_state` (see `make_rng_state`); out_u[0] receives the uniform used (0 when greedy).
    Reference: `reference_sample(logits, temperature, top_k, top_p, u)`."""
    if logits.shape[0] != work.vocab_size:
        raise ValueError(f"logits {logits.shape[0]} != workspace vocab {work.vocab_size}")
    sample_partial[work.n_blocks, work.threads, stream](
        logits, params, work.part_val, work.part_idx, work.part_sum, work.cand_val, work.cand_idx)
    sample_pick[1, work.threads, stream](
        logits, params, work.part_val, work.part_idx, work.part_sum, work.cand_val,
        work.cand_idx, work.cand2_val, work.cand2_idx, rng_state, out_token, out_u)


# ------------------------------------------------------------------ top probability


@kernel
def exp_sum_partial(logits, token, part_sum):
    """Block b: sum over its vocabulary chunk of exp(logit - logits[token[0]]), token the
    argmax just found -> part_sum[b] (every term <= 1: no overflow; sample_partial's sum at
    temperature 1)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    b = cuda.blockIdx.x
    V = logits.shape[0]
    t = token[0]
    m = logits[t] if 0 <= t < V else _NEG_INF       # no token (all NaN): the chunk weighs 0
    lo, hi = _chunk(V, cuda.gridDim.x, b)
    s = _chunk_exp_sum(sv, logits, lo, hi, m, float32(1.0))
    if cuda.threadIdx.x == 0:
        part_sum[b] = s


@kernel
def top_prob_final(part_sum, out_prob, counter, first):
    """out_prob[c] = 1 / sum(part_sum): the largest softmax probability (temperature 1), c the
    draft's slot (0 when `first`, else counter[0]: kernels/step.py mtp_chain's numbering)."""
    sv = cuda.shared.array(SAMPLE_THREADS, float32)
    acc = float32(0.0)
    for j in range(cuda.threadIdx.x, part_sum.shape[0], cuda.blockDim.x):
        acc += part_sum[j]
    total = _thread0_sum(sv, acc)
    if cuda.threadIdx.x == 0:
        c = 0 if first else counter[0]
        out_prob[c] = float32(1.0) / total


def launch_top_prob(logits, token, work: SampleWorkspace, out_prob, counter, first: bool,
                    stream=0):
    """out_prob[c] = max softmax(logits) at temperature 1, with token[0] = argmax(logits) from
    `launch_argmax` (on the device: a draft chain's confidence, 4 bytes instead of the logits
    row for the host). c = 0 when `first`, else counter[0]. Reference: 1 / sum(exp(l - max))
    (engine_spec._top_prob, float64)."""
    if logits.shape[0] != work.vocab_size:
        raise ValueError(f"logits {logits.shape[0]} != workspace vocab {work.vocab_size}")
    exp_sum_partial[work.n_blocks, work.threads, stream](logits, token, work.part_sum)
    top_prob_final[1, work.threads, stream](work.part_sum, out_prob, counter, np.int32(first))


# ------------------------------------------------------------------ numpy reference


def reference_sample(logits, temperature: float, top_k: int, top_p: float, u: float):
    """The algorithm of `launch_sample` in float64: returns (token, margin), margin being the
    smallest relative distance between a sampled/threshold quantity and a cumulative boundary
    (the float32 device result may differ only where margin is ~1e-6 or less)."""
    x = np.asarray(logits, np.float64)
    V = x.shape[0]
    finite = ~np.isnan(x)
    if not finite.any():
        return -1, np.inf
    order = np.lexsort((np.arange(V), -np.where(finite, x, -np.inf)))
    order = order[finite[order]]                 # rank order: logit desc, id asc, NaN dropped
    if temperature <= 0:
        return int(order[0]), np.inf
    M = x[order[0]]
    w_all = np.where(finite, np.exp((np.where(finite, x, M) - M) / temperature), 0.0)

    def first_above(cum, target):
        i = int(np.searchsorted(cum, target, side="right"))
        i = min(i, len(cum) - 1)
        lo = cum[i - 1] if i > 0 else 0.0
        margin = min(abs(cum[i] - target), abs(target - lo)) / max(cum[-1], 1e-300)
        return i, margin

    if top_k <= 0 and top_p >= 1:
        cum = np.cumsum(w_all)
        i, margin = first_above(cum, u * cum[-1])
        return i, margin
    k = TOPK_MAX if top_k <= 0 else min(top_k, TOPK_MAX)
    cand = order[:k]
    w = np.exp((x[cand] - M) / temperature)
    cum = np.cumsum(w)
    z = cum[-1] if top_k > 0 else w_all.sum()
    threshold = top_p * z
    reach = np.nonzero(cum >= threshold)[0]
    n = int(reach[0]) + 1 if len(reach) else len(cand)
    margin_p = np.min(np.abs(cum - threshold)) / z
    i, margin = first_above(cum[:n], u * cum[n - 1])
    return int(cand[i]), min(margin, margin_p)


_F1 = "float32[::1]"
_I1 = "int32[::1]"
_F2 = "float32[:, ::1]"
_I2 = "int32[:, ::1]"
PTX_SIGNATURES = {
    "argmax_partial": [f"void({_F2}, {_F2}, {_I2})"],
    "argmax_final": [f"void({_F2}, {_I2}, {_I1})"],
    "exp_sum_partial": [f"void({_F1}, {_I1}, {_F1})"],
    "top_prob_final": [f"void({_F1}, {_F1}, {_I1}, int32)"],
    "sample_partial": [f"void({_F1}, {_F1}, {_F1}, {_I1}, {_F1}, float32[:, ::1], int32[:, ::1])"],
    "sample_pick": [f"void({_F1}, {_F1}, {_F1}, {_I1}, {_F1}, float32[:, ::1], int32[:, ::1], "
                    f"float32[:, ::1], int32[:, ::1], uint64[::1], {_I1}, {_F1})"],
}
