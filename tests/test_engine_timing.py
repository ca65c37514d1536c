"""The device-time helpers spec_bench reads (decision 0039): Engine.time_decode_steps and
EngineSpecTarget.time_verify replay a captured step back to back and must leave the sequence
as they found it -- the next decode gives the token it gives without them. In the simulator
`replay_ms` falls back to the wall clock (its events keep no time)."""
import numpy as np
import pytest

from bw24nb.engine import Engine
from bw24nb.errors import ContextOverflow
from bw24nb.formats import open_model
from bw24nb.quant import QType


def test_timing_decode_and_verify_leaves_the_sequence(int8_heads_hybrid):
    from bw24nb.engine_spec import EngineSpecTarget
    eng = Engine(open_model(int8_heads_hybrid), n_ctx=12, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None)
    t = EngineSpecTarget(eng)
    x = int(t.prefill([3, 17, 101]).argmax[-1])
    snap = t.snapshot()
    want = t.decode(x)
    t.restore(snap)

    steps = eng.time_decode_steps(x, replays=1, reps=1)
    verify = t.time_verify([x, 5, 9], replays=1, reps=1)
    assert len(steps) == 1 and len(verify) == 1
    assert all(np.isfinite(v) and v > 0 for v in steps + verify)
    assert eng.position == 3
    got = t.decode(x)
    np.testing.assert_array_equal(got.argmax, want.argmax)
    np.testing.assert_array_equal(np.asarray(got.hidden).view(np.uint32),
                                  np.asarray(want.hidden).view(np.uint32))
    with pytest.raises(ContextOverflow, match="timing 10 decode steps"):
        eng.time_decode_steps(x, replays=10)
