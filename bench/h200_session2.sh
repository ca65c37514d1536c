#!/usr/bin/env bash
# One device call (2026-11-30, session 2): the kernels changed this session on the GPU, then the
# side-by-side engine bench, the kernel disk cache cold/warm, the int8 prefill GEMM, speculative
# decoding cost. Logs go to $OUT/logs/ (tarred at the end), JSON records to $OUT/*.jsonl.
#   usage (device tool, carry .whl):  BW24_COMMIT=<sha> bash bench/h200_session2.sh [STAGES]
stages=${1:-check,bench,attn,cache,spec}
. bench/device_env.sh      # the preamble these calls ran with
( python3 -m bw24nb.factory qwen2.5-coder-0.5b --out /tmp/c05.gguf --seed 1 --tokenizer none
  python3 -m bw24nb.factory qwen3.5-9b --out /tmp/q9.gguf --seed 1 --tokenizer none ) > "$L/factory.log" 2>&1 &
FACT=$!
on check && { run 80 check python3 -m bw24nb.cli kernel-check --size real \
  --only "${ONLY:-matvec_q8,matvec_q6k_r,rms_norm_q8,fake_quant_act,flash_decode,matmul_q8}"
  grep -E "FAIL|passed" "$L/check.log" | tail -6; }
wait $FACT
on bench && { run 75 bench_c05 python3 bench/run_bench.py /tmp/c05.gguf --name c05-random --runs 3 \
    --torch none --long-prompt 6144 --act-quant q8 --commit $C --jsonl "$OUT/bench.jsonl"
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager" "$L/bench_c05.log" | tail -8
  grep kernel_ms "$L/bench_c05.log" | head -8
  run 100 bench_q9 python3 bench/run_bench.py /tmp/q9.gguf --name q9-random --runs 3 \
    --torch none --long-prompt 0 --act-quant q8 --commit $C --jsonl "$OUT/bench.jsonl"
  grep -E "gate:|decode_tok|roofline_pct|prefill_tok|step_eager" "$L/bench_q9.log" | tail -8
  grep kernel_ms "$L/bench_q9.log" | head -12; }
on attn && { run 40 attention python3 bench/attention_bench.py --chunks ${CHUNKS:-16,32,64} --jsonl "$OUT/attention.jsonl"
  tail -14 "$L/attention.log"; }
on cache && { run 50 kernel_cache python3 bench/kernel_cache_check.py /tmp/c05.gguf --no-fixture \
    --runs warm,warm --cache-dir $BW24_KERNEL_CACHE --timeout 24
  tail -10 "$L/kernel_cache.log"; }
on spec && { run 50 spec python3 bench/spec_bench.py /tmp/q9.gguf --ks 1,3 --runs 3 --n 32 \
    --prompt-len 64 --modes mtp --commit $C --jsonl "$OUT/spec.jsonl"
  tail -14 "$L/spec.log"; }
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
