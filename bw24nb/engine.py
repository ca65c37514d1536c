"""The GPU engine: device weights, caches and workspace; prefill(tokens) and decode steps.

Read it like llama2.c's `forward()`: `_layer_launches` walks one decoder block top to bottom,
one kernel launch per step, for T tokens at once (T = 1 is a decode step). The same recipe as
the numpy reference (`reference/model.py`), which it is gated against.

A decode step is a list of named launch closures (`_decode_step`). Eagerly it is just run; for
speed it is captured once into a CUDA graph (`graph.CudaGraph`) and replayed per token: the
input token and its position live in device memory and the step's last kernel advances them
(`kernels/step.py`), so the only per-token traffic is reading back the 4-byte sampled token.
The same list run with CUDA events around each launch is the per-kernel profile.

Prefill chunks are graphs too, once a chunk size repeats (`_prefill_chunk`): an eager prefill
spends more host time preparing ~400-600 launches than the GPU spends running them (0.5B
shape, H200: 129 ms a 512-token chunk against 35 ms of kernels).

Every buffer is allocated in `__init__` (graph capture forbids allocation).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from numba import cuda

from . import device
from .cache.kv import K_TYPE_DEFAULT, V_TYPE_DEFAULT, KVCache
from .cache.recurrent import RecurrentState
from .errors import ContextOverflow, OutOfDeviceMemory
from .formats.config import LINEAR_ATTENTION
from .graph import Branches, CudaGraph, CudaGraphError
from .kernels import (activation, attention, attention_tc, decode_attention, embedding,
                      gated_deltanet, matmul, matmul_q8, matvec, moe, norm, quantize_act, rope,
                      sampling, step)
from .quant import QType, quantize

# Prompt tokens per prefill launch sequence: bounds the prefill workspace (T x FFN floats).
PREFILL_CHUNK = 512
# Prefill graphs kept, one per chunk size, least recently used dropped first: every full chunk
# is PREFILL_CHUNK tokens, so a long prompt needs one; the rest serve repeated short prompts.
PREFILL_GRAPHS = 4
# Rows a rowwise (decode-kernel) workspace takes: a speculative verify of K <= 8 drafts + 1.
VERIFY_ROWS = 9
# Prompt tokens per chunk of the "rows" prefill (prefill_path="rows"): the matvecs take them
# MAX_ROWS at a time, but a MoE block sees the whole chunk, so an expert's weights are read
# once for all of its tokens in it (moe.launch_moe_block_q8_expert_rows): 128 tokens route
# 1024 pairs, ~4 an expert at 256 experts. The split-K attention's partials grow with it
# (T x Hq x splits x head_dim floats: 277 MB for the 35B-A3B shape at 132 splits).
ROWS_PREFILL_CHUNK = 128

# Rows up to which a rowwise workspace runs Gated DeltaNet's conv and prep as one launch
# (gated_deltanet.gdn_conv_prep: decode, verify). Its block walks the T rows one after
# another, ~2 us a row: 8.2 ms of a 128-token chunk of the 35B-A3B's rows prefill (30 layers,
# session 20). Longer chunks take prefill's two launches (conv1d_silu in runs, gdn_prep a
# block per token and head), which give the same bits: tests/test_kernels_gdn.py and, on the
# H200, bench/gpu_same_bits.py (session 22). Session 23: 35B-A3B pp512 1278 with the two
# launches against 1206 with the fused one.
CONV_PREP_MAX_T = VERIFY_ROWS

# Decode and verify run the gated delta rule and the GDN output norm (+ ssm_out's int8 copy)
# as one launch (gated_deltanet.launch_gated_delta_rule_norm_q8: a block a value head, the
# same bits as the lane kernel then norm.gated_rms_norm_q8_rows); False: the two launches, as
# before session 27 (run_bench --launch gdn-apart). Read at every launch.
GDN_RULE_NORM = True
# ... for launches of at most this many tokens: decode's one. Verify's K + 1 rows run the two
# launches: the fused launch keeps a head on one SM, whose issue a token's step fills, while
# the lane kernel's one-warp blocks spread it over several. Session 34 (H100, 9B, K = 3, per
# verify): rule 0.233 + norm 0.106 = 0.339 ms against the fused launch's 0.399 / 0.397
# (run_bench --launch rule-norm-fused sets VERIFY_ROWS, sessions 27-33's rule).
GDN_RULE_NORM_MAX_T = 1
# Where decode runs the rule-norm launch, gdn_conv_prep's work in it too
# (gated_deltanet.launch_gdn_conv_rule_norm_q8: each value head's block runs its key head's q /
# k conv and norms and its own v conv and gates in the rule's preload): one launch a GDN layer
# fewer, the same bits (tests/test_kernels_gdn.py; on the GPU bench/gpu_same_bits.py, SAME).
# Measured neutral, so off (decision 0044; H100, 9B): 336.7 / 324.5 against 337.9 / 325.3
# tok/s; the fused launch 9.34 us against 5.80 + 3.93 (its conv preload lengthens the rule's
# path by what the boundary cost). run_bench --launch gdn-conv-fused. Read at every launch.
GDN_CONV_RULE_NORM = False

# Decode attention in one launch while the context is short (decode_attention's one-pass
# kernel: a block a query head runs all its splits and the combine, the bits of the split pass
# + combine): decode steps at contexts <= this many tokens replay a graph of their own built
# with it, longer ones the split-K graph. 0: never. Capped where the kernel stops paying
# (decode_attention.onepass_pays_ctx: 1024 tokens for the 0.5B heads, 256 for the 9B's).
# Measured on the H100 (session 39, run_bench --launch onepass-off): 0.5B decode 1010.8 /
# 999.8 against 895.5 tok/s @512, the same tokens; @6144 unchanged. Read at construction.
# Decision 0045.
ONEPASS_MAX_CTX = 1024

# Where decode takes the one-pass attention, the token's RoPE and K / V store in its launch
# too (decode_attention.launch_onepass(store=): every block of a KV head writes the same rows
# before its loads; the cache's bytes and the output's bits are the separate launch's). False:
# the rope_kv_store launch before it (run_bench --launch store-apart). Read at every launch.
# Measured on the H100 (session 40, decision 0046): 0.5B decode 1047.2 / 1044.2 against
# 1009.4 tok/s @512 (+3.6 %), the same tokens; chained 12.51 against 11.09 + 2.10 us a layer.
ONEPASS_STORE = True

# A verify's ffn_gate and ffn_up as one matvec over the stacked [gate | up] rows, as decode
# runs them (Engine._stack_decode_weights' "gu"), its [T, 2F] output read by swiglu_fused_q8:
# one launch a layer fewer (~3 us of fixed cost each, decision 0036), every row's bits the same
# (the rows kernels sum a row alike whichever launch carries it). False: the two launches, as
# before session 31 (run_bench / spec_bench --launch gu-apart). Read at every launch.
STACK_GATE_UP_ROWS = True

# Side streams the rows prefill spreads a chunk's MAX_ROWS-row slices of one matvec over
# (`Engine._mv`; 0: one chain, as before session 24). The slices read disjoint rows of the
# input and write disjoint rows of the output, so they may run side by side: parallel graph
# branches, the same kernels on the same inputs, the same bits. A slice of a 2048-row matvec
# (the 35B-A3B's gdn_out, attn_output) is 1-3 waves of the 9-row kernel, whose registers
# leave ~12 warps an SM: a chain pays every slice's tail and drain. Read at every launch.
ROWS_SLICE_SIDES = 3

# The rows prefill's int8 matvecs as one launch over the chunk (`matvec.tile_kernel`:
# ROWS_TILE_TOKENS tokens x ROWS_TILE_ROWS matrix rows a block, the rows kernels' bits) instead
# of MAX_ROWS-row slices (False: the slices, as before session 25). A slice's kernel reads its
# 9 tokens' activations again for every 4 rows (a block); a tile reads them once for
# ROWS_TILE_ROWS rows, and one grid covers every token. Read at every launch.
ROWS_TILES = True
ROWS_TILE_TOKENS = 8
ROWS_TILE_ROWS = 16

# Blocks a (token, KV head) the rows prefill's split-K attention takes, each walking its splits
# (decode_attention.launch_split(grid=); 0: a block a split, as decode). The plan stays
# decode's -- sized for the whole context (132 splits for the 35B-A3B heads at 8192) so every
# token gets its decode step's bits -- but a chunk early in a prompt uses few of them: at
# positions < 512 a token's splits are 16 keys, at most 32 of them, and the other blocks only
# load the position and leave (33.8k blocks a layer for a 128-token chunk). Read at every launch.
# The measured choice (session 26, bench/prefill_attention_bench.py, 35B-A3B heads, T = 128 at
# positions 0 / 384): 252 / 654 us split + combine on 8 walking blocks, against 666 / 809 on a
# block a split; pp512 2306 against 2201 tok/s.
ROWS_ATTENTION_GRID = 8
# ... and its one-tile splits on one warp (decode_attention.ONE_TILE_SPREAD off for these
# launches): in a 128-token launch the SMs are full of blocks, and four warps each loading the
# tile's K and V rows for a quarter of the rows lost (253 / 656 us one warp against 316 / 807
# spread, on the walking kernel, whose spread build takes 255 registers and spills).
ROWS_ATTENTION_SPREAD = False

# 2-D tensors a kernel reads as plain float32 arrays (not through a matvec): the depthwise conv.
FLOAT_TENSOR_SUFFIXES = ("ssm_conv1d.weight",)


ACT_QUANT = ("q8", "f32")


def gets_q6k_r(qtype, shape) -> bool:
    """Whether a weight of this type and shape also gets a Q6_K_R copy with int8 activations
    (Engine._repack_q6k; Engine._check_budget counts it): every Q6_K matrix of whole blocks,
    and every stack of Q6_K expert matrices (the int8 MoE block reads them as one matrix of
    E * M rows)."""
    return QType(int(qtype)) == QType.Q6_K and len(shape) in (2, 3) and shape[-1] % 256 == 0


# Engine(attention_plan=...): the decode attention's split plan (attention.launch_flash_decode)
ATTENTION_PLANS = {"aligned": {}, "plain": dict(chunk_align=1, combine_threads=256)}
# Prefill attention: "tc" = FlashAttention-2 on the f16 tensor cores over the F16 cache
# (kernels/attention_tc.py; q and the softmax weights rounded to f16), "split" = the decode
# split-K kernels over the chunk's T tokens (a block per (split, KV head, token),
# PREFILL_SPLITS splits at most per token), "tile" = the one-pass tiled kernel
# (attention.flash_attn_cache); "auto" = "tc" where it serves the cache (F16 K and V, a head
# dim it has, mma.sync: sm_80+), else "split". Measured on the H200 (session 8, prefill of 512
# tokens, per layer): the tile kernel took 3.9 ms (9B heads) / 0.94 ms (0.5B heads); on the
# H100 (session 40) the split kernels took 148 us a layer for the 0.5B's heads, 26 % of its
# prefill. The rows prefill (prefill_path "rows", the MoE gate's) always keeps "split": it
# exists to give each token its decode step's bits.
PREFILL_ATTENTION = ("auto", "tc", "split", "tile")
# Prefill's kernels: "gemm" = the prefill kernels (int8 tensor-core GEMM, prefill attention)
# over chunks of PREFILL_CHUNK tokens, the fast default; "rows" = the decode kernels (a
# speculative verify's rowwise forward) over chunks of ROWS_PREFILL_CHUNK tokens, so that every
# prompt token gets the bits its decode step would and prefill agrees with decode exactly. The
# two kernel families sum in different orders; a MoE router or an int8 rounding can turn that
# into a different expert or value at a near tie (docs/decisions/0016), so "rows" is the
# configuration in which the argmax gate binds for MoE models. It reads the dense weights once
# per MAX_ROWS (9) tokens instead of once per 512.
PREFILL_PATHS = ("auto", "gemm", "rows")
# A prefill chunk's MoE blocks: "tokens" = each token reads its own experts; "grouped" =
# expert-major (each expert's weights read once for its tokens of the chunk): on the int8 GEMM
# with prefill_path "gemm", on the decode kernels (the token block's bits) with "rows".
MOE_PREFILL = ("tokens", "grouped")
# Splits per token in prefill: a chunk's T tokens x KV heads already fill the GPU, and every
# split adds partials (T x Hq x splits x head_dim floats) and combine work. Measured on the
# H200 (session 8, 512 tokens from position 0, attention per chunk, 1 / 2 / 4 / 8 / 16 splits):
# 9B heads 2.83 / 2.97 / 3.20 / 3.68 / 5.30 ms, 0.5B heads 3.37 / 3.60 / 3.62 / 4.04 / 5.13 ms.
# 2, not 1: a chunk deep in a long prompt gives each block up to 2x fewer keys to walk alone.
PREFILL_SPLITS = 2


@dataclass
class QuantizedInput:
    """One matvec input quantized for the integer weight types: int8 values + a float32 scale
    per 32 (decode, dp4a), or those values as floats (prefill's float matmul)."""
    xq: object = None      # int8[T * K]        (decode; prefill on the int8 GEMM)
    xd: object = None      # float32[T * K/32]
    xf: object = None      # float32[T, K]      (prefill on the float matmul)


@dataclass
class DeviceWeight:
    """One weight on the device: its GGUF block bytes (matrices) or float32 values (vectors)."""
    buf: object            # DeviceNDArray
    qtype: QType
    shape: tuple           # numpy order: (out, in) or (E, out, in) or (n,)
    # a copy in a decode kernel's own layout, beside `buf` (Q6_K_R: (body, d), see _repack_q6k)
    q6k_r: tuple | None = None
    # warps per row of the decode matvec; None: matvec.warps_per_row's choice. A stack of
    # weights (Engine._stack_rows) keeps its members' split, so each member's rows are summed
    # exactly as when it runs alone.
    parts: int | None = None

    @property
    def rows(self) -> int:
        return self.shape[-2]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return self.buf.size * self.buf.dtype.itemsize


def _lossless_qtype(x: np.ndarray) -> QType:
    """The narrowest float type that holds every value of `x` exactly (F16, BF16 or F32).

    HF checkpoints are float; after the loader's transforms (norm +1, -exp(A_log), head
    reorders) their matrices are still exactly representable in the dtype they were stored in,
    so uploading in that dtype keeps the engine bit-comparable with the reference."""
    with np.errstate(over="ignore"):
        if np.array_equal(x.astype(np.float16).astype(np.float32), x):
            return QType.F16
    bf = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    if np.array_equal(bf, x):
        return QType.BF16
    return QType.F32


class DeviceWeights:
    """Name -> DeviceWeight under the internal (llama.cpp GGUF) names."""

    def __init__(self, source, log=print):
        self.source = source
        self.tensors: dict[str, DeviceWeight] = {}
        if source.format == "gguf":
            self._from_gguf(source)
        else:
            self._from_float(source, log)

    def _put_raw(self, name, raw, qtype, shape):
        qtype = QType(int(qtype))
        if len(shape) == 1 or name.endswith(FLOAT_TENSOR_SUFFIXES):
            vals = self.source.dequantize(name)
            self.tensors[name] = DeviceWeight(cuda.to_device(np.ascontiguousarray(vals, np.float32)),
                                              QType.F32, tuple(shape))
        else:
            self.tensors[name] = DeviceWeight(cuda.to_device(np.ascontiguousarray(raw).reshape(-1)),
                                              qtype, tuple(shape))

    def _from_gguf(self, source):
        # GGUF tensors already carry the internal names and llama.cpp's transforms.
        for name in source.names():
            info = source.info(name)
            self._put_raw(name, source.raw(name), info.qtype, info.shape)

    def _from_float(self, source, log):
        from .models import load_weights
        weights = load_weights(source)
        for name, x in weights.items():
            x = np.ascontiguousarray(x, np.float32)
            if x.ndim == 1 or name.endswith(FLOAT_TENSOR_SUFFIXES):
                self.tensors[name] = DeviceWeight(cuda.to_device(x), QType.F32, x.shape)
            else:
                qt = _lossless_qtype(x)
                self.tensors[name] = DeviceWeight(cuda.to_device(quantize(x, qt).reshape(-1)),
                                                  qt, x.shape)

    def get(self, name):
        return self.tensors.get(name)

    def __getitem__(self, name) -> DeviceWeight:
        try:
            return self.tensors[name]
        except KeyError:
            from .errors import MissingTensor
            raise MissingTensor(self.source.path, f"tensor {name!r} is missing") from None

    def blk(self, i, suffix):
        return self[f"blk.{i}.{suffix}"]

    def blk_opt(self, i, suffix):
        return self.tensors.get(f"blk.{i}.{suffix}")

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.tensors.values())


