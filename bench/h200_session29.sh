# Session 29's device calls (session 28's script, its rejected terms-kernel modes gone). Stages
# ($1, comma list):
#   kc      bw24nb kernel-check --size real --only ${KC_ONLY:-matvec_rows}
#   mvb     bench/matvec_bench.py --shapes 9b --act-rows ${MVB_ROWS:-2,4,9} --no-old
#   q9spec  bench/spec_bench.py on the 9B shape: the verify's cost at K = ${SB_KS:-3}, --launch
#           ${SB_LAUNCH:-default,rows-cap64,rows-cap72,rows-cap80} (the verify's rows kernels
#           under a register cap: matvec.ROWS_MAX_REGISTERS)
#   gate9   bench/spec_gate.py on the 9B shape, K = 1..8, states rollback ${G9_ARGS:-}
#           --launch ${G9_LAUNCH:-default}
#   q9m     run_bench on the 9B shape, --launch ${Q9M_LAUNCH:-default}
#   m35     run_bench on the 35B-A3B shape, --launch ${M35_LAUNCH:-default}
#   c05m    run_bench on the 0.5B shape, --launch ${C05M_LAUNCH:-default}
#   pa, moe, lc as in h200_session27.sh
# Session 28's terms-kernel stages ran in session 29's call 1 (as h200_session28.sh on 6b812b8:
#   kc,mvb,q9spec with --rsh / --launch rsh,rsh-b4): bit-exact and slower; removed.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-pa}; . bench/device_env.sh
{ on q9m || on gate9 || on q9spec; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on m35 && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
on c05m && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on kc && { run ${KC_S:-200} kc python3 -m bw24nb.cli kernel-check --size real --only "${KC_ONLY:-matvec_rows}"
  grep -E "PASS|FAIL|passed|Error|Traceback" $L/kc.log | cut -c1-150 | tail -30; }
on mvb && { run ${MVB_S:-200} mvb python3 bench/matvec_bench.py --shapes 9b --act-rows ${MVB_ROWS:-2,4,9} --no-old --commit $C --out /tmp/matvec_bench.jsonl
  grep -E "dp4a|BAD|Error|Traceback" $L/mvb.log | cut -c1-150 | head -40; }
on lc && { run ${LC_S:-90} lc python3 bench/launch_chain.py --only "${LC_ONLY:-rule}" --positions "" --commit $C --out /tmp/launch_chain.jsonl
  grep -vE "^\s*$|Warning|warn\(" $L/lc.log | cut -c1-160 | tail -20; }
on pa && { run ${PA_S:-200} pa python3 bench/prefill_attention_bench.py --commit $C --jsonl /tmp/prefill_attention.jsonl --grids ${PA_GRIDS:-4,8,16,32} ${PA_ARGS:-}
  grep -vE "^\s*$|Warning|warn\(" $L/pa.log | cut -c1-160 | tail -60; }
on moe && { run ${MOE_S:-200} moe python3 bench/moe_bench.py --tokens ${MOE_T:-128} ${MOE_ARGS:-} --commit $C --jsonl /tmp/moe_bench.jsonl
  grep -vE "^\s*$" $L/moe.log | cut -c1-160 | tail -30; }
[ -n "${P05:-}" ] && wait $P05
on c05m && rb_stage c05m /tmp/c05.gguf qwen2.5-coder-0.5b-random ${C05M_LAUNCH:-default} ${C05M_S:-200} "attention"
[ -n "${P9:-}" ] && wait $P9
on q9m && rb_stage q9m /tmp/q9.gguf qwen3.5-9b-random ${Q9M_LAUNCH:-default} ${Q9M_S:-330} "ffn_|gdn_qkv|attention"
on q9spec && { run ${SB_S:-150} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks ${SB_KS:-3} --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --launch ${SB_LAUNCH:-default,rows-cap64,rows-cap72,rows-cap80} --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode_step|Error|Traceback" $L/q9spec.log | head -24; }
on gate9 && { run ${G9_S:-300} gate9 python3 bench/spec_gate.py /tmp/q9.gguf --commit $C --jsonl /tmp/spec.jsonl --rollback states --launch ${G9_LAUNCH:-default} ${G9_ARGS:-}
  grep -E "MATCH|MISMATCH|gate|Error|Traceback" $L/gate9.log | cut -c1-160 | tail -24; }
[ -n "${P35:-}" ] && wait $P35
on m35 && rb_stage m35 /tmp/m35.gguf qwen3.6-35b-a3b-random ${M35_LAUNCH:-default} ${M35_S:-240} "moe|gdn_|attention"
grep -hE "\] bw24nb +(kernel_chain_ms:attention|decode_step_chain_ms)" $L/*.log 2>/dev/null | cut -c1-120
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
