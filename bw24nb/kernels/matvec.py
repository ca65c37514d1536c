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
                    16-byte-load kernel. The engine's decode default for these types.

Several rows of activations at once (rows = T > 1, launch_*(..., rows=T)): speculative
decoding verifies T = K + 1 tokens in one forward, and each verified row must be the value
plain decode would compute for it, bit for bit, or the accepted tokens could differ from
non-speculative decoding. So the rows = T kernels run the one-row kernel's loop unchanged --
the same warps per row (`warps_per_row(M, K)`, never a function of T), the same slots, the
same clamping -- and at every slot decode the weights once and multiply them into T
accumulators, each summed in exactly the order above (steps 1-5 per row t). The weights are
read once for the T rows, which is the point: weight bytes are the whole cost of a decode
matvec. T is a compile-time constant of each kernel (`rows_kernel`, built on first use; at most
MAX_ROWS) and the per-row work is written out T times (`unrolled`), so the accumulators live
in registers and the T copies' weight loads are one load each after LLVM's CSE. Row t of the
activations starts at t * K, of y and residual at t * M; the bias is shared. rows = 1 launches
the one-row kernels.

numpy references: `matvec_reference` (float path) and `matvec_q8_reference` (dp4a path) below.
"""
import numpy as np
from numba import cuda

from ..device import simulator_enabled
from ..jit import kernel
from ..quant.types import QType, row_bytes
from ..ptx import warp_sum
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


# ---------------------------------------------------------------- the kernels


def _group_term(lay):
    """term(w8, w16, wh, row_off, g, x): group g of the row at byte row_off, dotted with x."""
    qk, ts, gpb, group_dot = lay.block, lay.type_size, lay.groups, lay.group_dot

    @cuda.jit(device=True, inline="always")
    def term(w8, w16, wh, row_off, g, x):
        b = g // gpb
        return group_dot(w8, w16, wh, row_off + b * ts, g - b * gpb, x, b * qk)

    return term


def _group_term_q8(lay):
    """term(w8, w16, wh, row_off, g, xq32, xd): the same against int8 activations (dp4a)."""
    qk, ts, gpb, group_dot_q8 = lay.block, lay.type_size, lay.groups, lay.group_dot_q8

    @cuda.jit(device=True, inline="always")
    def term(w8, w16, wh, row_off, g, xq32, xd):
        b = g // gpb
        return group_dot_q8(w8, w16, wh, row_off + b * ts, g - b * gpb, xq32, xd, b * qk)

    return term


def _make_matvec(lay):
    qk, ts, gpb = lay.block, lay.type_size, lay.groups
    term = _group_term(lay)

    def matvec(w8, w16, wh, M, K, x, y, bias, residual, has_bias, has_residual, parts):
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        row = warp // parts
        part = warp - row * parts
        if parts == 1 and row >= M:   # the whole warp leaves: warp_sum stays full-warp
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        if row >= M:                  # split rows: stay for the block barrier, load nothing
            ngroups = 0
        row_off = np.int64(row) * (nblk * ts)
        stride = 32 * parts
        acc = np.float32(0.0)
        for g in range(32 * part + lane, ngroups, stride * UNROLL):
            # UNROLL = 4 slots; all loads unconditional (clamped), products kept in order
            p0 = term(w8, w16, wh, row_off, g, x)
            p1 = term(w8, w16, wh, row_off, min(g + stride, last), x)
            p2 = term(w8, w16, wh, row_off, min(g + 2 * stride, last), x)
            p3 = term(w8, w16, wh, row_off, min(g + 3 * stride, last), x)
            acc += p0
            acc += keep(p1, g + stride, ngroups)
            acc += keep(p2, g + 2 * stride, ngroups)
            acc += keep(p3, g + 3 * stride, ngroups)
        total = combine_parts(part_sh, parts, part, lane, warp_sum(acc))
        if lane == 0 and part == 0 and row < M:
            store_row(y, bias, residual, has_bias, has_residual, row, total)

    matvec.__name__ = matvec.__qualname__ = f"matvec_{lay.name}"
    return kernel(matvec)


def _make_matvec_q8(lay):
    qk, ts, gpb = lay.block, lay.type_size, lay.groups
    term = _group_term_q8(lay)

    def matvec_q8(w8, w16, wh, M, K, xq32, xd, y, bias, residual, has_bias, has_residual, parts):
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        row = warp // parts
        part = warp - row * parts
        if parts == 1 and row >= M:
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        if row >= M:
            ngroups = 0
        row_off = np.int64(row) * (nblk * ts)
        stride = 32 * parts
        acc = np.float32(0.0)
        for g in range(32 * part + lane, ngroups, stride * UNROLL):
            p0 = term(w8, w16, wh, row_off, g, xq32, xd)
            p1 = term(w8, w16, wh, row_off, min(g + stride, last), xq32, xd)
            p2 = term(w8, w16, wh, row_off, min(g + 2 * stride, last), xq32, xd)
            p3 = term(w8, w16, wh, row_off, min(g + 3 * stride, last), xq32, xd)
            acc += p0
            acc += keep(p1, g + stride, ngroups)
            acc += keep(p2, g + 2 * stride, ngroups)
            acc += keep(p3, g + 3 * stride, ngroups)
        total = combine_parts(part_sh, parts, part, lane, warp_sum(acc))
        if lane == 0 and part == 0 and row < M:
            store_row(y, bias, residual, has_bias, has_residual, row, total)

    matvec_q8.__name__ = matvec_q8.__qualname__ = f"matvec_q8_{lay.name}"
    return kernel(matvec_q8)


def _make_matvec_rows(lay, nr):
    """The float-path kernel for nr rows of activations (module docstring: rows = T > 1): the
    one-row kernel's loop, with each slot's products formed for every row and added to that
    row's accumulator in the one-row order."""
    qk, ts, gpb = lay.block, lay.type_size, lay.groups
    term = _group_term(lay)
    zero, finish = rows_epilogue(nr)

    @nvvm_inlined
    def slots(t, acc, args):
        w8, w16, wh, row_off, g, g1, g2, g3, stride, ngroups, x, K = args
        xt = x[t * K:]
        p0 = term(w8, w16, wh, row_off, g, xt)
        p1 = term(w8, w16, wh, row_off, g1, xt)
        p2 = term(w8, w16, wh, row_off, g2, xt)
        p3 = term(w8, w16, wh, row_off, g3, xt)
        a = acc[t]
        a += p0
        a += keep(p1, g + stride, ngroups)
        a += keep(p2, g + 2 * stride, ngroups)
        a += keep(p3, g + 3 * stride, ngroups)
        acc[t] = a

    step = unrolled(nr, slots)

    def matvec_rows(w8, w16, wh, M, K, x, y, bias, residual, has_bias, has_residual, parts):
        part_sh = cuda.shared.array(PART_SH_ROWS, np.float32)
        acc = cuda.local.array(nr, np.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        row = warp // parts
        part = warp - row * parts
        if parts == 1 and row >= M:
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        if row >= M:
            ngroups = 0
        row_off = np.int64(row) * (nblk * ts)
        stride = 32 * parts
        zero(acc, ())
        for g in range(32 * part + lane, ngroups, stride * UNROLL):
            step(acc, (w8, w16, wh, row_off, g, min(g + stride, last), min(g + 2 * stride, last),
                       min(g + 3 * stride, last), stride, ngroups, x, K))
        finish(acc, part_sh, lane, part, row, M, parts, y, bias, residual, has_bias, has_residual)

    matvec_rows.__name__ = matvec_rows.__qualname__ = f"matvec_{lay.name}_r{nr}"
    return kernel(matvec_rows)


def _make_matvec_q8_rows(lay, nr):
    """The dp4a-path kernel for nr rows of activations (as `_make_matvec_rows`)."""
    qk, ts, gpb = lay.block, lay.type_size, lay.groups
    term = _group_term_q8(lay)
    zero, finish = rows_epilogue(nr)

    @nvvm_inlined
    def slots(t, acc, args):
        w8, w16, wh, row_off, g, g1, g2, g3, stride, ngroups, xq32, xd, K = args
        xqt = xq32[t * (K >> 2):]
        xdt = xd[t * (K >> 5):]
        p0 = term(w8, w16, wh, row_off, g, xqt, xdt)
        p1 = term(w8, w16, wh, row_off, g1, xqt, xdt)
        p2 = term(w8, w16, wh, row_off, g2, xqt, xdt)
        p3 = term(w8, w16, wh, row_off, g3, xqt, xdt)
        a = acc[t]
        a += p0
        a += keep(p1, g + stride, ngroups)
        a += keep(p2, g + 2 * stride, ngroups)
        a += keep(p3, g + 3 * stride, ngroups)
        acc[t] = a

    step = unrolled(nr, slots)

    def matvec_q8_rows(w8, w16, wh, M, K, xq32, xd, y, bias, residual, has_bias, has_residual,
                       parts):
        part_sh = cuda.shared.array(PART_SH_ROWS, np.float32)
        acc = cuda.local.array(nr, np.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * WARPS_PER_BLOCK + (cuda.threadIdx.x >> 5)
        row = warp // parts
        part = warp - row * parts
        if parts == 1 and row >= M:
            return
        nblk = K // qk
        ngroups = nblk * gpb
        last = ngroups - 1
        if row >= M:
            ngroups = 0
        row_off = np.int64(row) * (nblk * ts)
        stride = 32 * parts
        zero(acc, ())
        for g in range(32 * part + lane, ngroups, stride * UNROLL):
            step(acc, (w8, w16, wh, row_off, g, min(g + stride, last), min(g + 2 * stride, last),
                       min(g + 3 * stride, last), stride, ngroups, xq32, xd, K))
        finish(acc, part_sh, lane, part, row, M, parts, y, bias, residual, has_bias, has_residual)

    matvec_q8_rows.__name__ = matvec_q8_rows.__qualname__ = f"matvec_q8_{lay.name}_r{nr}"
    return kernel(matvec_q8_rows)


# kernel objects by weight type; also module attributes matvec_<type> / matvec_q8_<type>
MATVEC = {qt: _make_matvec(lay) for qt, lay in LAYOUTS.items()}
MATVEC_Q8 = {qt: _make_matvec_q8(lay) for qt, lay in LAYOUTS.items() if lay.group_dot_q8 is not None}
for _qt, _k in MATVEC.items():
    globals()[f"matvec_{LAYOUTS[_qt].name}"] = _k
for _qt, _k in MATVEC_Q8.items():
    globals()[f"matvec_q8_{LAYOUTS[_qt].name}"] = _k

_SIG = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, float32[::1], float32[::1], " \
       "float32[::1], float32[::1], int32, int32, int32)"
_SIG_Q8 = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, int32[::1], float32[::1], " \
          "float32[::1], float32[::1], float32[::1], int32, int32, int32)"

