#!/usr/bin/env python3
"""test_python_client.py: the Python client and example against a worker.

argv: NIBBLER_WORKER NIBBLER_GENERATE PB2_DIR EXAMPLES_PYTHON_DIR
Starts nibbler-worker (stories260k from $NB_SHARED_DIR when present, else
synthetic:tiny) on a private ipc socket, then checks: Hello; greedy
speculative generation equals greedy target-only generation; the Python and
C clients (nibbler-generate --endpoint) produce the same tokens; errors carry
the worker's code; example_generate.py runs and its --json parses.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

worker_bin, generate_bin, pb2_dir, examples_dir = sys.argv[1:5]
sys.path.insert(0, pb2_dir)
sys.path.insert(0, examples_dir)
os.environ["NIBBLER_PB2_DIR"] = pb2_dir

from nibbler_client import NibblerClient, NibblerError, NibblerTimeout, pb  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)


shared = os.environ.get("NB_SHARED_DIR") or "../shared"
model = os.path.join(shared, "models", "stories260k")
if not os.path.isdir(model):
    model = "synthetic:tiny"
tmp = tempfile.mkdtemp(prefix="nb-test-py-")
endpoint = f"ipc://{tmp}/worker.sock"
log = open(os.path.join(tmp, "worker.log"), "w")
proc = subprocess.Popen([worker_bin, "--model", model, "--endpoint", endpoint,
                         "--group-size", "64", "--kv-memory", "33554432", "--max-seqs", "8"],
                        stdout=log, stderr=subprocess.STDOUT)
try:
    with NibblerClient(endpoint, timeout_ms=500, client_name="test_python_client") as c:
        t0 = time.monotonic()
        while True:
            try:
                info = c.hello()
                break
            except NibblerTimeout:
                if proc.poll() is not None or time.monotonic() - t0 > 120:
                    raise
        c.timeout_ms = 30000
        check(info.protocol_version == 1, "protocol version")
        check(info.model.vocab_size > 0, "vocab size")
        check(info.model.synthetic == model.startswith("synthetic:"), "synthetic flag")
        prompt = [info.model.bos_id, 5, 6, 7]
        spec = c.generate(prompt, max_tokens=60, mode="spec", gamma=4)
        ar = c.generate(prompt, max_tokens=60, mode="ar")
        check(len(spec.tokens) == 60, f"spec produced {len(spec.tokens)} tokens")
        check(spec.tokens == ar.tokens, "greedy spec == greedy ar")
        check(spec.drafted > 0 and 0 <= spec.accepted <= spec.drafted, "draft counts")
        print(f"python client: acceptance {spec.acceptance_rate:.2f}, "
              f"{spec.tokens_per_s:.0f} tokens/s")

        # The C client (nibbler-generate) on the same worker: the same tokens.
        out = subprocess.run([generate_bin, "--endpoint", endpoint, "--prompt-ids",
                              ",".join(map(str, prompt)), "--max-tokens", "60", "--json",
                              "--ignore-eos"] + (["--model", model] if not
                                                 model.startswith("synthetic:") else []),
                             capture_output=True, text=True, timeout=300)
        check(out.returncode == 0, f"nibbler-generate --endpoint: {out.stderr}")
        if out.returncode == 0:
            j = json.loads(out.stdout)
            check(j["token_ids"] == spec.tokens, "C and Python clients agree")

        # Errors carry the worker's code.
        try:
            c.free([123456789])
            check(False, "freeing an unknown sequence should fail")
        except NibblerError as e:
            check(e.code == pb.NOT_FOUND, f"unknown sequence: {e}")
        st = c.stats()
        check(st.n_seqs == 0, f"{st.n_seqs} sequences left")

        # The example script.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([pb2_dir, examples_dir]))
        out = subprocess.run([sys.executable, os.path.join(examples_dir, "example_generate.py"),
                              "--endpoint", endpoint, "--max-tokens", "20", "--json"],
                             capture_output=True, text=True, env=env, timeout=300)
        check(out.returncode == 0, f"example_generate.py: {out.stderr}")
        if out.returncode == 0:
            j = json.loads(out.stdout)
            check(j["tokens"] > 0 and j["tokens"] <= 20, f"example tokens {j['tokens']}")
            print("example_generate.py:", out.stdout.strip()[:200])
        c.shutdown()
    check(proc.wait(timeout=30) == 0, "worker exit status")
except Exception:
    failures += 1
    raise
finally:
    if proc.poll() is not None and proc.returncode != 0:
        failures += 1
        print(f"the worker exited with status {proc.returncode}", file=sys.stderr)
    if failures:
        log.flush()
        with open(os.path.join(tmp, "worker.log")) as f:
            print("worker log:\n" + f.read()[-4000:], file=sys.stderr)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()
    if failures == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"worker log kept in {tmp}", file=sys.stderr)

print(f"test_python_client: {failures} failed")
sys.exit(1 if failures else 0)
