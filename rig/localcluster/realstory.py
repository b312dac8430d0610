"""What a story on the real controllers sets up and reads: Kueue queues, a job's objects
(its TrainJob, Workloads and pods), and bounded waits.

Shared by ``holdwarden demo --real-controllers`` and the real-controller tests
(``tests/real``), so that the demo shows exactly what the tests prove.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    CLUSTERQUEUE,
    JOB_UID_LABEL,
    JOBSET_NAME_LABEL,
    LOCALQUEUE,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    RuleId,
)
from rig.builders import trainjob_body

LOCAL_QUEUE = "user-queue"
PODS_REMAIN = "pod(s) of the previous execution remain"
"""What the readmission gate's check message says while the held execution's pods remain."""

KEEP_FINALIZER = "test.holdwarden.io/keep"
"""Keeps one pod of an execution alive after its deletion (no kubelet here ends pods
gracefully, so without it they vanish at once and "pods remain" never happens)."""

REQUESTS = {"cpu": "100m", "memory": "64Mi"}
"""What each trainer pod asks for. It matters in Kueue mode: a Workload whose pods request
nothing is assigned no flavor, and Kueue then applies no flavor-scoped AdmissionCheck to
it (one with empty ``onFlavors`` means "all flavors"), so it is admitted past the
readmission gate."""


# The real controllers' service-account namespaces (rig/localcluster/controllers.py):
# the enforcer must never refuse a write of any identity in them.
CONTROLLER_USER_PREFIXES = (
    "system:serviceaccount:kube-system:",
    "system:serviceaccount:kueue-system:",
    "system:serviceaccount:kubeflow-system:",
    "system:serviceaccount:jobset-system:",
    # With nodes (rig/localcluster/nodes.py): the scheduler and the kwok kubelets.
    "system:kube-scheduler",
    "holdwarden:kwok",
)


def controller_refusals(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The audit records (refusals) whose writer is one of the real controllers."""
    return [r for r in records if str(r.get("user", "")).startswith(CONTROLLER_USER_PREFIXES)]


class NotWithin(AssertionError):
    """A bounded wait ran out; the message names what did not happen."""


def eventually(probe: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """``probe()``'s first truthy value, polled until ``timeout`` s; else NotWithin naming
    ``what``.

    Generous by default: the real controllers on a busy 2-core machine react in seconds,
    not milliseconds, and each wait is still bounded.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise NotWithin(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)


def wait_until_enforced(admin: k8s.ApiClient, namespace: str, timeout: float = 60.0) -> None:
    """Return once the apiserver calls the enforcer for writes in ``namespace`` (and the
    enforcer refuses); else NotWithin, naming the last answer.

    Why: the apiserver loads webhook configurations through an informer, so a
    configuration just created or changed (``holdwarden certs inject`` writes its
    caBundle) takes effect a moment later. Until then a write is not judged, or, with a
    version that has no caBundle yet, fails TLS verification under ``failurePolicy: Fail``.
    The canary is a dry-run create (nothing is stored) of a TrainJob that carries a hold
    but is not suspended: only the enforcer refuses it, by ``held-trainjob-suspended``.
    """
    canary = trainjob_body("holdwarden-canary", suspend=False)
    canary["metadata"]["annotations"] = {Annotations().hold_instance: "1"}
    custom = k8s.CustomObjectsApi(admin)
    last: list[str] = ["no answer yet"]

    def refused() -> bool:
        try:
            custom.create_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, canary,
                dry_run="All",
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 403 and RuleId.HELD_TRAINJOB_SUSPENDED in (exc.body or ""):
                return True
            # Not (yet) the enforcer: a failed call, or Trainer's or Kueue's webhook
            # refusing the canary first. Try again.
            last[0] = f"HTTP {exc.status}: {exc.body or exc.reason}"
            return False
        last[0] = "allowed"
        return False

    try:
        eventually(refused, f"the apiserver calls the enforcer in {namespace}", timeout)
    except NotWithin as exc:
        raise NotWithin(f"{exc} (last answer: {last[0]})") from None


def with_requests(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a TrainJob) whose trainer pods request REQUESTS."""
    body["spec"].setdefault("trainer", {})["resourcesPerNode"] = {"requests": dict(REQUESTS)}
    return body


def _kueue_object(resource: Any, name: str, spec: dict[str, Any] | None = None) -> Any:
    body: dict[str, Any] = {
        "apiVersion": f"{resource.group}/{resource.version}",
        "kind": resource.kind,
        "metadata": {"name": name},
    }
    if spec is not None:
        body["spec"] = spec
    return body


def make_admission_check(api: k8s.ApiClient, name: str, controller_name: str) -> None:
    """The AdmissionCheck a ClusterQueue lists so that the readmission gate decides."""
    k8s.CustomObjectsApi(api).create_cluster_custom_object(
        ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural,
        _kueue_object(ADMISSIONCHECK, name, {"controllerName": controller_name}),
    )  # fmt: skip


def make_queues(api: k8s.ApiClient, namespace: str, admission_checks: Sequence[str] = ()) -> str:
    """A ClusterQueue of its own (name returned) that admits this namespace's LocalQueue
    (LOCAL_QUEUE), through ``admission_checks`` when any are given.

    Quota is generous: no story here is about quota.
    """
    custom = k8s.CustomObjectsApi(api)
    suffix = uuid.uuid4().hex[:8]
    flavor, cluster_queue = f"flavor-{suffix}", f"cq-{suffix}"
    custom.create_cluster_custom_object(
        WORKLOAD.group, WORKLOAD.version, "resourceflavors",
        {"apiVersion": f"{WORKLOAD.group}/{WORKLOAD.version}", "kind": "ResourceFlavor",
         "metadata": {"name": flavor}},
    )  # fmt: skip
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": "100"},
                            {"name": "memory", "nominalQuota": "100Gi"},
                        ],
                    }
                ],
            }
        ],
    }
    if admission_checks:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": name} for name in admission_checks]
        }
    custom.create_cluster_custom_object(
        CLUSTERQUEUE.group, CLUSTERQUEUE.version, CLUSTERQUEUE.plural,
        _kueue_object(CLUSTERQUEUE, cluster_queue, spec),
    )  # fmt: skip
    local = _kueue_object(LOCALQUEUE, LOCAL_QUEUE, {"clusterQueue": cluster_queue})
    local["metadata"]["namespace"] = namespace
    custom.create_namespaced_custom_object(
        LOCALQUEUE.group, LOCALQUEUE.version, namespace, LOCALQUEUE.plural, local
    )
    return cluster_queue


