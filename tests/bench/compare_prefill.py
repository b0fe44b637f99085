#!/usr/bin/env python3
"""compare_prefill: joins bench_prefill_attention's table with
bench_prefill_sdpa.py's, per (chunk rows, history): nibbler's prefill
kernels (warpgroup MMA, the built-in choice; mma.sync, the one it replaced)
with the f16 cache and with the INT8 target view (and that view with the
prefill stage, as the cuda backend runs it), and PyTorch flash SDPA
(f16), in ms, with SDPA's time over the warpgroup kernel's (> 1: nibbler
faster).

usage: compare_prefill.py BENCH_PREFILL.md BENCH_PREFILL_SDPA.md
"""
import sys


def rows(path):
    out = {}
    for line in open(path):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) < 6 or not f[0].isdigit():
            continue
        out[(int(f[0]), int(f[1]), f[2], f[3])] = float(f[4])
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    nb, sd = rows(sys.argv[1]), rows(sys.argv[2])
    keys = sorted({(c, h) for (c, h, _, _) in nb})
    print("| chunk rows | history | f16 cache ms | INT8 view ms | INT8 view + stage ms | f16 mma.sync ms | "
          "INT8 mma.sync ms | SDPA flash ms | SDPA / f16 | SDPA / INT8 | SDPA / INT8 + stage |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, h in keys:
        f16 = nb.get((c, h, "f16 cache", "warpgroup prefill"))
        i8 = nb.get((c, h, "INT8 target view", "warpgroup prefill"))
        f16m = nb.get((c, h, "f16 cache", "mma.sync prefill"))
        i8m = nb.get((c, h, "INT8 target view", "mma.sync prefill"))
        i8s = nb.get((c, h, "INT8 target view", "warpgroup + stage"))
        sdpa = next((v for (cc, hh, _, _), v in sd.items() if cc == c and hh == h), None)

        def ms(x):
            return f"{x:.3f}" if x is not None else "-"

        def ratio(a, b):
            return f"{a / b:.2f}x" if a is not None and b else "-"

        print(f"| {c} | {h} | {ms(f16)} | {ms(i8)} | {ms(i8s)} | {ms(f16m)} | {ms(i8m)} | {ms(sdpa)} | "
              f"{ratio(sdpa, f16)} | {ratio(sdpa, i8)} | {ratio(sdpa, i8s)} |")

if __name__ == "__main__":
    main()
