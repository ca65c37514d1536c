"""The PTX snippets (bw24nb/ptx) compute what the instructions are specified to compute.

The kernel tests run bw24nb/ptx/probes.py's kernels: in the simulator they exercise the Python
twins (and the mma twin's warp rendezvous); on a GPU machine the very same tests run the real
inline PTX. Every comparison is exact: the snippets are integer arithmetic or exact conversions.
``test_gpu_snippets_equal_twins`` is the GPU-only cross-check of snippets against twins.
"""
import os

import numpy as np
import pytest
from numba import cuda

from bw24nb.device import gpu_present, simulator_enabled
from bw24nb.ptx import ld_v4_f32, mma_layout, mma_s8_m16n8k32, probes, twins
from bw24nb.ptx.snippets import SnippetError, all_snippets, parse_snippets, snippet

requires_gpu = pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU (runs on the H200 "
                                  "device machine: python3 -m pytest tests/test_ptx.py)")
simulator_only = pytest.mark.skipif(not simulator_enabled(), reason="checks a simulator twin's "
                                    "diagnostics for code that is undefined behaviour on a GPU")

# The OCP E2M1 code table, written out independently of bw24nb.ptx.twins.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _random_i32(rng, n):
    return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)


def _dp4a_numpy(a, b, c):
    prod = a.view(np.int8).reshape(-1, 4).astype(np.int64) * b.view(np.int8).reshape(-1, 4)
    return mma_layout.wrap_int32(prod.sum(axis=1) + c)


# --- dp4a ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("linked", [False, True], ids=["inline", "linked"])
def test_dp4a_matches_numpy(rng, linked):
    n = 300
    a, b, c = _random_i32(rng, n), _random_i32(rng, n), _random_i32(rng, n)
    # Extremes: all bytes -128 (largest products) and an accumulator at the int32 edge (wraps).
    a[:2] = b[:2] = np.int32(-0x7F7F7F80)            # bytes 0x80 = -128
    c[0], c[1] = 2**31 - 1, -2**31
    out = probes.run_dp4a(a, b, c, linked=linked)
    np.testing.assert_array_equal(out, _dp4a_numpy(a, b, c))


def test_dp4a_us_matches_numpy(rng):
    n = 300
    a, b, c = _random_i32(rng, n), _random_i32(rng, n), _random_i32(rng, n)
    a[:2], b[:2] = np.int32(-1), np.int32(-0x7F7F7F80)   # bytes 255 (unsigned) x -128
    c[0], c[1] = 2**31 - 1, -2**31
    prod = a.view(np.uint8).reshape(-1, 4).astype(np.int64) * b.view(np.int8).reshape(-1, 4)
    np.testing.assert_array_equal(probes.run_dp4a_us(a, b, c),
                                  mma_layout.wrap_int32(prod.sum(axis=1) + c))


def test_byte_perm_picks_bytes(rng):
    n = 300
    a = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    # selectors with bit 3 of every nibble clear (the default mode this intrinsic documents)
    sel = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) & np.uint32(0x7777)
    sel[:4] = [0x4440, 0x4441, 0x4442, 0x4443]        # one byte of a, zero-extended (b = 0 there)
    b[:4] = 0
    src = a.astype(np.uint64) | (b.astype(np.uint64) << np.uint64(32))
    want = np.zeros(n, np.uint64)
    for i in range(4):
        k = (sel.astype(np.uint64) >> np.uint64(4 * i)) & np.uint64(7)
        want |= ((src >> (np.uint64(8) * k)) & np.uint64(0xFF)) << np.uint64(8 * i)
    got = probes.run_byte_perm(a, b, sel)
    np.testing.assert_array_equal(got, want.astype(np.uint32))
    np.testing.assert_array_equal(got[:4], [(int(a[i]) >> (8 * i)) & 0xFF for i in range(4)])


# --- mma.sync m16n8k32 s8 -------------------------------------------------------------------------

def _random_tiles(rng, tiles, k):
    a = rng.integers(-128, 128, (tiles, 16, k)).astype(np.int8)
    b = rng.integers(-128, 128, (tiles, k, 8)).astype(np.int8)
    c = _random_i32(rng, tiles * 128).reshape(tiles, 16, 8)
    return a, b, c


