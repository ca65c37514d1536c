"""Where decode attention's split pass spends its time, phase by phase, on the GPU.

    python3 bench/attention_phases.py [--n 32] [--positions 511,6143] [--kernels split,1ps]
                                      [--commit SHA] [--out F]

Decode attention is launched as the engine launches it (F16 cache of --ctx positions, the
output gate and int8 copy fused into the combine) N times over in one programmatic graph, as
bench/launch_chain.py does, with the split pass's instrumented build
(decode_attention.launch_split(trace=)): thread 0 of every block stamps %clock64 and
%globaltimer at decode_attention.TRACE_STAMPS (entry after the grid-dependency wait, plan,
q, the first tile's scores and softmax, all tiles, partial stored). The stamps of the last
repetition are read back and reduced over the working blocks:

  <a>-><b>     per-block time from stamp a to stamp b: median and max, in ns (globaltimer;
               its update period is the GPU's) and in SM cycles (clock64)
  span         first block's entry to last block's partial stored (ns)
  entry skew   last block's entry minus first block's (ns)

--kernels splitpw traces the split pass with its position, plan and prefetch before the
grid-dependency wait (decode_attention.SPLIT_PRE_WAIT; its "entry" stamp then follows the
wait, "plan" the q loads' issue). --kernels 1p,1pld,1ps,1psld traces the one-pass kernel
instead (engine.ONEPASS_MAX_CTX; "s":
with the token's RoPE and K / V store, "ld": its loads issued early; 1psldc2, c4, c8: on
thread-block clusters of that many blocks a head sharing out the warps, ONEPASS_CLUSTER and
ONEPASS_CLUSTER_SHARE; 1psldc2f, c4f: each block of the full width; 1psldpw: the position and
the prefetch before the grid-dependency wait, ONEPASS_PRE_WAIT, the default since session
46; 1psldw: after it), whose thread 0 of every
block (of rank 0 in a cluster: a query head) stamps decode_attention.TRACE_STAMPS_1P:
entry, the position known, the store done, q in shared memory, warp 0's first pair of
splits, every split, the combine's weights, its groups' sums, the output stored.

One JSON line per (shape, position, kernel, interval) goes to --out (default
$OUT/attention_phases.jsonl). Benchmarks are not tests; the stamps cost a few stores a block,
so the absolute times are the instrumented kernel's.
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
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.kernels import decode_attention  # noqa: E402
from bw24nb.switches import switched  # noqa: E402
from launch_chain import ATTENTION_SHAPES, attention_launch  # noqa: E402
from matvec_bench import _commit  # noqa: E402


# --kernels: the split pass, or the one-pass kernel (engine.ONEPASS_MAX_CTX) without / with
# the token's RoPE and K / V store, its loads in order / issued early (ONEPASS_EARLY)
KERNELS = {"split": None, "splitpw": None, "1p": dict(store=False, early=False),
           "1pld": dict(store=False, early=True), "1ps": dict(store=True, early=False),
           "1psld": dict(store=True, early=True),
           **{f"1psldc{n}": dict(store=True, early=True, cluster=n, share=True)
              for n in (2, 4, 8)},
           **{f"1psldc{n}f": dict(store=True, early=True, cluster=n, share=False)
              for n in (2, 4)},
           "1psldpw": dict(store=True, early=True, pre_wait=True),
           "1psldw": dict(store=True, early=True, pre_wait=False)}


def traced_attention(stream, rng, Hq, Hkv, D, ctx, position, kind="split"):
    """(launch, trace, stamp names): launch_chain.attention_launch's decode attention at
    `position`, its split pass (kind "split") or its one-pass kernel (KERNELS) stamping into
    `trace` (decode_attention.trace_shape / trace_shape_1p)."""
    run = attention_launch(stream, rng, Hq, Hkv, D, ctx, position)
    if KERNELS[kind] is None:
        trace = cuda.to_device(np.zeros(decode_attention.trace_shape(1, Hkv, run.n_splits),
                                        np.uint64), stream=stream)
        return ((lambda: run(trace=trace, pre_wait=kind == "splitpw")), trace,
                decode_attention.TRACE_STAMPS)
    trace = cuda.to_device(np.zeros(decode_attention.trace_shape_1p(1, Hq), np.uint64),
                           stream=stream)
    options = dict(KERNELS[kind])
    share = options.pop("share", decode_attention.ONEPASS_CLUSTER_SHARE)
    pre_wait = options.pop("pre_wait", decode_attention.ONEPASS_PRE_WAIT)

    def launch():
        with switched([(decode_attention, "ONEPASS_CLUSTER_SHARE", share),
                       (decode_attention, "ONEPASS_PRE_WAIT", pre_wait)]):
            run(trace=trace, onepass=True, **options)
    return launch, trace, decode_attention.TRACE_STAMPS_1P


def reduce_stamps(stamps, names=None) -> dict:
    """{interval: (median ns, max ns, median cycles)} over the blocks that ran every phase,
    plus "span" and "entry skew" (ns); stamps [.., 2, n_stamps] uint64 as the trace holds
    them; names: the stamps' (default the split pass's TRACE_STAMPS)."""
    names = decode_attention.TRACE_STAMPS if names is None else names
    st = stamps.reshape(-1, 2, len(names)).astype(np.int64)
    working = st[(st[:, 0, :] > 0).all(axis=1)]
    res = {}
    for a in range(len(names) - 1):
        ns = working[:, 1, a + 1] - working[:, 1, a]
        cyc = working[:, 0, a + 1] - working[:, 0, a]
        res[f"{names[a]}->{names[a + 1]}"] = (float(np.median(ns)), float(ns.max()),
                                               float(np.median(cyc)))
    ns = working[:, 1, -1] - working[:, 1, 0]
    res[f"{names[0]}->{names[-1]}"] = (float(np.median(ns)), float(ns.max()),
                                       float(np.median(working[:, 0, -1] - working[:, 0, 0])))
    entries = st[:, 1, 0][st[:, 1, 0] > 0]
    res["span"] = (float(working[:, 1, -1].max() - entries.min()),) * 2 + (0.0,)
    res["entry skew"] = (float(entries.max() - entries.min()),) * 2 + (0.0,)
    res["blocks"] = (float(len(working)), float(len(entries)), 0.0)     # working, entered
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32, help="repetitions per graph")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--positions", default="511,6143")
    ap.add_argument("--shapes", default=",".join(ATTENTION_SHAPES))
    ap.add_argument("--kernels", default="split",
                    help=f"comma list of {', '.join(KERNELS)} (sequence names get /KIND)")
    ap.add_argument("--per-key", action="store_true",
                    help="each kernel also with decode_attention.FULL_GROUPS off (names get /pk)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    gpu = getattr(cuda.get_current_device(), "name", "simulator")
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    commit = a.commit or _commit()
    out = a.out or os.path.join(os.environ.get("OUT", "."), "attention_phases.jsonl")
    with open(out, "a") as f:
        for tag in [s for s in a.shapes.split(",") if s]:
            Hq, Hkv, D = ATTENTION_SHAPES[tag]
            for p, kind, pk in [(int(v), k, pk) for v in a.positions.split(",") if v
                                for k in a.kernels.split(",") if k
                                for pk in ((False, True) if a.per_key else (False,))]:
                seq = (f"attn{tag}@{p}" + ("" if kind == "split" else f"/{kind}")
                       + ("/pk" if pk else ""))
                # (the kernels are chosen at launch: the capture runs under the switch)
                with switched([(decode_attention, "FULL_GROUPS", not pk)]):
                    launch, trace, names = traced_attention(stream, rng, Hq, Hkv, D, a.ctx, p,
                                                            kind)
                    launch()                            # compiled and loaded before capture
                    stream.synchronize()
                    with CudaGraph.capture(stream, programmatic=True) as g:
                        for _ in range(a.n):
                            launch()
                for _ in range(3):
                    g.replay(stream)
                stream.synchronize()
                g.close()
                res = reduce_stamps(trace.copy_to_host(), names)
                for name, (med, mx, cyc) in res.items():
                    print(f"{seq} {name:18s} " + (
                        f"{med:.0f} of {mx:.0f} ran every phase" if name == "blocks" else
                        f"median {med:9.0f} ns  max {mx:9.0f} ns  median {cyc:9.0f} cycles"),
                        flush=True)
                    f.write(json.dumps({"date": date, "gpu": gpu, "commit": commit,
                                        "sequence": seq, "interval": name,
                                        "median_ns": med, "max_ns": mx, "median_cycles": cyc,
                                        "n": a.n, "note": a.note}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
