# Session 11, third device call: where the default prefill of the 35B-A3B shape (auto -> "rows",
# MoE blocks expert-major on the decode kernels) spends its time (per-kernel breakdown), then
# the speculative exactness gate K = 1..8 on that tree ("states" rollback; call 1 ran both
# rollbacks on 0200a31, whose prefill was the GEMM). Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
[ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${PF_S:-130} pf_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --prefill-only --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|prefill_(eager_)?tok|Error|Traceback" $L/pf_m35.log | grep -v "^  qwen"; grep -A16 "prefill of" $L/pf_m35.log | grep -v "bw24nb  "
run ${SPEC_S:-320} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24
cp /tmp/*.jsonl $OUT/; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
