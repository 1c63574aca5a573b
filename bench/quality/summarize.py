"""Aggregates bench/quality's CSV: one table per source kind, the plot, and the SUMMARY line.
Shares and errors are means over every (layer, step, head) row of the source kind, weighted by
the row's head count; bytes are per (layer, step, sequence), averaged over the runs."""
import csv
import math
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
cfgs = ["full", "fixed_16_005", "fixed_16_002", "fixed_32_005", "fixed_32_002", "fluxion", "fluxion_paper"]


def agg(label):
    out = {}
    for c in cfgs:
        rs = [r for r in rows if r["label"] == label and r["config"] == c]
        if not rs:
            continue
        h = sum(float(r["heads"]) for r in rs)
        rec = [(float(r["recall"]), float(r["heads"])) for r in rs if r["recall"] not in ("nan", "")
               and not math.isnan(float(r["recall"]))]
        out[c] = dict(
            within=sum(float(r["within_tau"]) * float(r["heads"]) for r in rs) / h,
            rel=sum(float(r["mean_rel_err"]) * float(r["heads"]) for r in rs) / h,
            recall=(sum(a * b for a, b in rec) / sum(b for _, b in rec)) if rec else float("nan"),
            bytes=sum(float(r["bytes_per_layer_step"]) for r in rs) / len(rs),
        )
    return out


summary = {}
for label, title in (("real", "real model (SmolLM2-135M, held-out text, 2K/4K/8K)"),
                     ("syn", "synthetic (32x32x8x128, share 0.5, 8K-128K)"),
                     ("syn_share", "synthetic retrieval-share sweep (25%, 75%; 32K)")):
    a = agg(label)
    if not a:
        continue
    print(f"\n{title}")
    print(f"{'config':<14} {'within_tau':>10} {'rel_err':>9} {'recall':>8} {'bytes/layer/step':>17} {'vs 16_005':>9}")
    base = a.get("fixed_16_005", {}).get("bytes", float("nan"))
    for c, v in a.items():
        print(f"{c:<14} {v['within']:>10.4f} {v['rel']:>9.4f} {v['recall']:>8.4f} {v['bytes']:>17.0f} "
              f"{v['bytes'] / base if base else float('nan'):>9.3f}")
    summary[label] = a

# Per-length table for the plot.
by_len = defaultdict(dict)
for r in rows:
    if r["label"] in ("real", "syn") and r["config"] in cfgs:
        by_len[(r["label"], int(r["prompt_len"]))][r["config"]] = r
for r in rows:
    if r["config"].startswith("predictor_share"):
        print(f"\npredictor inference share of the Fluxion attention step ({r['config'][16:]}, "
              f"L={r['prompt_len']}): {100 * float(r['within_tau']):.2f}%")
        summary["pred_share"] = float(r["within_tau"])

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, label, title in ((axes[0], "real", "SmolLM2-135M, held-out text"),
                             (axes[1], "syn", "synthetic Llama-3.1-8B-like shape")):
        for c in cfgs[1:]:
            pts = []
            for (lab, L), d in sorted(by_len.items()):
                if lab == label and c in d and "fixed_16_005" in d:
                    pts.append((float(d[c]["bytes_per_layer_step"]) / float(d["fixed_16_005"]["bytes_per_layer_step"]),
                                float(d[c]["within_tau"]), L))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o" if c.startswith("fluxion") else "s",
                        ms=8 if c == "fluxion" else 6, label=c)
                for p in pts:
                    ax.annotate(f"{p[2] // 1024 if p[2] >= 8192 else p[2]}{'K' if p[2] >= 8192 else ''}",
                                (p[0], p[1]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("host bytes per step / fixed (16, 0.05), same prompt length (labelled)")
        ax.set_ylabel("share of heads within tau = 0.1 (Eq. 2)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print("plot:", sys.argv[2])
except ImportError:
    print("quality: python3-matplotlib missing: no plot", file=sys.stderr)


def g(label, c, k):
    return summary.get(label, {}).get(c, {}).get(k, float("nan"))


br = g("real", "fluxion", "bytes") / g("real", "fixed_16_005", "bytes")
sbr = g("syn", "fluxion", "bytes") / g("syn", "fixed_16_005", "bytes")
print(f"SUMMARY within_tau_fluxion={g('real', 'fluxion', 'within'):.4f} "
      f"within_tau_16_005={g('real', 'fixed_16_005', 'within'):.4f} bytes_ratio={br:.4f} "
      f"syn_within_tau_fluxion={g('syn', 'fluxion', 'within'):.4f} "
      f"syn_within_tau_16_005={g('syn', 'fixed_16_005', 'within'):.4f} "
      f"syn_recall_fluxion={g('syn', 'fluxion', 'recall'):.4f} syn_bytes_ratio={sbr:.4f} "
      f"predictor_share_32k_b4={summary.get('pred_share', float('nan')):.4f}")
