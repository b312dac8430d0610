"""The gate's "waiting too long" signal: which Pending decisions count as stalled (pure),
and the tracker behind holdwarden_readmission_stalled_workloads and
holdwarden_readmission_longest_stall_seconds (no per-Workload series, no stale entries).

The same signal from a gate on the real control plane:
tests/controlplane/test_readmission_stalls_kube.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest

from holdwarden.readmission.decisions import GateAction, WorkerCount, decide_readmission
from holdwarden.readmission.metrics import LONGEST_STALL, STALLED, GateMetrics, StallTracker
from tests.unit.test_readmission import CHECKS, NOTES, NOW, trainjob, workload


def _multikueue(tj: dict[str, Any]) -> dict[str, Any]:
    tj["spec"] = {"managedBy": "kueue.x-k8s.io/multikueue"}
    return tj


@pytest.mark.parametrize(
    ("wl", "tj", "pods", "workers", "stalled"),
    [
        # Waits that are someone's decision: not stalled.
        pytest.param(workload(), None, 0, None, False, id="trainjob-not-found"),
        pytest.param(workload(), trainjob(opened=False), 0, None, False, id="not-opened"),
        pytest.param(workload(), trainjob(ended="Failed"), 3, None, False, id="ended"),
        pytest.param(workload(hold="3"), trainjob(), 2, None, False, id="held-pods-remain"),
        pytest.param(workload(active=False), trainjob(), 2, None, False, id="deactivated"),
        # Free to run, and the gate says no: stalled.
        pytest.param(workload(), trainjob(), 2, None, True, id="pods-remain"),
        pytest.param(workload(), trainjob(attempt="x"), 0, None, True, id="garbled-attempt"),
        pytest.param(
            workload(), _multikueue(trainjob()), 0, None, True, id="multikueue-not-counted"
        ),
        pytest.param(
            workload(),
            _multikueue(trainjob()),
            0,
            (WorkerCount("w1", unreachable="timed out"),),
            True,
            id="multikueue-worker-unreachable",
        ),
        pytest.param(
            workload(),
            _multikueue(trainjob()),
            0,
            (WorkerCount("w1", pods=1),),
            True,
            id="multikueue-worker-pods",
        ),
        # Admitted, or not ours to decide: not stalled.
        pytest.param(workload(), trainjob(), 0, None, False, id="ready"),
        pytest.param(workload(state="Retry"), trainjob(), 2, None, False, id="retry-not-ours"),
        pytest.param(
            workload(state="Ready", message="holdwarden: attempt 1 admitted"),
            trainjob(attempt="1"),
            2,
            None,
            False,
            id="already-ready",
        ),
    ],
)
def test_stalled_only_when_the_gate_itself_keeps_a_free_job_waiting(
    wl: dict[str, Any],
    tj: dict[str, Any] | None,
    pods: int,
    workers: tuple[WorkerCount, ...] | None,
    stalled: bool,
) -> None:
    def decide(w: dict[str, Any]) -> Any:
        return decide_readmission(
            w, tj, pods, check_names=CHECKS, annotations=NOTES, now=NOW, workers=workers
        )

    decision = decide(wl)
    assert decision.stalled is stalled, decision.reason
    if decision.action is GateAction.KEEP_PENDING:
        # The message written, the same question again writes nothing and says the same.
        again = decide(decision.workload)
        assert again.action is GateAction.NOTHING
        assert again.stalled is stalled


class _Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _sample(metrics: GateMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_the_tracker_counts_stalled_workloads_and_the_longest_wait_without_leaking() -> None:
    clock = _Clock()
    stalls = StallTracker(clock)
    metrics = GateMetrics()
    metrics.track_stalls(stalls)
    # Present from the start, at 0.
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (0, 0)

    stalls.record("ns/a", True)
    clock.advance(600)
    stalls.record("ns/b", True)
    stalls.record("ns/a", True)  # still stalled: its clock keeps running from the first
    clock.advance(1200)
    assert _sample(metrics, STALLED) == 2
    assert _sample(metrics, LONGEST_STALL) == 1800

    stalls.record("ns/a", False)  # readmitted (or held again)
    assert _sample(metrics, STALLED) == 1
    assert _sample(metrics, LONGEST_STALL) == 1200
    stalls.record("ns/a", True)  # a new wait starts a new clock
    clock.advance(60)
    assert _sample(metrics, LONGEST_STALL) == 1260  # ns/b, still the oldest
    stalls.forget("ns/b")  # deleted
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (1, 60)
    stalls.retain(["ns/other"])  # a resync that no longer sees ns/a
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (0, 0)
    stalls.record("ns/c", True)
    stalls.clear()  # the Lease lost
    assert (_sample(metrics, STALLED), _sample(metrics, LONGEST_STALL)) == (0, 0)
    # Two series in all, whatever the number of Workloads: no label per job.
    exposition = generate_latest(metrics.registry).decode()
    assert [line for line in exposition.splitlines() if line.startswith(STALLED)] == [
        f"{STALLED} 0.0"
    ]
