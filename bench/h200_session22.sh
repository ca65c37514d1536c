# Session 22's device calls. Stages ($1, comma list; the session-20 script's stages run there):
#   sb      bench/gpu_same_bits.py: conv runs, one-tile attention, and the quad delta rule
#           against the lane kernel (9B heads, 512 tokens; 9 tokens with saved steps)
#   hash    bench/prefill_hashes.py on the 9B shape, this tree then $OLD_TREE's: the workspace
#           hashed after every launch of a 512-token prefill chunk (first 4 layers; h after each
#           later layer), and the first line where they differ
#   q9m     run_bench on the 9B shape, --launch ${Q9M_LAUNCH:-default,lane-rule,gemm-s21} in one
#           process: the quad delta rule (default) beside the lane kernel, and the GEMM's Q4_K
#           tile choice before this session (gemm-s21); all must give the same tokens
#   c05m    the same on the 0.5B shape, --launch ${C05M_LAUNCH:-default,gemm-s21}
#   m35     run_bench on the 35B-A3B shape, --launch ${M35_LAUNCH:-default} (its factory starts
#           first, in the background)
# Call 1 (abaced0): session 20's script, sb,q9t (ONE_TILE_DIRECT: same tokens, not the cause of
# the 9B's token change; pp512 6171). Call 2: mm (--tiles all --cvt-tiles), q9old (559a9c5 still
# gives 8f7e9e56...: the trees differ). Call 3:
#   BW24_COMMIT=<head> OLD_COMMIT=559a9c5 bash bench/h200_session22.sh sb,hash,q9m
# (quad: SAME as lane; prefill gdn_rule 12.71 vs 15.27 ms, decode 4.87 vs 3.50 us a layer; the
# hashes part at layer 0's gdn_conv: the conv's FMA contraction, decision 0028's follow-up;
# gemm-s21: pp512 6301 vs 6463). Call 4, the quad rule with next-token loads, "auto" per T:
#   BW24_COMMIT=<head> Q9M_LAUNCH=default,lane-rule bash bench/h200_session22.sh sb,q9m,m35
# (call 4: quad with next-token loads 7.48 against lane 15.48 ms a 9B prefill, pp512 6839
# against 6248; 35B-A3B 326.1 / 307.0 tok/s, pp512 1201.) Call 5: session 20's script, sb,kc
# (KC_ONLY=gated_delta_rule): conv_prep SAME as conv + prep with the pinned conv sum, 12/12.
# Next (built after the device time was spent, the same bits in the simulator, not timed):
#   BW24_COMMIT=<head> Q9M_LAUNCH=default,pipe-rule M35_LAUNCH=default,conv-prep-rows \
#     bash bench/h200_session22.sh sb,q9m,m35
# sb: the pipe rule against lane on the GPU; q9m: prefill's rule on the pipe kernel beside quad;
# m35: the rows prefill's conv + prep as two launches (the default now) beside the fused one.
# Carry .whl and .old (git archive $OLD_COMMIT | tar x -C .old; rm -rf .old/research .old/docs .old/tests).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-sb,hash,q9m}; . bench/device_env.sh
P9=""; P05=""; P35=""
on m35 && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
{ on hash || on q9m; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
on c05m && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
on sb && { run ${SB_S:-150} sb python3 bench/gpu_same_bits.py
  grep -E "SAME|DIFF|Error|Traceback" $L/sb.log; }
[ -n "$P9" ] && wait $P9
on hash && { run ${HASH_S:-150} hashnew python3 bench/prefill_hashes.py /tmp/q9.gguf
  run ${HASH_S:-150} hashold env PYTHONPATH=/tmp/site:$PWD/${OLD_TREE:-.old} BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 bench/prefill_hashes.py /tmp/q9.gguf
  cp $L/hashnew.log $OUT/hashes_new.txt; cp $L/hashold.log $OUT/hashes_old.txt
  diff $L/hashold.log $L/hashnew.log | head -6 | cut -c1-400; tail -2 $L/hashnew.log | cut -c1-200; }
on q9m && { run ${Q9M_S:-330} q9m python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch ${Q9M_LAUNCH:-default,lane-rule,gemm-s21} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|Error|Traceback" $L/q9m.log | grep -v "^  qwen" | cut -c1-170
  grep -E "prefill_kernel_ms:(gdn_rule|ffn_|gdn_qkv)|kernel_chain_ms:gdn_rule" $L/q9m.log | cut -c1-120; }
[ -n "$P05" ] && wait $P05
on c05m && { run ${C05M_S:-200} c05m python3 bench/run_bench.py /tmp/c05.gguf --name qwen2.5-coder-0.5b-random --runs 3 --torch none --act-quant q8 --launch ${C05M_LAUNCH:-default,gemm-s21} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|Error|Traceback" $L/c05m.log | grep -v "^  qwen" | cut -c1-170; }
[ -n "$P35" ] && wait $P35
on m35 && { run ${M35_S:-240} m35 python3 bench/run_bench.py /tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8 --launch ${M35_LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|prefill_kernel_ms:(moe|gdn_rule)|Error|Traceback" $L/m35.log | grep -v "^  qwen" | cut -c1-170; }
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
