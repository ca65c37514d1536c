"""The harness's host-side logic, without a GPU: roofline bytes, llama-bench parsing, the
engine measurement flow (driven by the numpy reference model standing in for the engine) and
the JSONL records.

    python3 -m pytest bench/test_run_bench.py -q
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import roofline, run_bench  # noqa: E402
from bench.run_bench import Recorder, bench_engine, parse_llama_bench  # noqa: E402
from bw24nb.factory import model_config, write_gguf_model  # noqa: E402
from bw24nb.formats import open_model  # noqa: E402
from bw24nb.quant import QType  # noqa: E402


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    cfg = model_config("qwen3.5-0.8b", layers=4, vocab=512)      # tied embedding, MTP block
    path = tmp_path_factory.mktemp("bench") / "dense.gguf"
    write_gguf_model(str(path), cfg, seed=1, threads=2, log=None)
    return open_model(str(path))


def test_roofline_bytes_of_a_dense_hybrid(dense):
    c = dense.config
    mtp = {n for n in dense.names() if n.startswith(f"blk.{c.num_hidden_layers}.")}
    assert mtp                                            # the MTP block exists but is not read
    want = sum(dense.info(n).nbytes for n in dense.names() if n not in mtp)   # tied: all of embd
    assert roofline.weight_bytes_per_token(dense) == want
    # one attention layer (of 4) at ctx 100: K Q8_0 34 B + V Q5_1 24 B per 32 values; the
    # default F16 cache 2 B a value
    assert roofline.kv_bytes_per_token(c, 100, QType.Q8_0, QType.Q5_1) == \
        100 * 2 * (256 // 32) * (34 + 24)
    assert roofline.kv_bytes_per_token(c, 100) == 100 * 2 * 256 * 2 * 2
    s = 16 * 128 * 128 + 3 * (2 * 16 * 128 + 16 * 128)
    assert roofline.state_bytes_per_token(c) == 3 * s * 4
    assert math.isclose(roofline.roofline_tok_s(4000.0, 4 * 10**9), 1000.0)


def test_roofline_counts_top_k_experts_and_one_embedding_row(tmp_path):
    cfg = model_config("qwen3.6-35b-a3b", layers=2, vocab=512, experts=4)
    cfg.num_experts_per_tok = 2                       # top-2 of 4: half of every expert tensor
    path = tmp_path / "moe.gguf"
    write_gguf_model(str(path), cfg, seed=1, threads=2, log=None)
    src = open_model(str(path))
    assert src.config.num_experts_per_tok == 2
    want = 0
    for n in src.names():
        info = src.info(n)
        if n.startswith("blk.2."):
            continue
        if "_exps." in n:
            want += info.nbytes // 2
        elif n == "token_embd.weight":
            want += info.nbytes // 512
        else:
            want += info.nbytes
    assert roofline.weight_bytes_per_token(src) == want


LLAMA_JSON = json.dumps([
    {"build_commit": "abc1234", "build_number": 7000, "backends": "CUDA", "model_type": "qwen35 9B Q4_K - Medium",
     "model_size": 5800000000, "n_batch": 2048, "n_ubatch": 512, "type_k": "f16", "type_v": "f16",
     "n_gpu_layers": 99, "flash_attn": True, "n_prompt": 512, "n_gen": 0, "n_depth": 0,
     "avg_ts": 9000.0, "stddev_ts": 10.0, "samples_ts": [8990.0, 9000.0, 9100.0]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 512, "avg_ts": 150.0, "samples_ts": [149.0, 150.0, 152.0]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 6144, "avg_ts": 140.0, "samples_ts": []},
    {"n_prompt": 512, "n_gen": 0, "n_depth": 512, "avg_ts": 8000.0, "samples_ts": [8000.0]},
    {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 155.0, "samples_ts": [155.0]},
])


def test_parse_llama_bench_picks_the_three_points():
    got = {m: (v, u, c) for m, v, u, c in parse_llama_bench(LLAMA_JSON)}
    assert set(got) == {"prefill_tok_s@512", "decode_tok_s@512", "decode_tok_s@6144"}
    assert got["prefill_tok_s@512"][0] == 9000.0 and got["prefill_tok_s@512"][2]["build_commit"] == "abc1234"
    assert got["decode_tok_s@512"][0] == 150.0                  # median of samples
    assert got["decode_tok_s@6144"][0] == 140.0                 # no samples: avg_ts
    assert got["decode_tok_s@512"][2]["n_gen"] == 128


class ReferenceEngine:
    """The numpy reference behind the engine's interface (prefill returns the last logits)."""

    def __init__(self, source, n_ctx):
        from bw24nb.models import load_weights
        from bw24nb.reference.model import ReferenceModel
        self.model = ReferenceModel(source.config, load_weights(source))
        self.n_ctx = n_ctx

    def reset(self):
        self.model.reset()

    def prefill(self, ids):
        return self.model.prefill(ids)[-1]

    def decode(self, token):
        return self.model.decode(token)

    def profile_decode_step(self, replays=20, chain=1):
        f = 0.5 if chain > 1 else 1.0          # chained: what each costs inside the step
        return [("attn_q", 0.5 * f), ("ffn_up", 1.0 * f), ("attn_q", 0.25 * f)]

    def profile_prefill(self, ids):
        self.profiled_prefill = len(ids)
        return [("attention", 2.0), ("ffn_up", 3.0), ("attention", 1.5)]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    cfg = model_config("qwen2.5-coder-0.5b", layers=2, vocab=256)     # quick for the reference
    path = tmp_path_factory.mktemp("bench") / "small.gguf"
    write_gguf_model(str(path), cfg, seed=1, threads=2, log=None)
    return open_model(str(path))


