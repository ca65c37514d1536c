"""Speculative decoding on the GPU engine: what a round costs, per draft depth K.

    python3 bench/spec_bench.py MODEL.gguf [--ks 1-8] [--runs 5] [--warmup 1] [--n 128]
        [--prompt-len 512] [--ctx 4096] [--modes mtp,scripted,adversarial]
        [--rollback recompute,states] [--trims 32768,8192] [--confidences 0,0.5]
        [--launch default,MODE,..] [--passes 2] [--jsonl PATH] [--commit SHA]

e.g. on a 9B-shape random model (`python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf`).
Every time is host wall clock around a call that ends in a device synchronize (each
EngineSpecTarget call reads its result back), median of `--runs` after `--warmup`:

    decode_step_ms            one graph decode step (the plain greedy path), the unit below
    spec_verify_ms@K          one verify of K+1 tokens (a captured graph of the decode kernels
                              at T = K+1 rows, LM head rows, argmax per row, hidden rows read back)
    spec_verify_rel_decode@K  the above / decode_step_ms: the round's cost in decode steps
    decode_step_dev_ms, spec_verify_dev_ms@K, spec_verify_dev_rel_decode@K
                              the same by device time: each graph replayed --dev-replays times
                              back to back between CUDA events, median of max(--runs, 3) such
                              runs (Engine.time_decode_steps, EngineSpecTarget.time_verify):
                              no host work, steadier than one timed call (decision 0039)
    spec_rollback_ms@K        commit(1) after that verify: "recompute": state restore + a
                              1-token forward; "states": one copy of the kept step's state
    spec_draft_ms_per_token@K one round's drafting (mtp_draft: the feed graph + K-1 chain
                              graph replays, the drafts read back once) / K
    spec_draft_ms_per_token@K:trim<N>  the same with the FR-Spec draft head over N tokens
                              (--trims; ids 0..N-1: on random weights no token is more frequent
                              than another, and the cost depends on N alone)
    greedy_tok_s              plain greedy decode (Engine.generate_greedy: graph replays)
    spec_tok_s@K:<mode>       speculative_generate's generated tokens after the first / time
                              after prefill; mode "mtp" (the model's head: on random weights
                              its drafts are random, acceptance ~0) or "scripted" (drafts read
                              off the greedy output: 100% acceptance at no draft cost -- the
                              upper bound the verify cost allows) or "adversarial" (drafts that
                              always differ from greedy: acceptance 0, every round rolls back)
    spec_tok_s@K:mtp+conf<c> the MTP draft under confidence gating at threshold c
                              (--confidences; c = 0 never stops a round: what the gating's
                              device-side top probability costs by itself)
    spec_acceptance@K:<mode>  accepted / drafted of that run
    spec_gate@K:<mode>        1 when its tokens equal plain greedy's (timings of a 0 do not count)
    verify_kernel_ms@K:<name> device time of a verify's launches of that name (--profile-k),
                              with the decode step's as `decode_ms`

Records are appended as JSON lines (research/tune-data/README.md's schema plus a top-level
`k`) to --jsonl (default research/tune-data/spec.jsonl) and, when $OUT is set (the device
machine), to $OUT/spec.jsonl. Under the CUDA simulator it runs too, slowly: use a fixture with
tiny settings (`--ks 1 --runs 1 --warmup 0 --n 3 --prompt-len 3 --ctx 16`) to check it works.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))     # run as a script on the device: PYTHONPATH is not reliable

import numpy as np  # noqa: E402

from bench.run_bench import Recorder, git_commit, gpu_name, median, prompt_ids  # noqa: E402

DEFAULT_JSONL = ROOT / "research" / "tune-data" / "spec.jsonl"


def parse_ks(text: str) -> list[int]:
    """"1-8" or "1,3,8" -> [1, ..]."""
    ks = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        ks += list(range(int(a), int(b or a) + 1))
    return ks


def _sync():
    from numba import cuda
    cuda.synchronize()


def timed(fn, runs: int, warmup: int, before=None, after=None) -> list[float]:
    """Seconds of `fn()` per run (synchronized), `before` / `after` untimed around each."""
    out = []
    for i in range(warmup + runs):
        if before is not None:
            before()
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        dt = time.perf_counter() - t0
        if after is not None:
            after()
        if i >= warmup:
            out.append(dt)
    return out


def bench_rounds(rec: Recorder, model: str, target, prompt: list[int], ks, runs: int, warmup: int,
                 cfg: dict, trims=(), dev_replays: int = 20) -> None:
    """decode / verify / rollback / draft costs, each from the state after the prompt."""
    target.reset()
    rows = target.prefill(prompt)
    x = int(rows.argmax[-1])
    if target.has_mtp:                             # the prompt's pairs, fed once
        target.mtp_feed(rows.hidden, prompt[1:] + [x])
    mtp_base = target.mtp_position
    base = target.snapshot()                       # every measurement starts from here
    restore = lambda: target.restore(base)         # noqa: E731
    dec = timed(lambda: target.decode(x), runs, warmup, after=restore)
    dec_ms = 1e3 * median(dec)
    rec.add(model, "decode_step_ms", dec_ms, "ms", samples=[1e3 * s for s in dec], **cfg)

    reps = max(runs, 3)
    dev = target.engine.time_decode_steps(x, dev_replays, reps)
    restore()
    dev_ms = median(dev)
    rec.add(model, "decode_step_dev_ms", dev_ms, "ms", samples=dev, replays=dev_replays, **cfg)

    rng = np.random.default_rng(0)
    for k in ks:
        ids = [x] + [int(t) for t in rng.integers(0, target.vocab_size, k)]
        ver = timed(lambda: target.verify(ids), runs, warmup,
                    after=lambda: (target.commit(len(ids)), restore()))
        v_ms = 1e3 * median(ver)
        rec.add(model, f"spec_verify_ms@{k}", v_ms, "ms", samples=[1e3 * s for s in ver],
                **cfg)["k"] = k
        rec.add(model, f"spec_verify_rel_decode@{k}", v_ms / dec_ms, "x", **cfg)["k"] = k
        vdev = target.time_verify(ids, dev_replays, reps)
        rec.add(model, f"spec_verify_dev_ms@{k}", median(vdev), "ms", samples=vdev,
                replays=dev_replays, **cfg)["k"] = k
        rec.add(model, f"spec_verify_dev_rel_decode@{k}", median(vdev) / dev_ms, "x",
                **cfg)["k"] = k
        rb = timed(lambda: target.commit(1), runs, warmup, before=lambda: target.verify(ids),
                   after=restore)
        rec.add(model, f"spec_rollback_ms@{k}", 1e3 * median(rb), "ms",
                samples=[1e3 * s for s in rb], **cfg)["k"] = k
        if not target.has_mtp:
            continue
        for trim in (0, *trims):       # the greedy loop's path: mtp_draft's captured graphs
            vocab = np.arange(trim) if trim else None
            chain = lambda: target.mtp_draft([(rows.hidden[-1:], [x])], k, vocab)  # noqa: E731
            dr = timed(chain, runs, warmup, after=lambda: target.mtp_truncate(mtp_base))
            rec.add(model, f"spec_draft_ms_per_token@{k}" + (f":trim{trim}" if trim else ""),
                    1e3 * median(dr) / k, "ms", samples=[1e3 * s / k for s in dr],
                    **(dict(cfg, trim=trim) if trim else cfg))["k"] = k


def profile_verify(rec: Recorder, model: str, target, prompt: list[int], k: int, cfg: dict) -> None:
    """Per-kernel device time of a verify of k+1 rows against one decode step, by launch name
    (`EngineSpecTarget.profile_verify`, `Engine.profile_decode_step`): where the verify's cost
    over a decode step goes."""
    target.reset()
    rows = target.prefill(prompt)
    x = int(rows.argmax[-1])
    ids = [x] + [(x + 1 + i) % target.vocab_size for i in range(k)]
    by_name: dict[str, list[float]] = {}
    for name, ms in target.profile_verify(ids):
        by_name.setdefault(name, [0.0, 0.0])[0] += ms
    for name, ms in target.engine.profile_decode_step():
        by_name.setdefault(name, [0.0, 0.0])[1] += ms
    tv, td = (sum(v[i] for v in by_name.values()) for i in (0, 1))
    print(f"  verify of {k + 1} rows vs one decode step, per launch name: {tv:.3f} vs {td:.3f} ms")
    for name, (v, d) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
        print(f"    {name:<16} {v:8.4f} {d:8.4f}  x{v / d if d else float('nan'):.2f}")
        rec.add(model, f"verify_kernel_ms@{k}:{name}", v, "ms", decode_ms=d, **cfg)["k"] = k


def bench_end_to_end(rec: Recorder, model: str, target, prompt: list[int], ks, n: int,
                     modes, runs: int, warmup: int, cfg: dict, confidences=()) -> None:
    """tokens/s of plain greedy (the engine's graph fast path) and of speculative_generate,
    also with the MTP draft under confidence gating at each threshold of `confidences`."""
    from bw24nb.sampling import SamplingParams
    from bw24nb.spec import ScriptedDrafter, first_difference, speculative_generate

    eng = target.engine
    greedy, rates = None, []
    for i in range(warmup + runs):
        eng.reset()
        toks, t = eng.generate_greedy(prompt, n)
        greedy = toks
        if i >= warmup and t["decode_tokens"]:
            rates.append(t["decode_tokens"] / t["decode_s"])
    g_rate = median(rates) if rates else None
    rec.add(model, "greedy_tok_s", g_rate, "tok/s", samples=rates, n_gen=n, **cfg)

    runs_of = [(mode, None) for mode in modes if mode != "mtp" or target.has_mtp]
    if target.has_mtp:
        runs_of += [("mtp", c) for c in confidences]
    for mode, conf in runs_of:
        label = mode if conf is None else f"mtp+conf{conf:g}"
        for k in ks:
            rates, stats, toks = [], None, None
            for i in range(warmup + runs):
                drafter = mode if mode == "mtp" else ScriptedDrafter(
                    target, SamplingParams(), None, greedy, len(prompt),
                    "adversarial" if mode == "adversarial" else "oracle")
                _sync()
                t0 = time.perf_counter()
                toks, stats = speculative_generate(target, prompt, n, k, draft_mode=drafter,
                                                   confidence=conf)
                _sync()
                wall = time.perf_counter() - t0 - stats.prefill_s
                if i >= warmup and stats.generated > 1:
                    rates.append((stats.generated - 1) / wall)
            rate = median(rates) if rates else None
            extra = dict(n_gen=n, mode=label, **cfg)
            if conf is not None:
                extra["confidence"] = conf
            rec.add(model, f"spec_tok_s@{k}:{label}", rate, "tok/s", samples=rates,
                    speedup=None if not (rate and g_rate) else rate / g_rate, **extra)["k"] = k
            rec.add(model, f"spec_acceptance@{k}:{label}", 100 * stats.acceptance_rate, "%",
                    summary=stats.summary(), **extra)["k"] = k
            rec.add(model, f"spec_gate@{k}:{label}", int(first_difference(toks, greedy) is None),
                    "match", **extra)["k"] = k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/spec_bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ks", default="1-8", help="draft depths, e.g. 1-8 or 1,3,8")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dev-replays", type=int, default=20,
                    help="graph replays a device-time run (decode_step_dev_ms, "
                         "spec_verify_dev_ms@K)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--n", type=int, default=128, help="tokens per end-to-end run")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--modes", default="mtp,scripted,adversarial",
                    help="end-to-end draft modes: mtp, scripted, adversarial")
    ap.add_argument("--profile-k", type=int, default=3,
                    help="per-kernel breakdown of a verify at this K (0: none)")
    ap.add_argument("--rollback", default="recompute,states",
                    help="rollback strategies to measure, each a target of its own")
    ap.add_argument("--trims", default="",
                    help="FR-Spec draft-head sizes to time the draft with, e.g. 32768,8192")
    ap.add_argument("--confidences", default="",
                    help="confidence-gating thresholds to run the MTP draft under, e.g. 0,0.5 "
                         "(0 never stops a draft: the gating's own cost)")
    ap.add_argument("--launch", default="default",
                    help="comma list of run_bench's module launch modes (MODULE_MODES, e.g. "
                         "default,q4k-rowloop), each measured with targets of its own in this "
                         "process: the verify graphs are captured under its switches")
    ap.add_argument("--passes", type=int, default=1,
                    help="run the --launch list this many times in order (A B A B for 2): the "
                         "small launches' times drift between passes in one process (decision "
                         "0038), so a difference that holds in every pass is the change's; "
                         "records carry config.npass when > 1")
    ap.add_argument("--name", default=None, help="model label (default: the file name)")
    ap.add_argument("--jsonl", default=str(DEFAULT_JSONL))
    ap.add_argument("--commit", default=None)
    a = ap.parse_args(argv)
    from bench.run_bench import MODULE_MODES, module_mode
    launches = [m.strip() for m in a.launch.split(",") if m.strip()]
    if any(m != "default" and m not in MODULE_MODES for m in launches):
        ap.error(f"--launch: modes are default and {sorted(MODULE_MODES)}")
    if a.passes < 1:
        ap.error("--passes must be at least 1")

    from bw24nb.engine import Engine
    from bw24nb.formats import open_model
    from bw24nb.quant import QType

    source = open_model(a.model)
    c = source.config
    ctx = min(a.ctx, c.max_position_embeddings or a.ctx)
    kw = {}
    if c.head_dim % 32:                          # tiny fixtures: no q8_0 blocks per head
        kw = dict(k_type=QType.F16, v_type=QType.F16)
    engine = Engine(source, n_ctx=ctx, log=lambda m: print(m, file=sys.stderr), **kw)
    ks = parse_ks(a.ks)
    if max(ks) + a.prompt_len + a.n + 1 > ctx:
        ap.error(f"--prompt-len {a.prompt_len} + --n {a.n} + K {max(ks)} exceed --ctx {ctx}")
    paths = [Path(a.jsonl)] + ([Path(os.environ["OUT"]) / "spec.jsonl"] if os.environ.get("OUT") else [])
    rec = Recorder(gpu_name(), git_commit(a.commit), paths)
    model = a.name or os.path.basename(a.model.rstrip("/"))
    try:
        for n in range(1, a.passes + 1):
            for launch in launches:
                with module_mode(launch):
                    for rollback in a.rollback.split(","):
                        _bench_target(a, ap, rec, model, engine, ks, ctx, rollback, launch,
                                      n if a.passes > 1 else None)
    finally:
        rec.write()
    print(rec.table())
    return 0


def _bench_target(a, ap, rec, model, engine, ks, ctx, rollback, launch, npass=None) -> None:
    """Every measurement of one rollback strategy, on a target (and graphs) of its own; npass:
    which pass of --passes this is (None: one pass)."""
    from bw24nb.engine_spec import EngineSpecTarget
    target = EngineSpecTarget(engine, rollback=rollback)
    prompt = prompt_ids(a.prompt_len, target.vocab_size)
    cfg = dict(engine="bw24nb", file=a.model, n_ctx=ctx, runs=a.runs, warmup=a.warmup,
               prompt=a.prompt_len, rollback=rollback, has_mtp=target.has_mtp,
               **({} if launch == "default" else dict(launch=launch)),
               **({} if npass is None else dict(npass=npass)))
    print(f"{model}: {engine.name}; K in {ks}; MTP head: {target.has_mtp}; "
          f"rollback {rollback}; launch {launch}" + ("" if npass is None else f"; pass {npass}"),
          flush=True)
    trims = [int(t) for t in a.trims.split(",") if t.strip()]
    if any(not 0 < t <= target.vocab_size for t in trims):
        ap.error(f"--trims: sizes must be 1 .. {target.vocab_size}")
    bench_rounds(rec, model, target, prompt, ks, a.runs, a.warmup, cfg, trims, a.dev_replays)
    if a.profile_k:
        profile_verify(rec, model, target, prompt, a.profile_k, cfg)
    confs = [float(c) for c in a.confidences.split(",") if c.strip()]
    bench_end_to_end(rec, model, target, prompt, ks, a.n, a.modes.split(","), a.runs,
                     a.warmup, cfg, confs)


if __name__ == "__main__":
    raise SystemExit(main())
