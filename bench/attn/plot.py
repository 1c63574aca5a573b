"""Plots the top-k fraction (scoring+top-k time over scoring+top-k+attention) against block size,
one line per (budget, L) at the largest batch measured (paper Fig. 2(d) style)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["mode"] == "fixed"]
bmax = max(int(r["batch"]) for r in rows)
fig, ax = plt.subplots(figsize=(6.4, 4.2))
for bgt, style in (("0.02", "-o"), ("0.05", "--s")):
    for L in sorted({int(r["L"]) for r in rows}):
        pts = sorted((int(r["blk"]), float(r["topk_frac"])) for r in rows
                     if r["budget"] == bgt and int(r["L"]) == L and int(r["batch"]) == bmax)
        if pts:
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], style, label=f"bgt {bgt}, L {L // 1024}K")
ax.set_xscale("log", base=2)
ax.set_xticks([16, 32, 64, 128])
ax.set_xticklabels(["16", "32", "64", "128"])
ax.set_xlabel("block size (tokens)")
ax.set_ylabel("scoring + top-k share of host time (%)")
ax.set_title(f"Fluxion CPU core, Llama-3.1-8B layer, batch {bmax}")
ax.set_ylim(0, 100)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
print("plot:", sys.argv[2])
