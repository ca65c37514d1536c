# The next session's first device call (written at the end of session 15, whose budget ran
# out): where decode attention's 16-31 us a layer go (decision 0021's chained profile), then
# the chained profile itself on the shapes the issues name. Stages ($1, comma list):
#   attn     bench/launch_chain.py --only attn: the engine's decode attention and its split pass
#            alone (the combine is the difference) for the 9B and 0.5B heads at positions 511
#            and 6143 of an 8192 cache (session 15's chained profile: 31 / 16 us a layer at ~512)
#   chain    bench/launch_chain.py without attention (empty, norms, matvec, matvec + norm)
#   q9, c05  run_bench on the 9B / 0.5B shapes (their kernel_chain_ms lines printed)
# Carry .whl (numpy<2.5 and gguf wheels: README's device notes).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-attn,q9,c05}; . bench/device_env.sh
P9=""; P05=""
on q9 && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on c05 && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on attn && { run ${ATTN_S:-150} attn python3 bench/launch_chain.py --n 32 --only attn --commit $C --note "${NOTE:-}" --out /tmp/launch_chain.jsonl
  grep -h -E "us a rep|Error|Traceback" $L/attn.log; }
on chain && { run ${CHAIN_S:-90} chain python3 bench/launch_chain.py --positions "" --commit $C --note "${NOTE:-}" --out /tmp/launch_chain.jsonl
  grep -h -E "us a rep|adds|Error|Traceback" $L/chain.log; }
# wait on the factories' pids (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
grep -h -E "chained x|^    kernel_chain_ms" $L/*new.log 2>/dev/null | head -${CHAIN_LINES:-60}
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
