"""Decode matvec: y[M] = W[M, K] @ x[K] (+ bias[M]) (+ residual[M]) with W in its GGUF blocks.

Batch-1 decode reads every weight byte once, so this kernel is bandwidth-bound: `parts` warps
(1, 2 or 4, chosen per shape by `warps_per_row`) share one output row; warp w of the row takes
the row's "groups" 32w + l, 32w + l + 32 parts, ... at lane l (a group is 4 bytes of quants plus
their high bits -- kernels/dequant.py defines each type's groups), so a warp's 32 lanes read
consecutive bytes of the row at every step. Splitting a row over warps is what keeps short-M,
long-K shapes (Gated DeltaNet's 32 x 4096 alpha/beta, ffn_down with M = 896) from running on a
handful of warps each walking a long row one DRAM round trip at a time.

Why it is fast (docs/decisions/0004-decode-matvec.md has the measurements):
  * no block barrier anywhere: the lane partials meet in `warp_sum` (bw24nb/ptx/warp.py, five
    shfl.sync), and a warp whose row is past M leaves as a whole before it;
  * UNROLL groups per lane per step, with every load of the step unconditional (a group past the
    row's end is clamped to the row's last group and its product dropped by a select), so the
    compiler issues all of a step's loads before the first multiply: UNROLL x (4-8 bytes of
    quants + high bits + scale) in flight per lane instead of one group's worth;
  * the warp's loads stay coalesced: at each of a step's UNROLL slots the 32 lanes read 32
    consecutive groups, i.e. one contiguous span of the row (Q8_0/Q5_0/Q6_K blocks are only
    2-byte aligned, so lanes read 2-byte words: per-lane 16-byte vector loads are impossible
    for them, and per-lane whole blocks would make each warp load instruction touch 9-17
    cache lines instead of 2-5).

Summation order (part of the exactness contract -- the numpy reference is float64, so this is
what the tolerance covers, and what the argmax gate sees):
  1. group partial p_g: the group's 8 products w_e * x_e added left to right in float32, w_e the
     float32 weight the codec produces (dequant.py's docstring: run A, then run B);
  2. lane sum s_l = ((p_l + p_{l+32}) + p_{l+64}) + ...  (ascending group index, float32; a
     clamped slot past the row's end adds +0.0, which changes nothing but the sign of a zero);
  3. warp sum: tree over lanes with offsets 16, 8, 4, 2, 1 -- s_l += s_{l+off} for l < off --
     which is what warp_sum's xor butterfly computes (every lane ends with s_0);
  4. parts: ((w_0 + w_1) + w_2) + w_3 over the row's warps in order (one shared-memory hop and
     one block barrier, only when parts > 1);
  5. y = (sum + bias) + residual.
With parts = 1 this is the order of the first (shared-memory, 6-barrier) kernel, bit for bit.
The GPU may fuse a multiply and the following add into one FMA (one rounding
instead of two); the simulator does not. Both stay inside the tolerance the tests justify.

Two paths:
  launch_matvec     float activations; the reference-exact default, every weight type.
  launch_matvec_q8  int8 activations (quantize_act.py: one f32 scale per 32 values) and dp4a
                    for the integer block types (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K); the
                    integer part of each 32-value block dot is exact, the scales multiply in
                    float32 (dequant.py, <type>_group_dot_q8). Q4_K goes to matvec_q4k.py's
                    16-byte-load kernel, Q8_0 / Q5_0 / Q4_0 to matvec_qx0.py's (a block a
                    unit, its own summation order). The engine's decode default for these
                    types.

Several rows of activations at once (rows = T > 1, launch_*(..., rows=T)): speculative
decoding verifies T = K + 1 tokens in one forward, and each verified row must be the value
plain decode would compute for it, bit for bit, or the accepted tokens could differ from
non-speculative decoding. So the rows = T kernels run the one-row kernel's loop unchanged --
the same warps per row (`warps_per_row(M, K)`, never a function of T), the same units per
lane in the same order -- and at every slot decode the weights once and multiply them into T
accumulators, each summed in exactly the order above (steps 1-5 per row t). The weights are
read once for the T rows, which is the point: weight bytes are the whole cost of a decode
matvec. T is a compile-time constant of each kernel (`rows_kernel`, built on first use; at most
MAX_ROWS) and the per-row work is written out T times (`unrolled`), so the accumulators live
in registers and the T copies' weight loads are one load each after LLVM's CSE. Row t of the
activations starts at t * K, of y and residual at t * M; the bias is shared. rows = 1 launches
the one-row kernels.

Short rows: every launcher runs its path with the unroll fitted to the row (`fit_unroll`): when
a lane has fewer units than UNROLL, a step takes only that many slots. A clamped slot only adds
+0.0 to a lane sum that starts at +0.0 and so is never -0.0, so the bits stay; what goes is the
work on values that were dropped (at K = 2048 that halved the T = 9 rows kernel's time on the
H200, decision 0018). The MoE token and group kernels take the same fitted unroll, and put a
row of at most 16 (8) units on half (a quarter of) a warp (`lanes_per_row`), for the same
reason.

One skeleton: every decode matvec kernel -- the generic float and dp4a paths here, Q4_K's
16-byte path (matvec_q4k.py) and Q6_K_R's (matvec_q6k.py), one row or T rows -- is the row loop
of `row_kernel` / `rows_kernel_of` below, given a `RowPath`: the few device functions that say
what a unit of a row is and how to load and value it. A path's kernels take their weight and
activation arrays as two tuples, so the one loop serves them all.

numpy references: `matvec_reference` (float path) and `matvec_q8_reference` (dp4a path) below.
"""
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..device import simulator_enabled
from ..jit import kernel
from ..quant.types import QType, row_bytes
from ..ptx import f32_from_bits, ld_nc_v4_u32, warp_sum, warp_sum8, warp_sum16
from .dequant import LAYOUTS, layout, weight_views

# One warp per row, 4 warps (128 threads) a block: the decode shapes have M = 128 .. 151936
# rows, and at M = 128 a 4-warp block still spreads the rows over 32 blocks (8-warp blocks would
# leave 116 of 132 SMs idle); for large M the SM holds 16 such blocks = 64 warps either way.
WARPS_PER_BLOCK = 4
THREADS = 32 * WARPS_PER_BLOCK
# Groups per lane per step (see the module docstring). 4 covers a whole K = 896 row of Q5_0 /
# Q8_0 (112 groups) in one step -- one DRAM round trip per row -- and keeps 16-40 bytes in
# flight per lane for the long rows; the step body is written out 4 times below.
UNROLL = 4
# Rows of activations one launch may carry (rows = T > 1, the module docstring): speculative
# decoding's verify is K + 1 <= 9 tokens. The rows kernels' shared combine buffer holds one warp
# total per (row, warp of the block); shared sizes must be compile-time constants.
MAX_ROWS = 9
PART_SH_ROWS = WARPS_PER_BLOCK * MAX_ROWS


@cuda.jit(device=True, inline="always")
def store_row(y, bias, residual, has_bias, has_residual, row, v):
    """y[row] = (v + bias[row]) + residual[row], each term only when present."""
    if has_bias:
        v += bias[row]
    if has_residual:
        v += residual[row]
    y[row] = v


@cuda.jit(device=True, inline="always")
def keep(p, g, ngroups):
    """p when group g is inside the row, else +0.0 (the slot was clamped; see the docstring)."""
    return p if g < ngroups else np.float32(0.0)


@cuda.jit(device=True, inline="always")
def combine_parts(part_sh, parts, part, lane, total):
    """Sum of the row's `parts` warp totals, in warp order, in lane 0 of part 0 (returned
    there; other lanes get their own total back). Every thread of the block calls it: the
    barrier is block-wide (parts is the same for the whole launch)."""
    if parts == 1:
        return total
    if lane == 0:
        part_sh[cuda.threadIdx.x >> 5] = total
    cuda.syncthreads()
    if part == 0 and lane == 0:
        w0 = cuda.threadIdx.x >> 5
        for k in range(1, parts):
            total += part_sh[w0 + k]
    return total


# ---------------------------------------------------------------- several rows (rows = T)


def nvvm_inlined(fn):
    """A device function that NVVM inlines (numba's forceinline: LLVM's alwaysinline) rather
    than Numba (inline="always"). Numba's inliner re-runs its passes on the callee and copies
    its whole IR at every call site; for the rows kernels' T copies of a slot body that made one
    4-row kernel take minutes to compile instead of ~15 s. A function NVVM inlines is compiled
    once per signature. (The simulator has no forceinline, and needs none.)"""
    if simulator_enabled():
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


def unrolled(nr, body):
    """Device function run(acc, args) that calls body(t, acc, args) for t = 0, 1, .., nr - 1,
    written out as nr calls (a chain of functions, each calling the previous one and then
    `body` once) rather than a loop: NVVM does not unroll a loop whose body is a few hundred
    instructions. After NVVM inlines the chain, t is a constant in every copy of `body`, so
    acc[t] of a cuda.local.array(nr) accumulator is a register, and the copies' identical
    plain weight loads are merged into one by LLVM's CSE (not the inline-asm 16-byte loads:
    the kernels issue those once per slot themselves). `body` must be `nvvm_inlined`; `args` a
    tuple that it unpacks."""
    run = None
    for t in range(nr):
        run = _then(run, body, t)
    return run


def _then(prev, body, t):
    # t is passed as a plain int64, not the literal constant it is here: numba would compile
    # `body` once per literal value (NVVM's constant propagation specialises each copy anyway)
    if prev is None:
        def run(acc, args):
            body(np.int64(t), acc, args)
    else:
        def run(acc, args):
            prev(acc, args)
            body(np.int64(t), acc, args)
    return nvvm_inlined(run)


