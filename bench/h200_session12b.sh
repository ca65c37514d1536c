# Session 12, second device call: the two rows builds with the unroll fitted to short rows at
# the 35B-A3B shapes (which to keep), then the 35B-A3B shape's full bench (decode @512 / @6144,
# pp512 and the argmax gate) on the fitted MoE token / group kernels. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
run ${MV_S:-120} matvec35 python3 bench/matvec_bench.py --shapes 35b --act-rows 2,4,9 --no-old --launches 30 --commit $C --out /tmp/matvec.jsonl
grep -E "dp4a|BAD|FAILED|Error|Traceback" $L/matvec35.log | grep -v "^ " | head -30
[ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${BENCH_S:-380} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|step_eager|Error|Traceback" $L/bench_m35.log | grep -v "^  qwen"
tail -5 $L/bench_m35.log
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
