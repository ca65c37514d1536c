# Session 24's device calls. Stages ($1, comma list):
#   mm      bench/matmul_q8_bench.py --shapes 9b with $MM_ARGS
#   q9m     run_bench on the 9B shape, --launch ${Q9M_LAUNCH:-default}
#   moe     bench/moe_bench.py --tokens ${MOE_T:-128} (the expert_rows block stage by stage)
#   m35     run_bench on the 35B-A3B shape, --launch ${M35_LAUNCH:-default} (its factory starts
#           in the background at the beginning)
# Call 1 (session 23's script, 70b6f28): mm with the copy_ahead tiles (Q4_K 12288 x 4096:
# m128t64s4a 363.5, capped at 128 registers 339.5, KERNEL_CHOICE 358.7 us), q9m
# default,gemm-ahead (7004 against 6947 tok/s).
# Call 2 (ef168dc): Q9M_LAUNCH=default,gemm-ahead-r128 M35_LAUNCH=default,slice-chain q9m,m35
#   (gemm-ahead-r128 is the default since; --launch gemm-s23 now runs the old choice)
#   (9B pp512 7031 against 7117 with the capped tile, now the default; 35B-A3B 1335 with the
#   slices side by side against 1291 in a chain).
# Call 3 (e796366): M35_LAUNCH=default,group-walk moe,m35 (1378 against 1337; moe_bench failed
#   at its shared-expert stage, fixed). Call 4: moe (route_sort 457 of a 1288-us block).
# Call 5 (2d0e333): moe,m35 with moe_sort on shared-memory tiles (route_sort 172, the block
#   1005 us; 35B-A3B pp512 1567).
# Call 6 (70c3643): moe with group batches on split rows and the router on the group kernel
#   (shared_expert 375.2 against 309.7 us, route_sort 177.7 against 173.5: both reverted).
# Session 25 runs this script too (its calls are listed in docs/benchmarks.md "Session 25").
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-q9m}; . bench/device_env.sh
on q9m && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on m35 && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
on mm && { run ${MM_S:-300} mm python3 bench/matmul_q8_bench.py --shapes 9b --T 512 ${MM_ARGS:-} --commit $C --jsonl /tmp/matmul_q8.jsonl
  grep -E "Q4_K|Q6_K|Q8_0|BAD|Error|Traceback" $L/mm.log | cut -c1-200 | head -60; }
on moe && { run ${MOE_S:-200} moe python3 bench/moe_bench.py --tokens ${MOE_T:-128} ${MOE_ARGS:-} --commit $C --jsonl /tmp/moe_bench.jsonl
  grep -vE "^\s*$" $L/moe.log | cut -c1-160 | tail -30; }
[ -n "${P9:-}" ] && wait $P9
on q9m && rb_stage q9m /tmp/q9.gguf qwen3.5-9b-random ${Q9M_LAUNCH:-default} ${Q9M_S:-330} "ffn_|gdn_qkv"
[ -n "${P35:-}" ] && wait $P35
on m35 && rb_stage m35 /tmp/m35.gguf qwen3.6-35b-a3b-random ${M35_LAUNCH:-default} ${M35_S:-240} "moe|gdn_"
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
