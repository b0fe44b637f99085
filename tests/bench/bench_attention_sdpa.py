#!/usr/bin/env python3
"""bench_attention_sdpa: the PyTorch baseline for bench_attention_cuda.

One decode step (1 query row) of torch.nn.functional.scaled_dot_product_attention
in fp16 with the FLASH backend, contiguous KV, same shapes as the CUDA bench:
Llama-2-7B (32 q / 32 kv heads x 128) and Llama-3-8B (32 q / 8 kv heads x 128,
enable_gqa=True; falls back to repeating KV if this torch's flash kernel
refuses GQA, and says so), batch 1 and 8, contexts 4k..128k. Each timed
iteration follows the same L2 flush as the CUDA bench (--flush read: a
reduction over 4x the L2 size, leaving clean lines; write: a fill of 2x the
L2 size, leaving dirty ones; none), then a GPU spin long enough for Python
to queue the call behind it, CUDA events around the SDPA call only, median
of the iterations. Bytes = K + V + q + out (fp16). Prints the same
markdown table columns.

usage: bench_attention_sdpa.py [--quick] [--iters N] [--flush read|write|none]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


# ~0.5 ms at the H100's and H200's clocks: longer than PyTorch takes to
# dispatch one SDPA call from Python.
SPIN_CYCLES = 1_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--flush", choices=("read", "write", "none"), default="read")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=dev)
    rflush = torch.ones(l2, dtype=torch.int32, device=dev)  # 4x the L2 size in bytes

    def flush_l2(i):
        if args.flush == "read":
            rflush.max()
        elif args.flush == "write":
            flush.fill_(i & 0xFF)

    # measured peak: a device-to-device copy, bytes read + written
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    times = []
    for i in range(13):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e))
    peak = 2 * a.numel() / (statistics.median(times) * 1e-3) / 1e9
    del a, b

    D, Hq = 128, 32
    ctxs = [4096, 16384, 32768, 65536, 131072][: 2 if args.quick else 5]
    print(f"<!-- device {props.name}, torch {torch.__version__} -->")
    print(f"\nmeasured peak (torch copy D2D, read+write): {peak:.0f} GB/s; L2 flush: {args.flush}\n")
    print("| model | batch | ctx | kernel | ms | MB moved | GB/s | % of peak |")
    print("|---|---|---|---|---|---|---|---|")
    for name, hkv in (("llama2-7b", 32), ("llama3-8b", 8)):
        for B in (1, 8):
            for ctx in ctxs:
                q = torch.randn(B, Hq, 1, D, dtype=torch.float16, device=dev)
                k = torch.randn(B, hkv, ctx, D, dtype=torch.float16, device=dev)
                v = torch.randn(B, hkv, ctx, D, dtype=torch.float16, device=dev)
                kernel = "sdpa-flash"

                def run():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != Hq)

                try:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        run()
                except RuntimeError:
                    # NOTE: KV repeated outside the timed region; bytes still
                    # count the unrepeated KV a GQA kernel would read.
                    kr = k.repeat_interleave(Hq // hkv, dim=1)
                    vr = v.repeat_interleave(Hq // hkv, dim=1)

                    def run():
                        return F.scaled_dot_product_attention(q, kr, vr)

                    kernel = "sdpa-flash(repeat-kv)"
                t = []
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    for i in range(args.iters + 3):
                        flush_l2(i)
                        # NOTE: the GPU spins after the flush while Python
                        # queues the events and the SDPA call behind it, so
                        # no host time (PyTorch's dispatch of the call) is
                        # inside the events: the C bench's launches are
                        # queued behind its flush the same way.
                        torch.cuda._sleep(SPIN_CYCLES)
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        run()
                        e.record()
                        e.synchronize()
                        if i >= 3:
                            t.append(s.elapsed_time(e))
                ms = statistics.median(t)
                nbytes = 2 * B * hkv * ctx * D * 2 + 2 * B * Hq * D * 2
                gbs = nbytes / (ms * 1e-3) / 1e9
                print(f"| {name} | {B} | {ctx} | {kernel} | {ms:.4f} | {nbytes / 1e6:.1f} | {gbs:.0f} | {100 * gbs / peak:.1f} |",
                      flush=True)
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
