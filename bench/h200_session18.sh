# The next session's first device call (written at the end of session 17, whose device budget ran
# out): what session 17's last commits did not get to run on the GPU. Stages ($1, comma list):
#   kc          bw24nb kernel-check --size real --only 'matvec*': every decode matvec path on the
#               GPU against its numpy reference, now with K = 896 (kernels/matvec_qx0.py's Q8_0 /
#               Q5_0 / Q4_0 line-up at every block alignment; Q4_0 never ran on the GPU)
#   q9, q9old   run_bench pair on the 9B shape: this tree against $OLD_TREE (38eff85, before
#               prefill's combine took its batch of 2 in 48 registers): pp512 at head dim 256
#   c05         run_bench on the 0.5B shape (session 17: 876-887 / 775-788 tok/s, pp512 32.3k)
# Carry .whl and .old (git archive 38eff85 | tar x -C .old; bench/ and bw24nb/ are enough).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-kc,q9,q9old,c05}; . bench/device_env.sh
P9=""; P05=""
{ on q9 || on q9old; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on c05 && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on kc && { run ${KC_S:-150} kc python3 -m bw24nb.cli kernel-check --size real --only 'matvec*'
  grep -E "FAIL|BAD|Error|Traceback|checks? (passed|failed)" $L/kc.log | head -12; tail -2 $L/kc.log; }
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
grep -h -E "prefill_kernel_ms:attention " $L/q9new.log $L/q9old.log 2>/dev/null
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
cp /tmp/*.jsonl $OUT/ 2>/dev/null; cp $L/kc.log $OUT/kernel_check_real.txt 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
