#!/usr/bin/env bash
# tests/gpu/bench_linear_bad_args.sh BENCH: bench_linear_cuda refuses wrong
# arguments with exit 2 and its usage (or the --only rule), before it looks
# for a GPU (so this runs on machines without one), and the accepted forms
# get past the check (exit 0 with a GPU, 77 without).
set -u
bench=$1
. "$(dirname "$0")/bad_args_lib.sh"
for args in "--bogus" "--quick extra" "--gemv-sweep 1" "--only 4096 4096" "--only" \
    "--only 0 4096 1" "--only 4096 100 1" "--only 4096 4096 0" "--only 4096 4096 17" \
    "--only 4096 4096 1 9" "--dense x" "--dense --quick --sweep" "--sweep" "--norm-post x"; do
    refused "$bench" "$args" "--only M K N"
done
# --gemv-sweep with shapes: pairs, at most three, K a multiple of the group
for args in "--gemv-sweep 0 4096" "--gemv-sweep 4096 100" "--gemv-sweep 4096 -128" "--gemv-sweep x 4096"; do
    refused "$bench" "$args" "--gemv-sweep M K needs"
done
for args in "--gemv-sweep 512 512 1" "--gemv-sweep 512 512 512 512 512 512 512 512"; do
    refused "$bench" "$args" "--only M K N"
done
for args in "--quick" "--only 512 512 1" "--dense --quick" "--gemv-sweep 512 512" "--norm-post"; do
    accepted "$bench" "$args"
done
[ $fail -eq 0 ] && echo "PASS bench_linear_cuda argument checks"
exit $fail