# rows kernels (rows = T > 1) by (weight type, T), built on first use by `rows_kernel`
MATVEC_ROWS: dict = {}
MATVEC_Q8_ROWS: dict = {}


def rows_kernel(qtype, nr, q8=False):
    """The float-path (q8=False) or dp4a-path kernel of weight type `qtype` for nr = 2 ..
    MAX_ROWS rows of activations, built (not compiled) on its first request."""
    table, make = (MATVEC_Q8_ROWS, _make_matvec_q8_rows) if q8 else (MATVEC_ROWS, _make_matvec_rows)
    key = (QType(qtype), int(nr))
    if key not in table:
        table[key] = make(LAYOUTS[key[0]], key[1])
    return table[key]


# The compile check (tests/test_compile_ptx.py) compiles the module attributes named in
# PTX_SIGNATURES: one 4-row kernel of each path stands for the rest (same code, other layouts).
matvec_f16_r4 = rows_kernel(QType.F16, 4)
matvec_q8_q6_k_r4 = rows_kernel(QType.Q6_K, 4, q8=True)

PTX_SIGNATURES = {
    **{f"matvec_{LAYOUTS[qt].name}": [_SIG] for qt in MATVEC},
    **{f"matvec_q8_{LAYOUTS[qt].name}": [_SIG_Q8] for qt in MATVEC_Q8},
    "matvec_f16_r4": [_SIG],
    "matvec_q8_q6_k_r4": [_SIG_Q8],
}
# the warp sum must be the shuffle butterfly (tests/test_compile_ptx.py checks the text; that
# the only block barrier is the split-row combine's is checked by tests/test_kernels_matvec.py)
EXPECTED_PTX = {name: ["shfl.sync.bfly.b32"] for name in PTX_SIGNATURES}