def test_mma_layout_packing_is_a_bijection(rng):
    a = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    b = rng.integers(-128, 128, (32, 8)).astype(np.int8)
    c = _random_i32(rng, 128).reshape(16, 8)
    np.testing.assert_array_equal(mma_layout.unpack_a(mma_layout.pack_a(a)), a)
    np.testing.assert_array_equal(mma_layout.unpack_b(mma_layout.pack_b(b)), b)
    np.testing.assert_array_equal(mma_layout.unpack_c(mma_layout.pack_c(c)), c)
    # every element owned by exactly one (lane, slot)
    for coords, shape, slots in ((mma_layout.a_coords, (16, 32), 16),
                                 (mma_layout.b_coords, (32, 8), 8),
                                 (mma_layout.c_coords, (16, 8), 4)):
        owners = np.zeros(shape, int)
        for lane in range(32):
            for i in range(slots):
                owners[coords(lane, i)] += 1
        assert (owners == 1).all()


def test_mma_layout_matches_ptx_isa_examples():
    # Spot values of the PTX ISA formulas (groupID = lane >> 2, threadID_in_group = lane % 4).
    assert mma_layout.a_coords(0, 0) == (0, 0)
    assert mma_layout.a_coords(5, 6) == (9, 6)       # g=1, t=1: a1 byte 2 -> row g+8, col 4t+2
    assert mma_layout.a_coords(31, 15) == (15, 31)   # g=7, t=3: a3 byte 3 -> row 15, col 16+12+3
    assert mma_layout.b_coords(6, 5) == (25, 1)      # g=1, t=2: b1 byte 1 -> k 16+8+1, n 1
    assert mma_layout.c_coords(7, 3) == (9, 7)       # g=1, t=3: c3 -> row 9, col 7


def test_mma_warp_twin_matches_matmul(rng):
    a, b, c = (x[0] for x in _random_tiles(rng, 1, 32))
    d = twins.mma_s8_m16n8k32_warp(mma_layout.pack_a(a), mma_layout.pack_b(b), mma_layout.pack_c(c))
    expect = a.astype(np.int64) @ b.astype(np.int64) + c
    np.testing.assert_array_equal(mma_layout.unpack_c(d), mma_layout.wrap_int32(expect))


@pytest.mark.parametrize("tiles,k", [(1, 32), (3, 64)])
def test_mma_kernel_tile_exact(rng, tiles, k):
    """Three tiles over two blocks of two warps each (one warp idle), two k-steps chained."""
    a, b, c = _random_tiles(rng, tiles, k)
    d = probes.run_mma(a, b, c)
    for t in range(tiles):
        expect = a[t].astype(np.int64) @ b[t].astype(np.int64) + c[t]
        np.testing.assert_array_equal(d[t], mma_layout.wrap_int32(expect))


def test_mma_kernel_accumulator_wraps(rng):
    # s32 accumulation without .satfinite wraps modulo 2^32 (PTX ISA: .satfinite is what clamps).
    a = np.full((1, 16, 32), 127, np.int8)
    b = np.full((1, 32, 8), 127, np.int8)
    c = np.full((1, 16, 8), 2**31 - 1000, np.int32)
    d = probes.run_mma(a, b, c)
    np.testing.assert_array_equal(d, np.full((1, 16, 8), -2**31 + 32 * 127 * 127 - 1000, np.int32))


# --- mma.sync m16n8k16 f16 -> f32, and the f16x2 pack ------------------------------------------

def _random_f16_tiles(rng, tiles, k):
    a = rng.standard_normal((tiles, 16, k)).astype(np.float16)
    b = rng.standard_normal((tiles, k, 8)).astype(np.float16)
    c = rng.standard_normal((tiles, 16, 8)).astype(np.float32)
    return a, b, c


def test_mma_f16_layout_matches_the_ptx_table():
    """Spot checks of the f16 fragment table against the PTX ISA's (m16n8k16, .f16)."""
    assert mma_layout.a_coords_f16(0, 0) == (0, 0)
    assert mma_layout.a_coords_f16(5, 3) == (9, 3)      # g=1, t=1: a1's high half
    assert mma_layout.a_coords_f16(5, 4) == (1, 10)     # a2's low half: col 8 + 2t
    assert mma_layout.a_coords_f16(31, 7) == (15, 15)
    assert mma_layout.b_coords_f16(6, 1) == (5, 1)      # g=1, t=2: b0's high half
    assert mma_layout.b_coords_f16(6, 2) == (12, 1)     # b1: k = 8 + 2t


def test_mma_f16_layout_packing_is_a_bijection(rng):
    a, b, c = (x[0] for x in _random_f16_tiles(rng, 1, 16))
    np.testing.assert_array_equal(mma_layout.unpack_a_f16(mma_layout.pack_a_f16(a)), a)
    np.testing.assert_array_equal(mma_layout.unpack_b_f16(mma_layout.pack_b_f16(b)), b)
    np.testing.assert_array_equal(mma_layout.unpack_c_f32(mma_layout.pack_c_f32(c)), c)


