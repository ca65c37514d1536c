# Sourced by the device scripts (bench/h200.sh, h200_decode.sh; before session 30 the per-session
# bench/h200_sessionNN.sh): the carried wheels on the path, $OUT/logs, the kernel cache, and two helpers --
#   on STAGE            true when STAGE is in the comma list $stages
#   run SECONDS NAME CMD...   CMD under a time limit, output to $L/NAME.log, one "== NAME rc=.. Ns" line
#   rb_stage NAME FILE MODEL LAUNCH SECONDS PATTERN
#                             run_bench on FILE (--name MODEL, --launch LAUNCH) as stage NAME,
#                             then its gate / decode / prefill lines and the prefill kernels
#                             whose names match PATTERN (session 24 on)
#   bench_pair TAG FILE NAME  run_bench on FILE for stage TAG (this tree) and stage TAGold (the
#                             tree in $OLD_TREE, default .old, commit $OLD_COMMIT), then their
#                             gate / decode / prefill lines; $RB_EXTRA / $RB_OLD_EXTRA: more
#                             run_bench arguments for the new / the old tree
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
export BW24_KERNEL_CACHE=/tmp/bw24-kernels
C=${BW24_COMMIT:-unknown}
on() { case ,$stages, in *,$1,*) return 0;; esac; return 1; }
run() { local t=$1 name=$2; shift 2; local s=$(date +%s); timeout $t "$@" > "$L/$name.log" 2>&1; local rc=$?
        echo "== $name rc=$rc $(( $(date +%s) - s ))s"
        cp /tmp/*.jsonl $OUT/ 2>/dev/null; }  # after every stage: a call cut off at its limit keeps its rows
rb_stage() { local name=$1 file=$2 model=$3 launch=$4 secs=$5 pat=$6
  run $secs $name python3 bench/run_bench.py $file --name $model --runs 3 --torch none --act-quant q8 --launch $launch --commit $C --jsonl /tmp/bench.jsonl
  grep -E "gate:|decode_tok_s@|prefill_tok_s|Error|Traceback" $L/$name.log | grep -v "^  qwen" | cut -c1-170
  grep -E "prefill_kernel_ms:($pat)" $L/$name.log | grep -v "^  qwen" | cut -c1-120; }
bench_pair() { local tag=$1 file=$2 name=$3 old=${OLD_TREE:-.old}
  local args="--name $name --runs 3 --torch none --act-quant q8"
  on $tag && run ${PAIR_S:-250} ${tag}new python3 bench/run_bench.py $file $args ${RB_EXTRA:-} --commit $C --jsonl /tmp/bench.jsonl
  on ${tag}old && run ${PAIR_S:-250} ${tag}old env PYTHONPATH=/tmp/site:$PWD/$old BW24_KERNEL_CACHE=/tmp/bw24-kernels-old python3 $old/bench/run_bench.py $file $args ${RB_OLD_EXTRA:-} --commit ${OLD_COMMIT:-old} --jsonl /tmp/bench_old.jsonl
  { on $tag || on ${tag}old; } && grep -E "gate:|decode_tok_s@|prefill_tok|Error|Traceback" $L/${tag}*.log | grep -v "^  qwen" | cut -c1-170; }
