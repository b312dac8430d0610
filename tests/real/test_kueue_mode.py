"""Kueue mode on the real Kueue, Trainer, JobSet and Job controller, with the enforcer
registered in the apiserver and the readmission gate running.

Start; Kueue admits (through the gate's AdmissionCheck) and pods exist. Hold: Kueue evicts,
suspends the TrainJob, the pods are deleted; the Workload keeps its uid and the hold
annotations for at least 60 s; Observe says held. Release while a pod of the held
execution is still there (a finalizer keeps it): the gate keeps the job waiting; once the
pod is gone Kueue re-admits through the gate, P/attempt rises exactly once, and pods of
two executions never exist at the same time. Throughout, every committed change is
watched, and at the end the enforcer has refused no controller's write.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden import objects as hw_objects
from holdwarden.adapter import Adapter, Ref
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import JOB_UID_LABEL, Annotations
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.binaries import selected_cell
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_queues,
    with_requests,
)
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import assert_no_false_positives, live_pod_sets, meta
from tests.support.actors import Watcher

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

A = Annotations()
HOLD_STABLE_S = 60.0


@pytest.fixture(scope="module")
def enforced(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(real_cluster, tmp_path_factory.mktemp("enforcer")) as running:
        yield running


@contextmanager
def gated_queue(
    cluster: LocalCluster, admin: k8s.ApiClient, enforced: Enforcement, prefix: str
) -> Iterator[tuple[str, Objects, Adapter]]:
    """A fresh enforced namespace whose queues re-admit through the readmission gate, its
    objects, and a Kueue-mode adapter acting as the supervisor (closed after)."""
    namespace = cluster.create_namespace(
        f"{prefix}-{enforced.token[:6]}-{int(time.time()) % 100000}", labels=enforced.labels()
    )
    make_queues(admin, namespace, admission_checks=[enforced.check_name])
    supervisor = cluster.api_client(SUPERVISOR_IDENTITY)
    try:
        yield namespace, Objects(admin, namespace), Adapter(Config(mode="kueue"), supervisor)
    finally:
        supervisor.close()  # type: ignore[no-untyped-call]


def test_kueue_mode_hold_and_release_on_the_real_controllers(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, enforced: Enforcement
) -> None:
    namespace = real_cluster.create_namespace(
        f"kueue-{enforced.token[:6]}-{int(time.time()) % 100000}", labels=enforced.labels()
    )
    make_queues(real_admin, namespace, admission_checks=[enforced.check_name])
    objects = Objects(real_admin, namespace)
    watcher = Watcher(real_admin, namespace)
    watcher.start()
    supervisor = real_cluster.api_client(SUPERVISOR_IDENTITY)
    adapter = Adapter(Config(mode="kueue"), supervisor)
    try:
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        assert ref == Ref(namespace, "job")
        adapter.open(ref, meta())

        first = eventually(objects.pod_uids, "Kueue admits and the first pods exist")
        eventually(lambda: objects.attempt() == "1", "the gate records attempt 1")
        through_gate = adapter.observe(ref)
        assert not through_gate.ungated_admission, through_gate
        assert (enforced.check_name, "Ready") in through_gate.admission_checks
        workload = objects.workload()
        assert workload is not None
        workload_uid = workload["metadata"]["uid"]
        # The real Kueue names the Workload as holdwarden predicts (so a Hold finds it with
        # one GET, not a LIST over the namespace), and the test actors name it the same.
        trainjob_uid = workload["metadata"]["labels"][JOB_UID_LABEL]
        assert (
            workload["metadata"]["name"] == hw_objects.kueue_workload_names("job", trainjob_uid)[0]
        )
        kept = objects.keep(objects.pods()[0])

        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "Kueue suspends the TrainJob")
        evicted = eventually(
            lambda: condition(objects.workload(), "Evicted"), "Kueue evicts the Workload"
        )
        # Everything but the pod the finalizer keeps is deleted (by the Job controller).
        eventually(lambda: objects.pod_uids() <= first and len(objects.pods()) == 1, "pods go")
        observed = adapter.observe(ref)
        assert observed.state is State.HELD, observed
        assert observed.hold_instance == 1
        assert kept in observed.leftover_pods
        # The real Kueue reset the gate's check on eviction (its message replaced), and
        # left the gate's own record of the grant: what a gate that stopped between its
        # Ready and A's raise reads back (readmission/decisions.py).
        reset = eventually(
            lambda: next(
                (c for c in (objects.workload() or {}).get("status", {}).get(
                    "admissionChecks") or []
                 if c.get("name") == enforced.check_name and c.get("state") == "Pending"),
                None,
            ),
            "Kueue resets the gate's check to Pending",
        )  # fmt: skip
        assert "holdwarden: attempt" not in str(reset.get("message")), reset
        assert hw_objects.recorded_grant(objects.workload(), A) == 1

        # The hold stays: same Workload, same annotations, for at least HOLD_STABLE_S.
        until = time.monotonic() + HOLD_STABLE_S
        while time.monotonic() < until:
            current = objects.workload()
            assert current is not None and current["metadata"]["uid"] == workload_uid
            assert current["metadata"]["annotations"].get(A.hold_instance) == "1"
            assert current["spec"].get("active") is False
            assert objects.suspended()
            time.sleep(2)
        assert adapter.observe(ref).state is State.HELD

        adapter.release(ref, meta(1))
        # The held execution's pod is still there: the gate must keep the job waiting.
        until = time.monotonic() + 15
        while time.monotonic() < until:
            assert objects.suspended(), "re-admitted while the held execution's pod remains"
            time.sleep(0.5)
        objects.let_go(kept)
        eventually(lambda: not objects.suspended(), "re-admitted once the old pods are gone")
        second = eventually(lambda: objects.pod_uids() - first, "the second execution's pods")
        eventually(lambda: objects.attempt() == "2", "the gate records attempt 2")
        time.sleep(5)  # a second rise would show within a few gate passes
        assert objects.attempt() == "2"
        assert hw_objects.recorded_grant(objects.workload(), A) == 2
        current = objects.workload()
        assert current is not None and current["metadata"]["uid"] == workload_uid
    finally:
        watcher.stop()
        supervisor.close()  # type: ignore[no-untyped-call]

    events = watcher.events()
    for live in live_pod_sets(events):
        assert not (live & first and live & second), "pods of two executions at once"
    workload_events: list[Any] = [e for e in events if e.kind == "workload"]
    assert all(e.type != "DELETED" for e in workload_events), "the Workload was recreated"
    print(f"Kueue's eviction: {evicted}")
    assert_no_false_positives(real_cluster, enforced)


def test_the_enforcer_still_refuses_a_users_unsuspend_of_a_held_trainjob(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, enforced: Enforcement
) -> None:
    namespace = real_cluster.create_namespace(
        f"plain-{enforced.token[:6]}-{int(time.time()) % 100000}", labels=enforced.labels()
    )
    objects = Objects(real_admin, namespace)
    body = trainjob_body("job", suspend=True)
    body["metadata"]["annotations"] = {A.hold_instance: "1"}
    objects.custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", body
    )
    with real_cluster.api_client("alice") as alice, pytest.raises(k8s.ApiException) as refused:
        k8s.CustomObjectsApi(alice).patch_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "job",
            {"spec": {"suspend": False}},
        )  # fmt: skip
    assert refused.value.status == 403
    assert "held-trainjob-suspended" in (refused.value.body or "")


def test_a_held_workload_outlives_a_users_delete_and_goes_with_its_trainjob(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, enforced: Enforcement
) -> None:
    """held-workload-kept on the real controllers: a user's DELETE of the held Workload is
    refused (Kueue would make an active one and run the job) and the hold stays; deleting
    the TrainJob takes the held Workload with it, through the real garbage collector and
    Kueue's finalizer removal, with no refusal of either."""
    with gated_queue(real_cluster, real_admin, enforced, "gc") as (namespace, objects, adapter):
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        workload = eventually(objects.workload, "Kueue creates the Workload")
        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "the TrainJob is suspended")
    name = workload["metadata"]["name"]
    before = len(enforced.audit())
    with real_cluster.api_client("alice") as alice, pytest.raises(k8s.ApiException) as refused:
        k8s.CustomObjectsApi(alice).delete_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads", name
        )
    assert refused.value.status == 403
    assert "held-workload-kept" in (refused.value.body or "")
    kept = objects.workload()
    assert kept is not None and kept["metadata"]["uid"] == workload["metadata"]["uid"]
    assert kept["metadata"]["annotations"].get(A.hold_instance) == "1"
    # One refused DELETE, though maybe more than one audit line: the apiserver judges a
    # DELETE of an object with finalizers inside its update retry loop, so a concurrent
    # status write by Kueue makes it ask the enforcer again (seen 1 run in 5).
    alices = enforced.audit()[before:]
    assert alices and {(r["rule"], r["user"]) for r in alices} == {("held-workload-kept", "alice")}

    objects.custom.delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "job",
        propagation_policy="Background",
    )  # fmt: skip

    def gone() -> bool:
        found: Any = objects.custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads"
        )
        return not found["items"]

    eventually(gone, "the garbage collector deletes the held Workload with its TrainJob")
    after = enforced.audit()[before:]
    assert {(r["rule"], r["user"]) for r in after} == {("held-workload-kept", "alice")}, after
    assert_no_false_positives(real_cluster, enforced)