# ---------------------------------------------------------------- launchers


# Split a row over more warps while the launch has fewer than this many warps: ~16 a SM on a
# 132-SM H200 is what it takes to keep enough loads in flight (decision 0004).
SPLIT_BELOW_WARPS = 132 * 16
MAX_PARTS = WARPS_PER_BLOCK


def warps_per_row(M: int, K: int) -> int:
    """1, 2 or 4 warps per output row: the fewest that give the launch SPLIT_BELOW_WARPS warps,
    and only while each warp keeps >= 512 of the row's K values (a warp step covers 128 groups
    of >= 1 value; splitting shorter rows only adds the barrier)."""
    parts = 1
    while parts < MAX_PARTS and M * parts < SPLIT_BELOW_WARPS and K >= 512 * parts:
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


def rows_kernels(make, who):
    """rows_kernel(nr) for a kernel module with one rows-kernel factory `make(nr)`: the kernel
    for nr = 2 .. MAX_ROWS rows of activations, built (not compiled) on its first request."""
    built = {}

    def rows_kernel(nr):
        if not 2 <= nr <= MAX_ROWS:
            raise ValueError(f"{who}: a rows kernel carries 2 .. {MAX_ROWS} rows, not {nr}")
        if nr not in built:
            built[nr] = make(nr)
        return built[nr]

    return rows_kernel


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
    kern = MATVEC[lay.qtype] if rows == 1 else rows_kernel(lay.qtype, rows)
    kern[_grid(M, parts), THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), x_dev, y_dev,
        y_dev if bias is None else bias, y_dev if residual is None else residual,
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))


