"""Stacked decode matvecs (Engine._stack_decode_weights): weights that read the same input --
ffn_gate + ffn_up, attn_qkv + attn_gate, attn_q + attn_k + attn_v (+ their biases), ssm_beta +
ssm_alpha -- run as one matvec launch in a decode step. Each member's rows keep their own
split (DeviceWeight.parts), so decode must give the very bits it gives with one launch per
weight. Prefill reads the members as views into the stack (tests/test_engine.py's prefill
checks cover them)."""
import numpy as np
import pytest

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType

CASES = {"qwen2": {"gu", "qkv", "qkv_bias"}, "qwen35": {"ba", "gu", "qkv", "qkvz"}}


def _decode(eng, ids):
    eng.reset()
    return np.stack([eng.decode(t) for t in ids])


def _engine(fixture):
    src = open_model(f"tests/fixtures/{fixture}/model.gguf")
    # eager launches: the graph would replay the same list (tests/test_engine.py covers it)
    return src, Engine(src, n_ctx=8, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                       use_graph=False)


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_stacked_decode_gives_the_bits_of_separate_launches(fixture, rng):
    src, eng = _engine(fixture)
    assert {what for _, what in eng.stacks} == CASES[fixture]
    ids = [int(rng.integers(0, src.config.vocab_size))]
    names = [n for n, _ in eng._decode_step()]
    stacked = _decode(eng, ids)

    eng.stacks, eng._graph = {}, None          # one launch per weight again
    separate = _decode(eng, ids)
    assert len(names) < len(eng._decode_step())
    assert "ffn_gate_up" in names and "ffn_gate" not in names
    assert "attn_qkv" in names and "attn_k" not in names
    np.testing.assert_array_equal(stacked, separate)


def test_members_of_a_stack_are_views_into_it():
    _, eng = _engine("qwen35")
    layer, _ = next(k for k in eng.stacks if k[1] == "gu")
    st = eng.stacks[layer, "gu"]
    g, u = eng.w.blk(layer, "ffn_gate.weight"), eng.w.blk(layer, "ffn_up.weight")
    assert st.rows == g.rows + u.rows and st.cols == g.cols
    whole = st.buf.copy_to_host()
    np.testing.assert_array_equal(whole[:g.buf.size], g.buf.copy_to_host().reshape(-1))
    np.testing.assert_array_equal(whole[g.buf.size:], u.buf.copy_to_host().reshape(-1))


def test_fused_attention_output_gives_the_bits_of_separate_launches(rng):
    """Decode's attention combine applies the output gate itself (and, where head_dim % 32 == 0
    and attn_output takes int8 activations, writes that matvec's int8 input: kernel tests and
    kernel-check cover that half, the fixtures' head_dim is 16): the same bits as the
    sigmoid_mul and quantize_act launches it replaces."""
    src, eng = _engine("qwen35")
    assert eng.fuse_attention_output
    ids = [int(rng.integers(0, src.config.vocab_size))]
    names = [n for n, _ in eng._decode_step()]
    fused = _decode(eng, ids)
    eng.fuse_attention_output, eng._graph = False, None
    separate = _decode(eng, ids)
    assert "attn_gate" not in names and "attn_gate" in [n for n, _ in eng._decode_step()]
    np.testing.assert_array_equal(fused, separate)



@pytest.mark.parametrize("stacked", [True, False])
def test_projections_side_by_side_give_the_chains_bits(stacked, rng):
    """Engine._side_by_side: the projections of one input (Gated DeltaNet's qkv(z) and
    beta / alpha; q / k / v where they are not one stack) run on side streams, as parallel
    branches of the decode graph -- the same kernels on the same input, so the bits of one
    chain (proj_branches=False), here through a captured and replayed decode graph."""
    src = open_model("tests/fixtures/qwen35/model.gguf")
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 2)]
    out = {}
    for on in (True, False):
        eng = Engine(src, n_ctx=8, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                     proj_branches=on)
        if not stacked:
            eng.stacks = {}
        names = [n for n, _ in eng._decode_step()]
        if on:
            assert ("gdn_qkvz+gdn_ba" if stacked else "gdn_qkv+gdn_z+gdn_beta+gdn_alpha") in names
            assert stacked == ("attn_qkv" in names)
            assert stacked or "attn_q+attn_k+attn_v" in names
        else:
            assert not any("+" in n for n in names)
        out[on] = _decode(eng, ids)
    assert np.isfinite(out[True]).all()
    np.testing.assert_array_equal(out[True].view(np.uint32), out[False].view(np.uint32))


@pytest.fixture(scope="module")
def int8_heads_hybrid(tmp_path_factory):
    """A tiny qwen35 file whose DeltaNet heads are 32 wide (the fixtures' 16 are no int8
    block): decode then runs the GDN output norm with ssm_out's int8 copy, and the launch
    that folds it into the delta rule."""
    import dataclasses

    from bw24nb.factory import model_config, write_gguf_model
    from bw24nb.formats.config import validate_config
    cfg = dataclasses.replace(
        model_config("qwen3.5-0.8b", layers=4, vocab=256), hidden_size=64,
        intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32)
    cfg = validate_config(cfg, "tiny int8-head hybrid")
    path = tmp_path_factory.mktemp("gdn32") / "hybrid32.gguf"
    write_gguf_model(str(path), cfg, seed=11, threads=1, log=None)
    return str(path)


def test_gdn_rule_with_the_output_norm_gives_the_bits_of_two_launches(int8_heads_hybrid, rng,
                                                                      monkeypatch):
    """Decode's gated delta rule with the output norm (+ ssm_out's int8 input) folded in
    (engine.GDN_RULE_NORM, gated_deltanet.launch_gated_delta_rule_norm_q8) gives the logits
    of the two launches it replaces, bit for bit, over several steps (the state carried).
    Verify's rows (T > 1) take the same launch: tests/test_kernels_gdn.py checks its bits
    there."""
    from bw24nb import engine as engine_mod
    src = open_model(int8_heads_hybrid)
    eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                 use_graph=False)
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 3)]
    names = [n for n, _ in eng._decode_step()]
    assert "gdn_rule_norm_q8" in names and "gdn_rule" not in names
    assert "gdn_norm_q8" not in names
    fused = _decode(eng, ids)
    monkeypatch.setattr(engine_mod, "GDN_RULE_NORM", False)
    eng._graph = None
    names = [n for n, _ in eng._decode_step()]
    assert "gdn_rule" in names and "gdn_norm_q8" in names
    apart = _decode(eng, ids)
    assert np.isfinite(fused).all()
    np.testing.assert_array_equal(fused.view(np.uint32), apart.view(np.uint32))
