"""The KV cache of the full-attention layers: layout, quantizing store kernel, VRAM size.

Layout (the one definition every attention kernel reads through `kv_load`)
-------------------------------------------------------------------------
One uint8 device array per tensor (K and V), shape

    [n_slots, n_kv_heads, ctx, row_bytes(qtype, head_dim)]

i.e. layer slot → KV head → position → the head's `head_dim` values as GGUF blocks of 32
(llama.cpp's `block_q8_0` / `block_q5_1` bytes, or plain little-endian f16). A slot is a model
layer that has softmax attention (hybrid Qwen3.5/Next models have KV only on every 4th layer),
see `attention_layers`. Positions of one head are contiguous, so a key tile of a head is one
contiguous byte range and a split of the context is a contiguous slice.

Defaults: K in Q8_0 (8.5 bits/value), V in Q5_1 (6 bits/value): K feeds a softmax whose
exponent amplifies errors, V only a convex combination, so V tolerates the coarser type.
F16 is selectable for either.

The rows are GGUF's block bytes rather than a split-plane repack so that the host codecs in
`bw24nb.quant` (the oracle) read and write the cache as is, and one array per tensor keeps the
kernel signatures uniform across types. The price: a Q8_0 block is 34 bytes, so its quants are
not 4-byte aligned and the kernels load them one byte at a time. A split-plane layout (int8
quants [.., ctx, D] + f16 scales [.., ctx, D/32]) is the known next step if decode attention at
long context turns out to be load-bound.

Kernels receive each tensor twice: the uint8 array and a float16 *view of the same memory*
(`bytes.view(np.float16)`, last axis halved), so a block's f16 scale is one 2-byte load and a
`cvt.f32.f16` instead of byte assembly. Q8_0 block b's scale is f16 element 17*b, Q5_1's d and m
are f16 elements 12*b and 12*b+1 (34 and 24 are even, so every block starts 2-byte aligned).

Writing: `kv_store` encodes one tensor's fresh rows at positions read from a device array;
`kv_store_rope` (what `KVCache.store` launches) does a layer's K and V in one launch and applies
K's RoPE on the way in, so the rotated K never round-trips through memory (attention reads K
from the cache). One block per (token, head) row, one thread per value: each thread rotates and
quantizes its own element; the Q5_1 high bits are gathered through shared memory.

Reference: `bw24nb.quant.quantize` / `dequantize` (llama.cpp's quantize_row_*_ref), which
`kv_store` matches byte for byte when run in float32 without FMA contraction (the simulator);
on the GPU NVVM may fuse `(x - min) * id + 0.5` of Q5_1 into an FMA, which can move a value
lying exactly on a rounding boundary by one step.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from ..jit import kernel
from ..formats.config import FULL_ATTENTION
from ..kernels.quantize_act import round_half_away
from ..kernels.rope import roped_value, rotate_pair
from ..quant.types import QType, row_bytes

# Cache types a kernel can read and write. Module-level ints: numba freezes them into the
# kernels as constants, so the `if qtype == _Q8_0` chains cost a uniform branch.
KV_TYPES = (QType.Q8_0, QType.Q5_1, QType.F16)
_Q8_0 = int(QType.Q8_0)
_Q5_1 = int(QType.Q5_1)
_F16 = int(QType.F16)
QK = 32                       # values per Q8_0 / Q5_1 block (and per store-kernel thread)
# An F16 cache has no blocks: a store thread writes F16_GROUP values, so any head_dim that is a
# multiple of 8 works (the tiny test models have head_dim 16 or 24).
F16_GROUP = 8

# F16 K and V by default (docs/decisions/0011): exact to the stored values, what llama.cpp's
# baseline runs, and read by decode_attention.py's 16-byte-load split pass; Q8_0 K / Q5_1 V
# (`--kv-cache q8`) halves the cache for long contexts on small cards.
K_TYPE_DEFAULT = QType.F16
V_TYPE_DEFAULT = QType.F16
# The (K type, V type) pairs a user names (`--kv-cache`, bench/ --kv-cache / --kv), default first
KV_CACHE_KINDS = {"f16": (QType.F16, QType.F16), "q8": (QType.Q8_0, QType.Q5_1)}

# Store kernels: one block per (token, KV head), one thread per value (a decode step stores only
# n_kv_heads rows: a thread per 32-value block, as first written, left 8 threads doing 32 serial
# RoPE + encode steps each -- 18 us a launch on the H200). Shared arrays sized for the largest
# head.
HEAD_DIM_MAX = 256


# ------------------------------------------------------------------ sizes


def attention_layers(config) -> list[int]:
    """Model layer indices that have softmax attention and therefore a KV cache slot."""
    return [i for i in range(config.num_hidden_layers) if config.layer_type(i) == FULL_ATTENTION]


def kv_row_bytes(qtype, head_dim: int) -> int:
    """Bytes of one head's K or V row at one position."""
    qt = QType(int(qtype))
    if qt not in KV_TYPES:
        raise ValueError(f"KV cache type {qt.name} not supported; choose one of "
                         + ", ".join(t.name for t in KV_TYPES))
    group = _host_group(qt)
    if head_dim % group:
        raise ValueError(f"head_dim {head_dim} must be a multiple of {group} for a {qt.name} "
                         f"KV cache" + (" (use F16 for narrower heads)" if qt != QType.F16 else ""))
    return row_bytes(qt, head_dim)