@nvvm_inlined
def _zero(t, acc, args):
    acc[t] = np.float32(0.0)


@nvvm_inlined
def _warp_total(t, acc, args):
    """Row t's warp total (warp_sum, every lane) into acc[t]; lane 0 also leaves it in the
    row's slot of the shared buffer when the row is split over warps (combine_parts' hop)."""
    part_sh, lane, parts = args
    s = warp_sum(acc[t])
    acc[t] = s
    if parts > 1 and lane == 0:
        part_sh[t * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)] = s


@nvvm_inlined
def _store_total(t, acc, args):
    """y[t*M + row] = ((w_0 + w_1) + ..) + bias[row]) + residual[t*M + row] (matvec_rows'
    lane 0 of part 0): combine_parts' order and store_row's, for row t."""
    part_sh, parts, row, M, y, bias, residual, has_bias, has_residual = args
    total = acc[t]
    w0 = t * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
    for k in range(1, parts):
        total += part_sh[w0 + k]
    store_row(y[t * M:], bias, residual[t * M:], has_bias, has_residual, row, total)


def rows_epilogue(nr):
    """(zero, finish): device functions that clear the nr accumulators, and that take them
    through warp_sum, the split-row combine (one block barrier for all nr rows) and the store;
    the rows kernels of this module, matvec_q4k.py and matvec_q6k.py end with finish."""
    zero = unrolled(nr, _zero)
    totals = unrolled(nr, _warp_total)
    stores = unrolled(nr, _store_total)

    @cuda.jit(device=True, inline="always")
    def finish(acc, part_sh, lane, part, row, M, parts, y, bias, residual, has_bias,
               has_residual):
        totals(acc, (part_sh, lane, parts))
        if parts > 1:
            cuda.syncthreads()
        if lane == 0 and part == 0 and row < M:
            stores(acc, (part_sh, parts, row, M, y, bias, residual, has_bias, has_residual))

    return zero, finish


# ---------------------------------------------------------------- the row loop


@cuda.jit(device=True, inline="always")
def _same_x(x, K):
    return x


class RowPath(NamedTuple):
    """One family of decode matvec kernels, as the device functions the row loop calls.

    A row is `units(K)` units -- a group of the generic paths (dequant.py), a 16-byte chunk of
    the Q4_K and Q6_K_R kernels -- and lane l of the row's warp w takes units 32w + l,
    + 32 parts, ... in steps of `unroll` slots (module docstring). Every kernel takes its weight
    arrays as one tuple `w` and its activation arrays as one tuple `x` (numba passes a tuple's
    arrays as separate kernel parameters), so one skeleton, `row_kernel` / `rows_kernel_of`,
    serves every path:
      units(K) -> int             units in a row of K values
      base(row, K)                where the row starts in the weights (any value, e.g. a tuple)
      weights(w, base, u)         unit u's weight words, loaded once for all rows of a rows
                                  kernel (LLVM does not merge repeated inline-asm 16-byte loads);
                                  paths whose `value` does plain loads return a placeholder
      value(w, x, base, u, q)     unit u's float32 value (step 1 of the summation order) from
                                  its weight words q and the activations x
      x_row(x, t, K)              activation row t of x (rows kernels: row t at t * K values)
      values2(w, x, base_a, base_b, u, qa, qb)
                                  (optional) unit u's values of two weight rows, each exactly
                                  `value`'s, from one load of the activations (`warp_rows`)
      values4(w, x, bases, u, qs) (optional) the same for four rows (bases, qs: 4-tuples)
    `module` is where the path's device functions live: the kernels count as that module's
    for the kernel disk cache (jit.py: its sources decide when a stored kernel is stale).
    """
    name: str
    module: str
    unroll: int
    units: object
    base: object
    weights: object
    value: object
    x_row: object
    units_host: object = None       # units(K) on the host (`fit_unroll`); None: never refit
    x_one: object = _same_x         # x_one(x, K): the one-row kernel's x as `value` takes it
                                    # (x itself; Q4_K's `_x_row` at row 0 adds offsets of 0)
    values2: object = None          # two weight rows' values (`warp_rows`); None: no pairs
    values4: object = None          # the same for four weight rows (PAIR_ROWS_PER_WARP = 4)


_FITTED: dict = {}
# False: every launch keeps its path's full unroll (bench/moe_bench.py --unroll fit,full and
# bench/matvec_bench.py --fit-ab compare both)
FIT_UNROLL = True


def fit_unroll(p, K, parts):
    """Path p with its unroll cut to the units a lane of a `parts`-warp row of K values has,
    when that is fewer: 1 or 2 slots a step instead of 4 (p itself otherwise). A slot past the
    row's end only adds +0.0 to a lane sum that starts at +0.0 and so is never -0.0: an
    identity, so every row keeps its bits, and a short row stops computing values it drops --
    at K = 2048 (Q4_K: 64 chunks) half of a lane's slots, at K = 512 three quarters."""
    if not FIT_UNROLL or p.units_host is None or p.unroll == 1:
        return p
    per_lane = -(-p.units_host(K) // (32 * parts))
    U = 1 if per_lane <= 1 else 2 if per_lane <= 2 else p.unroll
    if U >= p.unroll:
        return p
    key = (p.name, U)
    if key not in _FITTED:
        _FITTED[key] = p._replace(unroll=U, name=f"{p.name}_u{U}")
    return _FITTED[key]


def _lane_step(p):
    """step(acc, w, x, base, u, stride, last, n): acc plus one row's `unroll` slots at unit u.
    Every slot's load is unconditional (its unit clamped to the row's last) and a slot past the
    row's end adds +0.0 (`keep`), so all of a step's loads issue before the first multiply."""
    weights, value = p.weights, p.value
    if p.unroll == 1:
        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n):
            return acc + value(w, x, base, u, weights(w, base, u))
    elif p.unroll == 4:
        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n):
            v0 = value(w, x, base, u, weights(w, base, u))
            u1 = min(u + stride, last)
            v1 = value(w, x, base, u1, weights(w, base, u1))
            u2 = min(u + 2 * stride, last)
            v2 = value(w, x, base, u2, weights(w, base, u2))
            u3 = min(u + 3 * stride, last)
            v3 = value(w, x, base, u3, weights(w, base, u3))
            acc += v0
            acc += keep(v1, u + stride, n)
            acc += keep(v2, u + 2 * stride, n)
            acc += keep(v3, u + 3 * stride, n)
            return acc
    elif p.unroll == 2:
        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n):
            v0 = value(w, x, base, u, weights(w, base, u))
            u1 = min(u + stride, last)
            v1 = value(w, x, base, u1, weights(w, base, u1))
            acc += v0
            acc += keep(v1, u + stride, n)
            return acc
    else:
        raise ValueError(f"{p.name}: unroll must be 1, 2 or 4, not {p.unroll}")
    return step


def _rows_step(p, nr):
    """step(acc, w, x, base, u, stride, last, n, K): `_lane_step` for nr rows of activations --
    each slot's weights loaded once, then every row's values added to acc[t] in the one-row
    order (the rows' code written out nr times by `unrolled`)."""
    weights, value, x_row = p.weights, p.value, p.x_row
    if p.unroll == 1:
        @nvvm_inlined
        def slots(t, acc, args):
            w, x, base, u, q0, K = args
            acc[t] = acc[t] + value(w, x_row(x, t, K), base, u, q0)

        each = unrolled(nr, slots)

        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n, K):
            each(acc, (w, x, base, u, weights(w, base, u), K))
    elif p.unroll == 4:
        @nvvm_inlined
        def slots(t, acc, args):
            w, x, base, u, u1, u2, u3, q0, q1, q2, q3, k1, k2, k3, K = args
            xt = x_row(x, t, K)
            v0 = value(w, xt, base, u, q0)
            v1 = value(w, xt, base, u1, q1)
            v2 = value(w, xt, base, u2, q2)
            v3 = value(w, xt, base, u3, q3)
            a = acc[t]
            a += v0
            a += v1 if k1 else np.float32(0.0)
            a += v2 if k2 else np.float32(0.0)
            a += v3 if k3 else np.float32(0.0)
            acc[t] = a

        each = unrolled(nr, slots)

        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n, K):
            # the slots' units and whether they are inside the row, in 32 bits (a row has
            # far fewer than 2^32 units; 64-bit compares cost two instructions each)
            u0 = np.uint32(u)
            s = np.uint32(stride)
            e1, e2, e3 = np.uint32(u0 + s), np.uint32(u0 + np.uint32(2) * s), \
                np.uint32(u0 + np.uint32(3) * s)
            lst, un = np.uint32(last), np.uint32(n)
            u1, u2, u3 = min(e1, lst), min(e2, lst), min(e3, lst)
            each(acc, (w, x, base, u0, u1, u2, u3, weights(w, base, u0), weights(w, base, u1),
                       weights(w, base, u2), weights(w, base, u3), e1 < un, e2 < un, e3 < un,
                       K))
    elif p.unroll == 2:
        @nvvm_inlined
        def slots(t, acc, args):
            w, x, base, u, u1, q0, q1, k1, K = args
            xt = x_row(x, t, K)
            v0 = value(w, xt, base, u, q0)
            v1 = value(w, xt, base, u1, q1)
            a = acc[t]
            a += v0
            a += v1 if k1 else np.float32(0.0)
            acc[t] = a

        each = unrolled(nr, slots)

        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, base, u, stride, last, n, K):
            u0 = np.uint32(u)                   # in 32 bits, as for unroll 4
            e1 = np.uint32(u0 + np.uint32(stride))
            u1 = min(e1, np.uint32(last))
            each(acc, (w, x, base, u0, u1, weights(w, base, u0), weights(w, base, u1),
                       e1 < np.uint32(n), K))
    else:
        raise ValueError(f"{p.name}: unroll must be 1, 2 or 4, not {p.unroll}")
    return step


