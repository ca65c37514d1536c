"""bw24nb.formats: GGUF and HF safetensors readers, the GGUF writer, open_model.

Oracles: gguf.GGUFReader for the GGUF header parser, safetensors.safe_open and torch for
tensor bytes/values, transformers' own config classes for config.json semantics, and
round trips through the writer. Bad inputs must raise bw24nb.errors types naming the file.
"""
import dataclasses
import json
import os
import struct
import time

import gguf
import numpy as np
import pytest

from bw24nb.errors import (Bw24Error, MissingTensor, ModelFormatError, UnsupportedArchitecture,
                           UnsupportedTensorType)
from bw24nb.formats import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig, open_model
from bw24nb.formats.config import interval_from_layer_types, layer_types_from_interval
from bw24nb.formats.gguf_writer import QuantizedTensor, gguf_config_metadata, write_gguf
from bw24nb.formats.safetensors_reader import config_from_hf
from bw24nb.formats.source import QTYPE_FP8_E4M3, QTYPE_U8

Q8_0, Q4_K, Q6_K, BF16 = 8, 12, 14, 30


# ------------------------------------------------------------------------------ fixtures
def tiny_config(family: str, **over) -> ModelConfig:
    hybrid = family in ("qwen3next", "qwen35", "qwen35moe")
    moe = family in ("qwen3moe", "qwen3next", "qwen35moe")
    n_layers = 8 if hybrid else 3
    cfg = ModelConfig(
        family=family, vocab_size=96, hidden_size=64, num_hidden_layers=n_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=0 if family == "qwen35moe" else 128,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, max_position_embeddings=4096,
        tie_word_embeddings=family in ("qwen3", "qwen35"),
        partial_rotary_factor=0.25 if hybrid else 1.0,
        attention_bias=family == "qwen2", qk_norm=family != "qwen2", attn_output_gate=hybrid,
        layer_types=(layer_types_from_interval(n_layers, 4) if hybrid
                     else [FULL_ATTENTION] * n_layers),
        bos_token_id=None if family != "qwen2" else 1, eos_token_id=2, eos_token_ids=[2, 5])
    if hybrid:
        cfg.linear_num_key_heads, cfg.linear_num_value_heads = 2, 4
        cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim = 16, 8, 4
        cfg.mtp_num_hidden_layers = 1 if family != "qwen3next" else 0
    if moe:
        cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = 8, 2, 32
        cfg.shared_expert_intermediate_size = 0 if family == "qwen3moe" else 48
        cfg.norm_topk_prob = family != "qwen3moe"
    return dataclasses.replace(cfg, **over)


