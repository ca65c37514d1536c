#!/usr/bin/env bash
# The next device calls, written in session 4 (2026-11-30), when this session's device time was
# already spent: decode speed on the 9B shape (#5) and the verify (#6), and the H200 re-check of
# the matvec row-loop refactor (decision 0010; its PTX was compared, not run).
# Stages: probe (bench/q4k_probe.py: where the Q4_K matvec's time goes, and bit-exact candidate
# kernels), bench (run_bench on the 9B shape; add c05 for the 0.5B shape), check (kernel-check
# --size real, ONLY=patterns, e.g. ONLY='matvec*'), fixspec / q9gate (the speculative exactness
# gate on the fixtures / the 9B shape), spec (spec_bench on the 9B shape, with the FR-Spec draft
# head at 32768 and 8192 tokens), att (bench/attention_bench.py: the decode attention per KV
# cache type, KVA, side by side), pfsweep (run_bench --prefill-only per LAUNCH mode, e.g. the
# psplitN prefill-attention splits), big (run_bench on the 35B-A3B / 27B shapes, BIG), tiles
# (bench/matmul_q8_bench.py: the int8 GEMM's tile candidates beside the default, TILES, on the
# SHAPES prefill shapes), rowsmv (bench/matvec_bench.py --act-rows: the verify's rows kernels
# against the one-row kernel, per shape and type). Logs in $OUT/logs.tgz, JSON records in
# $OUT/*.jsonl.
# Env: KVC / LAUNCH (run_bench's --kv-cache / --launch lists, default "default"), SPEC_MODES,
# GATE_MODEL (q9gate's model, e.g. /tmp/qwen3.6-35b-a3b.gguf after `big`), MV_SHAPES (rowsmv),
# ATT_ARGS. Stage tests: the GPU-only tests of tests/test_graph.py and tests/test_ptx.py.
#   usage (device tool, carry .whl):  BW24_COMMIT=<sha> bash bench/h200_decode.sh STAGES
stages=${1:-probe,bench}
. bench/device_env.sh
[ -f /tmp/q9.gguf ] || ( python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none ) > "$L/factory.log" 2>&1 &
FACT=$!
on tests && { run ${TESTS_S:-240} tests python3 -m pytest -q -o addopts="" -p no:cacheprovider \
    tests/test_graph.py tests/test_ptx.py ${TESTS_ARGS:-}; tail -4 "$L/tests.log"; }
on att && { run ${ATT_S:-120} att python3 bench/attention_bench.py --jsonl /tmp/attention.jsonl \
    --kv ${KVA:-q8,f16} ${ATT_ARGS:-}; grep -E "ctx|ERROR" "$L/att.log" | tail -30; }
on tiles && { run ${TILES_S:-240} tiles python3 bench/matmul_q8_bench.py --shapes ${SHAPES:-9b} \
    --tiles ${TILES:-all} ${TILES_ARGS:-} --commit $C --jsonl /tmp/matmul_q8.jsonl
  grep -E "^ *512x.*matmul_q8|BAD|FAILED|Error" "$L/tiles.log" | grep -v quant+ | tail -40; }
on rowsmv && { run ${MV_S:-240} rowsmv python3 bench/matvec_bench.py --no-old --shapes ${MV_SHAPES:-9b} \
    --act-rows ${ACT_ROWS:-2,4,9} --out /tmp/matvec.jsonl
  grep -E "dp4a|BAD|FAILED|Error" "$L/rowsmv.log" | tail -48; }
on probe && { run ${PROBE_S:-240} probe python3 bench/q4k_probe.py ${PROBE_ARGS:-}; cat "$L/probe.log" | tail -40; }
on check && { run ${CHECK_S:-200} check python3 -m bw24nb.cli kernel-check --size real ${ONLY:+--only $ONLY}
  grep -cE " PASS" "$L/check.log"; grep -E "FAIL|passed|failed|Error" "$L/check.log" | tail -8; }
on fixspec && { run ${FIXSPEC_S:-200} fixspec python3 bench/spec_gate.py tests/fixtures/qwen35*/model.gguf \
    --ks ${GKS:-1-8} --n 64 --commit $C --jsonl /tmp/spec.jsonl
  grep -E "MISMATCH|Error|Traceback|spec gate" "$L/fixspec.log" | head; tail -3 "$L/fixspec.log"; }
wait $FACT
on bench && { run ${BENCH_S:-150} bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 \
    --torch none --long-prompt ${LONG:-6144} --act-quant q8 --kv-cache ${KVC:-default} --launch ${LAUNCH:-default} --commit $C \
    --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_(eager_)?tok|step_eager|Error" "$L/bench_q9.log" | tail -12
  grep kernel_ms "$L/bench_q9.log" | head -32; grep -A14 "prefill of" "$L/bench_q9.log"
  on c05 && { run ${C05_S:-75} bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 \
    --torch none --long-prompt 6144 --act-quant q8 --launch ${LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_(eager_)?tok|step_eager" "$L/bench_c05.log" | tail -12
  grep -A12 "prefill of" "$L/bench_c05.log"; }; }
# pfsweep: prefill only (gate, pp512 graph / eager, per-kernel breakdown) per LAUNCH mode, e.g.
# LAUNCH=psplit1,psplit2,psplit4,psplit8 (prefill attention's splits per token)
on pfsweep && { run ${PF_S:-240} pf_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 \
    --torch none --prefill-only --launch ${LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|prefill_(eager_)?tok|prefill_kernel_ms:attention |Error" "$L/pf_q9.log" | grep -v "^  q9"
  run ${PF_S:-240} pf_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 \
    --torch none --prefill-only --launch ${LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|prefill_(eager_)?tok|prefill_kernel_ms:attention |Error" "$L/pf_c05.log" | grep -v "^  c05"; }
# big: the larger shapes, never benched before session 9 (files written on the device
# by the factory: 35B-A3B ~20 GiB, 27B ~16 GiB; BIG picks which)
on big && { for m in ${BIG:-qwen3.6-35b-a3b qwen3.6-27b}; do f=/tmp/$m.gguf
  [ -f $f ] || run ${FACT_S:-400} fact_$m python3 -m bw24nb.factory $m --out $f --seed 1 --tokenizer none
  run ${BIG_S:-300} bench_$m python3 bench/run_bench.py $f --name $m-random --runs 3 --torch none \
    --long-prompt 6144 --act-quant q8 --launch ${LAUNCH:-default} --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_(eager_)?tok|step_eager|Error" "$L/bench_$m.log" | tail -12
  done; }
on q9gate && { run ${Q9GATE_S:-200} q9gate python3 bench/spec_gate.py ${GATE_MODEL:-/tmp/q9.gguf} --ks ${GKS:-1-8} --n 64 \
    --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl \
    ${Q9GATE_ARGS:-}
  grep -E "MISMATCH|Error|Traceback|spec gate|K=[18]:" "$L/q9gate.log" | head -14; }
on spec && { run ${SPEC_S:-200} spec python3 bench/spec_bench.py /tmp/q9.gguf --ks ${KS:-1,3,8} --runs 2 \
    --warmup 1 --n 64 --prompt-len 64 --ctx 1024 --modes ${SPEC_MODES:-mtp,scripted,adversarial} --rollback states \
    --name q9-random --commit $C --jsonl /tmp/spec.jsonl ${SPEC_ARGS:---trims 32768,8192}
  tail -40 "$L/spec.log"; }
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