def test_bench_engine_records(small, tmp_path):
    dense = small
    eng = ReferenceEngine(dense, n_ctx=64)
    rec = Recorder(gpu="test-gpu", commit="deadbeef", paths=[tmp_path / "bench.jsonl"])
    bench_engine(rec, "tiny", eng, dense, runs=3, read_gb_s=100.0, gen=3, prompt=6,
                 long_prompt=200, prefill=5, warmup=1, gate_tokens=6, base_config={"file": "x"})
    metrics = {r["metric"]: r for r in rec.rows}
    assert metrics["gate"]["value"] == 1                       # chunked prefill == recurrent decode
    assert "decode_tok_s@200" not in metrics                   # beyond n_ctx: skipped
    d = metrics["decode_tok_s@6"]
    assert d["unit"] == "tok/s" and d["value"] > 0 and len(d["config"]["samples"]) == 3
    assert d["config"]["path"] == "decode loop"                # no generate_greedy here
    pct = metrics["decode_roofline_pct@6"]["config"]
    assert pct["weight_bytes"] == roofline.weight_bytes_per_token(dense)
    assert pct["kv_bytes"] == roofline.kv_bytes_per_token(dense.config, 6 + 1)
    assert metrics["prefill_tok_s@5"]["value"] > 0
    assert metrics["kernel_ms:attn_q"]["value"] == 0.75
    assert metrics["kernel_ms:attn_q"]["config"]["launches"] == 2
    assert metrics["decode_step_eager_ms"]["value"] == 1.75
    assert metrics["kernel_chain_ms:attn_q"]["value"] == 0.375
    assert metrics["kernel_chain_ms:attn_q"]["config"]["chain"] == run_bench.CHAIN_PROFILE > 1
    assert metrics["decode_step_chain_ms"]["value"] == 0.875
    assert eng.profiled_prefill == 5                           # the pp prompt's length
    assert metrics["prefill_kernel_ms:attention"]["value"] == 3.5
    assert metrics["prefill_kernel_ms:attention"]["config"]["launches"] == 2
    assert metrics["prefill_eager_ms"]["value"] == 6.5
    rec.write()
    lines = (tmp_path / "bench.jsonl").read_text().splitlines()
    assert len(lines) == len(rec.rows)
    row = json.loads(lines[0])
    assert set(row) == {"date", "gpu", "commit", "model", "config", "metric", "value", "unit"}
    assert row["gpu"] == "test-gpu" and row["model"] == "tiny" and row["config"]["engine"] == "bw24nb"


