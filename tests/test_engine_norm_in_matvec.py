"""Decode's norms folded into the matvecs that read them (engine.NORM_IN_MATVEC,
kernels/matvec_normed.py), through the engine: on a Qwen2 fixture re-encoded with Q5_0 matrices (the
default 0.5B model's main type; q / k / v with biases), the decode step runs
attn_norm + the q / k / v stack and ffn_norm + the gate / up stack as one launch each, and its
logits are bit for bit those of the separate launches, in the captured graph too. The kernel's
bits against the two launches, per shape: tests/test_kernels_matvec_normed.py."""
import numpy as np
import pytest

from bw24nb import engine as engine_mod
from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType

from int8_gguf import requantized_gguf  # tests/int8_gguf.py (pytest puts tests/ on the path)


@pytest.fixture(scope="module")
def qwen2_q8(tmp_path_factory):
    return requantized_gguf("tests/fixtures/qwen2/model.gguf",
                            tmp_path_factory.mktemp("normed") / "qwen2-q.gguf",
                            [QType.Q5_0])


def _decode(path, rng_ids, use_graph):
    eng = Engine(open_model(path), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None, use_graph=use_graph)
    names = [n for n, _ in eng._decode_step()]
    eng.prefill(rng_ids[:3])
    return names, np.stack([eng.decode(t) for t in rng_ids[3:]])


def test_folded_norms_give_the_separate_launches_bits(qwen2_q8, rng, monkeypatch):
    """(In the captured graph: what decode replays.)"""
    use_graph = True
    src = open_model(qwen2_q8)
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 6)]
    L = src.config.num_hidden_layers
    names, folded = _decode(qwen2_q8, ids, use_graph)
    assert names.count("attn_norm+attn_qkv") == L and names.count("ffn_norm+ffn_gate_up") == L
    assert not any(n in ("attn_norm_q8", "ffn_norm_q8", "attn_qkv", "ffn_gate_up")
                   for n in names)
    monkeypatch.setattr(engine_mod, "NORM_IN_MATVEC", ())
    apart_names, apart = _decode(qwen2_q8, ids, use_graph)
    assert apart_names.count("attn_norm_q8") == L and apart_names.count("attn_qkv") == L
    assert len(apart_names) == len(names) + 2 * L
    assert np.isfinite(apart).all()
    np.testing.assert_array_equal(folded.view(np.uint32), apart.view(np.uint32))


def test_one_consumer_only(qwen2_q8, monkeypatch):
    """NORM_IN_MATVEC names the consumers: the q / k / v stack alone keeps ffn_norm apart."""
    monkeypatch.setattr(engine_mod, "NORM_IN_MATVEC", ("attn_qkv",))
    eng = Engine(open_model(qwen2_q8), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None, use_graph=False)
    names = [n for n, _ in eng._decode_step()]
    L = eng.config.num_hidden_layers
    assert names.count("attn_norm+attn_qkv") == L and names.count("ffn_norm_q8") == L
