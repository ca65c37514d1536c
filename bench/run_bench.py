"""The benchmark harness: bw24nb vs PyTorch + transformers vs llama.cpp, in one run.

    python3 bench/run_bench.py MODEL.gguf [MODEL2.gguf ...] [--llama-bench PATH/llama-bench]
        [--torch auto|none] [--hf DIR ...] [--runs 3] [--jsonl PATH] [--commit SHA]

Per model file, after one warm-up, medians of `--runs` runs of:
    decode  tg128 after a 512-token prompt, and after a 6144-token prompt (tokens/s)
    prefill pp512 (tokens/s)
plus, measured once in the same run, the device's read bandwidth (a read-only stream of 16-byte
`ld.global.nc.v4.u32` loads: bench/device_smoke.py's kernel) and, for decode, % of the roofline
(bench/roofline.py: weight + KV + state bytes per token over that bandwidth), a per-kernel time
breakdown of one decode step (`Engine.profile_decode_step`, CUDA events around each launch)
and of one prefill chunk (`Engine.profile_prefill`: `prefill_kernel_ms:*`), the same prefill
with CUDA graphs off (`prefill_eager_tok_s`: what a chunk size's first chunk costs), and the
exactness gate (prefill's last argmax == token-by-token decode's, printed first: timings of a
MISMATCH engine do not count). `--prefill-only` skips the decode runs (sweeps of prefill
options, e.g. `--launch psplit1,psplit2`).

Side by side, same prompts and lengths:
    torch   transformers on the GPU in bf16: eager, and with a static cache (+ torch.compile,
            which transformers applies to static-cache generate); both recorded, the faster
            marked. `--hf DIR` loads a checkpoint (e.g. from `python3 -m bw24nb.factory ...
            --format hf`); `--torch auto` (default) builds the model from the GGUF's config with
            random weights on the GPU -- the same shapes, no 54 GB file on disk.
    llama   `llama-bench -o json` on the same GGUF (`--llama-bench PATH`): pp512, tg128 at
            depth 512 and 6144.

Every measurement is appended as one JSON object per line to research/tune-data/bench.jsonl
(schema: research/tune-data/README.md) and, when $OUT is set (the device machine), also to
$OUT/bench.jsonl so it comes back. A short table is printed last.

`run_bench(...)` is the importable entry point (`bw24nb bench` wires its CLI to `main`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))     # run as a script on the device: PYTHONPATH is not reliable

import numpy as np  # noqa: E402

from bw24nb.quant.types import QType  # noqa: E402
from bw24nb.switches import switched  # noqa: E402

DEFAULT_JSONL = ROOT / "research" / "tune-data" / "bench.jsonl"
PROMPT = 512              # tg128 "at 512": decode after a 512-token prompt
LONG_PROMPT = 6144        # the long-context decode point
N_GEN = 128
PREFILL = 512             # pp512
GATE_TOKENS = 32          # prompt length of the prefill-vs-decode argmax gate
PROMPT_SEED = 1234


# ------------------------------------------------------------------------------ records
@dataclass
class Recorder:
    """Collects records (one dict per measurement) and appends them as JSON lines."""
    gpu: str
    commit: str
    paths: list[Path]
    date: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc)
                      .isoformat(timespec="seconds"))
    rows: list[dict] = field(default_factory=list)

    def add(self, model: str, metric: str, value, unit: str, **config) -> dict:
        row = {"date": self.date, "gpu": self.gpu, "commit": self.commit, "model": model,
               "config": config, "metric": metric, "value": value, "unit": unit}
        self.rows.append(row)
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {model:<28} {config.get('engine', ''):<22} {metric:<24} {shown:>10} {unit}",
              flush=True)
        return row

    def write(self) -> None:
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                for row in self.rows:
                    f.write(json.dumps(row) + "\n")
            print(f"appended {len(self.rows)} records to {path}")

    def table(self) -> str:
        keep = [r for r in self.rows if "kernel_ms:" not in r["metric"]]
        lines = [f"{'model':<28} {'engine':<22} {'metric':<24} {'value':>10}  unit"]
        for r in keep:
            v = r["value"]
            shown = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"{r['model']:<28} {r['config'].get('engine', ''):<22} "
                         f"{r['metric']:<24} {shown:>10}  {r['unit']}")
        return "\n".join(lines)


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from numba import cuda
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown"


def git_commit(explicit: str | None = None) -> str:
    if explicit or os.environ.get("BW24_COMMIT"):
        return explicit or os.environ["BW24_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def prompt_ids(n: int, vocab: int) -> list[int]:
    """A fixed pseudo-random prompt (random-weight models do not care what it says)."""
    rng = np.random.default_rng(PROMPT_SEED)
    return [int(t) for t in rng.integers(0, min(vocab, 32000), n)]


def median(xs) -> float:
    return float(statistics.median(xs))


# ------------------------------------------------------------------------------ bandwidth
def measure_read_bandwidth(gib: float = 4.0) -> dict:
    """Read-only stream of 16-byte ld.global.nc.v4.u32 loads over a `gib` GiB buffer
    (bench/device_smoke.py's `read_v4`), best of two launch shapes, CUDA-event medians."""
    from numba import cuda

    from bench.device_smoke import THREADS, event_ms, fill_hash, read_v4
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    n = int(gib * 2**30) // 16 * 4
    stream = cuda.stream()
    src = cuda.device_array(n, np.uint32, stream=stream)
    fill_hash[sms * 8, THREADS, stream](src)
    best = None
    for per_sm in (4, 8):
        blocks = sms * per_sm
        out = cuda.device_array(blocks * THREADS, np.uint32, stream=stream)
        ms = event_ms(lambda: read_v4[blocks, THREADS, stream](src, out), stream)
        gb_s = n * 4 / (ms * 1e-3) / 1e9
        if best is None or gb_s > best["gb_s"]:
            best = {"gb_s": gb_s, "ms": ms, "blocks": blocks, "threads": THREADS, "gib": gib}
    return best


# ------------------------------------------------------------------------------ bw24nb engine
def _argmax(logits) -> int:
    return int(np.asarray(logits).reshape(-1).argmax())


def _sync():
    try:
        from numba import cuda
        cuda.synchronize()
    except Exception:
        pass


def engine_decode_rate(engine, ids: list[int], n: int) -> tuple[float, str, list[int]]:
    """(decode tokens/s after prefilling `ids`, how it was timed, the n greedy tokens): the
    engine's own timings when `generate_greedy` returns them ({"decode_s", "decode_tokens"}),
    else wall time of a host loop over `decode` (argmax on the host)."""
    engine.reset()
    if hasattr(engine, "generate_greedy"):
        out = engine.generate_greedy(ids, n)
        timings = out[1] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) \
            else getattr(engine, "last_timings", None)
        if timings and timings.get("decode_s"):
            tokens = list(out[0]) if isinstance(out, tuple) else []
            return (timings.get("decode_tokens", n - 1) / timings["decode_s"], "generate_greedy",
                    tokens)
    tok = _argmax(engine.prefill(ids))
    tokens = [tok]
    _sync()
    t0 = time.perf_counter()
    for _ in range(n - 1):
        tok = _argmax(engine.decode(tok))
        tokens.append(tok)
    _sync()
    return (n - 1) / (time.perf_counter() - t0), "decode loop", tokens


