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

After the goal count it lists every missed goal against its bound: the
event-timed floor of one empty launch plus the call's bytes at the
measured copy peak (both printed by bench_attention_cuda above its
table). "goal / bound" <= 1.00 means no kernel meets the goal without
reading faster than the copy peak (SDPA itself reads at up to ~106-111%
of it, so the bound is not absolute).
"""
import re
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
        out.setdefault(key, {})[kind] = (float(ms), float(pct), float(mb))
    return out


def device_figures(path):
    """The measured copy peak (GB/s) and the event-timed floor of one empty
    launch (us) that bench_attention_cuda prints above its table, or None."""
    txt = open(path).read()
    p = re.search(r"measured peak \(cudaMemcpy D2D, read\+write\): (\d+) GB/s", txt)
    f = re.search(r"one empty kernel ([\d.]+) us", txt)
    return (float(p.group(1)), float(f.group(1))) if p and f else None


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
    dev = device_figures(sys.argv[1])
    missed = []
    for key in sorted(set(cu) | set(sd)):
        c, s = cu.get(key, {}), sd.get(key, {}).get("sdpa")
        get = lambda k: c.get(k, (float("nan"), float("nan"), float("nan")))
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
            if s:  # each missed goal: the time it needs and the call's time now (ms), the call's MB
                if not ok[0]:
                    missed.append((key, "draft 3.3x SDPA", sms / 3.3, d[0], d[2]))
                if not ok[1]:
                    missed.append((key, "target 1.8x SDPA", sms / 1.8, t[0], t[2]))
            for name, x in (("fp16", f), ("target", t), ("draft", d)):
                if not x[1] >= 80.0 and dev and x[0] == x[0]:
                    missed.append((key, name + " at 80% of peak", x[2] / (0.8 * dev[0]), x[0], x[2]))
        pk = " / ".join(f"{x:.0f}" for x in (f[1], t[1], d[1], s[1] if s else float("nan")))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {sms:.4f} | {f[0]:.4f} | {t[0]:.4f} | {d[0]:.4f} | "
              f"{sp(f):.2f}x | {sp(t):.2f}x | {sp(d):.2f}x | {pk} | {gain} | {goals} |")
    print(f"\ngoals met at >= 32k: {n_ok} of {n_goal}")
    if dev and missed:
        # The least a call can take under this method: one empty launch
        # plus its bytes at the measured copy peak (SDPA reads at up to
        # ~106-111% of that peak, so the bound is not absolute).
        peak, floor = dev
        print(f"\nmissed goals against launch floor + bytes at the copy peak ({floor:.2f} us, {peak:.0f} GB/s); "
              "goal / bound <= 1.00: no kernel meets it without reading faster than the copy peak")
        print("| model | batch | ctx | goal | goal needs us | now us | bound us | now / bound | goal / bound |")
        print("|---|---|---|---|---|---|---|---|---|")
        for key, goal, need_ms, now_ms, mb in missed:
            bound = floor + mb / peak * 1e3  # MB / (GB/s) = ms
            print(f"| {key[0]} | {key[1]} | {key[2]} | {goal} | {need_ms * 1e3:.1f} | {now_ms * 1e3:.1f} | "
                  f"{bound:.1f} | {now_ms * 1e3 / bound:.2f} | {need_ms * 1e3 / bound:.2f} |")


if __name__ == "__main__":
    main()
