# The next device call (written in session 13, whose device budget ended first): the 9B
# shape's speculative path on the graphs with parallel branches (decision 0019) -- the
# exactness gate K = 1..8 (scripted drafts: mtp, oracle, adversarial, mixed; "states"
# rollback) and the verify cost per K beside a decode step (session 13 measured it on
# 38c6216 only: 2.46x at K = 3). The 35B-A3B shape's gate already passed on 7cb606f. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
[ -f /tmp/q9.gguf ] || python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1
run ${GATE_S:-280} q9gate python3 bench/spec_gate.py /tmp/q9.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/q9gate.log | cut -c1-150 | head -24
run ${SB_S:-150} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
grep -E "verify|Error|Traceback" $L/q9spec.log | head -20
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
