"""Plots of bench/sched's CSV.

sched_time.png: attention time per layer against context length, one panel per batch size, one
line per configuration (log y), with each point's within-tau share written beside Fluxion's and
fixed (16, 0.05)'s markers; mixed-length batches as a last panel of bars.
sched_ablation.png: the ablation points (scheduling policies, Fluxion without streaming skipping,
fixed granularity), layer time relative to Fluxion, median with the min..max spread of the
per-repetition ratios.
"""
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
CFG = [("fluxion", "-o", "C0"), ("fixed_16_005", "--s", "C1"), ("fixed_32_002", ":^", "C2"), ("full", "-.x", "C3")]

size = [r for r in rows if r["point"][0].isdigit()]
mixed = [r for r in rows if r["point"].startswith("mix")]
batches = sorted({int(r["batch"]) for r in size})
n_pan = len(batches) + (1 if mixed else 0)
fig, axes = plt.subplots(1, max(n_pan, 1), figsize=(4.2 * max(n_pan, 1), 4.0), squeeze=False)
for i, B in enumerate(batches):
    ax = axes[0][i]
    for name, style, col in CFG:
        pts = sorted((int(r["max_len"]), float(r["ms_med"]), float(r["within_tau"])) for r in size
                     if r["config"] == name and int(r["batch"]) == B)
        if not pts:
            continue
        ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], style, color=col, label=name)
        if name in ("fluxion", "fixed_16_005"):
            for p in pts:
                ax.annotate("%.2f" % p[2], (p[0] / 1024, p[1]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=col)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (K tokens)")
    ax.set_ylabel("attention time per layer (ms)")
    ax.set_title("batch %d (labels: within-tau share)" % B, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
if mixed:
    ax = axes[0][n_pan - 1]
    pts = sorted({r["point"] for r in mixed})
    w = 0.8 / len(CFG)
    for j, (name, _, col) in enumerate(CFG):
        ys = []
        for p in pts:
            v = [float(r["ms_med"]) for r in mixed if r["point"] == p and r["config"] == name]
            ys.append(v[0] if v else 0)
        ax.bar([k + j * w for k in range(len(pts))], ys, w, color=col, label=name)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(pts))])
    ax.set_xticklabels([p.replace("mix", "U(").replace("_b", ") b") for p in pts], fontsize=8)
    ax.set_ylabel("attention time per layer (ms)")
    ax.set_title("mixed-length batches", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
fig.suptitle("bench/sched: Llama-3.1-8B layer shape, synthetic KV, CPU workers %s" %
             (rows[0]["workers"] if rows else "?"), fontsize=10)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2])

abl = [r for r in rows if r["point"].startswith("abl")]
if abl:
    pts = sorted({r["point"] for r in abl})
    cfgs = [c for c in dict.fromkeys(r["config"] for r in abl)]
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    w = 0.8 / len(pts)
    for j, p in enumerate(pts):
        med, lo, hi = [], [], []
        for c in cfgs:
            r = [x for x in abl if x["point"] == p and x["config"] == c][0]
            # base_over_this is fluxion's time / this one's: this one relative to fluxion is its inverse
            m, a, b = (float(r["base_over_this"]), float(r["base_over_this_max"]), float(r["base_over_this_min"]))
            med.append(1 / m)
            lo.append(1 / m - 1 / a)
            hi.append(1 / b - 1 / m)
        ax.bar([k + j * w for k in range(len(cfgs))], med, w, yerr=[lo, hi], capsize=3,
               label=p.replace("abl", "U(").replace("_b", ") batch "))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(cfgs))])
    ax.set_xticklabels(cfgs, rotation=20, fontsize=8)
    ax.set_ylabel("layer time / Fluxion's (median, min..max)")
    ax.set_title("ablations on mixed-length batches", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[3], dpi=110)
    print("plot:", sys.argv[3])