def local_queue_active(api: k8s.ApiClient, namespace: str) -> bool:
    """Kueue reports ``namespace``'s LocalQueue (LOCAL_QUEUE) as Active."""
    found: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        LOCALQUEUE.group, LOCALQUEUE.version, namespace, LOCALQUEUE.plural, LOCAL_QUEUE
    )
    conditions = (found.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def wait_local_queue_active(api: k8s.ApiClient, namespace: str, timeout: float = 120.0) -> None:
    """Return once Kueue has the LocalQueue made by ``make_queues`` in its caches.

    Why: Kueue's defaulting webhook names MultiKueue as a job's manager only when its
    queue cache already maps the job's LocalQueue to a ClusterQueue with a MultiKueue
    check. A TrainJob created before that keeps Trainer's default manager and runs on the
    manager cluster. The LocalQueue's Active condition is written after the queue is in
    those caches and its ClusterQueue (with every admission check) is active.
    """
    eventually(
        lambda: local_queue_active(api, namespace),
        f"LocalQueue {namespace}/{LOCAL_QUEUE} Active",
        timeout,
    )


@dataclass
class Objects:
    """One TrainJob's objects, read as the admin: nothing here is cached."""

    admin: k8s.ApiClient
    namespace: str
    name: str = "job"

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.admin)

    def trainjob(self) -> dict[str, Any]:
        found: Any = self.custom.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, self.namespace, TRAINJOB.plural, self.name
        )
        return dict(found)

    def workloads(self) -> list[dict[str, Any]]:
        uid = self.trainjob()["metadata"]["uid"]
        found: Any = self.custom.list_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural,
            label_selector=f"{JOB_UID_LABEL}={uid}",
        )  # fmt: skip
        return [dict(item) for item in found["items"]]

    def workload(self) -> dict[str, Any] | None:
        items = self.workloads()
        return items[0] if items else None

    def check_message(self, check: str, says: str) -> str | None:
        """The message of the Workload's AdmissionCheck ``check``, once it contains ``says``."""
        workload = self.workload() or {}
        for entry in (workload.get("status") or {}).get("admissionChecks") or []:
            message = str(entry.get("message") or "")
            if entry.get("name") == check and says in message:
                return message
        return None

    def pods(self) -> list[k8s.V1Pod]:
        return list(
            k8s.CoreV1Api(self.admin)
            .list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={self.name}")
            .items
        )

    def pods_on(self, node: str) -> list[k8s.V1Pod]:
        """The job's pods bound to ``node``."""
        return [p for p in self.pods() if p.spec is not None and p.spec.node_name == node]

    def all_terminating_on(self, node: str) -> bool:
        """The job has pods on ``node`` and every one of them is being deleted."""
        pods = self.pods_on(node)
        return bool(pods) and all(p.metadata and p.metadata.deletion_timestamp for p in pods)

    def running_on_nodes(self, count: int) -> dict[str, str] | None:
        """{pod uid: node} once ``count`` pods of the job run (phase Running, bound to a
        node, not being deleted), else None."""
        running: dict[str, str] = {}
        for pod in self.pods():
            meta, spec, status = pod.metadata, pod.spec, pod.status
            if meta is None or spec is None or status is None:
                continue
            if status.phase == "Running" and spec.node_name and not meta.deletion_timestamp:
                running[str(meta.uid)] = str(spec.node_name)
        return running if len(running) >= count else None

    def pod_uids(self) -> set[str]:
        return {str(p.metadata.uid) for p in self.pods() if p.metadata is not None}

    def keep(self, pod: k8s.V1Pod) -> str:
        """Put KEEP_FINALIZER on ``pod``; returns its name."""
        if pod.metadata is None or not pod.metadata.name:
            raise ValueError("keep: the pod has no name")
        name = str(pod.metadata.name)
        k8s.CoreV1Api(self.admin).patch_namespaced_pod(
            name, self.namespace, {"metadata": {"finalizers": [KEEP_FINALIZER]}}
        )
        return name

    def let_go(self, pod_name: str) -> None:
        k8s.CoreV1Api(self.admin).patch_namespaced_pod(
            pod_name, self.namespace, {"metadata": {"finalizers": None}}
        )

    def suspended(self) -> bool:
        return bool(self.trainjob()["spec"].get("suspend"))

    def attempt(self) -> str | None:
        annotations = self.trainjob()["metadata"].get("annotations") or {}
        value = annotations.get(Annotations().attempt)
        return str(value) if value is not None else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition ``type_`` of ``obj``'s status (whatever its status), else None."""
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == type_:
            return dict(entry)
    return None
