"""Activations to int8 for the dp4a matvec: one float32 scale per 32 consecutive values.

For each block of 32 values x[32b .. 32b + 31], llama.cpp's CPU reference rounding
(bw24nb.quant.quantize_activations_q8, the numpy reference this kernel matches bit for bit):
    amax = max |x|
    d    = amax / 127                       (float32 division, correctly rounded)
    id   = 1 / d  (float32; 0 when d == 0)
    q    = roundf(x * id)                   (float32 product; C roundf: ties away from zero)
Every step is a correctly rounded IEEE operation, so GPU, simulator and numpy agree exactly.
(ggml-cuda's quantize_q8_1 divides by d instead, which can flip a q at a .5 boundary; we follow
the CPU reference, as bw24nb/quant/activations.py explains.)
The input is a flat run of n values, n a multiple of 32; a [T, K] matrix with K % 32 == 0 is
n = T * K and its rows never share a block.
"""
import math

import numpy as np
from numba import cuda

from ..jit import kernel

QBLOCK = 32
# The "nibble order" of a quantized activation row (decision 0027): within every 256 values the
# 32-value blocks are stored in the order 0, 2, 4, 6, 1, 3, 5, 7 -- the values a Q4_K chunk's
# low nibbles meet first, then those its high nibbles meet -- so that the 8 lanes of a Q4_K
# super-block read one contiguous 128-byte line per activation load instead of two half-used
# ones (matvec_q4k.PATH_NIB). Only the int8 values move, a whole 32-block at a time; the scales
# xd stay in natural order, and so does every value's code. Rows of K % 256 == 0 values only.
NIBBLE_GROUP = 256


def nibble_order(xq):
    """The nibble order of int8 activations in natural order (numpy; size % 256 == 0): block j
    of every 256 values moves to slot 4 (j & 1) + (j >> 1). The reference for producers that
    would write it (none does yet: decision 0027), and the bench's and tests' way to make it."""
    a = np.asarray(xq)
    if a.size % NIBBLE_GROUP:
        raise ValueError(f"nibble order: {a.size} values is not a whole number of "
                         f"{NIBBLE_GROUP}-value groups")
    g = a.reshape(-1, 4, 2, QBLOCK)                # [group, p, s, 32]: block j = 2 p + s
    return np.ascontiguousarray(g.transpose(0, 2, 1, 3)).reshape(a.shape)


# 4 activation blocks (one warp each) per 128-thread block.
BLOCKS_PER_CTA = 4
THREADS = QBLOCK * BLOCKS_PER_CTA


@cuda.jit(device=True, inline="always")
def round_half_away(v):
    """C roundf on float32 for |v| < 2^23: the nearest integer as a float32, ties away from
    zero -- floor, then up when the fraction is >= 1/2 (a - floor(a) is exact in float32, so no
    `+ 0.5` rounding trap). All in float32: math.floor gives an integer, and `r += 1` on it had
    the compiler round-trip through float64 (F2F.F64, DADD), 1/64 rate on consumer GPUs."""
    a = abs(v)
    r = np.float32(math.floor(a))
    if a - r >= np.float32(0.5):
        r += np.float32(1.0)
    return -r if v < np.float32(0.0) else r


@cuda.jit(device=True, inline="always")
def q8_code(v, amax):
    """(q, d): value v's int8 code in a 32-block whose max |x| is amax, and the block's scale --
    quantize_act_q8's arithmetic, for kernels that produce activations and quantize them on
    the way out (the fused norm, swiglu_q8): one warp = one block there, amax a warp_max."""
    d = amax / np.float32(127.0)
    inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    return round_half_away(v * inv), d


@cuda.jit(device=True, inline="always")
def _block_amax(amax, v):
    """max |v| over this thread's warp (= its 32-value block), by a tree in shared memory (max
    is exact in any order); every thread of the block calls it (it holds barriers)."""
    tid = cuda.threadIdx.x
    lane = tid & 31
    amax[tid] = abs(v)
    cuda.syncthreads()
    off = 16
    while off > 0:
        if lane < off:
            amax[tid] = max(amax[tid], amax[tid + off])
        cuda.syncthreads()
        off >>= 1
    return amax[tid - lane]