def test_observe_flags_a_job_admitted_past_the_gate(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, enforced: Enforcement
) -> None:
    """Found on the real Kueue: a Workload whose pods request no resources is given no
    flavor, and Kueue applies no flavor-scoped AdmissionCheck to it, so it runs past the
    readmission gate although its ClusterQueue lists it. Observe says so
    (``ungated_admission``), as ``holdwarden status`` does.

    Since Kueue v0.18 (the version matrix's finding): v0.17 gives every Workload each check
    that applies to all of the ClusterQueue's flavors, admitted with flavors or not, so
    there the same job goes through the gate, and Observe says that instead."""
    with gated_queue(real_cluster, real_admin, enforced, "nogate") as (
        namespace,
        objects,
        adapter,
    ):
        body = trainjob_body("job", queue=LOCAL_QUEUE, suspend=True)  # no requests
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        adapter.open(ref, meta())
        eventually(lambda: not objects.suspended(), "Kueue admits the job")
        observed = eventually(
            lambda: (o := adapter.observe(ref)).state is State.RUNNING and o, "it runs"
        )
        if _kueue_version() < (0, 18):
            assert not observed.ungated_admission, observed
            assert [state for _, state in observed.admission_checks] == ["Ready"], observed
            assert objects.attempt() == "1"  # the gate granted it
            return
        assert observed.ungated_admission, observed
        assert observed.admission_checks == ()
        assert objects.attempt() is None  # the gate never granted it


def _kueue_version() -> tuple[int, ...]:
    """The running Kueue's version (the selected cell's), as numbers: v0.17.0 -> (0, 17, 0)."""
    return tuple(int(part) for part in selected_cell().kueue.lstrip("v").split("."))
