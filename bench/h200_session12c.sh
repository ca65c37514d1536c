# The next device call (written in session 12, which lost its device after two calls): what
# 26fac28 and 6c4567e changed, each side by side with what it replaced, then the 35B-A3B
# shape's full bench on the new defaults. Carry .whl.
#  - every decode matvec with its unroll fitted to the row (matvec.fit_unroll) against the
#    full unroll, bit-compared: matvec_bench --fit-ab at the 0.5B and 35B-A3B shapes;
#  - the MoE block with short rows on part of a warp (matvec.lanes_per_row) against a whole
#    warp a row and against the full unroll, bit-compared: moe_bench --unroll fit,whole,full.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
FPID=""; [ -f /tmp/m35.gguf ] || { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1 & FPID=$!; }
run ${MV_S:-110} matvec python3 bench/matvec_bench.py --shapes small --fit-ab --no-old --launches 30 --commit $C --out /tmp/matvec.jsonl
run ${MV35_S:-60} matvec35 python3 bench/matvec_bench.py --shapes 35b --fit-ab --no-old --launches 30 --commit $C --out /tmp/matvec.jsonl
grep -hE "dp4a|BAD|FAILED|Error|Traceback" $L/matvec.log $L/matvec35.log | grep -v "^ " | head -30
run ${MOE_S:-150} moe python3 bench/moe_bench.py --tokens 1,9,128 --unroll fit,whole,full --commit $C --jsonl /tmp/moe_bench.jsonl
grep -vE "^  moe-35b|Warning|warn\(" $L/moe.log | tail -45
# wait on the factory's pid: `pgrep -f bw24nb.factory` also matches a shell whose command line
# names it (an inline device command waited on itself until its time limit, session 12)
[ -n "$FPID" ] && wait $FPID
run ${BENCH_S:-230} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|Error|Traceback" $L/bench_m35.log | grep -v "^  qwen"
grep -A12 "prefill of" $L/bench_m35.log | grep -v "bw24nb  "
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
