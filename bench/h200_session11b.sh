# Session 11, second device call: the 35B-A3B shape with the new default prefill (auto: "rows"
# for int8 MoE models, its MoE blocks expert-major on the decode kernels) against the GEMM
# prefill with per-token and expert-major MoE, prefill only; the default's full bench; the
# speculative gate on that shape. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
[ -f /tmp/m35.gguf ] || python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${BENCH_S:-200} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|step_eager|Error|Traceback" $L/bench_m35.log | grep -v "^  qwen"; grep -A10 "prefill of" $L/bench_m35.log | grep -v "bw24nb  "
run ${PF_S:-150} pf_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --prefill-only --launch gemm-tokens,moe-grouped --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|prefill_(eager_)?tok|Error|Traceback" $L/pf_m35.log | grep -v "^  qwen"
run ${SPEC_S:-150} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl
grep -E "MISMATCH|Error|Traceback|spec gate" $L/m35gate.log | head -20; grep -cE ": MATCH" $L/m35gate.log; tail -3 $L/m35gate.log
cp /tmp/*.jsonl $OUT/; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
