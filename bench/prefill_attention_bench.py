"""The rows prefill's attention on the GPU: decode's split-K kernels over a chunk of T tokens.

    python3 bench/prefill_attention_bench.py [--jsonl PATH] [--T 128] [--starts 0,384]
                                             [--ctx 8192] [--shapes 35b,9b] [--grids 0,8,16]

The exact MoE prefill (Engine prefill_path "rows") runs `attention.launch_flash_decode` over a
128-token chunk with decode's split count (sized for the engine's whole context: 132 splits
for the 35B-A3B heads at 8192), so that each token gets its decode step's plan and bits. A
chunk deep in a short prompt uses few of those splits; the rest are blocks that load the
position, find no keys and leave. This times, per shape and chunk start, one graph replay of:

  * the split pass and the combine (`only=`), and both, with decode's split count;
  * each of those with a one-tile split on one warp (spread=False, the form before session
    26) beside the default, its rows spread over the four warps;
  * the split pass with `grid` blocks a (token, KV head) walking its splits
    (decode_attention.launch_split(grid=)): the same plan, the same bits;
  * the split pass on partials of just enough splits for the chunk (each token's chunk is
    still min_chunk keys there, so the same work): what the empty blocks cost.

Every variant's output is compared with the decode-split run bit for bit (`same`), and that
run with the numpy reference. Each variant is captured N times into one CUDA graph and timed
by bench/matmul_q8_bench.py's `time_per_launch_us` (session 26's calls 1 and 2 replayed a
graph of one launch instead, 20 times: their figures include a graph launch each). Records
go to --jsonl (and $OUT/prefill_attention.jsonl).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

SHAPES = {          # name: (Hq, Hkv, D)
    "35b": (16, 2, 256),
    "9b": (16, 4, 256),
    "0.5b": (14, 2, 64),
    "tiny": (4, 2, 32),         # a simulator smoke run
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", default=str(ROOT / "research" / "tune-data" / "prefill_attention.jsonl"))
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--starts", default="0,384")
    ap.add_argument("--ctx", type=int, default=8192, help="the engine's context (sizes the splits)")
    ap.add_argument("--shapes", default="35b,9b")
    ap.add_argument("--grids", default="0,8,16",
                    help="blocks a (token, KV head) for the walking split pass; 0 = none")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    from matmul_q8_bench import _commit, _gpu_name, time_per_launch_us
    from numba import cuda

    from bw24nb.cache.kv import KV_CACHE_KINDS, KVCache
    from bw24nb.device import simulator_enabled
    from bw24nb.kernels import attention, decode_attention
    from bw24nb.reference import ops

    rng = np.random.default_rng(11)
    gpu, commit = _gpu_name(), _commit(args.commit)
    smoke = simulator_enabled()
    paths = [Path(args.jsonl)] + ([Path(os.environ["OUT"]) / "prefill_attention.jsonl"]
                                  if os.environ.get("OUT") else [])
    records = []
    stream = cuda.stream()
    T = args.T
    kt, vt = KV_CACHE_KINDS["f16"]
    grids = [int(g) for g in args.grids.split(",") if int(g) > 0]

    def _us(launch):
        return time_per_launch_us(launch, stream, smoke)[0]

    def rec(**kw):
        r = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), gpu=gpu,
                 commit=commit, T=T, ctx=args.ctx, unit="us", note=args.note, **kw)
        records.append(r)
        print(f"  {kw['shape']:5s} start {kw['start']:5d} {kw['variant']:28s} "
              f"{kw['value']:9.2f} us" + ("" if kw.get("same") is None else
                                         f"  same={kw['same']}"))

    for name in args.shapes.split(","):
        Hq, Hkv, D = SHAPES[name]
        for start in (int(s) for s in args.starts.split(",")):
            cap = args.ctx
            n = start + T
            kv = KVCache(1, Hkv, D, cap, kt, vt)
            k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
            v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
            kv.store(0, cuda.to_device(k), cuda.to_device(v),
                     cuda.to_device(np.arange(n, dtype=np.int32)))
            layer = kv.layer(0)
            q = rng.standard_normal((T, Hq, D)).astype(np.float32)
            q_dev = cuda.to_device(q)
            pos = cuda.to_device(np.arange(start, start + T, dtype=np.int32))
            S = attention.decode_splits(cap, Hkv)
            S_min = -(-n // attention.DECODE_MIN_CHUNK)      # keeps every chunk at min_chunk

            def run(S_, only=None, grid=None, out=None, spread=None):
                ml, acc = attention.alloc_decode_partials(T, Hq, D, S_)
                out = cuda.device_array((T, Hq, D), np.float32) if out is None else out

                def launch():
                    if grid is not None:
                        decode_attention.launch_split(
                            q_dev, pos, layer[0], layer[2], attention._scale(None, D),
                            attention.DECODE_MIN_CHUNK, attention.DECODE_CHUNK_ALIGN, ml, acc,
                            stream, grid=grid, spread=spread)
                        attention.launch_flash_decode(
                            q_dev, pos, layer[0], layer[1], kt, layer[2], layer[3], vt, out,
                            ml, acc, stream=stream, only="combine")
                    else:
                        attention.launch_flash_decode(
                            q_dev, pos, layer[0], layer[1], kt, layer[2], layer[3], vt, out,
                            ml, acc, stream=stream, only=only, spread=spread)
                return launch, out

            launch, out = run(S)
            launch()
            stream.synchronize()
            base = out.copy_to_host()
            kd, vd = kv.read(0, n)
            err = 0.0
            for t in (0, T // 2, T - 1):        # the reference, a few tokens (float64: slow)
                want = ops.attention(q[t:t + 1], kd[:start + t + 1], vd[:start + t + 1],
                                     causal_offset=start + t)
                err = max(err, float(np.abs(base[t:t + 1] - want).max() / np.abs(want).max()))
            print(f"{name} start {start}: decode splits {S}, enough {S_min}, rel err {err:.1e}"
                  + ("  ERROR" if err > 2e-3 else ""))
            rec(shape=name, start=start, variant=f"split+combine S={S}", metric="us",
                value=_us(launch), max_rel_err=err, n_splits=S)
            rec(shape=name, start=start, variant=f"split S={S}", metric="us", n_splits=S,
                value=_us(run(S, only="split")[0]))
            rec(shape=name, start=start, variant=f"split S={S} one warp", metric="us",
                n_splits=S, value=_us(run(S, only="split", spread=False)[0]))
            rec(shape=name, start=start, variant=f"combine S={S}", metric="us", n_splits=S,
                value=_us(run(S, only="combine")[0]))
            for S_ in sorted({S_min, max(S_min, 8)}):
                if S_ >= S:
                    continue
                lx, ox = run(S_)
                lx()
                stream.synchronize()
                same = bool(np.array_equal(ox.copy_to_host(), base))
                rec(shape=name, start=start, variant=f"split+combine S={S_}", metric="us",
                    n_splits=S_, value=_us(lx), same=same)
                rec(shape=name, start=start, variant=f"split S={S_}", metric="us", n_splits=S_,
                    value=_us(run(S_, only="split")[0]))
            for g in grids:
                if not decode_attention.walks(g):
                    continue
                lx, ox = run(S, grid=g)
                lx()
                stream.synchronize()
                same = bool(np.array_equal(ox.copy_to_host(), base))
                rec(shape=name, start=start, variant=f"walk{g}+combine S={S}", metric="us",
                    n_splits=S, grid=g, value=_us(lx), same=same)
                lx, ox = run(S, grid=g, spread=False)
                lx()
                stream.synchronize()
                same = bool(np.array_equal(ox.copy_to_host(), base))
                rec(shape=name, start=start, variant=f"walk{g}+combine S={S} one warp",
                    metric="us", n_splits=S, grid=g, value=_us(lx), same=same)
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
