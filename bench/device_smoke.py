"""One run on a real GPU: are the PTX snippets right, and what do they buy?

    python3 bench/device_smoke.py [--gib 4] [--out PATH]

(a) exactness: every bw24nb.ptx snippet (inline and linked) against its Python twin and numpy;
(b) launch cost: eager Numba launches vs the same kernels replayed from a CUDA graph;
(c) read bandwidth over a --gib GiB uint32 buffer: scalar 4-byte loads, four independent 4-byte
    loads per iteration, 16-byte ld.global.nc.v4.u32 — and a device-to-device copy for scale;
(d) dp4a throughput, inline asm vs a linked .func call; int8 mma.sync throughput (inline).

Timings are CUDA-event medians of >= 5 runs after warm-up. Prints a table, writes one JSON line
per metric (date, gpu, commit, metric, value, unit, config) to $OUT/device_smoke.jsonl (or
--out), and exits 1 if any exactness check failed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # a PYTHONPATH export did not always reach python3 there

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.ptx import (  # noqa: E402
    dp4a,
    dp4a_linked,
    ld_nc_v4_u32,
    mma_layout,
    mma_s8_m16n8k32,
    probes,
    twins,
)

REPEATS = 7
WARMUP = 2
THREADS = 256


# --- kernels used only here ----------------------------------------------------------------------

@cuda.jit
def bump(x):
    if cuda.grid(1) == 0:
        x[0] += 1


@cuda.jit
def fill_hash(buf):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < buf.size:
        buf[i] = (i * 2654435761) & 0xFFFFFFFF
        i += stride


@cuda.jit
def read_scalar(src, out):
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = src[0] ^ src[0]
    i = tid
    while i < src.size:
        acc ^= src[i]
        i += stride
    out[tid] = acc


@cuda.jit
def read_scalar_x4(src, out):
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    n = src.size
    acc = src[0] ^ src[0]
    i = tid
    while i + 3 * stride < n:
        a = src[i]
        b = src[i + stride]
        c = src[i + 2 * stride]
        d = src[i + 3 * stride]
        acc ^= a ^ b ^ c ^ d
        i += 4 * stride
    while i < n:
        acc ^= src[i]
        i += stride
    out[tid] = acc


@cuda.jit
def read_v4(src, out):
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = src[0] ^ src[0]
    j = tid
    while j < src.size // 4:
        v0, v1, v2, v3 = ld_nc_v4_u32(src, 4 * j)
        acc ^= v0 ^ v1 ^ v2 ^ v3
        j += stride
    out[tid] = acc


DP4A_ITERS = 4096


@cuda.jit
def dp4a_throughput(out, seed):
    tid = cuda.grid(1)
    b = seed ^ tid
    a0 = b * 3
    a1 = b * 5
    a2 = b * 7
    a3 = b * 11
    c0 = tid
    c1 = tid + 1
    c2 = tid + 2
    c3 = tid + 3
    for _ in range(DP4A_ITERS):
        c0 = dp4a(a0, b, c0)
        c1 = dp4a(a1, b, c1)
        c2 = dp4a(a2, b, c2)
        c3 = dp4a(a3, b, c3)
    out[tid] = c0 ^ c1 ^ c2 ^ c3


@cuda.jit
def dp4a_linked_throughput(out, seed):
    tid = cuda.grid(1)
    b = seed ^ tid
    a0 = b * 3
    a1 = b * 5
    a2 = b * 7
    a3 = b * 11
    c0 = tid
    c1 = tid + 1
    c2 = tid + 2
    c3 = tid + 3
    for _ in range(DP4A_ITERS):
        c0 = dp4a_linked(a0, b, c0)
        c1 = dp4a_linked(a1, b, c1)
        c2 = dp4a_linked(a2, b, c2)
        c3 = dp4a_linked(a3, b, c3)
    out[tid] = c0 ^ c1 ^ c2 ^ c3


MMA_ITERS = 2048


@cuda.jit
def mma_throughput(out, seed):
    tid = cuda.grid(1)
    a = seed ^ tid
    # two independent accumulator sets keep two MMAs in flight per warp
    x0 = x1 = x2 = x3 = tid
    y0 = y1 = y2 = y3 = tid + 1
    for _ in range(MMA_ITERS):
        x0, x1, x2, x3 = mma_s8_m16n8k32(a, a + 1, a + 2, a + 3, a + 4, a + 5, x0, x1, x2, x3)
        y0, y1, y2, y3 = mma_s8_m16n8k32(a + 6, a + 7, a + 8, a + 9, a, a + 1, y0, y1, y2, y3)
    out[tid] = x0 ^ x1 ^ x2 ^ x3 ^ y0 ^ y1 ^ y2 ^ y3


# --- measurement helpers --------------------------------------------------------------------------

def event_ms(launch, stream, repeats=REPEATS, warmup=WARMUP) -> float:
    """Median milliseconds of ``launch()`` on ``stream``, by CUDA events (in numba's CUDA
    simulator, which has no events, by the wall clock: a smoke test's number, not a time).
    The one timer of bench/: matvec_bench (and the scripts importing it from there) use it."""
    for _ in range(warmup):
        launch()
    stream.synchronize()
    times = []
    if not hasattr(cuda, "event_elapsed_time"):
        for _ in range(repeats):
            t = time.perf_counter()
            launch()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record(stream)
        launch()
        stop.record(stream)
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return statistics.median(times)


class Report:
    def __init__(self, out_path: Path):
        self.out_path = out_path
        self.rows: list[dict] = []
        self.failures: list[str] = []
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        self.base = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "gpu": name,
            "cc": "%d.%d" % dev.compute_capability,
            "commit": _git_commit(),
        }

    def add(self, metric: str, value, unit: str, **config) -> None:
        row = dict(self.base, metric=metric, value=value, unit=unit, config=config)
        self.rows.append(row)
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {metric:<40} {shown:>12} {unit:<10} {json.dumps(config) if config else ''}",
              flush=True)

    def check(self, metric: str, ok: bool, detail: str = "") -> None:
        config = {"detail": detail} if detail else {}
        self.add(metric, int(bool(ok)), "pass", **config)
        if not ok:
            self.failures.append(f"{metric} {detail}")

    def section(self, title: str, fn) -> None:
        print(f"\n{title}", flush=True)
        try:
            fn(self)
        except Exception as exc:
            traceback.print_exc()
            self.check(f"{title.split()[0]}_ran", False, f"{type(exc).__name__}: {exc}")

    def write(self) -> None:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out_path, "a") as f:
            for row in self.rows:
                f.write(json.dumps(row) + "\n")
        print(f"\nwrote {len(self.rows)} records to {self.out_path}")


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


# --- (a) exactness --------------------------------------------------------------------------------

def exactness(rep: Report) -> None:
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    n = 4096
    a, b, c = (rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(3))
    twin = np.array([twins.dp4a(x, y, z) for x, y, z in zip(a, b, c)], np.int32)
    ref = mma_layout.wrap_int32((a.view(np.int8).reshape(-1, 4).astype(np.int64)
                                 * b.view(np.int8).reshape(-1, 4)).sum(1) + c)
    rep.check("exact_twin_dp4a_vs_numpy", np.array_equal(twin, ref))
    rep.check("exact_dp4a_inline", np.array_equal(probes.run_dp4a(a, b, c), twin))
    rep.check("exact_dp4a_linked", np.array_equal(probes.run_dp4a(a, b, c, linked=True), twin))

    tiles, k = 64, 128
    at = rng.integers(-128, 128, (tiles, 16, k)).astype(np.int8)
    bt = rng.integers(-128, 128, (tiles, k, 8)).astype(np.int8)
    ct = rng.integers(-2**31, 2**31, (tiles, 16, 8), dtype=np.int64).astype(np.int32)
    d = probes.run_mma(at, bt, ct)
    ok = all(np.array_equal(d[t], mma_layout.mma_tile(at[t], bt[t], ct[t])) for t in range(tiles))
    rep.check("exact_mma_s8_m16n8k32_inline_k128", ok)
    d1 = probes.run_mma(at[:, :, :32], bt[:, :32], ct, linked=True)
    ok = all(np.array_equal(d1[t], mma_layout.unpack_c(twins.mma_s8_m16n8k32_warp(
        mma_layout.pack_a(at[t, :, :32]), mma_layout.pack_b(bt[t, :32]), mma_layout.pack_c(ct[t]))))
        for t in range(tiles))
    rep.check("exact_mma_s8_m16n8k32_linked", ok)
    wrap = probes.run_mma(np.full((1, 16, 32), 127, np.int8), np.full((1, 32, 8), 127, np.int8),
                          np.full((1, 16, 8), 2**31 - 1000, np.int32))
    rep.check("exact_mma_s32_wraps", bool((wrap == np.int32(-2**31 + 32 * 127 * 127 - 1000)).all()))

    codes = np.arange(256, dtype=np.uint8)
    f16x2, f32x2, f32 = probes.run_fp4(codes)
    tw_h = np.array([twins.fp4x2_to_f16x2(x) for x in codes], np.uint32)
    tw_f = np.array([twins.fp4x2_to_f32x2(x) for x in codes], np.float32).reshape(-1)
    rep.check("exact_fp4x2_to_f16x2", np.array_equal(f16x2, tw_h))
    rep.check("exact_fp4x2_to_f32x2", np.array_equal(f32x2, tw_f)
              and np.array_equal(np.signbit(f32x2), np.signbit(tw_f)))
    rep.check("exact_fp4_e2m1_to_f32", np.array_equal(f32, tw_f)
              and np.array_equal(np.signbit(f32), np.signbit(tw_f)))
    rep.check("exact_fp4x2_to_f16x2_linked", np.array_equal(probes.run_fp4_linked(codes), tw_h))

    src = rng.integers(0, 2**32, 4 * 100_003, dtype=np.uint64).astype(np.uint32)
    rep.check("exact_ld_nc_v4_u32", np.array_equal(probes.run_ld_nc_v4(src), src))


# --- (b) launch cost ------------------------------------------------------------------------------

def launch_cost(rep: Report) -> None:
    kernels = 200
    stream = cuda.stream()
    x = cuda.to_device(np.zeros(1, np.int64), stream=stream)
    bump[1, 32, stream](x)                     # compile + load before anything is timed
    stream.synchronize()

    eager = []
    for _ in range(WARMUP + REPEATS):
        t0 = time.perf_counter()
        for _ in range(kernels):
            bump[1, 32, stream](x)
        stream.synchronize()
        eager.append((time.perf_counter() - t0) / kernels * 1e6)
    rep.add("launch_eager_per_kernel", statistics.median(eager[WARMUP:]), "us",
            kernels=kernels, measured="host wall clock, launches + one sync")

    with CudaGraph.capture(stream) as graph:
        for _ in range(kernels):
            bump[1, 32, stream](x)
    rep.check("graph_nodes_equal_launches", graph.num_nodes == kernels, f"{graph.num_nodes} nodes")
    before = int(x.copy_to_host(stream=stream)[0])
    ms = event_ms(graph.replay, stream)
    after = int(x.copy_to_host(stream=stream)[0])
    rep.check("graph_replays_every_kernel", after - before == kernels * (WARMUP + REPEATS),
              f"counter advanced {after - before}")
    rep.add("launch_graph_per_kernel", ms * 1e3 / kernels, "us", kernels=kernels,
            measured="CUDA events around graph.replay()")
    host = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - t0) * 1e6)
        stream.synchronize()
    rep.add("graph_replay_host_call", statistics.median(host), "us", kernels=kernels,
            measured="host time of the replay() call alone")
    graph.close()


# --- (c) read bandwidth ---------------------------------------------------------------------------

def bandwidth(rep: Report, gib: float) -> None:
    dev = cuda.get_current_device()
    sms = dev.MULTIPROCESSOR_COUNT
    n = int(gib * 2**30) // 4 // 4 * 4
    nbytes = n * 4
    stream = cuda.stream()
    src = cuda.device_array(n, np.uint32, stream=stream)
    fill_hash[sms * 8, THREADS, stream](src)
    stream.synchronize()

    xors = {}
    for blocks_per_sm in (4, 8):
        blocks = sms * blocks_per_sm
        out = cuda.device_array(blocks * THREADS, np.uint32, stream=stream)
        for name, kern in (("scalar_4B", read_scalar), ("scalar_4B_x4", read_scalar_x4),
                           ("ld_nc_v4_16B", read_v4)):
            ms = event_ms(lambda: kern[blocks, THREADS, stream](src, out), stream)
            xors[(name, blocks_per_sm)] = int(np.bitwise_xor.reduce(out.copy_to_host(stream=stream)))
            rep.add(f"read_bw_{name}", nbytes / (ms * 1e-3) / 1e12, "TB/s", gib=gib,
                    blocks=blocks, threads=THREADS, ms=round(ms, 4))
    rep.check("read_kernels_agree_on_xor", len(set(xors.values())) == 1,
              f"{len(set(xors.values()))} distinct totals")

    half = n // 2
    dst = cuda.device_array(half, np.uint32, stream=stream)
    ms = event_ms(lambda: dst.copy_to_device(src[:half], stream=stream), stream)
    rep.add("d2d_copy_read_plus_write", 2 * half * 4 / (ms * 1e-3) / 1e12, "TB/s",
            gib=gib / 2, ms=round(ms, 4))
    del src, dst


# --- (d) dp4a inline vs linked, mma throughput ----------------------------------------------------

def compute(rep: Report) -> None:
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks = sms * 8
    stream = cuda.stream()
    out_inline = cuda.device_array(blocks * THREADS, np.int32, stream=stream)
    out_linked = cuda.device_array(blocks * THREADS, np.int32, stream=stream)
    seed = np.int32(0x1234567)
    ops = blocks * THREADS * DP4A_ITERS * 4
    for name, kern, out in (("dp4a_inline", dp4a_throughput, out_inline),
                            ("dp4a_linked", dp4a_linked_throughput, out_linked)):
        ms = event_ms(lambda: kern[blocks, THREADS, stream](out, seed), stream)
        rep.add(f"{name}_throughput", ops / (ms * 1e-3) / 1e12, "Tdp4a/s", blocks=blocks,
                threads=THREADS, iters=DP4A_ITERS, ms=round(ms, 4))
    rep.check("dp4a_inline_equals_linked", np.array_equal(out_inline.copy_to_host(stream=stream),
                                                         out_linked.copy_to_host(stream=stream)))

    out = cuda.device_array(blocks * THREADS, np.int32, stream=stream)
    ms = event_ms(lambda: mma_throughput[blocks, THREADS, stream](out, seed), stream)
    warps = blocks * THREADS // 32
    flops = warps * MMA_ITERS * 2 * (2 * 16 * 8 * 32)
    rep.add("mma_s8_m16n8k32_throughput", flops / (ms * 1e-3) / 1e12, "TOPS", blocks=blocks,
            threads=THREADS, iters=MMA_ITERS, chains_per_warp=2, ms=round(ms, 4))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0, help="read-bandwidth buffer size (GiB)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSONL output (default $OUT/device_smoke.jsonl, else ./device_smoke.jsonl)")
    args = ap.parse_args()
    out = args.out or Path(os.environ.get("OUT", ".")) / "device_smoke.jsonl"

    if not cuda.is_available():
        print("no CUDA GPU visible: this script is for the device machine", file=sys.stderr)
        return 2
    rep = Report(out)
    print(f"{rep.base['gpu']} (cc {rep.base['cc']}), commit {rep.base['commit']}")
    rep.section("exactness of the PTX snippets vs twins and numpy", exactness)
    rep.section("launch cost: eager vs CUDA graph replay", launch_cost)
    rep.section("read bandwidth", lambda r: bandwidth(r, args.gib))
    rep.section("compute: dp4a inline vs linked, int8 mma", compute)
    rep.write()
    if rep.failures:
        print("\nFAILED:\n  " + "\n  ".join(rep.failures))
        return 1
    print("\nall exactness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
