"""Fuzz the format readers: a mutated model file must either load with consistent tensors or
raise a bw24nb.errors.Bw24Error -- never another exception, never a hang.

Base files are small real models written by bw24nb's GGUF writer (and a safetensors
checkpoint written by the safetensors library). Mutations: byte flips (mostly in the header,
where they matter), truncations, integer header fields overwritten with hostile values (field
positions found by gguf.GGUFReader on the clean file), and spliced/deleted byte runs.
"""
import json
import os
import signal
import struct

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bw24nb.errors import Bw24Error
from bw24nb.formats import FULL_ATTENTION, ModelConfig, open_model
from bw24nb.formats.config import layer_types_from_interval
from bw24nb.formats.gguf_writer import QuantizedTensor, write_gguf

HANG_SECONDS = 10   # one example does ~1 ms of work; anything near this is a loop on bad counts
SETTINGS = dict(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Hang(Exception):
    """Not a Bw24Error: raised by the alarm, it fails the test."""


def _alarm(signum, frame):
    raise Hang(f"open_model/reading took over {HANG_SECONDS} s")


def check_file(path: str):
    """Open + read every tensor. Returns None for a Bw24Error, else the source's layout
    (data offset, {name: absolute offset}); any other exception propagates."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        try:
            src = open_model(path)
        except Bw24Error:
            return None
        cfg = src.config
        assert len(cfg.layer_types) == cfg.num_hidden_layers > 0
        for name in src.names():
            info = src.info(name)
            raw = src.raw(name)
            assert raw.dtype == np.uint8 and raw.nbytes == info.nbytes
            assert info.offset + info.nbytes <= os.path.getsize(info.file)
            try:
                with np.errstate(all="ignore"):
                    x = src.dequantize(name)
            except Bw24Error:
                continue
            assert x.dtype == np.float32 and x.shape == info.shape
        return getattr(src, "data_offset", None), {n: src.info(n).offset for n in src.names()}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------ base files
def _hybrid_config() -> ModelConfig:
    return ModelConfig(
        family="qwen35moe", vocab_size=40, hidden_size=32, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, intermediate_size=0,
        rms_norm_eps=1e-6, rope_theta=1e7, max_position_embeddings=1024,
        tie_word_embeddings=False, partial_rotary_factor=0.25, qk_norm=True,
        attn_output_gate=True, layer_types=layer_types_from_interval(4, 2),
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, mtp_num_hidden_layers=1,
        eos_token_id=3, eos_token_ids=[3, 4])


def _dense_config() -> ModelConfig:
    return ModelConfig(
        family="qwen2", vocab_size=40, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=1024,
        tie_word_embeddings=True, attention_bias=True, qk_norm=False,
        layer_types=[FULL_ATTENTION] * 2, bos_token_id=1, eos_token_id=2)


def _tensors(cfg: ModelConfig, rng) -> dict:
    h = cfg.hidden_size
    t = {
        "token_embd.weight": rng.standard_normal((cfg.vocab_size, h)).astype(np.float16),
        "blk.0.attn_q.weight": QuantizedTensor(gguf.quants.quantize(
            rng.standard_normal((2, 256)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
            8, (2, 256)),
        "blk.0.ffn_up.weight": QuantizedTensor(
            rng.integers(0, 256, (2, 144), dtype=np.uint8), 12, (2, 256)),
        "blk.1.ffn_down.weight": QuantizedTensor(
            rng.integers(0, 256, (1, 210), dtype=np.uint8), 14, (1, 256)),
        "blk.1.attn_norm.weight": rng.standard_normal(h).astype(np.float32),
        "blk.1.ssm_a": QuantizedTensor(rng.integers(0, 256, 16, dtype=np.uint8), 30, (8,)),
        "blk.1.idx": np.arange(5, dtype=np.int32),
    }
    if not cfg.tie_word_embeddings:
        t["output.weight"] = rng.standard_normal((cfg.vocab_size, h)).astype(np.float32)
    return t


def _tokenizer(n: int) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(n)],
            "tokenizer.ggml.token_type": [1] * n, "tokenizer.ggml.scores": [0.5] * n,
            "tokenizer.ggml.merges": ["t 1", "t 2"], "tokenizer.ggml.add_bos_token": True}


def _int_field_positions(path: str) -> list[tuple[int, int]]:
    """(offset, width) of every integer field in the GGUF header, located by gguf-py's reader
    on the clean file: counts, lengths, types, dimensions, offsets."""
    r = gguf.GGUFReader(path)
    base = r.data.__array_interface__["data"][0]
    fields = list(r.fields.values()) + [t.field for t in r.tensors]
    out = set()
    for f in fields:
        # Keys/values/array headers are the first parts; beyond the first few elements of an
        # array the parts are more of the same (string lengths), so keep only a few of those.
        for part in f.parts[:10]:
            if part.dtype in (np.uint32, np.uint64) and part.size == 1:
                out.add((part.__array_interface__["data"][0] - base, part.dtype.itemsize))
    return sorted(out)


class _Quiet(dict):
    """Fixture payload that hypothesis can print in a falsifying example without dumping
    whole files."""

    def __repr__(self):
        return "<base files>"


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    rng = np.random.default_rng(1234)
    d = tmp_path_factory.mktemp("fuzz")
    out = []
    for cfg in (_hybrid_config(), _dense_config()):
        p = write_gguf(d / f"{cfg.family}.gguf", cfg, _tensors(cfg, rng),
                       tokenizer=_tokenizer(cfg.vocab_size))
        layout = check_file(p)
        assert layout is not None                                   # the clean file loads
        r = gguf.GGUFReader(p)
        out.append({"blob": open(p, "rb").read(), "header_len": int(r.data_offset),
                    "fields": _int_field_positions(p), "layout": layout})
    return _Quiet(files=out, dir=d)


def _run(bases, which: int, blob: bytes):
    path = str(bases["dir"] / "mutant.gguf")
    with open(path, "wb") as f:
        f.write(blob)
    layout = check_file(path)
    base_start, base_offsets = bases["files"][which]["layout"]
    if layout is not None and layout[0] == base_start:
        # Same data section: a header mutation that still loads must not move any tensor
        # (the tensor table's offsets are checked against the shapes and types).
        for name, offset in layout[1].items():
            if name in base_offsets:
                assert offset == base_offsets[name], name
    return layout


# ------------------------------------------------------------------------------ GGUF
HOSTILE = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 24, 30, 31, 40, 255, 256, 1 << 16, (1 << 31) - 1,
           1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 62, 1 << 63, (1 << 64) - 1]


@settings(max_examples=400, **SETTINGS)
@given(which=st.integers(0, 1), data=st.data())
def test_gguf_byte_flips(bases, which, data):
    base = bases["files"][which]
    blob = bytearray(base["blob"])
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        in_header = data.draw(st.booleans()) or data.draw(st.booleans())   # 3/4 in the header
        hi = base["header_len"] if in_header else len(blob)
        pos = data.draw(st.integers(0, hi - 1))
        blob[pos] ^= data.draw(st.integers(1, 255))
    _run(bases, which, bytes(blob))


@settings(max_examples=150, **SETTINGS)
@given(which=st.integers(0, 1), data=st.data())
def test_gguf_truncations(bases, which, data):
    base = bases["files"][which]
    cut = data.draw(st.integers(0, len(base["blob"]) - 1))
    assert _run(bases, which, base["blob"][:cut]) is None or cut >= base["header_len"]


@settings(max_examples=350, **SETTINGS)
@given(which=st.integers(0, 1), data=st.data())
def test_gguf_header_fields(bases, which, data):
    base = bases["files"][which]
    blob = bytearray(base["blob"])
    for _ in range(data.draw(st.integers(1, 3))):
        pos, width = data.draw(st.sampled_from(base["fields"]))
        value = data.draw(st.one_of(st.sampled_from(HOSTILE),
                                    st.integers(0, (1 << (8 * width)) - 1)))
        value %= 1 << (8 * width)
        struct.pack_into("<I" if width == 4 else "<Q", blob, pos, value)
    _run(bases, which, bytes(blob))


@settings(max_examples=150, **SETTINGS)
@given(which=st.integers(0, 1), data=st.data())
def test_gguf_splices(bases, which, data):
    base = bases["files"][which]
    blob = base["blob"]
    pos = data.draw(st.integers(0, base["header_len"]))
    cut = data.draw(st.integers(0, 64))
    insert = data.draw(st.binary(max_size=64))
    _run(bases, which, blob[:pos] + insert + blob[pos + cut:])


# ------------------------------------------------------------------------- safetensors
@pytest.fixture(scope="module")
def st_base(tmp_path_factory):
    import torch
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("stfuzz")
    rng = np.random.default_rng(99)
    x = torch.from_numpy(rng.standard_normal((4, 16)).astype(np.float32))
    save_file({"model.embed_tokens.weight": x, "a.bf16": x.to(torch.bfloat16),
               "a.fp8": x.to(torch.float8_e4m3fn), "a.u8": x.to(torch.uint8),
               "a.i8": x.to(torch.int8), "a.f16": x.half()}, str(d / "model.safetensors"))
    config = {"model_type": "qwen3", "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 8, "vocab_size": 4, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": True, "eos_token_id": 2}
    blob = (d / "model.safetensors").read_bytes()
    return _Quiet(dir=d, blob=blob, config=json.dumps(config).encode(),
                  header_len=8 + struct.unpack_from("<Q", blob)[0])


@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_safetensors_mutations(st_base, data):
    d = st_base["dir"]
    blob, cfg = bytearray(st_base["blob"]), bytearray(st_base["config"])
    kind = data.draw(st.sampled_from(["flip", "truncate", "digit", "config"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 6))):
            pos = data.draw(st.integers(0, st_base["header_len"] - 1))
            blob[pos] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        blob = blob[:data.draw(st.integers(0, len(blob) - 1))]
    elif kind == "digit":        # keep the JSON valid, change a number (shape, offset, length)
        digits = [i for i in range(st_base["header_len"]) if chr(blob[i]).isdigit()]
        for _ in range(data.draw(st.integers(1, 3))):
            blob[data.draw(st.sampled_from(digits))] = ord(data.draw(st.sampled_from("0123456789")))
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(cfg) - 1))
            cfg[pos] = data.draw(st.sampled_from(b'0123456789",:{}[]tfn-.e '))
    (d / "model.safetensors").write_bytes(bytes(blob))
    (d / "config.json").write_bytes(bytes(cfg))
    check_file(str(d))