@cuda.jit(device=True, inline="always")
def _warp_row(parts):
    """(lane, row, part): this thread's lane, the output row of its warp, and which of the
    row's `parts` warps it is."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
    row = warp // parts
    return lane, row, warp - row * parts


def _named(fn, p, fixed_parts, nr=1, kind="", max_registers=None):
    """Kernel name <p.name><kind>[_p1][_r<nr>][_c<max_registers>]: every build of a path has
    its own name (the disk cache tells kernels apart by name and module)."""
    fn.__name__ = fn.__qualname__ = (p.name + kind + (f"_p{fixed_parts}" if fixed_parts else "")
                                     + (f"_r{nr}" if nr > 1 else "")
                                     + (f"_c{max_registers}" if max_registers else ""))
    fn.__module__ = p.module
    return kernel(fn, **({"max_registers": int(max_registers)} if max_registers else {}))


def _row_total(p):
    """row_total(w, x, base, n, last, P, part, lane, part_sh): one output row's sum in lane 0 of
    part 0 (steps 1-4 of the module docstring) -- this lane's slots from unit 32 part + lane
    on, the warp tree, then the row's `P` warps in order -- for the one-row kernels of path p
    (`row_kernel`, `token_kernel`). n = 0 (a split row past the end) loads nothing but still
    meets the block barrier."""
    step, U = _lane_step(p), p.unroll

    @cuda.jit(device=True, inline="always")
    def row_total(w, x, base, n, last, P, part, lane, part_sh):
        stride = 32 * P
        acc = np.float32(0.0)
        for u in range(32 * part + lane, n, stride * U):
            acc = step(acc, w, x, base, u, stride, last, n)
        return combine_parts(part_sh, P, part, lane, warp_sum(acc))

    return row_total


def row_kernel(p, fixed_parts=0):
    """The one-row decode kernel of path p: kern[grid, THREADS](w, M, K, x, y, bias, residual,
    has_bias, has_residual, parts), one output row per `parts` warps. With fixed_parts the
    split is a compile-time constant and the `parts` argument is ignored: at parts = 1 the
    stride and the slot indices fold, and the Q4_K kernel went from 64 to 48 registers and 842
    to 637 PTX instructions (session 5; its run-time-parts build ran 15.2 us against 13.1 us at
    12288 x 4096 on the H200, bench/q4k_probe.py `lib` vs `same`)."""
    row_total, units, row_base, x_one = _row_total(p), p.units, p.base, p.x_one
    FP = fixed_parts

    def matvec(w, M, K, x, y, bias, residual, has_bias, has_residual, parts):
        P = FP if FP else parts
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        lane, row, part = _warp_row(P)
        if P == 1 and row >= M:       # the whole warp leaves: warp_sum stays full-warp
            return
        n = units(K)
        last = n - 1
        if row >= M:                  # split rows: stay for the block barrier, load nothing
            n = 0
        total = row_total(w, x_one(x, K), row_base(row, K), n, last, P, part, lane, part_sh)
        if lane == 0 and part == 0 and row < M:
            store_row(y, bias, residual, has_bias, has_residual, row, total)

    return _named(matvec, p, FP)


# Verify's rows kernels wait on their loads (session 23's profile of 4 rows at 12288 x 4096:
# 53 % of the stall cycles on L1TEX, 5.6 warps a scheduler at 80-86 registers). A register cap
# buys resident warps at the price of spills; None leaves ptxas its choice. The bits do not
# depend on it. run_bench / spec_bench --launch rows-cap<N>.
ROWS_MAX_REGISTERS = None


def rows_kernel_of(p, nr, fixed_parts=0):
    """The decode kernel of path p for nr rows of activations (module docstring: rows = T > 1),
    named <p.name>[_p1]_r<nr>; the same parameters as `row_kernel`'s, x, y and residual holding
    nr rows; fixed_parts as for `row_kernel`."""
    step, units, row_base, U = _rows_step(p, nr), p.units, p.base, p.unroll
    zero, finish = rows_epilogue(nr)
    FP = fixed_parts

    def matvec_rows(w, M, K, x, y, bias, residual, has_bias, has_residual, parts):
        P = FP if FP else parts
        part_sh = cuda.shared.array(PART_SH_ROWS, np.float32)
        acc = cuda.local.array(nr, np.float32)
        lane, row, part = _warp_row(P)
        if P == 1 and row >= M:
            return
        n = units(K)
        last = n - 1
        if row >= M:
            n = 0
        base = row_base(row, K)
        stride = 32 * P
        zero(acc, ())
        for u in range(32 * part + lane, n, stride * U):
            step(acc, w, x, base, u, stride, last, n, K)
        finish(acc, part_sh, lane, part, row, M, P, y, bias, residual, has_bias, has_residual)

    return _named(matvec_rows, p, FP, nr, max_registers=ROWS_MAX_REGISTERS)


# ---------------------------------------------------------------- two weight rows a warp

# Verify's rows kernels (T >= 2) on two weight rows a warp (decision 0036). At T = 4 a Q4_K warp
# step visits ~8 L1 lines for its 512 bytes of weights and 17 for every activation row of them:
# the rows kernel is bound by line visits, not by DRAM. A warp that takes two weight rows loads
# each activation chunk once for both (and its weight-independent integer sums), which halves
# the activation visits per weight byte. Each row keeps its lane's units in the one-row order,
# the warp tree and the store: the bits do not change. Serves parts = 1 launches of paths with
# `values2`. On since session 31 with four rows a warp (PAIR_ROWS_PER_WARP): the 9B's verify at
# K = 3 took 5.38 ms against 6.68 with the one-row-a-warp rows kernels (H200, one process; pairs
# 5.39), the spec gate K = 1..8 MATCH. False: the rows kernels (run_bench --launch rows-plain).
ROWS_PAIRS = True
# The same for the one-row launches the row loop serves (decode's Q4_K rows longer than 4096 --
# the 9B's ffn_down -- and every Q6_K_R matvec, the LM head among them; the persistent Q4_K
# kernel keeps the others): a one-row step visits ~8 lines of weights and 17 of activations
# per 512 weight bytes, 8 + 8.5 with pairs. Off: slower on the H200 (session 31, 9B decode 368.1
# / 356.2 tok/s with pairs / quads against 379.6; run_bench --launch decode-pairs / decode-quads).
ONE_ROW_PAIRS = False
# Weight rows a warp when pairs are on: 2, or 4 (paths with `values4`; a quarter of the
# activation visits, one slot a step). 4 since session 31: Q4_K 12288 x 4096 at T = 4 / 9 16.5 /
# 27.7 us against 18.8 / 37.0 (pairs) and 23.5 / 47.0 (rows); at T = 2 pairs were best (12.3 /
# 15.0 / 14.3 us). run_bench --launch rows-pairs (2), rows-plain (off).
PAIR_ROWS_PER_WARP = 4
# With PAIR_ROWS_PER_WARP = 4, launches of fewer activation rows than this take pairs: at T = 2
# pairs beat quads on every 9B shape of session 31's matvec_bench (H200; 4096 x 4096 5.96
# against 7.20 us, 12288 x 4096 12.27 / 15.01, 4096 x 12288 13.11 / 17.57). Session 32 (H100,
# decision 0038): the 9B's K = 1 verify 3.92 against 4.04 ms with quads (twice each, A B A B);
# at T = 3 neither won (K = 2 verify 4.59 / 4.46 against 4.59 / 4.56 ms with pairs: quads won
# the gate / up stack, pairs ffn_down, gdn_out and the Q6_K LM head). run_bench --launch
# rows-quads (2: every rows launch on quads, session 31's default), quads-from<N>.
QUADS_FROM_ROWS = 3
# Launches of at most PAIRS_UP_TO_ROWS activation rows and at most PAIRS_UP_TO_M output rows
# take pairs where the rule above gives quads (0: off; run_bench --launch pairs-m0): a quad
# launch has a quarter of M's warps, too few for a 4096-row output. Session 33 (H100, the 9B's
# K = 3 verify, per launch, twice each): ffn_down 0.85 against 0.98 ms, gdn_out 0.21 / 0.25,
# attn_output 0.071 / 0.086; but the GDN projections, gdn_z (4096 rows) beside gdn_qkv on graph
# branches, 0.58 against 0.54. So launches beside others (`beside`, engine._side_by_side) keep
# the T rule unless PAIRS_BESIDE (run_bench --launch pairs-beside). At T = 9 pairs spill.
PAIRS_UP_TO_M = 4096
PAIRS_UP_TO_ROWS = 4
PAIRS_BESIDE = False


def warp_rows(p, rows, parts, M=None, beside=False) -> int:
    """Weight rows a warp of a `rows`-row launch of path p at `parts` warps a row and M output
    rows (None: unknown, the T rule alone), `beside` other launches on the GPU (graph branches):
    1 (the row loop: `row_kernel` / `rows_kernel_of`), or 2 / 4 (`rows_pair_kernel_of`, whose
    grid is `grid_rows(M, parts, R)`). The choice changes no bit."""
    if not (ROWS_PAIRS if rows > 1 else ONE_ROW_PAIRS) or parts != 1:
        return 1
    short = M is not None and M <= PAIRS_UP_TO_M and rows <= PAIRS_UP_TO_ROWS \
        and (PAIRS_BESIDE or not beside)
    R = 2 if PAIR_ROWS_PER_WARP == 2 or rows < QUADS_FROM_ROWS or short else 4
    return R if (p.values2 if R == 2 else p.values4) is not None else 1


def warp_rows_everywhere(R):
    """`bw24nb.switches.switched` settings under which every launch of one warp a row takes R
    weight rows a warp at every T and M: the twins that check (kernel-check) and time
    (bench/matvec_bench.py) each form."""
    return [(__name__, "ROWS_PAIRS", True), (__name__, "ONE_ROW_PAIRS", True),
            (__name__, "PAIR_ROWS_PER_WARP", R), (__name__, "QUADS_FROM_ROWS", 1),
            (__name__, "PAIRS_UP_TO_M", 0)]


def grid_rows(M, parts, R=1):
    """Blocks of a one-row or rows launch on R weight rows a warp (`warp_rows`): M * parts
    warps, or ceil(M / R) when R > 1."""
    return _grid((M + R - 1) // R, 1) if R > 1 else _grid(M, parts)


def _pair_step(p, nr):
    """step(acc, w, x, bases, u, stride, last, n, K): `_rows_step` for two weight rows, bases =
    (row a's, row b's) (acc[t]: row a, token t; acc[nr + t]: row b), `unroll` slots of each
    row's weights loaded once, then every token's activations loaded once and valued against
    both rows."""
    weights, values2, x_row = p.weights, p.values2, p.x_row
    if p.unroll == 1:
        @nvvm_inlined
        def slots(t, acc, args):
            w, x, ba, bb, u, qa, qb, K = args
            va, vb = values2(w, x_row(x, t, K), ba, bb, u, qa, qb)
            acc[t] = acc[t] + va
            acc[nr + t] = acc[nr + t] + vb

        each = unrolled(nr, slots)

        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, bases, u, stride, last, n, K):
            ba, bb = bases
            each(acc, (w, x, ba, bb, u, weights(w, ba, u), weights(w, bb, u), K))
    elif p.unroll == 2:
        @nvvm_inlined
        def slots(t, acc, args):
            w, x, ba, bb, u, u1, qa0, qb0, qa1, qb1, k1, K = args
            xt = x_row(x, t, K)
            va0, vb0 = values2(w, xt, ba, bb, u, qa0, qb0)
            va1, vb1 = values2(w, xt, ba, bb, u1, qa1, qb1)
            a = acc[t]
            a += va0
            a += va1 if k1 else np.float32(0.0)
            acc[t] = a
            b = acc[nr + t]
            b += vb0
            b += vb1 if k1 else np.float32(0.0)
            acc[nr + t] = b

        each = unrolled(nr, slots)

        @cuda.jit(device=True, inline="always")
        def step(acc, w, x, bases, u, stride, last, n, K):
            ba, bb = bases
            u0 = np.uint32(u)                   # in 32 bits, as `_rows_step`
            e1 = np.uint32(u0 + np.uint32(stride))
            u1 = min(e1, np.uint32(last))
            each(acc, (w, x, ba, bb, u0, u1, weights(w, ba, u0), weights(w, bb, u0),
                       weights(w, ba, u1), weights(w, bb, u1), e1 < np.uint32(n), K))
    else:
        raise ValueError(f"{p.name}: a pair step takes 1 or 2 slots, not {p.unroll}")
    return step


def _quad_step(p, nr):
    """`_pair_step` for four weight rows (acc[r nr + t]: row r of the four, token t), one slot a
    step: each row's weights loaded once, each token's activations once for all four."""
    weights, values4, x_row = p.weights, p.values4, p.x_row
    if p.unroll != 1:
        raise ValueError(f"{p.name}: a quad step takes 1 slot, not {p.unroll}")

    @nvvm_inlined
    def slots(t, acc, args):
        w, x, bases, u, qs, K = args
        v0, v1, v2, v3 = values4(w, x_row(x, t, K), bases, u, qs)
        acc[t] = acc[t] + v0
        acc[nr + t] = acc[nr + t] + v1
        acc[2 * nr + t] = acc[2 * nr + t] + v2
        acc[3 * nr + t] = acc[3 * nr + t] + v3

    each = unrolled(nr, slots)

    @cuda.jit(device=True, inline="always")
    def step(acc, w, x, bases, u, stride, last, n, K):
        b0, b1, b2, b3 = bases
        each(acc, (w, x, bases, u, (weights(w, b0, u), weights(w, b1, u), weights(w, b2, u),
                                    weights(w, b3, u)), K))

    return step


@nvvm_inlined
def _warp_total_only(t, acc, args):
    acc[t] = warp_sum(acc[t])


def _store_group(R):
    """store(t, acc, args): token t's value of each of the warp's R rows inside M (acc[r nr +
    t] for row ra + r), in store_row's order."""
    @nvvm_inlined
    def store(t, acc, args):
        nr, ra, M, y, bias, residual, has_bias, has_residual = args
        for r in range(R):
            if ra + r < M:
                store_row(y[t * M:], bias, residual[t * M:], has_bias, has_residual, ra + r,
                          acc[r * nr + t])
    return store


