#!/usr/bin/env bash
# One device call for the decode-performance work: kernel-check of the kernels touched, then the
# side-by-side bench (int8 vs float activations) on random-weight 0.5B and 9B-shape GGUFs.
#   usage (device tool, carry .whl):  bash bench/h200_perf.sh [STAGES]   (stages: check,c05,q9)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export BW24_KERNEL_CACHE=${BW24_KERNEL_CACHE:-/tmp/bw24-kernels}
stages=${1:-check,c05,q9}
ONLY=${ONLY:-matvec*,quantize_act,kv_store*,flash_decode,flash_attn_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
case ,$stages, in *,check,*)
  timeout 240 python3 -m bw24nb.cli kernel-check --size real --only "$ONLY" > "$OUT/check.log" 2>&1
  echo "== kernel-check rc=$?"; grep -E "FAIL|passed|failed" "$OUT/check.log" | tail -8;; esac
case ,$stages, in *,c05,*)
  python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none > /dev/null 2>&1
  timeout 300 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 --torch none \
     --long-prompt ${LONG:-6144} --act-quant ${AQ:-q8,f32} --jsonl "$OUT/bench_c05.jsonl" > "$OUT/bench_c05.log" 2>&1
  echo "== bench 0.5B rc=$?"; grep -E "gate|kernel|decode step" "$OUT/bench_c05.log" | head -4; tail -28 "$OUT/bench_c05.log";; esac
case ,$stages, in *,q9,*)
  python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none > /dev/null 2>&1
  timeout 300 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 --torch none \
     --long-prompt 0 --act-quant q8 --jsonl "$OUT/bench_q9.jsonl" > "$OUT/bench_q9.log" 2>&1
  echo "== bench 9B rc=$?"; tail -30 "$OUT/bench_q9.log";; esac
