"""`bw24nb kernel-check`: every GPU kernel against its numpy reference, as a table.

This is gate 1 of the exactness contract (shared/DESIGN.md). Each check draws fresh random
inputs (from a seed that is printed, so `--seed N` replays a run), poisons every output buffer
before the launch (NaN for floats, 0x7f bytes for integers; a guard region past the end of
vector outputs must survive untouched), launches the kernel through its `launch_*` function,
and compares every output element with the numpy reference the kernel module names
(`matvec_reference`, `bw24nb.reference.ops`, `reference.gated_deltanet`, ...). A reference is
never re-implemented here: what lives in this file is input generation, the error bounds and
the table.

Sizes: "tiny" shapes run in numba's CUDA simulator in a few seconds per op (a CI test runs the
whole tiny suite); "real" shapes are the shapes of the models bw24nb serves (`REAL_MODELS`) and
need a GPU.

Tolerances. Each row states its bound; each bound is derived in a comment where it is built:
  * exact ("exact" / "bit-exact"): integer results (dp4a dot products with power-of-two scales,
    argmax, token ids), copies, decoders (embedding), quantizers (activations, KV cache) and
    float32 operations the reference does identically (a + b);
  * float32 rounding bounds: a float32 sum along a chain of h roundings is within
    gamma_h = h u / (1 - h u) (u = 2^-24) of the exact value, relative to the sum of the
    magnitudes of its terms (sum |w x|, not |sum w x|). Bounds are first order and multiplied
    by MARGIN = 2 to cover second-order terms; none of them is fitted to observed errors.
    libdevice's expf/sinf/cosf are within 2 ulp (CUDA Programming Guide, math functions).

Public API: `REGISTRY` (name -> Check), `check` (the decorator), `Row`, `compare`, `Out`,
`run_checks`, `select`, `launcher_names`, `format_row`, `TABLE_HEADER`, `REAL_MODELS`, `main`
(what the CLI calls).
"""
from __future__ import annotations

import fnmatch
import math
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from .switches import switched

U = 2.0 ** -24                  # float32 unit roundoff
U16 = 2.0 ** -11                # float16 unit roundoff
MARGIN = 2.0                    # every first-order rounding bound is multiplied by this
TINY_NORMAL = 2.0 ** -126       # relative bounds hold down to the smallest normal float32
SIZES = ("tiny", "real")
GUARD = 8                       # guard elements after a vector output
_GUARD_F32 = np.float32(1234.5)
_INT_POISON_BYTE = 0x7F


def gamma(h: float) -> float:
    """gamma_h = h u / (1 - h u): the relative error bound of a chain of h float32 roundings."""
    return h * U / (1.0 - h * U)


# ------------------------------------------------------------------ real model shapes

REAL_MODELS = {
    "0.5b": SimpleNamespace(            # Qwen2.5-0.5B
        hidden=896, ffn=4864, n_heads=14, n_kv_heads=2, head_dim=64, vocab=151936,
        rope_theta=1e6, rotary_dim=64),
    "9b": SimpleNamespace(              # Qwen3.5-9B-like hybrid
        hidden=4096, ffn=12288, n_heads=16, n_kv_heads=4, head_dim=256, rope_theta=1e7,
        rotary_dim=64, lin_k_heads=16, lin_v_heads=32, lin_dk=128, lin_dv=128),
    "35b-a3b": SimpleNamespace(         # Qwen3.5-35B-A3B MoE
        hidden=2048, n_experts=256, top_k=8, expert_ffn=512),
}
Q05, Q9, MOE = REAL_MODELS["0.5b"], REAL_MODELS["9b"], REAL_MODELS["35b-a3b"]


# ------------------------------------------------------------------ rows and the registry


@dataclass
class Row:
    """One line of the table: a kernel on one type and shape."""
    kernel: str
    dtype: str
    shape: str
    max_abs: float
    max_rel: float            # max_abs / max |ref| (normwise)
    tol: str                  # the bound, in words
    ratio: float              # worst error / bound (<= 1 passes; 0 when exact and equal)
    passed: bool
    detail: str = ""          # why it failed (unwritten outputs, guard overwritten, ...)


@dataclass(frozen=True)
class Check:
    name: str
    covers: tuple             # launcher names, "kernels.norm.launch_rms_norm"
    fn: Callable              # fn(rng, size) -> iterable of Row


REGISTRY: dict[str, Check] = {}


def check(name: str, *covers: str):
    """Register `fn(rng, size) -> Iterable[Row]` as the check `name`, exercising the
    launchers `covers` (dotted names below bw24nb, e.g. "kernels.matvec.launch_matvec")."""
    def deco(fn):
        if name in REGISTRY:
            raise ValueError(f"kernel check {name!r} registered twice")
        REGISTRY[name] = Check(name, tuple(covers), fn)
        return fn
    return deco


# ------------------------------------------------------------------ device helpers


def _cuda():
    from numba import cuda   # lazily: the CLI decides simulator vs GPU before numba.cuda loads
    return cuda


def _dev(a):
    return _cuda().to_device(np.ascontiguousarray(a))


