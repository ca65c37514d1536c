"""Where two trees' prefills part: a hash of the workspace after every launch of one prefill chunk.

    python3 bench/prefill_hashes.py MODEL.gguf [--T 512] [--layers 4] > hashes.txt

Runs one prefill chunk of T fixed prompt tokens from position 0 launch by launch (the engine's
own launch list, `Engine._forward_launches`) and prints, after each launch, one line: the
layer, the launch's name and a short hash of every workspace buffer (the residual stream h, the
normed input x, the projections, the GDN and attention intermediates). For layers past
--layers only h is hashed, once a layer (hashing every buffer after every launch of a 32-layer
model reads ~20 GB back). Run it under two trees' PYTHONPATH on the same GPU and diff the
outputs: the first differing line names the first launch whose output changed. Uses only the
engine API both trees have (session 22: the 9B's tokens changed between 559a9c5 and dc88338
while every kernel twin checked gave the same bits).
"""
import argparse
import hashlib
import sys

import numpy as np
from numba import cuda

BUFFERS = ("h", "x", "qg", "q", "gate", "k", "v", "attn", "g", "u", "qkv", "z", "a", "b",
           "gq", "gk", "gv", "decay", "beta", "o", "xq", "xd")


def _digest(arr) -> str:
    host = arr.copy_to_host()
    return hashlib.sha1(np.ascontiguousarray(host).view(np.uint8)).hexdigest()[:10]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4, help="layers hashed launch by launch")
    args = ap.parse_args()
    from bw24nb.engine import Engine
    from bw24nb.formats import open_model
    eng = Engine(open_model(args.model), n_ctx=max(1024, args.T), log=lambda *a: None)
    ws, T = eng.wsp, min(args.T, eng.wsp.T)
    ids = np.random.default_rng(5).integers(0, min(eng.config.vocab_size, 32000), T)
    eng.reset()
    ws.ids[:T].copy_to_device(ids.astype(np.int32), stream=eng.stream)
    ws.positions[:T].copy_to_device(np.arange(T, dtype=np.int32), stream=eng.stream)
    names = [b for b in BUFFERS if getattr(ws, b, None) is not None]
    for b in names:                   # unwritten memory would differ between runs
        buf = getattr(ws, b)
        buf.copy_to_device(np.zeros(buf.shape, buf.dtype), stream=eng.stream)
    name, embed = eng._forward_launches(ws, T)[0]     # the engine's own first launch
    assert name == "embedding", name
    embed()
    eng.stream.synchronize()
    print(f"embedding h={_digest(ws.h)}")
    for i in range(eng.config.num_hidden_layers):
        for name, fn in eng._layer_launches(i, ws, T):
            fn()
            eng.stream.synchronize()
            if i < args.layers:
                print(f"layer {i} {name} " + " ".join(f"{b}={_digest(getattr(ws, b))}"
                                                       for b in names), flush=True)
        if i >= args.layers:
            print(f"layer {i} h={_digest(ws.h)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
