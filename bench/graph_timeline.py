"""A timeline of the decode (or verify) graph: when each kernel of a replay starts and ends.

    python3 bench/graph_timeline.py MODEL.gguf [--launch default,pdl] [--steps 8]
        [--context 512] [--verify K] [--csv-dir DIR] [--jsonl PATH] [--commit SHA]
    python3 bench/graph_timeline.py --report DIR/timeline_*.csv     (offline, no GPU)

Why: decisions 0041 and 0042 found three launches that are faster alone (chained in a graph of
their own) and slower in the engine's graph, and a 9B decode step of ~2.94 ms of which the
large matvecs take ~1.93 ms. Per-launch CUDA events (`Engine.profile_decode_step`) time each
launch in a graph of its own, so they cannot say what happens *between* launches of the real
graph: how long the GPU sits idle, which launches start early under programmatic edges and
wait, and which ones the step's end waits on.

How: CUPTI's kernel activity records, read through PyTorch's profiler (the device image has
torch; Nsight Systems cannot make a report there, /work/.library/device/KINDS.md). CUPTI records
every kernel of the process, whoever launched it, with the GPU's start and end timestamps, so
the engine's own graph replay (driver API, no torch involved) is what is recorded. The steps
are separated by a host sleep, and split on it afterwards (the host's copies and restores
between steps fall into groups of their own, which are dropped).

Per step, with the kernels in start order (`step_rows`):
    gap   start - the latest end before it (negative: it started while an earlier kernel ran,
          as a programmatic edge lets it: its duration then includes its wait)
    inc   how much of the step's busy time is its own: the part of [start, end] after the
          latest end before it. The incs add up to the step's span less its idle time (the
          positive gaps), so they split the busy time between the launches the step waited
          on -- the critical path's share of each -- and the gaps the rest.
    idle  the span's time with no kernel running (the union of the kernels' intervals, less).
Per kernel name over a step: launches, sum of durations, sum of incs, sum of positive gaps.
Medians over the steps. The same step is also timed without the profiler (`replay_ms`), so
the profiler's own cost on the timeline is on record beside it.

Writes jsonl rows (research/tune-data/bench.jsonl by default; $OUT/bench.jsonl on the device)
and, with --csv-dir, every profiled step's kernels as CSV (mode, step, i, name, start_us,
end_us) for reading offline (`--report`). Needs torch with CUDA (the device image) to
profile; the report and the arithmetic need neither. First results: decision 0043.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a host pause between profiled steps longer than any gap inside one (splits the steps)
STEP_PAUSE_S = 0.004
SPLIT_GAP_US = 1500.0

def kernel_name(mangled: str) -> str:
    """The Python function name inside a Numba kernel's mangled name (`_ZN` then length-
    prefixed parts, `B`-prefixed ABI tags, `E`, the argument types); any other name as it is.
    Numba escapes characters outside [A-Za-z0-9_] as _XX (hex), which is kept."""
    if not mangled.startswith("_ZN"):
        return mangled
    s, i, parts = mangled, 3, []
    while i < len(s) and s[i] != "E":
        tag = s[i] == "B"
        if tag:
            i += 1
        j = i
        while j < len(s) and s[j].isdigit():
            j += 1
        if j == i:
            break
        n = int(s[i:j])
        if not tag:
            parts.append(s[j:j + n])
        i = j + n
    return parts[-1] if parts else mangled


def short_name(name: str) -> str:
    """A trace's kernel name without the demangler's ABI tags, argument list and the
    `bw24nb::kernels::` prefix: `matvec_q4k::matvec_q8_q4_k_xreg4_db`."""
    name = re.sub(r"\[abi:[^\]]*\]", "", name).split("(")[0]
    return name.replace("bw24nb::kernels::", "").replace("bw24nb::", "")


def split_steps(kernels, gap_us: float = SPLIT_GAP_US) -> list[list[tuple[str, float, float]]]:
    """kernels: (name, start_us, end_us) in any order -> lists of one step each: a kernel that
    starts more than gap_us after every earlier kernel ended opens a new step."""
    out: list[list[tuple[str, float, float]]] = []
    latest = None
    for k in sorted(kernels, key=lambda k: (k[1], k[2])):
        if latest is None or k[1] - latest > gap_us:
            out.append([])
        out[-1].append(k)
        latest = k[2] if latest is None else max(latest, k[2])
    return out


def step_rows(step) -> tuple[list[dict], dict]:
    """One step's kernels -> (a row per kernel in start order: name, start, end, dur, gap,
    inc -- all us, start and end from the step's first start), {span, busy, idle, kernels})."""
    ks = sorted(step, key=lambda k: (k[1], k[2]))
    t0 = ks[0][1]
    rows, latest, busy = [], None, 0.0
    for name, s, e in ks:
        s, e = s - t0, e - t0
        # the union of the intervals grows by the part of [s, e] past the latest end so far
        gap = 0.0 if latest is None else s - latest
        inc = e - s if latest is None else max(0.0, e - max(s, latest))
        busy += inc
        latest = e if latest is None else max(latest, e)
        rows.append(dict(name=name, start=s, end=e, dur=e - s, gap=gap, inc=inc))
    span = latest
    return rows, dict(span=span, busy=busy, idle=span - busy, kernels=len(rows))


