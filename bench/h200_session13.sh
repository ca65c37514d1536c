# Session 13, call 3: the int8 MoE block with its independent launches on side streams
# (moe.BRANCHES, graph.Branches: the shared expert beside the routing and routed experts, each
# up projection beside its gate -- parallel graph branches instead of one chain), side by side
# with the chain, then the 35B-A3B shape's full bench on the new default (tokens digest
# 52d0b5ce8a6ffec7 @512 on session 12's tree: the bits must not change). Carry .whl.
#  - tests/test_graph.py on the GPU (the fork / join graph has 6 kernel edges a step, not 5);
#  - moe_bench --branches on,off: block times, bits equal both ways and across replays;
#  - run_bench --launch default,moe-chain: decode / pp512 / gate, both in one run.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=none; . bench/device_env.sh
FPID=""; [ -f /tmp/m35.gguf ] || { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory.log 2>&1 & FPID=$!; }
run ${TESTS_S:-150} tests python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_graph.py
tail -3 $L/tests.log
run ${MOE_S:-170} moe python3 bench/moe_bench.py --tokens 1,9,128 --branches on,off --commit $C --jsonl /tmp/moe_bench.jsonl
grep -vE "^  moe-35b|Warning|warn\(" $L/moe.log | tail -30
# wait on the factory's pid (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$FPID" ] && wait $FPID
run ${BENCH_S:-300} bench_m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8 --launch ${LAUNCH:-default,moe-chain} --commit $C --jsonl /tmp/bench.jsonl
grep -E "gate:|decode_tok_s@|prefill_(eager_)?tok|kernel_ms:moe |Error|Traceback" $L/bench_m35.log | grep -v "^  qwen"
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
