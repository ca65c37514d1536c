"""What a kernel takes on this GPU: registers a thread, shared and local memory, the most
threads a block may have -- and whether a launch of the engine's block size goes.

    python3 bench/kernel_resources.py [--regs 0,192,168,128]

For gated_deltanet's conv-in-the-rule-norm build (gdn_conv_rule_norm_q8), which the H100
refused to launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, session 38) at the 9B's heads, beside
the rule-norm build that runs: each built with every register cap of --regs (0: none), then
launched once on the 9B's heads (T = 1).
"""
import argparse
import sys

import numpy as np
from numba import cuda

from bw24nb.kernels import gated_deltanet as gdn
from bw24nb.models.qwen35 import value_to_key_head


def _attrs(kern):
    """(regs, shared, local, max threads) of a dispatcher's one compiled specialization."""
    [sig] = list(kern.overloads)
    out = []
    for get in ("get_regs_per_thread", "get_shared_mem_per_block", "get_local_mem_per_thread",
                "get_max_threads_per_block"):
        try:
            out.append(getattr(kern, get)(sig))
        except Exception as e:       # a numba without the query
            out.append(f"? ({type(e).__name__})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regs", default="0,192,168,128")
    args = ap.parse_args()
    nk, nv, dk, dv, T = 16, 32, 128, 128, 1
    C = 2 * nk * dk + nv * dv
    rng = np.random.default_rng(3)
    f32 = (lambda *sh: cuda.to_device(rng.standard_normal(sh).astype(np.float32)))
    key_head = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    threads = 32 * (dv // gdn.LANE_COLS + 1)
    ok = True
    for regs in [int(r) for r in args.regs.split(",")]:
        gdn.RULE_CONV_MAX_REGISTERS = regs or None
        gdn._RULE_NORM_KERNELS.clear()
        kern = gdn.rule_norm_kernel(dk, True, 1, True)
        try:
            ab = f32(T, 2 * nv)
            gdn.launch_gdn_conv_rule_norm_q8(
                f32(T, C), f32(C, 4), f32(3, C), ab[:, nv:], ab[:, :nv], f32(nv), f32(nv),
                key_head, f32(nv, dk, dv), f32(T, nv, dv), f32(T, nv, dv), f32(dv), 1e-6,
                cuda.device_array(T * nv * dv, np.int8), cuda.device_array(T * nv * dv // 32,
                                                                            np.float32),
                gdn.alloc_conv_counters(nk))
            cuda.synchronize()
            result = "launched"
        except Exception as e:
            result, ok = f"FAILED: {type(e).__name__}: {str(e)[:80]}", False
        print(f"gdn_conv_rule_norm_q8 cap {regs or 'none'}: regs, shared, local, max threads "
              f"= {_attrs(kern)}; block {threads}: {result}")
    gdn._RULE_NORM_KERNELS.clear()
    base = gdn.rule_norm_kernel(dk, True, 0)
    q, k = f32(T, nk, dk), f32(T, nk, dk)
    gdn.launch_gated_delta_rule_norm_q8(q, k, f32(T, nv, dv), f32(T, nv), f32(T, nv), key_head,
                                        f32(nv, dk, dv), f32(T, nv, dv), f32(T, nv, dv), f32(dv),
                                        1e-6, cuda.device_array(T * nv * dv, np.int8),
                                        cuda.device_array(T * nv * dv // 32, np.float32))
    cuda.synchronize()
    print(f"gated_delta_rule_norm_q8: regs, shared, local, max threads = {_attrs(base)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
