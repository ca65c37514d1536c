"""The PTX snippets as Numba ``@intrinsic`` functions that emit inline assembly.

Each intrinsic takes its instruction text from the ``// @inline`` block of a ``.ptx`` file in this
package (see ``snippets.py``), so what runs inline is exactly what the linked ``.func`` runs.
Import these through ``bw24nb.ptx``, which substitutes the Python twins under the simulator.

The inline assembly is emitted without the "side effect" flag: every snippet here is a pure
function of its operands (``ld.global.nc`` reads memory that, by its contract, nobody writes
during the kernel), so the compiler may schedule, hoist or drop it like any arithmetic.
"""
from __future__ import annotations

from llvmlite import ir
from numba import cuda, float32, types
from numba.cuda import cgutils
from numba.cuda import libdevice
from numba.cuda.core.errors import TypingError
from numba.cuda.extending import intrinsic

from bw24nb.ptx.snippets import Snippet, snippet

_I32 = ir.IntType(32)


def _llvm_type(constraint: str) -> ir.Type:
    types_ = {"r": ir.IntType(32), "l": ir.IntType(64), "h": ir.IntType(16), "f": ir.FloatType()}
    return types_[constraint]


def _emit(builder, snip: Snippet, args) -> list:
    """Call ``snip`` as inline asm on LLVM values ``args`` (one per input); return its outputs."""
    if len(args) != len(snip.inputs):
        raise TypeError(f"{snip.name}: {len(snip.inputs)} inputs, got {len(args)}")
    out_types = [_llvm_type(o.constraint) for o in snip.outputs]
    ret = out_types[0] if len(out_types) == 1 else ir.LiteralStructType(out_types)
    fnty = ir.FunctionType(ret, [_llvm_type(o.constraint) for o in snip.inputs])
    asm = ir.InlineAsm(fnty, snip.asm_template, snip.constraints, side_effect=False)
    res = builder.call(asm, list(args))
    if len(out_types) == 1:
        return [res]
    return [builder.extract_value(res, i) for i in range(len(out_types))]


def _require_integers(name: str, *tys) -> None:
    for ty in tys:
        if not isinstance(ty, types.Integer):
            raise TypingError(f"{name}: arguments must be integers, got {ty}")


def _as_i32(context, builder, val, ty):
    return context.cast(builder, val, ty, types.int32)


# --- three 32-bit integers in, one out: dp4a, dp4a.u32.s32, prmt.b32 ------------------------------


def _int3_intrinsic(name: str, snip: Snippet, ret, doc: str):
    """An @intrinsic f(a, b, c) emitting snippet `snip` on three integers (any integer types,
    taken as their low 32 bits) and returning its one 32-bit output as `ret`."""
    def typer(typingctx, a, b, c):
        _require_integers(name, a, b, c)

        def codegen(context, builder, sig, args):
            ins = [_as_i32(context, builder, v, t) for v, t in zip(args, sig.args)]
            return _emit(builder, snip, ins)[0]

        return ret(a, b, c), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


dp4a = _int3_intrinsic(
    "dp4a", snippet("dp4a_s32"), types.int32,
    "int32 ``c + sum(int8(a.byte[i]) * int8(b.byte[i]))``, wrapping; any integer types in.")
dp4a_us = _int3_intrinsic(
    "dp4a_us", snippet("dp4a_us"), types.int32,
    "int32 ``c + sum(uint8(a.byte[i]) * int8(b.byte[i]))``, wrapping (``dp4a.u32.s32``).")
byte_perm = _int3_intrinsic(
    "byte_perm", snippet("prmt_b32"), types.uint32,
    "uint32 whose byte i is byte ``(c >> 4i) & 7`` of the eight bytes {b, a} (a low): "
    "``prmt.b32`` in its default mode (CUDA's __byte_perm), c the selector.")


# --- mma.sync m16n8k32 s8 -------------------------------------------------------------------------

_MMA = snippet("mma_m16n8k32_s8")
_I32X4 = types.UniTuple(types.int32, 4)