class Workspace:
    """Activations for T tokens at once (T = 1: decode; T = PREFILL_CHUNK: prefill).

    `rowwise` (always for T = 1): the T rows run on the decode kernels -- multi-row matvecs
    that read each weight once for all rows, split-K attention planned per token -- so every
    row is bit-identical to decoding that token alone. A speculative verify (T = K + 1 <=
    VERIFY_ROWS) runs on such a workspace, and so does the "rows" prefill (T =
    ROWS_PREFILL_CHUNK); the GEMM prefill's chunks run on a workspace that is not rowwise."""

    def __init__(self, config, T: int, n_splits: int, rowwise: bool | None = None):
        c = config
        self.rowwise = T == 1 if rowwise is None else bool(rowwise)
        # cache.recurrent.StepStates: the GDN kernels also keep the state after every row
        # (a speculative verify's rollback; set by engine_spec.EngineSpecTarget)
        self.step_states = None
        f = np.float32
        H, D, Hq, Hkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
        F = max(c.intermediate_size, c.moe_intermediate_size, c.shared_expert_intermediate_size, 1)
        q_width = Hq * D * (2 if c.attn_output_gate else 1)
        self.T = T
        self.h = cuda.device_array((T, H), f)           # the residual stream
        self.x = cuda.device_array((T, H), f)           # normed input of a sub-block
        self.qg = cuda.device_array((T, q_width), f)    # q projection ([query|gate] when gated)
        self.q = cuda.device_array((T, Hq, D), f)
        self.gate = cuda.device_array((T, Hq, D), f)
        self.k = cuda.device_array((T, Hkv, D), f)
        self.v = cuda.device_array((T, Hkv, D), f)
        self.attn = cuda.device_array((T, Hq, D), f)
        self.g = cuda.device_array((T, F), f)
        self.u = cuda.device_array((T, F), f)
        # the outputs of the stacked decode matvecs (Engine._stack_decode_weights): T = 1, and
        # [gate | up] for a verify's rows too (STACK_GATE_UP_ROWS)
        self.gu = (cuda.device_array((T, 2 * F), f) if self.rowwise and T <= matvec.MAX_ROWS
                   else None)
        self.att_qkv = cuda.device_array((1, q_width + 2 * Hkv * D), f) if T == 1 else None
        self.qkvz = None
        if c.linear_num_value_heads:            # Gated DeltaNet activations
            nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                              c.linear_key_head_dim, c.linear_value_head_dim)
            self.qkv = cuda.device_array((T, 2 * nk * dk + nv * dv), f)
            if T == 1:
                self.qkvz = cuda.device_array((1, 2 * nk * dk + 2 * nv * dv), f)
            self.z = cuda.device_array((T, nv, dv), f)
            self.a = cuda.device_array((T, nv), f)
            self.b = cuda.device_array((T, nv), f)
            self.gq = cuda.device_array((T, nk, dk), f)
            self.gk = cuda.device_array((T, nk, dk), f)
            self.gv = cuda.device_array((T, nv, dv), f)
            # [beta | alpha] rows of the fused matvec (rowwise only, see Engine._fuse_ba)
            self.ab = cuda.device_array((T, 2 * nv), f) if self.rowwise else None
            self.decay = cuda.device_array((T, nv), f)
            self.beta = cuda.device_array((T, nv), f)
            self.o = cuda.device_array((T, nv, dv), f)
            # the key heads' counters of the conv in the rule-norm launch (GDN_CONV_RULE_NORM)
            self.conv_counters = gated_deltanet.alloc_conv_counters(nk) if self.rowwise else None
        # int8 activations for the dp4a matvecs (decode) and their float stand-ins for the
        # prefill matmul: flat, so every [T, K] view of them is contiguous
        KQ = max(H, F, Hq * D, c.linear_num_value_heads * c.linear_value_head_dim)
        self.xq = cuda.device_array(T * KQ, np.int8)
        self.xd = cuda.device_array(max(1, T * KQ // 32), f)
        self.xf = cuda.device_array(T * KQ, f) if T > 1 else None
        self.ids = cuda.device_array(T, np.int32)
        self.positions = cuda.device_array(T, np.int32)
        # split-K attention partials (decode, verify; prefill with n_splits = PREFILL_SPLITS)
        self.part_ml, self.part_acc = attention.alloc_decode_partials(T, Hq, D, n_splits)
        # the split pass's combine counters (decode_attention.COMBINE_IN_SPLIT), rowwise only
        self.counters = (decode_attention.alloc_combine_counters(T, Hkv) if self.rowwise
                         else None)


class Engine:
    """The GPU backend behind generate.Backend: reset / prefill / decode (+ a greedy fast path)."""

    def __init__(self, source, n_ctx: int = 4096, log=print, k_type=K_TYPE_DEFAULT,
                 v_type=V_TYPE_DEFAULT, vram_budget: int | None = None, use_graph: bool = True,
                 act_quant: str = "q8", prefill_gemm: str = "int8",
                 programmatic: bool | None = None, fuse_attention_output: bool = True,
                 attention_plan: str = "aligned", prefill_attention: str = "auto",
                 prefill_splits: int = PREFILL_SPLITS, gdn_rule: str = "auto",
                 fuse_prefill: bool = True, moe_q8: bool = True, prefill_path: str = "auto",
                 moe_prefill: str = "grouped", moe_branches: bool = True,
                 proj_branches: bool = True, norm_split: bool = True):
        if act_quant not in ACT_QUANT:
            raise ValueError(f"act_quant must be one of {ACT_QUANT}, not {act_quant!r}")
        # "q8": matvecs on integer block weights (Q8_0 .. Q6_K) take int8 activations (one
        # scale per 32, llama.cpp's q8_1 rounding) and dp4a, and prefill rounds its activations
        # the same way first; "f32": float activations everywhere (what the numpy reference
        # computes; F16/BF16/F32 weights always take this path).
        self.act_q8 = act_quant == "q8"
        # prefill with act_quant "q8": "int8" = tensor-core GEMM on the int8 activations
        # (kernels/matmul_q8.py); "float" = the float matmul on their float values (q * d)
        if prefill_gemm not in ("int8", "float"):
            raise ValueError(f"prefill_gemm must be 'int8' or 'float', not {prefill_gemm!r}")
        self.prefill_int8 = prefill_gemm == "int8"
        self.config = c = source.config
        self._check_supported(c)
        self.n_ctx = n_ctx
        self.log = log
        feats = device.current_features()
        self.name = f"GPU engine (Numba-CUDA, {feats.name}" + \
            (", simulator)" if device.simulator_enabled() else ")")
        self.stream = cuda.stream()
        t0 = time.perf_counter()
        if c.head_dim % 32 and (k_type != QType.F16 or v_type != QType.F16):
            # q8_0 / q5_1 blocks hold 32 values of one head; tiny test models have narrower heads
            log(f"engine: head_dim {c.head_dim} is not a multiple of 32; KV cache in F16")
            k_type = v_type = QType.F16
        self._check_budget(source, n_ctx, k_type, v_type, vram_budget, self.act_q8)
        self.w = DeviceWeights(source, log)
        # MTP (nextn) blocks past the main stack get KV slots after the main layers' ones, so
        # speculative decoding (engine_spec.py) can run the draft head; none without one
        self.mtp_blocks = self._mtp_blocks()
        self.kv = KVCache.for_model(c, n_ctx, k_type, v_type, extra_layers=len(self.mtp_blocks))
        self._register_mtp_slots()
        self.rs = RecurrentState(c) if c.linear_num_value_heads else None
        if c.linear_num_value_heads:
            from .models.qwen35 import value_to_key_head
            self.key_head = cuda.to_device(np.ascontiguousarray(value_to_key_head(
                c.family, c.linear_num_key_heads, c.linear_num_value_heads), np.int32))
        self.experts = {i: self._expert_weights(i)
                        for i in [*range(c.num_hidden_layers), *self.mtp_blocks]
                        if c.is_moe_layer(i)}
        self._moe_scratch = {}
        self.output = self.w.get("output.weight") or self.w["token_embd.weight"]
        self._repack_q6k()
        self.stacks = self._stack_decode_weights()      # after the Q6_K_R copies are made
        # MoE layers whose expert matrices all have dp4a types run the int8 block
        # (moe.launch_moe_block_q8: every token's rows the decode kernels', bit for bit, in
        # prefill, verify and decode alike); moe_q8=False keeps the float block (the
        # side-by-side bench's --launch moe-float)
        self.moe_q8 = {i: moe.expert_matrices_q8(ew, self._expert_q6k_r(i))
                       for i, ew in self.experts.items()
                       if self.act_q8 and moe_q8 and moe.int8_experts(ew)}
        # prefill_path "auto": "rows" where the model has int8 MoE blocks -- a router turns
        # the GEMM's other rounding into other experts at near ties, and the argmax gate then
        # fails (decision 0016, session 10) -- and "gemm" for the rest
        if prefill_path not in PREFILL_PATHS:
            raise ValueError(f"prefill_path must be one of {PREFILL_PATHS}, not {prefill_path!r}")
        if prefill_path == "auto":
            prefill_path = "rows" if self.moe_q8 else "gemm"
        self.prefill_path = prefill_path
        if moe_prefill not in MOE_PREFILL:
            raise ValueError(f"moe_prefill must be one of {MOE_PREFILL}, not {moe_prefill!r}")
        # a prefill chunk's MoE blocks, expert-major (moe_prefill "grouped"): on the int8
        # tensor-core GEMM (moe.launch_moe_block_q8_grouped) with the GEMM prefill, on the
        # decode kernels with "rows" (moe.launch_moe_block_q8_expert_rows: each token's bits
        # those of the token block)
        self.moe_grouped = {i for i, ew in self.experts.items()
                            if moe_prefill == "grouped" and prefill_path == "gemm"
                            and i in self.moe_q8 and self.prefill_int8
                            and moe.grouped_experts(ew)}
        self.moe_expert_rows = {i for i, ew in self.experts.items()
                                if moe_prefill == "grouped" and prefill_path == "rows"
                                and i in self.moe_q8 and ew.n_experts <= moe.ROUTER_E_MAX}
        # the int8 MoE blocks' independent launches (the shared expert, each up projection) on
        # side streams, parallel branches of the captured graphs (moe.BRANCHES); False: one
        # chain (same kernels, same bits: the side-by-side bench's --launch moe-chain)
        self.moe_branches = bool(moe_branches)
        # the decode-kernel projections of one input that nothing orders (a layer's q / k / v
        # matvecs, Gated DeltaNet's qkv / z / beta-alpha) side by side on side streams
        # (`_side_by_side`; three side streams: GDN's qkv, z, beta, alpha is the most); False:
        # one chain (same kernels, same bits: --launch proj-chain)
        self._proj_branches = Branches(3) if proj_branches else None
        # the rows prefill's slices of one matvec side by side (ROWS_SLICE_SIDES); their own
        # side streams, apart from the projections' (a slice loop may run on one of those)
        self._slice_branches = Branches(ROWS_SLICE_SIDES) if prefill_path == "rows" else None
        # id(DeviceWeight) -> (the weight, kept so that its id stays its own; its TokenMatrix)
        self._tile_matrices: dict = {}
        # decode / verify's q8 norms over a block per slot (norm.launch_rms_norm_q8's split:
        # the same bits; False = one block a row, the form before session 15: --launch
        # norm-whole)
        self._norm_split = norm_split
        self.inv_freq = cuda.to_device(rope.rope_inv_freq(c.rope_theta, c.rotary_dim))
        n_splits = attention.decode_splits(n_ctx, c.num_key_value_heads)
        self.ws1 = Workspace(c, 1, n_splits)
        if prefill_splits < 1:
            raise ValueError(f"prefill_splits must be >= 1, not {prefill_splits}")
        self.wsp = (Workspace(c, min(ROWS_PREFILL_CHUNK, n_ctx), n_splits, rowwise=True)
                    if prefill_path == "rows" else
                    Workspace(c, min(PREFILL_CHUNK, n_ctx), min(n_splits, int(prefill_splits))))
        self.logits = cuda.device_array(self.output.rows, np.float32)
        self.sample_ws = sampling.SampleWorkspace(self.output.rows)
        self.next_token = cuda.device_array(1, np.int32)
        self.use_graph = use_graph
        # decode/verify graphs with programmatic edges (graph.py): the next kernel's blocks are
        # launched while the previous one drains; None = wherever the GPU has them (sm_90+)
        self.programmatic = feats.grid_dependency if programmatic is None else bool(programmatic)
        # the cluster split pass needs clusters (the simulator runs a block a cluster anyway)
        self._clusters = feats.clusters or device.simulator_enabled()
        # decode/verify: the attention combine also applies the output gate and writes the
        # attn_output matvec's int8 input (attention.launch_flash_decode's gate / xq / xd) instead
        # of two more launches; False keeps those launches (same bits: the side-by-side bench)
        self.fuse_attention_output = bool(fuse_attention_output)
        # prefill fuses like decode: swiglu, the GDN output norm and (split-K prefill attention,
        # with fuse_attention_output) the attention combine write the int8 GEMM's input
        # themselves (same kernels, same bits: three launches a layer fewer). On since session
        # 10's side-by-side (pp512 9B 4294 vs 4231 tok/s, 0.5B 32190 vs 31010); False keeps the
        # separate launches (run_bench --launch unfused-prefill)
        self.fuse_prefill = bool(fuse_prefill)
        # decode/verify attention's split plan: "aligned" = the library's defaults (long splits
        # rounded to 128 keys), "plain" = the plan before session 7 (for
        # the side-by-side bench). Either gives each token one fixed summation order.
        if attention_plan not in ATTENTION_PLANS:
            raise ValueError(f"attention_plan must be one of {sorted(ATTENTION_PLANS)}, "
                             f"not {attention_plan!r}")
        self.attention_plan = attention_plan
        if prefill_attention not in PREFILL_ATTENTION:
            raise ValueError(f"prefill_attention must be one of {PREFILL_ATTENTION}, "
                             f"not {prefill_attention!r}")
        tc_ok = feats.int8_mma and attention_tc.supports(c.head_dim, self.kv.k_type,
                                                         self.kv.v_type)
        if prefill_attention == "tc" and not tc_ok:
            raise ValueError(f"prefill_attention 'tc' needs an F16/F16 KV cache, head_dim in "
                             f"{attention_tc.HEAD_DIMS} and mma.sync (sm_80+); here "
                             f"{self.kv.k_type.name}/{self.kv.v_type.name}, head_dim "
                             f"{c.head_dim}, {feats.name}")
        if prefill_attention == "auto":
            prefill_attention = "tc" if tc_ok else "split"
        self.prefill_attention = prefill_attention
        # the gated delta rule's kernel (gated_deltanet.RULE_VARIANTS): "auto" =
        # gated_deltanet.PREFILL_RULE ("pipe": an eighth of a column of the state per lane,
        # two tokens' passes in one loop) for prefill's chunks and "lane" (half a column per
        # lane, the default before session 22) for decode and verify -- the same bits;
        # "lane" / "quad" / "pipe" = that kernel everywhere; "tile" = the shared-memory tile
        # kernel before session 8 (its own order; for the side-by-side bench): decode, verify
        # and prefill share it, so speculative decoding stays token-identical
        if gdn_rule not in gated_deltanet.RULE_VARIANTS:
            raise ValueError(f"gdn_rule must be one of {gated_deltanet.RULE_VARIANTS}, "
                             f"not {gdn_rule!r}")
        self.gdn_rule = gdn_rule
        # the decode graphs: False = split-K attention, True = the one-pass attention
        # (ONEPASS_MAX_CTX), each captured on first use
        self._graphs: dict[bool, CudaGraph] = {}
        self._onepass_build = False         # set only while `_decode_step` builds
        self._decode_build = False          # likewise (its split pass may read ahead)
        self._onepass_limit = self._onepass_max_ctx(n_splits, self.kv.k_type, self.kv.v_type)
        # prefill: chunk size -> its captured graph (LRU, PREFILL_GRAPHS); sizes run eagerly
        # once already (their kernels compiled and loaded); sizes that failed to capture
        self._prefill_graphs: dict[int, CudaGraph] = {}
        self._prefill_seen: set[int] = set()
        self._prefill_eager_only: set[int] = set()
        # a fresh engine's device position is 0 too, not what the allocation held (a decode
        # before any prefill or reset stored its K / V row there)
        self.set_position(0)
        self.load_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ setup checks

    @staticmethod
    def _check_supported(c):
        from .kernels.gated_deltanet import GDN_DK_MAX
        if c.linear_num_value_heads and c.linear_key_head_dim > GDN_DK_MAX:
            from .errors import UnsupportedArchitecture
            raise UnsupportedArchitecture(f"{c.source}: linear_key_head_dim {c.linear_key_head_dim}"
                                          f" exceeds the delta-rule kernel's {GDN_DK_MAX}")

    def _expert_weights(self, i) -> "moe.ExpertWeights":
        c, w = self.config, self.w
        gate, up, down = (w.blk(i, f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        kw = {}
        sh = w.blk_opt(i, "ffn_down_shexp.weight")
        if sh is not None:
            g, u = w.blk(i, "ffn_gate_shexp.weight"), w.blk(i, "ffn_up_shexp.weight")
            gi = w.blk_opt(i, "ffn_gate_inp_shexp.weight")
            kw = dict(shared_ffn=g.rows, sh_gate=g.buf, sh_gate_type=g.qtype, sh_up=u.buf,
                      sh_up_type=u.qtype, sh_down=sh.buf, sh_down_type=sh.qtype,
                      sh_gate_inp=None if gi is None else gi.buf,
                      sh_gate_inp_type=None if gi is None else gi.qtype)
        router = w.blk(i, "ffn_gate_inp.weight")
        return moe.ExpertWeights(
            n_experts=gate.shape[0], top_k=c.num_experts_per_tok, hidden=c.hidden_size,
            ffn=gate.shape[1], norm_topk_prob=c.norm_topk_prob, router=router.buf,
            router_type=router.qtype, gate=gate.buf, gate_type=gate.qtype, up=up.buf,
            up_type=up.qtype, down=down.buf, down_type=down.qtype, **kw)

    def _expert_q6k_r(self, i) -> dict:
        """The Q6_K_R copies of MoE layer i's matrices, by ExpertMatricesQ8 field name."""
        names = {"gate": "ffn_gate_exps", "up": "ffn_up_exps", "down": "ffn_down_exps",
                 "sh_gate": "ffn_gate_shexp", "sh_up": "ffn_up_shexp", "sh_down": "ffn_down_shexp"}
        out = {}
        for field, name in names.items():
            dw = self.w.blk_opt(i, name + ".weight")
            if dw is not None and dw.q6k_r is not None:
                out[field] = dw.q6k_r
        return out

    def _repack_q6k(self) -> None:
        """Every Q6_K matrix a decode matvec reads (the LM head of Q4_K_M files, ffn_down and
        attn_v of its "more bits" layers) also gets the Q6_K_R copy its 16-byte-load kernel
        reads (kernels/matvec_q6k.py): Q6_K's 210-byte blocks are only 2-byte aligned in
        place, and the generic dp4a kernel reading them ran at ~1 TB/s on the H200 against
        ~3.6 TB/s for Q6_K_R (the 9B head: 1.33 -> 0.23 ms). The GGUF bytes stay for the
        prefill GEMM: +1 copy of each (0.8 GB head + ~0.7 GB of layers at the 9B shape)."""
        if not self.act_q8:
            return
        from .kernels.matvec_q6k import repack_q6_k
        for w in self.w.tensors.values():
            if gets_q6k_r(w.qtype, w.shape):
                rows = int(np.prod(w.shape[:-1]))           # an expert stack: E * M rows
                body, d = repack_q6_k(w.buf.copy_to_host(), rows, w.cols)
                w.q6k_r = (cuda.to_device(body), cuda.to_device(d))

    def _stack_rows(self, names) -> DeviceWeight | None:
        """One weight holding the rows of the weights `names` back to back, for a decode step
        to read them in one matvec launch instead of one each (a decode matvec launch costs
        ~3-5 us on the H200 beyond its bytes: run_bench's kernel_ms). Rows are independent
        byte ranges in every block type, so the stack is the buffers concatenated; the members
        then become views into it (no second copy: prefill keeps using them as before). None
        unless every member exists with one type, one width, no Q6_K_R copy, a 16-byte
        multiple of bytes (views stay aligned) and one split (`DeviceWeight.parts`)."""
        ws = [self.w.get(n) for n in names]
        if any(w is None or w.q6k_r is not None or w.buf.nbytes % 16 for w in ws):
            return None
        if len({(w.qtype, w.cols, w.buf.dtype) for w in ws}) != 1 or any(len(w.shape) != 2 for w in ws):
            return None
        parts = {self._split_of(w) for w in ws}
        if len(parts) != 1:
            return None
        return DeviceWeight(self._concat_as_views(ws), ws[0].qtype,
                            (sum(w.rows for w in ws), ws[0].cols), parts=parts.pop())

    @staticmethod
    def _split_of(w: DeviceWeight) -> int:
        """Warps a row of `w` takes in the decode matvec: its own split, else the default."""
        return w.parts or matvec.warps_per_row(w.rows, w.cols)

    def _widen_to_q8_0(self, names) -> bool:
        """Make q / k / v of mixed 32-value block types all Q8_0, losslessly
        (quant.legacy.widen_to_q8_0: the same d, q - bias as the int8 quant), so that they stack
        into one decode launch: the default 0.5B's Q4_K_M file has Q5_0 q / k beside a Q8_0 v on
        12 of its 24 layers (the "more bits" attn_v), which ran as three launches. The decode
        kernels give every row the bits it had (matvec_qx0: per block the same exact integer
        sum times the same d * xd); prefill reads the widened members (same values). Costs 12
        bytes a 32-value block more (Q5_0's 22 -> 34). False, touching nothing, unless the
        members are such a set that stacks once widened (the int8 path, one width, one split,
        16-byte multiples)."""
        from .quant.legacy import widen_to_q8_0
        from .quant.types import row_bytes, type_size
        widen = (QType.Q8_0, QType.Q5_0, QType.Q4_0)
        ws = [self.w.get(n) for n in names]
        if not self.act_q8 or any(w is None or len(w.shape) != 2 or w.qtype not in widen
                                  for w in ws):
            return False
        if (len({w.qtype for w in ws}) == 1 or len({w.cols for w in ws}) != 1
                or len({self._split_of(w) for w in ws}) != 1
                or any(w.rows * row_bytes(QType.Q8_0, w.cols) % 16 for w in ws)):
            return False
        for w in ws:
            if w.qtype != QType.Q8_0:
                blocks = w.buf.copy_to_host().reshape(-1, type_size(w.qtype))
                w.buf = cuda.to_device(widen_to_q8_0(blocks, w.qtype.name).reshape(-1))
                w.qtype = QType.Q8_0
        return True

    @staticmethod
    def _concat_as_views(ws):
        """One device buffer holding the members' buffers back to back; each member's `buf`
        becomes a view into it (same shape), so nothing is held twice."""
        buf = cuda.device_array(sum(w.buf.size for w in ws), ws[0].buf.dtype)
        off = 0
        for w in ws:
            n = w.buf.size
            buf[off:off + n].copy_to_device(w.buf.reshape(n))
            w.buf = buf[off:off + n].reshape(w.buf.shape)
            off += n
        return buf

    def _stack_decode_weights(self) -> dict:
        """(layer, what) -> stacked weight, for the matvecs that read the same input:
        "ba"  ssm_beta + ssm_alpha (tiny: 2 x 32 rows; rowwise workspaces, verify too),
        "gu"  ffn_gate + ffn_up, "qkvz"  attn_qkv + attn_gate, "qkv"  attn_q + attn_k + attn_v
        (with "qkv_bias", their biases back to back, where they have them) -- T = 1 only: the
        outputs are then contiguous slices of one row; a verify keeps the separate launches,
        whose rows are bit for bit the same (`DeviceWeight.parts`)."""
        stacks = {}
        for i in [*range(self.config.num_hidden_layers), *self.mtp_blocks]:
            p = f"blk.{i}."
            for what, names in (("ba", ("ssm_beta.weight", "ssm_alpha.weight")),
                                ("gu", ("ffn_gate.weight", "ffn_up.weight")),
                                ("qkvz", ("attn_qkv.weight", "attn_gate.weight"))):
                st = self._stack_rows([p + n for n in names])
                if st is not None:
                    stacks[i, what] = st
            qkv = [p + f"attn_{n}.weight" for n in "qkv"]
            biases = [self.w.get(p + f"attn_{n}.bias") for n in "qkv"]
            if any(b is not None for b in biases) and not all(b is not None for b in biases):
                continue                    # (a stack takes one bias for all its rows, or none)
            st = self._stack_rows(qkv)
            if st is None and self._widen_to_q8_0(qkv):
                st = self._stack_rows(qkv)
            if st is not None:
                stacks[i, "qkv"] = st
                if biases[0] is not None:
                    buf = self._concat_as_views(biases)
                    stacks[i, "qkv_bias"] = DeviceWeight(buf, QType.F32, (buf.size,))
        return stacks

    def _scratch(self, i, T, grouped=False, expert_rows=False):
        """MoE scratch for T tokens (decode: allocated at capture time; prefill: per chunk size)."""
        kind = (moe.MoEScratchGrouped if grouped else
                moe.MoEScratchExpertRows if expert_rows else
                moe.MoEScratchQ8 if i in self.moe_q8 else moe.MoEScratch)
        key = (T, kind)
        if key not in self._moe_scratch:
            any_w = next(iter(self.experts.values()))
            self._moe_scratch[key] = kind(T, any_w, self.moe_branches)
        return self._moe_scratch[key]

    @staticmethod
    def _check_budget(source, n_ctx, k_type, v_type, budget, act_q8=True):
        """Refuse before uploading anything when weights + KV cache exceed the free device
        memory or `budget` (bytes, --vram-budget): a clear error instead of a CUDA OOM halfway
        through the upload. Weights are counted as stored in the file (the upload keeps GGUF
        blocks as they are), plus the Q6_K_R copies `_repack_q6k` adds (the same size as their
        Q6_K originals); workspaces are small next to them, and so are the bytes a widened
        q / k / v adds (`_widen_to_q8_0`: 12 a 32-value block of its Q5_0 / Q4_0 members)."""
        from .cache.kv import kv_cache_bytes
        c = source.config
        weights = 0
        for n in source.names():
            info, nbytes = source.info(n), int(source.raw(n).nbytes)
            weights += nbytes * (2 if act_q8 and gets_q6k_r(info.qtype, info.shape) else 1)
        kv = kv_cache_bytes(c, n_ctx, k_type, v_type, extra_layers=c.mtp_num_hidden_layers or 0)
        need = weights + kv
        free, total = cuda.current_context().get_memory_info()
        limit = min(free, budget) if budget else free
        if need > limit:
            what = f"--vram-budget {budget / 2**30:.2f} GiB" if budget and budget < free else \
                f"the {free / 2**30:.2f} GiB free on the device (of {total / 2**30:.2f} GiB)"
            raise OutOfDeviceMemory(
                f"{source.path}: weights {weights / 2**30:.2f} GiB + KV cache {kv / 2**30:.2f} GiB "
                f"({n_ctx} tokens) = {need / 2**30:.2f} GiB do not fit {what}; lower --ctx, "
                f"use a smaller quantization, or raise --vram-budget")

    # ------------------------------------------------------------------ the recipe

    def _dp4a(self, w: DeviceWeight) -> bool:
        return self.act_q8 and w.qtype in matvec.MATVEC_Q8 and w.cols % 32 == 0

    def _quantize_input(self, ws: Workspace, x, T: int, consumers) -> tuple[list, QuantizedInput | None]:
        """The launch that quantizes x ([T, K] rows) for those of `consumers` (weights reading x)
        that take int8 activations, and the QuantizedInput to hand `_mv`; ([], None) when none
        does. Quantized once, read by all of them (q/k/v, gate/up)."""
        consumers = [w for w in consumers if w is not None and self._dp4a(w)]
        if not consumers:
            return [], None
        K, s = consumers[0].cols, self.stream
        if ws.rowwise or T == 1:    # T rows of K, contiguous: per-row 32-blocks = the flat ones
            qx = QuantizedInput(xq=ws.xq[:T * K], xd=ws.xd[:T * K // 32])
            xv = x.reshape(x.size)
            return [("quant_act", lambda: quantize_act.launch_quantize_act(xv, qx.xq, qx.xd, n=T * K,
                                                                           stream=s))], qx
        contiguous = tuple(x.strides) == (K * 4, 4)
        if contiguous and self._int8_input(ws, T, consumers):
            qx = QuantizedInput(xq=ws.xq[:T * K], xd=ws.xd[:T * K // 32])
            return [("quant_act", lambda: quantize_act.launch_quantize_act(x, qx.xq, qx.xd, n=T * K,
                                                                           stream=s))], qx
        qx = QuantizedInput(xf=ws.xf[:T * K].reshape(T, K))
        return [("fake_quant_act", lambda: quantize_act.launch_fake_quant_act(x, qx.xf, stream=s))], qx

    def _int8_input(self, ws: Workspace, T: int, consumers) -> bool:
        """Whether `consumers` (weights taking int8 activations, `_dp4a`) read T rows of a
        contiguous input as int8 + scales (decode / verify matvecs, the int8 prefill GEMM)
        rather than as their float values (`_quantize_input`'s choice)."""
        return ws.rowwise or T == 1 or (
            self.prefill_int8 and all(w.qtype in matmul_q8.MATMUL_Q8 for w in consumers))

    def _mv(self, w: DeviceWeight, x, y, T, bias=None, residual=None, qx=None, rowwise=None,
            stream=None):
        """y = W x (+b) (+r) for T rows: matvec (`rowwise`, default T == 1: each weight read
        once for all rows, every row in the one-row kernel's summation order) or the tiled
        matmul; with `qx` (from `_quantize_input`) integer block weights read the quantized
        input instead. On `stream` (default: the engine's); a launch given its stream runs
        beside others on the GPU (`_side_by_side`'s graph branches, the rows prefill's slices),
        which `matvec.warp_rows` weighs."""
        s, beside = (self.stream, False) if stream is None else (stream, True)
        rowwise = T == 1 if rowwise is None else rowwise
        if rowwise and T > matvec.MAX_ROWS and ROWS_TILES and qx is not None \
                and qx.xq is not None and self._dp4a(w):
            # a "rows" prefill chunk of an int8 matvec: token tiles over the whole chunk
            tm = self._tile_matrix(w)
            moe.launch_token_tiles(tm, tm.x_args(qx.xq, qx.xd), y, T, stream=s,
                                   nr=ROWS_TILE_TOKENS, rows=ROWS_TILE_ROWS,
                                   bias=None if bias is None else bias.buf, residual=residual)
            return
        if rowwise and T > matvec.MAX_ROWS:
            # a "rows" prefill chunk: the rows kernels MAX_ROWS rows at a time (each row's
            # bits do not depend on which launch carries it)
            K = w.cols
            br = self._slice_branches
            n_slices = -(-T // matvec.MAX_ROWS)
            sides = 0 if br is None else min(ROWS_SLICE_SIDES, len(br.sides), n_slices - 1)
            # every side forked before the first slice lands on s (a later fork would order
            # it after that slice); slice j on s when j % (sides + 1) == 0, else on side
            # j % (sides + 1) - 1
            on = [s] + [br.fork(s, i) for i in range(sides)]
            for j, t0 in enumerate(range(0, T, matvec.MAX_ROWS)):
                t1 = min(T, t0 + matvec.MAX_ROWS)
                qs = None if qx is None else QuantizedInput(
                    xq=qx.xq[t0 * K:t1 * K], xd=qx.xd[t0 * K // 32:t1 * K // 32])
                self._mv(w, x[t0:t1], y[t0:t1], t1 - t0, bias=bias,
                         residual=None if residual is None else residual[t0:t1], qx=qs,
                         rowwise=True, stream=on[j % (sides + 1)] if sides else None)
            for i in range(sides):
                br.join(s, i)
            return
        b = None if bias is None else bias.buf
        r = None if residual is None else residual.reshape(residual.size)
        if rowwise:
            yv = y.reshape(y.size)
            if qx is not None and self._dp4a(w):
                if w.q6k_r is not None:
                    from .kernels.matvec_q6k import launch_matvec_q8_q6k_r
                    launch_matvec_q8_q6k_r(w.q6k_r[0], w.q6k_r[1], w.rows, w.cols, qx.xq, qx.xd,
                                           yv, bias=b, residual=r, stream=s, rows=T,
                                           beside=beside)
                else:
                    matvec.launch_matvec_q8(w.buf, w.qtype, w.rows, w.cols, qx.xq, qx.xd, yv,
                                            bias=b, residual=r, stream=s, rows=T, parts=w.parts,
                                            beside=beside)
            else:
                matvec.launch_matvec(w.buf, w.qtype, w.rows, w.cols, x.reshape(x.size), yv,
                                     bias=b, residual=r, stream=s, rows=T, parts=w.parts)
            return
        if qx is not None and self._dp4a(w):
            if qx.xf is None:           # prefill on the int8 tensor-core GEMM
                matmul_q8.launch_matmul_q8(w.buf, w.qtype, w.rows, w.cols, qx.xq, qx.xd, y,
                                           bias=b, residual=residual, stream=s)
                return
            x = qx.xf
        matmul.launch_matmul(w.buf, w.qtype, w.rows, w.cols, x, y, bias=b, residual=residual,
                             stream=s)

    def _tile_matrix(self, w: DeviceWeight):
        """`w` as moe.TokenMatrix for `matvec.tile_kernel` (cached): the path, layout and
        warps a row the engine's decode matvec gives it (`_mv`'s launches), so the tiles sum
        each row as decode does."""
        key = id(w)
        if key not in self._tile_matrices:
            tm = moe.token_matrix(w.buf, w.qtype, w.rows, w.cols, q6k_r=w.q6k_r)
            parts = (matvec.warps_per_row(w.rows, w.cols) if w.q6k_r is not None
                     else self._split_of(w))
            self._tile_matrices[key] = (w, replace(tm, parts=parts))
        return self._tile_matrices[key][1]

    def _side_by_side(self, ws: Workspace, projections: list) -> list:
        """[(name, launch_on(stream))] of projections that read one input and write apart, as
        launch entries: on the decode kernels (ws.rowwise: decode, verify, the rows prefill)
        one entry that runs the first on the engine's stream and each other on a side stream
        (graph.Branches), joined before the next entry -- parallel graph branches where a
        chain would pay each small kernel's drain before the next starts; elsewhere (the
        prefill GEMMs, large enough to fill the GPU alone) one entry each, in order. The same
        kernels read the same input either way, so every bit is the chain's."""
        s, br = self.stream, self._proj_branches
        if br is None or not ws.rowwise or len(projections) == 1:     # alone: the engine's stream
            return [(name, (lambda fn=fn: fn(None))) for name, fn in projections]
        (_, first), rest = projections[0], projections[1:]

        def launch():
            for j, (_, fn) in enumerate(rest):
                fn(br.fork(s, j))
            first(s)
            for j in range(len(rest)):
                br.join(s, j)
        return [("+".join(n for n, _ in projections), launch)]

    def _layer_launches(self, i: int, ws: Workspace, T: int) -> list:
        """The launches of decoder block i for the first T rows of `ws`, as named closures:
        h += mixer(norm(h)); h += mlp(norm(h))."""
        c, w = self.config, self.w
        h, x = ws.h[:T], ws.x[:T]
        post = w.blk_opt(i, "ffn_norm.weight") or w.blk(i, "post_attention_norm.weight")
        mixer = (self._gdn_launches(i, ws, T) if c.layer_type(i) == LINEAR_ATTENTION
                 else self._attention_launches(i, ws, T))
        L = self._norm_then(("attn_norm", w.blk(i, "attn_norm.weight")), h, x, ws, T, mixer)
        ffn = self._moe_launches(i, ws, T) if c.is_moe_layer(i) else self._mlp_launches(i, ws, T)
        return L + self._norm_then(("ffn_norm", post), h, x, ws, T, ffn)

    def _norm_then(self, name_weight, h, x, ws: Workspace, T: int, launches: list) -> list:
        """x = rms_norm(h) * w, then `launches`. When those begin by quantizing x to int8
        (`_quantize_input`'s "quant_act": for dp4a matvecs, or for the int8 prefill GEMM -- the
        same flat [T * K] int8 + [T * K / 32] scales either way), the norm writes the int8
        copy itself (norm.launch_rms_norm_q8: the same bytes, one launch fewer; prefill too
        since session 8: 64 launches of a 9B-shape chunk)."""
        name, wn = name_weight
        eps, s = self.config.rms_norm_eps, self.stream
        if launches and launches[0][0] == "quant_act":
            K = x.shape[len(x.shape) - 1]      # (the simulator's shape tuple has no [-1])
            xq, xd = ws.xq[:T * K], ws.xd[:T * K // 32]  # the views _quantize_input hands out
            return [(name + "_q8", lambda: norm.launch_rms_norm_q8(h, wn.buf, eps, x, xq, xd, s,
                                                             split=self._norm_split))] \
                + launches[1:]
        return [(name, lambda: norm.launch_rms_norm(h, wn.buf, eps, x, s))] + launches

    def _attention_launches(self, i: int, ws: Workspace, T: int) -> list:
        """h += o_proj(attention(rope(norm(q)), rope(norm(k)), v)) [* sigmoid(gate)]."""
        c, w, s = self.config, self.w, self.stream
        eps = c.rms_norm_eps
        D, Hq, Hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        h, x = ws.h[:T], ws.x[:T]
        q, k, v, attn = ws.q[:T], ws.k[:T], ws.v[:T], ws.attn[:T]
        pos = ws.positions[:T]
        slot = self.kv.slot(i)
        k_u8, k_f16, v_u8, v_f16 = self.kv.layer(slot)
        L, qx = self._quantize_input(ws, x, T, [w.blk(i, f"attn_{n}.weight") for n in "qkv"])
        add = L.append
        qg = ws.qg[:T]
        stack = self.stacks.get((i, "qkv")) if ws.att_qkv is not None else None
        if stack is not None:   # T = 1: [q(+gate) | k | v] in one matvec, read as slices of it
            flat = ws.att_qkv.reshape(ws.att_qkv.size)
            nq, nk = qg.shape[1] if c.attn_output_gate else Hq * D, Hkv * D
            if c.attn_output_gate:
                qg = flat[:nq].reshape(1, nq)
            else:
                q = flat[:nq].reshape(1, Hq, D)
            k, v = flat[nq:nq + nk].reshape(1, Hkv, D), flat[nq + nk:nq + 2 * nk].reshape(1, Hkv, D)
            bias = self.stacks.get((i, "qkv_bias"))
            add(("attn_qkv", lambda: self._mv(stack, x, flat, T, bias=bias, qx=qx, rowwise=True)))
        else:                   # q (+gate), k and v side by side
            q_out, q_bias = ((qg, None) if c.attn_output_gate else
                             (q.reshape(T, Hq * D), w.blk_opt(i, "attn_q.bias")))
            L += self._side_by_side(ws, [
                ("attn_q", lambda st: self._mv(w.blk(i, "attn_q.weight"), x, q_out, T,
                                               bias=q_bias, qx=qx, rowwise=ws.rowwise, stream=st)),
                ("attn_k", lambda st: self._mv(w.blk(i, "attn_k.weight"), x, k.reshape(T, Hkv * D),
                                               T, bias=w.blk_opt(i, "attn_k.bias"), qx=qx,
                                               rowwise=ws.rowwise, stream=st)),
                ("attn_v", lambda st: self._mv(w.blk(i, "attn_v.weight"), x, v.reshape(T, Hkv * D),
                                               T, bias=w.blk_opt(i, "attn_v.bias"), qx=qx,
                                               rowwise=ws.rowwise, stream=st))])
        if c.attn_output_gate and not c.qk_norm:
            add(("split_q_gate", lambda: rope.launch_split_q_gate(qg, q, ws.gate[:T], s)))
        if c.qk_norm:           # q_norm + k_norm (+ the query / gate split): one launch
            wq, wk = w.blk(i, "attn_q_norm.weight").buf, w.blk(i, "attn_k_norm.weight").buf
            gate = ws.gate[:T] if c.attn_output_gate else None
            add(("qk_norm", lambda: norm.launch_qk_head_norm(
                qg if c.attn_output_gate else q, q, wq, k, wk, eps, gate=gate, stream=s)))
        # (the one-pass kernel: only in the decode step `_decode_step` builds for it)
        onepass = self._onepass_build and T == 1
        # the decode step's split pass reads its position before its grid-dependency wait
        # (decode_attention.SPLIT_PRE_WAIT): no kernel of that graph writes it before
        pre_wait = self._decode_build and T == 1 and decode_attention.SPLIT_PRE_WAIT
        # ... and may run as one launch with its combine (decode_attention.SPLIT_CLUSTER)
        split_cluster = (decode_attention.SPLIT_CLUSTER
                         if (self._decode_build and T == 1 and self._clusters
                             and decode_attention.SPLIT_CLUSTER > 1
                             and decode_attention.supports(Hq // Hkv, D, self.kv.k_type,
                                                           self.kv.v_type))
                         else None)
        # RoPE: q in place, k on its way into the cache, and the store of K and V: one launch,
        # or in the one-pass attention's own launch (ONEPASS_STORE)
        store = ((k, v, self.kv.rope_table(self.inv_freq)) if onepass and ONEPASS_STORE
                 else None)
        if store is None:
            add(("rope_kv_store", lambda: self.kv.store(slot, k, v, pos, inv_freq=self.inv_freq,
                                                        stream=s, q=q)))
        wo, attn2 = w.blk(i, "attn_output.weight"), attn.reshape(T, Hq * D)
        # decode / verify: split-K attention, planned per token, whose combine also gates the
        # output and writes the int8 copy the attn_output matvec reads (when it takes one);
        # prefill runs the same kernels over its T tokens, fused likewise with fuse_prefill
        # (the int8 copy then feeds the int8 GEMM: the same flat [T, K] layout)
        split = ws.rowwise or self.prefill_attention == "split"
        fuse = self.fuse_attention_output and (ws.rowwise or (split and self.fuse_prefill))
        out_gate = ws.gate[:T] if fuse and c.attn_output_gate else None
        qo = (QuantizedInput(xq=ws.xq[:T * Hq * D], xd=ws.xd[:T * Hq * D // 32])
              if fuse and D % 32 == 0 and self._dp4a(wo) and self._int8_input(ws, T, [wo])
              else None)
        if split:
            fused = qo
            # prefill: one combine block a head, no K / V prefetch, the combine's small batch
            # (launch_flash_decode and attention.combine_kernel say why)
            plan = (ATTENTION_PLANS[self.attention_plan] if ws.rowwise
                    else dict(slices=1, prefetch=False,
                              combine_batch=attention.PREFILL_COMBINE_BATCH))
            if ws.rowwise and T > VERIFY_ROWS:                  # the rows prefill
                plan = dict(plan, spread=ROWS_ATTENTION_SPREAD)
                if ROWS_ATTENTION_GRID:
                    plan["split_grid"] = ROWS_ATTENTION_GRID
            add(("attention" if store is None else "rope_kv_store+attention",
                 lambda: attention.launch_flash_decode(
                q, pos, k_u8, k_f16, self.kv.k_type, v_u8, v_f16, self.kv.v_type, attn,
                ws.part_ml[:T], ws.part_acc[:T], stream=s, gate=out_gate,
                xq=None if fused is None else fused.xq, xd=None if fused is None else fused.xd,
                counters=ws.counters if T <= VERIFY_ROWS else None, onepass=onepass,
                store=store, pre_wait=pre_wait and not onepass,
                split_cluster=None if onepass else split_cluster, **plan)))
        elif self.prefill_attention == "tc":
            add(("attention", lambda: attention_tc.launch_attention_tc(
                q, pos, k_u8, v_u8, attn, stream=s)))
        else:
            add(("attention", lambda: attention.launch_flash_attn_cache(
                q, pos, k_u8, k_f16, self.kv.k_type, v_u8, v_f16, self.kv.v_type, attn, stream=s)))
        if c.attn_output_gate and out_gate is None:
            add(("attn_gate", lambda: activation.launch_sigmoid_mul(attn, ws.gate[:T], s)))
        if qo is None:
            qL, qo = self._quantize_input(ws, attn2, T, [wo])
            L += qL
        add(("attn_output", lambda: self._mv(wo, attn2, h, T, bias=w.blk_opt(i, "attn_output.bias"),
                                             residual=h, qx=qo, rowwise=ws.rowwise)))
        return L

    def _gdn_launches(self, i: int, ws: Workspace, T: int) -> list:
        """h += ssm_out(gated_norm(delta_rule(prep(silu(conv(qkv)))), z)) — Gated DeltaNet."""
        c, w, s = self.config, self.w, self.stream
        nv, dv = c.linear_num_value_heads, c.linear_value_head_dim
        h, x = ws.h[:T], ws.x[:T]
        qkv, z, a, b = ws.qkv[:T], ws.z[:T], ws.a[:T], ws.b[:T]
        gq, gk, gv, g, beta, o = ws.gq[:T], ws.gk[:T], ws.gv[:T], ws.decay[:T], ws.beta[:T], ws.o[:T]
        conv_w = w.blk(i, "ssm_conv1d.weight").buf
        names = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")
        L, qx = self._quantize_input(ws, x, T, [w.blk(i, f"{n}.weight") for n in names])
        qkvz = self.stacks.get((i, "qkvz")) if ws.qkvz is not None else None
        if qkvz is not None:    # T = 1: [qkv | z] in one matvec, both read as slices of it
            C = qkv.shape[1]
            flat = ws.qkvz.reshape(ws.qkvz.size)
            qkv, z = flat[:C].reshape(1, C), flat[C:].reshape(1, nv, dv)
            proj = [("gdn_qkvz", lambda st: self._mv(qkvz, x, ws.qkvz, T, qx=qx, rowwise=True,
                                                     stream=st))]
        else:
            proj = [
                ("gdn_qkv", lambda st: self._mv(w.blk(i, "attn_qkv.weight"), x, qkv, T, qx=qx,
                    rowwise=ws.rowwise, stream=st)),
                ("gdn_z", lambda st: self._mv(w.blk(i, "attn_gate.weight"), x,
                    z.reshape(T, nv * dv), T, qx=qx, rowwise=ws.rowwise, stream=st))]
        o2, wout = o.reshape(T, nv * dv), w.blk(i, "ssm_out.weight")
        conv_steps, ssm_steps = (None, None) if ws.step_states is None else ws.step_states.layer(i)
        qL, qo = self._quantize_input(ws, o2, T, [wout])
        ba = self.stacks.get((i, "ba")) if ws.ab is not None else None  # rowwise workspaces only
        if ba is not None:      # beta and alpha rows in one matvec (see _stack_decode_weights)
            ab = ws.ab[:T]
            b, a = ab[:, :nv], ab[:, nv:]        # row-strided views (gdn_prep reads [:, ::1])
            gates = [("gdn_ba", lambda st: self._mv(ba, x, ab, T, qx=qx, rowwise=ws.rowwise,
                                                    stream=st))]
        else:
            gates = [("gdn_beta", lambda st: self._mv(w.blk(i, "ssm_beta.weight"), x, b, T,
                qx=qx, rowwise=ws.rowwise, stream=st)),
                     ("gdn_alpha", lambda st: self._mv(w.blk(i, "ssm_alpha.weight"), x, a, T,
                         qx=qx, rowwise=ws.rowwise, stream=st))]
        norm_w, eps = w.blk(i, "ssm_norm.weight").buf, c.rms_norm_eps
        if qo is not None and qo.xq is not None and dv % 32 == 0 \
                and (ws.rowwise or T == 1 or self.fuse_prefill):
            # decode / verify (prefill with fuse_prefill): the output norm writes ssm_out's
            # int8 input itself (one launch; the same flat layout for the int8 GEMM)
            norm_q = [("gdn_norm_q8", lambda: gated_deltanet.launch_gdn_output_norm(
                o, z, norm_w, eps, o, s, xq=qo.xq, xd=qo.xd))]
        else:
            norm_q = [("gdn_norm", lambda: gated_deltanet.launch_gdn_output_norm(
                o, z, norm_w, eps, o, s))] + qL
        dt, ssm_a = w.blk(i, "ssm_dt.bias").buf, w.blk(i, "ssm_a").buf
        if ws.rowwise and T <= CONV_PREP_MAX_T and gated_deltanet.conv_prep_threads(
                c.linear_num_key_heads, nv, c.linear_key_head_dim, dv) is not None:
            # decode / verify: the conv and the per-head prep in one launch
            mix = [("gdn_conv_prep", lambda: gated_deltanet.launch_gdn_conv_prep(
                qkv, conv_w, self.rs.conv[i], a, b, dt, ssm_a, gq, gk, gv, g, beta, stream=s,
                steps=conv_steps))]
        else:
            mix = [("gdn_conv", lambda: gated_deltanet.launch_conv1d_silu(
                        qkv, conv_w, self.rs.conv[i], qkv, s, steps=conv_steps)),
                   ("gdn_prep", lambda: gated_deltanet.launch_gdn_prep(
                        qkv, a, b, dt, ssm_a, gq, gk, gv, g, beta, stream=s))]
        rule = [("gdn_rule", lambda: gated_deltanet.launch_gated_delta_rule(
            gq, gk, gv, g, beta, self.key_head, self.rs.ssm[i], o, s, steps=ssm_steps,
            variant=self.gdn_rule))]
        if GDN_RULE_NORM and T <= GDN_RULE_NORM_MAX_T and norm_q[0][0] == "gdn_norm_q8" \
                and ws.rowwise \
                and T < gated_deltanet.QUAD_MIN_T and self.gdn_rule in ("auto", "lane") \
                and gated_deltanet.rule_norm_serves(c.linear_key_head_dim, dv):
            # decode / verify (the lane kernel's token counts): the rule and the output norm
            # with ssm_out's int8 copy in one launch, the same bits
            fused = gated_deltanet.launch_gated_delta_rule_norm_q8
            rule, norm_q = [("gdn_rule_norm_q8", lambda: fused(
                gq, gk, gv, g, beta, self.key_head, self.rs.ssm[i], o, z, norm_w, eps, qo.xq,
                qo.xd, s, steps=ssm_steps))], []
            if GDN_CONV_RULE_NORM and mix[0][0] == "gdn_conv_prep" and T == 1:
                # and the conv + prep in it too (one launch fewer, the same bits)
                conv_rule = gated_deltanet.launch_gdn_conv_rule_norm_q8
                mix, rule = [], [("gdn_conv_rule_norm_q8", lambda: conv_rule(
                    qkv, conv_w, self.rs.conv[i], a, b, dt, ssm_a, self.key_head,
                    self.rs.ssm[i], o, z, norm_w, eps, qo.xq, qo.xd, ws.conv_counters, stream=s,
                    conv_steps=conv_steps, steps=ssm_steps))]
        # the projections of x side by side (conv_prep waits for them all; only the output
        # norm reads z)
        return L + self._side_by_side(ws, proj + gates) + mix + rule + norm_q + [
            ("gdn_out", lambda: self._mv(wout, o2, h, T, residual=h, qx=qo, rowwise=ws.rowwise)),
        ]

    def _mlp_launches(self, i: int, ws: Workspace, T: int) -> list:
        """h += down(silu(gate(x)) * up(x))."""
        w, s = self.w, self.stream
        h, x = ws.h[:T], ws.x[:T]
        wg, wu, wd = (w.blk(i, f"ffn_{n}.weight") for n in ("gate", "up", "down"))
        F = wg.rows
        if ws.rowwise:          # contiguous [T, F] (the matvecs and swiglu_q8 read flat rows)
            g, u = (a.reshape(a.size)[:T * F].reshape(T, F) for a in (ws.g, ws.u))
        else:
            g, u = ws.g[:T, :F], ws.u[:T, :F]
        L, qx = self._quantize_input(ws, x, T, [wg, wu])
        gu = (self.stacks.get((i, "gu")) if ws.gu is not None and ws.gu.size >= T * 2 * F
              and (T == 1 or STACK_GATE_UP_ROWS) else None)
        qL, qg = self._quantize_input(ws, g, T, [wd])
        if gu is not None:      # [gate | up] rows in one matvec, swiglu reading both halves
            gu_out = ws.gu.reshape(ws.gu.size)[:T * 2 * F].reshape(T, 2 * F)
            proj = [("ffn_gate_up", lambda: self._mv(gu, x, gu_out, T, qx=qx, rowwise=True))]
            swiglu_q8 = lambda: activation.launch_swiglu_fused_q8(gu_out, g, qg.xq, qg.xd, s)
            swiglu = lambda: activation.launch_swiglu_fused(gu_out, g, s)
        else:
            proj = [("ffn_gate", lambda: self._mv(wg, x, g, T, qx=qx, rowwise=ws.rowwise)),
                    ("ffn_up", lambda: self._mv(wu, x, u, T, qx=qx, rowwise=ws.rowwise))]
            swiglu_q8 = lambda: activation.launch_swiglu_q8(g, u, g, qg.xq, qg.xd, s)
            swiglu = lambda: activation.launch_swiglu(g, u, g, s)
        if qg is not None and qg.xq is not None and (ws.rowwise or self.fuse_prefill):
            # decode / verify (prefill with fuse_prefill): swiglu writes ffn_down's int8 input
            act = [("swiglu_q8", swiglu_q8)]
        else:
            act = [("swiglu", swiglu)] + qL
        return L + proj + act + [
            ("ffn_down", lambda: self._mv(wd, g, h, T, residual=h, qx=qg, rowwise=ws.rowwise)),
        ]

    def _moe_launches(self, i: int, ws: Workspace, T: int) -> list:
        """h += sum_k w_k expert_k(x) [+ sigmoid(gate) shared(x)] — one fixed-grid block."""
        h, x = ws.h[:T], ws.x[:T]
        grouped = i in self.moe_grouped and T > 1 and not ws.rowwise
        expert_rows = i in self.moe_expert_rows and T > VERIFY_ROWS and ws.rowwise
        scratch, s = self._scratch(i, T, grouped, expert_rows), self.stream
        block = (moe.launch_moe_block_q8_grouped if grouped else
                 moe.launch_moe_block_q8_expert_rows if expert_rows else moe.launch_moe_block_q8)
        if i in self.moe_q8:
            # the int8 block: x quantized first (the norm before it writes the int8 copy,
            # `_norm_then`), the float x kept for a float router
            H = x.shape[len(x.shape) - 1]
            xq, xd, xv = ws.xq[:T * H], ws.xd[:T * H // 32], x.reshape(x.size)
            return [("quant_act", lambda: quantize_act.launch_quantize_act(xv, xq, xd, n=T * H,
                                                                           stream=s)),
                    ("moe", lambda: block(x, xq, xd, self.experts[i], self.moe_q8[i], scratch,
                                          h, residual=h, stream=s))]
        return [("moe", lambda: moe.launch_moe_block(x, self.experts[i], scratch, h, residual=h,
                                                     stream=s))]

    def _head_launches(self, ws: Workspace, row: int) -> list:
        """Final norm of one row + LM head into self.logits + argmax into self.next_token."""
        s = self.stream
        xr, hr = ws.x[row:row + 1], ws.h[row:row + 1]
        out = self.output
        qL, qx = self._quantize_input(ws, xr, 1, [out])     # one row: the decode path's head
        return self._norm_then(("output_norm", self.w["output_norm.weight"]), hr, xr, ws, 1, qL + [
            ("lm_head", lambda: self._mv(out, xr, self.logits, 1, qx=qx)),
            ("argmax", lambda: sampling.launch_argmax(self.logits, self.next_token, self.sample_ws, s)),
        ])

    def _forward_launches(self, ws: Workspace, T: int) -> list:
        tok = self.w["token_embd.weight"]
        L = [("embedding", lambda: embedding.launch_embedding(
            tok.buf, tok.qtype, tok.rows, tok.cols, ws.ids[:T], ws.h[:T], self.stream))]
        for i in range(self.config.num_hidden_layers):
            L += self._layer_launches(i, ws, T)
        return L + self._head_launches(ws, T - 1)

    def _onepass_max_ctx(self, n_splits: int, k_type, v_type) -> int:
        """The longest context whose decode steps take the one-pass attention (0: none)."""
        c = self.config
        if ONEPASS_MAX_CTX <= 0 or all(c.layer_type(i) == LINEAR_ATTENTION
                                       for i in range(c.num_hidden_layers)):
            return 0
        R, D = c.num_attention_heads // c.num_key_value_heads, c.head_dim
        if not decode_attention.supports(R, D, k_type, v_type) or D % 32:
            return 0
        return min(ONEPASS_MAX_CTX, decode_attention.onepass_pays_ctx(
            D, n_splits, attention.DECODE_MIN_CHUNK))

    def _onepass_serves(self, steps: int = 1) -> bool:
        """Whether the decode steps at positions self.position .. + steps - 1 all have a
        context the one-pass attention serves (a replay of several steps advances the
        position on the device only)."""
        return self.position + steps <= self._onepass_limit

    def _decode_step(self, onepass: bool = False) -> list:
        """The launches of one decode step; onepass: its attention in the one-pass kernel,
        which serves contexts up to `_onepass_limit` only (the caller's choice)."""
        ws = self.ws1
        self._onepass_build = bool(onepass)
        self._decode_build = True
        try:
            L = self._forward_launches(ws, 1)
        finally:
            self._onepass_build = self._decode_build = False
        return L + [
            ("advance", lambda: step.launch_advance(ws.ids, self.next_token, ws.positions, self.stream))]

    # ------------------------------------------------------------------ public API

    def reset(self):
        """Start a new sequence: zero the recurrent states. The KV cache needs no clearing:
        positions past the sequence's length are never read."""
        if self.rs is not None:
            self.rs.reset(self.stream)
        self.set_position(0)

    def set_position(self, pos: int) -> None:
        """The sequence length is `position`; the decode graph reads its own copy from device
        memory, written here with it."""
        self.position = pos
        self.ws1.positions.copy_to_device(np.array([pos], np.int32), stream=self.stream)

    def _run(self, launches):
        for _, fn in launches:
            fn()

    def prefill(self, ids) -> np.ndarray:
        """Run prompt tokens (appending to the sequence); logits of the last one (host float32)."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        if self.position + ids.size > self.n_ctx:
            raise ContextOverflow(f"{self.position} + {ids.size} tokens exceed the context of "
                                  f"{self.n_ctx}; raise --ctx")
        ws = self.wsp
        for start in range(0, ids.size, ws.T):
            chunk = ids[start:start + ws.T]
            T = chunk.size
            ws.ids[:T].copy_to_device(chunk, stream=self.stream)
            ws.positions[:T].copy_to_device(
                np.arange(self.position, self.position + T, dtype=np.int32), stream=self.stream)
            self._prefill_chunk(ws, T)
            self.position += T
        # the decode step continues from here: its input token is set by decode()/the sampler
        self.set_position(self.position)
        out = self.logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return out

    def _prefill_chunk(self, ws: Workspace, T: int) -> None:
        """Run the forward of the T tokens staged in `ws`. The first chunk of a size runs
        eagerly (it compiles and loads any kernel not yet loaded, which capture forbids); the
        second is captured into a graph and replayed, later ones replay it. The launches are
        the same either way (same kernels, same order: the same bits), and a chunk's inputs --
        tokens, positions -- are device buffers written before it, so one graph serves every
        chunk of its size. A capture that fails (something in the launches is not capturable)
        leaves that size eager, with a log line."""
        if not self.use_graph or T in self._prefill_eager_only or T not in self._prefill_seen:
            self._run(self._forward_launches(ws, T))
            self._prefill_seen.add(T)
            return
        g = self._prefill_graphs.pop(T, None)
        if g is None:
            try:
                with CudaGraph.capture(self.stream, programmatic=self.programmatic) as g:
                    self._run(self._forward_launches(ws, T))
            except CudaGraphError as e:
                self.log(f"engine: prefill of {T} tokens not capturable ({e}); it stays eager")
                self._prefill_eager_only.add(T)
                self._run(self._forward_launches(ws, T))
                return
            while len(self._prefill_graphs) >= PREFILL_GRAPHS:
                self._prefill_graphs.pop(next(iter(self._prefill_graphs))).close()
        self._prefill_graphs[T] = g                 # (re)inserted last: most recently used
        g.replay(self.stream)

    def _save_step_state(self):
        """What one decode step mutates besides the KV row it writes: position, input token and
        the recurrent states (warm-up and profiling must not advance the sequence)."""
        snap = self.rs.snapshot(stream=self.stream) if self.rs is not None else None
        return (self.ws1.positions.copy_to_host(stream=self.stream),
                self.ws1.ids.copy_to_host(stream=self.stream), snap)

    def _restore_step_state(self, saved):
        pos, ids, snap = saved
        self.ws1.positions.copy_to_device(pos, stream=self.stream)
        self.ws1.ids.copy_to_device(ids, stream=self.stream)
        if snap is not None:
            self.rs.restore(snap, stream=self.stream)
        self.stream.synchronize()

    def _replay_decode(self, steps: int = 1):
        """One decode step at the device's position: its graph (captured on first use), the
        one-pass attention's while the `steps` replays from self.position all serve it."""
        # the server drives the engine from its own thread: make the context current there
        # (numba does this for its own calls; the graph replay goes through the driver API)
        cuda.current_context()
        onepass = self._onepass_serves(steps)
        if not self.use_graph:
            self._run(self._decode_step(onepass))
            return
        if onepass not in self._graphs:
            self._graphs[onepass] = self._capture_decode(onepass)
            # the split-K graph (it serves every position) with it: a capture where a
            # generation passes the limit would stall that token. (Not the other way round:
            # the one-pass kernel's warm-up run past its limit would feed NaN on.)
            if onepass and self.n_ctx > self._onepass_limit and False not in self._graphs:
                self._graphs[False] = self._capture_decode(False)
        self._graphs[onepass].replay(self.stream)

    def _capture_decode(self, onepass: bool) -> CudaGraph:
        """The decode step's graph (`_decode_step(onepass)`). Every kernel runs once outside
        the capture first (compiles and loads its module), then the step is undone so the
        captured graph starts from the same state."""
        launches = self._decode_step(onepass)
        saved = self._save_step_state()
        self._run(launches)
        self._restore_step_state(saved)
        with CudaGraph.capture(self.stream, programmatic=self.programmatic) as g:
            self._run(launches)
        return g

    def decode(self, token: int) -> np.ndarray:
        """One token in, logits of the next out (host float32)."""
        if self.position >= self.n_ctx:
            raise ContextOverflow(f"the context of {self.n_ctx} tokens is full")
        self.ws1.ids.copy_to_device(np.array([token], np.int32), stream=self.stream)
        self._replay_decode()
        self.position += 1
        out = self.logits.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return out

    def generate_greedy(self, ids, n: int, eos_ids=()) -> tuple[list[int], dict]:
        """Greedy fast path: prefill, then n-1 graph replays reading back 4 bytes each.

        Returns (tokens, timings) with prefill_s and decode_s (host wall clock, synchronized)."""
        t0 = time.perf_counter()
        self.prefill(ids)
        tok = int(self.next_token.copy_to_host(stream=self.stream)[0])
        t1 = time.perf_counter()
        out = [tok]
        host_tok = cuda.pinned_array(1, np.int32)
        self.ws1.ids.copy_to_device(np.array([tok], np.int32), stream=self.stream)
        while len(out) < n and tok not in eos_ids and self.position < self.n_ctx:
            self._replay_decode()
            self.position += 1
            self.next_token.copy_to_host(host_tok, stream=self.stream)
            self.stream.synchronize()
            tok = int(host_tok[0])
            out.append(tok)
        t2 = time.perf_counter()
        return out, {"prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_tokens": len(out) - 1}

    def profile_decode_step(self, replays: int = 20, chain: int = 1) -> list[tuple[str, float]]:
        """Device time (ms) of each launch of one decode step (`time_launches`; `chain` > 1:
        each launch chained that many times in one graph, as in the decode graph). Leaves the
        sequence state as it was (launches that advance state are replayed on a saved copy)."""
        saved = self._save_step_state()
        onepass = self._onepass_serves()
        self._run(self._decode_step(onepass))        # compile + load every kernel first
        self._restore_step_state(saved)
        return self.time_launches(self._decode_step(onepass), replays,
                                  lambda: self._restore_step_state(saved), chain=chain)

    def profile_prefill(self, ids, replays: int = 3) -> list[tuple[str, float]]:
        """Device time (ms) of each launch of one prefill chunk of `ids` (at most one chunk,
        from position 0), timed like `profile_decode_step`. The recurrent states are put back
        after every launch (the rule kernels' cost does not depend on their values); the KV
        rows written are those the same prefill writes anyway. Leaves a fresh sequence."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        ws = self.wsp
        if not 0 < ids.size <= ws.T:
            raise ValueError(f"profile_prefill takes 1..{ws.T} tokens, not {ids.size}")
        T = ids.size
        self.reset()
        ws.ids[:T].copy_to_device(ids, stream=self.stream)
        ws.positions[:T].copy_to_device(np.arange(T, dtype=np.int32), stream=self.stream)
        launches = self._forward_launches(ws, T)
        snap = self.rs.snapshot(stream=self.stream) if self.rs is not None else None

        def restore():
            if snap is not None:
                self.rs.restore(snap, stream=self.stream)
            self.stream.synchronize()
        self._run(launches)                          # compile + load every kernel first
        restore()
        rows = self.time_launches(launches, replays, restore)
        self.reset()
        return rows

    def replay_ms(self, fn, replays: int = 20) -> float:
        """Device time (ms) per call of `fn()`, work it queues on the engine's stream (a graph
        replay), called `replays` times back to back between two CUDA events: the host's work
        between calls overlaps the device's, so only the device time counts. Wall clock under
        the simulator, which has no event timing."""
        if not hasattr(cuda, "event_elapsed_time"):
            self.stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(replays):
                fn()
            self.stream.synchronize()
            return 1e3 * (time.perf_counter() - t0) / replays
        a, b = cuda.event(), cuda.event()
        a.record(self.stream)
        for _ in range(replays):
            fn()
        b.record(self.stream)
        b.synchronize()
        return cuda.event_elapsed_time(a, b) / replays

    def time_decode_steps(self, token: int, replays: int = 20, reps: int = 5) -> list[float]:
        """Device time (ms) of one decode step of `token`, `reps` times: the step's graph
        replayed `replays` times back to back (`replay_ms`; each replay advances the device
        position and feeds its own argmax on, so they write `replays` KV rows past the current
        one). The sequence is left as it was."""
        if self.position + replays > self.n_ctx:
            raise ContextOverflow(f"timing {replays} decode steps from position "
                                  f"{self.position} needs a context above {self.n_ctx}")
        saved = self._save_step_state()
        first = np.array([token], np.int32)
        out = []
        for rep in range(reps + 1):                  # rep 0 captures (and compiles) the step
            self.ws1.ids.copy_to_device(first, stream=self.stream)
            if rep:
                out.append(self.replay_ms(lambda: self._replay_decode(replays), replays))
            else:
                self._replay_decode()
            self._restore_step_state(saved)
        return out

    def time_launches(self, launches, replays: int = 20, restore=None,
                      chain: int = 1) -> list[tuple[str, float]]:
        """(name, ms) per launch: every launch is captured alone into a CUDA graph and replayed
        `replays` times between CUDA events, so host launch cost (~16 us per eager Numba launch)
        stays out of the numbers (a graph launch of one node still adds ~2 us: small kernels
        read high). chain > 1: the launch is captured `chain` times over into one graph with
        the decode graph's edges (programmatic where it has them), and the time is per launch
        -- what it costs inside a step, after a kernel like itself (bench/launch_chain.py; the
        values it computes are then off, the time is not). Each kernel must have run once
        already; `restore()` after each launch puts back whatever state it advanced."""
        rows = []
        chain = max(1, int(chain))
        for name, fn in launches:
            with CudaGraph.capture(self.stream, programmatic=chain > 1 and self.programmatic) as g:
                for _ in range(chain):
                    fn()
            rows.append((name, self.replay_ms(lambda: g.replay(self.stream), replays) / chain))
            g.close()
            if restore is not None:
                restore()
        return rows

    # --- speculative decoding support (bw24nb/engine_spec.py drives these)

    def _mtp_blocks(self) -> list[int]:
        """Block indices of the MTP (nextn) draft head, `blk.{num_hidden_layers + j}`, that
        this checkpoint carries (Qwen3.5/3.6; empty for every other family). Each is a
        full-attention decoder block run by engine_spec.EngineSpecTarget."""
        c = self.config
        first = c.num_hidden_layers
        return [first + j for j in range(c.mtp_num_hidden_layers or 0)
                if f"blk.{first + j}.nextn.eh_proj.weight" in self.w.tensors]

    def _register_mtp_slots(self) -> None:
        """Address the MTP blocks' KV slots (the cache's last ones) by block index, so
        `_attention_launches(block, ...)` finds them like any main layer's."""
        first = self.kv.n_slots - len(self.mtp_blocks)
        for j, b in enumerate(self.mtp_blocks):
            self.kv.layer_slots[b] = first + j