def _host_group(qt) -> int:
    """Values one store thread encodes: a whole block for Q8_0/Q5_1, F16_GROUP for F16."""
    return F16_GROUP if int(qt) == _F16 else QK


def kv_cache_bytes(config, ctx: int, k_type=K_TYPE_DEFAULT, v_type=V_TYPE_DEFAULT,
                   extra_layers: int = 0) -> int:
    """Device bytes of the K and V caches for `ctx` positions (for the VRAM budget).

    `extra_layers` adds attention layers outside `num_hidden_layers` (an MTP head's layer)."""
    n_slots = len(attention_layers(config)) + extra_layers
    per_pos = kv_row_bytes(k_type, config.head_dim) + kv_row_bytes(v_type, config.head_dim)
    return n_slots * config.num_key_value_heads * ctx * per_pos


# ------------------------------------------------------------------ device helpers


@cuda.jit(device=True)
def f16_at(rows_f16, h, pos, i):
    return float32(rows_f16[h, pos, i])


@cuda.jit(device=True)
def kv_load(rows_u8, rows_f16, qtype, h, pos, e):
    """Value `e` (0 <= e < head_dim) of head `h` at position `pos`, dequantized to float32.

    Same float32 operations as bw24nb.quant's decoders: Q8_0 `d * q`, Q5_1 `d * q + m`."""
    b = e >> 5
    j = e & 31
    if qtype == _Q8_0:
        q = int32(rows_u8[h, pos, b * 34 + 2 + j])
        if q > 127:
            q -= 256
        return f16_at(rows_f16, h, pos, b * 17) * float32(q)
    elif qtype == _Q5_1:
        base = b * 24
        hbit = (int32(rows_u8[h, pos, base + 4 + (j >> 3)]) >> (j & 7)) & 1
        byte = int32(rows_u8[h, pos, base + 8 + (j & 15)])
        if j < 16:
            nib = byte & 15
        else:
            nib = byte >> 4
        d = f16_at(rows_f16, h, pos, b * 12)
        m = f16_at(rows_f16, h, pos, b * 12 + 1)
        return d * float32(nib | (hbit << 4)) + m
    else:
        return f16_at(rows_f16, h, pos, e)


@cuda.jit(device=True, inline="always")
def _group(qtype):
    if qtype == _F16:
        return F16_GROUP
    return QK


