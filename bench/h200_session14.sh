# Session 14: the Q4_K decode path decodes each chunk's weights once for all rows of a rows
# kernel (d and dmin from the header word already loaded, the scales' float products and the
# nibbles in `_chunk_weights`; per row only activations, dp4a and the float combination), with
# 32-bit float conversions and paired activation-scale loads. The bits of every row must stay
# the one-row kernel's. Side by side with session 13's tree (1bf232c), which travels as an
# untracked copy in .old14/ (bw24nb + bench) and runs with its own kernel cache. Stages ($1):
#   ptx    tests/test_ptx.py's probes of the new snippets on the GPU (ld_nc_v2_f32, dp4a_us, prmt)
#   mv     bench/matvec_bench.py on the 9B shapes, rows 1 / 2 / 4 / 9 (new tree; rows_bits: row t
#          of the rows kernel against the one-row kernel, bit for bit, on the GPU)
#   q9     run_bench on the 9B shape, new then old (decode @512 / @6144, pp512, gate, tokens)
#   q9spec spec_bench on the 9B shape, K = 1, 3, 8, new then old (verify cost per round)
#   q9gate spec_gate on the 9B shape, K = 1..8, scripted drafts, "states" rollback (new)
#   m35    run_bench on the 35B-A3B shape (pp512 runs the Q4_K group kernels); m35old: the
#          same on the old tree
# Carry .whl and .old14.
export BW24_COMMIT=${BW24_COMMIT:-unknown}; stages=${1:-mv,q9,q9spec}; . bench/device_env.sh
OLD="env PYTHONPATH=/tmp/site:$PWD/.old14 BW24_KERNEL_CACHE=/tmp/bw24-kernels-old"
P9=""; P35=""
{ on q9 || on q9spec || on q9gate; } && [ ! -f /tmp/q9.gguf ] && { python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > $L/factory9.log 2>&1 & P9=$!; }
{ on m35 || on m35old; } && [ ! -f /tmp/m35.gguf ] && { python3 -m bw24nb.factory qwen3.6-35b-a3b --out /tmp/m35.gguf --seed 1 --tokenizer none > $L/factory35.log 2>&1 & P35=$!; }
on ptx && { run ${PTX_S:-120} ptx python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_ptx.py -k "ld_nc_v2 or dp4a_us or byte_perm or dp4a_matches"
  tail -3 $L/ptx.log; }
on mv && { run ${MV_S:-150} mv python3 bench/matvec_bench.py --shapes 9b --no-old --act-rows 2,4,9 --commit $C --out /tmp/matvec.jsonl
  grep -E "Q4_K|Q6_K|Error|Traceback" $L/mv.log | head -24; grep -c '"rows_bits": false' /tmp/matvec.jsonl; }
# wait on the factory's pid (never `pgrep -f`: it matches the shell naming it, session 12)
[ -n "$P9" ] && wait $P9
Q9="/tmp/q9.gguf --name qwen3.5-9b-random --runs 3 --torch none --act-quant q8"
on q9 && { run ${Q9_S:-140} q9new python3 bench/run_bench.py $Q9 --commit $C --jsonl /tmp/bench.jsonl
  run ${Q9_S:-140} q9old $OLD python3 .old14/bench/run_bench.py $Q9 --commit 1bf232c --jsonl /tmp/bench_old.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok|tokens|Error|Traceback" $L/q9new.log $L/q9old.log | grep -v "^  qwen" | cut -c1-170; }
SB="/tmp/q9.gguf --ks ${KS:-1,3,8} --runs 2 --warmup 1 --n 32 --prompt-len 64 --ctx 1024 --modes scripted --rollback states --name qwen3.5-9b-random"
on q9spec && { run ${SB_S:-150} sbnew python3 bench/spec_bench.py $SB --commit $C --jsonl /tmp/spec.jsonl
  run ${SB_S:-150} sbold $OLD python3 .old14/bench/spec_bench.py $SB --commit 1bf232c --jsonl /tmp/spec_old.jsonl
  grep -E "verify|decode step|Error|Traceback" $L/sbnew.log $L/sbold.log | head -16; }
on q9gate && { run ${GATE_S:-280} q9gate python3 bench/spec_gate.py /tmp/q9.gguf --ks 1-8 --n 64 --prompt-len 32 --ctx 512 --scripted --rollback states --commit $C --jsonl /tmp/spec.jsonl
  grep -E "K=[18]:|MISMATCH|Error|Traceback|spec gate|K in" $L/q9gate.log | cut -c1-150 | head -24; }
[ -n "$P35" ] && wait $P35
M35="/tmp/m35.gguf --name qwen3.6-35b-a3b-random --runs 3 --torch none --act-quant q8"
on m35 && run ${M35_S:-200} m35new python3 bench/run_bench.py $M35 --commit $C --jsonl /tmp/bench.jsonl
on m35old && run ${M35_S:-200} m35old $OLD python3 .old14/bench/run_bench.py $M35 --commit 1bf232c --jsonl /tmp/bench_old.jsonl
{ on m35 || on m35old; } && grep -E "gate:|decode_tok_s@|prefill_tok|Error|Traceback" $L/m35*.log | grep -v "^  qwen" | cut -c1-170
cp /tmp/*.jsonl $OUT/ 2>/dev/null; tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
