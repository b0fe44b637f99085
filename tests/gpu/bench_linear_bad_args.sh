#!/usr/bin/env bash
# tests/gpu/bench_linear_bad_args.sh BENCH: bench_linear_cuda refuses wrong
# arguments with exit 2 and its usage (or the --only rule), before it looks
# for a GPU (so this runs on machines without one), and the accepted forms
# get past the check (exit 0 with a GPU, 77 without).
set -u
bench=$1
fail=0
for args in "--bogus" "--quick extra" "--gemv-sweep 1" "--only 4096 4096" "--only" \
    "--only 0 4096 1" "--only 4096 100 1" "--only 4096 4096 0" "--only 4096 4096 17" \
    "--only 4096 4096 1 9"; do
    msg=$("$bench" $args 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "--only M K N" <<<"$msg"; then
        echo "FAIL '$args': exit $rc (want 2 and the usage), stderr: $msg"
        fail=1
    fi
done
for args in "--quick" "--only 512 512 1"; do
    "$bench" $args >/dev/null 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
        echo "FAIL '$args': exit $rc (want 0, or 77 without a GPU)"
        fail=1
    fi
done
[ $fail -eq 0 ] && echo "PASS bench_linear_cuda argument checks"
exit $fail
