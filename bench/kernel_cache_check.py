"""Kernel disk cache on a GPU: time to the first token with an empty cache, then a warm one.

    python3 bench/kernel_cache_check.py [MODEL.gguf ...] [--gen] [--runs cold,warm]

For each model (always tests/fixtures/qwen35/model.gguf, plus the arguments), each run a fresh
Python process with BW24_KERNEL_CACHE set to one new folder (emptied before the first run):
    cold   empty cache: every kernel compiled, then stored
    warm   the same folder again: every kernel should load from it
    off    BW24_KERNEL_CACHE=off, for comparison (not in the default --runs)
The job: build the Engine (n_ctx 256), prefill 8 fixed token ids, take the argmax (the first
token), decode 4 more greedily through the captured decode graph. Reported per run: seconds
from process start to the first token, to the engine built, to the end; the cache's hits and
misses (a miss is a compilation); the tokens. Checks: warm tokens == cold tokens, and the warm
run compiled nothing (0 misses). With --gen, also `bw24nb gen MODEL -n 8` (the real command, its
argmax gate included) cold and warm, timed from process start to its first byte of output.

Prints a table; appends one JSON object per run to $OUT/kernel_cache.jsonl when $OUT is set.
Exit status 1 if a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "qwen35" / "model.gguf"
PROMPT_TOKENS = 8
DECODE_TOKENS = 4


def child_job(model: str) -> dict:
    """Runs inside the fresh process: the engine job, timed from the process start."""
    t0 = float(os.environ["BW24_CHECK_T0"])
    import numpy as np

    from bw24nb import jit
    from bw24nb.engine import Engine
    from bw24nb.formats import open_model

    t_import = time.time() - t0
    src = open_model(model)
    eng = Engine(src, n_ctx=256, log=lambda m: None)
    t_engine = time.time() - t0
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(0, min(src.config.vocab_size, 1000), PROMPT_TOKENS)]
    tok = int(np.argmax(eng.prefill(ids)))
    t_first = time.time() - t0
    tokens = [tok]
    for _ in range(DECODE_TOKENS):
        tok = int(np.argmax(eng.decode(tok)))
        tokens.append(tok)
    t_end = time.time() - t0
    stats = jit.cache_stats()
    return {"import_s": t_import, "engine_s": t_engine, "first_token_s": t_first,
            "total_s": t_end, "tokens": tokens, "hits": stats["hits"], "misses": stats["misses"],
            "kernels": stats["kernels"], "backend": eng.name}


def _env(cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["BW24_KERNEL_CACHE"] = cache
    return env


def run_job(model: str, cache: str, timeout: int) -> dict:
    env = _env(cache)
    env["BW24_CHECK_T0"] = repr(time.time())
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", model], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "wall_s": time.time() - t0}
    wall = time.time() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-3000:], "wall_s": wall}
    out = json.loads(lines[-1])
    out["wall_s"] = wall
    out["warnings"] = [ln for ln in proc.stderr.splitlines() if "kernel cache" in ln][:5]
    return out


def run_gen(model: str, cache: str, timeout: int) -> dict:
    """`bw24nb gen MODEL -n 8`: seconds from spawn to its first output byte, and its own line."""
    env = _env(cache)
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "bw24nb.cli", "gen", model, "-n", "8"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)
    t_first = time.time() - t0
    try:
        rest, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, err = proc.communicate()
    wall = time.time() - t0
    err = err.decode(errors="replace")
    reported = next((ln for ln in err.splitlines() if "first token" in ln), "")
    out = {"first_output_s": t_first if first else None, "wall_s": wall, "rc": proc.returncode,
           "text": (first + rest).decode(errors="replace")[:200], "gen_line": reported}
    if proc.returncode != 0:
        out["error"] = err[-3000:]
    return out


def _label(model: str) -> str:
    p = Path(model)
    return f"{p.parent.name}/{p.name}"[-32:]


def _row(model, run, r):
    if "error" in r:
        return f"{_label(model):32s} {run:6s}  ERROR (see the JSON line)"
    if "first_output_s" in r:
        return (f"{_label(model):32s} gen-{run:<6s} first output {r['first_output_s'] or -1:6.2f} s"
                f"  wall {r['wall_s']:6.2f} s   {r['gen_line'].strip()[-60:]}")
    return (f"{_label(model):32s} {run:6s} {r['first_token_s']:8.2f} {r['import_s']:8.2f} "
            f"{r['engine_s']:8.2f} {r['total_s']:8.2f} {r['hits']:5d} {r['misses']:6d}  {r['tokens']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--runs", default="cold,warm")
    ap.add_argument("--gen", action="store_true", help="also time `bw24nb gen` cold and warm")
    ap.add_argument("--timeout", type=int, default=280, help="seconds per run")
    ap.add_argument("--no-fixture", action="store_true", help="only the MODEL arguments")
    ap.add_argument("--cache-dir", default=None,
                    help="use this (already filled) cache folder instead of a new empty one, "
                         "and keep it: e.g. --runs warm after a benchmark filled it")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child_job(args.child)))
        return 0

    models = [] if args.no_fixture else [str(FIXTURE)]
    models += [str(Path(m).resolve()) for m in args.models]
    out_path = Path(os.environ["OUT"]) / "kernel_cache.jsonl" if os.environ.get("OUT") else None
    rows, failures = [], []
    for model in models:
        cache = args.cache_dir or tempfile.mkdtemp(prefix="bw24_kernel_cache_")
        results = {}
        for run in args.runs.split(","):
            r = run_job(model, "off" if run == "off" else cache, args.timeout)
            results[run] = r
            rows.append(_row(model, run, r))
            print(rows[-1], flush=True)
            record = {"check": "kernel_cache", "model": model, "run": run, **r,
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
            if out_path:
                with open(out_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            if "error" in r:
                failures.append(f"{_label(model)} {run}: {r['error'][-400:]}")
        cold, warm = results.get("cold"), results.get("warm")
        if cold and warm and "error" not in cold and "error" not in warm:
            if warm["tokens"] != cold["tokens"]:
                failures.append(f"{_label(model)}: warm tokens {warm['tokens']} != cold {cold['tokens']}")
            if warm["misses"]:
                failures.append(f"{_label(model)}: the warm run compiled {warm['misses']} kernel(s)")
            if not warm["hits"]:
                failures.append(f"{_label(model)}: the warm run loaded nothing from the cache")
        if args.gen and model != str(FIXTURE):
            gen_cache = tempfile.mkdtemp(prefix="bw24_kernel_cache_gen_")
            for run in ("cold", "warm"):
                r = run_gen(model, gen_cache, args.timeout)
                rows.append(_row(model, run, r))
                print(rows[-1], flush=True)
                if out_path:
                    with open(out_path, "a") as f:
                        f.write(json.dumps({"check": "kernel_cache_gen", "model": model, "run": run,
                                            **r}) + "\n")
                if "error" in r:
                    failures.append(f"{_label(model)} gen {run}: {r['error'][-400:]}")
            shutil.rmtree(gen_cache, ignore_errors=True)
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)

    print()
    print(f"{'model':32s} {'run':6s} {'1st tok':>8s} {'import':>8s} {'engine':>8s} {'total':>8s} "
          f"{'hits':>5s} {'misses':>6s}  tokens   (seconds from process start)")
    for row in rows:
        print(row)
    for f in failures:
        print("FAIL", f)
    print("kernel cache check:", "FAIL" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
