"""Start-up time of the local control plane (a script, not a test).

Run: ``.venv/bin/python bench/controlplane_bench.py [--runs 5]``

Starts and stops ``LocalCluster`` several times and prints each run's start-up time and
its phases (``cluster.phase_seconds``), then the median and max over the warm runs (every
run after the first; the first may still pay for building or unpacking binaries and for
cold file caches).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rig.localcluster import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    totals: list[float] = []
    phases: list[dict[str, float]] = []
    for run in range(args.runs):
        cluster = LocalCluster()
        began = time.monotonic()
        cluster.start()
        try:
            totals.append(cluster.startup_seconds)
            phases.append(dict(cluster.phase_seconds))
        finally:
            cluster.stop()
        stopped = time.monotonic() - began - cluster.startup_seconds
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in cluster.phase_seconds.items())
        print(
            f"run {run + 1}: start {cluster.startup_seconds:.2f}s ({parts}); stop {stopped:.2f}s",
            flush=True,
        )
    warm = totals[1:] or totals
    warm_phases = phases[1:] or phases
    print(
        f"\nwarm start-up over {len(warm)} runs: median {statistics.median(warm):.2f}s,"
        f" max {max(warm):.2f}s (first run {totals[0]:.2f}s)"
    )
    for name in warm_phases[0]:
        values = [p[name] for p in warm_phases]
        print(f"  {name:<12} median {statistics.median(values):.2f}s  max {max(values):.2f}s")


if __name__ == "__main__":
    main()