def tokens_digest(tokens) -> str:
    """Short digest of a token list: configurations run side by side (e.g. --launch pdl,serial,
    which must not change a single bit) are compared by it in the records."""
    return hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).hexdigest()[:16]


def engine_prefill_rate(engine, ids: list[int]) -> float:
    engine.reset()
    _sync()
    t0 = time.perf_counter()
    engine.prefill(ids)
    _sync()
    return len(ids) / (time.perf_counter() - t0)


def exactness_gate(engine, ids: list[int]) -> tuple[bool, int, int, str]:
    """Prefill's next-token argmax vs token-by-token decode's (DESIGN.md, gate 2), and how
    close the call was: prefill's top-2 logit gap and the largest prefill - decode logit
    difference, both relative to prefill's largest |logit| (a MISMATCH at a gap below that
    difference is a near tie; one far above it a wrong path)."""
    engine.reset()
    pre = np.array(engine.prefill(ids), np.float64).reshape(-1)
    engine.reset()
    logits = None
    for t in ids:
        logits = engine.decode(t)
    dec = np.array(logits, np.float64).reshape(-1)
    engine.reset()
    a, b = int(pre.argmax()), int(dec.argmax())
    scale = max(float(np.abs(pre).max()), 1e-30)
    top2 = np.sort(pre)[-2:]
    info = (f"top-2 gap {(top2[1] - top2[0]) / scale:.2e}, "
            f"max |prefill - decode| {float(np.abs(pre - dec).max()) / scale:.2e} of max |logit|")
    return a == b, a, b, info


