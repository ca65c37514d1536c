#!/usr/bin/env bash
# One device call (2026-11-30, session 3): the issue-4 gates on the final kernels (kernel-check
# at real shapes, every fixture against the numpy reference), speculative decoding on the
# 9B-shaped random model (graph verify / draft chain, both rollbacks, the K = 1..8 gate), and
# the side-by-side engine bench. Logs go to $OUT/logs/ (tarred at the end), JSON records to
# $OUT/*.jsonl.
#   usage (device tool, carry .whl):  BW24_COMMIT=<sha> bash bench/h200_session3.sh [STAGES]
stages=${1:-check,gate,fixspec,spec,bench}
. bench/device_env.sh      # the preamble these calls ran with
[ -f /tmp/q9.gguf ] || ( python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none ) > "$L/factory.log" 2>&1 &
FACT=$!
on check && { run ${CHECK_S:-200} check python3 -m bw24nb.cli kernel-check --size real ${ONLY:+--only $ONLY}
  grep -cE " PASS" "$L/check.log"; grep -E "FAIL|passed|failed" "$L/check.log" | tail -8; }
on gate && { run 150 gate python3 bench/engine_gate.py tests/fixtures/*/model.gguf tests/fixtures/*/hf \
    --tokens 32 --out "$OUT/gate.jsonl"
  tail -12 "$L/gate.log"; }
on fixspec && { run ${FIXSPEC_S:-200} fixspec python3 bench/spec_gate.py tests/fixtures/qwen35*/model.gguf \
    --ks 1-8 --n 64 --commit $C --jsonl /tmp/spec.jsonl
  grep -vE "^  " "$L/fixspec.log" | grep -E "MISMATCH|Error|Traceback|spec gate" | head; tail -3 "$L/fixspec.log"; }
wait $FACT
on spec && { run ${Q9GATE_S:-200} q9gate python3 bench/spec_gate.py /tmp/q9.gguf --ks 1-8 --n 64 \
    --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl
  grep -E "MISMATCH|Error|Traceback|spec gate|K=[18]:" "$L/q9gate.log" | head -14
 run ${SPEC_S:-240} spec_states python3 bench/spec_bench.py /tmp/q9.gguf --ks ${KS:-1-8} --runs 2 \
    --warmup 1 --n 64 --prompt-len 64 --ctx 1024 --modes mtp,scripted,adversarial --rollback states \
    --name q9-random --commit $C --jsonl /tmp/spec.jsonl
  tail -40 "$L/spec_states.log"
  run 100 spec_recompute python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3 --runs 2 --warmup 1 \
    --n 64 --prompt-len 64 --ctx 1024 --modes mtp,scripted --rollback recompute \
    --name q9-random --commit $C --jsonl /tmp/spec.jsonl
  tail -16 "$L/spec_recompute.log"; }
on bench && { run 100 bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 \
    --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager" "$L/bench_q9.log" | tail -8
  grep kernel_ms "$L/bench_q9.log" | head -14
  run 75 bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 \
    --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager" "$L/bench_c05.log" | tail -8; }
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
