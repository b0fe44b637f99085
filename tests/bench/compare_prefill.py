#!/usr/bin/env python3
"""compare_prefill: joins bench_prefill_attention's table with
bench_prefill_sdpa.py's, per (chunk rows, history): nibbler's tensor-core
prefill kernel with the f16 cache and with the INT8 target view, the scalar
chunk kernel it replaced (INT8 view), and PyTorch flash SDPA (f16), in ms,
with SDPA's time over each nibbler time (> 1: nibbler faster).

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
    print("| chunk rows | history | f16 cache ms | INT8 view ms | INT8 scalar ms | SDPA flash ms | "
          "SDPA / f16 | SDPA / INT8 |")
    print("|---|---|---|---|---|---|---|---|")
    for c, h in keys:
        f16 = nb.get((c, h, "f16 cache", "tensor-core prefill"))
        i8 = nb.get((c, h, "INT8 target view", "tensor-core prefill"))
        i8s = nb.get((c, h, "INT8 target view", "scalar chunk"))
        sdpa = next((v for (cc, hh, _, _), v in sd.items() if cc == c and hh == h), None)

        def ms(x):
            return f"{x:.3f}" if x is not None else "-"

        def ratio(a, b):
            return f"{a / b:.2f}x" if a is not None and b else "-"

        print(f"| {c} | {h} | {ms(f16)} | {ms(i8)} | {ms(i8s)} | {ms(sdpa)} | {ratio(sdpa, f16)} | "
              f"{ratio(sdpa, i8)} |")


if __name__ == "__main__":
    main()
