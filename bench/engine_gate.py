"""GPU engine vs numpy reference: greedy tokens and logits, per model (the issue-4 GPU gate).

    python3 bench/engine_gate.py MODEL [MODEL ...] [--tokens 32] [--kv q8_0|f16] [--out FILE.jsonl]

For each model: the reference and the engine prefill the same prompt ids and then decode greedily
(each feeding its own argmax). Reports whether the token streams are identical, the first
divergence, and max |Δlogit| / max |logit| over the steps where both saw the same history.
Also runs gen's argmax gate (prefill vs token-by-token decode) on the engine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def run_one(path, n_tokens, kv, log):
    from bw24nb.engine import Engine
    from bw24nb.formats import open_model
    from bw24nb.generate import argmax_gate
    from bw24nb.quant import QType
    from bw24nb.reference import load_reference

    src = open_model(path)
    ref, _ = load_reference(path)
    kt, vt = (QType.F16, QType.F16) if kv == "f16" else (QType.Q8_0, QType.Q5_1)
    t0 = time.perf_counter()
    eng = Engine(src, n_ctx=256, log=log, k_type=kt, v_type=vt)
    load_s = time.perf_counter() - t0
    V = src.config.vocab_size
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, min(V, 1000), 11)]
    gate_ok, a, b = argmax_gate(eng, prompt)
    r_logits = ref.prefill(prompt)[-1]
    e_logits = eng.prefill(prompt)
    errs, same = [], True
    r_tok, e_tok = int(np.argmax(r_logits)), int(np.argmax(e_logits))
    toks_r, toks_e = [r_tok], [e_tok]
    first_div = None
    for step in range(n_tokens):
        if same:
            errs.append(float(np.abs(e_logits - r_logits).max() / np.abs(r_logits).max()))
        if r_tok != e_tok and first_div is None:
            first_div = step
            same = False
        if step == n_tokens - 1:
            break
        r_logits = ref.decode(r_tok)
        e_logits = eng.decode(e_tok)
        r_tok, e_tok = int(np.argmax(r_logits)), int(np.argmax(e_logits))
        toks_r.append(r_tok)
        toks_e.append(e_tok)
    return {"model": str(path), "kv": kv, "gate": "MATCH" if gate_ok else f"MISMATCH {a} vs {b}",
            "tokens_identical": toks_r == toks_e, "first_divergence": first_div,
            "max_rel_logit_err": max(errs), "n_tokens": n_tokens, "engine_load_s": load_s,
            "backend": eng.name}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--kv", choices=["q8_0", "f16"], default="q8_0")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows, ok = [], True
    for m in args.models:
        try:
            r = run_one(m, args.tokens, args.kv, log=lambda s: print(s, file=sys.stderr))
        except Exception as e:  # report and continue: one broken model must not hide the rest
            import traceback
            traceback.print_exc()
            r = {"model": m, "kv": args.kv, "error": f"{type(e).__name__}: {e}"}
        rows.append(r)
        ok &= r.get("tokens_identical", False) and r.get("gate") == "MATCH"
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    print(f"{'model':50s} {'kv':5s} {'gate':8s} {'same 32':8s} {'max rel err':>12s}")
    for r in rows:
        print(f"{r['model'][-50:]:50s} {r['kv']:5s} {str(r.get('gate', 'ERR'))[:8]:8s} "
              f"{str(r.get('tokens_identical', 'ERR')):8s} {r.get('max_rel_logit_err', float('nan')):12.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
