# The next device call (prepared in session 12, whose budget ended before it): the 9B shape's
# full bench (its long rows run the same kernels as before: K = 4096 / 12288 keep 4 slots a
# step; this checks that nothing regressed, tokens digest included), then its verify cost per K
# beside a decode step (spec_bench, "states" rollback). Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
if [ ! -f /tmp/q9.gguf ]; then
  python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
fi
run ${BENCH_S:-240} bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error|Traceback" $L/bench_q9.log | grep -v "^  qwen"
run ${SB_S:-200} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
grep -E "verify|Error|Traceback" $L/q9spec.log | head -20
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
