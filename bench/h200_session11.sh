# Session 11, first device call: the 35B-A3B shape's expert-major MoE prefill and the
# rows-prefill path beside the default (prefill only, gate included), the default's full bench,
# and the speculative gate on that shape with more than session 10's 100 s. Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-0200a31}; stages=none; . bench/device_env.sh
python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1
run ${PF_S:-170} pf_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --prefill-only --launch default,moe-grouped,rows-prefill --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|prefill_(eager_)?tok|Error|Traceback" $L/pf_m35.log | grep -v "^  qwen"; grep -B2 -A12 "prefill of" $L/pf_m35.log | grep -v "bw24nb  " | head -60
run ${BENCH_S:-130} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|roofline_pct|prefill_(eager_)?tok|step_eager|Error" $L/bench_m35.log | grep -v "^  qwen"
run ${SPEC_S:-200} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl
grep -E "MISMATCH|Error|Traceback|spec gate|K=[0-9]:" $L/m35gate.log | head -20; tail -3 $L/m35gate.log
cp /tmp/*.jsonl $OUT/; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