def _parts(M, K, parts):
    parts = warps_per_row(M, K) if parts is None else int(parts)
    if parts not in (1, 2, 4):
        raise ValueError(f"matvec: parts (warps per row) must be 1, 2 or 4, not {parts}")
    return parts


def launch_matvec_q8(w_dev, qtype, M, K, xq_dev, xd_dev, y_dev, bias=None, residual=None,
                     stream=0, parts=None, rows=1):
    """y = W @ dequant(xq, xd) (+ bias) (+ residual) with dp4a, for Q8_0, Q4_0, Q5_0, Q4_K,
    Q5_K, Q6_K weights. xq_dev int8[K] and xd_dev float32[K / 32] come from
    `quantize_act.launch_quantize_act`. Reference: `matvec_q8_reference`.
    rows: T = 1 .. MAX_ROWS rows of activations (as `launch_matvec`): xq_dev int8[T * K] and
    xd_dev float32[T * K / 32] (row t's at t * K and t * K / 32: quantize_act's [T, K]
    output), y_dev and residual float32[T * M], bias float32[M]."""
    rows = check_rows(rows)
    lay = _check_common(w_dev, qtype, M, K, y_dev, bias, residual, rows)
    if lay.qtype not in MATVEC_Q8:
        raise ValueError(f"matvec_q8: no dp4a path for {lay.qtype.name}; "
                         f"use launch_matvec (dp4a types: {[q.name for q in MATVEC_Q8]})")
    if xq_dev.dtype != np.int8 or xq_dev.size < rows * K or xd_dev.dtype != np.float32 \
            or xd_dev.size < rows * K // 32:
        raise ValueError(f"matvec_q8: xq must be int8[{rows * K}] and xd float32[{rows * K // 32}]"
                         + ("" if rows == 1 else f" (rows={rows} x K={K})"))
    w8, w16, wh = weight_views(w_dev)
    parts = _parts(M, K, parts)
    y_dev = _flat(y_dev)
    residual = None if residual is None else _flat(residual)
    if lay.qtype == QType.Q4_K:               # 16-byte loads straight from the GGUF blocks
        from . import matvec_q4k
        matvec_q4k.launch(w8, M, K, xq_dev, xd_dev, y_dev, bias, residual, parts,
                          _grid(M, parts), THREADS, stream, rows)
        return
    xq32 = xq_dev.reshape(xq_dev.size)[:rows * K].view(np.int32)      # 4 int8 per dp4a operand
    kern = MATVEC_Q8[lay.qtype] if rows == 1 else rows_kernel(lay.qtype, rows, q8=True)
    kern[_grid(M, parts), THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), xq32, _flat(xd_dev), y_dev,
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