def tiny_tensors(cfg: ModelConfig, rng) -> dict:
    """A handful of tensors in every storage kind the writer takes (not a complete model:
    the format layer does not check completeness, the model layer does)."""
    h = cfg.hidden_size
    q8 = gguf.quants.quantize(rng.standard_normal((h, 256)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    t = {
        "token_embd.weight": rng.standard_normal((cfg.vocab_size, h)).astype(np.float32),
        "output_norm.weight": rng.standard_normal(h).astype(np.float16),
        "blk.0.attn_q.weight": QuantizedTensor(q8, Q8_0, (h, 256)),
        "blk.0.attn_v.weight": QuantizedTensor(
            rng.integers(0, 256, (h, 144), dtype=np.uint8), Q4_K, (h, 256)),
        "blk.1.attn_k.weight": QuantizedTensor(
            rng.integers(0, 256, (2, 3, 210), dtype=np.uint8), Q6_K, (2, 3, 256)),
        "blk.1.ssm_a": QuantizedTensor(       # bf16 = the high half of each float32
            (rng.standard_normal(8).astype(np.float32).view(np.uint32) >> 16)
            .astype(np.uint16).view(np.uint8), BF16, (8,)),
        "blk.2.pos": np.arange(-3, 5, dtype=np.int32),
    }
    if not cfg.tie_word_embeddings:
        t["output.weight"] = rng.standard_normal((cfg.vocab_size, h)).astype(np.float32)
    return t


def tiny_tokenizer(n: int) -> dict:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": [f"tok{i}\u0120é" for i in range(n)],
        "tokenizer.ggml.token_type": [1] * (n - 2) + [3, 3],
        "tokenizer.ggml.merges": ["t o", "to k"],
        "tokenizer.ggml.add_bos_token": False,
    }


def without_source(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, source="")


def raw_bytes_of(t) -> bytes:
    if isinstance(t, QuantizedTensor):
        return np.ascontiguousarray(t.data).tobytes()
    a = np.asarray(t)
    return np.ascontiguousarray(a.astype(np.float32) if a.dtype == np.float64 else a).tobytes()


FAMILIES = ["qwen2", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe"]


# ------------------------------------------------------------------------ GGUF round trip
@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_round_trip_config_and_bytes(tmp_path, rng, family):
    cfg = tiny_config(family)
    tensors = tiny_tensors(cfg, rng)
    path = write_gguf(tmp_path / "m.gguf", cfg, tensors, tokenizer=tiny_tokenizer(cfg.vocab_size))
    src = open_model(path)
    assert src.format == "gguf" and src.path == str(path)
    assert without_source(src.config) == cfg
    assert src.config.source == str(path)
    assert src.names() == list(tensors)
    for name, t in tensors.items():
        info = src.info(name)
        raw = src.raw(name)
        assert raw.dtype == np.uint8 and raw.nbytes == info.nbytes
        assert raw.tobytes() == raw_bytes_of(t), name
        # zero copy: a read-only view into the file mapping, shaped (rows..., row_bytes)
        assert not raw.flags.owndata and not raw.flags.writeable
        assert raw.shape[:-1] == info.shape[:-1]
        with open(path, "rb") as f:
            f.seek(info.offset)
            assert f.read(info.nbytes) == raw.tobytes()
    assert src.info("blk.1.attn_k.weight").shape == (2, 3, 256)
    assert src.info("blk.1.attn_k.weight").qtype == Q6_K
    assert src.info("output_norm.weight").qtype == 1
    assert src.metadata["tokenizer.ggml.tokens"][5] == "tok5\u0120é"
    assert src.metadata["tokenizer.ggml.add_bos_token"] is False
    assert src.has("blk.0.attn_q.weight") and not src.has("nope")
    with pytest.raises(MissingTensor, match="nope"):
        src.raw("nope")


def test_gguf_dequantize_values(tmp_path, rng):
    cfg = tiny_config("qwen3")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    tensors = {
        "token_embd.weight": rng.standard_normal((cfg.vocab_size, 64)).astype(np.float32),
        "a": x, "b": x.astype(np.float16), "c": QuantizedTensor(q8, Q8_0, x.shape),
        "d": QuantizedTensor(bf.view(np.uint8), BF16, x.shape), "e": np.arange(6, dtype=np.int8),
    }
    src = open_model(write_gguf(tmp_path / "d.gguf", cfg, tensors))
    np.testing.assert_array_equal(src.dequantize("a"), x)
    np.testing.assert_array_equal(src.dequantize("b"), x.astype(np.float16).astype(np.float32))
    # Q8_0: value = d * q with d an f16 per 32 values -- gguf-py's decoder is the oracle
    np.testing.assert_array_equal(src.dequantize("c"), gguf.quants.dequantize(q8, Q8_0))
    np.testing.assert_array_equal(src.dequantize("d"), (bf.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(src.dequantize("e"), np.arange(6, dtype=np.float32))
    out = src.dequantize("a")
    assert out.dtype == np.float32 and out.flags.writeable
    assert not np.may_share_memory(out, src.raw("a"))      # the caller owns it, not the mapping


def test_gguf_parser_agrees_with_gguf_reader(tmp_path, rng):
    """Our bounds-checked parser vs gguf-py's GGUFReader on the same file."""
    cfg = tiny_config("qwen35moe")
    tensors = tiny_tensors(cfg, rng)
    tok = tiny_tokenizer(cfg.vocab_size)
    tok["tokenizer.ggml.scores"] = [float(i) / 3 for i in range(cfg.vocab_size)]
    path = write_gguf(tmp_path / "x.gguf", cfg, tensors, tokenizer=tok, alignment=64,
                      metadata={"test.i64": (-(1 << 40), gguf.GGUFValueType.INT64),
                                "test.f64": (0.1, gguf.GGUFValueType.FLOAT64),
                                "test.u8s": np.array([1, 2, 255], np.uint8)})
    ours = open_model(path)
    ref = gguf.GGUFReader(path)
    ref_meta = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == ref_meta.keys()
    for k, v in ref_meta.items():
        assert ours.metadata[k] == v, k
    assert ours.alignment == 64 and ours.data_offset == ref.data_offset
    assert [t.name for t in ref.tensors] == ours.names()
    for t in ref.tensors:
        info = ours.info(t.name)
        assert info.shape == tuple(reversed(t.shape.tolist()))
        assert info.qtype == int(t.tensor_type) and info.nbytes == t.n_bytes
        assert info.offset == t.data_offset
        assert ours.raw(t.name).tobytes() == t.data.tobytes()


def test_gguf_metadata_semantics(tmp_path, rng):
    """The llama.cpp key conventions, checked on the written metadata itself."""
    cfg = tiny_config("qwen35", num_hidden_layers=12, layer_types=layer_types_from_interval(12, 3),
                      partial_rotary_factor=0.5)
    kv = {k: v for k, v, _ in gguf_config_metadata(cfg)}
    assert kv["qwen35.block_count"] == 13 and kv["qwen35.nextn_predict_layers"] == 1
    assert kv["qwen35.full_attention_interval"] == 3
    assert kv["qwen35.rope.dimension_count"] == 16           # 32 * 0.5
    assert kv["qwen35.ssm.inner_size"] == 4 * 8 and kv["qwen35.ssm.state_size"] == 16
    assert kv["qwen35.ssm.group_count"] == 2 and kv["qwen35.ssm.time_step_rank"] == 4
    src = open_model(write_gguf(tmp_path / "m.gguf", cfg, tiny_tensors(cfg, rng)))
    c = src.config
    assert c.num_hidden_layers == 12 and c.mtp_num_hidden_layers == 1
    assert [i for i, t in enumerate(c.layer_types) if t == FULL_ATTENTION] == [2, 5, 8, 11]
    assert c.layer_type(0) == LINEAR_ATTENTION
    assert c.rotary_dim == 16 and c.linear_value_head_dim == 8
    assert c.rms_norm_eps == 1e-6                  # the f32 value read back as the decimal written
    assert c.eos_token_ids == [2, 5] and c.eos_token_id == 2


def _write_custom_gguf(path, arch: str, kv: dict, tensors: dict):
    """A GGUF with exactly the metadata given (to test defaults and fallbacks)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (value, vtype) in kv.items():
        w.add_key_value(key, value, vtype)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _base_kv(cfg: ModelConfig, drop=()) -> dict:
    return {k: (v, t) for k, v, t in gguf_config_metadata(cfg) if k.split(".", 1)[-1] not in drop}


def test_gguf_vocab_size_fallbacks_and_tie(tmp_path, rng):
    cfg = tiny_config("qwen3")
    kv = _base_kv(cfg, drop={"vocab_size"})
    emb = rng.standard_normal((cfg.vocab_size, 64)).astype(np.float32)
    p = _write_custom_gguf(tmp_path / "a.gguf", "qwen3", kv, {"token_embd.weight": emb})
    assert open_model(p).config.vocab_size == cfg.vocab_size          # embedding rows
    kv["tokenizer.ggml.tokens"] = ([f"t{i}" for i in range(77)], gguf.GGUFValueType.ARRAY)
    p = _write_custom_gguf(tmp_path / "b.gguf", "qwen3", kv, {"x": emb[:2]})
    c = open_model(p).config
    assert c.vocab_size == 77 and c.tie_word_embeddings                # token list; no output.weight
    p = _write_custom_gguf(tmp_path / "c.gguf", "qwen3", _base_kv(cfg),
                           {"output.weight": emb, "token_embd.weight": emb})
    assert open_model(p).config.tie_word_embeddings is False


def test_gguf_defaults_match_llama_cpp(tmp_path, rng):
    """Optional keys default as llama.cpp's loader does: kv heads = heads, head_dim =
    hidden / heads, rope dims = head_dim, freq_base 10000, interval 4."""
    cfg = tiny_config("qwen35")
    drop = {"attention.head_count_kv", "attention.key_length", "attention.value_length",
            "rope.dimension_count", "rope.freq_base", "full_attention_interval"}
    p = _write_custom_gguf(tmp_path / "d.gguf", "qwen35", _base_kv(cfg, drop),
                           {"token_embd.weight": np.zeros((96, 64), np.float32)})
    c = open_model(p).config
    assert c.num_key_value_heads == 4 and c.head_dim == 16 and c.partial_rotary_factor == 1.0
    assert c.rope_theta == 10000.0
    assert c.layer_types == layer_types_from_interval(c.num_hidden_layers, 4)


def test_gguf_moe_dense_layers_from_tensors(tmp_path, rng):
    cfg = tiny_config("qwen3moe", mlp_only_layers=[1])
    t = {"token_embd.weight": np.zeros((96, 64), np.float32), "output.weight": np.zeros((96, 64), np.float32),
         "blk.0.ffn_down_exps.weight": np.zeros((8, 64, 32), np.float32),
         "blk.1.ffn_down.weight": np.zeros((64, 128), np.float32),
         "blk.2.ffn_down_exps.weight": np.zeros((8, 64, 32), np.float32)}
    c = open_model(write_gguf(tmp_path / "m.gguf", cfg, t)).config
    assert c.mlp_only_layers == [1]
    assert [c.is_moe_layer(i) for i in range(3)] == [True, False, True]
    assert c.norm_topk_prob is False and c.num_experts == 8 and c.moe_intermediate_size == 32


def test_gguf_unknown_arch_and_bad_keys(tmp_path):
    emb = {"token_embd.weight": np.zeros((8, 64), np.float32)}
    kv = {k.replace("qwen3.", "llama."): v for k, v in _base_kv(tiny_config("qwen3")).items()}
    p = _write_custom_gguf(tmp_path / "l.gguf", "llama", kv, emb)
    with pytest.raises(UnsupportedArchitecture, match="llama"):
        open_model(p)
    p = _write_custom_gguf(tmp_path / "m.gguf", "qwen3",
                           _base_kv(tiny_config("qwen3"), drop={"block_count"}), emb)
    with pytest.raises(ModelFormatError, match="qwen3.block_count") as e:
        open_model(p)
    assert e.value.path == p
    kv = _base_kv(tiny_config("qwen3"))
    kv["qwen3.embedding_length"] = ("64", gguf.GGUFValueType.STRING)
    p = _write_custom_gguf(tmp_path / "n.gguf", "qwen3", kv, emb)
    with pytest.raises(ModelFormatError, match="embedding_length.*integer"):
        open_model(p)
    kv = _base_kv(tiny_config("qwen3"))
    kv["qwen3.attention.head_count_kv"] = (3, gguf.GGUFValueType.UINT32)     # 4 % 3 != 0
    p = _write_custom_gguf(tmp_path / "o.gguf", "qwen3", kv, emb)
    with pytest.raises(ModelFormatError, match="num_key_value_heads"):
        open_model(p)


# ---------------------------------------------------------------------- GGUF bad files
@pytest.fixture
def good_gguf(tmp_path, rng):
    cfg = tiny_config("qwen3")
    t = tiny_tensors(cfg, rng)
    path = write_gguf(tmp_path / "good.gguf", cfg, t, tokenizer=tiny_tokenizer(cfg.vocab_size))
    with open(path, "rb") as f:
        return path, bytearray(f.read()), t


def _tensor_info_pos(data: bytes, name: str) -> int:
    """Offset of the n_dims field of tensor `name`'s info record."""
    key = struct.pack("<Q", len(name)) + name.encode()
    i = data.index(key)
    return i + len(key)


def _write(tmp_path, data, name="bad.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return str(p)


def test_gguf_bad_files(tmp_path, good_gguf):
    path, data, tensors = good_gguf
    cases = {
        "empty": (b"", "empty"),
        "magic": (b"GGUX" + data[4:], "not a GGUF file"),
        "safetensors-like": (struct.pack("<Q", 2) + b"{}", "not a GGUF file"),
        "version 1": (data[:4] + struct.pack("<I", 1) + data[8:], "version 1"),
        "big endian": (data[:4] + struct.pack(">I", 3) + data[8:], "big-endian"),
        "header cut": (data[:20], "header ends inside"),
        "metadata cut": (data[:400], "header ends inside|claims"),
        "data cut": (data[:-100], "runs past the end of the file"),
        "kv count": (data[:16] + struct.pack("<Q", 1 << 60) + data[24:], "metadata entries"),
    }
    for label, (blob, pattern) in cases.items():
        p = _write(tmp_path, blob)
        with pytest.raises(ModelFormatError, match=pattern) as e:
            open_model(p)
        assert e.value.path == p, label

    pos = _tensor_info_pos(data, "blk.0.attn_v.weight")
    bad = bytearray(data)
    struct.pack_into("<I", bad, pos, 5)
    with pytest.raises(ModelFormatError, match="5 dimensions"):
        open_model(_write(tmp_path, bad))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, pos + 4, 128)             # ne[0]: 256 -> 128, Q4_K blocks are 256
    with pytest.raises(ModelFormatError, match="not a multiple of the Q4_K block size"):
        open_model(_write(tmp_path, bad))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, pos + 4 + 8, 128)          # ne[1]: 64 -> 128 rows: offsets disagree
    with pytest.raises(ModelFormatError, match="expected .* from the sizes"):
        open_model(_write(tmp_path, bad))
    bad = bytearray(data)
    struct.pack_into("<I", bad, pos + 4 + 16, 99)         # unknown ggml type id
    with pytest.raises(UnsupportedTensorType, match="type id 99"):
        open_model(_write(tmp_path, bad))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, pos + 4 + 16 + 4, 1 << 40)   # data offset far past EOF
    with pytest.raises(ModelFormatError, match="data offset"):
        open_model(_write(tmp_path, bad))


def test_gguf_huge_array_length_fails_fast(tmp_path, good_gguf):
    """gguf.GGUFReader loops ~2**64 times on this; we must refuse at once."""
    path, data, _ = good_gguf
    key = b"tokenizer.ggml.token_type"
    i = data.index(key) + len(key) + 4 + 4          # value type, element type -> the length
    for n in (1 << 62, (1 << 64) - 1, 10 ** 9):
        bad = bytearray(data)
        struct.pack_into("<Q", bad, i, n)
        t0 = time.perf_counter()
        with pytest.raises(ModelFormatError, match="token_type"):
            open_model(_write(tmp_path, bad))
        assert time.perf_counter() - t0 < 2.0


def test_gguf_missing_path_and_not_a_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file") as e:
        open_model(tmp_path / "absent.gguf")
    assert e.value.path.endswith("absent.gguf")
    (tmp_path / "x.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelFormatError, match="config.json"):
        open_model(tmp_path / "x.safetensors")


def test_gguf_writer_refuses_what_gguf_cannot_say(tmp_path, rng):
    cfg = tiny_config("qwen3")
    t = {"token_embd.weight": np.zeros((96, 64), np.float32)}
    with pytest.raises(ValueError, match="attention_bias"):
        write_gguf(tmp_path / "a.gguf", dataclasses.replace(cfg, attention_bias=True), t)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        write_gguf(tmp_path / "a.gguf", cfg, {**t, "output.weight": t["token_embd.weight"]})
    hyb = tiny_config("qwen35")
    odd = [LINEAR_ATTENTION, FULL_ATTENTION, FULL_ATTENTION] + [LINEAR_ATTENTION] * 5
    with pytest.raises(ValueError, match="full_attention_interval"):
        write_gguf(tmp_path / "a.gguf", dataclasses.replace(hyb, layer_types=odd), t)
    with pytest.raises(ValueError, match="bytes given"):
        write_gguf(tmp_path / "a.gguf", cfg, {**t, "q": QuantizedTensor(np.zeros(10, np.uint8), Q8_0, (32,))})
    assert interval_from_layer_types(layer_types_from_interval(10, 5)) == 5
    assert interval_from_layer_types(odd) is None


# --------------------------------------------------------------------- HF safetensors
def _save_st(path, tensors: dict):
    """Write a safetensors file with torch (the only writer with bf16/fp8)."""
    import torch
    from safetensors.torch import save_file
    save_file({k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v, order="C")))
               for k, v in tensors.items()}, str(path))