def by_name(rows) -> dict[str, dict]:
    """Per kernel name: launches, and the sums of dur, inc and of the positive gaps before."""
    out: dict[str, dict] = {}
    for r in rows:
        d = out.setdefault(r["name"], dict(launches=0, dur=0.0, inc=0.0, gap=0.0))
        d["launches"] += 1
        d["dur"] += r["dur"]
        d["inc"] += r["inc"]
        d["gap"] += max(0.0, r["gap"])
    return out


def summarize(steps) -> tuple[dict, dict[str, dict]]:
    """Medians over steps of the step totals and of each name's sums (a name missing from a
    step counts 0 there)."""
    per_step = [step_rows(s) for s in steps]
    totals = {k: statistics.median(t[k] for _, t in per_step)
              for k in ("span", "busy", "idle", "kernels")}
    names = [by_name(rows) for rows, _ in per_step]
    keys = {n for d in names for n in d}
    zero = dict(launches=0, dur=0.0, inc=0.0, gap=0.0)
    per_name = {n: {f: statistics.median(d.get(n, zero)[f] for d in names) for f in zero}
                for n in keys}
    return totals, dict(sorted(per_name.items(), key=lambda kv: -kv[1]["inc"]))


def read_csv(path) -> dict[str, list[list[tuple[str, float, float]]]]:
    """A --csv-dir file (.csv, or .csv.gz) -> {mode: [step's kernels (short name, start,
    end), ...]}; a mode that comes back after another (--launch A,B,A) is "A#2"."""
    modes: dict[str, dict[int, list]] = {}
    runs: dict[str, int] = {}
    prev = None
    with (gzip.open(path, "rt", newline="") if str(path).endswith(".gz")
          else open(path, newline="")) as f:
        for r in csv.DictReader(f):
            mode = r["mode"]
            if mode != prev:        # a mode run again later in the file (A B A B): run #2, ..
                runs[mode] = runs.get(mode, 0) + 1
                prev = mode
            key = mode if runs[mode] == 1 else f"{mode}#{runs[mode]}"
            modes.setdefault(key, {}).setdefault(int(r["step"]), []).append(
                (short_name(r["name"]), float(r["start_us"]), float(r["end_us"])))
    return {m: [steps[k] for k in sorted(steps)] for m, steps in modes.items()}


def report(paths, top: int = 40) -> None:
    """Per file and mode: the step totals and, per kernel name, launches and the medians of
    its inc / dur / gap sums (what the device run printed), then the matvecs' share."""
    for path in paths:
        for mode, steps in read_csv(path).items():
            totals, per_name = summarize(steps)
            print(f"== {Path(path).name} [{mode}]: {len(steps)} steps; span {totals['span']:.1f} "
                  f"us, busy {totals['busy']:.1f}, idle {totals['idle']:.1f}")
            print(f"  {'kernel':<58} {'n':>4} {'inc us':>8} {'us/launch':>9} {'dur us':>8}")
            for i, (name, d) in enumerate(per_name.items()):
                if i < top:
                    each = d["inc"] / d["launches"] if d["launches"] else 0.0
                    print(f"  {name[:58]:<58} {d['launches']:>4.0f} {d['inc']:>8.1f} "
                          f"{each:>9.2f} {d['dur']:>8.1f}")
            mv = sum(d["inc"] for n, d in per_name.items() if "matvec" in n)
            print(f"  matvecs: {mv:.1f} us of the busy {totals['busy']:.1f} "
                  f"({100 * mv / max(totals['busy'], 1e-9):.1f} %)\n")


