# Session 12, third device call: every decode matvec now runs with its unroll fitted to the row
# (matvec.fit_unroll). The 0.5B shape (attn 896 x 896 on two warps a row: 2 slots; ffn_down
# K = 4864 on four: 1) and the 35B-A3B shape (K = 2048: 2 slots), full bench each. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
( python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none
  [ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none ) > $L/factory.log 2>&1
run ${C05_S:-150} bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name qwen2.5-coder-0.5b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|Error|Traceback" $L/bench_c05.log | grep -v "^  qwen"
run ${BENCH_S:-330} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|Error|Traceback" $L/bench_m35.log | grep -v "^  qwen"
grep -A14 "decode step, per kernel\|per kernel" $L/bench_m35.log | grep -v "bw24nb  " | head -34
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
