"""Write a model as a GGUF file (for tests and the tiny-model factory) with gguf.GGUFWriter.

The metadata uses llama.cpp's key names for the architecture (what convert_hf_to_gguf.py
writes), so `open_model(written)` gives back the same ModelConfig and the same tensor bytes:

    write_gguf(path, config, {"token_embd.weight": emb_f32,
                              "blk.0.attn_q.weight": QuantizedTensor(q4k_bytes, 12, (out, in))},
               tokenizer={"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [...]})

Tensors are float arrays (float32 -> F32, float16 -> F16, float64 -> F32; int8..int64 ->
I8..I64) or `QuantizedTensor`s holding already-encoded bytes with their GGUF type id.
Some ModelConfig fields have no GGUF key because llama.cpp fixes them per architecture
(q/k/v bias, qk-norm, the output gate) or reads them off the tensors (tied embeddings, dense
layers in a MoE stack); a config that contradicts those conventions is refused (ValueError)
rather than written as a file that would read back differently.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import gguf
import numpy as np

from .config import (GGUF_ARCH_TO_FAMILY, HYBRID_FAMILIES, MOE_FAMILIES, ModelConfig,
                     interval_from_layer_types)

K = gguf.Keys
VT = gguf.GGUFValueType
FAMILY_TO_GGUF_ARCH = {family: arch for arch, family in GGUF_ARCH_TO_FAMILY.items()}


@dataclass(frozen=True)
class QuantizedTensor:
    """Already-encoded tensor bytes: `data` uint8 (any shape; its C-order bytes are written
    as is), `qtype` a GGUF GGMLQuantizationType id, `shape` the logical numpy shape."""
    data: np.ndarray
    qtype: int
    shape: tuple[int, ...]


def gguf_config_metadata(config: ModelConfig) -> list[tuple[str, Any, VT]]:
    """The (key, value, type) entries describing `config` under llama.cpp's key names."""
    arch = FAMILY_TO_GGUF_ARCH.get(config.family)
    if arch is None:
        raise ValueError(f"no GGUF architecture for family {config.family!r}")

    def k(template: str) -> str:
        return template.format(arch=arch)

    kv: list[tuple[str, Any, VT]] = [
        (k(K.LLM.VOCAB_SIZE), config.vocab_size, VT.UINT32),
        (k(K.LLM.CONTEXT_LENGTH), config.max_position_embeddings, VT.UINT32),
        (k(K.LLM.EMBEDDING_LENGTH), config.hidden_size, VT.UINT32),
        # llama.cpp counts the MTP blocks in block_count (they follow the main stack).
        (k(K.LLM.BLOCK_COUNT), config.num_hidden_layers + config.mtp_num_hidden_layers, VT.UINT32),
        (k(K.Attention.HEAD_COUNT), config.num_attention_heads, VT.UINT32),
        (k(K.Attention.HEAD_COUNT_KV), config.num_key_value_heads, VT.UINT32),
        (k(K.Attention.KEY_LENGTH), config.head_dim, VT.UINT32),
        (k(K.Attention.VALUE_LENGTH), config.head_dim, VT.UINT32),
        (k(K.Attention.LAYERNORM_RMS_EPS), float(config.rms_norm_eps), VT.FLOAT32),
        (k(K.Rope.FREQ_BASE), float(config.rope_theta), VT.FLOAT32),
        (k(K.Rope.DIMENSION_COUNT), config.rotary_dim, VT.UINT32),
    ]
    if config.intermediate_size > 0:
        kv.append((k(K.LLM.FEED_FORWARD_LENGTH), config.intermediate_size, VT.UINT32))
    if config.rope_scaling:
        rs = config.rope_scaling
        kv.append((k(K.Rope.SCALING_TYPE), str(rs.get("rope_type", rs.get("type"))), VT.STRING))
        kv.append((k(K.Rope.SCALING_FACTOR), float(rs.get("factor", 1.0)), VT.FLOAT32))
        if rs.get("original_max_position_embeddings"):
            kv.append((k(K.Rope.SCALING_ORIG_CTX_LEN), int(rs["original_max_position_embeddings"]),
                       VT.UINT32))
    if config.family in MOE_FAMILIES:
        kv += [
            (k(K.LLM.EXPERT_COUNT), config.num_experts, VT.UINT32),
            (k(K.LLM.EXPERT_USED_COUNT), config.num_experts_per_tok, VT.UINT32),
            (k(K.LLM.EXPERT_FEED_FORWARD_LENGTH), config.moe_intermediate_size, VT.UINT32),
            (k(K.LLM.EXPERT_WEIGHTS_NORM), bool(config.norm_topk_prob), VT.BOOL),
        ]
        if config.shared_expert_intermediate_size > 0:
            kv.append((k(K.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
                       config.shared_expert_intermediate_size, VT.UINT32))
    if config.family in HYBRID_FAMILIES:
        interval = interval_from_layer_types(config.layer_types)
        if interval is None:
            raise ValueError(f"layer_types {config.layer_types} is not a full_attention_interval "
                             f"pattern, which is all GGUF can express")
        kv += [
            (k(K.LLM.FULL_ATTENTION_INTERVAL), interval, VT.UINT32),
            (k(K.SSM.CONV_KERNEL), config.linear_conv_kernel_dim, VT.UINT32),
            (k(K.SSM.STATE_SIZE), config.linear_key_head_dim, VT.UINT32),
            (k(K.SSM.GROUP_COUNT), config.linear_num_key_heads, VT.UINT32),
            (k(K.SSM.TIME_STEP_RANK), config.linear_num_value_heads, VT.UINT32),
            (k(K.SSM.INNER_SIZE), config.linear_value_head_dim * config.linear_num_value_heads,
             VT.UINT32),
        ]
    if config.mtp_num_hidden_layers:
        kv.append((k(K.LLM.NEXTN_PREDICT_LAYERS), config.mtp_num_hidden_layers, VT.UINT32))
    if config.bos_token_id is not None:
        kv.append((K.Tokenizer.BOS_ID, config.bos_token_id, VT.UINT32))
    eos_ids = list(config.eos_token_ids)
    if config.eos_token_id is not None and config.eos_token_id not in eos_ids:
        eos_ids.insert(0, config.eos_token_id)
    if len(eos_ids) > 3:
        raise ValueError(f"GGUF holds at most 3 end ids (eos, eot, eom), got {eos_ids}")
    for key, tid in zip((K.Tokenizer.EOS_ID, K.Tokenizer.EOT_ID, K.Tokenizer.EOM_ID), eos_ids):
        kv.append((key, tid, VT.UINT32))
    return kv


def _check_representable(config: ModelConfig, tensors: Mapping[str, Any]) -> None:
    fam = config.family
    fixed = {"attention_bias": fam == "qwen2", "qk_norm": fam != "qwen2",
             "attn_output_gate": fam in HYBRID_FAMILIES}
    for name, want in fixed.items():
        if bool(getattr(config, name)) != want:
            raise ValueError(f"{name}={getattr(config, name)} cannot be written for {fam}: llama.cpp "
                             f"fixes it to {want} for this architecture")
    if config.family in MOE_FAMILIES and config.decoder_sparse_step != 1:
        raise ValueError("decoder_sparse_step != 1 has no GGUF key; mark dense layers through "
                         "mlp_only_layers (blk.N.ffn_* tensors instead of ffn_*_exps)")
    if config.tie_word_embeddings == ("output.weight" in tensors):
        raise ValueError(f"tie_word_embeddings={config.tie_word_embeddings} but output.weight is "
                         f"{'present' if 'output.weight' in tensors else 'absent'}; in GGUF a tied "
                         f"model simply has no output.weight")


def _value_type(key: str, value: Any) -> tuple[Any, VT, VT | None]:
    """(value, type, array element type) for a python metadata value."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], VT):
        v, t = value                                   # explicitly typed: (value, GGUFValueType)
        return v, t, None
    if isinstance(value, np.ndarray):
        sub = {np.dtype(np.uint8): VT.UINT8, np.dtype(np.int8): VT.INT8, np.dtype(np.uint16): VT.UINT16,
               np.dtype(np.int16): VT.INT16, np.dtype(np.uint32): VT.UINT32,
               np.dtype(np.int32): VT.INT32, np.dtype(np.float32): VT.FLOAT32,
               np.dtype(np.uint64): VT.UINT64, np.dtype(np.int64): VT.INT64,
               np.dtype(np.float64): VT.FLOAT64, np.dtype(np.bool_): VT.BOOL}.get(value.dtype)
        if sub is None or value.ndim != 1:
            raise ValueError(f"metadata {key!r}: cannot store a {value.dtype} array of shape {value.shape}")
        return value.tolist(), VT.ARRAY, sub
    if isinstance(value, bool):
        return value, VT.BOOL, None
    if isinstance(value, int):
        if value < 0:
            return value, (VT.INT32 if value >= -(1 << 31) else VT.INT64), None
        return value, (VT.UINT32 if value < (1 << 32) else VT.UINT64), None
    if isinstance(value, float):
        return value, VT.FLOAT32, None
    if isinstance(value, str):
        return value, VT.STRING, None
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"metadata {key!r}: GGUF cannot store an empty array")
        if all(isinstance(x, str) for x in value):
            return list(value), VT.ARRAY, VT.STRING
        if all(isinstance(x, bool) for x in value):
            return list(value), VT.ARRAY, VT.BOOL
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return list(value), VT.ARRAY, VT.INT32          # llama.cpp's token_type arrays
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            return [float(x) for x in value], VT.ARRAY, VT.FLOAT32   # e.g. token scores
        raise ValueError(f"metadata {key!r}: array elements must share one type")
    raise ValueError(f"metadata {key!r}: cannot store a {type(value).__name__}")


def _tensor_for_writer(name: str, t) -> tuple[np.ndarray, int | None]:
    """(array to hand GGUFWriter, raw GGML type or None for plain dtypes)."""
    if isinstance(t, QuantizedTensor):
        try:
            gt = gguf.GGMLQuantizationType(int(t.qtype))
        except ValueError:
            raise ValueError(f"tensor {name!r}: type id {t.qtype} is not a GGUF type") from None
        block, type_size = gguf.GGML_QUANT_SIZES[gt]
        shape = tuple(int(d) for d in t.shape) or (1,)
        if shape[-1] % block:
            raise ValueError(f"tensor {name!r}: row length {shape[-1]} is not a multiple of the "
                             f"{gt.name} block size {block}")
        byte_shape = (*shape[:-1], shape[-1] // block * type_size)
        data = np.ascontiguousarray(t.data)
        if data.dtype != np.uint8:
            data = data.view(np.uint8)
        if data.nbytes != int(np.prod(byte_shape)):
            raise ValueError(f"tensor {name!r}: {data.nbytes} bytes given, {gt.name} of shape "
                             f"{shape} takes {int(np.prod(byte_shape))}")
        return data.reshape(byte_shape), int(gt)
    a = np.asarray(t)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    if a.dtype not in (np.float32, np.float16, np.int8, np.int16, np.int32, np.int64):
        raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no GGUF type; pass a "
                         f"QuantizedTensor for encoded data")
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim > 4:
        raise ValueError(f"tensor {name!r}: GGUF tensors have at most 4 dimensions, got {a.ndim}")
    return np.ascontiguousarray(a), None


def write_gguf(path, config: ModelConfig, tensors: Mapping[str, Any], *,
               tokenizer: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
               alignment: int | None = None, name: str | None = None) -> str:
    """Write `config` + `tensors` (name -> float array or QuantizedTensor, in file order) to a
    GGUF file at `path`; returns the path.

    `tokenizer`: full GGUF keys -> values (e.g. "tokenizer.ggml.tokens": [...]); these override
    the token ids taken from `config`. `metadata`: any further keys (same value rules: str,
    bool, int -> u32/i32/u64, float -> f32, lists -> arrays, or `(value, GGUFValueType)`).
    """
    path = os.fspath(path)
    _check_representable(config, tensors)
    arch = FAMILY_TO_GGUF_ARCH[config.family]
    entries: dict[str, tuple[Any, VT, VT | None]] = {}
    for key, value, vtype in gguf_config_metadata(config):
        entries[key] = (value, vtype, None)
    if name:
        entries[K.General.NAME] = (name, VT.STRING, None)
    if alignment is not None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a positive power of two")
        entries[K.General.ALIGNMENT] = (int(alignment), VT.UINT32, None)
    for extra in (tokenizer or {}), (metadata or {}):
        for key, value in extra.items():
            entries[key] = _value_type(key, value)

    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.data_alignment = int(alignment)
    for key, (value, vtype, sub) in entries.items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for tname, t in tensors.items():
        data, raw_type = _tensor_for_writer(tname, t)
        if raw_type is None:
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_dtype=gguf.GGMLQuantizationType(raw_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
