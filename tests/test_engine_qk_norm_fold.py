"""Attention's head norms folded into the launch that ropes q and k and stores K and V
(engine.FOLD_QK_NORM, cache/kv.py's kv_store_rope_qk_norm), through the engine: decode and
verify take the one launch and give the logits of the two, bit for bit. The kernel's bits
against the two launches per head dim, gate and cache type: tests/test_kv_cache.py."""
import numpy as np

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType


def test_decode_and_verify_with_the_head_norms_folded_give_the_bits_of_two_launches(
        int8_heads_hybrid, monkeypatch):
    from bw24nb import engine as engine_mod
    from bw24nb.engine_spec import EngineSpecTarget
    src = open_model(int8_heads_hybrid)
    out = {}
    for fold in (True, False):
        monkeypatch.setattr(engine_mod, "FOLD_QK_NORM", fold)
        eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                     use_graph=False)
        target = EngineSpecTarget(eng)
        for names in ([n for n, _ in eng._decode_step()],
                      [n for n, _ in target._rows_launches(3, head=True)]):
            assert ("qk_norm_rope_kv_store" in names) == fold, names
            assert ("qk_norm" in names) != fold and ("rope_kv_store" in names) != fold
        eng.reset()
        step = eng.decode(7)
        eng.reset()
        target.prefill([3, 17])
        rows = target.verify([5, 9, 11], want_logits=True).logits
        out[fold] = np.concatenate([step[None], rows])
    assert np.isfinite(out[True]).all()
    np.testing.assert_array_equal(out[True].view(np.uint32), out[False].view(np.uint32))
