"""Where does the Q4_K decode matvec's time go? Diagnostic variants of matvec_q4k, timed side
by side on the GPU (bench/matvec_bench.py's method: one CUDA graph of N launches rotating over
enough weight copies that every launch reads HBM; per-launch time includes the graph gap).

    python3 bench/q4k_probe.py [--shapes 12288x4096,4096x12288,4096x4096] [--variants a,b]
                               [--out PATH]

Variants (`lib` is the library kernel; the others are built here, from its device functions):
  lib        matvec_q4k.matvec_q8_q4_k_v4 through launch_matvec_q8 (what the engine runs)
  same       this file's copy of the kernel of sessions 5-13 (factory below with no knob
             turned): must equal `lib`, the library's session-14 formulation, bit for bit
  noscale    DIAGNOSTIC, wrong values: sub-block scales/mins not decoded (sc = m = 1)
  nosums     DIAGNOSTIC, wrong values: the activation-sum dp4a skipped (sxa = sxb = 0)
  loads      DIAGNOSTIC, wrong values: the same loads, values folded with xor (the memory floor
             of this access pattern)
  w8         `same` with 8 warps a block instead of 4
  rows2      each warp computes 2 output rows (8 chunk loads a lane in flight), same order
  hoist      every load of a lane's 4 chunks issued before their arithmetic, same order
  bytewise   the scale decode before session 5 (each sub-block's (sc, m) byte by byte, chunk
             position from c): the side-by-side row for the word-parallel decode in `same`
  pf_own     `same`, each warp first prefetching its whole row into L2 (prefetch.global.L2)
  pf_next    `same`, each warp prefetching the row one wave of resident warps further on (so
             DRAM keeps streaming across the waves); pf_next2 two waves on; pf_both both
  sums       the activation sums of the min term read from a precomputed int32 array (one
             per 16 values) instead of 8 dp4a a chunk: the same integers, so the same bits
  xreg       matvec_q4k's persistent kernel (session 19, decision 0026: warps looping over
             rows, a lane's activation words, sums and scales loaded once into registers) on
             SMs x 8 blocks -- `lib` itself when matvec_q4k.XREG is on; the same sums in the
             same order as `lib` at one warp a row: must match it bit for bit
  xreg_db    with the next row's weight words loaded a row ahead (matvec_q4k.XREG_DB)
  xreg_b4    on SMs x 4 blocks; xreg_db_b4 both
  (session 19's call 3 ran the probe's own copy of these, the same arithmetic, since folded
  into matvec_q4k)
The diagnostic rows answer "is the kernel ALU- or latency-bound?"; only `same`, `w8`, `rows2`,
`rows2_w8`, `hoist`, `sums`, `bytewise` and the `xreg` kernels are candidate kernels, and they
must match `lib` bit for bit (checked, printed).

Appends JSON lines (date, gpu, commit, shape, variant, us, GB/s, pct of the read roofline
measured in the same run, regs) to --out (default $OUT/q4k_probe.jsonl).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.kernels import matvec_q4k as q4  # noqa: E402
from bw24nb.kernels.dequant import random_weight_bytes, weight_views  # noqa: E402
from bw24nb.kernels.matvec import keep, launch_matvec_q8  # noqa: E402
from bw24nb.kernels.quantize_act import launch_quantize_act  # noqa: E402
from bw24nb.ptx import ld_nc_v4_u32, prefetch_l2, warp_sum  # noqa: E402
from bw24nb.quant import QType  # noqa: E402
from bw24nb.quant.types import row_bytes  # noqa: E402
from matvec_bench import L2_BYTES, STREAM_FACTOR, _commit, event_ms, read_roofline_gbs  # noqa: E402

_LOW = q4._LOW
_ONES = q4._ONES


@cuda.jit(device=True, inline="always")
def _scale_byte_old(s0, s1, s2, k):
    w = s0 if k < 4 else (s1 if k < 8 else s2)
    return np.int32((w >> np.uint32(8 * (k & 3))) & np.uint32(255))


@cuda.jit(device=True, inline="always")
def _scale_min_old(s0, s1, s2, j):
    """The session-2..4 library decode: one sub-block's (sc, m), byte by byte."""
    if j < 4:
        sc = _scale_byte_old(s0, s1, s2, j) & 63
        m = _scale_byte_old(s0, s1, s2, j + 4) & 63
    else:
        c = _scale_byte_old(s0, s1, s2, j + 4)
        sc = (c & 15) | ((_scale_byte_old(s0, s1, s2, j - 4) >> 6) << 4)
        m = (c >> 4) | ((_scale_byte_old(s0, s1, s2, j) >> 6) << 4)
    return sc, m


