# The next session's first device call (written at the end of session 18, whose device budget
# ran out). Stages ($1, comma list):
#   ph          bench/attention_phases.py: decode attention's split pass stamped phase by phase
#               (clock64 / globaltimer, decode_attention.TRACE_STAMPS) on the 0.5B and 9B heads
#               at 511 and 6143: which step of the ~11 us one-tile split (0.5B @511) waits
#   lc          launch_chain's attention sequences (split / combine alone), for the same heads
#   c05, c05old run_bench on the 0.5B shape, this tree beside $OLD_TREE (43287e2: before the
#               q / k / v of mixed Q5_0 / Q8_0 types were widened to one Q8_0 stack, session
#               18's last change, not run on the GPU; decode bits and tokens must not change,
#               52e90df2273a2853 @512; predicted ~1.7 us on each of 12 layers, ~1.5-2 %)
#   q9          run_bench on the 9B shape (session 18, f146f2a: 353-360 / 351 tok/s)
# Carry .whl and .old (git archive 43287e2 | tar x -C .old; rm -rf .old/research .old/docs .old/tests).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-ph,lc,c05,c05old}; . bench/device_env.sh
P9=""; P05=""
on q9 && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on ph && { run ${PH_S:-120} ph python3 bench/attention_phases.py --commit $C --out /tmp/attention_phases.jsonl \
    --note "${PH_NOTE:-session 19: decode attention split pass, phases}"
  grep -E "attn|Error|Traceback" $L/ph.log | head -48; }
on lc && { run ${LC_S:-90} lc python3 bench/launch_chain.py --n 32 --commit $C --out /tmp/launch_chain.jsonl \
    --only ${LC_ONLY:-attn05b,attn9b} --note "session 19: decode attention"
  grep -E "us a rep|Error|Traceback" $L/lc.log | head -40; }
[ -n "$P05" ] && wait $P05
PAIR_S=${C05_S:-120} bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P9" ] && wait $P9
PAIR_S=${Q9_S:-150} bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
