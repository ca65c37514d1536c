# The next session's first device call (written at the end of session 16, whose budget ran
# out): what session 16's last commits did not get to run. Stages ($1, comma list):
#   c05, c05old, q9, q9old   run_bench pairs: this tree against $OLD_TREE (fd0b78a, the tree
#            before session 16's decode attention) -- pp512 with prefill's own combine restored
#            (launch_flash_decode(slices=1, prefetch=False)), and decode side by side again
#   m35, m35old              the 35B-A3B shape, which session 16 did not run (head dim 256: the
#                            sliced combine changes its summation order)
#   m35gate  its spec gate, K = 1..8, mtp / oracle / adversarial / mixed, "states" rollback
# Carry .whl and .old (git archive fd0b78a | tar x -C .old; bench/ and bw24nb/ are enough).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-c05,c05old,q9,q9old,m35gate}; . bench/device_env.sh
P9=""; P05=""; P35=""
{ on q9 || on q9old; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
{ on m35 || on m35old || on m35gate; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
# wait on the factories' pids (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
[ -n "$P35" ] && wait $P35
bench_pair m35 /tmp/m35.gguf qwen3.6-35b-a3b-random
on m35gate && { run ${GATE_S:-320} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate" $L/m35gate.log | cut -c1-150 | head -24; }
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