@pytest.mark.parametrize("tiles,k", [(1, 16), (3, 48)])
def test_mma_f16_kernel_tile(rng, tiles, k):
    """Three tiles over two blocks of two warps (one idle), three k-steps chained: within the
    float32 rounding of the chained accumulation (the tensor core's adder order is not
    specified; on the GPU the result must still be that close to the float64 product)."""
    a, b, c = _random_f16_tiles(rng, tiles, k)
    d = probes.run_mma_f16(a, b, c)
    for t in range(tiles):
        expect = a[t].astype(np.float64) @ b[t].astype(np.float64) + c[t]
        np.testing.assert_allclose(d[t], expect, rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    # a mutated fragment index must be seen: the transposed B gives another product
    wrong = a[0].astype(np.float64) @ b[0].astype(np.float64)[::-1] + c[0]
    assert not np.allclose(d[0], wrong, rtol=1e-3)


def test_f16_pack_rounds_to_nearest_even(rng):
    lo = np.concatenate([rng.standard_normal(200).astype(np.float32) * 100,
                         np.float32([1 + 2**-11, 1 + 3 * 2**-11, 70000.0, -0.0, np.inf])])
    hi = rng.standard_normal(lo.size).astype(np.float32)
    got = probes.run_f16_pack(lo, hi)
    expect = np.stack([lo.astype(np.float16), hi.astype(np.float16)], 1).view(np.uint32)[:, 0]
    np.testing.assert_array_equal(got, expect)
    assert got[200] & 0xFFFF == np.float16(1.0).view(np.uint16)            # tie -> even
    assert got[201] & 0xFFFF == np.float16(1 + 2**-9).view(np.uint16)       # tie -> even (up)
    assert got[202] & 0xFFFF == np.float16(np.inf).view(np.uint16)          # overflow -> inf


def test_mma_linked_tile_exact(rng):
    a, b, c = _random_tiles(rng, 2, 32)
    d = probes.run_mma(a, b, c, linked=True)
    for t in range(2):
        np.testing.assert_array_equal(d[t], mma_layout.mma_tile(a[t], b[t], c[t]))


@cuda.jit
def _staged_mma_kernel(d, a32, bt32, c):
    """4 warps share one A and B tile staged through shared memory; warp w adds c[w]."""
    sa = cuda.shared.array((16, 8), dtype=np.uint32)
    sb = cuda.shared.array((8, 8), dtype=np.uint32)
    tid = cuda.threadIdx.x
    sa[tid // 8, tid % 8] = a32[tid // 8, tid % 8]          # 128 threads, 128 words of A
    if tid < 64:
        sb[tid // 8, tid % 8] = bt32[tid // 8, tid % 8]
    cuda.syncthreads()
    w = tid // 32
    g = (tid % 32) // 4
    t = tid % 4
    d0, d1, d2, d3 = mma_s8_m16n8k32(
        sa[g, t], sa[g + 8, t], sa[g, 4 + t], sa[g + 8, 4 + t], sb[g, t], sb[g, 4 + t],
        c[w, g, 2 * t], c[w, g, 2 * t + 1], c[w, g + 8, 2 * t], c[w, g + 8, 2 * t + 1])
    d[w, g, 2 * t] = d0
    d[w, g, 2 * t + 1] = d1
    d[w, g + 8, 2 * t] = d2
    d[w, g + 8, 2 * t + 1] = d3


def test_mma_from_shared_memory_staging(rng):
    a, b, _ = _random_tiles(rng, 1, 32)
    c = _random_i32(rng, 4 * 128).reshape(4, 16, 8)
    d = np.full((4, 16, 8), 0x7F7F7F7F, np.int32)
    a32 = np.ascontiguousarray(a[0]).view(np.uint32)
    bt32 = np.ascontiguousarray(b[0].T).view(np.uint32)
    _staged_mma_kernel[1, 128](d, a32, bt32, c)
    for w in range(4):
        np.testing.assert_array_equal(d[w], mma_layout.mma_tile(a[0], b[0], c[w]))


@cuda.jit
def _divergent_mma_kernel(out):
    lane = cuda.threadIdx.x % 32
    if lane != 5:                     # lane 5 skips the collective: undefined on a GPU
        d0, d1, d2, d3 = mma_s8_m16n8k32(0, 0, 0, 0, 0, 0, 1, 2, 3, 4)
        out[cuda.threadIdx.x] = d0


@cuda.jit
def _syncthreads_instead_of_mma_kernel(out):
    lane = cuda.threadIdx.x % 32
    if lane == 3:
        cuda.syncthreads()
    else:
        d0, d1, d2, d3 = mma_s8_m16n8k32(0, 0, 0, 0, 0, 0, 1, 2, 3, 4)
        out[cuda.threadIdx.x] = d0
        cuda.syncthreads()


@simulator_only
def test_mma_twin_reports_lane_parked_in_syncthreads():
    with pytest.raises(twins.WarpCollectiveError, match="lane 3 .* syncthreads"):
        _syncthreads_instead_of_mma_kernel[1, 32](np.zeros(32, np.int32))


@simulator_only
def test_mma_twin_reports_divergent_warp():
    with pytest.raises(twins.WarpCollectiveError, match="lane 5"):
        _divergent_mma_kernel[1, 32](np.zeros(32, np.int32))


@simulator_only
def test_mma_twin_reports_partial_warp():
    with pytest.raises(twins.WarpCollectiveError, match="partial warp"):
        _divergent_mma_kernel[1, 16](np.zeros(16, np.int32))


def test_mma_twin_outside_a_kernel_says_what_to_use():
    with pytest.raises(twins.WarpCollectiveError, match="mma_s8_m16n8k32_warp"):
        twins.mma_s8_m16n8k32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


# --- FP4 E2M1 -------------------------------------------------------------------------------------

def test_fp4_decode_all_codes():
    codes = np.arange(256, dtype=np.uint8)                 # every (low, high) pair of codes
    f16x2, f32x2, f32 = probes.run_fp4(codes)
    lo = np.array([E2M1[x & 0xF] for x in range(256)], np.float32)
    hi = np.array([E2M1[x >> 4] for x in range(256)], np.float32)
    pair = np.stack([lo, hi], axis=1).reshape(-1)
    for got in (f32x2, f32):
        np.testing.assert_array_equal(got, pair)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(pair))   # -0 stays -0
    expect_bits = (lo.astype(np.float16).view(np.uint16).astype(np.uint32)
                   | hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)
    np.testing.assert_array_equal(f16x2, expect_bits)


def test_fp4_linked_bit_path_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    got = probes.run_fp4_linked(codes)
    expect = np.array([int(twins.fp4x2_to_f16x2(x)) for x in range(256)], np.uint32)
    np.testing.assert_array_equal(got, expect)


# --- ld.global.nc.v4.u32 --------------------------------------------------------------------------

def test_ld_nc_v4_copies(rng):
    src = rng.integers(0, 2**32, 4 * 77, dtype=np.uint64).astype(np.uint32)
    np.testing.assert_array_equal(probes.run_ld_nc_v4(src), src)


def test_ld_nc_v4_twin_faults_on_misalignment():
    arr = np.arange(16, dtype=np.uint32)
    assert twins.ld_nc_v4_u32(arr, 8) == (8, 9, 10, 11)
    with pytest.raises(ValueError, match="multiple of 4"):
        twins.ld_nc_v4_u32(arr, 2)
    with pytest.raises(IndexError):
        twins.ld_nc_v4_u32(arr, 16)


def test_cp_async_copies_through_shared_memory(rng):
    src = rng.integers(0, 2**32, 256 * 3, dtype=np.uint64).astype(np.uint32)
    np.testing.assert_array_equal(probes.run_cp_async(src), src)


def test_cp_async_twin_faults_on_misalignment_and_bounds():
    dst, src = np.zeros(8, np.uint32), np.arange(16, dtype=np.uint32)
    twins.cp_async_16(dst, 4, src, 12)
    assert list(dst) == [0, 0, 0, 0, 12, 13, 14, 15]
    with pytest.raises(ValueError, match="multiple of 4"):
        twins.cp_async_16(dst, 2, src, 0)
    with pytest.raises(IndexError):
        twins.cp_async_16(dst, 8, src, 0)
    f = np.zeros(4, np.float32)
    twins.cp_async_16(f, 0, np.arange(4, dtype=np.float32), 0)
    assert list(f) == [0.0, 1.0, 2.0, 3.0]


def test_ld_nc_v2_copies(rng):
    src = rng.standard_normal(2 * 77).astype(np.float32)
    np.testing.assert_array_equal(probes.run_ld_nc_v2(src).view(np.uint32), src.view(np.uint32))


def test_ld_nc_v2_twin_faults_on_misalignment():
    arr = np.arange(6, dtype=np.float32)
    assert twins.ld_nc_v2_f32(arr, 4) == (4.0, 5.0)
    with pytest.raises(ValueError, match="multiple of 2"):
        twins.ld_nc_v2_f32(arr, 1)
    with pytest.raises(IndexError):
        twins.ld_nc_v2_f32(arr, 6)


def test_ld_v4_twin_faults_on_misalignment():
    arr = np.arange(12, dtype=np.float32)
    assert twins.ld_v4_f32(arr, 8) == (8.0, 9.0, 10.0, 11.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        twins.ld_v4_f32(arr, 2)
    with pytest.raises(IndexError):
        twins.ld_v4_f32(arr, 12)
    off = twins._aligned_empty(13, np.float32, 16)[1:]        # a base 4 bytes past 16
    with pytest.raises(ValueError, match="16-byte aligned"):
        twins.ld_v4_f32(off, 0)


# --- the .ptx files and their @inline blocks ------------------------------------------------------

def test_snippets_hold_the_expected_instructions():
    assert snippet("dp4a_s32").opcodes == ("dp4a.s32.s32",)
    assert snippet("mma_m16n8k32_s8").opcodes == ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",)
    assert snippet("ld_nc_v4_u32").opcodes == ("ld.global.nc.v4.u32",)
    assert snippet("ld_nc_v2_f32").opcodes == ("ld.global.nc.v2.f32",)
    assert snippet("dp4a_us").opcodes == ("dp4a.u32.s32",)
    assert snippet("prmt_b32").opcodes == ("prmt.b32",)
    assert snippet("ld_nc_v2_f32").constraints == "=f,=f,l"
    assert "cvt.rn.f16x2.e2m1x2" in snippet("fp4x2_to_f16x2_cvt").opcodes
    assert snippet("fp4x2_to_f16x2_bits").opcodes[-1] == "mul.rn.f16x2"
    assert snippet("dp4a_s32").asm_template == "dp4a.s32.s32 $0, $1, $2, $3;"
    assert snippet("dp4a_s32").constraints == "=r,r,r,r"
    assert snippet("ld_nc_v4_u32").constraints == "=r,=r,=r,=r,l"
    # an instruction without operands: an empty header list, an empty constraint string
    assert snippet("grid_dependency_wait").opcodes == ("griddepcontrol.wait",)
    assert snippet("grid_dependency_wait").operands == ()
    assert snippet("grid_dependency_wait").asm_template == "griddepcontrol.wait;"
    assert snippet("cp_async_16").opcodes[-1] == "cp.async.cg.shared.global"
    assert snippet("cp_async_16").constraints == "l,l"
    assert snippet("cp_async_wait_1").asm_template == "cp.async.wait_group 1;"


def test_every_ptx_file_defines_funcs_around_its_blocks():
    names = set(all_snippets())
    assert {"dp4a_s32", "mma_m16n8k32_s8", "fp4x2_to_f16x2_bits", "fp4x2_to_f16x2_cvt",
            "f16x2_to_f32x2", "ld_nc_v4_u32", "ld_nc_v2_f32", "dp4a_us", "prmt_b32",
            "grid_dependency_wait"} <= names
    for snip in all_snippets().values():
        text = snip.path.read_text()
        assert ".visible .func" in text and ".target sm_" in text and ".version" in text


@pytest.mark.parametrize("block,message", [
    ("// @inline x: =r %d0, r %a0\nadd.s32 %d0, %a0, 1;\n", "no '// @end'"),
    ("// @inline x: =r %d0, r %a0\nadd.s32 %d0, %d0, 1;\n// @end\n", "not used"),
    ("// @inline x: r %a0, =r %d0\nadd.s32 %d0, %a0, 1;\n// @end\n", "before inputs"),
    ("// @inline x: =r %d0, r %a0\nadd.s32 %d0, %a0, %r5;\n// @end\n", "%r5"),
    ("// @inline x: =q %d0, r %a0\nadd.s32 %d0, %a0, 1;\n// @end\n", "constraint"),
    ("// @inline x: =r %d0,\nmov.b32 %d0, 1;\n// @end\n", "operand ''"),
])
def test_malformed_blocks_are_rejected(tmp_path, block, message):
    path = tmp_path / "bad.ptx"
    path.write_text(block)
    with pytest.raises(SnippetError, match=message):
        parse_snippets(path)


def test_cluster_snippets():
    """cluster.ptx: the cluster's special registers read by name, its barrier steps, and the
    store into another block's shared memory (a generic address mapped with mapa)."""
    assert snippet("cluster_rank").asm_template == "mov.u32 $0, %cluster_ctarank;"
    assert snippet("cluster_size").asm_template == "mov.u32 $0, %cluster_nctarank;"
    assert snippet("cluster_arrive_relaxed").opcodes == ("barrier.cluster.arrive.relaxed.aligned",)
    assert snippet("cluster_arrive_release").opcodes == ("barrier.cluster.arrive.release.aligned",)
    assert snippet("cluster_wait_acquire").opcodes == ("barrier.cluster.wait.acquire.aligned",)
    st = snippet("st_cluster_f32")
    assert st.constraints == "l,r,f"
    assert st.opcodes[-2:] == ("mapa.shared::cluster.u32", "st.shared::cluster.f32")


def test_named_barrier_snippet_and_slots_on_their_own_barriers(rng):
    """bar_sync.ptx: ``bar.sync a, b`` with both operands in registers; the probe's two slots
    each rotate their values through shared memory on their own barrier, one twice as often
    as the other -- the twin (and the GPU) pair each slot's barriers among its own threads.
    A count that is no multiple of 32 is refused by the twin."""
    bar = snippet("bar_sync")
    assert bar.asm_template == "bar.sync $0, $1;" and bar.constraints == "r,r"
    vals = rng.standard_normal(3 * probes.SLOTS * probes.THREADS).astype(np.float32)
    np.testing.assert_array_equal(probes.run_slot_rotate(vals), probes.slot_rotate_reference(vals))
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        from numba import cuda

        from bw24nb.ptx import bar_sync

        @cuda.jit
        def odd(out):
            bar_sync(1, 48)
            out[cuda.threadIdx.x] = 1

        with pytest.raises(ValueError, match="multiple of 32"):
            odd[1, 64](cuda.to_device(np.zeros(64, np.int32)))


def test_cluster_gather_runs_as_clusters_of_one_in_the_simulator(rng):
    """The probe of the cluster snippets: launched without clusters (the simulator's only
    way), every block is rank 0 of a cluster of one and gathers its own values; asking the
    simulator for a cluster launch is an error that says so."""
    vals = rng.standard_normal(3 * probes.THREADS).astype(np.float32)
    out, ranks = probes.run_cluster_gather(vals, 1)
    np.testing.assert_array_equal(out, vals)
    np.testing.assert_array_equal(ranks, [0, 1] * 3)
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        with pytest.raises(RuntimeError, match="the simulator runs no clusters"):
            probes.run_cluster_gather(np.zeros(2 * probes.THREADS, np.float32), 2)
    from bw24nb.jit import launch_cluster
    with pytest.raises(ValueError, match=r"grid \(3, 1, 1\) is not whole clusters of 2"):
        launch_cluster(probes.cluster_gather_kernel, (3,), probes.THREADS, 2, 0)
    with pytest.raises(ValueError, match=r"clusters of 1 \.\. 8 blocks \(portable\), not 16"):
        launch_cluster(probes.cluster_gather_kernel, (16,), probes.THREADS, 16, 0)
    with pytest.raises(ValueError, match=r"1 \.\. 16 blocks \(non-portable\), not 32"):
        launch_cluster(probes.cluster_gather_kernel, (32,), probes.THREADS, 32, 0,
                       non_portable=True)


@requires_gpu
@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_gpu_cluster_gather(rng, cluster):
    """On the GPU (sm_90+), clusters of 2 .. 8 blocks: each block's values land in rank 0's
    shared memory at its rank's slots, every block knows its rank and the cluster's size."""
    blocks = 2 * cluster
    vals = rng.standard_normal(blocks * probes.THREADS).astype(np.float32)
    out, ranks = probes.run_cluster_gather(vals, cluster)
    for c in range(0, blocks, cluster):
        lo, hi = c * probes.THREADS, (c + cluster) * probes.THREADS
        np.testing.assert_array_equal(out[lo:hi], vals[lo:hi])
    np.testing.assert_array_equal(ranks.reshape(-1, 2),
                                  [[b % cluster, cluster] for b in range(blocks)])


def test_timer_blocks_read_special_registers_by_name(tmp_path):
    """timers.ptx: %clock64 / %globaltimer are read by name (the only special registers a
    block may name); any other undeclared register is still an error."""
    assert snippet("clock64").asm_template == "mov.u64 $0, %clock64;"
    assert snippet("global_timer").asm_template == "mov.u64 $0, %globaltimer;"
    assert snippet("clock64").constraints == "=l"
    path = tmp_path / "lane.ptx"
    path.write_text("// @inline x: =r %d0\nmov.u32 %d0, %laneid;\n// @end\n")
    with pytest.raises(SnippetError, match="%laneid"):
        parse_snippets(path)


# --- GPU: the real snippets against the twins -----------------------------------------------------

@requires_gpu
def test_gpu_snippets_equal_twins(rng):
    n = 256
    a, b, c = _random_i32(rng, n), _random_i32(rng, n), _random_i32(rng, n)
    twin = np.array([twins.dp4a(x, y, z) for x, y, z in zip(a, b, c)], np.int32)
    np.testing.assert_array_equal(probes.run_dp4a(a, b, c), twin)
    np.testing.assert_array_equal(probes.run_dp4a(a, b, c, linked=True), twin)

    af, bf, cf = _random_f16_tiles(rng, 4, 64)
    np.testing.assert_allclose(     # the real f16 MMA: the float64 product to float32 rounding
        probes.run_mma_f16(af, bf, cf), af.astype(np.float64) @ bf.astype(np.float64) + cf,
        rtol=1e-5, atol=1e-4)
    lo, hi = (rng.standard_normal(256).astype(np.float32) * 300 for _ in range(2))
    np.testing.assert_array_equal(probes.run_f16_pack(lo, hi),
                                  [twins.f32x2_to_f16x2(x, y) for x, y in zip(lo, hi)])

    at, bt, ct = _random_tiles(rng, 4, 32)
    d = probes.run_mma(at, bt, ct)
    for t in range(4):
        frags = twins.mma_s8_m16n8k32_warp(mma_layout.pack_a(at[t]), mma_layout.pack_b(bt[t]),
                                           mma_layout.pack_c(ct[t]))
        np.testing.assert_array_equal(d[t], mma_layout.unpack_c(frags))

    codes = np.arange(256, dtype=np.uint8)
    f16x2, f32x2, f32 = probes.run_fp4(codes)
    np.testing.assert_array_equal(f16x2, [twins.fp4x2_to_f16x2(x) for x in codes])
    np.testing.assert_array_equal(f32x2, np.array([twins.fp4x2_to_f32x2(x) for x in codes]).reshape(-1))

    src = rng.integers(0, 2**32, 4 * 1000, dtype=np.uint64).astype(np.uint32)
    got = probes.run_ld_nc_v4(src)
    for j in range(0, src.size, 4):
        assert tuple(got[j:j + 4]) == twins.ld_nc_v4_u32(src, j)


def test_simulator_flag_is_consistent():
    # The selection in bw24nb/ptx/__init__.py follows NUMBA_ENABLE_CUDASIM, nothing else.
    import bw24nb.ptx as ptx
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    assert (ptx.dp4a is twins.dp4a) == sim
    assert (ptx.mma_s8_m16n8k32 is twins.mma_s8_m16n8k32) == sim


def test_ptx_files_are_ascii():
    """ptxas rejects any non-ASCII byte, comments included (seen on the H200: 'Unexpected
    non-ASCII character encountered on line 12' for an em dash in dp4a.ptx)."""
    import pathlib
    for path in pathlib.Path(__file__).resolve().parents[1].joinpath("bw24nb", "ptx").glob("*.ptx"):
        data = path.read_bytes()
        bad = [i for i, b in enumerate(data) if b > 127]
        assert not bad, f"{path.name}: non-ASCII byte at offset {bad[0]}"


def test_warp_max_twin_gives_every_lane_the_maximum():
    """warp_max (simulator twin here): every lane gets the warp's largest value, -inf included."""
    from bw24nb.ptx import warp_max

    @cuda.jit
    def k(x, out):
        i = cuda.grid(1)
        out[i] = warp_max(x[i])

    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    x[40:] = -np.inf
    x[45] = 7.5
    out = cuda.device_array(64, np.float32)
    k[1, 64](cuda.to_device(x), out)
    got = out.copy_to_host()
    assert np.all(got[:32] == x[:32].max()) and np.all(got[32:] == np.float32(7.5))


def _each_lane(fn, seed):
    """(x, out): fn(x[i]) in every thread of a 64-thread block, x random float32[64]."""
    @cuda.jit
    def k(x, out):
        i = cuda.grid(1)
        out[i] = fn(x[i])

    x = np.random.default_rng(seed).standard_normal(64).astype(np.float32) * np.float32(1e3)
    out = cuda.device_array(64, np.float32)
    k[1, 64](cuda.to_device(x), out)
    return x, out.copy_to_host()


def test_warp_pair_sum_gives_both_lanes_of_a_pair_their_sum():
    """warp_pair_sum (the delta rule's half-column sums): lane l gets x_l + x_(l ^ 16), one
    float32 rounding, the same bits on both lanes of the pair; per warp of a 64-thread block."""
    from bw24nb.ptx import warp_pair_sum
    x, got = _each_lane(warp_pair_sum, 5)
    partner = (np.arange(64) & ~31) | ((np.arange(64) & 31) ^ 16)
    np.testing.assert_array_equal(got, (x + x[partner]).astype(np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), got[partner].view(np.uint32))


@pytest.mark.parametrize("width", [16, 8])
def test_warp_sum16_and_8_sum_each_group_of_lanes(width):
    """warp_sum16 / warp_sum8 (rows on part of a warp, kernels/matvec.py): every lane gets its
    group's tree sum (offsets width / 2 .. 1), and with the rest of the warp +0.0 that is
    warp_sum's value bit for bit; per warp of a 64-thread block."""
    from bw24nb.ptx import warp_sum8, warp_sum16
    from bw24nb.ptx.warp import warp_tree_sum_host
    x, got = _each_lane(warp_sum16 if width == 16 else warp_sum8, 6)
    for g in range(64 // width):
        lanes = x[g * width:(g + 1) * width]
        alone = np.zeros(32, np.float32)
        alone[:width] = lanes
        want = warp_tree_sum_host(alone)         # the whole warp's sum, the others +0.0
        np.testing.assert_array_equal(got[g * width:(g + 1) * width].view(np.uint32),
                                      np.full(width, want, np.float32).view(np.uint32))


@cuda.jit
def _two_shared_arrays(out):
    a = cuda.shared.array(256, np.float32)
    b = cuda.shared.array(256, np.float32)
    i = cuda.threadIdx.x
    a[i] = np.float32(i)
    b[i] = np.float32(-1.0)
    cuda.syncthreads()
    if i == 0:
        s = np.float32(0.0)
        for j in range(256):
            s += a[j]
        out[0] = s
        out[1] = b[255]


@cuda.jit
def _aligned_shared_array(out):
    a = cuda.shared.array(64, np.float32, alignment=16)
    i = cuda.threadIdx.x
    a[i] = np.float32(i)
    cuda.syncthreads()
    if i % 4 == 0:
        v = ld_v4_f32(a, i)
        out[i // 4] = v[0] + v[1] + v[2] + v[3]


def test_aligned_shared_array_takes_16_byte_loads():
    """A shared array declared with alignment=16 (decode attention's q rows) takes ld_v4_f32
    (LDS.128) on the GPU and in the simulator, where the twin checks the address."""
    out = cuda.to_device(np.zeros(16, np.float32))
    _aligned_shared_array[1, 64](out)
    np.testing.assert_array_equal(out.copy_to_host(),
                                  [16 * g + 6 for g in range(16)])


def test_simulated_shared_array_alignment_is_checked():
    """The simulator's shared arrays honour `alignment` as numba does on the GPU: a power of
    two and a multiple of 8, the data starting on a multiple of it."""
    for al in (8, 16, 64, 256):
        a = twins._aligned_empty((3, 5), np.float32, al)
        assert a.shape == (3, 5) and a.ctypes.data % al == 0
    with pytest.raises(ValueError, match="alignment"):
        twins._shared_array(None, 4, np.float32, alignment=12)


@simulator_only
def test_simulated_shared_arrays_are_one_per_line_and_block():
    """twins.install_simulator_fixes: every thread of a block gets the same array for a line
    (thread 0 sums what all 256 wrote), and two lines get two arrays (no aliasing); run a few
    times, since numba's unlocked allocation failed only now and then."""
    from numba.cuda.simulator import kernelapi
    assert kernelapi.FakeCUDAShared.array is twins._shared_array
    for _ in range(3):
        out = cuda.to_device(np.zeros(2, np.float32))
        _two_shared_arrays[1, 256](out)
        assert list(out.copy_to_host()) == [sum(range(256)), -1.0]


def test_prefetch_l2_bulk_twin_checks_the_range():
    """The simulator twin of cp.async.bulk.prefetch.L2 demands what the instruction does: a
    16-byte aligned start and length, positive, inside the array; prefetch_bytes widens and
    cuts any byte range to that."""
    from bw24nb.ptx.twins import prefetch_l2_bulk
    a = np.zeros(40, np.uint32)                 # 160 bytes
    prefetch_l2_bulk(a, 16, 144)
    for off, n in ((8, 16), (16, 8), (0, 0), (16, 160), (-16, 32)):
        with pytest.raises(IndexError, match="prefetch_l2_bulk"):
            prefetch_l2_bulk(a, off, n)


def test_fma_f32_rounds_once():
    """fma_f32(a, b, c) rounds a * b + c once: with a = b = 1 + 2^-12 and c = -1 the exact
    result 2^-11 + 2^-24 is a float32, while rounding the product first loses the 2^-24."""
    a = np.float32(1.0 + 2.0 ** -12)
    assert twins.fma_f32(a, a, np.float32(-1.0)) == np.float32(2.0 ** -11 + 2.0 ** -24)
    assert np.float32(a * a) - np.float32(1.0) == np.float32(2.0 ** -11)


def test_fma_f32_in_a_kernel(rng):
    """The name bw24nb.ptx exports (the twin here, libdevice's fmaf_rn on a GPU) inside a
    kernel, against the once-rounded float64 value."""
    from bw24nb.ptx import fma_f32

    @cuda.jit
    def kern(out, a, b, c):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fma_f32(a[i], b[i], c[i])

    a, b, c = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    out = cuda.to_device(np.full(64, np.nan, np.float32))
    kern[1, 64](out, cuda.to_device(a), cuda.to_device(b), cuda.to_device(c))
    want = (a.astype(np.float64) * b + c).astype(np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), want)
