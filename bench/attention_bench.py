"""Decode attention (split-K + combine) on the GPU: time per launch pair vs the split's minimum
chunk, at the real models' head shapes and two context lengths.

    python3 bench/attention_bench.py [--jsonl PATH] [--chunks 8,16,32,64,128] [--kv q8,f16]
                                     [--plans 1:256,128:1024] [--splits-ctx 8192]

Each configuration is captured once into a CUDA graph and replayed (CUDA events around 50
replays, median of 5 such runs), so the ~16 us eager launch cost stays out; the first
configuration of each shape is checked against the numpy reference on the cache's dequantized
contents before anything is timed. Records go to --jsonl (and $OUT/attention.jsonl).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SHAPES = {          # name: (Hq, Hkv, D)
    "qwen2.5-0.5b": (14, 2, 64),
    "qwen3.5-9b": (16, 4, 256),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", default=str(ROOT / "research" / "tune-data" / "attention.jsonl"))
    ap.add_argument("--chunks", default="8,16,32,64,128")
    ap.add_argument("--contexts", default="512,6144")
    ap.add_argument("--plans", default="default",
                    help="comma list of chunk_align:combine_threads pairs side by side (the rest "
                         "of the split plan, attention.launch_flash_decode); default = the "
                         "library's")
    ap.add_argument("--splits-ctx", type=int, default=0,
                    help="size the split count for this cache length (the engine sizes it for "
                         "its n_ctx, run_bench's 8192); 0 = the benchmark's own cache")
    ap.add_argument("--kv", default="q8,f16",
                    help="cache types side by side: q8 = Q8_0 K / Q5_1 V (attention.py's tile "
                         "kernel), f16 = F16 K and V (decode_attention.py's lane-per-key kernel)")
    args = ap.parse_args(argv)
    from numba import cuda

    from bw24nb.cache.kv import KV_CACHE_KINDS, KVCache
    from bw24nb.graph import CudaGraph
    from bw24nb.kernels import attention
    from bw24nb.reference import ops

    rng = np.random.default_rng(7)
    gpu = cuda.get_current_device().name
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    commit = os.environ.get("BW24_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    paths = [Path(args.jsonl)] + ([Path(os.environ["OUT"]) / "attention.jsonl"] if os.environ.get("OUT") else [])
    records = []
    stream = cuda.stream()
    from bw24nb.kernels import decode_attention
    for name, (Hq, Hkv, D), kv_name, ctx_len in (
            (n, s, kvn, int(c)) for n, s in SHAPES.items() for c in args.contexts.split(",")
            for kvn in args.kv.split(",")):
        kt, vt = KV_CACHE_KINDS[kv_name]
        path = ("decode_attention (lane per key)" if decode_attention.supports(Hq // Hkv, D, kt, vt)
                else "attention.flash_decode_split (tiles)")
        cap = ctx_len + 64
        kv = KVCache(1, Hkv, D, cap, kt, vt)
        k = rng.standard_normal((cap, Hkv, D)).astype(np.float32)
        v = rng.standard_normal((cap, Hkv, D)).astype(np.float32)
        kv.store(0, cuda.to_device(k), cuda.to_device(v), cuda.to_device(np.arange(cap, dtype=np.int32)))
        layer = kv.layer(0)
        q = rng.standard_normal((1, Hq, D)).astype(np.float32)
        q_dev = cuda.to_device(q)
        pos = cuda.to_device(np.array([ctx_len - 1], np.int32))
        out = cuda.device_array((1, Hq, D), np.float32)
        n_splits = attention.decode_splits(args.splits_ctx or cap, Hkv)
        part_ml, part_acc = attention.alloc_decode_partials(1, Hq, D, n_splits)
        kd, vd = kv.read(0, ctx_len)
        want = ops.attention(q, kd, vd, causal_offset=ctx_len - 1)
        plans = [(attention.DECODE_CHUNK_ALIGN, attention.COMBINE_THREADS)
                 if p == "default" else tuple(int(x) for x in p.split(":"))
                 for p in args.plans.split(",")]
        for chunk, (align, cthreads) in ((int(c), pl) for c in args.chunks.split(",")
                                         for pl in plans):
            def launch():
                attention.launch_flash_decode(q_dev, pos, layer[0], layer[1], kt,
                                              layer[2], layer[3], vt, out, part_ml,
                                              part_acc, stream=stream, min_chunk=chunk,
                                              chunk_align=align, combine_threads=cthreads)
            launch()
            stream.synchronize()
            err = float(np.abs(out.copy_to_host() - want).max() / np.abs(want).max())
            with CudaGraph.capture(stream) as g:
                launch()
            times = []
            for _ in range(5):
                a, b = cuda.event(), cuda.event()
                a.record(stream)
                for _ in range(50):
                    g.replay(stream)
                b.record(stream)
                b.synchronize()
                times.append(cuda.event_elapsed_time(a, b) / 50 * 1000.0)
            g.close()
            us = statistics.median(times)
            # the kernels' own plan, run on the host (the device function's Python source)
            _, _, used = attention._split_plan.py_func(ctx_len - 1, cap, n_splits, chunk, align)
            rec = dict(date=_dt.date.today().isoformat(), gpu=gpu, commit=commit, shape=name,
                       Hq=Hq, Hkv=Hkv, D=D, context=ctx_len, n_splits=n_splits,
                       min_chunk=chunk, chunk_align=align, combine_threads=cthreads,
                       used_splits=used, metric="decode_attention_us",
                       value=round(us, 2), unit="us", max_rel_err=err, kv=kv_name,
                       path=path,
                       note=f"split + combine, one graph replay, {kt.name} K / {vt.name} V")
            records.append(rec)
            print(f"{name:14s} {kv_name:3s} ctx {ctx_len:5d} min_chunk {chunk:4d} align {align:3d} "
                  f"combine {cthreads:4d} splits {used:4d}: "
                  f"{us:8.2f} us  (rel err {err:.1e})")
            if err > 2e-3:
                print("  ERROR: result does not match the reference")
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
