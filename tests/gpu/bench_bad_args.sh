#!/usr/bin/env bash
# tests/gpu/bench_bad_args.sh BENCH: bench_attention_cuda refuses wrong
# arguments with exit 2 and a message naming the accepted values, before it
# looks for a GPU (so this runs on machines without one), and a good
# --flush, --split, --step-chunks, --rows, --dtype or --table value gets past the check (exit 0 with a
# GPU, 77 without).
set -u
bench=$1
. "$(dirname "$0")/bad_args_lib.sh"
for args in "--flush bogus" "--flush" "--mode 9" "--iters 0" "--only llama9 1 4096" "--bogus" \
    "--split bogus" "--split" "--step-chunks 1" "--step-chunks 129" "--step-chunks" \
    "--rows 0" "--rows 10" "--rows" "--rows 5" "--split batch --rows 2" "--split step --rows 2 --mode 4" \
    "--dtype f32" "--dtype" "--table bogus" "--table runs:1" "--table runs:x" "--table runs:4097" "--table"; do
    refused "$bench" "$args" "--flush read|write|none" "--split batch|step" "--step-chunks" "--rows" "--dtype" \
        "--table shuffled|contig|runs:N"
done
for args in "--flush none" "--split step" "--split step --step-chunks 128"; do
    accepted "$bench" "$args" --only llama3-8b 1 4096 --mode 2 --iters 1
done
accepted "$bench" "--split step --rows 5" --only llama3-8b 1 4096 --mode 1 --iters 1
accepted "$bench" "--dtype bf16" --only llama3-8b 1 4096 --mode 1 --iters 1
for args in "--table contig" "--table runs:16" "--table shuffled"; do
    accepted "$bench" "$args" --only llama3-8b 1 4096 --mode 2 --iters 1
done
[ $fail -eq 0 ] && echo "PASS bench_attention_cuda argument checks"
exit $fail
