"""TPOT of the decode step per condition (quiet, 1 and 2 busy loops, one worker) at each prompt
length, as the ratio to the quiet window of the same round: median bar, min..max whisker, and the
targets (<= 2.5 with one competitor, <= 4 with two)."""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
lens = sorted({int(r["L"]) for r in rows})
conds = ["quiet", "loaded1", "loaded2", "workers1"]
labels = {"quiet": "quiet", "loaded1": "1 busy loop", "loaded2": "2 busy loops", "workers1": "1 worker"}
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
width = 0.8 / len(lens)
for i, L in enumerate(lens):
    for j, c in enumerate(conds):
        ratios = [float(r["ratio_to_quiet"]) for r in rows if int(r["L"]) == L and r["condition"] == c]
        tpots = [float(r["tpot_ms"]) for r in rows if int(r["L"]) == L and r["condition"] == c]
        if not ratios:
            continue
        x = j + (i - (len(lens) - 1) / 2) * width
        for ax, v in ((axes[0], tpots), (axes[1], ratios)):
            m = statistics.median(v)
            ax.bar(x, m, width * 0.9, color=f"C{i}", label=f"L {L}" if j == 0 else None)
            ax.errorbar(x, m, yerr=[[m - min(v)], [max(v) - m]], color="k", capsize=3, lw=1)
for ax in axes:
    ax.set_xticks(range(len(conds)))
    ax.set_xticklabels([labels[c] for c in conds])
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
axes[0].set_ylabel("TPOT (ms), median of rounds, min..max")
axes[1].set_ylabel("TPOT / quiet TPOT of the same round")
axes[1].axhline(2.5, color="C3", ls="--", lw=1)
axes[1].axhline(4.0, color="C3", ls=":", lw=1)
axes[1].text(3.45, 2.5, "target 1 loop", color="C3", fontsize=7, va="bottom", ha="right")
axes[1].text(3.45, 4.0, "target 2 loops", color="C3", fontsize=7, va="bottom", ha="right")
fig.suptitle("SmolLM2-135M decode step under CPU contention (bench/run step)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
print("plot:", sys.argv[2])
