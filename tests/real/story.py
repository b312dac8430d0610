"""Helpers for the real-controller stories: reading the objects, pods by execution, and
the checks every story ends with (no refusal of a controller, no denial in their logs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client as k8s

from adapter import CallMeta
from holdwarden.localcluster import LocalCluster
from holdwarden.vocabulary import JOB_UID_LABEL, JOBSET_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from tests.actors import WatchEvent
from tests.real.enforcer import Enforcement

KEEP_FINALIZER = "test.holdwarden.io/keep"
"""Keeps one pod of an execution alive after its deletion (no kubelet here ends pods
gracefully, so without it they vanish at once and "pods remain" never happens)."""


REQUESTS = {"cpu": "100m", "memory": "64Mi"}
"""What each trainer pod asks for. It matters in Kueue mode: a Workload whose pods request
nothing is assigned no flavor, and Kueue then applies no flavor-scoped AdmissionCheck to
it (one with empty ``onFlavors`` means "all flavors"), so it is admitted past the
readmission gate."""


def with_requests(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a TrainJob) whose trainer pods request REQUESTS."""
    body["spec"].setdefault("trainer", {})["resourcesPerNode"] = {"requests": dict(REQUESTS)}
    return body


def meta(instance: int | None = None, seconds: float = 30) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=seconds), instance)


@dataclass
class Objects:
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

    def pods(self) -> list[k8s.V1Pod]:
        return list(
            k8s.CoreV1Api(self.admin)
            .list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={self.name}")
            .items
        )

    def pod_uids(self) -> set[str]:
        return {str(p.metadata.uid) for p in self.pods() if p.metadata is not None}

    def keep(self, pod: k8s.V1Pod) -> str:
        """Put KEEP_FINALIZER on ``pod``; returns its name."""
        assert pod.metadata is not None
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
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == type_:
            return dict(entry)
    return None


def live_pod_sets(events: list[WatchEvent]) -> list[set[str]]:
    """The set of pod uids that existed after each committed pod change, in order."""
    live: set[str] = set()
    history = []
    for event in events:
        if event.kind != "pod":
            continue
        uid = str(event.obj["metadata"]["uid"])
        if event.type == "DELETED":
            live.discard(uid)
        else:
            live.add(uid)
        history.append(set(live))
    return history


CONTROLLER_IDENTITIES = (
    "system:serviceaccount:kueue-system:kueue-controller-manager",
    "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager",
    "system:serviceaccount:jobset-system:jobset-controller-manager",
)


def assert_no_false_positives(cluster: LocalCluster, enforcement: Enforcement) -> None:
    """The enforcer refused no controller's write, and no controller logged a denial."""
    refused = [
        r
        for r in enforcement.audit()
        if str(r.get("user", "")).startswith("system:serviceaccount:kube-system:")
        or r.get("user") in CONTROLLER_IDENTITIES
    ]
    assert not refused, f"the enforcer refused controllers' writes: {refused}"
    assert cluster.controllers is not None
    denials = {
        name: [line for line in log.splitlines() if "denied the request" in line][:5]
        for name, log in cluster.controllers.logs().items()
    }
    assert not any(denials.values()), f"controllers logged denials: {denials}"