@cuda.jit(device=True, inline="always")
def _encode_row(vals, qs, e, D, h, pos, qtype, rows_u8, rows_f16):
    """Thread e's part of encoding the row vals[0:D] (shared) at (h, pos). Every thread of the
    block calls it (it holds a barrier); threads e >= D only take part in the barrier.
    Thread e quantizes element e: the block's amax (or min/max) is re-derived by each of its
    32 threads from shared memory (broadcast reads; max/min are exact in any order), so the
    arithmetic per element is the host codec's, and results match it byte for byte."""
    live = e < D
    blk = e // QK
    j = e - blk * QK
    first = blk * QK
    if qtype == _Q8_0:
        if live:
            amax = float32(0.0)
            for i in range(QK):
                a = abs(vals[first + i])
                if a > amax:
                    amax = a
            d = amax / float32(127.0)
            inv = float32(0.0)
            if d != float32(0.0):
                inv = float32(1.0) / d
            if j == 0:
                rows_f16[h, pos, blk * 17] = d        # cvt.rn.f16.f32, as numpy's astype(f16)
            q = int32(round_half_away(vals[e] * inv))
            rows_u8[h, pos, blk * 34 + 2 + j] = q & 255
    elif qtype == _Q5_1:
        if live:
            lo = vals[first]
            hi = lo
            for i in range(1, QK):
                v = vals[first + i]
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
            d = (hi - lo) / float32(31.0)
            inv = float32(0.0)
            if d != float32(0.0):
                inv = float32(1.0) / d
            qs[e] = min(31, int32((vals[e] - lo) * inv + float32(0.5)))
            if j == 0:
                rows_f16[h, pos, blk * 12] = d
                rows_f16[h, pos, blk * 12 + 1] = lo
        cuda.syncthreads()
        if live:
            base = blk * 24
            if j < 16:      # byte j: element j's low nibble, element j + 16's in the high one
                rows_u8[h, pos, base + 8 + j] = (qs[e] & 15) | ((qs[e + 16] & 15) << 4)
            elif j < 20:    # qh byte j - 16: the fifth bits of elements 8(j-16) .. +7
                k0 = first + 8 * (j - 16)
                hb = int32(0)
                for i in range(8):
                    hb |= ((qs[k0 + i] >> 4) & 1) << i
                rows_u8[h, pos, base + 4 + (j - 16)] = hb
    else:
        if live:
            rows_f16[h, pos, e] = vals[e]


# ------------------------------------------------------------------ kernels


@kernel
def kv_store(x, positions, qtype, rows_u8, rows_f16):
    """Write x[t, h, :] (float32 [T, n_kv_heads, head_dim]) at position positions[t] of head h,
    encoded as `qtype`. Block (t, h), thread e = element e. Positions outside [0, ctx) are
    skipped (the engine raises ContextOverflow before that can happen)."""
    vals = cuda.shared.array(HEAD_DIM_MAX, float32)
    qs = cuda.shared.array(HEAD_DIM_MAX, int32)
    T, H, D = x.shape
    t = cuda.blockIdx.x // H
    h = cuda.blockIdx.x - t * H
    e = cuda.threadIdx.x
    pos = positions[t]
    if pos < 0 or pos >= rows_u8.shape[1]:      # uniform over the block: no barrier is skipped
        return
    if e < D:
        vals[e] = x[t, h, e]
    cuda.syncthreads()
    _encode_row(vals, qs, e, D, h, pos, qtype, rows_u8, rows_f16)


@kernel
def kv_store_rope(k, v, q, positions, inv_freq, k_type, k_u8, k_f16, v_type, v_u8, v_f16):
    """One launch for a layer's fresh K and V (and the RoPE of Q): K gets NEOX RoPE (table
    `inv_freq`, rotary_dim = 2 * len(inv_freq); an empty table means no RoPE) on the fly, then
    both are encoded at positions[t]. The rotated K exists only in the cache: attention reads
    K from there. Grid (T * HB, 2 or 3), HB = max(H, Hq): y = 0 stores K head, y = 1 V head
    (blocks past H leave), y = 2 rotates query head q[t, h] in place, rope.rope_neox's
    arithmetic pair for pair (a launch fewer a layer than a separate rope_q); thread e =
    element e (pair e for q)."""
    vals = cuda.shared.array(HEAD_DIM_MAX, float32)
    qs = cuda.shared.array(HEAD_DIM_MAX, int32)
    T, H, D = k.shape
    HB = cuda.gridDim.x // T
    t = cuda.blockIdx.x // HB
    h = cuda.blockIdx.x - t * HB
    e = cuda.threadIdx.x
    if cuda.blockIdx.y == 2:
        half = inv_freq.shape[0]
        if h < q.shape[1] and e < half:
            rotate_pair(q, t, h, e, half, float32(positions[t]) * inv_freq[e])
        return
    pos = positions[t]
    if h >= H or pos < 0 or pos >= k_u8.shape[1]:
        return
    if cuda.blockIdx.y == 1:
        if e < D:
            vals[e] = v[t, h, e]
        cuda.syncthreads()
        _encode_row(vals, qs, e, D, h, pos, v_type, v_u8, v_f16)
    else:
        if e < D:
            vals[e] = roped_value(k, t, h, e, inv_freq.shape[0], float32(pos), inv_freq)
        cuda.syncthreads()
        _encode_row(vals, qs, e, D, h, pos, k_type, k_u8, k_f16)