HF_CONFIGS = {
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=96, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, max_position_embeddings=4096, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=21),
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=96,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=4096,
                  tie_word_embeddings=True, attention_bias=False, eos_token_id=2),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=128,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, vocab_size=96, rms_norm_eps=1e-6, max_position_embeddings=4096,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=64, intermediate_size=128,
                       num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, vocab_size=96, rms_norm_eps=1e-6, rope_theta=10000000.0,
                       partial_rotary_factor=0.25, full_attention_interval=4,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, norm_topk_prob=True),
    "qwen3_5_text": dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, vocab_size=96, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.25,
                                          "mrope_section": [11, 11, 10], "mrope_interleaved": True},
                         layer_types=layer_types_from_interval(8, 4), linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                         linear_conv_kernel_dim=4, mtp_num_hidden_layers=1, eos_token_id=2),
    "qwen3_5_moe_text": dict(model_type="qwen3_5_moe_text", hidden_size=64, num_hidden_layers=8,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                             vocab_size=96, rms_norm_eps=1e-6, rope_theta=10000000.0,
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=8, num_experts=8,
                             num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=48, mtp_num_hidden_layers=1),
}
# transformers 5 saves Qwen3-MoE's expert count under its attribute_map name
HF_CONFIGS["qwen3_moe/num_local_experts"] = {
    **{k: v for k, v in HF_CONFIGS["qwen3_moe"].items() if k != "num_experts"},
    "num_local_experts": 8}
