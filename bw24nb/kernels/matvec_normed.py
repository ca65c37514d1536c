"""The decode matvec with its input's RMSNorm and int8 quantization folded into each block.

Decode runs rms_norm_q8 (norm.py: x = rms_norm(h) * w as int8 codes + scales) and then the
matvec that reads those codes. In the decode graph a launch boundary costs ~2-3 us whatever
the work (decision 0043's timeline), and the default 0.5B model runs 49 such norms a token,
~3.1 us each: 15 % of its step. Here every block of the matvec computes the codes itself, into
shared memory (`norm.q8_prologue`), and its warps then read them there instead of from global
memory: one launch where there were two.

The bits do not change. The prologue gives rms_norm_q8_rows' codes and scales exactly (its
docstring), and the row loop is the one-row kernel's (matvec.one_row_of: the same warps a row,
units a lane, lane order, warp tree and store), so every output is bit for bit the pair of
launches' -- which is also what speculative decoding's verify (the separate launches over its
K + 1 rows) gives each row.

What it costs: the norm's work, done by every block instead of once. The row is re-read from
L2 (C floats and C weights a block) and each thread values C / 128 elements. That is cheap
next to a launch where the matvec has few blocks (the 0.5B's q / k / v stack: 1152 rows, 288
blocks), and adds up where it has many (its gate / up stack: 9728 rows, 2432 blocks). Which
consumers take it is the engine's choice (engine.NORM_IN_MATVEC), by measurement.

Serves the Q8_0 / Q5_0 / Q4_0 kernels of matvec_qx0 (the default model's matrices) for rows of
up to MAX_K values (shared memory C + C / 8 bytes; C / 128 values a thread in registers).
Reference: norm.rms_norm_q8 then matvec.matvec_q8_reference; the tests compare against the two
launches bit for bit.
"""
import numpy as np
from numba import cuda

from ..quant.types import QType, row_bytes
from . import matvec, matvec_qx0
from .dequant import weight_views
from .matvec import THREADS, WARPS_PER_BLOCK, fit_unroll, one_row_of
from .norm import SCRATCH_WARPS, q8_prologue

# The widest row the prologue takes: 16 values a thread of the 128-thread block
MAX_K = 2048


def _x_block_shared(NB):
    """The prologue's copy of block u (`norm.q8_prologue`'s word-major layout, NB blocks a
    row) as matvec_qx0's `_x_block` returns it: 8 words of codes and the scale."""
    @cuda.jit(device=True, inline="always")
    def x_block(x, u):
        xs, ds = x
        return (xs[u], xs[NB + u], xs[2 * NB + u], xs[3 * NB + u], xs[4 * NB + u],
                xs[5 * NB + u], xs[6 * NB + u], xs[7 * NB + u], ds[u])
    return x_block


