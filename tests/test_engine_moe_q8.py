"""The engine's int8 MoE block (moe.launch_moe_block_q8) on the Qwen3-MoE fixture re-encoded
with Q8_0 / Q4_0 matrices (expert stacks included): the checked-in fixtures hold F16 weights,
which keep the float block.

What must hold:
  * the engine takes the int8 block for every MoE layer of the re-encoded file, and keeps the
    float one with moe_q8=False or with float expert weights;
  * prefill and decode agree: the MoE block gives each token the bits its decode step would,
    so they differ only where the dense kernels do (summation order) -> 1e-4 of max |logit|;
  * against the numpy reference (float activations) within the int8-activation bound of
    tests/test_engine_act_q8.py (3e-2 of max |logit|), and so within that of the float block.
"""
import numpy as np
import pytest

from bw24nb.formats import open_model
from bw24nb.quant import QType
from bw24nb.reference import load_reference
from int8_gguf import requantized_gguf  # tests/int8_gguf.py (pytest puts tests/ on the path)

FIXTURE = "tests/fixtures/qwen3moe/model.gguf"
TYPES = (QType.Q8_0, QType.Q4_0)


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    return requantized_gguf(FIXTURE, tmp_path_factory.mktemp("moeq8") / "qwen3moe-q.gguf", TYPES,
                            experts=True)


def _engine(path, **kw):
    from bw24nb.engine import Engine
    return Engine(open_model(path), n_ctx=16, k_type=QType.F16, v_type=QType.F16,
                  log=lambda m: None, use_graph=False, **kw)


@pytest.fixture(scope="module")
def engine(quantized_gguf):
    return _engine(quantized_gguf)


def test_moe_layers_take_the_int8_block(engine, quantized_gguf):
    assert engine.experts and set(engine.moe_q8) == set(engine.experts)
    assert not _engine(quantized_gguf, moe_q8=False).moe_q8
    assert not _engine(FIXTURE).moe_q8                      # F16 experts: the float block


def test_moe_q8_prefill_and_decode_agree_and_track_the_reference(engine, quantized_gguf):
    ref, _ = load_reference(quantized_gguf)
    prompt = [7, 200, 31]
    engine.reset()
    ref.reset()
    want = ref.prefill(prompt)
    full = engine.prefill(prompt)                  # the MoE block with T = 3 (grid z = 3)
    assert rel(full, want[-1]) <= 3e-2
    engine.reset()
    engine.prefill(prompt[:-1])
    stepped = engine.decode(prompt[-1])            # T = 1
    assert rel(stepped, full) <= 1e-4
    assert stepped.argmax() == full.argmax()


@pytest.mark.parametrize("fixture,moe_prefill", [("moe", "tokens"), ("moe", "grouped"),
                                                 ("dense", "tokens"), ("gdn", "tokens")])
def test_rows_prefill_gives_decodes_bits(quantized_gguf, fixture, moe_prefill, tmp_path,
                                         monkeypatch):
    """Engine(prefill_path="rows"): prefill runs the decode kernels (the rowwise forward of a
    speculative verify), so its last logits are bit for bit those of decoding the prompt token
    by token -- here over two chunks (12 tokens as 10 + 2: the first one's matvecs in two
    launches of 9 + 1 rows, its MoE blocks expert-major with moe_prefill="grouped"; on the
    Gated DeltaNet fixture its conv and prep as prefill's two launches, past CONV_PREP_MAX_T,
    and the delta rule on gated_deltanet.PREFILL_RULE's kernel). The first chunk's int8
    matvecs run as token tiles (engine.ROWS_TILES: 8 + 2 tokens), and so does its router
    (moe.ROUTER_TILE_MIN_T lowered to 2)."""
    import bw24nb.engine as engine_mod
    from bw24nb.kernels import gated_deltanet, moe
    monkeypatch.setattr(engine_mod, "ROWS_PREFILL_CHUNK", 10)
    monkeypatch.setattr(moe, "ROUTER_TILE_MIN_T", 2)
    monkeypatch.setattr(gated_deltanet, "QUAD_MIN_T", 10)
    path = quantized_gguf if fixture == "moe" else \
        _dense_int8(tmp_path) if fixture == "dense" else \
        requantized_gguf("tests/fixtures/qwen35/model.gguf", tmp_path / "qwen35-q.gguf", TYPES)
    eng = _engine(path, prefill_path="rows", moe_prefill=moe_prefill)
    assert eng.wsp.rowwise and eng.wsp.T == 10
    assert bool(eng.moe_expert_rows) == (moe_prefill == "grouped")
    prompt = [(37 * i + 11) % 250 for i in range(12)]
    eng.reset()
    full = eng.prefill(prompt)
    eng.reset()
    for t in prompt:
        stepped = eng.decode(t)
    np.testing.assert_array_equal(full.view(np.uint32), stepped.view(np.uint32))


def _dense_int8(tmp_path):
    return requantized_gguf("tests/fixtures/qwen3/model.gguf", tmp_path / "qwen3-q.gguf", TYPES)


def test_prefill_path_is_checked(quantized_gguf):
    with pytest.raises(ValueError, match="prefill_path"):
        _engine(quantized_gguf, prefill_path="fast")


def test_auto_prefill_is_rows_for_int8_moe_and_gemm_otherwise(engine, quantized_gguf):
    # the default: prefill on the decode kernels where a router could turn the GEMM's rounding
    # into other experts (the argmax gate then binds), the GEMM everywhere else
    assert engine.prefill_path == "rows" and engine.moe_expert_rows == set(engine.moe_q8)
    assert _engine(quantized_gguf, moe_q8=False).prefill_path == "gemm"
    assert _engine(FIXTURE).prefill_path == "gemm"                  # F16 experts


def test_grouped_moe_prefill_tracks_the_token_block(engine, quantized_gguf):
    """Engine(moe_prefill="grouped"): a prefill chunk's MoE blocks run expert-major (sorted
    rows, one int8 GEMM per expert); the same routing and int8 activations as the token block,
    sums in the GEMM's order -> logits within float32 rounding of the default's."""
    grouped = _engine(quantized_gguf, prefill_path="gemm", moe_prefill="grouped")
    assert grouped.moe_grouped == set(grouped.moe_q8) and not grouped.moe_expert_rows
    prompt = [7, 200, 31, 99, 5]
    engine.reset()
    grouped.reset()
    want = engine.prefill(prompt)
    got = grouped.prefill(prompt)
    assert rel(got, want) <= 1e-4
    assert got.argmax() == want.argmax()
    with pytest.raises(ValueError, match="moe_prefill"):
        _engine(quantized_gguf, moe_prefill="csr")