HF_CONFIGS["qwen3_5"] = dict(model_type="qwen3_5", tie_word_embeddings=False,
                             text_config=HF_CONFIGS["qwen3_5_text"],
                             vision_config={"model_type": "qwen3_5_vision", "depth": 2})
HF_CONFIGS["qwen3_5_moe"] = dict(model_type="qwen3_5_moe", tie_word_embeddings=False,
                                 text_config=HF_CONFIGS["qwen3_5_moe_text"])


def _hf_dir(tmp_path, config: dict, tensors: dict | None = None, name="hf"):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    if tensors is None:
        tensors = {"model.embed_tokens.weight": np.zeros((4, 8), np.float32),
                   "lm_head.weight": np.zeros((4, 8), np.float32)}
    _save_st(d / "model.safetensors", tensors)
    return d


def _transformers_config(config: dict):
    from transformers import AutoConfig
    c = AutoConfig.for_model(**config)
    return c.get_text_config() if hasattr(c, "get_text_config") else c


@pytest.mark.parametrize("model_type", sorted(HF_CONFIGS))
def test_hf_config_agrees_with_transformers(tmp_path, model_type):
    """config.json semantics (defaults, rope dicts, nested text_config, layer_types) as
    transformers' own configuration classes read them."""
    cj = HF_CONFIGS[model_type]
    src = open_model(_hf_dir(tmp_path, cj))
    c, ref = src.config, _transformers_config(cj)
    assert src.format == "safetensors" and src.metadata == json.loads(json.dumps(cj))
    for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "rms_norm_eps", "max_position_embeddings"):
        assert getattr(c, f) == getattr(ref, f), f
    assert c.head_dim == getattr(ref, "head_dim", ref.hidden_size // ref.num_attention_heads)
    rp = ref.rope_parameters
    assert c.rope_theta == rp["rope_theta"]
    assert c.partial_rotary_factor == rp.get("partial_rotary_factor", 1.0)
    ref_types = getattr(ref, "layer_types", None) or [FULL_ATTENTION] * ref.num_hidden_layers
    assert c.layer_types == list(ref_types)
    if c.family in ("qwen3moe", "qwen3next", "qwen35moe"):
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == \
               (ref.num_experts, ref.num_experts_per_tok, ref.moe_intermediate_size)
        assert c.shared_expert_intermediate_size == getattr(ref, "shared_expert_intermediate_size", 0)
        assert c.norm_topk_prob == getattr(ref, "norm_topk_prob", True)
    if c.family in ("qwen3next", "qwen35", "qwen35moe"):
        for f in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim"):
            assert getattr(c, f) == getattr(ref, f), f
        assert c.attn_output_gate and c.qk_norm
    assert c.attention_bias == (c.family == "qwen2")
    assert c.mtp_num_hidden_layers == getattr(ref, "mtp_num_hidden_layers", 0)


@pytest.mark.parametrize("model_type", sorted(HF_CONFIGS))
def test_hf_config_survives_gguf_round_trip(tmp_path, rng, model_type):
    """HF config -> write_gguf -> read back: both formats give the same ModelConfig."""
    hf = open_model(_hf_dir(tmp_path, HF_CONFIGS[model_type])).config
    t = {"token_embd.weight": np.zeros((hf.vocab_size, hf.hidden_size), np.float32)}
    if not hf.tie_word_embeddings:
        t["output.weight"] = t["token_embd.weight"]
    back = open_model(write_gguf(tmp_path / "m.gguf", hf, t)).config
    assert without_source(back) == without_source(hf)


def test_hf_tensors_bytes_and_values(tmp_path, rng):
    import torch
    from safetensors import safe_open
    x = rng.standard_normal((6, 32)).astype(np.float32)
    tensors = {
        "model.embed_tokens.weight": x,
        "f16": x.astype(np.float16),
        "bf16": torch.from_numpy(x).to(torch.bfloat16),
        "fp8": torch.from_numpy(x).to(torch.float8_e4m3fn),
        "packed_u8": rng.integers(0, 256, (6, 16), dtype=np.uint8),
        "i8": rng.integers(-128, 128, (5,), dtype=np.int8),
        "scalar": np.array(0.5, np.float32),
        "e5m2": torch.from_numpy(x[:2]).to(torch.float8_e5m2),
    }
    d = _hf_dir(tmp_path, HF_CONFIGS["qwen3"], tensors)
    src = open_model(d)
    assert sorted(src.names()) == sorted(tensors)
    assert src.config.tie_word_embeddings                    # no lm_head.weight
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        for name in tensors:
            ref = f.get_tensor(name)
            raw = src.raw(name)
            assert raw.tobytes() == ref.reshape(-1).view(torch.uint8).numpy().tobytes(), name
            assert src.info(name).shape == tuple(ref.shape)
            assert not raw.flags.owndata and not raw.flags.writeable
    assert src.info("bf16").qtype == BF16 and src.info("fp8").qtype == QTYPE_FP8_E4M3
    assert src.info("packed_u8").qtype == QTYPE_U8 and src.info("f16").qtype == 1
    np.testing.assert_array_equal(src.dequantize("model.embed_tokens.weight"), x)
    np.testing.assert_array_equal(src.dequantize("bf16"), tensors["bf16"].float().numpy())
    np.testing.assert_array_equal(src.dequantize("fp8"), tensors["fp8"].float().numpy())
    np.testing.assert_array_equal(src.dequantize("i8"), tensors["i8"].astype(np.float32))
    assert src.dequantize("scalar").shape == () and float(src.dequantize("scalar")) == 0.5
    # U8 is a plain integer (its values are the bytes); E5M2 has no codec: carried raw only
    np.testing.assert_array_equal(src.dequantize("packed_u8"), tensors["packed_u8"].astype(np.float32))
    assert src.raw("e5m2").tobytes() == tensors["e5m2"].view(torch.uint8).numpy().tobytes()
    with pytest.raises(UnsupportedTensorType, match="F8_E5M2"):
        src.dequantize("e5m2")


def test_hf_sharded_index(tmp_path, rng):
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIGS["qwen3_5"]))
    a = {"model.language_model.embed_tokens.weight": rng.standard_normal((96, 64)).astype(np.float32)}
    b = {"lm_head.weight": rng.standard_normal((96, 64)).astype(np.float32),
         "mtp.layers.0.input_layernorm.weight": np.ones(64, np.float32)}
    _save_st(d / "model-00001-of-00002.safetensors", a)
    _save_st(d / "model-00002-of-00002.safetensors", b)
    wm = {**{k: "model-00001-of-00002.safetensors" for k in a},
          **{k: "model-00002-of-00002.safetensors" for k in b}}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    src = open_model(d)
    assert set(src.names()) == set(wm)
    np.testing.assert_array_equal(src.dequantize("lm_head.weight"), b["lm_head.weight"])
    assert src.config.family == "qwen35" and not src.config.tie_word_embeddings
    assert src.config.mtp_num_hidden_layers == 1

    wm["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ModelFormatError, match="model.norm.weight"):
        open_model(d)
    wm.pop("model.norm.weight")
    wm["x"] = "model-00003-of-00003.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ModelFormatError, match="00003.*missing") as e:
        open_model(d)
    assert e.value.path.endswith("model-00003-of-00003.safetensors")
    wm["x"] = "../etc/passwd"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ModelFormatError, match="not a file in the checkpoint"):
        open_model(d)
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        open_model(d)