def bench_engine(rec: Recorder, model: str, engine, source, *, runs: int, read_gb_s: float | None,
                 gen: int = N_GEN, prompt: int = PROMPT, long_prompt: int = LONG_PROMPT,
                 prefill: int = PREFILL, warmup: int = 1, gate_tokens: int = GATE_TOKENS,
                 base_config: dict | None = None, decode: bool = True) -> None:
    """The bw24nb measurements of one loaded engine (any object with reset / prefill / decode
    [/ generate_greedy / profile_decode_step / profile_prefill]); decode=False: the gate and
    the prefill ones only."""
    from bench import roofline
    cfg = source.config
    base = dict(base_config or {}, engine="bw24nb", runs=runs, warmup=warmup)
    k_type = getattr(getattr(engine, "kv", None), "k_type", roofline.K_TYPE)
    v_type = getattr(getattr(engine, "kv", None), "v_type", roofline.V_TYPE)

    ok, a, b, info = exactness_gate(engine, prompt_ids(gate_tokens, cfg.vocab_size))
    print(f"  gate: {'MATCH' if ok else 'MISMATCH'} (prefill argmax {a}, decode argmax {b}; "
          f"{info})")
    rec.add(model, "gate", int(ok), "match", **base, prompt=gate_tokens, detail=info)

    points = ([prompt] + ([long_prompt] if long_prompt else [])) if decode else []
    for label, n_prompt in ((f"decode_tok_s@{p}", p) for p in points):
        if n_prompt + gen > getattr(engine, "n_ctx", n_prompt + gen):
            print(f"  skip {label}: n_ctx {engine.n_ctx} < {n_prompt + gen}")
            continue
        ids = prompt_ids(n_prompt, cfg.vocab_size)
        rates, how, digests = [], "", set()
        for r in range(warmup + runs):
            rate, how, tokens = engine_decode_rate(engine, ids, gen)
            digests.add(tokens_digest(tokens))
            if r >= warmup:
                rates.append(rate)
        rate = median(rates)
        rec.add(model, label, rate, "tok/s", **base, prompt=n_prompt, n_gen=gen, path=how,
                samples=[round(x, 3) for x in rates], tokens=",".join(sorted(digests)))
        print(f"  {label}: {rate:.1f} tok/s, tokens {','.join(sorted(digests))}")
        if read_gb_s:
            nb = roofline.decode_bytes(source, n_prompt + gen // 2, k_type, v_type)
            ceiling = roofline.roofline_tok_s(read_gb_s, nb.total)
            rec.add(model, label.replace("decode_tok_s", "decode_roofline_pct"),
                    100.0 * rate / ceiling, "%", **base, prompt=n_prompt, n_gen=gen,
                    read_gb_s=round(read_gb_s, 1), weight_bytes=nb.weights, kv_bytes=nb.kv,
                    state_bytes=nb.state, roofline_tok_s=round(ceiling, 2))

    ids = prompt_ids(prefill, cfg.vocab_size)
    rates = [engine_prefill_rate(engine, ids) for _ in range(warmup + runs)][warmup:]
    rec.add(model, f"prefill_tok_s@{prefill}", median(rates), "tok/s", **base, prompt=prefill,
            samples=[round(x, 2) for x in rates])
    if getattr(engine, "use_graph", False):
        # side by side: the same prefill with every chunk launched eagerly (what the first
        # chunk of a new size costs; the rates above replay the chunk's graph)
        engine.use_graph = False
        try:
            eager = [engine_prefill_rate(engine, ids) for _ in range(runs)]
        finally:
            engine.use_graph = True
        rec.add(model, f"prefill_eager_tok_s@{prefill}", median(eager), "tok/s", **base,
                prompt=prefill, samples=[round(x, 2) for x in eager])

    if decode and not hasattr(engine, "profile_decode_step"):
        print("  note: the engine has no profile_decode_step(); no per-kernel breakdown")
        return
    if decode:
        _profile_decode(rec, model, engine, cfg, prompt, base)
    _profile_prefill(rec, model, engine, cfg, prefill, base)


# launches per chained graph in the decode profile's second pass (0: skip it)
CHAIN_PROFILE = 16


def _by_name(rows) -> tuple[dict[str, list[float]], float]:
    """(name, ms) launch rows grouped by name, the largest total first, and their sum (ms)."""
    totals: dict[str, list[float]] = {}
    for name, ms in rows:
        totals.setdefault(name, []).append(float(ms))
    return (dict(sorted(totals.items(), key=lambda kv: -sum(kv[1]))),
            sum(sum(v) for v in totals.values()))


def _profile_decode(rec: Recorder, model: str, engine, cfg, prompt: int, base: dict) -> None:
    engine.reset()
    engine.prefill(prompt_ids(prompt, cfg.vocab_size))
    totals, step_ms = _by_name(engine.profile_decode_step())
    print(f"  decode step, eager, per kernel (context {prompt}): {step_ms:.3f} ms in "
          f"{sum(len(v) for v in totals.values())} launches")
    for name, v in totals.items():
        rec.add(model, f"kernel_ms:{name}", sum(v), "ms", **base, launches=len(v),
                share=round(sum(v) / step_ms, 4) if step_ms else None, context=prompt)
    rec.add(model, "decode_step_eager_ms", step_ms, "ms", **base, context=prompt)
    if not CHAIN_PROFILE:
        return
    # the same launches, each chained CHAIN_PROFILE times in one graph with the decode graph's
    # edges: what each costs inside the step (the eager rows above each pay a graph launch);
    # profile_decode_step left the sequence where it was, so no second prefill
    chained, chain_ms = _by_name(engine.profile_decode_step(replays=5, chain=CHAIN_PROFILE))
    print(f"  decode step, chained x{CHAIN_PROFILE}, per kernel: {chain_ms:.3f} ms")
    for name, v in chained.items():
        print(f"    kernel_chain_ms:{name} {sum(v):.4f} ({len(v)} launches, "
              f"{1e3 * sum(v) / len(v):.2f} us each)")
        rec.add(model, f"kernel_chain_ms:{name}", sum(v), "ms", **base, launches=len(v),
                chain=CHAIN_PROFILE, context=prompt)
    rec.add(model, "decode_step_chain_ms", chain_ms, "ms", **base, chain=CHAIN_PROFILE,
            context=prompt)


def _profile_prefill(rec: Recorder, model: str, engine, cfg, prefill: int, base: dict) -> None:
    if not hasattr(engine, "profile_prefill"):
        return
    # one chunk at most: the "rows" prefill's chunks are shorter than the GEMM's 512
    prefill = min(prefill, engine.wsp.T) if hasattr(engine, "wsp") else prefill
    try:
        rows = engine.profile_prefill(prompt_ids(prefill, cfg.vocab_size))
    except Exception as e:      # a diagnostic: the measurements above stand without it
        print(f"  prefill profile failed ({type(e).__name__}: {e})")
        return
    totals, pf_ms = _by_name(rows)
    print(f"  prefill of {prefill} tokens, per kernel: {pf_ms:.3f} ms in "
          f"{sum(len(v) for v in totals.values())} launches")
    for name, v in totals.items():
        print(f"    prefill_kernel_ms:{name} {sum(v):.3f} ({len(v)} launches)")
        rec.add(model, f"prefill_kernel_ms:{name}", sum(v), "ms", **base, launches=len(v),
                share=round(sum(v) / pf_ms, 4) if pf_ms else None, prompt=prefill)
    rec.add(model, "prefill_eager_ms", pf_ms, "ms", **base, prompt=prefill)


def _free_numba_memory() -> None:
    """Numba defers freeing device arrays; flush them now (torch needs the room)."""
    import gc
    gc.collect()
    try:
        from numba import cuda
        cuda.current_context().deallocations.clear()
    except Exception:
        pass


# ------------------------------------------------------------------------------ torch
def torch_model(config=None, hf_dir: str | None = None):
    """transformers CausalLM in bf16 on the GPU: from `hf_dir`, or built from a ModelConfig
    with random init (bw24nb.factory.hf_config_json gives the config.json)."""
    import torch
    import transformers
    if hf_dir:
        return transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.bfloat16, device_map="cuda").eval()
    from bw24nb.factory import hf_config_json
    hf_cfg = transformers.AutoConfig.for_model(**hf_config_json(config))
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16)
    return model.eval()


def bench_torch(rec: Recorder, model_name: str, model, vocab: int, *, runs: int, warmup: int = 1,
                gen: int = N_GEN, prompt: int = PROMPT, prefill: int = PREFILL,
                modes=("eager", "static+compile"), base_config: dict | None = None) -> None:
    """Greedy generate of `gen` tokens after a `prompt`-token prompt (decode rate = (gen - 1)
    / (generate time - prefill time)), and prefill of `prefill` tokens, CUDA-synchronized."""
    import torch
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt_ids(prompt, vocab)], device=dev)
    pids = torch.tensor([prompt_ids(prefill, vocab)], device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    def forward(x):
        with torch.inference_mode():
            model(x, use_cache=True)

    best = None
    for mode in modes:
        extra = {"cache_implementation": "static"} if mode == "static+compile" else {}

        def generate():
            with torch.inference_mode():
                model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False,
                               pad_token_id=0, **extra)
        base = dict(base_config or {}, engine=f"torch-{mode}", runs=runs, warmup=warmup,
                    torch=torch.__version__, transformers=__import__("transformers").__version__)
        try:
            for _ in range(warmup + (1 if mode != "eager" else 0)):   # compile warms up twice
                generate()
            decode, pre = [], []
            for _ in range(runs):
                t_pre = timed(lambda: forward(ids))
                t_gen = timed(generate)
                decode.append((gen - 1) / max(t_gen - t_pre, 1e-9))
                pre.append(prefill / timed(lambda: forward(pids)))
        except Exception as e:  # static cache / compile unsupported for this architecture
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(f"  torch {mode}: skipped ({msg})")
            rec.add(model_name, f"decode_tok_s@{prompt}", None, "tok/s", **base, error=msg)
            continue
        r = rec.add(model_name, f"decode_tok_s@{prompt}", median(decode), "tok/s", **base,
                    prompt=prompt, n_gen=gen, samples=[round(x, 3) for x in decode])
        rec.add(model_name, f"prefill_tok_s@{prefill}", median(pre), "tok/s", **base,
                prompt=prefill, samples=[round(x, 2) for x in pre])
        if best is None or r["value"] > best["value"]:
            best = r
    if best is not None:
        best["config"]["fastest_torch"] = True