def _bases_of(row_base, R):
    """bases(ra, M, K): where the warp's R rows start (`row_base`), a row past M at the last."""
    if R == 2:
        @cuda.jit(device=True, inline="always")
        def bases(ra, M, K):
            return row_base(ra, K), row_base(min(ra + 1, M - 1), K)
    else:
        @cuda.jit(device=True, inline="always")
        def bases(ra, M, K):
            return (row_base(ra, K), row_base(min(ra + 1, M - 1), K),
                    row_base(min(ra + 2, M - 1), K), row_base(min(ra + 3, M - 1), K))
    return bases


def rows_pair_kernel_of(p, nr, R=2):
    """Path p's kernel for nr >= 1 rows of activations at parts = 1 on R = 2 (or 4) weight rows
    a warp, named <p.name>_w<R>_p1[_r<nr>] (a register cap only for nr >= 2, as
    `rows_kernel_of`): warp w takes rows R w .. R w + R - 1 (those past M load the last row and
    drop their values). Each row's sum is the one-row kernel's: lane l's units l, l + 32, ..
    ascending, warp_sum, + bias, + residual. The steps take 1 / R of the path's unroll (at least
    one slot; `fit_unroll`'s bits: a step's slots only group the same additions), so a lane
    holds about as many weight words as the one-row-a-warp kernel. The same parameters as
    `rows_kernel_of`'s (parts is ignored); grid: `grid_rows(M, 1, R)`."""
    q = p._replace(unroll=max(1, p.unroll // R))
    step = _pair_step(q, nr) if R == 2 else _quad_step(q, nr)
    units, bases = q.units, _bases_of(q.base, R)
    U = q.unroll
    zero = unrolled(R * nr, _zero)
    totals = unrolled(R * nr, _warp_total_only)
    stores = unrolled(nr, _store_group(R))
    NACC = R * nr                     # a local array's size must be a constant, not an expression

    def matvec_rows_wr(w, M, K, x, y, bias, residual, has_bias, has_residual, parts):
        acc = cuda.local.array(NACC, np.float32)
        lane = cuda.threadIdx.x & 31
        ra = (cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)) * R
        if ra >= M:                   # the whole warp leaves: warp_sum stays full-warp
            return
        n = units(K)
        last = n - 1
        bs = bases(ra, M, K)
        zero(acc, ())
        for u in range(lane, n, 32 * U):
            step(acc, w, x, bs, u, 32, last, n, K)
        totals(acc, ())
        if lane == 0:
            stores(acc, (nr, ra, M, y, bias, residual, has_bias, has_residual))

    return _named(matvec_rows_wr, p, 1, nr, kind=f"_w{R}",
                  max_registers=ROWS_MAX_REGISTERS if nr > 1 else None)


# ---------------------------------------------------------------- rows on part of a warp


# False: every row takes a whole warp (bench/moe_bench.py --unroll fit,whole compares both)
SUB_WARP_ROWS = True


def lanes_per_row(p, K, parts):
    """Lanes a row of K values needs under path p: 32, or 16 / 8 when a one-warp row has at
    most that many units. Then only lanes 0 .. n - 1 of a whole-warp row hold a unit, the
    others +0.0, and the butterfly's first step (offset 16; at 8 lanes also 8) adds +0.0 to
    sums that are never -0.0: so a half- or quarter-warp summing its own lanes (`warp_sum16`,
    `warp_sum8`) gives the whole warp's bits, and a warp carries two or four rows where it
    carried one. The 35B-A3B shape's expert down projections (K = 512: 16 Q4_K chunks, 8
    Q6_K_R ones) had half (three quarters) of their lanes idle."""
    if not SUB_WARP_ROWS or parts != 1 or p.units_host is None:
        return 32
    n = p.units_host(K)
    return 8 if n <= 8 else 16 if n <= 16 else 32


def blocks_for(nrows, lanes, parts):
    """THREADS-thread blocks a token / group kernel needs for nrows matrix rows of `lanes`
    lanes (32 / lanes rows a warp) or `parts` warps each."""
    if lanes < 32:
        per_block = WARPS_PER_BLOCK * (32 // lanes)
        return (nrows + per_block - 1) // per_block
    return (nrows * parts + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK


def _row_place(lanes):
    """place(P) -> (lane, row, part, first): a thread's lane within its row, its row, which of
    the row's P warps it is, and the first row of its warp. At 32 lanes that is `_warp_row`
    (first = row); at 16 / 8 (`lanes_per_row`, P = 1) a warp holds rows first .. first + 32 /
    lanes - 1, one per `lanes` lanes."""
    if lanes == 32:
        @cuda.jit(device=True, inline="always")
        def place(P):
            lane, row, part = _warp_row(P)
            return lane, row, part, row
        return place
    RW = 32 // lanes

    @cuda.jit(device=True, inline="always")
    def place(P):
        lane = cuda.threadIdx.x & 31
        first = (cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)) * RW
        return lane & (lanes - 1), first + lane // lanes, 0, first

    return place


def _lanes_row_total(p, lanes):
    """`_row_total(p)`'s row_total at 32 lanes; at 16 / 8, the same signature for a row of at
    most `lanes` units (one a lane): +0.0 plus the lane's unit, then the row's lanes'
    butterfly -- what the one-warp, one-slot loop sums (`lanes_per_row` says why the bits are
    the same)."""
    if lanes == 32:
        return _row_total(p)
    weights, value = p.weights, p.value
    lane_sum = warp_sum16 if lanes == 16 else warp_sum8

    @cuda.jit(device=True, inline="always")
    def row_total(w, x, base, n, last, P, part, lane, part_sh):
        acc = np.float32(0.0)
        if lane < n:
            acc = acc + value(w, x, base, lane, weights(w, base, lane))
        return lane_sum(acc)

    return row_total


def _named_lanes(fn, p, fixed_parts, kind, lanes):
    """`_named` with the lanes in the name: <p.name><kind>[_p1] at 32, <p.name><kind>_l<lanes>
    at 16 / 8 (whose split is always 1)."""
    if lanes == 32:
        return _named(fn, p, fixed_parts, kind=kind)
    return _named(fn, p, 0, kind=f"{kind}_l{lanes}")


def token_kernel(p, fixed_parts=0, lanes=32):
    """The one-row kernel of path p over many tokens and (optionally) experts: the MoE block's
    matvecs (kernels/moe.py), where every token picks its own k experts and the prefill must
    give each token the bits its decode step would.

    kern[(blocks, 1, T), THREADS](w, ids, use_ids, k, M, K, x, x_per_expert, y, parts): token
    t = blockIdx.z has k M virtual rows; virtual row v = r M + m reads weight row e M + m of a
    stack of experts [E, M, K] (GGUF rows, expert e's row m at row e M + m), e = ids[t, r] when
    use_ids, else r (k = 1, e = 0: an ordinary weight, one matvec per token). Its activations
    are row t (x_per_expert = 0: the k experts share the token's input) or row t k + r
    (x_per_expert = 1: each expert its own, e.g. the down projections) of x, and it writes
    y[(t k + r) M + m] = y[t, r, m]. Each virtual row is summed exactly as `row_kernel` sums an
    M-row matvec of that expert's rows -- the same lane loop, warp tree and split combine
    (steps 1-4 of the module docstring, no bias or residual) -- so a token's value does not
    depend on T, the other tokens, or which launch carried it. A row takes `parts` warps, or
    `lanes` = 16 / 8 lanes of one (`lanes_per_row`: the same bits); `blocks_for` gives the
    grid's x."""
    row_total, place = _lanes_row_total(p, lanes), _row_place(lanes)
    units, row_base, x_row = p.units, p.base, p.x_row
    FP = fixed_parts if lanes == 32 else 1

    def matvec_tokens(w, ids, use_ids, k, M, K, x, x_per_expert, y, parts):
        P = FP if FP else parts
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        lane, v, part, first = place(P)
        R = k * M
        if P == 1 and first >= R:     # the whole warp leaves: the lane sums stay full-warp
            return
        t = cuda.blockIdx.z
        n = units(K)
        last = n - 1
        r = v // M
        if v >= R:                    # a row past the end: stays for the block barrier or
            n = 0                     # the warp's shuffles, loads nothing
            r = 0
        e = ids[t, r] if use_ids else r
        base = row_base(np.int64(e) * M + (v - r * M), K)
        xt = x_row(x, t * k + r if x_per_expert else t, K)
        total = row_total(w, xt, base, n, last, P, part, lane, part_sh)
        if lane == 0 and part == 0 and v < R:
            y[np.int64(t) * R + v] = total

    return _named_lanes(matvec_tokens, p, fixed_parts, "_tok", lanes)


def group_kernel(p, fixed_parts=0, lanes=32):
    """The one-row kernel of path p over groups of activation rows, each group against its own
    matrix of a stack: the expert-major form of `token_kernel` (kernels/moe.py's prefill on
    the decode kernels), so that every row still gets the bits its decode step would.

    kern[(blocks, G, Z), THREADS](w, group_off, src, use_src, M, K, x, y, parts): group g =
    blockIdx.y owns rows group_off[g] .. group_off[g + 1] - 1 of y and matrix g of the stack
    (weight rows g M .. g M + M - 1); row i's activations are row src[i] of x (use_src = 1:
    e.g. the token a sorted (token, expert) pair came from) or row i (use_src = 0); grid slice
    z = blockIdx.z takes the group's rows z, z + Z, ... Every row is summed by `_row_total`, as
    `token_kernel` and `row_kernel` sum it (steps 1-4 of the module docstring), and written
    once: y[i M + m]. A warp walks its rows one after another, so a matrix row comes from DRAM
    once per (block, z) and from the cache for the group's other rows. Rows on `parts` warps or
    `lanes` lanes as for `token_kernel`. On whole-warp rows of one warp a warp takes its rows
    GROUP_BATCH at a time (`_group_batch`): the same sums, each chunk's weights decoded once
    for the batch."""
    row_total, place = _lanes_row_total(p, lanes), _row_place(lanes)
    units, row_base, x_row = p.units, p.base, p.x_row
    FP = fixed_parts if lanes == 32 else 1
    # batches (GROUP_BATCH) on whole-warp rows of one warp: the rows kernels' step has no
    # split-row combine and no sub-warp tree
    NB = GROUP_BATCH if lanes == 32 and FP == 1 else 1
    batch_n = _group_batch(p, NB) if NB > 1 else None
    batch_2 = _group_batch(p, 2) if NB > 2 else None

    def matvec_groups(w, group_off, src, use_src, M, K, x, y, parts):
        P = FP if FP else parts
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        lane, m, part, first = place(P)
        if P == 1 and first >= M:     # the whole warp leaves: the lane sums stay full-warp
            return
        g = cuda.blockIdx.y
        n = units(K)
        last = n - 1
        if m >= M:                    # a row past the end: stays for the block barriers or
            n = 0                     # the warp's shuffles, loads nothing
        base = row_base(np.int64(g) * M + min(m, M - 1), K)
        i0 = np.int64(group_off[g]) + cuda.blockIdx.z
        i1 = np.int64(group_off[g + 1])
        Z = np.int64(cuda.gridDim.z)
        if NB > 1:                    # (P = 1 and m < M here: the warp left otherwise)
            i0 = batch_n(w, x, y, src, use_src, M, m, base, n, last, K, lane, i0, i1, Z)
        if NB > 2:
            i0 = batch_2(w, x, y, src, use_src, M, m, base, n, last, K, lane, i0, i1, Z)
        for i in range(i0, i1, Z):
            xt = x_row(x, src[i] if use_src else i, K)
            total = row_total(w, xt, base, n, last, P, part, lane, part_sh)
            if lane == 0 and part == 0 and m < M:
                y[np.int64(i) * M + m] = total
            if P > 1:                 # part_sh is written again for the next row
                cuda.syncthreads()

    return _named_lanes(matvec_groups, p, fixed_parts, "_grp" + (f"_b{NB}" if NB > 1 else ""),
                        lanes)


@nvvm_inlined
def _pick_batch_row(t, acc, args):
    """Row t of a group batch (`_group_batch`): outs[t] = its row of y, rows[t] = its row of x
    (src[..] when use_src)."""
    rows, outs, src, use_src, i, Z = args
    outs[t] = i + t * Z
    rows[t] = src[i + t * Z] if use_src else i + t * Z


@nvvm_inlined
def _store_batch_row(t, acc, args):
    """Row t of a group batch: its warp tree, stored by lane 0 at y[outs[t] M + m]."""
    y, outs, M, m, lane = args
    s = warp_sum(acc[t])
    if lane == 0:
        y[outs[t] * M + m] = s


def group_pair_kernel(p):
    """`group_kernel` for two stacks of one shape read by the same rows (the MoE gate and up
    projections): kern[(blocks, G, Z), THREADS](wa, wb, group_off, src, use_src, M, K, x,
    ya, yb), whole-warp rows of one warp each. A warp sums row m of both matrices for each of
    its group's rows -- GROUP_BATCH at a time, then one at a time -- so the two rows' weight
    loads are in flight together; each sum is `group_kernel`'s (the rows kernels' step, or the
    lane loop), so ya and yb hold the bits of two group_kernel launches."""
    NB = GROUP_BATCH
    units, row_base, x_row = p.units, p.base, p.x_row
    lane_step, U = _lane_step(p), p.unroll
    step = _rows_step(p._replace(x_row=_mapped_x_row(p.x_row)), NB) if NB > 1 else None
    zero = unrolled(NB, _zero)
    picks, stores = unrolled(NB, _pick_batch_row), unrolled(NB, _store_batch_row)

    def matvec_group_pairs(wa, wb, group_off, src, use_src, M, K, x, ya, yb):
        lane = cuda.threadIdx.x & 31
        m = np.int64(cuda.blockIdx.x) * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        if m >= M:                    # (the whole warp)
            return
        g = cuda.blockIdx.y
        n = units(K)
        last = n - 1
        base = row_base(np.int64(g) * M + m, K)
        i = np.int64(group_off[g]) + cuda.blockIdx.z
        i1 = np.int64(group_off[g + 1])
        Z = np.int64(cuda.gridDim.z)
        if NB > 1:
            acc_a = cuda.local.array(NB, np.float32)
            acc_b = cuda.local.array(NB, np.float32)
            rows = cuda.local.array(NB, np.int64)
            outs = cuda.local.array(NB, np.int64)
            while i + (NB - 1) * Z < i1:
                picks(acc_a, (rows, outs, src, use_src, i, Z))
                zero(acc_a, ())
                zero(acc_b, ())
                for u in range(lane, n, 32 * U):
                    step(acc_a, wa, (x, rows), base, u, 32, last, n, K)
                    step(acc_b, wb, (x, rows), base, u, 32, last, n, K)
                stores(acc_a, (ya, outs, M, m, lane))
                stores(acc_b, (yb, outs, M, m, lane))
                i += NB * Z
        while i < i1:
            xt = x_row(x, src[i] if use_src else i, K)
            a = np.float32(0.0)
            b = np.float32(0.0)
            for u in range(lane, n, 32 * U):
                a = lane_step(a, wa, xt, base, u, 32, last, n)
                b = lane_step(b, wb, xt, base, u, 32, last, n)
            a = warp_sum(a)
            b = warp_sum(b)
            if lane == 0:
                ya[i * M + m] = a
                yb[i * M + m] = b
            i += Z

    return _named(matvec_group_pairs, p, 0, kind=f"_grp2_b{NB}")


_PAIR_KERNELS: dict = {}


def group_pair_kernels(p):
    """path p's `group_pair_kernel` (one build a path and GROUP_BATCH)."""
    key = (p.name, p.unroll, GROUP_BATCH)
    if key not in _PAIR_KERNELS:
        _PAIR_KERNELS[key] = group_pair_kernel(p)
    return _PAIR_KERNELS[key]


def tile_kernel(p, nr, fixed_parts=0):
    """`token_kernel` for one ordinary matrix (no experts: k = 1, every token its own x row)
    over tiles of nr tokens: kern[(ceil(M / RB), ceil(T / nr)), THREADS](w, M, K, x, y, bias,
    residual, has_bias, has_residual, T, parts, RB), y[t M + m] = (W x_t)[m] (+ bias[m])
    (+ residual[t M + m]) as `store_row` adds them -- the rows prefill's dense matvecs (the
    engine's ROWS_TILES), and the MoE router of a prefill chunk (no bias, no residual).
    Block (b, j) takes rows b RB .. b RB + RB - 1 for tokens j nr .. j nr + nr - 1
    (a tile past T repeats token T - 1 and stores nothing for it), the block's warps a row
    (`parts` of them) or WARPS_PER_BLOCK / parts rows at a time. Each row is summed for the nr
    tokens at once (`_rows_step`: the weights loaded once, every token's lane sum in the
    one-row order), then the warp tree and the parts in warp order, as `token_kernel` sums it:
    y[t M + m], the token kernel's bits. The tile's activations come from DRAM once and then
    from the cache for the block's other rows -- the token kernel reads a token's whole x for
    every row it computes (the 35B-A3B router at T = 128: 256 rows x 128 tokens x 8 KB)."""
    step = _rows_step(p._replace(x_row=_mapped_x_row(p.x_row)), nr)
    units, row_base, U = p.units, p.base, p.unroll
    zero, totals = unrolled(nr, _zero), unrolled(nr, _warp_total)
    FP = fixed_parts

    @nvvm_inlined
    def pick(t, acc, args):
        rows, T0, T = args
        rows[t] = min(T0 + t, T - 1)

    @nvvm_inlined
    def store(t, acc, args):
        y, bias, residual, has_bias, has_residual, part_sh, P, m, M, T0, T = args
        if T0 + t < T:
            total = acc[t]
            w0 = t * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
            for k in range(1, P):
                total += part_sh[w0 + k]
            if has_bias:                  # `store_row`'s sum, without its slices' registers
                total += bias[m]
            o = (T0 + t) * M + m
            if has_residual:
                total += residual[o]
            y[o] = total

    picks, stores = unrolled(nr, pick), unrolled(nr, store)

    def matvec_tiles(w, M, K, x, y, bias, residual, has_bias, has_residual, T, parts, RB):
        P = FP if FP else parts
        part_sh = cuda.shared.array(PART_SH_ROWS, np.float32)
        acc = cuda.local.array(nr, np.float32)
        rows = cuda.local.array(nr, np.int64)
        lane = cuda.threadIdx.x & 31
        wi = cuda.threadIdx.x >> 5
        part = wi % P
        RS = WARPS_PER_BLOCK // P             # rows the block sums at a time
        T0 = np.int64(cuda.blockIdx.y) * nr
        picks(acc, (rows, T0, np.int64(T)))
        units_k = units(K)
        last = units_k - 1
        stride = 32 * P
        m0 = np.int64(cuda.blockIdx.x) * RB
        for mb in range(m0, min(m0 + RB, M), RS):      # (the same trips in every warp)
            m = mb + wi // P
            n = units_k if m < M else 0                 # a row past the end loads nothing
            base = row_base(min(m, M - 1), K)
            zero(acc, ())
            for u in range(32 * part + lane, n, stride * U):
                step(acc, w, (x, rows), base, u, stride, last, n, K)
            totals(acc, (part_sh, lane, P))
            if P > 1:
                cuda.syncthreads()
            if lane == 0 and part == 0 and m < M:
                stores(acc, (y, bias, residual, has_bias, has_residual, part_sh, P, m, M, T0,
                             T))
            if P > 1:                                   # part_sh is written again next row
                cuda.syncthreads()

    return _named(matvec_tiles, p, FP, kind=f"_tile{nr}")


# Rows of one group a warp sums together in group_kernel (32 lanes, one warp a row): batches of
# GROUP_BATCH rows, then (GROUP_BATCH > 2) one batch of 2, then single rows. A batch loads and
# decodes each chunk's weights once for its rows (`_rows_step`, the rows kernels' step: every
# row the one-row kernel's bits) and gives the warp independent rows' loads and dp4a to
# overlap. 1: every row alone (the walk before session 24). Read when a kernel is built.
# H200, T = 128 at the 35B-A3B shape (decision 0031): the expert gate 160.3 against 198.7 us,
# pp512 1378 against 1337 tok/s (run_bench --launch group-walk). Batches of split rows lost
# (the shared expert 375.2 against 309.7 us) and were removed, and so were batches on rows of
# 16 lanes (session 25: the expert down 228.0 against 194.4 us walking).
GROUP_BATCH = 4


def _mapped_x_row(x_row):
    """x_row(xm, t, K) for xm = (x, rows): activation row rows[t] of x -- a batch's rows are
    not consecutive (row i of a group reads row src[i] of x)."""
    @cuda.jit(device=True, inline="always")
    def mapped(xm, t, K):
        x, rows = xm
        return x_row(x, rows[t], K)
    return mapped


def _group_batch(p, nr):
    """batch(w, x, y, src, use_src, M, m, base, n, last, K, lane, i, i1, Z) -> i: the group's
    rows i, i + Z, ... taken nr at a time while nr remain before i1 (acc[t]: row i + t Z's lane
    sum, in `_row_total`'s order; then its warp tree and the store), returning the first row
    left."""
    step = _rows_step(p._replace(x_row=_mapped_x_row(p.x_row)), nr)
    zero = unrolled(nr, _zero)
    picks, stores = unrolled(nr, _pick_batch_row), unrolled(nr, _store_batch_row)
    U = p.unroll

    @cuda.jit(device=True, inline="always")
    def batch(w, x, y, src, use_src, M, m, base, n, last, K, lane, i, i1, Z):
        acc = cuda.local.array(nr, np.float32)
        rows = cuda.local.array(nr, np.int64)
        outs = cuda.local.array(nr, np.int64)
        while i + (nr - 1) * Z < i1:
            picks(acc, (rows, outs, src, use_src, i, Z))
            zero(acc, ())
            for u in range(lane, n, 32 * U):
                step(acc, w, (x, rows), base, u, 32, last, n, K)
            stores(acc, (y, outs, M, m, lane))
            i += nr * Z
        return i

    return batch


_TOKEN_KERNELS: dict = {}
_GROUP_KERNELS: dict = {}
_TILE_KERNELS: dict = {}


def tile_kernels(p, nr):
    """kernels(parts): path p's `tile_kernel` for tiles of nr tokens (<= MAX_ROWS), one build
    for parts = 1 (the split folded in) and one for 2 and 4, each built on first request."""
    if not 1 <= nr <= MAX_ROWS:
        raise ValueError(f"{p.name}: a tile holds 1 .. {MAX_ROWS} tokens, not {nr}")
    key = (p.name, p.unroll, nr)
    if key not in _TILE_KERNELS:
        built = {}

        def kernels(parts):
            fp = 1 if parts == 1 else 0
            if fp not in built:
                built[fp] = tile_kernel(p, nr, fp)
            return built[fp]
        _TILE_KERNELS[key] = kernels
    return _TILE_KERNELS[key]


def _kernel_set(cache, make, p, lanes):
    """kernels(parts) of path p's rows on `lanes` lanes, one set a (path, lanes) shared by
    every caller: make(p, 1, lanes), the build with the split folded in, for parts = 1, and
    make(p, 0, lanes), the run-time-parts build, for 2 and 4 (as `path_kernels`), each built
    on first request. Rows on 16 / 8 lanes take one warp's part, so parts must be 1. (A
    group kernel's set is also GROUP_BATCH's.)"""
    key = (p.name, lanes, GROUP_BATCH if make is group_kernel else 0)
    if key not in cache:
        built = {}

        def kernels(parts):
            if lanes < 32 and parts != 1:
                raise ValueError(f"{p.name}: a row on {lanes} lanes takes one warp's part, "
                                 f"not {parts} warps")
            fp = 1 if parts == 1 else 0
            if fp not in built:
                built[fp] = make(p, fp, lanes)
            return built[fp]
        cache[key] = kernels
    return cache[key]


def token_kernels(p, lanes=32):
    """kernels(parts): path p's `token_kernel` on `lanes` lanes a row."""
    return _kernel_set(_TOKEN_KERNELS, token_kernel, p, lanes)


def group_kernels(p, lanes=32):
    """kernels(parts): path p's `group_kernel` on `lanes` lanes a row."""
    return _kernel_set(_GROUP_KERNELS, group_kernel, p, lanes)


def path_kernels(p, who):
    """kernels(rows, parts, K, M, beside, R): path p's kernel for `rows` = 1 .. MAX_ROWS rows of
    activations and `parts` warps a row on R weight rows a warp (None: `warp_rows` of M output
    rows and `beside`; a launcher that sizes its grid with R passes the R it used), built
    (not compiled) on first request. parts = 1 -- every large-M decode matvec -- gets its own
    build with the split folded in (`row_kernel`'s fixed_parts); 2 and 4 share the
    run-time-parts build. Either build computes the same sums in the same order, so which one
    runs changes no bit. With K given the path runs with its unroll fitted to the row
    (`fit_unroll`: the same bits, no dropped slots computed)."""
    built = {}

    def kernels(rows, parts, K=None, M=None, beside=False, R=None):
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"{who}: a launch carries 1 .. {MAX_ROWS} rows, not {rows}")
        fp = 1 if parts == 1 else 0
        q = p if K is None else fit_unroll(p, K, parts)
        if R is None:
            R = warp_rows(p, rows, parts, M, beside)
        key = (rows, q.unroll, fp, None if rows == 1 else ROWS_MAX_REGISTERS, R)
        if key not in built:
            built[key] = (rows_pair_kernel_of(q, rows, R) if R > 1 else row_kernel(q, fp)
                          if rows == 1 else rows_kernel_of(q, rows, fp))
        return built[key]

    return kernels


# Verify's rows kernels with the activation terms shared by the block (session 28: each
# persistent block wrote its tokens' activation sums and scales to shared memory once for all
# its rows; Q4_K and Q6_K_R, the same bits, 19-35 % fewer SASS instructions a (token, chunk))
# lost on the H200 (session 29): Q4_K 12288 x 4096 at T = 4 25.78 against 23.46 us, the 9B's
# verify at K = 3 8.22 against 6.64 ms. The rows kernels wait on their loads (session 23's
# profile), not on issue. They were removed, with the rows prefill's token tiles on the same
# terms; decision 0035.


# ---------------------------------------------------------------- the generic paths


@cuda.jit(device=True, inline="always")
def x_row_q8(x, t, K):
    """Activation row t of int8 activations x = (xq, xd), both read as 4-byte words or floats:
    row t's K int8 values start at word t * K / 4, its K / 32 scales at t * K / 32."""
    return x[0][t * (K >> 2):], x[1][t * (K >> 5):]


def _generic_path(lay, q8):
    """The row path of layout `lay`'s group codec: float activations x = (x,) (`group_dot`),
    or int8 ones x = (xq32, xd) (`group_dot_q8`, dp4a); w = (w8, w16, wh), dequant's views."""
    qk, ts, gpb = lay.block, lay.type_size, lay.groups
    group_dot = lay.group_dot_q8 if q8 else lay.group_dot

    @cuda.jit(device=True, inline="always")
    def units(K):
        return (K // qk) * gpb

    @cuda.jit(device=True, inline="always")
    def base(row, K):
        return np.int64(row) * ((K // qk) * ts)

    @cuda.jit(device=True, inline="always")
    def weights(w, base, g):
        return np.int32(0)            # group_dot does plain loads: CSE merges the rows' copies

    if q8:
        @cuda.jit(device=True, inline="always")
        def value(w, x, base, g, q):
            b = g // gpb
            return group_dot(w[0], w[1], w[2], base + b * ts, g - b * gpb, x[0], x[1], b * qk)

        x_row = x_row_q8
    else:
        @cuda.jit(device=True, inline="always")
        def value(w, x, base, g, q):
            b = g // gpb
            return group_dot(w[0], w[1], w[2], base + b * ts, g - b * gpb, x[0], b * qk)

        @cuda.jit(device=True, inline="always")
        def x_row(x, t, K):
            return (x[0][t * K:],)

    name = f"matvec_q8_{lay.name}" if q8 else f"matvec_{lay.name}"
    return RowPath(name, __name__, UNROLL, units, base, weights, value, x_row,
                   lambda K: (K // qk) * gpb)


@cuda.jit(device=True, inline="always")
def _f32_units(K):
    return K >> 2


@cuda.jit(device=True, inline="always")
def _f32_base(row, K):
    return np.int64(row) * K


@cuda.jit(device=True, inline="always")
def _f32_weights(w, base, u):
    return ld_nc_v4_u32(w[0], base + 4 * u)


@cuda.jit(device=True, inline="always")
def _f32_value(w, x, base, u, q):
    a0, a1, a2, a3 = ld_nc_v4_u32(x[0], 4 * u)
    q0, q1, q2, q3 = q
    v = f32_from_bits(q0) * f32_from_bits(a0)
    v += f32_from_bits(q1) * f32_from_bits(a1)
    v += f32_from_bits(q2) * f32_from_bits(a2)
    return v + f32_from_bits(q3) * f32_from_bits(a3)


@cuda.jit(device=True, inline="always")
def _f32_x_row(x, t, K):
    return (x[0][t * K:],)


# F32 weights with K % 4 == 0 (Gated DeltaNet's fused beta/alpha rows, MoE routers): a unit is
# 4 consecutive values, one 16-byte load of weights and one of activations (both read as uint32
# words and bit-cast), so a lane keeps 4 x 32 bytes in flight per step where the generic F32
# group (one value, decoded from two 2-byte loads with ldexp) kept 4 x 8. Summation order: the
# unit's 4 products left to right, then steps 2-5 of the module docstring over units.
F32_V4 = RowPath("matvec_f32_v4", __name__, UNROLL, _f32_units, _f32_base, _f32_weights,
                 _f32_value, _f32_x_row, lambda K: K >> 2)
F32_V4_KERNELS = path_kernels(F32_V4, "matvec_f32_v4")
matvec_f32_v4 = F32_V4_KERNELS(1, 2)


# kernel objects by weight type; also module attributes matvec_<type> / matvec_q8_<type>
PATHS = {qt: _generic_path(lay, False) for qt, lay in LAYOUTS.items()}
PATHS_Q8 = {qt: _generic_path(lay, True) for qt, lay in LAYOUTS.items()
            if lay.group_dot_q8 is not None}
_KERNELS = {qt: path_kernels(p, "matvec") for qt, p in PATHS.items()}
_KERNELS_Q8 = {qt: path_kernels(p, "matvec_q8") for qt, p in PATHS_Q8.items()}
MATVEC = {qt: k(1, 2) for qt, k in _KERNELS.items()}          # the run-time-parts builds
MATVEC_Q8 = {qt: k(1, 2) for qt, k in _KERNELS_Q8.items()}
for _qt, _k in MATVEC.items():
    globals()[f"matvec_{LAYOUTS[_qt].name}"] = _k
for _qt, _k in MATVEC_Q8.items():
    globals()[f"matvec_q8_{LAYOUTS[_qt].name}"] = _k

_W = "Tuple((uint8[::1], uint16[::1], float16[::1]))"
_SIG = f"void({_W}, int32, int32, UniTuple(float32[::1], 1), float32[::1], float32[::1], " \
       "float32[::1], int32, int32, int32)"
_SIG_Q8 = f"void({_W}, int32, int32, Tuple((int32[::1], float32[::1])), float32[::1], " \
          "float32[::1], float32[::1], int32, int32, int32)"

def rows_kernel(qtype, nr, q8=False, parts=2, K=None):
    """The float-path (q8=False) or dp4a-path kernel of weight type `qtype` for nr = 1 ..
    MAX_ROWS rows of activations and `parts` warps a row (`path_kernels`; K, when given,
    fits the loop build's unroll), built (not compiled) on its first request."""
    return (_KERNELS_Q8 if q8 else _KERNELS)[QType(qtype)](int(nr), int(parts), K)


# The compile check (tests/test_compile_ptx.py) compiles the module attributes named in
# PTX_SIGNATURES: one 4-row kernel of each path stands for the rest (same code, other layouts),
# and the parts = 1 build of the dp4a Q6_K path for the parts = 1 builds.
matvec_f16_r4 = rows_kernel(QType.F16, 4)
matvec_q8_q6_k_r4 = rows_kernel(QType.Q6_K, 4, q8=True)
matvec_q8_q6_k_p1 = rows_kernel(QType.Q6_K, 1, q8=True, parts=1)

PTX_SIGNATURES = {
    **{f"matvec_{LAYOUTS[qt].name}": [_SIG] for qt in MATVEC},
    **{f"matvec_q8_{LAYOUTS[qt].name}": [_SIG_Q8] for qt in MATVEC_Q8},
    "matvec_f16_r4": [_SIG],
    "matvec_q8_q6_k_r4": [_SIG_Q8],
    "matvec_q8_q6_k_p1": [_SIG_Q8],
    "matvec_f32_v4": ["void(UniTuple(uint32[::1], 1), int32, int32, UniTuple(uint32[::1], 1), "
                      "float32[::1], float32[::1], float32[::1], int32, int32, int32)"],
}
# the warp sum must be the shuffle butterfly (tests/test_compile_ptx.py checks the text; that
# the only block barrier is the split-row combine's is checked by tests/test_kernels_matvec.py)
EXPECTED_PTX = {name: ["shfl.sync.bfly.b32"] for name in PTX_SIGNATURES}


# ---------------------------------------------------------------- launchers


# False: Q8_0 / Q5_0 / Q4_0 keep the generic group path (bench/matvec_bench.py compares both)
QX0_V4 = True

# Split a row over more warps while the launch has fewer than this many warps: ~16 a SM on a
# 132-SM H200 is what it takes to keep enough loads in flight (decision 0004).
SPLIT_BELOW_WARPS = 132 * 16
MAX_PARTS = WARPS_PER_BLOCK
# A row is split over twice the warps only while K >= SPLIT_MIN_K * parts (parts before the
# doubling): 1024 keeps >= 512 of a row's values a warp. 512 (before session 41) split the
# 0.5B's K = 896 rows (28 Q5_0 / Q8_0 blocks, one step of one warp: q/k/v, attn_output) over
# two warps, the second with nothing to add but a barrier. Measured (H100, session 41,
# run_bench in one process, tok/s @512 / @6144): 0.5B 1102.0 / 871.6 against 1043.7 / 819.3
# and 1033.6 / 824.1 (+6 %); 35B-A3B (its K = 512 expert rows) 328.4 / 307.9 against
# 327.8 / 308.5 and 328.5 / 307.9; 9B unchanged (no row below K = 2048). run_bench
# --launch split-k512 is the old rule. Read at every call; decode, verify and prefill all read
# a matrix's split from here, so the three keep agreeing bit for bit.
SPLIT_MIN_K = 1024


def warps_per_row(M: int, K: int) -> int:
    """1, 2 or 4 warps per output row: the fewest that give the launch SPLIT_BELOW_WARPS warps,
    and only while K >= SPLIT_MIN_K * parts (a warp step covers 128 groups of >= 1 value;
    splitting shorter rows only adds the barrier)."""
    parts = 1
    while parts < MAX_PARTS and M * parts < SPLIT_BELOW_WARPS and K >= SPLIT_MIN_K * parts:
        parts *= 2
    return parts


def _grid(M, parts=1):
    return (M * parts + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK


def check_rows(rows, who="matvec"):
    """`rows` as an int, or a ValueError naming `who` when it is outside 1 .. MAX_ROWS."""
    rows = int(rows)
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"{who}: rows (activation rows a launch carries) must be 1 .. "
                         f"{MAX_ROWS}, not {rows}")
    return rows


def at_least(rows, n, what):
    """The size a per-row buffer needs, in words: "M=17" or "rows x M = 3 x 17 = 51"."""
    return f"{what}={n}" if rows == 1 else f"rows x {what} = {rows} x {n} = {rows * n}"


def _flat(a):
    return a if a.ndim == 1 else a.reshape(a.size)


def _check_common(w_dev, qt, M, K, y_dev, bias, residual, rows=1):
    lay = layout(qt)
    need = M * row_bytes(lay.qtype, K)
    have = w_dev.size * w_dev.dtype.itemsize
    if have != need:
        raise ValueError(f"matvec: a {lay.qtype.name} weight of {M} x {K} is {need} bytes; "
                         f"the device buffer holds {have}")
    for name, a, n in (("y", y_dev, rows), ("bias", bias, 1), ("residual", residual, rows)):
        if a is not None and (a.dtype != np.float32 or a.size < n * M):
            raise ValueError(f"matvec: {name} must be float32 with at least "
                             f"{at_least(n, M, 'M')} elements")
    return lay


def launch_matvec(w_dev, qtype, M, K, x_dev, y_dev, bias=None, residual=None, stream=0,
                  parts=None, rows=1):
    """y = W @ x (+ bias) (+ residual), float32 activations, every weight type.

    w_dev: device buffer of the GGUF rows (M * row_bytes(qtype, K) bytes, any dtype/shape,
    C-contiguous); x_dev float32[K]; y_dev float32[M]; bias, residual float32[M] or None.
    residual may be y_dev itself (in-place y += W @ x); x_dev must not alias y_dev.
    parts: warps per row (default `warps_per_row(M, K)`). Reference: `matvec_reference`.
    rows: T = 1 .. MAX_ROWS rows of activations in one launch, the weights read once (module
    docstring): x_dev float32[T, K] (any C-contiguous shape; row t at t * K), y_dev and
    residual float32[T, M] likewise, bias float32[M] shared; row t of y is bit for bit what a
    rows = 1 launch on row t's x (and residual) gives."""
    rows = check_rows(rows)
    lay = _check_common(w_dev, qtype, M, K, y_dev, bias, residual, rows)
    if x_dev.dtype != np.float32 or x_dev.size < rows * K:
        raise ValueError(f"matvec: x must be float32 with at least {at_least(rows, K, 'K')} "
                         "elements")
    w8, w16, wh = weight_views(w_dev)
    parts = _parts(M, K, parts)
    x_dev, y_dev = _flat(x_dev), _flat(y_dev)
    residual = None if residual is None else _flat(residual)
    if lay.qtype == QType.F32 and K % 4 == 0:      # 16-byte loads (F32_V4)
        kern = F32_V4_KERNELS(rows, parts, K)
        w, x = (w8.view(np.uint32),), (x_dev[:rows * K].view(np.uint32),)
    else:
        kern = rows_kernel(lay.qtype, rows, parts=parts, K=K)
        w, x = (w8, w16, wh), (x_dev,)
    kern[_grid(M, parts), THREADS, stream](
        w, np.int32(M), np.int32(K), x, y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))


def _parts(M, K, parts):
    parts = warps_per_row(M, K) if parts is None else int(parts)
    if parts not in (1, 2, 4):
        raise ValueError(f"matvec: parts (warps per row) must be 1, 2 or 4, not {parts}")
    return parts


def launch_matvec_q8(w_dev, qtype, M, K, xq_dev, xd_dev, y_dev, bias=None, residual=None,
                     stream=0, parts=None, rows=1, nibble=False, beside=False):
    """y = W @ dequant(xq, xd) (+ bias) (+ residual) with dp4a, for Q8_0, Q4_0, Q5_0, Q4_K,
    Q5_K, Q6_K weights (Q4_K on matvec_q4k.py's kernel; Q8_0 / Q5_0 / Q4_0 on matvec_qx0.py's
    when the buffer allows it, `matvec_qx0.serves`). xq_dev int8[K] and xd_dev float32[K / 32] come from
    `quantize_act.launch_quantize_act`. Reference: `matvec_q8_reference`.
    rows: T = 1 .. MAX_ROWS rows of activations (as `launch_matvec`): xq_dev int8[T * K] and
    xd_dev float32[T * K / 32] (row t's at t * K and t * K / 32: quantize_act's [T, K]
    output), y_dev and residual float32[T * M], bias float32[M].
    nibble: xq is in nibble order (quantize_act.nibble_order; Q4_K only, K % 256 == 0).
    beside: the launch runs beside others on the GPU (graph branches; `warp_rows`)."""
    rows = check_rows(rows)
    lay = _check_common(w_dev, qtype, M, K, y_dev, bias, residual, rows)
    if lay.qtype not in MATVEC_Q8:
        raise ValueError(f"matvec_q8: no dp4a path for {lay.qtype.name}; "
                         f"use launch_matvec (dp4a types: {[q.name for q in MATVEC_Q8]})")
    if xq_dev.dtype != np.int8 or xq_dev.size < rows * K or xd_dev.dtype != np.float32 \
            or xd_dev.size < rows * K // 32:
        raise ValueError(f"matvec_q8: xq must be int8[{rows * K}] and xd float32[{rows * K // 32}]"
                         + ("" if rows == 1 else f" (rows={rows} x K={K})"))
    if nibble and (lay.qtype != QType.Q4_K or K % 256):
        raise ValueError(f"matvec_q8: activations in nibble order serve Q4_K rows (K % 256 == 0)"
                         f", not {lay.qtype.name} with K = {K}")
    w8, w16, wh = weight_views(w_dev)
    parts = _parts(M, K, parts)
    y_dev = _flat(y_dev)
    residual = None if residual is None else _flat(residual)
    if lay.qtype == QType.Q4_K:               # 16-byte loads straight from the GGUF blocks
        from . import matvec_q4k
        matvec_q4k.launch(w8, M, K, xq_dev, xd_dev, y_dev, bias, residual, parts,
                          _grid(M, parts), THREADS, stream, rows, nibble, beside)
        return
    from . import matvec_qx0
    if matvec_qx0.serves(lay.qtype, w8):
        # Q8_0 / Q5_0 / Q4_0: 16-byte loads of the GGUF blocks, lined up in registers
        matvec_qx0.launch(lay.qtype, w8, w16, wh, M, K, xq_dev, xd_dev, y_dev, bias, residual,
                          parts, _grid(M, parts), THREADS, stream, rows)
        return
    xq32 = xq_dev.reshape(xq_dev.size)[:rows * K].view(np.int32)      # 4 int8 per dp4a operand
    kern = rows_kernel(lay.qtype, rows, q8=True, parts=parts, K=K)
    kern[_grid(M, parts), THREADS, stream](
        (w8, w16, wh), np.int32(M), np.int32(K), (xq32, _flat(xd_dev)), y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))


# ---------------------------------------------------------------- numpy references


def matvec_reference(w_raw, qtype, M, K, x, bias=None, residual=None):
    """float64 ((dequantize(W) @ x) + bias) + residual, returned as float64[M]."""
    from ..quant import dequantize
    w = dequantize(np.asarray(w_raw).reshape(-1), QType(qtype), (M, K)).astype(np.float64)
    y = w @ np.asarray(x, dtype=np.float64)[:K]
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[:M]
    if residual is not None:
        y = y + np.asarray(residual, dtype=np.float64)[:M]
    return y


def matvec_q8_reference(w_raw, qtype, M, K, xq, xd, bias=None, residual=None):
    """The dp4a path's value: float64 dequantize(W) @ (xq * xd per 32-block) (+ bias)
    (+ residual). Exact when all scales are powers of two and the sums fit 2^24 (see tests)."""
    from .quantize_act import dequantize_act_q8
    return matvec_reference(w_raw, qtype, M, K, dequantize_act_q8(xq, xd), bias, residual)