def profiled_kernels(run_steps) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every kernel (and device copy / memset) CUPTI saw while
    run_steps() ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_steps()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    out = []
    for ev in trace.get("traceEvents", []):
        # kernels, and the copies and memsets a graph may hold among them
        if ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "ts" in ev and "dur" in ev:
            ts = float(ev["ts"])
            out.append((kernel_name(ev.get("name", "?")), ts, ts + float(ev["dur"])))
    return out


def _decode_steps(engine, token: int, steps: int):
    """Run `steps` decode steps of `token` from the current position, each after a pause, and
    put the sequence back: the graph replays what the engine's decode() replays."""
    saved = engine._save_step_state()

    def run():
        for _ in range(steps):
            time.sleep(STEP_PAUSE_S)
            engine._replay_decode(steps)       # (the graph that serves every step's context)
            engine.stream.synchronize()
        time.sleep(STEP_PAUSE_S)
        engine._restore_step_state(saved)
    return run


def _verify_steps(target, ids, steps: int):
    """`steps` verifies of ids at the current position, each after a pause, the sequence put
    back after each (target.time_verify's replay of the captured rows graph)."""
    import numpy as np
    e = target.engine
    ids = np.asarray(ids, np.int32)
    T = ids.size
    snap = target.snapshot()
    target.verify(ids)                             # compile, load and capture first
    target.restore(snap)
    key = ("rows", T, True)

    def run():
        for _ in range(steps):
            target._put_rows(ids)
            e.stream.synchronize()
            time.sleep(STEP_PAUSE_S)
            target.graphs.run(key, lambda: target._rows_launches(T, True))
            e.stream.synchronize()
            time.sleep(STEP_PAUSE_S)
            target.restore(snap)
            e.stream.synchronize()
            time.sleep(STEP_PAUSE_S)                   # the restore's work apart from both steps
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/graph_timeline.py",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="the GGUF (not with --report)")
    ap.add_argument("--report", nargs="+", metavar="CSV",
                    help="no GPU: read --csv-dir files and print their tables")
    ap.add_argument("--launch", default="default", help="run_bench launch modes, comma list")
    ap.add_argument("--steps", type=int, default=8, help="profiled steps per mode")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens before the steps")
    ap.add_argument("--verify", type=int, default=0,
                    help="K > 0: time the verify of K + 1 tokens instead of a decode step")
    ap.add_argument("--n-ctx", type=int, default=0,
                    help="engine context (0: room for --context, the steps and the verify)")
    ap.add_argument("--top", type=int, default=25, help="kernel names printed per mode")
    ap.add_argument("--csv-dir", default=None, help="write every step's kernels here")
    ap.add_argument("--name", default=None)
    ap.add_argument("--jsonl", default="research/tune-data/bench.jsonl")
    ap.add_argument("--commit", default=None)
    a = ap.parse_args(argv)
    if a.report:
        report(a.report, a.top)
        return 0
    if not a.model:
        ap.error("a model file, or --report CSV")
    # the unprofiled timing replays 10 steps past the context (the verify K + 1 rows)
    need = a.context + max(a.steps, 10) + a.verify + 2
    n_ctx = a.n_ctx or max(2048, need + 64)
    if n_ctx < need:
        ap.error(f"--n-ctx {n_ctx} leaves no room for --context {a.context} and the steps")
    if a.steps < 1 or a.context < 1:
        ap.error("--steps and --context must be at least 1")

    from bench.run_bench import (LAUNCH_MODES, Recorder, git_commit, gpu_name, module_mode,
                                 prompt_ids)
    modes = [m.strip() for m in a.launch.split(",") if m.strip()]
    bad = [m for m in modes if m not in LAUNCH_MODES]
    if bad:
        ap.error(f"--launch: unknown mode(s) {bad}; modes are {sorted(LAUNCH_MODES)}")
    from bw24nb.engine import Engine
    from bw24nb.formats import open_model
    import numpy as np

    source = open_model(a.model)
    model = a.name or Path(a.model).name
    paths = [Path(a.jsonl)] if a.jsonl else []
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / "bench.jsonl")
    rec = Recorder(gpu=gpu_name(), commit=git_commit(a.commit), paths=paths)
    what = f"verify K={a.verify}" if a.verify else "decode"
    print(f"{rec.gpu}, commit {rec.commit}; {model}: {what} at context {a.context}", flush=True)
    csv_rows = []
    try:
        for mode in modes:
            with module_mode(mode):
                eng = Engine(source, n_ctx=n_ctx, log=lambda *x: None, **LAUNCH_MODES[mode])
                ids = prompt_ids(a.context, source.config.vocab_size)
                eng.reset()
                tok = int(np.asarray(eng.prefill(ids)).argmax())
                if a.verify:
                    from bw24nb.engine_spec import EngineSpecTarget
                    target = EngineSpecTarget(eng, rollback="states")
                    vids = [tok] + prompt_ids(a.verify, source.config.vocab_size)
                    run = _verify_steps(target, vids, a.steps)
                    plain = statistics.median(target.time_verify(vids, replays=10, reps=3))
                else:
                    eng._replay_decode()               # capture (and compile) the step
                    eng.stream.synchronize()
                    run = _decode_steps(eng, tok, a.steps)
                    plain = statistics.median(eng.time_decode_steps(tok, replays=10, reps=3))
                run()                                  # warm: the same calls, unprofiled
                groups = split_steps(profiled_kernels(run))
                # the steps, without the host's copies and restores between them (groups of
                # their own: the pauses are on both sides)
                most = max(map(len, groups), default=0)
                steps = [g for g in groups if len(g) >= most / 2]
                if len(steps) != a.steps:
                    # e.g. CUPTI recorded nothing, or a pause shorter than a gap in a step
                    raise RuntimeError(f"{mode}: the trace split into {len(steps)} steps, not "
                                       f"{a.steps} ({[len(g) for g in groups]} kernels a group)")
                counts = sorted({len(s) for s in steps})
                totals, per_name = summarize(steps)
                base = dict(engine="bw24nb", launch=mode, context=a.context, what=what,
                            steps=len(steps), kernels_per_step=counts, tool="cupti/torch.profiler")
                print(f"\n== {mode}: {len(steps)} steps of {counts} kernels; span "
                      f"{totals['span']:.1f} us, busy {totals['busy']:.1f}, idle "
                      f"{totals['idle']:.1f}; without the profiler {1e3 * plain:.1f} us")
                rec.add(model, "timeline_span_us", totals["span"], "us", **base)
                rec.add(model, "timeline_idle_us", totals["idle"], "us", **base)
                rec.add(model, "timeline_unprofiled_us", 1e3 * plain, "us", **base)
                print(f"  {'kernel':<48} {'n':>4} {'inc us':>9} {'dur us':>9} {'gap us':>8}")
                for i, (name, d) in enumerate(per_name.items()):
                    if i < a.top:
                        print(f"  {name[:48]:<48} {d['launches']:>4.0f} {d['inc']:>9.1f} "
                              f"{d['dur']:>9.1f} {d['gap']:>8.1f}")
                    rec.add(model, f"timeline_inc_us:{name}", round(d["inc"], 3), "us", **base,
                            launches=d["launches"], dur_us=round(d["dur"], 3),
                            gap_us=round(d["gap"], 3))
                for n, s in enumerate(steps):
                    rows, _ = step_rows(s)
                    csv_rows += [(mode, n, i, short_name(r["name"]), round(r["start"], 3),
                                  round(r["end"], 3))
                                 for i, r in enumerate(rows)]
                del eng
    finally:
        rec.write()
        if a.csv_dir and csv_rows:
            Path(a.csv_dir).mkdir(parents=True, exist_ok=True)
            tag = f"verify{a.verify}" if a.verify else "decode"
            path = Path(a.csv_dir) / f"timeline_{model}_{tag}.csv"
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["mode", "step", "i", "name", "start_us", "end_us"])
                w.writerows(csv_rows)
            print(f"wrote {len(csv_rows)} kernel rows to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