# ------------------------------------------------------------------------------ llama.cpp
def llama_bench_cmd(binary: str, gguf: str, runs: int, extra: str = "",
                    long_prompt: int = LONG_PROMPT) -> list[str]:
    """pp512 and tg128 at depths 0, 512 and `long_prompt` (llama-bench crosses -p/-n with -d;
    parse_llama_bench keeps pp at depth 0 and tg at the two depths)."""
    depths = ",".join(str(d) for d in (0, PROMPT, long_prompt) if d is not None and d >= 0)
    return [binary, "-m", gguf, "-p", str(PREFILL), "-n", str(N_GEN), "-d", depths,
            "-ngl", "99", "-fa", "1", "-r", str(max(runs, 3)), "-o", "json", *shlex.split(extra)]


def parse_llama_bench(text: str, prompt: int = PROMPT, long_prompt: int = LONG_PROMPT,
                      prefill: int = PREFILL) -> list[tuple[str, float, str, dict]]:
    """llama-bench `-o json` output -> (metric, value, unit, config) for pp512 (depth 0) and
    tg128 at depth `prompt` / `long_prompt`. Tokens/s is the median of `samples_ts` (llama-bench
    already excludes its warm-up run), else `avg_ts`."""
    out = []
    for t in json.loads(text):
        n_prompt, n_gen, depth = t.get("n_prompt", 0), t.get("n_gen", 0), t.get("n_depth", 0)
        samples = t.get("samples_ts") or []
        value = float(statistics.median(samples)) if samples else float(t["avg_ts"])
        config = {k: t.get(k) for k in ("build_commit", "build_number", "backends", "type_k",
                                        "type_v", "n_batch", "n_ubatch", "flash_attn",
                                        "n_gpu_layers", "model_type", "model_size") if k in t}
        config.update(samples=[round(float(s), 3) for s in samples], n_depth=depth)
        if n_gen == 0 and n_prompt == prefill and depth == 0:
            out.append((f"prefill_tok_s@{prefill}", value, "tok/s", config))
        elif n_prompt == 0 and n_gen > 0 and depth in (prompt, long_prompt) and depth > 0:
            out.append((f"decode_tok_s@{depth}", value, "tok/s", dict(config, n_gen=n_gen)))
    return out