def test_hf_config_details(tmp_path):
    names = {"lm_head.weight"}
    p = "cfg.json"
    base = HF_CONFIGS["qwen3_next"]
    # layer_types from the interval; explicit layer_types win over it
    c = config_from_hf({**base, "full_attention_interval": 2}, names, p)
    assert c.layer_types == layer_types_from_interval(8, 2)
    lt = [FULL_ATTENTION] + [LINEAR_ATTENTION] * 7
    assert config_from_hf({**base, "layer_types": lt}, names, p).layer_types == lt
    # rope_scaling (older files) overrides rope_parameters; yarn is recorded, not dropped
    c = config_from_hf({**HF_CONFIGS["qwen3"], "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
        "rope_theta": 5e6}}, names, p)
    assert c.rope_theta == 5e6
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 32768}
    # partial rotary default differs by family, as in transformers
    no_prf = {k: v for k, v in base.items() if k != "partial_rotary_factor"}
    assert config_from_hf(no_prf, names, p).partial_rotary_factor == 0.25
    assert config_from_hf(HF_CONFIGS["qwen3"], names, p).partial_rotary_factor == 1.0
    # eos lists, plus generation_config's
    c = config_from_hf({**HF_CONFIGS["qwen3"], "eos_token_id": [7, 8]}, names, p,
                       {"eos_token_id": [8, 9]})
    assert c.eos_token_id == 7 and c.eos_token_ids == [7, 8, 9]
    # norm_topk_prob defaults: qwen3_moe False, qwen3_next True (transformers' class defaults)
    no_norm = {k: v for k, v in HF_CONFIGS["qwen3_moe"].items() if k != "norm_topk_prob"}
    assert config_from_hf(no_norm, names, p).norm_topk_prob is False
    no_norm = {k: v for k, v in base.items() if k != "norm_topk_prob"}
    assert config_from_hf(no_norm, names, p).norm_topk_prob is True
    # MTP layers counted from the tensors when the config does not say
    q35 = {k: v for k, v in HF_CONFIGS["qwen3_5_text"].items() if k != "mtp_num_hidden_layers"}
    mtp_names = {"mtp.layers.0.x", "mtp.layers.1.y", "mtp.fc.weight"}
    assert config_from_hf(q35, mtp_names, p).mtp_num_hidden_layers == 2
    assert config_from_hf(q35, set(), p).mtp_num_hidden_layers == 0