@intrinsic
def mma_s8_m16n8k32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """Warp-collective int8 16x8x32 MMA; fragments per ``bw24nb/ptx/mma_layout.py``."""
    _require_integers("mma_s8_m16n8k32", a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

    def codegen(context, builder, sig, args):
        ins = [_as_i32(context, builder, v, t) for v, t in zip(args, sig.args)]
        return context.make_tuple(builder, _I32X4, _emit(builder, _MMA, ins))

    return _I32X4(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), codegen


# --- mma.sync m16n8k16 f16 -> f32, and the f32 -> f16x2 pack of its operands --------------------

_MMA_F16 = snippet("mma_m16n8k16_f16")
_F32X4 = types.UniTuple(types.float32, 4)


@intrinsic
def mma_f16_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """Warp-collective f16 16x8x16 MMA with float32 accumulators: a* / b* f16x2 words (any
    integer types), c* float32; returns (d0, d1, d2, d3). Fragments: ``mma_layout.py``."""
    _require_integers("mma_f16_m16n8k16", a0, a1, a2, a3, b0, b1)

    def codegen(context, builder, sig, args):
        ins = [_as_i32(context, builder, v, t) for v, t in zip(args[:6], sig.args[:6])]
        ins += [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:])]
        return context.make_tuple(builder, _F32X4, _emit(builder, _MMA_F16, ins))

    return _F32X4(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), codegen


_F32X2_TO_F16X2 = snippet("f32x2_to_f16x2")


@intrinsic
def f32x2_to_f16x2(typingctx, lo, hi):
    """uint32 holding f16(lo) in bits 15:0 and f16(hi) in bits 31:16, each rounded to nearest
    even (``cvt.rn.f16x2.f32``): an A / B register of ``mma_f16_m16n8k16`` from two floats."""

    def codegen(context, builder, sig, args):
        ins = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
        return _emit(builder, _F32X2_TO_F16X2, ins)[0]

    return types.uint32(lo, hi), codegen


# --- grid dependency control (programmatic dependent launch) -------------------------------------

_GRID_WAIT = snippet("grid_dependency_wait")


@intrinsic
def grid_dependency_wait(typingctx):
    """``griddepcontrol.wait`` (griddepcontrol.ptx says why): returns once the grids this one
    depends on through programmatic graph edges have completed and their writes are visible.
    Emitted as a volatile asm with a memory clobber, so the compiler moves no load or store of
    the kernel above it. Before sm_90 the instruction does not exist and nothing is emitted
    (no such GPU gets programmatic edges either: device.ArchFeatures.grid_dependency)."""

    def codegen(context, builder, sig, args):
        from bw24nb.device import current_features
        if current_features().grid_dependency:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fnty, _GRID_WAIT.asm_template, "~{memory}",
                                      side_effect=True), [])
        return context.get_dummy_value()

    return types.none(), codegen


# --- timers -------------------------------------------------------------------------------------


def _timer_intrinsic(name: str, doc: str):
    snip = snippet(name)

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(64), [])
            return builder.call(ir.InlineAsm(fnty, snip.asm_template, "=l,~{memory}",
                                             side_effect=True), [])
        return types.uint64(), codegen

    typer.__name__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


clock64 = _timer_intrinsic("clock64", """The SM's cycle counter (``mov.u64 %clock64``,
timers.ptx): consistent within a block, not across SMs. Volatile, with a memory clobber: the
compiler moves no load or store across it and never merges two reads.""")
global_timer = _timer_intrinsic("global_timer", """The GPU's nanosecond timer (``mov.u64
%globaltimer``, timers.ptx): comparable across blocks and kernels (its update period is the
GPU's, not one nanosecond). Volatile, with a memory clobber, like `clock64`.""")


# --- bit casts ----------------------------------------------------------------------------------