def _kernel(qt, K, parts):
    """The kernel for qt rows of K values, `parts` warps a row (1: folded in, as row_kernel's
    fixed_parts; else the run-time split): matvec_qx0's fitted path with its activations read
    from the prologue's shared copy."""
    p = fit_unroll(matvec_qx0.PATHS[qt], K, parts)
    ps = p._replace(name=f"{p.name}_normed_k{K}", module=__name__,
                    value=matvec_qx0.VALUE_OF[qt](_x_block_shared(K // 32)))
    fp = 1 if parts == 1 else 0
    one_row, prologue = one_row_of(ps, fp), q8_prologue(K, THREADS)
    NW, NB = K // 4, K // 32           # (shared array sizes: constants, not expressions)

    def matvec_normed(w, M, h, wn, eps, y, bias, residual, has_bias, has_residual, parts):
        xs = cuda.shared.array(NW, np.uint32)
        ds = cuda.shared.array(NB, np.float32)
        scratch = cuda.shared.array(SCRATCH_WARPS, np.float32)
        part_sh = cuda.shared.array(WARPS_PER_BLOCK, np.float32)
        prologue(h, wn, eps, xs, ds, scratch)
        one_row(w, M, K, (xs, ds), y, bias, residual, has_bias, has_residual, parts, part_sh)

    return matvec._named(matvec_normed, ps, fp)


_KERNELS: dict = {}


def kernel_for(qt, K, parts):
    """`_kernel`, built (not compiled) once per (type, K, parts build)."""
    key = (QType(qt), int(K), 1 if parts == 1 else 0)
    if key not in _KERNELS:
        _KERNELS[key] = _kernel(key[0], key[1], parts)
    return _KERNELS[key]


def serves(qtype, w_dev, K) -> bool:
    """Whether a matrix of rows of K values in w_dev can run here: a type matvec_qx0 serves on
    this buffer, and a row the prologue takes (K a multiple of 32, at most MAX_K)."""
    w8 = weight_views(w_dev)[0]
    return matvec_qx0.serves(QType(qtype), w8) and K % 32 == 0 and 32 <= K <= MAX_K


def launch_matvec_normed(w_dev, qtype, M, K, h, wn, eps, y, bias=None, residual=None, stream=0,
                         parts=None):
    """y = W @ q8(rms_norm(h) * wn) (+ bias) (+ residual) in one launch: bit for bit
    norm.launch_rms_norm_q8(h, wn, eps, ...) then matvec.launch_matvec_q8 on its codes (one
    row). h and wn float32[K] (h: the first K values of its buffer), y float32[M], bias and
    residual float32[M] or None; parts as launch_matvec_q8's (default warps_per_row)."""
    qt = QType(qtype)
    if not serves(qt, w_dev, K):
        raise ValueError(f"matvec_normed: no kernel for {qt.name} rows of {K} on this buffer "
                         f"(Q8_0 / Q5_0 / Q4_0 that matvec_qx0 serves, K a multiple of 32 "
                         f"up to {MAX_K})")
    need = M * row_bytes(qt, K)
    if w_dev.nbytes != need:
        raise ValueError(f"matvec_normed: a {qt.name} weight of {M} x {K} is {need} bytes; "
                         f"the device buffer holds {w_dev.nbytes}")
    hf = h.reshape(h.size)
    for name, a, n in (("h", hf, K), ("wn", wn, K), ("y", y, M), ("bias", bias, M),
                       ("residual", residual, M)):
        if a is not None and (a.dtype != np.float32 or a.size < n):
            raise ValueError(f"matvec_normed: {name} must be float32 with at least {n} values")
    parts = matvec.warps_per_row(M, K) if parts is None else int(parts)
    yf = y.reshape(y.size)
    w8, w16, wh = weight_views(w_dev)
    kernel_for(qt, K, parts)[matvec._grid(M, parts), THREADS, stream](
        matvec_qx0.weight_args(w8, w16, wh), np.int32(M), hf, wn, np.float32(eps), yf,
        yf if bias is None else bias, yf if residual is None else residual.reshape(residual.size),
        np.int32(bias is not None), np.int32(residual is not None), np.int32(parts))


# module attributes for tests/test_compile_ptx.py: the 0.5B's q / k / v stacks (K = 896:
# Q8_0 on half its layers, Q5_0 on the others, two warps a row) and its gate / up (one)
matvec_normed_q8_0_k896 = kernel_for(QType.Q8_0, 896, 2)
matvec_normed_q5_0_k896_p1 = kernel_for(QType.Q5_0, 896, 1)
_W = "Tuple((uint32[::1], uint16[::1], float16[::1]))"
_SIG = (f"void({_W}, int32, float32[::1], float32[::1], float32, float32[::1], float32[::1], "
        "float32[::1], int32, int32, int32)")
PTX_SIGNATURES = {"matvec_normed_q8_0_k896": [_SIG], "matvec_normed_q5_0_k896_p1": [_SIG]}
EXPECTED_PTX = {name: ["ld.global.nc.v4.u32", "dp4a.s32.s32", "bar.sync", "shfl.sync.bfly.b32"]
                for name in PTX_SIGNATURES}
