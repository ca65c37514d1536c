"""Decode matvec on a real GPU: how close to the read roofline is each real shape?

    python3 bench/matvec_bench.py [--shapes all|small|9b|35b|big|q6k] [--launches 50] [--no-old] [--out PATH]
                                  [--act-rows 4,9] [--fit-ab] [--nibble] [--pairs]
                                  [--commit SHA]

For each (M x K, weight type) of the default model (Qwen2.5-Coder-0.5B: Q5_0 / Q8_0 / Q6_K) and
the 9B shape (Q4_K), times `launch_matvec` -- and, side by side, the first kernel of this module
(shared-memory warp sum, 6 block barriers per row; `old` rows, rebuilt here from
`dequant.LAYOUTS`, nothing of it is in the library) and the dp4a path (`launch_matvec_q8`, x
quantized once beforehand):

  * one CUDA graph of N back-to-back launches (N >= --launches, raised for small shapes so that
    one replay streams >= 3 x the 60 MB L2), rotating over enough device copies of the weight
    that every launch reads it from HBM as the real decode step does (the whole model is 8x L2);
  * CUDA-event time of a replay, median of 5 after 2 warm-up replays, divided by N: per-launch
    time *including* the ~0.9 us graph launch gap between kernels (what the decode step pays);
  * GB/s = weight bytes / that time; pct = GB/s / read roofline, the roofline measured in the
    same run by bench/device_smoke.py's 16-byte ld.global.nc read kernel (1 GiB buffer);
  * Q8_0 / Q5_0 / Q4_0 shapes: also `dp4a_group`, the generic group path that
    kernels/matvec_qx0.py's 16-byte kernel replaced (matvec.QX0_V4 off), in the same run;
  * --act-rows T,..: also the dp4a kernels over T rows of activations at once (`dp4a_r<T>`,
    what speculative decoding's verify of K = T - 1 drafts runs, decision 0009): per-launch
    time for all T rows, and `x_r1` = that time over the one-row dp4a time in the same run
    (the verify's cost per matvec; T would be the cost of T separate launches);
  * --nibble: Q4_K shapes also get `dp4a_nib` (and `dp4a_nib_r<T>`): the same kernels on the
    activations in nibble order (quantize_act.nibble_order, decision 0027), which must give the
    natural order's bits (checked: a differing bit is BAD);
  * Q6_K shapes: also `q6kr`, the engine's Q6_K kernel (kernels/matvec_q6k.py on the repacked
    Q6_K_R copy: the LM head of every Q4_K_M file and the 9B's Q6_K ffn_down layers; `dp4a` is
    the generic path, which the engine does not run for Q6_K), with --q6kr-parts P,..: also
    `q6kr_p<P>` at P warps a row (the default is `matvec.warps_per_row`), and `q6kr_r<T>` for
    every --act-rows T (checked like `dp4a_r<T>`: each row bit for bit the one-row `q6kr`).
    This replaced bench/matvec_q6k_bench.py (session 35), which timed the one-row kernel only;
  * --pairs: Q4_K shapes also get `dp4a_w2_r<T>` and `dp4a_w4_r<T>` for every --act-rows T:
    the rows kernels on two / four weight rows a warp (matvec.ROWS_PAIRS, PAIR_ROWS_PER_WARP,
    decision 0036), which must give `dp4a_r<T>`'s bits (checked: a differing bit is BAD);
  * max_rel_err: max over rows of |y - matvec_reference| / (|W| @ |x|)   (float64 reference;
    the kernels' bound is ~2e-6, see tests/test_kernels_matvec.py; > 1e-5 is flagged BAD;
    dp4a rows against matvec_q8_reference, i.e. x as quantized, flagged above 1e-4).

Prints a table, appends one JSON line per row (date, gpu, commit, shape, qtype, kernel, us,
GB/s, pct, ...) to $OUT/matvec_bench.jsonl (or ./matvec_bench.jsonl when $OUT is unset, or
--out), and exits 1 if any result is BAD.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # a PYTHONPATH export did not always reach python3 there
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from device_smoke import event_ms as _event_ms  # noqa: E402
from bw24nb.kernels.dequant import layout, random_weight_bytes, weight_views  # noqa: E402
from bw24nb.kernels.matvec import (  # noqa: E402
    MATVEC_Q8,
    launch_matvec,
    launch_matvec_q8,
)
from bw24nb.kernels.matvec_q6k import launch_matvec_q8_q6k_r, repack_q6_k  # noqa: E402
from bw24nb.kernels.quantize_act import (  # noqa: E402
    dequantize_act_q8,
    launch_quantize_act,
    nibble_order,
)
from bw24nb.quant import QType, dequantize  # noqa: E402
from bw24nb.quant.types import row_bytes  # noqa: E402

try:                                  # (an older tree, run side by side, has no such path)
    from bw24nb.kernels.matvec_qx0 import PATHS as _QX0_PATHS  # noqa: E402
    QX0_TYPES = set(_QX0_PATHS)
except ImportError:
    QX0_TYPES = set()

L2_BYTES = 60 * 2**20
STREAM_FACTOR = 3            # bytes streamed per replay >= 3 x L2: the L2 cannot hold the set
MAX_LAUNCHES = 4096
REPLAYS = 5
WARMUP = 2
REL_ERR_BAD = 1e-5

# (M, K, type, what it is)
SHAPES = [
    (896, 896, QType.Q5_0, "0.5B attn_q / attn_output"),
    (128, 896, QType.Q5_0, "0.5B attn_k / attn_v"),
    (128, 896, QType.Q8_0, "0.5B attn_v (Q8_0 layers)"),
    (4864, 896, QType.Q5_0, "0.5B ffn_gate / ffn_up"),
    (896, 4864, QType.Q6_K, "0.5B ffn_down"),
    (151936, 896, QType.Q8_0, "0.5B lm_head"),
    (4096, 4096, QType.Q4_K, "9B attn square"),
    (12288, 4096, QType.Q4_K, "9B ffn_gate / ffn_up"),
    (4096, 12288, QType.Q4_K, "9B ffn_down"),
    (4096, 12288, QType.Q6_K, "9B ffn_down (Q6_K layers)"),
    (248320, 4096, QType.Q6_K, "9B lm_head"),
    (8192, 2048, QType.Q4_K, "35B-A3B gdn_qkv"),
    (2048, 4096, QType.Q4_K, "35B-A3B gdn_out"),
]


# --- the first kernel, for side-by-side (shared-memory tree, 6 barriers per row) ---------------

OLD_WARPS = 4
OLD_THREADS = 32 * OLD_WARPS


def _make_old(lay):
    qk, ts, gpb, group_dot = lay.block, lay.type_size, lay.groups, lay.group_dot

    def matvec_old(w8, w16, wh, M, K, x, y):
        red = cuda.shared.array(OLD_THREADS, np.float32)
        tid = cuda.threadIdx.x
        lane = tid & 31
        row = cuda.blockIdx.x * OLD_WARPS + (tid >> 5)
        acc = np.float32(0.0)
        if row < M:
            nblk = K // qk
            row_off = np.int64(row) * (nblk * ts)
            for g in range(lane, nblk * gpb, 32):
                b = g // gpb
                acc += group_dot(w8, w16, wh, row_off + b * ts, g - b * gpb, x, b * qk)
        red[tid] = acc
        cuda.syncthreads()
        off = 16
        while off > 0:
            if lane < off:
                red[tid] += red[tid + off]
            cuda.syncthreads()
            off >>= 1
        if row < M and lane == 0:
            y[row] = red[tid]

    return cuda.jit(matvec_old)


_OLD = {}


def launch_old(w_dev, qt, M, K, x, y, stream):
    lay = layout(qt)
    if lay.qtype not in _OLD:
        _OLD[lay.qtype] = _make_old(lay)
    w8, w16, wh = weight_views(w_dev)
    _OLD[lay.qtype][(M + OLD_WARPS - 1) // OLD_WARPS, OLD_THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), x, y)


# --- read roofline (bench/device_smoke.py's kernel) -----------------------------------------------

def read_roofline_gbs(stream) -> float:
    from device_smoke import THREADS, fill_hash, read_v4
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    n = 2**30 // 4
    src = cuda.device_array(n, np.uint32, stream=stream)
    fill_hash[sms * 8, THREADS, stream](src)
    best = 0.0
    for bps in (4, 8):
        out = cuda.device_array(sms * bps * THREADS, np.uint32, stream=stream)
        ms = event_ms(lambda: read_v4[sms * bps, THREADS, stream](src, out), stream)
        best = max(best, n * 4 / (ms * 1e-3) / 1e9)
    del src
    return best


def event_ms(fn, stream) -> float:
    """device_smoke.event_ms with this script's REPLAYS and WARMUP (read at the call: --tiny
    lowers them)."""
    return _event_ms(fn, stream, REPLAYS, WARMUP)


# --- one shape ------------------------------------------------------------------------------------

def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _switched(launch, **switches):
    """launch() with the switches bw24nb.kernels.matvec.<NAME> = value set, restored after
    (bw24nb.switches.switched): FIT_UNROLL=False (the path's full unroll), QX0_V4=False (Q8_0
    / Q5_0 / Q4_0 on the generic group path)."""
    from bw24nb.switches import switched
    with switched([("bw24nb.kernels.matvec", name, value) for name, value in switches.items()]):
        launch()


def _everywhere(R, launch):
    """launch() with every launch of one warp a row on R weight rows a warp, at every T and M
    (matvec.warp_rows_everywhere)."""
    from bw24nb.kernels.matvec import warp_rows_everywhere
    from bw24nb.switches import switched
    with switched(warp_rows_everywhere(R)):
        launch()


def _bits_twin(name):
    """(the kernel whose bits kernel `name` must give, the record key of the check or None),
    or None: the full unroll (`dp4a_full`) against `dp4a`, nibble order (`dp4a_nib`,
    `dp4a_nib_r<T>`) against natural order."""
    if name == "dp4a_full":
        return "dp4a", None
    if name.startswith("dp4a_nib"):
        return "dp4a" + name[len("dp4a_nib"):], "nibble_bits"
    if name.startswith(("dp4a_w2", "dp4a_w4")):
        return "dp4a" + name[len("dp4a_w2"):], "pair_bits"
    return None


def _rows_match_one_row(one_row, M, K, xq_r, xd_r, out, stream) -> bool:
    """True when every row t of a rows kernel's output `out` equals, bit for bit, the one-row
    launch `one_row(xq, xd, y)` run on row t's activations alone."""
    y1 = cuda.device_array(M, np.float32, stream=stream)
    for t in range(out.size // M):
        one_row(xq_r[t * K:(t + 1) * K], xd_r[t * K // 32:(t + 1) * K // 32], y1)
        one = y1.copy_to_host(stream=stream)
        stream.synchronize()
        if not np.array_equal(one.view(np.uint32), out[t * M:(t + 1) * M].view(np.uint32)):
            return False
    return True


def bench_shape(M, K, qt, launches, with_old, stream, rng, act_rows=(), fit_ab=False,
                nibble=False, pairs=False, q6kr_parts=()):
    nbytes = M * row_bytes(qt, K)
    n = min(MAX_LAUNCHES, max(launches, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes)))
    copies = min(n, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes) + 1)
    w_host = random_weight_bytes(rng, qt, M, K)
    x_host = rng.standard_normal(K).astype(np.float32)
    ws = [cuda.to_device(w_host, stream=stream) for _ in range(copies)]
    # Q6_K: the engine's Q6_K_R copy of each weight copy, found from the copy a launch is given
    rep = {} if qt != QType.Q6_K else {id(w): tuple(cuda.to_device(a, stream=stream)
                                                    for a in repack_q6_k(w_host, M, K))
                                       for w in ws}
    x = cuda.to_device(x_host, stream=stream)
    y = cuda.device_array(M, np.float32, stream=stream)

    # W dequantized once (matvec_reference's float64 W; the 9B's LM head is 8 GB of it): the
    # references below are W @ x, and matvec_q8_reference's W @ (x as quantized)
    w64 = dequantize(w_host.reshape(-1), qt, (M, K)).astype(np.float64)
    ref = w64 @ x_host.astype(np.float64)
    # what the rounding error is proportional to: |W| @ |x| per row (float64)
    w_abs = np.abs(w64)
    scale = w_abs @ np.abs(x_host.astype(np.float64))

    # (name, launch, reference, error flagged above, output, its |W| @ |x| per row)
    kernels = [("new", lambda w: launch_matvec(w, qt, M, K, x, y, stream=stream), ref, REL_ERR_BAD,
                y, scale)]
    if with_old:
        kernels.append(("old", lambda w: launch_old(w, qt, M, K, x, y, stream), ref, REL_ERR_BAD,
                        y, scale))
    if qt in MATVEC_Q8:
        xq = cuda.device_array(K, np.int8, stream=stream)
        xd = cuda.device_array(K // 32, np.float32, stream=stream)
        launch_quantize_act(x.reshape(1, K), xq, xd, stream=stream)
        # the dp4a path is checked against its own reference (x as quantized); for K-quants its
        # rounding scales with |w| + 2 |dmin m| (tests/test_kernels_matvec.py), hence 10x looser
        ref_q8 = w64 @ dequantize_act_q8(xq.copy_to_host(stream=stream),
                                         xd.copy_to_host(stream=stream)).astype(np.float64)
        kernels.append(("dp4a", lambda w: launch_matvec_q8(w, qt, M, K, xq, xd, y, stream=stream),
                        ref_q8, 10 * REL_ERR_BAD, y, scale))
        if qt in QX0_TYPES:                   # Q8_0 / Q5_0 / Q4_0: the group path before
            y_grp = cuda.device_array(M, np.float32, stream=stream)
            kernels.append(("dp4a_group", lambda w: _switched(lambda:
                launch_matvec_q8(w, qt, M, K, xq, xd, y_grp, stream=stream), QX0_V4=False),
                ref_q8, 10 * REL_ERR_BAD, y_grp, scale))
        if fit_ab:                            # the same kernel with the full 4 slots a step
            y_full = cuda.device_array(M, np.float32, stream=stream)
            kernels.append(("dp4a_full", lambda w: _switched(lambda:
                launch_matvec_q8(w, qt, M, K, xq, xd, y_full, stream=stream), FIT_UNROLL=False),
                ref_q8, 10 * REL_ERR_BAD, y_full, scale))
        for P in ((None,) + tuple(q6kr_parts) if rep else ()):   # the engine's Q6_K kernel
            y_q = cuda.device_array(M, np.float32, stream=stream)
            kernels.append(("q6kr" if P is None else f"q6kr_p{P}", lambda w, P=P, y_q=y_q:
                            launch_matvec_q8_q6k_r(*rep[id(w)], M, K, xq, xd, y_q,
                                                   stream=stream, parts=P),
                            ref_q8, 10 * REL_ERR_BAD, y_q, scale))
        nib = nibble and qt == QType.Q4_K and K % 256 == 0
        if nib:                               # the same values in nibble order: the same bits
            xq_n = cuda.to_device(nibble_order(xq.copy_to_host(stream=stream)), stream=stream)
            y_n = cuda.device_array(M, np.float32, stream=stream)
            kernels.append(("dp4a_nib", lambda w: launch_matvec_q8(
                w, qt, M, K, xq_n, xd, y_n, stream=stream, nibble=True), ref_q8,
                10 * REL_ERR_BAD, y_n, scale))
        rows_x = {}                            # dp4a_r<T> -> its (xq, xd), for the bit check
        for nr in act_rows:                   # verify's rows kernels: T activation rows at once
            x_r = rng.standard_normal((nr, K)).astype(np.float32)
            xq_r = cuda.device_array(nr * K, np.int8, stream=stream)
            xd_r = cuda.device_array(nr * K // 32, np.float32, stream=stream)
            y_r = cuda.device_array(nr * M, np.float32, stream=stream)
            launch_quantize_act(cuda.to_device(x_r, stream=stream), xq_r, xd_r, stream=stream)
            q_h, d_h = xq_r.copy_to_host(stream=stream), xd_r.copy_to_host(stream=stream)
            ref_r = np.concatenate([w64 @ dequantize_act_q8(
                q_h[t * K:(t + 1) * K], d_h[t * K // 32:(t + 1) * K // 32]).astype(np.float64)
                for t in range(nr)])
            scale_r = np.concatenate([w_abs @ np.abs(x_r[t].astype(np.float64)) for t in range(nr)])
            rows_x[f"dp4a_r{nr}"] = xq_r, xd_r, lambda q, d, y1: launch_matvec_q8(
                ws[0], qt, M, K, q, d, y1, stream=stream)
            if rep:                           # the engine's Q6_K kernel over the same rows
                y_q = cuda.device_array(nr * M, np.float32, stream=stream)
                rows_x[f"q6kr_r{nr}"] = xq_r, xd_r, lambda q, d, y1: launch_matvec_q8_q6k_r(
                    *rep[id(ws[0])], M, K, q, d, y1, stream=stream)
                kernels.append((f"q6kr_r{nr}", lambda w, nr=nr, xq_r=xq_r, xd_r=xd_r, y_q=y_q:
                                launch_matvec_q8_q6k_r(*rep[id(w)], M, K, xq_r, xd_r, y_q,
                                                       stream=stream, rows=nr),
                                ref_r, 10 * REL_ERR_BAD, y_q, scale_r))
            kernels.append((f"dp4a_r{nr}", lambda w, nr=nr, xq_r=xq_r, xd_r=xd_r, y_r=y_r:
                            _switched(lambda: launch_matvec_q8(w, qt, M, K, xq_r, xd_r, y_r,
                                                               stream=stream, rows=nr),
                                      ROWS_PAIRS=False),
                            ref_r, 10 * REL_ERR_BAD, y_r, scale_r))
            if nib:
                xq_rn = cuda.to_device(nibble_order(q_h), stream=stream)
                y_rn = cuda.device_array(nr * M, np.float32, stream=stream)
                kernels.append((f"dp4a_nib_r{nr}", lambda w, nr=nr, xq_rn=xq_rn, xd_r=xd_r,
                                y_rn=y_rn: launch_matvec_q8(w, qt, M, K, xq_rn, xd_r, y_rn,
                                                            stream=stream, rows=nr, nibble=True),
                                ref_r, 10 * REL_ERR_BAD, y_rn, scale_r))
            for R in ((2, 4) if pairs and qt == QType.Q4_K else ()):
                y_rp = cuda.device_array(nr * M, np.float32, stream=stream)
                kernels.append((f"dp4a_w{R}_r{nr}", lambda w, nr=nr, xq_r=xq_r, xd_r=xd_r,
                                y_rp=y_rp, R=R: _everywhere(R, lambda: launch_matvec_q8(
                                    w, qt, M, K, xq_r, xd_r, y_rp, stream=stream, rows=nr)),
                                ref_r, 10 * REL_ERR_BAD, y_rp, scale_r))

    rows, outs = [], {}
    for name, launch, want, bad_above, y, scale in kernels:
        y.copy_to_device(np.full(y.size, np.nan, np.float32), stream=stream)
        launch(ws[0])                            # compile + load before capture
        stream.synchronize()
        with CudaGraph.capture(stream) as graph:
            for i in range(n):
                launch(ws[i % copies])
        ms = event_ms(graph.replay, stream)
        graph.close()
        out = y.copy_to_host(stream=stream)
        stream.synchronize()
        err = float(np.max(np.abs(out.astype(np.float64) - want) / np.maximum(scale, 1e-30)))
        if not np.all(np.isfinite(out)):
            err = float("inf")
        us = ms * 1e3 / n
        rows.append(dict(kernel=name, us=us, gbs=nbytes / (us * 1e-6) / 1e9, max_rel_err=err,
                         bad_above=bad_above, launches=n, copies=copies, bytes=nbytes))
        outs[name] = out
        twin = _bits_twin(name)
        if twin is not None:                            # another form of a kernel: its bits
            other, key = twin
            same = np.array_equal(out.view(np.uint32), outs[other].view(np.uint32))
            if key:
                rows[-1][key] = same
            if not same:
                rows[-1]["max_rel_err"] = float("inf")  # a changed bit is BAD
        if name in rows_x:                              # verify's contract: row t of the rows
            xq_r, xd_r, one_row = rows_x[name]          # kernel is the one-row kernel's result
            rows[-1]["rows_bits"] = same = _rows_match_one_row(    # on row t, bit for bit
                one_row, M, K, xq_r, xd_r, out, stream)
            if not same:
                rows[-1]["max_rel_err"] = float("inf")
    del ws
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", choices=["all", "small", "0.5b", "9b", "35b", "big", "q6k"],
                    default="all",
                    help="small: skip the lm_head and the 9B / 35B-A3B shapes; 0.5b: the 0.5B "
                         "shapes with the lm_head; 9b: only the 9B shapes but its lm_head; "
                         "35b: only the 35B-A3B shapes; big: the 9B (no lm_head) and 35B-A3B "
                         "shapes; q6k: every Q6_K shape (the 9B's lm_head among them)")
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--no-old", action="store_true", help="skip the old kernel's rows")
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default=None, help="the commit measured (default: git HEAD of "
                    "the copy it runs in, which on the device machine may not be the tree's)")
    ap.add_argument("--act-rows", default="", help="also time the dp4a kernels over these "
                    "numbers of activation rows (verify's K + 1), e.g. 2,4,9")
    ap.add_argument("--fit-ab", action="store_true",
                    help="also time the dp4a kernel with its full unroll (`dp4a_full`, "
                         "matvec.FIT_UNROLL off), which must give the fitted kernel's bits "
                         "(Q8_0 / Q5_0 / Q4_0 always get `dp4a_group`: the generic group path "
                         "their 16-byte kernel replaced, matvec.QX0_V4 off)")
    ap.add_argument("--nibble", action="store_true",
                    help="Q4_K shapes: also the kernels on activations in nibble order "
                         "(`dp4a_nib`, `dp4a_nib_r<T>`), bit-checked against natural order")
    ap.add_argument("--pairs", action="store_true",
                    help="Q4_K shapes: also the rows kernels on two / four weight rows a warp "
                         "(`dp4a_w2_r<T>`, `dp4a_w4_r<T>`: matvec.ROWS_PAIRS), bit-checked "
                         "against `dp4a_r<T>`")
    ap.add_argument("--q6kr-parts", default="",
                    help="Q6_K shapes: also the engine's Q6_K_R kernel at these warps a row "
                         "(`q6kr_p<P>`, P in 1, 2, 4), beside `q6kr` at the default")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke-test this script in numba's CUDA simulator (tiny shapes, no timing value)")
    args = ap.parse_args()
    out_path = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "matvec_bench.jsonl"
    act_rows = [int(n) for n in args.act_rows.split(",") if n]
    q6kr_parts = [int(n) for n in args.q6kr_parts.split(",") if n]
    if any(p not in (1, 2, 4) for p in q6kr_parts):
        ap.error("--q6kr-parts: warps a row, each 1, 2 or 4")
    if any(not 2 <= n <= 9 for n in act_rows):
        ap.error("--act-rows: numbers of rows from 2 to 9 (matvec.MAX_ROWS)")

    dev = cuda.get_current_device()
    name = getattr(dev, "name", "cuda-simulator")
    gpu = name.decode() if isinstance(name, bytes) else str(name)
    stream = cuda.stream()
    rng = np.random.default_rng(2026)
    t0 = time.time()
    if args.tiny:
        global L2_BYTES, REPLAYS, WARMUP
        L2_BYTES, REPLAYS, WARMUP = 1, 1, 0
        args.launches = 2
    roof = 1.0 if args.tiny else read_roofline_gbs(stream)
    print(f"# {gpu}: read roofline (16-byte ld.global.nc, 1 GiB) {roof:.0f} GB/s", flush=True)

    big9 = [s for s in SHAPES if s[3].startswith("9B") and s[3] != "9B lm_head"]
    shapes = SHAPES if args.shapes == "all" else big9 if args.shapes == "9b" else \
        [s for s in SHAPES if s[2] == QType.Q6_K] if args.shapes == "q6k" else \
        big9 + [s for s in SHAPES if s[3].startswith("35B")] if args.shapes == "big" else \
        [s for s in SHAPES if s[3].startswith("35B")] if args.shapes == "35b" else \
        [s for s in SHAPES if s[3].startswith("0.5B")] if args.shapes == "0.5b" else \
        [s for s in SHAPES if s[0] * s[1] < 2e7 and s[3].startswith("0.5B")]
    if args.tiny:
        shapes = [(4, 256, qt, "tiny") for qt in (QType.Q5_0, QType.Q8_0, QType.Q6_K, QType.Q4_K)]
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    commit = args.commit or _commit()
    table, bad = [], False
    with open(out_path, "a") as f:
        for M, K, qt, what in shapes:
            try:
                rows = bench_shape(M, K, qt, args.launches, not args.no_old, stream, rng,
                                   act_rows, args.fit_ab, args.nibble, args.pairs, q6kr_parts)
            except Exception as e:                      # report and go on with the next shape
                print(f"# {M}x{K} {qt.name}: FAILED {type(e).__name__}: {e}", flush=True)
                bad = True
                continue
            by = {r["kernel"]: r["us"] for r in rows}
            for r in rows:
                r.update(pct=100 * r["gbs"] / roof)
                one = by.get("dp4a_nib" if r["kernel"].startswith("dp4a_nib") else
                             "q6kr" if r["kernel"].startswith("q6kr") else "dp4a")
                x_r1 = round(r["us"] / one, 3) if one and r["kernel"].startswith(
                    ("dp4a_r", "dp4a_nib_r", "dp4a_w2_r", "dp4a_w4_r", "q6kr_r")) else None
                ok = r["max_rel_err"] <= r["bad_above"]
                bad |= not ok
                rec = dict(date=date, gpu=gpu, commit=commit, shape=f"{M}x{K}", M=M, K=K,
                           qtype=qt.name, what=what, kernel=r["kernel"], us=round(r["us"], 3),
                           gbs=round(r["gbs"], 1), pct=round(r["pct"], 1),
                           roofline_gbs=round(roof, 1), max_rel_err=r["max_rel_err"],
                           ok=ok, launches=r["launches"], copies=r["copies"], bytes=r["bytes"],
                           **({} if x_r1 is None else dict(x_r1=x_r1)),
                           **({} if "rows_bits" not in r else dict(rows_bits=r["rows_bits"])),
                           **({} if "nibble_bits" not in r else dict(nibble_bits=r["nibble_bits"])),
                           **({} if "pair_bits" not in r else dict(pair_bits=r["pair_bits"])))
                f.write(json.dumps(rec) + "\n")
                table.append(rec)
                print(f"  {M:>6}x{K:<5} {qt.name:<5} {r['kernel']:<10} {r['us']:9.2f} us "
                      f"{r['gbs']:7.0f} GB/s {r['pct']:5.1f}%  err {r['max_rel_err']:.1e}"
                      f"{'' if x_r1 is None else f'  x{x_r1} of one row'}"
                      f"{'' if r.get('rows_bits', True) else '  rows != one row'}"
                      f"{'' if ok else '  BAD'}", flush=True)

    print(f"\nmatvec bench, {gpu}, commit {commit}, roofline {roof:.0f} GB/s "
          f"(us per launch include the graph's ~0.9 us launch gap)")
    print(f"{'shape':>13} {'type':<5} {'what':<27} {'kernel':<10} {'us':>9} {'GB/s':>7} "
          f"{'%roof':>6} {'max_rel_err':>11} {'launches':>8}")
    for r in table:
        print(f"{r['shape']:>13} {r['qtype']:<5} {r['what']:<27} {r['kernel']:<10} {r['us']:9.2f} "
              f"{r['gbs']:7.0f} {r['pct']:6.1f} {r['max_rel_err']:11.1e} {r['launches']:8d}"
              f"{'' if r['ok'] else '  BAD'}")
    print(f"# {len(table)} rows -> {out_path} ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
