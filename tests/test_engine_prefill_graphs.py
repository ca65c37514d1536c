"""Prefill chunks as CUDA graphs (Engine._prefill_chunk) and the per-launch prefill profile
(Engine.profile_prefill), on the dense hybrid fixture (GDN + gated attention) with 2-token
chunks so that a short prompt repeats a chunk size: the first chunk of a size runs eagerly, the
second is captured and replayed, later ones replay. The launches are the same either way, so
the logits must be the eager engine's bit for bit."""
import contextlib

import numpy as np
import pytest

import bw24nb.engine as engine_mod
from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.graph import CudaGraph, CudaGraphError
from bw24nb.quant import QType

FIXTURE = "tests/fixtures/qwen35/model.gguf"


@pytest.fixture
def two_token_chunks(monkeypatch):
    monkeypatch.setattr(engine_mod, "PREFILL_CHUNK", 2)


def _engine(use_graph, logs=None):
    src = open_model(FIXTURE)
    eng = Engine(src, n_ctx=8, k_type=QType.F16, v_type=QType.F16, use_graph=use_graph,
                 log=(logs.append if logs is not None else lambda m: None))
    return src, eng


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def eager_prefill():
    """A 5-token prompt (chunks of 2, 2, 1) and the eager engine's logits for it."""
    mp = pytest.MonkeyPatch()
    mp.setattr(engine_mod, "PREFILL_CHUNK", 2)
    try:
        src, eager = _engine(False)
        ids = np.random.default_rng(7).integers(0, src.config.vocab_size, 5)
        return ids, eager.prefill(ids)
    finally:
        mp.undo()


def test_prefill_graphs_give_the_eager_bits(two_token_chunks, eager_prefill):
    ids, want = eager_prefill
    _, graphed = _engine(True)
    got = graphed.prefill(ids)                  # 2: eager, then captured and replayed; 1: eager
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert sorted(graphed._prefill_graphs) == [2]
    assert graphed._prefill_seen == {1, 2} and not graphed._prefill_eager_only
    graphed.reset()                             # again: 2 replays its graph, 1 is captured
    np.testing.assert_array_equal(_bits(graphed.prefill(ids)), _bits(want))
    assert sorted(graphed._prefill_graphs) == [1, 2]


def test_a_prefill_that_cannot_be_captured_stays_eager(two_token_chunks, eager_prefill,
                                                       monkeypatch):
    ids, want = eager_prefill
    logs = []
    _, graphed = _engine(True, logs)

    @contextlib.contextmanager
    def refuse(stream, mode="thread_local", programmatic=False):
        raise CudaGraphError("cuStreamEndCapture failed: test")
        yield                                              # (a generator, as the real one)
    monkeypatch.setattr(CudaGraph, "capture", refuse)
    np.testing.assert_array_equal(_bits(graphed.prefill(ids)), _bits(want))
    assert graphed._prefill_graphs == {} and graphed._prefill_eager_only == {2}
    assert sum("not capturable" in m for m in logs) == 1   # said once, not per chunk


def test_profile_prefill_times_every_launch_and_leaves_a_fresh_sequence(rng, monkeypatch):
    """One (name, ms) per launch of the prefill chunk, in launch order; afterwards the engine is
    at position 0 with zeroed recurrent states: a prefill gives a fresh engine's logits."""
    from numba import cuda
    if not hasattr(cuda, "event_elapsed_time"):           # the simulator's events keep no time
        monkeypatch.setattr(cuda, "event_elapsed_time", lambda a, b: 0.0, raising=False)
    src, eng = _engine(False)
    ids = rng.integers(0, src.config.vocab_size, 2)
    want = eng.prefill(ids)
    rows = eng.profile_prefill(ids, replays=1)
    names = [n for n, _ in eng._forward_launches(eng.wsp, len(ids))]
    assert [n for n, _ in rows] == names
    assert "gdn_rule" in names and "attention" in names
    assert all(ms >= 0 for _, ms in rows)
    assert eng.position == 0
    np.testing.assert_array_equal(_bits(eng.prefill(ids)), _bits(want))
    with pytest.raises(ValueError, match="profile_prefill takes"):
        eng.profile_prefill(np.zeros(eng.wsp.T + 1, np.int64))

