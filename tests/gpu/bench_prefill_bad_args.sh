#!/usr/bin/env bash
# tests/gpu/bench_prefill_bad_args.sh BENCH: bench_prefill_attention refuses
# wrong arguments with exit 2 and its usage, before it looks for a GPU (so
# this runs on machines without one); good values get past the check (exit 0
# with a GPU, 77 without).
set -u
bench=$1
. "$(dirname "$0")/bad_args_lib.sh"
for args in "--iters 0" "--iters" "--iters 5x" "--chunk 8" "--chunk 512,x" "--chunk" "--hist 100" \
    "--hist -128" "--hist 262144" "--bogus" "--chunk 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"; do
    refused "$bench" "$args" "--chunk C" "--hist H" "--iters"
done
for args in "--quick --chunk 64 --hist 0,128" "--iters 1 --chunk 16 --hist 256"; do
    accepted "$bench" "$args"
done
[ $fail -eq 0 ] && echo "PASS bench_prefill_attention argument checks"
exit $fail
