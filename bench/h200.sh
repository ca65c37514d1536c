# The device script: every current benchmark stage in one place. Each session used to copy the
# last session's script (bench/h200_session2.sh .. h200_session29.sh, retired in session 30;
# `git show ff4c098:bench/h200_session29.sh` shows the last; `git log -- bench/h200_sessionNN.sh` finds
# one). Stages ($1, comma list), each with a time limit ${NAME_S} and its own switches:
#   kc      bw24nb kernel-check --size real --only ${KC_ONLY:-matvec_rows}
#   mvb     bench/matvec_bench.py --shapes 9b --act-rows ${MVB_ROWS:-2,4,9} --no-old ${MVB_ARGS:-}
#   mm      bench/matmul_q8_bench.py --shapes 9b --T 512 ${MM_ARGS:-}: the prefill GEMM alone
#   sb      bench/gpu_same_bits.py: kernels against their twins, bit for bit, on the GPU (${SAME_S})
#   lc      bench/launch_chain.py --only ${LC_ONLY:-rule} --positions ${LC_POS:-}
#   ap      bench/attention_phases.py --kernels ${AP_KERNELS:-split} --positions ${AP_POS:-511,6143}
#           --shapes ${AP_SHAPES:-9b,05b}: decode attention's phases, stamped in the kernel
#   pa      bench/prefill_attention_bench.py --grids ${PA_GRIDS:-4,8,16,32} ${PA_ARGS:-}
#   moe     bench/moe_bench.py --tokens ${MOE_T:-128} ${MOE_ARGS:-}
#   ncu     Nsight Compute (--set full) on one launch of each of bench/ncu_kernels.py's targets
#           ${NCU_TARGETS:-mv4-q4k,mv4w2-q4k} (rulenorm4s, rule4s: the GDN rule of a K = 3 verify):
#           $OUT/ncu_TARGET.txt and the stall samples by SASS line
#   q9spec  bench/spec_bench.py on the 9B shape: the verify's cost at K = ${SB_KS:-3}, --launch
#           ${SB_LAUNCH:-default} ${SB_PASSES:-1} times over (A B A B), ${SB_RUNS:-2} runs,
#           per launch at K = ${SB_PK:-3}
#   m35spec the same on the 35B-A3B shape: K = ${MSB_KS:-3}, --launch ${MSB_LAUNCH:-default}
#   gate35  gate9 on the 35B-A3B shape, --launch ${G35_LAUNCH:-default} ${G35_ARGS:-}
#   gate9   bench/spec_gate.py on the 9B shape, K = 1..8, states rollback, --launch
#           ${G9_LAUNCH:-default} ${G9_ARGS:-}
#   tl, tlv, tl05,
#   tl35    bench/graph_timeline.py: every kernel's start and end in the 9B's decode graph (tl),
#           its verify graph at K = ${TLV_K:-3} (tlv), the 0.5B's (tl05), the 35B-A3B's (tl35); launch
#           modes ${TL_LAUNCH:-pdl,default}, ${TL_STEPS:-8} steps at context ${TL_CTX:-512};
#           the kernels as CSV in $OUT
#   c05m, q9m, m35
#           run_bench on the 0.5B / 9B / 35B-A3B shape, --launch ${C05M_LAUNCH:-default} (etc.):
#           several launch modes in one process give side-by-side numbers on the same tokens;
#           the first mode of a process reads ~2 % low on decode (decision 0042's A/A/A), so
#           lead with a throwaway one: Q9M_LAUNCH=pdl,default,X,default (pdl = default on sm_90)
#   c05, q9, m35p (each with its "old" twin: c05old, q9old, m35pold)
#           run_bench on this tree beside the tree in $OLD_TREE (default .old, commit
#           $OLD_COMMIT), same machine. Carry .old:
#           mkdir .old && git archive $OLD_COMMIT | tar x -C .old && rm -rf .old/{research,docs,tests}
# The random-weight GGUFs come from bw24nb.factory (seed 1), each started in the background when
# a stage needs it. Example: BW24_COMMIT=$(git rev-parse --short HEAD) bash bench/h200.sh kc,q9spec
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-kc}; . bench/device_env.sh
P9=""; P35=""; P05=""
factory() { python3 -m bw24nb.factory $1 --out $2 --seed 1 --tokenizer none > $L/factory_$1.log 2>&1; }
{ on q9m || on tl || on tlv || on gate9 || on q9spec || on q9 || on q9old; } && [ ! -f /tmp/q9.gguf ] && { factory qwen3.5-9b /tmp/q9.gguf & P9=$!; }
{ on m35 || on tl35 || on m35p || on m35pold || on m35spec || on gate35; } && [ ! -f /tmp/m35.gguf ] && { factory qwen3.6-35b-a3b /tmp/m35.gguf & P35=$!; }
{ on c05m || on tl05 || on c05 || on c05old; } && [ ! -f /tmp/c05.gguf ] && { factory qwen2.5-coder-0.5b /tmp/c05.gguf & P05=$!; }

