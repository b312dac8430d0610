"""Issue 29, trap 3, on the real Trainer of the current cell: Trainer up to v2.2 ignores
``spec.managedBy``; preflight's ``trainerManagedBy`` refuses Hold exactly there.

The cluster plays a MultiKueue manager as far as this trap needs: a ClusterQueue whose
AdmissionCheck is MultiKueue's (``kueue.x-k8s.io/multikueue``), so that the real Kueue's
defaulting webhook gives a TrainJob of its LocalQueue ``spec.managedBy:
kueue.x-k8s.io/multikueue``, as on a manager. No worker is connected (the check stays
inactive): what a real worker would add is the dispatch, and the trap is what the manager's
own Trainer does with the job before any of that. On a manager, once MultiKueue admits the
Workload, Kueue unsuspends the manager's TrainJob (Kueue v0.19.2, jobframework
``startJob``: only composable jobs skip local execution, and a TrainJob is not one),
relying on ``managedBy`` to keep Trainer away; a Trainer that created its JobSet then runs
the job there too.

- Trainer v2.2.1 (the ``kueue-0.17`` cell of ``make test-matrix``) creates the JobSet of
  the MultiKueue-managed TrainJob; preflight sees MultiKueue and Trainer v2.2's TrainJob
  CRD, ``trainerManagedBy`` is unsupported and Hold raises ``Unsupported`` writing nothing.
- Trainer v2.3.0 (today's cell) creates nothing for it; ``trainerManagedBy`` is supported
  and the same Hold succeeds.

"Creates nothing" is shown against a control, never by a bare sleep: a second TrainJob,
Trainer's own (no queue, default ``managedBy``), created after the first, gets its JobSet
and Trainer's ``Suspended`` condition. Trainer's informer delivers the two creations in
order, and its reconcile of a TrainJob it does not manage returns at once, before any
request, so by then the first has been looked at and left alone.

The MultiKueue AdmissionCheck is cluster-wide evidence for preflight (every Kueue-mode
preflight of this cluster would see it), so the test deletes it, and its ClusterQueue,
before it ends.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.errors import Unsupported
from holdwarden.adapter.types import Ref
from holdwarden.config import Config
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    CLUSTERQUEUE,
    MULTIKUEUE_CONTROLLER,
    TRAINJOB,
    TRAINJOB_CRD_NAME,
)
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.binaries import selected_cell
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_admission_check,
    make_queues,
    with_requests,
)
from tests.real.story import meta

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


def honours_managed_by(trainer_version: str) -> bool:
    """Trainer skips a TrainJob managed by someone else from v2.3.0 on."""
    major, minor = (int(part) for part in trainer_version.lstrip("v").split(".")[:2])
    return (major, minor) >= (2, 3)


def jobset(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: Any = k8s.CustomObjectsApi(admin).get_namespaced_custom_object(
            *JOBSET[:2], namespace, JOBSET[2], name
        )
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(found)


def defaulted_managed_by(admin: k8s.ApiClient, namespace: str) -> str | None:
    """``spec.managedBy`` of a server-side dry-run create of a TrainJob in LOCAL_QUEUE:
    Kueue's webhook names MultiKueue once its caches map the queue to the check."""
    body = with_requests(trainjob_body("probe", queue=LOCAL_QUEUE, suspend=True))
    created: Any = k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body, dry_run="All"
    )
    value = created["spec"].get("managedBy")
    return str(value) if value is not None else None


