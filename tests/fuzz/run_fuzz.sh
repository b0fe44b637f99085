#!/bin/sh
# run_fuzz.sh: builds the request decoder/validator fuzz target with clang
# (-fsanitize=fuzzer,address,undefined) in its own build directory and runs
# it for a bounded time over a copy of tests/fuzz/corpus.
# Usage: tests/fuzz/run_fuzz.sh [seconds (default 60)] [build dir (default build-fuzz)]
# Exit status: 0 when no crash was found; non-zero otherwise (the crashing
# input is left in the build directory as crash-*).
set -eu
SECS=${1:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${2:-$ROOT/build-fuzz}
# NOTE: absolute, since the fuzzer runs from inside the build directory.
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
command -v clang >/dev/null || { echo "run_fuzz.sh: clang not found (scripts/setup.sh installs it)" >&2; exit 2; }
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang -DNIBBLER_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" --target fuzz_request -j"$(nproc)"
WORK="$BUILD/fuzz-corpus"
mkdir -p "$WORK"
cp "$ROOT"/tests/fuzz/corpus/* "$WORK"/
cd "$BUILD"
./tests/fuzz_request -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$WORK"
