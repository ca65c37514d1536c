"""Decode's attention in one launch at short contexts (engine.ONEPASS_MAX_CTX,
decode_attention's one-pass kernel; decision 0045), through the engine: the decode step at a
context the kernel serves replays a graph of its own, and its logits are the split-K graph's
bit for bit, across the switch from one graph to the other. The kernel's bits against the
split pass + combine, per shape: tests/test_kernels_attention.py."""
import numpy as np

from bw24nb.engine import Engine
from bw24nb.formats import open_model
from bw24nb.quant import QType


def _decode_all(eng, prompt, ids):
    eng.reset()
    eng.prefill(prompt)
    return np.stack([eng.decode(t) for t in ids])


def test_one_pass_decode_gives_the_split_graphs_bits(int8_heads_hybrid, rng, monkeypatch):
    """Steps at contexts up to the limit run the one-pass kernel (counted), later ones the
    split pass + combine, each from its own captured graph; every step's logits equal those
    of an engine that never takes the one-pass kernel. The attention layers' heads are 32
    wide, so their attention output is the int8 copy the attn_output matvec reads."""
    from bw24nb import engine as engine_mod
    from bw24nb.kernels import decode_attention
    monkeypatch.setattr(engine_mod, "ONEPASS_MAX_CTX", 1024)
    src = open_model(int8_heads_hybrid)
    prompt = [int(t) for t in rng.integers(0, src.config.vocab_size, 3)]
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 4)]
    eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None)
    assert eng._onepass_limit == 32             # 2 splits (a 16-token cache) of 16 keys
    calls = []
    real = decode_attention.launch_onepass
    monkeypatch.setattr(decode_attention, "launch_onepass",
                        lambda *a, **k: (calls.append(1), real(*a, **k)))
    eng._onepass_limit = 5                      # steps at positions 3, 4 (contexts 4, 5)
    # the one-pass graph stores the token's K / V (and ropes q) in the attention launch
    names = {f: [n for n, _ in eng._decode_step(onepass=f)] for f in (False, True)}
    assert "rope_kv_store+attention" in names[True] and "rope_kv_store" not in names[True]
    assert "rope_kv_store" in names[False] and "rope_kv_store+attention" not in names[False]
    mixed = _decode_all(eng, prompt, ids)
    assert sorted(eng._graphs) == [False, True]  # both captured at the first step
    n_attn = sum(1 for i in range(src.config.num_hidden_layers)
                 if src.config.layer_type(i) != "linear_attention")
    assert len(calls) == 2 * n_attn             # captured once a graph in the simulator
    split = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None)
    split._onepass_limit = 0
    plain = _decode_all(split, prompt, ids)
    assert sorted(split._graphs) == [False]
    assert np.isfinite(plain).all()
    np.testing.assert_array_equal(mixed.view(np.uint32), plain.view(np.uint32))


def test_one_pass_limit_follows_the_switch_and_the_cache(int8_heads_hybrid, monkeypatch):
    """ONEPASS_MAX_CTX caps the limit (0: never); a cache the kernel cannot read (Q8_0) or a
    replay of several steps past the limit keeps the split graph."""
    from bw24nb import engine as engine_mod
    src = open_model(int8_heads_hybrid)
    monkeypatch.setattr(engine_mod, "ONEPASS_MAX_CTX", 8)
    eng = Engine(src, n_ctx=32, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                 use_graph=False)
    assert eng._onepass_limit == 8
    eng.position = 5
    assert eng._onepass_serves(3) and not eng._onepass_serves(4)
    monkeypatch.setattr(engine_mod, "ONEPASS_MAX_CTX", 0)
    assert Engine(src, n_ctx=32, k_type=QType.F16, v_type=QType.F16, log=lambda m: None,
                  use_graph=False)._onepass_limit == 0
    monkeypatch.setattr(engine_mod, "ONEPASS_MAX_CTX", 1024)
    assert Engine(src, n_ctx=32, k_type=QType.Q8_0, v_type=QType.Q8_0, log=lambda m: None,
                  use_graph=False)._onepass_limit == 0


def test_cluster_split_decode_gives_the_split_graphs_bits(int8_heads_hybrid, rng, monkeypatch):
    """decode_attention.SPLIT_CLUSTER > 1: the decode step past the one pass's contexts runs
    its attention as one launch (the split pass and the combine on thread-block clusters,
    `launch_split_cluster`, counted), the position before the wait -- and every step's logits
    equal the split pass + combine's; the verify-sized and prefill launches keep the two
    kernels (not counted)."""
    from bw24nb.kernels import decode_attention
    src = open_model(int8_heads_hybrid)
    prompt = [int(t) for t in rng.integers(0, src.config.vocab_size, 3)]
    ids = [int(t) for t in rng.integers(0, src.config.vocab_size, 4)]

    def run(cluster):
        monkeypatch.setattr(decode_attention, "SPLIT_CLUSTER", cluster)
        eng = Engine(src, n_ctx=16, k_type=QType.F16, v_type=QType.F16, log=lambda m: None)
        eng._onepass_limit = 0
        return _decode_all(eng, prompt, ids)

    calls = []
    real = decode_attention.launch_split_cluster
    monkeypatch.setattr(decode_attention, "launch_split_cluster",
                        lambda *a, **k: (calls.append(k.get("pre_wait", a[-1])), real(*a, **k)))
    plain = run(1)
    assert calls == []
    clustered = run(4)
    n_attn = sum(1 for i in range(src.config.num_hidden_layers)
                 if src.config.layer_type(i) != "linear_attention")
    # run once, then captured (the graph's first use), in the decode step only
    assert len(calls) == 2 * n_attn and all(calls)
    assert np.isfinite(plain).all()
    np.testing.assert_array_equal(clustered.view(np.uint32), plain.view(np.uint32))
