#!/usr/bin/env bash
# tests/gpu/bench_engine_long_bad_args.sh BENCH: bench_engine_long refuses
# wrong arguments with exit 2 and its usage, before it looks for a GPU (so
# this runs on machines without one), and a small valid run (the tiny
# synthetic model) gets past the check (exit 0 with a GPU, 77 without).
set -u
bench=$1
. "$(dirname "$0")/bad_args_lib.sh"
for args in "--bogus" "--ctx" "--ctx 0" "--ctx 4096,x" "--ctx 4096,,8" "--ctx 1,2,3,4,5,6,7,8,9" \
    "--ctx 2000000" "--batch 65" "--batch -1" "--new 0" "--new 5000" "--new 3x" "--gamma 0" \
    "--gamma 9" "--chunk 0" "--util 0" "--util 1.5" "--util x" "--kinds fp32" "--kinds" \
    "--max-seq-len 0" "--max-seq-len 2000000" "--ctx 4096 --max-seq-len 4096" \
    "--ctx 4096 --new 64 --max-seq-len 4248" "--ctx 64 --new 2 --gamma 2 --max-seq-len 105"; do
    refused "$bench" "$args" "usage: bench_engine_long" "--ctx N,N.."
done
accepted "$bench" "--model synthetic:tiny --ctx 64 --batch 1,2 --new 2 --gamma 2 --chunk 32 --util 0.2"
accepted "$bench" "--model synthetic:tiny --ctx 64 --batch 1 --new 2 --max-seq-len 4096 --util 0.2"
# the bound counts a sequence that wins every round, and the pass-timing
# steps: ctx + new + 4 (gamma + 1) + new (gamma + 1) + gamma + 20
accepted "$bench" "--model synthetic:tiny --ctx 64 --batch 1 --new 2 --gamma 2 --max-seq-len 106 --util 0.2"
[ $fail -eq 0 ] && echo "PASS bench_engine_long argument checks"
exit $fail
