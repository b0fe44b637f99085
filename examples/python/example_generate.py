#!/usr/bin/env python3
"""example_generate.py: drive a running nibbler worker from Python.

Starts nothing: run a worker first, e.g.
    build/worker/nibbler-worker --model synthetic:tiny --endpoint ipc:///tmp/nb.sock &
    PYTHONPATH=build/python:examples/python \
        python3 examples/python/example_generate.py --endpoint ipc:///tmp/nb.sock

Says hello, adds a sequence, prefills the prompt ids, runs the speculate loop
by hand, prints the tokens and the acceptance rate, and frees the sequence.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nibbler_client import NibblerClient, NibblerError, pb  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", required=True, help="the worker's ipc:// or tcp:// endpoint")
    ap.add_argument("--prompt-ids", default="",
                    help="comma-separated prompt ids (default: the model's BOS alone)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-ms", type=int, default=120000)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()

    with NibblerClient(a.endpoint, timeout_ms=a.timeout_ms, client_name="example_generate") as c:
        info = c.hello()
        m = info.model
        if m.synthetic:
            print(f"NOTE: {m.name} is a synthetic model: random weights, the output is noise",
                  file=sys.stderr)
        prompt = [int(x) for x in a.prompt_ids.split(",") if x.strip()] or [m.bos_id]
        seq = int.from_bytes(os.urandom(7), "little") + 1
        c.add_sequence(seq, temperature=a.temperature, seed=a.seed, max_tokens=a.max_tokens)
        tokens, drafted, accepted = [], 0, 0
        t0 = time.monotonic()
        try:
            first = c.prefill(seq, prompt)
            tokens.extend(first.tokens)
            while len(tokens) < a.max_tokens:
                try:
                    s = c.speculate([seq], a.gamma).seqs[0]
                except NibblerError as e:
                    if e.code == pb.FINISHED:
                        break
                    raise
                tokens.extend(s.tokens)
                drafted += s.n_drafted
                accepted += s.n_accepted
                if s.finish_reason != pb.NOT_FINISHED:
                    break
        finally:
            c.free([seq])
        elapsed = time.monotonic() - t0
        tokens = tokens[:a.max_tokens]
        rate = accepted / drafted if drafted else 0.0
        if a.json:
            print(json.dumps({"model": m.name, "synthetic": m.synthetic, "prompt": prompt,
                              "token_ids": tokens, "tokens": len(tokens), "drafted": drafted,
                              "accepted": accepted, "acceptance_rate": rate,
                              "tokens_per_s": len(tokens) / elapsed if elapsed > 0 else 0.0}))
        else:
            print("tokens:", ",".join(map(str, tokens)))
            print(f"{len(tokens)} tokens in {elapsed:.3f} s, drafted {drafted}, "
                  f"accepted {accepted}, acceptance {100 * rate:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
