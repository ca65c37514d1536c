"""Prefill matmul: Y[T, M] = X[T, K] @ W[M, K]^T (+ bias[M]) (+ R[T, M]), W in GGUF blocks.

The straightforward shared-memory tiled kernel: a 256-thread block owns a TILE_T x TILE_M tile
of Y; for each TILE_K-wide slice of K it decodes the W tile (kernels/dequant.py's
<type>_element, the codec's float32 value) and copies the X tile into shared memory, then every
thread accumulates its 2 x 2 outputs from shared memory. It is the correctness baseline for
every weight type; the int8 tensor-core (mma.m16n8k32) version replaces it for speed.

Summation order (exactness contract): Y[t, m] = (((sum_k X[t,k] W[m,k]) + bias[m]) + R[t, m])
with the sum taken sequentially in ascending k in float32 (each step possibly an FMA on the GPU).

Skinny F32 weights (M <= SKINNY_M_MAX rows, e.g. Gated DeltaNet's ssm_alpha / ssm_beta,
32 x 4096): the tiled kernel gives them T / 32 blocks (16 at T = 512), each walking K one
32-wide slice at a time -- 0.52 ms a launch on the H200 (session 8). `matmul_f32_skinny`
instead gives each block SKINNY_TOKENS = 4 tokens (128 blocks at T = 512) and every row: warp
w of 8 owns rows w, w + 8, ..., lane l the 16-byte groups k = 4 l + 128 j of K, all in
registers, then a warp sum. Its order:
    s_l = sum over j ascending of (x[k] w[k] + x[k+1] w[k+1] + x[k+2] w[k+2] + x[k+3] w[k+3]),
          k = 4 l + 128 j, each product added in turn (float32);
    y = ((warp_sum tree of s_l) + bias[m]) + R[t, m]
(kernel_check's bound for it: the float32 error of a K-term sum, like the tiled kernel's).

numpy reference: `matmul_reference`.
"""
import numpy as np
from numba import cuda, float32

from ..jit import kernel
from ..ptx import f32_from_bits, ld_nc_v4_u32, warp_sum
from ..quant.types import QType, row_bytes
from .dequant import LAYOUTS, layout, weight_views

# 16 x 16 threads, each computing 2 x 2 outputs of a 32 x 32 tile; K slices of 32 (one Q8_0 /
# Q4_0 block, an eighth of a K-quant super-block). Untuned: the tensor-core kernel replaces this.
TILE_T = 32
TILE_M = 32
TILE_K = 32
THREADS = 256
_PAD = TILE_K + 1     # row pitch of the shared tiles: column reads hit 32 different banks


