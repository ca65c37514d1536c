#!/usr/bin/env bash
# One device call: PTX/graph checks, device smoke (launch cost, bandwidth), the engine-vs-reference
# gate on every fixture, and a first decode benchmark. Logs land in $OUT.
#   usage (device tool, carry .whl [.bigfiles]):  bash bench/h200_check.sh [STAGES]
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${1:-ptx,smoke,gate,bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
case ,$stages, in *,ptx,*)
  timeout 240 python3 -m pytest -q -rs tests/test_ptx.py tests/test_graph.py > "$OUT/ptx.log" 2>&1
  echo "== ptx/graph tests: $(tail -1 "$OUT/ptx.log")";; esac
case ,$stages, in *,smoke,*)
  timeout 200 python3 bench/device_smoke.py --gib 4 > "$OUT/smoke.log" 2>&1
  cp -f "$OUT/device_smoke.jsonl" "$OUT/smoke.jsonl" 2>/dev/null
  echo "== smoke"; tail -25 "$OUT/smoke.log";; esac
case ,$stages, in *,gate,*)
  timeout 300 python3 bench/engine_gate.py tests/fixtures/*/model.gguf tests/fixtures/qwen35/hf \
     --kv f16 --out "$OUT/gate.jsonl" > "$OUT/gate.log" 2>&1
  ls .bigfiles/*.gguf >/dev/null 2>&1 && timeout 200 python3 bench/engine_gate.py .bigfiles/*.gguf \
     --kv q8_0 --out "$OUT/gate.jsonl" >> "$OUT/gate.log" 2>&1
  echo "== gate"; grep -E "^(model|/|tests|\.big)" "$OUT/gate.log" | tail -12; grep -m3 Error "$OUT/gate.log";; esac
case ,$stages, in *,real,*)
  # the real default model, sent earlier in pieces to .bigfiles/m/ (see docs/benchmarks.md)
  export BW24_CACHE=/tmp/bw24cache; mkdir -p $BW24_CACHE
  M=$BW24_CACHE/qwen2.5-coder-0.5b-instruct.gguf
  [ -f $M ] || cat .bigfiles/m/part* > $M
  for run in cold warm; do
    /usr/bin/time -f "wall %e s" timeout 240 python3 -m bw24nb.cli gen --chat -n 96 --ctx 4096 \
      --prompt "Write a Python function that reverses a string." > "$OUT/gen_$run.log" 2>&1
    echo "== gen ($run)"; tail -22 "$OUT/gen_$run.log"
  done
  timeout 300 python3 bench/run_bench.py $M --runs 3 --torch none --long-prompt 0 \
     --jsonl "$OUT/bench_real.jsonl" > "$OUT/bench_real.log" 2>&1
  echo "== bench (real model)"; tail -40 "$OUT/bench_real.log";;
esac
case ,$stages, in *,bench,*)
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > "$OUT/factory.log" 2>&1
  timeout 300 python3 bench/run_bench.py /tmp/c05.gguf --runs 3 --torch none --long-prompt 0 \
     --jsonl "$OUT/bench.jsonl" > "$OUT/bench.log" 2>&1
  echo "== bench"; tail -30 "$OUT/bench.log";; esac
