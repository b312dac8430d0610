"""The gate's "waiting too long" signal from a gate on the real control plane: a released
job whose old pod remains is counted until it is readmitted, and a deleted Workload is
forgotten. Which decisions count as stalled, and the tracker itself, are pinned without a
server in tests/unit/test_readmission_stalls.py."""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes import client as k8s

from holdwarden.readmission.controller import ReadmissionGate
from holdwarden.readmission.metrics import LONGEST_STALL, STALLED
from holdwarden.vocabulary import WORKLOAD
from rig.localcluster import GATE_IDENTITY, LocalCluster
from tests.controlplane.test_readmission_kube import (  # the gate tests' fixtures and helpers
    Objects,
    _pod,
    check_name,
    gate_config,
    objects,
)
from tests.unit.test_readmission import NOTES
from tests.unit.test_readmission_stalls import _Clock, _sample

__all__ = ["check_name", "objects"]  # fixtures, used by name


def _wait_for(what: str, predicate: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f}s"
        time.sleep(0.05)


def test_a_released_job_whose_old_pod_remains_is_counted_until_readmitted(
    cluster: LocalCluster, objects: Objects, check_name: str, trainer_client: k8s.ApiClient
) -> None:
    clock = _Clock()
    gate = ReadmissionGate(gate_config(check_name), cluster.api_client(GATE_IDENTITY), clock=clock)
    metrics = gate.metrics
    # Held (and Kueue listed the check Pending again): a wait by design, not counted.
    objects.hold("2")
    objects.kueue_sets_check(check_name, "Pending")
    objects.annotate_trainjob(NOTES.opened, "2026-12-02T12:00:00Z")
    _pod(trainer_client, objects.namespace, "job-node-0")
    gate.run_once()
    assert "hold instance 2 is in force" in objects.check(check_name)["message"]
    assert _sample(metrics, STALLED) == 0

    # Released while the held execution's pod remains: stalled, and its clock runs.
    objects.release()
    gate.run_once()
    assert "1 pod(s) of the previous execution remain" in objects.check(check_name)["message"]
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (1, 0)
    clock.advance(1801)
    gate.run_once()  # still waiting: the clock is not restarted
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (1, 1801)

    # The pod goes, the job is readmitted: no longer counted.
    k8s.CoreV1Api(trainer_client).delete_namespaced_pod("job-node-0", objects.namespace)
    gate.run_once()
    assert objects.check(check_name)["state"] == "Ready"
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (0, 0)


def test_a_running_gate_forgets_a_stalled_workload_once_it_is_deleted(
    cluster: LocalCluster, objects: Objects, check_name: str, trainer_client: k8s.ApiClient
) -> None:
    gate = ReadmissionGate(gate_config(check_name), cluster.api_client(GATE_IDENTITY))
    metrics = gate.metrics
    objects.annotate_trainjob(NOTES.opened, "2026-12-02T12:00:00Z")
    _pod(trainer_client, objects.namespace, "job-node-0")
    objects.kueue_sets_check(check_name, "Pending")
    gate.start()
    try:
        _wait_for("the stalled Workload counted", lambda: _sample(metrics, STALLED) == 1)
        _wait_for("its wait measured", lambda: _sample(metrics, LONGEST_STALL) > 0)
        objects.kueue.delete_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, objects.namespace, WORKLOAD.plural, "wl"
        )
        _wait_for("the deleted Workload forgotten", lambda: _sample(metrics, STALLED) == 0)
        assert _sample(metrics, LONGEST_STALL) == 0
    finally:
        gate.stop(timeout=5)
    assert gate.errors == 0
