"""Do two forms that the simulator tests hold bit-identical also give the same bits on the GPU?

    python3 bench/gpu_same_bits.py [--T 512]
    python3 bench/gpu_same_bits.py --gemm-hash     (run under two trees' PYTHONPATH)

FMA contraction is the compiler's choice on the GPU (the simulator rounds every operation), so
a restructured kernel can differ from its twin there by an ulp. Checked at the 9B shape's GDN
dims: the lane delta rule's staged form (prefill, T >= RULE_STAGE_MIN_T) against its direct
form, and conv1d_silu's T-token launch against T one-token launches. Prints one line each:
SAME, or DIFF with the count of differing outputs and the largest relative difference.
--gemm-hash: only a hash of the prefill GEMM's outputs (Q4_K, Q6_K, Q8_0 at 512 x 4096 x 4096,
fixed inputs), to compare two trees of the library run one after the other.
"""
import hashlib
import argparse
import sys

import numpy as np
from numba import cuda

from bw24nb.kernels import gated_deltanet as gdn
from bw24nb.models.qwen35 import value_to_key_head


def _report(name, a, b):
    a, b = np.asarray(a), np.asarray(b)
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    if same:
        print(f"{name}: SAME ({a.size} values)")
    else:
        n = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
        rel = float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))
        print(f"{name}: DIFF ({n} of {a.size} values, max rel {rel:.2e})")
    return same


def gemm_hash() -> int:
    from bw24nb.kernels.matmul_q8 import launch_matmul_q8
    from bw24nb.kernels.quantize_act import launch_quantize_act
    from bw24nb.quant.types import QType
    from bw24nb.kernels.dequant import random_weight_bytes
    T, M, K = 512, 4096, 4096
    for qt in (QType.Q4_K, QType.Q6_K, QType.Q8_0):
        rng = np.random.default_rng(7)
        w = cuda.to_device(random_weight_bytes(rng, qt, M, K))
        x = cuda.to_device(rng.standard_normal((T, K)).astype(np.float32))
        xq = cuda.device_array((T, K), np.int8)
        xd = cuda.device_array((T, K // 32), np.float32)
        y = cuda.device_array((T, M), np.float32)
        launch_quantize_act(x, xq, xd)
        launch_matmul_q8(w, qt, M, K, xq, xd, y)
        print(f"gemm {qt.name} {T}x{M}x{K}: {hashlib.sha256(y.copy_to_host().tobytes()).hexdigest()[:16]}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--gemm-hash", action="store_true")
    args = ap.parse_args()
    if args.gemm_hash:
        return gemm_hash()
    rng = np.random.default_rng(21)
    T, nk, nv, dk, dv = args.T, 16, 32, 128, 128
    qn = rng.standard_normal((T, nk, dk))
    kn = rng.standard_normal((T, nk, dk))
    q = (qn / np.linalg.norm(qn, axis=-1, keepdims=True) * dk ** -0.5).astype(np.float32)
    k = (kn / np.linalg.norm(kn, axis=-1, keepdims=True)).astype(np.float32)
    v = rng.standard_normal((T, nv, dv)).astype(np.float32)
    g = (-rng.uniform(0.0, 1.5, (T, nv))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (T, nv)).astype(np.float32)
    s0 = (0.5 * rng.standard_normal((nv, dk, dv))).astype(np.float32)
    kh = cuda.to_device(value_to_key_head("qwen35", nk, nv).astype(np.int32))
    outs = {}
    for staged in (False, True):
        st = cuda.to_device(s0)
        o = cuda.device_array((T, nv, dv), np.float32)
        gdn.launch_gated_delta_rule(*(cuda.to_device(a) for a in (q, k, v, g, beta)), kh, st, o,
                                    staged=staged)
        outs[staged] = (o.copy_to_host(), st.copy_to_host())
    ok = _report("delta rule staged vs direct: o", outs[True][0], outs[False][0])
    ok &= _report("delta rule staged vs direct: state", outs[True][1], outs[False][1])

    C = 2 * nk * dk + nv * dv
    Tc = min(T, 64)
    x = (2 * rng.standard_normal((Tc, C))).astype(np.float32)
    w = cuda.to_device((0.5 * rng.standard_normal((C, gdn.CONV_KERNEL))).astype(np.float32))
    state = (2 * rng.standard_normal((gdn.CONV_KERNEL - 1, C))).astype(np.float32)
    d_x, d_state = cuda.to_device(x), cuda.to_device(state)
    gdn.launch_conv1d_silu(d_x, w, d_state, d_x)                # in place, as prefill runs it
    one, ys = cuda.to_device(state), []
    for t in range(Tc):
        y1 = cuda.device_array((1, C), np.float32)
        gdn.launch_conv1d_silu(cuda.to_device(x[t:t + 1]), w, one, y1)
        ys.append(y1.copy_to_host())
    ok &= _report("conv runs vs one-token launches: y", d_x.copy_to_host(), np.concatenate(ys))
    ok &= _report("conv runs vs one-token launches: state", d_state.copy_to_host(),
                  one.copy_to_host())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