on kc && { run ${KC_S:-200} kc python3 -m bw24nb.cli kernel-check --size real --only "${KC_ONLY:-matvec_rows}"
  grep -E "PASS|FAIL|passed|Error|Traceback" $L/kc.log | cut -c1-150 | tail -30; }
on mvb && { run ${MVB_S:-200} mvb python3 bench/matvec_bench.py --shapes 9b --act-rows ${MVB_ROWS:-2,4,9} --no-old ${MVB_ARGS:-} --commit $C --out /tmp/matvec_bench.jsonl
  grep -E "dp4a|q6kr|BAD|Error|Traceback" $L/mvb.log | cut -c1-150 | head -40; }
on mm && { run ${MM_S:-300} mm python3 bench/matmul_q8_bench.py --shapes 9b --T 512 ${MM_ARGS:-} --commit $C --jsonl /tmp/matmul_q8.jsonl
  grep -E "Q4_K|Q6_K|Q8_0|BAD|Error|Traceback" $L/mm.log | cut -c1-200 | head -60; }
on sb && { run ${SAME_S:-150} sb python3 bench/gpu_same_bits.py
  grep -E "SAME|DIFF|Error|Traceback" $L/sb.log; }
on lc && { run ${LC_S:-90} lc python3 bench/launch_chain.py --only "${LC_ONLY:-rule}" --positions "${LC_POS:-}" --commit $C --out /tmp/launch_chain.jsonl
  grep -vE "^\s*$|Warning|warn\(" $L/lc.log | cut -c1-160 | tail -40; }
on ap && { run ${AP_S:-120} ap python3 bench/attention_phases.py --kernels "${AP_KERNELS:-split}" --positions "${AP_POS:-511,6143}" --shapes "${AP_SHAPES:-9b,05b}" ${AP_ARGS:-} --commit $C --out /tmp/attention_phases.jsonl
  grep -vE "^\s*$|Warning|warn\(" $L/ap.log | cut -c1-160 | tail -80; }
on pa && { run ${PA_S:-200} pa python3 bench/prefill_attention_bench.py --commit $C --jsonl /tmp/prefill_attention.jsonl --grids ${PA_GRIDS:-4,8,16,32} ${PA_ARGS:-}
  grep -vE "^\s*$|Warning|warn\(" $L/pa.log | cut -c1-160 | tail -60; }
on moe && { run ${MOE_S:-200} moe python3 bench/moe_bench.py --tokens ${MOE_T:-128} ${MOE_ARGS:-} --commit $C --jsonl /tmp/moe_bench.jsonl
  grep -vE "^\s*$" $L/moe.log | cut -c1-160 | tail -30; }
if on ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "ncu: $NCU"
  for tgt in $(echo ${NCU_TARGETS:-mv4-q4k,mv4w2-q4k} | tr , ' '); do
    case $tgt in gemm*) re=matmul_q8;; mvd-q6k) re=q6_k_r;; rulenorm*) re=gated_delta_rule_norm;; rule*) re=gated_delta_rule_lane;; *) re=matvec;; esac
    run ${NCU_S:-120} ncu_$tgt $NCU --clock-control none --set full -k regex:$re --launch-skip 1 --launch-count 1 -f -o /tmp/ncu_$tgt python3 bench/ncu_kernels.py $tgt
    tail -3 $L/ncu_$tgt.log | cut -c1-200
    $NCU -i /tmp/ncu_$tgt.ncu-rep --page details > $OUT/ncu_$tgt.txt 2>&1
    $NCU -i /tmp/ncu_$tgt.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${tgt}_sass.csv 2>&1
    python3 bench/ncu_stalls.py $OUT/ncu_${tgt}_sass.csv | head -8
    grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu_$tgt.txt | head -12
  done
