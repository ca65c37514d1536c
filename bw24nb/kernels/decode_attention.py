"""Split-K decode attention over an F16 KV cache: one key per lane, 16-byte loads.

The split pass of attention.py's decode (`flash_decode_split`) stages K and V tiles through
shared memory element by element (a dequantizing load per value) and spends its time in that
chain of latencies: on the H200 a 9B-shaped layer (16 query / 4 KV heads, head_dim 256) took
45 us at 512 tokens of context and ~330 us at 6144 (bench/attention_bench.py, session 3), for
~3 MB and ~25 MB of cache. With an F16 cache no value needs decoding, so this kernel reads K and
V straight from global memory in 16-byte loads, and keeps scores and the accumulator in
registers:

  * a block is one split of one token's GQA group (KV head kvh, its R = n_rep query heads),
    4 warps; the split's keys [begin, end) go in tiles of 32, warp w taking tiles w, w + 4, ...;
  * scores: lane j of a tile is key j; it reads its K row (D halves) in D / 8 16-byte loads and
    forms the R dot products, q read from shared memory (every lane the same address: a
    broadcast), d ascending into one float32 accumulator per row; times `scale`, -inf past end;
  * online softmax per row over the tile: m' = max(m, warp_max(s)), p = exp(s - m'),
    alpha = exp(m - m'), l = l alpha + warp_sum(p);
  * PV: lane l owns dims [lE, lE + E) (E = D / 32); acc[r, e] = acc[r, e] alpha_r, then
    += p[r, j] v[j, d] for the tile's keys j ascending (p through shared memory, a warp's own
    rows: warp barriers only; the warp reads one whole V row per key: coalesced). V's words
    are issued ahead: the tile's first groups of VG = 8 keys (all four with E <= 2, two with
    E = 4, one with E = 8) with the K tile, each later group one group before its products
    (session 6: one key at a time, a tile cost ~10 us of waiting on the H200; session 18,
    decision 0025: groups issued after the scores, 4 round trips a tile, ~7 us);
  * the four warps' (m, l, acc) merge in warp order (M = max m_w, weights exp(m_w - M)) into the
    split's partial, in attention.py's layout, so its `flash_decode_combine` finishes the job.
Every sum has a fixed order and a block only ever sees one token, so a verify over K + 1 tokens
gives each token the bits of its own decode step (what speculative decoding relies on), as in
attention.py. The reference is ops.attention on the cache's contents.

Kernels are built per (R, E) (rows and dims per lane are compile-time constants, so the
accumulators are registers): R <= ROWS_MAX, D in {32, 64, 128, 256}. `supports` says whether a
shape and cache type can take this path; attention.launch_flash_decode dispatches.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint32

from ..device import current_features, simulator_enabled
from ..jit import CLUSTER_MAX, CLUSTER_MAX_NON_PORTABLE, kernel, launch_cluster
from ..ptx import (bar_sync, clock64, cluster_arrive_relaxed, cluster_arrive_release, cluster_rank,
                   cluster_size, cluster_wait_acquire, f16x2_to_f32x2, global_timer,
                   grid_dependency_wait, ld_nc_v4_u32, ld_v4_f32, st_cluster_f32, warp_max,
                   warp_max16, warp_max_rows, warp_sum, warp_sum16, warp_sum_rows, warp_sync)
from .activation import sigmoid
# the plan the combine derives again, and the softmax step of every split pass: one definition
from .attention import (COMBINE_BATCH, COMBINE_THREADS, _split_plan, block_max, combine_slices,
                        online_softmax_step, softmax_weights)
from .quantize_act import q8_code
from .prefetch import prefetch_bytes
from .rope import roped_from, roped_value, rope_partner, rotate_pair, rotated

WARPS = 4
THREADS = 32 * WARPS
TILE = 32                   # keys a warp scores at once: one per lane
VG = 8                      # keys of one V group (a tile is 4 groups)
VW = 32                     # V words a lane may have in flight: 4 groups with E <= 2 dims a
                            # lane, 2 with 4, 1 (and the next) with 8
ROWS_MAX = 8                # query heads per KV head (Qwen family: 4 .. 8)
HEAD_DIMS = (32, 64, 128, 256)
_RD_MAX = ROWS_MAX * 256    # q rows of one block / one warp's accumulators in shared memory
_ACC_SH = WARPS * _RD_MAX   # the merge buffer (q_sh aliases its start; q is dead by then)
_P_SH = WARPS * ROWS_MAX * TILE
_ML_SH = WARPS * ROWS_MAX
_W_MAX = 256                # COMBINE_IN_SPLIT: a head's split weights in buf (<= 256 splits)
_ACC_W_MAX = _W_MAX // 32   # its L sums: one a combine warp of 32 splits
_RED_SH = WARPS + _ACC_W_MAX                # the warps' maxima, then those L sums
_NEG_INF = np.float32(-np.inf)
# A split's K and V rows are named to L2 (one bulk prefetch a cache, kernels/prefetch.py) as
# soon as its range is known, so V's round trip overlaps q's load and the scores instead of
# following them (docs/decisions/0022). False: the kernel before (launch_split(prefetch=)).
PREFETCH_KV = True
# The instrumented build (`launch_split(trace=)`, bench/attention_phases.py): thread 0 of each
# block stamps %clock64 and %globaltimer (bw24nb.ptx) at these points -- kernel entry (after
# the grid-dependency wait), the plan known (the position's round trip), q in shared memory,
# the first tile's scores, its softmax, every tile done, the partial stored; a block past the
# context stamps the first two only (the rest stay 0). A stamp is an instruction-stream point:
# each one sits behind a barrier, a store it must follow, or a branch on the value it waits
# for (the plan's `used`, row 0's score), so the compiler cannot read the clock earlier.
TRACE_STAMPS = ("entry", "plan", "q", "scores", "softmax", "tiles", "stored")
# The softmax's rows (R query heads) as one interleaved step: every row's score, then their
# warp maxima as one butterfly of R interleaved shuffle chains (ptx.warp_max_rows), every row's
# exponentials, their sums likewise. The per-row form runs R max / sum chains one after another
# (each row's `if` a branch between them): 1056 ns of the 0.5B's one-tile split pass for 7 rows,
# 672 for the 9B's 4 (bench/attention_phases.py, session 19). The same values, bit for bit (a
# row's operations and their order are unchanged); off until measured in the engine's graph
# (launch_chain's "/il" kinds; run_bench measures it through this switch).
INTERLEAVE_ROWS = False
# A split of at most one tile (TILE keys: the 0.5B heads at ~512 tokens, 16 keys a split) has
# all its keys on warp 0: the other warps leave once q is in shared memory, and warp 0 stores
# its (m, l, acc) as the split's partial straight from registers -- the values the four-warp
# merge computes for it (weight exp(0) = 1 for warp 0, the others skipped; + 0.0 as the merge's
# sum starts, which only turns a -0.0 into +0.0), without the block barrier and the shared
# memory round trip of the merge (its "tiles -> stored" phase: 1440 ns on the 0.5B heads,
# session 19). The same bits (tested). On since session 21: the 0.5B's attention took 15.24
# against 16.35 us a layer in the engine, 867.3 / 809.0 against 863.4 / 799.8 tok/s, the same
# tokens (run_bench --launch default,attn-1t); launch_chain's "/1t": 14.55 against 15.75 us at
# 511, 19.76 against 22.66 at 6143. run_bench --launch attn-merge turns it off.
ONE_TILE_DIRECT = True
# A direct one-tile split on all four warps: warp w takes query rows w, w + 4, ... of the GQA
# group, each over the whole tile (lane = key), with the operations warp 0 runs for that row
# alone -- the same scores, softmax, PV and store, so the same bits. One warp walking all R rows
# made a split's latency R rows long: at 512 tokens of context every decode split is one tile
# (16 keys), and the 9B's split pass spent 5.9 us of its ~12 on scores (R = 4, D = 256; the
# 0.5B's 2.8 of ~8 at R = 7; attention_phases, session 19). Needs `direct`. Measured in the
# engine (session 26, run_bench --launch attn-1warp, both orders): it pays for the small heads
# only -- 0.5B (D = 64) 919.3 / 817.9 against 837.7 / 791.2 tok/s @512 / @6144 -- and loses for
# D = 256, where every warp loading the tile's 512-byte K and V rows costs more than the rows
# it saves: 35B-A3B 324.7 / 305.5 against 333.0 / 315.1 (attention 31.3 against 27.9 us a
# layer), 9B 19.8 against 18.6 us a layer. So it applies up to ONE_TILE_SPREAD_MAX_D.
ONE_TILE_SPREAD = True
ONE_TILE_SPREAD_MAX_D = 64
# The combine in the split pass: the last block of a (token, KV head) to store its partial
# (a counter per pair, `alloc_combine_counters`) merges the group's partials itself, with the
# combine kernel's arithmetic in its order (`combine_order`): the same bits, one launch and
# its boundary fewer. Bench/graph_timeline (decision 0043): the 0.5B's combine costs 7.3 us
# of its 17.3-us attention a layer. Measured a loss, so off (decision 0044; H100, 0.5B):
# 619.6 / 557.7 against 893.4 / 796.6 tok/s, attention 33.1 against 14.5 us a layer -- the
# last block runs the group's heads one after another. run_bench --launch attn-fused; not for
# walking grids.
COMBINE_IN_SPLIT = False
# One pass at short contexts: a block a (token, query head) runs every split of its row --
# warp w the pairs of splits w, w + ONEPASS_WARPS, .., a half-warp a split, each with the
# one-tile statements of `one_tile_spread` for that row (`split_pair_row`) -- keeps the
# partials in shared memory and merges them with the combine kernel's arithmetic in its order
# (`combine_order`), then gates and quantizes as the combine does: the bits of the split pass
# + combine, in one launch and without the partials' round trip through L2. Only for plans
# whose splits are at most 16 keys (the engine's DECODE_MIN_CHUNK) and at most
# `onepass_splits(D)` of them; a block given any other plan writes NaN, so a wrong dispatch
# cannot pass for a result. The engine takes it for decode while the context is at most
# engine.ONEPASS_MAX_CTX tokens (a graph of its own). Decision 0045.
ONEPASS_WARPS = 16          # (8 above D = 64: `onepass_warps`)
# The one-pass kernel's loads that do not need the token's position -- q, the output gate and,
# with the store, the new K / V rows and their RoPE frequencies -- issued with the position's
# load, the K / V prefetch issued as soon as the position is known (before the store), and
# the rotated q put in shared memory from registers instead of read back: the same
# operations on the same values (the same bits, tested), fewer round trips in a row. Session
# 44 (H100, 0.5B, run_bench, same tokens): 1150.7 / 1164.3 against 1149.5 / 1145.1 tok/s
# @512, the decode step 0.824 / 0.815 against 0.837 / 0.832 ms chained; the traced one pass
# 10.24 against 11.30 us (attention_phases 1psld / 1ps). run_bench onepass-late turns it off.
ONEPASS_EARLY = True
# V loads and products of a group of VG keys that all lie before the split's end (every group
# but a split's last partial one): the rows at constant offsets from one unsigned base, the
# products without a per-key test. The per-key form clamps each key to end - 1, multiplies
# its 64-bit row index and adds Numba's negative-index wraparound: ~12 instructions a V load,
# about half of the one-pass kernel's 1151-instruction pair loop at D = 64 (SASS, sm_90). The
# same loads and products (the same bits); False: the per-key form everywhere. Read when a
# kernel is built (split_kernel / onepass_kernel).
FULL_GROUPS = True
# The one-pass kernel's combine, step 3 (group g sums splits g, g + G, ..): each thread loads
# this many splits' partial and weight from shared memory, then adds them in order -- the same
# sums, with the loads in flight together instead of one shared-memory round trip an add
# (weights -> groups: 0.86 us of the 0.5B's one pass, 2.56 us of the 9B's at 511 tokens,
# session 44's trace). 1: one load pair an add. Read when a kernel is built. Built and tested
# (simulator) in session 44, when the device budget ran out before it could be measured: off
# until a run shows it pays (run_bench group-batch8 beside default).
ONEPASS_GROUP_BATCH = 1
# The one-pass kernel's instrumented build (`launch_onepass(trace=)`, bench/attention_phases.py
# --kernels 1p,1ps,..): thread 0 of each block stamps %clock64 and %globaltimer at kernel entry,
# the position known, the store done (its barrier; = the position without the store), q in
# shared memory, warp 0's first pair of splits, every split (the barrier after), the combine's
# weights and L, its groups' sums, and the output stored.
TRACE_STAMPS_1P = ("entry", "position", "stored", "q", "pair0", "splits", "weights", "groups",
                   "out")
# The one pass on a thread-block cluster of this many blocks a query head (sm_90+; 1: a block
# a head), for head dims up to ONEPASS_CLUSTER_MAX_D: the cluster's warps take the pairs of
# splits in turn (warp w of rank r: pairs w N + r, w N + r + N W, ..; W warps a block,
# `onepass_block_warps`), each block storing its partials into rank 0's shared memory (DSMEM:
# bw24nb/ptx/cluster.ptx), and rank 0 combines them after one cluster barrier, in the
# combine's order as before: the same bits on N times the SMs (kernel-check, H100: clusters of
# 2, 4, 8 bit-exact). Why: a head's block ran all its splits on one SM -- the 0.5B's 14 blocks
# of 16 warps spent 4.2 of the one pass's 8.8 us in their pairs of splits. Session 45 (H100,
# decision 0051): traced at 511 tokens, clusters of 4 / 2 take 2.4 / 2.8 us there and the
# kernel 7.4 / 7.5 us; chained 8.3 - 8.7 us against 9.5; in the engine (run_bench, four
# alternating pairs) clusters of 2 full-width blocks 1209.0 / 1204.1 / 1174.8 / 1196.3 tok/s
# @512 against 1155.5 / 1155.6 / 1151.3 / 1132.9 (+4 %, the same tokens), while narrower
# blocks (clusters of 4 or 8 sharing the warps) won chained but not in the graph. Launched
# without a cluster (the simulator, a GPU without clusters) the cluster build runs every split
# in each block. run_bench onepass-cluster1 turns it off.
ONEPASS_CLUSTER = 2
ONEPASS_CLUSTER_MAX_D = 64      # the 9B heads (D = 256) at 255 tokens: 14.33 us chained on
                                # clusters of 2 against 14.18 (session 45): not for them
# A cluster's blocks share out onepass_warps(D) (True: N blocks of W / N warps, but never fewer
# than the combine's threads need) or each has all of them (False: rank 0 combines on as many
# threads as the block-a-head kernel, the combine's steps as fast as before; the other ranks'
# extra warps only wait). Session 45 (run_bench, H100): False with clusters of 2 is the default
# above; True with 2, 4, 8: 1128.8, 1117.0 / 1143.8, 1156.4 tok/s against ~1157 @512.
ONEPASS_CLUSTER_SHARE = False
# The decode step's one pass reads the token's position and names its splits' K / V rows to L2
# *before* its grid-dependency wait (jit's `own_wait`): the position is written only by the
# previous replay's last kernel (complete before this replay starts) and the rows are earlier
# tokens' (a prefetch is a hint either way), so under programmatic edges, where the kernel's
# blocks sit resident in the wait while the q / k / v matvec before it runs, those two round
# trips (entry -> position ~0.9-1.1 us in session 45's trace) overlap that matvec instead of
# following it. Only for launches whose positions no kernel of the same graph writes -- every
# caller of the one pass: the engine's decode step (engine._onepass_build: not its verify, its
# prefill, nor the MTP draft chain, whose first kernel writes the positions its attention
# reads: so the split pass, which runs there, keeps its wait first), the checks and
# benchmarks (positions from the host). The same operations: the same bits; the PTX / SASS
# (sm_90) has the position's load and the prefetches before griddepcontrol.wait.
# Built in session 45; on since session 46 (H100, 0.5B, run_bench default / onepass-pre-wait
# alternating, the same tokens): 1213.1 / 1212.2 / 1263.2 against 1186.2 / 1173.0 / 1177.1 /
# 1184.6 tok/s @512, the decode step 0.756 / 0.774 / 0.762 against 0.794 / 0.807 / 0.802 /
# 0.776 ms chained; traced, 6.78 against 7.68 us entry -> out (attention_phases 1psldpw /
# 1psld). run_bench onepass-post-wait turns it off.
ONEPASS_PRE_WAIT = True
# The split pass's position, plan and K / V prefetch before its grid-dependency wait, as
# ONEPASS_PRE_WAIT does for the one pass, in the decode step past the one pass's contexts
# (engine._decode_build: its graph writes no position before the attention; the verify's
# and the MTP chain's split passes keep their wait first, `launch_split(pre_wait=)`): the
# position's round trip and the first K / V misses overlap the matvec before instead of
# following it. The same operations (the same bits: simulator tests, kernel-check
# flash_decode_forms; on the H100 the same tokens). Session 46 (H100, 0.5B, run_bench
# default / split-post-wait alternating): 920.2 / 915.5 / 923.5 against 891.6 / 899.6 /
# 903.8 tok/s @6144 (+2.3 %), @512 unchanged (the one pass serves it).
SPLIT_PRE_WAIT = True
# The split pass and its combine in one launch, on a thread-block cluster of this many blocks
# a (token, KV head) (sm_90+; 1: off -- the split pass, then attention's combine kernel), each
# block SPLIT_CLUSTER_SLOTS four-warp split slots (fewer where shared memory runs short,
# `cluster_split_slots`): the slots take the plan's splits in turn, each with the split
# pass's statements on its own named barrier (bar_sync.ptx), and after one cluster barrier
# rank c merges heads c, c + N, .. of the group in the combine kernel's order -- the same
# bits without the combine's launch, its kernel boundary and its position round trip (at
# 6144 tokens the 0.5B's split pass spans ~13 us and its combine ~5 a layer; decision 0052).
# For the decode step past the one pass's contexts (engine). Built in session 46 with no
# device time left: off until run_bench split-cluster8 shows it pays.
SPLIT_CLUSTER = 1
# 3: the 0.5B heads' blocks of 384 threads fit 168 registers (sm_90 SASS, no spills); 4 slots
# would fit its shared memory but 128 registers, with a 152-byte stack (run_bench
# split-cluster16s4 measures it)
SPLIT_CLUSTER_SLOTS = 3
# The scores' q reads (`dot8`) as two 16-byte shared loads (LDS.128) a chunk of 8 dims, not
# eight 4-byte ones each with Numba's negative-index check: the same products in the same
# order, so the same bits (simulator tests; kernel-check flash_decode*). sm_90 SASS of the
# 0.5B split kernel (r7_e2): its chunk loop 182 -> 99 instructions, 128 -> 138 registers
# (4 -> 3 blocks of 128 threads an SM could hold). Built in session 47, when no device was
# lent: off until run_bench attn-wide-q (or launch_chain's "/wq") shows it pays.
WIDE_Q = False
ONEPASS_THREADS = 32 * ONEPASS_WARPS
_ONEPASS_ACC = 8192         # floats of partial accumulators (32 KB): splits x D
_ONEPASS_SPLITS = 256       # (m, l, w) slots: the most splits any head dim may take


def supports(n_rep: int, D: int, k_type, v_type) -> bool:
    from ..quant import QType
    return (int(k_type) == int(QType.F16) and int(v_type) == int(QType.F16)
            and 1 <= n_rep <= ROWS_MAX and D in HEAD_DIMS)


def onepass_splits(D: int) -> int:
    """The most splits the one-pass kernel holds for head_dim D (its shared accumulators)."""
    return min(_ONEPASS_SPLITS, _ONEPASS_ACC // D)


def onepass_warps(D: int) -> int:
    """Warps of a one-pass block: ONEPASS_WARPS up to D = 64, half that above (the V
    groups' registers, ptxas for sm_90: 134 a thread at D = 128, 193 at 256, against 98 at
    64)."""
    return ONEPASS_WARPS if D <= 64 else ONEPASS_WARPS // 2


def onepass_cluster(D: int) -> int:
    """Blocks a query head's cluster takes by default (ONEPASS_CLUSTER up to
    ONEPASS_CLUSTER_MAX_D, else 1)."""
    return max(1, int(ONEPASS_CLUSTER)) if D <= ONEPASS_CLUSTER_MAX_D else 1


def onepass_block_warps(D: int, cluster: int = 1) -> int:
    """Warps of one block of the one pass on clusters of `cluster` blocks: with
    ONEPASS_CLUSTER_SHARE `onepass_warps(D)` shared out (the cluster's warps run the pairs of
    splits), but never fewer than the combine takes -- a thread for each split it may hold
    (`onepass_splits`) and for each dim; else all of them."""
    n = max(1, int(cluster)) if ONEPASS_CLUSTER_SHARE else 1
    need = max(onepass_splits(D), D) // 32
    return max(onepass_warps(D) // n, need)


def onepass_max_ctx(D: int, n_splits: int, min_chunk: int) -> int:
    """The longest context whose decode plan the one-pass kernel serves: splits of min_chunk
    keys (<= TILE / 2: a half-warp a split), at most min(n_splits, onepass_splits(D)) of
    them; 0 if none."""
    if not 1 <= min_chunk <= TILE // 2:        # a half-warp a split
        return 0
    return min_chunk * min(int(n_splits), onepass_splits(D))


def onepass_rounds(D: int) -> int:
    """Pairs of splits a warp may run one after another while the one pass still pays: 2 up
    to head_dim 64, 1 above. Measured against the split pass + combine (bench/launch_chain.py,
    H100, session 39; decision 0045): 0.5B heads (D = 64, 16 warps) 14.88 against 16.21 us at
    1023 tokens (2 rounds), 19.38 against 17.87 at 1535 (3); 9B heads (D = 256, 8 warps)
    14.72 against 17.05 at 255 (1), 22.35 against 17.10 at 383 (2)."""
    return 2 if D <= 64 else 1


def onepass_pays_ctx(D: int, n_splits: int, min_chunk: int) -> int:
    """The longest context at which the engine takes the one-pass kernel: what it serves
    (`onepass_max_ctx`), at most `onepass_rounds(D)` pairs of splits a warp."""
    rounds = min_chunk * 2 * onepass_warps(D) * onepass_rounds(D)
    return min(onepass_max_ctx(D, n_splits, min_chunk), rounds)


def combine_order(D: int, combine_threads: int = COMBINE_THREADS, slices=None) -> int:
    """G, the groups the combine kernel sums a head's splits in (attention._make_combine, step
    3): its blocks of `combine_threads` threads over slices of DS = D / slices dims give
    blockDim / Dp groups, Dp = DS rounded up to a power of two >= 32. The split pass's combine
    (COMBINE_IN_SPLIT) sums in the same G groups, so its bits are the kernel's."""
    slices = combine_slices(D) if slices is None else int(slices)
    DS = D // slices
    Dp = 32
    while Dp < DS:
        Dp *= 2
    return combine_threads // Dp


