# Session 16's second call: griddepcontrol.launch_dependents first + the matvecs' L2 prefetch of
# their weights before the wait (docs/decisions/0022), side by side with the build before.
# (Ran on 6940165, whose BW24_PDL build switch was reverted in 7e91515: this script is the record
# of that run and needs that commit checked out to run again.)
# Stages ($1, comma list):
#   chain    bench/launch_chain.py (mv, mv+norm, norm, empty) under BW24_PDL=prefetch, trigger, off
#   q9, c05  run_bench on the 9B / 0.5B shapes: this tree (new), $OLD_TREE (old), and this tree
#            with BW24_PDL=trigger (trig: the early trigger without the prefetch)
#   m35      the 35B-A3B shape, new and old
# Carry .whl and .old (git archive of the old commit).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-chain,q9,c05}; . bench/device_env.sh
P9=""; P05=""; P35=""
on q9 && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on c05 && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on m35 && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
if on chain; then
  for mode in prefetch trigger off; do
    run ${CHAIN_S:-90} chain_$mode env BW24_PDL=$mode BW24_KERNEL_CACHE=/tmp/bw24-kernels-$mode python3 bench/launch_chain.py --positions "" --commit $C --note "${NOTE:-} BW24_PDL=$mode" --out /tmp/launch_chain.jsonl
    grep -h -E "us a rep|adds|Error|Traceback" $L/chain_$mode.log | sed "s/^/$mode: /"
  done
fi
trig() { local tag=$1 file=$2 name=$3
  on ${tag}trig && run ${PAIR_S:-250} ${tag}trig env BW24_PDL=trigger BW24_KERNEL_CACHE=/tmp/bw24-kernels-trigger python3 bench/run_bench.py $file --name $name --runs 3 --torch none --act-quant q8 ${RB_EXTRA:-} --commit "$C+BW24_PDL=trigger" --jsonl /tmp/bench_trig.jsonl
  on ${tag}trig && grep -E "gate:|decode_tok_s@|prefill_tok|Error|Traceback" $L/${tag}trig.log | grep -v "^  qwen" | cut -c1-170; }
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random; trig q9 /tmp/q9.gguf qwen3.5-9b-random
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random; trig c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P35" ] && wait $P35
bench_pair m35 /tmp/m35.gguf qwen3.6-35b-a3b-random
grep -h -E "chained x|^    kernel_chain_ms" $L/q9new.log $L/c05new.log 2>/dev/null | head -${CHAIN_LINES:-40}
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
