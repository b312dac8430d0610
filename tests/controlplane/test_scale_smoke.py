"""A small version of bench/scale_bench.py on the real apiserver: the counts, not the times.

200 TrainJobs and their Workloads; UPDATEs through the registered enforcer, its policy twin
and no admission all land; 100 Holds at once with ``AsyncAdapter``, then 100 Releases, and
every Workload carries exactly what the calls left: no hold lost, none doubled.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.scale_bench import Population, concurrent_holds, gate_at_scale, update_latency
from rig.localcluster import LocalCluster

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]


def test_scale_smoke_no_hold_lost_or_doubled(cluster: LocalCluster, tmp_path: Path) -> None:
    namespace = cluster.create_namespace("scale-smoke")
    population = Population(cluster, namespace)
    population.grow_to(200)
    assert len(population.names) == 200 and len(population.workloads) == 200
    latency = update_latency(cluster, tmp_path, writes=10)
    assert set(latency) == {"none", "webhook", "policy"}
    assert all(figures["TrainJob p50"] > 0 for figures in latency.values())
    holds = asyncio.run(concurrent_holds(cluster, population, 100, instance=1))
    for verb in ("hold", "release"):
        figures = holds[verb]
        assert figures["ok"] == 100 and not figures["failures"], figures
        assert figures["lost"] == 0 and figures["doubled"] == 0, figures


def test_scale_smoke_the_gate_admits_once_the_last_pod_goes(cluster: LocalCluster) -> None:
    """The gate's part of the bench at 300 pods: its caches hold them all (slimmed), and
    each of the two gated Workloads turns Ready after its last pod is deleted."""
    figures = gate_at_scale(cluster, 300, decisions=2)
    assert figures["cached"]["pods"] >= 300, figures
    assert figures["decision_ms_p50"] > 0 and figures["rss_mib"] > 0
