"""What a small kernel costs inside a decode graph: chains of the decode step's launches.

    python3 bench/launch_chain.py [--n 64] [--hidden 4096] [--commit SHA] [--out PATH]

The 9B decode step spends ~1.1 ms of its ~3.1 ms outside the matvecs, in a dozen small
kernels a layer; a graph launch gap is ~0.9 us (../shared/DEVICE.md), so most of that is each
small kernel's own dependency chain, not the launch. This measures it: each sequence below is
captured N times over into one graph with programmatic edges, as the engine captures its
decode step, and timed per repetition (CUDA events, median of 5 replays after 2 warm-ups):

  empty     a one-block kernel storing one value: the floor of a dependent launch
  norm      rms_norm_q8 of one hidden row (the attn / ffn norm of a decode layer), split over
            a block per slot (the default since session 15)
  norm1     the same on one block (split=False, the form before)
  gnorm     the gated q8 norm over 32 value heads of 128 (the GDN output norm)
  mv        the Q4_K hidden x hidden matvec with a residual (ssm_out / attn_output), the
            weights rotated over copies so that every launch reads HBM
  mv+norm   mv then norm, as in a layer: (mv+norm) - mv is what the norm adds to a step
  rule      the gated delta rule of one token (the lane kernel, 9B heads: 16 key / 32 value
            heads of 128)
  rule+gnorm         the rule, then the gated q8 output norm: the two launches before
                     session 27
  rulenorm  the two in one launch (gated_deltanet.launch_gated_delta_rule_norm_q8; session
            27 also measured a "last" form: the lane kernel's blocks, the head's last one
            norming -- decision 0034)
  rulenorm<T>[s][/np]  the same launch on verify's T = 1, 2, 4 tokens (rulenorm1 is
                     rulenorm), "s" with the per-token state snapshots that states rollback
                     keeps, "/np" with each token's inputs read in its step (not preloaded:
                     gated_deltanet.RULE_NORM_PRELOAD off, session 32's form)
  rule<T>[s][+gnorm] the lane rule of T tokens alone (its grid nv x dv / 16 one-warp blocks
                     spreads a head over several SMs; the fused launch keeps it on one), then
                     the gated q8 norm as a second launch: the verify's launches apart
  convprep1, convprep4s
                     gdn_conv_prep on the 9B's channels: decode's one row, verify's four with
                     every row's window kept
  attn<S>@<P>        decode attention as the engine launches it (F16 cache, split pass +
                     combine with the output gate and the int8 output) for the head shape S
                     (9b: 16 / 4 heads of 256, 05b: 14 / 2 of 64) at position P of an 8192 cache
  attn<S>split@<P>   its split pass alone: the combine costs the difference
  attn<S>comb@<P>    its combine alone, over the partials the split left
  attn<S>split+e@<P> the split pass, then the one-thread kernel `empty` runs
  .../mc<V>          the same with the split plan's min_chunk V (--min-chunks)
  .../npf            attention or its split with the split's K / V prefetch off
  .../cs<N>          attention as one launch on clusters of N = 2, 4, 8, 16 blocks a KV head
                     (decode_attention.SPLIT_CLUSTER, the position before the wait; the same
                     results)
  .../pw             attention or its split with the split's position, plan and prefetch
                     before its grid-dependency wait (decode_attention.SPLIT_PRE_WAIT: the
                     engine's decode step past the one pass; the same results)
  .../il             attention or its split with the softmax's rows interleaved
                     (decode_attention.INTERLEAVE_ROWS; the same results)
  .../merge          attention or its split with one-tile splits through the four-warp
                     merge (decode_attention.ONE_TILE_DIRECT off; the default stores them
                     from warp 0 directly since session 21: the same results)
  .../1p             attention in decode_attention's one-pass kernel (engine.ONEPASS_MAX_CTX;
                     the same results where it serves the position, NaN past it)
  .../1ps            the same with the token's RoPE and K / V store in it (engine.ONEPASS_STORE)
  .../1pld, 1psld    the two with their loads issued early (decode_attention.ONEPASS_EARLY)
  .../1psld          on the engine's clusters (decode_attention.onepass_cluster: 2 blocks a
                     head up to D = 64, since session 45), .../1psldc1 a block a head
  .../1psldc<N>      1psld on thread-block clusters of N = 2, 4, 8 blocks a query head
                     sharing out the block's warps (decode_attention.ONEPASS_CLUSTER_SHARE;
                     the same results); .../1psldc<N>f each block of the full width
  .../1psldpw        1psld with its position and K / V prefetch before its grid-dependency
                     wait (decode_attention.ONEPASS_PRE_WAIT, the default since session
                     46: .../1psld is the same; the same results); .../1psldw after it
  .../wq, 1psldwq    attention (position before the wait) and 1psld with q read as 16-byte
                     shared loads (decode_attention.WIDE_Q, off; the same results)

Appends one JSON line per sequence (date, gpu, commit, sequence, us per repetition) to --out
(default $OUT/launch_chain.jsonl). Benchmarks are not tests.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.graph import CudaGraph  # noqa: E402
from bw24nb.jit import kernel  # noqa: E402
from bw24nb.kernels import attention, decode_attention  # noqa: E402
from bw24nb.switches import switched  # noqa: E402
from bw24nb.kernels.dequant import random_weight_bytes  # noqa: E402
from bw24nb.kernels.matvec import launch_matvec_q8  # noqa: E402
from bw24nb.kernels.norm import launch_gated_rms_norm_q8, launch_rms_norm_q8  # noqa: E402
from bw24nb.kernels.rope import rope_inv_freq  # noqa: E402
from bw24nb.quant import QType  # noqa: E402
from bw24nb.quant.types import row_bytes  # noqa: E402
from matvec_bench import L2_BYTES, _commit, event_ms  # noqa: E402


@kernel
def store_one(y):
    """The smallest kernel a graph can chain: one thread stores one value."""
    if cuda.threadIdx.x == 0:
        y[0] = y[0] + np.float32(1.0)


# decode attention head shapes (query heads, KV heads, head dim)
ATTENTION_SHAPES = {"9b": (16, 4, 256), "05b": (14, 2, 64)}


def attention_launch(stream, rng, Hq, Hkv, D, ctx, position):
    """launch(**options): decode attention of one token at `position` over a random F16 cache
    of `ctx` positions, as the engine launches it (the output gate and int8 output fused into
    the combine), on partials for the engine's split count; options go to
    attention.launch_flash_decode (min_chunk, only, prefetch, trace, ...). `.n_splits` and
    `.out` are the partials' split count and the output."""
    def cache():
        v = rng.standard_normal((Hkv, ctx, D)).astype(np.float16)
        u8 = cuda.to_device(v.view(np.uint8), stream=stream)
        return u8, u8.view(np.float16)
    k_u8, k_f16 = cache()
    v_u8, v_f16 = cache()
    q = cuda.to_device(rng.standard_normal((1, Hq, D)).astype(np.float32), stream=stream)
    # the one-pass kernel's store (store=True): the token's new K / V rows, 64 rotary dims
    knew, vnew = (cuda.to_device(rng.standard_normal((1, Hkv, D)).astype(np.float32),
                                 stream=stream) for _ in range(2))
    inv = cuda.to_device(rope_inv_freq(1e6, min(64, D)), stream=stream)
    pos = cuda.to_device(np.array([position], np.int32), stream=stream)
    out = cuda.device_array((1, Hq, D), np.float32, stream=stream)
    gate = cuda.to_device(rng.standard_normal(Hq * D).astype(np.float32), stream=stream)
    xq = cuda.device_array(Hq * D, np.int8, stream=stream)
    xd = cuda.device_array(Hq * D // 32, np.float32, stream=stream)
    n_splits = attention.decode_splits(ctx, Hkv)
    pml, pacc = attention.alloc_decode_partials(1, Hq, D, n_splits)

    def launch(store=False, **options):
        attention.launch_flash_decode(q, pos, k_u8, k_f16, QType.F16, v_u8, v_f16, QType.F16,
                                      out, pml, pacc, stream=stream, gate=gate, xq=xq, xd=xd,
                                      store=(knew, vnew, inv) if store else None, **options)
    launch.n_splits, launch.out = n_splits, out
    return launch


def attention_launches(stream, rng, Hq, Hkv, D, ctx, position, min_chunk=None):
    """{kind: launch}: decode attention as `attention_launch` runs it ("" ); its split pass
    alone ("split"); its combine alone, over the partials the split left ("comb"); the split
    followed by the one-thread kernel, what a kernel boundary after the split costs
    ("split+e"); the whole and the split without the split's K / V prefetch ("/npf",
    "split/npf"), with the softmax's rows interleaved ("/il", "split/il") and with one-tile
    splits through the merge ("/merge", "split/merge"); the one-pass kernel ("/1p": NaN where
    its plan does not serve the position, decode_attention.onepass_max_ctx), with the token's
    RoPE and K / V store ("/1ps"), each with its loads issued early ("/1pld", "/1psld";
    decode_attention.ONEPASS_EARLY), the last on clusters of N blocks a head ("/1psldcN",
    decode_attention.ONEPASS_CLUSTER). min_chunk: the
    split plan's (default the engine's). A kind's "/..." part goes after the sequence name's
    position (docstring above)."""
    mc = attention.DECODE_MIN_CHUNK if min_chunk is None else min_chunk
    run = attention_launch(stream, rng, Hq, Hkv, D, ctx, position)

    def attend(only, prefetch=None, interleave=None, direct=None, onepass=False, store=False,
               early=None, cluster=None, pre_wait=False):
        extra = (dict(store=store, early=early, cluster=cluster) if onepass
                 else dict(pre_wait=pre_wait))
        return lambda i: run(min_chunk=mc, only=only, prefetch=prefetch, interleave=interleave,
                             direct=direct, onepass=onepass, **extra)

    split = attend("split")

    def split_then_empty(i):
        split(i)
        store_one[1, 32, stream](run.out.reshape(run.out.size))
    return {"": attend(None), "split": split, "comb": attend("combine"),
            "split+e": split_then_empty, "/npf": attend(None, False),
            "/pw": attend(None, pre_wait=True), "split/pw": attend("split", pre_wait=True),
            **{f"/cs{n}": lambda i, n=n: run(min_chunk=mc, split_cluster=n, pre_wait=True)
               for n in (2, 4, 8, 16)},
            "split/npf": attend("split", False), "/il": attend(None, None, True),
            "split/il": attend("split", None, True), "/merge": attend(None, direct=False),
            "split/merge": attend("split", direct=False),
            "/1p": attend(None, onepass=True, early=False),
            "/1pld": attend(None, onepass=True, early=True),
            "/1ps": attend(None, onepass=True, store=True, early=False),
            "/1psld": attend(None, onepass=True, store=True, early=True),
            "/1psldc1": attend(None, onepass=True, store=True, early=True, cluster=1),
            **{f"/1psldc{n}": switch(attend(None, onepass=True, store=True, early=True,
                                            cluster=n), "ONEPASS_CLUSTER_SHARE", True)
               for n in (2, 4, 8)},
            **{f"/1psldc{n}f": switch(attend(None, onepass=True, store=True, early=True,
                                             cluster=n), "ONEPASS_CLUSTER_SHARE", False)
               for n in (2, 4)},
            "/1psldpw": switch(attend(None, onepass=True, store=True, early=True),
                               "ONEPASS_PRE_WAIT", True),
            "/1psldw": switch(attend(None, onepass=True, store=True, early=True),
                              "ONEPASS_PRE_WAIT", False),
            "/wq": switch(attend(None, pre_wait=True), "WIDE_Q", True),
            "/1psldwq": switch(attend(None, onepass=True, store=True, early=True),
                               "WIDE_Q", True)}


def switch(launch, name: str, value):
    """`launch` with decode_attention's switch `name` set to `value` while it launches (a
    one-pass cluster's blocks sharing out the warps, ONEPASS_CLUSTER_SHARE; the position
    before the wait, ONEPASS_PRE_WAIT)."""
    def run(i):
        with switched([(decode_attention, name, value)]):
            launch(i)
    return run


def gdn_launches(stream, rng, nk=16, nv=32, d=128, T=1, snapshots=False):
    """(rule(i), gnorm(i), rulenorm(i)): T tokens' gated delta rule (the lane kernel; one
    token: decode's), the gated q8 output norm after it, and the two as one launch (with
    `snapshots`, keeping every token's state as verify's states rollback does), on random
    inputs of the 9B's heads; the state is updated in place, as in decode."""
    from bw24nb.kernels import gated_deltanet as gdn
    from bw24nb.models.qwen35 import value_to_key_head

    def dev(a):
        return cuda.to_device(np.ascontiguousarray(a, np.float32), stream=stream)
    unit = rng.standard_normal((T, nk, d))
    q = dev(unit / np.linalg.norm(unit, axis=-1, keepdims=True) * d ** -0.5)
    unit = rng.standard_normal((T, nk, d))
    k = dev(unit / np.linalg.norm(unit, axis=-1, keepdims=True))
    v, z = dev(rng.standard_normal((T, nv, d))), dev(rng.standard_normal((T, nv, d)))
    g, beta = dev(-rng.uniform(0, 1, (T, nv))), dev(rng.uniform(0, 1, (T, nv)))
    state = dev(0.1 * rng.standard_normal((nv, d, d)))
    steps = cuda.device_array((T, nv, d, d), np.float32, stream=stream) if snapshots else None
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32), stream=stream)
    w = dev(np.ones(d))
    o = cuda.device_array((T, nv, d), np.float32, stream=stream)
    xq = cuda.device_array(T * nv * d, np.int8, stream=stream)
    xd = cuda.device_array(T * nv * d // 32, np.float32, stream=stream)
    eps = 1e-6

    def rule(i):
        gdn.launch_gated_delta_rule(q, k, v, g, beta, key_head, state, o, stream=stream,
                                    variant="lane", steps=steps)

    def gnorm(i):
        gdn.launch_gdn_output_norm(o, z, w, eps, o, stream=stream, xq=xq, xd=xd)

    def rulenorm(i):
        gdn.launch_gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o, z, w, eps,
                                            xq, xd, stream=stream, steps=steps)
    return rule, gnorm, rulenorm