def test_bench_engine_prefill_only(small):
    """decode=False (run_bench --prefill-only): the gate and the prefill records, no decode."""
    eng = ReferenceEngine(small, n_ctx=64)
    rec = Recorder(gpu="g", commit="c", paths=[])
    bench_engine(rec, "tiny", eng, small, runs=3, read_gb_s=100.0, gen=3, prompt=6,
                 long_prompt=0, prefill=5, warmup=1, gate_tokens=6, decode=False)
    metrics = {r["metric"] for r in rec.rows}
    assert {"gate", "prefill_tok_s@5", "prefill_kernel_ms:attention", "prefill_eager_ms"} <= metrics
    assert not any(m.startswith(("decode_", "kernel_ms:")) for m in metrics)


class FastEngine:
    """generate_greedy with timings, no profile: the other branches of the harness."""
    n_ctx = 10_000

    def __init__(self, vocab):
        self.vocab, self.calls = vocab, []

    def reset(self):
        pass

    def prefill(self, ids):
        return np.eye(self.vocab, dtype=np.float32)[len(ids) % self.vocab]

    def decode(self, token):
        return np.eye(self.vocab, dtype=np.float32)[(token + 1) % self.vocab]

    def generate_greedy(self, ids, n):
        self.calls.append((len(ids), n))
        return list(range(n)), {"prefill_s": 0.5, "decode_s": 0.25, "decode_tokens": n - 1}


def test_bench_engine_uses_engine_timings_and_skips_a_missing_profile(dense, capsys):
    eng = FastEngine(dense.config.vocab_size)
    rec = Recorder(gpu="g", commit="c", paths=[])
    bench_engine(rec, "m", eng, dense, runs=3, read_gb_s=None, gen=5, prompt=7, long_prompt=9,
                 prefill=4, gate_tokens=3)
    metrics = {r["metric"]: r for r in rec.rows}
    assert metrics["decode_tok_s@7"]["value"] == 4 / 0.25 and metrics["decode_tok_s@9"]["value"] == 16
    assert metrics["decode_tok_s@7"]["config"]["path"] == "generate_greedy"
    assert (7, 5) in eng.calls and (9, 5) in eng.calls
    assert not any(m.startswith(("kernel_ms:", "decode_roofline_pct")) for m in metrics)
    assert "no profile_decode_step" in capsys.readouterr().out


def test_bench_torch_on_cpu_records_decode_and_prefill():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bench.run_bench import bench_torch
    from bw24nb.factory import hf_config_json
    cfg = model_config("qwen2.5-coder-0.5b", layers=1, vocab=256)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**hf_config_json(cfg))).eval()
    rec = Recorder(gpu="cpu", commit="c", paths=[])
    bench_torch(rec, "tiny", model, cfg.vocab_size, runs=3, warmup=1, gen=6, prompt=8,
                prefill=8, modes=("eager",))
    metrics = {r["metric"]: r for r in rec.rows}
    assert metrics["decode_tok_s@8"]["value"] > 0 and metrics["prefill_tok_s@8"]["value"] > 0
    assert metrics["decode_tok_s@8"]["config"]["engine"] == "torch-eager"
    assert metrics["decode_tok_s@8"]["config"]["fastest_torch"] is True


def test_sass_count_finds_the_kernel_and_its_work_loop():
    """bench/sass_count.py's parser on a made-up cuobjdump listing: the helper function is left
    out, the loop is the backward-branch span with the dot products (not the longer one with
    none), registers come from the kernel's resource line."""
    from bench.sass_count import count
    listing = """Resource usage:
 Function __cuda_sm20_div_s64:
  REG:20 STACK:0 SHARED:0
 Function kern:
  REG:58 STACK:0 SHARED:16
\t\tFunction : __cuda_sm20_div_s64
        /*0000*/                   IMAD R0, R1, R2, RZ ;
        /*0010*/                   BRA 0x0 ;
\t\tFunction : kern
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   IADD3 R1, R0, 0x1, RZ ;
        /*0020*/                   LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;
        /*0030*/                   IDP.4A.S8.S8 R8, R4, R5, RZ ;
        /*0040*/               @P0 IDP.4A.S8.S8 R8, R6, R7, R8 ;
        /*0050*/               @P1 BRA 0x20 ;
        /*0060*/                   SHFL.BFLY PT, R9, R8, 0x10, 0x1f ;
        /*0070*/                   FADD R8, R8, R9 ;
        /*0080*/                   ISETP.GE.AND P2, PT, R1, 0x4, PT ;
        /*0090*/                   IADD3 R1, R1, 0x1, RZ ;
        /*00a0*/                   SEL R3, R1, RZ, P2 ;
        /*00b0*/               @!P2 BRA 0x60 ;
        /*00c0*/                   EXIT ;
"""
    c = count(listing)
    assert c["total"] == 13 and c["registers"] == 58 and c["stack_bytes"] == 0
    assert c["loop"] == 4 and c["loop_ops"] == {"IDP": 2, "LDG": 1, "BRA": 1}
    assert c["inner"] == 4 and c["inner_ops"] == c["loop_ops"]
    # a row loop around the chunk loop (a persistent kernel): the main loop is the row loop
    # (more work: its stores' float ops), the inner loop the chunk loop with all the dots
    nested = listing.replace("@!P2 BRA 0x60", "@!P2 BRA 0x10").replace(
        "FADD R8, R8, R9", "FMUL R8, R8, R9")
    c = count(nested)
    assert c["loop"] == 11 and c["inner"] == 4 and c["inner_ops"]["IDP"] == 2


