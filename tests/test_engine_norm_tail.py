"""Decode's hidden-row norms as the tails of the matvecs before them (engine.NORM_TAIL,
matvec.row_tail_kernel): the decode step folds each q8 norm of the hidden row into the
attn_output / gdn_out / ffn_down launch that wrote the row, those launches run the norm in
their last block instead of launching it, and every decode step's logits are the norm
launches' bit for bit. The kernel against the two launches, per weight type:
tests/test_kernels_matvec_tail.py."""
import numpy as np

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType


def _decode_all(eng, ids):
    eng.reset()
    eng.prefill(ids[:1])
    return np.stack([eng.decode(t) for t in ids[1:]])


def test_norm_tails_give_the_norm_launches_bits(int8_heads_hybrid, rng, monkeypatch):
    from bw24nb import engine as engine_mod
    from bw24nb.kernels import norm
    src = open_model(int8_heads_hybrid)
    c = src.config
    ids = [int(t) for t in rng.integers(0, c.vocab_size, 3)]
    kw = dict(n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
              use_graph=False)       # (the launches a graph would capture, run as they are)

    eng = Engine(src, **kw)
    names = [n for n, _ in eng._decode_step()]
    # every hidden-row norm follows the matvec that wrote the row: one entry each
    n_attn = sum(1 for i in range(c.num_hidden_layers) if c.layer_type(i) != "linear_attention")
    assert names.count("attn_output+ffn_norm_q8") == n_attn
    assert names.count("gdn_out+ffn_norm_q8") == c.num_hidden_layers - n_attn
    assert names.count("ffn_down+attn_norm_q8") == c.num_hidden_layers - 1
    assert names.count("ffn_down+output_norm_q8") == 1
    assert "attn_norm_q8" in names                # layer 0's: after the embedding
    # ... and the matvecs carry them: no q8 norm launch in a decode step but layer 0's
    calls = []
    real = norm.launch_rms_norm_q8
    monkeypatch.setattr(norm, "launch_rms_norm_q8", lambda *a, **k: (calls.append(1),
                                                                     real(*a, **k)))
    eng.prefill(ids[:1])
    steps = []
    for t in ids[1:]:
        calls.clear()
        steps.append(eng.decode(t))
        assert len(calls) == 1
    monkeypatch.setattr(norm, "launch_rms_norm_q8", real)

    monkeypatch.setattr(engine_mod, "NORM_TAIL", False)
    plain_eng = Engine(src, **kw)
    assert "attn_norm_q8" in [n for n, _ in plain_eng._decode_step()][3:]
    plain = _decode_all(plain_eng, ids)
    assert np.isfinite(plain).all()
    np.testing.assert_array_equal(np.stack(steps).view(np.uint32), plain.view(np.uint32))
