# Session 15's device calls. Stages ($1, comma list):
#   chain    bench/launch_chain.py: what the decode step's small kernels cost inside a
#            programmatic graph (empty kernel, the q8 norms, the 4096 x 4096 Q4_K matvec, matvec
#            + norm), on this tree and on the old one ($OLD_TREE) side by side
#   q9       run_bench on the 9B shape, this tree then the old one (bench_pair)
#   c05      the same on the 0.5B shape (Qwen2.5-Coder-0.5B, the launch-bound default model)
#   mv       bench/matvec_bench.py --act-rows 2,4,9 on the 9B shapes: the rows kernels indexed
#            from one base plus an offset (9146c14, unmeasured in session 14; 3a5a2d1 had
#            12288 x 4096 at 1 / 2 / 4 / 9 rows 11.44 / 14.95 / 24.05 / 48.03 us)
#   m35gate  the 35B-A3B shape's spec gate K = 1..8 (mtp / oracle / adversarial / mixed,
#            "states"): its MoE token and group kernels run session 14's changed path
#   m35spec  its verify cost per round, K = 1 / 3 / 8 (session 13: 2.06x a step at K = 3)
#   q9spec   the 9B shape's verify cost per round, K = 1 / 3 / 8 (session 14: 2.16x at K = 3)
#   q27      run_bench on the 27B shape (RB27 = its extra run_bench arguments, e.g. "--launch
#            default,norm-whole": its 5120-wide norms take the wide-row split)
#   m35      run_bench on the 35B-A3B shape (bench_pair: with RB_EXTRA="--launch
#            default,norm-whole" both norm forms in one run)
# Carry .whl and .old: `mkdir .old && git archive $OLD_COMMIT bw24nb bench | tar -x -C .old`
# (ignored by git; named in carry it travels, and runs with its own kernel cache).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-chain,q9,q9old,c05,c05old}; . bench/device_env.sh
OLD_COMMIT=${OLD_COMMIT:-e13dd5d}; export OLD_COMMIT
P9=""; P05=""; P35=""; P27=""
{ on q9 || on q9old || on q9spec; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
{ on m35gate || on m35spec || on m35; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
on q27 && [ ! -f /tmp/q27.gguf ] && { python3 -m bw24nb.factory qwen3.6-27b --out /tmp/q27.gguf --seed 1 --tokenizer none > $L/factory27.log 2>&1 & P27=$!; }
on chain && { run ${CHAIN_S:-90} chainnew python3 bench/launch_chain.py --commit $C --note "${NOTE:-}" --out /tmp/launch_chain.jsonl
  run ${CHAIN_S:-90} chainold env PYTHONPATH=/tmp/site:$PWD/${OLD_TREE:-.old} BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 ${OLD_TREE:-.old}/bench/launch_chain.py --commit $OLD_COMMIT --note "${NOTE:-} (old tree)" --out /tmp/launch_chain.jsonl 2>/dev/null || true
  grep -h -E "us a rep|adds|Error|Traceback" $L/chain*.log; }
on mv && { run ${MV_S:-150} mv python3 bench/matvec_bench.py --shapes 9b --no-old --act-rows 2,4,9 --commit $C --out /tmp/matvec.jsonl
  grep -E "Q4_K|Error|Traceback" $L/mv.log | head -16; grep -c '"rows_bits": false' /tmp/matvec.jsonl; }
# wait on the factories' pids (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P9" ] && wait $P9
bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
on q9spec && { run ${SB_S:-170} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode step|Error|Traceback" $L/q9spec.log | head -12; }
[ -n "$P05" ] && wait $P05
bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P35" ] && wait $P35
on m35gate && { run ${GATE_S:-300} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24; }
on m35spec && { run ${SB_S:-170} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode step|Error|Traceback" $L/m35spec.log | head -12; }
bench_pair m35 /tmp/m35.gguf qwen3.6-35b-a3b-random
[ -n "$P27" ] && wait $P27
RB_EXTRA="${RB27:-}" bench_pair q27 /tmp/q27.gguf qwen3.6-27b-random
grep -h -E "chained x|kernel_chain_ms" $L/*new.log 2>/dev/null | head -${CHAIN_LINES:-60}
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
