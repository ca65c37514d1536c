"""The engine's int8-activation path (act_quant="q8", the default) on integer block weights.

The checked-in fixtures hold F16 weights, which always take the float path; here the Qwen3
fixture is re-encoded with Q8_0 / Q5_0 / Q4_0 matrices (every matrix's K is a multiple of 32),
so decode runs quantize_act + the dp4a matvec and prefill the fake-quantized float matmul.

What must hold:
  * prefill and decode agree (the argmax gate's premise): both see the same int8 activations,
    so they differ only by float32 summation order -> 1e-4 of the largest |logit|;
  * against the numpy reference (float activations): activation rounding is <= 1/254 of each
    32-block's max per value, i.e. ~2^-8 relative per matvec input, compounded over 2 layers
    and the head -> 3e-2 of the largest |logit|;
(act_quant="f32" is the path tests/test_engine.py checks against the reference. Decode runs
eagerly here -- use_graph=False -- since the graph path is the same launches, and the simulator
is slow.)
"""
import numpy as np
import pytest

from bw24nb.formats import open_model
from bw24nb.quant import QType
from bw24nb.reference import load_reference
from int8_gguf import requantized_gguf  # tests/int8_gguf.py (pytest puts tests/ on the path)

FIXTURE = "tests/fixtures/qwen3/model.gguf"
TYPES = (QType.Q8_0, QType.Q5_0, QType.Q4_0)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    return requantized_gguf(FIXTURE, tmp_path_factory.mktemp("q8") / "qwen3-q.gguf", TYPES)


@pytest.fixture(scope="module")
def engine(quantized_gguf):
    from bw24nb.engine import Engine
    return Engine(open_model(quantized_gguf), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                  log=lambda m: None, act_quant="q8", use_graph=False)


def test_file_has_integer_weights(quantized_gguf):
    src = open_model(quantized_gguf)
    kinds = {QType(src.info(n).qtype) for n in src.names()}
    assert set(TYPES) <= kinds


def test_q8_prefill_and_decode_agree_and_track_the_reference(engine, quantized_gguf):
    q8 = engine
    ref, _ = load_reference(quantized_gguf)
    prompt = [7, 200, 31]
    q8.reset()
    ref.reset()
    want = ref.prefill(prompt)
    full = q8.prefill(prompt)                      # prefill: fake-quantized float matmul
    assert rel(full, want[-1]) <= 3e-2
    q8.reset()
    q8.prefill(prompt[:-1])
    stepped = q8.decode(prompt[-1])                # decode: quantize_act + dp4a matvec
    assert rel(stepped, full) <= 1e-4
    assert stepped.argmax() == full.argmax()


def test_act_quant_is_checked(quantized_gguf):
    from bw24nb.engine import Engine
    with pytest.raises(ValueError, match="act_quant"):
        Engine(open_model(quantized_gguf), n_ctx=16, act_quant="int4", log=lambda m: None)


def test_fused_prefill_gives_the_unfused_bits(quantized_gguf, rng):
    """Engine(fuse_prefill=True): swiglu writes ffn_down's int8 GEMM input itself (decode's
    fusion; run_bench --launch fused-prefill) -- the same bits as swiglu + quantize_act, one
    launch a layer fewer. (The attention combine and the GDN output norm fuse likewise where
    head dims are multiples of 32; this fixture's are 16: kernel tests and kernel-check cover
    those kernels.)"""
    from bw24nb.engine import Engine
    src = open_model(quantized_gguf)
    ids = rng.integers(0, src.config.vocab_size, 3)
    out, names = {}, {}
    for fuse in (False, True):
        eng = Engine(src, n_ctx=8, k_type=QType.F16, v_type=QType.F16, use_graph=False,
                     log=lambda m: None, act_quant="q8", fuse_prefill=fuse)
        out[fuse] = eng.prefill(ids)
        names[fuse] = [n for n, _ in eng._forward_launches(eng.wsp, len(ids))]
    assert "swiglu_q8" in names[True] and "swiglu_q8" not in names[False]
    assert len(names[True]) == len(names[False]) - src.config.num_hidden_layers
    np.testing.assert_array_equal(out[True].view(np.uint32), out[False].view(np.uint32))


def test_block_weights_take_the_16_byte_path(engine, monkeypatch):
    """Every Q8_0 / Q5_0 / Q4_0 matrix the engine holds, and every stack of them, is a buffer
    matvec_qx0 may read (16-byte aligned, whole 16-byte words: `usable`), and a decode step runs
    its matvecs on that path -- a change to uploads or stacking that broke the alignment would
    otherwise drop them to the generic path silently (decision 0023)."""
    from bw24nb.kernels import matvec_qx0
    from bw24nb.kernels.dequant import weight_views
    mats = [w for w in engine.w.tensors.values()
            if w.qtype in matvec_qx0.PATHS and len(w.shape) == 2]
    mats += [w for w in engine.stacks.values() if w.qtype in matvec_qx0.PATHS]
    assert {w.qtype for w in mats} == set(TYPES)
    for w in mats:
        assert matvec_qx0.usable(weight_views(w.buf)[0]), (w.qtype, w.shape)
    calls = []
    launch = matvec_qx0.launch

    def counted(qt, *args, **kw):
        calls.append(qt)
        return launch(qt, *args, **kw)
    monkeypatch.setattr(matvec_qx0, "launch", counted)
    engine.reset()
    engine.prefill([7, 200])
    engine.decode(31)
    assert set(calls) == set(TYPES)


def test_mixed_qkv_is_widened_to_q8_0_and_stacked(engine, quantized_gguf, monkeypatch):
    """Engine._widen_to_q8_0: the fixture's types go by turns, so a layer's q / k / v mix
    Q8_0 / Q5_0 / Q4_0; each becomes one Q8_0 stack (one decode launch), and decode gives the
    very bits of an engine that keeps the original types in separate launches."""
    from bw24nb.engine import Engine
    src = open_model(quantized_gguf)
    mixed = [i for i in range(src.config.num_hidden_layers)
             if len({QType(src.info(f"blk.{i}.attn_{n}.weight").qtype) for n in "qkv"}) > 1]
    assert mixed
    for i in mixed:
        assert engine.stacks[i, "qkv"].qtype == QType.Q8_0
        assert {engine.w.blk(i, f"attn_{n}.weight").qtype for n in "qkv"} == {QType.Q8_0}
    ids = [7, 200, 31]
    engine.reset()
    widened = np.stack([engine.decode(t) for t in ids])
    monkeypatch.setattr(Engine, "_widen_to_q8_0", lambda self, names: False)
    plain = Engine(open_model(quantized_gguf), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                   log=lambda m: None, act_quant="q8", use_graph=False)
    assert all((i, "qkv") not in plain.stacks for i in mixed)
    plain.reset()
    separate = np.stack([plain.decode(t) for t in ids])
    np.testing.assert_array_equal(widened.view(np.uint32), separate.view(np.uint32))
