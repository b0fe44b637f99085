#!/usr/bin/env bash
# tests/gpu/worker_smoke.sh BUNDLE: nibbler-worker --backend cuda as a process
# (tests/gpu/run calls it when the bundle has nibbler-worker and
# nibbler-generate). Checks: greedy Speculate == greedy Decode through the
# socket on proxy-llama-31m; a memory budget too small for the weights is
# refused at start with a clear message (exit 2).
set -uo pipefail
bundle=$1
model=$NB_SHARED_DIR/models/proxy-llama-31m
export NIBBLER_WORKER=$bundle/bin/nibbler-worker
fail=0
gen() { # mode
    "$bundle/bin/nibbler-generate" --model "$model" --backend cuda --prompt "static int" \
        --max-tokens 300 --ignore-eos --mode "$1" --gamma 4 --json
}
ar=$(gen ar) || { echo "FAIL worker smoke: ar run"; fail=1; }
spec=$(gen spec) || { echo "FAIL worker smoke: spec run"; fail=1; }
ids() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["token_ids"])'; }
if [ $fail = 0 ]; then
    a=$(echo "$ar" | ids); s=$(echo "$spec" | ids)
    if [ "$a" = "$s" ] && [ -n "$a" ]; then
        echo "worker cuda: Speculate(4) == Decode over the socket, 300 tokens; spec: $(echo "$spec" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print({k: v for k, v in j.items() if k not in ("token_ids", "text")})')"
    else
        echo "FAIL worker smoke: spec and ar token ids differ"; fail=1
    fi
fi
msg=$("$bundle/bin/nibbler-worker" --model "$model" --endpoint ipc:///tmp/nb-smoke.sock --backend cuda \
    --gpu-memory-utilization 0.0001 2>&1); rc=$?
if [ $rc = 2 ] && echo "$msg" | grep -q "leaves no room"; then
    echo "worker cuda: tiny --gpu-memory-utilization refused (exit 2): $(echo "$msg" | tail -1)"
else
    echo "FAIL worker smoke: tiny budget gave exit $rc: $msg"; fail=1
fi
exit $fail
