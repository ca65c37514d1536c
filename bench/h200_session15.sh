# The next device calls (written in session 14, whose device budget ended first): what the Q4_K
# instruction diet (decision 0020) was not yet measured on. Session 14 measured the 9B shape
# (decode, verify K = 1 / 3 / 8, the spec gate K = 1..8) and the 35B-A3B shape's bench, each
# beside 1bf232c. Left:
#   m35gate  the 35B-A3B shape's spec gate K = 1..8 (mtp / oracle / adversarial / mixed,
#            "states"): its MoE token and group kernels run the changed path
#   m35spec  its verify cost per round, K = 1 / 3 / 8 (session 13: 2.06x a step at K = 3)
#   q27      the 27B shape's bench (64 layers of Q4_K; session 13: 87.8 / 85.5 tok/s, pp512 1230)
#   q27old   the same on the old tree, side by side (needs .old: see below)
#   sass     bench/sass_count.py on the device's own toolkit, to check the static counts there
#   mv       bench/matvec_bench.py --act-rows 2,4,9 on the 9B shapes: the rows kernels indexed
#            from one base plus an offset (landed unmeasured at the end of session 14; session
#            14's numbers at 3a5a2d1: 12288 x 4096 at 1 / 2 / 4 / 9 rows 11.44 / 14.95 / 24.05 /
#            48.03 us); then spec_bench on the 9B shape (verify K = 3 was 6.90 ms)
# Carry .whl, and .old for q27old: `mkdir .old && git archive 1bf232c bw24nb bench | tar -x -C
# .old` (ignored by git; named in carry it travels, and runs with its own kernel cache). Budget: m35gate ~300 s, m35spec ~170 s,
# q27 ~250 s each with its factory run once (~150 s): two calls.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-m35gate,m35spec}; . bench/device_env.sh
P35=""; P27=""
{ on m35gate || on m35spec; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
{ on q27 || on q27old; } && [ ! -f /tmp/q27.gguf ] && { python3 -m bw24nb.factory qwen3.6-27b --out /tmp/q27.gguf --seed 1 --tokenizer none > $L/factory27.log 2>&1 & P27=$!; }
on mv && { run ${MV_S:-150} mv python3 bench/matvec_bench.py --shapes 9b --no-old --act-rows 2,4,9 --commit $C --out /tmp/matvec.jsonl
  grep -E "Q4_K|Error|Traceback" $L/mv.log | head -16; grep -c '"rows_bits": false' /tmp/matvec.jsonl; }
on sass && { run ${SASS_S:-120} sass python3 bench/sass_count.py bw24nb.kernels.matvec_q4k:matvec_q8_q4_k_v4 bw24nb.kernels.matvec_q4k:matvec_q8_q4_k_v4_r4 --commit $C --jsonl /tmp/sass.jsonl
  cut -c1-160 $L/sass.log | tail -3; }
# wait on the factories' pids (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P35" ] && wait $P35
on m35gate && { run ${GATE_S:-300} m35gate python3 bench/spec_gate.py /tmp/m35.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/m35gate.log | cut -c1-150 | head -24; }
on m35spec && { run ${SB_S:-170} m35spec python3 bench/spec_bench.py /tmp/m35.gguf --ks 1,3,8 --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.6-35b-a3b-random --commit $C --jsonl /tmp/spec.jsonl
  grep -E "verify|decode step|Error|Traceback" $L/m35spec.log | head -12; }
[ -n "$P27" ] && wait $P27
OLD_COMMIT=1bf232c bench_pair q27 /tmp/q27.gguf qwen3.6-27b-random
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
