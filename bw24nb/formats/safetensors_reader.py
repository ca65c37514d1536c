"""HF checkpoint directory (config.json + *.safetensors) -> TensorSource + ModelConfig.

A safetensors file is

    u64 little-endian N | N bytes of JSON header | data

and the header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
(offsets relative to the data section, which the tensors must cover without holes or
overlaps). The header is read here and the data section memory-mapped: numpy has no bfloat16,
so `safetensors.safe_open(framework="numpy")` cannot even open a BF16 checkpoint, and reading
the header ourselves gives zero-copy uint8 views of every tensor whatever its dtype.

Tensors come from every shard named by model.safetensors.index.json, or from every
*.safetensors file when there is no index. Names are the checkpoint's own
(`model.layers.0.self_attn.q_proj.weight`; Qwen3.5 multimodal: `model.language_model.*`,
`mtp.*`, `model.visual.*`). The ModelConfig follows transformers' configuration_*.py for
each model_type, including its defaults (documented at each field below).
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import struct

import numpy as np

from ..errors import ModelFormatError, UnsupportedArchitecture
from .config import (DENSE_FAMILIES, FULL_ATTENTION, HF_MODEL_TYPE_TO_FAMILY, HYBRID_FAMILIES,
                     MAX_LAYERS, MOE_FAMILIES, ModelConfig,
                     layer_types_from_interval, validate_config)
from .gguf_reader import _map_file
from .source import (QTYPE_BF16, QTYPE_BOOL, QTYPE_F16, QTYPE_F32, QTYPE_F64, QTYPE_FP8_E4M3,
                     QTYPE_FP8_E5M2, QTYPE_FP8_E8M0, QTYPE_I8, QTYPE_I16, QTYPE_I32, QTYPE_I64,
                     QTYPE_U8, QTYPE_U16, QTYPE_U32, QTYPE_U64, MappedTensorSource, TensorInfo)

# safetensors dtype -> (qtype, bytes per value)
SAFETENSORS_DTYPES = {
    "F64": (QTYPE_F64, 8), "F32": (QTYPE_F32, 4), "F16": (QTYPE_F16, 2), "BF16": (QTYPE_BF16, 2),
    "I64": (QTYPE_I64, 8), "I32": (QTYPE_I32, 4), "I16": (QTYPE_I16, 2), "I8": (QTYPE_I8, 1),
    "U64": (QTYPE_U64, 8), "U32": (QTYPE_U32, 4), "U16": (QTYPE_U16, 2), "U8": (QTYPE_U8, 1),
    "BOOL": (QTYPE_BOOL, 1), "F8_E4M3": (QTYPE_FP8_E4M3, 1), "F8_E5M2": (QTYPE_FP8_E5M2, 1),
    "F8_E8M0": (QTYPE_FP8_E8M0, 1),
}
# The safetensors library refuses headers above 100 MB; so do we (a corrupted length field
# must not become a 2**64-byte read).
MAX_HEADER_BYTES = 100_000_000
INDEX_FILE = "model.safetensors.index.json"


# ------------------------------------------------------------------------------ tensors
def read_safetensors_header(path: str, size: int, mm) -> tuple[dict, list[tuple]]:
    """Validate one file's header -> (its __metadata__, [(name, qtype, shape, start, nbytes)])
    with `start` absolute in the file."""
    def bad(problem: str):
        raise ModelFormatError(path, problem)

    if size < 8:
        bad(f"only {size} bytes: too short for a safetensors file (8-byte header length first)")
    (n,) = struct.unpack_from("<Q", mm, 0)
    if n > MAX_HEADER_BYTES:
        bad(f"header length {n} exceeds the safetensors limit of {MAX_HEADER_BYTES} bytes: not a "
            f"safetensors file, or a corrupted one")
    if 8 + n > size:
        bad(f"header length {n} runs past the end of the file ({size} bytes): the file is "
            f"truncated or corrupted (an interrupted download?)")
    try:
        header = json.loads(bytes(mm[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        bad(f"the safetensors header is not valid UTF-8 JSON ({e}): corrupted file")
    if not isinstance(header, dict):
        bad("the safetensors header is not a JSON object: corrupted file")
    file_meta = header.pop("__metadata__", {})
    if not isinstance(file_meta, dict):
        bad("the safetensors __metadata__ entry is not a JSON object")

    data_start, data_size = 8 + n, size - 8 - n
    entries = []
    for name, spec in header.items():
        if not isinstance(spec, dict):
            bad(f"tensor {name!r}: header entry is not a JSON object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            bad(f"tensor {name!r} has dtype {dtype!r}, which bw24nb cannot read (known: "
                f"{', '.join(SAFETENSORS_DTYPES)})")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            bad(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            bad(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with begin <= end")
        qtype, itemsize = SAFETENSORS_DTYPES[dtype]
        nbytes = math.prod(shape) * itemsize
        if offsets[1] - offsets[0] != nbytes:
            bad(f"tensor {name!r}: {dtype} of shape {shape} takes {nbytes} bytes but its "
                f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
        if offsets[1] > data_size:
            bad(f"tensor {name!r}: data ends at byte {data_start + offsets[1]}, past the end of the "
                f"file ({size} bytes): the file is truncated (an interrupted download?)")
        entries.append((name, qtype, tuple(shape), offsets[0], nbytes))

    # The format's rule (and the safetensors library's check): the tensors tile the data
    # section exactly, so two tensors never share bytes and no byte is unaccounted for.
    cursor = 0
    for name, _, _, begin, nbytes in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != cursor:
            bad(f"tensor {name!r} starts at data byte {begin}, expected {cursor}: tensors overlap "
                f"or leave a hole (corrupted header)")
        cursor = begin + nbytes
    if cursor != data_size:
        bad(f"the tensors cover {cursor} data bytes but the file holds {data_size}: corrupted or "
            f"padded file")
    return file_meta, [(name, qtype, shape, data_start + begin, nbytes)
                       for name, qtype, shape, begin, nbytes in entries]


def _shard_files(directory: str) -> tuple[list[str], dict[str, str] | None]:
    """(shard paths, weight_map or None) for an HF checkpoint directory."""
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index_path):
        index = _load_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise ModelFormatError(index_path, "has no 'weight_map' object of tensor name -> file")
        files = []
        for fname in dict.fromkeys(weight_map.values()):
            if os.path.basename(fname) != fname or fname in (".", ".."):
                raise ModelFormatError(index_path, f"weight_map names {fname!r}, which is not a file "
                                                   f"in the checkpoint directory")
            fpath = os.path.join(directory, fname)
            if not os.path.isfile(fpath):
                raise ModelFormatError(fpath, f"missing: {INDEX_FILE} lists it as a shard (an "
                                              f"incomplete download?)")
            files.append(fpath)
        return files, weight_map
    files = sorted(glob.glob(os.path.join(glob.escape(directory), "*.safetensors")))
    if not files:
        raise ModelFormatError(directory, "no *.safetensors files (and no "
                                          f"{INDEX_FILE}); not an HF safetensors checkpoint")
    return files, None


def _load_json(path: str):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise ModelFormatError(path, f"cannot read: {e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelFormatError(path, f"is not valid JSON ({e})") from None


class SafetensorsSource(MappedTensorSource):
    """An HF checkpoint directory as a TensorSource (`format == "safetensors"`).
    `metadata` is config.json; `file_metadata[file]` each shard's `__metadata__`."""

    def __init__(self, directory):
        directory = os.fspath(directory)
        super().__init__(directory, "safetensors")
        config_path = os.path.join(directory, "config.json")
        if not os.path.isfile(config_path):
            raise ModelFormatError(config_path, "missing: an HF checkpoint directory needs "
                                                "config.json next to its *.safetensors files")
        config_json = _load_json(config_path)
        if not isinstance(config_json, dict):
            raise ModelFormatError(config_path, "is not a JSON object")
        self.metadata = config_json
        self.file_metadata: dict[str, dict] = {}

        files, weight_map = _shard_files(directory)
        for fpath in files:
            mm, size = _map_file(fpath)
            file_meta, entries = read_safetensors_header(fpath, size, mm)
            self.file_metadata[fpath] = file_meta
            data = np.frombuffer(mm, dtype=np.uint8)
            for name, qtype, shape, start, nbytes in entries:
                if name in self._table:
                    raise ModelFormatError(fpath, f"tensor {name!r} is also in "
                                                  f"{self._table[name][0].file}; shards must not overlap")
                info = TensorInfo(name=name, qtype=qtype, shape=shape, nbytes=nbytes,
                                  file=fpath, offset=start)
                self._table[name] = (info, data)
        if weight_map is not None:
            for name, fname in weight_map.items():
                info = self._table.get(name, (None,))[0]
                if info is None or os.path.basename(info.file) != fname:
                    raise ModelFormatError(os.path.join(directory, fname),
                                           f"{INDEX_FILE} puts tensor {name!r} in this shard, but it "
                                           f"is not there (an incomplete or mixed download?)")

        gen_path = os.path.join(directory, "generation_config.json")
        generation = _load_json(gen_path) if os.path.isfile(gen_path) else {}
        self.config = config_from_hf(config_json, set(self._table), config_path,
                                     generation if isinstance(generation, dict) else {})


