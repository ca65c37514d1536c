# Session 12, first device call: the rows kernels' two builds (T written-out copies against a
# run-time row loop with its unroll fitted to the row) at the 9B and 35B-A3B shapes, T = 2, 4, 9,
# bit-compared in the run; then the MoE block stage by stage at the 35B-A3B shape with the row
# loop's unroll fitted to short rows and with the full 4 slots (bit-compared). Carry .whl.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
run ${MV_S:-260} matvec python3 bench/matvec_bench.py --shapes big --act-rows 2,4,9 --no-old --launches 30 --commit $C --out /tmp/matvec.jsonl
grep -E "dp4a|BAD|FAILED|Error|Traceback" $L/matvec.log | grep -v "^ " | head -60
run ${MOE_S:-250} moe python3 bench/moe_bench.py --tokens 1,9,128 --unroll fit,full --commit $C --jsonl /tmp/moe_bench.jsonl
grep -vE "^  moe-35b" $L/moe.log | tail -40
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
