"""The speculative-decoding exactness gate on the GPU engine, every fixture and mode in one process.

    python3 bench/spec_gate.py MODEL [MODEL ...] [--ks 1-8] [--n 64] [--prompt-len 16]
        [--modes mtp,oracle,adversarial,mixed] [--rollback states,recompute] [--ctx 256]
        [--scripted] [--launch MODE] [--jsonl PATH] [--commit SHA]

For each model, rollback strategy and draft mode: `spec.spec_check` -- greedy speculative
decoding at each K against plain greedy decoding of the same prompt, `--n` tokens -- on an
`EngineSpecTarget` (the verify and draft-chain CUDA graphs). "oracle" drafts always agree with
the target (every round accepts K), "adversarial" never do (every round rolls back), "mixed"
and the model's own "mtp" head give partial acceptances. One line per (model, rollback, mode,
K) and a record `spec_gate@K:<mode>` (1 = token-identical) appended to --jsonl (default
research/tune-data/spec.jsonl; also $OUT/spec.jsonl on the device machine). Exit 1 on any
MISMATCH. `bw24nb spec --check` is the same gate for one model and mode from the CLI.
--launch MODE runs it all under one of run_bench's module launch modes (MODULE_MODES, e.g.
`rows-cap64`: the verify's rows kernels under a 64-register cap), so a kernel kept off by
default can be gated on the GPU before it is timed or made the default.
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

from bench.run_bench import (MODULE_MODES, Recorder, git_commit, gpu_name,  # noqa: E402
                             module_mode, prompt_ids)
from bench.spec_bench import parse_ks  # noqa: E402

DEFAULT_JSONL = ROOT / "research" / "tune-data" / "spec.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/spec_gate.py", description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ks", default="1-8")
    ap.add_argument("--n", type=int, default=64, help="greedy tokens compared per run")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--modes", default="mtp,oracle,adversarial,mixed")
    ap.add_argument("--rollback", default="states,recompute")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--jsonl", default=str(DEFAULT_JSONL))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--scripted", action="store_true",
                    help="oracle / adversarial / mixed drafts read off the greedy reference "
                         "(spec_check live=False) instead of decoding ahead: same drafts, no "
                         "target cost (for the big models)")
    ap.add_argument("--launch", default="default",
                    help="one of run_bench's module launch modes (MODULE_MODES) to run under")
    a = ap.parse_args(argv)
    if a.launch != "default" and a.launch not in MODULE_MODES:
        ap.error(f"--launch: modes are default and {sorted(MODULE_MODES)}")

    paths = [Path(a.jsonl)] + ([Path(os.environ["OUT"]) / "spec.jsonl"] if os.environ.get("OUT") else [])
    rec = Recorder(gpu_name(), git_commit(a.commit), paths)
    ks = parse_ks(a.ks)
    failed = 0
    try:
        with module_mode(a.launch):
            failed = _gate(a, rec, ks)
    finally:
        rec.write()
    print("spec gate:", "MATCH everywhere" if not failed else f"{failed} MISMATCH")
    return 1 if failed else 0


def _gate(a, rec, ks) -> int:
    """Every model, rollback and mode of the gate: the number of K that mismatched."""
    from bw24nb.engine import Engine
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.formats import open_model
    from bw24nb.quant import QType
    from bw24nb.spec import plain_greedy, spec_check

    failed = 0
    for path in a.models:
        source = open_model(path)
        c = source.config
        kw = dict(k_type=QType.F16, v_type=QType.F16) if c.head_dim % 32 else {}
        engine = Engine(source, n_ctx=a.ctx, log=lambda m: print(m, file=sys.stderr), **kw)
        name = Path(path).parent.name if Path(path).name == "model.gguf" else Path(path).name
        for rollback in a.rollback.split(","):
            target = EngineSpecTarget(engine, rollback=rollback)
            prompt = prompt_ids(a.prompt_len, target.vocab_size)
            ref = plain_greedy(target, prompt, a.n)
            for mode in a.modes.split(","):
                if mode == "mtp" and not target.has_mtp:
                    continue
                t0 = time.perf_counter()
                rows = spec_check(target, prompt, a.n, ks=ks, draft_mode=mode, reference=ref,
                                  live=not a.scripted)
                dt = time.perf_counter() - t0
                for r in rows:
                    failed += not r.match
                    print(f"{name} rollback={rollback} mode={mode} K={r.k}: {r.gate}; "
                          f"{r.stats.summary()}", flush=True)
                    rec.add(name, f"spec_gate@{r.k}:{mode}", int(r.match), "match",
                            engine="bw24nb", file=path, rollback=rollback, n_gen=a.n,
                            prompt=a.prompt_len, acceptance_pct=100 * r.stats.acceptance_rate,
                            first_diff=r.first_diff, launch=a.launch)["k"] = r.k
                print(f"  ({len(rows)} K in {dt:.1f} s)", flush=True)
            del target
        del engine
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
