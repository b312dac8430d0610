"""Issue 29, trap 4, on the real Kueue v0.19.2: ``objectRetentionPolicies.workloads.
afterDeactivatedByKueue`` deletes a job Kueue deactivated itself, even while holdwarden
holds it.

What Kueue v0.19.2 does (read in its code): the job reconciler
(pkg/controller/jobframework/reconciler.go, ``handleWorkloadAfterDeactivatedPolicy``)
deletes the *job* (here the TrainJob, background propagation; its Workload and JobSet then
go by garbage collection) once the Workload is inactive and its ``Evicted`` condition's
reason starts with ``DeactivatedDueTo`` (pkg/workload/evict/evict.go,
``IsEvictedDueToDeactivationByKueue``), the retention after that condition's
lastTransitionTime. Kueue's own deactivations give that reason (maximum execution time,
requeuing limit, a rejected AdmissionCheck); a deactivation by anyone else (holdwarden's
hold) gives ``Deactivated``. No feature gate to set: ``ObjectRetentionPolicies`` is GA and
locked on since v0.17 (pkg/features/kube_features.go).

This module starts its own cluster: on the shared one the retention would delete the job
tests/real/test_kueue_traps.py strands and then revives.

Seen here: Kueue v0.19.2's own ClusterRole (config/components/rbac/role.yaml, and the
Helm chart's) has no ``delete`` on ``trainjobs``, so with the upstream RBAC the retention's
delete of a TrainJob is refused ("Reconciler error ... cannot delete resource trainjobs")
and retried; the jobs stay, held or not. Granted that delete (as an operator might), Kueue
deletes a job it stopped by its time limit that the supervisor then held, hold and all,
and the one nobody held; a job held by holdwarden alone outlives the retention (the
control). holdwarden says so: preflight's ``kueueRetention`` names the setting, and Observe
and Release of the deleted job raise NotFound naming it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.adapter import Adapter
from holdwarden.adapter.errors import NotFound
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import JOB_UID_LABEL, TRAINJOB, WORKLOAD
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.realstory import (
    Objects,
    condition,
    eventually,
    make_queues,
    wait_local_queue_active,
)
from tests.real.conftest import REAL_NAMESPACE_LABEL
from tests.real.story import kueue_log, meta
from tests.real.test_kueue_traps import MET, body

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

RETENTION = "1s"
RETENTION_SECONDS = 1


@pytest.fixture(scope="module")
def retention_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(
        controllers=CONTROLLERS,
        kueue_settings={
            "objectRetentionPolicies": {"workloads": {"afterDeactivatedByKueue": RETENTION}}
        },
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


def evicted(objects: Objects) -> dict[str, Any] | None:
    found = condition(objects.workload(), "Evicted")
    return found if found and found["status"] == "True" else None


def workloads_of(admin: k8s.ApiClient, namespace: str, uid: str) -> list[Any]:
    found: Any = k8s.CustomObjectsApi(admin).list_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
        label_selector=f"{JOB_UID_LABEL}={uid}",
    )  # fmt: skip
    return list(found["items"])


def trainjob_gone(objects: Objects) -> bool:
    try:
        objects.trainjob()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def kueues_deletion_event(admin: k8s.ApiClient, namespace: str, name: str) -> str | None:
    events = k8s.CoreV1Api(admin).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason=Deleted"
    )
    notes = [str(e.message) for e in events.items if e.message]
    return notes[0] if notes else None


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _diagnosis(cluster: LocalCluster, objects: Objects) -> str:
    """What Kueue left, when it did not delete the job: the TrainJob, its Workload's
    conditions, and Kueue's log lines about the namespace."""
    if trainjob_gone(objects):
        return f"{objects.name}: gone"
    job = objects.trainjob()
    workload = objects.workload() or {}
    logs = (cluster.controllers.logs() if cluster.controllers else {}).get("kueue", "")
    lines = [
        line[:600]
        for line in logs.splitlines()
        if (objects.namespace in line and f"{objects.name}-" in line) or f'"{objects.name}"' in line
    ]
    return "\n".join(
        [
            f"{objects.name}:",
            f"trainjob metadata: {job['metadata']}",
            f"trainjob spec: {job['spec']}",
            f"workload spec: {workload.get('spec')}",
            f"workload conditions: {(workload.get('status') or {}).get('conditions')}",
            *lines[-25:],
        ]
    )


def kueue_refused_deleting(cluster: LocalCluster, namespace: str, name: str) -> bool:
    """Kueue's log has its retention's delete of ``namespace/name`` refused by RBAC."""
    refused = 'cannot delete resource \\"trainjobs\\" in API group \\"trainer.kubeflow.org\\"'
    return any(
        # controller-runtime's "Reconciler error" line names the object by namespace and
        # name (it has no "job" key, unlike the reconciler's own lines).
        refused in line and f'"namespace":"{namespace}","name":"{name}"' in line
        for line in kueue_log(cluster)
    )


def kueue_deleting(cluster: LocalCluster, namespace: str, name: str) -> bool:
    """Kueue's log has its retention deciding to delete ``namespace/name``."""
    return any(
        "Deleting job: deactivation retention period expired" in line
        and f'"job":"{namespace}/{name}"' in line
        for line in kueue_log(cluster)
    )