def _make_matmul(lay):
    element = lay.element

    qk, ts = lay.block, lay.type_size

    def matmul(w8, w16, wh, M, K, x, y, bias, residual, has_bias, has_residual):
        ws = cuda.shared.array((TILE_M, _PAD), np.float32)
        xs = cuda.shared.array((TILE_T, _PAD), np.float32)
        tid = cuda.threadIdx.x
        tx = tid & 15            # m = m0 + tx, m0 + tx + 16
        ty = tid >> 4            # t = t0 + ty, t0 + ty + 16
        m0 = cuda.blockIdx.x * TILE_M
        t0 = cuda.blockIdx.y * TILE_T
        T = x.shape[0]
        rb = np.int64(K // qk) * ts                # bytes per W row
        a00 = np.float32(0.0)
        a01 = np.float32(0.0)
        a10 = np.float32(0.0)
        a11 = np.float32(0.0)
        busy = (t0 + ty < T) and (m0 + tx < M)       # has at least one output in range
        for k0 in range(0, K, TILE_K):
            # TILE_M == TILE_T: one pass loads row r of both tiles
            for idx in range(tid, TILE_M * TILE_K, THREADS):
                r = idx // TILE_K
                c = idx - r * TILE_K
                m = m0 + r
                k = k0 + c
                v = np.float32(0.0)
                if m < M and k < K:
                    v = element(w8, w16, wh, m * rb, k)
                ws[r, c] = v
                t = t0 + r
                u = np.float32(0.0)
                if t < T and k < K:
                    u = x[t, k]
                xs[r, c] = u
            cuda.syncthreads()
            if busy:
                for c in range(TILE_K):
                    x0 = xs[ty, c]
                    x1 = xs[ty + 16, c]
                    w0 = ws[tx, c]
                    w1 = ws[tx + 16, c]
                    a00 += x0 * w0
                    a01 += x0 * w1
                    a10 += x1 * w0
                    a11 += x1 * w1
            cuda.syncthreads()
        _store(y, bias, residual, has_bias, has_residual, T, M, t0 + ty, m0 + tx, a00)
        _store(y, bias, residual, has_bias, has_residual, T, M, t0 + ty, m0 + tx + 16, a01)
        _store(y, bias, residual, has_bias, has_residual, T, M, t0 + ty + 16, m0 + tx, a10)
        _store(y, bias, residual, has_bias, has_residual, T, M, t0 + ty + 16, m0 + tx + 16, a11)

    matmul.__name__ = matmul.__qualname__ = f"matmul_{lay.name}"
    return kernel(matmul)


@cuda.jit(device=True, inline="always")
def _store(y, bias, residual, has_bias, has_residual, T, M, t, m, v):
    if t < T and m < M:
        if has_bias:
            v += bias[m]
        if has_residual:
            v += residual[t, m]
        y[t, m] = v


SKINNY_M_MAX = 64
SKINNY_TOKENS = 4
SKINNY_WARPS = 8
SKINNY_THREADS = 32 * SKINNY_WARPS
_SKINNY_RPW = SKINNY_M_MAX // SKINNY_WARPS          # rows a warp owns at most
_SKINNY_ACC = _SKINNY_RPW * SKINNY_TOKENS
_SKINNY_X = 4 * SKINNY_TOKENS                       # one 16-byte group of each token


@kernel
def matmul_f32_skinny(w32, x32, T, M, K, y, bias, residual, has_bias, has_residual):
    """Y[t, m] for the block's SKINNY_TOKENS tokens and every m < M <= SKINNY_M_MAX (the module
    docstring); w32 / x32 the F32 weight rows and X rows as flat uint32 words, K % 4 == 0."""
    acc = cuda.local.array(_SKINNY_ACC, float32)
    xv = cuda.local.array(_SKINNY_X, float32)
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    t0 = cuda.blockIdx.x * SKINNY_TOKENS
    for i in range(_SKINNY_ACC):
        acc[i] = float32(0.0)
    for k in range(4 * lane, K, 128):
        for t in range(SKINNY_TOKENS):      # a token past T reads the last one's row, unused
            a0, a1, a2, a3 = ld_nc_v4_u32(x32, np.int64(min(t0 + t, T - 1)) * K + k)
            xv[4 * t] = f32_from_bits(a0)
            xv[4 * t + 1] = f32_from_bits(a1)
            xv[4 * t + 2] = f32_from_bits(a2)
            xv[4 * t + 3] = f32_from_bits(a3)
        for r in range(_SKINNY_RPW):
            m = min(warp + r * SKINNY_WARPS, M - 1)   # a row past M: the last row, unused
            b0, b1, b2, b3 = ld_nc_v4_u32(w32, np.int64(m) * K + k)
            w0, w1 = f32_from_bits(b0), f32_from_bits(b1)
            w2, w3 = f32_from_bits(b2), f32_from_bits(b3)
            for t in range(SKINNY_TOKENS):
                a = acc[r * SKINNY_TOKENS + t]
                a += xv[4 * t] * w0
                a += xv[4 * t + 1] * w1
                a += xv[4 * t + 2] * w2
                a += xv[4 * t + 3] * w3
                acc[r * SKINNY_TOKENS + t] = a
    for r in range(_SKINNY_RPW):
        m = warp + r * SKINNY_WARPS
        for t in range(SKINNY_TOKENS):
            v = warp_sum(acc[r * SKINNY_TOKENS + t])
            if lane == 0:
                _store(y, bias, residual, has_bias, has_residual, T, M, t0 + t, m, v)


MATMUL = {qt: _make_matmul(lay) for qt, lay in LAYOUTS.items()}
for _qt, _k in MATMUL.items():
    globals()[f"matmul_{LAYOUTS[_qt].name}"] = _k

_SIG = "void(uint8[::1], uint16[::1], float16[::1], int32, int32, float32[:, ::1], " \
       "float32[:, ::1], float32[::1], float32[:, ::1], int32, int32)"
PTX_SIGNATURES = {f"matmul_{LAYOUTS[qt].name}": [_SIG] for qt in MATMUL}
PTX_SIGNATURES["matmul_f32_skinny"] = [
    "void(uint32[::1], uint32[::1], int32, int32, int32, float32[:, ::1], float32[::1], "
    "float32[:, ::1], int32, int32)"]
EXPECTED_PTX = {"matmul_f32_skinny": ["ld.global.nc.v4.u32", "shfl.sync.bfly.b32"]}


def launch_matmul(w_dev, qtype, M, K, x_dev, y_dev, bias=None, residual=None, stream=0,
                  skinny=True):
    """Y = X @ W^T (+ bias) (+ residual) for every weight type.

    w_dev: device buffer of the GGUF rows (M * row_bytes(qtype, K) bytes); x_dev float32[T, K];
    y_dev float32[T, M]; bias float32[M] or None; residual float32[T, M] or None (may be y_dev).
    F32 weights of at most SKINNY_M_MAX rows (K % 4 == 0, x contiguous) take
    `matmul_f32_skinny` unless skinny=False. Reference: `matmul_reference`."""
    lay = layout(qtype)
    need = M * row_bytes(lay.qtype, K)
    if w_dev.size * w_dev.dtype.itemsize != need:
        raise ValueError(f"matmul: a {lay.qtype.name} weight of {M} x {K} is {need} bytes; "
                         f"the device buffer holds {w_dev.size * w_dev.dtype.itemsize}")
    if x_dev.ndim != 2 or x_dev.shape[1] != K or x_dev.dtype != np.float32:
        raise ValueError(f"matmul: x must be float32[T, {K}], got {x_dev.dtype}{tuple(x_dev.shape)}")
    T = x_dev.shape[0]
    if tuple(y_dev.shape) != (T, M) or y_dev.dtype != np.float32:
        raise ValueError(f"matmul: y must be float32[{T}, {M}]")
    if residual is not None and (tuple(residual.shape) != (T, M) or residual.dtype != np.float32):
        raise ValueError(f"matmul: residual must be float32[{T}, {M}]")
    if bias is not None and (bias.size < M or bias.dtype != np.float32):
        raise ValueError(f"matmul: bias must be float32[{M}]")
    if T == 0 or M == 0:
        return
    w8, w16, wh = weight_views(w_dev)
    # stand-ins of the right type for absent bias / residual (the kernels never read them)
    tail = (y_dev[0] if bias is None else bias, y_dev if residual is None else residual,
            np.int32(bias is not None), np.int32(residual is not None))
    if (skinny and lay.qtype == QType.F32 and M <= SKINNY_M_MAX and K % 4 == 0
            and tuple(x_dev.strides) == (K * 4, 4)):
        matmul_f32_skinny[(T + SKINNY_TOKENS - 1) // SKINNY_TOKENS, SKINNY_THREADS, stream](
            w8.view(np.uint32), x_dev.reshape(T * K).view(np.uint32), np.int32(T), np.int32(M),
            np.int32(K), y_dev, *tail)
        return
    grid = ((M + TILE_M - 1) // TILE_M, (T + TILE_T - 1) // TILE_T)
    MATMUL[lay.qtype][grid, THREADS, stream](
        w8, w16, wh, np.int32(M), np.int32(K), x_dev, y_dev, *tail)


def matmul_reference(w_raw, qtype, M, K, x, bias=None, residual=None):
    """float64 ((X @ dequantize(W)^T) + bias) + residual, returned as float64[T, M]."""
    from ..quant import dequantize
    w = dequantize(np.asarray(w_raw).reshape(-1), QType(qtype), (M, K)).astype(np.float64)
    y = np.asarray(x, dtype=np.float64) @ w.T
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[:M]
    if residual is not None:
        y = y + np.asarray(residual, dtype=np.float64)
    return y