fi

[ -n "$P05" ] && wait $P05
tl() { run $1 $2 python3 bench/graph_timeline.py $3 --name $4 --launch ${TL_LAUNCH:-pdl,default} --steps ${TL_STEPS:-8} --context ${TL_CTX:-512} --verify $5 --csv-dir $OUT --jsonl "" --commit $C
  grep -E "^== |span|Error|Traceback" $L/$2.log | cut -c1-160; grep -A12 "inc us" $L/$2.log | head -26 | cut -c1-100; }
on tl05 && tl ${TL05_S:-150} tl05 /tmp/c05.gguf qwen2.5-coder-0.5b-random 0
on c05m && rb_stage c05m /tmp/c05.gguf qwen2.5-coder-0.5b-random ${C05M_LAUNCH:-default} ${C05M_S:-200} "attention"
PAIR_S=${C05_S:-120} bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P9" ] && wait $P9
on tl && tl ${TL_S:-200} tl /tmp/q9.gguf qwen3.5-9b-random 0
on tlv && tl ${TLV_S:-200} tlv /tmp/q9.gguf qwen3.5-9b-random ${TLV_K:-3}
on q9m && rb_stage q9m /tmp/q9.gguf qwen3.5-9b-random ${Q9M_LAUNCH:-default} ${Q9M_S:-330} "ffn_|gdn_qkv|attention"
PAIR_S=${Q9_S:-250} bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
on q9spec && { run ${SB_S:-150} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks ${SB_KS:-3} --runs ${SB_RUNS:-2} --profile-k ${SB_PK:-3} --passes ${SB_PASSES:-1} --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --launch ${SB_LAUNCH:-default} --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode_step|Error|Traceback" $L/q9spec.log | head -24; }
on gate9 && { run ${G9_S:-300} gate9 python3 bench/spec_gate.py /tmp/q9.gguf --commit $C --jsonl /tmp/spec.jsonl --rollback states --launch ${G9_LAUNCH:-default} ${G9_ARGS:-}
  grep -E "MATCH|MISMATCH|gate|Error|Traceback" $L/gate9.log | cut -c1-160 | tail -24; }
[ -n "$P35" ] && wait $P35
on m35spec && { run ${MSB_S:-300} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks ${MSB_KS:-3} --runs 2 --profile-k ${MSB_PK:-3} --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --launch ${MSB_LAUNCH:-default} --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode_step|Error|Traceback" $L/m35spec.log | head -24; }
on gate35 && { run ${G35_S:-300} gate35 python3 bench/spec_gate.py /tmp/m35.gguf --commit $C --jsonl /tmp/spec.jsonl --rollback states --launch ${G35_LAUNCH:-default} ${G35_ARGS:-}
  grep -E "MATCH|MISMATCH|gate|Error|Traceback" $L/gate35.log | cut -c1-160 | tail -24; }
on tl35 && tl ${TL35_S:-300} tl35 /tmp/m35.gguf qwen3.6-35b-a3b-random 0
on m35 && rb_stage m35 /tmp/m35.gguf qwen3.6-35b-a3b-random ${M35_LAUNCH:-default} ${M35_S:-240} "moe|gdn_|attention"
PAIR_S=${M35_S:-240} bench_pair m35p /tmp/m35.gguf qwen3.6-35b-a3b-random

grep -hE "\] bw24nb +(kernel_chain_ms:attention|decode_step_chain_ms)" $L/*.log 2>/dev/null | cut -c1-120
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs_$(echo $stages | tr , _).tgz -C $OUT logs && rm -rf $L   # a tarball a run
