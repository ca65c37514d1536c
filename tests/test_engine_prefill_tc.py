"""Prefill attention on the tensor cores (kernels/attention_tc.py) through the engine.

The checked-in fixtures' heads are 16 / 24 wide, which the kernel does not serve; conftest's
tiny hybrid has 32-wide heads, so its prefill takes the kernel by default
(`prefill_attention="auto"`). The kernel rounds q and the softmax weights to f16, so prefill's
logits move against the split-K kernels' by f16 rounding:
  * on float activations by that rounding alone, smoothly: 1.8e-5 .. 4.3e-5 of the largest
    |logit| over 12 random prompts (session 47); TOL_F32 = 2^-10, two f16 roundings;
  * on int8 activations (the default) the same rounding can move a value across an int8
    rounding step, and the logits then move in steps: 2.6e-6 .. 7.7e-3 over those prompts,
    1.1e-2 on one CI prompt (session 47, which is why this test no longer bounds it by 1e-2).
    Such steps are bounded by what int8 activations do to the logits on their own, ~0.09
    against the float reference on this model: TOL_Q8 = 0.1 catches a broken kernel (wrong
    heads, keys or weights move the logits by O(1)), not rounding.
"""
import numpy as np
import pytest

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType

TOL_F32 = 2.0 ** -10
TOL_Q8 = 0.1


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def _engine(path, **kw):
    return Engine(open_model(path), n_ctx=24, k_type=QType.F16, v_type=QType.F16,
                  log=lambda m: None, **kw)


@pytest.mark.parametrize("act_quant,tol", [("f32", TOL_F32), ("q8", TOL_Q8)])
def test_prefill_on_tensor_cores_matches_the_split_kernels(int8_heads_hybrid, rng, act_quant,
                                                            tol):
    tc = _engine(int8_heads_hybrid, act_quant=act_quant)
    split = _engine(int8_heads_hybrid, act_quant=act_quant, prefill_attention="split")
    assert (tc.prefill_attention, split.prefill_attention) == ("tc", "split")
    names = [n for n, _ in tc._forward_launches(tc.wsp, 9)]
    assert "attention" in names and "attn_gate" in names      # gated: the gate its own launch
    prompt = [int(t) for t in rng.integers(0, tc.config.vocab_size, 9)]
    a, b = tc.prefill(prompt), split.prefill(prompt)
    assert np.isfinite(a).all()
    assert rel(a, b) <= tol
    assert not np.array_equal(a, b)         # the two kernels really differ (f16 q and P)
    # decode goes on from either prefill's cache and states (its kernels are the same)
    t = int(b.argmax())
    assert rel(tc.decode(t), split.decode(t)) <= tol


def test_tensor_core_prefill_refuses_a_cache_it_cannot_read(int8_heads_hybrid):
    with pytest.raises(ValueError, match="needs an F16/F16 KV cache"):
        Engine(open_model(int8_heads_hybrid), n_ctx=24, k_type=QType.Q8_0, v_type=QType.F16,
               log=lambda m: None, prefill_attention="tc")
    eng = Engine(open_model(int8_heads_hybrid), n_ctx=24, k_type=QType.Q8_0, v_type=QType.F16,
                 log=lambda m: None)
    assert eng.prefill_attention == "split"          # "auto" falls back