@intrinsic
def f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bit pattern is the low 32 bits of the integer ``bits`` (an LLVM
    bitcast: no instruction of its own)."""
    _require_integers("f32_from_bits", bits)

    def codegen(context, builder, sig, args):
        return builder.bitcast(_as_i32(context, builder, args[0], sig.args[0]), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def f32_bits(typingctx, value):
    """The int32 whose bits are float32 ``value``'s IEEE pattern (an LLVM bitcast: no
    instruction of its own); the inverse of `f32_from_bits`. For integers kept in a float32
    array."""
    if not isinstance(value, types.Float):
        raise TypingError(f"f32_bits: needs a float, got {value}")

    def codegen(context, builder, sig, args):
        x = context.cast(builder, args[0], sig.args[0], types.float32)
        return builder.bitcast(x, _I32)

    return types.int32(value), codegen


@cuda.jit(device=True, inline="always")
def fma_f32(a, b, c):
    """a * b + c in float32, rounded once (libdevice's __nv_fmaf_rn: ``fma.rn.f32``). For sums
    whose order is part of a contract: left to the compiler, ``x * y + z * w`` may become
    fma(x, y, z * w) or fma(z, w, x * y), and two kernels with the same source line can pick
    differently (session 22: the prefill conv's pick changed with its restructure, decision
    0028)."""
    return libdevice.fmaf_rn(float32(a), float32(b), float32(c))


# --- f16x2 -> two f32 -------------------------------------------------------------------------------

_F16X2_TO_F32X2 = snippet("f16x2_to_f32x2")
_F32X2 = types.UniTuple(types.float32, 2)


@intrinsic
def f16x2_to_f32x2(typingctx, word):
    """(float32 of the f16 in bits 15:0, float32 of the f16 in bits 31:16) of a 32-bit word:
    two ``cvt.f32.f16`` (exact), for half-precision data read as uint32 words with 16-byte
    loads (the F16 KV cache: kernels/decode_attention.py)."""
    _require_integers("f16x2_to_f32x2", word)

    def codegen(context, builder, sig, args):
        h = _as_i32(context, builder, args[0], sig.args[0])
        return context.make_tuple(builder, _F32X2, _emit(builder, _F16X2_TO_F32X2, [h]))

    return _F32X2(word), codegen


# --- FP4 E2M1 decode ------------------------------------------------------------------------------



def _fp4_intrinsics(decode: Snippet):
    """(fp4x2_to_f16x2, fp4x2_to_f32x2, fp4_e2m1_to_f32) built on one byte->f16x2 snippet."""

    @intrinsic
    def fp4x2_to_f16x2(typingctx, byte):
        _require_integers("fp4x2_to_f16x2", byte)

        def codegen(context, builder, sig, args):
            x = _as_i32(context, builder, args[0], sig.args[0])
            return _emit(builder, decode, [x])[0]

        return types.uint32(byte), codegen

    @intrinsic
    def fp4x2_to_f32x2(typingctx, byte):
        _require_integers("fp4x2_to_f32x2", byte)

        def codegen(context, builder, sig, args):
            x = _as_i32(context, builder, args[0], sig.args[0])
            h = _emit(builder, decode, [x])[0]
            return context.make_tuple(builder, _F32X2, _emit(builder, _F16X2_TO_F32X2, [h]))

        return _F32X2(byte), codegen

    @intrinsic
    def fp4_e2m1_to_f32(typingctx, nibble):
        _require_integers("fp4_e2m1_to_f32", nibble)

        def codegen(context, builder, sig, args):
            x = builder.and_(_as_i32(context, builder, args[0], sig.args[0]), ir.Constant(_I32, 0xF))
            h = _emit(builder, decode, [x])[0]
            return _emit(builder, _F16X2_TO_F32X2, [h])[0]

        return types.float32(nibble), codegen

    return fp4x2_to_f16x2, fp4x2_to_f32x2, fp4_e2m1_to_f32


FP4_BITS = _fp4_intrinsics(snippet("fp4x2_to_f16x2_bits"))   # sm_80 / sm_90: integer ops + one mul
FP4_CVT = _fp4_intrinsics(snippet("fp4x2_to_f16x2_cvt"))     # sm_100a / sm_120a: cvt.rn.f16x2.e2m1x2


def _element_pointer(context, builder, sig, args):
    """The LLVM pointer to array[index] for an intrinsic taking (array, index) first (sig and
    args: those two): no bounds check, no negative-index wraparound."""
    aryty, idxty = sig.args[:2]
    ary = context.make_array(aryty)(context, builder, value=args[0])
    idx = context.cast(builder, args[1], idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)


def _element_address(context, builder, sig, args):
    """`_element_pointer` as a 64-bit address."""
    return builder.ptrtoint(_element_pointer(context, builder, sig, args), ir.IntType(64))


# --- vector non-coherent loads (16 and 8 bytes) ----------------------------------------------------

def _vector_load_intrinsic(name: str, snip: Snippet, dtype, width: int, doc: str):
    """An @intrinsic f(array, index) -> UniTuple(dtype, width): `snip`, one vector load of
    array[index .. index + width - 1] from the address `_element_address` computes. array must
    be a 1-D C-contiguous `dtype` device array (a TypingError names the call otherwise)."""
    tup = types.UniTuple(dtype, width)

    def typer(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == dtype
                and array.ndim == 1 and array.layout == "C"):
            raise TypingError(f"{name}: needs a 1-D C-contiguous {dtype} array, got {array}")
        _require_integers(name, index)

        def codegen(context, builder, sig, args):
            addr = _element_address(context, builder, sig, args)
            return context.make_tuple(builder, tup, _emit(builder, snip, [addr]))

        return tup(array, index), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


ld_nc_v4_u32 = _vector_load_intrinsic(
    "ld_nc_v4_u32", snippet("ld_nc_v4_u32"), types.uint32, 4,
    """``(array[index], ..., array[index + 3])`` in one 16-byte ``ld.global.nc.v4.u32``.

    ``array``: 1-D C-contiguous uint32 device array whose elements are not written during the
    kernel; ``index`` a multiple of 4 from a 16-byte aligned base (device allocations are).
    No bounds check, no negative-index wraparound (as for plain Numba indexing on the GPU).
    """)

# the Q4_K matvec's two consecutive activation scales (kernels/matvec_q4k.py)
ld_nc_v2_f32 = _vector_load_intrinsic(
    "ld_nc_v2_f32", snippet("ld_nc_v2_f32"), types.float32, 2,
    """``(array[index], array[index + 1])`` in one 8-byte ``ld.global.nc.v2.f32``: ``array`` a
    1-D C-contiguous float32 device array not written during the kernel, ``index`` even from
    an 8-byte aligned base. No bounds check, no negative-index wraparound.""")



@intrinsic
def ld_v4_f32(typingctx, array, index):
    """``(array[index], ..., array[index + 3])`` as one 16-byte vector load of LLVM's own (no
    inline asm: the address space stays the compiler's to infer, so a shared array's read is
    one ``ld.shared.v4.f32`` -- LDS.128 -- where four indexed reads stayed four LDS with their
    negative-index checks). ``array`` a 1-D C-contiguous float32 array (global or shared),
    ``index`` a multiple of 4 from a 16-byte aligned base. No bounds check, no negative-index
    wraparound."""
    if not (isinstance(array, types.Array) and array.dtype == types.float32
            and array.ndim == 1 and array.layout == "C"):
        raise TypingError(f"ld_v4_f32: needs a 1-D C-contiguous float32 array, got {array}")
    _require_integers("ld_v4_f32", index)
    tup = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig, args)
        vty = ir.VectorType(ir.FloatType(), 4)
        vec = builder.load(builder.bitcast(ptr, vty.as_pointer(ptr.type.addrspace)), align=16)
        return context.make_tuple(builder, tup, [builder.extract_element(vec, ir.Constant(_I32, i))
                                                 for i in range(4)])

    return tup(array, index), codegen

# --- cp.async: global -> shared without registers ---------------------------------------------

_CP_ASYNC_16 = snippet("cp_async_16")


@intrinsic
def cp_async_16(typingctx, dst, dst_index, src, src_index):
    """Start copying ``src[src_index .. src_index + 3]`` to ``dst[dst_index .. dst_index + 3]``
    (16 bytes, ``cp.async.cg.shared.global``; cp_async.ptx says why): dst a 1-D C-contiguous
    shared array, src a 1-D C-contiguous device array the kernel does not write, both of one
    4-byte dtype, both indices multiples of 4 from 16-byte aligned bases. The bytes are there
    after `cp_async_wait_*` (for this thread) and a barrier (for the block). Emitted as a
    volatile asm with a memory clobber, so no load or store of the kernel crosses it."""
    for name, ary in (("dst", dst), ("src", src)):
        if not (isinstance(ary, types.Array) and ary.ndim == 1 and ary.layout == "C"
                and ary.dtype in (types.uint32, types.int32, types.float32)):
            raise TypingError(f"cp_async_16: {name} must be a 1-D C-contiguous array of a "
                              f"4-byte type, got {ary}")
    if dst.dtype != src.dtype:
        raise TypingError(f"cp_async_16: dst ({dst.dtype}) and src ({src.dtype}) differ")
    _require_integers("cp_async_16", dst_index, src_index)

    def codegen(context, builder, sig, args):
        dty, diy, sty, siy = sig.args
        d = _element_address(context, builder, types.none(dty, diy), [args[0], args[1]])
        s = _element_address(context, builder, types.none(sty, siy), [args[2], args[3]])
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(64)])
        builder.call(ir.InlineAsm(fnty, _CP_ASYNC_16.asm_template,
                                  _CP_ASYNC_16.constraints + ",~{memory}", side_effect=True),
                     [d, s])
        return context.get_dummy_value()

    return types.none(dst, dst_index, src, src_index), codegen


def _barrier_asm_intrinsic(name: str, doc: str, feature: str | None = None):
    """An @intrinsic f() emitting snippet `name` (no operands) as a volatile asm with a memory
    clobber (no load or store crosses it); with `feature` (a device.ArchFeatures flag), only
    where the GPU has it, nothing elsewhere."""
    snip = snippet(name)

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            from bw24nb.device import current_features
            if feature is None or getattr(current_features(), feature):
                fnty = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fnty, snip.asm_template, "~{memory}",
                                          side_effect=True), [])
            return context.get_dummy_value()

        return types.none(), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


cp_async_commit = _barrier_asm_intrinsic(
    "cp_async_commit", "``cp.async.commit_group``: this thread's copies since the last commit "
    "form one group.")
cp_async_wait_1 = _barrier_asm_intrinsic(
    "cp_async_wait_1", "``cp.async.wait_group 1``: all but this thread's newest group landed.")
cp_async_wait_0 = _barrier_asm_intrinsic(
    "cp_async_wait_0", "``cp.async.wait_group 0``: all of this thread's groups landed.")


# --- named barrier ----------------------------------------------------------------------------

_BAR_SYNC = snippet("bar_sync")


@intrinsic
def bar_sync(typingctx, barrier, threads):
    """``bar.sync barrier, threads``: named barrier `barrier` (1 .. 15) over `threads` threads
    (a multiple of 32; bar_sync.ptx says why). A volatile asm with a memory clobber: no load
    or store crosses it."""
    _require_integers("bar_sync", barrier, threads)

    def codegen(context, builder, sig, args):
        ins = [_as_i32(context, builder, v, t) for v, t in zip(args, sig.args)]
        fnty = ir.FunctionType(ir.VoidType(), [_I32, _I32])
        builder.call(ir.InlineAsm(fnty, _BAR_SYNC.asm_template,
                                  _BAR_SYNC.constraints + ",~{memory}", side_effect=True), ins)
        return context.get_dummy_value()

    return types.none(barrier, threads), codegen


# --- L2 prefetch ------------------------------------------------------------------------------

_PREFETCH_L2 = snippet("prefetch_l2")


@intrinsic
def prefetch_l2(typingctx, array, index):
    """``prefetch.global.L2`` of the line holding ``array[index]`` (any 1-D C-contiguous
    array): a hint with no result. Emitted with side effects (it has no output for the
    compiler to keep it alive by); out-of-bounds addresses are not faults for a prefetch, but
    keep them in bounds anyway (the twin checks)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"):
        raise TypingError(f"prefetch_l2: needs a 1-D C-contiguous array, got {array}")
    _require_integers("prefetch_l2", index)

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig, args)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)])
        builder.call(ir.InlineAsm(fnty, _PREFETCH_L2.asm_template, _PREFETCH_L2.constraints,
                                  side_effect=True), [addr])
        return context.get_dummy_value()

    return types.none(array, index), codegen


