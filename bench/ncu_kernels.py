"""Launch one kernel of interest a few times, for Nsight Compute (ncu) to profile on the H200.

ncu is on the device image (Firecracker runtime: it reads the hardware counters; give it
``--clock-control none``, /work/.library/device/H200.md). This script only sets up random
inputs of a real shape and launches; ncu picks the launch (``-k regex:NAME --launch-skip 1
--launch-count 1``: the first launch compiles and warms). Targets:

  gemm-q4k   matmul_q8 at Q4_K 12288 x 4096, T = 512 (the 9B's ffn_gate / ffn_up), KERNEL_CHOICE
  gemm-q6k   matmul_q8 at Q6_K 4096 x 12288, T = 512 (the 9B's ffn_down)
  mv-q4k     the decode matvec at Q4_K 12288 x 4096, one row (the default persistent kernel)
  mv4-q4k    the same with 4 activation rows (verify at K = 3), the one-row-a-warp rows kernel
  mv4w2-q4k  mv4-q4k on two weight rows a warp (matvec.ROWS_PAIRS, decision 0036)
  mvd-q4k    one row at Q4_K 4096 x 12288 (the 9B's ffn_down: the row loop)
  mvdw2-q4k  mvd-q4k on two weight rows a warp (matvec.ONE_ROW_PAIRS)
  mvd-q6k    one row at Q6_K 4096 x 12288 on the engine's Q6_K_R kernel (the 9B's Q6_K ffn_down
             layers; kernels/matvec_q6k.py)
  gateup4    the verify's ffn_gate + ffn_up stack at K = 3 as the engine launches it: Q4_K
             24576 x 4096, 4 rows, matvec's default settings (quads: decision 0038)
  rulenorm4s the GDN rule with the output norm (gated_delta_rule_norm_q8) of a K = 3 verify:
             4 tokens of the 9B's heads, every token's state kept (states rollback)
  rule4s     the lane rule alone on the same inputs (its one-warp blocks: decision 0039)

Usage: python3 bench/ncu_kernels.py TARGET [--launches N]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from bw24nb.kernels.dequant import random_weight_bytes  # noqa: E402
from bw24nb.kernels.matmul_q8 import launch_matmul_q8  # noqa: E402
from bw24nb.kernels.matvec import launch_matvec_q8  # noqa: E402
from bw24nb.kernels.matvec_q6k import launch_matvec_q8_q6k_r, repack_q6_k  # noqa: E402
from bw24nb.kernels.quantize_act import launch_quantize_act  # noqa: E402
from bw24nb.quant import QType  # noqa: E402

TARGETS = {
    "gemm-q4k": ("gemm", QType.Q4_K, 12288, 4096, 512),
    "gemm-q6k": ("gemm", QType.Q6_K, 4096, 12288, 512),
    "mv-q4k": ("mv", QType.Q4_K, 12288, 4096, 1),
    "mv4-q4k": ("mv", QType.Q4_K, 12288, 4096, 4),
    "mv4w2-q4k": ("mv", QType.Q4_K, 12288, 4096, 4),
    "mvd-q4k": ("mv", QType.Q4_K, 4096, 12288, 1),
    "mvdw2-q4k": ("mv", QType.Q4_K, 4096, 12288, 1),
    "mvd-q6k": ("mv", QType.Q6_K, 4096, 12288, 1),
    "gateup4": ("mv", QType.Q4_K, 24576, 4096, 4),
    "rulenorm4s": ("rulenorm", None, 0, 0, 4),
    "rule4s": ("rule", None, 0, 0, 4),
}


def gdn_target(kind, T, launches) -> int:
    """launch_chain's GDN launches of T tokens with the states kept: the fused rule-norm
    (kind "rulenorm") or the lane rule alone ("rule")."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launch_chain import gdn_launches
    stream = cuda.stream()
    rule, _, rulenorm = gdn_launches(stream, np.random.default_rng(0), T=T, snapshots=True)
    for i in range(launches):
        (rulenorm if kind == "rulenorm" else rule)(i)
    stream.synchronize()
    print(f"{kind}: {launches} launches, T = {T}, states kept")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--launches", type=int, default=3)
    a = ap.parse_args()
    kind, qt, M, K, T = TARGETS[a.target]
    if kind in ("rule", "rulenorm"):
        return gdn_target(kind, T, a.launches)
    from bw24nb.kernels import matvec
    if a.target.startswith("mv"):           # (the rows kernels take quads by default since
        pairs = "w2" in a.target            # session 31: mv4 is the plain form)
        matvec.ROWS_PAIRS = matvec.ONE_ROW_PAIRS = pairs
        matvec.PAIR_ROWS_PER_WARP = 2
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    w_host = random_weight_bytes(rng, qt, M, K)
    w = cuda.to_device(w_host, stream=stream)
    x = cuda.to_device(rng.standard_normal((T, K)).astype(np.float32), stream=stream)
    xq = cuda.device_array((T, K), np.int8, stream=stream)
    xd = cuda.device_array((T, K // 32), np.float32, stream=stream)
    y = cuda.device_array((T, M), np.float32, stream=stream)
    launch_quantize_act(x, xq, xd, stream=stream)
    q6k_r = None if kind == "gemm" or qt != QType.Q6_K else tuple(
        cuda.to_device(a, stream=stream) for a in repack_q6_k(w_host, M, K))
    for _ in range(a.launches):
        if kind == "gemm":
            launch_matmul_q8(w, qt, M, K, xq, xd, y, stream=stream)
        elif qt == QType.Q6_K:              # the engine's Q6_K decode: the Q6_K_R copy
            launch_matvec_q8_q6k_r(*q6k_r, M, K, xq.reshape(-1), xd.reshape(-1), y.reshape(-1),
                                   stream=stream, rows=T)
        else:
            launch_matvec_q8(w, qt, M, K, xq.reshape(-1), xd.reshape(-1), y.reshape(-1),
                             stream=stream, rows=T)
    stream.synchronize()
    print(f"{a.target}: {a.launches} launches of {qt.name} {M} x {K}, T = {T}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