def conv_prep_launch(stream, rng, nk=16, nv=32, d=128, T=1, steps=False):
    """T rows of gdn_conv_prep on the 9B's channels (with `steps`, every row's window kept, as
    verify's states rollback does); the window is updated in place."""
    from bw24nb.kernels import gated_deltanet as gdn

    def dev(a):
        return cuda.to_device(np.ascontiguousarray(a, np.float32), stream=stream)
    C = 2 * nk * d + nv * d
    qkv, w = dev(rng.standard_normal((T, C))), dev(0.5 * rng.standard_normal((C, 4)))
    window = dev(rng.standard_normal((gdn.CONV_KERNEL - 1, C)))
    a, b = dev(rng.standard_normal((T, nv))), dev(rng.standard_normal((T, nv)))
    dt_bias, ssm_a = dev(rng.standard_normal(nv)), dev(-np.exp(rng.uniform(-2, 2, nv)))
    q, k = (cuda.device_array((T, nk, d), np.float32, stream=stream) for _ in range(2))
    v = cuda.device_array((T, nv, d), np.float32, stream=stream)
    g, beta = (cuda.device_array((T, nv), np.float32, stream=stream) for _ in range(2))
    st = (cuda.device_array((T, gdn.CONV_KERNEL - 1, C), np.float32, stream=stream)
          if steps else None)

    def run(i):
        gdn.launch_gdn_conv_prep(qkv, w, window, a, b, dt_bias, ssm_a, q, k, v, g, beta,
                                 stream=stream, steps=st)
    return run