_PREFETCH_L2_BULK = snippet("prefetch_l2_bulk")


@intrinsic
def prefetch_l2_bulk(typingctx, array, byte_offset, nbytes):
    """``cp.async.bulk.prefetch.L2.global`` of bytes [byte_offset, byte_offset + nbytes) of a
    1-D C-contiguous array's data (prefetch_l2_bulk.ptx says why): a hint with no result.
    byte_offset (from the array's start, which must be 16-byte aligned) and nbytes must be
    multiples of 16, nbytes > 0, the range inside the array (the twin checks all of it;
    `bw24nb.kernels.prefetch.prefetch_bytes` rounds a range to fit). Nothing is emitted before
    sm_90 (device.ArchFeatures.bulk_prefetch)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"):
        raise TypingError(f"prefetch_l2_bulk: needs a 1-D C-contiguous array, got {array}")
    _require_integers("prefetch_l2_bulk", byte_offset, nbytes)

    def codegen(context, builder, sig, args):
        from bw24nb.device import current_features
        if current_features().bulk_prefetch:
            aryty, offty, nty = sig.args
            ary = context.make_array(aryty)(context, builder, value=args[0])
            base = builder.ptrtoint(ary.data, ir.IntType(64))
            off = context.cast(builder, args[1], offty, types.int64)
            addr = builder.add(base, off)
            n = _as_i32(context, builder, args[2], nty)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)])
            builder.call(ir.InlineAsm(fnty, _PREFETCH_L2_BULK.asm_template,
                                      _PREFETCH_L2_BULK.constraints, side_effect=True),
                         [addr, n])
        return context.get_dummy_value()

    return types.none(array, byte_offset, nbytes), codegen


# --- thread-block clusters: rank, size, barrier, a store into another block's shared memory -----

def _cluster_register_intrinsic(name: str, none_value: int, doc: str):
    """An @intrinsic f() -> int32 reading a cluster special register (cluster.ptx), or the
    constant `none_value` where the GPU has no clusters (a block is then its own cluster)."""
    snip = snippet(name)

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            from bw24nb.device import current_features
            if not current_features().clusters:
                return ir.Constant(_I32, none_value)
            return _emit(builder, snip, [])[0]
        return types.int32(), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


cluster_rank = _cluster_register_intrinsic(
    "cluster_rank", 0, "int32 ``%cluster_ctarank``: this block's rank in its cluster (0 when "
    "launched without one).")
cluster_size = _cluster_register_intrinsic(
    "cluster_size", 1, "int32 ``%cluster_nctarank``: blocks in this block's cluster (1 when "
    "launched without one).")


# the cluster barrier's steps: nothing where the GPU has no clusters (a block is then its own)
cluster_arrive_relaxed = _barrier_asm_intrinsic(
    "cluster_arrive_relaxed", "``barrier.cluster.arrive.relaxed.aligned``: this thread has "
    "started (the barrier's first phase; no memory ordering). Every thread of the block.",
    "clusters")
cluster_arrive_release = _barrier_asm_intrinsic(
    "cluster_arrive_release", "``barrier.cluster.arrive.release.aligned``: this thread's "
    "earlier writes (remote ones too) are released to the cluster. Every thread of the block.",
    "clusters")
cluster_wait_acquire = _barrier_asm_intrinsic(
    "cluster_wait_acquire", "``barrier.cluster.wait.acquire.aligned``: waits until every thread "
    "of the cluster has arrived on the current phase; what they released is visible after it.",
    "clusters")

_ST_CLUSTER_F32 = snippet("st_cluster_f32")


@intrinsic
def st_cluster_f32(typingctx, array, index, rank, value):
    """``array[index] = value`` in the shared memory of the cluster's block of rank `rank`
    (cluster.ptx says when that is allowed): array a 1-D C-contiguous float32 *shared* array,
    whose element's address in this block is mapped to the other block's (``mapa``). Emitted as
    a volatile asm with a memory clobber. Where the GPU has no clusters, the plain store (rank
    must then be 0)."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
            and array.dtype == types.float32):
        raise TypingError(f"st_cluster_f32: needs a 1-D C-contiguous float32 shared array, "
                          f"got {array}")
    _require_integers("st_cluster_f32", index, rank)

    def codegen(context, builder, sig, args):
        from bw24nb.device import current_features
        rty, vty = sig.args[2:]
        val = context.cast(builder, args[3], vty, types.float32)
        ptr = _element_pointer(context, builder, sig, args)
        if not current_features().clusters:
            builder.store(val, ptr)
            return context.get_dummy_value()
        addr = builder.ptrtoint(ptr, ir.IntType(64))
        r = _as_i32(context, builder, args[2], rty)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), _I32, ir.FloatType()])
        builder.call(ir.InlineAsm(fnty, _ST_CLUSTER_F32.asm_template,
                                  _ST_CLUSTER_F32.constraints + ",~{memory}", side_effect=True),
                     [addr, r, val])
        return context.get_dummy_value()

    return types.none(array, index, rank, value), codegen
