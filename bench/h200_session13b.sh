# Session 13, calls 4-5: the decode-kernel projections of one input side by side on side
# streams (Engine._side_by_side: GDN qkv(z) / beta-alpha, q / k / v) -- parallel graph
# branches -- beside the chain, and the speculative path on the new graphs. Stages (a comma
# list, $1): q9ab (the 9B shape's bench, --launch default,proj-chain: tokens digest
# 7ef99b2d0f8cdd51 @512 both ways), m35spec (the 35B-A3B shape's verify cost per K),
# m35gate (its speculative exactness gate K = 1..8, "states" rollback), big27 (the 27B
# shape's bench, --launch default,chain). Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-q9ab,m35spec}; . bench/device_env.sh
P1=""; P2=""
{ on m35spec || on m35gate; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P1=$!; }
on q9ab && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P2=$!; }
# wait on the factories' pids (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P2" ] && wait $P2
on q9ab && { run ${Q9_S:-200} bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch default,proj-chain --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error|Traceback" $L/bench_q9.log | grep -v "^  qwen"; }
[ -n "$P1" ] && wait $P1
on m35spec && { run ${SB_S:-170} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode step|Error|Traceback" $L/m35spec.log | head -12; }
on m35gate && { run ${GATE_S:-300} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24; }
on big27 && { [ -f /tmp/q27.gguf ] || python3 -m bw24nb.factory qwen3.6-27b --out /tmp/q27.gguf --seed 1 --tokenizer none > $L/factory27.log 2>&1
  run ${B27_S:-250} bench_q27 python3 bench/run_bench.py /tmp/q27.gguf --name qwen3.6-27b-random --runs 3 --torch none --act-quant q8 --launch default,chain --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error|Traceback" $L/bench_q27.log | grep -v "^  qwen"; }
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