def read_safetensors_dir(directory) -> SafetensorsSource:
    """Open an HF checkpoint directory -> SafetensorsSource (TensorSource with `.config`)."""
    return SafetensorsSource(directory)


# -------------------------------------------------------------------------- ModelConfig
_REQUIRED = object()
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


# Other spellings of a key in config.json files (transformers' `attribute_map`): Qwen3-MoE
# checkpoints on the Hub say num_experts, transformers 5 saves num_local_experts.
_KEY_ALIASES = {"num_experts": ("num_local_experts",)}


class _Fields:
    """Typed config.json lookups with errors naming the key."""

    def __init__(self, d: dict, path: str):
        self.d, self.path = d, path

    def _raw(self, key: str, default):
        v = self.d.get(key)
        for alias in _KEY_ALIASES.get(key, ()):
            if v is None:
                v = self.d.get(alias)
        if v is None:
            if default is _REQUIRED:
                raise ModelFormatError(self.path, f"missing key {key!r} (needed for "
                                                  f"{self.d.get('model_type')!r} models)")
            return default
        return v

    def int(self, key: str, default=_REQUIRED):
        v = self._raw(key, default)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ModelFormatError(self.path, f"{key} = {v!r} should be an integer")
        return v

    def float(self, key: str, default=_REQUIRED, d: dict | None = None):
        src = self if d is None else _Fields(d, self.path)
        v = src._raw(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ModelFormatError(self.path, f"{key} = {v!r} should be a number")
        return float(v)

    def bool(self, key: str, default=_REQUIRED):
        v = self._raw(key, default)
        if not isinstance(v, bool):
            raise ModelFormatError(self.path, f"{key} = {v!r} should be true or false")
        return v


def _text_config(cj: dict, path: str) -> dict:
    """The language-model part of config.json: multimodal Qwen3.5 nests it in `text_config`;
    top-level keys (tie_word_embeddings, token ids) fill in what the text config lacks."""
    text = cj.get("text_config")
    if text is None:
        return cj
    if not isinstance(text, dict):
        raise ModelFormatError(path, "text_config is not a JSON object")
    merged = {k: v for k, v in cj.items() if k not in ("text_config", "vision_config")}
    merged.update(text)
    return merged


def _rope_parameters(t: dict, path: str) -> dict:
    """transformers 5 keeps RoPE settings in `rope_parameters` (older files: `rope_scaling`,
    which wins when both are present, as in transformers); per-layer-type nesting resolves to
    the full-attention entry."""
    rp = t.get("rope_scaling") or t.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ModelFormatError(path, f"rope_parameters = {rp!r} is not a JSON object")
    if rp and all(isinstance(v, dict) for v in rp.values()):
        rp = rp.get(FULL_ATTENTION) or next(iter(rp.values()))
    return rp


def config_from_hf(cj: dict, names: set[str], path: str, generation: dict | None = None) -> ModelConfig:
    """ModelConfig from an HF config.json dict (+ tensor names for tied-embedding and MTP
    detection, + generation_config.json for extra end-of-sequence ids)."""
    model_type = cj.get("model_type")
    if not isinstance(model_type, str):
        raise ModelFormatError(path, "has no model_type string; not a transformers config.json")
    t = _text_config(cj, path)
    text_type = t.get("model_type", model_type)
    family = HF_MODEL_TYPE_TO_FAMILY.get(text_type) or HF_MODEL_TYPE_TO_FAMILY.get(model_type)
    if family is None:
        raise UnsupportedArchitecture(
            f"{path}: model_type {model_type!r} (architectures {cj.get('architectures')}) is not "
            f"supported; bw24nb runs {', '.join(sorted(HF_MODEL_TYPE_TO_FAMILY))}")
    f = _Fields(t, path)
    hybrid, moe = family in HYBRID_FAMILIES, family in MOE_FAMILIES

    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    n_layers = f.int("num_hidden_layers")
    if heads <= 0 or not 0 < n_layers <= MAX_LAYERS:
        raise ModelFormatError(path, f"num_attention_heads = {heads}, num_hidden_layers = {n_layers} "
                                     f"are not a model")
    rp = _rope_parameters(t, path)
    # Priority as in transformers' convert_rope_params_to_dict: rope dict, then top-level key,
    # then default (10000; partial rotary 0.25 for the hybrid families, 1.0 otherwise).
    rope_theta = f.float("rope_theta", 10000.0, d={**t, **rp})
    prf = f.float("partial_rotary_factor", 0.25 if hybrid else 1.0, d={**t, **rp})
    rope_type = rp.get("rope_type", rp.get("type")) or "default"
    if not isinstance(rope_type, str):
        raise ModelFormatError(path, f"rope_type = {rope_type!r} should be a string")
    rope_scaling = {}
    if rope_type != "default":
        rope_scaling = {"rope_type": rope_type, "factor": f.float("factor", 1.0, d=rp)}
        orig = _Fields(rp, path).int("original_max_position_embeddings", 0)
        if orig:
            rope_scaling["original_max_position_embeddings"] = orig

    cfg = ModelConfig(
        family=family,
        vocab_size=f.int("vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=f.int("num_key_value_heads", heads),   # transformers: None -> heads
        head_dim=f.int("head_dim", hidden // heads),
        intermediate_size=f.int("intermediate_size") if family in DENSE_FAMILIES
        else f.int("intermediate_size", 0),
        rms_norm_eps=f.float("rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        max_position_embeddings=f.int("max_position_embeddings", 32768),
        # A checkpoint without lm_head.weight can only run tied (transformers would leave the
        # head randomly initialised otherwise).
        tie_word_embeddings=f.bool("tie_word_embeddings", False) or "lm_head.weight" not in names,
        partial_rotary_factor=prf,
        attention_bias=True if family == "qwen2" else f.bool("attention_bias", False),
        qk_norm=family != "qwen2",
        attn_output_gate=hybrid,
        layer_types=_hf_layer_types(t, family, n_layers, path),
        rope_scaling=rope_scaling,
        source=path,
    )
    if hybrid:
        cfg.linear_num_key_heads = f.int("linear_num_key_heads")
        cfg.linear_num_value_heads = f.int("linear_num_value_heads")
        cfg.linear_key_head_dim = f.int("linear_key_head_dim")
        cfg.linear_value_head_dim = f.int("linear_value_head_dim")
        cfg.linear_conv_kernel_dim = f.int("linear_conv_kernel_dim", 4)
    if moe:
        cfg.num_experts = f.int("num_experts")
        cfg.num_experts_per_tok = f.int("num_experts_per_tok")
        cfg.moe_intermediate_size = f.int("moe_intermediate_size")
        cfg.shared_expert_intermediate_size = f.int("shared_expert_intermediate_size", 0)
        # transformers: Qwen3MoeConfig defaults norm_topk_prob to False, Qwen3NextConfig to True,
        # and Qwen3.5-MoE always renormalises (no key).
        cfg.norm_topk_prob = (True if family == "qwen35moe"
                              else f.bool("norm_topk_prob", family == "qwen3next"))
        cfg.decoder_sparse_step = f.int("decoder_sparse_step", 1)
        only = t.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 for i in only):
            raise ModelFormatError(path, f"mlp_only_layers = {only!r} should be a list of layer indices")
        cfg.mlp_only_layers = list(only)
    if hybrid:
        mtp = t.get("mtp_num_hidden_layers", t.get("num_nextn_predict_layers"))
        if mtp is None:
            mtp = len({m.group(1) for n in names if (m := _MTP_LAYER.match(n))})
        elif not isinstance(mtp, int) or isinstance(mtp, bool):
            raise ModelFormatError(path, f"mtp_num_hidden_layers = {mtp!r} should be an integer")
        cfg.mtp_num_hidden_layers = mtp
    _hf_token_ids(cfg, t, generation or {}, path)
    return validate_config(cfg, path)


def _hf_layer_types(t: dict, family: str, n_layers: int, path: str) -> list[str]:
    given = t.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or not all(isinstance(x, str) for x in given):
            raise ModelFormatError(path, f"layer_types = {given!r} should be a list of strings")
        if "sliding_attention" in given:
            raise UnsupportedArchitecture(f"{path}: sliding-window attention layers are not supported")
        return list(given)
    if family in HYBRID_FAMILIES:
        interval = t.get("full_attention_interval", 4)                  # transformers' default
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            raise ModelFormatError(path, f"full_attention_interval = {interval!r} should be a "
                                         f"positive integer")
        return layer_types_from_interval(n_layers, interval)
    if t.get("use_sliding_window"):
        raise UnsupportedArchitecture(f"{path}: use_sliding_window = true is not supported")
    return [FULL_ATTENTION] * n_layers


def _token_list(v, key: str, path: str) -> list[int]:
    if v is None:
        return []
    ids = v if isinstance(v, list) else [v]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelFormatError(path, f"{key} = {v!r} should be a token id or a list of them")
    return ids


def _hf_token_ids(cfg: ModelConfig, t: dict, generation: dict, path: str) -> None:
    bos = _token_list(t.get("bos_token_id"), "bos_token_id", path)
    eos = _token_list(t.get("eos_token_id"), "eos_token_id", path)
    eos += _token_list(generation.get("eos_token_id"), "generation_config eos_token_id", path)
    cfg.bos_token_id = bos[0] if bos else None
    cfg.eos_token_ids = list(dict.fromkeys(eos))
    cfg.eos_token_id = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
