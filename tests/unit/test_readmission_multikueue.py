"""The readmission gate on a MultiKueue manager cluster: the pure decision on what the
worker clusters still have of a job (tables and properties), and the reading of a
MultiKueueCluster's kubeconfig location. The counting itself runs on two real control
planes in tests/real/test_multikueue.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.readmission.decisions import (
    GateAction,
    WorkerCount,
    decide_readmission,
    why_waiting,
    worker_blocker,
)
from holdwarden.readmission.multikueue import kubeconfig_location
from holdwarden.vocabulary import MULTIKUEUE_CONTROLLER
from tests.unit.test_readmission import CHECKS, NOTES, NOW, decide, trainjob, workload


def dispatched(**kwargs: Any) -> dict[str, Any]:
    job = trainjob(**kwargs)
    job["spec"] = {"managedBy": MULTIKUEUE_CONTROLLER}
    return job


@pytest.mark.parametrize(
    ("workers", "why"),
    [
        pytest.param((), None, id="no-workers"),
        pytest.param((WorkerCount("w1"),), None, id="one-clear"),
        pytest.param((WorkerCount("w1"), WorkerCount("w2")), None, id="two-clear"),
        pytest.param(
            (WorkerCount("w1", pods=2),),
            "2 pod(s) of the previous execution remain on MultiKueue worker cluster 'w1'",
            id="pods",
        ),
        pytest.param(
            (WorkerCount("w1", mirror=True),),
            "the TrainJob's mirror copy on MultiKueue worker cluster 'w1' still exists",
            id="mirror",
        ),
        pytest.param(
            (WorkerCount("w1"), WorkerCount("w2", unreachable="request failed: timeout")),
            "MultiKueue worker cluster 'w2' could not be counted (request failed: timeout)",
            id="unreachable",
        ),
        pytest.param(
            (WorkerCount("w1", pods=1), WorkerCount("w2", unreachable="x")),
            "'w2' could not be counted",
            id="unreachable-first",
        ),
    ],
)
def test_worker_blocker_names_the_worker_and_what_remains(
    workers: tuple[WorkerCount, ...], why: str | None
) -> None:
    found = worker_blocker(workers)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found


def test_a_dispatched_job_is_not_admitted_on_uncounted_workers() -> None:
    assert why_waiting(workload(), dispatched(), 0, NOTES, None) == (
        "its pods on MultiKueue's worker clusters have not been counted"
    )
    assert why_waiting(workload(), dispatched(), 0, NOTES, (WorkerCount("w1"),)) is None


def test_a_local_job_needs_no_worker_count() -> None:
    assert why_waiting(workload(), trainjob(), 0, NOTES, None) is None


def test_the_managers_own_pods_still_count_first() -> None:
    why = why_waiting(workload(), dispatched(), 1, NOTES, (WorkerCount("w1", pods=3),))
    assert why == "1 pod(s) of the previous execution remain"


worker_counts = st.lists(
    st.builds(
        WorkerCount,
        cluster=st.sampled_from(["w1", "w2", "w3"]),
        pods=st.integers(0, 3),
        mirror=st.booleans(),
        unreachable=st.none() | st.just("timed out"),
    ),
    max_size=4,
).map(tuple)


@given(workers=st.none() | worker_counts, local_pods=st.integers(0, 2))
def test_a_dispatched_job_turns_ready_only_on_workers_counted_and_clear(
    workers: tuple[WorkerCount, ...] | None, local_pods: int
) -> None:
    decision = decide_with_workers(workers, local_pods)
    clear = (
        workers is not None
        and local_pods == 0
        and all(w.unreachable is None and w.pods == 0 and not w.mirror for w in workers)
    )
    assert (decision.action is GateAction.MARK_READY) == clear
    if not clear:
        assert decision.action is GateAction.KEEP_PENDING


def decide_with_workers(workers: tuple[WorkerCount, ...] | None, local_pods: int) -> Any:
    return decide_readmission(
        workload(),
        dispatched(),
        local_pods,
        check_names=CHECKS,
        annotations=NOTES,
        now=NOW,
        workers=workers,
    )


def test_a_local_job_still_turns_ready_without_workers() -> None:
    assert decide(workload(), trainjob()).action is GateAction.MARK_READY


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"clusterSource": {"kubeConfig": {"location": "w1-secret"}}},
            ("Secret", "w1-secret"),
            id="secret-by-default",
        ),
        pytest.param(
            {"clusterSource": {"kubeConfig": {"location": "s", "locationType": "Secret"}}},
            ("Secret", "s"),
            id="secret",
        ),
        pytest.param(
            {"clusterSource": {"kubeConfig": {"location": "/k", "locationType": "Path"}}},
            "locationType 'Path'",
            id="path",
        ),
        pytest.param(
            {"clusterSource": {"clusterProfileRef": {"name": "p"}}},
            "ClusterProfile",
            id="cluster-profile",
        ),
        pytest.param({"clusterSource": {"kubeConfig": {}}}, "location is missing", id="none"),
        pytest.param({}, "location is missing", id="empty-spec"),
    ],
)
def test_kubeconfig_location(spec: dict[str, Any], expected: tuple[str, str] | str) -> None:
    found = kubeconfig_location({"metadata": {"name": "w1"}, "spec": spec})
    if isinstance(expected, tuple):
        assert found == expected
    else:
        assert isinstance(found, str) and expected in found
