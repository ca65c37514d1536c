# Session 20's device calls (session 19's stages, and mvn). Stages ($1, comma list):
#   ph          bench/attention_phases.py: decode attention's split pass stamped phase by phase
#               (clock64 / globaltimer, decode_attention.TRACE_STAMPS) on the 0.5B and 9B heads
#               at 511 and 6143 (call 1)
#   lc          launch_chain's attention sequences (split / combine alone; "/il": the softmax's
#               rows interleaved, decode_attention.INTERLEAVE_ROWS, built after call 3), for the
#               same heads
#   c05, c05old run_bench pair, 0.5B shape: this tree beside $OLD_TREE (call 1: db03c82 beside
#               43287e2, the q / k / v of mixed Q5_0 / Q8_0 types widened to one Q8_0 stack)
#   kc          bw24nb kernel-check --size real --only $KC_ONLY (default matvec*) [--types
#               $KC_TYPES]: the Q4_K path
#               on pairs (decision 0026) against numpy on the GPU
#   mv, mvold   bench/matvec_bench.py --shapes 9b with verify rows 4 and 9, this tree then
#               $OLD_TREE's, same machine (the Q4_K 16-byte chunks against pairs)
#   q9, q9old   run_bench pair, 9B shape
#   q9spec      bench/spec_bench.py on the 9B shape: the verify's cost at K = 1, 3, 8
#   gate9       bench/spec_gate.py on the 9B shape, K = 1..8 (Q4_K's new sums: new tokens)
#   m35, m35old run_bench pair, 35B-A3B shape
#   c05x        run_bench on the 0.5B shape, --launch default,attn-il in one process: decode
#               attention's softmax rows interleaved in the engine (the same tokens)
#   q9x         run_bench on the 9B shape, --launch default,q4k-xreg-db,q4k-xreg-b4 in one process:
#               the persistent Q4_K kernel's grids and double buffer in the engine (decision
#               0026; the tokens must equal default's)
#   mvn         bench/matvec_bench.py --shapes 9b --act-rows 4,9 --nibble: the Q4_K kernels on
#               activations in nibble order beside natural order (decision 0027), bits checked
#   mvx         (call 4, dc31558) matvec_bench --xrows: verify's persistent rows kernel, since
#               removed (slower: decision 0026's follow-up)
#   q9r         run_bench on the 9B shape, --launch ${Q9R_LAUNCH:-default,q4k-rowloop}: the
#               session-20 defaults (persistent double-buffered Q4_K one-row kernel) beside the
#               row loop
#   q9s, mvs    (session 21, call 1) the streaming Q4_K kernel for K > 4096 in the engine and
#               alone (matvec_q4k.XSTREAM): slower, since removed with its switches
#   c05t, q9t   run_bench on the 0.5B / 9B shape, --launch default,attn-merge: one-tile splits
#               stored directly (decode_attention.ONE_TILE_DIRECT, the default since session
#               21) beside the four-warp merge; lc measures its "/merge" kinds beside the others
#   sb          bench/gpu_same_bits.py: the conv runs and the one-tile attention store against
#               their twins, bit for bit, on the GPU
# Next call (session 22's first): why the 9B's tokens changed between 559a9c5 and dc88338
# (decision 0028) -- BW24_COMMIT=<head> bash bench/h200_session20.sh sb,q9t
# Session 21 (this script, with MM_ARGS: extra matmul_q8_bench arguments for mm, e.g. --tiles
# m64t128s4_cvt_r80 for a register cap): call 1 ran mvs,kc,lc,c05t,q9s on 559a9c5 (XSTREAM lost,
# ONE_TILE_DIRECT won), call 2 mm,mmold,q9,q9old against 725dcce (the GEMM's header scales and
# Q6_K lanes won); call 3: the GDN prefill staging, conv runs and the GEMM's unrolled full step
# against 559a9c5:
#   BW24_COMMIT=<head> OLD_COMMIT=559a9c5 KC_ONLY='gdn*,gated_delta_rule' \
#     MM_ARGS=--tiles=m64t128s4_cvt_r80,m64t128s4_cvt_r96,m128t128s4_cvt_r96 \
#     bash bench/h200_session20.sh mm,mmold,kc,q9,q9old,c05,c05old
# Session 20's next calls, as written then (each ~500 s):
#   1. BW24_COMMIT=<head> KC_ONLY=matvec_q8,matvec_rows KC_TYPES=Q4_K \
#        bash bench/h200_session20.sh mvs,kc,lc,c05t,q9s
#      kc: the persistent one-row Q4_K kernel (default since this session) against numpy at
#      the real shapes (--types keeps the other types' slow references out); q9s also gives
#      pp512 with the prefill GEMM's header scale decode (cc8d5ea)
#   2. the GEMM change side by side: .old = 725dcce (git archive, as below), then
#        BW24_COMMIT=<head> OLD_COMMIT=725dcce bash bench/h200_session20.sh mm,mmold,q9,q9old
#   mm, mmold   bench/matmul_q8_bench.py --shapes 9b, this tree then $OLD_TREE's: the prefill
#               GEMM alone (the Q4_K / Q5_K header scale decode, cc8d5ea, and Q6_K units on 8
#               threads, 4c077dd, against 725dcce)
#   probe       bench/q4k_probe.py: the row loop, the library's persistent kernel and the probe's
#               xreg variants, 9B shapes
# Call 2 ran kc,mv,mvold,q9,q9old on 9d5fc34 (Q4_K on pairs, rejected); call 3 ran the probe and
# the q9 pair inline on b95e37a (the persistent kernel, then on by default).
# Carry .whl and .old (git archive $OLD_COMMIT | tar x -C .old; rm -rf .old/research .old/docs .old/tests).
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-ph,lc,c05,c05old}; . bench/device_env.sh
P9=""; P05=""; P35=""
{ on q9 || on q9old || on q9x || on q9r || on q9t || on q9spec || on gate9; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on c05 || on c05old || on c05x || on c05t; } && [ ! -f /tmp/c05.gguf ] && { python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > $L/factory05.log 2>&1 & P05=$!; }
{ on m35 || on m35old; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
on ph && { run ${PH_S:-120} ph python3 bench/attention_phases.py --commit $C --out /tmp/attention_phases.jsonl \
    --note "${PH_NOTE:-session 19: decode attention split pass, phases}"
  grep -E "attn|Error|Traceback" $L/ph.log | head -48; }
on lc && { run ${LC_S:-90} lc python3 bench/launch_chain.py --n 32 --commit $C --out /tmp/launch_chain.jsonl \
    --only ${LC_ONLY:-attn05b,attn9b} --note "${LC_NOTE:-session 20: decode attention}"
  grep -E "us a rep|Error|Traceback" $L/lc.log | head -40; }
on kc && { run ${KC_S:-150} kc python3 -m bw24nb.cli kernel-check --size real --only "${KC_ONLY:-matvec*}" ${KC_TYPES:+--types $KC_TYPES}
  grep -E "FAIL|BAD|Error|Traceback" $L/kc.log | head -16; tail -2 $L/kc.log; cp $L/kc.log $OUT/kernel_check_real.txt; }
on mv && { run ${MV_S:-120} mv python3 bench/matvec_bench.py --shapes 9b --no-old --act-rows 4,9 --commit $C --out /tmp/matvec.jsonl
  grep -E "Q4_K|Error|Traceback" $L/mv.log | head -16; }
on mvn && { run ${MVN_S:-170} mvn python3 bench/matvec_bench.py --shapes 9b --no-old --act-rows 4,9 --nibble --commit $C --out /tmp/matvec.jsonl
  grep -E "Q4_K|Error|Traceback" $L/mvn.log | grep -v "^ *[0-9]*x[0-9]* *Q4_K  *9B" | head -40; }
on sb && { run ${SB_S:-150} sb python3 bench/gpu_same_bits.py
  grep -E "SAME|DIFF|Error|Traceback" $L/sb.log; }
on mm && { run ${MM_S:-150} mm python3 bench/matmul_q8_bench.py --shapes 9b ${MM_ARGS:-} --commit $C --jsonl /tmp/matmul_q8.jsonl
  grep -E "matmul_q8|Error|Traceback|BAD" $L/mm.log | grep -v quant+ | head -24; }
on mmold && { run ${MM_S:-150} mmold env PYTHONPATH=/tmp/site:$PWD/${OLD_TREE:-.old} BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 ${OLD_TREE:-.old}/bench/matmul_q8_bench.py --shapes 9b --commit ${OLD_COMMIT:-old} --jsonl /tmp/matmul_q8_old.jsonl
  grep -E "matmul_q8 |Error|Traceback|BAD" $L/mmold.log | head -12; }
on mvold && { run ${MV_S:-120} mvold env PYTHONPATH=/tmp/site:$PWD/${OLD_TREE:-.old} BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 ${OLD_TREE:-.old}/bench/matvec_bench.py --shapes 9b --no-old --act-rows 4,9 --commit ${OLD_COMMIT:-old} --out /tmp/matvec_old.jsonl
  grep -E "Q4_K|Error|Traceback" $L/mvold.log | head -16; }
[ -n "$P05" ] && wait $P05
PAIR_S=${C05_S:-120} bench_pair c05 /tmp/c05.gguf qwen2.5-coder-0.5b-random
[ -n "$P9" ] && wait $P9
PAIR_S=${Q9_S:-150} bench_pair q9 /tmp/q9.gguf qwen3.5-9b-random
[ -n "$P05" ] && { on c05x || on c05t; } && wait $P05
on c05x && { run ${C05X_S:-200} c05x python3 bench/run_bench.py /tmp/c05.gguf --name qwen2.5-coder-0.5b-random --runs 3 --torch none --act-quant q8 --launch ${C05X_LAUNCH:-default,attn-il} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|kernel_chain_ms:attention|Error|Traceback" $L/c05x.log | grep -v "^qwen" | cut -c1-170; }
on c05t && { run ${C05T_S:-200} c05t python3 bench/run_bench.py /tmp/c05.gguf --name qwen2.5-coder-0.5b-random --runs 3 --torch none --act-quant q8 --launch default,attn-merge --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|kernel_chain_ms:attention|Error|Traceback" $L/c05t.log | grep -v "^qwen" | cut -c1-170; }
on q9t && { run ${Q9T_S:-300} q9t python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch default,attn-merge --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|kernel_chain_ms:attention|Error|Traceback" $L/q9t.log | grep -v "^  qwen" | cut -c1-170; }
on q9x && { run ${Q9X_S:-300} q9x python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch ${Q9X_LAUNCH:-default,q4k-xreg-db,q4k-xreg-b4} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|kernel_chain_ms:ffn_gate_up|Error|Traceback" $L/q9x.log | grep -v "^qwen" | cut -c1-170; }
on q9r && { run ${Q9R_S:-300} q9r python3 bench/run_bench.py /tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8 --launch ${Q9R_LAUNCH:-default,q4k-rowloop} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|decode_step_chain|Error|Traceback" $L/q9r.log | grep -v "^  qwen" | cut -c1-170; }
on probe && { run ${PROBE_S:-100} probe python3 bench/q4k_probe.py --shapes 12288x4096,4096x4096 --variants same,xreg,xreg_db,xreg_b4,xreg_db_b4 --out /tmp/q4k_probe.jsonl
  grep -E " us |Error|Traceback" $L/probe.log | head -12; }
on q9spec && { run ${SB_S:-150} q9spec python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --launch ${SB_LAUNCH:-default} --name qwen3.5-9b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode_step|Error|Traceback" $L/q9spec.log | head -24; }
on gate9 && { run ${G9_S:-300} gate9 python3 bench/spec_gate.py /tmp/q9.gguf --commit $C --jsonl /tmp/spec.jsonl --rollback states ${G9_ARGS:-}
  grep -E "MATCH|MISMATCH|Error|Traceback" $L/gate9.log | head -20; }
[ -n "$P35" ] && wait $P35
PAIR_S=${M35_S:-200} bench_pair m35 /tmp/m35.gguf qwen3.6-35b-a3b-random
grep -h -E "kernel_chain_ms:ffn|kernel_chain_ms:gdn_qkv|decode_step_chain" $L/q9*.log 2>/dev/null | cut -c1-120 | head -12
cp /tmp/*.jsonl $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
