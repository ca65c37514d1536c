"""The weight prefetch ahead of each decode / verify matvec (engine.PREFETCH_AHEAD_MB,
kernels/prefetch.launch_prefetch_l2; decision 0042). A prefetch changes no value, so what is
checked here is the wiring: every matvec's weights are named to L2 after the matvec before it
and before it runs, on a side stream that is joined back, no other launch is added, dropped or
moved, and the logits stay those of the engine without it. On the GPU: bench/run_bench.py
--launch prefetch<MiB> (the decode graph) and bench/spec_gate.py (the verify's)."""
import numpy as np
import pytest

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.kernels import prefetch
from bw24nb.quant import QType


@pytest.mark.parametrize("nbytes", [1, 15, 16, 1000, prefetch.CHUNK + 17, 3 * prefetch.CHUNK])
def test_prefetch_kernel_names_ranges_inside_the_array(nbytes):
    """launch_prefetch_l2 over arrays of odd lengths and dtypes: the simulator's twin of the
    instruction checks that every range is 16-byte aligned and inside the array."""
    from numba import cuda
    for dtype in (np.uint8, np.uint32):
        n = -(-nbytes // np.dtype(dtype).itemsize)
        buf = cuda.to_device(np.zeros(n, dtype))
        prefetch.launch_prefetch_l2(buf, nbytes)
        prefetch.launch_prefetch_l2(buf, 10 * nbytes + 64)     # cut to the array
        prefetch.launch_prefetch_l2(buf, 0)                    # nothing
    cuda.synchronize()


def _weights_of(eng) -> dict:
    """id of a device buffer a matvec streams -> True (every weight and stack of the engine)."""
    bufs = {}
    for dw in list(eng.w.tensors.values()) + list(eng.stacks.values()):
        bufs[id(dw.buf)] = dw
        if dw.q6k_r is not None:
            bufs[id(dw.q6k_r[0])] = dw
    return bufs


def test_each_matvec_is_prefetched_after_the_one_before(int8_heads_hybrid, monkeypatch):
    from bw24nb import engine as engine_mod
    from bw24nb.kernels import matvec, matvec_q6k
    monkeypatch.setattr(engine_mod, "PREFETCH_AHEAD_MB", 1.0)
    eng = Engine(open_model(int8_heads_hybrid), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                 log=lambda m: None, use_graph=False)
    known, events = _weights_of(eng), []

    def spy(kind, real):
        def launch(w, *args, **kw):
            events.append((kind, id(w)))
            return real(w, *args, **kw)
        return launch
    monkeypatch.setattr(prefetch, "launch_prefetch_l2",
                        spy("prefetch", prefetch.launch_prefetch_l2))
    monkeypatch.setattr(matvec, "launch_matvec_q8", spy("matvec", matvec.launch_matvec_q8))
    monkeypatch.setattr(matvec, "launch_matvec", spy("matvec", matvec.launch_matvec))
    monkeypatch.setattr(matvec_q6k, "launch_matvec_q8_q6k_r",
                        spy("matvec", matvec_q6k.launch_matvec_q8_q6k_r))
    names = [n for n, _ in eng._decode_step()]
    assert names[0] == "l2_prefetch" and names.count("l2_prefetch") >= 4, names
    eng.decode(3)
    mv = [b for k, b in events if k == "matvec"]
    assert mv and all(b in known for b in mv), "a matvec streams a buffer the engine does not hold"
    # each matvec's buffer was prefetched since the matvec launched before it (projections
    # side by side: since the launch before their group)
    since = set()
    for kind, b in events:
        if kind == "prefetch":
            assert b in known
            since.add(b)
        else:
            assert b in since, (eng.w.tensors, b)
    assert not eng._prefetch_open


def test_prefetch_changes_no_bit_and_no_other_launch(int8_heads_hybrid, monkeypatch):
    """With the prefetches, decode and verify run the launches they run without them, in the
    same order (the l2_prefetch entries aside), and a decode step gives the same logits, bit
    for bit (eagerly: in the simulator a graph replays its recorded launches in call order)."""
    from bw24nb import engine as engine_mod
    from bw24nb.engine_spec import EngineSpecTarget
    src = open_model(int8_heads_hybrid)
    names, logits = {}, {}
    for mb in (0.0, 1.0):
        monkeypatch.setattr(engine_mod, "PREFETCH_AHEAD_MB", mb)
        eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                     use_graph=False)
        target = EngineSpecTarget(eng)
        names[mb] = ([n for n, _ in eng._decode_step()],
                     [n for n, _ in target._rows_launches(3, head=True)])
        logits[mb] = eng.decode(7)
        assert not eng._prefetch_open
    for with_pf, without in zip(names[1.0], names[0.0]):
        assert "l2_prefetch" in with_pf and "l2_prefetch" not in without
        assert [n for n in with_pf if n != "l2_prefetch"] == without
    assert np.isfinite(logits[0.0]).all()
    np.testing.assert_array_equal(logits[1.0].view(np.uint32), logits[0.0].view(np.uint32))
