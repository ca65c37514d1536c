# Session 17's second call: the Q8_0 / Q5_0 / Q4_0 decode matvec on 16-byte loads
# (kernels/matvec_qx0.py) against the generic group path it replaced. Stages ($1, comma list):
#   mv       bench/matvec_bench.py --shapes 0.5b: every 0.5B shape, the new kernel (`dp4a`) beside
#            the group path (`dp4a_group`) in the same run, and the rows kernels at 2 / 4 / 9
#   c05, c05old   run_bench on the 0.5B shape (all Q5_0 / Q8_0 but ffn_down): this tree against
#            $OLD_TREE (the commit before, 595b0c2)
# Carry .whl and .old (git archive 595b0c2 | tar x -C .old).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-mv,c05,c05old}; . bench/device_env.sh
P05=""
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on mv && { run ${MV_S:-200} mv python3 bench/matvec_bench.py --shapes 0.5b --no-old --act-rows 2,4,9 --commit $C --out /tmp/matvec.jsonl
  grep -E "^ +[0-9]+x[0-9]+ .*(dp4a|BAD)|FAILED|Error|Traceback" $L/mv.log | cut -c1-120; }
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
grep -h -E "chained x|^    kernel_chain_ms:(lm_head|ffn_gate_up|attn_q|attn_output|ffn_down)" $L/c05new.log $L/c05old.log 2>/dev/null
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
