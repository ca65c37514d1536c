#!/usr/bin/env bash
# Device calls of 2026-11-30, session 4: decode speed on the 9B shape (#5) and the verify (#6).
# Stages: probe (bench/q4k_probe.py: where the Q4_K matvec's time goes), bench (run_bench on the
# 9B and 0.5B shapes), check (kernel-check --size real, ONLY=patterns), fixspec / q9gate (the
# speculative exactness gate), spec (spec_bench on the 9B shape). Logs in $OUT/logs.tgz, JSON
# records in $OUT/*.jsonl.
#   usage (device tool, carry .whl):  BW24_COMMIT=<sha> bash bench/h200_session4.sh STAGES
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
export BW24_KERNEL_CACHE=/tmp/bw24-kernels
C=${BW24_COMMIT:-unknown}
stages=${1:-probe,bench}
on() { case ,$stages, in *,$1,*) return 0;; esac; return 1; }
run() { local t=$1 name=$2; shift 2; local s=$(date +%s); timeout $t "$@" > "$L/$name.log" 2>&1; local rc=$?
        echo "== $name rc=$rc $(( $(date +%s) - s ))s"; }
[ -f /tmp/q9.gguf ] || ( python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none ) > "$L/factory.log" 2>&1 &
FACT=$!
on probe && { run ${PROBE_S:-240} probe python3 bench/q4k_probe.py ${PROBE_ARGS:-}; cat "$L/probe.log" | tail -40; }
on check && { run ${CHECK_S:-200} check python3 -m bw24nb.cli kernel-check --size real ${ONLY:+--only $ONLY}
  grep -cE " PASS" "$L/check.log"; grep -E "FAIL|passed|failed|Error" "$L/check.log" | tail -8; }
on fixspec && { run ${FIXSPEC_S:-200} fixspec python3 bench/spec_gate.py tests/fixtures/qwen35*/model.gguf \
    --ks ${GKS:-1-8} --n 64 --commit $C --jsonl /tmp/spec.jsonl
  grep -E "MISMATCH|Error|Traceback|spec gate" "$L/fixspec.log" | head; tail -3 "$L/fixspec.log"; }
wait $FACT
on bench && { run ${BENCH_S:-150} bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 \
    --torch none --long-prompt ${LONG:-6144} --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager|Error" "$L/bench_q9.log" | tail -8
  grep kernel_ms "$L/bench_q9.log" | head -32
  on c05 && { run 75 bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 \
    --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager" "$L/bench_c05.log" | tail -8; }; }
on q9gate && { run ${Q9GATE_S:-200} q9gate python3 bench/spec_gate.py /tmp/q9.gguf --ks ${GKS:-1-8} --n 64 \
    --prompt-len 32 --ctx 512 --scripted --commit $C --jsonl /tmp/spec.jsonl
  grep -E "MISMATCH|Error|Traceback|spec gate|K=[18]:" "$L/q9gate.log" | head -14; }
on spec && { run ${SPEC_S:-200} spec python3 bench/spec_bench.py /tmp/q9.gguf --ks ${KS:-1,3,8} --runs 2 \
    --warmup 1 --n 64 --prompt-len 64 --ctx 1024 --modes mtp,scripted,adversarial --rollback states \
    --name q9-random --commit $C --jsonl /tmp/spec.jsonl ${SPEC_ARGS:-}
  tail -40 "$L/spec.log"; }
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
