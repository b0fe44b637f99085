#!/usr/bin/env bash
# tests/integration/worker_flags.sh WORKER: nibbler-worker's boolean flags
# take no value (a value is refused at start with exit 2 and a message naming
# the option, before anything is bound), and each is accepted alone (parsed
# before --help, which then exits 0).
set -u
worker=$1
fail=0
for flag in --batch-invariant-draft --no-prefix-cache; do
    msg=$("$worker" --model synthetic:tiny --endpoint ipc:///tmp/nb-flags-never.sock "$flag=1" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "unknown or incomplete option '$flag=1'" <<<"$msg"; then
        echo "FAIL '$flag=1': exit $rc (want 2 and the option named), stderr: $msg"
        fail=1
    fi
    out=$("$worker" "$flag" --help 2>&1)
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q -- "$flag" <<<"$out"; then
        echo "FAIL '$flag --help': exit $rc (want 0 and the flag documented)"
        fail=1
    fi
done
[ -e /tmp/nb-flags-never.sock ] && { echo "FAIL: a refused start bound its endpoint"; fail=1; }
[ $fail -eq 0 ] && echo "PASS nibbler-worker flag checks"
exit $fail
