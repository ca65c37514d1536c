"""The GPU engine end to end against the numpy reference (in the simulator on CI machines).

One hybrid MoE fixture covers every layer kind the engine wires: gated full attention with
partial RoPE and QK-norm, Gated DeltaNet (conv, delta rule, gated norm), the routed + shared
expert MoE block, and the CUDA-graph decode step (replayed through bw24nb.graph, which the
simulator emulates). The simulator runs every CUDA thread as a Python thread, so this file is
kept to a few steps (~10 min on a busy 2-core box); on the H200, bench/engine_gate.py runs the
same comparison over 32 greedy tokens plus gen's argmax gate for every fixture
(research/tune-data/gate.jsonl).

Tolerance: the KV cache is F16 here (the fixture's head_dim 16 has no q8_0 blocks), so K and V
carry f16 rounding (~5e-4 relative); matvec/matmul accumulate in float32 in another order than
the reference's float64 -> logits within 3e-3 of the largest |logit|.
"""
import numpy as np
import pytest

from bw24nb.formats import open_model
from bw24nb.quant import QType
from bw24nb.reference import load_reference

FIXTURE = "tests/fixtures/qwen35moe/model.gguf"
TOL = 3e-3


@pytest.fixture(scope="module")
def pair():
    from bw24nb.engine import Engine
    src = open_model(FIXTURE)
    eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None)
    ref, _ = load_reference(FIXTURE)
    return eng, ref


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_prefill_then_graph_decode_match_reference(pair):
    eng, ref = pair
    prompt = [7, 200, 31, 99]
    eng.reset()
    ref.reset()
    assert rel(eng.prefill(prompt), ref.prefill(prompt)[-1]) <= TOL
    e, r = eng.decode(5), ref.decode(5)      # first decode: warm-up, capture, replay
    assert rel(e, r) <= TOL and e.argmax() == r.argmax()
    assert eng._graphs and eng.position == len(prompt) + 1


def test_a_fresh_engine_decodes_from_position_zero():
    """decode() as the first call of a new engine: the decode step reads its position from
    device memory, which construction sets to 0 (it once held whatever the allocation did, and
    the step stored its K / V row at that position)."""
    from bw24nb.engine import Engine
    src = open_model(FIXTURE)
    eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                 use_graph=False)
    ref, _ = load_reference(FIXTURE)
    ref.reset()
    e, r = eng.decode(5), ref.decode(5)
    assert rel(e, r) <= TOL and e.argmax() == r.argmax() and eng.position == 1


def test_reset_rewinds_position_and_recurrent_state(pair):
    eng, _ = pair
    eng.reset()
    a = eng.prefill([7, 200])
    eng.reset()
    b = eng.prefill([7, 200])
    np.testing.assert_array_equal(a, b)     # no state leaks across reset (GDN state, position)


def test_prompt_longer_than_context_is_refused(pair):
    from bw24nb.errors import ContextOverflow
    eng, _ = pair
    eng.reset()
    with pytest.raises(ContextOverflow, match="exceed the context"):
        eng.prefill(list(range(17)))