def _poison_value(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.array(np.nan, dtype)
    return np.frombuffer(bytes([_INT_POISON_BYTE]) * dtype.itemsize, dtype)[0]


class Out:
    """A poisoned device output: `.dev` (shape, dtype) is filled with the poison (NaN, or
    0x7f bytes for integers, or `poison`), followed in memory by GUARD sentinel elements
    (`guard=True`) that the kernel must leave untouched."""

    def __init__(self, shape, dtype=np.float32, poison=None, guard=True):
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        n = int(np.prod(shape))
        self.dtype = np.dtype(dtype)
        self.poison = _poison_value(dtype) if poison is None else self.dtype.type(poison)
        g = GUARD if guard else 0
        host = np.empty(n + g, self.dtype)
        host[:n] = self.poison
        if self.dtype.kind == "f":
            host[n:] = _GUARD_F32
        else:
            host.view(np.uint8)[n * self.dtype.itemsize:] = 0x5A
        self._guard = host[n:].copy()
        self._n, self._shape = n, shape
        self.full = _dev(host)
        self.dev = self.full[:n].reshape(shape) if g else self.full.reshape(shape)

    def get(self):
        """(host copy of the output, guard intact?)."""
        host = self.full.copy_to_host()
        ok = host[self._n:].tobytes() == self._guard.tobytes()
        return host[:self._n].reshape(self._shape), ok


# ------------------------------------------------------------------ comparison


def compare(kernel, dtype, shape, got, ref, bound=0.0, tol="exact", *, bits=False,
            guard_ok=True, poison=None, problems=()) -> Row:
    """Compare `got` with `ref` element by element: |got - ref| <= bound (an absolute bound,
    scalar or broadcastable per element); bound 0 demands equality (NaN matches NaN), `bits`
    demands equal bit patterns. Counts unwritten outputs (NaN poison left in a float output
    where the reference is a number; the `poison` value left in an integer output where the
    reference differs). `problems` are extra failure reasons found by the caller."""
    got, ref = np.asarray(got), np.asarray(ref)
    notes = [p for p in problems if p]
    if got.shape != ref.shape:
        return Row(kernel, dtype, shape, math.inf, math.inf, tol, math.inf, False,
                   f"output shape {got.shape} != reference {ref.shape}")
    g, r = got.astype(np.float64), ref.astype(np.float64)
    same = (g == r) | (np.isnan(g) & np.isnan(r))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(same, 0.0, np.abs(g - r))
    err = np.where(np.isnan(err), np.inf, err)
    if got.dtype.kind == "f":
        unwritten = int(np.count_nonzero(np.isnan(g) & ~np.isnan(r)))
    elif poison is not None:
        unwritten = int(np.count_nonzero((got == poison) & (ref != poison)))
    else:
        unwritten = 0
    if unwritten:
        notes.append(f"{unwritten} of {got.size} outputs unwritten (poison left)")
    if not guard_ok:
        notes.append("wrote past the end of the output (guard overwritten)")
    b = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    if bits:
        if got.dtype != ref.dtype:
            notes.append(f"dtype {got.dtype} != reference {ref.dtype}")
            ok = False
        else:
            mism = np.frombuffer(got.tobytes(), np.uint8) != np.frombuffer(ref.tobytes(), np.uint8)
            ok = not mism.any()
            if not ok:
                notes.append(f"{int(np.count_nonzero(mism))} bytes differ")
    else:
        over = err > b
        ok = not over.any()
        if not ok:
            worst = np.unravel_index(int(np.argmax(np.where(b > 0, err / np.where(b > 0, b, 1),
                                                            np.where(err > 0, np.inf, 0)))),
                                     err.shape)
            notes.append(f"{int(np.count_nonzero(over))} of {err.size} outside the bound; worst "
                         f"at {tuple(int(i) for i in worst)}: got {g[worst]:.7g}, "
                         f"ref {r[worst]:.7g}")
    max_abs = float(err.max()) if err.size else 0.0
    finite_ref = np.abs(r[np.isfinite(r)])
    rmax = float(finite_ref.max()) if finite_ref.size else 0.0
    max_rel = max_abs / rmax if rmax > 0 else (0.0 if max_abs == 0 else math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(b > 0, err / np.where(b > 0, b, 1.0), np.where(err > 0, np.inf, 0.0))
    ratio = float(q.max()) if q.size else 0.0
    passed = bool(ok and not notes)
    return Row(kernel, dtype, shape, max_abs, max_rel, tol, ratio, passed, "; ".join(notes))


def _f64(a):
    return np.asarray(a, np.float64)


def _shape(*dims) -> str:
    return "x".join(str(int(d)) for d in dims)


# ------------------------------------------------------------------ weights


# `--types`: the weight types the per-type checks run (None: all). At real shapes the numpy
# references of the big matvecs take most of a run (a run of every matvec check took over
# 150 s on the H200 before reaching Q4_K); a device call checking one kernel family names it.
TYPES: frozenset | None = None


def _typed(types):
    """The weight types of `types` that --types selects (all without it), in order."""
    from .quant import QType
    return [qt for qt in types if TYPES is None or QType(qt).name in TYPES]


def _weight_types():
    from .kernels.dequant import LAYOUTS
    return _typed(LAYOUTS)


def _fits(qt, K) -> bool:
    from .quant import block_size
    return K % block_size(qt) == 0


def _random_weight(rng, qt, M, K):
    from .kernels.dequant import random_weight_bytes
    return random_weight_bytes(rng, qt, M, K)


def _abs_weight(raw, qt, M, K):
    """|dequantize(W)| in float64 (what rounding errors of a dot with W are proportional to)."""
    from .quant import dequantize
    return np.abs(dequantize(np.asarray(raw).reshape(-1), qt, (M, K)).astype(np.float64))


def _matvec_chain(qt, K) -> int:
    """Longest chain of float32 roundings of one output of the warp-per-row matvec (matvec.py's
    summation order): a group's <= 8 products added left to right (8), the lane's running sum
    over its groups (ceil(groups / 32)), the 5-level warp tree, + bias + residual (2)."""
    from .kernels.dequant import LAYOUTS
    lay = LAYOUTS[qt]
    groups = (K // lay.block) * lay.groups
    return 8 + math.ceil(groups / 32) + 5 + 2


# ------------------------------------------------------------------ matvec, matmul, embedding


# (label, M, K): rows x input width of real decode projections
# (0.5b.ffn_up: K = 896, whose Q8_0 / Q5_0 / Q4_0 blocks start at every 2-byte offset of a
# 16-byte word -- kernels/matvec_qx0.py's line-up)
_MATVEC_REAL = [("0.5b.ffn_down", Q05.hidden, Q05.ffn), ("0.5b.ffn_up", Q05.ffn, Q05.hidden),
                ("9b.ffn_up", Q9.ffn, Q9.hidden), ("35b.expert_gate", MOE.expert_ffn, MOE.hidden)]
_LM_HEAD = ("0.5b.lm_head", Q05.vocab, Q05.hidden)


@check("matvec", "kernels.matvec.launch_matvec")
def check_matvec(rng, size):
    """Float-activation decode matvec, every weight type, + bias + residual (in place)."""
    from .kernels import matvec as mv
    from .quant import QType
    cases = []
    for qt in _weight_types():
        if size == "tiny":
            # 3 rows: one block with an idle warp; F16 instead takes 5 rows (two blocks), a
            # width that is no multiple of 32 (dense rows may have any) and the epilogue
            cases += [(qt, "+b+r", 5, 100, True) if qt == QType.F16 else (qt, "", 3, 256, False)]
        else:
            extra = [_LM_HEAD] if qt == QType.Q8_0 else []
            cases += [(qt, label, M, K, False) for label, M, K in _MATVEC_REAL + extra
                      if _fits(qt, K)]
    if size == "real":
        # bias and an in-place residual (y += W x + b), Qwen2's biased attention projection
        cases.append((QType.Q8_0, "0.5b.attn_q+b+r", Q05.hidden, Q05.hidden, True))
    for qt, label, M, K, epilogue in cases:
        w = _random_weight(rng, qt, M, K)
        x = rng.standard_normal(K).astype(np.float32)
        bias = residual = None
        y = Out(M)
        if epilogue:
            # large enough that a dropped or doubled term is far outside the bound
            bias = (100 * rng.standard_normal(M)).astype(np.float32)
            residual = (100 * rng.standard_normal(M)).astype(np.float32)
            y.dev.copy_to_device(residual)
        mv.launch_matvec(_dev(w), qt, M, K, _dev(x), y.dev,
                         bias=None if bias is None else _dev(bias),
                         residual=y.dev if epilogue else None)
        got, guard_ok = y.get()
        ref = mv.matvec_reference(w, qt, M, K, x, bias, residual)
        mag = _abs_weight(w, qt, M, K) @ np.abs(_f64(x))
        if epilogue:
            mag += np.abs(bias) + np.abs(residual)
        # chain of h roundings (see _matvec_chain) -> |y - y_exact| <= gamma_h sum|w x|
        h = _matvec_chain(qt, K)
        yield compare("matvec", qt.name, f"{_shape(M, K)} {label}".strip(), got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


# Largest |integer weight| per element in units of the f16 scale, intermediate pieces included:
# Q4_K / Q5_K form sc*q and m separately, so (15 or 31) * 63 + 63; Q6_K is sc (int8) * q (6 bit).
def _max_int_weight():
    from .quant import QType
    return {QType.Q8_0: 128, QType.Q4_0: 8, QType.Q5_0: 16, QType.Q4_K: 15 * 63 + 63,
            QType.Q5_K: 31 * 63 + 63, QType.Q6_K: 128 * 32}


def _min_offsets(w_raw, qt, M, K):
    """|dmin * m| per element for Q4_K / Q5_K (the value a zero quant decodes to), else 0: the
    dp4a path rounds (d*sc)*sum(q*qx) and (dmin*m)*sum(qx) separately."""
    from .kernels.dequant import LAYOUTS, Q4_K_OFF_QS, Q5_K_OFF_QH
    from .quant import QType, dequantize
    if qt not in (QType.Q4_K, QType.Q5_K):
        return np.zeros((M, K))
    assert Q4_K_OFF_QS == Q5_K_OFF_QH       # quants (and Q5_K's high bits) start there
    blocks = np.array(w_raw).reshape(-1, LAYOUTS[qt].type_size)
    blocks[:, Q4_K_OFF_QS:] = 0
    return np.abs(dequantize(blocks, qt, (M, K)).astype(np.float64))


def _int8_path_weight_mag(w_raw, qt, M, K):
    """|w| + 2 |dmin m| per element: what an int8-activation dot's rounding scales with (the
    K-quants round their scale and min pieces separately, `_min_offsets`)."""
    return _abs_weight(w_raw, qt, M, K) + 2 * _min_offsets(w_raw, qt, M, K)


@check("matvec_q8", "kernels.matvec.launch_matvec_q8")
def check_matvec_q8(rng, size):
    """dp4a decode matvec: (a) the integer part is exact; (b) end to end on realistic scales."""
    from .kernels import matvec as mv
    from .kernels import quantize_act as qa
    from .kernels.dequant import random_weight_bytes
    max_int = _max_int_weight()
    for qt in _typed(mv.MATVEC_Q8):
        # (a) every f16 scale 2^-6, every activation scale 2^-3: each term is an integer times
        # 2^-9 and |sum| < 2^24 units (activations bounded for that), so every float32 step of
        # the kernel is exact and the result must equal the float64 reference bit for bit.
        M, K = (3, 256) if size == "tiny" else (MOE.expert_ffn, MOE.hidden)
        w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
        bound = min(127, (2 ** 24 - 1) // (K * max_int[qt]))
        xq = rng.integers(-bound, bound + 1, size=K).astype(np.int8)
        xq[:2] = [bound, -bound]
        xd = np.full(K // 32, 2.0 ** -3, np.float32)
        y = Out(M)
        mv.launch_matvec_q8(_dev(w), qt, M, K, _dev(xq), _dev(xd), y.dev)
        got, guard_ok = y.get()
        ref = mv.matvec_q8_reference(w, qt, M, K, xq, xd)
        exact_ref = np.array_equal(ref.astype(np.float32).astype(np.float64), ref)
        yield compare("matvec_q8 int", qt.name, _shape(M, K), got, ref.astype(np.float32),
                      tol="bit-exact", bits=True, guard_ok=guard_ok,
                      problems=["" if exact_ref else "reference not exact in float32 (test bug)"])
        # (b) random weight scales, activations quantized as the engine does (the quantizer's
        # exact output, see quantize_act), bias and residual
        shapes = [("", 3, 256)] if size == "tiny" else [s for s in _MATVEC_REAL if _fits(qt, s[2])]
        for label, M, K in shapes:
            w = _random_weight(rng, qt, M, K)
            x = rng.standard_normal(K).astype(np.float32)
            bias = rng.standard_normal(M).astype(np.float32)
            residual = rng.standard_normal(M).astype(np.float32)
            xq, xd = qa.quantize_act_q8_reference(x)
            y = Out(M)
            mv.launch_matvec_q8(_dev(w), qt, M, K, _dev(xq), _dev(xd), y.dev, bias=_dev(bias),
                                residual=_dev(residual))
            got, guard_ok = y.get()
            ref = mv.matvec_q8_reference(w, qt, M, K, xq, xd, bias, residual)
            # integer parts exact; per 4-value run (scale * int) rounds up to 4 times, then the
            # float path's chain; K-quants round their two pieces separately, so the error
            # scales with |w| + 2 |dmin m| rather than |w|.
            xa = np.abs(qa.dequantize_act_q8(xq, xd))
            wmag = _int8_path_weight_mag(w, qt, M, K)
            mag = wmag @ xa + np.abs(bias) + np.abs(residual)
            h = _matvec_chain(qt, K) + 4
            yield compare("matvec_q8", qt.name, f"{_shape(M, K)} {label}".strip(), got, ref,
                          MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                          guard_ok=guard_ok)


@check("matvec_q6k_r", "kernels.matvec_q6k.launch_matvec_q8_q6k_r")
def check_matvec_q6k_r(rng, size):
    """Q6_K decode matvec on the repacked Q6_K_R layout (16-byte loads, dp4a), against
    matvec_q8_reference on the original GGUF bytes: (a) the integer part is exact; (b) end to
    end on realistic scales, + bias + residual (in place), every split of a row over warps."""
    from .kernels import matvec as mv
    from .kernels import matvec_q6k as q6
    from .kernels import quantize_act as qa
    from .kernels.dequant import random_weight_bytes
    from .quant import QType
    qt = QType.Q6_K
    # (a) every d 2^-6, every activation scale 2^-3: each term is an integer times 2^-9 and
    # |sum| < 2^24 units (activations bounded for that): every float32 step is exact.
    M, K = (5, 512) if size == "tiny" else (MOE.expert_ffn, MOE.hidden)
    w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
    bound = min(127, (2 ** 24 - 1) // (K * _max_int_weight()[qt]))
    xq = rng.integers(-bound, bound + 1, size=K).astype(np.int8)
    xq[:2] = [bound, -bound]
    xd = np.full(K // 32, 2.0 ** -3, np.float32)
    ref = mv.matvec_q8_reference(w, qt, M, K, xq, xd)
    exact_ref = np.array_equal(ref.astype(np.float32).astype(np.float64), ref)
    body, d = q6.repack_q6_k(w, M, K)
    for parts in (1, 2, 4):
        y = Out(M)
        q6.launch_matvec_q8_q6k_r(_dev(body), _dev(d), M, K, _dev(xq), _dev(xd), y.dev,
                                  parts=parts)
        got, guard_ok = y.get()
        yield compare("matvec_q6k_r int", qt.name, f"{_shape(M, K)} parts={parts}", got,
                      ref.astype(np.float32), tol="bit-exact", bits=True, guard_ok=guard_ok,
                      problems=["" if exact_ref else "reference not exact in float32 (test bug)"])
    # (b) random scales, activations as the engine quantizes them, bias and y += W x + b
    if size == "tiny":
        shapes = [("", 5, 512), ("", 3, 768)]
    else:
        shapes = [("9b.ffn_down", Q9.hidden, Q9.ffn), ("9b.lm_head[:32768]", 32768, Q9.hidden)]
    for label, M, K in shapes:
        w = _random_weight(rng, qt, M, K)
        x = rng.standard_normal(K).astype(np.float32)
        bias = rng.standard_normal(M).astype(np.float32)
        residual = rng.standard_normal(M).astype(np.float32)
        xq, xd = qa.quantize_act_q8_reference(x)
        body, d = q6.repack_q6_k(w, M, K)
        y = Out(M)
        y.dev.copy_to_device(residual)
        q6.launch_matvec_q8_q6k_r(_dev(body), _dev(d), M, K, _dev(xq), _dev(xd), y.dev,
                                  bias=_dev(bias), residual=y.dev)
        got, guard_ok = y.get()
        ref = mv.matvec_q8_reference(w, qt, M, K, xq, xd, bias, residual)
        # integer parts exact; each 16-value quarter term rounds twice ((d sc) xd, * isum),
        # 3 adds in a 64-value chunk, the lane's chunks, 5 in the warp tree, <= 2 combining
        # the row's warps, + bias + residual (matvec_q6k.py's summation order)
        mag = _abs_weight(w, qt, M, K) @ np.abs(qa.dequantize_act_q8(xq, xd)) \
            + np.abs(bias) + np.abs(residual)
        h = 2 + 3 + math.ceil(K // 256 * q6.CHUNKS_PER_BLOCK / 32) + 5 + 2 + 2
        yield compare("matvec_q6k_r", qt.name, f"{_shape(M, K)} {label}+b+r".strip(), got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


@check("matvec_rows", "kernels.matvec.launch_matvec", "kernels.matvec.launch_matvec_q8",
       "kernels.matvec_q6k.launch_matvec_q8_q6k_r")
def check_matvec_rows(rng, size):
    """rows = 4 launches of the three decode matvecs (speculative decoding's verify: the
    weights read once for 4 activation rows): (a) every row bit for bit the rows = 1 launch on
    that row's inputs -- the verified tokens must be plain decode's, so the tolerance is 0;
    (b) every row within the one-row bound of the reference. + bias + residual (in place)."""
    from .kernels import matvec as mv
    from .kernels import matvec_q6k as q6
    from .kernels import quantize_act as qa
    from .quant import QType
    T = 4
    if size == "tiny":
        # one block of 4 warps (3 rows and an idle warp); Q4_K's K = 512 splits rows over 2
        cases = [("float", QType.F16, 3, 256), ("float", QType.F32, 3, 256),
                 ("q8", QType.Q4_K, 3, 512), ("q8", QType.Q6_K, 3, 256),
                 ("q6k_r", QType.Q6_K, 3, 256)]
    else:
        # F32 at the fused GDN beta/alpha shape (2 x 32 rows: matvec.F32_V4)
        cases = [("float", QType.Q8_0, Q9.hidden, Q9.hidden), ("float", QType.F32, 64, Q9.hidden),
                 ("q8", QType.Q4_K, Q9.hidden, Q9.hidden),
                 ("q8", QType.Q4_K, Q9.hidden, Q9.ffn),       # ffn_down: the one-row row loop
                 ("q8", QType.Q6_K, Q9.ffn, Q9.hidden), ("q6k_r", QType.Q6_K, Q9.ffn, Q9.hidden)]
    for path, qt, M, K in [c for c in cases if _typed([c[1]])]:
        w = _random_weight(rng, qt, M, K)
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = rng.standard_normal(M).astype(np.float32)
        residual = rng.standard_normal((T, M)).astype(np.float32)
        xq, xd = qa.quantize_act_q8_reference(x)
        body, d = q6.repack_q6_k(w, M, K) if path == "q6k_r" else (None, None)
        dev = {"w": _dev(w), "bias": _dev(bias)}
        if path == "q6k_r":
            dev["body"], dev["d"] = _dev(body), _dev(d)

        def launch(y, t0, rows):
            """rows activation rows from row t0 into y (holding their residual: y += W x + b)."""
            xs = slice(t0 * K, (t0 + rows) * K)
            ds = slice(t0 * K // 32, (t0 + rows) * K // 32)
            y.dev.copy_to_device(residual[t0:t0 + rows].reshape(-1))
            if path == "float":
                mv.launch_matvec(dev["w"], qt, M, K, _dev(x.reshape(-1)[xs]), y.dev,
                                 bias=dev["bias"], residual=y.dev, rows=rows)
            elif path == "q8":
                mv.launch_matvec_q8(dev["w"], qt, M, K, _dev(xq[xs]), _dev(xd[ds]), y.dev,
                                    bias=dev["bias"], residual=y.dev, rows=rows)
            else:
                q6.launch_matvec_q8_q6k_r(dev["body"], dev["d"], M, K, _dev(xq[xs]), _dev(xd[ds]),
                                          y.dev, bias=dev["bias"], residual=y.dev, rows=rows)
            return y.get()

        # "rows4": the one-row-a-warp rows kernels (the default's quads: "quads4==rows4" below)
        with switched([(mv, "ROWS_PAIRS", False)]):
            got, guard_ok = launch(Out(T * M), 0, T)
        got = got.reshape(T, M)
        # each row's rounding bound is the one-row launcher's (the chains of check_matvec,
        # check_matvec_q8 and check_matvec_q6k_r): a row is summed in exactly that order
        wmag = _abs_weight(w, qt, M, K)
        if path == "float":
            h = _matvec_chain(qt, K)
        elif path == "q8":
            h = _matvec_chain(qt, K) + 4
            wmag += 2 * _min_offsets(w, qt, M, K)
        else:
            h = 2 + 3 + math.ceil(K // 256 * q6.CHUNKS_PER_BLOCK / 32) + 5 + 2 + 2
        ones, refs, bounds = [], [], []
        for t in range(T):
            one, one_guard = launch(Out(M), t, 1)
            guard_ok = guard_ok and one_guard
            ones.append(one)
            xq_t, xd_t = xq[t * K:(t + 1) * K], xd[t * K // 32:(t + 1) * K // 32]
            if path == "float":
                refs.append(mv.matvec_reference(w, qt, M, K, x[t], bias, residual[t]))
                mag = wmag @ np.abs(_f64(x[t]))
            else:
                refs.append(mv.matvec_q8_reference(w, qt, M, K, xq_t, xd_t, bias, residual[t])
                            if path == "q8" else
                            q6.matvec_q8_q6k_r_reference(body, d, M, K, xq_t, xd_t, bias,
                                                         residual[t]))
                mag = wmag @ np.abs(qa.dequantize_act_q8(xq_t, xd_t))
            bounds.append(MARGIN * gamma(h) * (mag + np.abs(bias) + np.abs(residual[t]))
                          + TINY_NORMAL)
        tol = f"{MARGIN:g}γ{h}·Σ|wx|"
        name = {"float": "matvec", "q8": "matvec_q8", "q6k_r": "matvec_q6k_r"}[path]
        shape = f"T{T} {_shape(M, K)}+b+r"
        yield compare(f"{name} rows4==rows1", qt.name, shape, got, np.stack(ones),
                      tol="bit-exact", bits=True, guard_ok=guard_ok)
        yield compare(f"{name} rows4", qt.name, shape, got, np.stack(refs), np.stack(bounds),
                      tol, guard_ok=guard_ok)
        if path == "q6k_r" or (path == "q8" and qt == QType.Q4_K):
            # two or four weight rows a warp (matvec.ROWS_PAIRS / ONE_ROW_PAIRS,
            # PAIR_ROWS_PER_WARP; decision 0036), each at every row count and M
            # (warp_rows_everywhere): the row loop's bits, 4 rows and (where the row loop
            # serves one row) one
            from .kernels import matvec_q4k as q4
            one_row = path == "q6k_r" or not q4.xreg_serves(M, K, mv.warps_per_row(M, K), 1)
            for R, what in ((2, "pairs"), (4, "quads")):
                with switched(mv.warp_rows_everywhere(R)):
                    pairs, pairs_guard = launch(Out(T * M), 0, T)
                    pair1, pair1_guard = launch(Out(M), 0, 1) if one_row else (None, True)
                yield compare(f"{name} {what}4==rows4", qt.name, shape, pairs.reshape(T, M), got,
                              tol="bit-exact", bits=True, guard_ok=pairs_guard)
                if one_row:
                    yield compare(f"{name} {what}1==rows1", qt.name, f"{_shape(M, K)}+b+r",
                                  pair1, ones[0], tol="bit-exact", bits=True,
                                  guard_ok=pair1_guard)


@check("quantize_act", "kernels.quantize_act.launch_quantize_act")
def check_quantize_act(rng, size):
    """Activations -> int8 + one f32 scale per 32: bit-exact (every step is one correctly
    rounded IEEE operation, see quantize_act.py)."""
    from .kernels import quantize_act as qa
    shapes = [(2, 128)] if size == "tiny" else [(1, Q9.ffn), (64, Q05.ffn)]
    for T, K in shapes:
        x = (rng.standard_normal((T, K)) * rng.uniform(0.01, 10, (T, 1))).astype(np.float32)
        x[0, 32:64] = 0.0                        # an all-zero block: d = 0, q = 0
        # amax 127 gives d = 1 and 1/d = 1: the ties +-2.5 must round away from zero
        x[-1, :8] = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 3.49999976]
        n = T * K
        # -128 is never produced (|q| <= 127): any element left at it was not written
        xq = Out(n, np.int8, poison=-128)
        xd = Out(n // 32)
        qa.launch_quantize_act(_dev(x), xq.dev, xd.dev)
        q_ref, d_ref = qa.quantize_act_q8_reference(x)
        got_q, gq = xq.get()
        got_d, gd = xd.get()
        yield compare("quantize_act q", "int8", _shape(T, K), got_q, q_ref, tol="exact",
                      bits=True, guard_ok=gq, poison=np.int8(-128))
        yield compare("quantize_act d", "f32", _shape(T, K // 32), got_d, d_ref, tol="bit-exact",
                      bits=True, guard_ok=gd)


@check("fake_quant_act", "kernels.quantize_act.launch_fake_quant_act")
def check_fake_quant_act(rng, size):
    """Prefill's activations rounded as decode's int8 path rounds them, kept as floats:
    q * d from quantize_act's reference, bit-exact (q * d is one float32 rounding; the kernel
    computes the same q and d, then that product)."""
    from .kernels import quantize_act as qa
    shapes = [(3, 64)] if size == "tiny" else [(512, Q9.hidden), (512, Q05.ffn)]
    for T, K in shapes:
        x = (rng.standard_normal((T, K)) * rng.uniform(0.01, 10, (T, 1))).astype(np.float32)
        x[0, :32] = 0.0
        x[-1, 1] = -1e-6 * np.abs(x[-1, :32]).max()     # rounds to q = 0 from below: +0.0, not -0.0
        xf = Out((T, K))
        qa.launch_fake_quant_act(_dev(x), xf.dev)
        q_ref, d_ref = qa.quantize_act_q8_reference(x)
        ref = (q_ref.reshape(-1, 32).astype(np.float32) * d_ref.reshape(-1, 1)).reshape(T, K)
        got, guard_ok = xf.get()
        yield compare("fake_quant_act", "f32", _shape(T, K), got, ref, tol="bit-exact",
                      bits=True, guard_ok=guard_ok)


@check("swiglu_q8", "kernels.activation.launch_swiglu_q8")
def check_swiglu_q8(rng, size):
    """Fused swiglu + int8 quantizer (decode, ffn_down's input): y within swiglu's bound, xq / xd
    bit-exact against quantize_act's reference applied to the kernel's own y."""
    from .kernels import activation
    from .kernels import quantize_act as qa
    from .reference import ops
    for n in ([96] if size == "tiny" else [Q05.ffn, Q9.ffn]):
        g = (2 * rng.standard_normal(n)).astype(np.float32)
        u = (2 * rng.standard_normal(n)).astype(np.float32)
        y, xq, xd = Out(n), Out(n, np.int8, poison=-128), Out(n // 32)
        activation.launch_swiglu_q8(_dev(g), _dev(u), y.dev, xq.dev, xd.dev)
        got, gy = y.get()
        ref = ops.swiglu(g, u)
        yield compare("swiglu_q8 y", "f32", _shape(n), got, ref,
                      MARGIN * _ELEMWISE_U * U * np.abs(_f64(ref)) + TINY_NORMAL,
                      f"{MARGIN:g}·{_ELEMWISE_U}u·|ref|", guard_ok=gy)
        q_ref, d_ref = qa.quantize_act_q8_reference(got)
        got_q, gq = xq.get()
        got_d, gd = xd.get()
        yield compare("swiglu_q8 q", "int8", _shape(n), got_q, q_ref, tol="exact", bits=True,
                      guard_ok=gq, poison=np.int8(-128))
        yield compare("swiglu_q8 d", "f32", _shape(n // 32), got_d, d_ref, tol="bit-exact",
                      bits=True, guard_ok=gd)


@check("swiglu_fused_q8", "kernels.activation.launch_swiglu_fused_q8")
def check_swiglu_fused_q8(rng, size):
    """swiglu + int8 quantizer on the stacked [gate | up] matvec's rows (decode and verify):
    y, xq and xd bit for bit those of swiglu_q8 (checked above) on the two halves."""
    from .kernels import activation
    for T, F in ([(3, 64)] if size == "tiny" else [(1, Q9.ffn), (4, Q9.ffn), (9, Q05.ffn)]):
        gu = (2 * rng.standard_normal((T, 2 * F))).astype(np.float32)
        y, xq, xd = Out((T, F)), Out(T * F, np.int8, poison=-128), Out(T * F // 32)
        activation.launch_swiglu_fused_q8(_dev(gu), y.dev, xq.dev, xd.dev)
        ry, rq, rd = Out(T * F), Out(T * F, np.int8, poison=-128), Out(T * F // 32)
        activation.launch_swiglu_q8(_dev(np.ascontiguousarray(gu[:, :F])),
                                    _dev(np.ascontiguousarray(gu[:, F:])), ry.dev, rq.dev, rd.dev)
        for what, out, twin, dt in (("y", y, ry, "f32"), ("q", xq, rq, "int8"),
                                    ("d", xd, rd, "f32")):
            got, guard_ok = out.get()
            ref, _ = twin.get()
            yield compare(f"swiglu_fused_q8 {what} T={T}", dt, _shape(*got.shape), got,
                          ref.reshape(got.shape), tol="exact" if dt == "int8" else "bit-exact",
                          bits=True, guard_ok=guard_ok,
                          **({"poison": np.int8(-128)} if dt == "int8" else {}))


@check("rms_norm_q8", "kernels.norm.launch_rms_norm_q8")
def check_rms_norm_q8(rng, size):
    """Fused RMSNorm + int8 quantizer (decode): y within the rms_norm bound of the reference,
    and xq / xd bit-exact against quantize_act's reference applied to the kernel's own y (the
    quantizer's arithmetic must be the standalone kernel's, operation for operation)."""
    from .kernels import norm
    from .kernels import quantize_act as qa
    from .reference import ops
    shapes = [(1, 320)] if size == "tiny" else [(1, Q9.hidden), (1, Q05.hidden)]
    for N, C in shapes:
        x = (3 * rng.standard_normal((N, C))).astype(np.float32)
        w = rng.standard_normal(C).astype(np.float32)
        eps = 1e-6
        y, xq, xd = Out((N, C)), Out(N * C, np.int8, poison=-128), Out(N * C // 32)
        norm.launch_rms_norm_q8(_dev(x), _dev(w), eps, y.dev, xq.dev, xd.dev)
        got, gy = y.get()
        rel, label = _norm_bound(C)
        ref = ops.rms_norm(x, w, eps)
        yield compare("rms_norm_q8 y", "f32", _shape(N, C), got, ref,
                      rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=gy)
        q_ref, d_ref = qa.quantize_act_q8_reference(got)
        got_q, gq = xq.get()
        got_d, gd = xd.get()
        yield compare("rms_norm_q8 q", "int8", _shape(N, C), got_q, q_ref, tol="exact",
                      bits=True, guard_ok=gq, poison=np.int8(-128))
        yield compare("rms_norm_q8 d", "f32", _shape(N, C // 32), got_d, d_ref,
                      tol="bit-exact", bits=True, guard_ok=gd)


_MATMUL_REAL = [("0.5b.ffn_down", Q05.hidden, Q05.ffn), ("9b.attn_qkv", 8192, Q9.hidden)]


@check("matmul", "kernels.matmul.launch_matmul")
def check_matmul(rng, size):
    """Prefill matmul, every weight type, partial tiles in T and M, + bias + residual; and the
    skinny F32 kernel (matmul_f32_skinny: few rows, e.g. GDN's ssm_alpha / ssm_beta)."""
    from .kernels import matmul as mm
    from .quant import QType, block_size
    cases = []
    for qt in _weight_types():
        if size == "tiny":
            # K: one block (a K-quant super-block is 8 K-slices), or for dense types 40 = one
            # 32-wide slice + a partial one; Q8_0 also takes a bias and an in-place residual
            bs = block_size(qt)
            cases.append((qt, "+b+r" if qt == QType.Q8_0 else "", 3, 5,
                          40 if bs == 1 else max(bs, 32), qt == QType.Q8_0, False))
        else:
            cases += [(qt, label, 100, M, K, False, False) for label, M, K in _MATMUL_REAL
                      if _fits(qt, K)]
    # skinny: a partial block of tokens (11 = 2 x 4 + 3), rows not a multiple of the 8 warps, K
    # with a partial last 128-wide step (136) / the 9B's ssm_alpha (32 x 4096)
    if size == "tiny":
        cases.append((QType.F32, "skinny+b+r", 11, 13, 136, True, True))
    else:
        cases += [(QType.F32, "9b.ssm_alpha skinny", 512, 32, 4096, False, True),
                  (QType.F32, "skinny+b+r", 37, 64, 4096, True, True)]
    if size == "real":
        cases.append((QType.Q8_0, "0.5b.attn_q+b+r", 100, Q05.hidden, Q05.hidden, True, False))
    for qt, label, T, M, K, epilogue, skinny in cases:
        w = _random_weight(rng, qt, M, K)
        x = rng.standard_normal((T, K)).astype(np.float32)
        bias = residual = None
        y = Out((T, M))
        if epilogue:
            bias = (100 * rng.standard_normal(M)).astype(np.float32)
            residual = (100 * rng.standard_normal((T, M))).astype(np.float32)
            y.dev.copy_to_device(residual)
        mm.launch_matmul(_dev(w), qt, M, K, _dev(x), y.dev,
                         bias=None if bias is None else _dev(bias),
                         residual=y.dev if epilogue else None, skinny=skinny)
        got, guard_ok = y.get()
        ref = mm.matmul_reference(w, qt, M, K, x, bias, residual)
        mag = np.abs(_f64(x)) @ _abs_weight(w, qt, M, K).T
        if epilogue:
            mag += np.abs(bias) + np.abs(residual)
        # sequential float32 sum over ascending k (K products, K - 1 adds) + bias + residual
        h = K + 2
        yield compare("matmul", qt.name, f"{_shape(T, M, K)} {label}".strip(), got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


@check("matmul_q8", "kernels.matmul_q8.launch_matmul_q8")
def check_matmul_q8(rng, size):
    """Int8 tensor-core prefill matmul (mma.m16n8k32.s8), the integer weight types: (a) the
    integer part is exact; (b) end to end on realistic scales, + bias + residual."""
    from .kernels import matmul_q8 as mq
    from .kernels import quantize_act as qa
    from .kernels.dequant import random_weight_bytes
    from .quant import QType
    max_int = _max_int_weight()
    for qt in _typed(mq.MATMUL_Q8):
        kq = qt in (QType.Q4_K, QType.Q5_K, QType.Q6_K)
        # (a) every f16 scale 2^-6, every activation scale 2^-3: each term is an integer times
        # 2^-9 and every partial sum stays below 2^23 units (activations bounded for that), so
        # every float32 step of the kernel is exact: bit for bit the float64 reference.
        # T, M odd and no multiple of the 64 x 64 tile.
        T, M, K = (5, 17, 256 if kq else 64) if size == "tiny" else (100, MOE.expert_ffn, MOE.hidden)
        w = random_weight_bytes(rng, qt, M, K, f16_value=2.0 ** -6)
        bound = min(127, 2 ** 23 // (K * max_int[qt]))
        xq = rng.integers(-bound, bound + 1, size=(T, K)).astype(np.int8)
        xq[0, :2] = [bound, -bound]
        xd = np.full((T, K // 32), 2.0 ** -3, np.float32)
        y = Out((T, M))
        mq.launch_matmul_q8(_dev(w), qt, M, K, _dev(xq), _dev(xd), y.dev)
        got, guard_ok = y.get()
        ref = mq.matmul_q8_reference(w, qt, M, K, xq, xd)
        exact_ref = np.array_equal(ref.astype(np.float32).astype(np.float64), ref)
        yield compare("matmul_q8 int", qt.name, _shape(T, M, K), got, ref.astype(np.float32),
                      tol="bit-exact", bits=True, guard_ok=guard_ok,
                      problems=["" if exact_ref else "reference not exact in float32 (test bug)"])
        # (b) random weight scales, activations quantized as the engine does, bias and an
        # in-place residual (y += X W^T + b)
        if size == "tiny":
            shapes = [("+b+r", 3, 5, 256 if kq else 288)]   # 288: a K step of 8 + one of 1
        else:
            shapes = [(label + "+b+r", 100, M, K) for label, M, K in _MATMUL_REAL if _fits(qt, K)]
        for label, T, M, K in shapes:
            w = _random_weight(rng, qt, M, K)
            x = rng.standard_normal((T, K)).astype(np.float32)
            bias = rng.standard_normal(M).astype(np.float32)
            residual = rng.standard_normal((T, M)).astype(np.float32)
            xq, xd = qa.quantize_act_q8_reference(x)
            xq, xd = xq.reshape(T, K), xd.reshape(T, K // 32)
            y = Out((T, M))
            y.dev.copy_to_device(residual)
            mq.launch_matmul_q8(_dev(w), qt, M, K, _dev(xq), _dev(xd), y.dev, bias=_dev(bias),
                                residual=y.dev)
            got, guard_ok = y.get()
            ref = mq.matmul_q8_reference(w, qt, M, K, xq, xd, bias, residual)
            # integer dots exact; each sub-block term rounds <= 3 times before the accumulator
            # adds it (one term per 32 values, two for Q6_K), then + bias + residual: h <=
            # terms + 5. K-quants round (d*sc)*isum and (dmin*m)*xsum separately, so the error
            # scales with |w| + 2 |dmin m| rather than |w| (matmul_q8.py's summation order).
            xa = np.abs(qa.dequantize_act_q8(xq, xd)).reshape(T, K)
            wmag = _int8_path_weight_mag(w, qt, M, K)
            mag = xa @ wmag.T + np.abs(bias) + np.abs(residual)
            h = (2 if qt == QType.Q6_K else 1) * (K // 32) + 5
            yield compare("matmul_q8", qt.name, f"{_shape(T, M, K)} {label}".strip(), got, ref,
                          MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                          guard_ok=guard_ok)


@check("embedding", "kernels.embedding.launch_embedding")
def check_embedding(rng, size):
    """Embedding lookup, every table type: each value decodes exactly as the codec's, so the
    comparison is on float32 bit patterns."""
    from .kernels import embedding as emb
    from .quant import block_size
    for qt in _weight_types():
        bs = block_size(qt)
        if size == "tiny":
            V, H, T = 7, max(bs, 32), 3
        else:
            V, T = Q05.vocab, 64
            H = Q05.hidden if _fits(qt, Q05.hidden) else MOE.hidden
        table = _random_weight(rng, qt, V, H)
        # the first and the last row, a repeated id
        ids = np.concatenate([[0, V - 1], rng.integers(0, V, T - 2)]).astype(np.int32)
        ids[-1] = ids[-2]
        out = Out((T, H))
        emb.launch_embedding(_dev(table), qt, V, H, _dev(ids), out.dev)
        got, guard_ok = out.get()
        # The reference dequantizes the table it is given; rows are independent, so hand it
        # only the rows looked up (a real vocabulary is 10^8 values to decode otherwise).
        rows, inverse = np.unique(ids, return_inverse=True)
        ref = emb.embedding_reference(np.ascontiguousarray(table[rows]), qt, len(rows), H, inverse)
        yield compare("embedding", qt.name, _shape(T, H) + f" of {V}", got, ref,
                      tol="bit-exact", bits=True, guard_ok=guard_ok)


# ------------------------------------------------------------------ norms


def _norm_bound(C, extra_u=0.0):
    """Relative bound of the RMSNorm kernels vs ops.rms_norm (float64, rounded once).
    Sum of squares: each thread squares (1) and adds its ceil(C / B) elements, then a
    log2(B)-level tree: a sum of positive terms within gamma_h relative, h = ceil(C/B) +
    log2(B) + 1. rstd = 1/sqrt(sum/C + eps) halves that and adds <= 3.5 u (divide, add,
    sqrt, reciprocal); y = x * rstd * w adds 2 u; the reference's own rounding 1 u.
    Returns (relative bound, label)."""
    from .kernels.norm import _row_threads
    B = _row_threads(C)
    h = math.ceil(C / B) + int(math.log2(B)) + 1
    rel = MARGIN * (gamma(h) / 2 + (6.5 + extra_u) * U)
    return rel, f"{MARGIN:g}(γ{h}/2+{6.5 + extra_u:g}u)·|ref|"


# silu(z) = z / (1 + exp(-z)) in float32: expf 2 ulp, add 1, divide 1 (the exp error enters
# 1 + e scaled by e / (1 + e) <= 1), plus the product with it 1 and the reference's two extra
# float32 roundings (rms_norm and silu are rounded before their float64 product) 2: 7 u.
_SILU_GATE_U = 7.0


@check("rms_norm", "kernels.norm.launch_rms_norm")
def check_rms_norm(rng, size):
    from .kernels import norm
    from .reference import ops
    shapes = [(2, 300)] if size == "tiny" else [(4, Q9.hidden), (4, Q05.hidden)]
    for N, C in shapes:
        x = (3 * rng.standard_normal((N, C))).astype(np.float32)
        x[0] *= 1e-3                    # a row where eps is not negligible against mean(x^2)
        w = rng.standard_normal(C).astype(np.float32)
        eps = 1e-6
        y = Out((N, C))
        norm.launch_rms_norm(_dev(x), _dev(w), eps, y.dev)
        got, guard_ok = y.get()
        ref = ops.rms_norm(x, w, eps)
        rel, label = _norm_bound(C)
        yield compare("rms_norm", "f32", _shape(N, C), got, ref,
                      rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)


@check("add_rms_norm", "kernels.norm.launch_add_rms_norm")
def check_add_rms_norm(rng, size):
    """h = x + r written over r (the residual stream in place), y = rms_norm(h) * w."""
    from .kernels import norm
    from .reference import ops
    N, C = (2, 160) if size == "tiny" else (4, Q9.hidden)
    x = rng.standard_normal((N, C)).astype(np.float32)
    r = (4 * rng.standard_normal((N, C))).astype(np.float32)
    w = rng.standard_normal(C).astype(np.float32)
    eps = 1e-6
    r_dev = _dev(r)
    y = Out((N, C))
    norm.launch_add_rms_norm(_dev(x), r_dev, _dev(w), eps, r_dev, y.dev)
    got, guard_ok = y.get()
    h = x + r                               # float32 add: the same IEEE operation, bit-exact
    yield compare("add_rms_norm h", "f32", _shape(N, C), r_dev.copy_to_host(), h,
                  tol="bit-exact", bits=True)
    ref = ops.rms_norm(h, w, eps)
    rel, label = _norm_bound(C)
    yield compare("add_rms_norm y", "f32", _shape(N, C), got, ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)


@check("qk_head_norm", "kernels.norm.launch_qk_head_norm")
def check_qk_head_norm(rng, size):
    """q_norm + k_norm + the gated query / gate split in one launch: q and k within the head
    norm's bound, the gate halves copied exactly."""
    from .kernels import norm
    from .reference import ops
    T, Hq, Hk, D = (2, 3, 2, 32) if size == "tiny" else (4, Q9.n_heads, Q9.n_kv_heads,
                                                         Q9.head_dim)
    qg = (2 * rng.standard_normal((T, Hq, 2 * D))).astype(np.float32)
    k = (2 * rng.standard_normal((T, Hk, D))).astype(np.float32)
    wq, wk = (rng.standard_normal(D).astype(np.float32) for _ in range(2))
    eps = 1e-6
    q, gate = Out((T, Hq, D)), Out((T, Hq, D))
    k_dev = _dev(k)
    norm.launch_qk_head_norm(_dev(qg.reshape(T, Hq * 2 * D)), q.dev, _dev(wq), k_dev, _dev(wk),
                             eps, gate=gate.dev)
    rel, label = _norm_bound(D)
    got, guard_ok = q.get()
    ref = ops.rms_norm(qg[..., :D], wq, eps)
    yield compare("qk_head_norm q", "f32", _shape(T, Hq, D), got, ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)
    ref = ops.rms_norm(k, wk, eps)
    yield compare("qk_head_norm k", "f32", _shape(T, Hk, D), k_dev.copy_to_host(), ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label)
    got, guard_ok = gate.get()
    yield compare("qk_head_norm gate", "f32", _shape(T, Hq, D), got, qg[..., D:],
                  tol="bit-exact", bits=True, guard_ok=guard_ok)


@check("head_rms_norm", "kernels.norm.launch_head_rms_norm")
def check_head_rms_norm(rng, size):
    """Qwen3 q_norm / k_norm: one weight [D] over every (token, head) vector."""
    from .kernels import norm
    from .reference import ops
    shapes = [(2, 3, 16)] if size == "tiny" else [(4, Q9.n_heads, Q9.head_dim),
                                                  (4, Q9.n_kv_heads, Q9.head_dim)]
    for T, H, D in shapes:
        x = (2 * rng.standard_normal((T, H, D))).astype(np.float32)
        w = rng.standard_normal(D).astype(np.float32)
        eps = 1e-6
        y = Out((T, H, D))
        norm.launch_head_rms_norm(_dev(x), _dev(w), eps, y.dev)
        got, guard_ok = y.get()
        ref = ops.rms_norm(x, w, eps)
        rel, label = _norm_bound(D)
        yield compare("head_rms_norm", "f32", _shape(T, H, D), got, ref,
                      rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)


@check("gated_rms_norm", "kernels.norm.launch_gated_rms_norm")
def check_gated_rms_norm(rng, size):
    """rms_norm(x) * w * silu(z) per head (the Gated DeltaNet output norm)."""
    from .kernels import norm
    from .reference.gated_deltanet import gated_rms_norm
    T, H, D = (2, 3, 32) if size == "tiny" else (4, Q9.lin_v_heads, Q9.lin_dv)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    z = (3 * rng.standard_normal((T, H, D))).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    eps = 1e-6
    y = Out((T, H, D))
    norm.launch_gated_rms_norm(_dev(x), _dev(z), _dev(w), eps, y.dev)
    got, guard_ok = y.get()
    ref = gated_rms_norm(x, z, w, eps)
    rel, label = _norm_bound(D, _SILU_GATE_U)
    yield compare("gated_rms_norm", "f32", _shape(T, H, D), got, ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)


@check("gated_rms_norm_q8", "kernels.norm.launch_gated_rms_norm_q8")
def check_gated_rms_norm_q8(rng, size):
    """The Gated DeltaNet output norm with ssm_out's int8 quantizer fused in (decode): y within
    the gated norm's bound, xq / xd bit-exact against quantize_act's reference applied to the
    kernel's own y."""
    from .kernels import norm
    from .kernels import quantize_act as qa
    from .reference.gated_deltanet import gated_rms_norm
    T, H, D = (2, 3, 32) if size == "tiny" else (4, Q9.lin_v_heads, Q9.lin_dv)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    z = (3 * rng.standard_normal((T, H, D))).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    eps = 1e-6
    n = T * H * D
    y, xq, xd = Out((T, H, D)), Out(n, np.int8, poison=-128), Out(n // 32)
    norm.launch_gated_rms_norm_q8(_dev(x), _dev(z), _dev(w), eps, y.dev, xq.dev, xd.dev)
    got, gy = y.get()
    ref = gated_rms_norm(x, z, w, eps)
    rel, label = _norm_bound(D, _SILU_GATE_U)
    yield compare("gated_rms_norm_q8 y", "f32", _shape(T, H, D), got, ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=gy)
    q_ref, d_ref = qa.quantize_act_q8_reference(got.reshape(-1))
    got_q, gq = xq.get()
    got_d, gd = xd.get()
    yield compare("gated_rms_norm_q8 q", "int8", _shape(n), got_q, q_ref, tol="exact",
                  bits=True, guard_ok=gq, poison=np.int8(-128))
    yield compare("gated_rms_norm_q8 d", "f32", _shape(n // 32), got_d, d_ref,
                  tol="bit-exact", bits=True, guard_ok=gd)


# ------------------------------------------------------------------ rope, q/gate split


def _rope_bound(x, positions, inv_freq):
    """Per-element bound of the NEOX RoPE kernel vs ops.rope (float64 angle, rounded once).
    The kernel's angle float32(pos) * inv_freq32 carries inv_freq's float32 rounding and the
    product's: <= 2u relative, i.e. 2u * pos * inv_freq absolute, which moves an output by at
    most that times |a| + |b| (its pair). cosf/sinf are within 2 ulp (<= 2u absolute, |c| <= 1),
    the multiply-subtract adds 3 roundings, the reference's rounding 1: 6u (|a| + |b|) more.
    Dims past rotary_dim are copied: exact."""
    half = inv_freq.shape[0]
    rd = 2 * half
    pair = np.abs(_f64(x[..., :half])) + np.abs(_f64(x[..., half:rd]))
    ang = _f64(positions)[:, None, None] * _f64(inv_freq)[None, None, :]
    b = MARGIN * (2 * U * ang + 6 * U) * pair
    bound = np.zeros(x.shape)
    bound[..., :half] = b
    bound[..., half:rd] = b
    return bound + np.where(np.arange(x.shape[-1]) < rd, TINY_NORMAL, 0.0)


_ROPE_TOL = f"{MARGIN:g}(2u·pos·θᵢ+6u)(|a|+|b|)"


@check("rope", "kernels.rope.launch_rope", "kernels.rope.launch_rope_qk")
def check_rope(rng, size):
    """NEOX RoPE in place: partial (first quarter of the head, Qwen3.5) and full (Qwen2)."""
    from .kernels import rope
    from .reference import ops
    if size == "tiny":
        single = [(5, 3, 32, 8, 1e7)]                      # T, H, D, rotary_dim, theta
        qk = [(4, 4, 2, 16, 16, 1e4)]                      # T, Hq, Hkv, D, rotary_dim, theta
        max_pos = 4000
    else:
        single = [(8, Q9.n_heads, Q9.head_dim, Q9.rotary_dim, Q9.rope_theta)]
        qk = [(8, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim, Q05.rotary_dim, Q05.rope_theta),
              (8, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim, Q9.rotary_dim, Q9.rope_theta)]
        max_pos = 32768
    for T, H, D, rd, theta in single:
        x = rng.standard_normal((T, H, D)).astype(np.float32)
        positions = rng.integers(0, max_pos, T).astype(np.int32)     # arbitrary, not consecutive
        inv_freq = rope.rope_inv_freq(theta, rd)
        d = _dev(x)
        rope.launch_rope(d, _dev(positions), _dev(inv_freq))
        ref = ops.rope(x, positions, theta, rd)
        yield compare("rope", f"rot{rd}", _shape(T, H, D), d.copy_to_host(), ref,
                      _rope_bound(x, positions, inv_freq), _ROPE_TOL)
    for T, Hq, Hkv, D, rd, theta in qk:
        q = rng.standard_normal((T, Hq, D)).astype(np.float32)
        k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
        positions = (np.arange(T) + rng.integers(0, max_pos - T)).astype(np.int32)
        inv_freq = rope.rope_inv_freq(theta, rd)
        qd, kd = _dev(q), _dev(k)
        rope.launch_rope_qk(qd, kd, _dev(positions), _dev(inv_freq))
        for name, src, dev in (("q", q, qd), ("k", k, kd)):
            yield compare(f"rope_qk {name}", f"rot{rd}", _shape(*src.shape), dev.copy_to_host(),
                          ops.rope(src, positions, theta, rd),
                          _rope_bound(src, positions, inv_freq), _ROPE_TOL)


@check("split_q_gate", "kernels.rope.launch_split_q_gate")
def check_split_q_gate(rng, size):
    """Gated attention's q_proj output, per head [query | gate] -> q, gate: a copy, exact."""
    from .kernels import rope
    T, H, D = (3, 2, 16) if size == "tiny" else (4, Q9.n_heads, Q9.head_dim)
    qg = rng.standard_normal((T, H * 2 * D)).astype(np.float32)
    q, gate = Out((T, H, D)), Out((T, H, D))
    rope.launch_split_q_gate(_dev(qg), q.dev, gate.dev)
    per_head = qg.reshape(T, H, 2 * D)       # the reference: HF's view(T, -1, 2D).chunk(2, -1)
    for name, out, ref in (("q", q, per_head[..., :D]), ("gate", gate, per_head[..., D:])):
        got, guard_ok = out.get()
        yield compare(f"split_q_gate {name}", "f32", _shape(T, H, D), got,
                      np.ascontiguousarray(ref), tol="bit-exact", bits=True, guard_ok=guard_ok)


# ------------------------------------------------------------------ elementwise

# silu(g) * u / x * sigmoid(g): expf 2 ulp, 1 + e 1, divide 1, one or two multiplies, and the
# reference's float32 rounding of its result (and of sigmoid(g) before the product): <= 7
# roundings, each within u relative of its result. Relative bounds hold down to the smallest
# normal float32 (below it, silu(-100) underflows to -0 on the device and to a subnormal in
# float64), hence TINY_NORMAL absolute on top.
_ELEMWISE_U = 7


@check("swiglu", "kernels.activation.launch_swiglu", "kernels.activation.launch_swiglu_fused")
def check_swiglu(rng, size):
    from .kernels import activation as act
    from .reference import ops
    N, F = (3, 37) if size == "tiny" else (4, Q9.ffn)
    tol = f"{MARGIN:g}·{_ELEMWISE_U}u·|ref|"
    g = (4 * rng.standard_normal((N, F))).astype(np.float32)
    g[0, :3] = [-80.0, 80.0, 0.0]            # the exp-overflow side, saturation, zero
    u = rng.standard_normal((N, F)).astype(np.float32)
    y = Out((N, F))
    with np.errstate(over="ignore"):         # exp(80) overflows float32 in the simulator too
        act.launch_swiglu(_dev(g), _dev(u), y.dev)
    got, guard_ok = y.get()
    ref = ops.swiglu(g, u)
    yield compare("swiglu", "f32", _shape(N, F), got, ref,
                  MARGIN * _ELEMWISE_U * U * np.abs(_f64(ref)) + TINY_NORMAL, tol,
                  guard_ok=guard_ok)
    gu = (3 * rng.standard_normal((N, 2 * F))).astype(np.float32)
    y = Out((N, F))
    act.launch_swiglu_fused(_dev(gu), y.dev)
    got, guard_ok = y.get()
    ref = ops.swiglu(gu[:, :F], gu[:, F:])
    yield compare("swiglu_fused", "f32", _shape(N, 2 * F), got, ref,
                  MARGIN * _ELEMWISE_U * U * np.abs(_f64(ref)) + TINY_NORMAL, tol,
                  guard_ok=guard_ok)


@check("sigmoid_mul", "kernels.activation.launch_sigmoid_mul")
def check_sigmoid_mul(rng, size):
    """x *= sigmoid(gate) in place (gated attention's output gate)."""
    from .kernels import activation as act
    from .reference import ops
    T, C = (4, 48) if size == "tiny" else (4, Q9.n_heads * Q9.head_dim)
    x = rng.standard_normal((T, C)).astype(np.float32)
    gate = (5 * rng.standard_normal((T, C))).astype(np.float32)
    d = _dev(x)
    act.launch_sigmoid_mul(d, _dev(gate))
    ref = _f64(x) * ops.sigmoid(gate)
    yield compare("sigmoid_mul", "f32", _shape(T, C), d.copy_to_host(), ref,
                  MARGIN * _ELEMWISE_U * U * np.abs(ref) + TINY_NORMAL,
                  f"{MARGIN:g}·{_ELEMWISE_U}u·|ref|")


@check("add", "kernels.activation.launch_add")
def check_add(rng, size):
    """out = a + b: one float32 addition, the same IEEE operation as numpy's: bit-exact."""
    from .kernels import activation as act
    N, C = (3, 70) if size == "tiny" else (4, Q9.hidden)
    a = rng.standard_normal((N, C)).astype(np.float32)
    b = rng.standard_normal((N, C)).astype(np.float32)
    out = Out((N, C))
    act.launch_add(_dev(a), _dev(b), out.dev)
    got, guard_ok = out.get()
    yield compare("add", "f32", _shape(N, C), got, a + b, tol="bit-exact", bits=True,
                  guard_ok=guard_ok)


# ------------------------------------------------------------------ KV cache


def _kv_rows(rng, T, H, D):
    """K/V rows with the quantizers' edge cases: per-row scales over 3 decades, an all-zero
    block (d = 0), a constant block (Q5_1 d = 0), roundf ties."""
    x = (rng.standard_normal((T, H, D)) * rng.uniform(0.01, 10, (T, H, 1))).astype(np.float32)
    x[0, 0, :32] = 0.0
    x[0, 0, 32:64] = 1.25
    x[-1, -1, :8] = [0.5, -0.5, 1.5, -1.5, 2.5, 3.5, -127.0, 127.0]
    return x


def _q5_1_near_boundary(x):
    """bool (..., D): the Q5_1 quant of x lies within 1e-4 of a rounding boundary (float64)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    lo = blocks.min(axis=1, keepdims=True)
    d = (blocks.max(axis=1, keepdims=True) - lo) / np.float32(31)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d > 0, (blocks - lo).astype(np.float64) / d.astype(np.float64) + 0.5, 0.0)
    frac = v - np.floor(v)
    return (np.minimum(frac, 1 - frac) < 1e-4).reshape(x.shape)


@check("kv_store", "cache.kv.launch_kv_store")
def check_kv_store(rng, size):
    """Quantizing KV store at device positions: the bytes of bw24nb.quant.quantize. Q8_0 and
    F16 are bit-exact everywhere; Q5_1 too in the simulator, while on a GPU NVVM contracts
    (x - min) * id + 0.5 into one FMA, so a quant within rounding of a .5 boundary may land one
    step away (cache/kv.py): there the scale bytes must match and every value must be equal or
    exactly one step d apart at a near-tie. Positions not stored keep their poison."""
    from .cache import kv
    from .device import simulator_enabled
    from .quant import QType, dequantize, quantize
    T, H, D, ctx = (3, 2, 64, 16) if size == "tiny" else (32, Q9.n_kv_heads, Q9.head_dim, 4096)
    for qt in (QType.Q8_0, QType.Q5_1, QType.F16):
        x = _kv_rows(rng, T, H, D)
        positions = rng.choice(ctx, T, replace=False).astype(np.int32)
        rb = kv.kv_row_bytes(qt, D)
        poison = np.full((H, ctx, rb), _INT_POISON_BYTE, np.uint8)
        rows = _dev(poison)
        kv.launch_kv_store(_dev(x), _dev(positions), qt, rows, rows.view(np.float16))
        got = rows.copy_to_host()
        want = quantize(x, qt)                                     # [T, H, rb]
        untouched = np.ones(ctx, bool)
        untouched[positions] = False
        problems = []
        if not np.array_equal(got[:, untouched], poison[:, untouched]):
            problems.append("wrote positions it was not given")
        got_rows = np.ascontiguousarray(got[:, positions].transpose(1, 0, 2))   # [T, H, rb]
        gv = dequantize(got_rows, qt, (T, H, D))
        wv = dequantize(want, qt, (T, H, D))
        tol = "bit-exact"
        if qt == QType.Q5_1 and not simulator_enabled():
            tol = "bytes, or 1 step at a tie"
            gb, wb = got_rows.reshape(T, H, -1, 24), want.reshape(T, H, -1, 24)
            if not np.array_equal(gb[..., :4], wb[..., :4]):
                problems.append("Q5_1 scale bytes differ")
            d16 = wb[..., :2].copy().view(np.float16)[..., 0]          # each block's d
            d = np.repeat(d16.astype(np.float64), 32, axis=-1)
            diff = np.abs(_f64(gv) - _f64(wv))
            bad = ~((diff == 0) | (_q5_1_near_boundary(x) & np.isclose(diff, d)))
            if bad.any():
                problems.append(f"{int(bad.sum())} values differ beyond a one-step tie")
            row = compare("kv_store", qt.name, _shape(T, H, D) + f" ctx{ctx}", gv, wv,
                          np.where(_q5_1_near_boundary(x), d * 1.0001, 0.0), tol,
                          problems=problems)
        else:
            row = compare("kv_store", qt.name, _shape(T, H, D) + f" ctx{ctx}", got_rows, want,
                          tol=tol, bits=True, problems=problems)
            # report the error in value space too (0 when the bytes match)
            row.max_abs = float(np.max(np.abs(_f64(gv) - _f64(wv)), initial=0.0))
        yield row


def _quant_error(x, qt):
    """Per-element bound on |dequantize(quantize(x)) - x| for a KV cache type, from the block
    the element sits in: Q8_0 rounds to half a step d = amax / 127, and d itself is stored in
    f16 (relative 2^-11, times |q| <= 127); Q5_1 half a step d = (max - min) / 31, with d and
    the offset min in f16; F16 rounds each value (2^-11 relative)."""
    from .quant import QType
    x = _f64(x)
    if qt == QType.F16:
        return 2.0 ** -11 * np.abs(x)
    blocks = x.reshape(-1, 32)
    if qt == QType.Q8_0:
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        err = d * (0.5 + 127 * 2.0 ** -11)
    else:
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        d = (hi - lo) / 31
        err = d * (0.5 + 31 * 2.0 ** -11) + np.abs(lo) * 2.0 ** -11
    return np.broadcast_to(err, blocks.shape).reshape(x.shape)


@check("kv_store_rope", "cache.kv.launch_kv_store_rope")
def check_kv_store_rope(rng, size):
    """A layer's K and V in one launch, K rotated (partial NEOX RoPE) on the way in. V: the
    bytes of quantize(v) (as kv_store). K: compared in value space with the oracle
    ops.rope(k): the rotation's bound (as `rope`) plus the codec's quantization error of the
    block (the kernel quantizes its own float32 rotation, which may sit on the other side of a
    rounding boundary than the float64 one; MARGIN covers the scale d moving with it)."""
    from .cache import kv
    from .device import simulator_enabled
    from .kernels import rope
    from .quant import QType, dequantize, quantize
    from .reference import ops
    if size == "tiny":
        cases = [(3, 2, 32, 16, 16, 1e7, QType.Q8_0, QType.Q5_1)]  # T, H, D, ctx, rotary, theta
    else:
        cases = [(32, Q9.n_kv_heads, Q9.head_dim, 4096, Q9.rotary_dim, Q9.rope_theta,
                  QType.Q8_0, QType.Q5_1),
                 (32, Q05.n_kv_heads, Q05.head_dim, 4096, Q05.rotary_dim, Q05.rope_theta,
                  QType.F16, QType.F16)]
    for T, H, D, ctx, rd, theta, kt, vt in cases:
        k, v = _kv_rows(rng, T, H, D), _kv_rows(rng, T, H, D)
        positions = rng.choice(ctx, T, replace=False).astype(np.int32)
        inv_freq = rope.rope_inv_freq(theta, rd)
        caches = []
        for qt in (kt, vt):
            poison = np.full((H, ctx, kv.kv_row_bytes(qt, D)), _INT_POISON_BYTE, np.uint8)
            caches.append((poison, _dev(poison)))
        (kp, k_u8), (vp, v_u8) = caches
        # the query heads ride along (q=...: rotated in place in the same launch)
        q = _kv_rows(rng, T, 2 * H + 1, D)
        q_dev = _dev(q)
        kv.launch_kv_store_rope(_dev(k), _dev(v), _dev(positions), _dev(inv_freq), kt, k_u8,
                                k_u8.view(np.float16), vt, v_u8, v_u8.view(np.float16), q=q_dev)
        q_ref = ops.rope(q, positions, theta, rd)
        yield compare("kv_store_rope q", "f32", _shape(T, 2 * H + 1, D), q_dev.copy_to_host(),
                      q_ref, _rope_bound(q, positions, inv_freq) + TINY_NORMAL, "rope")
        untouched = np.ones(ctx, bool)
        untouched[positions] = False
        shape = _shape(T, H, D) + f" ctx{ctx} rot{rd}"
        got_k, got_v = k_u8.copy_to_host(), v_u8.copy_to_host()
        problems = ["" if np.array_equal(got[:, untouched], p[:, untouched])
                    else "wrote positions it was not given"
                    for got, p in ((got_k, kp), (got_v, vp))]
        k_rows = np.ascontiguousarray(got_k[:, positions].transpose(1, 0, 2))
        k_ref = ops.rope(k, positions, theta, rd)
        bound = MARGIN * (_rope_bound(k, positions, inv_freq) + _quant_error(k_ref, kt))
        yield compare("kv_store_rope k", kt.name, shape, dequantize(k_rows, kt, (T, H, D)), k_ref,
                      bound + TINY_NORMAL, f"{MARGIN:g}(rope + quantization)",
                      problems=problems[:1])
        v_rows = np.ascontiguousarray(got_v[:, positions].transpose(1, 0, 2))
        want = quantize(v, vt)
        if vt == QType.Q5_1 and not simulator_enabled():
            # FMA contraction on the GPU: one step at a near-tie (see kv_store)
            gv, wv = dequantize(v_rows, vt, (T, H, D)), dequantize(want, vt, (T, H, D))
            yield compare("kv_store_rope v", vt.name, shape, gv, wv,
                          np.where(_q5_1_near_boundary(v), _quant_error(v, vt) * 2.0001, 0.0),
                          "bytes, or 1 step at a tie", problems=problems[1:])
        else:
            yield compare("kv_store_rope v", vt.name, shape, v_rows, want, tol="bit-exact",
                          bits=True, problems=problems[1:])


# ------------------------------------------------------------------ attention


def _attention_bound(q, k, v, positions, scale, ref, n_splits=0, merges=1, f16=False):
    """Per-output absolute bound of the flash kernels vs ops.attention (float64) on the same
    K/V values (the cache's dequantized contents for the cache kernels).

    Row (t, h) sees keys s <= positions[t]. Its scores are D-term float32 dots, then * scale:
    absolute error E <= gamma_{D+1} * Smax with Smax = max_s scale * sum_d |q_d k_sd| (which
    also bounds |score|). A weight e_s = exp(s_s - m) then errs relatively by
    delta <= 2E (s and m) + 2u Smax (the subtraction, |s - m| <= 2 Smax) + 4u (expf 2 ulp, the
    alpha rescale); with split-K the combine's exp(m_s - M) adds 2u Smax + 2u more. The output
    (sum_s e_s v_s) / (sum_s e_s) then errs by <= 2 delta * Mv (numerator and denominator),
    Mv = max_s |v_sd| bounding the convex combination, plus the float32 accumulation of both
    sums: gamma_h with h = n + 2 ceil(n / ATTN_KEYS) + 2 n_splits + 4 for n visible keys
    (one add per key, two rescales per tile, the combine), and u |ref| for the reference.
    `merges` = 2 for the F16 split pass (decode_attention.py), whose four warps' partials meet
    in one more exp(m_w - M) merge before the combine: its 2u Smax + 2u again, and 4 adds.
    `f16` (the tensor-core kernel, attention_tc.py): q is rounded to f16 first, a score error
    of u16 Smax more (u16 = 2^-11), and each weight is rounded to f16 in the numerator only,
    2 u16 on the output relative to Mv; the tensor core's float32 sums may truncate rather than
    round (2u an add), so its accumulation terms count twice."""
    from .kernels.attention import ATTN_KEYS
    T, Hq, D = q.shape
    S, Hkv, _ = k.shape
    kv_head = np.arange(Hq) // (Hq // Hkv)
    aq = np.abs(_f64(q)).transpose(1, 0, 2)                                  # [Hq, T, D]
    ak = np.abs(_f64(k))[:, kv_head].transpose(1, 2, 0)                     # [Hq, D, S]
    dots = np.matmul(aq, ak).transpose(1, 0, 2) * abs(scale)                # [T, Hq, S]
    visible = np.arange(S)[None, :] <= _f64(positions)[:, None]             # [T, S]
    smax = np.where(visible[:, None, :], dots, 0.0).max(axis=2)             # [T, Hq]
    E = (2 * gamma(D + 1) + U16) * smax if f16 else gamma(D + 1) * smax
    delta = 2 * E + 2 * U * smax + 4 * U
    if n_splits:
        delta += merges * (2 * U * smax + 2 * U)
    n = _f64(positions) + 1                                                 # [T]
    h = n + 2 * np.ceil(n / ATTN_KEYS) + 2 * n_splits + 4 * merges
    acc = np.array([gamma(x) for x in (2 * h if f16 else h)])               # [T]
    vmax = np.maximum.accumulate(np.abs(_f64(v)), axis=0)                   # [S, Hkv, D]
    mv = vmax[np.asarray(positions)][:, kv_head]                            # [T, Hq, D]
    per_row = 2 * delta + 2 * acc[:, None] + 2 * U + (2 * U16 if f16 else 0.0)   # [T, Hq]
    return MARGIN * (per_row[:, :, None] * mv + U * np.abs(_f64(ref))) + TINY_NORMAL


_ATTN_TOL = f"{MARGIN:g}(2δ+2γn+2u)·max|v|"


def _filled_cache(rng, S, Hkv, D, ctx, k_type, v_type):
    """A one-slot KV cache holding S random positions (written by the store kernel)."""
    from .cache import KVCache
    cache = KVCache(1, Hkv, D, ctx, k_type, v_type)
    k = (2 * rng.standard_normal((S, Hkv, D))).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    cache.store(0, _dev(k), _dev(v), _dev(np.arange(S, dtype=np.int32)))
    return cache


@check("flash_attn", "kernels.attention.launch_flash_attn")
def check_flash_attn(rng, size):
    """Prefill attention with float32 K/V: from empty and continued (queries at an offset)."""
    from .kernels import attention as at
    from .reference import ops
    if size == "tiny":
        cases = [(6, 13, 6, 2, 16)]            # T, S, Hq, Hkv, D: n_rep 3, rows straddle tiles
    else:
        cases = [(273, 273, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim),
                 (100, 1100, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim)]
    for T, S, Hq, Hkv, D in cases:
        q = rng.standard_normal((T, Hq, D)).astype(np.float32)
        k = rng.standard_normal((S, Hkv, D)).astype(np.float32)
        v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
        positions = np.arange(S - T, S, dtype=np.int32)
        out = Out((T, Hq, D))
        at.launch_flash_attn(_dev(q), _dev(k), _dev(v), _dev(positions), out.dev)
        got, guard_ok = out.get()
        ref = ops.attention(q, k, v, causal_offset=S - T)
        yield compare("flash_attn", "f32", f"T{T} S{S} H{Hq}/{Hkv} D{D}", got, ref,
                      _attention_bound(q, k, v, positions, D ** -0.5, ref), _ATTN_TOL,
                      guard_ok=guard_ok)


@check("flash_attn_cache", "kernels.attention.launch_flash_attn_cache")
def check_flash_attn_cache(rng, size):
    """Prefill attention over one layer of the quantized KV cache (vs the reference on the
    cache's dequantized contents, so only float32 rounding separates them)."""
    from .kernels import attention as at
    from .quant import QType
    from .reference import ops
    if size == "tiny":
        cases = [(5, 9, 4, 2, 32, 16, QType.Q8_0, QType.Q5_1)]   # T, S, Hq, Hkv, D, ctx, types
    else:
        cases = [(64, 1000, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim, 2048, QType.Q8_0, QType.Q5_1),
                 (64, 1000, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim, 2048, QType.F16, QType.F16)]
    for T, S, Hq, Hkv, D, ctx, kt, vt in cases:
        cache = _filled_cache(rng, S, Hkv, D, ctx, kt, vt)
        q = rng.standard_normal((T, Hq, D)).astype(np.float32)
        positions = np.arange(S - T, S, dtype=np.int32)
        out = Out((T, Hq, D))
        k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
        at.launch_flash_attn_cache(_dev(q), _dev(positions), k_u8, k_f16, kt, v_u8, v_f16, vt,
                                   out.dev)
        got, guard_ok = out.get()
        k, v = cache.read(0, S)
        ref = ops.attention(q, k, v, causal_offset=S - T)
        yield compare("flash_attn_cache", f"{kt.name}/{vt.name}", f"T{T} S{S} H{Hq}/{Hkv} D{D}",
                      got, ref, _attention_bound(q, k, v, positions, D ** -0.5, ref), _ATTN_TOL,
                      guard_ok=guard_ok)


@check("attention_tc", "kernels.attention_tc.launch_attention_tc")
def check_attention_tc(rng, size):
    """Prefill attention on the f16 tensor cores over an F16 cache: a prompt from position 0
    and a chunk deep in one, with the real models' heads (0.5B: n_rep 7, D 64; 9B: D 256;
    Qwen3: D 128)."""
    from .kernels import attention_tc as tc
    from .quant import QType
    from .reference import ops
    if size == "tiny":
        cases = [(9, 9, 4, 2, 32, 12), (5, 40, 7, 1, 64, 44)]   # T, S, Hq, Hkv, D, ctx
    else:
        cases = [(512, 512, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim, 2048),
                 (128, 1000, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim, 2048),
                 (512, 512, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim, 1024),
                 (64, 700, 32, 8, 128, 1024)]
    for T, S, Hq, Hkv, D, ctx in cases:
        cache = _filled_cache(rng, ctx, Hkv, D, ctx, QType.F16, QType.F16)   # past S: unseen
        q = rng.standard_normal((T, Hq, D)).astype(np.float32)
        positions = np.arange(S - T, S, dtype=np.int32)
        out = Out((T, Hq, D))
        k_u8, _, v_u8, _ = cache.layer(0)
        tc.launch_attention_tc(_dev(q), _dev(positions), k_u8, v_u8, out.dev)
        got, guard_ok = out.get()
        k, v = cache.read(0, S)
        ref = ops.attention(q, k, v, causal_offset=S - T)
        yield compare("attention_tc", "F16/F16", f"T{T} S{S} H{Hq}/{Hkv} D{D}", got, ref,
                      _attention_bound(q, k, v, positions, D ** -0.5, ref, f16=True),
                      _ATTN_TOL + " (f16 q, p)", guard_ok=guard_ok)


@check("flash_decode", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_split")
def check_flash_decode(rng, size):
    """Split-K decode attention + combine: contexts that are not a multiple of the split (nor
    of the key tile), a split with no visible key, a multi-token verify step."""
    from .kernels import attention as at
    from .quant import QType
    from .reference import ops
    if size == "tiny":
        # T, n_ctx, n_splits, Hq, Hkv, D, ctx, types
        cases = [(1, 37, 3, 4, 2, 32, 40, QType.Q8_0, QType.Q5_1),
                 (1, 5, 4, 2, 1, 32, 8, QType.F16, QType.F16)]       # chunk 2: split 3 empty
    else:
        cases = [(1, 4097, at.decode_splits(4097, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, 8192, QType.Q8_0, QType.Q5_1),
                 (4, 1000, at.decode_splits(1000, Q05.n_kv_heads), Q05.n_heads, Q05.n_kv_heads,
                  Q05.head_dim, 2048, QType.Q8_0, QType.Q5_1),
                 (1, 3001, 7, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim, 4096, QType.F16, QType.F16),
                 # the F16 split pass (decode_attention.py) at the engine's split counts
                 (1, 6144, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, 8192, QType.F16, QType.F16),
                 (4, 1000, at.decode_splits(2048, Q05.n_kv_heads), Q05.n_heads, Q05.n_kv_heads,
                  Q05.head_dim, 2048, QType.F16, QType.F16)]
    from .kernels.decode_attention import supports
    for T, n_ctx, n_splits, Hq, Hkv, D, ctx, kt, vt in cases:
        # every position holds data, also those past n_ctx (which must stay unseen)
        cache = _filled_cache(rng, ctx, Hkv, D, ctx, kt, vt)
        q = rng.standard_normal((T, Hq, D)).astype(np.float32)
        positions = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
        part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
        out = Out((T, Hq, D))
        k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
        at.launch_flash_decode(_dev(q), _dev(positions), k_u8, k_f16, kt, v_u8, v_f16, vt,
                               out.dev, part_ml, part_acc)
        got, guard_ok = out.get()
        k, v = cache.read(0, n_ctx)
        ref = ops.attention(q, k, v, causal_offset=n_ctx - T)
        yield compare("flash_decode", f"{kt.name}/{vt.name}",
                      f"T{T} ctx{n_ctx}/{n_splits}sp H{Hq}/{Hkv} D{D}", got, ref,
                      _attention_bound(q, k, v, positions, D ** -0.5, ref, n_splits,
                                       merges=2 if supports(Hq // Hkv, D, kt, vt) else 1),
                      _ATTN_TOL, guard_ok=guard_ok)


def _decode_inputs(rng, T, n_ctx, Hq, Hkv, D, ctx, gated):
    """(n, q, positions, gate, cache layer) of a T-token decode ending at n_ctx: a filled F16
    cache of ctx positions, random q, the output gate (T * Hq * D values) when `gated`."""
    from .quant import QType
    cache = _filled_cache(rng, ctx, Hkv, D, ctx, QType.F16, QType.F16)
    n = T * Hq * D
    q = _dev(rng.standard_normal((T, Hq, D)).astype(np.float32))
    positions = _dev(np.arange(n_ctx - T, n_ctx, dtype=np.int32))
    gate = _dev((3 * rng.standard_normal(n)).astype(np.float32)) if gated else None
    return n, q, positions, gate, cache.layer(0)


@check("flash_decode_fused", "kernels.attention.launch_flash_decode")
def check_flash_decode_fused(rng, size):
    """The decode combine with the output gate and the attn_output matvec's int8 input folded in
    (gate=, xq=, xd=): bit for bit what flash_decode, then sigmoid_mul, then quantize_act write
    (the same operations in the same order, so no rounding may differ)."""
    from .kernels import attention as at
    from .kernels.activation import launch_sigmoid_mul
    from .kernels.quantize_act import launch_quantize_act
    from .quant import QType
    if size == "tiny":
        cases = [(1, 37, 3, 4, 2, 32, 40, True), (2, 20, 2, 2, 1, 64, 24, False)]
    else:
        cases = [(1, 4097, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, 8192, True),
                 (4, 1000, at.decode_splits(2048, Q05.n_kv_heads), Q05.n_heads, Q05.n_kv_heads,
                  Q05.head_dim, 2048, False)]
    for T, n_ctx, n_splits, Hq, Hkv, D, ctx, gated in cases:
        n, q, positions, gate, (k_u8, k_f16, v_u8, v_f16) = _decode_inputs(
            rng, T, n_ctx, Hq, Hkv, D, ctx, gated)
        # the separate launches
        part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
        ref = Out((T, Hq, D))
        at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16, QType.F16,
                               ref.dev, part_ml, part_acc)
        if gated:
            launch_sigmoid_mul(ref.dev, gate)
        q_ref, d_ref = Out(n, np.int8, poison=-128), Out(n // 32)
        launch_quantize_act(ref.dev.reshape(n), q_ref.dev, d_ref.dev)
        # the one launch
        part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
        out, xq, xd = Out((T, Hq, D)), Out(n, np.int8, poison=-128), Out(n // 32)
        at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16, QType.F16,
                               out.dev, part_ml, part_acc, gate=gate, xq=xq.dev, xd=xd.dev)
        shape = f"T{T} ctx{n_ctx}/{n_splits}sp H{Hq}/{Hkv} D{D}" + (" gated" if gated else "")
        got, g_ok = out.get()
        want, _ = ref.get()
        yield compare("flash_decode_fused out", "f32", shape, got, want, tol="bit-exact",
                      bits=True, guard_ok=g_ok)
        got_q, gq = xq.get()
        yield compare("flash_decode_fused q", "int8", shape, got_q, q_ref.get()[0],
                      tol="exact", bits=True, guard_ok=gq, poison=np.int8(-128))
        got_d, gd = xd.get()
        yield compare("flash_decode_fused d", "f32", shape, got_d, d_ref.get()[0],
                      tol="bit-exact", bits=True, guard_ok=gd)


@check("flash_decode_cluster_split", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_split_cluster")
def check_flash_decode_cluster_split(rng, size):
    """The split pass and its combine as one launch on thread-block clusters (split_cluster=N,
    decode_attention.SPLIT_CLUSTER; the position before the wait as the decode step runs it):
    bit for bit the split pass + combine kernel's output, gate and int8 copy included, on
    clusters of 2, 4 and 8 blocks a KV head (in the simulator, and without clusters, one block
    a pair) -- tokens past the one pass's contexts, several rounds of slots where the plan
    has more splits than the clusters' slots; tiny: blocks of one slot too (block barriers)."""
    from .kernels import attention as at
    from .quant import QType
    if size == "tiny":
        cases = [(1, 300, 3, 4, 2, 32, 320, True), (2, 150, 12, 8, 1, 64, 160, False)]
    else:
        cases = [(1, 6144, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads,
                  Q05.n_kv_heads, Q05.head_dim, 8192, True),
                 (2, 3000, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads,
                  Q05.n_kv_heads, Q05.head_dim, 8192, False),
                 (1, 6144, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, 8192, True)]
    for T, n_ctx, n_splits, Hq, Hkv, D, ctx, gated in cases:
        n, q, positions, gate, (k_u8, k_f16, v_u8, v_f16) = _decode_inputs(
            rng, T, n_ctx, Hq, Hkv, D, ctx, gated)
        outs = {}
        forms = [("split", {}), ("cluster2", dict(split_cluster=2, pre_wait=True)),
                 ("cluster4", dict(split_cluster=4, pre_wait=True)),
                 ("cluster8", dict(split_cluster=8, pre_wait=True))]
        if size == "tiny":          # (one more build: the GPU's first call had no time for it)
            forms.append(("cluster8 1 slot", dict(split_cluster=8, cluster_slots=1)))
        for form, kw in forms:
            part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
            out, xq, xd = Out((T, Hq, D)), Out(n, np.int8, poison=-128), Out(n // 32)
            at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16,
                                   QType.F16, out.dev, part_ml, part_acc, gate=gate,
                                   xq=xq.dev, xd=xd.dev, **kw)
            outs[form] = (out.get(), xq.get(), xd.get())
        (want, _), (want_q, _), (want_d, _) = outs.pop("split")
        shape = f"T{T} ctx{n_ctx}/{n_splits}sp H{Hq}/{Hkv} D{D}" + (" gated" if gated else "")
        for form, ((got, g_ok), (got_q, gq), (got_d, gd)) in outs.items():
            yield compare(f"flash_decode {form} out", "f32", shape, got, want, tol="bit-exact",
                          bits=True, guard_ok=g_ok)
            yield compare(f"flash_decode {form} q", "int8", shape, got_q, want_q, tol="exact",
                          bits=True, guard_ok=gq, poison=np.int8(-128))
            yield compare(f"flash_decode {form} d", "f32", shape, got_d, want_d,
                          tol="bit-exact", bits=True, guard_ok=gd)


@check("flash_decode_full_groups", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_split", "kernels.decode_attention.launch_onepass")
def check_flash_decode_full_groups(rng, size):
    """Decode attention with the V groups whose keys are all in range loaded from one base and
    multiplied without per-key tests (decode_attention.FULL_GROUPS, the default): bit for bit
    the per-key form, in the split pass + combine and in the one-pass kernel, for tokens whose
    splits end in partial groups."""
    from .kernels import attention as at
    from .kernels import decode_attention as da
    from .quant import QType
    from .switches import switched
    if size == "tiny":
        cases = [(2, 45, 4, 4, 2, 32, True), (1, 300, 24, 14, 2, 64, False)]
    else:
        cases = [(1, 1013, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads,
                  Q05.n_kv_heads, Q05.head_dim, False),
                 (2, 509, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, True),
                 (1, 6139, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, True)]
    for T, n_ctx, n_splits, Hq, Hkv, D, gated in cases:
        n, q, positions, gate, (k_u8, k_f16, v_u8, v_f16) = _decode_inputs(
            rng, T, n_ctx, Hq, Hkv, D, n_ctx, gated)
        forms = [("split", {})]
        if n_ctx <= da.onepass_max_ctx(D, n_splits, at.DECODE_MIN_CHUNK):
            forms.append(("one-pass", dict(onepass=True)))
        for name, form in forms:
            got = []
            for full in (False, True):
                part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
                out = Out((T, Hq, D))
                with switched([(da, "FULL_GROUPS", full)]):
                    at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16,
                                           QType.F16, out.dev, part_ml, part_acc, gate=gate,
                                           **form)
                got.append(out.get())
            shape = f"T{T} ctx{n_ctx}/{n_splits}sp H{Hq}/{Hkv} D{D} {name}"
            (o0, _), (o1, g1) = got
            yield compare("flash_decode_full_groups out", "f32", shape, o1, o0,
                          tol="bit-exact", bits=True, guard_ok=g1)


@check("flash_decode_onepass", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_onepass")
def check_flash_decode_onepass(rng, size):
    """Decode attention in one launch (onepass=, engine.ONEPASS_MAX_CTX): bit for bit what the
    split pass + combine write -- output, gate, int8 copy -- for tokens whose plans use
    different numbers of 16-key splits, more of them than the kernel's warps."""
    from .kernels import attention as at
    from .quant import QType
    if size == "tiny":
        # T, n_ctx, n_splits, Hq, Hkv, D, gated
        cases = [(2, 40, 4, 4, 2, 32, True), (1, 300, 24, 14, 2, 64, False)]
    else:
        cases = [(1, 1024, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads,
                  Q05.n_kv_heads, Q05.head_dim, False),
                 (2, 512, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, True)]
    for T, n_ctx, n_splits, Hq, Hkv, D, gated in cases:
        n, q, positions, gate, (k_u8, k_f16, v_u8, v_f16) = _decode_inputs(
            rng, T, n_ctx, Hq, Hkv, D, n_ctx, gated)
        got = []
        forms = ({}, dict(onepass=True, early=False), dict(onepass=True, early=True),
                 *(dict(onepass=True, early=True, cluster=c) for c in (2, 4, 8)))
        for form in forms:
            part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
            out, xq, xd = Out((T, Hq, D)), Out(n, np.int8, poison=-128), Out(n // 32)
            at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16,
                                   QType.F16, out.dev, part_ml, part_acc, gate=gate,
                                   xq=xq.dev, xd=xd.dev, **form)
            got.append((out.get(), xq.get(), xd.get()))
        (o0, _), (q0, _), (d0, _) = got[0]
        for form, ((o1, g1), (q1, gq), (d1, gd)) in zip(forms[1:], got[1:]):
            shape = (f"T{T} ctx{n_ctx}/{n_splits}sp H{Hq}/{Hkv} D{D}" + (" gated" if gated else "")
                     + (" early" if form["early"] else "")
                     + (f" cluster{form['cluster']}" if "cluster" in form else ""))
            yield compare("flash_decode_onepass out", "f32", shape, o1, o0, tol="bit-exact",
                          bits=True, guard_ok=g1)
            yield compare("flash_decode_onepass q", "int8", shape, q1, q0, tol="exact",
                          bits=True, guard_ok=gq, poison=np.int8(-128))
            yield compare("flash_decode_onepass d", "f32", shape, d1, d0, tol="bit-exact",
                          bits=True, guard_ok=gd)


@check("flash_decode_onepass_store", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_onepass")
def check_flash_decode_onepass_store(rng, size):
    """The one-pass decode attention with the token's RoPE and K / V store in its launch
    (store=, engine.ONEPASS_STORE; one token, decode's): the same output and the same cache
    rows, bit for bit, as cache.kv's store launch then the kernel. The token's rows start as
    NaN."""
    from .kernels import attention as at
    from .kernels import decode_attention as da
    from .kernels.rope import rope_inv_freq
    from .quant import QType
    # T, n_ctx, Hq, Hkv, D, rotary dims
    cases = ([(1, 40, 4, 2, 32, 16)] if size == "tiny" else
             [(1, 1024, Q05.n_heads, Q05.n_kv_heads, Q05.head_dim, Q05.rotary_dim),
              (1, 256, Q9.n_heads, Q9.n_kv_heads, Q9.head_dim, Q9.rotary_dim)])
    for T, n_ctx, Hq, Hkv, D, rot in cases:
        n_splits = at.decode_splits(8192, Hkv)
        knew = _dev((2 * rng.standard_normal((T, Hkv, D))).astype(np.float32))
        vnew = _dev(rng.standard_normal((T, Hkv, D)).astype(np.float32))
        qh = rng.standard_normal((T, Hq, D)).astype(np.float32)
        inv = _dev(rope_inv_freq(1e7, rot))
        positions = _dev(np.arange(n_ctx - T, n_ctx, dtype=np.int32))
        seed = int(rng.integers(0, 2 ** 31))
        got = []
        # (fused store, early loads, cluster, position before the wait: ONEPASS_PRE_WAIT)
        forms = ((False, None, None, False), (True, False, None, False),
                 (True, True, None, False), (True, True, 2, False), (True, True, 4, False),
                 (True, True, 8, False), (True, True, None, True))
        for fused, early, cl, pw in forms:
            cache = _filled_cache(np.random.default_rng(seed), n_ctx, Hkv, D, n_ctx, QType.F16,
                                  QType.F16)
            rows = (cache.k_f16[0], cache.v_f16[0])
            for r in rows:
                host = r.copy_to_host()
                host[:, n_ctx - T:] = np.nan
                r.copy_to_device(host)
            q = _dev(qh)
            k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
            part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
            out = Out((T, Hq, D))
            if not fused:
                cache.store(0, knew, vnew, positions, inv_freq=inv, q=q)
            with switched([(da, "ONEPASS_PRE_WAIT", pw)]):
                at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16,
                                       QType.F16, out.dev, part_ml, part_acc, onepass=True,
                                       store=(knew, vnew, inv) if fused else None,
                                       early=early, cluster=cl)
            got.append((out.get(), np.concatenate([r.copy_to_host()[:, n_ctx - T:].reshape(-1)
                                                   for r in rows]), q.copy_to_host()))
        (o0, _), rows0, q0 = got[0]
        for (_, early, cl, pw), ((o1, g1), rows1, q1) in zip(forms[1:], got[1:]):
            shape = (f"T{T} ctx{n_ctx} H{Hq}/{Hkv} D{D} rot{rot}" + (" early" if early else "")
                     + (f" cluster{cl}" if cl else "") + (" pre-wait" if pw else ""))
            yield compare("flash_decode_onepass_store out", "f32", shape, o1, o0,
                          tol="bit-exact", bits=True, guard_ok=g1)
            yield compare("flash_decode_onepass_store kv", "f16", shape, rows1, rows0,
                          tol="bit-exact", bits=True)
            yield compare("flash_decode_onepass_store q", "f32", shape, q1, q0,
                          tol="bit-exact", bits=True)


@check("flash_decode_forms", "kernels.attention.launch_flash_decode",
       "kernels.decode_attention.launch_split")
def check_flash_decode_forms(rng, size):
    """The F16 split pass's other forms, bit for bit the block-a-split, one-warp form they
    replace in places: one-tile splits with their rows spread over the four warps (spread=,
    decode's default for small heads), blocks walking their splits (split_grid=, the rows
    prefill) and the position, plan and prefetch before the grid-dependency wait (pre_wait=,
    the decode step's past the one pass) -- tokens of one launch whose plans use different
    numbers of splits, of one tile and of several."""
    from .kernels import attention as at
    from .quant import QType
    if size == "tiny":
        # T, first position, n_splits, Hq, Hkv, D, walking blocks
        cases = [(3, 14, 4, 4, 2, 32, 1), (2, 40, 3, 8, 1, 64, 2), (2, 300, 2, 8, 1, 64, 1)]
    else:
        cases = [(16, 0, at.decode_splits(8192, 2), 16, 2, 256, 8),      # the 35B-A3B heads
                 (16, 480, at.decode_splits(8192, Q9.n_kv_heads), Q9.n_heads, Q9.n_kv_heads,
                  Q9.head_dim, 8),
                 (9, 503, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads, Q05.n_kv_heads,
                  Q05.head_dim, 4),
                 (2, 6142, at.decode_splits(8192, Q05.n_kv_heads), Q05.n_heads,
                  Q05.n_kv_heads, Q05.head_dim, 16)]
    for T, p0, n_splits, Hq, Hkv, D, grid in cases:
        ctx = p0 + T
        cache = _filled_cache(rng, ctx, Hkv, D, ctx, QType.F16, QType.F16)
        q = _dev(rng.standard_normal((T, Hq, D)).astype(np.float32))
        positions = _dev(np.arange(p0, ctx, dtype=np.int32))
        k_u8, k_f16, v_u8, v_f16 = cache.layer(0)
        outs = {}
        for form, kw in (("one warp", dict(spread=False)), ("spread", dict(spread=True)),
                         (f"walk{grid}", dict(spread=False, split_grid=grid)),
                         (f"walk{grid} spread", dict(spread=True, split_grid=grid)),
                         ("pre-wait", dict(pre_wait=True)),
                         (f"walk{grid} pre-wait", dict(pre_wait=True, split_grid=grid))):
            part_ml, part_acc = at.alloc_decode_partials(T, Hq, D, n_splits)
            out = Out((T, Hq, D))
            at.launch_flash_decode(q, positions, k_u8, k_f16, QType.F16, v_u8, v_f16,
                                   QType.F16, out.dev, part_ml, part_acc, **kw)
            outs[form] = out.get()
        want, _ = outs.pop("one warp")
        shape = f"T{T} pos{p0}.. {n_splits}sp H{Hq}/{Hkv} D{D}"
        for form, (got, g_ok) in outs.items():
            yield compare(f"flash_decode {form}", "f32", shape, got, want, tol="bit-exact",
                          bits=True, guard_ok=g_ok)


# ------------------------------------------------------------------ argmax, sampling, step


@check("argmax", "kernels.sampling.launch_argmax")
def check_argmax(rng, size):
    """Device argmax: exact, ties to the lowest id (also across blocks), NaN never ranks."""
    from .kernels import sampling as sm
    V, threads = (1500, 32) if size == "tiny" else (Q05.vocab, sm.SAMPLE_THREADS)
    work = sm.SampleWorkspace(V, threads)
    logits = rng.standard_normal(V).astype(np.float32)
    top = np.float32(logits.max() + 1.0)
    logits[np.sort(rng.choice(V, 3, replace=False))] = top      # a three-way tie
    logits[rng.integers(0, V)] = np.nan
    out = Out(1, np.int32)
    sm.launch_argmax(_dev(logits), out.dev, work)
    got, guard_ok = out.get()
    # np.argmax returns the first maximum; nanargmax the same with NaN skipped (the kernel's
    # rule: NaN never ranks)
    ref = np.array([np.nanargmax(logits)], np.int32)
    yield compare("argmax", "f32", f"V{V} {work.n_blocks}blk", got, ref, tol="exact",
                  guard_ok=guard_ok, poison=_poison_value(np.int32))
    # a verify's rows in one launch pair: each row's own argmax, ties in different rows
    T = 4
    work = sm.SampleWorkspace(V, threads, rows=T)
    rows = rng.standard_normal((T, V)).astype(np.float32)
    for r in range(T):
        rows[r, np.sort(rng.choice(V, 2 + r, replace=False))] = np.float32(rows[r].max() + 1.0)
    out = Out(T, np.int32)
    sm.launch_argmax(_dev(rows), out.dev, work)
    got, guard_ok = out.get()
    yield compare("argmax rows", "f32", f"{T}x V{V} {work.n_blocks}blk", got,
                  rows.argmax(axis=1).astype(np.int32), tol="exact", guard_ok=guard_ok,
                  poison=_poison_value(np.int32))


@check("top_prob", "kernels.sampling.launch_top_prob")
def check_top_prob(rng, size):
    """A draft's confidence on the device: 1 / sum(exp(l - max)) after launch_argmax, at the
    draft's slot (counter[0]); float32 sums of V terms <= 1 against float64."""
    from .kernels import sampling as sm
    V, threads = (1500, 32) if size == "tiny" else (Q05.vocab, sm.SAMPLE_THREADS)
    work = sm.SampleWorkspace(V, threads)
    for scale in (1.0, 6.0):
        logits = (scale * rng.standard_normal(V)).astype(np.float32)
        d_logits, tok = _dev(logits), _dev(np.zeros(1, np.int32))
        sm.launch_argmax(d_logits, tok, work)
        out = Out(3)
        counter = _dev(np.array([1], np.int32))
        sm.launch_top_prob(d_logits, tok, work, out.dev, counter, False)
        got, guard_ok = out.get()
        z = logits.astype(np.float64)
        ref = 1.0 / np.exp(z - z.max()).sum()
        # V float32 adds of terms <= 1 (a block tree and a chunk loop): <= (V + log2 V) u rel.
        bound = np.float64(V + 16) * 2.0 ** -24 * ref
        yield compare("top_prob", "f32", f"V{V} x{scale:g}", got[1:2], np.array([ref]),
                      np.array([bound]), "(V+16)u·p", guard_ok=guard_ok,
                      problems=[] if np.isnan(got[0]) and np.isnan(got[2])
                      else ["wrote another slot"])


# a draw whose u lands within this relative distance of a boundary between two tokens may pick
# either neighbour (float32 device sums vs the float64 reference; sampling.py's docstring)
_SAMPLE_MARGIN = 1e-5


@check("sample", "kernels.sampling.launch_sample")
def check_sample(rng, size):
    """Seeded sampling: the uniform is bit-exact (reference_uniform), the token equals
    reference_sample's for that uniform unless u sits on a knife edge."""
    from .kernels import sampling as sm
    # tiny: 16 threads sort 128-logit chunks; 4 blocks make a two-level merge tree
    V, threads = (500, 16) if size == "tiny" else (Q05.vocab, sm.SAMPLE_THREADS)
    work = sm.SampleWorkspace(V, threads)
    seed = int(rng.integers(0, 2 ** 63))
    state = sm.make_rng_state(seed)
    draws = 0
    # temperature, top_k, top_p, logit scale
    for temperature, top_k, top_p, scale in ((0.0, 0, 1.0, 1.0), (1.0, 0, 1.0, 1.0),
                                             (0.8, 12, 0.7, 2.0), (1.0, 0, 0.6, 4.0)):
        logits = (rng.standard_normal(V) * scale).astype(np.float32)
        out = Out(1, np.int32)
        u_out = Out(1)
        sm.launch_sample(_dev(logits), _dev(sm.sampling_params(temperature, top_p, top_k)), state,
                         out.dev, u_out.dev, work)
        token, g1 = out.get()
        u, g2 = u_out.get()
        problems = []
        if temperature > 0:
            u_ref = sm.reference_uniform(seed, draws)
            draws += 1
            if u[0] != u_ref:
                problems.append(f"uniform {u[0]!r} != reference {u_ref!r}")
        elif u[0] != 0:
            problems.append(f"greedy reported u = {u[0]!r}, not 0")
        want, margin = sm.reference_sample(logits, temperature, top_k, top_p, float(u[0]))
        knife_edge = margin <= _SAMPLE_MARGIN and 0 <= token[0] < V
        ref = token.copy() if knife_edge else np.array([want], np.int32)
        label = "greedy" if temperature <= 0 else f"t{temperature:g} k{top_k} p{top_p:g}"
        yield compare("sample", label, f"V{V} {work.n_blocks}blk", token, ref,
                      tol="exact" + (" (u at a tie)" if knife_edge else ""),
                      guard_ok=g1 and g2, poison=_poison_value(np.int32), problems=problems)
    counter = int(state.copy_to_host()[1])
    if counter != draws:
        yield Row("sample rng", "u64", "state", float(abs(counter - draws)), math.inf, "exact",
                  math.inf, False, f"RNG counter {counter} after {draws} draws")


@check("advance", "kernels.step.launch_advance")
def check_advance(rng, size):
    """End of a decode step: token_in = token_out, position += 1. Exact."""
    from .kernels import step
    token_out = np.array([rng.integers(0, 151936)], np.int32)
    position = np.array([rng.integers(0, 1 << 20)], np.int32)
    token_in = Out(1, np.int32)
    pos_dev = _dev(position)
    step.launch_advance(token_in.dev, _dev(token_out), pos_dev)
    want_in, want_pos = np.full(1, _poison_value(np.int32)), position.copy()
    step.advance_reference(want_in, token_out, want_pos)
    got, guard_ok = token_in.get()
    yield compare("advance token", "i32", "1", got, want_in, tol="exact", guard_ok=guard_ok,
                  poison=_poison_value(np.int32))
    yield compare("advance position", "i32", "1", pos_dev.copy_to_host(), want_pos, tol="exact")


@check("mtp_chain", "kernels.step.launch_mtp_chain")
def check_mtp_chain(rng, size):
    """One MTP draft step into the next (speculative decoding's device-side draft chain): the
    argmax becomes draft `counter` and the next input token, the output row the next hidden
    row, the position source + 1. A round's first step (first = 1) restarts the count. Exact."""
    from .kernels import step
    H = 64 if size == "tiny" else Q9.hidden
    x_row = rng.standard_normal(H).astype(np.float32)
    token = np.array([rng.integers(0, 248320)], np.int32)
    pos_src = rng.integers(0, 1 << 20, 9).astype(np.int32)
    for first, idx in ((1, 8), (0, 0)):
        drafts0 = np.full(9, -1, np.int32)
        counter0 = np.array([3], np.int32)
        h, ids = Out((1, H)), Out(1, np.int32)
        positions, drafts, counter = _dev(np.zeros(1, np.int32)), _dev(drafts0), _dev(counter0)
        src = positions if not first else _dev(pos_src)
        if not first:
            positions.copy_to_device(pos_src[:1])
        step.launch_mtp_chain(_dev(token), _dev(x_row), ids.dev, h.dev, positions, src, idx,
                              drafts, counter, bool(first))
        want = dict(h=np.zeros((1, H), np.float32), ids=np.zeros(1, np.int32),
                    pos=np.zeros(1, np.int32), drafts=drafts0.copy(), counter=counter0.copy())
        step.mtp_chain_reference(token, x_row, want["ids"], want["h"], want["pos"],
                                 pos_src if first else pos_src[:1].copy(), idx, want["drafts"],
                                 want["counter"], first)
        label = "first" if first else "chained"
        got_h, ok_h = h.get()
        got_ids, ok_ids = ids.get()
        yield compare(f"mtp_chain {label} row", "f32", f"1x{H}", got_h, want["h"], tol="exact",
                      bits=True, guard_ok=ok_h)
        yield compare(f"mtp_chain {label} ids/pos", "i32", "3",
                      np.concatenate([got_ids, positions.copy_to_host(), counter.copy_to_host()]),
                      np.concatenate([want["ids"], want["pos"], want["counter"]]), tol="exact",
                      guard_ok=ok_ids)
        yield compare(f"mtp_chain {label} drafts", "i32", "9", drafts.copy_to_host(),
                      want["drafts"], tol="exact")


# ------------------------------------------------------------------ Gated DeltaNet


def _gdn_dims(size):
    if size == "tiny":
        return SimpleNamespace(nk=2, nv=4, dk=16, dv=16)
    return SimpleNamespace(nk=Q9.lin_k_heads, nv=Q9.lin_v_heads, dk=Q9.lin_dk, dv=Q9.lin_dv)


@check("gdn_conv1d", "kernels.gated_deltanet.launch_conv1d_silu")
def check_gdn_conv1d(rng, size):
    """Causal depthwise conv (width 4) + silu, continuing from a window; new window exact."""
    from .kernels import gated_deltanet as gdn
    from .reference import ops
    from .reference.gated_deltanet import causal_conv1d
    d = _gdn_dims(size)
    C = 2 * d.nk * d.dk + d.nv * d.dv
    K = gdn.CONV_KERNEL
    # real: 40 tokens cut into the kernel's runs of 3 (a window reaching into the run before)
    for T in ((3,) if size == "tiny" else (1, 40)):
        x = (2 * rng.standard_normal((T, C))).astype(np.float32)
        w = (0.5 * rng.standard_normal((C, K))).astype(np.float32)
        state = (2 * rng.standard_normal((K - 1, C))).astype(np.float32)   # mid-sequence
        y = Out((T, C))
        state_dev = _dev(state)
        gdn.launch_conv1d_silu(_dev(x), _dev(w), state_dev, y.dev)
        got, guard_ok = y.get()
        conv, new_state = causal_conv1d(x, w, state)
        ref = ops.silu(conv)
        # 4 products summed in float32: <= 4 roundings of terms bounded by sum_j |w_j x_j|
        # (silu' <= 1.1 carries them through); silu itself 4 ulps and the reference's 1
        xp = np.concatenate([state, x]).astype(np.float64)
        mag = sum(np.abs(_f64(w[:, j]) * xp[j:j + T]) for j in range(K))
        bound = MARGIN * (gamma(K) * 1.1 * mag + 5 * U * np.abs(_f64(ref))) + TINY_NORMAL
        yield compare("gdn_conv1d", "f32", _shape(T, C), got, ref, bound,
                      f"{MARGIN:g}(1.1γ4·Σ|wx|+5u|y|)", guard_ok=guard_ok)
        yield compare("gdn_conv1d state", "f32", _shape(K - 1, C), state_dev.copy_to_host(),
                      new_state, tol="bit-exact", bits=True)


@check("gdn_conv_prep", "kernels.gated_deltanet.launch_gdn_conv_prep")
def check_gdn_conv_prep(rng, size):
    """The decode launch that fuses the conv and the per-head prep, against the two launches
    it replaces (each checked against the numpy reference by its own row): the same
    arithmetic in the same order, so equal but for the compiler's choice of FMA contractions in
    either kernel (bounded below; the window and its row copies: bit-exact)."""
    from .kernels import gated_deltanet as gdn
    d = _gdn_dims(size)
    T = 3
    C = 2 * d.nk * d.dk + d.nv * d.dv
    qkv = (1.5 * rng.standard_normal((T, C))).astype(np.float32)
    w = (0.5 * rng.standard_normal((C, gdn.CONV_KERNEL))).astype(np.float32)
    window = rng.standard_normal((gdn.CONV_KERNEL - 1, C)).astype(np.float32)
    a = rng.uniform(-30, 30, (T, d.nv)).astype(np.float32)
    b = (3 * rng.standard_normal((T, d.nv))).astype(np.float32)
    dt_bias = rng.standard_normal(d.nv).astype(np.float32)
    ssm_a = (-np.exp(rng.uniform(-2, 2, d.nv))).astype(np.float32)
    gates = [_dev(arr) for arr in (a, b, dt_bias, ssm_a)]
    shapes = [(T, d.nk, d.dk), (T, d.nk, d.dk), (T, d.nv, d.dv), (T, d.nv), (T, d.nv)]
    x, st = _dev(qkv), _dev(window)
    gdn.launch_conv1d_silu(x, _dev(w), st, x)
    want = [Out(sh) for sh in shapes]
    gdn.launch_gdn_prep(x, *gates, *(o.dev for o in want))
    st2 = _dev(window)
    got = [Out(sh) for sh in shapes]
    steps = Out((T, gdn.CONV_KERNEL - 1, C))
    gdn.launch_gdn_conv_prep(_dev(qkv), _dev(w), st2, *gates, *(o.dev for o in got),
                             steps=steps.dev)
    shape = f"T{T} {d.nk}/{d.nv}h {d.dk}/{d.dv}"
    # Either kernel may contract the conv's four products into FMAs differently: its sum then
    # moves by a few u of sum |w_j x_j| (not of the sum, which can cancel); silu' <= 1.1 passes
    # it on to v; q and k carry it divided by their head's norm (times the query scale).
    win = np.concatenate([window, qkv]).astype(np.float64)
    terms = sum(np.abs(w[:, j].astype(np.float64) * win[j:j + T]) for j in range(gdn.CONV_KERNEL))
    pre = sum(w[:, j].astype(np.float64) * win[j:j + T] for j in range(gdn.CONV_KERNEL))
    y64 = pre / (1 + np.exp(-pre))
    dy = 8 * U * 1.1 * terms                                             # [T, C]
    kd = d.nk * d.dk
    bounds = []
    for off, scale in ((0, d.dk ** -0.5), (kd, 1.0)):
        yh = y64[:, off:off + kd].reshape(T, d.nk, d.dk)
        norm = np.sqrt((yh ** 2).sum(-1, keepdims=True) + 1e-6)
        bounds.append(scale * dy[:, off:off + kd].reshape(T, d.nk, d.dk) / norm)
    bounds.append(dy[:, 2 * kd:].reshape(T, d.nv, d.dv))
    bounds += [0.0, 0.0]
    for name, g_, w_, b_ in zip(("q", "k", "v", "g", "beta"), got, want, bounds):
        ref, _ = w_.get()
        val, guard_ok = g_.get()
        yield compare(f"gdn_conv_prep {name}", "f32", shape, val, ref,
                      b_ + 8 * U * np.abs(_f64(ref)) + TINY_NORMAL,
                      "8u(1.1Σ|wx|/‖y‖+|ref|)", guard_ok=guard_ok)
    yield compare("gdn_conv_prep window", "f32", shape, st2.copy_to_host(), st.copy_to_host(),
                  tol="bit-exact", bits=True)
    val, guard_ok = steps.get()
    yield compare("gdn_conv_prep steps", "f32", shape, val[-1], st.copy_to_host(),
                  tol="bit-exact", bits=True, guard_ok=guard_ok)


@check("gdn_prep", "kernels.gated_deltanet.launch_gdn_prep")
def check_gdn_prep(rng, size):
    """Per-head prep: L2-normalised q (scaled) and k, v copied, g = ssm_a softplus(a + dt),
    beta = sigmoid(b)."""
    from .kernels import gated_deltanet as gdn
    from .reference import ops
    from .reference.gated_deltanet import L2NORM_EPS, l2norm, softplus
    d = _gdn_dims(size)
    T = 2 if size == "tiny" else 4
    kd = d.nk * d.dk
    qkv = (1.5 * rng.standard_normal((T, 2 * kd + d.nv * d.dv))).astype(np.float32)
    a = rng.uniform(-30, 30, (T, d.nv)).astype(np.float32)            # both softplus tails
    b = (3 * rng.standard_normal((T, d.nv))).astype(np.float32)
    dt_bias = rng.standard_normal(d.nv).astype(np.float32)
    ssm_a = (-np.exp(rng.uniform(-2, 2, d.nv))).astype(np.float32)    # = -exp(A_log)
    q, k = Out((T, d.nk, d.dk)), Out((T, d.nk, d.dk))
    v = Out((T, d.nv, d.dv))
    g, beta = Out((T, d.nv)), Out((T, d.nv))
    gdn.launch_gdn_prep(*(_dev(arr) for arr in (qkv, a, b, dt_bias, ssm_a)),
                        q.dev, k.dev, v.dev, g.dev, beta.dev, eps=L2NORM_EPS)
    shape = f"T{T} {d.nk}/{d.nv}h {d.dk}/{d.dv}"
    # l2norm: dk squares summed per thread (dk/32) then block_sum's 5-level tree over 32
    # threads: gamma_h, h = dk/32 + 6, halved by the rsqrt, + 3u (add eps, sqrt, reciprocal),
    # + 3u (times x, times the query scale, which is itself float32(dk^-0.5)); the reference
    # is float64 and not rounded.
    h = math.ceil(d.dk / gdn.PREP_THREADS) + 6
    rel = MARGIN * (gamma(h) / 2 + 6 * U)
    label = f"{MARGIN:g}(γ{h}/2+6u)·|ref|"
    q_ref = l2norm(qkv[:, :kd].reshape(T, d.nk, d.dk)) * d.dk ** -0.5
    k_ref = l2norm(qkv[:, kd:2 * kd].reshape(T, d.nk, d.dk))
    for name, out, ref in (("q", q, q_ref), ("k", k, k_ref)):
        got, guard_ok = out.get()
        yield compare(f"gdn_prep {name}", "f32", shape, got, ref,
                      rel * np.abs(ref) + TINY_NORMAL, label, guard_ok=guard_ok)
    got, guard_ok = v.get()
    yield compare("gdn_prep v", "f32", shape, got, qkv[:, 2 * kd:].reshape(T, d.nv, d.dv),
                  tol="bit-exact", bits=True, guard_ok=guard_ok)
    # g: a + dt_bias rounds (u |x| absolute), which softplus carries into <= u |x| relative
    # (softplus'/softplus <= 1); log1p, exp, max/add, the product with ssm_a: <= 6 ulps + 1
    x = _f64(a) + _f64(dt_bias)
    g_ref = _f64(ssm_a) * softplus(x)
    got, guard_ok = g.get()
    yield compare("gdn_prep g", "f32", shape, got, g_ref,
                  MARGIN * (np.abs(x) + 7) * U * np.abs(g_ref) + TINY_NORMAL,
                  f"{MARGIN:g}(|a+dt|+7)u·|ref|", guard_ok=guard_ok)
    # beta = sigmoid(b): expf 2 ulp, add, divide, and ops.sigmoid's float32 rounding
    b_ref = ops.sigmoid(b)
    got, guard_ok = beta.get()
    yield compare("gdn_prep beta", "f32", shape, got, b_ref,
                  MARGIN * 5 * U * np.abs(_f64(b_ref)) + TINY_NORMAL, f"{MARGIN:g}·5u·|ref|",
                  guard_ok=guard_ok)


def _rule_inputs(rng, d, T, dv):
    """The delta rule's inputs for T tokens of heads d (`_gdn_dims`) with dv value dims: q, k
    as launch_gdn_prep leaves them (L2-normalised, q scaled), v, g (log decay <= 0), beta in
    [0, 1], and a mid-sequence state s0."""
    from .reference.gated_deltanet import l2norm
    qn = l2norm(rng.standard_normal((T, d.nk, d.dk)))
    kn = l2norm(rng.standard_normal((T, d.nk, d.dk)))
    q = (qn * d.dk ** -0.5).astype(np.float32)
    k = kn.astype(np.float32)
    v = rng.standard_normal((T, d.nv, dv)).astype(np.float32)
    g = (-rng.uniform(0.0, 1.5, (T, d.nv))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (T, d.nv)).astype(np.float32)
    s0 = (0.5 * rng.standard_normal((d.nv, d.dk, dv))).astype(np.float32)
    return q, k, v, g, beta, s0


@check("gated_delta_rule", "kernels.gated_deltanet.launch_gated_delta_rule")
def check_gated_delta_rule(rng, size):
    """T recurrent steps of the gated delta rule from a random state (decode T = 1, prefill
    T > 1), against the reference's recurrent form; every kernel ("lane", "quad", "pipe" --
    "auto" picks between them by T -- and "tile")."""
    from .kernels import gated_deltanet as gdn
    from .models.qwen35 import value_to_key_head
    from .reference.gated_deltanet import gated_delta_rule_recurrent
    d = _gdn_dims(size)
    key_head = value_to_key_head("qwen35", d.nk, d.nv)
    for T, variant in ((t, var) for t in ((3,) if size == "tiny" else (1, 40))
                       for var in gdn.RULE_KERNELS):
        q, k, v, g, beta, s0 = _rule_inputs(rng, d, T, d.dv)
        state = _dev(s0)
        o = Out((T, d.nv, d.dv))
        gdn.launch_gated_delta_rule(*(_dev(a) for a in (q, k, v, g, beta)),
                                    _dev(key_head.astype(np.int32)), state, o.dev,
                                    variant=variant)
        got, guard_ok = o.get()
        # the reference takes q, k repeated onto the value heads and scales q itself
        o_ref, s_ref = gated_delta_rule_recurrent(_f64(q)[:, key_head] * np.sqrt(d.dk),
                                                  _f64(k)[:, key_head], v, g, beta, s0)
        # per step each dot over d_k rows rounds <= d_k times and the update adds 2 roundings
        # per entry; with |k| = 1, beta in [0, 1] and decay <= 1 the update is non-expansive in
        # the old state, so errors add over the T steps: T (d_k + 4) u max(|S|, |o|).
        scale = max(np.abs(o_ref).max(), np.abs(s_ref).max())
        bound = MARGIN * T * (d.dk + 4) * U * scale
        label = f"{MARGIN:g}·T(dk+4)u·max|S|"
        shape = f"T{T} {d.nk}/{d.nv}h {d.dk}/{d.dv} {variant}"
        yield compare("gated_delta_rule o", "f32", shape, got, o_ref, bound, label,
                      guard_ok=guard_ok)
        yield compare("gated_delta_rule S", "f32", shape, state.copy_to_host(), s_ref, bound,
                      label)


def _same_q8_rows(name, shape, got, want):
    """Rows for a launch's normed output y, its int8 codes q and scales d, each `Out.get()`'s
    (values, guard_ok), against a twin's, bit for bit."""
    (y2, q2, d2), (y1, q1, d1) = got, want
    yield compare(f"{name} y", "f32", shape, y2[0], y1[0], tol="bit-exact", bits=True,
                  guard_ok=y2[1])
    yield compare(f"{name} q", "int8", shape, q2[0], q1[0], tol="exact", bits=True,
                  guard_ok=q2[1], poison=np.int8(-128))
    yield compare(f"{name} d", "f32", shape, d2[0], d1[0], tol="bit-exact", bits=True,
                  guard_ok=d2[1])


@check("gdn_rule_norm_q8", "kernels.gated_deltanet.launch_gated_delta_rule_norm_q8")
def check_gdn_rule_norm_q8(rng, size):
    """The decode / verify launch that runs the lane rule and the gated q8 output norm
    together, against the two launches it replaces (each checked against the numpy reference
    by its own row): the same arithmetic in the same order, so bit-exact -- the normed o, its
    int8 codes and scales, the saved steps and the state."""
    from .kernels import gated_deltanet as gdn
    from .models.qwen35 import value_to_key_head
    d = _gdn_dims(size)
    dv = 32 if size == "tiny" else d.dv             # (the tiny heads' 16 is no int8 block)
    key_head = _dev(value_to_key_head("qwen35", d.nk, d.nv).astype(np.int32))
    for T in ((2,) if size == "tiny" else (1, 4)):
        q, k, v, g, beta, s0 = _rule_inputs(rng, d, T, dv)
        z = (2 * rng.standard_normal((T, d.nv, dv))).astype(np.float32)
        w = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
        n = T * d.nv * dv
        ins = [_dev(a) for a in (q, k, v, g, beta)]
        outs = []
        # the two launches; the norm warp own / shared; verify's inputs preloaded or not
        for fused in (None, (True, True), (False, True), (True, False)):
            state = _dev(s0)
            o = Out((T, d.nv, dv))
            xq, xd = Out(n, np.int8, poison=-128), Out(n // 32)
            steps = Out((T, d.nv, d.dk, dv))
            if fused is not None:
                with switched([(gdn, "RULE_NORM_OWN_WARP", fused[0]),
                               (gdn, "RULE_NORM_PRELOAD", fused[1])]):
                    gdn.launch_gated_delta_rule_norm_q8(*ins, key_head, state, o.dev, _dev(z),
                                                        _dev(w), 1e-6, xq.dev, xd.dev,
                                                        steps=steps.dev)
            else:
                gdn.launch_gated_delta_rule(*ins, key_head, state, o.dev, steps=steps.dev,
                                            variant="lane")
                gdn.launch_gdn_output_norm(o.dev, _dev(z), _dev(w), 1e-6, o.dev, xq=xq.dev,
                                           xd=xd.dev)
            outs.append((o.get(), xq.get(), xd.get(), steps.get(), state.copy_to_host()))
        (o1, q1, d1, st1, s1) = outs[0]
        for form, (o2, q2, d2, st2, s2) in zip(("", " shared warp", " no preload"), outs[1:]):
            shape = f"T{T} {d.nk}/{d.nv}h {d.dk}/{dv}{form}"
            yield from _same_q8_rows("gdn_rule_norm_q8", shape, (o2, q2, d2), (o1, q1, d1))
            yield compare("gdn_rule_norm_q8 steps", "f32", shape, st2[0], st1[0],
                          tol="bit-exact", bits=True, guard_ok=st2[1])
            yield compare("gdn_rule_norm_q8 S", "f32", shape, s2, s1, tol="bit-exact", bits=True)


@check("gdn_conv_rule_norm_q8", "kernels.gated_deltanet.launch_gdn_conv_rule_norm_q8")
def check_gdn_conv_rule_norm_q8(rng, size):
    """Decode's conv + prep inside the rule-norm launch, against gdn_conv_prep then the
    rule-norm launch (each checked by its own row): the same arithmetic in the same order (the
    norms' sums of squares spelled as the fma chains of gdn_conv_prep's compiled code), so
    bit-exact -- the normed o, its int8 codes and scales, the state, the conv window and both
    steps; the key heads' counters back at zero."""
    from .kernels import gated_deltanet as gdn
    from .models.qwen35 import value_to_key_head
    d = _gdn_dims(size)
    dv = 32 if size == "tiny" else d.dv
    C = 2 * d.nk * d.dk + d.nv * dv
    key_head = _dev(value_to_key_head("qwen35", d.nk, d.nv).astype(np.int32))
    counters = gdn.alloc_conv_counters(d.nk)
    for T in (1,):                                  # (decode's launch: one token)
        f32 = (lambda *shape, s=1.0: (s * rng.standard_normal(shape)).astype(np.float32))
        qkv, window, s0, z = f32(T, C, s=1.5), f32(gdn.CONV_KERNEL - 1, C), \
            f32(d.nv, d.dk, dv, s=0.5), f32(T, d.nv, dv, s=2.0)
        ab = np.concatenate([f32(T, d.nv, s=3.0),
                             rng.uniform(-30, 30, (T, d.nv)).astype(np.float32)], 1)
        consts = [_dev(a) for a in (f32(C, gdn.CONV_KERNEL, s=0.5), f32(d.nv),
                                    (-np.exp(rng.uniform(-2, 2, d.nv))).astype(np.float32),
                                    (1 + 0.1 * f32(dv)), z)]
        n = T * d.nv * dv
        outs = []
        for fused in (False, True):
            x, win, state, d_ab = (_dev(a) for a in (qkv, window, s0, ab))
            b, a = d_ab[:, :d.nv], d_ab[:, d.nv:]
            o, xq, xd = Out((T, d.nv, dv)), Out(n, np.int8, poison=-128), Out(n // 32)
            steps = Out((T, d.nv, d.dk, dv))
            conv_steps = Out((T, gdn.CONV_KERNEL - 1, C))
            if fused:
                gdn.launch_gdn_conv_rule_norm_q8(x, consts[0], win, a, b, consts[1], consts[2],
                                                 key_head, state, o.dev, consts[4], consts[3],
                                                 1e-6, xq.dev, xd.dev, counters,
                                                 conv_steps=conv_steps.dev, steps=steps.dev)
            else:
                q, k, v = (Out(sh).dev for sh in ((T, d.nk, d.dk), (T, d.nk, d.dk),
                                                  (T, d.nv, dv)))
                g, beta = Out((T, d.nv)).dev, Out((T, d.nv)).dev
                gdn.launch_gdn_conv_prep(x, consts[0], win, a, b, consts[1], consts[2], q, k, v,
                                         g, beta, steps=conv_steps.dev)
                gdn.launch_gated_delta_rule_norm_q8(q, k, v, g, beta, key_head, state, o.dev,
                                                    consts[4], consts[3], 1e-6, xq.dev, xd.dev,
                                                    steps=steps.dev)
            outs.append((o.get(), xq.get(), xd.get(), steps.get(), conv_steps.get(),
                         state.copy_to_host(), win.copy_to_host()))
        (o1, q1, d1, st1, cs1, s1, w1), (o2, q2, d2, st2, cs2, s2, w2) = outs
        shape = f"T{T} {d.nk}/{d.nv}h {d.dk}/{dv}"
        yield from _same_q8_rows("gdn_conv_rule_norm_q8", shape, (o2, q2, d2), (o1, q1, d1))
        for name, got, want in (("steps", st2, st1), ("conv steps", cs2, cs1)):
            yield compare(f"gdn_conv_rule_norm_q8 {name}", "f32", shape, got[0], want[0],
                          tol="bit-exact", bits=True, guard_ok=got[1])
        yield compare("gdn_conv_rule_norm_q8 S", "f32", shape, s2, s1, tol="bit-exact", bits=True)
        yield compare("gdn_conv_rule_norm_q8 window", "f32", shape, w2, w1, tol="bit-exact",
                      bits=True)
        yield compare("gdn_conv_rule_norm_q8 counters", "int32", shape,
                      counters.copy_to_host(), np.zeros(d.nk, np.int32), tol="exact", bits=True)


@check("gdn_output_norm", "kernels.gated_deltanet.launch_gdn_output_norm")
def check_gdn_output_norm(rng, size):
    from .kernels import gated_deltanet as gdn
    from .reference.gated_deltanet import gated_rms_norm
    d = _gdn_dims(size)
    T = 2 if size == "tiny" else 4
    o = rng.standard_normal((T, d.nv, d.dv)).astype(np.float32)
    z = (2 * rng.standard_normal((T, d.nv, d.dv))).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d.dv)).astype(np.float32)
    y = Out((T, d.nv, d.dv))
    gdn.launch_gdn_output_norm(_dev(o), _dev(z), _dev(w), 1e-6, y.dev)
    got, guard_ok = y.get()
    ref = gated_rms_norm(o, z, w, 1e-6)
    rel, label = _norm_bound(d.dv, _SILU_GATE_U)
    yield compare("gdn_output_norm", "f32", _shape(T, d.nv, d.dv), got, ref,
                  rel * np.abs(_f64(ref)) + TINY_NORMAL, label, guard_ok=guard_ok)


@check("recurrent_state")
def check_recurrent_state(rng, size):
    """The GDN state's snapshot / restore / reset kernels (cache/recurrent.py): copies and a
    fill, bit-exact; a snapshot of some layers leaves the other slots of its buffer alone."""
    from .cache.recurrent import RecurrentState
    d = _gdn_dims(size)
    cfg = SimpleNamespace(linear_num_key_heads=d.nk, linear_num_value_heads=d.nv,
                          linear_key_head_dim=d.dk, linear_value_head_dim=d.dv,
                          linear_conv_kernel_dim=4)
    layers = [0, 1] if size == "tiny" else list(range(24))      # real: the 9B's 24 GDN layers
    st = RecurrentState(cfg, layers=layers)
    shape = f"{len(layers)}L {d.nv}x{d.dk}x{d.dv}"
    conv0 = rng.standard_normal(st.conv_all.shape).astype(np.float32)
    ssm0 = rng.standard_normal(st.ssm_all.shape).astype(np.float32)
    st.conv_all.copy_to_device(conv0)
    st.ssm_all.copy_to_device(ssm0)
    snap = st.new_snapshot()
    snap.conv.copy_to_device(np.full(snap.conv.shape, np.nan, np.float32))
    snap.ssm.copy_to_device(np.full(snap.ssm.shape, np.nan, np.float32))
    st.snapshot(into=snap)
    yield compare("recurrent snapshot", "f32", shape, snap.ssm.copy_to_host(), ssm0,
                  tol="bit-exact", bits=True,
                  problems=["" if np.array_equal(snap.conv.copy_to_host(), conv0)
                            else "conv windows not copied"])
    st.conv_all.copy_to_device(rng.standard_normal(st.conv_all.shape).astype(np.float32))
    st.ssm_all.copy_to_device(rng.standard_normal(st.ssm_all.shape).astype(np.float32))
    st.restore(snap)
    yield compare("recurrent restore", "f32", shape, st.ssm_all.copy_to_host(), ssm0,
                  tol="bit-exact", bits=True,
                  problems=["" if np.array_equal(st.conv_all.copy_to_host(), conv0)
                            else "conv windows not restored"])
    # one layer only: the other slots of the buffer keep their poison
    part = st.new_snapshot()
    part.ssm.copy_to_device(np.full(part.ssm.shape, np.nan, np.float32))
    st.snapshot(into=part, layers=[layers[1]])
    want = np.full(part.ssm.shape, np.nan, np.float32)
    want[1] = ssm0[1]
    yield compare("recurrent snapshot 1 layer", "f32", shape, part.ssm.copy_to_host(), want,
                  tol="bit-exact", bits=True)
    st.reset()
    yield compare("recurrent reset", "f32", shape, st.ssm_all.copy_to_host(),
                  np.zeros(st.ssm_all.shape, np.float32), tol="bit-exact", bits=True,
                  problems=["" if not st.conv_all.copy_to_host().any() else "conv not zeroed"])


# ------------------------------------------------------------------ MoE


def _route_rel(E, threads, k, lmax):
    """Relative bound of a router weight vs route() (float64 softmax, rounded once):
    exp(l - m) with |l - m| <= lmax: the subtraction's rounding (u lmax absolute in the
    argument, hence relative in the result) + expf's 2 ulp; the sum over E terms (block_sum:
    ceil(E / threads) per thread + a log2(threads) tree) gamma_h; the divide 1; the
    renormalisation: a k-term sum and a divide, which doubles the error of the numerator's;
    the reference's rounding 1."""
    h = math.ceil(E / threads) + int(math.log2(threads))
    per_p = (lmax + 3) * U + gamma(h) + U
    return MARGIN * (2 * per_p + gamma(k) + 2 * U)


@check("moe_route", "kernels.moe.launch_moe_route")
def check_moe_route(rng, size):
    """Router softmax + top-k (+ renormalisation). The ids must be the reference's; at a
    near-tie (two probabilities within the rounding bound) either order is right, so ids are
    compared through the reference probability each one selects."""
    from .kernels import moe
    from .reference import ops
    from .reference.moe import route
    T, E, k = (2, 20, 4) if size == "tiny" else (4, MOE.n_experts, MOE.top_k)
    for norm_topk in (True, False):
        logits = (2 * rng.standard_normal((T, E))).astype(np.float32)
        logits[0, :5] = logits[0].max() + 1                # a 5-way tie at the top: ids 0, 1, ..
        ids, wts = Out((T, k), np.int32), Out((T, k))
        moe.launch_moe_route(_dev(logits), norm_topk, ids.dev, wts.dev)
        got_ids, g1 = ids.get()
        got_w, g2 = wts.get()
        # route() computes logits = linear(x, router_w): an identity router (float64 for this
        # size) hands it our logits exactly
        ref_ids, ref_w = route(logits, np.eye(E, dtype=np.float32), k, norm_topk)
        probs = ops.softmax(logits).astype(np.float64)
        rel = _route_rel(E, moe._router_threads(E), k, float(np.ptp(logits, axis=1).max()))
        label = f"ids: p(id) within {rel:.1e}·p"
        problems = []
        if any(len(set(r)) != k for r in got_ids):
            problems.append("an expert chosen twice")
        if got_ids.min() < 0 or got_ids.max() >= E:
            problems.append("expert id out of range")
            got_ids = np.clip(got_ids, 0, E - 1)
        p_got = np.take_along_axis(probs, got_ids.astype(np.int64), axis=1)
        p_ref = np.take_along_axis(probs, ref_ids, axis=1)
        tag = "norm" if norm_topk else "raw"
        yield compare("moe_route ids", tag, f"T{T} E{E} k{k}", p_got, p_ref, rel * p_ref, label,
                      guard_ok=g1, problems=problems + [
                          "" if np.array_equal(got_ids[0, :min(k, 4)], np.arange(min(k, 4)))
                          else f"exact ties not in id order: {got_ids[0, :min(k, 4)]}"])
        yield compare("moe_route weights", tag, f"T{T} E{E} k{k}", got_w, ref_w,
                      rel * np.abs(_f64(ref_w)) + TINY_NORMAL, f"{rel:.1e}·|ref|", guard_ok=g2)
        # the form ROUTE_WARP leaves out (moe_route's block, or one warp a token): the same bits
        other = not moe.ROUTE_WARP
        ids2, wts2 = Out((T, k), np.int32), Out((T, k))
        saved, moe.ROUTE_WARP = moe.ROUTE_WARP, other
        try:
            moe.launch_moe_route(_dev(logits), norm_topk, ids2.dev, wts2.dev)
        finally:
            moe.ROUTE_WARP = saved
        form = "block" if saved else "warp"
        (ids_o, h1), (w_o, h2) = ids2.get(), wts2.get()
        yield compare(f"moe_route {form} ids", tag, f"T{T} E{E} k{k}", ids_o, got_ids,
                      guard_ok=h1)
        yield compare(f"moe_route {form} weights", tag, f"T{T} E{E} k{k}", w_o, got_w,
                      tol="bit-exact", bits=True, guard_ok=h2)


def _moe_types(size):
    from .quant import QType
    # tiny: one K-quant, one legacy and one dense type (the expert kernels are matvec.py's
    # loop over dequant.py's per-type decoders, which `matvec` checks for every type); real:
    # every block type and BF16 (a full 256-expert stack in F32 / F16 is 1 GB that no
    # checkpoint ships, and their decoders are BF16's path's neighbours in dequant.py)
    if size == "tiny":
        return [QType.Q4_K, QType.Q8_0, QType.BF16]
    return [qt for qt in _weight_types() if qt not in (QType.F32, QType.F16)]


def _moe_dims(size):
    """(T, E, k, hidden, expert ffn); tiny keeps one K-quant super-block per row."""
    if size == "tiny":
        return 2, 4, 2, 256, 256
    return 3, MOE.n_experts, MOE.top_k, MOE.hidden, MOE.expert_ffn


def _expert_ids(rng, T, E, k):
    return np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)


@check("expert_matvec", "kernels.moe.launch_expert_matvec")
def check_expert_matvec(rng, size):
    """y[t, r] = W[ids[t, r]] @ x[t] over a stacked expert weight [E, M, K]."""
    from .kernels import matvec as mv
    from .kernels import moe
    for qt in _moe_types(size):
        T, E, k, K, M = _moe_dims(size)                   # gate/up: [E, ffn, hidden]
        M = 3 if size == "tiny" else M                    # one row block with an idle warp
        w = _random_weight(rng, qt, E * M, K)            # expert e = rows e*M .. e*M + M - 1
        x = rng.standard_normal((T, K)).astype(np.float32)
        ids = _expert_ids(rng, T, E, k)
        ids[-1, -1] = E - 1                               # the last expert's rows too
        y = Out((T, k, M))
        moe.launch_expert_matvec(_dev(w), qt, E, M, K, _dev(ids), _dev(x), y.dev)
        got, guard_ok = y.get()
        w3 = w.reshape(E, M, -1)
        ref = np.stack([np.stack([mv.matvec_reference(w3[e], qt, M, K, x[t]) for e in ids[t]])
                        for t in range(T)])
        mag = np.stack([np.stack([_abs_weight(w3[e], qt, M, K) @ np.abs(_f64(x[t]))
                                  for e in ids[t]]) for t in range(T)])
        h = _matvec_chain(qt, K)         # matvec.py's loop and order (moe.py's docstring)
        yield compare("expert_matvec", qt.name, f"T{T} k{k} {E}x{M}x{K}", got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


@check("moe_down", "kernels.moe.launch_moe_down")
def check_moe_down(rng, size):
    """y[t] = sum_r w_r W_down[ids_r] @ act_r (rank order) + sigmoid(g) shared_y + residual."""
    from .kernels import matvec as mv
    from .kernels import moe
    from .reference import ops
    for qt in _moe_types(size):
        T, E, k, M, K = _moe_dims(size)                   # down: [E, hidden, ffn]
        M = 3 if size == "tiny" else M
        w = _random_weight(rng, qt, E * M, K)
        act = rng.standard_normal((T, k, K)).astype(np.float32)
        ids = _expert_ids(rng, T, E, k)
        wts = rng.uniform(0.05, 1.0, (T, k)).astype(np.float32)
        shared_y = rng.standard_normal((T, M)).astype(np.float32)
        shared_gate = (2 * rng.standard_normal(T)).astype(np.float32)
        residual = rng.standard_normal((T, M)).astype(np.float32)
        y = Out((T, M))
        moe.launch_moe_down(_dev(w), qt, E, M, K, _dev(ids), _dev(wts), _dev(act), y.dev,
                            shared_y=_dev(shared_y), shared_gate=_dev(shared_gate),
                            residual=_dev(residual))
        got, guard_ok = y.get()
        w3 = w.reshape(E, M, -1)
        sig = _f64(ops.sigmoid(shared_gate))[:, None]
        ref = _f64(residual) + sig * shared_y
        mag = np.abs(_f64(residual)) + sig * np.abs(shared_y)
        for t in range(T):
            for r in range(k):
                e = ids[t, r]
                ref[t] += wts[t, r] * mv.matvec_reference(w3[e], qt, M, K, act[t, r])
                mag[t] += wts[t, r] * (_abs_weight(w3[e], qt, M, K) @ np.abs(_f64(act[t, r])))
        # each dot: the matvec chain; the rank-order combine: 2 roundings per expert; the gate:
        # sigmoid (4 u, relative) + a multiply and two adds
        h = _matvec_chain(qt, K) + 2 * k + 8
        yield compare("moe_down", qt.name, f"T{T} k{k} {E}x{M}x{K}", got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


def _moe_q8_types(size):
    """Weight types of the MoE matvec rows: two in the simulator, every dp4a type that fits the
    35B-A3B shape's hidden and expert widths on the GPU."""
    from .kernels import matvec as mv
    from .quant import QType
    return [QType.Q4_K, QType.Q8_0] if size == "tiny" else \
        [qt for qt in mv.MATVEC_Q8 if _fits(qt, MOE.hidden) and _fits(qt, MOE.expert_ffn)]


def _expert_rows_compare(name, qt, tag, got, w3, M, K, xq2, xd2, pairs, guard_ok):
    """compare() of the rows got[n] = W[e] @ x_j for pairs[n] = (e, j) (expert e of the stack
    w3, activation row j of xq2 / xd2) against matvec_q8_reference, within the dp4a matvec's
    bound (its loop and order: gamma(chain + 4) of sum |w x|); each expert's |W| built once."""
    from .kernels import matvec as mv
    from .kernels import quantize_act as qa
    ref = np.zeros((len(pairs), M))
    mag = np.zeros((len(pairs), M))
    wmag = {}
    for n, (e, j) in enumerate(pairs):
        ref[n] = mv.matvec_q8_reference(w3[e], qt, M, K, xq2[j], xd2[j])
        if e not in wmag:
            wmag[e] = _int8_path_weight_mag(w3[e], qt, M, K)
        mag[n] = wmag[e] @ np.abs(qa.dequantize_act_q8(xq2[j], xd2[j]))
    h = _matvec_chain(qt, K) + 4
    return compare(name, qt.name, tag, got.reshape(len(pairs), M), ref,
                   MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                   guard_ok=guard_ok)


@check("token_matvec", "kernels.moe.launch_token_matvec")
def check_token_matvec(rng, size):
    """The int8 MoE block's matvec (matvec.token_kernel): y[t, r] = W[ids[t, r]] @ x_t(r) on
    int8 activations, each token's own (gate / up) or each expert's own row (down)."""
    from .kernels import moe
    from .kernels import quantize_act as qa
    for qt in _moe_q8_types(size):
        for per_expert in (False, True):
            T, E, k, H, F = _moe_dims(size)
            M, K = (H, F) if per_expert else (F, H)       # down [E, hidden, ffn] / gate [E, ffn, hidden]
            M = 3 if size == "tiny" else M
            w = _random_weight(rng, qt, E * M, K)
            rows = T * k if per_expert else T
            x = rng.standard_normal((rows, K)).astype(np.float32)
            xq, xd = qa.quantize_act_q8_reference(x)
            ids = _expert_ids(rng, T, E, k)
            ids[-1, -1] = E - 1
            tm = moe.token_matrix(_dev(w), qt, M, K, k=k)
            y = Out((T, k, M))
            moe.launch_token_matvec(tm, _dev(ids), True, k, tm.x_args(_dev(xq), _dev(xd)),
                                    per_expert, y.dev, T)
            got, guard_ok = y.get()
            pairs = [(ids[t, r], t * k + r if per_expert else t)
                     for t in range(T) for r in range(k)]
            yield _expert_rows_compare(
                "token_matvec", qt, f"T{T} k{k} {E}x{M}x{K}" + (" per-expert x" if per_expert
                                                                 else ""),
                got, w.reshape(E, M, -1), M, K, xq.reshape(rows, K), xd.reshape(rows, K // 32),
                pairs, guard_ok)


@check("group_matvec", "kernels.moe.launch_group_matvec")
def check_group_matvec(rng, size):
    """The expert-major MoE prefill's matvec (matvec.group_kernel): rows group_off[e] ..
    group_off[e + 1] of y against expert e's weights (one expert with none), each row's
    activations row src[i] of x (gate / up: the pair's token) or row i (down)."""
    from .kernels import moe
    from .kernels import quantize_act as qa
    for qt in _moe_q8_types(size):
        for per_row in (False, True):
            T, E, k, H, F = _moe_dims(size)
            E = min(E, 8)
            M, K = (H, F) if per_row else (F, H)
            M = 3 if size == "tiny" else M
            counts = rng.integers(0, 2 * T, E)
            counts[1] = 0
            R = int(counts.sum())
            off = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
            src = rng.integers(0, T, R).astype(np.int32)
            w = _random_weight(rng, qt, E * M, K)
            rows = R if per_row else T
            x = rng.standard_normal((rows, K)).astype(np.float32)
            xq, xd = qa.quantize_act_q8_reference(x)
            tm = moe.token_matrix(_dev(w), qt, M, K, k=k)
            y = Out((R, M))
            moe.launch_group_matvec(tm, _dev(off), None if per_row else _dev(src),
                                    tm.x_args(_dev(xq), _dev(xd)), y.dev, E, R)
            got, guard_ok = y.get()
            pairs = [(e, i if per_row else src[i])
                     for e in range(E) for i in range(int(off[e]), int(off[e + 1]))]
            yield _expert_rows_compare(
                "group_matvec", qt, f"E{E} R{R} {M}x{K}" + (" per-row x" if per_row else ""),
                got, w.reshape(E, M, -1), M, K, xq.reshape(rows, K), xd.reshape(rows, K // 32),
                pairs, guard_ok)


@check("group_matvec_pair", "kernels.moe.launch_group_matvec_pair")
def check_group_matvec_pair(rng, size):
    """The expert-major block's gate and up in one launch (matvec.group_pair_kernel): rows
    group_off[e] .. group_off[e + 1] of ya and yb against expert e of two stacks, each row's
    activations row src[i] of x (whole-warp rows: K of at least 17 chunks a row)."""
    from .kernels import moe
    from .kernels import quantize_act as qa
    from .quant import QType
    qt = QType.Q4_K
    T, E, k, H, F = _moe_dims(size)
    E = min(E, 8)
    M, K = (3, 1024) if size == "tiny" else (F, H)
    counts = rng.integers(0, 2 * T + 2, E)
    counts[1] = 0
    R = int(counts.sum())
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
    src = rng.integers(0, T, R).astype(np.int32)
    ws = [_random_weight(rng, qt, E * M, K) for _ in range(2)]
    x = rng.standard_normal((T, K)).astype(np.float32)
    xq, xd = qa.quantize_act_q8_reference(x)
    ta, tb = (moe.token_matrix(_dev(w), qt, M, K, k=k) for w in ws)
    if not moe._pairs_serve(ta, tb):
        raise RuntimeError(f"group_matvec_pair: {M} x {K} {qt.name} rows are not one warp each")
    ya, yb = Out((R, M)), Out((R, M))
    moe.launch_group_matvec_pair(ta, tb, _dev(off), _dev(src), ta.x_args(_dev(xq), _dev(xd)),
                                 ya.dev, yb.dev, E, R)
    pairs = [(e, src[i]) for e in range(E) for i in range(int(off[e]), int(off[e + 1]))]
    for w, y, which in zip(ws, (ya, yb), ("a", "b")):
        got, guard_ok = y.get()
        yield _expert_rows_compare(
            "group_matvec_pair", qt, f"E{E} R{R} {M}x{K} y{which}", got, w.reshape(E, M, -1),
            M, K, xq.reshape(T, K), xd.reshape(T, K // 32), pairs, guard_ok)


@check("token_tiles", "kernels.moe.launch_token_tiles")
def check_token_tiles(rng, size):
    """One matrix over T tokens in rows x tokens tiles (matvec.tile_kernel: the rows prefill's
    int8 matvecs, the prefill router): y[t] = W @ x_t (+ bias) (+ residual[t]), a part tile of
    tokens and a part block of rows."""
    from .kernels import matvec as mv
    from .kernels import moe
    from .kernels import quantize_act as qa
    T, E, k, H, F = _moe_dims(size)
    T = 11 if size == "tiny" else 37
    for qt in _moe_q8_types(size):
        M, K = (5, H) if size == "tiny" else (F, H)
        w = _random_weight(rng, qt, M, K)
        x = rng.standard_normal((T, K)).astype(np.float32)
        xq, xd = qa.quantize_act_q8_reference(x)
        bias = rng.standard_normal(M).astype(np.float32)
        res = rng.standard_normal((T, M)).astype(np.float32)
        tm = moe.token_matrix(_dev(w), qt, M, K)
        y = Out((T, M))
        moe.launch_token_tiles(tm, tm.x_args(_dev(xq), _dev(xd)), y.dev, T, nr=4, rows=3,
                               bias=_dev(bias), residual=_dev(res))
        got, guard_ok = y.get()
        xq2, xd2 = xq.reshape(T, K), xd.reshape(T, K // 32)
        ref = np.stack([mv.matvec_q8_reference(w, qt, M, K, xq2[t], xd2[t]) for t in range(T)])
        wmag = _int8_path_weight_mag(w, qt, M, K)
        mag = np.stack([wmag @ np.abs(qa.dequantize_act_q8(xq2[t], xd2[t])) for t in range(T)])
        ref = ref + _f64(bias) + _f64(res)
        mag = mag + np.abs(_f64(bias)) + np.abs(_f64(res))
        h = _matvec_chain(qt, K) + 6          # + the bias and residual adds
        yield compare("token_tiles", qt.name, f"T{T} {M}x{K} tiles 4x3 +bias +res", got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|·|",
                      guard_ok=guard_ok)


@check("moe_sort", "kernels.moe.launch_moe_sort")
def check_moe_sort(rng, size):
    """The expert-major prefill's sort (one block, a thread a pair): group_off, each pair's
    sorted row and each sorted row's token, against a stable numpy sort by expert -- over
    several rounds of the block where the pairs outnumber its threads."""
    from .kernels import moe
    T, E, k, H, F = _moe_dims(size)
    nt = moe.norm.pow2_block(E, moe.SORT_THREADS_MAX)    # the fewest threads that hold E
    for T_, threads in ((T + 5, None), (2 * nt // k + 3, nt)):
        ids = _expert_ids(rng, T_, E, k)
        n = T_ * k
        off, pos, src = (Out((E + 1,), np.uint32), Out((n,), np.int32), Out((n,), np.int32))
        moe.launch_moe_sort(_dev(ids), E, off.dev, pos.dev, src.dev, threads=threads)
        flat = ids.reshape(n)
        order = np.argsort(flat, kind="stable")
        want_pos = np.empty(n, np.int32)
        want_pos[order] = np.arange(n)
        want_off = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=E))])
        tag = f"T{T_} k{k} E{E}" + (f" {threads} threads" if threads else "")
        for what, o, want in (("group_off", off, want_off.astype(np.uint32)),
                              ("pos", pos, want_pos), ("src", src, (order // k).astype(np.int32))):
            got, guard_ok = o.get()
            yield compare(f"moe_sort {what}", "i32", tag, got, want, guard_ok=guard_ok)


@check("matmul_q8_grouped", "kernels.matmul_q8.launch_matmul_q8_grouped")
def check_matmul_q8_grouped(rng, size):
    """The MoE prefill's expert-major GEMM: rows group_off[e] .. group_off[e + 1] of Y against
    expert e's weights, each expert with its own count of rows (one with none)."""
    from .kernels import matmul_q8 as mq
    from .kernels import quantize_act as qa
    from .quant import QType
    types = [QType.Q4_K, QType.Q8_0] if size == "tiny" else list(mq.MATMUL_Q8_GROUPED)
    for qt in types:
        _, E, _, H, F = _moe_dims(size)
        E = min(E, 8)
        M, K = (3 if size == "tiny" else F), H
        if not _fits(qt, K):
            continue
        counts = rng.integers(0, 40, E)
        counts[1] = 0
        R = int(counts.sum())
        off = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        w = _random_weight(rng, qt, E * M, K)
        x = rng.standard_normal((R, K)).astype(np.float32)
        xq, xd = qa.quantize_act_q8_reference(x)
        xq, xd = xq.reshape(R, K), xd.reshape(R, K // 32)
        y = Out((R, M))
        mq.launch_matmul_q8_grouped(_dev(w), qt, E, M, K, _dev(xq), _dev(xd), _dev(off), y.dev,
                                    int(counts.max()))
        got, guard_ok = y.get()
        w3 = w.reshape(E, M, -1)
        ref = np.zeros((R, M))
        mag = np.zeros((R, M))
        xa = np.abs(qa.dequantize_act_q8(xq, xd)).reshape(R, K)
        for e in range(E):
            a, b = int(off[e]), int(off[e + 1])
            if a < b:
                ref[a:b] = mq.matmul_q8_reference(w3[e], qt, M, K, xq[a:b], xd[a:b])
                mag[a:b] = xa[a:b] @ _int8_path_weight_mag(w3[e], qt, M, K).T
        h = (2 if qt == QType.Q6_K else 1) * (K // 32) + 5    # matmul_q8's order
        yield compare("matmul_q8_grouped", qt.name, f"E{E} R{R} {M}x{K}", got, ref,
                      MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|wx|",
                      guard_ok=guard_ok)


def _mlp_error(x, gate, up, down, g_a):
    """(y, bound on |Δy|) for one SwiGLU MLP `down @ (silu(gate @ x) * (up @ x))` whose dots err
    by g_a relative to their magnitudes (first order): gate/up values err by g_a |W| |x|;
    silu' <= 1.1 carries the gate error into the activation, the up error scales with
    |silu(g)|, and silu * up rounds ~7 u; the down dot adds its own g_a |W| |act|."""
    from .reference import ops
    ax = np.abs(x)
    g, u = gate @ x, up @ x
    dg, du = g_a * (np.abs(gate) @ ax), g_a * (np.abs(up) @ ax)
    s = _f64(ops.silu(g))
    act = s * u
    dact = 1.1 * dg * np.abs(u) + np.abs(s) * du + dg * du + 7 * U * np.abs(act)
    y = down @ act
    dy = np.abs(down) @ dact + g_a * (np.abs(down) @ np.abs(act))
    return y, dy


@check("moe_block", "kernels.moe.launch_moe_block")
def check_moe_block(rng, size):
    """The whole sparse MoE block (router, k experts, combine, gated shared expert) against
    moe_forward on the dequantized weights, decode (T = 1, matvecs) and prefill (matmuls)."""
    from .kernels import moe
    from .quant import QType, dequantize, quantize
    from .reference.moe import moe_forward, route
    if size == "tiny":
        # F16 (blocks of one value) lets the simulator run a narrow block: every projection's
        # type path is checked on its own above, this row checks the wiring
        E, k, H, I, Is, wt, Ts = 4, 2, 16, 8, 8, QType.F16, (1,)
    else:
        E, k, H, I, Is, wt, Ts = MOE.n_experts, MOE.top_k, MOE.hidden, MOE.expert_ffn, 512, \
            QType.Q4_K, (1, 4)
    raw, deq = {}, {}
    for name, shape in (("gate", (E, I, H)), ("up", (E, I, H)), ("down", (E, H, I)),
                        ("sh_gate", (Is, H)), ("sh_up", (Is, H)), ("sh_down", (H, Is))):
        rows = int(np.prod(shape[:-1]))
        raw[name] = _random_weight(rng, wt, rows, shape[-1])
        deq[name] = dequantize(raw[name], wt, shape)
    # x is drawn with this scale so that the expert pre-activations are O(1), as in a trained
    # model (random block weights are far from unit scale; silu of a -1000 is not a test)
    w_rms = float(np.sqrt(np.mean(np.square(deq["gate"][:2], dtype=np.float64))))
    x_scale = 1 / (math.sqrt(H) * w_rms)
    # router and shared-expert gate in F32, as llama.cpp stores ffn_gate_inp; logits ~N(0, 4)
    for name, shape in (("router", (E, H)), ("sh_gate_inp", (1, H))):
        deq[name] = (2 * w_rms * rng.standard_normal(shape)).astype(np.float32)
        raw[name] = quantize(deq[name], QType.F32)
    dev = {n: _dev(a) for n, a in raw.items()}
    w = moe.ExpertWeights(
        n_experts=E, top_k=k, hidden=H, ffn=I, norm_topk_prob=True,
        router=dev["router"], router_type=QType.F32, gate=dev["gate"], gate_type=wt,
        up=dev["up"], up_type=wt, down=dev["down"], down_type=wt, shared_ffn=Is,
        sh_gate=dev["sh_gate"], sh_gate_type=wt, sh_up=dev["sh_up"], sh_up_type=wt,
        sh_down=dev["sh_down"], sh_down_type=wt, sh_gate_inp=dev["sh_gate_inp"],
        sh_gate_inp_type=QType.F32)
    # float64 copies for the bound; the expert stacks are converted one expert at a time
    d64 = {n: _f64(deq[n]) for n in ("router", "sh_gate", "sh_up", "sh_down", "sh_gate_inp")}
    for T in Ts:
        # Each dot errs <= g_a relative to its magnitude: the kernel's chain (matvec for T = 1,
        # the sequential matmul for T > 1) plus the reference's own (`linear` runs float32 BLAS
        # for big weights: gamma_K) plus its float32 rounding.
        g_a = gamma(max(_matvec_chain(wt, max(H, I)), max(H, I) + 2)) + gamma(max(H, I)) + U
        # Routing must not sit on a knife edge (two experts within rounding of the k-th place):
        # redraw x until the reference's top-k boundary is clear of the logits' error.
        for _ in range(20):
            x = (x_scale * rng.standard_normal((T, H))).astype(np.float32)
            logits = _f64(x) @ d64["router"].T
            dl = g_a * (np.abs(_f64(x)) @ np.abs(d64["router"]).T)
            srt = np.sort(logits, axis=1)[:, ::-1]
            if np.all(srt[:, k - 1] - srt[:, k] > 8 * dl.max()):
                break
        y = Out((T, H))
        launch_scratch = moe.MoEScratch(T, w)
        moe.launch_moe_block(_dev(x), w, launch_scratch, y.dev)
        got, guard_ok = y.get()
        ref = moe_forward(x, deq["router"], (deq["gate"], deq["up"], deq["down"]), k, True,
                          shared=(deq["sh_gate"], deq["sh_up"], deq["sh_down"]),
                          shared_gate_w=deq["sh_gate_inp"])
        # Bound: each expert's MLP (_mlp_error); router weights err relatively by
        # _route_rel + 2 max|Δlogit| (a logit error e moves a softmax ratio by <= 2e, doubled
        # by the renormalisation); the rank-order combine 2k roundings; the shared expert with
        # its sigmoid gate (|sigmoid'| <= 1/4) and the final adds.
        ref_ids, ref_w = route(x, deq["router"], k, True)
        wrel = _route_rel(E, moe._router_threads(E), k, float(np.ptp(logits, axis=1).max())) \
            + 4 * dl.max()
        bound = np.zeros((T, H))
        for t in range(T):
            xt = _f64(x[t])
            acc_mag = np.zeros(H)
            for r in range(k):
                e = ref_ids[t, r]
                ye, dye = _mlp_error(xt, _f64(deq["gate"][e]), _f64(deq["up"][e]),
                                     _f64(deq["down"][e]), g_a)
                bound[t] += ref_w[t, r] * dye + wrel * ref_w[t, r] * np.abs(ye)
                acc_mag += ref_w[t, r] * np.abs(ye)
            ys, dys = _mlp_error(xt, d64["sh_gate"], d64["sh_up"], d64["sh_down"], g_a)
            ls = float(d64["sh_gate_inp"][0] @ xt)
            sg = 1 / (1 + math.exp(-ls))
            dls = g_a * float(np.abs(d64["sh_gate_inp"][0]) @ np.abs(xt))
            bound[t] += sg * dys + (0.25 * dls + 5 * U * sg) * np.abs(ys)
            bound[t] += gamma(2 * k + 4) * (acc_mag + sg * np.abs(ys))
        ids_ok = np.array_equal(launch_scratch.ids.copy_to_host(), ref_ids)
        yield compare("moe_block", wt.name, f"T{T} E{E} k{k} H{H} I{I}", got, ref,
                      MARGIN * bound + U * np.abs(_f64(ref)) + TINY_NORMAL,
                      f"{MARGIN:g}·Σ stage bounds", guard_ok=guard_ok,
                      problems=["" if ids_ok else "router picked other experts than route()"])


@check("moe_combine", "kernels.moe.launch_moe_combine")
def check_moe_combine(rng, size):
    """y[t] = sum_r w_r yd[t, r] (rank order) + sigmoid(g) shared_y + residual."""
    from .kernels import moe
    from .reference import ops
    T, _, k, H, _ = _moe_dims(size)
    yd = rng.standard_normal((T, k, H)).astype(np.float32)
    wts = rng.uniform(0.05, 1.0, (T, k)).astype(np.float32)
    sy = rng.standard_normal((T, H)).astype(np.float32)
    sg = (2 * rng.standard_normal((T, 1))).astype(np.float32)
    res = rng.standard_normal((T, H)).astype(np.float32)
    y = Out((T, H))
    moe.launch_moe_combine(_dev(yd), _dev(wts), y.dev, _dev(sy), _dev(sg), _dev(res))
    got, guard_ok = y.get()
    sig = _f64(ops.sigmoid(sg))
    ref = np.einsum("tr,trh->th", _f64(wts), _f64(yd)) + sig * sy + res
    mag = np.einsum("tr,trh->th", _f64(wts), np.abs(_f64(yd))) + sig * np.abs(sy) + np.abs(res)
    h = 2 * k + 8                     # the k products and adds, the sigmoid gate, two adds
    yield compare("moe_combine", "f32", f"T{T} k{k} H{H}", got, ref,
                  MARGIN * gamma(h) * mag + TINY_NORMAL, f"{MARGIN:g}γ{h}·Σ|·|",
                  guard_ok=guard_ok)


def _moe_q8_block_rows(rng, size, mode):
    """The int8 MoE block (moe.launch_moe_block_q8, mode "tokens"; or an expert-major prefill:
    on the int8 GEMM, "grouped", or on the decode kernels, "expert_rows"), stage by
    stage against the references, each stage fed the device's own output of the stage before
    (so every bound is a single kernel's): the routing (route() on x), the k gate / up dots
    (matvec_q8_reference on the int8 input), the down dots (on the block's own int8
    activations), the shared expert's down dot, and the combine."""
    from .kernels import matvec as mv
    from .kernels import moe
    from .kernels import quantize_act as qa
    from .quant import QType, dequantize, quantize
    from .reference import ops
    from .reference.moe import route
    grouped = mode == "grouped"             # the GEMM's summation order
    sorted_rows = mode != "tokens"          # rows in moe_sort's order
    name = "moe_block_q8" + ("" if mode == "tokens" else "_" + mode)
    if size == "tiny":
        E, k, H, F, Is, wt, Ts = 4, 2, 256, 256, 256, QType.Q4_K, \
            ((2,) if sorted_rows else (1, 2))
    else:
        E, k, H, F, Is, wt, Ts = MOE.n_experts, MOE.top_k, MOE.hidden, MOE.expert_ffn, 512, \
            QType.Q4_K, ((64,) if sorted_rows else (1, 4))
    scratch, block = {"tokens": (moe.MoEScratchQ8, moe.launch_moe_block_q8),
                      "grouped": (moe.MoEScratchGrouped, moe.launch_moe_block_q8_grouped),
                      "expert_rows": (moe.MoEScratchExpertRows,
                                      moe.launch_moe_block_q8_expert_rows)}[mode]
    raw = {n: _random_weight(rng, wt, int(np.prod(sh[:-1])), sh[-1]) for n, sh in (
        ("gate", (E, F, H)), ("up", (E, F, H)), ("down", (E, H, F)), ("sh_gate", (Is, H)),
        ("sh_up", (Is, H)), ("sh_down", (H, Is)))}
    router = rng.standard_normal((E, H)).astype(np.float32)
    sh_inp = rng.standard_normal((1, H)).astype(np.float32)
    dev = {n: _dev(a) for n, a in raw.items()}
    w = moe.ExpertWeights(
        n_experts=E, top_k=k, hidden=H, ffn=F, norm_topk_prob=True,
        router=_dev(quantize(router, QType.F32)), router_type=QType.F32, gate=dev["gate"],
        gate_type=wt, up=dev["up"], up_type=wt, down=dev["down"], down_type=wt, shared_ffn=Is,
        sh_gate=dev["sh_gate"], sh_gate_type=wt, sh_up=dev["sh_up"], sh_up_type=wt,
        sh_down=dev["sh_down"], sh_down_type=wt, sh_gate_inp=_dev(quantize(sh_inp, QType.F32)),
        sh_gate_inp_type=QType.F32)
    q = moe.expert_matrices_q8(w)
    w3 = {n: raw[n].reshape(E, -1, raw[n].shape[-1]) for n in ("gate", "up", "down")}
    # x at the scale that makes the pre-activations O(1) (check_moe_block's reason)
    w_rms = float(np.sqrt(np.mean(np.square(dequantize(w3["gate"][0], wt, (F, H)), dtype=np.float64))))
    x_scale = 1 / (math.sqrt(H) * w_rms)

    def dot_bound(wraw, M, K, xq, xd, h):
        xa = np.abs(qa.dequantize_act_q8(xq, xd))
        return MARGIN * gamma(h) * (_int8_path_weight_mag(wraw, wt, M, K) @ xa) + TINY_NORMAL

    h_mv = _matvec_chain(wt, max(H, F)) + 4
    for T in Ts:
        x = (x_scale * rng.standard_normal((T, H))).astype(np.float32)
        xq, xd = qa.quantize_act_q8_reference(x)
        s = scratch(T, w)
        res = rng.standard_normal((T, H)).astype(np.float32)
        y = Out((T, H))
        y.dev.copy_to_device(res)
        block(_dev(x), _dev(xq), _dev(xd), w, q, s, y.dev, residual=y.dev)
        got, guard_ok = y.get()
        tag = f"T{T} E{E} k{k} H{H} F{F}"
        ids = s.ids.copy_to_host()
        wts = s.weights.copy_to_host()
        ref_ids, ref_w = route(x, router, k, True)
        yield compare(name + " ids", "i32", tag, ids, ref_ids.astype(np.int32))
        yield compare(name + " weights", "f32", tag, wts, ref_w, 64 * U * np.abs(ref_w) + TINY_NORMAL,
                      "64u·|w|")
        # row of (t, r) in the block's buffers: t k + r, or its sorted row (expert-major)
        pos = s.pos.copy_to_host() if sorted_rows else np.arange(T * k)
        gate = s.gate.copy_to_host().reshape(T * k, F)
        up = s.up.copy_to_host().reshape(T * k, F)
        yd = s.yd.copy_to_host().reshape(T * k, H)
        aq = s.act_q.copy_to_host().reshape(T * k, F)
        ad = s.act_d.copy_to_host().reshape(T * k, F // 32)
        xq2, xd2 = xq.reshape(T, H), xd.reshape(T, H // 32)
        h_g = H // 32 + 5 if grouped else h_mv          # matmul_q8's chain, or the matvec's
        h_d = F // 32 + 5 if grouped else h_mv
        rows = {n: np.zeros((T * k, M)) for n, M in (("gate", F), ("up", F), ("down", H))}
        bnds = {n: np.zeros((T * k, M)) for n, M in (("gate", F), ("up", F), ("down", H))}
        for t in range(T):
            for r in range(k):
                e, i = ref_ids[t, r], pos[t * k + r]
                for n in ("gate", "up"):
                    rows[n][i] = mv.matvec_q8_reference(w3[n][e], wt, F, H, xq2[t], xd2[t])
                    bnds[n][i] = dot_bound(w3[n][e], F, H, xq2[t], xd2[t], h_g)
                rows["down"][i] = mv.matvec_q8_reference(w3["down"][e], wt, H, F, aq[i], ad[i])
                bnds["down"][i] = dot_bound(w3["down"][e], H, F, aq[i], ad[i], h_d)
        for n, dv in (("gate", gate), ("up", up), ("down", yd)):
            yield compare(f"{name} {n}", wt.name, tag, dv, rows[n], bnds[n], "2γh·Σ|wx|")
        # the shared expert's down dot on its own int8 activations, and the combine
        shq = s.sh_q.copy_to_host().reshape(T, Is)
        shd = s.sh_d.copy_to_host().reshape(T, Is // 32)
        shy = s.sh_y.copy_to_host()
        sh_ref = np.stack([mv.matvec_q8_reference(raw["sh_down"], wt, H, Is, shq[t], shd[t])
                           for t in range(T)])
        h_s = Is // 32 + 5 if grouped else _matvec_chain(wt, Is) + 4
        sh_b = np.stack([dot_bound(raw["sh_down"], H, Is, shq[t], shd[t], h_s) for t in range(T)])
        yield compare(f"{name} shared", wt.name, tag, shy, sh_ref, sh_b, "2γh·Σ|wx|")
        sig = _f64(ops.sigmoid(s.sh_logit.copy_to_host()))
        ydk = _f64(yd)[pos].reshape(T, k, H)
        ref = np.einsum("tr,trh->th", _f64(wts), ydk) + sig * shy + res
        mag = np.einsum("tr,trh->th", _f64(wts), np.abs(ydk)) + sig * np.abs(shy) + np.abs(res)
        yield compare(name, wt.name, tag, got, ref, MARGIN * gamma(2 * k + 8) * mag + TINY_NORMAL,
                      f"{MARGIN:g}γ{2 * k + 8}·Σ|·|", guard_ok=guard_ok)


@check("moe_block_q8", "kernels.moe.launch_moe_block_q8")
def check_moe_block_q8(rng, size):
    yield from _moe_q8_block_rows(rng, size, "tokens")


@check("moe_block_q8_grouped", "kernels.moe.launch_moe_block_q8_grouped")
def check_moe_block_q8_grouped(rng, size):
    yield from _moe_q8_block_rows(rng, size, "grouped")


@check("moe_block_q8_expert_rows", "kernels.moe.launch_moe_block_q8_expert_rows")
def check_moe_block_q8_expert_rows(rng, size):
    yield from _moe_q8_block_rows(rng, size, "expert_rows")


# ------------------------------------------------------------------ running


def launcher_names() -> dict[str, Callable]:
    """Every `launch_*` function defined in a module of bw24nb.kernels or bw24nb.cache,
    as {"kernels.norm.launch_rms_norm": function}."""
    import importlib
    import pkgutil
    found = {}
    for pkg_name in ("bw24nb.kernels", "bw24nb.cache"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg_name}.{info.name}")
            for attr, obj in vars(mod).items():
                if attr.startswith("launch_") and callable(obj) \
                        and getattr(obj, "__module__", None) == mod.__name__:
                    found[f"{mod.__name__.removeprefix('bw24nb.')}.{attr}"] = obj
    return found


def select(only: str | None) -> list[Check]:
    """Checks selected by comma-separated glob patterns over their names: those matching any
    plain pattern (every check if there is none), minus those matching a `!pattern`.
    E.g. "matvec*,matmul" or "!matvec*,!matmul" (the rest)."""
    pats = [p.strip() for p in (only or "").split(",") if p.strip()]
    include = [p for p in pats if not p.startswith("!")]
    exclude = [p[1:] for p in pats if p.startswith("!")]
    return [c for c in REGISTRY.values()
            if (not include or any(fnmatch.fnmatchcase(c.name, p) for p in include))
            and not any(fnmatch.fnmatchcase(c.name, p) for p in exclude)]


def _seeded(seed: int, name: str):
    # one generator per check, from the run's seed and the check's name: `--only` replays
    # exactly the inputs the full run drew
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def run_checks(size: str = "tiny", seed: int | None = None, only: str | None = None,
               on_row: Callable[[Row], None] | None = None,
               on_error: Callable[[str, str], None] | None = None) -> list[Row]:
    """Run the selected checks at `size` ("tiny" | "real") with `seed`; returns every row
    (`on_row` sees each as it is produced). A check that raises yields one FAIL row (and
    `on_error(name, traceback)`), and the run goes on."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if seed is None:
        seed = new_seed()
    rows = []
    for c in select(only):
        try:
            for row in c.fn(_seeded(seed, c.name), size):
                rows.append(row)
                if on_row:
                    on_row(row)
        except Exception as e:            # a crash is a failure of that kernel, not of the run
            row = Row(c.name, "-", "-", math.nan, math.nan, "-", math.nan, False,
                      f"raised {type(e).__name__}: {e}".splitlines()[0])
            rows.append(row)
            if on_error:
                on_error(c.name, traceback.format_exc())
            if on_row:
                on_row(row)
    return rows


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


TABLE_HEADER = (f"{'kernel':<26} {'type':<14} {'shape':<32} {'max_abs':>9} {'max_rel':>9} "
                f"{'tol':<28} {'err/tol':>7}  result")


def _num(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if math.isinf(v):
        return "inf"
    return "0" if v == 0 else f"{v:.2e}"


def format_row(r: Row) -> str:
    ratio = "-" if math.isnan(r.ratio) else ("inf" if math.isinf(r.ratio) else
                                              ("0" if r.ratio == 0 else f"{r.ratio:.3f}"))
    line = (f"{r.kernel:<26} {r.dtype:<14} {r.shape:<32} {_num(r.max_abs):>9} {_num(r.max_rel):>9} "
            f"{r.tol:<28} {ratio:>7}  {'PASS' if r.passed else 'FAIL'}")
    if r.detail:
        line += f"\n{'':<4}^ {r.detail}"
    return line


def main(size: str = "auto", seed: int | None = None, only: str | None = None,
         out=None, err=None, types: str | None = None) -> int:
    """What `bw24nb kernel-check` runs: the table, then `kernel-check: N passed, M failed`.
    types: comma list of weight type names the per-type checks run (default all).
    Returns the exit status (1 on any failure, 2 when nothing matched `only`, or a type name
    is unknown)."""
    from .device import gpu_present, simulator_enabled
    out = out or sys.stdout
    err = err or sys.stderr
    gpu = gpu_present()
    if not gpu and not simulator_enabled():
        # No GPU: run the kernels in numba's simulator. numba.cuda reads the switch when it is
        # first imported; if something imported it already, start afresh in a subprocess.
        if "numba.cuda" in sys.modules:
            import subprocess
            argv = [sys.executable, "-m", "bw24nb.cli", "kernel-check", "--size", size]
            argv += [] if seed is None else ["--seed", str(seed)]
            argv += [] if only is None else ["--only", only]
            argv += [] if types is None else ["--types", types]
            return subprocess.call(argv, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if size == "auto":
        size = "real" if gpu else "tiny"
    if size == "real" and not gpu:
        print("error: --size real needs a GPU (the simulator would take hours at real shapes); "
              "use --size tiny", file=err)
        return 2
    checks = select(only)
    if not checks:
        print(f"error: no kernel check matches {only!r}; checks: {', '.join(REGISTRY)}", file=err)
        return 2
    global TYPES
    TYPES = None
    if types is not None:
        from .quant import QType
        names = {t.strip().upper() for t in types.split(",") if t.strip()}
        unknown = sorted(names - set(QType.__members__))
        if unknown or not names:
            print(f"error: --types {types!r}: unknown weight types {unknown}; known: "
                  f"{', '.join(QType.__members__)}", file=err)
            return 2
        TYPES = frozenset(names)
    seed = new_seed() if seed is None else int(seed)
    where = "simulator" if simulator_enabled() else ("GPU" if gpu else "CPU")
    print(f"kernel-check: size {size}, seed {seed} (replay: --seed {seed}), {len(checks)} "
          f"checks on the {where}", file=out)
    print(TABLE_HEADER, file=out)
    t0 = time.perf_counter()

    def show(row):
        print(format_row(row), file=out, flush=True)

    def crashed(name, tb):
        print(f"kernel-check: {name} raised:\n{tb}", file=err, flush=True)

    rows = run_checks(size, seed, only, on_row=show, on_error=crashed)
    n_fail = sum(not r.passed for r in rows)
    print(f"kernel-check: {len(rows)} rows in {time.perf_counter() - t0:.1f} s "
          f"(replay: --seed {seed})", file=out)
    print(f"kernel-check: {len(rows) - n_fail} passed, {n_fail} failed", file=out)
    return 1 if n_fail else 0
