# Session 10, fifth device call: the benches after kernel_for's grid rule, the MoE gate
# diagnosis and bench on the 35B-A3B shape, the speculative gate on it. Carry .whl.
export BW24_COMMIT=e81059b; stages=none; . bench/device_env.sh
( python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none ) > $L/factory.log 2>&1 &
sleep 3; while [ ! -s /tmp/q9.gguf ]; do sleep 1; done
run 60 bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error" $L/bench_c05.log | grep -v "^  c05"
wait
run 60 bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error" $L/bench_q9.log | grep -v "^  q9"
run 110 diag python3 bench/moe_gate_diag.py /tmp/m35.gguf --jsonl /tmp/moe_gate_diag.jsonl
grep -vE "Warning|warn\(" $L/diag.log | tail -48
run 150 bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|step_eager|Error" $L/bench_m35.log | grep -v "^  qwen"
run ${SPEC_S:-100} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl
grep -E "MISMATCH|Error|Traceback|spec gate|K=[18]:" $L/m35gate.log | head -14; tail -3 $L/m35gate.log
cp /tmp/*.jsonl $OUT/; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
