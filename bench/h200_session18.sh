# Session 18's device calls. Stages ($1, comma list):
#   kc          bw24nb kernel-check --size real --only 'matvec*,flash_decode*': every decode matvec
#               path (with K = 896: matvec_qx0's Q8_0 / Q5_0 / Q4_0 line-up; Q4_0 never ran on
#               the GPU) and decode attention against numpy ($KC_ONLY narrows it)
#   lc          launch_chain's decode attention sequences ($LC_ONLY, more arguments in $LC_ARGS:
#               the first call's were the one-launch form's, decision 0025), 0.5B / 9B heads at
#               511 / 6143
#   lcold       $LCOLD_ONLY from $OLD_TREE's launch_chain (same machine, same run)
#   c05, c05old run_bench pair, 0.5B shape: this tree against $OLD_TREE ($RB_EXTRA: the first
#               two calls ran --launch split-attn,fused-attn, the one-launch form's modes)
#   q9, q9old   run_bench pair, 9B shape: this tree against $OLD_TREE
#   gate9       bench/spec_gate.py on the 9B shape, K = 1..8, with the engine's default plan
# Carry .whl and .old (git archive $OLD_COMMIT | tar x -C .old; bench/ and bw24nb/ are enough).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-kc,lc,c05}; . bench/device_env.sh
P9=""; P05=""
{ on q9 || on q9old || on gate9; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on kc && { run ${KC_S:-170} kc python3 -m bw24nb.cli kernel-check --size real --only "${KC_ONLY:-matvec*,flash_decode*}"
  grep -E "FAIL|BAD|Error|Traceback|one launch" $L/kc.log | head -16; tail -2 $L/kc.log; }
on lc && { run ${LC_S:-150} lc python3 bench/launch_chain.py --n 32 --commit $C --out /tmp/launch_chain.jsonl \
    --only ${LC_ONLY:-attn05b,attn9b} ${LC_ARGS:-} --note "session 18: ${LC_NOTE:-decode attention}"
  grep -E "us a rep|Error|Traceback" $L/lc.log | head -40; }
on lcold && { run ${LC_S:-150} lcold env PYTHONPATH=/tmp/site:$PWD/${OLD_TREE:-.old} BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 ${OLD_TREE:-.old}/bench/launch_chain.py --n 32 --commit ${OLD_COMMIT:-old} --out /tmp/launch_chain_old.jsonl \
    --only ${LCOLD_ONLY:-attn05b@,attn9b@} ${LCOLD_ARGS:-} --note "session 18: the old tree ($OLD_COMMIT) beside ${C}'s launch_chain, same machine"
  grep -E "us a rep|Error|Traceback" $L/lcold.log | head -40; }
[ -n "$P05" ] && wait $P05
PAIR_S=${C05_S:-200} bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P9" ] && wait $P9
PAIR_S=${Q9_S:-250} bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
on gate9 && { run ${G9_S:-300} gate9 python3 bench/spec_gate.py /tmp/q9.gguf --commit $C --jsonl /tmp/spec.jsonl --rollback states ${G9_ARGS:-}
  grep -E "MATCH|MISMATCH|Error|Traceback" $L/gate9.log | head -20; }
grep -h -E "prefill_kernel_ms:attention |kernel_chain_ms:attention " $L/*new.log $L/*old.log 2>/dev/null | head
cp /tmp/*.jsonl $OUT/ 2>/dev/null; cp $L/kc.log $OUT/kernel_check_real.txt 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
