# Sourced by the device scripts (bench/h200_session*.sh from session 4 on): the carried wheels
# on the path, $OUT/logs, the kernel cache, and two helpers --
#   on STAGE            true when STAGE is in the comma list $stages
#   run SECONDS NAME CMD...   CMD under a time limit, output to $L/NAME.log, one "== NAME rc=.. Ns" line
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
export BW24_KERNEL_CACHE=/tmp/bw24-kernels
C=${BW24_COMMIT:-unknown}
on() { case ,$stages, in *,$1,*) return 0;; esac; return 1; }
run() { local t=$1 name=$2; shift 2; local s=$(date +%s); timeout $t "$@" > "$L/$name.log" 2>&1; local rc=$?
        echo "== $name rc=$rc $(( $(date +%s) - s ))s"; }