@cuda.jit(device=True, inline="always")
def _words(w32, row_word, c):
    """Chunk c's weight words as the kernel of sessions 5-13 loaded them: (s0, s1, s2) the
    packed scales, (q0..q3) the quants. The variants below are built on that kernel; since
    session 14 matvec_q4k's `_chunk_weights` also decodes them (decision 0020), so `lib` and
    `same` are two formulations of one order, and must still agree bit for bit."""
    b = c >> 3
    p = (c & 7) >> 1
    h = c & 1
    blk = row_word + b * q4.Q4_K_WORDS
    _hdr, s0, s1, s2 = ld_nc_v4_u32(w32, blk)
    q0, q1, q2, q3 = ld_nc_v4_u32(w32, blk + 4 + 8 * p + 4 * h)
    return s0, s1, s2, q0, q1, q2, q3


def make(noscale=False, nosums=False, loads=False, rows_per_warp=1, warps=4, hoist=False,
         sums=False, bytewise=False, pf_own=False, pf_next=0):
    W = warps
    R = rows_per_warp
    PF_OWN = pf_own          # prefetch the warp's own row into L2 before its loads
    PF_NEXT = pf_next        # ... and the row pf_next x (SMs x 10 warps) rows further on

    @cuda.jit(device=True, inline="always")
    def chunk_loads(w32, wh, xq, xd, row_word, c):
        # every load of chunk c, before any arithmetic (the `hoist` variant)
        s0, s1, s2, q0, q1, q2, q3 = _words(w32, row_word, c)
        b = c >> 3
        p = (c & 7) >> 1
        h = c & 1
        blk = row_word + b * q4.Q4_K_WORDS
        e = b * 256 + 64 * p + 16 * h
        a = ld_nc_v4_u32(xq, e >> 2)
        bb = ld_nc_v4_u32(xq, (e + 32) >> 2)
        return (s0, s1, s2, q0, q1, q2, q3, a, bb, xd[e >> 5], xd[(e + 32) >> 5],
                wh[2 * blk], wh[2 * blk + 1])

    @cuda.jit(device=True, inline="always")
    def chunk_math(L, c):
        s0, s1, s2, q0, q1, q2, q3, a, bb, xda, xdb, dh, dminh = L
        a0, a1, a2, a3 = a
        b0, b1, b2, b3 = bb
        p = (c & 7) >> 1
        d = np.float32(dh)
        dmin = np.float32(dminh)
        sc_a, m_a, sc_b, m_b = q4.pair_scales(s0, s1, s2, p)
        sa = q4._dot4(q0 & _LOW, q1 & _LOW, q2 & _LOW, q3 & _LOW, a0, a1, a2, a3)
        sb = q4._dot4((q0 >> np.uint32(4)) & _LOW, (q1 >> np.uint32(4)) & _LOW,
                      (q2 >> np.uint32(4)) & _LOW, (q3 >> np.uint32(4)) & _LOW, b0, b1, b2, b3)
        sxa = q4._dot4(_ONES, _ONES, _ONES, _ONES, a0, a1, a2, a3)
        sxb = q4._dot4(_ONES, _ONES, _ONES, _ONES, b0, b1, b2, b3)
        va = xda * ((d * np.float32(sc_a)) * np.float32(sa) - (dmin * np.float32(m_a)) * np.float32(sxa))
        vb = xdb * ((d * np.float32(sc_b)) * np.float32(sb) - (dmin * np.float32(m_b)) * np.float32(sxb))
        return va + vb

    @cuda.jit(device=True, inline="always")
    def chunk_value(wh, xq, xd, xs, row_word, c, wq):
        s0, s1, s2, q0, q1, q2, q3 = wq
        b = c >> 3
        p = (c & 7) >> 1
        h = c & 1
        blk = row_word + b * q4.Q4_K_WORDS
        e = b * 256 + 64 * p + 16 * h
        a0, a1, a2, a3 = ld_nc_v4_u32(xq, e >> 2)
        b0, b1, b2, b3 = ld_nc_v4_u32(xq, (e + 32) >> 2)
        if loads:
            z = (s0 ^ s1 ^ s2 ^ q0 ^ q1 ^ q2 ^ q3 ^ a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1 ^ b2 ^ b3)
            return np.float32(z & np.uint32(255)) + xd[e >> 5]
        d = np.float32(wh[2 * blk])
        dmin = np.float32(wh[2 * blk + 1])
        if noscale:
            sc_a = np.int32(1)
            m_a = np.int32(1)
            sc_b = np.int32(1)
            m_b = np.int32(1)
        elif bytewise:
            pc = (c & 7) >> 1
            sc_a, m_a = _scale_min_old(s0, s1, s2, 2 * pc)
            sc_b, m_b = _scale_min_old(s0, s1, s2, 2 * pc + 1)
        else:
            sc_a, m_a, sc_b, m_b = q4.pair_scales(s0, s1, s2, p)
        sa = q4._dot4(q0 & _LOW, q1 & _LOW, q2 & _LOW, q3 & _LOW, a0, a1, a2, a3)
        sb = q4._dot4((q0 >> np.uint32(4)) & _LOW, (q1 >> np.uint32(4)) & _LOW,
                      (q2 >> np.uint32(4)) & _LOW, (q3 >> np.uint32(4)) & _LOW, b0, b1, b2, b3)
        if nosums:
            sxa = np.int32(0)
            sxb = np.int32(0)
        elif sums:
            sxa = xs[e >> 4]
            sxb = xs[(e + 32) >> 4]
        else:
            sxa = q4._dot4(_ONES, _ONES, _ONES, _ONES, a0, a1, a2, a3)
            sxb = q4._dot4(_ONES, _ONES, _ONES, _ONES, b0, b1, b2, b3)
        va = xd[e >> 5] * ((d * np.float32(sc_a)) * np.float32(sa)
                           - (dmin * np.float32(m_a)) * np.float32(sxa))
        vb = xd[(e + 32) >> 5] * ((d * np.float32(sc_b)) * np.float32(sb)
                                  - (dmin * np.float32(m_b)) * np.float32(sxb))
        return va + vb

    @cuda.jit(device=True, inline="always")
    def row_acc(w32, wh, xq, xd, xs, row_word, c, stride, last, nchunk):
        c1 = min(c + stride, last)
        c2 = min(c + 2 * stride, last)
        c3 = min(c + 3 * stride, last)
        if hoist:
            L0 = chunk_loads(w32, wh, xq, xd, row_word, c)
            L1 = chunk_loads(w32, wh, xq, xd, row_word, c1)
            L2 = chunk_loads(w32, wh, xq, xd, row_word, c2)
            L3 = chunk_loads(w32, wh, xq, xd, row_word, c3)
            v0 = chunk_math(L0, c)
            v1 = chunk_math(L1, c1)
            v2 = chunk_math(L2, c2)
            v3 = chunk_math(L3, c3)
        else:
            v0 = chunk_value(wh, xq, xd, xs, row_word, c, _words(w32, row_word, c))
            v1 = chunk_value(wh, xq, xd, xs, row_word, c1, _words(w32, row_word, c1))
            v2 = chunk_value(wh, xq, xd, xs, row_word, c2, _words(w32, row_word, c2))
            v3 = chunk_value(wh, xq, xd, xs, row_word, c3, _words(w32, row_word, c3))
        return v0, keep(v1, c + stride, nchunk), keep(v2, c + 2 * stride, nchunk), \
            keep(v3, c + 3 * stride, nchunk)

    @cuda.jit
    def kern(w32, wh, M, K, xq, xd, xs, y, dist):
        # parts = 1 only (the shapes here have >= 4096 rows); R rows a warp: row0 + r * nwarps
        lane = cuda.threadIdx.x & 31
        warp = cuda.blockIdx.x * W + (cuda.threadIdx.x >> 5)
        nwarps = cuda.gridDim.x * W
        nblk = K >> 8
        nchunk = nblk * q4.CHUNKS_PER_BLOCK
        last = nchunk - 1
        rw = np.int64(nblk * q4.Q4_K_WORDS)
        row0 = warp
        row1 = warp + nwarps
        if row0 >= M:
            return
        if PF_OWN:                  # 128-byte lines = 32 words; lanes take every 32nd line
            for wd in range(lane * 32, nblk * q4.Q4_K_WORDS, 1024):
                prefetch_l2(w32, row0 * rw + wd)
        if PF_NEXT:
            rn = row0 + dist
            if rn < M:
                for wd in range(lane * 32, nblk * q4.Q4_K_WORDS, 1024):
                    prefetch_l2(w32, rn * rw + wd)
        acc0 = np.float32(0.0)
        acc1 = np.float32(0.0)
        for c in range(lane, nchunk, 32 * 4):
            u0 = u1 = u2 = u3 = np.float32(0.0)
            if R == 2:
                r1 = min(row1, M - 1)
                u0, u1, u2, u3 = row_acc(w32, wh, xq, xd, xs, r1 * rw, c, 32, last, nchunk)
            t0, t1, t2, t3 = row_acc(w32, wh, xq, xd, xs, row0 * rw, c, 32, last, nchunk)
            acc0 += t0
            acc0 += t1
            acc0 += t2
            acc0 += t3
            if R == 2:
                acc1 += u0
                acc1 += u1
                acc1 += u2
                acc1 += u3
        t = warp_sum(acc0)
        if lane == 0:
            y[row0] = t
        if R == 2:
            t1 = warp_sum(acc1)
            if lane == 0 and row1 < M:
                y[row1] = t1

    def launch(w8, M, K, xq, xd, xs, y, stream):
        w32 = w8.view(np.uint32)
        wh = w8.view(np.float16)
        nw = (M + R - 1) // R
        dist = PF_NEXT * SMS * 40      # ~ the warps resident at once (48 registers: 40 an SM)
        kern[(nw + W - 1) // W, 32 * W, stream](w32, wh, np.int32(M), np.int32(K),
                                                xq.view(np.uint32), xd, xs, y, np.int32(dist))
    launch.kern = kern
    return launch