def test_hf_bad_inputs(tmp_path):
    cj = HF_CONFIGS["qwen3"]
    d = tmp_path / "nocfg"
    d.mkdir()
    _save_st(d / "model.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(ModelFormatError, match="config.json") as e:
        open_model(d)
    assert e.value.path.endswith("config.json")
    (d / "config.json").write_text("{ nope")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        open_model(d)
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelFormatError, match="not a JSON object"):
        open_model(d)
    (d / "config.json").write_text(json.dumps({k: v for k, v in cj.items() if k != "hidden_size"}))
    with pytest.raises(ModelFormatError, match="hidden_size"):
        open_model(d)
    (d / "config.json").write_text(json.dumps({**cj, "num_hidden_layers": "3"}))
    with pytest.raises(ModelFormatError, match="num_hidden_layers.*integer"):
        open_model(d)
    (d / "config.json").write_text(json.dumps({**cj, "model_type": "llama"}))
    with pytest.raises(UnsupportedArchitecture, match="llama"):
        open_model(d)
    (d / "config.json").write_text(json.dumps({**cj, "use_sliding_window": True}))
    with pytest.raises(UnsupportedArchitecture, match="sliding"):
        open_model(d)
    e2 = tmp_path / "empty"
    e2.mkdir()
    (e2 / "config.json").write_text(json.dumps(cj))
    with pytest.raises(ModelFormatError, match="no \\*.safetensors"):
        open_model(e2)


