"""bench/run node: left, each control call's latency through fluxion-decoded against the bare
gRPC-core echo of the same bytes (median of pairs, p10..p90 of the per-pair ratio); right, TPOT of
full, fixed (16, 0.05) and Fluxion per (prompt length, batch), median bar and min..max whisker, and
beneath it the paired ratios Fluxion / fixed (16, 0.05) and Fluxion / full (median, min..max)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ctl = list(csv.DictReader(open(sys.argv[1])))
ses = list(csv.DictReader(open(sys.argv[2])))
fig = plt.figure(figsize=(12, 4.6))
gs = fig.add_gridspec(2, 2, width_ratios=[1, 1.6], height_ratios=[2, 1])
ax0 = fig.add_subplot(gs[:, 0])
x = range(len(ctl))
w = 0.38
ax0.bar([i - w / 2 for i in x], [float(r["echo_us_median"]) for r in ctl], w, color="C7", label="bare gRPC-core echo")
ax0.bar([i + w / 2 for i in x], [float(r["node_us_median"]) for r in ctl], w, color="C0", label="fluxion-decoded")
for i, r in enumerate(ctl):
    ax0.text(i + w / 2, float(r["node_us_median"]), "%.2fx\n[%.2f, %.2f]" % (float(r["ratio_median"]),
             float(r["ratio_p10"]), float(r["ratio_p90"])), ha="center", va="bottom", fontsize=7)
ax0.set_xticks(list(x))
ax0.set_xticklabels([r["call"] for r in ctl])
ax0.set_ylabel("latency per call (us), median of pairs")
ax0.set_title("control calls vs echo (ratio per pair, p10..p90)", fontsize=9)
ax0.legend(fontsize=8, loc="upper left")
ax0.grid(axis="y", alpha=0.3)
ax0.margins(y=0.25)

ax1 = fig.add_subplot(gs[0, 1])
ax2 = fig.add_subplot(gs[1, 1], sharex=ax1)
modes = [("full", "full", "C3"), ("fixed_16_005", "fixed (16, 0.05)", "C1"), ("fluxion", "Fluxion", "C2")]
groups = sorted({(int(r["len"]), int(r["batch"])) for r in ses})
row = {(int(r["len"]), int(r["batch"]), r["mode"]): r for r in ses}
w = 0.8 / len(modes)
for j, (m, label, color) in enumerate(modes):
    xs, med, lo, hi = [], [], [], []
    for g, (L, b) in enumerate(groups):
        r = row.get((L, b, m))
        if r is None:
            continue
        xs.append(g + (j - 1) * w)
        med.append(float(r["tpot_ms_median"]))
        lo.append(float(r["tpot_ms_median"]) - float(r["tpot_ms_min"]))
        hi.append(float(r["tpot_ms_max"]) - float(r["tpot_ms_median"]))
    ax1.bar(xs, med, w * 0.9, color=color, label=label)
    ax1.errorbar(xs, med, yerr=[lo, hi], fmt="none", color="k", capsize=2, lw=0.8)
for j, (key, label, color) in enumerate([("vs_16_005", "Fluxion / fixed (16, 0.05)", "C1"),
                                         ("vs_full", "Fluxion / full", "C3")]):
    xs, med, lo, hi = [], [], [], []
    for g, (L, b) in enumerate(groups):
        r = row.get((L, b, "fluxion"))
        if r is None:
            continue
        m = float(r[key + "_median"])
        xs.append(g + (j - 0.5) * 0.3)
        med.append(m)
        lo.append(m - float(r[key + "_min"]))
        hi.append(float(r[key + "_max"]) - m)
    ax2.errorbar(xs, med, yerr=[lo, hi], fmt="o", ms=4, color=color, capsize=3, lw=1, label=label)
ax1.set_ylabel("TPOT (ms): the mode's step,\nmedian, min..max")
ax1.set_title("concurrent sessions on the real SmolLM2-135M; the modes' steps interleaved by the node", fontsize=9)
ax1.legend(fontsize=7, loc="upper left")
ax1.grid(axis="y", alpha=0.3)
ax2.axhline(1.0, color="k", lw=0.8)
ax2.set_ylabel("paired ratio", fontsize=8)
ax2.legend(fontsize=6, loc="best")
ax2.grid(axis="y", alpha=0.3)
ax2.set_xticks(range(len(groups)))
ax2.set_xticklabels(["L %d\nbatch %d" % g for g in groups], fontsize=7)
plt.setp(ax1.get_xticklabels(), visible=False)
fig.suptitle("fluxion-decoded on loopback (bench/run node), KV from the node's local prefill")
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=120)
print("plot:", sys.argv[3])
