"""The int8 MoE block on a real GPU, stage by stage: where a decode step's and a prefill
chunk's MoE time goes (decision 0017).

    python3 bench/moe_bench.py [--tokens 1,9,128] [--down-type Q4_K|Q6_K] [--jsonl PATH]
                               [--commit SHA] [--unroll fit,whole,full] [--branches on,off]
                               [--min-units 1,2] [--tiny]

At the Qwen3.6-35B-A3B shape (256 experts, top 8, hidden 2048, expert and shared FFN 512; Q4_K
gate / up, --down-type for the down projections; random weights and inputs), for each T of
--tokens:

  * the whole block per launch sequence: `token` (moe.launch_moe_block_q8: each token reads its
    own experts; decode, verify), `expert_rows` (launch_moe_block_q8_expert_rows: expert-major
    on the decode kernels, the rows prefill's default) and `gemm` (launch_moe_block_q8_grouped:
    expert-major on the int8 GEMM) for T > 1;
  * the gate and down projections alone, as the token kernel and as the group kernel run them
    (`token_gate`, `group_gate`, `token_down`, `group_down`; `group_gate_b1` with each row
    alone, matvec.GROUP_BATCH = 1), with the row dots a second they
    reach (T k F gate rows, T k H down rows): the decode row loop gives each row dot a warp,
    and the down projections' K = 512 leaves half of its lanes without a unit;
  * the gate and up in one launch (`group_gate_up_pair`, moe.GATE_UP_PAIRS) and the block
    with them as two launches side by side (`block_expert_rows_nopair`);
  * the expert_rows block's other stages, each alone: `route_sort` and its three launches
    (`router`, on token tiles from moe.ROUTER_TILE_MIN_T tokens, with tile sizes
    `router_t<tokens>r<rows>` and the token kernel `router_tok` beside it; `route`, `sort`),
    `group_up`, `swiglu`, `shared_expert` (its three matvecs and swiglu), `combine`; and the
    block with the group kernels' rows one at a time beside it (`block_expert_rows_walk`,
    matvec.GROUP_BATCH = 1).

Each is captured N times into one CUDA graph (bench/matmul_q8_bench.py's `time_per_launch_us`)
and timed by CUDA events: median us per launch. Checks in the same run, flagged BAD: the
expert_rows block's output equals the token block's bit for bit (both sum every row in the
decode order), the GEMM block's agrees with it to 1e-2 of max |y| (another order), and the
router's token tiles give the token kernel's logits bit for bit. --min-units 1,2 runs
everything once per moe.TOKEN_MIN_UNITS value, each with its own matrices.
--unroll fit,whole,full runs everything three times: the defaults (the row loop's unroll fitted
to short rows, matvec.fit_unroll, and rows of <= 16 units on 16 / 8 lanes,
matvec.lanes_per_row), fitted on a whole warp a row, and the full 4 slots on a whole warp; the
token block must give the same bits each way. --branches on,off runs the blocks with their
independent launches on side streams (moe.BRANCHES, the default: parallel graph branches) and
as one chain; the bits must be the same, and each block's output after the timed replays must
equal its first launch's (a race between branches would show there).
One JSON record per row to --jsonl (default $OUT/moe_bench.jsonl or ./moe_bench.jsonl); exits
1 on BAD. --tiny: a 4-expert block of width 256; `--tiny --tokens 1` is what the simulator
runs in about a minute, as a smoke test of the script (T = 3 takes it over 10 minutes).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402


def _block(rng, E, k, H, F, down_type):
    """A random int8-ready MoE layer: (ExpertWeights, ExpertMatricesQ8)."""
    from bw24nb.kernels import moe
    from bw24nb.quant import QType, quantize
    from bw24nb.kernels.dequant import random_weight_bytes as _random_weight
    from numba import cuda

    def dev(a):
        return cuda.to_device(a)
    qt = QType.Q4_K
    gate, up = (_random_weight(rng, qt, E * F, H) for _ in range(2))
    down = _random_weight(rng, down_type, E * H, F)
    sh_gate, sh_up = (_random_weight(rng, qt, F, H) for _ in range(2))
    sh_down = _random_weight(rng, down_type, H, F)
    router = quantize(rng.standard_normal((E, H)).astype(np.float32), QType.F32)
    sh_inp = quantize(rng.standard_normal((1, H)).astype(np.float32), QType.F32)
    w = moe.ExpertWeights(
        n_experts=E, top_k=k, hidden=H, ffn=F, norm_topk_prob=True, router=dev(router),
        router_type=QType.F32, gate=dev(gate), gate_type=qt, up=dev(up), up_type=qt,
        down=dev(down), down_type=down_type, shared_ffn=F, sh_gate=dev(sh_gate),
        sh_gate_type=qt, sh_up=dev(sh_up), sh_up_type=qt, sh_down=dev(sh_down),
        sh_down_type=down_type, sh_gate_inp=dev(sh_inp), sh_gate_inp_type=QType.F32)
    return w, moe.expert_matrices_q8(w)


def bench_tokens(T, w, q, rng, stream, smoke, seed):
    """[(name, us, launches, row_dots or None)], the problems found and the blocks' outputs,
    for T tokens (the inputs drawn from `seed` and T, the same for every call)."""
    from numba import cuda
    from bw24nb.kernels import matvec, moe
    from bw24nb.kernels.quantize_act import launch_quantize_act
    from matmul_q8_bench import time_per_launch_us
    E, k, H, F = w.n_experts, w.top_k, w.hidden, w.ffn
    # x at the scale that keeps the expert pre-activations O(1) (kernel_check's reason)
    rng = np.random.default_rng([seed, T])
    x = cuda.to_device((rng.standard_normal((T, H)) / np.sqrt(H)).astype(np.float32))
    xq, xd = cuda.device_array(T * H, np.int8), cuda.device_array(T * H // 32, np.float32)
    launch_quantize_act(x.reshape(T * H), xq, xd, stream=stream)
    blocks = {"token": (moe.MoEScratchQ8, moe.launch_moe_block_q8)}
    if T > 1:
        blocks["expert_rows"] = (moe.MoEScratchExpertRows, moe.launch_moe_block_q8_expert_rows)
        if moe.grouped_experts(w):
            blocks["gemm"] = (moe.MoEScratchGrouped, moe.launch_moe_block_q8_grouped)
    out, rows, problems = {}, [], []
    scratch = {}
    for name, (kind, block) in blocks.items():
        s = scratch[name] = kind(T, w)
        y = cuda.device_array((T, H), np.float32)

        def launch(block=block, s=s, y=y):
            block(x, xq, xd, w, q, s, y, stream=stream)
        launch()
        stream.synchronize()
        out[name] = y.copy_to_host()
        us, n = time_per_launch_us(launch, stream, smoke)
        rows.append((f"block_{name}", us, n, None))
        if not np.array_equal(y.copy_to_host().view(np.uint32), out[name].view(np.uint32)):
            problems.append(f"{name} block: the output after {n}-launch graph replays differs "
                            "from the first launch's (a race?)")
    if "expert_rows" in out and not np.array_equal(out["expert_rows"].view(np.uint32),
                                                    out["token"].view(np.uint32)):
        problems.append("expert_rows block != token block (bits)")
    if "gemm" in out:
        err = float(np.abs(out["gemm"] - out["token"]).max() / np.abs(out["token"]).max())
        # another summation order and another int8 rounding of the expert activations: the
        # H200 measured 1.6e-3 at T = 128 (session 12); this only catches a broken block
        if not err <= 1e-2:
            problems.append(f"gemm block differs from the token block by {err:.2e} of max |y|")
    # the router's token tiles (a prefill chunk's) against the token kernel (decode's): bits
    st = scratch["token"]
    if moe.ROUTER_TILES and T >= moe.ROUTER_TILE_MIN_T:
        xr = q.router.x_args(xq=xq, xd=xd, x=x)
        lt, lk = (cuda.device_array((T, E), np.float32) for _ in range(2))
        moe.launch_token_tiles(q.router, xr, lt, T, stream)
        moe.launch_token_matvec(q.router, st.ids, False, 1, xr, False, lk, T, stream)
        stream.synchronize()
        if not np.array_equal(lt.copy_to_host().view(np.uint32),
                              lk.copy_to_host().view(np.uint32)):
            problems.append("router: token tiles != token kernel (bits)")
    # the gate and down projections alone, on the buffers the blocks left
    xi = q.gate.x_args(xq=xq, xd=xd, x=x)
    stages = [("token_gate", T * k * F, lambda: moe.launch_token_matvec(
                  q.gate, st.ids, True, k, xi, False, st.gate, T, stream)),
              ("token_down", T * k * H, lambda: moe.launch_token_matvec(
                  q.down, st.ids, True, k, q.down.x_args(st.act_q, st.act_d), True, st.yd, T,
                  stream))]
    if "expert_rows" in scratch:
        se, R = scratch["expert_rows"], T * k
        stages += [("group_gate", R * F, lambda: moe.launch_group_matvec(
                       q.gate, se.group_off, se.src, xi, se.gate, E, R, stream)),
                   ("group_down", R * H, lambda: moe.launch_group_matvec(
                       q.down, se.group_off, None, q.down.x_args(se.act_q, se.act_d), se.yd, E,
                       R, stream))]
        # the rest of the expert_rows block, stage by stage (on its own buffers, in its order:
        # the block's time minus the three projections is these)
        Fs = w.shared_ffn
        y_c = cuda.device_array((T, H), np.float32)
        xk = dict(xq=xq, xd=xd, x=x)          # (the block's own activation keywords)

        def on(tm, xa, o, st):          # the block's one group of all T rows
            moe.launch_group_matvec(tm, se.all_rows, None, xa, o, 1, T, st)

        def shared():
            side = se.branches.fork(stream, 0)      # as the block forks and joins it
            moe._shared_expert(q, se, xk, T, se.branches, side, on)
            se.branches.join(stream, 0)

        def walked(fn):                 # fn with matvec.GROUP_BATCH = 1: each row alone
            saved, matvec.GROUP_BATCH = matvec.GROUP_BATCH, 1
            try:
                fn()
            finally:
                matvec.GROUP_BATCH = saved
        def unpaired(fn):               # fn with moe.GATE_UP_PAIRS off: two launches
            saved, moe.GATE_UP_PAIRS = moe.GATE_UP_PAIRS, False
            try:
                fn()
            finally:
                moe.GATE_UP_PAIRS = saved
        stages += [("group_gate_b1", R * F, lambda: walked(lambda: moe.launch_group_matvec(
                       q.gate, se.group_off, se.src, xi, se.gate, E, R, stream))),
                   ("group_gate_up_pair", 2 * R * F, lambda: moe.launch_group_matvec_pair(
                       q.gate, q.up, se.group_off, se.src, xi, se.gate, se.up.reshape(R, F), E,
                       R, stream)),
                   ("block_expert_rows_nopair", None, lambda: unpaired(
                       lambda: moe.launch_moe_block_q8_expert_rows(x, xq, xd, w, q, se, y_c,
                                                                   stream=stream))),
                   ("route_sort", None, lambda: moe._route_sort(w, q, se, xk, T, stream)),
                   # route_sort's three launches alone: the router's float matvec (on token
                   # tiles from moe.ROUTER_TILE_MIN_T tokens; router_tok: the token kernel),
                   # softmax + top-k (a block a token) and the sort (one block)
                   ("router", T * E, lambda: moe.router_logits(q, se, xk, T, stream)),
                   *[(f"router_t{nr}r{rb}", T * E, lambda nr=nr, rb=rb: moe.launch_token_tiles(
                       q.router, q.router.x_args(**xk), se.logits, T, stream, nr=nr, rows=rb))
                     for nr, rb in ((8, 8), (4, 4), (2, 8), (4, 2), (2, 4), (4, 16))],
                   ("router_tok", T * E, lambda: moe.launch_token_matvec(
                       q.router, se.ids, False, 1, q.router.x_args(**xk), False, se.logits, T,
                       stream)),
                   ("route", None, lambda: moe.launch_moe_route(
                       se.logits, w.norm_topk_prob, se.ids, se.weights, stream)),
                   ("sort", None, lambda: moe.launch_moe_sort(
                       se.ids, E, se.group_off, se.pos, se.src, stream)),
                   ("block_expert_rows_walk", None, lambda: walked(
                       lambda: moe.launch_moe_block_q8_expert_rows(x, xq, xd, w, q, se, y_c,
                                                                   stream=stream))),
                   ("group_up", R * F, lambda: moe.launch_group_matvec(
                       q.up, se.group_off, se.src, xi, se.up.reshape(R, F), E, R, stream)),
                   ("swiglu", None, lambda: moe.launch_swiglu_q8(
                       se.gate.reshape(R, F), se.up.reshape(R, F), se.act.reshape(R, F),
                       se.act_q, se.act_d, stream)),
                   ("shared_expert", T * (2 * Fs + H), shared),
                   ("combine", None, lambda: moe.launch_moe_combine(
                       se.yd, se.weights, y_c, se.sh_y,
                       None, None, stream, pos=se.pos))]
    for name, dots, launch in stages:
        try:
            us, n = time_per_launch_us(launch, stream, smoke)
        except Exception as e:          # (one stage's failure must not lose the others' rows)
            problems.append(f"stage {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        rows.append((name, us, n, dots))
    return rows, problems, out


def main(argv=None) -> int:
    from run_bench import Recorder, git_commit, gpu_name
    ap = argparse.ArgumentParser(prog="bench/moe_bench.py", description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,9,128")
    ap.add_argument("--down-type", default="Q4_K", choices=["Q4_K", "Q6_K"])
    ap.add_argument("--jsonl", default=None)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--unroll", default="fit",
                    help="a list of fit (the default: the row loop's slots a step cut to a "
                         "short row's units, short rows on 16 / 8 lanes), whole (fitted, a warp "
                         "a row) and full (4 slots, a warp a row); the token block must give "
                         "the same bits in each")
    ap.add_argument("--min-units", default=None,
                    help="a list of moe.TOKEN_MIN_UNITS values (the fewest units a lane keeps "
                         "of a split token-matrix row), each run in turn with its own "
                         "matrices; the default: the module's")
    ap.add_argument("--branches", default="on",
                    help="a list of on (the default: independent launches on side streams) and "
                         "off (one chain); the blocks must give the same bits in each")
    a = ap.parse_args(argv)
    from numba import cuda
    from bw24nb.device import simulator_enabled
    from bw24nb.quant import QType
    smoke = simulator_enabled()
    E, k, H, F = (4, 2, 256, 256) if a.tiny else (256, 8, 2048, 512)
    out_dir = Path(os.environ.get("OUT", "."))
    paths = [Path(a.jsonl) if a.jsonl else out_dir / "moe_bench.jsonl"]
    rec = Recorder(gpu_name(), git_commit(a.commit), paths)
    rng = np.random.default_rng(a.seed)
    stream = cuda.stream()
    w, q = _block(rng, E, k, H, F, QType[a.down_type])
    shape = f"E{E} k{k} H{H} F{F} down {a.down_type}"
    print(f"moe bench, {gpu_name()}, {shape}")
    from bw24nb.kernels import moe
    if a.min_units is None:
        return _bench(a, ap, rec, w, q, stream, shape, smoke)
    bad, default = 0, moe.TOKEN_MIN_UNITS
    for mu in (int(v) for v in a.min_units.split(",") if v):
        moe.TOKEN_MIN_UNITS = mu           # (the matrices' parts are fixed when they are built)
        print(f"moe.TOKEN_MIN_UNITS = {mu}")
        try:
            bad += _bench(a, ap, rec, w, moe.expert_matrices_q8(w), stream, shape, smoke,
                          tag=f"/mu{mu}", min_units=mu)
        finally:
            moe.TOKEN_MIN_UNITS = default
    rec.write()
    return 1 if bad else 0


def _bench(a, ap, rec, w, q, stream, shape, smoke, tag="", min_units=None):
    """Every T of --tokens under every --unroll x --branches combination; the BAD count."""
    from bw24nb.kernels import matvec, moe
    bad = 0
    print(f"{'T':>5} {'launch':<24} {'us':>10} {'n':>5} {'row dots/s':>12}")
    rng = np.random.default_rng(a.seed)
    modes = [m for m in a.unroll.split(",") if m]
    if not modes or any(m not in ("fit", "whole", "full") for m in modes):
        ap.error("--unroll: a list of fit, whole and full")
    branches = [b for b in a.branches.split(",") if b]
    if not branches or any(b not in ("on", "off") for b in branches):
        ap.error("--branches: a list of on and off")
    combos = [(m, b) for m in modes for b in branches]
    for T in (int(t) for t in a.tokens.split(",") if t):
        block_outs = {}
        for mode, br in combos:
            # fit: each launch's unroll cut to its rows' units (matvec.fit_unroll) and short rows
            # on part of a warp (matvec.lanes_per_row), the defaults; whole: fitted, a warp a
            # row; full: 4 slots, a warp a row
            matvec.FIT_UNROLL = mode != "full"
            matvec.SUB_WARP_ROWS = mode == "fit"
            moe.BRANCHES = br == "on"
            tag_ = (tag + ("" if modes == ["fit"] else f"/{mode}")
                    + ("" if branches == ["on"] else f"/br-{br}"))
            rows, problems, outs = bench_tokens(T, w, q, rng, stream, smoke, a.seed)
            block_outs[mode, br] = outs
            for name, us, n, dots in rows:
                rate = dots / (us * 1e-6) if dots else None
                print(f"{T:>5} {name + tag_:<24} {us:>10.2f} {n:>5} "
                      + (f"{rate:>12.3e}" if rate else f"{'':>12}"))
                rec.add("moe-35b-a3b-shape", f"moe_us:{name}@T{T}", us, "us", engine="bw24nb",
                        shape=shape, launches_per_graph=n, row_dots=dots, row_dots_per_s=rate,
                        unroll=mode, branches=br,
                        min_units=moe.TOKEN_MIN_UNITS if min_units is None else min_units)
            for p in problems:
                print(f"  BAD T={T} {mode} branches {br}: {p}")
            bad += len(problems)
        first = next(iter(block_outs))
        for key, outs in block_outs.items():
            for name in ("token", "expert_rows"):
                if name in outs and not np.array_equal(outs[name].view(np.uint32),
                                                       block_outs[first][name].view(np.uint32)):
                    print(f"  BAD T={T}: the {name} block's bits differ between {first} and {key}")
                    bad += 1
        matvec.FIT_UNROLL, matvec.SUB_WARP_ROWS, moe.BRANCHES = True, True, True
    if min_units is None:
        rec.write()
        return 1 if bad else 0
    return bad


if __name__ == "__main__":
    sys.exit(main())
