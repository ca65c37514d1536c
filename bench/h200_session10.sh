# Session 10, fourth device call: the 0.5B GEMM tiles, the MoE gate diagnosis on the 35B-A3B shape,
# and the 9B / 0.5B benches with the new defaults (KERNEL_CHOICE, fuse_prefill). Carry .whl.
export BW24_COMMIT=0cc6d25; stages=none; . bench/device_env.sh
( python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none ) > $L/factory.log 2>&1 &
run 60 tiles python3 bench/matmul_q8_bench.py --shapes 0.5b --tiles m64t128s4,m128t128s4 --cvt-tiles --commit $C --jsonl /tmp/matmul_q8.jsonl
grep -E "^ *512x.*matmul_q8|BAD" $L/tiles.log | grep -v quant+
wait
run 150 diag python3 bench/moe_gate_diag.py /tmp/m35.gguf --jsonl /tmp/moe_gate_diag.jsonl
tail -48 $L/diag.log
run 170 bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s|roofline_pct|prefill_(eager_)?tok|Error" $L/bench_q9.log | grep -v "^  q9" | tail -8
run 90 bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s|roofline_pct|prefill_(eager_)?tok|Error" $L/bench_c05.log | grep -v "^  c05" | tail -8
cp /tmp/*.jsonl $OUT/; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
