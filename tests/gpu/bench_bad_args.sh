#!/usr/bin/env bash
# tests/gpu/bench_bad_args.sh BENCH: bench_attention_cuda refuses wrong
# arguments with exit 2 and a message naming the accepted values, before it
# looks for a GPU (so this runs on machines without one), and a good
# --flush, --split or --step-chunks value gets past the check (exit 0 with a GPU, 77 without).
set -u
bench=$1
fail=0
for args in "--flush bogus" "--flush" "--mode 9" "--iters 0" "--only llama9 1 4096" "--bogus" \
    "--split bogus" "--split" "--step-chunks 1" "--step-chunks 129" "--step-chunks"; do
    msg=$("$bench" $args 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "--flush read|write|none" <<<"$msg" ||
        ! grep -q -- "--split batch|step" <<<"$msg" || ! grep -q -- "--step-chunks" <<<"$msg"; then
        echo "FAIL '$args': exit $rc (want 2 and the usage), stderr: $msg"
        fail=1
    fi
done
for args in "--flush none" "--split step" "--split step --step-chunks 128"; do
    "$bench" $args --only llama3-8b 1 4096 --mode 2 --iters 1 >/dev/null 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
        echo "FAIL '$args': exit $rc (want 0, or 77 without a GPU)"
        fail=1
    fi
done
[ $fail -eq 0 ] && echo "PASS bench_attention_cuda argument checks"
exit $fail
