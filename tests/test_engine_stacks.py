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

    eng.stacks, eng._graphs = {}, {}         # one launch per weight again
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
    eng.fuse_attention_output, eng._graphs = False, {}
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



def test_verify_rows_on_the_gate_up_stack_give_the_bits_of_two_launches(int8_heads_hybrid,
                                                                        monkeypatch):
    """A verify's rows (T = K + 1) run ffn_gate + ffn_up as the stacked matvec too
    (engine.STACK_GATE_UP_ROWS), swiglu reading both halves of its [T, 2F] output
    (swiglu_fused_q8 on this int8 model; the float path's swiglu_fused at T = 1: the decode
    test above): every row's logits bit for bit those of the two launches (T = 3)."""
    from bw24nb import engine as engine_mod
    from bw24nb.engine_spec import EngineSpecTarget
    src = open_model(int8_heads_hybrid)
    eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                 use_graph=False)
    target = EngineSpecTarget(eng)
    ids = np.array([5, 17, 101], np.int32) % src.config.vocab_size
    out = {}
    for stacked in (True, False):
        monkeypatch.setattr(engine_mod, "STACK_GATE_UP_ROWS", stacked)
        target.graphs.clear("rows")
        names = [n for n, _ in target._rows_launches(3, head=True)]
        assert ("ffn_gate_up" in names) == stacked and ("ffn_gate" in names) != stacked
        assert "swiglu_q8" in names
        target.reset()
        target.prefill([7])
        out[stacked] = target.verify(ids, want_logits=True).logits
    assert np.isfinite(out[True]).all()
    np.testing.assert_array_equal(out[True].view(np.uint32), out[False].view(np.uint32))
