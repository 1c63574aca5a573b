"""Plot of tpot_bench's per-step CSV (bench/sched/run writes sched_tpot.csv).

sched_tpot.png: left, each configuration's step time against the decode step (the mean over its
engines, each engine's own as thin lines; the warm-up steps shaded) with the per-step ratio on a
second axis; right, the host bytes each step read and, for Fluxion,
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
inst = {}   # (configuration, instance) -> step -> row
for r in rows:
    inst.setdefault((r["engine"], r.get("instance", "0")), {})[int(r["step"])] = r


def mean_rows(engine):
    """step -> the mean over the configuration's engines of each numeric column."""
    per = [v for (e, _), v in sorted(inst.items()) if e == engine]
    out = {}
    for s in set.intersection(*(set(p) for p in per)):
        out[s] = {k: sum(float(p[s][k]) for p in per) / len(per)
                  for k in ("ms", "host_mib", "skipped_groups")}
    return out, per


first = "fluxion" if any(e == "fluxion" for e, _ in inst) else "fixed_16_005_a"   # --same: an A/A run
fx, fx_per = mean_rows(first)
fname = "Fluxion" if first == "fluxion" else "fixed (16, 0.05) A"
bx, bx_per = mean_rows("fixed_16_005")
steps = sorted(set(fx) & set(bx))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
for per, color in ((fx_per, "C0"), (bx_per, "C1")):
    if len(per) > 1:
        for p in per:
            a.plot(steps, [float(p[s]["ms"]) for s in steps], "-", color=color, lw=0.4, alpha=0.5)
a.plot(steps, [fx[s]["ms"] for s in steps], "-", color="C0", lw=1.2, label=f"{fname} (mean of {len(fx_per)})")
a.plot(steps, [bx[s]["ms"] for s in steps], "-", color="C1", lw=1.2,
       label=f"fixed (16, 0.05) (mean of {len(bx_per)})")
a.axvspan(-0.5, WARM - 0.5, color="0.9")
a.set_xlabel("decode step")
a.set_ylabel("step time (ms)")
a.set_ylim(bottom=0)
a.grid(alpha=0.3)
a2 = a.twinx()
pairs = [s for s in steps if s >= WARM]
a2.plot(pairs, [fx[s]["ms"] / bx[s]["ms"] for s in pairs], ".", color="C2", ms=3,
        label="ratio of the step")
a2.axhline(0.9, color="C3", ls="--", lw=1, label="target 0.9")
a2.set_ylabel(f"{fname} / fixed (16, 0.05)")
a2.set_ylim(0.5, 1.5)
h1, l1 = a.get_legend_handles_labels()
h2, l2 = a2.get_legend_handles_labels()
a.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
a.set_title("real model: step time, steps of the engines interleaved")
b.plot(steps, [fx[s]["host_mib"] for s in steps], "-", color="C0", label=f"{fname} host MiB")
b.plot(steps, [bx[s]["host_mib"] for s in steps], "-", color="C1", label="fixed (16, 0.05) host MiB")
b.set_xlabel("decode step")
b.set_ylabel("host bytes read per step (MiB)")
b.set_ylim(bottom=0)
b.grid(alpha=0.3)
b2 = b.twinx()
b2.plot(steps, [fx[s]["skipped_groups"] for s in steps], ".", color="C4", ms=3,
        label=f"{fname}: streaming-only groups")
b2.set_ylabel("streaming-only (layer, sequence, kv group)s")
b2.set_ylim(bottom=0)
h1, l1 = b.get_legend_handles_labels()
h2, l2 = b2.get_legend_handles_labels()
b.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
b.set_title("what each step read")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2])