def test_attention_phases_reduces_working_blocks_only():
    """bench/attention_phases.py: intervals over the blocks that stamped every phase (a block
    past the context stamps entry and plan only), the span from the first entry to the last
    partial stored, and the skew of the entries."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench.attention_phases import reduce_stamps
    from bw24nb.kernels.decode_attention import TRACE_STAMPS
    n = len(TRACE_STAMPS)
    st = np.zeros((1, 1, 3, 2, n), np.uint64)
    for b, t0 in enumerate((100, 130)):                  # two working blocks, 10 ns a phase
        st[0, 0, b, 1] = t0 + 10 * np.arange(n) * (b + 1)
        st[0, 0, b, 0] = 1000 + 20 * np.arange(n)
    st[0, 0, 2, 1, :2] = (90, 95)                         # exits after its plan
    st[0, 0, 2, 0, :2] = (5, 6)
    res = reduce_stamps(st)
    assert res[f"{TRACE_STAMPS[0]}->{TRACE_STAMPS[1]}"] == (15.0, 20.0, 20.0)
    assert res["span"][0] == 130 + 20 * (n - 1) - 90
    assert res["entry skew"][0] == 130 - 90
    assert res["blocks"][:2] == (2.0, 3.0)


def test_attention_phases_reduces_the_one_pass_kernels_stamps():
    """bench/attention_phases.py --kernels 1p..: the one-pass kernel's stamps (a block a query
    head, TRACE_STAMPS_1P) reduce by their own names, one interval a pair of stamps."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench.attention_phases import KERNELS, reduce_stamps
    from bw24nb.kernels.decode_attention import TRACE_STAMPS_1P
    assert set(KERNELS) == {"split", "splitpw", "1p", "1pld", "1ps", "1psld", "1psldc2",
                            "1psldc4", "1psldc8", "1psldc2f", "1psldc4f", "1psldpw", "1psldw"}
    assert KERNELS["1psldc4"] == dict(store=True, early=True, cluster=4, share=True)
    assert KERNELS["1psldw"] == dict(store=True, early=True, pre_wait=False)
    n = len(TRACE_STAMPS_1P)
    st = np.zeros((1, 3, 2, n), np.uint64)
    for h in range(3):
        st[0, h, 1] = 50 + h + 7 * np.arange(n) * (h + 1)
        st[0, h, 0] = 10 + 3 * np.arange(n)
    res = reduce_stamps(st, TRACE_STAMPS_1P)
    assert res["entry->position"] == (14.0, 21.0, 3.0)
    assert res[f"entry->{TRACE_STAMPS_1P[-1]}"][1] == 21 * (n - 1)
    assert res["blocks"][:2] == (3.0, 3.0)