def grant_kueue_delete(admin: k8s.ApiClient, token: str) -> None:
    """What an operator would add: delete on TrainJobs for Kueue's service account."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    name = f"kueue-delete-trainjobs-{token}"
    role: Any = {
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainjobs"],
                "verbs": ["delete"],
            }
        ],
    }
    binding: Any = {
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": "kueue-controller-manager",
                "namespace": "kueue-system",
            }
        ],
    }
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)


class Nudger:
    """Touches TrainJobs (an annotation) at most every 2 s, so that Kueue reconciles them
    now rather than after its error backoff."""

    def __init__(self, admin: k8s.ApiClient, namespace: str) -> None:
        self.custom = k8s.CustomObjectsApi(admin)
        self.namespace = namespace
        self.last = 0.0
        self.count = 0

    def __call__(self, *names: str) -> None:
        if time.monotonic() - self.last < 2:
            return
        self.last = time.monotonic()
        self.count += 1
        for name in names:
            try:
                self.custom.patch_namespaced_custom_object(
                    TRAINJOB.group, TRAINJOB.version, self.namespace, TRAINJOB.plural, name,
                    {"metadata": {"annotations": {"test.holdwarden.io/nudge": str(self.count)}}},
                )  # fmt: skip
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_kueues_retention_deletes_a_job_it_deactivated_hold_and_all(
    retention_cluster: LocalCluster,
) -> None:
    cluster = retention_cluster
    token = str(int(time.time() * 1000) % 1000000)
    namespace = cluster.create_namespace(f"ret-{token}", labels={REAL_NAMESPACE_LABEL: "true"})
    with cluster.api_client() as admin, cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        make_queues(admin, namespace)
        wait_local_queue_active(admin, namespace)
        adapter = Adapter(Config(mode="kueue"), supervisor)

        # Preflight on this cluster reads Kueue's ConfigMap and names the setting.
        retention = adapter.preflight(namespace).capabilities()["kueueRetention"]
        assert not retention.supported
        assert f"afterDeactivatedByKueue is {RETENTION}" in retention.reason

        # The control: held by holdwarden alone (Evicted reason "Deactivated"), first.
        control = Objects(admin, namespace, "ctl")
        ctl = adapter.start(body(namespace, "ctl", None), meta())
        adapter.open(ctl, meta())
        eventually(lambda: not control.suspended(), "Kueue admits and runs the control job")
        adapter.hold(ctl, meta(1), "node lost")
        ctl_evicted = eventually(lambda: evicted(control), "Kueue evicts the held control job")
        assert ctl_evicted["reason"] == "Deactivated", ctl_evicted

        # Two jobs Kueue stops itself (their time limit); the supervisor then holds one.
        stopped = Objects(admin, namespace, "job")
        free = Objects(admin, namespace, "free")
        ref = adapter.start(body(namespace, "job", 3), meta())
        adapter.open(ref, meta())
        adapter.open(adapter.start(body(namespace, "free", 3), meta()), meta())
        uid = stopped.trainjob()["metadata"]["uid"]
        for objects in (stopped, free):
            by_kueue = eventually(partial(evicted, objects), f"Kueue stops {objects.name}")
            assert by_kueue["reason"] == MET, by_kueue
        adapter.hold(ref, meta(1), "node lost")
        assert adapter.observe(ref).state is State.HELD

        # Kueue v0.19.2 as deployed upstream: its retention tries to delete both TrainJobs
        # and is refused, its ClusterRole has no delete on trainjobs. Both stay.
        for name in ("job", "free"):
            eventually(
                partial(kueue_refused_deleting, cluster, namespace, name),
                f"Kueue's retention tries to delete {name} and is refused",
            )
        assert not trainjob_gone(stopped) and not trainjob_gone(free)
        observed = adapter.observe(ref)
        assert observed.state is State.HELD and observed.hold_instance == 1, observed

        # With delete granted (as an operator might), Kueue deletes both, hold and all;
        # the Workloads follow (owner references).
        grant_kueue_delete(admin, token)
        nudge = Nudger(admin, namespace)

        def both_gone() -> bool:
            nudge("job", "free")
            return trainjob_gone(stopped) and trainjob_gone(free)

        try:
            eventually(both_gone, "Kueue deletes the held job and the free one", 120)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{_diagnosis(cluster, stopped)}\n{_diagnosis(cluster, free)}"
            ) from None
        eventually(lambda: not workloads_of(admin, namespace, uid), "its Workload goes", 120)
        note = eventually(
            lambda: kueues_deletion_event(admin, namespace, "job"), "Kueue's Deleted event"
        )
        assert "deactivation retention period expired" in note, note

        # holdwarden says the job is gone, naming it, on Observe and on Release.
        with pytest.raises(NotFound) as observe_error:
            adapter.observe(ref)
        with pytest.raises(NotFound) as release_error:
            adapter.release(ref, meta(1))
        for error in (observe_error.value, release_error.value):
            assert f"{namespace}/job" in str(error), str(error)

        # The control, held by holdwarden alone longer than the retention, nudged too,
        # is still there and held: Kueue never decided to delete it.
        nudge.last = 0.0
        nudge("ctl")
        held_for = time.time() - _seconds(ctl_evicted["lastTransitionTime"])
        assert held_for > RETENTION_SECONDS, held_for
        assert adapter.observe(ctl).state is State.HELD
        assert control.suspended()
        assert not kueue_deleting(cluster, namespace, "ctl")
