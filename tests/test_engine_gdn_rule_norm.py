"""Decode's gated delta rule with the GDN output norm folded in (engine.GDN_RULE_NORM,
gated_deltanet.launch_gated_delta_rule_norm_q8; decision 0034), through the engine. The
fixtures' DeltaNet heads are 16 wide, no int8 block, so their decode takes neither q8 norm:
these tests take conftest's tiny hybrid with 32-wide heads (`int8_heads_hybrid`). The kernel's bits against the two
launches, per shape: tests/test_kernels_gdn.py."""
import numpy as np
import pytest

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType


def _decode(eng, ids):
    eng.reset()
    return np.stack([eng.decode(t) for t in ids])


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
    eng._graphs = {}
    names = [n for n, _ in eng._decode_step()]
    assert "gdn_rule" in names and "gdn_norm_q8" in names
    apart = _decode(eng, ids)
    assert np.isfinite(fused).all()
    np.testing.assert_array_equal(fused.view(np.uint32), apart.view(np.uint32))


@pytest.mark.parametrize("fused_verify", [False, True], ids=["verify-apart", "verify-fused"])
def test_speculative_verify_through_the_fused_launch_is_token_identical(int8_heads_hybrid,
                                                                       fused_verify,
                                                                       monkeypatch):
    """Decode runs the fused launch; verify runs the lane rule then the norm over its K + 1
    rows (engine.GDN_RULE_NORM_MAX_T = 1, the default since session 34) or the fused launch
    (`fused_verify`, as before), saving every row's state for the rollback: speculative
    decoding reproduces plain greedy decoding token for token, with drafts that are all kept
    (scripted "mixed" drafts on this model: the verify's last state carries on) and with
    drafts that are all rejected ("adversarial": every round rolls the DeltaNet states back
    to the saved first row)."""
    from bw24nb import engine as engine_mod
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.spec import plain_greedy, spec_check
    if fused_verify:
        monkeypatch.setattr(engine_mod, "GDN_RULE_NORM_MAX_T", engine_mod.VERIFY_ROWS)
    eng = Engine(open_model(int8_heads_hybrid), n_ctx=24, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None)
    assert "gdn_rule_norm_q8" in [n for n, _ in eng._decode_step()]
    target = EngineSpecTarget(eng)
    verify_names = [n for n, _ in target._rows_launches(3, head=True)]
    assert ("gdn_rule_norm_q8" in verify_names) == fused_verify
    assert ("gdn_rule" in verify_names) != fused_verify
    prompt, n = [3, 17, 101], 5
    ref = plain_greedy(target, prompt, n)
    kept = {}
    for mode in ("mixed", "adversarial"):
        [row] = spec_check(target, prompt, n, ks=[2], draft_mode=mode, reference=ref,
                           live=False)
        assert row.match, (mode, row, ref)
        kept[mode] = (row.stats.accepted, row.stats.drafted)
    assert kept["mixed"][0] > 0 and kept["adversarial"][0] == 0 < kept["adversarial"][1]


def test_decode_with_the_conv_in_the_rule_norm_launch_keeps_its_bits(int8_heads_hybrid, rng,
                                                                     monkeypatch):
    """engine.GDN_CONV_RULE_NORM: decode's GDN conv + prep run inside the rule-norm launch
    (gated_deltanet.launch_gdn_conv_rule_norm_q8), one launch a layer fewer; the logits over
    several steps (conv windows and states carried) are the two launches' bit for bit, and a
    speculative round after it (verify keeps gdn_conv_prep) still matches plain decode."""
    from bw24nb import engine as engine_mod
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.spec import plain_greedy, spec_check
    src = open_model(int8_heads_hybrid)
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 4)]
    got = []
    for on in (False, True):
        monkeypatch.setattr(engine_mod, "GDN_CONV_RULE_NORM", on)
        eng = Engine(src, n_ctx=24, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                     use_graph=False)
        names = [n for n, _ in eng._decode_step()]
        assert ("gdn_conv_rule_norm_q8" in names) == on and ("gdn_conv_prep" in names) != on
        assert ("gdn_rule_norm_q8" in names) != on
        got.append(_decode(eng, ids))
        assert not eng.ws1.conv_counters.copy_to_host().any()
    assert np.isfinite(got[0]).all()
    np.testing.assert_array_equal(got[1].view(np.uint32), got[0].view(np.uint32))
    target = EngineSpecTarget(eng)              # on: decode fused, verify's rows apart
    prompt, n = [3, 17, 101], 5
    ref = plain_greedy(target, prompt, n)
    for mode in ("mixed", "adversarial"):
        [row] = spec_check(target, prompt, n, ks=[2], draft_mode=mode, reference=ref,
                           live=False)
        assert row.match, (mode, row, ref)
