# tests/gpu/bad_args_lib.sh: sourced by the benchmarks' argument-check
# scripts. Both functions set fail=1 on a mismatch and print why.
#
#   refused BENCH "ARGS" PATTERN...  ARGS must exit 2 with every PATTERN
#                                    (fixed strings) in its stderr
#   accepted BENCH "ARGS" [EXTRA...] ARGS (then EXTRA) must get past the
#                                    check: exit 0 with a GPU, 77 without
fail=0
refused() {
    local bench=$1 args=$2 msg rc p
    shift 2
    msg=$("$bench" $args 2>&1 >/dev/null)
    rc=$?
    local ok=1
    [ $rc -eq 2 ] || ok=0
    for p in "$@"; do grep -q -- "$p" <<<"$msg" || ok=0; done
    if [ $ok -eq 0 ]; then
        echo "FAIL '$args': exit $rc (want 2 and the usage), stderr: $msg"
        fail=1
    fi
}
accepted() {
    local bench=$1 args=$2 rc
    shift 2
    "$bench" $args "$@" >/dev/null 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
        echo "FAIL '$args': exit $rc (want 0, or 77 without a GPU)"
        fail=1
    fi
}
