# Session 17's third call: prefill's combine on its own small batch (attention.combine_kernel,
# PREFILL_COMBINE_BATCH = 2 in 48 registers) against $OLD_TREE (38eff85: the batch of 8, 80
# registers, in prefill too), and the 35B-A3B spec gate's modes the first call did not reach.
# Stages ($1, comma list):
#   c05, c05old   run_bench pair on the 0.5B shape (its pp512 attention: 4.34 ms at 595b0c2
#                 against 3.60 at fd0b78a)
#   m35gate       bench/spec_gate.py, K = 1..8, adversarial and mixed drafts, "states" rollback
# Carry .whl and .old (git archive 38eff85 | tar x -C .old).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-c05,c05old,m35gate}; . bench/device_env.sh
P05=""; P35=""
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on m35gate && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
grep -h -E "prefill_kernel_ms:attention " $L/c05new.log $L/c05old.log 2>/dev/null
[ -n "$P35" ] && wait $P35
on m35gate && { run ${GATE_S:-330} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --modes ${MODES:-adversarial,mixed} --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[1-8]:|MISMATCH|Error|Traceback|spec gate" $L/m35gate.log | cut -c1-90 | head -24; }
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