def _store_threads(D: int) -> int:
    """One thread per value, rounded up to whole warps."""
    return 32 * ((D + 31) // 32)


def _check_rows(x, qtype, rows_u8):
    T, H, D = x.shape
    if D > HEAD_DIM_MAX:
        raise ValueError(f"head_dim {D} exceeds the store kernel's {HEAD_DIM_MAX}")
    if D % _host_group(qtype):
        raise ValueError(f"head_dim {D} must be a multiple of {_host_group(qtype)} for "
                         f"{QType(int(qtype)).name}")
    if rows_u8.shape[0] != H or rows_u8.shape[2] != kv_row_bytes(qtype, D):
        raise ValueError(f"cache rows {tuple(rows_u8.shape)} do not fit x {tuple(x.shape)} "
                         f"as {QType(int(qtype)).name}")
    return T * H * (D // _host_group(qtype))


def launch_kv_store(x, positions, qtype, rows_u8, rows_f16, stream=0):
    """Quantize K or V rows `x[T, Hkv, D]` into one layer's cache (`rows_u8[Hkv, ctx, RB]` and
    its f16 view) at `positions[T]` (int32 device array, read on the device so one captured
    graph serves every decode step). Reference: bw24nb.quant.quantize(x, qtype) per row."""
    _check_rows(x, qtype, rows_u8)
    T, H, D = x.shape
    kv_store[T * H, _store_threads(D), stream](x, positions, np.int32(qtype), rows_u8, rows_f16)


def launch_kv_store_rope(k, v, positions, inv_freq, k_type, k_u8, k_f16, v_type, v_u8, v_f16,
                         stream=0, q=None):
    """Fused `launch_rope(k) + launch_kv_store(k) + launch_kv_store(v)` in one launch; k is
    left unrotated in memory. `inv_freq` from bw24nb.kernels.rope.rope_inv_freq (on device),
    or a zero-length float32 device array for no RoPE. With q ([T, Hq, D]) the same launch
    also does `launch_rope(q)` (in place)."""
    _check_rows(k, k_type, k_u8)
    _check_rows(v, v_type, v_u8)
    if tuple(k.shape) != tuple(v.shape) or v_u8.shape[1] != k_u8.shape[1]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} / caches do not match")
    if 2 * inv_freq.shape[0] > k.shape[2]:
        raise ValueError(f"rotary_dim {2 * inv_freq.shape[0]} exceeds head_dim {k.shape[2]}")
    T, H, D = k.shape
    if q is not None and (q.shape[0] != T or q.shape[2] != D):
        raise ValueError(f"q {tuple(q.shape)} does not match k {tuple(k.shape)}")
    HB = H if q is None else max(H, q.shape[1])
    kv_store_rope[(T * HB, 2 if q is None else 3), _store_threads(D), stream](
        k, v, k if q is None else q, positions, inv_freq, np.int32(k_type), k_u8, k_f16,
        np.int32(v_type), v_u8, v_f16)


# ------------------------------------------------------------------ the cache object


class KVCache:
    """K and V caches of `n_slots` attention layers, allocated once on the device.

    `layer(slot)` returns `(k_u8, k_f16, v_u8, v_f16)`: the four per-layer arrays the
    attention kernels and `launch_kv_store` take (each `[n_kv_heads, ctx, ...]`)."""

    def __init__(self, n_slots: int, n_kv_heads: int, head_dim: int, ctx: int,
                 k_type=K_TYPE_DEFAULT, v_type=V_TYPE_DEFAULT, layer_slots: dict | None = None):
        self.n_slots, self.n_kv_heads, self.head_dim, self.ctx = n_slots, n_kv_heads, head_dim, ctx
        self.k_type, self.v_type = QType(int(k_type)), QType(int(v_type))
        self.k_row_bytes = kv_row_bytes(self.k_type, head_dim)
        self.v_row_bytes = kv_row_bytes(self.v_type, head_dim)
        # zeros, not garbage: every byte pattern decodes to a finite value either way, but a
        # zeroed cache makes an indexing bug show up as "attends to zeros", not as NaN noise
        self.k = cuda.to_device(np.zeros((n_slots, n_kv_heads, ctx, self.k_row_bytes), np.uint8))
        self.v = cuda.to_device(np.zeros((n_slots, n_kv_heads, ctx, self.v_row_bytes), np.uint8))
        self.k_f16 = self.k.view(np.float16)
        self.v_f16 = self.v.view(np.float16)
        self.layer_slots = dict(layer_slots) if layer_slots else {i: i for i in range(n_slots)}
        self._no_rope = None

    @classmethod
    def for_model(cls, config, ctx: int, k_type=K_TYPE_DEFAULT, v_type=V_TYPE_DEFAULT,
                  extra_layers: int = 0) -> "KVCache":
        """One slot per attention layer of `config` (+ `extra_layers`, e.g. an MTP layer, whose
        slots follow and are addressed by slot number)."""
        layers = attention_layers(config)
        return cls(len(layers) + extra_layers, config.num_key_value_heads, config.head_dim, ctx,
                   k_type, v_type, layer_slots={layer: s for s, layer in enumerate(layers)})

    @property
    def nbytes(self) -> int:
        return (self.k_row_bytes + self.v_row_bytes) * self.n_slots * self.n_kv_heads * self.ctx

    def slot(self, layer: int) -> int:
        """Slot of model layer `layer` (KeyError for a layer without attention)."""
        return self.layer_slots[layer]

    def layer(self, slot: int):
        return self.k[slot], self.k_f16[slot], self.v[slot], self.v_f16[slot]

    def rope_table(self, inv_freq):
        """inv_freq, or for None (no RoPE) the empty table the store kernels take for it."""
        if inv_freq is not None:
            return inv_freq
        if self._no_rope is None:
            self._no_rope = cuda.device_array(0, np.float32)
        return self._no_rope

    def store(self, slot: int, k, v, positions, inv_freq=None, stream=0, q=None) -> None:
        """Encode fresh `k`, `v` (float32 device arrays `[T, n_kv_heads, head_dim]`) into the
        cache at `positions` (int32 device array [T]), in one launch. With `inv_freq` (the
        device RoPE table) K is rotated on the way in; without, K must already be rotated.
        With `q` ([T, n_heads, head_dim]) and `inv_freq`, the launch also rotates q in place."""
        inv_freq = self.rope_table(inv_freq)
        k_u8, k_f16, v_u8, v_f16 = self.layer(slot)
        launch_kv_store_rope(k, v, positions, inv_freq, self.k_type, k_u8, k_f16,
                             self.v_type, v_u8, v_f16, stream, q=q)

    def read(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copy of positions [0, n) of one slot, dequantized: (k, v) float32
        `[n, n_kv_heads, head_dim]` (the reference attention's input layout)."""
        from ..quant import dequantize
        out = []
        for rows, qt in ((self.k[slot], self.k_type), (self.v[slot], self.v_type)):
            raw = np.ascontiguousarray(rows.copy_to_host()[:, :n])
            vals = dequantize(raw, qt, (self.n_kv_heads, n, self.head_dim))
            out.append(np.ascontiguousarray(vals.transpose(1, 0, 2)))
        return out[0], out[1]


_A3 = "float32[:, :, ::1]"
_ROWS = "int32, uint8[:, :, ::1], float16[:, :, ::1]"
PTX_SIGNATURES = {
    "kv_store": [f"void({_A3}, int32[::1], {_ROWS})"],
    "kv_store_rope": [f"void({_A3}, {_A3}, {_A3}, int32[::1], float32[::1], {_ROWS}, {_ROWS})"],
}
