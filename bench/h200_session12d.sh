# Session 12, fourth device call (right after the third, while the kernel cache is warm): the
# speculative exactness gate K = 1..8 on the 35B-A3B shape with the fitted unroll (decode and
# verify run the same sums; MoE token kernels fitted), then the verify cost per K. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
[ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${SPEC_S:-330} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24
run ${SB_S:-200} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
grep -E "verify|decode step|step_ms|x of|Error|Traceback" $L/m35spec.log | head -30
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
