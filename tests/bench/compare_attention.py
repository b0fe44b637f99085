#!/usr/bin/env python3
"""compare_attention: joins bench_attention_cuda and bench_attention_sdpa
tables into one markdown table with speedups over SDPA and the goals
(draft >= 3.3x SDPA at >= 32k, target >= 1.8x, every kernel >= 80% of
measured peak at >= 32k) marked, and the tensor-core decode kernel's gain over the scalar one for
the quantized views (the forced "-tc" and "-fma" rows; the main columns
take the built-in choice).

usage: compare_attention.py CUDA_TABLE.md SDPA_TABLE.md [STEP_TABLE.md]

With STEP_TABLE.md (bench_attention_cuda --split step) the table is the
engine's configuration instead: the fp16 and target columns (and their
kernel-gain figures) from the step-mode split, which target, verify and
decode passes must use (row invariance), the draft column from
CUDA_TABLE.md's batch-tuned split, which draft passes use by default.
"""
import sys


def rows(path):
    out = {}
    for line in open(path):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) != 8 or not c[1].isdigit():
            continue
        model, b, ctx, kern, ms, mb, gbs, pct = c
        key = (model, int(b), int(ctx))
        kind = "sdpa" if kern.startswith("sdpa") else kern.replace("nibbler-", "")
        out.setdefault(key, {})[kind] = (float(ms), float(pct))
    return out


def main():
    cu, sd = rows(sys.argv[1]), rows(sys.argv[2])
    if len(sys.argv) > 3:  # the engine's mix: fp16 / target rows from the step split
        st = rows(sys.argv[3])
        for key, kinds in st.items():
            for kind, v in kinds.items():
                if not kind.startswith("int4-draft"):
                    cu.setdefault(key, {})[kind] = v
    print("| model | batch | ctx | SDPA ms | fp16 ms | int8-target ms | int4-draft ms | fp16/SDPA | "
          "target/SDPA | draft/SDPA | % peak fp16 / target / draft / SDPA | tensor-core gain fp16 / target / draft | goals |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    n_ok = n_goal = 0
    for key in sorted(set(cu) | set(sd)):
        c, s = cu.get(key, {}), sd.get(key, {}).get("sdpa")
        get = lambda k: c.get(k, (float("nan"), float("nan")))
        f, t, d = get("fp16"), get("int8-target"), get("int4-draft")
        tf, df = get("int8-target-fma"), get("int4-draft-fma")
        tt, dt = get("int8-target-tc"), get("int4-draft-tc")
        ff, ft = get("fp16-fma"), get("fp16-tc")
        gain = f"{ff[0] / ft[0]:.2f}x / {tf[0] / tt[0]:.2f}x / {df[0] / dt[0]:.2f}x"
        sms = s[0] if s else float("nan")
        sp = lambda x: sms / x[0] if s and x[0] == x[0] else float("nan")
        goals = ""
        if key[2] >= 32768:
            ok = [sp(d) >= 3.3, sp(t) >= 1.8, min(f[1], t[1], d[1]) >= 80.0]
            n_goal += 3
            n_ok += sum(ok)
            goals = " ".join(("ok" if o else "MISS") + ":" + n for o, n in zip(ok, ("draft3.3x", "target1.8x", "80%peak")))
        pk = " / ".join(f"{x:.0f}" for x in (f[1], t[1], d[1], s[1] if s else float("nan")))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {sms:.4f} | {f[0]:.4f} | {t[0]:.4f} | {d[0]:.4f} | "
              f"{sp(f):.2f}x | {sp(t):.2f}x | {sp(d):.2f}x | {pk} | {gain} | {goals} |")
    print(f"\ngoals met at >= 32k: {n_ok} of {n_goal}")


if __name__ == "__main__":
    main()
