#!/usr/bin/env bash
# Records the XML fixtures of tests/test_sanitizer.py on a GPU machine with compute-sanitizer, with
# the exact command line stress.sanitize.runner uses:   tests/data/sanitizer/record.sh DIR
# writes DIR/<tool>_<what>.xml, the child's record (.json) and the sanitizer's text output (.txt).
set -u
out=${1:?usage: record.sh DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 SPECSAN_DEVICE=cuda

sanitize() {  # tool name child-args...
  local tool=$1 name=$2; shift 2
  local start=$(date +%s%N)
  local cmd
  cmd=$("$py" -c 'import shlex, sys; from stress import sanitizer
print(shlex.join(sanitizer.command(sys.argv[1], sys.argv[2], sys.argv[3:])))' \
    "$tool" "$out/${tool}_$name.xml" --record "$out/${tool}_$name.json" "$@")
  timeout 60 bash -c "$cmd" >"$out/${tool}_$name.txt" 2>&1
  echo "$tool $name: exit $? in $(( ($(date +%s%N) - start) / 1000000 )) ms"
}

sanitize memcheck oob control overread &
sanitize memcheck clean control clean &
sanitize initcheck uninit control uninit &
sanitize initcheck clean control clean &
sanitize synccheck clean control clean &
sanitize synccheck bad_warp_sync control bad-warp-sync &
sanitize memcheck row_overread case block_table.gather wide 1 --mutant row-overread &
wait