def apart(launches, then_norm):
    """gdn_launches' rule alone, or the rule then the gated q8 norm (two launches)."""
    rule, gnorm, _ = launches
    return (lambda i: (rule(i), gnorm(i))) if then_norm else rule


def no_preload(body, form):
    """body, or with form "/np" body under gated_deltanet.RULE_NORM_PRELOAD = False."""
    if form != "/np":
        return body

    def off(i):
        from bw24nb.kernels import gated_deltanet as gdn
        from bw24nb.switches import switched
        with switched([(gdn, "RULE_NORM_PRELOAD", False)]):
            body(i)
    return off


def per_rep_us(stream, n, body) -> float:
    """Capture body(i) for i < n into one programmatic graph; us per repetition."""
    body(0)                                   # compiled and loaded before capture
    stream.synchronize()
    with CudaGraph.capture(stream, programmatic=True) as g:
        for i in range(n):
            body(i)
    ms = event_ms(lambda: g.replay(stream), stream)
    g.close()
    return 1e3 * ms / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=64, help="repetitions per graph")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--note", default="")
    ap.add_argument("--only", default="",
                    help="comma list of sequence-name prefixes to run (default: all)")
    ap.add_argument("--ctx", type=int, default=8192, help="the attention cache's positions")
    ap.add_argument("--positions", default="511,6143",
                    help="attention sequences' query positions (comma list; none: '')")
    ap.add_argument("--min-chunks", default="",
                    help="comma list of split-plan min_chunk values for the attention sequences, "
                         "each named attn<shape>[split]@<pos>/mc<v> (default: the engine's only)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    H, n = a.hidden, a.n
    stream = cuda.stream()
    rng = np.random.default_rng(0)
    eps = np.float32(1e-6)

    one = cuda.to_device(np.zeros(1, np.float32), stream=stream)
    h = cuda.to_device(rng.standard_normal(H).astype(np.float32), stream=stream)
    nw = cuda.to_device((1 + 0.1 * rng.standard_normal(H)).astype(np.float32), stream=stream)
    y = cuda.device_array(H, np.float32, stream=stream)
    xq = cuda.device_array(H, np.int8, stream=stream)
    xd = cuda.device_array(H // 32, np.float32, stream=stream)
    heads, dv = 32, 128
    o = cuda.to_device(rng.standard_normal((heads, dv)).astype(np.float32), stream=stream)
    z = cuda.to_device(rng.standard_normal((heads, dv)).astype(np.float32), stream=stream)
    gw = cuda.to_device(np.ones(dv, np.float32), stream=stream)
    gy = cuda.device_array((heads, dv), np.float32, stream=stream)
    gq = cuda.device_array(heads * dv, np.int8, stream=stream)
    gd = cuda.device_array(heads * dv // 32, np.float32, stream=stream)
    nbytes = H * row_bytes(QType.Q4_K, H)
    copies = max(2, math.ceil(3 * L2_BYTES / nbytes))
    w_host = random_weight_bytes(rng, QType.Q4_K, H, H)
    ws = [cuda.to_device(w_host, stream=stream) for _ in range(copies)]
    launch_rms_norm_q8(h, nw, eps, y, xq, xd, stream=stream)     # a valid int8 input for mv

    def mv(i):
        launch_matvec_q8(ws[i % copies], QType.Q4_K, H, H, xq, xd, h, residual=h, stream=stream)

    def norm(i, split=True):
        launch_rms_norm_q8(h, nw, eps, y, xq, xd, stream=stream, split=split)

    def norm1(i):
        norm(i, False)

    rule, gnorm, rulenorm = gdn_launches(stream, rng)
    seqs = {
        "empty": lambda i: store_one[1, 32, stream](one),
        "rule": rule,
        "rule+gnorm": lambda i: (rule(i), gnorm(i)),
        "rulenorm": rulenorm,
        **{f"rulenorm{T}" + ("s" if snap else "") + form: no_preload(
            gdn_launches(stream, rng, T=T, snapshots=snap)[2], form)
           for T in (1, 2, 4) for snap in (False, True) for form in ("", "/np")},
        **{f"rule{T}" + ("s" if snap else "") + ("+gnorm" if then else ""): apart(
            gdn_launches(stream, rng, T=T, snapshots=snap), then)
           for T in (1, 2, 4) for snap in (False, True) for then in (False, True)},
        **{f"convprep{T}" + ("s" if T > 1 else ""): conv_prep_launch(stream, rng, T=T, steps=T > 1)
           for T in (1, 4)},
        "norm": norm,
        "norm1": norm1,
        "gnorm": lambda i: launch_gated_rms_norm_q8(o, z, gw, eps, gy, gq, gd, stream=stream),
        "mv": mv,
        "mv+norm": lambda i: (mv(i), norm(i)),
        "mv+norm1": lambda i: (mv(i), norm1(i)),
    }
    for tag, (Hq, Hkv, D) in ATTENTION_SHAPES.items():
        for p in [int(v) for v in a.positions.split(",") if v]:
            for mc in [int(v) for v in a.min_chunks.split(",") if v] or [None]:
                sfx = "" if mc is None else f"/mc{mc}"
                for kind, body in attention_launches(stream, rng, Hq, Hkv, D, a.ctx, p,
                                                     mc).items():
                    base, _, after = kind.partition("/")
                    seqs[f"attn{tag}{base}@{p}{sfx}" + (f"/{after}" if after else "")] = body
    if a.only:
        keep = tuple(v for v in a.only.split(",") if v)
        seqs = {k: v for k, v in seqs.items() if k.startswith(keep)}
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    gpu = getattr(cuda.get_current_device(), "name", "simulator")
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    commit = a.commit or _commit()
    out = a.out or os.path.join(os.environ.get("OUT", "."), "launch_chain.jsonl")
    res = {}
    with open(out, "a") as f:
        for name, body in seqs.items():
            res[name] = us = per_rep_us(stream, n, body)
            print(f"{name:8s} {us:8.2f} us a repetition (n = {n})", flush=True)
            f.write(json.dumps({"date": date, "gpu": gpu, "commit": commit, "hidden": H, "n": n,
                                "sequence": name, "us": round(us, 3), "note": a.note}) + "\n")
    for nm in ("norm", "norm1"):
        if "mv+" + nm in res and "mv" in res:
            print(f"{nm} after a matvec adds {res['mv+' + nm] - res['mv']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