def bench_llama(rec: Recorder, model: str, binary: str, gguf: str, runs: int, extra: str = "",
                long_prompt: int = LONG_PROMPT, base_config: dict | None = None) -> None:
    cmd = llama_bench_cmd(binary, gguf, runs, extra, long_prompt)
    print("  $ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    base = dict(base_config or {}, engine="llama.cpp", cmd=" ".join(cmd[1:]))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print("  llama-bench failed:\n    " + "\n    ".join(tail))
        rec.add(model, "llama_bench_ok", 0, "bool", **base, error=" | ".join(tail)[:500])
        return
    for metric, value, unit, config in parse_llama_bench(proc.stdout):
        rec.add(model, metric, value, unit, **base, **config)


# ------------------------------------------------------------------------------ driver
def kv_cache_kwargs(name: str) -> dict:
    """Engine(...) arguments of a --kv-cache name: default (the engine's), q8, f16."""
    from bw24nb.cache.kv import KV_CACHE_KINDS
    if name == "default":
        return {}
    if name not in KV_CACHE_KINDS:
        raise ValueError(f"unknown KV cache {name!r}; known: default, {', '.join(KV_CACHE_KINDS)}")
    k_type, v_type = KV_CACHE_KINDS[name]
    return dict(k_type=k_type, v_type=v_type)


LAUNCH_MODES = {"default": {}, "pdl": dict(programmatic=True), "serial": dict(programmatic=False),
                # the attention output gate and int8 quantization as their own launches (the
                # decode before session 7's fusion into the attention combine)
                "unfused-attn": dict(fuse_attention_output=False),
                # prefill attention on the one-pass tile kernel (before session 8's split-K)
                "tile-prefill": dict(prefill_attention="tile"),
                # prefill attention on the decode split-K kernels (the default before the
                # tensor-core kernel, attention_tc.py)
                "split-prefill": dict(prefill_attention="split"),
                # the gated delta rule on the shared-memory tile kernel (before session 8)
                "tile-rule": dict(gdn_rule="tile"),
                # the delta rule on one kernel for every T (the default "auto" takes
                # gated_deltanet.PREFILL_RULE for prefill, lane for decode / verify; the same
                # bits): lane = the default before session 22
                "lane-rule": dict(gdn_rule="lane"),
                "quad-rule": dict(gdn_rule="quad"),
                # prefill fused like decode (swiglu / GDN norm / attention combine write the
                # int8 GEMM input): the default since session 10; unfused-prefill = before
                "fused-prefill": dict(fuse_prefill=True),
                "unfused-prefill": dict(fuse_prefill=False),
                # prefill attention's splits per token (Engine's PREFILL_SPLITS is the default)
                **{f"psplit{n}": dict(prefill_splits=n) for n in (1, 2, 4, 8, 16)},
                # decode attention's split plan before session 7 (no 128-key rounding of long
                # splits)
                "plain-attn": dict(attention_plan="plain"),
                # the float MoE block (before session 10's int8 block, moe.launch_moe_block_q8)
                "moe-float": dict(moe_q8=False),
                # prefill on the decode kernels (Engine(prefill_path="rows"): prefill gives
                # decode's bits, the configuration the MoE gate binds in), each token reading
                # its own experts
                "rows-prefill": dict(prefill_path="rows", moe_prefill="tokens"),
                # the same, the MoE blocks expert-major on the decode kernels (session 11)
                "rows-grouped": dict(prefill_path="rows", moe_prefill="grouped"),
                # GEMM prefill, MoE expert-major on the int8 GEMM (session 10; measured in
                # session 11: pp512 2890 vs 767 tok/s on the 35B-A3B shape, gate MISMATCH)
                "moe-grouped": dict(prefill_path="gemm", moe_prefill="grouped"),
                # GEMM prefill, each token reading its own experts (the default to session 10)
                "gemm-tokens": dict(prefill_path="gemm", moe_prefill="tokens"),
                # the int8 MoE blocks as one chain of launches (before session 13's side
                # streams: moe.BRANCHES)
                "moe-chain": dict(moe_branches=False),
                # the decode-kernel projections of one input (q / k / v, GDN qkv / z / ba) as a
                # chain (before session 13's side streams: Engine._side_by_side)
                "proj-chain": dict(proj_branches=False),
                # both as chains: the session-12 launch order
                "chain": dict(moe_branches=False, proj_branches=False),
                # decode's q8 norms on one block a row (before session 15's split over a block
                # per slot: norm.launch_rms_norm_q8, the same bits)
                "norm-whole": dict(norm_split=False)}
# launch modes that set module switches, not Engine arguments, while their engine is built and
# measured: the Q4_K one-row matvecs on the row loop (q4k-rowloop), or on matvec_q4k's
# persistent kernel (decision 0026; the default since session 20 is -db: the next row's weights
# loaded a row ahead, SMs x 4 blocks) plain on SMs x 8 or x 4 blocks, or -db on SMs x 8;
# decode attention's softmax rows interleaved (decode_attention.INTERLEAVE_ROWS, off: no gain
# measured in session 20); its one-tile splits through the four-warp merge (attn-merge:
# decode_attention.ONE_TILE_DIRECT off; stored by warp 0 directly is the default since
# session 21); the prefill GEMM's kernel choice before session 22 (gemm-s21: Q4_K on
# m64t128s4_cvt, not m128t64s4_cvt; matmul_q8.KERNEL_CHOICE) or its Q4_K on the copy_ahead tile
# (gemm-ahead: cp.async double buffers, uncapped; session 24: 6947 against 7004 tok/s at 9B
# pp512), or session 23's (gemm-s23: m128t64s4_cvt; the copy_ahead tile capped at 128 registers
# is the default since session 24, run then as gemm-ahead-r128: 7117 against 7031); (session
# 34's conv-prep-rows, session 35's conv-prep-walk and argmax-per-row are gone with the forms
# they chose between, decisions 0040 and 0041);
# prefill's delta rule on the pipe kernel (pipe-rule: gated_deltanet.PREFILL_RULE; the default
# since session 23) or the quad kernel (quad-rule, session 22's default); the rows prefill's
# slices of a matvec as one chain (slice-chain: engine.ROWS_SLICE_SIDES = 0, before session
# 24); the MoE group kernels' rows one at a time (group-walk: matvec.GROUP_BATCH = 1, before
# session 24). All give the same bits but token-units1: the MoE token matrices' rows split
# while a lane keeps one unit (moe.TOKEN_MIN_UNITS = 1, the bits before session 25; the
# default keeps two, which puts the shared expert's gate and up on one warp a row); the rows
# prefill's int8 matvecs in MAX_ROWS-row slices (rows-slices: engine.ROWS_TILES off, before
# session 25) and the prefill router on the token kernel (router-tok: moe.ROUTER_TILES off);
# the rows prefill's token tiles at other sizes (rows-t<tokens>r<rows>); the rows prefill's
# attention on a block a split (attn-split-blocks: engine.ROWS_ATTENTION_GRID = 0, before
# session 26) or walking blocks of other counts (attn-walk<N>); decode attention's one-tile
# splits on one warp (attn-1warp: decode_attention.ONE_TILE_SPREAD off, before session 26);
# the verify's rows kernels (T >= 2) under a register cap (rows-cap<N>:
# matvec.ROWS_MAX_REGISTERS = N; session 29), or on two weight rows a warp (rows-pairs,
# rows-pairs-cap<N>: matvec.ROWS_PAIRS; session 30) or four (rows-quads[-cap128]:
# matvec.PAIR_ROWS_PER_WARP = 4, session 31's default), or four from N activation rows on and
# two below (quads-from<N>: matvec.QUADS_FROM_ROWS; 3 is session 32's default), without pairs
# for outputs of up to 4096 rows at T <= 4 (pairs-m0: matvec.PAIRS_UP_TO_M = 0, session 32's
# default; session 33's pairs-m4096), with them also beside other launches on graph branches
# (pairs-beside: matvec.PAIRS_BESIDE), and decode's
# row-loop launches likewise (decode-pairs, decode-quads: matvec.ONE_ROW_PAIRS; all-pairs: rows
# and decode on pairs); the verify's rule-norm launch reading each token's inputs in its step
# (rule-no-preload: gated_deltanet.RULE_NORM_PRELOAD off, session 32's form), or run as the
# lane rule then the norm at T > 1 (rule-norm-t1: engine.GDN_RULE_NORM_MAX_T = 1, the default
# since session 34; rule-norm-fused: the fused launch at every verify T, as before; gdn-apart:
# at every T). rule-no-preload only tells under rule-norm-fused.
_Q4 = "bw24nb.kernels.matvec_q4k"
# the Q4_K GEMM on the copy_ahead tile (cp.async double buffers; session 23)
_GEMM_AHEAD = {QType.Q4_K: (("m128t64s4a", False), ("m64t128s4", False)),
               QType.Q6_K: (("m128t128s4", False), ("m64t128s4", False)),
               QType.Q8_0: (("m64t128s4", False),)}
# session 23's choice (KERNEL_CHOICE since session 24 caps the copy_ahead tile at 128
# registers: 339.5 against this choice's 358.7 us at Q4_K 12288 x 4096)
_GEMM_S23 = {**_GEMM_AHEAD, QType.Q4_K: (("m128t64s4", False), ("m64t128s4", False))}
_GEMM_S21 = {QType.Q4_K: (("m64t128s4", False),),
             QType.Q6_K: (("m128t128s4", False), ("m64t128s4", False)),
             QType.Q8_0: (("m64t128s4", False),)}
MODULE_MODES = {"q4k-rowloop": [(_Q4, "XREG", False)],
                "q4k-xreg": [(_Q4, "XREG", True), (_Q4, "XREG_DB", False),
                             (_Q4, "XREG_BLOCKS_PER_SM", 8)],
                "q4k-xreg-b4": [(_Q4, "XREG", True), (_Q4, "XREG_DB", False),
                                (_Q4, "XREG_BLOCKS_PER_SM", 4)],
                "q4k-xreg-db": [(_Q4, "XREG", True), (_Q4, "XREG_DB", True),
                                (_Q4, "XREG_BLOCKS_PER_SM", 4)],
                "q4k-xreg-db-b8": [(_Q4, "XREG", True), (_Q4, "XREG_DB", True),
                                   (_Q4, "XREG_BLOCKS_PER_SM", 8)],
                # 3 blocks an SM: a quarter of the register file left to the launches before
                # and after the persistent kernel (decision 0043's residency hypothesis)
                "q4k-xreg-db-b3": [(_Q4, "XREG", True), (_Q4, "XREG_DB", True),
                                   (_Q4, "XREG_BLOCKS_PER_SM", 3)],
                **{f"rows-cap{n}": [("bw24nb.kernels.matvec", "ROWS_PAIRS", False),
                                    ("bw24nb.kernels.matvec", "ROWS_MAX_REGISTERS", n)]
                   for n in (56, 64, 72, 80, 96)},
                "rows-plain": [("bw24nb.kernels.matvec", "ROWS_PAIRS", False)],
                "rows-pairs": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                               ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 2)],
                "rows-quads": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                               ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 4),
                               ("bw24nb.kernels.matvec", "QUADS_FROM_ROWS", 2)],
                "rows-quads-cap128": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                                      ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 4),
                                      ("bw24nb.kernels.matvec", "QUADS_FROM_ROWS", 2),
                                      ("bw24nb.kernels.matvec", "ROWS_MAX_REGISTERS", 128)],
                **{f"quads-from{n}": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                                      ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 4),
                                      ("bw24nb.kernels.matvec", "QUADS_FROM_ROWS", n)]
                   for n in (3, 4, 5)},
                "rule-no-preload": [("bw24nb.kernels.gated_deltanet", "RULE_NORM_PRELOAD",
                                     False)],
                "pairs-m0": [("bw24nb.kernels.matvec", "PAIRS_UP_TO_M", 0)],
                # every rows launch of <= PAIRS_UP_TO_ROWS rows not beside others on pairs,
                # the gate / up stack and the LM head included (session 32: pairs won the
                # Q6_K LM head at T = 3)
                "pairs-m-all": [("bw24nb.kernels.matvec", "PAIRS_UP_TO_M", 1 << 30)],
                "pairs-beside": [("bw24nb.kernels.matvec", "PAIRS_BESIDE", True)],
                "decode-pairs": [("bw24nb.kernels.matvec", "ONE_ROW_PAIRS", True),
                                 ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 2)],
                "decode-quads": [("bw24nb.kernels.matvec", "ONE_ROW_PAIRS", True),
                                 ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 4),
                                 ("bw24nb.kernels.matvec", "QUADS_FROM_ROWS", 1)],
                "all-pairs": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                              ("bw24nb.kernels.matvec", "ONE_ROW_PAIRS", True),
                              ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 2)],
                **{f"rows-pairs-cap{n}": [("bw24nb.kernels.matvec", "ROWS_PAIRS", True),
                                          ("bw24nb.kernels.matvec", "PAIR_ROWS_PER_WARP", 2),
                                          ("bw24nb.kernels.matvec", "ROWS_MAX_REGISTERS", n)]
                   for n in (80, 96, 128)},
                "attn-il": [("bw24nb.kernels.decode_attention", "INTERLEAVE_ROWS", True)],
                # session 47, built with no device lent, both off until measured: the MoE
                # router's top-k on one warp a token (moe.ROUTE_WARP), decode attention's q
                # read as LDS.128 (decode_attention.WIDE_Q); the same bits either way
                "route-warp": [("bw24nb.kernels.moe", "ROUTE_WARP", True)],
                "attn-wide-q": [("bw24nb.kernels.decode_attention", "WIDE_Q", True)],
                "attn-merge": [("bw24nb.kernels.decode_attention", "ONE_TILE_DIRECT", False)],
                "attn-fused": [("bw24nb.kernels.decode_attention", "COMBINE_IN_SPLIT", True)],
                "gdn-conv-fused": [("bw24nb.engine", "GDN_CONV_RULE_NORM", True)],
                # decode attention split-K at every context (the one-pass graph off; decision 0045)
                "onepass-off": [("bw24nb.engine", "ONEPASS_MAX_CTX", 0)],
                # the one-pass attention's RoPE and K / V store in a launch of their own
                "store-apart": [("bw24nb.engine", "ONEPASS_STORE", False)],
                # the one-pass attention's position-free loads issued with the position's
                "onepass-early": [("bw24nb.kernels.decode_attention", "ONEPASS_EARLY", True)],
                "onepass-late": [("bw24nb.kernels.decode_attention", "ONEPASS_EARLY", False)],
                # decode attention's V groups with a clamp and a test for every key
                "per-key": [("bw24nb.kernels.decode_attention", "FULL_GROUPS", False)],
                # the one-pass combine's group sums 8 splits' terms a shared-memory round trip
                "group-batch8": [("bw24nb.kernels.decode_attention", "ONEPASS_GROUP_BATCH", 8)],
                # the one pass on thread-block clusters of n blocks a query head (1: a block;
                # the default since session 45: 2 full-width blocks up to D = 64), the blocks
                # sharing out the warps ("onepass-clusterN") or each of the full width ("..Nf")
                **{f"onepass-cluster{n}": [("bw24nb.kernels.decode_attention",
                                            "ONEPASS_CLUSTER", n),
                                           ("bw24nb.kernels.decode_attention",
                                            "ONEPASS_CLUSTER_SHARE", True)] for n in (1, 2, 4, 8)},
                **{f"onepass-cluster{n}f": [("bw24nb.kernels.decode_attention",
                                             "ONEPASS_CLUSTER", n),
                                            ("bw24nb.kernels.decode_attention",
                                             "ONEPASS_CLUSTER_SHARE", False)] for n in (2, 4)},
                # the one pass's position and K / V prefetch before its grid-dependency wait
                # (the default since session 46) or after it
                "onepass-pre-wait": [("bw24nb.kernels.decode_attention", "ONEPASS_PRE_WAIT",
                                      True)],
                "onepass-post-wait": [("bw24nb.kernels.decode_attention", "ONEPASS_PRE_WAIT",
                                       False)],
                # the decode step's split pass (past the one pass) likewise
                "split-post-wait": [("bw24nb.kernels.decode_attention", "SPLIT_PRE_WAIT",
                                     False)],
                # ... and with its combine in one launch on clusters of n blocks a (token, KV
                # head; 16: non-portable), of s four-warp split slots each ("split-clusterN",
                # s the default `cluster_split_slots`; "split-clusterNsS")
                **{f"split-cluster{n}": [("bw24nb.kernels.decode_attention", "SPLIT_CLUSTER",
                                          n)] for n in (2, 4, 8, 16)},
                **{f"split-cluster{n}s{sl}": [
                    ("bw24nb.kernels.decode_attention", "SPLIT_CLUSTER", n),
                    ("bw24nb.kernels.decode_attention", "SPLIT_CLUSTER_SLOTS", sl)]
                   for n in (4, 8, 16) for sl in (1, 2, 3, 4)},
                # rows split over more warps while each keeps >= 256 values (the rule before
                # session 41; the default keeps >= 512)
                "split-k512": [("bw24nb.kernels.matvec", "SPLIT_MIN_K", 512)],
                "fused-both": [("bw24nb.kernels.decode_attention", "COMBINE_IN_SPLIT", True),
                               ("bw24nb.engine", "GDN_CONV_RULE_NORM", True)],
                "gemm-s21": [("bw24nb.kernels.matmul_q8", "KERNEL_CHOICE", _GEMM_S21)],
                "gemm-ahead": [("bw24nb.kernels.matmul_q8", "KERNEL_CHOICE", _GEMM_AHEAD)],
                "gemm-s23": [("bw24nb.kernels.matmul_q8", "KERNEL_CHOICE", _GEMM_S23)],
                "pipe-rule": [("bw24nb.kernels.gated_deltanet", "PREFILL_RULE", "pipe")],
                "quad-rule": [("bw24nb.kernels.gated_deltanet", "PREFILL_RULE", "quad")],
                "slice-chain": [("bw24nb.engine", "ROWS_SLICE_SIDES", 0)],
                "group-walk": [("bw24nb.kernels.matvec", "GROUP_BATCH", 1)],
                "token-units1": [("bw24nb.kernels.moe", "TOKEN_MIN_UNITS", 1)],
                "rows-slices": [("bw24nb.engine", "ROWS_TILES", False)],
                "router-tok": [("bw24nb.kernels.moe", "ROUTER_TILES", False)],
                "rows-t8r8": [("bw24nb.engine", "ROWS_TILE_TOKENS", 8),
                              ("bw24nb.engine", "ROWS_TILE_ROWS", 8)],
                "rows-t4r16": [("bw24nb.engine", "ROWS_TILE_TOKENS", 4),
                               ("bw24nb.engine", "ROWS_TILE_ROWS", 16)],
                "rows-t8r16": [("bw24nb.engine", "ROWS_TILE_TOKENS", 8),
                               ("bw24nb.engine", "ROWS_TILE_ROWS", 16)],
                "attn-split-blocks": [("bw24nb.engine", "ROWS_ATTENTION_GRID", 0)],
                "attn-1warp": [("bw24nb.kernels.decode_attention", "ONE_TILE_SPREAD", False)],
                "attn-walk4": [("bw24nb.engine", "ROWS_ATTENTION_GRID", 4)],
                "attn-walk16": [("bw24nb.engine", "ROWS_ATTENTION_GRID", 16)],
                "gdn-apart": [("bw24nb.engine", "GDN_RULE_NORM", False)],
                "rule-norm-t1": [("bw24nb.engine", "GDN_RULE_NORM_MAX_T", 1)],
                "rule-norm-fused": [("bw24nb.engine", "GDN_RULE_NORM_MAX_T", 64)],
                "gu-apart": [("bw24nb.engine", "STACK_GATE_UP_ROWS", False)],
                "norm-shared-warp": [("bw24nb.kernels.gated_deltanet", "RULE_NORM_OWN_WARP",
                                      False)],
                "s30-verify": [("bw24nb.engine", "STACK_GATE_UP_ROWS", False),
                               ("bw24nb.kernels.matvec", "ROWS_PAIRS", False),
                               ("bw24nb.kernels.gated_deltanet", "RULE_NORM_OWN_WARP", False)]}
