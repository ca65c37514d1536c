"""Why does a MoE model's prefill-vs-decode argmax gate fail? Layer by layer, on a real GPU.

    python3 bench/moe_gate_diag.py MODEL.gguf [--tokens 32] [--jsonl PATH] [--commit SHA]

run_bench's gate compares prefill's next-token argmax with token-by-token decode's. The dense
kernels of the two paths sum in different orders (the prefill GEMM vs the decode matvec, the
chunked vs the recurrent delta rule), so their hidden states differ by float32 rounding; a MoE
router turns that into a discrete choice, and an expert swapped at a near tie moves the
output by O(1). This script tells that apart from a wrong path: it runs the gate's prompt
through prefill (one chunk) and through eager decode steps, records every MoE block's input
x, router logits and chosen experts (the int8 block, moe.launch_moe_block_q8, wrapped), and
prints per MoE layer

  * max over tokens of |x_prefill - x_decode| / max |x_decode|: the float noise the dense
    kernels leave before the layer's router;
  * how many tokens chose another expert set, and at the first such (layer, token) the
    router's margin there: the gap between the k-th and (k+1)-th logits of prefill's row,
    against the two rows' largest logit difference.

Until the first routing difference the input difference is pure rounding (~1e-6 .. 1e-4); a
swap at a margin below the logit difference is a near tie (DESIGN.md: cross-kernel-family FP
order on discontinuous top-k routing), one at a wide margin, or a large input difference
before any swap, a bug. One JSON record per layer goes to --jsonl (default
$OUT/moe_gate_diag.jsonl).
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

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()

    from numba import cuda
    from bw24nb.engine import Engine
    from bw24nb.formats import open_model
    from bw24nb.kernels import moe
    from bench.run_bench import git_commit, gpu_name, prompt_ids

    src = open_model(args.model)
    eng = Engine(src, n_ctx=max(256, 2 * args.tokens), log=lambda *a: None, use_graph=False)
    if not eng.moe_q8:
        print(f"{args.model}: no layer runs the int8 MoE block; nothing to record")
        return 1
    calls: list[tuple] = []
    original = moe.launch_moe_block_q8

    def recording(x, xq, xd, w, q, s, y, residual=None, stream=0):
        original(x, xq, xd, w, q, s, y, residual=residual, stream=stream)
        cuda.synchronize()
        calls.append((x.copy_to_host(), s.logits.copy_to_host(), s.ids.copy_to_host()))

    moe.launch_moe_block_q8 = recording
    ids = prompt_ids(args.tokens, src.config.vocab_size)
    try:
        eng.reset()
        pre_logits = np.asarray(eng.prefill(ids), np.float64)
        pre = list(calls)
        calls.clear()
        eng.reset()
        for t in ids:
            dec_logits = np.asarray(eng.decode(t), np.float64)
        dec = list(calls)
    finally:
        moe.launch_moe_block_q8 = original
    # the main stack's MoE layers (an MTP block past it has one too, which plain decode skips)
    L = sum(1 for i in eng.moe_q8 if i < src.config.num_hidden_layers)
    T, k = len(ids), src.config.num_experts_per_tok
    if len(pre) != L or len(dec) != L * T:
        print(f"recorded {len(pre)} prefill / {len(dec)} decode blocks, expected {L} / {L * T}")
        return 1
    base = dict(date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                gpu=gpu_name(), commit=git_commit(args.commit), model=Path(args.model).name,
                tokens=T)
    out = Path(args.jsonl) if args.jsonl else Path(os.environ.get("OUT", ".")) / "moe_gate_diag.jsonl"
    rows = []
    first = None
    print(f"{args.model}: {L} MoE layers, {T} tokens, top-{k}")
    print(f"{'layer':>5} {'max|dx|/max|x|':>15} {'tokens routed differently':>26}")
    for li in range(L):
        xp, lp, ip = pre[li]
        xs = np.concatenate([dec[t * L + li][0] for t in range(T)])
        ls = np.concatenate([dec[t * L + li][1] for t in range(T)])
        iss = np.concatenate([dec[t * L + li][2] for t in range(T)])
        dx = float(np.abs(xp.astype(np.float64) - xs).max() / max(np.abs(xs).max(), 1e-30))
        differ = [t for t in range(T) if set(ip[t]) != set(iss[t])]
        rec = dict(base, layer=li, metric="moe_input_rel_diff", value=dx, tokens_rerouted=len(differ))
        if differ and first is None:
            t = differ[0]
            srt = np.sort(lp[t].astype(np.float64))[::-1]
            margin = float(srt[k - 1] - srt[k])
            dl = float(np.abs(lp[t].astype(np.float64) - ls[t]).max())
            first = (li, t, margin, dl)
            rec.update(first_token=t, margin=margin, logit_diff=dl)
        rows.append(rec)
        print(f"{li:>5} {dx:>15.2e} {len(differ):>26}")
    scale = max(float(np.abs(pre_logits).max()), 1e-30)
    print(f"final logits: argmax prefill {int(pre_logits.argmax())}, decode {int(dec_logits.argmax())}, "
          f"max |diff| {float(np.abs(pre_logits - dec_logits).max()) / scale:.2e} of max |logit|")
    if first is None:
        print("no token chose another expert set")
    else:
        li, t, margin, dl = first
        kind = "a near tie" if margin <= 2 * dl else "NOT a near tie"
        print(f"first rerouted: layer {li}, token {t}: router margin (k-th - (k+1)-th logit) "
              f"{margin:.3e}, max |router logit diff| {dl:.3e} -> {kind}")
    with out.open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"# {len(rows)} records -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
