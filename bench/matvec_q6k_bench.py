"""Q6_K decode matvec on a real GPU: the repacked 16-byte-load kernel against the generic one.

    python3 bench/matvec_q6k_bench.py [--launches 50] [--parts auto,1,2,4] [--jsonl PATH]
    python3 bench/matvec_q6k_bench.py --smoke      # this script in numba's CUDA simulator

For each Q6_K shape (Qwen3.5-9B lm_head 248320 x 4096, its ffn_down 4096 x 12288, the 0.5B
ffn_down 896 x 4864) times, on the same random matrix and the same quantized x:

  dp4a    matvec.launch_matvec_q8 on the GGUF bytes (the generic dp4a kernel, 2-byte loads)
  q6k_r   matvec_q6k.launch_matvec_q8_q6k_r on repack_q6_k's (body, d), once per --parts value
          ("auto" = matvec.warps_per_row)

as matvec_bench.py does: one CUDA graph of N back-to-back launches (N >= --launches, raised
until a replay streams >= 3 x the 60 MB L2), rotating over enough device copies of the weight
that every launch reads it from HBM; CUDA-event time of a replay, median of 5 after 2 warm-up
replays, divided by N (so a launch's time includes the ~0.9 us graph launch gap). GB/s = weight
bytes (GGUF size; the repack has the same bytes) / that time; pct = GB/s / the read roofline
measured in the same run (bench/device_smoke.py's 16-byte ld.global.nc kernel, 1 GiB).
max_rel_err: over up to --check-rows evenly spaced rows, |y - matvec_q8_reference| / (|W| @ |x|)
(float64 reference on the GGUF bytes; the bound is ~3e-6, see tests/test_kernels_matvec_q6k.py;
> 1e-5 is flagged BAD and the exit status is 1).

One JSON line per (shape, kernel, parts) is appended to --jsonl (default
$OUT/matvec_q6k_bench.jsonl, or ./ when $OUT is unset).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.kernels.dequant import random_weight_bytes  # noqa: E402
from bw24nb.kernels.matvec import launch_matvec_q8, matvec_q8_reference, warps_per_row  # noqa: E402
from bw24nb.kernels.matvec_q6k import launch_matvec_q8_q6k_r, repack_q6_k  # noqa: E402
from bw24nb.kernels.quantize_act import dequantize_act_q8, launch_quantize_act  # noqa: E402
from bw24nb.quant import QType, dequantize  # noqa: E402
from bw24nb.quant.types import row_bytes  # noqa: E402
from matvec_bench import _commit, event_ms, read_roofline_gbs  # noqa: E402

Q6 = QType.Q6_K
L2_BYTES = 60 * 2**20
STREAM_FACTOR = 3
MAX_LAUNCHES = 4096
REPLAYS = 5
WARMUP = 2
REL_ERR_BAD = 1e-5

SHAPES = [
    (248320, 4096, "9B lm_head"),
    (4096, 12288, "9B ffn_down"),
    (896, 4864, "0.5B ffn_down"),
]
SMOKE_SHAPES = [(5, 512, "smoke"), (3, 768, "smoke odd blocks")]


def _rows_checked(M, n):
    return np.unique(np.linspace(0, M - 1, min(M, n)).round().astype(np.int64))


def bench_shape(M, K, launches, parts_list, check_rows, stream, rng):
    nbytes = M * row_bytes(Q6, K)
    n = min(MAX_LAUNCHES, max(launches, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes)))
    copies = min(n, math.ceil(STREAM_FACTOR * L2_BYTES / nbytes) + 1)
    t0 = time.time()
    raw = random_weight_bytes(rng, Q6, M, K)
    body, d = repack_q6_k(raw, M, K)
    x = cuda.to_device(rng.standard_normal(K).astype(np.float32), stream=stream)
    xq = cuda.device_array(K, np.int8, stream=stream)
    xd = cuda.device_array(K // 32, np.float32, stream=stream)
    launch_quantize_act(x, xq, xd, stream=stream)
    y = cuda.device_array(M, np.float32, stream=stream)
    xq_h, xd_h = xq.copy_to_host(stream=stream), xd.copy_to_host(stream=stream)
    stream.synchronize()

    # the reference on a sample of rows (a full 248320 x 4096 float64 dequantize is 8 GB)
    rows = _rows_checked(M, check_rows)
    sub = raw[rows]
    ref = matvec_q8_reference(sub, Q6, len(rows), K, xq_h, xd_h)
    scale = np.abs(dequantize(sub.reshape(-1), Q6, (len(rows), K)).astype(np.float64)) \
        @ np.abs(dequantize_act_q8(xq_h, xd_h))
    print(f"# {M}x{K}: data ready in {time.time() - t0:.1f} s ({nbytes / 1e6:.0f} MB, "
          f"{copies} copies, {n} launches a replay)", flush=True)

    def timed(name, parts, make_copy, launch):
        ws = [make_copy() for _ in range(copies)]
        y.copy_to_device(np.full(M, np.nan, np.float32), stream=stream)
        launch(ws[0])                                # compile + load before capture
        stream.synchronize()
        with CudaGraph.capture(stream) as graph:
            for i in range(n):
                launch(ws[i % copies])
        ms = event_ms(graph.replay, stream, replays=REPLAYS, warmup=WARMUP)
        graph.close()
        out = y.copy_to_host(stream=stream)
        stream.synchronize()
        del ws
        got = out[rows].astype(np.float64)
        err = float(np.max(np.abs(got - ref) / np.maximum(scale, 1e-30)))
        if not np.all(np.isfinite(out)):
            err = float("inf")
        us = ms * 1e3 / n
        return dict(kernel=name, parts=parts, us=us, gbs=nbytes / (us * 1e-6) / 1e9,
                    max_rel_err=err, launches=n, copies=copies, bytes=nbytes)

    results = [timed("dp4a", warps_per_row(M, K), lambda: cuda.to_device(raw, stream=stream),
                     lambda w: launch_matvec_q8(w, Q6, M, K, xq, xd, y, stream=stream))]
    for p in parts_list:
        parts = warps_per_row(M, K) if p == "auto" else int(p)
        label = "q6k_r" if p == "auto" else f"q6k_r/p{parts}"
        results.append(timed(
            label, parts,
            lambda: (cuda.to_device(body, stream=stream), cuda.to_device(d, stream=stream)),
            lambda w, parts=parts: launch_matvec_q8_q6k_r(w[0], w[1], M, K, xq, xd, y,
                                                          stream=stream, parts=parts)))
    return results


def main() -> int:
    global L2_BYTES, REPLAYS, WARMUP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--parts", default="auto,1,2",
                    help="comma list of warps per row for q6k_r rows: auto (warps_per_row), 1, 2, 4")
    ap.add_argument("--shapes", default="all", help="all, or comma list of MxK (e.g. 4096x12288)")
    ap.add_argument("--check-rows", type=int, default=512)
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="run in numba's CUDA simulator on tiny shapes (checks the script, no timing value)")
    args = ap.parse_args()
    out_path = Path(args.jsonl) if args.jsonl else \
        Path(os.environ.get("OUT", ".")) / "matvec_q6k_bench.jsonl"
    parts_list = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in parts_list:
        if p not in ("auto", "1", "2", "4"):
            ap.error(f"--parts: {p!r} is not auto, 1, 2 or 4")

    shapes = SHAPES
    if args.shapes != "all":
        known = {f"{m}x{k}": (m, k, what) for m, k, what in SHAPES}
        shapes = []
        for s in (s.strip() for s in args.shapes.split(",") if s.strip()):
            m, k = (int(v) for v in s.split("x"))
            shapes.append(known.get(s, (m, k, "custom")))
    if args.smoke:
        L2_BYTES, REPLAYS, WARMUP = 1, 1, 0
        args.launches = 2
        shapes = SMOKE_SHAPES

    dev = cuda.get_current_device()
    name = getattr(dev, "name", "cuda-simulator")
    gpu = name.decode() if isinstance(name, bytes) else str(name)
    stream = cuda.stream()
    rng = np.random.default_rng(2026)
    t0 = time.time()
    roof = 1.0 if args.smoke else read_roofline_gbs(stream)
    print(f"# {gpu}: read roofline (16-byte ld.global.nc, 1 GiB) {roof:.0f} GB/s", flush=True)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    commit = _commit()
    table, bad = [], False
    with open(out_path, "a") as f:
        for M, K, what in shapes:
            try:
                rows = bench_shape(M, K, args.launches, parts_list, args.check_rows, stream, rng)
            except Exception as e:                      # report and go on with the next shape
                print(f"# {M}x{K}: FAILED {type(e).__name__}: {e}", flush=True)
                bad = True
                continue
            base_us = rows[0]["us"]
            for r in rows:
                ok = r["max_rel_err"] <= REL_ERR_BAD
                bad |= not ok
                rec = dict(date=date, gpu=gpu, commit=commit, bench="matvec_q6k",
                           shape=f"{M}x{K}", M=M, K=K, qtype="Q6_K", what=what,
                           kernel=r["kernel"], parts=r["parts"], us=round(r["us"], 3),
                           gbs=round(r["gbs"], 1), pct=round(100 * r["gbs"] / roof, 1),
                           roofline_gbs=round(roof, 1), speedup_vs_dp4a=round(base_us / r["us"], 3),
                           max_rel_err=r["max_rel_err"], ok=ok, launches=r["launches"],
                           copies=r["copies"], bytes=r["bytes"], smoke=bool(args.smoke))
                f.write(json.dumps(rec) + "\n")
                table.append(rec)
                print(f"  {M:>6}x{K:<5} {r['kernel']:<9} p{r['parts']} {r['us']:9.2f} us "
                      f"{r['gbs']:7.0f} GB/s {rec['pct']:5.1f}%  x{rec['speedup_vs_dp4a']:.2f}  "
                      f"err {r['max_rel_err']:.1e}{'' if ok else '  BAD'}", flush=True)

    print(f"\nmatvec_q6k bench, {gpu}, commit {commit}, roofline {roof:.0f} GB/s "
          f"(us per launch include the graph's ~0.9 us launch gap)")
    print(f"{'shape':>13} {'what':<16} {'kernel':<9} {'parts':>5} {'us':>9} {'GB/s':>7} "
          f"{'%roof':>6} {'speedup':>7} {'max_rel_err':>11}")
    for r in table:
        print(f"{r['shape']:>13} {r['what']:<16} {r['kernel']:<9} {r['parts']:>5} {r['us']:9.2f} "
              f"{r['gbs']:7.0f} {r['pct']:6.1f} {r['speedup_vs_dp4a']:7.2f} {r['max_rel_err']:11.1e}"
              f"{'' if r['ok'] else '  BAD'}")
    print(f"# {len(table)} rows -> {out_path} ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