LAUNCH_MODES.update({name: {} for name in MODULE_MODES})      # (no Engine arguments)


def module_mode(name):
    """MODULE_MODES[name]'s attributes set for the block, restored after it."""
    return switched(MODULE_MODES.get(name, ()))


def run_bench(models: list[str], *, runs: int = 3, n_ctx: int = 8192, hf_dirs: list[str] | None = None,
              torch_mode: str = "auto", torch_modes=("eager", "static+compile"),
              llama_bench: str | None = None, llama_args: str = "", engine: bool = True,
              long_prompt: int = LONG_PROMPT, bw_gib: float = 4.0,
              jsonl: str | Path | None = DEFAULT_JSONL, commit: str | None = None,
              names: list[str] | None = None, act_quants=("q8",),
              kv_caches=("default",), launches=("default",), decode: bool = True) -> Recorder:
    """Benchmark every GGUF in `models`; returns the Recorder (records already written)."""
    paths = [Path(jsonl)] if jsonl else []
    if os.environ.get("OUT"):                 # the device machine: make the records come back
        out = Path(os.environ["OUT"]) / "bench.jsonl"
        if all(p.resolve() != out.resolve() for p in paths):
            paths.append(out)
    rec = Recorder(gpu=gpu_name(), commit=git_commit(commit), paths=paths)
    print(f"{rec.gpu}, commit {rec.commit}, {rec.date}")

    read_gb_s = None
    try:
        bw = measure_read_bandwidth(bw_gib)
        read_gb_s = bw["gb_s"]
        rec.add("-", "read_bandwidth", read_gb_s, "GB/s", engine="device",
                kernel="ld.global.nc.v4.u32 xor-reduce", **{k: v for k, v in bw.items() if k != "gb_s"})
    except Exception as e:
        print(f"  read bandwidth not measured ({type(e).__name__}: {e}); no roofline %")

    from bw24nb.formats import open_model
    for i, path in enumerate(models):
        name = (names[i] if names and i < len(names) else Path(path).name)
        print(f"\n== {name} ({path})")
        source = open_model(path)
        base = {"file": str(path), "n_ctx": n_ctx}
        if engine:
            try:
                from bw24nb.engine import Engine
            except ImportError as e:
                print(f"  bw24nb engine not importable ({e}); skipping it")
            else:
                # side by side: int8 activations vs float, the KV cache types, and graphs
                # with / without programmatic edges (graph.py)
                for aq, kvc, lm in ((a, c, m) for a in act_quants for c in kv_caches
                                    for m in launches):
                    tags = ([aq] if len(act_quants) > 1 else []) + \
                        ([kvc] if len(kv_caches) > 1 else []) + ([lm] if len(launches) > 1 else [])
                    label = name if not tags else f"{name} [{' '.join(tags)}]"
                    eng = None
                    try:
                        with module_mode(lm):
                            eng = Engine(source, n_ctx=n_ctx, log=lambda *a: None, act_quant=aq,
                                         **kv_cache_kwargs(kvc), **LAUNCH_MODES[lm])
                            bench_engine(rec, label, eng, source, runs=runs, read_gb_s=read_gb_s,
                                         long_prompt=long_prompt, decode=decode,
                                         base_config=dict(base, act_quant=aq, launch=lm,
                                                          kv_cache=f"{eng.kv.k_type.name}/{eng.kv.v_type.name}",
                                                          programmatic=bool(getattr(eng, "programmatic", False)),
                                                          fuse_attention_output=eng.fuse_attention_output,
                                                          attention_plan=eng.attention_plan,
                                                          prefill_attention=eng.prefill_attention,
                                                          prefill_splits=int(eng.wsp.part_ml.shape[2]),
                                                          gdn_rule=getattr(eng, "gdn_rule", None),
                                                          prefill_path=getattr(eng, "prefill_path", None),
                                                          moe_prefill=("grouped" if getattr(eng, "moe_grouped", None)
                                                                       or getattr(eng, "moe_expert_rows", None)
                                                                       else "tokens") if getattr(eng, "experts", None) else None,
                                                          load_s=round(getattr(eng, "load_s", 0.0), 2)))
                    except Exception as e:
                        traceback.print_exc(limit=3)
                        msg = f"{type(e).__name__}: {e}"[:500]
                        rec.add(label, "engine_ok", 0, "bool", engine="bw24nb", **base, error=msg)
                    finally:
                        del eng             # free the engine's VRAM before torch loads
                        _free_numba_memory()
        hf = hf_dirs[i] if hf_dirs and i < len(hf_dirs) else None
        if torch_mode != "none" or hf:
            try:
                import torch
                model = torch_model(source.config, hf)
                bench_torch(rec, name, model, source.config.vocab_size, runs=runs,
                            modes=tuple(torch_modes),
                            base_config={"file": hf or "random init from the GGUF's config"})
                del model
                torch.cuda.empty_cache()
            except Exception as e:
                traceback.print_exc(limit=3)
                rec.add(name, "torch_ok", 0, "bool", engine="torch", error=f"{type(e).__name__}: {e}"[:500])
        if llama_bench:
            bench_llama(rec, name, llama_bench, path, runs, llama_args, long_prompt,
                        base_config={"file": str(path)})

    rec.write()
    print("\n" + rec.table())
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="GGUF files (e.g. from python3 -m bw24nb.factory)")
    ap.add_argument("--name", action="append", help="label per model (default: file name)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per metric (median), >= 3")
    ap.add_argument("--n-ctx", type=int, default=8192, help="engine context (>= 6144 + 128)")
    ap.add_argument("--hf", action="append", help="HF checkpoint dir per model for the torch run")
    ap.add_argument("--torch", choices=("auto", "none"), default="auto",
                    help="auto: torch baseline from the GGUF's config with random weights")
    ap.add_argument("--torch-modes", default="eager,static+compile",
                    help="comma list of torch modes: eager, static+compile")
    ap.add_argument("--long-prompt", type=int, default=LONG_PROMPT,
                    help="prompt length of the long-context decode point (0 = skip it)")
    ap.add_argument("--llama-bench", help="path to a llama.cpp build's llama-bench binary")
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments")
    ap.add_argument("--no-engine", action="store_true", help="skip the bw24nb engine")
    ap.add_argument("--act-quant", default="q8",
                    help="comma list of engine activation paths to run side by side: q8 (int8 "
                         "activations + dp4a, the default), f32")
    ap.add_argument("--kv-cache", default="default",
                    help="comma list of engine KV caches to run side by side: default (the "
                         "engine's), q8 (Q8_0 K / Q5_1 V), f16")
    ap.add_argument("--launch", default="default",
                    help="comma list of decode-graph launch modes to run side by side: default "
                         "(the engine's), pdl (programmatic edges), serial (plain edges), "
                         "unfused-attn (attention's output gate and int8 copy as separate launches), "
                         "plain-attn (the decode attention split plan before session 7), "
                         "moe-chain / proj-chain / chain (the MoE blocks' / the projections' / "
                         "both's launches as one chain, before session 13's side streams); "
                         "LAUNCH_MODES has them all. The first mode of a process reads ~2 %% "
                         "low on decode (A/A/A, decision 0042): lead an A/B with a throwaway "
                         "mode (pdl is the default on sm_90)")
    ap.add_argument("--bw-gib", type=float, default=4.0, help="read-bandwidth buffer (GiB)")
    ap.add_argument("--jsonl", default=str(DEFAULT_JSONL), help="append records here ('' = nowhere)")
    ap.add_argument("--commit", help="commit id to record (default: $BW24_COMMIT, else git)")
    ap.add_argument("--prefill-only", action="store_true",
                    help="bw24nb: the gate and the prefill measurements only (no decode runs)")
    args = ap.parse_args(argv)
    if args.runs < 3:
        ap.error("--runs must be >= 3 (medians of at least three runs)")
    launches = tuple(m for m in args.launch.split(",") if m)
    if set(launches) - set(LAUNCH_MODES):
        ap.error(f"unknown --launch {sorted(set(launches) - set(LAUNCH_MODES))}; known: "
                 f"{', '.join(LAUNCH_MODES)}")
    modes = [m for m in args.torch_modes.split(",") if m]
    bad = sorted(set(modes) - {"eager", "static+compile"})
    if bad:
        ap.error(f"unknown --torch-modes {bad}")
    run_bench(args.models, runs=args.runs, n_ctx=args.n_ctx, hf_dirs=args.hf, torch_mode=args.torch,
              torch_modes=modes, llama_bench=args.llama_bench, llama_args=args.llama_args,
              engine=not args.no_engine, long_prompt=args.long_prompt, bw_gib=args.bw_gib,
              jsonl=args.jsonl or None, commit=args.commit, names=args.name,
              act_quants=tuple(a for a in args.act_quant.split(",") if a),
              kv_caches=tuple(c for c in args.kv_cache.split(",") if c), launches=launches,
              decode=not args.prefill_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
