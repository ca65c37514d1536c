# Session 23's device calls. Stages ($1, comma list):
#   ncu     Nsight Compute (--set full, --clock-control none) on one launch of each of
#           bench/ncu_kernels.py's targets ($NCU_TARGETS, default gemm-q4k,gemm-q6k,mv-q4k,mv4-q4k):
#           $OUT/ncu_TARGET.txt (the details page) and ncu_TARGET_sass.csv (stall samples by
#           SASS instruction)
#   mm      bench/matmul_q8_bench.py --shapes 9b with $MM_ARGS
#   q9m     run_bench on the 9B shape, --launch ${Q9M_LAUNCH:-default}
# Call 2: ncu (gemm-q4k: issue slots 61 % busy, stalls not_selected 24 %, long_sb 17 %,
# selected 17 %, wait 14 %; LDS 15 % of the instructions; 126 registers, 2 blocks an SM).
# Call 3: MM_ARGS="--tiles m128t64s4p_cvt,m128t64s4p_cvt_r80,m64t128s4p_cvt,m64t64s8p_cvt"
#   Q9M_LAUNCH=default,gemm-pairs ... mm,q9m (the pairs tiles beside KERNEL_CHOICE: Q4_K
#   12288 x 4096 394.0 against 356.9 us, pp512 6598 against 6992; removed, decision 0030).
# Next (refused: the budget was spent; built and the same bits in the simulator, not timed):
#   BW24_COMMIT=<head> MM_ARGS="--types Q4_K --tiles m128t64s4a_cvt,m64t64s4a_cvt,m128t64s4a_cvt_r128" \
#     bash bench/h200_session23.sh mm
#   (the copy_ahead tiles, cp.async double buffers, beside KERNEL_CHOICE; then
#   Q9M_LAUNCH=default,gemm-ahead ... q9m)
# Call 1: session 22's script, sb,q9m,m35 with the pipe rule and the rows prefill's conv + prep
# (pipe 6.53 against quad 7.41 ms a 9B prefill, pp512 6992 against 6851; 35B-A3B pp512 1278
# with conv + prep as two launches against 1206 fused).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-ncu}; . bench/device_env.sh
on q9m && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
if on ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "ncu: $NCU"
  for tgt in $(echo ${NCU_TARGETS:-gemm-q4k,gemm-q6k,mv-q4k,mv4-q4k} | tr , ' '); do
    case $tgt in gemm*) re=matmul_q8;; *) re=matvec;; esac
    run ${NCU_S:-120} ncu_$tgt $NCU --clock-control none --set full -k regex:$re --launch-skip 1 --launch-count 1 -f -o /tmp/ncu_$tgt python3 bench/ncu_kernels.py $tgt
    tail -3 $L/ncu_$tgt.log | cut -c1-200
    $NCU -i /tmp/ncu_$tgt.ncu-rep --page details > $OUT/ncu_$tgt.txt 2>&1
    $NCU -i /tmp/ncu_$tgt.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${tgt}_sass.csv 2>&1
    python3 bench/ncu_stalls.py $OUT/ncu_${tgt}_sass.csv | head -8
    grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Compute \(SM\) Throughput|Memory Throughput" $OUT/ncu_$tgt.txt | head -12
  done
fi
on mm && { run ${MM_S:-300} mm python3 bench/matmul_q8_bench.py --shapes 9b --T 512 ${MM_ARGS:-} --commit $C --jsonl /tmp/matmul_q8.jsonl
  grep -E "Q4_K|Q6_K|Q8_0|BAD|Error|Traceback" $L/mm.log | cut -c1-200 | head -60; }
[ -n "${P9:-}" ] && wait $P9
on q9m && { run ${Q9M_S:-330} q9m python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch ${Q9M_LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|Error|Traceback" $L/q9m.log | grep -v "^  qwen" | cut -c1-170
  grep -E "prefill_kernel_ms:(gdn_rule|ffn_|gdn_qkv)" $L/q9m.log | grep -v "^  qwen" | cut -c1-120; }
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
