"""How each cost grows with the number of objects: a plot from ``bench/scale_bench.py --json``.

    .venv/bin/python bench/scale_bench.py --sizes 1000,10000,100000 --pods '' --json > s.json
    .venv/bin/python bench/scale_plot.py s.json docs/performance/scale.png

Two panels, N on a log axis: the UPDATE latency (p50) with no admission, the enforcer and
the policy twin, per kind, and what the enforcer adds (which must not grow with N); and
the throughput of 1,000 Holds and 1,000 Releases at once (a Kueue-mode Hold's first read
is a label-selected LIST, which grows with N; a Release reads by name).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONFIGS = (("none", "no admission"), ("webhook", "enforcer"), ("policy", "policy twin"))
KINDS = (("TrainJob", "-"), ("Workload", "--"))


def plot(report: dict[str, Any], out: Path) -> None:
    """Draw ``report`` (scale_bench's JSON) to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    rows = sorted((int(n), row) for n, row in report["sizes"].items())
    sizes = [n for n, _ in rows]
    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, style in KINDS:
        for tag, label in CONFIGS:
            values = [row["update_ms"][tag][f"{kind} p50"] for _, row in rows]
            latency.plot(sizes, values, style, marker="o", label=f"{kind}, {label}")
        added = [
            row["update_ms"]["webhook"][f"{kind} p50"] - row["update_ms"]["none"][f"{kind} p50"]
            for _, row in rows
        ]
        latency.plot(sizes, added, style, marker="x", color="black", label=f"{kind}: enforcer adds")
    latency.set_xscale("log")
    latency.set_xlabel("TrainJobs and Workloads in the cluster (N each)")
    latency.set_ylabel("UPDATE latency p50 (ms)")
    latency.set_title("Admission cost per UPDATE")
    latency.legend(fontsize=7)
    latency.grid(True, alpha=0.3)
    for verb in ("hold", "release"):
        values = [row["holds"][verb]["calls_per_s"] for _, row in rows]
        throughput.plot(sizes, values, marker="o", label=f"{verb.title()}s, 1,000 at once")
    throughput.set_xscale("log")
    throughput.set_xlabel("TrainJobs and Workloads in the cluster (N each)")
    throughput.set_ylabel("calls per second")
    throughput.set_title("AsyncAdapter, Kueue mode")
    throughput.legend(fontsize=8)
    throughput.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="scale_bench.py --json output")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args()
    plot(json.loads(args.report.read_text()), args.out)


if __name__ == "__main__":
    main()
