"""Plot of tpot_bench's per-step CSV (bench/sched/run writes sched_tpot.csv).

sched_tpot.png: left, each engine's step time against the decode step (the warm-up steps shaded)
with the per-pair ratio on a second axis; right, the host bytes each step read and, for Fluxion,
the (layer, sequence, kv group)s that were streaming-only: what Fluxion's decisions did as the
answers grew.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

WARM = 2
rows = list(csv.DictReader(open(sys.argv[1])))
eng = {}
for r in rows:
    eng.setdefault(r["engine"], {})[int(r["step"])] = r
fx, bx = eng["fluxion"], eng["fixed_16_005"]
steps = sorted(set(fx) & set(bx))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
a.plot(steps, [float(fx[s]["ms"]) for s in steps], "-", color="C0", lw=1, label="Fluxion")
a.plot(steps, [float(bx[s]["ms"]) for s in steps], "-", color="C1", lw=1, label="fixed (16, 0.05)")
a.axvspan(-0.5, WARM - 0.5, color="0.9")
a.set_xlabel("decode step")
a.set_ylabel("step time (ms)")
a.set_ylim(bottom=0)
a.grid(alpha=0.3)
a2 = a.twinx()
pairs = [s for s in steps if s >= WARM]
a2.plot(pairs, [float(fx[s]["ms"]) / float(bx[s]["ms"]) for s in pairs], ".", color="C2", ms=3,
        label="ratio of the pair")
a2.axhline(0.9, color="C3", ls="--", lw=1, label="target 0.9")
a2.set_ylabel("Fluxion / fixed (16, 0.05)")
a2.set_ylim(0.5, 1.5)
h1, l1 = a.get_legend_handles_labels()
h2, l2 = a2.get_legend_handles_labels()
a.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
a.set_title("real model: step time, steps of the two engines interleaved")
b.plot(steps, [float(fx[s]["host_mib"]) for s in steps], "-", color="C0", label="Fluxion host MiB")
b.plot(steps, [float(bx[s]["host_mib"]) for s in steps], "-", color="C1", label="fixed (16, 0.05) host MiB")
b.set_xlabel("decode step")
b.set_ylabel("host bytes read per step (MiB)")
b.set_ylim(bottom=0)
b.grid(alpha=0.3)
b2 = b.twinx()
b2.plot(steps, [int(fx[s]["skipped_groups"]) for s in steps], ".", color="C4", ms=3,
        label="Fluxion: streaming-only groups")
b2.set_ylabel("streaming-only (layer, sequence, kv group)s")
b2.set_ylim(bottom=0)
h1, l1 = b.get_legend_handles_labels()
h2, l2 = b2.get_legend_handles_labels()
b.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
b.set_title("what each step read")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2])
