# Session 16's third call: the sliced, batch-loading decode-attention combine against the one
# before (fd0b78a in $OLD_TREE), and a min_chunk sweep of the split plan. Stages ($1):
#   attn      launch_chain --only attn on this tree, with --min-chunks $MCS (default 16,32,64)
#   attnold   launch_chain --only attn on $OLD_TREE (the engine's plan only)
#   q9, q9old, c05, c05old   run_bench pairs on the 9B / 0.5B shapes
# Carry .whl and .old.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-attn,attnold,q9,q9old,c05,c05old}; . bench/device_env.sh
P9=""; P05=""
on q9 && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on c05 && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on attn && { run ${ATTN_S:-200} attn python3 bench/launch_chain.py --n 32 --only attn --min-chunks ${MCS:-16,32,64} --commit $C --note "${NOTE:-}" --out /tmp/launch_chain.jsonl
  grep -h -E "us a rep|Error|Traceback" $L/attn.log; }
on attnold && { run ${ATTN_S:-200} attnold env PYTHONPATH=/tmp/site:$PWD/.old BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 .old/bench/launch_chain.py --n 32 --only attn --commit ${OLD_COMMIT:-old} --note "${NOTE:-}" --out /tmp/launch_chain_old.jsonl
  grep -h -E "us a rep|Error|Traceback" $L/attnold.log | sed "s/^/old: /"; }
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
grep -h -E "chained x|^    kernel_chain_ms:attention" $L/q9new.log $L/c05new.log 2>/dev/null
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