def _st_bytes(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_safetensors_bad_headers(tmp_path):
    d = _hf_dir(tmp_path, HF_CONFIGS["qwen3"])
    f = d / "model.safetensors"
    ok = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "I8", "shape": [4], "data_offsets": [16, 20]}}
    f.write_bytes(_st_bytes(ok, bytes(20)))
    assert sorted(open_model(d).names()) == ["a", "b"]
    cases = {
        "short": (b"\x01\x02", "too short"),
        "huge header": (struct.pack("<Q", 1 << 62) + b"{}", "exceeds the safetensors limit"),
        "header past EOF": (struct.pack("<Q", 500) + b"{}", "runs past the end"),
        "not json": (struct.pack("<Q", 4) + b"{{{{", "not valid UTF-8 JSON"),
        "not utf8": (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid UTF-8 JSON"),
        "list header": (_st_bytes([], b""), "not a JSON object"),  # type: ignore[arg-type]
        "dtype": (_st_bytes({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)),
                  "dtype 'Q9'"),
        "shape": (_st_bytes({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)),
                  "shape"),
        "size": (_st_bytes({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
                 "takes 12 bytes"),
        "truncated": (_st_bytes(ok, bytes(10)), "past the end of the file"),
        "overlap": (_st_bytes({**ok, "b": {"dtype": "I8", "shape": [4], "data_offsets": [12, 16]}},
                              bytes(20)), "overlap or leave a hole"),
        "hole": (_st_bytes({"a": ok["a"]}, bytes(20)), "cover 16 data bytes"),
        "offsets": (_st_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4)),
                    "data_offsets"),
    }
    for label, (blob, pattern) in cases.items():
        f.write_bytes(blob)
        with pytest.raises(ModelFormatError, match=pattern) as e:
            open_model(d)
        assert e.value.path == str(f), label


def test_open_model_dispatch(tmp_path, rng):
    cfg = tiny_config("qwen2")
    p = write_gguf(tmp_path / "weights.bin", cfg, tiny_tensors(cfg, rng))   # any name: it's a file
    assert open_model(p).format == "gguf"
    assert open_model(os.fspath(_hf_dir(tmp_path, HF_CONFIGS["qwen2"]))).format == "safetensors"
    for bad in (tmp_path / "missing", tmp_path / "missing.gguf"):
        with pytest.raises(Bw24Error):
            open_model(bad)