@kernel
def quantize_act_q8(x, xq, xd, n):
    """x float32[n] -> xq int8[n], xd float32[n / 32]; one thread per value, one warp per block."""
    amax = cuda.shared.array(THREADS, np.float32)
    i = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
    v = x[i] if i < n else np.float32(0.0)
    q, d = q8_code(v, _block_amax(amax, v))
    if i < n:
        xq[i] = q
        if (cuda.threadIdx.x & 31) == 0:
            xd[i >> 5] = d


@kernel
def fake_quant_act_q8(x, xf):
    """x float32[T, K] (rows may be strided) -> xf float32[T, K] = q * d: the values
    quantize_act_q8's int8 output stands for, as floats (the same amax tree and rounding, so the
    same q and d; K % 32 == 0, so a warp is one block of one row). Prefill's float matmul runs
    on these, so it sees the activations decode's dp4a matvec sees."""
    amax = cuda.shared.array(THREADS, np.float32)
    T, K = x.shape
    i = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
    t = i // K
    k = i - t * K
    v = x[t, k] if t < T else np.float32(0.0)
    q, d = q8_code(v, _block_amax(amax, v))
    if t < T:
        # through an integer, as the int8 path stores it: a negative value rounding to zero
        # gives +0.0 (the float rounding alone would keep -0.0, which the int8 q cannot hold)
        xf[t, k] = np.float32(np.int32(q)) * d


PTX_SIGNATURES = {
    "quantize_act_q8": ["void(float32[::1], int8[::1], float32[::1], int32)"],
    "fake_quant_act_q8": ["void(float32[:, :], float32[:, ::1])"],
}


def launch_quantize_act(x_dev, xq_dev, xd_dev, n=None, stream=0):
    """Quantize the first n values of x_dev (float32, flat or [T, K]) into xq_dev (int8, same
    count) and xd_dev (float32, n / 32 scales). n defaults to x_dev.size.
    Reference: `quantize_act_q8_reference`."""
    n = x_dev.size if n is None else int(n)
    if n % QBLOCK:
        raise ValueError(f"quantize_act: {n} values is not a whole number of {QBLOCK}-blocks")
    if x_dev.dtype != np.float32 or xq_dev.dtype != np.int8 or xd_dev.dtype != np.float32:
        raise ValueError("quantize_act: x float32, xq int8, xd float32")
    if xq_dev.size < n or xd_dev.size < n // QBLOCK or x_dev.size < n:
        raise ValueError(f"quantize_act: need x, xq of >= {n} values and xd of >= {n // QBLOCK}")
    flat = (lambda a: a if a.ndim == 1 else a.reshape(a.size))
    grid = (n + THREADS - 1) // THREADS
    quantize_act_q8[grid, THREADS, stream](flat(x_dev), flat(xq_dev), flat(xd_dev), np.int32(n))


def launch_fake_quant_act(x_dev, xf_dev, stream=0):
    """xf = dequantize(quantize(x)) row-wise, x float32 [T, K] (a strided row slice is fine),
    xf float32 [T, K] contiguous, K % 32 == 0, xf not aliasing x. Reference:
    `dequantize_act_q8(*quantize_act_q8_reference(x))` (to float32 rounding of q * d)."""
    T, K = x_dev.shape
    if K % QBLOCK or tuple(xf_dev.shape) != (T, K):
        raise ValueError(f"fake_quant_act: x {tuple(x_dev.shape)} -> xf {tuple(xf_dev.shape)} "
                         f"needs equal shapes and K a multiple of {QBLOCK}")
    fake_quant_act_q8[(T * K + THREADS - 1) // THREADS, THREADS, stream](x_dev, xf_dev)


def quantize_act_q8_reference(x):
    """x (n values, n % 32 == 0) -> (xq int8[n], xd float32[n / 32]): the kernel's exact output."""
    from ..quant import quantize_activations_q8
    q, d = quantize_activations_q8(np.asarray(x, dtype=np.float32).reshape(-1))
    return q.reshape(-1), d.reshape(-1)


def dequantize_act_q8(xq, xd):
    """float64 xq * xd (block-wise): the activation value the dp4a path multiplies with."""
    xq = np.asarray(xq, dtype=np.int8).reshape(-1, QBLOCK).astype(np.float64)
    return (xq * np.asarray(xd, dtype=np.float64).reshape(-1, 1)).reshape(-1)
