# Session 19's device calls. Stages ($1, comma list):
#   ph          bench/attention_phases.py: decode attention's split pass stamped phase by phase
#               (clock64 / globaltimer, decode_attention.TRACE_STAMPS) on the 0.5B and 9B heads
#               at 511 and 6143 (call 1)
#   lc          launch_chain's attention sequences (split / combine alone; "/il": the softmax's
#               rows interleaved, decode_attention.INTERLEAVE_ROWS, built after call 3), for the
#               same heads
#   c05, c05old run_bench pair, 0.5B shape: this tree beside $OLD_TREE (call 1: db03c82 beside
#               43287e2, the q / k / v of mixed Q5_0 / Q8_0 types widened to one Q8_0 stack)
#   kc          bw24nb kernel-check --size real --only $KC_ONLY (default matvec*): the Q4_K path
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
#   probe       bench/q4k_probe.py: the row loop, the library's persistent kernel and the probe's
#               xreg variants, 9B shapes
# Call 2 ran kc,mv,mvold,q9,q9old on 9d5fc34 (Q4_K on pairs, rejected); call 3 ran the probe and
# the q9 pair inline on b95e37a (the persistent kernel, then on by default).
# Carry .whl and .old (git archive $OLD_COMMIT | tar x -C .old; rm -rf .old/research .old/docs .old/tests).
# Every stage above is also a stage of bench/h200_session20.sh (with session 20's), which runs
# them: one copy of the stage commands.
exec bash "$(dirname "$0")/h200_session20.sh" "${1:-ph,lc,c05,c05old}"