def make_xreg(blocks_per_sm=8, double_buffer=False):
    """The `xreg` variants (module docstring): matvec_q4k's persistent kernel on SMs x
    blocks_per_sm blocks, with or without its double buffer, whatever matvec_q4k.XREG says."""
    def launch(w8, M, K, xq, xd, xs, y, stream):
        if K % 1024 or K // 1024 > q4.XREG_MAX_J:
            raise ValueError(f"xreg: K must be 1024 J with J <= {q4.XREG_MAX_J}, not {K}")
        kern = q4.xreg_kernel(K // 1024, double_buffer)
        launch.kern = kern
        kern[q4.persistent_grid(M, blocks_per_sm), 128, stream](
            w8.view(np.uint32), np.int32(M), np.int32(K), xq.view(np.uint32), xd, y, y, y,
            np.int32(0), np.int32(0))
    launch.kern = None
    return launch


VARIANTS = {
    "same": dict(),
    "noscale": dict(noscale=True),
    "nosums": dict(nosums=True),
    "noscale_nosums": dict(noscale=True, nosums=True),
    "loads": dict(loads=True),
    "w8": dict(warps=8),
    "rows2": dict(rows_per_warp=2),
    "rows2_w8": dict(rows_per_warp=2, warps=8),
    "hoist": dict(hoist=True),
    "sums": dict(sums=True),
    "bytewise": dict(bytewise=True),
    "pf_own": dict(pf_own=True),
    "pf_next": dict(pf_next=1),
    "pf_next2": dict(pf_next=2),
    "pf_both": dict(pf_own=True, pf_next=1),
    "xreg": dict(xreg=dict()),
    "xreg_db": dict(xreg=dict(double_buffer=True)),
    "xreg_b4": dict(xreg=dict(blocks_per_sm=4)),
    "xreg_db_b4": dict(xreg=dict(double_buffer=True, blocks_per_sm=4)),
}
CANDIDATES = {"same", "w8", "rows2", "rows2_w8", "hoist", "sums", "bytewise", "pf_own", "pf_next",
              "pf_next2", "pf_both", "xreg", "xreg_db", "xreg_b4", "xreg_db_b4"}
SMS = 132       # set from the device in main()


@cuda.jit
def sums16(xq, xs):
    """xs[i] = sum of the int8 activations xq[16 i .. 16 i + 15] (what the `sums` variant
    reads instead of computing it with 4 dp4a per half-chunk; an engine version would have the
    quantize kernels write it)."""
    i = cuda.grid(1)
    if i < xs.shape[0]:
        s = np.int32(0)
        for j in range(16):
            s += np.int32(xq[16 * i + j])
        xs[i] = s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="12288x4096,4096x12288,4096x4096")
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default=None,
                    help="comma list of VARIANTS to time beside `lib` (default: all)")
    args = ap.parse_args()
    keep = set(VARIANTS) if args.variants is None else set(args.variants.split(","))
    if keep - set(VARIANTS):
        ap.error(f"unknown variants {sorted(keep - set(VARIANTS))}; known: {sorted(VARIANTS)}")
    out = Path(args.out or os.path.join(os.environ.get("OUT", "."), "q4k_probe.jsonl"))
    global SMS
    SMS = cuda.get_current_device().MULTIPROCESSOR_COUNT
    stream = cuda.stream()
    rng = np.random.default_rng(5)
    roof = read_roofline_gbs(stream)
    dev = cuda.get_current_device()
    gpu = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    base = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), gpu=gpu,
                commit=os.environ.get("BW24_COMMIT", _commit()), roofline_gbs=round(roof, 1))
    print(f"read roofline {roof:.0f} GB/s")
    launchers = {name: make_xreg(**kw["xreg"]) if "xreg" in kw else make(**kw)
                 for name, kw in VARIANTS.items() if name in keep}
    bad = 0
    for shape in args.shapes.split(","):
        M, K = map(int, shape.split("x"))
        qt = QType.Q4_K
        nbytes = M * row_bytes(qt, K)
        n = max(args.launches, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes))
        copies = min(n, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes) + 1)
        w_host = random_weight_bytes(rng, qt, M, K)
        ws = [cuda.to_device(w_host, stream=stream) for _ in range(copies)]
        x = cuda.to_device(rng.standard_normal(K).astype(np.float32), stream=stream)
        xq = cuda.device_array(K, np.int8, stream=stream)
        xd = cuda.device_array(K // 32, np.float32, stream=stream)
        launch_quantize_act(x.reshape(1, K), xq, xd, stream=stream)
        xs = cuda.device_array(K // 16, np.int32, stream=stream)
        sums16[(K // 16 + 127) // 128, 128, stream](xq, xs)
        y = cuda.device_array(M, np.float32, stream=stream)
        runs = [("lib", lambda w: launch_matvec_q8(w, qt, M, K, xq, xd, y, stream=stream))]
        for name, L in launchers.items():
            runs.append((name, lambda w, L=L: L(weight_views(w)[0], M, K, xq, xd, xs, y, stream)))
        want = None
        for name, launch in runs:
            y.copy_to_device(np.full(M, np.nan, np.float32), stream=stream)
            launch(ws[0])
            stream.synchronize()
            got = y.copy_to_host(stream=stream)
            if name == "lib":
                want = got
            exact = bool(np.array_equal(got, want))
            with CudaGraph.capture(stream) as graph:
                for i in range(n):
                    launch(ws[i % copies])
            ms = event_ms(graph.replay, stream)
            graph.close()
            us = ms * 1e3 / n
            gbs = nbytes / (us * 1e-6) / 1e9
            regs = None
            try:
                k = q4.matvec_q8_q4_k_v4 if name == "lib" else launchers[name].kern
                regs = int(list(k.get_regs_usage().values())[0])
            except Exception:
                pass
            if name in CANDIDATES and not exact:
                bad += 1
            rec = dict(base, shape=shape, M=M, K=K, qtype="Q4_K", variant=name, us=round(us, 3),
                       gbs=round(gbs, 1), pct=round(100 * gbs / roof, 1), regs=regs,
                       equal_to_lib=exact, diagnostic=name not in CANDIDATES | {"lib"})
            print(f"{shape:>11s} {name:16s} {us:8.2f} us {gbs:7.0f} GB/s {rec['pct']:5.1f}% "
                  f"regs={regs} equal={exact}")
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
        del ws
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
