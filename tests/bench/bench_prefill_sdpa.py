#!/usr/bin/env python3
"""bench_prefill_sdpa: the PyTorch baseline for bench_prefill_attention.

One prefill chunk's attention at one layer: C query rows over H tokens of
history plus the chunk, causal with the chunk's rows at the END of the keys
(torch.nn.attention.bias.causal_lower_right), f16, contiguous KV, the
Llama-3-8B head shape (32 q / 8 kv heads x 128, enable_gqa; KV repeated
outside the timed region if this torch's flash kernel refuses GQA, and the
kernel column says so), torch.nn.functional.scaled_dot_product_attention
with the FLASH backend (the EFFICIENT one if flash refuses the mask).
A GPU spin queued before each call (no host time inside the events),
CUDA events around the call, median of the iterations after two warm-up
calls. TFLOP/s counts the causal work as bench_prefill_attention does.

usage: bench_prefill_sdpa.py [--quick] [--iters N] [--chunk C,...] [--hist H,...]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def ints(s):
    return [int(x) for x in s.split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--chunk", type=ints, default=[512, 2048])
    ap.add_argument("--hist", type=ints, default=None)
    args = ap.parse_args()
    hists = args.hist or ([0, 4096, 16384] if args.quick else [0, 4096, 16384, 32768])
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    D, Hq, Hkv = 128, 32, 8
    print(f"<!-- device {props.name}, torch {torch.__version__} -->")
    print("| chunk rows | history | cache / view | kernel | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for C in args.chunk:
        for H in hists:
            T = H + C
            q = torch.randn(1, Hq, C, D, dtype=torch.float16, device=dev)
            k = torch.randn(1, Hkv, T, D, dtype=torch.float16, device=dev)
            v = torch.randn(1, Hkv, T, D, dtype=torch.float16, device=dev)
            mask = causal_lower_right(C, T)
            work = sum(H + r + 1 for r in range(C))
            flops = 4.0 * D * Hq * work
            kr, vr = k, v
            kernel = None
            for backend, name in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"),
                                  (SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient")):
                for gqa in (True, False):
                    if not gqa:
                        kr = k.repeat_interleave(Hq // Hkv, dim=1)
                        vr = v.repeat_interleave(Hq // Hkv, dim=1)
                    try:
                        with sdpa_kernel(backend):
                            F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, enable_gqa=gqa)
                        kernel = (backend, name if gqa else name + "(repeat-kv)", gqa)
                        break
                    except RuntimeError:
                        continue
                if kernel:
                    break
            if not kernel:
                print(f"| {C} | {H} | f16 | (no flash/efficient SDPA kernel took the causal mask) | - | - |")
                continue
            backend, name, gqa = kernel
            t = []
            with sdpa_kernel(backend):
                for i in range(args.iters + 2):
                    # NOTE: a GPU spin (~0.5 ms) while Python queues the
                    # call, so PyTorch's dispatch is not inside the events
                    # (bench_prefill_attention spins the same way).
                    torch.cuda._sleep(1_000_000)
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, enable_gqa=gqa)
                    e.record()
                    e.synchronize()
                    if i >= 2:
                        t.append(s.elapsed_time(e))
            ms = statistics.median(t)
            print(f"| {C} | {H} | f16 | {name} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |", flush=True)
            del q, k, v, kr, vr
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