def test_a_trainer_that_ignores_managed_by_creates_the_jobset_and_preflight_refuses_hold(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, real_namespace: str
) -> None:
    trainer = selected_cell().trainer
    honours = honours_managed_by(trainer)
    print(f"Trainer {trainer}: honours spec.managedBy: {honours}")
    custom = k8s.CustomObjectsApi(real_admin)
    check = f"mk-{uuid.uuid4().hex[:8]}"
    make_admission_check(real_admin, check, MULTIKUEUE_CONTROLLER)
    cluster_queue = ""
    try:
        cluster_queue = make_queues(real_admin, real_namespace, [check])
        eventually(
            lambda: defaulted_managed_by(real_admin, real_namespace) == MULTIKUEUE_CONTROLLER,
            "Kueue's webhook names MultiKueue as the manager of a TrainJob of the queue",
        )
        subject, control = (
            Objects(real_admin, real_namespace, "job"),
            Objects(real_admin, real_namespace, "ctl"),
        )
        with real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
            adapter = Adapter(Config(mode="kueue"), supervisor)
            body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
            body["metadata"]["namespace"] = real_namespace
            ref = adapter.start(body, meta())  # waits for Kueue's Workload
            assert subject.trainjob()["spec"].get("managedBy") == MULTIKUEUE_CONTROLLER
            # The control: Trainer's own TrainJob, made after the subject.
            custom.create_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, real_namespace, TRAINJOB.plural,
                trainjob_body("ctl", namespace=real_namespace, suspend=True),
            )  # fmt: skip
            eventually(
                lambda: jobset(real_admin, real_namespace, "ctl"),
                f"Trainer {trainer} creates the JobSet of its own TrainJob (the control)",
            )
            eventually(
                lambda: condition(control.trainjob(), "Suspended"),
                f"Trainer {trainer} writes the control's Suspended condition",
            )
            if honours:
                assert jobset(real_admin, real_namespace, "job") is None, (
                    f"Trainer {trainer} created a JobSet for a TrainJob managed by MultiKueue"
                )
                assert condition(subject.trainjob(), "Suspended") is None, (
                    f"Trainer {trainer} wrote the status of a TrainJob it does not manage"
                )
            else:
                made = eventually(
                    lambda: jobset(real_admin, real_namespace, "job"),
                    f"Trainer {trainer} creates the JobSet of the MultiKueue-managed TrainJob",
                )
                owners = made["metadata"].get("ownerReferences") or []
                assert [o["name"] for o in owners if o.get("kind") == TRAINJOB.kind] == ["job"]

            result = adapter.preflight(real_namespace)
            cap = result.trainer_managed_by
            assert cap is not None, "Kueue mode: trainerManagedBy is probed"
            assert f"AdmissionCheck {check}" in cap.reason, cap
            assert cap.supported is honours, cap
            assert result.hold_supported is honours, result.hold_unsupported_reason
            workload = subject.workload()
            assert workload is not None
            if honours:
                assert "v2.3 or later" in cap.reason, cap
                adapter.hold(ref, meta(1), "trap 3: Trainer honours managedBy")
                assert (subject.workload() or {})["spec"].get("active") is False
            else:
                assert "v2.2 or earlier" in cap.reason and TRAINJOB_CRD_NAME in cap.reason, cap
                assert result.hold_unsupported_reason == cap.reason
                with pytest.raises(Unsupported, match=r"ignores spec\.managedBy"):
                    adapter.hold(Ref(real_namespace, "job"), meta(1), "trap 3")
                after = subject.workload() or {}
                assert after["spec"] == workload["spec"], "Hold wrote the Workload"
    finally:
        remove_multikueue(real_admin, real_namespace, cluster_queue, check)


def remove_multikueue(admin: k8s.ApiClient, namespace: str, cluster_queue: str, check: str) -> None:
    """Delete the namespace's TrainJobs (their Workloads go with them), the ClusterQueue
    and the check, and wait until the check is gone: Kueue keeps a check in use by a
    ClusterQueue, and a ClusterQueue in use by Workloads, with a finalizer, and a check
    left Terminating would still be MultiKueue seen in use by the next preflight."""
    custom = k8s.CustomObjectsApi(admin)
    for name in ("job", "ctl"):
        try:
            custom.delete_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, name
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
    for resource, name in ((CLUSTERQUEUE, cluster_queue), (ADMISSIONCHECK, check)):
        if name:
            custom.delete_cluster_custom_object(
                resource.group, resource.version, resource.plural, name
            )

    def check_gone() -> bool:
        try:
            custom.get_cluster_custom_object(
                ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural, check
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    eventually(check_gone, f"the MultiKueue AdmissionCheck {check} is deleted")
