"""Prefill matmul on a real GPU: the int8 tensor-core GEMM (kernels/matmul_q8.py) vs the float
tiled kernel (kernels/matmul.py) at the prefill shapes of the served models.

    python3 bench/matmul_q8_bench.py [--shapes all|9b|0.5b|0.5b-fill] [--T 512] [--jsonl PATH]
                                     [--commit SHA] [--smoke] [--tiles all|NAME,NAME]

For each (T x M x K, weight type) -- Qwen3.5-9B (hidden 4096, FFN 12288; Q4_K, Q6_K, Q8_0) and
Qwen2.5-0.5B (hidden 896, FFN 4864; Q8_0, Q5_0), T = 512 prompt tokens:

  1. correctness first, on the device: X ~ N(0, 1) quantized by the quantize_act kernel (its
     output checked bit for bit against quantize_act_q8_reference), then
       * matmul_q8 against the float64 reference `matmul_q8_reference` on a sample of 192 weight
         rows (the first 64, the last 64, 64 random; every T row), within kernel_check's bound
         (2 gamma_h (|W| + 2|dmin m|) @ |x|, h = terms + 5): `err/tol` > 1 is BAD;
       * matmul_q8 against the float kernel on every output: `vs_float` = max |y_q8 - y_f32| /
         max |y_f32|, the cost of 8-bit activations (informational, ~1e-2 expected);
  2. timing: one CUDA graph of N back-to-back launches (N chosen so that a replay lasts
     >= 2 ms; this removes the ~21 us eager-launch gap that would dominate the 0.5B shapes),
     CUDA-event time of a replay, median of 5 after 2 warm-up replays, divided by N. Kernels:
     `matmul_q8` (the GEMM alone, activations already quantized), `quant+matmul_q8` (the
     activation quantizer then the GEMM: what prefill pays per projection), `matmul_q8_cvt` (the
     same GEMM converting each int32 dot with cvt.rn.f32.s32 instead of matmul_q8.py's
     magic-number add: the A/B of that choice; its output must be bit-identical), `matmul`
     (the float kernel) and, with --tiles, `matmul_q8_<tile>` for each named candidate of
     matmul_q8.TILES (another block tile / K step; its output must equal the default tile's
     bit for bit, `same_bits`).
     The weight stays resident in L2 where it fits (<= 60 MB): these shapes are compute-bound.
  3. TOPS = 2 T M K / time / 1e12 (int8 MACs for matmul_q8, float32 FMAs for matmul).

Prints a table and appends one JSON line per (shape, type, kernel, metric) -- keys date, gpu,
commit, shape, type, kernel, metric, value (+ T, M, K, what) -- to --jsonl (default
$OUT/matmul_q8_bench.jsonl, or ./matmul_q8_bench.jsonl when $OUT is unset). Exits 1 if any
check is BAD. `--smoke` runs tiny shapes in numba's CUDA simulator (checks only; times are
wall clock and mean nothing).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # a PYTHONPATH export did not always reach python3 there

if "--smoke" in sys.argv:              # before numba.cuda is imported
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.kernel_check import MARGIN, TINY_NORMAL, _min_offsets, gamma  # noqa: E402
from bw24nb.kernels.dequant import random_weight_bytes  # noqa: E402
from bw24nb.kernels.matmul import launch_matmul  # noqa: E402
from bw24nb.kernels import matmul_q8 as mq  # noqa: E402
from bw24nb.kernels.matmul_q8 import launch_matmul_q8, matmul_q8_reference  # noqa: E402
from bw24nb.kernels.quantize_act import (  # noqa: E402
    dequantize_act_q8,
    launch_quantize_act,
    quantize_act_q8_reference,
)
from bw24nb.quant import QType, dequantize  # noqa: E402

REPLAYS = 5
WARMUP = 2
GRAPH_MS = 2.0               # a replay lasts at least this long
MAX_LAUNCHES = 200
_CVT = {}                    # weight type -> the cvt variant of its kernel
_TILED = {}                  # (weight type, tile name) -> the kernel with that tile
TILE_NAMES: list[str] = []   # --tiles
SAMPLE_ROWS = 64             # reference rows: first, last and random, SAMPLE_ROWS each

H9, F9 = 4096, 12288         # Qwen3.5-9B hidden, FFN
H05, F05 = 896, 4864         # Qwen2.5-0.5B hidden, FFN
# (model, M, K, what, types)
SHAPES = [
    ("9b", H9, H9, "attn square (q/o)", (QType.Q4_K, QType.Q6_K, QType.Q8_0)),
    ("9b", F9, H9, "ffn_gate / ffn_up", (QType.Q4_K, QType.Q6_K, QType.Q8_0)),
    ("9b", H9, F9, "ffn_down", (QType.Q4_K, QType.Q6_K, QType.Q8_0)),
    ("0.5b", H05, H05, "attn_q / attn_output", (QType.Q8_0, QType.Q5_0)),
    ("0.5b", F05, H05, "ffn_gate / ffn_up", (QType.Q8_0, QType.Q5_0)),
    ("0.5b", H05, F05, "ffn_down", (QType.Q8_0, QType.Q5_0)),
    # the 0.5B's GEMMs whose 64 x 64 grid under-fills the GPU (112 and 16 blocks at T = 512):
    # where a tile or split-K for small grids would have to win (decision 0049)
    ("0.5b-fill", H05, F05, "ffn_down", (QType.Q6_K,)),
    ("0.5b-fill", 128, H05, "attn_k / attn_v", (QType.Q5_0,)),
]
SMOKE_SHAPES = [("smoke", 70, 64, "tiny, 2 M tiles", (QType.Q8_0,)),
                ("smoke", 17, 256, "tiny", (QType.Q6_K,))]


def _commit(arg) -> str:
    if arg:
        return arg
    if os.environ.get("BW24_COMMIT"):
        return os.environ["BW24_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _gpu_name() -> str:
    name = getattr(cuda.get_current_device(), "name", "cuda-simulator")
    return name.decode() if isinstance(name, bytes) else str(name)


def replay_ms(graph, stream) -> float:
    """Median time of one replay: CUDA events on the GPU, wall clock in the simulator."""
    for _ in range(WARMUP):
        graph.replay()
    stream.synchronize()
    times = []
    for _ in range(REPLAYS):
        if hasattr(cuda, "event_elapsed_time") and not os.environ.get("NUMBA_ENABLE_CUDASIM"):
            a, b = cuda.event(), cuda.event()
            a.record(stream)
            graph.replay()
            b.record(stream)
            b.synchronize()
            times.append(cuda.event_elapsed_time(a, b))
        else:
            t = time.perf_counter()
            graph.replay()
            stream.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_per_launch_us(launch, stream, smoke) -> tuple[float, int]:
    """(median us per launch, launches per graph) of `launch()` captured N times."""
    n = 1
    if not smoke:                              # (the simulator has nothing to load)
        launch()                               # compile + load before capture
        stream.synchronize()
        with CudaGraph.capture(stream) as g1:
            launch()
        one = replay_ms(g1, stream)
        g1.close()
        n = max(1, min(MAX_LAUNCHES, math.ceil(GRAPH_MS / max(one, 1e-3))))
    with CudaGraph.capture(stream) as graph:
        for _ in range(n):
            launch()
    ms = replay_ms(graph, stream)
    graph.close()
    return ms * 1e3 / n, n


def _parse_tile(name):
    """--tiles NAME[_cvt][_rNN] -> (matmul_q8.TILES[NAME] or None, cvt, register cap NN or
    None)."""
    base, regs = name, None
    m = re.fullmatch(r"(.*)_r(\d+)", name)
    if m:
        base, regs = m.group(1), int(m.group(2))
    return mq.TILES.get(base.removesuffix("_cvt")), base.endswith("_cvt"), regs


def bench_shape(T, M, K, qt, stream, rng, smoke):
    """Check, then time, one shape. Returns (checks dict, [(kernel, us, launches)])."""
    w_host = random_weight_bytes(rng, qt, M, K)
    x_host = rng.standard_normal((T, K)).astype(np.float32)
    w = cuda.to_device(w_host, stream=stream)
    x = cuda.to_device(x_host, stream=stream)
    xq = cuda.device_array((T, K), np.int8, stream=stream)
    xd = cuda.device_array((T, K // 32), np.float32, stream=stream)
    y = cuda.device_array((T, M), np.float32, stream=stream)
    y_f = cuda.device_array((T, M), np.float32, stream=stream)

    # --- correctness: quantizer bit-exact, GEMM vs float64 reference on sampled rows
    launch_quantize_act(x, xq, xd, stream=stream)
    y.copy_to_device(np.full((T, M), np.nan, np.float32), stream=stream)
    launch_matmul_q8(w, qt, M, K, xq, xd, y, stream=stream)
    launch_matmul(w, qt, M, K, x, y_f, stream=stream)
    got = y.copy_to_host(stream=stream)
    got_f = y_f.copy_to_host(stream=stream)
    q_dev, d_dev = xq.copy_to_host(stream=stream), xd.copy_to_host(stream=stream)
    stream.synchronize()
    q_ref, d_ref = quantize_act_q8_reference(x_host)
    quant_ok = np.array_equal(q_dev.reshape(-1), q_ref) and np.array_equal(d_dev.reshape(-1), d_ref)

    rows = np.unique(np.concatenate([np.arange(min(SAMPLE_ROWS, M)),
                                     np.arange(max(0, M - SAMPLE_ROWS), M),
                                     rng.integers(0, M, SAMPLE_ROWS)]))
    w_rows = np.ascontiguousarray(w_host[rows])
    ref = matmul_q8_reference(w_rows, qt, len(rows), K, q_ref, d_ref)
    xa = np.abs(dequantize_act_q8(q_ref, d_ref)).reshape(T, K)
    wmag = np.abs(dequantize(w_rows.reshape(-1), qt, (len(rows), K)).astype(np.float64)) \
        + 2 * _min_offsets(w_rows, qt, len(rows), K)
    h = (2 if qt == QType.Q6_K else 1) * (K // 32) + 5
    bound = MARGIN * gamma(h) * (xa @ wmag.T) + TINY_NORMAL
    sub = got[:, rows].astype(np.float64)
    err_ratio = float(np.max(np.abs(sub - ref) / bound)) if np.all(np.isfinite(got)) else math.inf
    scale_f = float(np.max(np.abs(got_f)))
    vs_float = float(np.max(np.abs(got.astype(np.float64) - got_f)) / scale_f) if scale_f else math.inf
    checks = dict(quant_ok=quant_ok, err_ratio=err_ratio, vs_float=vs_float,
                  ok=bool(quant_ok and err_ratio <= 1.0))

    # --- the cvt variant: same values, so the same bits
    if qt not in _CVT:
        _CVT[qt] = mq._make_matmul_q8(qt, magic_cvt=False)
    y_c = cuda.device_array((T, M), np.float32, stream=stream)
    mq._launch(_CVT[qt], w, M, K, T, xq, xd, y_c, None, None, stream)
    checks["cvt_same_bits"] = bool(np.array_equal(y_c.copy_to_host(stream=stream).view(np.uint32),
                                                  got.view(np.uint32)))
    stream.synchronize()

    # --- the tile candidates: same order of every sum, so the same bits
    tiled = []
    for name in TILE_NAMES:
        if (qt, name) not in _TILED:
            tile, cvt, regs = _parse_tile(name)
            try:
                _TILED[qt, name] = mq._make_matmul_q8(qt, magic_cvt=not cvt, tile=tile,
                                                      max_regs=regs)
            except ValueError:          # a tile that does not serve this type (copy_ahead)
                _TILED[qt, name] = None
        if _TILED[qt, name] is None:
            continue
        y_t = cuda.device_array((T, M), np.float32, stream=stream)
        y_t.copy_to_device(np.full((T, M), np.nan, np.float32), stream=stream)
        mq._launch(_TILED[qt, name], w, M, K, T, xq, xd, y_t, None, None, stream)
        same = np.array_equal(y_t.copy_to_host(stream=stream).view(np.uint32), got.view(np.uint32))
        checks[f"tile_{name}_same_bits"] = bool(same)
        checks["ok"] = bool(checks["ok"] and same)
        tiled.append((f"matmul_q8_{name}",
                      lambda k=_TILED[qt, name], yt=y_t: mq._launch(k, w, M, K, T, xq, xd, yt,
                                                                   None, None, stream)))

    # --- timing
    kernels = [
        ("matmul_q8", lambda: launch_matmul_q8(w, qt, M, K, xq, xd, y, stream=stream)),
        ("quant+matmul_q8", lambda: (launch_quantize_act(x, xq, xd, stream=stream),
                                     launch_matmul_q8(w, qt, M, K, xq, xd, y, stream=stream))),
        ("matmul_q8_cvt", lambda: mq._launch(_CVT[qt], w, M, K, T, xq, xd, y_c, None, None,
                                             stream)),
        ("matmul", lambda: launch_matmul(w, qt, M, K, x, y_f, stream=stream)),
    ] + tiled
    times = []
    for name, launch in kernels:
        us, n = time_per_launch_us(launch, stream, smoke)
        times.append((name, us, n))
    return checks, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", choices=["all", "9b", "0.5b", "0.5b-fill"], default="all")
    ap.add_argument("--T", type=int, default=512, help="prompt tokens (rows of X)")
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--commit", default=None, help="commit of the measured tree (else "
                    "$BW24_COMMIT, else git rev-parse HEAD)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes in numba's CUDA simulator: checks the script, times mean nothing")
    ap.add_argument("--tiles", default="", help="also time these matmul_q8.TILES candidates "
                    "(NAME_rNN: built with ptxas capped at NN registers) "
                    f"(comma-separated, or 'all'): {', '.join(mq.TILES)}; a name ending in "
                    "_cvt converts with cvt instead of the magic-number add")
    ap.add_argument("--types", default="", help="only these weight types (comma-separated, "
                    "e.g. Q4_K)")
    ap.add_argument("--cvt-tiles", action="store_true",
                    help="with --tiles: also time each named tile with cvt (NAME_cvt)")
    args = ap.parse_args()
    names = list(mq.TILES) if args.tiles == "all" \
        else [n for n in args.tiles.split(",") if n]
    if args.cvt_tiles:
        names += [n + "_cvt" for n in names if not n.endswith("_cvt")]
    unknown = [n for n in names if _parse_tile(n)[0] is None]
    if unknown:
        ap.error(f"--tiles: unknown {unknown}; known: {', '.join(mq.TILES)}")
    TILE_NAMES[:] = names
    out_path = Path(args.jsonl) if args.jsonl else \
        Path(os.environ.get("OUT", ".")) / "matmul_q8_bench.jsonl"
    if args.smoke:
        global REPLAYS, WARMUP
        REPLAYS, WARMUP = 1, 0
        shapes, T = SMOKE_SHAPES, 5
    else:
        shapes = [s for s in SHAPES if args.shapes in ("all", s[0])]
        T = args.T

    gpu = _gpu_name()
    commit = _commit(args.commit)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    stream = cuda.stream()
    rng = np.random.default_rng(2026)
    t0 = time.time()
    print(f"# matmul_q8 bench on {gpu}, commit {commit}, T = {T}", flush=True)
    table, bad = [], False
    with open(out_path, "a") as f:
        def record(shape, qt, kernel, metric, value, **extra):
            f.write(json.dumps(dict(date=date, gpu=gpu, commit=commit, shape=shape, type=qt.name,
                                    kernel=kernel, metric=metric, value=value, **extra)) + "\n")

        only = {t.strip().upper() for t in args.types.split(",") if t.strip()}
        for model, M, K, what, types in shapes:
            for qt in types:
                if only and qt.name not in only:
                    continue
                shape = f"{T}x{M}x{K}"
                extra = dict(T=T, M=M, K=K, what=f"{model} {what}")
                try:
                    checks, times = bench_shape(T, M, K, qt, stream, rng, args.smoke)
                except Exception as e:              # report and go on with the next shape
                    print(f"# {shape} {qt.name}: FAILED {type(e).__name__}: {e}", flush=True)
                    record(shape, qt, "matmul_q8", "ok", 0, error=f"{type(e).__name__}: {e}", **extra)
                    bad = True
                    continue
                bad |= not checks["ok"]
                record(shape, qt, "matmul_q8", "ok", int(checks["ok"]), **extra)
                record(shape, qt, "matmul_q8", "err_over_tol", checks["err_ratio"], **extra)
                record(shape, qt, "quantize_act", "bit_exact", int(checks["quant_ok"]), **extra)
                record(shape, qt, "matmul_q8", "rel_diff_vs_float", checks["vs_float"], **extra)
                record(shape, qt, "matmul_q8_cvt", "same_bits", int(checks["cvt_same_bits"]), **extra)
                for name in TILE_NAMES:
                    if f"tile_{name}_same_bits" in checks:      # (not a refused tile)
                        record(shape, qt, f"matmul_q8_{name}", "same_bits",
                               int(checks[f"tile_{name}_same_bits"]), **extra)
                flops = 2.0 * T * M * K
                base = {name: us for name, us, _ in times}["matmul"]
                for name, us, n in times:
                    tops = flops / (us * 1e-6) / 1e12
                    record(shape, qt, name, "us", round(us, 3), launches=n, **extra)
                    record(shape, qt, name, "tops", round(tops, 3), **extra)
                    table.append(dict(shape=shape, what=f"{model} {what}", type=qt.name,
                                      kernel=name, us=us, tops=tops, speedup=base / us,
                                      n=n, **checks))
                    print(f"  {shape:>16} {qt.name:<5} {name:<16} {us:10.1f} us {tops:8.2f} TOPS"
                          f"  x{base / us:6.1f}  err/tol {checks['err_ratio']:.3f}"
                          f"{'' if checks['cvt_same_bits'] else '  (cvt variant differs)'}"
                          f"{'' if checks['ok'] else '  BAD'}", flush=True)

    print(f"\nprefill matmul, {gpu}, commit {commit}, T = {T}; times: CUDA-graph replay median "
          f"of {REPLAYS} / launches; err/tol vs float64 reference on sampled rows (BAD > 1); "
          f"vs_float = max|y_q8 - y_f32| / max|y_f32|")
    print(f"{'T x M x K':>16} {'type':<5} {'what':<25} {'kernel':<16} {'us':>10} {'TOPS':>8} "
          f"{'speedup':>7} {'err/tol':>7} {'vs_float':>8}")
    for r in table:
        print(f"{r['shape']:>16} {r['type']:<5} {r['what']:<25} {r['kernel']:<16} {r['us']:10.1f} "
              f"{r['tops']:8.2f} {r['speedup']:7.1f} {r['err_ratio']:7.3f} {r['vs_float']:8.1e}"
              f"{'' if r['ok'] else '  BAD'}")
    print(f"# {len(table)} rows -> {out_path} ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
