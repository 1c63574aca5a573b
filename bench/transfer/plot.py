"""Plots the KV transfer rate of each round: ucx_perftest at our message size (warmed up and cold)
and with one message the session's size, the node's path with payload hashes (the product) and
without, on a new connection and on the warm one after it, per transport; and the node's
last-byte-to-READY time per GB."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = list(csv.DictReader(open(sys.argv[1])))
tls = [t for t in ("shm", "tcp") if any(r["transport"] == t and r["kind"] != "long" for r in rows)]
fig, axes = plt.subplots(1, len(tls) + 1, figsize=(4.2 * (len(tls) + 1), 4.6))
styles = {"perftest": ("k", "o", "ucx_perftest ucp_am_bw"),
          "perftest-session": ("0.55", "D", "ucx_perftest, one message the session's size"),
          "perftest-cold": ("C4", "v", "ucx_perftest without warm-up (-w 0)"),
          "flx": ("C0", "s", "node, hashes checked, new connection"),
          "flx-warm": ("C0", "s", "node, hashes checked, warm connection", "--"),
          "flx-nohash": ("C1", "^", "node, no hashes, new connection"),
          "flx-nohash-warm": ("C1", "^", "node, no hashes, warm connection", "--")}
for ax, t in zip(axes, tls):
    for kind, (color, marker, label, *ls) in styles.items():
        pts = [(int(r["rep"]), float(r["gbps"])) for r in rows if r["transport"] == t and r["kind"] == kind]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label,
                linestyle=ls[0] if ls else "-")
    msg = next(float(r["msg_bytes"]) for r in rows if r["transport"] == t)
    ax.set_title(f"{t}: {msg / 2**20:.1f} MiB messages")
    ax.set_xlabel("round")
    ax.set_ylabel("GB/s (1e9 bytes)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)   # one legend for the rate panels, below them
ax = axes[-1]
for t, color in (("shm", "C0"), ("tcp", "C2")):
    pts = [float(r["ready_ms_per_gb"]) for r in rows
           if r["transport"] == t and r["kind"] in ("flx", "flx-warm", "long")]
    if pts:
        ax.plot(range(len(pts)), pts, "o", color=color, label=t)
ax.axhline(10, color="r", linestyle="--", label="target 10 ms/GB")
ax.set_title("last byte to READY")
ax.set_xlabel("session")
ax.set_ylabel("ms per GB of KV")
ax.set_ylim(bottom=0)
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
fig.tight_layout(rect=(0, 0.12, 1, 1))
fig.savefig(sys.argv[2], dpi=110)
