# The call after h200_session12c.sh, back to back (the kernel cache and /tmp/m35.gguf survive
# only while the machine stays warm): the speculative exactness gate K = 1..8 on the 35B-A3B
# shape with the fitted unroll and short rows on part of a warp ("states" rollback; decode,
# verify and prefill run the same sums), then the verify's cost per K, and the 0.5B and 9B
# shapes' full bench (their decode matvecs changed where K = 896 / 4864 runs fewer slots).
# Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
[ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${SPEC_S:-300} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24
run ${SB_S:-150} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
grep -E "verify|decode step|Error|Traceback" $L/m35spec.log | head -20
python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1
run ${C05_S:-120} bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name qwen2.5-coder-0.5b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error|Traceback" $L/bench_c05.log | grep -v "^  qwen"
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