def test_module_modes_set_their_switches_for_the_block_only():
    """run_bench's module launch modes (q4k-xreg...) set matvec_q4k's switches while their
    engine is built and measured, and put the defaults back after it, exception or not."""
    from bw24nb.kernels import matvec_q4k as q4
    assert set(run_bench.MODULE_MODES) <= set(run_bench.LAUNCH_MODES)
    was = (q4.XREG, q4.XREG_DB, q4.XREG_BLOCKS_PER_SM)
    assert was == (True, True, 4)          # the defaults (session 20)
    with run_bench.module_mode("q4k-xreg"):
        assert q4.XREG is True and not q4.XREG_DB and q4.XREG_BLOCKS_PER_SM == 8
    assert (q4.XREG, q4.XREG_DB, q4.XREG_BLOCKS_PER_SM) == was
    with run_bench.module_mode("q4k-rowloop"):
        assert q4.XREG is False
    assert (q4.XREG, q4.XREG_DB, q4.XREG_BLOCKS_PER_SM) == was
    try:
        with run_bench.module_mode("q4k-xreg"):
            assert q4.XREG is True
            raise RuntimeError("engine failed")
    except RuntimeError:
        pass
    assert (q4.XREG, q4.XREG_DB, q4.XREG_BLOCKS_PER_SM) == was
    with run_bench.module_mode("default"):
        assert (q4.XREG, q4.XREG_DB, q4.XREG_BLOCKS_PER_SM) == was
    from bw24nb.kernels import decode_attention as da
    with run_bench.module_mode("attn-merge"):
        assert da.ONE_TILE_DIRECT is False
    assert da.ONE_TILE_DIRECT is True
    with run_bench.module_mode("attn-il"):
        assert da.INTERLEAVE_ROWS is True
    assert da.INTERLEAVE_ROWS is False
    with run_bench.module_mode("attn-1warp"):
        assert da.ONE_TILE_SPREAD is False
    assert da.ONE_TILE_SPREAD is True
    from bw24nb import engine
    with run_bench.module_mode("attn-split-blocks"):
        assert engine.ROWS_ATTENTION_GRID == 0
    assert engine.ROWS_ATTENTION_GRID == 8


def test_prefill_attention_bench_compares_every_form_bit_for_bit(tmp_path, monkeypatch):
    """bench/prefill_attention_bench.py on a tiny head shape (each variant launched once, not
    timed: no timing is asserted): every variant it times gives the decode-split run's output
    bit for bit, the reference check passes, and its records reach the jsonl."""
    import bench.prefill_attention_bench as pab
    import matmul_q8_bench          # (as the bench imports it: bench/ on sys.path)
    monkeypatch.setattr(matmul_q8_bench, "time_per_launch_us",
                        lambda launch, stream, smoke: (launch(), (1.0, 1))[1])
    out = tmp_path / "pa.jsonl"
    monkeypatch.delenv("OUT", raising=False)
    assert pab.main(["--T", "3", "--starts", "40", "--ctx", "64", "--shapes", "tiny",
                     "--grids", "2", "--jsonl", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    variants = {r["variant"] for r in recs}
    assert {"split+combine S=8", "split S=8 one warp", "walk2+combine S=8",
            "walk2+combine S=8 one warp"} <= variants
    assert all(r["same"] for r in recs if "same" in r)
    assert recs[0]["max_rel_err"] < 2e-3


def test_matvec_bench_times_the_engines_q6k_kernel(tmp_path, monkeypatch):
    """bench/matvec_bench.py --tiny in the simulator (launched, not timed: no timing is
    asserted): a Q6_K shape gets the engine's Q6_K_R kernel beside the generic path -- at the
    default and the asked warps a row, and over T rows, each row bit for bit the one-row
    launch -- every output within its reference bound (outputs are NaN-poisoned first), and
    the records reach the jsonl."""
    import bench.matvec_bench as matvec_bench     # (it puts bench/ on sys.path itself)
    out = tmp_path / "mv.jsonl"
    monkeypatch.setattr(sys, "argv", ["matvec_bench.py", "--tiny", "--no-old", "--act-rows", "2",
                                      "--q6kr-parts", "1", "--out", str(out)])
    assert matvec_bench.main() == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    q6 = {r["kernel"]: r for r in recs if r["qtype"] == "Q6_K"}
    assert {"dp4a", "q6kr", "q6kr_p1", "q6kr_r2", "dp4a_r2"} <= set(q6)
    assert all(r["ok"] for r in recs)
    assert q6["q6kr_r2"]["rows_bits"] and q6["dp4a_r2"]["rows_bits"]
    assert "x_r1" in q6["q6kr_r2"]