def alloc_combine_counters(T: int, n_kv_heads: int):
    """The split pass's combine counters (COMBINE_IN_SPLIT): one int32 a (token, KV head), zero;
    the last block of each pair puts its counter back to zero (allocate once, before capture)."""
    return cuda.to_device(np.zeros(T * n_kv_heads, np.int32))


def _make(R: int, E: int, prefetch: bool = True, trace: bool = False, interleave: bool = False,
          direct: bool = False, walk: bool = False, spread: bool = False, fused: bool = False,
          onepass: bool = False, store: bool = False, early: bool = False, full: bool = True,
          group_batch: int = 1, cluster: int = 1, warps: int = 0, pre_wait: bool = False,
          slots: int = 0):
    """The split kernel for R query rows and E = D / 32 dims per lane; prefetch: name the
    split's K and V rows to L2 first (PREFETCH_KV); trace: stamp TRACE_STAMPS (the same
    results; the stamps' stores are the only difference); interleave: the softmax's rows as
    one interleaved step (INTERLEAVE_ROWS; the same results); direct: a one-tile split stored
    by warp 0 without the merge (ONE_TILE_DIRECT; the same results); walk: a grid of fewer
    blocks than splits, each walking its splits (`launch_split(grid=)`; the same results);
    spread: with direct, a one-tile split's rows spread over the warps (ONE_TILE_SPREAD; the
    same results); onepass: the one-pass kernel instead (ONEPASS_WARPS; the bits of the split
    pass + combine); store: with onepass, the token's RoPE and K / V store in it too; early:
    with onepass, its loads issued early (ONEPASS_EARLY; the same results); with onepass,
    trace stamps TRACE_STAMPS_1P instead; full: V groups whose keys are all in range loaded and
    multiplied without per-key clamps and tests (FULL_GROUPS; the same results); group_batch:
    with onepass, the combine's group sums load this many splits' terms before adding them
    (ONEPASS_GROUP_BATCH; the same results); cluster: with onepass, the build that clusters of
    that many blocks run, a cluster a query head (ONEPASS_CLUSTER, `launch_onepass`; the same
    results); 1: a block a head; warps: with onepass, a block's (default
    `onepass_block_warps(D, cluster)`); pre_wait: with onepass, the position and the K / V
    prefetch before the grid-dependency wait (ONEPASS_PRE_WAIT; the same results); without
    onepass and fused, the split pass's position, plan and K / V prefetch before the wait
    (SPLIT_PRE_WAIT, `launch_split(pre_wait=)`; the same results); slots: the cluster split
    pass instead (`split_cluster`), blocks of that many four-warp split slots (SPLIT_CLUSTER;
    the bits of the split pass + combine)."""
    FG = full
    SL = 0 if onepass or fused else int(slots)      # the cluster split pass's slots a block
    CS = SL > 0
    NTC = THREADS * max(SL, 1)                      # its threads ...
    NWC = WARPS * max(SL, 1)                        # ... and warps
    # a slot's stride between its warps' accumulators in the merge buffer: the split pass
    # keeps the one of the largest heads (its layout, unchanged), a slot of the cluster pass
    # its head's own, so SL slots fit in shared memory (`cluster_split_slots`)
    RDS = R * 32 * E if CS else _RD_MAX
    _BUF_CS = max(1, SL) * WARPS * RDS
    _P_CS = max(1, SL) * _P_SH
    _ML_CS = max(1, SL) * _ML_SH
    _RED_CS = NWC + _W_MAX // 32            # the warps' maxima, then the combine's L sums
    _NSC = (_W_MAX + NTC - 1) // NTC        # splits a thread holds in combine_head
    CL = onepass and int(cluster) > 1
    PW = onepass and bool(pre_wait)
    PWS = not onepass and not fused and bool(pre_wait)      # the split pass's
    WQ = bool(WIDE_Q)                       # read at build time: the callers' cache keys hold it
    if CS and trace:
        raise ValueError("the cluster split pass has no traced build")
    GB = max(1, int(group_batch))
    NS = len(TRACE_STAMPS)
    NS1 = len(TRACE_STAMPS_1P)
    trace_on = trace
    D = 32 * E
    DW = D // 2             # uint32 words in one K or V row
    CH = D // 8             # 16-byte chunks in one K row
    RE = R * E              # accumulators a lane holds (a constant for cuda.local.array)
    NQ = (R * D + THREADS - 1) // THREADS       # q values a thread loads
    EW = (E + 1) // 2       # V words a lane reads a key (E = 1: the word its lane pair shares)
    GW = VG * EW            # words of one V group (VG keys) a lane holds
    NE = max(1, min(TILE // VG, VW // GW))      # V groups issued with the K tile (the rest
                                                # one group ahead of the products)
    RS = (R + WARPS - 1) // WARPS       # spread: rows a warp takes (row warp + WARPS j, < R)
    W1 = int(warps) or onepass_block_warps(D, cluster if onepass else 1)   # onepass: a block's
    NT1 = 32 * W1
    assert NT1 >= min(_ONEPASS_SPLITS, _ONEPASS_ACC // D)   # a thread a split in the combine
    RSE = RS * E
    assert NT1 >= D                     # onepass, early: a thread a dim

    @cuda.jit(device=True, inline="always")
    def v_load(vraw, vw, head_word, k0, j0, nk, end, lane):
        """The words of this lane's E dims of keys k0 + j0 .. + VG - 1 (a key past `end` reads
        the last key's row, unused) into vraw[GW], if the group has a key (j0 < nk)."""
        if j0 < nk:
            lw = (lane >> 1) if E == 1 else lane * (E // 2)
            if FG and j0 + VG <= nk:
                # every key of the group is before `end`: rows at constant offsets from one
                # unsigned base (no clamp, and no negative-index wraparound to compute)
                base = np.uint64(head_word + np.int64(k0 + j0) * DW + lw)
                for jj in range(VG):
                    v_words(vraw, vw, base + np.uint64(jj * DW), jj)
            else:
                for jj in range(VG):
                    v_words(vraw, vw, np.uint64(head_word + np.int64(min(k0 + j0 + jj, end - 1))
                                                * DW + lw), jj)

    @cuda.jit(device=True, inline="always")
    def v_words(vraw, vw, vrow, jj):
        """This lane's EW words of one V row (vrow: its first word's index, unsigned, so that
        no negative-index wraparound is computed) into vraw[jj * EW ..]."""
        if EW == 4:                     # 16-byte aligned (lw = 4 lane): one load
            w0, w1, w2, w3 = ld_nc_v4_u32(vw, vrow)
            vraw[jj * 4] = w0
            vraw[jj * 4 + 1] = w1
            vraw[jj * 4 + 2] = w2
            vraw[jj * 4 + 3] = w3
        else:
            for w in range(EW):
                vraw[jj * EW + w] = vw[vrow + np.uint64(w)]

    @cuda.jit(device=True, inline="always")
    def pv(acc, vraw, j0, nk, p_sh, pb, lane, warp):
        """acc[r, e] += p[r, j] v[j, e] for the group's keys j = j0 .. j0 + VG - 1 (< nk),
        ascending (warp: unused, `pv_spread`'s signature)."""
        if FG and j0 + VG <= nk:      # every key (the same products, no tests)
            for jj in range(VG):
                for r in range(R):
                    pj = p_sh[pb + r * TILE + j0 + jj]
                    for e in range(E):
                        acc[r * E + e] += pj * v_value(vraw, jj, e, lane)
        else:
            for jj in range(VG):
                if j0 + jj < nk:
                    for r in range(R):
                        pj = p_sh[pb + r * TILE + j0 + jj]
                        for e in range(E):
                            acc[r * E + e] += pj * v_value(vraw, jj, e, lane)

    def stamper(n):
        """stamp(trace, base, k) for a trace of n stamps a block: stamp k's SM cycle counter
        at base + k, then its global timer at base + n + k."""
        @cuda.jit(device=True, inline="always")
        def stamp(trace, base, k):
            trace[base + k] = clock64()
            trace[base + n + k] = global_timer()
        return stamp

    stamp = stamper(NS)         # the split pass's (TRACE_STAMPS)

    @cuda.jit(device=True, inline="always")
    def v_value(vraw, jj, e, lane):
        """Value e of this lane's E dims of the group's key jj."""
        if E == 1:
            lo, hi = f16x2_to_f32x2(vraw[jj])
            return hi if (lane & 1) else lo
        lo, hi = f16x2_to_f32x2(vraw[jj * EW + (e >> 1)])
        return hi if (e & 1) else lo

    @cuda.jit(device=True, inline="always")
    def k_chunk(kw, row, c):
        """Dims 8c .. 8c + 7 of this lane's K row (one 16-byte load), as 8 floats."""
        w0, w1, w2, w3 = ld_nc_v4_u32(kw, row + 4 * c)
        k_0, k_1 = f16x2_to_f32x2(w0)
        k_2, k_3 = f16x2_to_f32x2(w1)
        k_4, k_5 = f16x2_to_f32x2(w2)
        k_6, k_7 = f16x2_to_f32x2(w3)
        return k_0, k_1, k_2, k_3, k_4, k_5, k_6, k_7

    @cuda.jit(device=True, inline="always")
    def dot8(a, buf, qb, k):
        """a + q[qb .. qb + 7] . k, d ascending (the score's order). With WIDE_Q, q comes as
        two 16-byte shared loads (LDS.128; `buf` is 16-byte aligned and qb a multiple of 8)
        instead of eight 4-byte ones: the same products in the same order."""
        if WQ:
            q0, q1, q2, q3 = ld_v4_f32(buf, qb)
            q4, q5, q6, q7 = ld_v4_f32(buf, qb + 4)
        else:
            q0, q1, q2, q3 = buf[qb], buf[qb + 1], buf[qb + 2], buf[qb + 3]
            q4, q5, q6, q7 = buf[qb + 4], buf[qb + 5], buf[qb + 6], buf[qb + 7]
        a += q0 * k[0]
        a += q1 * k[1]
        a += q2 * k[2]
        a += q3 * k[3]
        a += q4 * k[4]
        a += q5 * k[5]
        a += q6 * k[6]
        a += q7 * k[7]
        return a

    @cuda.jit(device=True, inline="always")
    def softmax_row(score, m_row, l_row, lane, nk, scale):
        """One row's online-softmax step over a tile: (m', alpha, l', p) for this lane's key."""
        m_new, p, al = online_softmax_step(score * scale if lane < nk else _NEG_INF, m_row)
        return m_new, al, l_row * al + warp_sum(p), p

    @cuda.jit(device=True, inline="always")
    def pv_spread(acc, vraw, j0, nk, p_sh, pb, lane, warp):
        """`pv` for the rows of `one_tile_spread`: slot j = row warp + WARPS j."""
        if FG and j0 + VG <= nk:      # every key (the same products, no tests)
            for jj in range(VG):
                for j in range(RS):
                    if warp + WARPS * j < R:
                        pj = p_sh[pb + j * TILE + j0 + jj]
                        for e in range(E):
                            acc[j * E + e] += pj * v_value(vraw, jj, e, lane)
        else:
            for jj in range(VG):
                if j0 + jj < nk:
                    for j in range(RS):
                        if warp + WARPS * j < R:
                            pj = p_sh[pb + j * TILE + j0 + jj]
                            for e in range(E):
                                acc[j * E + e] += pj * v_value(vraw, jj, e, lane)

    @cuda.jit(device=True, inline="always")
    def v_first(v0, v1, v2, v3, vw, head_word, k0, nk, end, lane):
        """V's first NE groups of the tile at k0, issued with its K loads (none if nk <= 0)."""
        v_load(v0, vw, head_word, k0, 0, nk, end, lane)
        if NE > 1:
            v_load(v1, vw, head_word, k0, VG, nk, end, lane)
        if NE > 2:
            v_load(v2, vw, head_word, k0, 2 * VG, nk, end, lane)
            v_load(v3, vw, head_word, k0, 3 * VG, nk, end, lane)

    def pv_groups(pvf):
        """The tile's PV with `pvf` (pv, pv_spread): the 4 groups of VG keys in order, a group
        not yet issued (`v_first`) issued NE groups before its products, so at most one V
        round trip a tile is exposed, where session 6's loop over keys waited for each of 32."""
        @cuda.jit(device=True, inline="always")
        def run(acc, v0, v1, v2, v3, vw, head_word, k0, nk, end, p_sh, pb, lane, warp):
            if NE == 1:
                v_load(v1, vw, head_word, k0, VG, nk, end, lane)
            if NE == 2:
                v_load(v2, vw, head_word, k0, 2 * VG, nk, end, lane)
            pvf(acc, v0, 0, nk, p_sh, pb, lane, warp)
            if NE == 1:
                v_load(v2, vw, head_word, k0, 2 * VG, nk, end, lane)
            if NE == 2:
                v_load(v3, vw, head_word, k0, 3 * VG, nk, end, lane)
            pvf(acc, v1, VG, nk, p_sh, pb, lane, warp)
            if NE == 1:
                v_load(v3, vw, head_word, k0, 3 * VG, nk, end, lane)
            pvf(acc, v2, 2 * VG, nk, p_sh, pb, lane, warp)
            pvf(acc, v3, 3 * VG, nk, p_sh, pb, lane, warp)
        return run

    pv_tile = pv_groups(pv)
    pv_tile_spread = pv_groups(pv_spread)

    @cuda.jit(device=True, inline="always")
    def one_tile_spread(buf, p_sh, kw, vw, head_word, begin, end, scale, kvh, tok, split_i,
                        part_ml, part_acc, trace, tb, lane, warp):
        """A split of at most one tile (keys begin .. end - 1 <= begin + TILE - 1) on every
        warp: warp w takes rows w, w + WARPS, ... (its slots j), each over the whole tile,
        with the statements the one-warp path runs for that row (the loop below with warp 0's
        tile, the plain softmax -- the interleaved one gives the same values -- and the
        direct store): the same bits, from warps that now run RS rows instead of R."""
        s = cuda.local.array(RS, float32)
        m = cuda.local.array(RS, float32)
        lsum = cuda.local.array(RS, float32)
        alpha = cuda.local.array(RS, float32)
        acc = cuda.local.array(RSE, float32)
        v0 = cuda.local.array(GW, uint32)
        v1 = cuda.local.array(GW, uint32)
        v2 = cuda.local.array(GW, uint32)
        v3 = cuda.local.array(GW, uint32)
        k0 = begin
        nk = end - k0
        key = min(k0 + lane, end - 1)
        row = head_word + np.int64(key) * DW
        v_first(v0, v1, v2, v3, vw, head_word, k0, nk, end, lane)
        for j in range(RS):
            m[j] = _NEG_INF
            lsum[j] = float32(0.0)
            s[j] = float32(0.0)
        for i in range(RSE):
            acc[i] = float32(0.0)
        for c in range(CH):
            k = k_chunk(kw, row, c)
            for j in range(RS):
                r = warp + WARPS * j
                if r < R:                       # warp-uniform
                    s[j] = dot8(s[j], buf, r * D + 8 * c, k)
        if trace_on and lane == 0 and warp == 0 and s[0] == s[0]:    # (after row 0's dot)
            stamp(trace, tb, 3)
        pb = warp * ROWS_MAX * TILE
        for j in range(RS):
            if warp + WARPS * j < R:
                m[j], alpha[j], lsum[j], p = softmax_row(s[j], m[j], lsum[j], lane, nk, scale)
                p_sh[pb + j * TILE + lane] = p
        warp_sync()                             # p_sh (this warp's rows) written, then read
        if trace_on and lane == 0 and warp == 0:
            stamp(trace, tb, 4)
        for j in range(RS):
            if warp + WARPS * j < R:
                for e in range(E):
                    acc[j * E + e] *= alpha[j]
        pv_tile_spread(acc, v0, v1, v2, v3, vw, head_word, k0, nk, end, p_sh, pb, lane, warp)
        if trace_on and lane == 0 and warp == 0:
            stamp(trace, tb, 5)
        for j in range(RS):
            r = warp + WARPS * j
            if r < R:
                h = kvh * R + r
                for e in range(E):
                    part_acc[tok, h, split_i, lane * E + e] = float32(0.0) + acc[j * E + e]
                if lane == 0:
                    part_ml[tok, h, split_i, 0] = m[j]
                    part_ml[tok, h, split_i, 1] = float32(0.0) + lsum[j]
        if trace_on and lane == 0 and warp == 0:
            stamp(trace, tb, 6)

    @cuda.jit(device=True, inline="always")
    def prefetch_split(kw, vw, head_word, begin, end, tid):
        """Thread 0: the K rows of keys begin .. end - 1 named to L2, thread 32: their V rows."""
        b0 = 4 * (head_word + np.int64(begin) * DW)
        b1 = 4 * (head_word + np.int64(end) * DW)
        prefetch_bytes(kw if tid == 0 else vw, b0, b1)

    @cuda.jit(device=True, inline="always")
    def plan_ahead(positions, tok, ctx, n_splits, min_chunk, chunk_align, kw, vw, kvh, first,
                   stride, tid):
        """(n_ctx, chunk, used): the token's split plan from its position, and (thread 0 / 32
        of the four warps, with prefetch) the K / V rows of splits first, first + stride, ..
        named to L2 -- PWS's steps before the grid-dependency wait, which the caller runs
        next."""
        n_ctx, chunk, used = _split_plan(positions[tok], ctx, n_splits, min_chunk, chunk_align)
        if prefetch and (tid == 0 or tid == 32):
            head_word = np.int64(kvh) * ctx * DW
            for split_i in range(first, used, stride):
                prefetch_split(kw, vw, head_word, split_i * chunk,
                               min(split_i * chunk + chunk, n_ctx), tid)
        return n_ctx, chunk, used

    @cuda.jit(device=True, inline="always")
    def slot_sync(slot):
        """A barrier over the four warps of `slot`: the block's (__syncthreads) where a block
        is one split's, named barrier slot + 1 in the cluster split pass (bar_sync.ptx)."""
        if SL > 1:
            bar_sync(slot + 1, THREADS)
        else:
            cuda.syncthreads()

    @cuda.jit(device=True, inline="always")
    def _trace_base(kvh, tok, n_splits, split_i):
        return ((tok * cuda.gridDim.y + kvh) * n_splits + split_i) * 2 * NS

    @cuda.jit(device=True, inline="always")
    def split_body(split_i, qv, buf, p_sh, m_sh, l_sh, kw, vw, ctx, scale, n_ctx, chunk, kvh,
                   tok, n_splits, part_ml, part_acc, trace, tid, slot):
        """Split split_i of the block's token and KV head: its keys' scores, softmax and PV
        on four warps, stored as the split's partial. tid: the thread among those four warps'
        (the block's, but in a slot of the cluster split pass); slot: theirs (`slot_sync`)."""
        s = cuda.local.array(R, float32)
        m = cuda.local.array(R, float32)
        lsum = cuda.local.array(R, float32)
        alpha = cuda.local.array(R, float32)
        mx = cuda.local.array(R, float32)      # interleave: the rows' maxima
        pr = cuda.local.array(R, float32)      # interleave: the rows' p, then their sums
        acc = cuda.local.array(RE, float32)
        # the tile's V words, a group of VG keys each (separate arrays, so that every index
        # is a constant and they stay in registers)
        v0 = cuda.local.array(GW, uint32)
        v1 = cuda.local.array(GW, uint32)
        v2 = cuda.local.array(GW, uint32)
        v3 = cuda.local.array(GW, uint32)
        lane = tid & 31
        warp = tid >> 5
        tb = _trace_base(kvh, tok, n_splits, split_i)
        begin = split_i * chunk
        end = min(begin + chunk, n_ctx)
        head_word = np.int64(kvh) * ctx * DW
        if prefetch and not PWS and (tid == 0 or tid == 32):    # the split's rows (PWS:
            prefetch_split(kw, vw, head_word, begin, end, tid)  # named before the wait)
        for k in range(NQ):
            i = tid + k * THREADS
            if i < R * D:
                buf[i] = qv[k]
        for r in range(R):
            m[r] = _NEG_INF
            lsum[r] = float32(0.0)
        for i in range(RE):
            acc[i] = float32(0.0)
        slot_sync(slot)
        if trace_on and tid == 0:
            stamp(trace, tb, 2)
        one_tile = direct and end - begin <= TILE       # the same for the whole block
        if one_tile and spread:
            one_tile_spread(buf, p_sh, kw, vw, head_word, begin, end, scale, kvh, tok, split_i,
                            part_ml, part_acc, trace, tb, lane, warp)
            return
        if one_tile and warp > 0:
            return                  # no key: q was all this warp had to give
        # every warp runs the same number of steps (the barriers below are block-wide); a
        # warp whose tile starts past `end` scores nothing and adds nothing
        for t0 in range(begin, end, WARPS * TILE):
            k0 = t0 + warp * TILE
            nk = min(TILE, end - k0)            # <= 0: this warp has no tile this step
            key = min(k0 + lane, end - 1)
            row = head_word + np.int64(key) * DW
            # V's first NE groups, in flight with the K tile (none if nk <= 0)
            v_first(v0, v1, v2, v3, vw, head_word, k0, nk, end, lane)
            for r in range(R):
                s[r] = float32(0.0)
            for c in range(CH):
                k = k_chunk(kw, row, c)
                for r in range(R):
                    s[r] = dot8(s[r], buf, r * D + 8 * c, k)
            if trace_on and tid == 0 and t0 == begin and s[0] == s[0]:   # (after row 0's dot)
                stamp(trace, tb, 3)
            if interleave:
                for r in range(R):
                    s[r] = s[r] * scale if lane < nk else _NEG_INF
                    mx[r] = s[r]
                warp_max_rows(mx, R)
                for r in range(R):
                    m_new = max(m[r], mx[r])
                    # no key of this row yet (m_new = -inf): p = exp(-inf) = 0 as before, and
                    # alpha = 0 instead of 1 -- it scales an l and an acc that are still +0.0
                    mm = m_new if m_new != _NEG_INF else float32(0.0)
                    pr[r] = math.exp(s[r] - mm)
                    alpha[r] = math.exp(m[r] - mm)
                    m[r] = m_new
                    p_sh[(warp * ROWS_MAX + r) * TILE + lane] = pr[r]
                warp_sum_rows(pr, R)
                for r in range(R):
                    lsum[r] = lsum[r] * alpha[r] + pr[r]
            else:
                for r in range(R):
                    m[r], alpha[r], lsum[r], p = softmax_row(s[r], m[r], lsum[r], lane, nk,
                                                             scale)
                    p_sh[(warp * ROWS_MAX + r) * TILE + lane] = p
            warp_sync()                         # p_sh (this warp's rows) written, then read
            if trace_on and tid == 0 and t0 == begin:
                stamp(trace, tb, 4)
            for r in range(R):
                for e in range(E):
                    acc[r * E + e] *= alpha[r]
            pv_tile(acc, v0, v1, v2, v3, vw, head_word, k0, nk, end, p_sh,
                    warp * ROWS_MAX * TILE, lane, warp)
            warp_sync()                         # p_sh read before the next step rewrites it
        if one_tile:                # warp 0's state is the partial: the merge's values, stored
            if trace_on and tid == 0:
                stamp(trace, tb, 5)
            for r in range(R):
                h = kvh * R + r
                for e in range(E):
                    part_acc[tok, h, split_i, lane * E + e] = float32(0.0) + acc[r * E + e]
                if lane == 0:
                    part_ml[tok, h, split_i, 0] = m[r]
                    part_ml[tok, h, split_i, 1] = float32(0.0) + lsum[r]
            if trace_on and tid == 0:
                stamp(trace, tb, 6)
            return
        slot_sync(slot)                         # every warp done with q before buf is reused
        if trace_on and tid == 0:
            stamp(trace, tb, 5)
        # merge the warps in order into the split's partial (q is dead: buf holds acc now)
        for r in range(R):
            for e in range(E):
                buf[warp * RDS + r * D + lane * E + e] = acc[r * E + e]
        if lane == 0:
            for r in range(R):
                m_sh[warp * ROWS_MAX + r] = m[r]
                l_sh[warp * ROWS_MAX + r] = lsum[r]
        slot_sync(slot)
        for i in range(tid, R * D, THREADS):
            r = i // D
            d = i - r * D
            M = m_sh[r]
            for w in range(1, WARPS):
                M = max(M, m_sh[w * ROWS_MAX + r])
            L = float32(0.0)
            A = float32(0.0)
            for w in range(WARPS):
                mw = m_sh[w * ROWS_MAX + r]
                if mw != _NEG_INF:
                    f = math.exp(mw - M)
                    L += l_sh[w * ROWS_MAX + r] * f
                    A += buf[w * RDS + i] * f
            h = kvh * R + r
            part_acc[tok, h, split_i, d] = A
            if d == 0:
                part_ml[tok, h, split_i, 0] = M
                part_ml[tok, h, split_i, 1] = L
        if trace_on and tid == 0:
            stamp(trace, tb, 6)

    @cuda.jit(device=True, inline="always")
    def q_rows_and_plan(q, positions, qv, ctx, n_splits, min_chunk, chunk_align, kvh, tok, tid):
        """The position's load issued first and the block's q rows into registers (qv) while
        it is in flight; then the split plan (n_ctx, chunk, used). The K / V prefetch follows
        as soon as the plan is known, then q into shared memory (a block past the context
        loads q for nothing)."""
        position = positions[tok]
        q_rows(q, qv, kvh, tok, tid)
        return _split_plan(position, ctx, n_splits, min_chunk, chunk_align)

    @cuda.jit(device=True, inline="always")
    def q_rows(q, qv, kvh, tok, tid):
        """The block's q rows into registers: thread tid holds q values tid, tid + THREADS, .."""
        for k in range(NQ):
            i = tid + k * THREADS
            qv[k] = float32(0.0)
            if i < R * D:
                r = i // D
                qv[k] = q[tok, kvh * R + r, i - r * D]

    def split(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, part_ml, part_acc,
              trace):
        # q rows (16-byte aligned for dot8's LDS.128), later the warps' accumulators
        buf = cuda.shared.array(_ACC_SH, float32, alignment=16)
        p_sh = cuda.shared.array(_P_SH, float32)
        m_sh = cuda.shared.array(_ML_SH, float32)
        l_sh = cuda.shared.array(_ML_SH, float32)
        qv = cuda.local.array(NQ, float32)
        # walk: the plan's split count is the partials' (the grid may be smaller, each block
        # walking splits blockIdx.x, + gridDim.x, ...); otherwise they are the grid's x
        n_splits = part_ml.shape[2] if walk else cuda.gridDim.x
        kvh = cuda.blockIdx.y
        tok = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        first = cuda.blockIdx.x
        if PWS:
            # (jit's own_wait) only for launches whose graph writes neither the position nor
            # the rows before this kernel (the decode step's: `launch_split(pre_wait=)`); a
            # block walks splits first, + gridDim.x, .. (without walk gridDim.x >= used)
            n_ctx, chunk, used = plan_ahead(positions, tok, ctx, n_splits, min_chunk,
                                            chunk_align, kw, vw, kvh, first, cuda.gridDim.x,
                                            tid)
            grid_dependency_wait()
        if trace_on and tid == 0:
            stamp(trace, _trace_base(kvh, tok, n_splits, cuda.blockIdx.x), 0)
        if PWS:
            q_rows(q, qv, kvh, tok, tid)
        else:
            n_ctx, chunk, used = q_rows_and_plan(q, positions, qv, ctx, n_splits, min_chunk,
                                                 chunk_align, kvh, tok, tid)
        if trace_on and tid == 0 and used > 0:      # (control-dependent on the position)
            stamp(trace, _trace_base(kvh, tok, n_splits, cuda.blockIdx.x), 1)
        if walk:
            # a block's splits one after another, each exactly as a block of its own would
            # run it (the same loads, sums and stores: the same bits); the barrier keeps the
            # next split's q store behind the last split's readers of buf
            for split_i in range(first, used, cuda.gridDim.x):
                if split_i != first:
                    cuda.syncthreads()
                split_body(split_i, qv, buf, p_sh, m_sh, l_sh, kw, vw, ctx, scale, n_ctx,
                           chunk, kvh, tok, n_splits, part_ml, part_acc, trace, tid, 0)
        elif first < used:          # else the whole block leaves: the combine never reads it
            split_body(first, qv, buf, p_sh, m_sh, l_sh, kw, vw, ctx, scale, n_ctx, chunk,
                       kvh, tok, n_splits, part_ml, part_acc, trace, tid, 0)

    @cuda.jit(device=True, inline="always")
    def combine_head(tok, kvh, r, used, part_ml, part_acc, out, gate, xq, xd, has_gate, has_q8,
                     G, w_sh, acc_sh, red_sh):
        """Head r of the (token, KV head)'s group from its `used` partials, on the whole
        block (NTC threads, NWC warps), the combine kernel's steps in its order, so its bits:
          1. M = max m_s over the visible splits (l_s > 0, s < used): exact in any order;
          2. w_s = exp(m_s - M); L = the combine's warps of 32 splits each summed by warp_sum,
             then those sums in warp order (thread tid holds splits tid, tid + NTC, .., so
             warp w takes the combine's warps w, w + NWC, ..; the trailing ones past `used`,
             all +0.0, are left out, which leaves L as it is);
          3. output d: group g of G (`combine_order`) sums splits g, g + G, .. ascending
             (thread (g, d) of the block, into acc_sh), the groups' sums added in group
             order, / L; then the gate and the int8 copy (a warp: 32 consecutive dims of the
             head, the combine's q8 block).
        w_sh holds >= _W_MAX floats, acc_sh >= G D. Every thread calls it (block barriers);
        it ends on one, so the next head may reuse w_sh, acc_sh and red_sh."""
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        h = kvh * R + r
        ms = cuda.local.array(_NSC, float32)
        lv = cuda.local.array(_NSC, float32)
        m = _NEG_INF
        for k in range(_NSC):
            s0 = tid + k * NTC
            ms[k] = _NEG_INF
            lv[k] = float32(0.0)
            if s0 < used:
                ms[k] = part_ml[tok, h, s0, 0]
                lv[k] = part_ml[tok, h, s0, 1]
                if lv[k] > float32(0.0):
                    m = max(m, ms[k])
        M = block_max(m, red_sh, lane, warp, NWC)
        cuda.syncthreads()                  # red_sh read before it holds the L sums
        nv = (used + 31) // 32              # the combine's warps that hold a used split
        for k in range(_NSC):
            cw = warp + k * NWC             # the combine's warp cw: splits 32 cw + ..
            if cw < nv:                     # (warp-uniform: warp_sum takes every lane)
                s0 = tid + k * NTC
                wv = float32(0.0)
                ls = float32(0.0)
                if s0 < used:
                    if lv[k] > float32(0.0):
                        wv = float32(math.exp(ms[k] - M))
                    ls = lv[k] * wv
                    w_sh[s0] = wv
                ls = warp_sum(ls)
                if lane == 0:
                    red_sh[NWC + cw] = ls
        cuda.syncthreads()
        L = red_sh[NWC]
        for cw in range(1, nv):
            L += red_sh[NWC + cw]
        xs = cuda.local.array(COMBINE_BATCH, float32)
        for i in range(tid, G * D, NTC):
            g = i // D
            d = i - g * D
            a = float32(0.0)
            n_mine = (used - g + G - 1) // G if g < used else 0
            for b in range(0, n_mine, COMBINE_BATCH):
                for j in range(COMBINE_BATCH):
                    xs[j] = float32(0.0)
                    if b + j < n_mine:
                        xs[j] = part_acc[tok, h, g + G * (b + j), d]
                for j in range(COMBINE_BATCH):
                    if b + j < n_mine:
                        a += xs[j] * w_sh[g + G * (b + j)]
            acc_sh[g * D + d] = a
        cuda.syncthreads()
        for d in range(tid, D, NTC):        # whole warps: D % 32 == 0
            total = acc_sh[d]
            for g in range(1, G):
                total += acc_sh[g * D + d]
            v = total / L
            o = (tok * cuda.gridDim.y * R + h) * D + d       # flat [T, Hq, D]
            if has_gate:
                v = v * sigmoid(gate[o])
            out[tok, h, d] = v
            if has_q8:
                code, qs = q8_code(v, warp_max(abs(v)))
                xq[o] = code
                if (d & 31) == 0:
                    xd[o >> 5] = qs
        cuda.syncthreads()

    @cuda.jit(device=True, inline="always")
    def combine_tail(tok, kvh, used, part_ml, part_acc, out, gate, xq, xd, has_gate, has_q8,
                     counters, G, buf, flag_sh, red_sh):
        """After the block's partial is stored: the last of the (token, KV head)'s `used`
        blocks merges the group's R heads one after another (`combine_head`, in buf, free
        once the block's partial is stored), so each output has the combine kernel's bits."""
        tid = cuda.threadIdx.x
        Hkv = cuda.gridDim.y
        cuda.threadfence()                  # this block's partial, visible before it counts
        cuda.syncthreads()
        if tid == 0:
            done = cuda.atomic.add(counters, tok * Hkv + kvh, 1)
            flag_sh[0] = 1 if done == used - 1 else 0
        cuda.syncthreads()
        if flag_sh[0] == 0:
            return
        cuda.threadfence()                  # the other blocks' partials, seen after the count
        if tid == 0:
            counters[tok * Hkv + kvh] = 0   # the next launch starts from zero
        for r in range(R):
            combine_head(tok, kvh, r, used, part_ml, part_acc, out, gate, xq, xd, has_gate,
                         has_q8, G, buf[:_W_MAX], buf[_W_MAX:], red_sh)

    def split_fused(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, part_ml, part_acc,
                    trace, out, gate, xq, xd, has_gate, has_q8, counters, G):
        """`split`, then `combine_tail` (COMBINE_IN_SPLIT): a block a split, no walking."""
        buf = cuda.shared.array(_ACC_SH, float32, alignment=16)
        p_sh = cuda.shared.array(_P_SH, float32)
        m_sh = cuda.shared.array(_ML_SH, float32)
        l_sh = cuda.shared.array(_ML_SH, float32)
        flag_sh = cuda.shared.array(1, np.int32)
        red_sh = cuda.shared.array(_RED_SH, float32)
        qv = cuda.local.array(NQ, float32)
        n_splits = cuda.gridDim.x
        kvh = cuda.blockIdx.y
        tok = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        n_ctx, chunk, used = q_rows_and_plan(q, positions, qv, ctx, n_splits, min_chunk,
                                             chunk_align, kvh, tok, tid)
        first = cuda.blockIdx.x
        if first < used:            # else the whole block leaves and is not counted
            split_body(first, qv, buf, p_sh, m_sh, l_sh, kw, vw, ctx, scale, n_ctx, chunk, kvh,
                       tok, n_splits, part_ml, part_acc, trace, tid, 0)
            cuda.syncthreads()      # every warp's stores issued (and buf free: w_sh below)
            combine_tail(tok, kvh, used, part_ml, part_acc, out, gate, xq, xd, has_gate,
                         has_q8, counters, G, buf, flag_sh, red_sh)

    def split_cluster(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, part_ml,
                      part_acc, out, gate, xq, xd, has_gate, has_q8, G):
        """The split pass and the combine in one launch: a thread-block cluster a (token, KV
        head) (grid (N, Hkv, T), clusters of N along x; one block in the simulator), blocks of
        SL four-warp slots. Slot s of rank c runs splits c SL + s, + N SL, .. of the plan, each
        with `split_body`'s statements (so the split pass's partials, bit for bit) on its own
        named barrier; after one cluster barrier (the partials' stores released to the
        cluster, acquired by every block) rank c combines heads c, c + N, .. of the group with
        `combine_head` (the combine kernel's bits). With PWS the position, plan and prefetch
        come before the grid-dependency wait, as in `split`."""
        # the slots' q rows / merge buffers (16-byte aligned for dot8), after the barrier the
        # group sums
        buf_all = cuda.shared.array(_BUF_CS, float32, alignment=16)
        p_all = cuda.shared.array(_P_CS, float32)
        m_all = cuda.shared.array(_ML_CS, float32)
        l_all = cuda.shared.array(_ML_CS, float32)
        w_sh = cuda.shared.array(_W_MAX, float32)
        red_sh = cuda.shared.array(_RED_CS, float32)
        qv = cuda.local.array(NQ, float32)
        n_splits = part_ml.shape[2]
        kvh = cuda.blockIdx.y
        tok = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        slot = tid // THREADS
        stid = tid - slot * THREADS
        crank = cluster_rank()
        csize = cluster_size()
        first = crank * SL + slot
        stride = csize * SL
        if PWS:
            n_ctx, chunk, used = plan_ahead(positions, tok, ctx, n_splits, min_chunk,
                                            chunk_align, kw, vw, kvh, first, stride, stid)
            grid_dependency_wait()
            q_rows(q, qv, kvh, tok, stid)
        else:
            n_ctx, chunk, used = q_rows_and_plan(q, positions, qv, ctx, n_splits, min_chunk,
                                                 chunk_align, kvh, tok, stid)
        buf = buf_all[slot * WARPS * RDS:(slot + 1) * WARPS * RDS]
        p_sh = p_all[slot * _P_SH:(slot + 1) * _P_SH]
        m_sh = m_all[slot * _ML_SH:(slot + 1) * _ML_SH]
        l_sh = l_all[slot * _ML_SH:(slot + 1) * _ML_SH]
        for split_i in range(first, used, stride):
            if split_i != first:
                slot_sync(slot)     # the last split's readers of buf done before q's store
            split_body(split_i, qv, buf, p_sh, m_sh, l_sh, kw, vw, ctx, scale, n_ctx, chunk,
                       kvh, tok, n_splits, part_ml, part_acc, part_ml, stid, slot)
        cluster_arrive_release()    # this thread's partials' stores, released to the cluster
        cluster_wait_acquire()      # every block's, visible here
        for r in range(crank, R, csize):
            combine_head(tok, kvh, r, used, part_ml, part_acc, out, gate, xq, xd, has_gate,
                         has_q8, G, w_sh, buf_all, red_sh)

    @cuda.jit(device=True, inline="always")
    def pv_row(acc, vraw, j0, nk, p_sh, pb, lane, warp):
        """`pv` for one row (`split_pair_row`): acc[e] += p[j] v[j, e], keys ascending."""
        if FG and j0 + VG <= nk:      # every key (the same products, no tests)
            for jj in range(VG):
                pj = p_sh[pb + j0 + jj]
                for e in range(E):
                    acc[e] += pj * v_value(vraw, jj, e, lane)
        else:
            for jj in range(VG):
                if j0 + jj < nk:
                    pj = p_sh[pb + j0 + jj]
                    for e in range(E):
                        acc[e] += pj * v_value(vraw, jj, e, lane)

    @cuda.jit(device=True, inline="always")
    def split_pair_row(q_sh, p_sh, kw, vw, head_word, chunk, n_ctx, sa, has_b, scale, acc_sh,
                       m_sh, l_sh, lane, warp):
        """Splits sa and sa + 1 (if has_b) of one row, of at most 16 keys each, a half-warp
        each: lane j < 16 takes key j of split sa, lane 16 + j key j of split sa + 1. Each
        split gets `one_tile_spread`'s statements for that row, so its bits: a half-warp's
        maximum and sum (warp_max16, warp_sum16) are the full warp's over a split whose keys
        fill lanes 0 .. 15 and whose other lanes hold -inf / +0.0 (ptx/warp.py), and the
        accumulators' first `acc *= alpha` (+0.0 times 0 or 1) leaves the +0.0 they start
        at. The partials go to shared memory (acc_sh[split * D + d], m_sh / l_sh[split]) --
        with CL, to the cluster's rank 0's (`put`)."""
        acc_a = cuda.local.array(E, float32)
        acc_b = cuda.local.array(E, float32)
        v0 = cuda.local.array(GW, uint32)
        v1 = cuda.local.array(GW, uint32)
        v2 = cuda.local.array(GW, uint32)
        v3 = cuda.local.array(GW, uint32)
        ba = sa * chunk
        ea = min(ba + chunk, n_ctx)
        bb = ea
        eb = min(bb + chunk, n_ctx) if has_b else ea
        nka = ea - ba
        nkb = eb - bb               # 0 without split b: none of its V loads or products
        j = lane & 15
        upper = lane >= 16 and has_b
        k0 = bb if upper else ba
        k1 = eb if upper else ea
        key = min(k0 + j, k1 - 1)
        valid = j < k1 - k0 and (lane < 16 or has_b)
        row = head_word + np.int64(key) * DW
        # V's groups: split a's keys 0-7 and 8-15, then split b's; the first NE with K
        v_load(v0, vw, head_word, ba, 0, nka, ea, lane)
        if NE > 1:
            v_load(v1, vw, head_word, ba, VG, nka, ea, lane)
        if NE > 2:
            v_load(v2, vw, head_word, bb, 0, nkb, eb, lane)
            v_load(v3, vw, head_word, bb, VG, nkb, eb, lane)
        for e in range(E):
            acc_a[e] = float32(0.0)
            acc_b[e] = float32(0.0)
        s = float32(0.0)
        for c in range(CH):
            k = k_chunk(kw, row, c)
            s = dot8(s, q_sh, 8 * c, k)
        # online_softmax_step from m = -inf, l = 0, on this lane's half
        sc = s * scale if valid else _NEG_INF
        m = max(_NEG_INF, warp_max16(sc))
        p, alpha = softmax_weights(sc, _NEG_INF, m)
        lsum = float32(0.0) * alpha + warp_sum16(p)
        pb = warp * TILE
        p_sh[pb + lane] = p
        warp_sync()                             # p_sh (this warp's) written, then read
        if NE == 1:
            v_load(v1, vw, head_word, ba, VG, nka, ea, lane)
        if NE == 2:
            v_load(v2, vw, head_word, bb, 0, nkb, eb, lane)
        pv_row(acc_a, v0, 0, nka, p_sh, pb, lane, warp)
        if NE == 1:
            v_load(v2, vw, head_word, bb, 0, nkb, eb, lane)
        if NE == 2:
            v_load(v3, vw, head_word, bb, VG, nkb, eb, lane)
        pv_row(acc_a, v1, VG, nka, p_sh, pb, lane, warp)
        if NE == 1:
            v_load(v3, vw, head_word, bb, VG, nkb, eb, lane)
        pv_row(acc_b, v2, 0, nkb, p_sh, pb + 16, lane, warp)
        pv_row(acc_b, v3, VG, nkb, p_sh, pb + 16, lane, warp)
        warp_sync()                             # p_sh read before the next pair rewrites it
        for e in range(E):
            put(acc_sh, sa * D + lane * E + e, float32(0.0) + acc_a[e])
            if has_b:
                put(acc_sh, (sa + 1) * D + lane * E + e, float32(0.0) + acc_b[e])
        if lane == 0 or (lane == 16 and has_b):
            put(m_sh, sa + (lane >> 4), m)
            put(l_sh, sa + (lane >> 4), float32(0.0) + lsum)

    stamp1 = stamper(NS1)       # the one-pass kernel's (TRACE_STAMPS_1P)

    @cuda.jit(device=True, inline="always")
    def put(sh, i, value):
        """sh[i] = value in the block that combines: this one, or with CL the cluster's rank 0
        (its shared memory at the same offset: DSMEM, cluster.ptx)."""
        if CL:
            st_cluster_f32(sh, i, 0, value)
        else:
            sh[i] = value

    @cuda.jit(device=True, inline="always")
    def prefetch_pairs(kw, vw, head_word, chunk, n_ctx, n_pairs, lane, first, stride):
        """Lanes 0 / 1 of each warp: its pairs of splits (first, first + stride, ..) K / V rows
        named to L2, as the split pass's blocks name theirs."""
        for pair in range(first, n_pairs, stride):
            b0 = 4 * (head_word + np.int64(2 * pair * chunk) * DW)
            b1 = 4 * (head_word + np.int64(min(2 * pair * chunk + 2 * chunk, n_ctx)) * DW)
            prefetch_bytes(kw if lane == 0 else vw, b0, b1)

    @cuda.jit(device=True, inline="always")
    def one_pass_plan(position, ctx, n_splits, min_chunk, chunk_align, kvh):
        """(n_ctx, chunk, used, head_word, ok): the token's split plan (`_split_plan`), its KV
        head's first word in the cache, and whether this kernel serves the plan (splits of at
        most a half-warp's keys, their partials within the shared accumulators)."""
        n_ctx, chunk, used = _split_plan(position, ctx, n_splits, min_chunk, chunk_align)
        head_word = np.int64(kvh) * ctx * DW
        ok = chunk <= TILE // 2 and used * D <= _ONEPASS_ACC and used <= _ONEPASS_SPLITS
        return n_ctx, chunk, used, head_word, ok

    @cuda.jit(device=True, inline="always")
    def one_pass_body(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                      gate, xq, xd, has_gate, has_q8, G, knew, vnew, inv_freq, kf, vf, trace):
        """Block (query head h, token): every split of h's plan (two a warp at once), then
        the combine's steps (attention.flash_decode_combine, in its order; `combine_tail`
        says which), the gate and the int8 copy. Grid (Hq, T), 32 `onepass_warps(D)`
        threads. With `store` (a compile-time switch), first what cache/kv.py's
        kv_store_rope does for this token: q's head h rotated in place, and the token's K
        (rotated) and V rows written into the cache's F16 rows kf / vf [Hkv, ctx, D] --
        by each of the KV head's R blocks, the same bytes, before any of its loads.
        With `early` (ONEPASS_EARLY), every load that does not need the position (q, the
        gate, the new K / V and their RoPE frequencies) is issued with the position's, the
        K / V prefetch as soon as the position is known, and q goes to shared memory from
        registers: the same operations on the same values. With `trace`, thread 0 stamps
        TRACE_STAMPS_1P into trace[(tok * Hq + h) * 2 * NS1 ..]."""
        acc_sh = cuda.shared.array(_ONEPASS_ACC, float32)
        m_sh = cuda.shared.array(_ONEPASS_SPLITS, float32)
        l_sh = cuda.shared.array(_ONEPASS_SPLITS, float32)
        w_sh = cuda.shared.array(_ONEPASS_SPLITS, float32)
        q_sh = cuda.shared.array(256, float32, alignment=16)
        p_sh = cuda.shared.array(ONEPASS_THREADS, float32)      # a tile's p, a warp each
        red_sh = cuda.shared.array(ONEPASS_WARPS, float32)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        if CL:
            # a cluster a query head (its blocks consecutive along x); launched without a
            # cluster, each block is a cluster of one and runs every split itself
            crank = cluster_rank()
            csize = cluster_size()
            cluster_arrive_relaxed()            # started: the others may write to us after
        else:
            crank = 0
            csize = 1
        h = cuda.blockIdx.x // csize
        tok = cuda.blockIdx.y
        Hq = cuda.gridDim.x // csize
        kvh = h // R
        gw = warp * csize + crank               # this warp among the cluster's: pairs go to
                                                # the ranks in turn, then to their warps
        pair_stride = csize * W1
        t0 = tid == 0 and crank == 0            # the stamping thread
        tb = (tok * Hq + h) * 2 * NS1
        o = (tok * Hq + h) * D                  # flat [T, Hq, D]: gate, xq, xd
        if PW:
            # (jit's own_wait) the position, then the prefetch, before the grid-dependency
            # wait: no kernel of the decode graph writes either before this one reads them
            position = positions[tok]
            n_ctx, chunk, used, head_word, ok = one_pass_plan(position, ctx, n_splits,
                                                              min_chunk, chunk_align, kvh)
            if prefetch and ok and lane < 2:
                prefetch_pairs(kw, vw, head_word, chunk, n_ctx, (used + 1) // 2, lane, gw,
                               pair_stride)
            grid_dependency_wait()
        if trace_on and t0:
            stamp1(trace, tb, 0)
        if not PW:
            position = positions[tok]
        # early: thread d < D (D <= NT1) loads what it needs of q, the gate and the new rows
        half = inv_freq.shape[0] if store else 0
        d_in = tid < D
        qe = float32(0.0)
        qp = float32(0.0)
        qr = float32(0.0)
        ke = float32(0.0)
        kp = float32(0.0)
        ve = float32(0.0)
        fr = float32(0.0)
        gv = float32(0.0)
        if early and d_in:
            qe = q[tok, h, tid]
            if has_gate:
                gv = gate[o + tid]
            if store:
                ke = knew[tok, kvh, tid]
                ve = vnew[tok, kvh, tid]
                if tid < 2 * half:
                    pe, fi = rope_partner(tid, half)
                    qp = q[tok, h, pe]
                    kp = knew[tok, kvh, pe]
                    fr = inv_freq[fi]
        qr2 = float32(0.0)
        if not PW:
            n_ctx, chunk, used, head_word, ok = one_pass_plan(position, ctx, n_splits,
                                                              min_chunk, chunk_align, kvh)
        n_pairs = (used + 1) // 2               # a warp's half each (`split_pair_row`)
        if trace_on and t0 and position >= 0:
            stamp1(trace, tb, 1)
        if early and not PW and prefetch and ok and lane < 2:      # (before the store)
            prefetch_pairs(kw, vw, head_word, chunk, n_ctx, n_pairs, lane, gw, pair_stride)
        if store:
            if early:
                if d_in:
                    ang = float32(position) * fr
                    # q by pairs, as rotate_pair (thread i < half: elements i and i + half)
                    if tid < half:
                        qr, qr2 = rotated(qe, qp, ang)
                        q_sh[tid] = qr
                        q_sh[tid + half] = qr2
                    elif tid >= 2 * half:
                        q_sh[tid] = qe
                    kf[kvh, position, tid] = roped_from(ke, kp, tid, half, ang)
                    vf[kvh, position, tid] = ve
            else:
                if tid < half:
                    rotate_pair(q, tok, h, tid, half, float32(position) * inv_freq[tid])
                if tid < D:
                    kf[kvh, position, tid] = roped_value(knew, tok, kvh, tid, half,
                                                         float32(position), inv_freq)
                    vf[kvh, position, tid] = vnew[tok, kvh, tid]
            # the block's own writes before its loads (the K / V rows are read by
            # ld.global.nc, not coherent with this kernel's writes: every block writes these
            # rows, the same bytes, before it reads any of its KV head's rows)
            cuda.threadfence_block()
            cuda.syncthreads()
            if early and tid < half:            # q in place (every thread has read it)
                q[tok, h, tid] = qr
                q[tok, h, tid + half] = qr2
        if trace_on and t0:
            stamp1(trace, tb, 2)
        if early:
            if d_in and not store:
                q_sh[tid] = qe
        else:
            for d in range(tid, D, NT1):
                q_sh[d] = q[tok, h, d]
        if not early and not PW and prefetch and ok and lane < 2:
            prefetch_pairs(kw, vw, head_word, chunk, n_ctx, n_pairs, lane, gw, pair_stride)
        cuda.syncthreads()                      # q_sh
        if trace_on and t0:
            stamp1(trace, tb, 3)
        if not ok:                              # a plan this kernel does not serve: NaN
            for d in range(tid, D, NT1):
                out[tok, h, d] = np.float32(np.nan)
                if has_q8:
                    xq[o + d] = 0
                    if (d & 31) == 0:
                        xd[(o + d) >> 5] = np.float32(np.nan)
            if CL:
                cluster_wait_acquire()          # (every block of the cluster is here too)
            return
        if CL:
            cluster_wait_acquire()              # every block started: its shared memory is
        for pair in range(gw, n_pairs, pair_stride):                    # there to write to
            split_pair_row(q_sh, p_sh, kw, vw, head_word, chunk, n_ctx, 2 * pair,
                           2 * pair + 1 < used, scale, acc_sh, m_sh, l_sh, lane, warp)
            if trace_on and t0 and pair == 0:
                stamp1(trace, tb, 4)
        if CL:
            # the partials, written into rank 0's shared memory, released to it; then only
            # rank 0 runs the combine (the others' shared memory is never read)
            cluster_arrive_release()
            cluster_wait_acquire()
            if crank != 0:
                return
        else:
            cuda.syncthreads()
        if trace_on and t0:
            stamp1(trace, tb, 5)
        # the combine's step 1: M over the visible splits (thread s = split s)
        m = _NEG_INF
        l_s = float32(0.0)
        if tid < used:
            l_s = l_sh[tid]
            if l_s > float32(0.0):
                m = m_sh[tid]
        M = block_max(m, red_sh, lane, warp, W1)
        # step 2: the weights, and L = the sums of the combine's warps of 32 splits (warp w
        # here is its warp w: the same lanes), in warp order (those past `used` add +0.0)
        w = float32(0.0)
        if m != _NEG_INF:
            w = float32(math.exp(m - M))
        if tid < _ONEPASS_SPLITS:
            w_sh[tid] = w
        ls = warp_sum(l_s * w)
        cuda.syncthreads()                      # red_sh (the maxima) read
        if lane == 0:
            red_sh[warp] = ls
        cuda.syncthreads()
        nv = (used + 31) // 32
        L = red_sh[0]
        for j in range(1, nv):
            L += red_sh[j]
        if trace_on and t0 and L == L:
            stamp1(trace, tb, 6)
        # step 3: group g of G sums splits g, g + G, .. ascending into split g's slot (only
        # group g reads it, and only this thread dim d of it), then the groups in order
        # (GB > 1: the partials and weights of GB splits loaded, then added in order)
        xs = cuda.local.array(GB, float32)
        ws = cuda.local.array(GB, float32)
        for i in range(tid, G * D, NT1):
            g = i // D
            d = i - g * D
            a = float32(0.0)
            n_mine = (used - g + G - 1) // G if g < used else 0
            if GB == 1:
                for j in range(n_mine):
                    a += acc_sh[(g + G * j) * D + d] * w_sh[g + G * j]
            else:
                for b in range(0, n_mine, GB):
                    for k in range(GB):
                        if b + k < n_mine:
                            sk = g + G * (b + k)
                            xs[k] = acc_sh[sk * D + d]
                            ws[k] = w_sh[sk]
                    for k in range(GB):
                        if b + k < n_mine:
                            a += xs[k] * ws[k]
            acc_sh[g * D + d] = a
        cuda.syncthreads()
        if trace_on and t0:
            stamp1(trace, tb, 7)
        for d in range(tid, D, NT1):    # whole warps: D % 32 == 0
            total = acc_sh[d]
            for g in range(1, G):
                total += acc_sh[g * D + d]
            v = total / L
            if has_gate:
                v = v * sigmoid(gv if early else gate[o + d])
            out[tok, h, d] = v
            if has_q8:
                code, qs = q8_code(v, warp_max(abs(v)))
                xq[o + d] = code
                if (d & 31) == 0:
                    xd[(o + d) >> 5] = qs
        if trace_on and t0:
            stamp1(trace, tb, 8)

    def one_pass(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out, gate,
                 xq, xd, has_gate, has_q8, G):
        one_pass_body(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                      gate, xq, xd, has_gate, has_q8, G, q, q, gate, q, q, gate)   # (no store)

    def one_pass_store(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                       gate, xq, xd, has_gate, has_q8, G, knew, vnew, inv_freq, kf, vf):
        one_pass_body(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                      gate, xq, xd, has_gate, has_q8, G, knew, vnew, inv_freq, kf, vf, gate)

    def one_pass_trace(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                       gate, xq, xd, has_gate, has_q8, G, trace):
        one_pass_body(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                      gate, xq, xd, has_gate, has_q8, G, q, q, gate, q, q, trace)

    def one_pass_store_trace(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align,
                             n_splits, out, gate, xq, xd, has_gate, has_q8, G, knew, vnew,
                             inv_freq, kf, vf, trace):
        one_pass_body(q, positions, kw, vw, ctx, scale, min_chunk, chunk_align, n_splits, out,
                      gate, xq, xd, has_gate, has_q8, G, knew, vnew, inv_freq, kf, vf, trace)

    if onepass:
        fn = ((one_pass_store_trace if trace else one_pass_store) if store else
              (one_pass_trace if trace else one_pass))
        fn.__name__ = fn.__qualname__ = (f"flash_decode_f16_r{R}_e{E}_1p" + ("s" if store else "")
                                         + ("" if prefetch else "_npf") + ("_ld" if early else "")
                                         + ("_trace" if trace else "") + ("" if full else "_pk")
                                         + ("" if GB == 1 else f"_gb{GB}")
                                         + (f"_c{int(cluster)}w{W1}" if CL else "")
                                         + ("_pw" if PW else "") + ("_wq" if WQ else ""))
        return kernel(fn, own_wait=PW)
    name = (f"flash_decode_f16_r{R}_e{E}" + ("" if prefetch else "_npf") + ("_il" if interleave else "")
            + ("_1t" if direct else "") + ("_spread" if spread and direct else "")
            + ("_walk" if walk else "") + ("_trace" if trace else "") + ("_fused" if fused else "")
            + ("" if full else "_pk") + ("_pw" if PWS else "") + ("_wq" if WQ else ""))
    if fused:
        split_fused.__name__ = split_fused.__qualname__ = name
        return kernel(split_fused)
    if CS:
        split_cluster.__name__ = split_cluster.__qualname__ = name + f"_cs{SL}"
        # SL slots of 128 threads share an SM's 64K registers (the split pass takes 128),
        # which a thread is given in units of 8 (384 threads: 170 would be 176, too many)
        return kernel(split_cluster, own_wait=PWS,
                      max_registers=min(255, (65536 // NTC) // 8 * 8))
    split.__name__ = split.__qualname__ = name
    return kernel(split, own_wait=PWS)


_KERNELS: dict = {}


def split_kernel(R: int, E: int, prefetch: bool = True, trace: bool = False,
                 interleave: bool = False, direct: bool = False, walk: bool = False,
                 spread: bool = False, fused: bool = False, pre_wait: bool = False):
    """The (R, E) split kernel, built (not compiled) on first request (fused: with the
    combine, COMBINE_IN_SPLIT; never walking or traced; pre_wait: the position, plan and
    prefetch before the grid-dependency wait, SPLIT_PRE_WAIT; not with fused)."""
    if fused and (walk or trace):
        raise ValueError("the split pass's combine takes a block a split and no trace")
    if fused and pre_wait:
        raise ValueError("the split pass's combine waits first (no pre_wait)")
    key = (R, E, bool(prefetch), bool(trace), bool(interleave), bool(direct), bool(walk),
           bool(spread) and bool(direct), bool(fused), bool(FULL_GROUPS), bool(pre_wait),
           bool(WIDE_Q))
    if key not in _KERNELS:
        _KERNELS[key] = _make(*key[:-3], full=key[-3], pre_wait=key[-2])
    return _KERNELS[key]


def cluster_split_slots(R: int, D: int) -> int:
    """Four-warp split slots a block of the cluster split pass takes for R query rows of D
    dims: SPLIT_CLUSTER_SLOTS, fewer where its static shared memory -- each slot's merge
    buffer (4 R D floats), softmax rows and (m, l); the combine's weights and sums -- would
    pass the 48 KB a block may hold; at least 1."""
    for sl in range(SPLIT_CLUSTER_SLOTS, 0, -1):
        floats = sl * (WARPS * R * D + _P_SH + 2 * _ML_SH) + _W_MAX + WARPS * sl + _W_MAX // 32
        if 4 * floats <= 48 * 1024:
            return sl
    return 1


def cluster_split_kernel(R: int, E: int, slots: int, prefetch: bool = True,
                         pre_wait: bool = False):
    """The (R, E) cluster split pass (`split_cluster`) on blocks of `slots` split slots,
    built on first request with the split pass's defaults (ONE_TILE_DIRECT, ONE_TILE_SPREAD,
    INTERLEAVE_ROWS, FULL_GROUPS: the same bits whichever); pre_wait: SPLIT_PRE_WAIT's form."""
    D = 32 * E
    spread = ONE_TILE_SPREAD and D <= ONE_TILE_SPREAD_MAX_D
    key = ("cs", R, E, int(slots), bool(prefetch), bool(INTERLEAVE_ROWS), bool(ONE_TILE_DIRECT),
           bool(spread), bool(FULL_GROUPS), bool(pre_wait), bool(WIDE_Q))
    if key not in _KERNELS:
        _KERNELS[key] = _make(R, E, bool(prefetch), interleave=key[5], direct=key[6],
                              spread=key[7], full=key[8], pre_wait=key[9], slots=key[3])
    return _KERNELS[key]


def onepass_kernel(R: int, E: int, prefetch: bool = True, store: bool = False,
                   early: bool | None = None, trace: bool = False, cluster: int = 1,
                   pre_wait: bool | None = None):
    """The (R, E) one-pass kernel (ONEPASS_WARPS), built on first request (store: with the
    token's RoPE and K / V store, `launch_onepass(store=)`; early: its loads issued early,
    default ONEPASS_EARLY; trace: the instrumented build, TRACE_STAMPS_1P; cluster: the build
    for clusters of that many blocks a head, ONEPASS_CLUSTER; pre_wait: the position and the
    prefetch before the grid-dependency wait, default ONEPASS_PRE_WAIT)."""
    pre_wait = ONEPASS_PRE_WAIT if pre_wait is None else bool(pre_wait)
    early = ONEPASS_EARLY if early is None else bool(early)
    n = max(1, int(cluster))
    key = ("1p", R, E, bool(prefetch), bool(store), early, bool(trace), bool(FULL_GROUPS),
           int(ONEPASS_GROUP_BATCH), n, onepass_block_warps(32 * E, n), pre_wait,
           bool(WIDE_Q))
    if key not in _KERNELS:
        _KERNELS[key] = _make(R, E, bool(prefetch), trace=bool(trace), onepass=True,
                              store=bool(store), early=early, full=key[-6],
                              group_batch=key[-5], cluster=n, warps=key[-3], pre_wait=pre_wait)
    return _KERNELS[key]


def trace_shape_1p(T: int, n_heads: int) -> tuple:
    """The shape of `launch_onepass`'s trace: [T, Hq, 2, len(TRACE_STAMPS_1P)] uint64,
    [..., 0, k] the k-th stamp's %clock64, [..., 1, k] its %globaltimer."""
    return (T, n_heads, 2, len(TRACE_STAMPS_1P))


def launch_onepass(q, positions, k_u8, v_u8, scale, min_chunk, chunk_align, n_splits, out,
                   gate, xq, xd, G, stream=0, prefetch=None, store=None, early=None,
                   trace=None, cluster=None):
    """Decode attention in one launch (the one-pass kernel): q[T, Hq, D] against one F16 cache
    layer, the plan of `n_splits` splits (the split pass's: each token's own position,
    min_chunk, chunk_align) into out[T, Hq, D]; gate (flat float32, or None) and xq / xd (the
    int8 copy, or None) as the combine takes them; G = `combine_order` of the combine whose
    bits it gives. Tokens whose plan it does not serve (`onepass_max_ctx`) get NaN.
    store = (k, v, inv_freq, k_f16, v_f16): first what cache.kv.launch_kv_store_rope(k, v,
    positions, inv_freq, F16, k_u8, k_f16, F16, v_u8, v_f16, q=q) does -- q rotated in place,
    the tokens' K rotated and K, V written at their positions (k, v [T, Hkv, D] float32;
    inv_freq the RoPE table, empty for none; k_f16 / v_f16 the layer's rows as F16
    [Hkv, ctx, D], KVCache.layer) -- the same bytes, in this launch (one launch fewer a
    decode layer). One token only: a token's rows are written by its own blocks, which no
    other token's blocks wait for. early: the loads issued early (default ONEPASS_EARLY; the
    same results); trace: a uint64 device array of `trace_shape_1p` runs the instrumented
    build, which stamps TRACE_STAMPS_1P into it (bench/attention_phases.py); cluster: blocks a
    query head, launched as one thread-block cluster (default `onepass_cluster(D)`; the same
    results; on a GPU without clusters, and in the simulator, the cluster build runs a block a
    head)."""
    T, Hq, D = q.shape
    Hkv, ctx = k_u8.shape[0], k_u8.shape[1]
    if store is not None:
        knew, vnew, inv_freq, kf, vf = store
        if T != 1:
            raise ValueError(f"launch_onepass: the store takes one token, not {T} (a token's "
                             f"K / V rows would be read by the others' blocks unwritten)")
        if tuple(knew.shape) != (T, Hkv, D) or tuple(vnew.shape) != (T, Hkv, D) \
                or 2 * inv_freq.shape[0] > D or tuple(kf.shape) != (Hkv, ctx, D) \
                or tuple(vf.shape) != (Hkv, ctx, D):
            raise ValueError(f"launch_onepass: store of k {tuple(knew.shape)}, v "
                             f"{tuple(vnew.shape)}, RoPE table {inv_freq.shape[0]}, rows "
                             f"{tuple(kf.shape)} do not fit [{T}, {Hkv}, {D}] on {ctx} positions")
    if Hq % Hkv or not 1 <= Hq // Hkv <= ROWS_MAX or D not in HEAD_DIMS:
        raise ValueError(f"launch_onepass: {Hq} query heads over {Hkv} KV heads of dim {D}")
    if tuple(out.shape) != (T, Hq, D):
        raise ValueError(f"launch_onepass: out {tuple(out.shape)} does not fit q {tuple(q.shape)}")
    if not 1 <= int(G) <= _ONEPASS_ACC // D:        # the groups' sums go to splits 0 .. G - 1
        raise ValueError(f"launch_onepass: G must be 1 .. {_ONEPASS_ACC // D}, not {G}")
    R, E = Hq // Hkv, D // 32
    kw = k_u8.reshape(k_u8.size).view(np.uint32)
    vw = v_u8.reshape(v_u8.size).view(np.uint32)
    stand = out.reshape(out.size)               # stand-ins the kernel never touches
    if trace is not None and (trace.dtype != np.uint64
                              or tuple(trace.shape) != trace_shape_1p(T, Hq)):
        raise ValueError(f"launch_onepass: trace must be uint64{list(trace_shape_1p(T, Hq))}, "
                         f"not {trace.dtype}{list(trace.shape)}")
    n = max(1, int(onepass_cluster(D) if cluster is None else cluster))
    if n > CLUSTER_MAX:         # (checked here too: the simulator launches no cluster)
        raise ValueError(f"launch_onepass: clusters of at most {CLUSTER_MAX} blocks (portable), "
                         f"not {n}")
    k = onepass_kernel(R, E, PREFETCH_KV if prefetch is None else bool(prefetch),
                       store is not None, early, trace is not None, n)
    args = (q, positions, kw, vw, np.int32(ctx), np.float32(scale), np.int32(min_chunk),
            np.int32(chunk_align), np.int32(n_splits), out, *_combine_outputs(stand, gate, xq, xd),
            np.int32(G))
    if store is not None:
        args += (knew, vnew, inv_freq, kf, vf)
    if trace is not None:
        args += (trace.reshape(trace.size),)
    _launch_clusters(k, (Hq * n, T), 32 * onepass_block_warps(D, n), n, stream, args)


def launch_split_cluster(q, positions, k_u8, v_u8, scale, min_chunk, chunk_align, part_ml,
                         part_acc, out, gate, xq, xd, G, stream=0, prefetch=None,
                         cluster=None, slots=None, pre_wait=False):
    """The cluster split pass (`split_cluster`): the split pass and its combine in one launch,
    the bits of `launch_split` + attention's combine kernel for G = `combine_order(D, ..)`
    (gate, xq / xd as launch_flash_decode takes them; None: absent). part_ml / part_acc:
    the partials' workspace, as for the split pass. cluster: blocks a (token, KV head)
    (default SPLIT_CLUSTER; <= jit.CLUSTER_MAX, or up to CLUSTER_MAX_NON_PORTABLE as
    non-portable clusters, which the H100 / H200 schedule a GPC each; on a GPU without
    clusters and in the simulator one block a pair runs every split); slots: a block's
    four-warp split slots (default `cluster_split_slots`); pre_wait: SPLIT_PRE_WAIT's form
    (only where no kernel of the graph writes `positions` before this launch, as
    `launch_split`)."""
    T, Hq, D = q.shape
    Hkv, ctx = k_u8.shape[0], k_u8.shape[1]
    R, E = Hq // Hkv, D // 32
    n_splits = part_ml.shape[2]
    n = max(1, int(SPLIT_CLUSTER if cluster is None else cluster))
    if n > CLUSTER_MAX_NON_PORTABLE:
        raise ValueError(f"launch_split_cluster: clusters of at most {CLUSTER_MAX_NON_PORTABLE} "
                         f"blocks (non-portable above {CLUSTER_MAX}), not {n}")
    sl = cluster_split_slots(R, D) if slots is None else int(slots)
    if sl < 1 or sl > 15:
        raise ValueError(f"launch_split_cluster: 1 .. 15 slots a block (named barriers), not {sl}")
    if n_splits > _W_MAX:
        raise ValueError(f"launch_split_cluster: at most {_W_MAX} splits, not {n_splits}")
    if G * D > sl * WARPS * R * D:
        raise ValueError(f"launch_split_cluster: the combine's {G} groups of {D} dims do not "
                         f"fit {sl} slots' buffers")
    kw = k_u8.reshape(k_u8.size).view(np.uint32)
    vw = v_u8.reshape(v_u8.size).view(np.uint32)
    stand = part_ml.reshape(part_ml.size)
    k = cluster_split_kernel(R, E, sl, PREFETCH_KV if prefetch is None else bool(prefetch),
                             bool(pre_wait))
    args = (q, positions, kw, vw, np.int32(ctx), np.float32(scale), np.int32(min_chunk),
            np.int32(chunk_align), part_ml, part_acc, out,
            *_combine_outputs(stand, gate, xq, xd), np.int32(G))
    _launch_clusters(k, (n, Hkv, T), THREADS * sl, n, stream, args)


def _combine_outputs(stand, gate, xq, xd) -> tuple:
    """The combine's outputs as a kernel with one takes them: gate, xq, xd flat (absent ones:
    `stand`, a flat float32 array the kernel then never touches), has_gate, has_q8."""
    return (stand if gate is None else gate.reshape(gate.size),
            stand.view(np.int8) if xq is None else xq.reshape(xq.size),
            stand if xd is None else xd.reshape(xd.size),
            np.int32(gate is not None), np.int32(xq is not None))


def _launch_clusters(k, grid, block, n, stream, args) -> None:
    """k over `grid` in thread-block clusters of n blocks along x (jit.launch_cluster;
    non-portable above CLUSTER_MAX); where there are none -- n = 1, the simulator, a GPU
    without clusters -- a block a cluster: grid's x divided by n, each block rank 0 of 1."""
    if n > 1 and not simulator_enabled() and current_features().clusters:
        launch_cluster(k, grid, block, n, stream, *args, non_portable=n > CLUSTER_MAX)
    else:
        k[(grid[0] // n, *grid[1:]), block, stream](*args)


def walks(grid) -> bool:
    """Whether `launch_split(grid=)` takes this many blocks a (token, KV head): any count >= 1."""
    return grid is not None and int(grid) >= 1


def trace_shape(T: int, n_kv_heads: int, n_splits: int) -> tuple:
    """The shape of `launch_split`'s trace: [T, Hkv, n_splits, 2, len(TRACE_STAMPS)] uint64,
    [..., 0, k] the k-th stamp's %clock64, [..., 1, k] its %globaltimer."""
    return (T, n_kv_heads, n_splits, 2, len(TRACE_STAMPS))


def launch_split(q, positions, k_u8, v_u8, scale, min_chunk, chunk_align, part_ml, part_acc,
                 stream=0, prefetch=None, trace=None, interleave=None, direct=None,
                 grid=None, spread=None, combine=None, pre_wait=False):
    """The split pass (attention.launch_flash_decode runs the combine after it, with the same
    min_chunk / chunk_align, i.e. the same split plan): q[T, Hq, D],
    k_u8 / v_u8 one F16 cache layer [Hkv, ctx, 2 D] bytes (KVCache.layer), partials as
    attention.alloc_decode_partials makes them; prefetch: the K / V prefetch (default
    PREFETCH_KV; the same results either way); trace: a uint64 device array of
    `trace_shape` runs the instrumented build, which stamps TRACE_STAMPS into it; interleave:
    the softmax's rows interleaved (default INTERLEAVE_ROWS; the same results); direct: one-tile
    splits stored without the merge (default ONE_TILE_DIRECT; the same results); grid: blocks
    a (token, KV head), each walking splits b, b + grid, ... of the plan that the partials'
    split count gives (`walks`; None or >= that count: a block a split). The same results:
    a split's arithmetic does not depend on which block runs it; spread: a direct one-tile
    split's rows on all four warps (default: ONE_TILE_SPREAD for head_dim <=
    ONE_TILE_SPREAD_MAX_D; the same results); combine: (out, gate, xq, xd, has_gate, has_q8,
    counters, G) runs the combine in the split pass (COMBINE_IN_SPLIT: `combine_tail`; gate /
    xq / xd stand-ins when absent, as attention.launch_flash_decode passes them); pre_wait:
    the position, the plan and the K / V prefetch before the grid-dependency wait
    (SPLIT_PRE_WAIT; the same results; ignored with combine). Only for a launch whose graph
    has no kernel writing `positions` before it -- the engine's decode step, not its verify
    or MTP chain -- so the default is False whatever SPLIT_PRE_WAIT says."""
    T, Hq, D = q.shape
    Hkv, ctx = k_u8.shape[0], k_u8.shape[1]
    R, E = Hq // Hkv, D // 32
    n_splits = part_ml.shape[2]
    kw = k_u8.reshape(k_u8.size).view(np.uint32)
    vw = v_u8.reshape(v_u8.size).view(np.uint32)
    if trace is not None and (trace.dtype != np.uint64
                              or tuple(trace.shape) != trace_shape(T, Hkv, n_splits)):
        raise ValueError(f"launch_split: trace must be uint64{list(trace_shape(T, Hkv, n_splits))}"
                         f", not {trace.dtype}{list(trace.shape)}")
    stamps = (kw[:2].view(np.uint64) if trace is None    # a stand-in the kernel never touches
              else trace.reshape(trace.size))
    walk = grid is not None and walks(grid) and grid < n_splits
    fused = combine is not None
    if fused and walk:
        raise ValueError("launch_split: the split pass's combine takes a block a split")
    k = split_kernel(R, E, PREFETCH_KV if prefetch is None else bool(prefetch), trace is not None,
                     INTERLEAVE_ROWS if interleave is None else bool(interleave),
                     ONE_TILE_DIRECT if direct is None else bool(direct), walk,
                     (ONE_TILE_SPREAD and D <= ONE_TILE_SPREAD_MAX_D) if spread is None
                     else bool(spread), fused, bool(pre_wait) and not fused)[
                         (grid if walk else n_splits, Hkv, T), THREADS, stream]
    args = (q, positions, kw, vw, np.int32(ctx), np.float32(scale), np.int32(min_chunk),
            np.int32(chunk_align), part_ml, part_acc, stamps)
    if fused:
        out, gate, xq, xd, has_gate, has_q8, counters, G = combine
        if counters.dtype != np.int32 or counters.size < T * Hkv:
            raise ValueError(f"launch_split: counters must be int32[>= {T * Hkv}] "
                             f"(alloc_combine_counters), not {counters.dtype}[{counters.size}]")
        k(*args, out, gate, xq, xd, np.int32(has_gate), np.int32(has_q8), counters, np.int32(G))
    else:
        k(*args)


# the compile check (tests/test_compile_ptx.py): the 9B shape (4 rows, D 256) and the 0.5B
# shape (7 rows, D 64) stand for the rest
flash_decode_f16_r4_e8 = split_kernel(4, 8)
flash_decode_f16_r7_e2 = split_kernel(7, 2)
_SIG = ("void(float32[:, :, ::1], int32[::1], uint32[::1], uint32[::1], int32, float32, int32, "
        "int32, float32[:, :, :, ::1], float32[:, :, :, ::1], uint64[::1])")
flash_decode_f16_r7_e2_trace = split_kernel(7, 2, trace=True)      # bench/attention_phases.py
flash_decode_f16_r7_e2_il = split_kernel(7, 2, interleave=True)
flash_decode_f16_r7_e2_1t = split_kernel(7, 2, direct=True)
flash_decode_f16_r8_e8_1t_spread_walk = split_kernel(8, 8, direct=True, walk=True,
                                                     spread=True)    # the 35B-A3B heads
flash_decode_f16_r7_e2_1t_spread = split_kernel(7, 2, direct=True, spread=True)
flash_decode_f16_r4_e8_1t_spread = split_kernel(4, 8, direct=True, spread=True)
flash_decode_f16_r7_e2_1t_spread_fused = split_kernel(7, 2, direct=True, spread=True, fused=True)
flash_decode_f16_r4_e8_1t_fused = split_kernel(4, 8, direct=True, fused=True)
_SIG_FUSED = _SIG[:-1] + (", float32[:, :, ::1], float32[::1], int8[::1], float32[::1], int32, "
                          "int32, int32[::1], int32)")
flash_decode_f16_r7_e2_1p = onepass_kernel(7, 2, early=False)         # the 0.5B heads
flash_decode_f16_r4_e8_1p = onepass_kernel(4, 8, early=False)         # the 9B heads
flash_decode_f16_r8_e4_1p = onepass_kernel(8, 4, early=False)         # D = 128 (Qwen3 dense)
flash_decode_f16_r7_e2_1ps = onepass_kernel(7, 2, store=True, early=False)  # + RoPE, K / V store
flash_decode_f16_r4_e8_1ps = onepass_kernel(4, 8, store=True, early=False)
flash_decode_f16_r7_e2_1p_ld = onepass_kernel(7, 2, early=True)       # loads issued early
flash_decode_f16_r7_e2_1ps_ld = onepass_kernel(7, 2, store=True, early=True)
flash_decode_f16_r4_e8_1ps_ld = onepass_kernel(4, 8, store=True, early=True)
flash_decode_f16_r7_e2_1ps_trace = onepass_kernel(7, 2, store=True, early=False, trace=True)
flash_decode_f16_r7_e2_1ps_ld_c4 = onepass_kernel(7, 2, store=True, early=True, cluster=4)
flash_decode_f16_r4_e8_1ps_ld_c2 = onepass_kernel(4, 8, store=True, early=True, cluster=2)
flash_decode_f16_r7_e2_1ps_ld_c2_pw = onepass_kernel(7, 2, store=True, early=True, cluster=2,
                                                     pre_wait=True)
# the cluster split pass (its combine's outputs as the fused split pass's, without counters)
_SIG_CS = _SIG[:-len(", uint64[::1])")] + (", float32[:, :, ::1], float32[::1], int8[::1], "
                                           "float32[::1], int32, int32, int32)")
flash_decode_f16_r7_e2_cs3_pw = cluster_split_kernel(7, 2, 3, pre_wait=True)    # the 0.5B heads
flash_decode_f16_r4_e8_cs2 = cluster_split_kernel(4, 8, 2)                      # the 9B heads
_SIG_1P = ("void(float32[:, :, ::1], int32[::1], uint32[::1], uint32[::1], int32, float32, int32, "
           "int32, int32, float32[:, :, ::1], float32[::1], int8[::1], float32[::1], int32, int32, "
           "int32)")
_SIG_1PS = _SIG_1P[:-1] + (", float32[:, :, ::1], float32[:, :, ::1], float32[::1], "
                          "float16[:, :, ::1], float16[:, :, ::1])")
PTX_SIGNATURES = {"flash_decode_f16_r4_e8": [_SIG], "flash_decode_f16_r7_e2": [_SIG],
                  "flash_decode_f16_r7_e2_1ps": [_SIG_1PS], "flash_decode_f16_r4_e8_1ps": [_SIG_1PS],
                  "flash_decode_f16_r7_e2_1p": [_SIG_1P], "flash_decode_f16_r4_e8_1p": [_SIG_1P],
                  "flash_decode_f16_r8_e4_1p": [_SIG_1P], "flash_decode_f16_r7_e2_1p_ld": [_SIG_1P],
                  "flash_decode_f16_r7_e2_1ps_ld": [_SIG_1PS],
                  "flash_decode_f16_r4_e8_1ps_ld": [_SIG_1PS],
                  "flash_decode_f16_r7_e2_1ps_trace": [_SIG_1PS[:-1] + ", uint64[::1])"],
                  "flash_decode_f16_r7_e2_1ps_ld_c4": [_SIG_1PS],
                  "flash_decode_f16_r4_e8_1ps_ld_c2": [_SIG_1PS],
                  "flash_decode_f16_r7_e2_1ps_ld_c2_pw": [_SIG_1PS],
                  "flash_decode_f16_r7_e2_trace": [_SIG], "flash_decode_f16_r7_e2_il": [_SIG],
                  "flash_decode_f16_r7_e2_1t": [_SIG], "flash_decode_f16_r8_e8_1t_spread_walk": [_SIG],
                  "flash_decode_f16_r7_e2_1t_spread": [_SIG],
                  "flash_decode_f16_r4_e8_1t_spread": [_SIG],
                  "flash_decode_f16_r7_e2_1t_spread_fused": [_SIG_FUSED],
                  "flash_decode_f16_r4_e8_1t_fused": [_SIG_FUSED],
                  "flash_decode_f16_r7_e2_cs3_pw": [_SIG_CS],
                  "flash_decode_f16_r4_e8_cs2": [_SIG_CS]}
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "cvt.f32.f16", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}
EXPECTED_PTX["flash_decode_f16_r7_e2_trace"] += ["%clock64", "%globaltimer"]
for _name in ("flash_decode_f16_r7_e2_cs3_pw", "flash_decode_f16_r4_e8_cs2"):
    EXPECTED_PTX[_name] += ["bar.sync", "%cluster_ctarank",
                            "barrier.cluster.arrive.release.aligned",
                            "barrier.cluster.wait.acquire.aligned"]
EXPECTED_PTX["flash_decode_f16_r7_e2_1ps_trace"] += ["%clock64", "%globaltimer"]
for _name in ("flash_decode_f16_r7_e2_1ps_ld_c4", "flash_decode_f16_r4_e8_1ps_ld_c2",
              "flash_decode_f16_r7_e2_1ps_ld_c2_pw"):
    EXPECTED_PTX[_name] += ["%cluster_ctarank", "barrier.cluster.arrive.relaxed.aligned",
                            "barrier.cluster.wait.acquire.aligned",
                            "mapa.shared::cluster.u32", "st.shared::cluster.f32"]
