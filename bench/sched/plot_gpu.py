"""Plot of bench/sched's GPU points (a CUDA device only): sched_gpu.png.

Left: attention time per layer of the four GPU-point configurations (fixed (16, 0.05) on the CPU
workers, Fluxion with the GPU worker, the hybrid (16, 0.05) baseline whose GPU takes no task, and
(16, 0.05) GPU-only over UVA), log y; each Fluxion bar carries its speedup over the hybrid baseline
and its GPU idle ratio. Right, when a trace is given (sched_bench --trace): one layer of Fluxion
with the GPU worker at the largest point, each task a bar from the time a worker took it to the
time its result was in place (the GPU's tasks on its streams in the top row). A CPU task's row is the
worker that began it (its scoring, top-k and chunk plan); its chunks then run on whichever CPU
workers are free, which help with begun tasks before they take a new one. So a gap in a row is that
worker running other tasks' chunks (or briefly waiting for a task another worker is beginning), which
the trace does not draw; how busy the CPU workers were is the CSV's cpu_busy (the share of the
scheduler's run they spent in tasks), in the title when the CSV has it.

usage: plot_gpu.py SCHED_CSV OUT_PNG [TRACE_CSV]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["point"].startswith("gpu")]
if not rows:
    sys.exit("plot_gpu: no GPU point in %s" % sys.argv[1])
trace = list(csv.DictReader(open(sys.argv[3]))) if len(sys.argv) > 3 else []
CFG = [("fixed_16_005", "C1", "fixed (16, 0.05), CPU"), ("hybrid_16_005", "C4", "hybrid (16, 0.05)"),
       ("fluxion_gpu", "C0", "Fluxion + GPU worker"), ("gpu_only_16_005", "C3", "(16, 0.05) GPU-only")]
pts = []
for r in rows:
    if r["point"] not in pts:
        pts.append(r["point"])
fig, axes = plt.subplots(1, 2 if trace else 1, figsize=(13 if trace else 6.5, 4.4), squeeze=False)
ax = axes[0][0]
w = 0.8 / len(CFG)
for j, (name, col, label) in enumerate(CFG):
    xs, ys = [], []
    for k, p in enumerate(pts):
        v = [r for r in rows if r["point"] == p and r["config"] == name]
        if not v:
            continue
        xs.append(k + j * w)
        ys.append(float(v[0]["ms_med"]))
        if name == "fluxion_gpu":
            ax.annotate("%.2fx\nidle %.2f" % (float(v[0]["base_over_this"]), float(v[0]["gpu_idle_ratio"])),
                        (k + j * w, ys[-1]), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.bar(xs, ys, w, color=col, label=label)
ax.set_xticks([k + 0.4 - w / 2 for k in range(len(pts))])
ax.set_xticklabels([p.replace("gpu", "").replace("_b", " b") for p in pts], fontsize=9)
ax.set_yscale("log")
ax.set_ylabel("attention time per layer (ms), median")
ax.set_title("GPU points (labels: Fluxion over the hybrid, Fluxion's GPU idle ratio)", fontsize=9)
ax.grid(alpha=0.3, axis="y", which="both")
ax.legend(fontsize=7, loc="upper left")
if trace:
    ax = axes[0][1]
    big = [t for t in trace if t["config"] == "fluxion_gpu"]
    point = max({t["point"] for t in big}, key=lambda p: (int(p.split("K")[0][3:]), int(p.split("_b")[1])))
    layer = min(int(t["layer"]) for t in big if t["point"] == point)
    tasks = [t for t in big if t["point"] == point and int(t["layer"]) == layer and int(t["worker"]) != -2]
    cpus = sorted({int(t["worker"]) for t in tasks if int(t["worker"]) >= 0})
    row_of = {c: i for i, c in enumerate(cpus)}
    gpu_row = len(cpus)
    lanes = []   # the GPU's tasks overlap (several streams): stack them in sub-rows
    for t in sorted(tasks, key=lambda t: float(t["start_us"])):
        s, e = float(t["start_us"]) / 1e3, float(t["end_us"]) / 1e3
        if int(t["worker"]) >= 0:
            y, col = row_of[int(t["worker"])], "C0"
        else:   # the first sub-row free by this task's start
            k = next((i for i, end in enumerate(lanes) if end <= s), len(lanes))
            if k == len(lanes):
                lanes.append(e)
            else:
                lanes[k] = e
            y, col = gpu_row + 0.5 * k, "C3"
        ax.barh(y, e - s, left=s, height=0.45 if int(t["worker"]) < 0 else 0.8, color=col, edgecolor="k",
                linewidth=0.3)
    ax.set_yticks(list(range(len(cpus))) + [gpu_row])
    ax.set_yticklabels(["cpu %d" % c for c in cpus] + ["GPU"], fontsize=6)
    ax.set_xlabel("time in the layer (ms)")
    busy = [r.get("cpu_busy") for r in rows if r["point"] == point and r["config"] == "fluxion_gpu"]
    busy = " CPU workers busy %.2f of the run;" % float(busy[0]) if busy and busy[0] else ""
    ax.set_title("one layer, Fluxion + GPU worker, %s (%d tasks, %d on the GPU)\n%s CPU rows: the worker that "
                 "began the task, its chunks ran on any free worker" %
                 (point.replace("gpu", ""), len(tasks), sum(int(t["worker"]) < 0 for t in tasks), busy), fontsize=9)
    ax.grid(alpha=0.3, axis="x")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=130)
print("plot: %s" % sys.argv[2])
