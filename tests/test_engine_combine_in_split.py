"""The decode attention's combine run by the split pass's last block
(decode_attention.COMBINE_IN_SPLIT), through the engine: decode and verify give the bits of
the split pass + combine kernel. Per shape, with the gate and the int8 copy:
tests/test_kernels_attention.py."""
import numpy as np

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType


def test_decode_and_verify_with_the_combine_in_the_split_pass_keep_their_bits(
        int8_heads_hybrid, rng, monkeypatch):
    from bw24nb.engine_spec import EngineSpecTarget
    from bw24nb.kernels import decode_attention as da
    src = open_model(int8_heads_hybrid)
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 2)]
    draft = np.array([int(t) for t in rng.integers(0, src.config.vocab_size, 3)], np.int32)
    launches = []
    plain = da.launch_split

    def spy(*a, combine=None, **k):
        launches.append(combine is not None)
        return plain(*a, combine=combine, **k)
    monkeypatch.setattr(da, "launch_split", spy)
    got = []
    for on in (False, True):
        launches.clear()
        monkeypatch.setattr(da, "COMBINE_IN_SPLIT", on)
        eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                     use_graph=False)
        assert eng.ws1.counters is not None and not eng.ws1.counters.copy_to_host().any()
        eng.reset()
        logits = np.stack([eng.decode(t) for t in ids])
        target = EngineSpecTarget(eng)
        rows = target.verify(draft, want_logits=True)
        got.append((logits, rows.logits, np.asarray(rows.argmax)))
        assert launches and all(f == on for f in launches)     # every attention layer
        assert not eng.ws1.counters.copy_to_host().any()
        assert not target.wsv.counters.copy_to_host().any()
    (la, va, ta), (lb, vb, tb) = got
    assert np.isfinite(la).all() and np.isfinite(va).all()
    np.testing.assert_array_equal(la.view(np.uint32), lb.view(np.uint32))
    np.testing.assert_array_equal(va.view(np.uint32), vb.view(np.uint32))
    np.testing.assert_array_equal(ta, tb)
